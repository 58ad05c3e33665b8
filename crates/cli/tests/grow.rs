//! `uraid grow` (mdadm --grow): offline on members (raid1 more mirrors with --add, a
//! raid5 -> raid6 takeover with --add, refusals that write nothing) and on a served array
//! through its control socket (grown while served, refusals).

use std::path::PathBuf;
use uraid_testkit::prelude::*;

fn detail(members: &[PathBuf]) -> serde_json::Value {
    json(&ok(uraid().args(["detail", "--json"]).args(members)))
}

/// Write 1 MiB of a pattern at the start of the array; give it back.
fn fill(d: &TempDir, members: &[PathBuf]) -> Vec<u8> {
    let data = byte_pattern(1 << 20, 7);
    let input = d.path("fill.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(members));
    data
}

fn read_back(members: &[PathBuf], len: usize) -> Vec<u8> {
    let out = ok(uraid()
        .args(["read", "--length", &len.to_string()])
        .args(members));
    out.stdout
}

#[test]
fn raid1_grows_to_three_mirrors_with_add_offline() {
    let d = TempDir::new("grow-r1");
    let imgs = d.images(2, 8, "m");
    ok(uraid()
        .args(["create", "-l", "1", "--assume-clean"])
        .args(&imgs));
    let data = fill(&d, &imgs);
    let new = d.image("m2.img", 8);
    let out = ok(uraid()
        .args(["grow", "--raid-devices", "3", "--add"])
        .arg(&new)
        .arg("--")
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(err.contains("raid1 raid-devices 2 -> 3"), "{err}");
    let all = [imgs.clone(), vec![new.clone()]].concat();
    let det = detail(&all);
    assert_eq!(det["raid_disks"], 3);
    assert_eq!(det["degraded"], false, "{det}");
    assert_eq!(det["members"][2]["state"], "active", "{det}");
    assert_eq!(
        read_back(std::slice::from_ref(&new), data.len()),
        data,
        "the new mirror alone"
    );
    // Examine says what mdadm says: 3 raid devices, the new member's role 2.
    let ex = json(&ok(uraid().args(["examine", "--json"]).arg(&new)));
    assert_eq!(ex["raid_disks"], 3, "{ex}");
    assert_eq!(ex["role_number"], 2, "{ex}");
}

#[test]
fn raid5_takes_over_as_raid6_and_recovers_q_offline() {
    let d = TempDir::new("grow-r56");
    let imgs = d.images(3, 8, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "16K", "--assume-clean"])
        .args(&imgs));
    let data = fill(&d, &imgs);
    let q = d.image("q.img", 8);
    let out = ok(uraid()
        .args(["grow", "-l", "6", "-a"])
        .arg(&q)
        .arg("--")
        .args(&imgs));
    assert!(
        text(&out.stderr).contains("left-symmetric-6"),
        "{}",
        text(&out.stderr)
    );
    let all = [imgs.clone(), vec![q.clone()]].concat();
    let det = detail(&all);
    assert_eq!(det["level"], "raid6");
    assert_eq!(det["layout"], "left-symmetric-6");
    assert_eq!(det["raid_disks"], 4);
    assert_eq!(det["degraded"], false, "{det}");
    ok(uraid().arg("check").args(&all));
    // Q holds: two of the old members away, the data still reads.
    assert_eq!(read_back(&[imgs[0].clone(), q], data.len()), data);
}

#[test]
fn refusals_name_the_reason_and_write_nothing() {
    let d = TempDir::new("grow-refuse");
    let imgs = d.images(3, 8, "m");
    ok(uraid()
        .args(["create", "-l", "1", "--assume-clean"])
        .args(&imgs));
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "-n", "2"]).args(&imgs), &imgs);
    assert!(err.contains("3 active members"), "{err}");
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "--level", "5"]).args(&imgs), &imgs);
    assert!(err.contains("only with 2 devices"), "{err}");
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "--size", "lots"]).args(&imgs), &imgs);
    assert!(err.contains("--size \"lots\""), "{err}");
    assert_eq!(err.matches("lots").count(), 1, "said once: {err}");
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "--size", "1G"]).args(&imgs), &imgs);
    assert!(err.contains("beyond the members"), "{err}");
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.arg("grow").args(&imgs), &imgs);
    assert!(err.contains("nothing to change"), "{err}");
}

/// md grows a running array: `mdadm --grow -n 3 --add DEV` on a served raid1 gives the
/// new device the new role and rebuilds it while the array stays served; the served raid5
/// takes a layout restripe and finishes it; a level change that needs a restripe is
/// refused without a device for its new role, before anything is written, and with one
/// runs as md's two steps from one command (takeover, rebuild, restripe).
#[test]
fn a_served_array_grows_while_served() {
    let d = TempDir::new("grow-served");
    let imgs = d.images(2, 8, "m");
    ok(uraid()
        .args(["create", "-l", "1", "--assume-clean"])
        .args(&imgs));
    let data = fill(&d, &imgs);
    let new = d.image("m2.img", 8);
    let srv = Served::start(&d, &imgs, &[]);
    let out = ok(srv
        .cmd()
        .args(["grow", "--raid-devices", "3", "--add"])
        .arg(&new)
        .arg("--array")
        .arg(&imgs[0]));
    let err = text(&out.stderr);
    assert!(err.contains("raid1 raid-devices 2 -> 3"), "{err}");
    srv.wait_detail(&imgs[0], |d| {
        d["raid_disks"] == 3 && d["degraded"] == false && d["sync"].is_null()
    });
    ok(srv.cmd().arg("stop").arg(&imgs[0]));
    drop(srv);
    assert_eq!(
        read_back(std::slice::from_ref(&new), data.len()),
        data,
        "the new mirror alone, rebuilt while served"
    );

    let imgs = create_array(&d, "5", 3, 16, &[]);
    let data5 = fill(&d, &imgs);
    let mut srv = Served::start(&d, &imgs, &[]);
    // A takeover with a restripe needs a device for the role the takeover makes: without
    // a spare it is refused before the takeover is written.
    let before = uraid_testkit::data::snapshot(&imgs);
    let out = run(srv
        .cmd()
        .args(["grow", "-l", "6", "--layout", "left-symmetric", "--array"])
        .arg(&imgs[0]));
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("needs 1 device"), "{err}");
    let det = srv.detail(&imgs[0]);
    assert_eq!(det["level"], "raid5");
    assert!(
        before == uraid_testkit::data::snapshot(&imgs),
        "the refused grow wrote to a member"
    );
    // A layout restripe runs while served and ends in the new layout.
    let out = ok(srv
        .cmd()
        .args(["grow", "--layout", "right-asymmetric", "--control"])
        .arg(&srv.control));
    assert!(
        text(&out.stderr).contains("reshape started"),
        "{}",
        text(&out.stderr)
    );
    srv.wait_detail(&imgs[0], |d| {
        d["sync"].is_null() && d["layout"] == "right-asymmetric"
    });
    ok(srv.cmd().arg("stop").arg(&imgs[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    let det = detail(&imgs);
    assert_eq!(det["layout"], "right-asymmetric", "{det}");
    assert_eq!(
        read_back(&imgs, data5.len()),
        data5,
        "the bytes after the restripe"
    );

    // With a device, md's two steps as one command: the takeover to raid6 (its Q role
    // rebuilt onto the new device while served), then the restripe to the rotating layout.
    // A fresh array: the restripe above took the room before its data.
    let d = TempDir::new("grow-served-6");
    let imgs = create_array(&d, "5", 3, 16, &[]);
    let data5 = fill(&d, &imgs);
    let mut srv = Served::start(&d, &imgs, &[]);
    let spare = d.image("q.img", 16);
    let out = ok(srv
        .cmd()
        .args(["grow", "-l", "6", "--layout", "left-symmetric", "--add"])
        .arg(&spare)
        .arg("--control")
        .arg(&srv.control));
    let err = text(&out.stderr);
    assert!(err.contains("the restripe starts once"), "{err}");
    srv.wait_detail(&imgs[0], |d| {
        d["level"] == "raid6"
            && d["layout"] == "left-symmetric"
            && d["sync"].is_null()
            && d["degraded"] == false
    });
    ok(srv.cmd().arg("stop").arg(&imgs[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    let mut all = imgs.clone();
    all.push(spare);
    let det = detail(&all);
    assert_eq!(det["level"], "raid6", "{det}");
    assert_eq!(det["layout"], "left-symmetric", "{det}");
    assert_eq!(det["raid_disks"], 4, "{det}");
    let out = ok(uraid().args(["check", "-q"]).args(&all));
    assert!(
        text(&out.stdout).contains("mismatch_cnt: 0"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        read_back(&all, data5.len()),
        data5,
        "the bytes after both steps"
    );
}

/// `grow --size max` on a served raid5 with an internal bitmap: the bitmap is resized
/// with it (md's bitmap resize), the grown region resynced while served, and after the
/// stop the array is larger, its data whole and its parity right; mdadm reads the bitmap.
#[test]
fn a_served_array_with_a_bitmap_grows_its_size() {
    let d = TempDir::new("grow-size-bitmap");
    let imgs = d.images(3, 24, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-n", "3", "--bitmap", "internal"])
        .args([
            "--bitmap-chunk",
            "1M",
            "--size",
            "8M",
            "--assume-clean",
            "--run",
        ])
        .args(&imgs));
    let data = fill(&d, &imgs);
    let before = detail(&imgs)["array_bytes"].as_u64().unwrap();
    let mut srv = Served::start(&d, &imgs, &[]);
    let out = ok(srv
        .cmd()
        .args(["grow", "--size", "max", "--array"])
        .arg(&imgs[0]));
    assert!(
        text(&out.stderr).contains("component size"),
        "{}",
        text(&out.stderr)
    );
    srv.wait_detail(&imgs[0], |d| {
        d["array_bytes"].as_u64().unwrap_or(0) > before && d["sync"].is_null()
    });
    ok(srv.cmd().arg("stop").arg(&imgs[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    assert_eq!(read_back(&imgs, data.len()), data);
    let out = ok(uraid().args(["check", "-q"]).args(&imgs));
    assert!(
        text(&out.stdout).contains("mismatch_cnt: 0"),
        "{}",
        text(&out.stdout)
    );
    let test = "a_served_array_with_a_bitmap_grows_its_size";
    if let Some(md) = tool_path("mdadm", test) {
        // mdadm finds an internal bitmap only on a block device.
        if let Some(l) = Loop::attach_or_skip(&imgs[0], test) {
            let out = stdout(&ok(std::process::Command::new(&md)
                .arg("--examine-bitmap")
                .arg(&l.0)));
            let sync = mdadm_field(&out, "Sync Size").unwrap_or_default();
            let used = detail(&imgs)["used_dev_sectors"].as_u64().unwrap() / 2;
            assert!(sync.starts_with(&used.to_string()), "{out}");
        }
    }
}

/// mdadm's `--grow --array-size` on a served raid5, then `--raid-devices` fewer: the size
/// set is what the array is exported at (detail, and nbdinfo on a new connection) while
/// the members keep their superblocks; the shrink takes it as its confirmation; `max`
/// exports all of the smaller array again. Offline, `--array-size` alone is refused.
#[test]
fn a_served_raid5_is_sized_with_array_size_then_shrunk() {
    let test = "a_served_raid5_is_sized_with_array_size_then_shrunk";
    let d = TempDir::new("grow-array-size");
    let imgs = d.images(4, 24, "m");
    ok(uraid()
        .args([
            "create",
            "-l",
            "5",
            "-n",
            "4",
            "--size",
            "8M",
            "--assume-clean",
            "--run",
        ])
        .args(&imgs));
    let data = fill(&d, &imgs);
    let err = fails_cleanly(
        uraid().args(["grow", "--array-size", "8M"]).args(&imgs),
        &imgs,
    );
    assert!(
        err.contains("not served") && err.contains("--control"),
        "{err}"
    );
    let mut srv = Served::start(&d, &imgs, &[]);
    let out = ok(srv
        .cmd()
        .args(["grow", "--array-size", "16M", "--array"])
        .arg(&imgs[0]));
    assert!(
        text(&out.stderr).contains("array size 16384K"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(srv.detail(&imgs[0])["array_bytes"].as_u64(), Some(16 << 20));
    if tool_path("nbdinfo", test).is_some() {
        let out = ok(std::process::Command::new("nbdinfo")
            .arg("--size")
            .arg(srv.uri()));
        assert_eq!(text(&out.stdout).trim(), (16u64 << 20).to_string());
    }
    ok(srv
        .cmd()
        .args(["grow", "--raid-devices", "3", "--array"])
        .arg(&imgs[0]));
    srv.wait_detail(&imgs[0], |d| {
        d["raid_disks"].as_u64() == Some(3) && d["sync"].is_null()
    });
    assert_eq!(srv.detail(&imgs[0])["array_bytes"].as_u64(), Some(16 << 20));
    ok(srv
        .cmd()
        .args(["grow", "--array-size", "max", "--array"])
        .arg(&imgs[0]));
    let full = srv.detail(&imgs[0])["array_bytes"].as_u64().unwrap();
    assert!(full >= 16 << 20, "{full}");
    ok(srv.cmd().arg("stop").arg(&imgs[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    // The bytes written at the start (below the kept size) came through the shrink.
    assert_eq!(read_back(&imgs, data.len()), data);
    let out = ok(uraid().args(["check", "-q"]).args(&imgs));
    assert!(
        text(&out.stdout).contains("mismatch_cnt: 0"),
        "{}",
        text(&out.stdout)
    );
}

/// `uraid grow --raid-devices 3 --add DEV` on a served raid0 of 2: mdadm's raid0 growth
/// (through a raid4 whose parity the new device first rebuilds, the restripe, the takeover
/// back) from one command while served; without the device it is refused and nothing
/// changes. The end is a raid0 of 3 at its new size holding the old bytes, which mdadm
/// reads as a raid0 of 3.
#[test]
fn a_served_raid0_grows_by_a_device() {
    let d = TempDir::new("grow-served-0");
    let imgs = create_array(&d, "0", 2, 16, &[]);
    let size_before = detail(&imgs)["array_bytes"].as_u64().unwrap();
    let data = fill(&d, &imgs);
    let mut srv = Served::start(&d, &imgs, &[]);
    let out = run(srv
        .cmd()
        .args(["grow", "--raid-devices", "3", "--control"])
        .arg(&srv.control));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("needs 1 new device") && err.contains("nothing was written"),
        "{err}"
    );
    let new = d.image("m2.img", 16);
    let out = ok(srv
        .cmd()
        .args(["grow", "--raid-devices", "3", "--add"])
        .arg(&new)
        .arg("--control")
        .arg(&srv.control));
    let err = text(&out.stderr);
    assert!(err.contains("takeover back to raid0"), "{err}");
    srv.wait_detail(&imgs[0], |d| d["level"] == "raid0" && d["raid_disks"] == 3);
    ok(srv.cmd().arg("stop").arg(&imgs[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    let all = [imgs.clone(), vec![new]].concat();
    let det = detail(&all);
    assert_eq!(det["level"], "raid0", "{det}");
    assert_eq!(det["raid_disks"], 3, "{det}");
    assert!(
        det["array_bytes"].as_u64().unwrap() >= size_before / 2 * 3,
        "{det}"
    );
    assert_eq!(
        read_back(&all, data.len()),
        data,
        "the bytes after the grow"
    );
    if let Some(md) = tool_path("mdadm", "a_served_raid0_grows_by_a_device") {
        for m in &all {
            examine_says(&md, m, &[("Raid Level", "raid0"), ("Raid Devices", "3")]);
        }
    }
}
