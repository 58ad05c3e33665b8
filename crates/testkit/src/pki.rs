//! A throw-away X.509 PKI for TLS tests, made with rcgen: a CA and a server certificate
//! for `localhost` and `127.0.0.1`, written as `ca-cert.pem`, `server-cert.pem` and
//! `server-key.pem` (the names nbdkit's `--tls-certificates`, qemu's `tls-creds-x509`
//! and libnbd's `tls-certificates` look for in a folder).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A folder with a CA and a server certificate signed by it.
pub struct Pki {
    /// The folder (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`).
    pub dir: PathBuf,
}

impl Pki {
    /// Makes a new CA (named `ca_name`) and a server certificate in `dir` (created).
    pub fn new(dir: &Path, ca_name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, ca_name);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();

        let mut srv =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        srv.distinguished_name.push(DnType::CommonName, "localhost");
        srv.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        srv.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let srv_key = KeyPair::generate().unwrap();
        let srv_cert = srv.signed_by(&srv_key, &ca_cert, &ca_key).unwrap();

        std::fs::write(dir.join("ca-cert.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.join("server-cert.pem"), srv_cert.pem()).unwrap();
        std::fs::write(dir.join("server-key.pem"), srv_key.serialize_pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    /// `ca-cert.pem`.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca-cert.pem")
    }

    /// `server-cert.pem`.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("server-cert.pem")
    }

    /// `server-key.pem`.
    pub fn key(&self) -> PathBuf {
        self.dir.join("server-key.pem")
    }
}
