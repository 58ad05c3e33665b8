//! NBD over TLS (NBD_OPT_STARTTLS, X.509 with rustls), both sides: uraid's server with
//! uraid's client, libnbd's nbdinfo and qemu-img against uraid's server, and uraid's
//! client against nbdkit --tls=require and qemu-nbd --tls-creds. A certificate from
//! another CA, a plain client on a TLS-only server and nbds:// without a CA are refused
//! with errors that say so.

use std::net::TcpListener;
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
        let listener = Listener::bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = listener.tcp_addr().unwrap().port();
        let tls = TlsServer::from_pem_files(&pki.cert(), &pki.key(), required).unwrap();
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
fn roundtrip(c: &Arc<Client>) {
    let block = 64 << 10;
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for b in (t..16).step_by(4) {
                    c.write(&pattern(block, b + 7), b * block as u64, false)
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
            t.wait().unwrap() == pattern(block, b as u64 + 7),
            "block {b}"
        );
    }
}

#[test]
fn uraid_client_and_server_over_tls() {
    let dir = TempDir::new("tls-own");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let s = TlsServed::start(&pki, true);
    let uri = format!("nbds://127.0.0.1:{}/disk", s.port);
    let c = Arc::new(Client::open(&uri, &tls_config(&pki.ca())).unwrap());
    assert_eq!(c.info().size_bytes, 8 << 20);
    roundtrip(&c);
    // By name too (the certificate carries both).
    let uri = format!("nbds://localhost:{}/disk", s.port);
    let c = Arc::new(Client::open(&uri, &tls_config(&pki.ca())).unwrap());
    roundtrip(&c);
}

#[test]
fn a_tls_only_server_refuses_plain_clients_and_a_wrong_ca_is_refused() {
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
    roundtrip(&c);
}

#[test]
fn tls_offered_not_required_serves_both() {
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
    roundtrip(&plain);
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
    roundtrip(&Arc::new(c));
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
    roundtrip(&Arc::new(c));
}
