//! A panic in a connection's thread that is not the backend's (those are answered with
//! EIO): the connection closes with an error logged, its client does not hang, and other
//! connections go on. The panic is injected through a backend whose error for reads at
//! one offset panics when the connection formats it for the reply.
//! (Its own test binary: it installs a global log subscriber.)

mod common;

use common::*;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uraid_nbd::proto::Command;
use uraid_nbd::{Backend, Listener, MemBackend, Server, ServerConfig, ZeroFlags};
use uraid_testkit::TempDir;

const MIB: usize = 1 << 20;
const BOMB_OFFSET: u64 = 64 * 1024;

/// An error whose message panics: a bug in the connection's own code path, outside the
/// backend call that `guarded` protects.
#[derive(Debug)]
struct Bomb;

impl std::fmt::Display for Bomb {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("injected panic in the connection thread")
    }
}

impl std::error::Error for Bomb {}

struct BombBackend(MemBackend);

impl Backend for BombBackend {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if offset == BOMB_OFFSET {
            return Err(io::Error::other(Bomb));
        }
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        self.0.write(offset, buf, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.0.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.0.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> io::Result<()> {
        self.0.write_zeroes(offset, len, flags)
    }
}

/// The log, captured.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_panic_closes_its_connection_and_others_go_on() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let dir = TempDir::new("conn-panic");
    let path = dir.path("s.sock");
    let listener = Listener::bind_unix(&path).unwrap();
    let backend = Arc::new(BombBackend(MemBackend::new(MIB)));
    let running = Server::new(ServerConfig::default())
        .unwrap()
        .spawn(listener, backend as Arc<dyn Backend>)
        .unwrap();

    let mut other = Client::connect(&path, "", true).unwrap();
    assert_eq!(other.write(0, &[7; 4096]), 0);
    for structured in [true, false] {
        let mut victim = Client::connect(&path, "", structured).unwrap();
        assert_eq!(victim.write(8192, &[3; 512]), 0);
        victim
            .send(Command::Read, 0, BOMB_OFFSET, 512, &[])
            .unwrap();
        // Hang guard only (not a timing assertion): without the fix the read never ends.
        victim
            .stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        assert!(
            is_closed(&mut victim.stream),
            "the client of a panicked connection hung instead of seeing a close"
        );
        // The other connection, and a new one, go on.
        assert_eq!(other.read(0, 4096).unwrap(), vec![7; 4096]);
        let mut fresh = Client::connect(&path, "", structured).unwrap();
        assert_eq!(fresh.read(8192, 512).unwrap(), vec![3; 512]);
        fresh.disconnect();
    }
    other.disconnect();
    running.shutdown().unwrap();
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert_eq!(
        text.matches("a connection thread panicked (injected panic in the connection thread)")
            .count(),
        2,
        "one error logged per panicked connection:\n{text}"
    );
}
