//! NBD over TLS (NBD_OPT_STARTTLS, X.509 with rustls), both sides: uraid's server with
//! uraid's client, libnbd's nbdinfo and qemu-img against uraid's server, and uraid's
//! client against nbdkit --tls=require and qemu-nbd --tls-creds. A certificate from
//! another CA, a plain client on a TLS-only server and nbds:// without a CA are refused
//! with errors that say so.
//!
//! TLS-PSK (pre-shared keys, as nbdkit's `--tls-psk`; OpenSSL), uraid's server with uraid's
//! client: data round trip from several threads, then a wrong key, an unknown identity and a
//! plain client refused, each named; the server still serves after them.
//! `tls::close_all` (a process's last step) ends every open TLS connection; it acts on the
//! whole process, so the tests here run one at a time.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uraid_nbd::client::{Client, ClientConfig, ClientError};
use uraid_nbd::{Backend, Listener, MemBackend, RunningServer, Server, ServerConfig};
use uraid_nbd::{TlsClient, TlsServer};
use uraid_testkit::data::pattern;
use uraid_testkit::pki::Pki;
use uraid_testkit::{need_tool, TempDir};

/// uraid's server on TCP loopback with TLS (`required` or only offered).
struct TlsServed {
    port: u16,
    running: Option<RunningServer>,
}

impl TlsServed {
    fn start(pki: &Pki, required: bool) -> TlsServed {
        TlsServed::serving(TlsServer::from_pem_files(&pki.cert(), &pki.key(), required).unwrap())
    }

    /// With pre-shared keys from `keys`, TLS required.
    fn psk(keys: &Path) -> TlsServed {
        TlsServed::serving(TlsServer::from_psk_file(keys, true).unwrap())
    }

    fn serving(tls: TlsServer) -> TlsServed {
        let listener = Listener::bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = listener.tcp_addr().unwrap().port();
        let config = ServerConfig {
            export_name: "disk".into(),
            tls: Some(tls),
            ..ServerConfig::default()
        };
        let backend = Arc::new(MemBackend::new(8 << 20)) as Arc<dyn Backend>;
        let running = Server::new(config)
            .unwrap()
            .spawn(listener, backend)
            .unwrap();
        TlsServed {
            port,
            running: Some(running),
        }
    }
}

impl Drop for TlsServed {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.shutdown();
        }
    }
}

fn tls_config(ca: &std::path::Path) -> ClientConfig {
    ClientConfig {
        timeout: Duration::from_secs(30),
        tls: Some(TlsClient::from_ca_file(ca).unwrap()),
        ..ClientConfig::default()
    }
}

/// Writes and reads back 16 blocks of 64 KiB from 4 threads, requests in flight together.
fn roundtrip(c: &Arc<Client>, seed: u64) {
    let block = 64 << 10;
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for b in (t..16).step_by(4) {
                    c.write(&pattern(block, b + seed), b * block as u64, false)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    c.flush().unwrap();
    let tickets: Vec<_> = (0..16u64)
        .map(|b| c.start_read(b * block as u64, block as u32))
        .collect();
    for (b, t) in tickets.into_iter().enumerate() {
        assert!(
            t.wait().unwrap() == pattern(block, b as u64 + seed),
            "block {b}"
        );
    }
}

/// One test at a time in this binary: [`uraid_nbd::tls::close_all`] ends every TLS
/// connection of the process.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A key file of `(identity, key)` lines, keys made from `seed`.
fn key_file(dir: &TempDir, name: &str, ids: &[(&str, u64)]) -> PathBuf {
    let path = dir.path(name);
    let text: String = ids
        .iter()
        .map(|(id, seed)| {
            let key: String = pattern(32, *seed)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("{id}:{key}\n")
        })
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// A client with no TLS of its own (a PSK URI brings its key file).
fn config() -> ClientConfig {
    ClientConfig {
        timeout: Duration::from_secs(30),
        ..ClientConfig::default()
    }
}

#[test]
fn uraid_client_and_server_over_tls() {
    let _one = one_at_a_time();
    let dir = TempDir::new("tls-own");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let s = TlsServed::start(&pki, true);
    let uri = format!("nbds://127.0.0.1:{}/disk", s.port);
    let c = Arc::new(Client::open(&uri, &tls_config(&pki.ca())).unwrap());
    assert_eq!(c.info().size_bytes, 8 << 20);
    roundtrip(&c, 7);
    // By name too (the certificate carries both).
    let uri = format!("nbds://localhost:{}/disk", s.port);
    let c = Arc::new(Client::open(&uri, &tls_config(&pki.ca())).unwrap());
    roundtrip(&c, 7);
}

#[test]
fn a_tls_only_server_refuses_plain_clients_and_a_wrong_ca_is_refused() {
    let _one = one_at_a_time();
    let dir = TempDir::new("tls-refuse");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let other = Pki::new(&dir.path("other"), "some other CA");
    let s = TlsServed::start(&pki, true);

    let plain = format!("nbd://127.0.0.1:{}/disk", s.port);
    let e = Client::open(&plain, &ClientConfig::default()).unwrap_err();
    assert!(matches!(e, ClientError::TlsRequired { .. }), "{e}");
    assert!(e.to_string().contains("requires TLS"), "{e}");

    let uri = format!("nbds://127.0.0.1:{}/disk", s.port);
    let e = Client::open(&uri, &tls_config(&other.ca())).unwrap_err();
    assert!(matches!(e, ClientError::Certificate { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&uri) && msg.contains("not signed by the CA in --nbd-tls-ca"),
        "{e}"
    );
    assert_eq!(msg.matches("certificate").count(), 1, "said once: {e}");

    let e = Client::open(&uri, &ClientConfig::default()).unwrap_err();
    assert!(matches!(e, ClientError::TlsNoCa { .. }), "{e}");
    assert!(e.to_string().contains("--nbd-tls-ca"), "{e}");

    // A certificate for another name than the one connected to.
    let e = Client::open(
        &format!("nbds://127.0.0.1:{}/disk?tls-hostname=elsewhere", s.port),
        &tls_config(&pki.ca()),
    )
    .unwrap_err();
    assert!(matches!(e, ClientError::Certificate { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("not made out for elsewhere (it names localhost, 127.0.0.1)"),
        "{e}"
    );

    // The server still serves after all that.
    let c = Arc::new(Client::open(&uri, &tls_config(&pki.ca())).unwrap());
    roundtrip(&c, 7);
}

#[test]
fn tls_offered_not_required_serves_both() {
    let _one = one_at_a_time();
    let dir = TempDir::new("tls-offered");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let s = TlsServed::start(&pki, false);
    let plain = Arc::new(
        Client::open(
            &format!("nbd://127.0.0.1:{}/disk", s.port),
            &ClientConfig::default(),
        )
        .unwrap(),
    );
    roundtrip(&plain, 7);
    let tls = Client::open(
        &format!("nbds://127.0.0.1:{}/disk", s.port),
        &tls_config(&pki.ca()),
    )
    .unwrap();
    let mut b = vec![0u8; 64 << 10];
    tls.read(&mut b, 0).unwrap();
    assert!(b == pattern(64 << 10, 7), "what the plain client wrote");
}

#[test]
fn nbdinfo_and_qemu_img_over_tls_against_uraid() {
    let _one = one_at_a_time();
    if !need_tool("nbdinfo", "nbdinfo_and_qemu_img_over_tls_against_uraid")
        || !need_tool("qemu-img", "nbdinfo_and_qemu_img_over_tls_against_uraid")
    {
        return;
    }
    let dir = TempDir::new("tls-tools");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let s = TlsServed::start(&pki, true);
    let out = Command::new("nbdinfo")
        .arg("--size")
        .arg(format!(
            "nbds://127.0.0.1:{}/disk?tls-certificates={}",
            s.port,
            pki.dir.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "nbdinfo: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "8388608");

    let out = Command::new("qemu-img")
        .arg("info")
        .arg("--object")
        .arg(format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            pki.dir.display()
        ))
        .arg("--image-opts")
        .arg(format!(
            "driver=nbd,host=127.0.0.1,port={},export=disk,tls-creds=tls0",
            s.port
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "qemu-img: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("8 MiB"),
        "{out:?}"
    );
}

/// A server process on a TCP port, killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `cmd` and opens `uri` with `config` once it answers (60 s at most: a safety
/// net, not a measure).
fn start_and_open(mut cmd: Command, uri: &str, config: &ClientConfig) -> (Proc, Client) {
    let mut p = Proc(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}")),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Client::open(uri, config) {
            Ok(c) => return (p, c),
            Err(ClientError::Connect { .. }) if Instant::now() < deadline => {
                if let Ok(Some(st)) = p.0.try_wait() {
                    panic!("{cmd:?} exited: {st}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{uri}: {e}"),
        }
    }
}

#[test]
fn uraid_client_against_nbdkit_tls_require() {
    let _one = one_at_a_time();
    if !need_tool("nbdkit", "uraid_client_against_nbdkit_tls_require") {
        return;
    }
    let dir = TempDir::new("tls-nbdkit");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let port = free_port();
    let mut cmd = Command::new("nbdkit");
    cmd.args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .arg("--tls=require")
        .arg(format!("--tls-certificates={}", pki.dir.display()))
        .args(["memory", "8M"]);
    let uri = format!("nbds://127.0.0.1:{port}/");
    let (_p, c) = start_and_open(cmd, &uri, &tls_config(&pki.ca()));
    roundtrip(&Arc::new(c), 7);
    // nbdkit refuses the plain client: uraid names it.
    let e = Client::open(
        &format!("nbd://127.0.0.1:{port}/"),
        &ClientConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(e, ClientError::TlsRequired { .. }), "{e}");
    let other = Pki::new(&dir.path("other"), "some other CA");
    let e = Client::open(&uri, &tls_config(&other.ca())).unwrap_err();
    assert!(e.to_string().contains("certificate"), "{e}");
}

#[test]
fn uraid_client_against_qemu_nbd_tls_creds() {
    let _one = one_at_a_time();
    if !need_tool("qemu-nbd", "uraid_client_against_qemu_nbd_tls_creds") {
        return;
    }
    let dir = TempDir::new("tls-qemu");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let img = dir.image("disk.img", 8);
    let port = free_port();
    let mut cmd = Command::new("qemu-nbd");
    cmd.args(["-f", "raw", "-b", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .arg("--object")
        .arg(format!(
            "tls-creds-x509,id=tls0,endpoint=server,verify-peer=off,dir={}",
            pki.dir.display()
        ))
        .args(["--tls-creds", "tls0", "--persistent"])
        .arg(&img);
    let uri = format!("nbds://127.0.0.1:{port}/");
    let (_p, c) = start_and_open(cmd, &uri, &tls_config(&pki.ca()));
    roundtrip(&Arc::new(c), 7);
}

#[test]
fn uraid_client_and_server_over_tls_psk() {
    let _one = one_at_a_time();
    let dir = TempDir::new("tls-psk-own");
    let keys = key_file(&dir, "server.psk", &[("alice", 1), ("bob", 2)]);
    let s = TlsServed::psk(&keys);
    // Each identity with its own key, named in the URI both ways libnbd names it.
    let uri = format!(
        "nbds://127.0.0.1:{}/disk?tls-psk-file={}&tls-username=alice",
        s.port,
        keys.display()
    );
    let c = Arc::new(Client::open(&uri, &config()).unwrap());
    assert_eq!(c.info().size_bytes, 8 << 20);
    roundtrip(&c, 7);
    let bob = key_file(&dir, "bob.psk", &[("bob", 2)]);
    let uri = format!(
        "nbds://bob@127.0.0.1:{}/disk?tls-psk-file={}",
        s.port,
        bob.display()
    );
    let c2 = Arc::new(Client::open(&uri, &config()).unwrap());
    let mut b = vec![0u8; 64 << 10];
    c2.read(&mut b, 0).unwrap();
    assert!(b == pattern(64 << 10, 7), "what alice wrote");
    roundtrip(&c2, 11);
    drop(c);
    // The only identity of a file needs no name; the key file may be the client's option
    // (`--nbd-tls-psk`) in place of the URI's.
    let global = ClientConfig {
        tls: Some(TlsClient::from_psk_file(&bob, None).unwrap()),
        ..config()
    };
    let c3 = Client::open(&format!("nbds://127.0.0.1:{}/disk", s.port), &global).unwrap();
    c3.read(&mut b, 0).unwrap();
    assert!(b == pattern(64 << 10, 11), "what bob wrote");
    // A members' key file of two identities: each URI names its own, or is refused.
    let both = ClientConfig {
        tls: Some(TlsClient::from_psk_file_for_members(&keys, None).unwrap()),
        ..config()
    };
    let e = Client::open(&format!("nbds://127.0.0.1:{}/disk", s.port), &both).unwrap_err();
    assert!(matches!(e, ClientError::TlsPsk { .. }), "{e}");
    assert!(e.to_string().contains("holds 2 identities"), "{e}");
    let c4 = Client::open(&format!("nbds://alice@127.0.0.1:{}/disk", s.port), &both).unwrap();
    c4.read(&mut b, 0).unwrap();
    assert!(b == pattern(64 << 10, 11), "what bob wrote");
}

#[test]
fn a_wrong_key_an_unknown_identity_and_a_plain_client_are_refused_by_name() {
    let _one = one_at_a_time();
    let dir = TempDir::new("tls-psk-refuse");
    let keys = key_file(&dir, "server.psk", &[("alice", 1)]);
    let s = TlsServed::psk(&keys);

    let wrong = key_file(&dir, "wrong.psk", &[("alice", 99)]);
    let uri = format!(
        "nbds://127.0.0.1:{}/disk?tls-psk-file={}",
        s.port,
        wrong.display()
    );
    let e = Client::open(&uri, &config()).unwrap_err();
    assert!(matches!(e, ClientError::PskRefused { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&uri) && msg.contains("refused the pre-shared key for identity \"alice\""),
        "{e}"
    );
    assert_eq!(msg.matches("pre-shared").count(), 1, "said once: {e}");

    let unknown = key_file(&dir, "carol.psk", &[("carol", 1)]);
    let uri = format!(
        "nbds://127.0.0.1:{}/disk?tls-psk-file={}",
        s.port,
        unknown.display()
    );
    let e = Client::open(&uri, &config()).unwrap_err();
    assert!(matches!(e, ClientError::PskRefused { .. }), "{e}");
    assert!(e.to_string().contains("identity \"carol\""), "{e}");

    // A username the client's own file lacks: named before connecting.
    let uri = format!(
        "nbds://dave@127.0.0.1:{}/disk?tls-psk-file={}",
        s.port,
        keys.display()
    );
    let e = Client::open(&uri, &config()).unwrap_err();
    assert!(matches!(e, ClientError::TlsPsk { .. }), "{e}");
    assert!(e.to_string().contains("no identity \"dave\""), "{e}");

    let e = Client::open(&format!("nbd://127.0.0.1:{}/disk", s.port), &config()).unwrap_err();
    assert!(matches!(e, ClientError::TlsRequired { .. }), "{e}");

    // Still serving, to the right key.
    let uri = format!(
        "nbds://127.0.0.1:{}/disk?tls-psk-file={}",
        s.port,
        keys.display()
    );
    let c = Arc::new(Client::open(&uri, &config()).unwrap());
    roundtrip(&c, 3);
}

/// What a process does last (`uraid`'s main): every TLS connection still open is ended, its
/// close_notify sent, within the limit; the client held open finds its connection closed,
/// and the server goes on serving new ones.
#[test]
fn close_all_ends_every_open_tls_connection() {
    let _one = one_at_a_time();
    let dir = TempDir::new("tls-psk-close");
    let keys = key_file(&dir, "server.psk", &[("alice", 1)]);
    let s = TlsServed::psk(&keys);
    let uri = format!(
        "nbds://127.0.0.1:{}/disk?tls-psk-file={}",
        s.port,
        keys.display()
    );
    let held = Arc::new(Client::open(&uri, &config()).unwrap());
    roundtrip(&held, 5);
    assert!(
        uraid_nbd::tls::close_all(Duration::from_secs(20)),
        "a TLS pump was left running"
    );
    let mut b = vec![0u8; 4096];
    assert!(
        held.read(&mut b, 0).is_err(),
        "read over an ended connection"
    );
    let c = Arc::new(Client::open(&uri, &config()).unwrap());
    roundtrip(&c, 6);
}
