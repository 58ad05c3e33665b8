//! Live management of a served array: detail/fail/remove/add/stop through the control
//! socket, member locks, a member failed under fio without the client seeing an error,
//! a hostile client, the demo command and the no-ublk message.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;
use uraid_testkit::prelude::*;

fn member_state(detail: &serde_json::Value, role: usize) -> String {
    detail["members"][role]["state"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

/// raid6: two members fail while fio runs randrw with verify; fio must see no error, and
/// its data must verify again after a restart on the remaining members.
#[test]
fn members_fail_under_fio() {
    if !need_tool("fio", "members_fail_under_fio") {
        return;
    }
    let dir = TempDir::new("failio");
    let members = create_array(&dir, "6", 5, 24, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    let fio = ChildGuard(Some(
        Command::new("fio")
            .args(fio_args(&srv.uri(), 32, 11))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let mut fio = fio;
    // Once fio has written (the array turned dirty), fail one member by path and one by role.
    srv.wait_detail(&members[0], |d| d["state"] == "active");
    ok(srv.cmd().arg("fail").arg(&members[1]));
    let during = fio.still_running();
    ok(srv
        .cmd()
        .args(["fail", "--control"])
        .arg(&srv.control)
        .arg("3"));
    let d = srv.detail(&members[0]);
    assert_eq!(d["degraded"], true);
    assert_eq!(member_state(&d, 1), "faulty");
    assert_eq!(member_state(&d, 3), "faulty");
    // A third failure is beyond raid6 and is refused.
    let third = srv.cmd().arg("fail").arg(&members[0]).output().unwrap();
    assert!(!third.status.success());
    let out = fio.wait_output();
    fio_check(&out);
    if !during {
        eprintln!("note: fio finished before the first failure");
    }
    ok(srv.cmd().arg("stop").arg(&members[2]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    let live = [members[0].clone(), members[2].clone(), members[4].clone()];
    assert!(member_states(&live).iter().all(|s| s == "clean"));
    // Restart with every path given: the failed members are stale and left out.
    let srv = Served::start(&dir, &members, &[]);
    assert_eq!(srv.detail(&members[0])["degraded"], true);
    let out = Command::new("fio")
        .args(fio_args(&srv.uri(), 32, 11))
        .arg("--verify_only=1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "verify after restart: {}",
        stdout(&out)
    );
}

/// A real IO error: member 2 is a loop device whose backing file shrinks to nothing while
/// fio runs, so every IO to it fails. The engine marks it faulty and serves from parity;
/// fio sees no error and its data verifies.
#[test]
fn member_io_error_under_fio() {
    if !need_tools(&["fio", "losetup"], "member_io_error_under_fio") {
        return;
    }
    let dir = TempDir::new("ioerr");
    let files = create_array(&dir, "5", 4, 16, &[]);
    let Some(lo) = Loop::attach_or_skip(&files[2], "member_io_error_under_fio") else {
        return;
    };
    let mut members = files.clone();
    members[2] = std::path::PathBuf::from(&lo.0);
    let srv = Served::start(&dir, &members, &[]);
    let mut fio = ChildGuard(Some(
        Command::new("fio")
            .args(fio_args(&srv.uri(), 24, 13))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    srv.wait_detail(&members[0], |d| d["state"] == "active");
    let during = fio.still_running();
    // Between the truncation and `losetup -c` the loop device reads the truncated file as
    // zeros without an error: silent corruption that no RAID can see (only a scrub finds
    // it). The server is paused across that window, so that the member's first failing IO
    // is a real error after it.
    let srv_pid = srv.child.as_ref().unwrap().id().to_string();
    let _ = Command::new("kill").args(["-STOP", &srv_pid]).status();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&files[2])
        .unwrap()
        .set_len(0)
        .unwrap();
    ok(Command::new("losetup").args(["-c", &lo.0]));
    let _ = Command::new("kill").args(["-CONT", &srv_pid]).status();
    let out = fio.wait_output();
    fio_check(&out);
    if !during {
        eprintln!("note: fio finished before the member failed");
    }
    let d = srv.detail(&members[0]);
    assert_eq!(member_state(&d, 2), "faulty", "{d}");
    assert_eq!(d["degraded"], true);
}

/// A served array killed without a clean stop is resynced in the background when it is
/// served again, and its data is intact.
#[test]
fn unclean_stop_resyncs_when_served_again() {
    if !need_tool("qemu-io", "unclean_stop_resyncs_when_served_again") {
        return;
    }
    let dir = TempDir::new("unclean");
    let members = create_array(&dir, "5", 3, 8, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    qemu_io(&srv.uri(), &["write -P 0x42 0 1M", "flush"]);
    let st = srv.signal_and_wait(libc::SIGKILL);
    assert!(!st.success());
    assert!(member_states(&members).iter().all(|s| s == "active"));
    let mut srv = Served::start(&dir, &members, &[]);
    srv.wait_detail(&members[0], |d| d["resync_pending"] == false);
    let out = qemu_io(&srv.uri(), &["read -P 0x42 0 1M"]);
    assert!(!out.contains("verification failed"));
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    assert!(srv.stderr().contains("resync finished"), "{}", srv.stderr());
    assert!(member_states(&members).iter().all(|s| s == "clean"));
}

/// While served, other uraid commands must not open the members for writing; detail asks
/// the server.
#[test]
fn served_members_are_locked() {
    let dir = TempDir::new("locks");
    let members = create_array(&dir, "5", 3, 8, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    for sub in ["read", "write", "resync", "assemble"] {
        let mut c = srv.cmd();
        c.arg(sub).args(&members);
        if sub == "write" {
            c.stdin(Stdio::null());
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{sub} ran on a served array");
        assert!(err.contains("control"), "{sub}: {err}");
    }
    // detail, human and JSON, through the server.
    let human = stdout(&ok(srv.cmd().arg("detail").args(&members)));
    assert!(human.contains("Served by pid"), "{human}");
    assert!(human.contains("raid5"), "{human}");
    let d = srv.detail(&members[2]);
    assert_eq!(d["serve"]["pid"].as_u64(), Some(srv.pid() as u64));
    assert_eq!(d["raid_disks"], 3);
    // detail --control, as the serve banner says, without a member path (and without the
    // run dir, so the socket is not found from an index file).
    let by_socket = json(&ok(uraid()
        .args(["detail", "--json", "--control"])
        .arg(&srv.control)));
    assert_eq!(by_socket["uuid"], d["uuid"]);
    let human = stdout(&ok(uraid()
        .arg("detail")
        .arg("--control")
        .arg(&srv.control)));
    assert!(
        human.contains(&format!("Served by pid {} (control", srv.pid())),
        "{human}"
    );
    let neither = uraid().arg("detail").output().unwrap();
    assert!(!neither.status.success());
    assert!(String::from_utf8_lossy(&neither.stderr).contains("--control"));
    // The default socket name (<uuid>.sock) links to the --control path.
    let uuid = d["uuid"].as_str().unwrap();
    let link = srv.run_dir.join(format!("{uuid}.sock"));
    assert!(UnixStream::connect(&link).is_ok());
    // create over a served member is refused before it writes anything.
    let create = srv
        .cmd()
        .args(["create", "-l", "1", "-n", "2"])
        .arg(&members[0])
        .arg("missing")
        .output()
        .unwrap();
    assert!(!create.status.success());
    assert!(String::from_utf8_lossy(&create.stderr).contains("control"));
    // A second server on the same members is refused.
    let second = srv
        .cmd()
        .args(["serve", "--nbd", "unix:/nonexistent/x.sock"])
        .args(&members)
        .output()
        .unwrap();
    assert!(!second.status.success());
    ok(srv.cmd().arg("stop").arg("--control").arg(&srv.control));
    assert!(srv.wait().success());
    // Everything is released: the index and sockets are gone, and commands work again.
    assert!(!link.exists() && !srv.control.exists());
    ok(uraid()
        .arg("read")
        .arg("--length")
        .arg("4096")
        .args(&members));
}

/// fail, remove, add: the re-added member is rebuilt while served, and then holds the data
/// on its own (read back with another member left out).
#[test]
fn remove_and_add_rebuilds() {
    if !need_tool("nbdcopy", "remove_and_add_rebuilds") {
        return;
    }
    let dir = TempDir::new("readd");
    let members = create_array(&dir, "5", 4, 12, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    let size = srv.detail(&members[0])["array_bytes"].as_u64().unwrap() as usize;
    let image = pattern(size, 5);
    let src = dir.path("in.img");
    std::fs::write(&src, &image).unwrap();
    ok(Command::new("nbdcopy").arg(&src).arg(srv.uri()));

    // remove refuses an active member, as mdadm does.
    let r = srv.cmd().arg("remove").arg(&members[1]).output().unwrap();
    assert!(!r.status.success());
    ok(srv.cmd().arg("fail").arg(&members[1]));
    ok(srv.cmd().arg("remove").arg(&members[1]));
    assert_eq!(member_state(&srv.detail(&members[0]), 1), "missing");
    srv.add(&members[0], &members[1]);
    srv.wait_detail(&members[0], |d| d["degraded"] == false);
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    // Leave out member 0: member 1's rebuilt data is now needed everywhere.
    let back = dir.path("back.img");
    ok(uraid().arg("read").arg("-o").arg(&back).args(&members[1..]));
    assert!(
        std::fs::read(&back).unwrap() == image,
        "rebuilt member is wrong"
    );
}

/// A spare added to a whole array waits (served with the sync IO engine); when a member fails it takes the role and is
/// rebuilt while served, then holds every byte on its own.
#[test]
fn spare_takes_over() {
    if !need_tool("nbdcopy", "spare_takes_over") {
        return;
    }
    let dir = TempDir::new("spare");
    let members = create_array(&dir, "1", 2, 10, &[]);
    let spare = dir.image("spare.img", 10);
    let mut srv = Served::start(&dir, &members, &SYNC);
    let size = srv.detail(&members[0])["array_bytes"].as_u64().unwrap() as usize;
    let image = pattern(size, 8);
    let src = dir.path("in.img");
    std::fs::write(&src, &image).unwrap();
    ok(Command::new("nbdcopy").arg(&src).arg(srv.uri()));
    let added = json(&ok(srv
        .cmd()
        .args(["add", "--json", "--control"])
        .arg(&srv.control)
        .arg(&spare)));
    assert_eq!(added["degraded"], false, "{added}");
    ok(srv.cmd().arg("fail").arg(&members[0]));
    srv.wait_detail(&members[1], |d| d["degraded"] == false);
    let d = srv.detail(&members[1]);
    let spare_name = spare.display().to_string();
    assert!(
        d["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["device"].as_str() == Some(spare_name.as_str()) && m["state"] == "active"),
        "{d}"
    );
    ok(srv.cmd().arg("stop").arg(&members[1]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    // The former spare alone holds the whole array.
    let back = dir.path("back.img");
    ok(uraid().arg("read").arg("-o").arg(&back).arg(&spare));
    assert!(
        std::fs::read(&back).unwrap() == image,
        "rebuilt spare is wrong"
    );
}

/// mdadm --replace while served (with the sync IO engine): the named device is added as a spare, rebuilt beside the
/// member, then takes its role; the array is never degraded, and the new member set holds
/// the data (also without one of the old members).
#[test]
fn replace_while_served() {
    if !need_tool("nbdcopy", "replace_while_served") {
        return;
    }
    let dir = TempDir::new("replace");
    let members = create_array(&dir, "5", 3, 10, &[]);
    let new = dir.image("new.img", 10);
    let mut srv = Served::start(&dir, &members, &SYNC);
    let size = srv.detail(&members[0])["array_bytes"].as_u64().unwrap() as usize;
    let image = pattern(size, 21);
    let src = dir.path("in.img");
    std::fs::write(&src, &image).unwrap();
    ok(Command::new("nbdcopy").arg(&src).arg(srv.uri()));
    let r = json(&ok(srv
        .cmd()
        .args(["replace", "--json", "--member"])
        .arg(&members[1])
        .arg("--with")
        .arg(&new)));
    assert_eq!(r["degraded"], false, "{r}");
    let new_name = new.display().to_string();
    srv.wait_detail(&members[0], |d| {
        assert_eq!(d["degraded"], false, "degraded while replacing: {d}");
        d["members"][1]["device"].as_str() == Some(new_name.as_str())
    });
    let d = srv.detail(&members[0]);
    assert_eq!(member_state(&d, 1), "active", "{d}");
    assert!(d["members"][1]["replacement"].is_null(), "{d}");
    // A second replace of the same role has no spare left.
    let again = srv
        .cmd()
        .args(["replace", "--control"])
        .arg(&srv.control)
        .args(["--member", "1"])
        .output()
        .unwrap();
    assert!(!again.status.success());
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    // The old member is out (its role is faulty in the others' superblocks); the new one
    // with member 0 alone holds every byte.
    let back = dir.path("back.img");
    ok(uraid()
        .arg("read")
        .arg("-o")
        .arg(&back)
        .arg(&members[0])
        .arg(&new));
    assert!(
        std::fs::read(&back).unwrap() == image,
        "replacement is wrong"
    );
}

/// Garbage on the NBD socket drops that client only; data and other clients are unharmed.
#[test]
fn hostile_client() {
    if !need_tool("qemu-io", "hostile_client") {
        return;
    }
    let dir = TempDir::new("hostile");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let srv = Served::start(&dir, &members, &[]);
    let uri = srv.uri();
    qemu_io(&uri, &["write -P 0x77 0 65536"]);
    for junk in [
        pattern(4096, 9),
        // The client half of a handshake, then an oversized option.
        [
            &0u32.to_be_bytes()[..],
            b"IHAVEOPT",
            &[0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff],
        ]
        .concat(),
    ] {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        let _ = s.write_all(&junk);
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    // The control socket answers garbage with an error and keeps serving.
    for junk in [
        "not json",
        "{\"cmd\":\"format-disk\"}",
        "{\"cmd\":\"fail\",\"member\":\"99\"}",
    ] {
        let mut c = UnixStream::connect(&srv.control).unwrap();
        writeln!(c, "{junk}").unwrap();
        let mut reply = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(&c), &mut reply).unwrap();
        let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(v["ok"], false, "{junk} -> {reply}");
    }
    let mut c = UnixStream::connect(&srv.control).unwrap();
    let _ = c.write_all(&vec![b'x'; 200_000]);
    drop(c);
    let out = qemu_io(&uri, &["read -P 0x77 0 65536"]);
    assert!(!out.contains("verification failed"));
    assert_eq!(srv.detail(&members[0])["degraded"], false);
}

/// `uraid demo` makes an array, serves it, stops on Ctrl-C, and reuses it the next time.
#[test]
fn demo_serves_and_reuses() {
    if !need_tool("nbdinfo", "demo_serves_and_reuses") {
        return;
    }
    let dir = TempDir::new("demo");
    let demo_dir = dir.path("demo");
    let control = demo_dir.join("control.sock");
    let sock = dir.path("demo.sock");
    let args = vec![
        "demo".to_string(),
        "--dir".into(),
        demo_dir.display().to_string(),
        "--size".into(),
        "16M".into(),
        "--nbd".into(),
        format!("unix:{}", sock.display()),
    ];
    let mut srv = Served::spawn(&dir, args.clone(), &[], sock.clone(), control.clone());
    srv.name = "demo".into();
    let d = srv.detail(&demo_dir.join("member0.img"));
    assert_eq!(d["level"], "raid5");
    assert_eq!(d["raid_disks"], 4);
    assert_eq!(nbd_size(&srv.uri()), d["array_bytes"].as_u64().unwrap());
    let uuid = d["uuid"].as_str().unwrap().to_string();
    let st = srv.signal_and_wait(libc::SIGINT);
    assert!(st.success(), "{}", srv.stderr());
    let mut again = Served::spawn(&dir, args, &[], sock, control);
    assert!(again.stderr().contains("reusing"), "{}", again.stderr());
    assert_eq!(again.detail(&demo_dir.join("member1.img"))["uuid"], uuid);
    ok(again.cmd().arg("stop").arg("--control").arg(&again.control));
    assert!(again.wait().success());
}

/// Without the ublk driver, `--ublk` fails with a message that says so and leaves the
/// array clean and unlocked.
#[test]
fn ublk_missing_driver_message() {
    if std::path::Path::new("/dev/ublk-control").exists() {
        uraid_testkit::skip_not_applicable(
            "ublk_missing_driver_message",
            "this kernel has ublk (tests/vm/export.sh serves through it)",
        );
        return;
    }
    let dir = TempDir::new("noublk");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let out = uraid()
        .env("URAID_RUN_DIR", dir.run_dir())
        .args(["serve", "--ublk", "--no-nbd"])
        .args(&members)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("CONFIG_BLK_DEV_UBLK") && err.contains("--nbd"),
        "{err}"
    );
    assert!(member_states(&members).iter().all(|s| s == "clean"));
    ok(uraid()
        .arg("read")
        .arg("--length")
        .arg("512")
        .args(&members));
}

/// The write journal's mode through the control socket: write-back shown in detail, a
/// write that stays in the cache, a kill, and the next assembly replays it.
#[test]
fn journal_mode_write_back_survives_a_kill() {
    if !need_tool("qemu-io", "journal_mode_write_back_survives_a_kill") {
        return;
    }
    let dir = TempDir::new("jmode");
    let mut all = Vec::new();
    for name in ["m0", "m1", "m2", "m3", "j"] {
        all.push(dir.image(&format!("{name}.img"), 16));
    }
    ok(uraid()
        .args([
            "create",
            "-l",
            "5",
            "-n",
            "4",
            "--chunk",
            "64K",
            "--write-journal",
        ])
        .arg(&all[4])
        .args(&all[..4]));
    let mut srv = Served::start(&dir, &all, &[]);
    let out = ok(srv.cmd().args(["journal-mode", "--array"]).arg(&all[0]));
    assert_eq!(stdout(&out).trim(), "write-through");
    ok(srv
        .cmd()
        .args(["journal-mode", "--array"])
        .arg(&all[0])
        .arg("write-back"));
    assert_eq!(srv.detail(&all[0])["journal"]["mode"], "write-back");
    qemu_io(&srv.uri(), &["write -P 0x5a 4096 8192", "flush"]);
    let d = srv.detail(&all[0]);
    assert!(
        d["journal"]["cached_bytes"].as_u64().unwrap_or(0) > 0,
        "the write should still be cached: {d}"
    );
    let st = srv.signal_and_wait(libc::SIGKILL);
    assert!(!st.success());
    let out = ok(uraid()
        .args(["read", "--offset", "4096", "--length", "8192"])
        .args(&all));
    assert!(out.stdout.len() == 8192 && out.stdout.iter().all(|b| *b == 0x5a));
    let out = ok(uraid().args(["check", "-q"]).args(&all));
    assert!(stdout(&out).contains("mismatch_cnt: 0"), "{}", stdout(&out));
}

/// `stop --keep-ublk` on a server without a ublk export is refused by name, and the server
/// goes on serving (nothing stopped); a plain stop then stops it clean.
#[test]
fn stop_keep_ublk_without_a_ublk_export_is_refused_and_stops_nothing() {
    let dir = TempDir::new("keep-ublk-nbd");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    let err = fails_with(
        srv.cmd()
            .arg("stop")
            .arg("--keep-ublk")
            .arg("--control")
            .arg(&srv.control),
        "no ublk export to keep",
    );
    assert!(err.contains("Nothing was stopped"), "{err}");
    assert_eq!(
        err.matches("no ublk export").count(),
        1,
        "said once:\n{err}"
    );
    // Still served: detail answers, and the array is not stopped.
    let d = stdout(&ok(srv
        .cmd()
        .arg("detail")
        .arg("--json")
        .arg("--control")
        .arg(&srv.control)));
    assert!(d.contains("\"uuid\""), "{d}");
    ok(srv.cmd().arg("stop").arg("--control").arg(&srv.control));
    assert!(srv.wait().success(), "{}", srv.stderr());
    assert!(member_states(&members).iter().all(|s| s == "clean"));
}
