//! `--readonly` on every metadata version, with an internal bitmap: after a crash (dirty
//! superblocks, dirty bitmap bits) assemble, detail, read and check with `-o` write no
//! byte to any member, neither the superblock (0.90 at the end, 1.0 at the end, 1.1 at
//! the start) nor its bitmap.

use std::path::PathBuf;
use uraid_testkit::prelude::*;

/// Each member's superblock state as `examine` prints it ("clean" or "active").
fn states(members: &[PathBuf]) -> Vec<String> {
    members
        .iter()
        .map(|m| {
            let out = stdout(&ok(uraid().arg("examine").arg(m)));
            mdadm_field(&out, "State").unwrap_or_default()
        })
        .collect()
}

#[test]
fn readonly_writes_nothing_to_0_90_1_0_or_1_1_members_with_a_bitmap() {
    for meta in ["0.90", "1.0", "1.1"] {
        let dir = TempDir::new(&format!("ro-v{meta}"));
        let members: Vec<PathBuf> = (0..3)
            .map(|i| {
                let p = dir.path(&format!("m{i}.img"));
                std::fs::File::create(&p).unwrap().set_len(8 * MIB).unwrap();
                p
            })
            .collect();
        ok(uraid()
            .args(["create", "-l", "5", "--chunk", "64K", "-e", meta])
            .args(["-b", "internal", "--run"])
            .args(&members));
        let data = pattern(1 << 20, 4);
        let input = dir.path("in.bin");
        std::fs::write(&input, &data).unwrap();
        // A crash after the write: superblocks dirty, the bitmap's bits set.
        ok(uraid()
            .args(["write", "--crash-after", "--input"])
            .arg(&input)
            .args(&members));
        let dirty = states(&members);
        assert!(dirty.iter().all(|s| s == "active"), "{meta}: {dirty:?}");
        let before = checksums(&members);
        ok(uraid().args(["assemble", "--readonly"]).args(&members));
        ok(uraid().args(["detail", "-o"]).args(&members));
        let out = ok(uraid()
            .args(["read", "--readonly", "--length"])
            .arg(data.len().to_string())
            .args(&members));
        assert!(out.stdout == data, "{meta}: read-only read differs");
        ok(uraid().args(["check", "-o", "-q"]).args(&members));
        assert_eq!(
            before,
            checksums(&members),
            "{meta}: a --readonly command wrote to a member"
        );
        assert_eq!(states(&members), dirty, "{meta}: the dirty flag changed");
        // Read-write, the same assembly resyncs and writes the array clean: the check above
        // could see a write.
        ok(uraid().args(["assemble", "--resync"]).args(&members));
        assert_ne!(
            before,
            checksums(&members),
            "{meta}: read-write assembly wrote nothing"
        );
    }
}
