//! An array stopped mid-reshape (raid5 growing from 3 to 4 disks with a chunk change, its
//! data area moving down, as mdadm leaves it): `examine` and `detail` show mdadm's reshape
//! lines; a write lands (in the geometry that holds its sectors) and leaves the reshape
//! where it was; served, the reshape goes on to its end.

use std::path::{Path, PathBuf};
use std::process::Command;
use uraid_core::superblock::{
    MetadataVersion, Superblock, FEATURE_NEW_OFFSET, FEATURE_RESHAPE_ACTIVE,
};
use uraid_testkit::prelude::*;

fn uraid() -> Command {
    let mut c = uraid_testkit::cli::uraid();
    c.args(SYNC);
    c
}

fn sb_at(path: &Path) -> Superblock {
    let bytes = std::fs::read(path).unwrap();
    let at = MetadataVersion::V1_2
        .super_offset_sectors(bytes.len() as u64 / 512)
        .unwrap() as usize
        * 512;
    Superblock::decode(&bytes[at..at + 4096]).unwrap()
}

fn put_sb(path: &Path, sb: &Superblock) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&sb.encode(), sb.super_offset * 512).unwrap();
}

fn stdout(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find(|l| l.trim_start().starts_with(&format!("{key} : ")))
        .map(|l| l.split_once(" : ").unwrap().1.to_string())
}

/// A 4-member raid5 rewritten as md leaves one stopped growing from 3 to 4 disks with
/// its chunk going from 16K to 32K at 10 new stripes; (members, position, data_offset).
fn mid_reshape(d: &TempDir) -> (Vec<PathBuf>, u64, u64) {
    let imgs: Vec<PathBuf> = d.images(4, 8, "g");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "16K", "-N", "grow"])
        .args(&imgs));
    // 3 -> 4 disks, chunk 16K -> 32K, at 10 new stripes of 3 x 32K.
    let position = 64 * 3 * 10;
    let mut data_offset = 0;
    for img in &imgs {
        let mut sb = sb_at(img);
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
        sb.reshape_position = position;
        sb.delta_disks = 1;
        sb.new_level = sb.level;
        sb.new_layout = sb.layout;
        sb.new_chunk = 64;
        sb.new_offset = -(sb.data_offset as i32 / 2);
        data_offset = sb.data_offset;
        put_sb(img, &sb);
    }
    (imgs, position, data_offset)
}

#[test]
fn examine_and_detail_show_a_reshape_as_mdadm_and_writes_are_refused_once() {
    let d = TempDir::new("reshape-report");
    let (imgs, position, data_offset) = mid_reshape(&d);
    let ex = stdout(uraid().arg("examine").arg(&imgs[0]));
    assert_eq!(field(&ex, "Reshape pos'n").as_deref(), Some("960"), "{ex}");
    assert_eq!(
        field(&ex, "Delta Devices").as_deref(),
        Some("1 (3->4)"),
        "{ex}"
    );
    assert_eq!(field(&ex, "New Chunksize").as_deref(), Some("32K"), "{ex}");
    assert_eq!(
        field(&ex, "New Offset"),
        Some(format!("{} sectors", data_offset - data_offset / 2)),
        "{ex}"
    );
    // Unchanged level and layout: mdadm prints no line for them.
    assert_eq!(field(&ex, "New Level"), None, "{ex}");
    assert_eq!(field(&ex, "New Layout"), None, "{ex}");
    // mdadm reads the same reshape from these bytes and prints the same lines.
    if let Some(mdadm) = tool_path("mdadm", "reshape_report: mdadm comparison") {
        let md = stdout(Command::new(mdadm).arg("--examine").arg(&imgs[0]));
        assert!(field(&md, "Reshape pos'n").is_some(), "mdadm:\n{md}");
        for key in [
            "Reshape pos'n",
            "Delta Devices",
            "New Chunksize",
            "New Offset",
            "New Level",
            "New Layout",
            "Data Offset",
        ] {
            assert_eq!(
                field(&ex, key),
                field(&md, key),
                "{key}:\n{ex}\nmdadm:\n{md}"
            );
        }
    }

    let det = stdout(uraid().arg("detail").args(&imgs));
    let size = sb_at(&imgs[0]).size / 64 * 64 * 3;
    assert_eq!(
        field(&det, "Reshape Status"),
        Some(format!("{}% complete", position * 100 / size)),
        "{det}"
    );
    assert_eq!(
        field(&det, "Delta Devices").as_deref(),
        Some("1, (3->4)"),
        "{det}"
    );
    assert_eq!(
        field(&det, "New Chunksize").as_deref(),
        Some("32K"),
        "{det}"
    );

    // Writes below and above the position land; the reshape stays where it was.
    let input = d.0.join("w.bin");
    std::fs::write(&input, vec![7u8; 4096]).unwrap();
    let above = (position + 64) * 512;
    for at in [0, above] {
        ok(uraid()
            .args(["write", "--offset", &at.to_string(), "--input"])
            .arg(&input)
            .args(&imgs));
    }
    let all = ok(uraid().arg("read").args(&imgs)).stdout;
    for at in [0, above as usize] {
        assert!(
            all[at..at + 4096].iter().all(|&b| b == 7),
            "the write at {at}"
        );
    }
    assert_eq!(sb_at(&imgs[0]).reshape_position, position);
}

/// `uraid serve` of an array mid-reshape goes on with the reshape to its end (as md does
/// when it starts such an array): it says so, and the array is then in its new shape with
/// md's check clean.
#[test]
fn serve_goes_on_with_a_reshape_to_its_end() {
    let d = TempDir::new("reshape-serve");
    let (imgs, _, _) = mid_reshape(&d);
    let mut s = Served::start(&d, &imgs, &[]);
    s.wait_detail(&imgs[0], |det| det["sync"].is_null());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !s.stderr().contains("reshape finished") {
        assert!(std::time::Instant::now() < deadline, "{}", s.stderr());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(s.stderr().contains("reshape going on"), "{}", s.stderr());
    assert!(s.signal_and_wait(libc::SIGTERM).success());
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)));
    assert_eq!(det["raid_disks"], 4, "{det}");
    assert_eq!(det["chunk_bytes"], 32 * 1024, "{det}");
    let out = ok(uraid().args(["check", "-q"]).args(&imgs));
    assert!(
        text(&out.stdout).contains("mismatch_cnt: 0"),
        "{}",
        text(&out.stdout)
    );
}

/// A 4-member raid10 near=2 stopped at the start of a switch to offset=2 with its data area
/// moving down (md's raid10 reshape): `examine` and `detail` show the reshape lines,
/// `read` gives the data, a write goes through both geometries, and `grow --continue`
/// finishes it: the new layout and data offset in every superblock, the same data, every
/// copy equal.
#[test]
fn a_raid10_mid_reshape_is_shown_read_and_continued() {
    let d = TempDir::new("reshape10-report");
    let imgs: Vec<PathBuf> = d.images(4, 8, "t");
    ok(uraid()
        .args([
            "create", "-l", "10", "-n", "4", "-p", "n2", "-c", "16K", "-N", "r10",
        ])
        .args(&imgs));
    let input = d.0.join("p.bin");
    let pattern: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&input, &pattern).unwrap();
    ok(uraid()
        .args(["write", "--offset", "0", "--input"])
        .arg(&input)
        .args(&imgs));
    let data_offset = sb_at(&imgs[0]).data_offset;
    for img in &imgs {
        let mut sb = sb_at(img);
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
        sb.reshape_position = 0;
        sb.new_level = sb.level;
        sb.new_layout = 0x10201;
        sb.new_chunk = sb.chunksize;
        sb.new_offset = -(data_offset as i32 / 2);
        put_sb(img, &sb);
    }
    let before = ok(uraid().arg("read").args(&imgs)).stdout;
    assert!(before[..pattern.len()] == pattern[..], "read mid-reshape");
    let ex = stdout(uraid().arg("examine").arg(&imgs[0]));
    assert_eq!(field(&ex, "Reshape pos'n").as_deref(), Some("0"), "{ex}");
    assert_eq!(
        field(&ex, "New Layout").as_deref(),
        Some("offset=2"),
        "{ex}"
    );
    let det = stdout(uraid().arg("detail").args(&imgs));
    assert_eq!(
        field(&det, "Reshape Status").as_deref(),
        Some("0% complete"),
        "{det}"
    );
    // Served read-write mid-reshape (issue 15): the same bytes written again, and one
    // sector changed and changed back.
    ok(uraid()
        .args(["write", "--offset", "0", "--input"])
        .arg(&input)
        .args(&imgs));
    let one = d.0.join("one.bin");
    std::fs::write(&one, [0xeeu8; 512]).unwrap();
    ok(uraid()
        .args(["write", "--offset", "4096", "--input"])
        .arg(&one)
        .args(&imgs));
    let mid = ok(uraid().arg("read").args(&imgs)).stdout;
    assert!(
        mid[4096..4608].iter().all(|&b| b == 0xee),
        "the write mid-reshape"
    );
    std::fs::write(&one, &pattern[4096..4608]).unwrap();
    ok(uraid()
        .args(["write", "--offset", "4096", "--input"])
        .arg(&one)
        .args(&imgs));
    ok(uraid().args(["grow", "--continue"]).args(&imgs));
    let sb = sb_at(&imgs[0]);
    assert_eq!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0);
    assert_eq!(sb.layout, 0x10201);
    assert_eq!(sb.data_offset, data_offset - data_offset / 2);
    let after = ok(uraid().arg("read").args(&imgs)).stdout;
    assert!(after == before, "the data after the reshape");
    let chk = ok(uraid().args(["check", "-q"]).args(&imgs));
    let chk = String::from_utf8_lossy(&chk.stdout);
    assert!(chk.contains("mismatch_cnt: 0"), "{chk}");
}
