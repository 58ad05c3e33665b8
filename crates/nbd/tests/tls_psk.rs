//! NBD over TLS-PSK (pre-shared keys, as nbdkit's `--tls-psk`; OpenSSL), uraid's server
//! with uraid's client over loopback TCP: data round trip from several threads, then a
//! wrong key, an unknown identity and a plain client refused, each named; the server still
//! serves after them. `tls::close_all` (a process's last step) ends every open TLS
//! connection; it acts on the whole process, so the tests here run one at a time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use uraid_nbd::client::{Client, ClientConfig, ClientError};
use uraid_nbd::{Backend, Listener, MemBackend, RunningServer, Server, ServerConfig};
use uraid_nbd::{TlsClient, TlsServer};
use uraid_testkit::data::pattern;
use uraid_testkit::TempDir;

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

struct PskServed {
    port: u16,
    running: Option<RunningServer>,
}

impl PskServed {
    fn start(keys: &Path) -> PskServed {
        let listener = Listener::bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = listener.tcp_addr().unwrap().port();
        let config = ServerConfig {
            export_name: "disk".into(),
            tls: Some(TlsServer::from_psk_file(keys, true).unwrap()),
            ..ServerConfig::default()
        };
        let backend = Arc::new(MemBackend::new(8 << 20)) as Arc<dyn Backend>;
        let running = Server::new(config)
            .unwrap()
            .spawn(listener, backend)
            .unwrap();
        PskServed {
            port,
            running: Some(running),
        }
    }
}

impl Drop for PskServed {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.shutdown();
        }
    }
}

/// One test at a time in this binary: [`uraid_nbd::tls::close_all`] ends every TLS
/// connection of the process.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn config() -> ClientConfig {
    ClientConfig {
        timeout: Duration::from_secs(30),
        ..ClientConfig::default()
    }
}

/// Writes 16 blocks of 64 KiB from 4 threads and reads them back, in flight together.
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

#[test]
fn uraid_client_and_server_over_tls_psk() {
    let _one = one_at_a_time();
    let dir = TempDir::new("tls-psk-own");
    let keys = key_file(&dir, "server.psk", &[("alice", 1), ("bob", 2)]);
    let s = PskServed::start(&keys);
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
    let s = PskServed::start(&keys);

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
    let s = PskServed::start(&keys);
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
