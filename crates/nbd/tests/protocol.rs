//! Protocol behaviour through a raw client: options, commands, errors, shutdown.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use common::*;
use uraid_nbd::proto::*;
use uraid_nbd::{MemBackend, ServerConfig, ZeroFlags};
use uraid_testkit::data::pattern;
use uraid_testkit::TempDir;

const MIB: usize = 1 << 20;

#[test]
fn go_reports_size_and_flags_and_data_roundtrips() {
    let srv = TestServer::start(4 * MIB);
    for structured in [false, true] {
        let mut c = Client::connect(&srv.socket, "", structured).unwrap();
        assert_eq!(c.size, 4 * MIB as u64);
        let want = FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_TRIM
            | FLAG_SEND_WRITE_ZEROES
            | FLAG_CAN_MULTI_CONN
            | if structured { FLAG_SEND_DF } else { 0 };
        assert_eq!(c.flags, want);
        let data = pattern(10_000, structured as u64 + 1);
        assert_eq!(c.write(12_345, &data), 0);
        assert_eq!(c.read(12_345, 10_000).unwrap(), data);
        // Zero-length read is legal and carries no data.
        assert_eq!(c.read(0, 0).unwrap(), Vec::<u8>::new());
        c.disconnect();
        assert_eq!(&srv.backend.snapshot()[12_345..22_345], &data[..]);
    }
}

#[test]
fn pipelined_requests_get_every_reply_with_right_data() {
    let srv = TestServer::start(8 * MIB);
    let mut c = Client::connect(&srv.socket, "uraid", true).unwrap();
    let mut expect = HashMap::new();
    // 96 writes in flight (more than the worker count), then 96 reads.
    for i in 0..96u64 {
        let data = pattern(4096 * (1 + (i as usize % 5)), i);
        let cookie = c
            .send(Command::Write, 0, i * 65536, data.len() as u32, &data)
            .unwrap();
        expect.insert(cookie, data);
    }
    let mut written = HashMap::new();
    for _ in 0..96 {
        let r = c.recv().unwrap();
        assert_eq!(r.error, 0);
        let data = expect
            .remove(&r.cookie)
            .expect("reply to an unknown cookie");
        written.insert(r.cookie, data);
    }
    assert!(expect.is_empty());
    let mut reads = HashMap::new();
    for (i, (_, data)) in (0u64..).zip({
        let mut v: Vec<_> = written.into_iter().collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }) {
        let cookie = c
            .send(Command::Read, 0, i * 65536, data.len() as u32, &[])
            .unwrap();
        reads.insert(cookie, data);
    }
    for _ in 0..96 {
        let r = c.recv().unwrap();
        assert_eq!(r.error, 0);
        assert_eq!(r.data, reads.remove(&r.cookie).unwrap());
    }
}

#[test]
fn fua_flush_trim_and_write_zeroes_reach_the_backend() {
    let srv = TestServer::start_with(
        MemBackend::from_vec(vec![0xee; MIB]),
        ServerConfig::default(),
    );
    let mut c = Client::connect(&srv.socket, "", true).unwrap();
    let r = c
        .call(Command::Write, CMD_FLAG_FUA, 0, 512, &[1u8; 512])
        .unwrap();
    assert_eq!(r.error, 0);
    assert_eq!(srv.backend.fua_count(), 1);
    assert_eq!(c.call(Command::Flush, 0, 0, 0, &[]).unwrap().error, 0);
    assert_eq!(srv.backend.flush_count(), 1);
    let r = c
        .call(
            Command::WriteZeroes,
            CMD_FLAG_NO_HOLE | CMD_FLAG_FUA,
            4096,
            8192,
            &[],
        )
        .unwrap();
    assert_eq!(r.error, 0);
    assert_eq!(srv.backend.fua_count(), 2);
    assert_eq!(c.call(Command::Trim, 0, 65536, 4096, &[]).unwrap().error, 0);
    assert_eq!(srv.backend.trim_count(), 1);
    let snap = srv.backend.snapshot();
    assert_eq!(&snap[..512], &[1u8; 512][..]);
    assert!(snap[512..4096].iter().all(|&b| b == 0xee));
    assert!(snap[4096..12288].iter().all(|&b| b == 0));
    assert!(snap[12288..65536].iter().all(|&b| b == 0xee));
}

#[test]
fn invalid_requests_get_errors_and_leave_the_backend_alone() {
    let srv = TestServer::start_with(
        MemBackend::from_vec(vec![0x5a; MIB]),
        ServerConfig::default(),
    );
    for structured in [false, true] {
        let mut c = Client::connect(&srv.socket, "", structured).unwrap();
        let size = MIB as u64;
        let cases: Vec<(Command, u16, u64, u32, u32)> = vec![
            (Command::Read, 0, size, 1, 22),
            (Command::Read, 0, size - 1, 2, 22),
            (Command::Read, 0, u64::MAX - 1, 4, 75),
            (Command::Read, 0, 0, 64 << 20, 22),
            (Command::Write, 0, size - 10, 20, 28),
            (Command::Trim, 0, size, 512, 22),
            (Command::WriteZeroes, 0, size - 1, 2, 28),
            (Command::Unknown(77), 0, 0, 0, 22),
            (Command::Write, CMD_FLAG_NO_HOLE, 0, 16, 22),
            (Command::Flush, 1 << 9, 0, 0, 22),
        ];
        for (cmd, flags, off, len, want) in cases {
            let payload = if cmd == Command::Write {
                vec![0xffu8; len as usize]
            } else {
                Vec::new()
            };
            let r = c.call(cmd, flags, off, len, &payload).unwrap();
            assert_eq!(r.error, want, "{cmd:?} flags {flags:#x} at {off} len {len}");
            assert!(r.data.is_empty());
        }
        // The connection is still usable.
        assert_eq!(c.read(0, 16).unwrap(), vec![0x5a; 16]);
    }
    assert!(srv.backend.snapshot().iter().all(|&b| b == 0x5a));
    assert_eq!(srv.backend.trim_count(), 0);
}

#[test]
fn read_only_export_refuses_writes() {
    let srv = TestServer::start_with(
        MemBackend::from_vec(vec![7; 65536]).with_read_only(true),
        ServerConfig::default(),
    );
    let mut c = Client::connect(&srv.socket, "", true).unwrap();
    assert_ne!(c.flags & FLAG_READ_ONLY, 0);
    assert_eq!(c.flags & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES), 0);
    assert_eq!(c.write(0, &[1, 2, 3]), 1);
    assert_eq!(c.call(Command::Trim, 0, 0, 512, &[]).unwrap().error, 1);
    assert_eq!(c.read(0, 4).unwrap(), vec![7; 4]);
    assert!(srv.backend.snapshot().iter().all(|&b| b == 7));
}

#[test]
fn options_list_info_unknown_and_export_name() {
    let config = ServerConfig {
        export_name: "md0".into(),
        description: "test array".into(),
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(MemBackend::new(MIB), config);
    let mut s = greet(&srv.socket, FLAG_C_FIXED_NEWSTYLE).unwrap();

    send_option(&mut s, OPT_LIST, &[]).unwrap();
    let (_, rep, data) = read_option_reply(&mut s).unwrap();
    assert_eq!(rep, REP_SERVER);
    assert_eq!(&data[..4], &3u32.to_be_bytes());
    assert_eq!(&data[4..], b"md0");
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ACK);

    send_option(&mut s, OPT_LIST, b"x").unwrap();
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);

    send_option(&mut s, 0x4242, b"whatever").unwrap();
    assert_eq!(
        read_option_reply(&mut s).unwrap(),
        (0x4242, REP_ERR_UNSUP, vec![])
    );
    send_option(&mut s, OPT_STARTTLS, &[]).unwrap();
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_UNSUP);

    send_option(&mut s, OPT_INFO, &go_data("nope", &[])).unwrap();
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_UNKNOWN);
    send_option(&mut s, OPT_GO, &[0, 0, 0, 9, 1]).unwrap();
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);

    send_option(
        &mut s,
        OPT_INFO,
        &go_data("md0", &[INFO_NAME, INFO_DESCRIPTION]),
    )
    .unwrap();
    let mut infos = HashMap::new();
    loop {
        let (opt, rep, data) = read_option_reply(&mut s).unwrap();
        assert_eq!(opt, OPT_INFO);
        if rep == REP_ACK {
            break;
        }
        assert_eq!(rep, REP_INFO);
        infos.insert(u16::from_be_bytes([data[0], data[1]]), data[2..].to_vec());
    }
    assert_eq!(&infos[&INFO_EXPORT][..8], &(MIB as u64).to_be_bytes());
    assert_eq!(infos[&INFO_NAME], b"md0");
    assert_eq!(infos[&INFO_DESCRIPTION], b"test array");
    let bs = &infos[&INFO_BLOCK_SIZE];
    assert_eq!(&bs[0..4], &1u32.to_be_bytes());
    assert_eq!(&bs[4..8], &4096u32.to_be_bytes());
    assert_eq!(&bs[8..12], &(32u32 << 20).to_be_bytes());

    // Old-style entry into transmission, with the 124 zero bytes (no NO_ZEROES).
    send_option(&mut s, OPT_EXPORT_NAME, b"md0").unwrap();
    let reply = read_exact(&mut s, 10 + 124).unwrap();
    assert_eq!(&reply[..8], &(MIB as u64).to_be_bytes());
    assert!(reply[10..].iter().all(|&b| b == 0));
    s.write_all(&encode_request(&Request {
        flags: 0,
        command: Command::Read,
        cookie: 99,
        offset: 0,
        length: 8,
    }))
    .unwrap();
    let r = read_exact(&mut s, 16 + 8).unwrap();
    assert_eq!(&r[..16], &encode_simple_reply(99, 0));

    // Unknown name with EXPORT_NAME: the server must hang up.
    let mut s = greet(&srv.socket, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).unwrap();
    send_option(&mut s, OPT_EXPORT_NAME, b"other").unwrap();
    assert!(is_closed(&mut s));

    // ABORT is acknowledged, then the server closes.
    let mut s = greet(&srv.socket, FLAG_C_FIXED_NEWSTYLE).unwrap();
    send_option(&mut s, OPT_ABORT, &[]).unwrap();
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ACK);
    assert!(is_closed(&mut s));
}

#[test]
fn shutdown_answers_in_flight_requests_and_flushes() {
    let srv = TestServer::start(4 * MIB);
    let mut idle = Client::connect(&srv.socket, "", true).unwrap();
    let mut c = Client::connect(&srv.socket, "", true).unwrap();
    for i in 0..32u64 {
        c.send(Command::Write, 0, i * 4096, 4096, &pattern(4096, i))
            .unwrap();
    }
    for _ in 0..32 {
        assert_eq!(c.recv().unwrap().error, 0);
    }
    let backend = srv.backend.clone();
    let socket = srv.socket.clone();
    let stats = srv.stop();
    assert_eq!(stats.connections_accepted, 2);
    assert!(backend.flush_count() >= 1, "no final flush");
    let snap = backend.snapshot();
    for i in 0..32usize {
        assert_eq!(
            &snap[i * 4096..(i + 1) * 4096],
            &pattern(4096, i as u64)[..]
        );
    }
    // Both connections were closed and nothing listens any more.
    assert!(is_closed(&mut idle.stream));
    assert!(UnixStream::connect(&socket).is_err());
}

#[test]
fn connection_limit_refuses_extra_clients() {
    let config = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(MemBackend::new(65536), config);
    let mut a = Client::connect(&srv.socket, "", true).unwrap();
    let _b = Client::connect(&srv.socket, "", true).unwrap();
    let mut third = UnixStream::connect(&srv.socket).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(
        third.read(&mut buf).unwrap_or(0),
        0,
        "third client was served"
    );
    assert_eq!(a.write(0, b"still works"), 0);
    drop(a);
    let stats = srv.stop();
    assert_eq!(stats.connections_refused, 1);
}

#[test]
fn parallel_connections_share_one_export() {
    let srv = TestServer::start(8 * MIB);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let path = srv.socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&path, "", t % 2 == 0).unwrap();
                let base = t * 2 * MIB as u64;
                for i in 0..16u64 {
                    let data = pattern(64 * 1024, t * 100 + i);
                    c.send(Command::Write, 0, base + i * 65536, 65536, &data)
                        .unwrap();
                }
                for _ in 0..16 {
                    assert_eq!(c.recv().unwrap().error, 0);
                }
                assert_eq!(c.call(Command::Flush, 0, 0, 0, &[]).unwrap().error, 0);
                c.disconnect();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Another connection sees every write (CAN_MULTI_CONN).
    let mut c = Client::connect(&srv.socket, "", true).unwrap();
    for t in 0..4u64 {
        for i in 0..16u64 {
            let got = c.read(t * 2 * MIB as u64 + i * 65536, 65536).unwrap();
            assert_eq!(got, pattern(64 * 1024, t * 100 + i), "conn {t} block {i}");
        }
    }
}

#[test]
fn large_writes_under_a_tight_buffer_budget_all_complete() {
    // Budget for exactly one maximal payload, shared by three busy connections.
    let config = ServerConfig {
        max_payload_bytes: MIB as u32,
        buffer_budget_bytes: MIB,
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(MemBackend::new(8 * MIB), config);
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let path = srv.socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&path, "", true).unwrap();
                for round in 0..2u64 {
                    let off = t * 2 * MIB as u64 + round * MIB as u64;
                    let data = pattern(MIB, t * 10 + round);
                    // Write and read back pipelined; both need a large buffer.
                    c.send(Command::Write, 0, off, MIB as u32, &data).unwrap();
                    assert_eq!(c.recv().unwrap().error, 0);
                    assert_eq!(c.read(off, MIB as u32).unwrap(), data);
                }
                // Over the payload limit: refused before any buffer is taken.
                assert_eq!(c.read(0, MIB as u32 + 1), Err(22));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let snap = srv.backend.snapshot();
    for t in 0..3usize {
        for round in 0..2usize {
            let off = t * 2 * MIB + round * MIB;
            assert!(snap[off..off + MIB] == pattern(MIB, t as u64 * 10 + round as u64)[..]);
        }
    }
}

#[test]
fn fast_zero_is_advertised_only_when_the_backend_can_and_its_flags_reach_it() {
    // A backend that cannot zero fast: no NBD_FLAG_SEND_FAST_ZERO, and the flag is refused.
    let srv = TestServer::start_with(
        MemBackend::from_vec(vec![0xee; MIB]),
        ServerConfig::default(),
    );
    let mut c = Client::connect(&srv.socket, "", true).unwrap();
    assert_eq!(c.flags & FLAG_SEND_FAST_ZERO, 0, "flags {:#x}", c.flags);
    let r = c
        .call(Command::WriteZeroes, CMD_FLAG_FAST_ZERO, 0, 4096, &[])
        .unwrap();
    assert_eq!(r.error, 22);
    assert!(srv.backend.zero_flags().is_empty());
    assert!(srv.backend.snapshot()[..4096].iter().all(|&b| b == 0xee));
    // NO_HOLE reaches the backend.
    let r = c
        .call(Command::WriteZeroes, CMD_FLAG_NO_HOLE, 0, 4096, &[])
        .unwrap();
    assert_eq!(r.error, 0);
    assert_eq!(
        srv.backend.zero_flags(),
        vec![ZeroFlags {
            fua: false,
            no_hole: true,
            fast: false
        }]
    );

    // One that can: advertised, and a fast zero zeroes.
    let srv = TestServer::start_with(
        MemBackend::from_vec(vec![0xee; MIB]).with_fast_zero(true),
        ServerConfig::default(),
    );
    for structured in [true, false] {
        let mut c = Client::connect(&srv.socket, "", structured).unwrap();
        assert_ne!(c.flags & FLAG_SEND_FAST_ZERO, 0, "flags {:#x}", c.flags);
        let r = c
            .call(Command::WriteZeroes, CMD_FLAG_FAST_ZERO, 8192, 4096, &[])
            .unwrap();
        assert_eq!(r.error, 0);
    }
    assert!(srv
        .backend
        .zero_flags()
        .iter()
        .all(|f| f.fast && !f.no_hole));
    let snap = srv.backend.snapshot();
    assert!(snap[8192..12288].iter().all(|&b| b == 0));
    assert!(snap[12288..16384].iter().all(|&b| b == 0xee));

    // One that advertises but finds a range it cannot zero fast: ENOTSUP, data untouched.
    use std::sync::Arc;
    use uraid_nbd::{Backend, Listener, Server};
    struct SlowHere(MemBackend);
    impl Backend for SlowHere {
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.0.read(offset, buf)
        }
        fn write(&self, offset: u64, buf: &[u8], fua: bool) -> std::io::Result<()> {
            self.0.write(offset, buf, fua)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.0.flush()
        }
        fn trim(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.0.trim(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, how: ZeroFlags) -> std::io::Result<()> {
            if how.fast && offset == 0 {
                return Err(std::io::Error::from_raw_os_error(95));
            }
            self.0.write_zeroes(offset, len, how)
        }
        fn can_fast_zero(&self) -> bool {
            true
        }
    }
    let dir = TempDir::new("slowhere");
    let path = dir.path("s.sock");
    let backend = Arc::new(SlowHere(MemBackend::from_vec(vec![0xee; MIB])));
    let running = Server::new(ServerConfig::default())
        .unwrap()
        .spawn(
            Listener::bind_unix(&path).unwrap(),
            backend.clone() as Arc<dyn Backend>,
        )
        .unwrap();
    let mut c = Client::connect(&path, "", true).unwrap();
    let r = c
        .call(Command::WriteZeroes, CMD_FLAG_FAST_ZERO, 0, 4096, &[])
        .unwrap();
    assert_eq!(r.error, 95, "ENOTSUP");
    assert!(backend.0.snapshot()[..4096].iter().all(|&b| b == 0xee));
    // The connection goes on; without the flag the zeroing happens.
    let r = c.call(Command::WriteZeroes, 0, 0, 4096, &[]).unwrap();
    assert_eq!(r.error, 0);
    assert!(backend.0.snapshot()[..4096].iter().all(|&b| b == 0));
    c.disconnect();
    running.shutdown().unwrap();
}

/// Panics on reads at offset 0, otherwise a MemBackend.
struct PanickyBackend(MemBackend);

impl uraid_nbd::Backend for PanickyBackend {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        assert_ne!(offset, 0, "deliberate backend panic");
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> std::io::Result<()> {
        if offset == 4096 {
            return Err(std::io::Error::from_raw_os_error(libc_enospc()));
        }
        self.0.write(offset, buf, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        Err(std::io::Error::other("flush failed"))
    }
    fn trim(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroFlags) -> std::io::Result<()> {
        self.0.write_zeroes(offset, len, how)
    }
}

fn libc_enospc() -> i32 {
    28
}

#[test]
fn backend_errors_and_panics_become_nbd_errors() {
    use std::sync::Arc;
    use uraid_nbd::{Backend, Listener, Server};
    let dir = TempDir::new("panicky");
    let path = dir.path("s.sock");
    let listener = Listener::bind_unix(&path).unwrap();
    let backend: Arc<dyn Backend> = Arc::new(PanickyBackend(MemBackend::new(MIB)));
    let running = Server::new(ServerConfig::default())
        .unwrap()
        .spawn(listener, backend)
        .unwrap();
    for structured in [true, false] {
        let mut c = Client::connect(&path, "", structured).unwrap();
        assert_eq!(c.read(0, 512), Err(5), "panic must read as EIO");
        assert_eq!(c.write(4096, &[1; 512]), 28);
        assert_eq!(c.call(Command::Flush, 0, 0, 0, &[]).unwrap().error, 5);
        // The connection survives all of it.
        assert_eq!(c.write(8192, &[9; 512]), 0);
        assert_eq!(c.read(8192, 512).unwrap(), vec![9; 512]);
    }
    // The final flush fails, and serve says so.
    assert!(matches!(
        running.shutdown(),
        Err(uraid_nbd::NbdError::FinalFlush(_))
    ));
}

#[test]
fn stalled_or_trickling_handshakes_are_dropped() {
    let config = ServerConfig {
        handshake_timeout: Some(std::time::Duration::from_millis(1000)),
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(MemBackend::new(65536), config);
    // Says nothing after the greeting.
    let mut stalled = UnixStream::connect(&srv.socket).unwrap();
    read_exact(&mut stalled, 18).unwrap();
    // Sends a valid option one byte at a time, never finishing in time.
    let mut trickle = greet(&srv.socket, FLAG_C_FIXED_NEWSTYLE).unwrap();
    let mut opt = Vec::new();
    opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
    opt.extend_from_slice(&OPT_LIST.to_be_bytes());
    opt.extend_from_slice(&64u32.to_be_bytes());
    opt.extend_from_slice(&[0u8; 64]);
    for b in opt {
        if trickle.write_all(&[b]).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(is_closed(&mut stalled));
    assert!(is_closed(&mut trickle));
    // A prompt client is unaffected, and may then idle as long as it likes.
    let mut c = Client::connect(&srv.socket, "", true).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1200));
    assert_eq!(c.write(0, b"idle is fine"), 0);
}

#[test]
fn unix_bind_replaces_stale_sockets_but_not_live_ones() {
    let srv = TestServer::start(65536);
    assert!(matches!(
        uraid_nbd::Listener::bind_unix(&srv.socket),
        Err(uraid_nbd::NbdError::BindUnix { .. })
    ));
    // The live server still works.
    let mut c = Client::connect(&srv.socket, "", true).unwrap();
    assert_eq!(c.write(0, b"x"), 0);
    // A stale socket file (nobody listening) is replaced.
    let dir = TempDir::new("stale");
    let path = dir.path("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let l = uraid_nbd::Listener::bind_unix(&path).unwrap();
    drop(l);
    assert!(!path.exists(), "socket file left behind");
}

/// Adjacent plain writes that arrive together are run as one backend write (plugging);
/// each still gets its reply, FUA writes and gaps are not merged, and the data is right.
#[test]
fn buffered_adjacent_writes_merge_into_one_backend_write() {
    let srv = TestServer::start(4 * MIB);
    let mut c = Client::connect(&srv.socket, "", false).unwrap();
    // 8 adjacent 4 KiB writes, then one after a gap, then a FUA one right after it: 33 KiB
    // in one send, so the server's first read holds them all.
    let mut writes: Vec<(u64, Vec<u8>, u16)> = (0..8u64)
        .map(|i| (i * 4096, pattern(4096, i + 1), 0))
        .collect();
    writes.push((65536, pattern(4096, 20), 0));
    writes.push((65536 + 4096, pattern(4096, 21), CMD_FLAG_FUA));
    let before = srv.backend.write_count();
    let mut cookies = c.send_writes(&writes).unwrap();
    for _ in 0..writes.len() {
        let r = c.recv().unwrap();
        assert_eq!(r.error, 0);
        let i = cookies
            .iter()
            .position(|&k| k == r.cookie)
            .expect("unknown cookie");
        cookies.remove(i);
    }
    assert!(cookies.is_empty(), "writes without a reply");
    let snap = srv.backend.snapshot();
    for (off, data, _) in &writes {
        assert_eq!(&snap[*off as usize..*off as usize + data.len()], &data[..]);
    }
    let calls = srv.backend.write_count() - before;
    // The 8 adjacent ones merge (3 calls); the socket may hand them over in pieces, but
    // never as 10 separate reads of one request each with 33 KiB sent at once.
    assert!(
        calls < writes.len() as u64,
        "{calls} backend writes for {} requests",
        writes.len()
    );
    assert!(calls >= 3, "the gap or the FUA write was merged");
    assert_eq!(srv.backend.fua_count(), 1);
    c.disconnect();
}

/// An option reply: option, reply type, data.
type OptReply = (u32, u32, Vec<u8>);
/// A structured reply chunk: cookie, type, payload.
type Chunk = (u64, u16, Vec<u8>);

/// Option replies and structured reply chunks in what the server sent, in order.
fn replies(out: &[u8]) -> (Vec<OptReply>, Vec<Chunk>) {
    let (mut opts, mut chunks) = (Vec::new(), Vec::new());
    let be32 = |b: &[u8]| u32::from_be_bytes(b[..4].try_into().unwrap());
    let mut at = 18; // the greeting
    while at + 8 <= out.len() {
        if out[at..at + 8] == OPTION_REPLY_MAGIC.to_be_bytes() {
            let len = be32(&out[at + 16..]) as usize;
            let body = out[at + 20..at + 20 + len].to_vec();
            opts.push((be32(&out[at + 8..]), be32(&out[at + 12..]), body));
            at += 20 + len;
        } else if out[at..at + 4] == STRUCTURED_REPLY_MAGIC.to_be_bytes() {
            let kind = u16::from_be_bytes([out[at + 6], out[at + 7]]);
            let cookie = u64::from_be_bytes(out[at + 8..at + 16].try_into().unwrap());
            let len = be32(&out[at + 16..]) as usize;
            chunks.push((cookie, kind, out[at + 20..at + 20 + len].to_vec()));
            at += 20 + len;
        } else {
            // Transmission flags after GO's info, or a simple reply: not needed here.
            at += 1;
        }
    }
    (opts, chunks)
}

fn option(o: u32, data: &[u8]) -> Vec<u8> {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&o.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn meta_query(queries: &[&str]) -> Vec<u8> {
    let mut b = vec![0, 0, 0, 0];
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}

fn request(flags: u16, command: Command, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    encode_request(&Request {
        flags,
        command,
        cookie,
        offset,
        length,
    })
    .to_vec()
}

/// A session: structured replies, the given meta context options, GO, `requests`, DISC.
/// (No write first: requests run in parallel, so a status could be taken before it; the
/// tools tests see data and holes together.)
fn block_status_session(meta: &[Vec<u8>], requests: &[Vec<u8>]) -> Vec<u8> {
    let mut s = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    s.extend(option(OPT_STRUCTURED_REPLY, &[]));
    for m in meta {
        s.extend_from_slice(m);
    }
    s.extend(option(OPT_GO, &[0, 0, 0, 0, 0, 0]));
    for r in requests {
        s.extend_from_slice(r);
    }
    s.extend(request(0, Command::Disc, 99, 0, 0));
    s
}

fn descriptors(payload: &[u8]) -> (u32, Vec<(u32, u32)>) {
    let id = u32::from_be_bytes(payload[..4].try_into().unwrap());
    let d = payload[4..]
        .chunks_exact(8)
        .map(|c| {
            (
                u32::from_be_bytes(c[..4].try_into().unwrap()),
                u32::from_be_bytes(c[4..].try_into().unwrap()),
            )
        })
        .collect();
    (id, d)
}

#[test]
fn meta_context_and_block_status() {
    let size = uraid_nbd::fuzzing::FUZZ_EXPORT_BYTES as u32;
    let out = uraid_nbd::fuzzing::fuzz_session(&block_status_session(
        &[
            option(OPT_LIST_META_CONTEXT, &meta_query(&["base:"])),
            option(
                OPT_SET_META_CONTEXT,
                &meta_query(&["qemu:nothing", BASE_ALLOCATION]),
            ),
        ],
        &[
            request(0, Command::BlockStatus, 2, 0, size),
            request(CMD_FLAG_REQ_ONE, Command::BlockStatus, 3, 65536, 8192),
            request(0, Command::BlockStatus, 4, 0, 0),
        ],
    ));
    let (opts, chunks) = replies(&out);
    let ctx: Vec<_> = opts.iter().filter(|o| o.1 == REP_META_CONTEXT).collect();
    assert_eq!(
        ctx.len(),
        2,
        "LIST and SET each name base:allocation: {opts:?}"
    );
    assert_eq!(ctx[0].0, OPT_LIST_META_CONTEXT);
    assert_eq!(ctx[1].0, OPT_SET_META_CONTEXT);
    assert_eq!(&ctx[1].2[..4], &BASE_ALLOCATION_ID.to_be_bytes());
    assert_eq!(&ctx[1].2[4..], BASE_ALLOCATION.as_bytes());

    let status: HashMap<u64, &Chunk> = chunks.iter().map(|c| (c.0, c)).collect();
    let (kind, payload) = (status[&2].1, &status[&2].2);
    assert_eq!(kind, REPLY_TYPE_BLOCK_STATUS);
    let hz = STATE_HOLE | STATE_ZERO;
    assert_eq!(descriptors(payload), (BASE_ALLOCATION_ID, vec![(size, hz)]));
    // REQ_ONE: one extent, within the request.
    assert_eq!(
        descriptors(&status[&3].2),
        (BASE_ALLOCATION_ID, vec![(8192, hz)])
    );
    // A zero length is refused.
    assert_eq!(status[&4].1, REPLY_TYPE_ERROR);
}

#[test]
fn block_status_needs_a_meta_context() {
    // Without SET_META_CONTEXT the command is EINVAL; SET before structured replies fails.
    let set_early = {
        let mut s = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
            .to_be_bytes()
            .to_vec();
        s.extend(option(
            OPT_SET_META_CONTEXT,
            &meta_query(&[BASE_ALLOCATION]),
        ));
        s.extend(option(OPT_ABORT, &[]));
        s
    };
    let (opts, _) = replies(&uraid_nbd::fuzzing::fuzz_session(&set_early));
    assert_eq!(opts[0].0, OPT_SET_META_CONTEXT);
    assert_eq!(opts[0].1, REP_ERR_INVALID, "{opts:?}");

    let out = uraid_nbd::fuzzing::fuzz_session(&block_status_session(
        &[],
        &[request(0, Command::BlockStatus, 2, 0, 4096)],
    ));
    let (_, chunks) = replies(&out);
    let c = chunks.iter().find(|c| c.0 == 2).expect("a reply");
    assert_eq!(c.1, REPLY_TYPE_ERROR);
    assert_eq!(&c.2[..4], &22u32.to_be_bytes(), "EINVAL");
}

#[test]
fn dirty_bitmap_context_beside_base_allocation() {
    // The fuzz export has a dirty bitmap named "fuzz" (MemBackend says all of it is dirty).
    let size = uraid_nbd::fuzzing::FUZZ_EXPORT_BYTES as u32;
    let dirty = format!("{DIRTY_BITMAP_PREFIX}fuzz");
    let out = uraid_nbd::fuzzing::fuzz_session(&block_status_session(
        &[
            option(OPT_LIST_META_CONTEXT, &meta_query(&[])),
            option(OPT_LIST_META_CONTEXT, &meta_query(&["qemu:"])),
            option(
                OPT_SET_META_CONTEXT,
                &meta_query(&["qemu:dirty-bitmap:other", BASE_ALLOCATION, &dirty]),
            ),
        ],
        &[request(0, Command::BlockStatus, 2, 0, size)],
    ));
    let (opts, chunks) = replies(&out);
    let ctx: Vec<_> = opts.iter().filter(|o| o.1 == REP_META_CONTEXT).collect();
    let names: Vec<(u32, &[u8])> = ctx.iter().map(|o| (o.0, &o.2[4..])).collect();
    assert_eq!(
        names,
        [
            (OPT_LIST_META_CONTEXT, BASE_ALLOCATION.as_bytes()),
            (OPT_LIST_META_CONTEXT, dirty.as_bytes()),
            (OPT_LIST_META_CONTEXT, dirty.as_bytes()),
            (OPT_SET_META_CONTEXT, BASE_ALLOCATION.as_bytes()),
            (OPT_SET_META_CONTEXT, dirty.as_bytes()),
        ],
        "LIST all, LIST qemu:, SET both (the unknown bitmap is not chosen)"
    );
    assert_eq!(&ctx[4].2[..4], &DIRTY_BITMAP_ID.to_be_bytes());
    // One request, one block status chunk per context, base:allocation first.
    let status: Vec<_> = chunks.iter().filter(|c| c.0 == 2).collect();
    assert_eq!(status.len(), 2, "{status:?}");
    assert!(status.iter().all(|c| c.1 == REPLY_TYPE_BLOCK_STATUS));
    let hz = STATE_HOLE | STATE_ZERO;
    assert_eq!(
        descriptors(&status[0].2),
        (BASE_ALLOCATION_ID, vec![(size, hz)])
    );
    assert_eq!(
        descriptors(&status[1].2),
        (DIRTY_BITMAP_ID, vec![(size, STATE_DIRTY)])
    );
}
