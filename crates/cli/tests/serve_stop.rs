//! A stop always stops: `uraid serve` exits after SIGTERM under load even when its control
//! socket was removed, a member file was removed or a member's device errors, and a second
//! SIGTERM forces the quickest safe exit while the clean stop is held up. Each time the next
//! assembly reads back what was acknowledged before.
//!
//! The bounds below are hang bounds (a stop that never ends), far above what a stop takes.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use uraid_testkit::prelude::*;

/// Longer than this and the stop is taken to hang.
const HANG_BOUND: Duration = Duration::from_secs(30);

/// Waits for the server to exit, or kills it and fails.
fn exits_within(srv: &mut Served, bound: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + bound;
    let child = srv.child.as_mut().expect("running");
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            srv.child = None;
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            srv.child = None;
            panic!(
                "{what}: uraid serve still running {} s after the signal:\n{}",
                bound.as_secs(),
                srv.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(srv: &Served, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(srv.pid() as i32, sig) };
}

/// Acknowledged data that the next assembly must read back: 1 MiB of 0x5c at 0.
fn write_known(srv: &Served) {
    qemu_io(&srv.uri(), &["write -P 0x5c 0 1M", "flush"]);
}

/// Serves `members` again (degraded if some are gone) and checks the known data.
fn check_known(dir: &TempDir, members: &[PathBuf], what: &str) {
    let mut srv = Served::start(dir, members, &[]);
    let out = qemu_io(&srv.uri(), &["read -P 0x5c 0 1M"]);
    assert!(
        !out.contains("verification failed") && !out.contains("Pattern verification"),
        "{what}: acknowledged data lost: {out}"
    );
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{what}: {}", srv.stderr());
}

/// fio writing 8 MiB past the known data until it is cut off.
fn load(srv: &Served) -> ChildGuard {
    ChildGuard(Some(
        Command::new("fio")
            .args([
                "--name=load",
                "--ioengine=nbd",
                &format!("--uri={}", srv.uri()),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=16",
                "--offset=4m",
                "--size=8m",
                "--time_based",
                "--runtime=120",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ))
}

/// Waits (bounded) until writes have marked the array active.
fn wait_active(srv: &Served, member: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while srv.detail(member)["state"] != "active" {
        assert!(Instant::now() < deadline, "the load never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The control socket removed (a tmpfiles cleaner, an operator) before SIGTERM: the control
/// thread used to be woken by connecting to that path, and the stop hung for ever.
#[test]
fn stop_with_the_control_socket_removed() {
    if !need_tools(&["fio", "qemu-io"], "stop_with_the_control_socket_removed") {
        return;
    }
    let dir = TempDir::new("stop-sock");
    let members = create_array(&dir, "5", 3, 16, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    write_known(&srv);
    let _load = load(&srv);
    wait_active(&srv, &members[0]);
    std::fs::remove_file(&srv.control).unwrap();
    signal(&srv, libc::SIGTERM);
    let st = exits_within(&mut srv, HANG_BOUND, "control socket removed");
    assert!(st.success(), "{}", srv.stderr());
    assert!(
        member_states(&members).iter().all(|s| s == "clean"),
        "a completed stop leaves no resync owed"
    );
    check_known(&dir, &members, "control socket removed");
}

/// A member file removed during the stop: its descriptor still works, and nothing in the
/// stop may depend on its path.
#[test]
fn stop_with_a_member_file_removed() {
    if !need_tools(&["fio", "qemu-io"], "stop_with_a_member_file_removed") {
        return;
    }
    let dir = TempDir::new("stop-member");
    let members = create_array(&dir, "5", 3, 16, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    write_known(&srv);
    let _load = load(&srv);
    wait_active(&srv, &members[0]);
    std::fs::remove_file(&members[2]).unwrap();
    signal(&srv, libc::SIGTERM);
    let st = exits_within(&mut srv, HANG_BOUND, "member removed");
    assert!(st.success(), "{}", srv.stderr());
    let left = &members[..2];
    assert!(member_states(left).iter().all(|s| s == "clean"));
    check_known(&dir, left, "member removed");
}

/// A member's device fails every IO as the stop begins (its loop device's backing file
/// shrinks to nothing): it is failed, the stop goes on and the others are marked clean.
#[test]
fn stop_with_a_member_erroring() {
    if !need_tools(
        &["fio", "qemu-io", "losetup"],
        "stop_with_a_member_erroring",
    ) {
        return;
    }
    let dir = TempDir::new("stop-eio");
    let files = create_array(&dir, "5", 3, 16, &[]);
    let Some(lo) = Loop::attach_or_skip(&files[2], "stop_with_a_member_erroring") else {
        return;
    };
    let mut members = files.clone();
    members[2] = PathBuf::from(&lo.0);
    let mut srv = Served::start(&dir, &members, &[]);
    write_known(&srv);
    let _load = load(&srv);
    wait_active(&srv, &members[0]);
    // Paused across the truncation (a loop device reads a truncated file as zeros until
    // `losetup -c`), so that the member's next IO is a real error.
    signal(&srv, libc::SIGSTOP);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&files[2])
        .unwrap()
        .set_len(0)
        .unwrap();
    ok(Command::new("losetup").args(["-c", &lo.0]));
    signal(&srv, libc::SIGTERM);
    signal(&srv, libc::SIGCONT);
    let st = exits_within(&mut srv, HANG_BOUND, "member erroring");
    assert!(st.success(), "{}", srv.stderr());
    let left = &files[..2];
    assert!(member_states(left).iter().all(|s| s == "clean"));
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(&files[0])));
    assert_eq!(
        v["array_state"],
        "AA.",
        "the erroring member is failed in the others' superblocks: {v}\n{}",
        srv.stderr()
    );
    check_known(&dir, left, "member erroring");
}

/// An NBD client that asks for many reads and never takes the replies: the clean stop
/// waits for their answers (up to the 60 s write timeout each).
fn stalled_client(sock: &Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
    // Fixed newstyle, no zeroes; then NBD_OPT_EXPORT_NAME "md0".
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&3u32.to_be_bytes());
    opt.extend_from_slice(b"md0");
    s.write_all(&opt).unwrap();
    let mut export = [0u8; 10];
    s.read_exact(&mut export).unwrap();
    // 64 reads of 64 KiB, far more than the socket buffers hold, sent in one write (2 KiB):
    // the server need not read them for this write to complete.
    let mut reqs = Vec::with_capacity(64 * 28);
    for i in 0..64u64 {
        reqs.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        reqs.extend_from_slice(&0u16.to_be_bytes()); // flags
        reqs.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
        reqs.extend_from_slice(&i.to_be_bytes()); // cookie
        reqs.extend_from_slice(&((i % 16) * 65536).to_be_bytes());
        reqs.extend_from_slice(&65536u32.to_be_bytes());
    }
    s.write_all(&reqs).unwrap();
    s
}

/// While the clean stop waits on a client that takes no replies, a second SIGTERM makes the
/// process flush, say what it left and exit non-zero at once; the data is all there after.
#[test]
fn a_second_sigterm_forces_the_exit() {
    if !need_tool("qemu-io", "a_second_sigterm_forces_the_exit") {
        return;
    }
    let dir = TempDir::new("stop-twice");
    let members = create_array(&dir, "5", 3, 16, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    write_known(&srv);
    let _client = stalled_client(&srv.sock);
    signal(&srv, libc::SIGTERM);
    let deadline = Instant::now() + HANG_BOUND;
    while !srv.stderr().contains("stopping") {
        assert!(Instant::now() < deadline, "no stop began: {}", srv.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&srv, libc::SIGTERM);
    let st = exits_within(&mut srv, HANG_BOUND, "second SIGTERM");
    assert!(!st.success(), "a forced exit is not a clean stop");
    let err = srv.stderr();
    assert!(err.contains("forced exit: flushed 3 member(s)"), "{err}");
    check_known(&dir, &members, "second SIGTERM");
}
