//! The write-intent bitmap as NBD's `qemu:dirty-bitmap:uraid` meta context (issue 17), so
//! that backup tools copy only what changed: after writes to two separate regions of a
//! served raid1 and raid5 with an internal bitmap, exactly those regions' bitmap chunks are
//! dirty and the rest clean, as `nbdinfo --map` and `qemu-img map` (with qemu's
//! `x-dirty-bitmap`) see it; without a bitmap the context is not offered.

use std::process::Command;
use uraid_testkit::prelude::*;

const CONTEXT: &str = "qemu:dirty-bitmap:uraid";

/// (offset, length, dirty) runs of `nbdinfo --map=CONTEXT`.
fn nbdinfo_dirty(uri: &str) -> Vec<(u64, u64, bool)> {
    let out = stdout(&ok(Command::new("nbdinfo")
        .arg(format!("--map={CONTEXT}"))
        .arg(uri)));
    out.lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let flags: u32 = w[2].parse().unwrap();
            assert!(flags <= 1, "only the dirty flag: {l}");
            (w[0].parse().unwrap(), w[1].parse().unwrap(), flags == 1)
        })
        .collect()
}

/// (offset, length, dirty) runs of `qemu-img map` over the dirty bitmap: with
/// `x-dirty-bitmap`, qemu reads the context's flag 1 as a hole, so dirty is `data: false`.
fn qemu_img_dirty(srv: &Served) -> Vec<(u64, u64, bool)> {
    let opts = format!(
        "driver=nbd,server.type=unix,server.path={},export={},x-dirty-bitmap={CONTEXT}",
        srv.sock.display(),
        srv.name
    );
    let v = json(&ok(Command::new("qemu-img").args([
        "map",
        "--output=json",
        "--image-opts",
        &opts,
    ])));
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    for e in v.as_array().unwrap() {
        let dirty = !e["data"].as_bool().unwrap();
        let (start, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        match out.last_mut() {
            Some(last) if last.2 == dirty => last.1 += len,
            _ => out.push((start, len, dirty)),
        }
    }
    out
}

/// The runs expected after writes of `writes` (offset, length): each write dirties the
/// whole units (bitmap chunks in array bytes) it touches.
fn expected(size: u64, unit: u64, writes: &[(u64, u64)]) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    let mut at = 0;
    while at < size {
        let dirty = writes.iter().any(|&(o, l)| at < o + l && o < at + unit);
        match out.last_mut() {
            Some(last) if last.2 == dirty => last.1 += unit,
            _ => out.push((at, unit, dirty)),
        }
        at += unit;
    }
    out
}

fn check(level: &str, disks: usize, unit: u64, serve_args: &[&str]) {
    let test = format!("dirty_bitmap_raid{level}");
    if !need_tools(&["nbdinfo", "qemu-img", "qemu-io"], &test) {
        return;
    }
    let dir = TempDir::new(&format!("db-r{level}"));
    let members = dir.images(disks, 16, "m");
    // A long daemon delay: no bit is cleared while the test looks.
    ok(uraid()
        .args([
            "create",
            "-l",
            level,
            "--chunk",
            "64K",
            "--run",
            "--assume-clean",
        ])
        .args([
            "--bitmap",
            "internal",
            "--bitmap-chunk",
            "64K",
            "--delay",
            "3600",
        ])
        .args(["-n", &disks.to_string()])
        .args(&members));
    let srv = Served::start(&dir, &members, serve_args);
    let size = nbd_size(&srv.uri());
    assert_eq!(
        nbdinfo_dirty(&srv.uri()),
        [(0, size, false)],
        "raid{level}: all clean"
    );
    // Two regions: one inside a unit, one across a unit boundary.
    let writes = [(MIB, 4096), (6 * MIB + 100 * 1024, 64 * 1024)];
    qemu_io(
        &srv.uri(),
        &["write -P 0x5a 1M 4k", "write -P 0x5b 6244k 64k", "flush"],
    );
    let want = expected(size, unit, &writes);
    assert_eq!(want.iter().filter(|r| r.2).count(), 2, "two dirty regions");
    assert_eq!(nbdinfo_dirty(&srv.uri()), want, "raid{level} nbdinfo --map");
    assert_eq!(qemu_img_dirty(&srv), want, "raid{level} qemu-img map");
    // Listing offers both contexts; base:allocation still works beside it.
    let list = stdout(&ok(Command::new("nbdinfo")
        .arg("--list")
        .arg("--content")
        .arg(srv.uri())));
    assert!(
        list.contains(CONTEXT) && list.contains("base:allocation"),
        "{list}"
    );
}

#[test]
fn dirty_bitmap_raid1() {
    // raid1's bitmap counts array sectors: a unit is one 64 KiB bitmap chunk.
    check("1", 2, 64 * 1024, &[]);
}

#[test]
fn dirty_bitmap_with_metrics() {
    // With --metrics the export counts its requests; the bitmap and block status are
    // still the array's (a wrapper that forgot them would say "all data, no bitmap").
    check("1", 2, 64 * 1024, &["--metrics", "127.0.0.1:0"]);
}

#[test]
fn dirty_bitmap_raid5() {
    // raid5's counts member sectors in chunk rows: 64 KiB of each of 2 data members.
    check("5", 3, 128 * 1024, &[]);
}

#[test]
fn dirty_bitmap_not_offered_without_a_bitmap() {
    if !need_tools(&["nbdinfo"], "dirty_bitmap_not_offered_without_a_bitmap") {
        return;
    }
    let dir = TempDir::new("db-none");
    let members = dir.images(2, 16, "m");
    ok(uraid()
        .args(["create", "-l", "1", "--run", "--assume-clean", "-n", "2"])
        .args(&members));
    let srv = Served::start(&dir, &members, &[]);
    let list = stdout(&ok(Command::new("nbdinfo").arg("--list").arg(srv.uri())));
    assert!(list.contains("base:allocation"), "{list}");
    assert!(!list.contains("qemu:dirty-bitmap"), "{list}");
    let out = Command::new("nbdinfo")
        .arg(format!("--map={CONTEXT}"))
        .arg(srv.uri())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the context is not there to map");
}

#[test]
fn bitmap_chunk_and_delay_need_a_bitmap_and_sane_values() {
    let dir = TempDir::new("db-bad");
    let members = dir.images(2, 16, "m");
    for (args, needle) in [
        (&["--bitmap-chunk", "64K"][..], "need --bitmap internal"),
        (&["--delay", "5"][..], "need --bitmap internal"),
        (
            &["--bitmap", "internal", "--delay", "0"][..],
            "--delay must be at least 1",
        ),
        (
            &["--bitmap", "internal", "--bitmap-chunk", "x"][..],
            "bad bitmap chunk",
        ),
        (
            &["--bitmap", "internal", "--bitmap-chunk", "3K"][..],
            "not a power of two",
        ),
    ] {
        let err = fails_cleanly(
            uraid()
                .args(["create", "-l", "1", "--run", "-n", "2"])
                .args(args)
                .args(&members),
            &members,
        );
        assert!(err.contains(needle), "{args:?}: no {needle:?} in {err}");
        assert_eq!(err.matches(needle).count(), 1, "said once: {err}");
    }
}
