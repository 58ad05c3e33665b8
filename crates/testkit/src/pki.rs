//! A throw-away X.509 PKI for TLS tests, made with rcgen: a CA and a server certificate
//! signed by it, written as `ca-cert.pem`, `server-cert.pem` and `server-key.pem` (the
//! names nbdkit's `--tls-certificates`, qemu's `tls-creds-x509`, nbd-server's config and
//! libnbd's `tls-certificates` look for in a folder). [`Pki::new`] certifies `localhost`
//! and `127.0.0.1`; [`Pki::for_names`] the names (or addresses) given, as a host in a
//! network namespace needs ([`crate::netns`]); [`Pki::issue`] signs another server's
//! certificate with the same CA, so that one `--nbd-tls-ca` trusts several servers.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The CA's own certificate and key, kept in memory (never written beside a server's
/// certificate) to sign more.
struct Authority {
    cert: Certificate,
    key: KeyPair,
}

/// A folder with a CA and a server certificate signed by it.
pub struct Pki {
    /// The folder (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`).
    pub dir: PathBuf,
    ca: Arc<Authority>,
}

impl Pki {
    /// Makes a new CA (named `ca_name`) and a server certificate for `localhost` and
    /// `127.0.0.1` in `dir` (created).
    pub fn new(dir: &Path, ca_name: &str) -> Pki {
        Pki::for_names(dir, ca_name, &["localhost", "127.0.0.1"])
    }

    /// Makes a new CA (named `ca_name`) and a server certificate in `dir` (created) for
    /// `names`: DNS names or IP addresses (an address becomes an IP subject alternative
    /// name, which is what a client that connects by address checks). The first name is
    /// the certificate's common name.
    pub fn for_names(dir: &Path, ca_name: &str, names: &[&str]) -> Pki {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, ca_name);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = ca.self_signed(&key).unwrap();
        let ca = Arc::new(Authority { cert, key });
        Pki::sign(dir, ca, names)
    }

    /// A server certificate for `names` in `dir` (created), signed by this PKI's CA (its
    /// `ca-cert.pem` the same as this one's).
    pub fn issue(&self, dir: &Path, names: &[&str]) -> Pki {
        Pki::sign(dir, self.ca.clone(), names)
    }

    fn sign(dir: &Path, ca: Arc<Authority>, names: &[&str]) -> Pki {
        assert!(!names.is_empty(), "a server certificate needs a name");
        std::fs::create_dir_all(dir).unwrap();
        let mut srv =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        srv.distinguished_name.push(DnType::CommonName, names[0]);
        srv.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        srv.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let srv_key = KeyPair::generate().unwrap();
        let srv_cert = srv.signed_by(&srv_key, &ca.cert, &ca.key).unwrap();

        std::fs::write(dir.join("ca-cert.pem"), ca.cert.pem()).unwrap();
        std::fs::write(dir.join("server-cert.pem"), srv_cert.pem()).unwrap();
        std::fs::write(dir.join("server-key.pem"), srv_key.serialize_pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
            ca,
        }
    }

    /// A client certificate for `name` signed by this PKI's CA, written in `dir` (created)
    /// as `client-cert.pem` and `client-key.pem` (qemu's and libnbd's names); gives the two
    /// paths.
    pub fn issue_client(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        std::fs::create_dir_all(dir).unwrap();
        let mut c = CertificateParams::new(vec![name.to_string()]).unwrap();
        c.distinguished_name.push(DnType::CommonName, name);
        c.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        c.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = c.signed_by(&key, &self.ca.cert, &self.ca.key).unwrap();
        let (cp, kp) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
        std::fs::write(&cp, cert.pem()).unwrap();
        std::fs::write(&kp, key.serialize_pem()).unwrap();
        (cp, kp)
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
