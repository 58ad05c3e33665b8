//! NBD block status of a served array (issue 17): `base:allocation` reports holes where
//! every member that holds a range is sparse and data where anything was written, as
//! `nbdinfo --map` and `qemu-img map` see it, for raid1, raid10 and raid5 on sparse files.

use std::process::Command;
use uraid_testkit::prelude::*;

/// (offset, length, hole) runs of `nbdinfo --map`.
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, bool)> {
    let out = stdout(&ok(Command::new("nbdinfo").args(["--map", uri])));
    out.lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let flags: u32 = w[2].parse().unwrap();
            assert!(
                flags == 0 || flags == 3,
                "hole and zero go together here: {l}"
            );
            (w[0].parse().unwrap(), w[1].parse().unwrap(), flags == 3)
        })
        .collect()
}

/// (offset, length, zero) runs of `qemu-img map --output=json`.
fn qemu_img_map(uri: &str) -> Vec<(u64, u64, bool)> {
    let v = json(&ok(Command::new("qemu-img").args([
        "map",
        "--output=json",
        "-f",
        "raw",
        uri,
    ])));
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let zero = e["zero"].as_bool().unwrap();
            assert_eq!(e["data"].as_bool().unwrap(), !zero, "{e}");
            (
                e["start"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                zero,
            )
        })
        .collect()
}

fn check(level: &str, disks: usize, row_bytes: u64) {
    let test = format!("block_status_raid{level}");
    if !need_tools(&["nbdinfo", "qemu-img", "qemu-io"], &test) {
        return;
    }
    let dir = TempDir::new(&format!("bs-r{level}"));
    let members = dir.images(disks, 16, "m");
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
        .args(["-n", &disks.to_string()])
        .args(&members));
    let srv = Served::start(&dir, &members, &[]);
    let size = nbd_size(&srv.uri());
    // Nothing written yet: all of it is a hole.
    assert_eq!(nbdinfo_map(&srv.uri()), [(0, size, true)], "raid{level}");
    qemu_io(&srv.uri(), &["write -P 0x6b 1M 64k", "flush"]);
    // The row holding the write is data (its other members' chunks too), the rest a hole.
    let want = vec![
        (0, MIB, true),
        (MIB, row_bytes, false),
        (MIB + row_bytes, size - MIB - row_bytes, true),
    ];
    assert_eq!(nbdinfo_map(&srv.uri()), want, "raid{level} nbdinfo --map");
    assert_eq!(qemu_img_map(&srv.uri()), want, "raid{level} qemu-img map");
    // What the map calls a hole reads as zeros, the data as written.
    let out = qemu_io(
        &srv.uri(),
        &["read -P 0 0 1M", "read -P 0x6b 1M 64k", "read -P 0 2M 1M"],
    );
    assert!(!out.contains("verification failed"), "{out}");
}

#[test]
fn block_status_raid1() {
    check("1", 2, 64 * 1024);
}

#[test]
fn block_status_raid10() {
    // 4 members near 2, 64 KiB chunks: a unit is one array chunk, held by its two copies.
    check("10", 4, 64 * 1024);
}

#[test]
fn block_status_raid5() {
    // 3 members, 64 KiB chunks: a row is 128 KiB of the array.
    check("5", 3, 128 * 1024);
}
