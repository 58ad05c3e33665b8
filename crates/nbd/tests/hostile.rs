//! Hostile clients must not disturb a well-behaved one, nor change data.
//!
//! A good client keeps writing and verifying patterns in the first MiB while
//! raw sockets send garbage: bad magic, truncated handshakes, huge option
//! lengths, out-of-range and oversized requests, unknown commands, seeded
//! random bytes, disconnects mid-payload, pipelines whose replies are never
//! read. Afterwards the good data must be intact, the rest of the export
//! unchanged, and the server must still accept and serve clients.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use uraid_nbd::proto::*;
use uraid_nbd::{MemBackend, ServerConfig};
use uraid_testkit::data::pattern;

const MIB: usize = 1 << 20;
const EXPORT_BYTES: usize = 8 * MIB;
const GOOD_BYTES: usize = MIB;
const SEED: u64 = 0x5eed_0bad;

fn request(command: Command, flags: u16, offset: u64, length: u32) -> [u8; 28] {
    encode_request(&Request {
        flags,
        command,
        cookie: 0xbad,
        offset,
        length,
    })
}

/// Writes (ignoring errors: the server may already have hung up), then
/// closes our side and reads until the server closes.
fn blast_and_drain(mut s: UnixStream, bytes: &[u8]) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    assert!(is_closed(&mut s), "server kept a hostile connection open");
}

fn attack_handshake(path: &Path) {
    // Unknown client flags: the spec says drop.
    let mut s = greet(path, 0xffff_0000).unwrap();
    assert!(is_closed(&mut s));
    // Bad option magic.
    let mut s = greet(path, FLAG_C_FIXED_NEWSTYLE).unwrap();
    s.write_all(b"NOTMAGIC\0\0\0\x07\0\0\0\0").unwrap();
    assert!(is_closed(&mut s));
    // Truncated handshake: two bytes of client flags, then gone.
    let mut s = UnixStream::connect(path).unwrap();
    read_exact(&mut s, 18).unwrap();
    s.write_all(&[0, 0]).unwrap();
    drop(s);
    // Connect and leave at once.
    drop(UnixStream::connect(path).unwrap());
    // Huge option lengths are refused without reading them.
    for len in [u32::MAX, 64 * MIB as u32, 1 << 20] {
        let mut s = greet(path, FLAG_C_FIXED_NEWSTYLE).unwrap();
        let mut m = Vec::new();
        m.extend_from_slice(&IHAVEOPT.to_be_bytes());
        m.extend_from_slice(&OPT_GO.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        s.write_all(&m).unwrap();
        assert!(is_closed(&mut s), "option of {len} bytes accepted");
    }
    // GO whose inner name length lies: an error reply, and the session goes on.
    let mut s = greet(path, FLAG_C_FIXED_NEWSTYLE).unwrap();
    send_option(&mut s, OPT_GO, &[0xff, 0xff, 0xff, 0xff, 0, 0]).unwrap();
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);
    send_option(&mut s, OPT_ABORT, &[]).unwrap();
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ACK);
    // Option flood: the server stops answering after its limit.
    let mut s = greet(path, FLAG_C_FIXED_NEWSTYLE).unwrap();
    let mut flood = Vec::new();
    for _ in 0..400 {
        flood.extend_from_slice(&IHAVEOPT.to_be_bytes());
        flood.extend_from_slice(&0x77u32.to_be_bytes());
        flood.extend_from_slice(&0u32.to_be_bytes());
    }
    blast_and_drain(s.try_clone().unwrap(), &flood);
    assert!(is_closed(&mut s));
}

fn attack_transmission(path: &Path) {
    // Out-of-range, overflowing, oversized, unknown: error replies.
    let mut c = Client::connect(path, "", true).unwrap();
    let size = EXPORT_BYTES as u64;
    for (cmd, off, len, want) in [
        (Command::Read, size, 512, Errno::Inval),
        (Command::Read, u64::MAX - 100, 512, Errno::Overflow),
        (Command::Read, 0, u32::MAX, Errno::Inval),
        (Command::WriteZeroes, size - 512, 1024, Errno::NoSpc),
        (Command::Trim, u64::MAX, 1, Errno::Overflow),
        (Command::Unknown(0xbeef), 0, 0, Errno::Inval),
        (Command::Unknown(5), 0, 4096, Errno::Inval),
    ] {
        let r = c.call(cmd, 0, off, len, &[]).unwrap();
        assert_eq!(r.error, want.code(), "{cmd:?} {off} {len}");
    }
    let r = c
        .call(Command::Write, 0, size - 1, 2, &[0xff, 0xff])
        .unwrap();
    assert_eq!(r.error, Errno::NoSpc.code());
    // Oversized write: the payload cannot be skipped, so the server hangs up.
    c.send(Command::Write, 0, 0, 33 * MIB as u32, &[]).unwrap();
    assert!(is_closed(&mut c.stream));

    // Bad request magic mid-session.
    let mut c = Client::connect(path, "", false).unwrap();
    c.stream.write_all(&[0xde; 28]).unwrap();
    assert!(is_closed(&mut c.stream));

    // Disconnect in the middle of a write payload: nothing may be written.
    let c = Client::connect(path, "", true).unwrap();
    let mut m = request(Command::Write, 0, 2 * MIB as u64, 65536).to_vec();
    m.extend_from_slice(&[0xff; 1000]);
    blast_and_drain(c.stream, &m);
    // ...and in the middle of a request header.
    let c = Client::connect(path, "", true).unwrap();
    blast_and_drain(c.stream, &request(Command::Read, 0, 0, 4096)[..11]);

    // A pipeline whose replies are never read, then gone.
    let mut c = Client::connect(path, "", true).unwrap();
    for i in 0..200u64 {
        c.send(Command::Read, 0, (i % 8) * 65536, 512 * 1024, &[])
            .unwrap();
    }
    drop(c);
}

fn attack_random(path: &Path, rng: &mut StdRng) {
    for round in 0..40 {
        let len = rng.gen_range(0..4096);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if round % 2 == 0 {
            // Random bytes straight after connecting.
            let s = UnixStream::connect(path).unwrap();
            blast_and_drain(s, &bytes);
            continue;
        }
        // Random requests after a valid handshake: mostly valid magic, any
        // command and flags, offsets never inside the export.
        bytes.clear();
        for _ in 0..rng.gen_range(1..32) {
            let magic_ok = rng.gen_bool(0.9);
            let mut h = request(
                Command::from_wire(rng.gen_range(0..10)),
                rng.gen(),
                rng.gen::<u64>() | (1 << 40),
                rng.gen_range(0..(40 * MIB as u32)),
            );
            if !magic_ok {
                h[0] = rng.gen();
            }
            bytes.extend_from_slice(&h);
            if rng.gen_bool(0.2) {
                let junk = rng.gen_range(0..2000);
                bytes.extend((0..junk).map(|_| rng.gen::<u8>()));
            }
        }
        let c = Client::connect(path, "", round % 4 == 1).unwrap();
        blast_and_drain(c.stream, &bytes);
    }
}

#[test]
fn hostile_clients_do_not_disturb_a_good_one() {
    println!("seed {SEED:#x}");
    let initial = pattern(EXPORT_BYTES, SEED);
    let config = ServerConfig {
        max_connections: 6,
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(MemBackend::from_vec(initial.clone()), config);
    let path = srv.socket.clone();

    let stop = Arc::new(AtomicBool::new(false));
    let good = {
        let stop = stop.clone();
        let path = path.clone();
        std::thread::spawn(move || {
            let mut c = Client::connect(&path, "uraid", true).unwrap();
            let mut model = pattern(GOOD_BYTES, SEED);
            let mut rng = StdRng::seed_from_u64(SEED);
            let mut rounds = 0u64;
            while rounds < 200 || !stop.load(Ordering::Relaxed) {
                let len = rng.gen_range(1..64 * 1024);
                let off = rng.gen_range(0..GOOD_BYTES - len);
                let data = pattern(len, rounds + 1000);
                assert_eq!(c.write(off as u64, &data), 0);
                model[off..off + len].copy_from_slice(&data);
                let roff = rng.gen_range(0..GOOD_BYTES - 4096);
                let got = c.read(roff as u64, 4096).unwrap();
                assert_eq!(got, model[roff..roff + 4096], "round {rounds}");
                rounds += 1;
            }
            c.disconnect();
            (model, rounds)
        })
    };

    let mut rng = StdRng::seed_from_u64(SEED);
    attack_handshake(&path);
    attack_transmission(&path);
    attack_random(&path, &mut rng);
    stop.store(true, Ordering::Relaxed);
    let (model, rounds) = good.join().expect("good client failed");
    assert!(rounds >= 200);

    // Every hostile connection has been released: 6 fresh clients fit.
    let mut clients = Vec::new();
    for attempt in 0.. {
        match Client::connect(&path, "", true) {
            Ok(c) => clients.push(c),
            Err(_) => {
                assert!(attempt < 500, "connection slots leaked");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if clients.len() == 6 {
            break;
        }
    }
    let mut c = clients.pop().unwrap();
    assert_eq!(c.read(0, GOOD_BYTES as u32).unwrap(), model);
    drop(clients);

    let snap = srv.backend.snapshot();
    assert!(snap[..GOOD_BYTES] == model[..], "good data damaged");
    assert!(
        snap[GOOD_BYTES..] == initial[GOOD_BYTES..],
        "a hostile client changed the export"
    );
    let mut probe = [0u8; 1];
    let _ = c.stream.set_nonblocking(true);
    assert!(c.stream.read(&mut probe).is_err(), "unexpected data");
}
