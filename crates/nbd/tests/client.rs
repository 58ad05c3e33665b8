//! uraid's NBD client against real servers: nbdkit (memory plugin, the blocksize-policy
//! filter) on a Unix socket and on TCP loopback, qemu-nbd (structured replies, holes),
//! nbd-server (the reference server, simple replies, a named export) and uraid's own
//! server; and a server that dies or stalls, which must give errors, not hangs.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uraid_nbd::client::{Client, ClientConfig};
use uraid_testkit::{data::pattern, need_tool, TempDir};

/// A server process, killed on drop.
struct ServerProc {
    child: Child,
    uri: String,
}

impl ServerProc {
    /// SIGKILL, and wait until it is gone (its sockets closed).
    fn kill_and_wait(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGSTOP, and wait until every thread of the server is stopped: kill() returns
    /// before a thread running on another CPU has stopped, and in that window it could
    /// still answer a request sent meanwhile.
    fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.child.id());
        let stopped = || {
            std::fs::read_dir(&tasks).unwrap().all(|t| {
                let stat =
                    std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                // The state follows the command name's closing parenthesis.
                let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
                matches!(state, Some(Some('T' | 't')))
            })
        };
        let start = std::time::Instant::now();
        while !stopped() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "server did not stop"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (60 s at most: a safety net, not a measure) until the server accepts a client.
fn wait_up(uri: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if Client::open(uri, &ClientConfig::default()).is_ok() {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the server for {uri} exited: {st}");
        }
        assert!(Instant::now() < deadline, "{uri}: server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(mut cmd: Command, uri: String) -> ServerProc {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    wait_up(&uri, &mut child);
    ServerProc { child, uri }
}

/// `nbdkit ARGS` on a Unix socket in `dir`.
fn nbdkit_unix(dir: &TempDir, args: &[&str]) -> ServerProc {
    nbdkit_unix_export(dir, "", args)
}

/// `nbdkit ARGS` on a Unix socket in `dir`, reached through export `export`.
fn nbdkit_unix_export(dir: &TempDir, export: &str, args: &[&str]) -> ServerProc {
    let sock = dir.path("nbdkit.sock");
    let mut cmd = Command::new("nbdkit");
    cmd.args(["-f", "--exit-with-parent", "-U"])
        .arg(&sock)
        .args(args);
    spawn(
        cmd,
        format!("nbd+unix:///{export}?socket={}", sock.display()),
    )
}

/// `qemu-nbd` serving a new sparse raw image of `size` bytes in `dir` on a Unix socket.
fn qemu_nbd_sparse(dir: &TempDir, size: u64) -> ServerProc {
    let img = dir.path("disk.raw");
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let sock: PathBuf = dir.path("qemu.sock");
    let mut cmd = Command::new("qemu-nbd");
    cmd.args(["-t", "-f", "raw", "-k"]).arg(&sock).arg(&img);
    spawn(cmd, format!("nbd+unix:///?socket={}", sock.display()))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config(timeout_secs: u64) -> ClientConfig {
    ClientConfig {
        timeout: Duration::from_secs(timeout_secs),
        ..ClientConfig::default()
    }
}

/// Runs `f` on a thread and gives its result, failing the test if it has not returned in
/// 120 s (a hang is the bug these tests look for; the bound is no claim about speed).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("{what}: hung"))
}

/// Writes from 8 threads at once (each its own 64 KiB blocks, several requests in flight
/// on one connection), then reads every block back.
fn concurrent_roundtrip(c: &Arc<Client>, blocks: u64) {
    let block = 64 << 10;
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for b in (t..blocks).step_by(8) {
                    c.write(&pattern(block, b + 1), b * block as u64, b % 3 == 0)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    c.flush().unwrap();
    // Reads in flight together through tickets, answered in any order.
    let tickets: Vec<_> = (0..blocks)
        .map(|b| c.start_read(b * block as u64, block as u32))
        .collect();
    for (b, t) in tickets.into_iter().enumerate() {
        let data = t.wait().unwrap();
        assert!(data == pattern(block, b as u64 + 1), "block {b} differs");
    }
    // One large read, split by the client at the server's maximum.
    let mut all = vec![0u8; blocks as usize * block];
    c.read(&mut all, 0).unwrap();
    for b in 0..blocks as usize {
        assert!(all[b * block..(b + 1) * block] == pattern(block, b as u64 + 1));
    }
}

fn zeroes_and_trim(c: &Client) {
    assert!(c.info().can_write_zeroes() && c.info().can_trim());
    c.write(&[0xab; 8192], 4096, false).unwrap();
    c.write_zeroes(4096, 4096, true, true).unwrap();
    let mut b = vec![1u8; 8192];
    c.read(&mut b, 4096).unwrap();
    assert!(b[..4096].iter().all(|&x| x == 0), "write-zeroes left data");
    assert!(
        b[4096..].iter().all(|&x| x == 0xab),
        "write-zeroes went too far"
    );
    c.trim(0, 1 << 20).unwrap();
    // Beyond the end: refused before anything is sent.
    let size = c.info().size_bytes;
    assert!(c.read(&mut [0u8; 512], size).is_err());
}

/// Where `[offset, offset + len)` reads as zeros, from `base:allocation`: (start, end,
/// zero) runs, asked again from where each answer stopped.
fn zero_map(c: &Client, offset: u64, len: u64) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    let mut at = offset;
    while at < offset + len {
        let extents = c.block_status(at, offset + len - at).unwrap();
        assert!(!extents.is_empty());
        for e in extents {
            assert!(
                e.length > 0 && at + e.length <= offset + len,
                "{e:?} at {at}"
            );
            match out.last_mut() {
                Some(last) if last.2 == e.zero => last.1 += e.length,
                _ => out.push((at, at + e.length, e.zero)),
            }
            at += e.length;
        }
    }
    out
}

/// A server's `base:allocation`, asked through [`Client::block_status`]: 64 KiB written at
/// 1 MiB of an otherwise unwritten export is data, the rest reads as zeros, and the
/// answers start where asked (also inside a block) and stop at the range's end.
fn written_is_data_and_the_rest_zero(c: &Client) {
    assert!(c.info().block_status, "the server sets base:allocation");
    c.write(&pattern(64 << 10, 9), 1 << 20, true).unwrap();
    let size = c.info().size_bytes;
    let map = zero_map(c, 0, size);
    assert_eq!(
        map,
        vec![
            (0, 1 << 20, true),
            (1 << 20, (1 << 20) + (64 << 10), false),
            ((1 << 20) + (64 << 10), size, true)
        ]
    );
    // A range inside the data, not block aligned.
    assert_eq!(
        zero_map(c, (1 << 20) + 100, 1000),
        vec![((1 << 20) + 100, (1 << 20) + 1100, false)]
    );
    // Beyond the end: refused before anything is sent.
    assert!(c.block_status(size - 512, 1024).is_err());
}

#[test]
fn block_status_from_nbdkit_qemu_nbd_and_uraids_own_server() {
    let server = common::TestServer::start(8 << 20);
    written_is_data_and_the_rest_zero(&Client::open(&server.uri(), &config(30)).unwrap());
    if need_tool("nbdkit", "block_status_from_nbdkit") {
        let dir = TempDir::new("client-status-nbdkit");
        let s = nbdkit_unix(&dir, &["memory", "16M"]);
        written_is_data_and_the_rest_zero(&Client::open(&s.uri, &config(30)).unwrap());
    }
    if need_tool("qemu-nbd", "block_status_from_qemu_nbd") {
        let dir = TempDir::new("client-status-qemu");
        let s = qemu_nbd_sparse(&dir, 8 << 20);
        written_is_data_and_the_rest_zero(&Client::open(&s.uri, &config(30)).unwrap());
    }
}

/// Without structured replies there is no block status: the client says so, and sends
/// nothing.
#[test]
fn block_status_needs_structured_replies() {
    let server = common::TestServer::start(1 << 20);
    let cfg = ClientConfig {
        structured_replies: false,
        ..config(30)
    };
    let c = Client::open(&server.uri(), &cfg).unwrap();
    assert!(!c.info().block_status);
    let e = c.block_status(0, 4096).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
}

#[test]
fn nbdkit_memory_on_a_unix_socket() {
    if !need_tool("nbdkit", "nbdkit_memory_on_a_unix_socket") {
        return;
    }
    let dir = TempDir::new("client-unix");
    let s = nbdkit_unix(&dir, &["memory", "16M"]);
    let c = Arc::new(Client::open(&s.uri, &config(30)).unwrap());
    let info = *c.info();
    assert_eq!(info.size_bytes, 16 << 20);
    assert!(info.structured_replies, "nbdkit offers structured replies");
    assert!(info.can_flush() && info.can_fua() && !info.read_only());
    concurrent_roundtrip(&c, 64);
    zeroes_and_trim(&c);
}

#[test]
fn nbdkit_memory_on_tcp_loopback_with_multi_conn() {
    if !need_tool("nbdkit", "nbdkit_memory_on_tcp_loopback_with_multi_conn") {
        return;
    }
    let port = free_port();
    let mut cmd = Command::new("nbdkit");
    cmd.args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["memory", "16M"]);
    let s = spawn(cmd, format!("nbd://127.0.0.1:{port}/"));
    let cfg = ClientConfig {
        connections: 3,
        ..config(30)
    };
    let c = Arc::new(Client::open(&s.uri, &cfg).unwrap());
    assert!(c.info().can_multi_conn());
    assert_eq!(c.connections(), 3, "nbdkit memory advertises multi-conn");
    concurrent_roundtrip(&c, 48);
    zeroes_and_trim(&c);
}

#[test]
fn block_size_minimum_is_honoured() {
    if !need_tool("nbdkit", "block_size_minimum_is_honoured") {
        return;
    }
    let dir = TempDir::new("client-bs");
    // The filter fails any request that breaks the advertised sizes.
    let s = nbdkit_unix(
        &dir,
        &[
            "--filter=blocksize-policy",
            "memory",
            "4M",
            "blocksize-minimum=4096",
            "blocksize-preferred=65536",
            "blocksize-maximum=65536",
            "blocksize-error-policy=error",
        ],
    );
    let c = Client::open(&s.uri, &config(30)).unwrap();
    assert_eq!(c.info().min_block_bytes, 4096);
    assert_eq!(c.info().max_payload_bytes, 65536);
    // 512 bytes inside a 4 KiB block: read-modify-write around it.
    let whole = pattern(4096, 7);
    c.write(&whole, 8192, false).unwrap();
    c.write(&[0x55; 512], 8192 + 512, false).unwrap();
    let mut expect = whole.clone();
    expect[512..1024].fill(0x55);
    let mut back = vec![0u8; 512 * 3];
    c.read(&mut back, 8192).unwrap();
    assert!(back[..] == expect[..512 * 3]);
    // 1 MiB at once: split at the 64 KiB maximum.
    let big = pattern(1 << 20, 9);
    c.write(&big, 1 << 20, false).unwrap();
    let mut back = vec![0u8; 1 << 20];
    c.read(&mut back, 1 << 20).unwrap();
    assert!(back == big);
}

#[test]
fn qemu_nbd_structured_replies_with_holes() {
    if !need_tool("qemu-nbd", "qemu_nbd_structured_replies_with_holes") {
        return;
    }
    let dir = TempDir::new("client-qemu");
    let s = qemu_nbd_sparse(&dir, 8 << 20);
    let c = Client::open(&s.uri, &config(30)).unwrap();
    assert_eq!(c.info().size_bytes, 8 << 20);
    assert!(c.info().structured_replies);
    // Data between holes: qemu-nbd answers a sparse read with hole and data chunks.
    let data = pattern(64 << 10, 3);
    c.write(&data, 3 << 20, true).unwrap();
    let mut back = vec![0xffu8; 4 << 20];
    c.read(&mut back, 1 << 20).unwrap();
    let at = 2 << 20;
    assert!(back[..at].iter().all(|&x| x == 0), "hole before the data");
    assert!(back[at..at + data.len()] == data[..]);
    assert!(
        back[at + data.len()..].iter().all(|&x| x == 0),
        "hole after"
    );
}

/// nbd-server, which daemonizes: its pid from the pid file it writes (`-p`), killed (with
/// the children it forks per connection, its process group) on drop.
struct NbdServer {
    pid: i32,
}

impl NbdServer {
    /// Waits for the daemon's pid in `pidfile`.
    fn from_pidfile(pidfile: &std::path::Path) -> NbdServer {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(pidfile).unwrap_or_default();
            if let Ok(pid) = text.trim().parse::<i32>() {
                return NbdServer { pid };
            }
            assert!(
                Instant::now() < deadline,
                "nbd-server wrote no pid to {}",
                pidfile.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        // SAFETY: signals only the daemon this test started (and its connection children,
        // which are in its process group, it being a session leader after daemonizing).
        unsafe {
            libc::kill(-self.pid, libc::SIGTERM);
            libc::kill(self.pid, libc::SIGTERM);
        }
    }
}

#[test]
fn nbd_server_with_a_named_export_and_simple_replies() {
    const TEST: &str = "nbd_server_with_a_named_export_and_simple_replies";
    if !need_tool("nbd-server", TEST) {
        return;
    }
    let dir = TempDir::new("client-nbd-server");
    let img = dir.path("disk.raw");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let port = free_port();
    let conf = dir.path("nbd-server.conf");
    std::fs::write(
        &conf,
        format!(
            "[generic]\n    port = {port}\n    listenaddr = 127.0.0.1\n[disk]\n    exportname = {}\n",
            img.display()
        ),
    )
    .unwrap();
    let pidfile = dir.path("nbd-server.pid");
    let st = Command::new("nbd-server")
        .arg("-C")
        .arg(&conf)
        .arg("-p")
        .arg(&pidfile)
        .status()
        .unwrap();
    assert!(st.success(), "nbd-server -C {}: {st}", conf.display());
    let _server = NbdServer::from_pidfile(&pidfile);
    let uri = format!("nbd://127.0.0.1:{port}/disk");
    let deadline = Instant::now() + Duration::from_secs(60);
    let c = loop {
        match Client::open(&uri, &config(30)) {
            Ok(c) => break Arc::new(c),
            Err(e) => {
                assert!(Instant::now() < deadline, "{uri}: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert_eq!(c.info().size_bytes, 8 << 20);
    concurrent_roundtrip(&c, 64);
    // The bytes reached the export file, where nbd-server keeps them.
    let on_disk = std::fs::read(&img).unwrap();
    assert!(on_disk[64 << 10..128 << 10] == pattern(64 << 10, 2)[..]);
    // An export it does not have is refused with its words, not a hang.
    let e = match Client::open(&format!("nbd://127.0.0.1:{port}/nosuch"), &config(30)) {
        Ok(_) => panic!("an export nbd-server does not have was opened"),
        Err(e) => e,
    };
    assert!(e.to_string().contains("nosuch"), "{e}");
}

#[test]
fn uraids_own_server() {
    let server = common::TestServer::start(8 << 20);
    let c = Arc::new(Client::open(&server.uri(), &config(30)).unwrap());
    assert_eq!(c.info().size_bytes, 8 << 20);
    assert!(c.info().structured_replies);
    concurrent_roundtrip(&c, 32);
}

/// Many threads, each with requests in flight, on one connection: whoever waits reads the
/// socket for everyone in turn (leader and followers). A turn lost between them would leave
/// every waiter asleep until the timeout (20 s), and the requests would fail.
#[test]
fn many_waiters_take_turns_reading_without_losing_one() {
    let server = common::TestServer::start(16 << 20);
    let c = Arc::new(Client::open(&server.uri(), &config(20)).unwrap());
    let block = 4096usize;
    bounded("32 threads of small requests", move || {
        let threads: Vec<_> = (0..32u64)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for i in 0..300u64 {
                        let b = (t * 300 + i) % 4096;
                        let data = pattern(block, b + 7 * t + 1);
                        c.write(&data, b * block as u64, false).unwrap();
                        // Two reads in flight from this thread, waited in reverse order.
                        let t1 = c.start_read(b * block as u64, block as u32);
                        let t2 = c.start_read(((b + 1) % 4096) * block as u64, block as u32);
                        t2.wait().unwrap();
                        assert_eq!(t1.wait().unwrap(), data, "thread {t} block {b}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
}

/// Replies that finish together: small ones (up to 16 KiB) are combined into one write by
/// whichever worker is sending, large ones go out alone from their worker's buffer, and
/// every reply must still arrive whole and right. 64 workers answer reads of 512 bytes to
/// 256 KiB (both sides of the cut) and writes, all in flight at once; a reply cut by
/// another's bytes, or one left queued, fails a read's data or its ticket.
#[test]
fn small_and_large_replies_at_once_arrive_whole() {
    let size = 16usize << 20;
    let server = common::TestServer::start_with(
        uraid_nbd::MemBackend::new(size),
        uraid_nbd::ServerConfig {
            workers_per_connection: 64,
            ..uraid_nbd::ServerConfig::default()
        },
    );
    let c = Arc::new(Client::open(&server.uri(), &config(20)).unwrap());
    let all = pattern(size, 99);
    c.write(&all, 0, false).unwrap();
    let sizes = [512usize, 4096, 16 << 10, (16 << 10) + 4096, 256 << 10];
    bounded("mixed replies", move || {
        for round in 0..20u64 {
            let mut reads = Vec::new();
            let mut writes = Vec::new();
            for i in 0..200u64 {
                let len = sizes[((i + round) % sizes.len() as u64) as usize];
                let at = ((i * 7919 + round * 104729) % (size / len) as u64) * len as u64;
                if i % 5 == 4 {
                    // Rewrites of the same bytes: the data stays the pattern.
                    let d = all[at as usize..at as usize + len].to_vec();
                    writes.push(c.start_write(&d, at, false));
                } else {
                    reads.push((at, len, c.start_read(at, len as u32)));
                }
            }
            for (at, len, t) in reads {
                let got = t.wait().unwrap();
                assert!(
                    got[..] == all[at as usize..at as usize + len],
                    "round {round}: read of {len} at {at} differs"
                );
            }
            for t in writes {
                t.wait().unwrap();
            }
        }
    });
}

/// Replies the server sends for requests nobody waits for yet must still be read when a
/// send would block: the server may stop taking requests until its replies have gone (here
/// one worker per connection, which blocks writing a reply). 64 reads of 1 MiB are sent
/// and not waited for, more than the sockets buffer; then a large write must get through.
#[test]
fn replies_nobody_waits_for_do_not_stop_a_send() {
    let server = common::TestServer::start_with(
        uraid_nbd::MemBackend::new(80 << 20),
        uraid_nbd::ServerConfig {
            workers_per_connection: 1,
            ..uraid_nbd::ServerConfig::default()
        },
    );
    let c = Arc::new(Client::open(&server.uri(), &config(60)).unwrap());
    let mib = 1usize << 20;
    bounded("a write behind unread replies", move || {
        let tickets: Vec<_> = (0..64u64)
            .map(|i| c.start_read(i * mib as u64, mib as u32))
            .collect();
        c.write(&pattern(8 * mib, 3), 64 * mib as u64, false)
            .unwrap();
        for t in tickets {
            assert_eq!(t.wait().unwrap().len(), mib);
        }
        let mut back = vec![0u8; 8 * mib];
        c.read(&mut back, 64 * mib as u64).unwrap();
        assert!(back == pattern(8 * mib, 3));
    });
}

/// A server that goes away while the connection is idle shows as lost at once (the
/// watcher sees the hang-up), without a request to find it out.
#[test]
fn an_idle_connection_closed_by_the_server_shows_as_lost() {
    if !need_tool(
        "nbdkit",
        "an_idle_connection_closed_by_the_server_shows_as_lost",
    ) {
        return;
    }
    let dir = TempDir::new("client-idle-close");
    let mut s = nbdkit_unix(&dir, &["memory", "4M"]);
    let c = Arc::new(Client::open(&s.uri, &config(86_400)).unwrap());
    c.write(&[1; 4096], 0, false).unwrap();
    assert!(c.status().connected);
    s.kill_and_wait();
    let c2 = c.clone();
    let status = bounded("the close seen while idle", move || loop {
        let st = c2.status();
        if !st.connected {
            return st;
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    let why = status.error.unwrap_or_default();
    assert!(why.contains("closed"), "{why}");
}

#[test]
fn a_killed_server_fails_requests_at_once() {
    if !need_tool("nbdkit", "a_killed_server_fails_requests_at_once") {
        return;
    }
    let dir = TempDir::new("client-kill");
    let mut s = nbdkit_unix(&dir, &["memory", "4M"]);
    // A day's timeout: only the closed connection can end these requests.
    let c = Arc::new(Client::open(&s.uri, &config(86_400)).unwrap());
    c.write(&[1; 4096], 0, false).unwrap();
    s.kill_and_wait();
    let c2 = c.clone();
    let e = bounded("read after kill", move || {
        // The first request may be sent before the reader sees the close; it still fails.
        c2.read(&mut [0u8; 4096], 0).unwrap_err()
    });
    assert!(e.to_string().contains("connection closed"), "{e}");
    let e = c.write(&[1; 4096], 0, false).unwrap_err();
    assert!(e.to_string().contains("connection closed"), "{e}");
}

#[test]
fn a_stalled_server_times_out() {
    if !need_tool("nbdkit", "a_stalled_server_times_out") {
        return;
    }
    let dir = TempDir::new("client-stall");
    let s = nbdkit_unix(&dir, &["memory", "4M"]);
    let c = Arc::new(Client::open(&s.uri, &config(1)).unwrap());
    c.write(&[1; 4096], 0, false).unwrap();
    s.stop();
    let c2 = c.clone();
    let e = bounded("read from a stopped server", move || {
        c2.read(&mut [0u8; 4096], 0).unwrap_err()
    });
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    // The connection is closed: later requests fail without waiting for the server.
    s.signal(libc::SIGCONT);
    let e = c.read(&mut [0u8; 4096], 0).unwrap_err();
    assert!(e.to_string().contains("no reply"), "{e}");
}

#[test]
fn a_missing_export_is_refused_with_the_servers_words() {
    if !need_tool(
        "nbdkit",
        "a_missing_export_is_refused_with_the_servers_words",
    ) {
        return;
    }
    let dir = TempDir::new("client-noexport");
    let s = nbdkit_unix_export(
        &dir,
        "only",
        &[
            "--filter=exportname",
            "memory",
            "1M",
            "exportname=only",
            "exportname-strict=true",
        ],
    );
    let uri = format!(
        "nbd+unix:///other?socket={}",
        dir.path("nbdkit.sock").display()
    );
    let e = Client::open(&uri, &config(30)).unwrap_err();
    assert!(e.to_string().contains("refused export \"other\""), "{e}");
    assert_eq!(
        Client::open(&s.uri, &config(30)).unwrap().info().size_bytes,
        1 << 20
    );
}
