//! TLS for remote members and for `uraid serve` (issue 16): an nbds:// member on nbdkit
//! --tls=require checked against `--nbd-tls-ca`, a certificate from another CA refused
//! with a clear error and nothing written, `serve --tls-cert/--tls-key` requiring TLS of
//! its clients (nbdinfo over TLS reads it), TLS required by default off loopback, and
//! `--tls-psk` refused by name.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uraid_nbd::client::{Client, ClientConfig, ClientError};
use uraid_nbd::TlsClient;
use uraid_testkit::pki::Pki;
use uraid_testkit::prelude::*;

/// nbdkit on a TCP loopback port with TLS required, killed on drop.
struct TlsNbdkit {
    child: Child,
    uri: String,
}

impl TlsNbdkit {
    fn start(pki: &Pki, size: &str) -> TlsNbdkit {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("nbdkit")
            .args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .arg("--tls=require")
            .arg(format!("--tls-certificates={}", pki.dir.display()))
            .args(["memory", size])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn nbdkit");
        let k = TlsNbdkit {
            child,
            uri: format!("nbds://127.0.0.1:{port}/"),
        };
        let config = tls_config(pki);
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = Client::open(&k.uri, &config) {
            assert!(
                matches!(e, ClientError::Connect { .. }) && Instant::now() < deadline,
                "{}: {e}",
                k.uri
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        k
    }
}

impl Drop for TlsNbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_config(pki: &Pki) -> ClientConfig {
    ClientConfig {
        tls: Some(TlsClient::from_ca_file(&pki.ca()).unwrap()),
        ..ClientConfig::default()
    }
}

#[test]
fn raid1_with_a_tls_only_member_and_a_wrong_ca_refused() {
    if !need_tool(
        "nbdkit",
        "raid1_with_a_tls_only_member_and_a_wrong_ca_refused",
    ) {
        return;
    }
    let dir = TempDir::new("remote-tls-member");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let other = Pki::new(&dir.path("other"), "some other CA");
    let host = TlsNbdkit::start(&pki, "32M");
    let local = dir.image("m0.img", 32);
    let ca = pki.ca();

    // Another CA: refused, the certificate named, nothing written to the local member.
    let err = fails_cleanly(
        uraid()
            .arg("--nbd-tls-ca")
            .arg(other.ca())
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&host.uri),
        std::slice::from_ref(&local),
    );
    assert!(
        err.contains(&host.uri) && err.contains("certificate"),
        "{err}"
    );
    assert_eq!(err.matches("certificate").count(), 1, "said once: {err}");

    let members = vec![local.clone(), PathBuf::from(&host.uri)];
    ok(uraid()
        .arg("--nbd-tls-ca")
        .arg(&ca)
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&members));
    let v = json(&ok(uraid().arg("--nbd-tls-ca").arg(&ca).args([
        "examine",
        "--json",
        host.uri.as_str(),
    ])));
    assert_eq!(v["role"], "Active device 1", "{v}");

    let data = pattern(256 << 10, 21);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .arg("--nbd-tls-ca")
        .arg(&ca)
        .args(["write", "--offset", "1M", "--input"])
        .arg(&input)
        .args(&members));
    // The remote copy, read over TLS beside uraid, at the member's data offset.
    let data_offset = v["data_offset_sectors"].as_u64().unwrap() * 512;
    let c = Client::open(&host.uri, &tls_config(&pki)).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(&mut back, data_offset + (1 << 20)).unwrap();
    assert!(back == data, "the TLS member holds no copy");
}

#[test]
fn nbds_without_a_ca_is_refused_by_name() {
    let dir = TempDir::new("remote-tls-noca");
    let img = dir.image("m0.img", 8);
    let err = fails_with(
        uraid()
            .args(["create", "-l", "1", "-n", "2", "--run"])
            .arg(&img)
            .arg("nbds://127.0.0.1:1/disk"),
        "--nbd-tls-ca",
    );
    assert!(err.contains("nbds://127.0.0.1:1/disk"), "{err}");
    assert_eq!(std::fs::read(&img).unwrap(), vec![0u8; 8 << 20]);
}

#[test]
fn serve_with_a_certificate_requires_tls() {
    let dir = TempDir::new("serve-tls");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let control = dir.path("ctl.sock");
    let args: Vec<String> = vec![
        "serve".into(),
        "--nbd".into(),
        "tcp:127.0.0.1:0".into(),
        "--control".into(),
        control.display().to_string(),
        "--name".into(),
        "md0".into(),
        "--tls-cert".into(),
        pki.cert().display().to_string(),
        "--tls-key".into(),
        pki.key().display().to_string(),
    ];
    let srv = Served::spawn(&dir, args, &members, dir.path("unused"), control);
    let uri = loop {
        let line = srv
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("no banner");
        if let Some(u) = line.strip_prefix("nbd: ") {
            break u.to_string();
        }
    };
    assert!(uri.starts_with("nbds://127.0.0.1:"), "{uri}");
    let plain = uri.replacen("nbds", "nbd", 1);
    let e = Client::open(&plain, &ClientConfig::default()).unwrap_err();
    assert!(matches!(e, ClientError::TlsRequired { .. }), "{e}");

    let c = Client::open(&uri, &tls_config(&pki)).unwrap();
    let data = pattern(128 << 10, 5);
    c.write(&data, 1 << 20, true).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(&mut back, 1 << 20).unwrap();
    assert!(back == data, "served over TLS");
    drop(c);

    if need_tool("nbdinfo", "serve_with_a_certificate_requires_tls") {
        let out = Command::new("nbdinfo")
            .arg("--size")
            .arg(format!("{uri}?tls-certificates={}", pki.dir.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "nbdinfo: {out:?}");
        let size: u64 = text(&out.stdout).trim().parse().unwrap();
        assert!(size > 0 && size <= 8 * MIB, "{size}");
    }
}

#[test]
fn serve_off_loopback_requires_a_certificate_and_psk_is_refused() {
    let dir = TempDir::new("serve-tls-refuse");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let err = fails_cleanly(
        uraid()
            .args(["serve", "--nbd", "tcp:0.0.0.0:0"])
            .args(&members),
        &members,
    );
    assert!(
        err.contains("TLS is required") && err.contains("--tls off"),
        "{err}"
    );
    let err = fails_cleanly(
        uraid()
            .args([
                "serve",
                "--nbd",
                "tcp:127.0.0.1:0",
                "--tls-psk",
                "/etc/keys.psk",
            ])
            .args(&members),
        &members,
    );
    assert!(
        err.contains("--tls-psk") && err.contains("pre-shared key is not supported"),
        "{err}"
    );
    assert_eq!(err.matches("pre-shared").count(), 1, "said once: {err}");
}
