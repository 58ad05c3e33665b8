//! md's behaviour around a degraded array: served with a spare it rebuilds onto the spare;
//! `uraid recover` with nothing to do says so; once it writes degraded, the present members'
//! superblocks record the absent one as removed (mdadm --examine: `AA.`); `uraid monitor`
//! reports every event of a served array, even several within one polling interval.

use std::process::Command;
use std::time::{Duration, Instant};
use uraid_testkit::prelude::*;

#[test]
fn a_degraded_array_with_a_spare_recovers_when_served() {
    if !need_tool(
        "qemu-io",
        "a_degraded_array_with_a_spare_recovers_when_served",
    ) {
        return;
    }
    let dir = TempDir::new("degr-spare");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let spare = dir.image("spare.img", 8);
    let mut srv = Served::start(&dir, &members, &[]);
    qemu_io(&srv.uri(), &["write -P 0x3c 0 1M"]);
    ok(srv
        .cmd()
        .arg("add")
        .arg("--control")
        .arg(&srv.control)
        .arg(&spare));
    assert_eq!(srv.detail(&members[0])["degraded"], false);
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());

    // Member 1 is gone; the spare is there.
    let now = [members[0].clone(), spare.clone()];
    let mut srv = Served::start(&dir, &now, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = srv.detail(&members[0]);
        if d["degraded"] == false && d["sync"].is_null() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no recovery onto the spare: {d}\n{}",
            srv.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        srv.stderr().contains("a spare takes role 1"),
        "{}",
        srv.stderr()
    );
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    // The rebuilt spare alone holds the data.
    let srv = Served::start(&dir, std::slice::from_ref(&spare), &[]);
    let out = qemu_io(&srv.uri(), &["read -P 0x3c 0 1M"]);
    assert!(!out.contains("verification failed"), "{out}");
}

#[test]
fn recover_with_nothing_to_do_says_so() {
    let dir = TempDir::new("degr-recover");
    let members = create_array(&dir, "5", 3, 8, &[]);
    let out = ok(uraid().arg("recover").args(&members));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing to recover: every member is in sync"),
        "{err}"
    );
    let out = ok(uraid().arg("recover").args(&members[..2]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing to recover: role(s) 2 missing and no spare"),
        "{err}"
    );
}

#[test]
fn a_degraded_write_marks_the_absent_member_removed_for_mdadm() {
    if !need_tools(
        &["qemu-io", "mdadm"],
        "a_degraded_write_marks_the_absent_member_removed_for_mdadm",
    ) {
        return;
    }
    let dir = TempDir::new("degr-roles");
    let members = create_array(&dir, "5", 3, 8, &[]);
    let mut srv = Served::start(&dir, &members[..2], &[]);
    qemu_io(&srv.uri(), &["write -P 0x11 0 64k"]);
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    for m in &members[..2] {
        let out = stdout(&ok(Command::new("mdadm").arg("--examine").arg(m)));
        assert!(out.contains("Array State : AA."), "{}: {out}", m.display());
    }
    // The absent member was not written: it still says AAA, with older events.
    let out = stdout(&ok(Command::new("mdadm").arg("--examine").arg(&members[2])));
    assert!(out.contains("Array State : AAA"), "{out}");
}

/// A Fail, a remove and an add, all within one 4 s polling interval: the monitor reports
/// each (a diff of two states would see only a rebuild, or nothing at all).
#[test]
fn monitor_misses_no_event_within_one_interval() {
    let dir = TempDir::new("degr-monitor");
    let members = create_array(&dir, "5", 3, 8, &[]);
    let srv = Served::start(&dir, &members, &[]);
    let mut mon = ChildGuard(Some(
        srv.cmd()
            .args([
                "monitor",
                "--json",
                "--delay",
                "4",
                "--count",
                "3",
                "--control",
            ])
            .arg(&srv.control)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let out = mon.0.as_mut().unwrap().stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("no first poll");
    assert!(first.contains("NewArray"), "{first}");
    let m1 = members[1].display().to_string();
    ok(srv.cmd().arg("fail").arg(&members[1]));
    ok(srv.cmd().arg("remove").arg(&members[1]));
    ok(srv
        .cmd()
        .args(["add", "--control"])
        .arg(&srv.control)
        .arg(&members[1]));
    let mut events = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        events.push((
            v["event"].as_str().unwrap().to_string(),
            v["device"].as_str().unwrap_or("").to_string(),
        ));
    }
    let status = mon.0.take().unwrap().wait().unwrap();
    assert!(status.success());
    let pos = |name: &str| {
        events
            .iter()
            .position(|(e, d)| e == name && d.ends_with(&m1))
    };
    let (Some(fail), Some(gone)) = (pos("Fail"), pos("DeviceDisappeared")) else {
        panic!("missed events: {events:?}");
    };
    assert!(fail < gone, "{events:?}");
    let degraded = events.iter().position(|(e, _)| e == "DegradedArray");
    assert!(degraded.is_some_and(|d| d > fail), "{events:?}");
    assert!(
        events.iter().any(|(e, _)| e == "RebuildStarted"),
        "{events:?}"
    );
}
