//! A 0.90 array managed through the CLI while served (fail, remove, add with a rebuild,
//! a spare taking over, replace), with host `mdadm --examine` reading every member's
//! superblock after each step: its checksum correct, State clean, the counts and events,
//! and every "this" line and table row as uraid's `examine` prints them and as md's
//! super_90_sync numbers them (in-sync devices in their role's entry, the others from
//! raid_disks on, faulty roles kept as removed+faulty entries).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use uraid_core::superblock090::{sb090_offset_sectors, Superblock090, DISK_FAULTY, SB090_BYTES};
use uraid_testkit::prelude::*;

/// `uraid` with the sync IO engine.
fn uraid() -> Command {
    let mut c = uraid_testkit::cli::uraid();
    c.args(SYNC);
    c
}

/// The table rows ("this" and one per device) as printed, trimmed.
fn rows(t: &str) -> Vec<String> {
    t.lines()
        .skip_while(|l| !l.contains("RaidDevice State"))
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty() && !l.contains("RaidDevice State"))
        .collect()
}

/// What md's rules say the counts of a member's record are after a step.
struct Want {
    active: u32,
    working: u32,
    failed: u32,
    spare: u32,
    /// nr_disks: every device still in the array, a faulty one too until removed.
    total: u32,
    /// Entries of devices failed but not yet removed: md gives them a number from
    /// raid_disks on with state faulty alone (mdadm prints only the first
    /// raid_disks + spare entries, so these are read from the record).
    faulty: usize,
    events: u64,
}

fn record(img: &Path) -> Superblock090 {
    let f = std::fs::File::open(img).unwrap();
    let at = sb090_offset_sectors(f.metadata().unwrap().len() / 512).unwrap() * 512;
    let mut buf = vec![0u8; SB090_BYTES];
    f.read_exact_at(&mut buf, at).unwrap();
    Superblock090::decode(&buf).unwrap()
}

/// mdadm --examine of every member agrees with uraid's examine and with `want`; returns
/// mdadm's table of the first member (the same on every member).
fn check(md: &Path, members: &[PathBuf], want: &Want, step: &str) -> Vec<String> {
    let mut first: Option<Vec<String>> = None;
    for img in members {
        let ours = stdout(&ok(uraid().arg("examine").arg(img)));
        let out = Command::new(md)
            .arg("--examine")
            .arg(img)
            .env("TZ", "UTC")
            .output()
            .unwrap();
        let theirs = text(&out.stdout);
        let ctx = format!(
            "{step}: {}\nuraid:\n{ours}\nmdadm:\n{theirs}{}",
            img.display(),
            text(&out.stderr)
        );
        assert!(out.status.success(), "mdadm --examine failed: {ctx}");
        let f = |t: &str, k: &str| mdadm_field(t, k);
        assert_eq!(f(&theirs, "Version").as_deref(), Some("0.90.00"), "{ctx}");
        // mdadm recomputes the checksum and says "correct" only when it matches.
        let sum = f(&theirs, "Checksum").unwrap_or_default();
        assert!(sum.ends_with(" - correct"), "checksum: {ctx}");
        assert_eq!(f(&theirs, "State").as_deref(), Some("clean"), "{ctx}");
        for (k, v) in [
            ("Active Devices", want.active),
            ("Working Devices", want.working),
            ("Failed Devices", want.failed),
            ("Spare Devices", want.spare),
            ("Total Devices", want.total),
        ] {
            assert_eq!(f(&theirs, k), Some(v.to_string()), "{k}: {ctx}");
        }
        assert_eq!(
            f(&theirs, "Events"),
            Some(want.events.to_string()),
            "Events: {ctx}"
        );
        for k in [
            "UUID",
            "Raid Level",
            "Raid Devices",
            "Total Devices",
            "Preferred Minor",
            "Update Time",
            "State",
            "Active Devices",
            "Working Devices",
            "Failed Devices",
            "Spare Devices",
            "Checksum",
            "Events",
            "Layout",
            "Chunk Size",
        ] {
            assert_eq!(f(&ours, k), f(&theirs, k), "{k}: {ctx}");
        }
        let rec = record(img);
        let faulty: Vec<usize> = (0..rec.disks.len())
            .filter(|&i| rec.disks[i].state == DISK_FAULTY)
            .collect();
        assert_eq!(
            faulty.len(),
            want.faulty,
            "faulty entries {faulty:?}: {ctx}"
        );
        for &i in &faulty {
            assert!(
                i >= rec.raid_disks as usize,
                "faulty entry {i} in a role: {ctx}"
            );
            assert_eq!(rec.disks[i].number as usize, i, "{ctx}");
            assert_eq!(rec.disks[i].raid_disk as usize, i, "{ctx}");
        }
        let (r_ours, r_theirs) = (rows(&ours), rows(&theirs));
        assert_eq!(r_ours, r_theirs, "table: {ctx}");
        // The device rows (after "this") are the same on every member.
        let table = r_theirs[1..].to_vec();
        match &first {
            None => first = Some(table),
            Some(t) => assert_eq!(t, &table, "tables differ between members: {ctx}"),
        }
    }
    first.unwrap()
}

/// The fields of a table row as mdadm prints them: the entry index, Number, Major, Minor,
/// RaidDevice, then the state words.
fn row(t: &[String], number: usize) -> Vec<String> {
    t.iter()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|w| w[0] == number.to_string())
        .unwrap_or_else(|| panic!("no row {number} in {t:#?}"))
}

fn events(img: &Path) -> u64 {
    let v = json(&ok(uraid().args(["examine", "--json"]).arg(img)));
    v["events"]
        .as_u64()
        .unwrap_or_else(|| panic!("events in {v}"))
}

fn create090(dir: &TempDir, level: &str, n: usize) -> Vec<PathBuf> {
    let imgs = dir.images(n, 12, "m");
    ok(uraid()
        .args(["create", "-e", "0.90", "-l", level, "-c", "64K"])
        .args(&imgs));
    imgs
}

#[test]
fn mdadm_examines_a_090_raid5_through_fail_remove_add_and_replace() {
    const TEST: &str = "mdadm_examines_a_090_raid5_through_fail_remove_add_and_replace";
    let Some(md) = tool_path("mdadm", TEST) else {
        return;
    };
    let dir = TempDir::new("t090r5");
    let m = create090(&dir, "5", 4);
    let new = dir.image("new.img", 12);
    let ev0 = events(&m[0]);
    let t = check(
        &md,
        &m,
        &Want {
            active: 4,
            working: 4,
            failed: 0,
            spare: 0,
            total: 4,
            faulty: 0,
            events: ev0,
        },
        "created",
    );
    for i in 0..4 {
        let r = row(&t, i);
        assert_eq!(
            r[1..5],
            [i.to_string(), "0".into(), "0".into(), i.to_string()],
            "{t:#?}"
        );
        assert_eq!(&r[5..], ["active", "sync"], "{t:#?}");
    }
    let srv = Served::start(&dir, &m, &SYNC);

    // fail: md keeps the faulty device in its role's entry, "faulty" and removed from sync.
    ok(srv.cmd().arg("fail").arg(&m[1]));
    let live = [m[0].clone(), m[2].clone(), m[3].clone()];
    let ev = events(&m[0]);
    let t = check(
        &md,
        &live,
        &Want {
            active: 3,
            working: 3,
            failed: 1,
            spare: 0,
            total: 4,
            faulty: 1,
            events: ev,
        },
        "fail m1",
    );
    let r = row(&t, 1);
    assert!(r.contains(&"faulty".to_string()), "{t:#?}");

    // remove: the role stays faulty+removed in the table.
    ok(srv.cmd().arg("remove").arg(&m[1]));
    let ev2 = events(&m[0]);
    assert!(ev2 > ev, "md writes the superblocks at a remove");
    let t = check(
        &md,
        &live,
        &Want {
            active: 3,
            working: 3,
            failed: 1,
            spare: 0,
            total: 3,
            faulty: 0,
            events: ev2,
        },
        "remove m1",
    );
    assert!(row(&t, 1).contains(&"faulty".to_string()), "{t:#?}");

    // add: rebuilt into role 1, then all four in sync again.
    srv.add(&m[0], &m[1]);
    srv.wait_detail(&m[0], |d| d["degraded"] == false && d["state"] == "clean");
    let ev3 = events(&m[0]);
    assert!(ev3 > ev2, "events did not advance");
    let t = check(
        &md,
        &m,
        &Want {
            active: 4,
            working: 4,
            failed: 0,
            spare: 0,
            total: 4,
            faulty: 0,
            events: ev3,
        },
        "add m1 rebuilt",
    );
    for i in 0..4 {
        let r = row(&t, i);
        assert_eq!(
            r[1..5],
            [i.to_string(), "0".into(), "0".into(), i.to_string()],
            "{t:#?}"
        );
        assert_eq!(&r[5..], ["active", "sync"], "{t:#?}");
    }

    // replace m2 with a new device: the new one takes role 2, m2 is out (faulty).
    ok(srv
        .cmd()
        .args(["replace", "--member"])
        .arg(&m[2])
        .arg("--with")
        .arg(&new));
    let new_name = new.display().to_string();
    srv.wait_detail(&m[0], |d| {
        d["members"][2]["device"].as_str() == Some(new_name.as_str())
            && d["degraded"] == false
            && d["state"] == "clean"
    });
    let now = [m[0].clone(), m[1].clone(), new.clone(), m[3].clone()];
    let ev4 = events(&m[0]);
    let t = check(
        &md,
        &now,
        &Want {
            active: 4,
            working: 4,
            failed: 0,
            spare: 0,
            total: 5,
            faulty: 1,
            events: ev4,
        },
        "replace m2",
    );
    for i in 0..4 {
        let r = row(&t, i);
        assert_eq!(
            r[1..5],
            [i.to_string(), "0".into(), "0".into(), i.to_string()],
            "{t:#?}"
        );
        assert_eq!(&r[5..], ["active", "sync"], "{t:#?}");
    }

    // remove the replaced m2 (faulty, no role): its entry and its count go.
    ok(srv.cmd().arg("remove").arg(&m[2]));
    let ev5 = events(&m[0]);
    assert!(ev5 > ev4, "md writes the superblocks at a remove");
    check(
        &md,
        &now,
        &Want {
            active: 4,
            working: 4,
            failed: 0,
            spare: 0,
            total: 4,
            faulty: 0,
            events: ev5,
        },
        "remove replaced m2",
    );
    drop(srv);
}

#[test]
fn mdadm_examines_a_090_raid1_spare_taking_over() {
    const TEST: &str = "mdadm_examines_a_090_raid1_spare_taking_over";
    let Some(md) = tool_path("mdadm", TEST) else {
        return;
    };
    let dir = TempDir::new("t090r1");
    let m = create090(&dir, "1", 2);
    let spare = dir.image("spare.img", 12);
    let srv = Served::start(&dir, &m, &SYNC);
    ok(srv.cmd().args(["add", "--array"]).arg(&m[0]).arg(&spare));
    let all = [m[0].clone(), m[1].clone(), spare.clone()];
    let ev = events(&m[0]);
    let t = check(
        &md,
        &all,
        &Want {
            active: 2,
            working: 3,
            failed: 0,
            spare: 1,
            total: 3,
            faulty: 0,
            events: ev,
        },
        "spare added",
    );
    // md numbers a spare from raid_disks on, and (for compatibility) writes that entry's
    // number as its RaidDevice.
    let r = row(&t, 2);
    assert_eq!(r[1..5], ["2", "0", "0", "2"], "{t:#?}");
    assert_eq!(&r[5..], ["spare"], "{t:#?}");

    ok(srv.cmd().arg("fail").arg(&m[0]));
    srv.wait_detail(&m[1], |d| d["degraded"] == false && d["state"] == "clean");
    let live = [m[1].clone(), spare.clone()];
    let ev2 = events(&m[1]);
    let t = check(
        &md,
        &live,
        &Want {
            active: 2,
            working: 2,
            failed: 0,
            spare: 0,
            total: 3,
            faulty: 1,
            events: ev2,
        },
        "spare rebuilt into role 0",
    );
    let r = row(&t, 0);
    assert_eq!(r[4], "0", "{t:#?}");
    assert_eq!(&r[5..], ["active", "sync"], "{t:#?}");

    ok(srv.cmd().arg("remove").arg(&m[0]));
    let ev3 = events(&m[1]);
    assert!(ev3 > ev2, "md writes the superblocks at a remove");
    check(
        &md,
        &live,
        &Want {
            active: 2,
            working: 2,
            failed: 0,
            spare: 0,
            total: 2,
            faulty: 0,
            events: ev3,
        },
        "failed m0 removed",
    );
    drop(srv);
}
