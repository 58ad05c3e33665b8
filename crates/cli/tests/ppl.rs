//! `--consistency-policy ppl` (mdadm's -k): md's partial parity log on a raid5, named by
//! detail; what md would not start is refused before anything is written.

use uraid_core::superblock::{Superblock, FEATURE_MULTIPLE_PPLS, FEATURE_PPL};
use uraid_testkit::prelude::*;

fn field(t: &str, key: &str) -> String {
    t.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(" : ")?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no {key} in:\n{t}"))
}

fn sb_of(path: &std::path::Path) -> Superblock {
    let b = std::fs::read(path).unwrap();
    Superblock::decode(&b[4096..8192]).unwrap()
}

#[test]
fn create_with_ppl_writes_the_log_area_and_detail_names_the_policy() {
    let d = TempDir::new("ppl");
    let e = d.images(4, 64, "p");
    ok(uraid()
        .args(["create", "-l", "5", "--consistency-policy", "ppl"])
        .args(&e));
    let t = text(&ok(uraid().arg("detail").args(&e)).stdout);
    assert_eq!(field(&t, "Consistency Policy"), "ppl");
    // examine prints mdadm's PPL line.
    let t = text(&ok(uraid().arg("examine").arg(&e[0])).stdout);
    assert_eq!(
        field(&t, "PPL"),
        "2048 sectors at offset 8 sectors from superblock"
    );
    for img in &e {
        let sb = sb_of(img);
        assert_ne!(sb.feature_map & FEATURE_PPL, 0);
        // 1 MiB at 8 sectors after the superblock: several PPLs, as md writes them.
        assert_eq!(sb.ppl(), (8, 2048));
        assert_ne!(sb.feature_map & FEATURE_MULTIPLE_PPLS, 0);
        // The area holds md's empty header: 0xff reserve, the array's signature.
        let b = std::fs::read(img).unwrap();
        let at = ((sb.super_offset + 8) * 512) as usize;
        let h = uraid_core::ppl::PplHeader::decode_for(
            &b[at..at + 4096],
            uraid_core::ppl::signature(&sb.set_uuid),
        )
        .unwrap();
        assert_eq!((h.generation, h.entries.len()), (0, 0));
        // The bad block log moved behind the area, before the data.
        assert!(sb.bblog_offset >= 8 + 2048, "{}", sb.bblog_offset);
        assert!(sb.super_offset + sb.bblog_offset as u64 + 8 <= sb.data_offset);
    }
    let plain = d.images(4, 64, "r");
    ok(uraid()
        .args(["create", "-l", "5", "-k", "resync"])
        .args(&plain));
    let t = text(&ok(uraid().arg("detail").args(&plain)).stdout);
    assert_eq!(field(&t, "Consistency Policy"), "resync");
}

#[test]
fn ppl_where_md_has_none_is_refused_before_anything_is_written() {
    let d = TempDir::new("pplbad");
    let e = d.images(4, 64, "b");
    let err = fails_cleanly(
        uraid().args(["create", "-l", "6", "-k", "ppl"]).args(&e),
        &e,
    );
    assert!(err.contains("raid5 only"), "{err}");
    let err = fails_cleanly(
        uraid()
            .args(["create", "-l", "5", "-k", "ppl", "--bitmap", "internal"])
            .args(&e),
        &e,
    );
    assert!(err.contains("--bitmap=internal"), "{err}");
    let err = fails_cleanly(
        uraid().args(["create", "-l", "5", "-k", "wal"]).args(&e),
        &e,
    );
    assert!(err.contains("resync, bitmap, journal or ppl"), "{err}");
}

/// Linux 6.12 rewrites a PPL array's superblocks with FEATURE_MULTIPLE_PPLS alone (0x800,
/// seen in the VM harness): uraid must still run the log for such an array, or a crash
/// while uraid writes leaves md a stale PPL and the write hole open.
#[test]
fn an_array_with_feature_multiple_ppls_alone_logs_its_writes() {
    let d = TempDir::new("ppl800");
    let e = d.images(3, 64, "m");
    ok(uraid().args(["create", "-l", "5", "-k", "ppl"]).args(&e));
    for img in &e {
        let mut b = std::fs::read(img).unwrap();
        let mut sb = sb_of(img);
        sb.feature_map = FEATURE_MULTIPLE_PPLS;
        b[4096..8192].copy_from_slice(&sb.encode()[..4096]);
        std::fs::write(img, b).unwrap();
    }
    let t = text(&ok(uraid().arg("detail").args(&e)).stdout);
    assert_eq!(field(&t, "Consistency Policy"), "ppl");
    let input = d.path("in.bin");
    std::fs::write(&input, vec![0x5a; 4096]).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(&e));
    // The write was logged: some member's PPL header moved past the empty one.
    let generations: Vec<u64> = e
        .iter()
        .map(|img| {
            let sb = sb_of(img);
            let b = std::fs::read(img).unwrap();
            let at = ((sb.super_offset + 8) * 512) as usize;
            uraid_core::ppl::PplHeader::decode_for(
                &b[at..at + 4096],
                uraid_core::ppl::signature(&sb.set_uuid),
            )
            .unwrap()
            .generation
        })
        .collect();
    assert!(generations.iter().any(|&g| g > 0), "{generations:?}");
}
