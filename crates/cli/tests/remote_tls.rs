//! TLS for remote members and for `uraid serve` (issue 16): an nbds:// member on nbdkit
//! --tls=require checked against `--nbd-tls-ca`, a certificate from another CA refused
//! with a clear error and nothing written, `serve --tls-cert/--tls-key` requiring TLS of
//! its clients (nbdinfo over TLS reads it), TLS required by default off loopback. TLS-PSK:
//! members on nbdkit `--tls-psk` and qemu-nbd `tls-creds-psk`, a wrong key refused with
//! nothing written, `serve --tls-psk` read by nbdinfo and qemu-img, bad PSK setups
//! refused. TLS 1.2 alone (uraid's client offering only it) against nbdkit with X.509 and
//! PSK, and against qemu-nbd with PSK. Across network namespaces: raid1 over two TLS-only hosts (nbdkit and
//! qemu-nbd) losing one mid-write and re-adding it over TLS, a host with a certificate
//! from another CA or for another address refused by name with nothing written, and a
//! plain `nbd://` URI to a TLS-only host refused.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uraid_nbd::client::{Client, ClientConfig, ClientError};
use uraid_nbd::TlsClient;
use uraid_testkit::netns::{need_netns, Host, ServerKind};
use uraid_testkit::pki::Pki;
use uraid_testkit::prelude::*;

/// A TLS-only NBD server process (nbdkit or qemu-nbd) on a TCP loopback port, killed on
/// drop.
struct TlsProc {
    child: Child,
    uri: String,
}

/// How a [`TlsProc`] proves itself: an X.509 certificate of the test's CA, or a
/// pre-shared key file and the identity clients give.
enum Creds<'a> {
    X509(&'a Pki),
    Psk { file: &'a Path, user: &'a str },
}

impl Creds<'_> {
    /// The URI of the server on `port`, and the client configuration that opens it.
    fn uri_and_config(&self, port: u16) -> (String, ClientConfig) {
        match self {
            Creds::X509(pki) => (format!("nbds://127.0.0.1:{port}/"), tls_config(pki)),
            Creds::Psk { file, user } => (
                format!(
                    "nbds://127.0.0.1:{port}/?tls-psk-file={}&tls-username={user}",
                    file.display()
                ),
                ClientConfig::default(),
            ),
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl TlsProc {
    /// nbdkit `--tls=require` with a memory disk of `size`.
    fn nbdkit(creds: &Creds, size: &str) -> TlsProc {
        let port = free_port();
        let mut cmd = Command::new("nbdkit");
        cmd.args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .arg("--tls=require");
        match creds {
            Creds::X509(pki) => cmd.arg(format!("--tls-certificates={}", pki.dir.display())),
            Creds::Psk { file, .. } => cmd.arg(format!("--tls-psk={}", file.display())),
        };
        cmd.args(["memory", size]);
        TlsProc::spawn(cmd, creds, port)
    }

    /// qemu-nbd `--tls-creds` (X.509, or PSK: `tls-creds-psk` reads `DIR/keys.psk`)
    /// serving the raw file `image`.
    fn qemu_nbd(creds: &Creds, image: &Path) -> TlsProc {
        TlsProc::qemu_nbd_with(creds, image, "")
    }

    /// [`TlsProc::qemu_nbd`] with more properties on its tls-creds object (`,priority=...`).
    fn qemu_nbd_with(creds: &Creds, image: &Path, more: &str) -> TlsProc {
        let port = free_port();
        let object = match creds {
            Creds::X509(pki) => format!(
                "tls-creds-x509,id=tls0,endpoint=server,verify-peer=off,dir={}",
                pki.dir.display()
            ),
            Creds::Psk { file, .. } => {
                assert_eq!(file.file_name().unwrap(), "keys.psk", "qemu's file name");
                format!(
                    "tls-creds-psk,id=tls0,endpoint=server,dir={}",
                    file.parent().unwrap().display()
                )
            }
        };
        let object = format!("{object}{more}");
        let mut cmd = Command::new("qemu-nbd");
        cmd.args(["-f", "raw", "-b", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .args(["--object", &object, "--tls-creds", "tls0", "--persistent"])
            .arg(image);
        if more.contains("VERS-TLS1.1") {
            // Its export never opens for uraid's client: wait for the port alone.
            return TlsProc::spawn_listening(cmd, creds, port);
        }
        TlsProc::spawn(cmd, creds, port)
    }

    /// Starts `cmd` (a server on `port`) and waits until the port takes connections (60 s
    /// at most: a safety net, not a measure).
    fn spawn_listening(mut cmd: Command, creds: &Creds, port: u16) -> TlsProc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        let (uri, _) = creds.uri_and_config(port);
        let mut k = TlsProc { child, uri };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "{}: never listened", k.uri);
            if let Ok(Some(st)) = k.child.try_wait() {
                panic!("{cmd:?} exited: {st}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        k
    }

    /// Starts `cmd` (a server on `port`) and waits until its export opens (60 s at most:
    /// a safety net, not a measure).
    fn spawn(mut cmd: Command, creds: &Creds, port: u16) -> TlsProc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        let (uri, config) = creds.uri_and_config(port);
        let mut k = TlsProc { child, uri };
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = Client::open(&k.uri, &config) {
            assert!(
                matches!(e, ClientError::Connect { .. }) && Instant::now() < deadline,
                "{}: {e}",
                k.uri
            );
            if let Ok(Some(st)) = k.child.try_wait() {
                panic!("{cmd:?} exited: {st}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        k
    }
}

impl Drop for TlsProc {
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
    let host = TlsProc::nbdkit(&Creds::X509(&pki), "32M");
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

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// `uraid serve` of `members` as md0 on a loopback TCP port, with `tls` (its TLS options);
/// the server and its nbds:// URI from the banner.
fn serve_tls(dir: &TempDir, members: &[PathBuf], tls: &[&str]) -> (Served, String) {
    let control = dir.path("ctl.sock");
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--nbd".into(),
        "tcp:127.0.0.1:0".into(),
        "--control".into(),
        control.display().to_string(),
        "--name".into(),
        "md0".into(),
    ];
    args.extend(tls.iter().map(|a| a.to_string()));
    let srv = Served::spawn(dir, args, members, dir.path("unused"), control);
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
    (srv, uri)
}

#[test]
fn serve_with_a_certificate_requires_tls() {
    let dir = TempDir::new("serve-tls");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let (_srv, uri) = serve_tls(
        &dir,
        &members,
        &[
            "--tls-cert",
            &path_str(&pki.cert()),
            "--tls-key",
            &path_str(&pki.key()),
        ],
    );
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
fn serve_off_loopback_requires_a_certificate_and_bad_psk_setups_are_refused() {
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
    // A key file with a bad line: the file, the line and the fault named, never the key.
    let keys = dir.path("bad.psk");
    std::fs::write(
        &keys,
        "alice:00112233445566778899aabbccddeeff\nbob:0011zz\n",
    )
    .unwrap();
    let err = fails_cleanly(
        uraid()
            .args(["serve", "--nbd", "tcp:127.0.0.1:0", "--tls-psk"])
            .arg(&keys)
            .args(&members),
        &members,
    );
    assert!(
        err.contains(&path_str(&keys)) && err.contains("line 2") && err.contains("not hexadecimal"),
        "{err}"
    );
    assert!(!err.contains("00112233"), "the key is never printed: {err}");
    assert_eq!(err.matches("line 2").count(), 1, "said once: {err}");
    // Certificates and pre-shared keys together: choose one.
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let good = psk_file(&dir, "keys", "alice", 1);
    let err = fails_cleanly(
        uraid()
            .args(["serve", "--nbd", "tcp:127.0.0.1:0", "--tls-psk"])
            .arg(&good)
            .arg("--tls-cert")
            .arg(pki.cert())
            .arg("--tls-key")
            .arg(pki.key())
            .args(&members),
        &members,
    );
    assert!(err.contains("choose one"), "{err}");
}

/// A pre-shared key file `SUB/keys.psk` (the name qemu's tls-creds-psk reads) holding
/// `user`'s 32-byte key made from `seed`, as psktool writes it.
fn psk_file(dir: &TempDir, sub: &str, user: &str, seed: u64) -> PathBuf {
    let d = dir.path(sub);
    std::fs::create_dir_all(&d).unwrap();
    let key: String = pattern(32, seed)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = d.join("keys.psk");
    std::fs::write(&path, format!("{user}:{key}\n")).unwrap();
    path
}

/// raid1 over a local file and an nbdkit `--tls=require --tls-psk` member
/// (`nbds://...?tls-psk-file=FILE&tls-username=NAME`): written and read back over TLS-PSK;
/// the same member with another key is refused by name and nothing is written.
#[test]
fn raid1_with_a_psk_member_on_nbdkit_and_a_wrong_key_refused() {
    if !need_tool(
        "nbdkit",
        "raid1_with_a_psk_member_on_nbdkit_and_a_wrong_key_refused",
    ) {
        return;
    }
    let dir = TempDir::new("remote-psk-member");
    let keys = psk_file(&dir, "keys", "alice", 1);
    let wrong = psk_file(&dir, "wrong", "alice", 2);
    let host = TlsProc::nbdkit(
        &Creds::Psk {
            file: &keys,
            user: "alice",
        },
        "32M",
    );
    let local = dir.image("m0.img", 32);

    let wrong_uri = host.uri.replace(&path_str(&keys), &path_str(&wrong));
    assert_ne!(wrong_uri, host.uri);
    let err = fails_cleanly(
        uraid()
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&wrong_uri),
        std::slice::from_ref(&local),
    );
    // TLS 1.2 refuses a wrong key with an alert; TLS 1.3 (nbdkit's GnuTLS) closes the
    // connection without answering, which uraid says as either reason.
    assert!(
        err.contains(&wrong_uri)
            && (err.contains("refused the pre-shared key for identity \"alice\"")
                || err.contains("does not take the pre-shared key for identity \"alice\"")),
        "{err}"
    );
    assert_eq!(err.matches("pre-shared").count(), 1, "said once: {err}");

    let members = vec![local.clone(), PathBuf::from(&host.uri)];
    write_and_read_back(&dir, &members, &host.uri, |off, len| {
        let c = Client::open(&host.uri, &ClientConfig::default()).unwrap();
        let mut b = vec![0u8; len];
        c.read(&mut b, off).unwrap();
        b
    });

    // The key file as the global option, for nbds:// members that name none.
    let bare = host.uri.split('?').next().unwrap().to_string();
    let v = json(&ok(uraid()
        .arg("--nbd-tls-psk")
        .arg(&keys)
        .args(["examine", "--json", &bare])));
    assert_eq!(v["role"], "Active device 1", "{v}");
    let two = dir.path("two.psk");
    let text = std::fs::read_to_string(&keys).unwrap();
    std::fs::write(&two, format!("bob:0011\n{text}")).unwrap();
    let err = fails_with(
        uraid()
            .arg("--nbd-tls-psk")
            .arg(&two)
            .args(["examine", "--json", &bare]),
        "holds 2 identities",
    );
    assert!(
        err.contains(&bare) && err.contains("--nbd-tls-username"),
        "{err}"
    );
    ok(uraid().arg("--nbd-tls-psk").arg(&two).args([
        "--nbd-tls-username",
        "alice",
        "examine",
        &bare,
    ]));
    ok(uraid()
        .arg("--nbd-tls-psk")
        .arg(&two)
        .args(["examine", &bare.replacen("nbds://", "nbds://alice@", 1)]));
    fails_with(
        uraid().args(["--nbd-tls-username", "alice", "examine", &bare]),
        "give --nbd-tls-psk FILE",
    );
    fails_with(
        uraid()
            .arg("--nbd-tls-psk")
            .arg(&keys)
            .arg("--nbd-tls-ca")
            .arg(&keys)
            .args(["examine", &bare]),
        "choose one",
    );
}

/// Creates raid1 over `members` (the remote one `uri`), writes 256 KiB at 1 MiB and
/// checks that the remote member's copy, read by `remote(offset, len)`, holds it.
fn write_and_read_back(
    dir: &TempDir,
    members: &[PathBuf],
    uri: &str,
    remote: impl Fn(u64, usize) -> Vec<u8>,
) {
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(members));
    let v = json(&ok(uraid().args(["examine", "--json", uri])));
    assert_eq!(v["role"], "Active device 1", "{v}");
    let data = pattern(256 << 10, 21);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .args(["write", "--offset", "1M", "--input"])
        .arg(&input)
        .args(members));
    let data_offset = v["data_offset_sectors"].as_u64().unwrap() * 512;
    assert!(
        remote(data_offset + (1 << 20), data.len()) == data,
        "the PSK member holds no copy"
    );
    let out = ok(uraid()
        .args(["read", "--offset", "1M", "--length", "256K"])
        .args(members));
    assert!(out.stdout == data, "read back through the array");
}

/// A uraid member on qemu-nbd with `tls-creds-psk` (TLS-PSK, GnuTLS): written over
/// TLS-PSK, the copy found in qemu-nbd's image file.
#[test]
fn raid1_with_a_psk_member_on_qemu_nbd() {
    if !need_tool("qemu-nbd", "raid1_with_a_psk_member_on_qemu_nbd") {
        return;
    }
    let dir = TempDir::new("remote-psk-qemu");
    let keys = psk_file(&dir, "qkeys", "bob", 4);
    let img = dir.image("q.img", 32);
    let host = TlsProc::qemu_nbd(
        &Creds::Psk {
            file: &keys,
            user: "bob",
        },
        &img,
    );
    let local = dir.image("m0.img", 32);
    let members = vec![local, PathBuf::from(&host.uri)];
    write_and_read_back(&dir, &members, &host.uri, |off, len| {
        read_file_at(&img, off, len)
    });
}

/// uraid's PSK client held to TLS 1.2 against nbdkit (whose 1.32 has no priority option:
/// the client side chooses the version here): nbdkit's GnuTLS negotiates a TLS 1.2 PSK
/// suite with uraid's OpenSSL, and a write reads back through it.
#[test]
fn a_psk_member_on_nbdkit_over_tls_1_2() {
    if !need_tool("nbdkit", "a_psk_member_on_nbdkit_over_tls_1_2") {
        return;
    }
    let dir = TempDir::new("remote-psk-nbdkit12");
    let keys = psk_file(&dir, "keys", "alice", 3);
    let host = TlsProc::nbdkit(
        &Creds::Psk {
            file: &keys,
            user: "alice",
        },
        "32M",
    );
    let port = host
        .uri
        .strip_prefix("nbds://127.0.0.1:")
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_string();
    let config = ClientConfig {
        tls: Some(TlsClient::from_psk_file_tls12_only(&keys, Some("alice")).unwrap()),
        ..ClientConfig::default()
    };
    let c = Client::open(&format!("nbds://127.0.0.1:{port}/"), &config).unwrap();
    let data = pattern(256 << 10, 12);
    c.write(&data, 1 << 20, true).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(&mut back, 1 << 20).unwrap();
    assert!(back == data, "read back over TLS 1.2 PSK from nbdkit");
}

/// uraid's X.509 client held to TLS 1.2 against nbdkit: nbdkit's GnuTLS negotiates a TLS
/// 1.2 certificate suite with rustls, the certificate is checked against the test's CA,
/// and a write reads back through it.
#[test]
fn an_x509_member_on_nbdkit_over_tls_1_2() {
    if !need_tool("nbdkit", "an_x509_member_on_nbdkit_over_tls_1_2") {
        return;
    }
    let dir = TempDir::new("remote-x509-nbdkit12");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let host = TlsProc::nbdkit(&Creds::X509(&pki), "32M");
    let config = ClientConfig {
        tls: Some(TlsClient::from_ca_file_tls12_only(&pki.ca()).unwrap()),
        ..ClientConfig::default()
    };
    let c = Client::open(&host.uri, &config).unwrap();
    let data = pattern(256 << 10, 13);
    c.write(&data, 3 << 20, true).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(&mut back, 3 << 20).unwrap();
    assert!(back == data, "read back over TLS 1.2 X.509 from nbdkit");
}

/// qemu-nbd serving a 32 MiB image over TLS-PSK (identity "bob") with GnuTLS held to one
/// TLS version (`TLS1.2`, `TLS1.1`: its priority string): the folder, the image, the host.
fn qemu_psk_host_speaking(version: &str) -> (TempDir, PathBuf, TlsProc) {
    let dir = TempDir::new(&format!("remote-psk-qemu-{version}"));
    let keys = psk_file(&dir, "qkeys", "bob", 7);
    let img = dir.image("q.img", 32);
    let host = TlsProc::qemu_nbd_with(
        &Creds::Psk {
            file: &keys,
            user: "bob",
        },
        &img,
        &format!(",priority=NORMAL:-VERS-ALL:+VERS-{version}"),
    );
    (dir, img, host)
}

/// The same member over TLS 1.2: qemu-nbd's GnuTLS held to TLS 1.2 by its priority string
/// (`NORMAL:-VERS-ALL:+VERS-TLS1.2`), so uraid's OpenSSL PSK client must negotiate a TLS 1.2 PSK
/// suite with a server not its own.
#[test]
fn raid1_with_a_psk_member_on_qemu_nbd_over_tls_1_2() {
    if !need_tool(
        "qemu-nbd",
        "raid1_with_a_psk_member_on_qemu_nbd_over_tls_1_2",
    ) {
        return;
    }
    let (dir, img, host) = qemu_psk_host_speaking("TLS1.2");
    let local = dir.image("m0.img", 32);
    let members = vec![local, PathBuf::from(&host.uri)];
    write_and_read_back(&dir, &members, &host.uri, |off, len| {
        read_file_at(&img, off, len)
    });
}

/// A server that speaks only a TLS version uraid does not (qemu-nbd held to TLS 1.1): the
/// member is refused with that reason, naming the versions uraid speaks, not as a refused key.
#[test]
fn a_psk_member_on_a_tls_1_1_only_server_is_refused_for_its_version() {
    if !need_tool(
        "qemu-nbd",
        "a_psk_member_on_a_tls_1_1_only_server_is_refused_for_its_version",
    ) {
        return;
    }
    let (_dir, _img, host) = qemu_psk_host_speaking("TLS1.1");
    let e = Client::open(&host.uri, &ClientConfig::default()).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            e,
            ClientError::TlsVersion { .. } | ClientError::TlsUnanswered { .. }
        ),
        "{text}"
    );
    assert!(
        text.contains("TLS version") && text.contains("TLS 1.2 and 1.3"),
        "{text}"
    );
    assert!(!text.contains("refused the pre-shared key"), "{text}");
}

/// `uraid serve --tls-psk FILE`: TLS required, uraid's client with the key serves, and
/// libnbd's nbdinfo (`nbds://NAME@host/?tls-psk-file=`) and qemu-img (`tls-creds-psk`)
/// read the array's size over TLS-PSK.
#[test]
fn serve_with_a_psk_file_is_read_by_nbdinfo_and_qemu_img() {
    let test = "serve_with_a_psk_file_is_read_by_nbdinfo_and_qemu_img";
    let dir = TempDir::new("serve-psk");
    let keys = psk_file(&dir, "keys", "alice", 5);
    let members = create_array(&dir, "1", 2, 8, &[]);
    let (_srv, uri) = serve_tls(&dir, &members, &["--tls-psk", &path_str(&keys)]);
    let e = Client::open(&uri.replacen("nbds", "nbd", 1), &ClientConfig::default()).unwrap_err();
    assert!(matches!(e, ClientError::TlsRequired { .. }), "{e}");
    let with_key = format!("{uri}?tls-psk-file={}", keys.display());
    let c = Client::open(&with_key, &ClientConfig::default()).unwrap();
    let size = c.info().size_bytes;
    assert!(size > 0 && size <= 8 * MIB, "{size}");
    let data = pattern(128 << 10, 5);
    c.write(&data, 1 << 20, true).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(&mut back, 1 << 20).unwrap();
    assert!(back == data, "served over TLS-PSK");
    drop(c);
    let wrong = psk_file(&dir, "wrong", "alice", 6);
    let e = Client::open(
        &format!("{uri}?tls-psk-file={}", wrong.display()),
        &ClientConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(e, ClientError::PskRefused { .. }), "{e}");

    if need_tool("nbdinfo", test) {
        let out = Command::new("nbdinfo")
            .arg("--size")
            .arg(format!(
                "{}?tls-psk-file={}",
                uri.replacen("nbds://", "nbds://alice@", 1),
                keys.display()
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "nbdinfo: {out:?}");
        assert_eq!(
            text(&out.stdout).trim(),
            size.to_string(),
            "nbdinfo: {out:?}"
        );
    }
    if need_tool("qemu-img", test) {
        let port = uri
            .strip_prefix("nbds://127.0.0.1:")
            .and_then(|r| r.split('/').next())
            .unwrap();
        let out = Command::new("qemu-img")
            .args(["info", "--output=json", "--object"])
            .arg(format!(
                "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
                keys.parent().unwrap().display()
            ))
            .arg("--image-opts")
            .arg(format!(
                "driver=nbd,host=127.0.0.1,port={port},export=md0,tls-creds=tls0"
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "qemu-img: {out:?}");
        let v = json(&out);
        assert_eq!(v["virtual-size"].as_u64(), Some(size), "qemu-img: {v}");
    }
}

// TLS-only hosts in network namespaces (`uraid_testkit::netns`): each host's certificate
// carries its own 10.231.x.y address, signed by the test's CA.

const BLOCK: usize = 64 << 10;

/// Block `b` under `seed`.
fn block(seed: u64, b: u64) -> Vec<u8> {
    pattern(BLOCK, seed * 1_000_003 + b)
}

fn member_state(d: &serde_json::Value, role: usize) -> String {
    d["members"][role]["state"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

fn read_file_at(path: &std::path::Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; len];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, offset)
        .unwrap();
    b
}

/// Byte offset of the data area of the member whose file is `disk` (read from the file,
/// not over the network).
fn data_offset(disk: &std::path::Path) -> u64 {
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(disk)));
    v["data_offset_sectors"].as_u64().unwrap() * 512
}

/// raid1 over two TLS-only hosts (nbdkit `--tls=require`, qemu-nbd `--tls-creds`), served
/// by `uraid serve --nbd-tls-ca`: the qemu-nbd host is cut off between two writes of one
/// client; the writer sees no error, the member is faulty and its connection lost, and
/// everything reads back. The host restored is re-added over TLS and recovered: the array
/// is not degraded, and both hosts' disks hold every block.
#[test]
fn raid1_over_two_tls_only_hosts_loses_one_mid_write_and_readds_it_over_tls() {
    let test = "raid1_over_two_tls_only_hosts_loses_one_mid_write_and_readds_it_over_tls";
    if !need_netns(test) || !need_tools(&["qemu-nbd"], test) {
        return;
    }
    let dir = TempDir::new("tls-hosts-raid1");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let ca = pki.ca().display().to_string();
    let hosts = [
        Host::start_tls(&dir, "kit", 48, ServerKind::Nbdkit, &pki),
        Host::start_tls(&dir, "qemu", 48, ServerKind::QemuNbd, &pki),
    ];
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    for u in &uris {
        assert!(u.starts_with("nbds://10.231."), "{u}");
    }
    let members: Vec<PathBuf> = uris.iter().map(PathBuf::from).collect();
    ok(uraid()
        .args(["--nbd-tls-ca", &ca])
        .args(["create", "-l", "1", "-n", "2", "--bitmap", "internal"])
        .args(["--bitmap-chunk", "4M", "--assume-clean", "--run"])
        .args(&members));
    let mut srv = Served::start(&dir, &members, &["--nbd-tls-ca", &ca, "--nbd-timeout", "2"]);
    let a0 = members[0].as_path();

    let c = Client::open(&srv.uri(), &ClientConfig::default()).unwrap();
    for b in 0..16 {
        c.write(&block(3, b), b * BLOCK as u64, false).unwrap();
    }
    hosts[1].cut();
    for b in 16..64 {
        c.write(&block(3, b), b * BLOCK as u64, false)
            .unwrap_or_else(|e| panic!("block {b} failed with a host cut: {e}"));
    }
    c.flush().expect("flush failed with a host cut");
    srv.wait_detail(a0, |d| member_state(d, 1) == "faulty");
    let d = srv.detail(a0);
    assert_eq!(d["degraded"], true, "{d}");
    assert_eq!(member_state(&d, 0), "active", "{d}");
    assert_eq!(d["members"][1]["remote"]["connection"], "lost", "{d}");
    let mut back = vec![0u8; BLOCK];
    for b in 0..64 {
        c.read(&mut back, b * BLOCK as u64).unwrap();
        assert!(back == block(3, b), "block {b} differs");
    }

    hosts[1].restore();
    ok(srv.cmd().args(["--nbd-tls-ca", &ca, "remove", &uris[1]]));
    ok(srv
        .cmd()
        .args(["--nbd-tls-ca", &ca, "add", "--array", &uris[0], &uris[1]]));
    srv.wait_detail(a0, |d| d["degraded"] == false);
    let d = srv.detail(a0);
    assert_eq!(member_state(&d, 1), "active", "{d}");
    assert_eq!(d["members"][1]["remote"]["connection"], "up", "{d}");
    drop(c);
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());

    // What went over TLS is on both hosts' disks, the blocks the cut host missed included.
    for h in &hosts {
        let off = data_offset(h.disk());
        for b in 0..64 {
            assert!(
                read_file_at(h.disk(), off + b * BLOCK as u64, BLOCK) == block(3, b),
                "{}: block {b} missing",
                h.uri()
            );
        }
    }
}

/// A host whose certificate the member's CA did not sign (another CA), or that names
/// another address: create, assemble and serve with it are refused, the error naming the
/// member's URI, saying once that its certificate is the problem and what to give instead;
/// and nothing is written to any member (the good host's superblock is as it was).
#[test]
fn a_tls_host_with_a_wrong_certificate_is_refused_by_name_and_nothing_is_written() {
    let test = "a_tls_host_with_a_wrong_certificate_is_refused_by_name_and_nothing_is_written";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("tls-hosts-wrong");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let other = Pki::new(&dir.path("other"), "some other CA");
    let ca = pki.ca().display().to_string();
    let good = Host::start_tls(&dir, "good", 16, ServerKind::Nbdkit, &pki);
    let mut swapped = Host::start_tls(&dir, "swapped", 16, ServerKind::Nbdkit, &pki);
    let stranger = Host::start_tls(&dir, "stranger", 16, ServerKind::Nbdkit, &other);
    let elsewhere_dir = dir.path("elsewhere-tls");
    let elsewhere = Host::start_certified(&dir, "elsewhere", 16, ServerKind::Nbdkit, |_| {
        pki.issue(&elsewhere_dir, &["192.0.2.7"]).dir
    });
    let disks = [
        good.disk(),
        swapped.disk(),
        stranger.disk(),
        elsewhere.disk(),
    ]
    .map(|d| d.to_path_buf())
    .to_vec();

    let refused = |cmd: &mut Command, uri: &str| {
        let err = fails_cleanly(cmd, &disks);
        assert!(err.contains(uri), "{uri} not named: {err}");
        assert_eq!(err.matches("certificate").count(), 1, "said once: {err}");
        assert!(err.contains("--nbd-tls-ca"), "no remedy given: {err}");
        err
    };
    for (bad, why) in [
        (&stranger, "not signed"),
        (&elsewhere, "it names 192.0.2.7"),
    ] {
        let err = refused(
            uraid()
                .args(["--nbd-tls-ca", &ca])
                .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
                .arg(good.uri())
                .arg(bad.uri()),
            &bad.uri(),
        );
        assert!(err.contains(why), "{err}");
    }

    // An array made while its certificate was good; then the host gets one from another CA.
    let members = [PathBuf::from(good.uri()), PathBuf::from(swapped.uri())];
    ok(uraid()
        .args(["--nbd-tls-ca", &ca])
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&members));
    let folder = swapped.tls.clone().unwrap();
    other.issue(&folder, &[&swapped.addr.to_string()]);
    swapped.restart(false);
    let uri = swapped.uri();
    refused(
        uraid()
            .args(["--nbd-tls-ca", &ca, "assemble"])
            .args(&members),
        &uri,
    );
    refused(
        uraid()
            .env("URAID_RUN_DIR", dir.run_dir())
            .args(["serve", "--nbd"])
            .arg(format!("unix:{}", dir.path("never.sock").display()))
            .args(["--nbd-tls-ca", &ca])
            .args(&members),
        &uri,
    );
}

/// A plain `nbd://` URI to a TLS-only host is refused by name: the server requires TLS, and
/// the error says to use nbds:// with the CA; nothing is written.
#[test]
fn a_plain_uri_to_a_tls_only_host_is_refused_by_name() {
    let test = "a_plain_uri_to_a_tls_only_host_is_refused_by_name";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("tls-hosts-plain");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let host = Host::start_tls(&dir, "kit", 16, ServerKind::Nbdkit, &pki);
    let plain = host.uri().replacen("nbds://", "nbd://", 1);
    let local = dir.image("m0.img", 16);
    let err = fails_cleanly(
        uraid()
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&plain),
        &[local.clone(), host.disk().to_path_buf()],
    );
    assert!(
        err.contains(&plain) && err.contains("requires TLS") && err.contains("nbds://"),
        "{err}"
    );
    assert_eq!(err.matches("requires TLS").count(), 1, "said once: {err}");
}

/// nbd-server as a TLS-only host (`force_tls`, its certificate for its address): a plain
/// URI is refused by name as with nbdkit. Over nbds:// nbd-server 3.24 demands a client
/// certificate: without one it drops the connection once TLS is up, and uraid says that
/// with the member's URI and the options that give one, instead of an end of file;
/// nothing is written. With `--nbd-tls-cert/--nbd-tls-key` (signed by the CA nbd-server
/// trusts) the array is made on it, and its data lands on the host's disk.
#[test]
fn an_nbd_server_tls_only_host_wants_a_client_certificate_and_takes_one() {
    let test = "an_nbd_server_tls_only_host_wants_a_client_certificate_and_takes_one";
    if !need_netns(test) || !need_tools(&[ServerKind::NbdServer.program()], test) {
        return;
    }
    let dir = TempDir::new("tls-hosts-nbd-server");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let ca = pki.ca().display().to_string();
    let host = Host::start_tls(&dir, "nbd-server", 32, ServerKind::NbdServer, &pki);
    let uri = host.uri();
    assert!(
        uri.starts_with("nbds://") && uri.ends_with("/disk"),
        "{uri}"
    );
    let local = dir.image("m0.img", 32);
    let files = [local.clone(), host.disk().to_path_buf()];
    let plain = uri.replacen("nbds://", "nbd://", 1);
    let err = fails_cleanly(
        uraid()
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&plain),
        &files,
    );
    assert!(
        err.contains(&plain) && err.contains("requires TLS") && err.contains("nbds://"),
        "{err}"
    );

    let err = fails_cleanly(
        uraid()
            .args(["--nbd-tls-ca", &ca])
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&uri),
        &files,
    );
    assert!(
        err.contains(&uri) && err.contains("client certificate") && err.contains("--nbd-tls-cert"),
        "{err}"
    );
    assert_eq!(
        err.matches("closed the connection").count(),
        1,
        "said once: {err}"
    );

    // A key without its certificate: refused before anything is opened.
    let (cert, key) = pki.issue_client(&dir.path("client"), "uraid-array-host");
    let err = fails_cleanly(
        uraid()
            .args(["--nbd-tls-ca", &ca])
            .arg("--nbd-tls-key")
            .arg(&key)
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&uri),
        &files,
    );
    assert!(err.contains("go together"), "{err}");
    let with_cert = |c: &mut std::process::Command| {
        c.args(["--nbd-tls-ca", &ca])
            .arg("--nbd-tls-cert")
            .arg(&cert)
            .arg("--nbd-tls-key")
            .arg(&key);
    };
    let mut c = uraid();
    with_cert(&mut c);
    ok(
        c.args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&uri),
    );
    let data = pattern(1 << 20, 41);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    let mut c = uraid();
    with_cert(&mut c);
    ok(c.args(["write", "--input"])
        .arg(&input)
        .arg(&local)
        .arg(&uri));
    // On the host's disk, behind nbd-server: the superblock and the mirror's data.
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(host.disk())));
    let off = v["data_offset_sectors"].as_u64().unwrap() * 512;
    let on_host = std::fs::read(host.disk()).unwrap();
    assert!(
        on_host[off as usize..off as usize + data.len()] == data[..],
        "the data did not reach nbd-server's disk"
    );
}
