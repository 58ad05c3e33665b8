//! A reshape that runs while the array is served (md goes on with a reshape it finds when
//! it starts an array): `uraid grow --stop-at 0` records the start of a raid5 3 -> 4 grow,
//! `uraid serve` moves the data at `--speed-max` while fio writes and verifies through
//! NBD; `detail` and `status` show the reshape, the monitor hears its progress and end, and
//! afterwards the array is a 4-device raid5 with fio's bytes, mdadm sees no reshape, and
//! md's check finds no mismatch.

use std::process::Command;
use std::time::{Duration, Instant};
use uraid_testkit::prelude::*;

#[test]
fn a_raid5_grows_while_fio_verifies_through_nbd() {
    let test = "a_raid5_grows_while_fio_verifies_through_nbd";
    if !need_tools(&["fio", "qemu-io"], test) {
        return;
    }
    let d = TempDir::new("rs-served");
    let imgs = d.images(3, 24, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "64K", "--assume-clean"])
        .args(&imgs));
    let new = d.image("m3.img", 24);
    let out = ok(uraid()
        .args([
            "grow",
            "-q",
            "--raid-devices",
            "4",
            "--stop-at",
            "0",
            "--add",
        ])
        .arg(&new)
        .arg("--")
        .args(&imgs));
    assert!(
        text(&out.stderr).contains("recorded at array sector 0"),
        "{}",
        text(&out.stderr)
    );
    let all = [imgs.clone(), vec![new.clone()]].concat();
    let mut srv = Served::start(&d, &all, &["--speed-max", "3000"]);
    let monitor = d.path("monitor.log");
    let mut mon = srv
        .cmd()
        .args(["monitor", "--delay", "1", "--control"])
        .arg(&srv.control)
        .stdout(std::fs::File::create(&monitor).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let det = srv.detail(&all[0]);
    assert_eq!(det["sync"]["kind"], "reshape", "{det}");
    let status = stdout(&ok(srv.cmd().arg("status")));
    assert!(status.contains("reshape ="), "{status}");
    // A pattern on the old side of the reshape, checked after it and after a restart.
    qemu_io(&srv.uri(), &["write -P 0x5a 30M 1M"]);
    // fio writes and verifies 16 MiB (inside the size both shapes have) while it moves.
    let fio = run(Command::new("fio").args(fio_args(&srv.uri(), 16, 5)));
    fio_check(&fio);
    let during = srv.detail(&all[0]);
    assert_eq!(
        during["sync"]["kind"], "reshape",
        "the reshape ended before fio did (raise the size or lower --speed-max): {during}"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let det = srv.detail(&all[0]);
        if det["sync"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "the reshape did not end: {det}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        srv.stderr().contains("reshape finished"),
        "{}",
        srv.stderr()
    );
    let got = qemu_io(&srv.uri(), &["read -P 0x5a 30M 1M"]);
    assert!(!got.contains("verification failed"), "{got}");
    // Served on in the new shape: fio writes and verifies again.
    fio_check(&run(Command::new("fio").args(fio_args(&srv.uri(), 16, 6))));
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        let log = std::fs::read_to_string(&monitor).unwrap();
        if log.contains("RebuildFinished") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // (RebuildStarted came with the start of the server, before the monitor listened.)
    assert!(log.contains("Rebuild20"), "{log}");
    assert!(log.contains("RebuildFinished"), "{log}");
    let _ = mon.kill();
    let _ = mon.wait();
    ok(srv.cmd().arg("stop").arg(&all[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    let bytes = ok(uraid().arg("read").args(&all)).stdout;
    let at = 30 << 20;
    assert!(
        bytes[at..at + (1 << 20)].iter().all(|&b| b == 0x5a),
        "the pattern written mid-reshape, after a restart"
    );
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&all)));
    assert_eq!(det["raid_disks"], 4, "{det}");
    let out = ok(uraid().args(["check", "-q"]).args(&all));
    assert!(
        text(&out.stdout).contains("mismatch_cnt: 0"),
        "{}",
        text(&out.stdout)
    );
    if let Some(md) = tool_path("mdadm", test) {
        let ex = run(Command::new(md).arg("--examine").arg(&all[0]));
        let ex = text(&ex.stdout);
        assert!(ex.contains("Raid Devices : 4"), "{ex}");
        assert!(!ex.contains("Reshape"), "{ex}");
    }
}

/// md's `mdadm --grow --raid-devices 4 --add DEV` on a running raid5: uraid adds the device
/// as a spare, starts the reshape while fio writes and verifies through NBD (the array is
/// built again in its reshaping form under it), runs the reshape in the background and,
/// at its end, serves the new shape: a client that connects then sees the larger size and
/// can write past the old end; after a restart the bytes are there and md agrees.
#[test]
fn a_served_raid5_starts_its_grow_live_and_then_serves_the_new_size() {
    let test = "a_served_raid5_starts_its_grow_live_and_then_serves_the_new_size";
    if !need_tools(&["fio", "qemu-io", "nbdinfo"], test) {
        return;
    }
    let d = TempDir::new("rs-live");
    let imgs = d.images(3, 24, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "64K", "--assume-clean"])
        .args(&imgs));
    let new = d.image("m3.img", 24);
    let mut srv = Served::start(&d, &imgs, &["--speed-max", "3000"]);
    let before = nbd_size(&srv.uri());
    qemu_io(&srv.uri(), &["write -P 0x5a 30M 1M"]);
    // fio writes and verifies 16 MiB while the grow starts under it.
    let fio = ChildGuard(Some(
        Command::new("fio")
            .args(fio_args(&srv.uri(), 16, 7))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    std::thread::sleep(Duration::from_millis(300));
    let out = ok(srv
        .cmd()
        .args(["grow", "-q", "--raid-devices", "4", "--add"])
        .arg(&new)
        .arg("--control")
        .arg(&srv.control));
    let said = text(&out.stderr);
    assert!(said.contains("reshape started"), "{said}");
    let mut fio = fio;
    assert!(
        fio.still_running(),
        "fio ended before the grow did, so the grow was not tested under IO (raise fio's size)"
    );
    let det = srv.detail(&imgs[0]);
    assert_eq!(det["sync"]["kind"], "reshape", "{det}");
    assert_eq!(det["raid_disks"], 4, "{det}");
    fio_check(&fio.wait_output());
    srv.wait_detail(&imgs[0], |d| {
        d["sync"].is_null() && d["array_bytes"].as_u64() > Some(before)
    });
    let det = srv.detail(&imgs[0]);
    let after = det["array_bytes"].as_u64().unwrap();
    // Three data members instead of two, less what the moved data offset took.
    assert!(after > before * 5 / 4, "{before} -> {after}: {det}");
    assert_eq!(
        nbd_size(&srv.uri()),
        after,
        "a new client sees the new size"
    );
    let got = qemu_io(&srv.uri(), &["read -P 0x5a 30M 1M"]);
    assert!(!got.contains("verification failed"), "{got}");
    // Past the old end: only the new shape has it.
    let past = format!("write -P 0xa5 {before} 1M");
    qemu_io(&srv.uri(), &[past.as_str()]);
    let all = [imgs.clone(), vec![new.clone()]].concat();
    ok(srv.cmd().arg("stop").arg(&all[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    let bytes = ok(uraid().arg("read").args(&all)).stdout;
    assert_eq!(bytes.len() as u64, after);
    let at = 30 << 20;
    assert!(bytes[at..at + (1 << 20)].iter().all(|&b| b == 0x5a));
    let at = before as usize;
    assert!(bytes[at..at + (1 << 20)].iter().all(|&b| b == 0xa5));
    let out = ok(uraid().args(["check", "-q"]).args(&all));
    assert!(
        text(&out.stdout).contains("mismatch_cnt: 0"),
        "{}",
        text(&out.stdout)
    );
    if let Some(md) = tool_path("mdadm", test) {
        let ex = run(Command::new(md).arg("--examine").arg(&new));
        let ex = text(&ex.stdout);
        assert!(ex.contains("Raid Devices : 4"), "{ex}");
        assert!(ex.contains("Device Role : Active device 3"), "{ex}");
        assert!(!ex.contains("Reshape"), "{ex}");
    }
}
