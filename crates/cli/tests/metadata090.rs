//! Metadata 0.90 from the command line: `create -e 0.90` for raid1 and raid5 (one of them
//! degraded), data written and read back, `examine` printing what `mdadm --examine` prints
//! for the same member, `detail` naming the version; and the limits refused by name with
//! nothing written (27 devices, 2 TiB per member); an internal bitmap after the superblock, as mdadm
//! --examine-bitmap reads it.

use serde_json::Value;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use uraid_core::superblock090::{
    sb090_offset_sectors, Disk090, Superblock090, DISK_ACTIVE, DISK_SYNC, SB090_BYTES,
};
use uraid_testkit::prelude::*;

/// `uraid` with the sync IO engine.
fn uraid() -> Command {
    let mut c = uraid_testkit::cli::uraid();
    c.args(SYNC);
    c
}

fn record(img: &Path) -> Superblock090 {
    let f = std::fs::File::open(img).unwrap();
    let at = sb090_offset_sectors(f.metadata().unwrap().len() / 512).unwrap() * 512;
    let mut buf = vec![0u8; SB090_BYTES];
    f.read_exact_at(&mut buf, at).unwrap();
    Superblock090::decode(&buf).unwrap()
}

/// The fields mdadm prints for a 0.90 member, in both outputs.
const FIELDS: [&str; 19] = [
    "Magic",
    "Version",
    "UUID",
    "Creation Time",
    "Raid Level",
    "Used Dev Size",
    "Array Size",
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
    "Chunk Size",
];

/// uraid's examine and mdadm's agree on every field and on the device table.
fn agrees_with_mdadm(md: &Path, img: &Path, ctx: &str) {
    let ours = stdout(&ok(uraid().arg("examine").arg(img)));
    let out = Command::new(md)
        .arg("--examine")
        .arg(img)
        .env("TZ", "UTC")
        .output()
        .unwrap();
    let theirs = text(&out.stdout);
    assert!(out.status.success(), "{ctx}: mdadm --examine failed");
    let ctx = format!("{ctx}\nuraid:\n{ours}\nmdadm:\n{theirs}");
    for k in FIELDS.iter().chain(&["Layout"]) {
        assert_eq!(mdadm_field(&ours, k), mdadm_field(&theirs, k), "{k}: {ctx}");
    }
    assert!(mdadm_field(&ours, "Version").is_some(), "{ctx}");
    // The table: "this" and one row per device, as mdadm prints them (mdadm adds the
    // device's name where it knows one: none for major 0).
    let rows = |t: &str| -> Vec<String> {
        t.lines()
            .skip_while(|l| !l.contains("RaidDevice State"))
            .map(|l| l.trim_end().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    };
    assert_eq!(rows(&ours), rows(&theirs), "{ctx}");
    assert!(rows(&ours).len() > 2, "{ctx}");
}

#[test]
fn create_e_090_arrays_hold_their_data_and_examine_as_mdadm_does() {
    let md = tool_path(
        "mdadm",
        "create_e_090_arrays_hold_their_data_and_examine_as_mdadm_does",
    );
    for (level, missing) in [("1", false), ("5", false), ("5", true)] {
        let ctx = format!("raid{level} missing={missing}");
        let d = TempDir::new(&format!("v090-{level}-{missing}"));
        let imgs = d.images(3, 12, "m");
        let mut devs: Vec<PathBuf> = imgs.clone();
        if missing {
            devs[2] = PathBuf::from("missing");
        }
        ok(uraid()
            .args(["create", "-e", "0.90", "-l", level, "-c", "64K"])
            .args(&devs));
        let present: Vec<PathBuf> = devs.iter().filter(|p| p.exists()).cloned().collect();
        let data = byte_pattern(3 << 20, 9);
        let input = d.0.join("in.bin");
        std::fs::write(&input, &data).unwrap();
        ok(uraid()
            .args(["write", "--offset", "4096", "--input"])
            .arg(&input)
            .args(&present));
        let out = ok(uraid()
            .args(["read", "--offset", "4096", "--length"])
            .arg(data.len().to_string())
            .args(&present));
        assert!(out.stdout == data, "{ctx}: read back differs");
        if !missing {
            let chk = ok(uraid().args(["check", "-q"]).args(&present));
            assert_eq!(stdout(&chk).trim(), "mismatch_cnt: 0", "{ctx}");
        }
        let detail = stdout(&ok(uraid().arg("detail").args(&present)));
        assert_eq!(
            mdadm_field(&detail, "Version").as_deref(),
            Some("0.90"),
            "{ctx}"
        );
        for (i, img) in present.iter().enumerate() {
            let rec = record(img);
            assert!(rec.is_clean(), "{ctx}");
            assert_eq!(rec.this_disk.raid_disk as usize, i, "{ctx}");
            assert_eq!(rec.failed_disks, u32::from(missing), "{ctx}");
            let ex = json_exact(&ok(uraid().args(["examine", "--json"]).arg(img)));
            assert_eq!(ex["version"], "0.90.00", "{ctx}");
            assert_eq!(ex["uuid"], rec.uuid_string(), "{ctx}");
            if level == "1" {
                // Data from sector 0.
                let raw = std::fs::read(img).unwrap();
                assert!(raw[4096..4096 + data.len()] == data[..], "{ctx}");
            }
            if let Some(md) = &md {
                agrees_with_mdadm(md, img, &ctx);
            }
        }
    }
}

/// The region a create would write first (the 0.90 superblock) and the data's start are
/// still zero; reading a 2 TiB sparse file whole is out of the question.
fn untouched(img: &Path) -> bool {
    let f = std::fs::File::open(img).unwrap();
    let len = f.metadata().unwrap().len();
    let at = sb090_offset_sectors(len / 512).unwrap() * 512;
    let mut buf = vec![0u8; 64 << 10];
    [0, at].iter().all(|&off| {
        f.read_exact_at(&mut buf, off).unwrap();
        buf.iter().all(|&b| b == 0)
    })
}

#[test]
fn create_e_090_refuses_its_limits_and_writes_nothing() {
    let d = TempDir::new("v090-limits");
    let wide = d.images(28, 1, "w");
    let err = fails_cleanly(
        uraid()
            .args(["create", "-e", "0.90", "-l", "5", "--run"])
            .args(&wide),
        &wide,
    );
    assert!(err.contains("at most 27 devices"), "{err}");
    // 2 TiB per member: sparse files a little over it.
    let big: Vec<PathBuf> = (0..2).map(|i| d.path(&format!("big{i}.img"))).collect();
    for p in &big {
        std::fs::File::create(p)
            .unwrap()
            .set_len((2 << 40) + (1 << 20))
            .unwrap();
    }
    let out = run(uraid()
        .args(["create", "-e", "0.90", "-l", "1", "--assume-clean"])
        .args(&big)
        .stdin(std::process::Stdio::null()));
    let err = text(&out.stderr);
    assert!(!out.status.success(), "created: {err}");
    assert!(err.contains("at most 2 TiB per member"), "{err}");
    assert!(big.iter().all(|p| untouched(p)), "a member was written");
    // Below the limit with --size it is allowed (mdadm's way out).
    ok(uraid()
        .args([
            "create",
            "-e",
            "0",
            "-l",
            "1",
            "--assume-clean",
            "--size",
            "1G",
        ])
        .args(&big));
    assert_eq!(record(&big[0]).size_kib, 1 << 20);
}

#[test]
fn a_090_member_of_the_other_byte_order_is_examined_but_not_assembled() {
    let d = TempDir::new("v090-be");
    let imgs = d.images(2, 4, "m");
    ok(uraid()
        .args(["create", "-e", "0.90", "-l", "1"])
        .args(&imgs));
    for img in &imgs {
        let mut rec = record(img);
        rec.byte_order = uraid_core::superblock090::ByteOrder::Big;
        let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
        let at = sb090_offset_sectors(f.metadata().unwrap().len() / 512).unwrap() * 512;
        f.write_all_at(&rec.encode(), at).unwrap();
    }
    let ex = json_exact(&ok(uraid().args(["examine", "--json"]).arg(&imgs[0])));
    assert_eq!(ex["byte_order"], "big");
    assert_eq!(ex["uuid"], record(&imgs[0]).uuid_string());
    let err = fails_cleanly(uraid().arg("detail").args(&imgs), &imgs);
    assert!(err.contains("big-endian"), "{err}");
    assert!(err.contains("--update=byteorder"), "{err}");
}

/// `mdadm --examine-bitmap` locates an internal bitmap only on a block device.
fn examine_bitmap(md: &Path, img: &Path, test: &str) -> Option<String> {
    let lo = uraid_testkit::loopdev::Loop::attach_or_skip(img, test)?;
    let out = Command::new(md).arg("-X").arg(&lo.0).output().unwrap();
    let t = text(&out.stdout);
    assert!(
        out.status.success(),
        "mdadm -X {img:?}:\n{t}\n{}",
        text(&out.stderr)
    );
    Some(t)
}

#[test]
fn create_e_090_with_an_internal_bitmap_is_read_by_mdadm() {
    const TEST: &str = "create_e_090_with_an_internal_bitmap_is_read_by_mdadm";
    let d = TempDir::new("v090-bitmap");
    let imgs = d.images(2, 12, "m");
    ok(uraid()
        .args(["create", "-e", "0.90", "-l", "1", "-b", "internal"])
        .args(&imgs));
    let data = byte_pattern(1 << 20, 5);
    let input = d.0.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .args(["write", "--offset", "0", "--input"])
        .arg(&input)
        .args(&imgs));
    let out = ok(uraid()
        .args(["read", "--offset", "0", "--length"])
        .arg(data.len().to_string())
        .args(&imgs));
    assert!(out.stdout == data, "read back differs");
    let Some(md) = tool_path("mdadm", TEST) else {
        return;
    };
    for img in &imgs {
        let rec = record(img);
        agrees_with_mdadm(&md, img, "bitmap");
        let theirs = text(
            &Command::new(&md)
                .arg("--examine")
                .arg(img)
                .output()
                .unwrap()
                .stdout,
        );
        assert_eq!(
            mdadm_field(&theirs, "Internal Bitmap").as_deref(),
            Some("present"),
            "{theirs}"
        );
        let Some(x) = examine_bitmap(&md, img, TEST) else {
            return;
        };
        // mdadm checks the bitmap's magic and version and prints its uuid as it reads it:
        // the array's, only when the words are in the order md copies them.
        assert_eq!(mdadm_field(&x, "Magic").as_deref(), Some("6d746962"), "{x}");
        assert_eq!(mdadm_field(&x, "UUID"), Some(rec.uuid_string()), "{x}");
        assert_eq!(
            mdadm_field(&x, "Events"),
            Some(rec.events.to_string()),
            "{x}"
        );
        assert_eq!(
            mdadm_field(&x, "Chunksize").as_deref(),
            Some("64 MB"),
            "{x}"
        );
        let sync = mdadm_field(&x, "Sync Size").unwrap_or_default();
        assert!(sync.starts_with(&format!("{} ", rec.size_kib)), "{x}");
        let bits = mdadm_field(&x, "Bitmap").unwrap_or_default();
        assert!(bits.starts_with("1 bits (chunks), 0 dirty"), "{x}");
    }
}

fn rewrite(img: &Path, rec: &Superblock090) {
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    let at = sb090_offset_sectors(f.metadata().unwrap().len() / 512).unwrap() * 512;
    f.write_all_at(&rec.encode(), at).unwrap();
}

#[test]
fn a_090_superblock_and_a_12_one_on_one_device_go_by_creation_time() {
    let d = TempDir::new("v090-stale");
    let imgs = d.images(2, 8, "s");
    ok(uraid()
        .args(["create", "-e", "0.90", "-l", "1", "--assume-clean"])
        .args(&imgs));
    // Made a day earlier, as a stale record would be.
    for img in &imgs {
        let mut rec = record(img);
        rec.ctime -= 86_400;
        rewrite(img, &rec);
    }
    ok(uraid()
        .args(["create", "--run", "-e", "1.2", "-l", "1", "-N", "new"])
        .args(["--assume-clean"])
        .args(&imgs));
    let old = record(&imgs[0]);
    let version = |img: &Path| {
        json_exact(&ok(uraid().args(["examine", "--json"]).arg(img)))["version"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The newer 1.2 superblock is taken, as mdadm takes it; the array assembles.
    assert_eq!(version(&imgs[0]), "1.2");
    let detail = stdout(&ok(uraid().arg("detail").args(&imgs)));
    assert_eq!(mdadm_field(&detail, "Version").as_deref(), Some("1.2"));
    let md = tool_path(
        "mdadm",
        "a_090_superblock_and_a_12_one_on_one_device_go_by_creation_time",
    );
    let mdadm_version = |img: &Path| {
        md.as_ref().map(|md| {
            let out = Command::new(md).arg("--examine").arg(img).output().unwrap();
            mdadm_field(&text(&out.stdout), "Version").unwrap_or_default()
        })
    };
    if let Some(v) = mdadm_version(&imgs[0]) {
        assert_eq!(v, "1.2");
    }
    // The 0.90 record made newer than the 1.2 superblock: it is taken.
    let new_ctime = {
        let b = std::fs::read(&imgs[0]).unwrap();
        uraid_core::superblock::Superblock::decode(&b[4096..8192])
            .unwrap()
            .ctime_secs()
    };
    for img in &imgs {
        let mut rec = record(img);
        rec.ctime = new_ctime as u32 + 60;
        rewrite(img, &rec);
    }
    assert_eq!(version(&imgs[0]), "0.90.00");
    if let Some(v) = mdadm_version(&imgs[0]) {
        assert_eq!(v, "0.90.00");
    }
    let detail = stdout(&ok(uraid().arg("detail").args(&imgs)));
    assert_eq!(mdadm_field(&detail, "Version").as_deref(), Some("0.90"));
    // Created in the same second: no telling which is current; refused, naming both.
    for img in &imgs {
        let mut rec = record(img);
        rec.ctime = new_ctime as u32;
        rewrite(img, &rec);
    }
    for cmd in ["examine", "assemble"] {
        let err = fails_cleanly(uraid().arg(cmd).args(&imgs), &imgs);
        for needle in ["0.90", "1.2", "same time", &old.uuid_string()] {
            assert!(err.contains(needle), "{cmd}: {needle}: {err}");
        }
    }
}

/// A 0.91 member (md's record mid-reshape) examines as `mdadm --examine` prints it: the
/// reshape lines ("Reshape pos'n", "Delta Devices", "New Level", "New Layout", "New
/// Chunksize") where mdadm prints them, word for word, and for a shrink the leaving
/// device in the table; `examine --json` lists the same devices (the leaving one too).
#[test]
fn examine_of_a_0_91_member_prints_mdadm_s_reshape_lines() {
    let md = tool_path(
        "mdadm",
        "examine_of_a_0_91_member_prints_mdadm_s_reshape_lines",
    );
    let d = TempDir::new("v091-examine");
    let imgs = d.images(4, 12, "m");
    ok(uraid()
        .args([
            "create",
            "-e",
            "0.90",
            "-l",
            "5",
            "-c",
            "64K",
            "--assume-clean",
        ])
        .args(&imgs));
    // (what, delta_disks, new_level, new_layout, new_chunk bytes, position sectors)
    let cases: [(&str, i32, i32, u32, u32, u64); 3] = [
        ("grow", 1, 5, 2, 65_536, 24_576),
        ("shrink", -1, 5, 2, 65_536, 1_000_000),
        ("restripe", 0, 6, 0, 131_072, 8),
    ];
    let reshape_block = |t: &str| -> Vec<String> {
        t.lines()
            .skip_while(|l| !l.contains("Reshape pos'n"))
            .take_while(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    for (what, delta, new_level, new_layout, new_chunk, position) in cases {
        for img in &imgs {
            let mut rec = record(img);
            rec.minor_version = 91;
            rec.delta_disks = delta;
            rec.new_level = new_level;
            rec.new_layout = new_layout;
            rec.new_chunk = new_chunk;
            rec.reshape_position = position;
            // A shrink from 5 to 4: the fifth device is still in the table, active, until
            // the reshape is done (mdadm lists it after the roles).
            rec.disks[4] = if delta < 0 {
                Disk090 {
                    number: 4,
                    major: 7,
                    minor: 12,
                    raid_disk: 4,
                    state: DISK_ACTIVE | DISK_SYNC,
                }
            } else {
                Disk090::default()
            };
            let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
            let at = sb090_offset_sectors(f.metadata().unwrap().len() / 512).unwrap() * 512;
            f.write_all_at(&rec.encode(), at).unwrap();
        }
        let ours = stdout(&ok(uraid().arg("examine").arg(&imgs[0])));
        let block = reshape_block(&ours);
        assert!(
            block[0].contains(&format!("Reshape pos'n : {}", position / 2)),
            "{what}:\n{ours}"
        );
        assert_eq!(
            mdadm_field(&ours, "Version").as_deref(),
            Some("0.91.00"),
            "{what}"
        );
        let ex = json_exact(&ok(uraid().args(["examine", "--json"]).arg(&imgs[0])));
        assert_eq!(ex["reshape"]["position_sectors"], position, "{what}");
        assert_eq!(ex["reshape"]["delta_disks"], delta, "{what}");
        // The JSON's device table is the text's, row for row: a shrink's leaving device
        // with its state too.
        let rows: Vec<Value> = ours
            .lines()
            .skip_while(|l| !l.contains("RaidDevice State"))
            .skip(1)
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let n = |i: usize| w[i].parse::<u32>().unwrap();
                (w.len() > 5 && w[0] != "this").then(|| {
                    serde_json::json!({
                        "number": n(1),
                        "major": n(2),
                        "minor": n(3),
                        "raid_disk": n(4),
                        "state": w[5..].join(" "),
                    })
                })
            })
            .collect();
        let listed = 4 + delta.min(0).unsigned_abs() as usize;
        assert_eq!(rows.len(), listed, "{what}:\n{ours}");
        assert_eq!(ex["disks"], Value::Array(rows), "{what}:\n{ours}\n{ex:#}");
        if delta < 0 {
            let leaving = &ex["disks"][4];
            assert_eq!(leaving["raid_disk"], 4, "{what}: {ex:#}");
            assert_eq!(leaving["minor"], 12, "{what}: {ex:#}");
            assert_eq!(leaving["state"], "active sync", "{what}: {ex:#}");
        }
        if let Some(md) = &md {
            let out = Command::new(md)
                .arg("--examine")
                .arg(&imgs[0])
                .env("TZ", "UTC")
                .output()
                .unwrap();
            let theirs = text(&out.stdout);
            assert!(out.status.success(), "{what}: mdadm --examine failed");
            assert_eq!(
                block,
                reshape_block(&theirs),
                "{what}\nuraid:\n{ours}\nmdadm:\n{theirs}"
            );
            agrees_with_mdadm(md, &imgs[0], what);
        }
    }
}
