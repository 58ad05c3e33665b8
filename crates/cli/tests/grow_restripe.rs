//! `uraid grow` restriping a raid5 offline (md's reshape with the data offset moving):
//! 3 -> 4 devices with --add, and a chunk change stopped mid-way (`--stop-at`), examined by
//! mdadm as a reshape in progress, then finished with `uraid grow --continue`. The bytes
//! read back, the grown part reads zeros, and md's check finds no mismatch.

use std::path::PathBuf;
use uraid_testkit::prelude::*;

fn fill(d: &TempDir, members: &[PathBuf], len: usize) -> Vec<u8> {
    let data = byte_pattern(len, 11);
    let input = d.path("fill.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(members));
    data
}

fn read_all(members: &[PathBuf]) -> Vec<u8> {
    ok(uraid().arg("read").args(members)).stdout
}

fn check_clean(members: &[PathBuf]) {
    let out = ok(uraid().args(["check", "-q"]).args(members));
    assert!(
        text(&out.stdout).contains("mismatch_cnt: 0"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn raid5_grows_from_three_to_four_devices_offline() {
    let d = TempDir::new("rs-grow");
    let imgs = d.images(3, 12, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "64K", "--assume-clean"])
        .args(&imgs));
    let size_before = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)))["array_bytes"]
        .as_u64()
        .unwrap();
    let data = fill(&d, &imgs, size_before as usize);
    let new = d.image("m3.img", 12);
    let out = ok(uraid()
        .args(["grow", "-q", "--raid-devices", "4", "--add"])
        .arg(&new)
        .arg("--")
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(
        err.contains("3 -> 4 devices") && err.contains("finished"),
        "{err}"
    );
    let all = [imgs.clone(), vec![new.clone()]].concat();
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&all)));
    assert_eq!(det["raid_disks"], 4, "{det}");
    assert_eq!(det["degraded"], false, "{det}");
    let size_after = det["array_bytes"].as_u64().unwrap();
    assert_eq!(size_after, size_before / 2 * 3, "{det}");
    let got = read_all(&all);
    assert_eq!(got.len() as u64, size_after);
    assert!(got[..data.len()] == data[..], "the old bytes moved");
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "the grown part reads zeros"
    );
    check_clean(&all);
}

#[test]
fn a_chunk_change_stopped_mid_way_is_a_reshape_mdadm_sees_and_continues() {
    let d = TempDir::new("rs-chunk");
    let imgs = d.images(4, 12, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "64K", "--assume-clean"])
        .args(&imgs));
    let data = fill(&d, &imgs, 16 << 20);
    let out = ok(uraid()
        .args(["grow", "-q", "--chunk", "32K", "--stop-at", "8192"])
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(err.contains("stopped at array sector"), "{err}");
    assert!(err.contains("grow --continue"), "{err}");
    // mdadm reads it as md's own reshape in progress.
    if let Some(md) = tool_path(
        "mdadm",
        "a_chunk_change_stopped_mid_way_is_a_reshape_mdadm_sees_and_continues",
    ) {
        let ex = examine(&md, &imgs[0]);
        let pos = mdadm_field(&ex, "Reshape pos'n").unwrap_or_else(|| panic!("{ex}"));
        // mdadm prints the position in KiB.
        let kib: u64 = pos.split_whitespace().next().unwrap().parse().unwrap();
        assert!(kib * 2 >= 8192, "{ex}");
        assert_eq!(
            mdadm_field(&ex, "New Chunksize").as_deref(),
            Some("32K"),
            "{ex}"
        );
        assert!(ex.contains("New Offset"), "{ex}");
    }
    // Mid-way, the same bytes; a write lands, and the reshape carries it along.
    let mid = read_all(&imgs);
    assert!(mid[..data.len()] == data[..]);
    let input = d.path("x.bin");
    std::fs::write(&input, [1u8; 4096]).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(&imgs));
    let mut data = data;
    data[..4096].fill(1);
    let out = ok(uraid().args(["grow", "-q", "--continue"]).args(&imgs));
    assert!(
        text(&out.stderr).contains("finished"),
        "{}",
        text(&out.stderr)
    );
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)));
    assert_eq!(det["chunk_bytes"], 32 * 1024, "{det}");
    assert!(read_all(&imgs)[..data.len()] == data[..]);
    check_clean(&imgs);
    if let Some(md) = tool_path(
        "mdadm",
        "a_chunk_change_stopped_mid_way_is_a_reshape_mdadm_sees_and_continues",
    ) {
        let ex = examine(&md, &imgs[0]);
        assert!(mdadm_field(&ex, "Reshape pos'n").is_none(), "{ex}");
        assert_eq!(
            mdadm_field(&ex, "Chunk Size").as_deref(),
            Some("32K"),
            "{ex}"
        );
    }
}

#[test]
fn continue_on_an_array_not_mid_reshape_says_so() {
    let d = TempDir::new("rs-none");
    let imgs = d.images(3, 8, "m");
    ok(uraid()
        .args(["create", "-l", "5", "--assume-clean"])
        .args(&imgs));
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "--continue"]).args(&imgs), &imgs);
    assert!(err.contains("not in the middle of a reshape"), "{err}");
}

/// mdadm's raid0 grow (`mdadm --grow /dev/md0 -n 3 --add DEV`): through a raid4 whose
/// parity role is missing, restriped, and back to raid0. The bytes read back; mdadm reads
/// the members as a raid0 of 3 whose size is md's raid0 arithmetic: 3 members of their
/// data size in whole chunks.
#[test]
fn raid0_grows_from_two_to_three_devices_through_raid4() {
    let d = TempDir::new("rs-grow0");
    let imgs = d.images(2, 12, "m");
    ok(uraid().args(["create", "-l", "0", "-c", "64K"]).args(&imgs));
    let size_before = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)))["array_bytes"]
        .as_u64()
        .unwrap();
    let data = fill(&d, &imgs, size_before as usize);
    let new = d.image("m2.img", 12);
    // Without the new device: mdadm's refusal, nothing changed.
    let out = run(uraid()
        .args(["grow", "-q", "--raid-devices", "3"])
        .args(&imgs));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("to create working array"),
        "{}",
        text(&out.stderr)
    );
    let out = ok(uraid()
        .args(["grow", "-q", "--raid-devices", "3", "--add"])
        .arg(&new)
        .arg("--")
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(
        err.contains("raid0 -> raid4") && err.contains("-> raid0"),
        "{err}"
    );
    let all = [imgs.clone(), vec![new.clone()]].concat();
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&all)));
    assert_eq!(det["level"], "raid0", "{det}");
    assert_eq!(det["raid_disks"], 3, "{det}");
    let size_after = det["array_bytes"].as_u64().unwrap();
    assert!(size_after >= size_before / 2 * 3, "{det}");
    let got = read_all(&all);
    assert_eq!(got.len() as u64, size_after);
    assert!(got[..data.len()] == data[..], "the old bytes moved");
    if let Some(md) = tool_path(
        "mdadm",
        "raid0_grows_from_two_to_three_devices_through_raid4",
    ) {
        let mut sizes = Vec::new();
        for m in &all {
            let ex = examine_says(&md, m, &[("Raid Level", "raid0"), ("Raid Devices", "3")]);
            assert!(mdadm_field(&ex, "Reshape pos'n").is_none(), "{ex}");
            let avail = mdadm_field(&ex, "Avail Dev Size").unwrap_or_else(|| panic!("{ex}"));
            let sectors: u64 = avail.split_whitespace().next().unwrap().parse().unwrap();
            sizes.push(sectors);
        }
        // md's raid0: every member's data in whole chunks (one zone when they are alike).
        let chunk = 128;
        let zone: u64 = sizes.iter().map(|s| s / chunk * chunk).sum();
        assert_eq!(zone * 512, size_after, "members {sizes:?}");
    }
}

/// A degraded raid5 grows as md grows one: with no device for the new role, mdadm's
/// refusal; with one, the reshape reads the missing member's blocks from parity, the new
/// device takes the new role and the missing role stays missing; a device added after
/// recovers it, and md's check finds no mismatch.
#[test]
fn a_degraded_raid5_grows_and_its_missing_role_recovers_after() {
    let d = TempDir::new("rs-grow-deg");
    let imgs = d.images(3, 12, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "64K", "--assume-clean"])
        .args(&imgs));
    let size = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)))["array_bytes"]
        .as_u64()
        .unwrap();
    let data = fill(&d, &imgs, size as usize);
    // Member 1 left out: the array runs degraded.
    let left = vec![imgs[0].clone(), imgs[2].clone()];
    let out = run(uraid()
        .args(["grow", "-q", "--raid-devices", "4"])
        .args(&left));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("Need 1 spare to avoid degraded array"),
        "{err}"
    );
    assert!(err.contains("--force"), "{err}");
    let new = d.image("m3.img", 12);
    let out = ok(uraid()
        .args(["grow", "-q", "--raid-devices", "4", "--add"])
        .arg(&new)
        .arg("--")
        .args(&left));
    assert!(
        text(&out.stderr).contains("finished"),
        "{}",
        text(&out.stderr)
    );
    let now = [left.clone(), vec![new.clone()]].concat();
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&now)));
    assert_eq!(det["raid_disks"], 4, "{det}");
    assert_eq!(det["degraded"], true, "{det}");
    assert!(
        read_all(&now)[..data.len()] == data[..],
        "degraded, reshaped"
    );
    let fresh = d.image("m4.img", 12);
    ok(uraid()
        .args(["grow", "-q", "--raid-devices", "4", "--add"])
        .arg(&fresh)
        .arg("--")
        .args(&now));
    let all = [now.clone(), vec![fresh.clone()]].concat();
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&all)));
    assert_eq!(det["degraded"], false, "{det}");
    assert!(read_all(&all)[..data.len()] == data[..], "recovered");
    check_clean(&all);
}

/// mdadm's shrink, `--array-size` with `--raid-devices` fewer: refused without the size,
/// nothing changed; with it, a backwards reshape (the room after the data made by the
/// component size) stopped mid-way that mdadm --examine reads as md's own ("Delta
/// Devices : -1", a reshape position, a new offset), then continued: 3 devices and a
/// spare, the kept bytes, no mismatch.
#[test]
fn raid5_shrinks_from_four_to_three_devices_after_array_size() {
    let d = TempDir::new("rs-shrink");
    let imgs = d.images(4, 12, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "64K", "--assume-clean"])
        .args(&imgs));
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)));
    let size_before = det["array_bytes"].as_u64().unwrap();
    let data = fill(&d, &imgs, size_before as usize);
    let out = run(uraid().args(["grow", "-q", "-n", "3"]).args(&imgs));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--array-size") && err.contains("nothing was written"),
        "{err}"
    );
    // The most 3 devices hold, less 1 MiB: room after the data for the offset to move.
    let keep_k = size_before / 3 * 2 / 1024 - 1024;
    let out = ok(uraid()
        .args(["grow", "-q", "-n", "3", "--array-size"])
        .arg(format!("{keep_k}K"))
        .args(["--stop-at", "8192"])
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(err.contains("4 -> 3 devices"), "{err}");
    if let Some(md) = tool_path(
        "mdadm",
        "raid5_shrinks_from_four_to_three_devices_after_array_size",
    ) {
        let ex = examine_says(&md, &imgs[0], &[("Raid Devices", "3")]);
        assert!(mdadm_field(&ex, "Reshape pos'n").is_some(), "{ex}");
        assert!(
            mdadm_field(&ex, "Delta Devices").is_some_and(|v| v.starts_with("-1")),
            "{ex}"
        );
        assert!(mdadm_field(&ex, "New Offset").is_some(), "{ex}");
    }
    let keep = (keep_k * 1024) as usize;
    assert!(read_all(&imgs)[..keep] == data[..keep], "mid-way");
    ok(uraid().args(["grow", "-q", "--continue"]).args(&imgs));
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)));
    assert_eq!(det["raid_disks"], 3, "{det}");
    assert_eq!(det["degraded"], false, "{det}");
    let got = read_all(&imgs);
    assert!(
        got.len() >= keep && (got.len() as u64) < size_before,
        "{}",
        got.len()
    );
    assert!(got[..keep] == data[..keep], "the kept bytes");
    check_clean(&imgs);
    if let Some(md) = tool_path(
        "mdadm",
        "raid5_shrinks_from_four_to_three_devices_after_array_size",
    ) {
        let spares = imgs
            .iter()
            .filter(|m| {
                mdadm_field(
                    &examine_says(&md, m, &[("Raid Devices", "3")]),
                    "Device Role",
                )
                .is_some_and(|r| r.contains("spare"))
            })
            .count();
        assert_eq!(spares, 1);
    }
}

/// mdadm's raid0 chunk change, through a raid4 with its parity role missing: a raid0 of
/// the same members with the new chunk (mdadm --examine agrees), every byte.
#[test]
fn raid0_changes_its_chunk_through_raid4() {
    let d = TempDir::new("rs-chunk0");
    let imgs = d.images(3, 12, "m");
    ok(uraid().args(["create", "-l", "0", "-c", "64K"]).args(&imgs));
    let size_before = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)))["array_bytes"]
        .as_u64()
        .unwrap();
    let data = fill(&d, &imgs, size_before as usize);
    let out = ok(uraid().args(["grow", "-q", "--chunk", "128K"]).args(&imgs));
    let err = text(&out.stderr);
    assert!(
        err.contains("raid0 -> raid4") && err.contains("-> raid0"),
        "{err}"
    );
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)));
    assert_eq!(det["level"], "raid0", "{det}");
    assert_eq!(det["raid_disks"], 3, "{det}");
    let got = read_all(&imgs);
    let n = got.len().min(data.len());
    assert!(got[..n] == data[..n], "the bytes after the chunk change");
    if let Some(md) = tool_path("mdadm", "raid0_changes_its_chunk_through_raid4") {
        for m in &imgs {
            let ex = examine_says(&md, m, &[("Raid Level", "raid0"), ("Chunk Size", "128K")]);
            assert!(mdadm_field(&ex, "Reshape pos'n").is_none(), "{ex}");
        }
    }
}

/// mdadm's raid0 shrink (`--raid-devices 2 --array-size`), through a raid4: refused without
/// the size; stopped mid-way it is a raid4 of 4 -> 3 mid-reshape (mdadm --examine says
/// so), which `uraid grow --continue` finishes and `--level 0` takes to a raid0 of 2 (the
/// parity member leaves): mdadm --examine says raid0 with 2 devices on the kept members and
/// still raid4 on the one that left, and the kept bytes read back.
#[test]
fn raid0_shrinks_from_three_to_two_devices_through_raid4() {
    let d = TempDir::new("rs-shrink0");
    let imgs = d.images(3, 12, "m");
    ok(uraid().args(["create", "-l", "0", "-c", "64K"]).args(&imgs));
    let size_before = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)))["array_bytes"]
        .as_u64()
        .unwrap();
    let data = fill(&d, &imgs, size_before as usize);
    let out = run(uraid().args(["grow", "-q", "-n", "2"]).args(&imgs));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--array-size") && err.contains("nothing was written"),
        "{err}"
    );
    // What 2 members hold, less 1 MiB (room after the data), in whole 64K chunks.
    let keep_k = (size_before / 3 * 2 / 1024 - 1024) / 64 * 64;
    let out = ok(uraid()
        .args(["grow", "-q", "-n", "2", "--array-size"])
        .arg(format!("{keep_k}K"))
        .args(["--stop-at", "8192"])
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(
        err.contains("raid0 -> raid4") && err.contains("--continue"),
        "{err}"
    );
    let md = tool_path(
        "mdadm",
        "raid0_shrinks_from_three_to_two_devices_through_raid4",
    );
    if let Some(md) = &md {
        let ex = examine_says(
            md,
            &imgs[0],
            &[("Raid Level", "raid4"), ("Raid Devices", "3")],
        );
        assert!(mdadm_field(&ex, "Reshape pos'n").is_some(), "{ex}");
    }
    let keep = (keep_k * 1024) as usize;
    assert!(read_all(&imgs)[..keep] == data[..keep], "mid-way");
    ok(uraid().args(["grow", "-q", "--continue"]).args(&imgs));
    check_clean(&imgs);
    let out = ok(uraid().args(["grow", "-q", "-l", "0"]).args(&imgs));
    assert!(
        text(&out.stderr).contains("leaves the array"),
        "{}",
        text(&out.stderr)
    );
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)));
    assert_eq!(det["level"], "raid0", "{det}");
    assert_eq!(det["raid_disks"], 2, "{det}");
    let got = read_all(&imgs);
    assert!(
        got.len() >= keep && got.len() < size_before as usize,
        "{}",
        got.len()
    );
    assert!(got[..keep] == data[..keep], "the kept bytes");
    if let Some(md) = &md {
        for m in &imgs[..2] {
            let ex = examine_says(md, m, &[("Raid Level", "raid0"), ("Raid Devices", "2")]);
            assert!(mdadm_field(&ex, "Reshape pos'n").is_none(), "{ex}");
        }
        examine_says(
            md,
            &imgs[2],
            &[("Raid Level", "raid4"), ("Raid Devices", "3")],
        );
    }
}
