//! md's consistency_policy on a running raid5 (`uraid set consistency_policy=...`): ppl and
//! resync switch both ways, the superblocks follow, writes are logged only with ppl, and
//! what md refuses is refused before anything is written.

use std::sync::Arc;
use uraid_core::ppl::{signature, PplHeader};
use uraid_core::superblock::FEATURE_PPL;
use uraid_core::Level;
use uraid_engine::{create, read_superblock, CreateOptions, MemMember, Member};
use uraid_testkit::engine::as_members;

fn members(n: usize) -> Vec<Arc<MemMember>> {
    (0..n)
        .map(|i| Arc::new(MemMember::new(format!("s{i}"), (4096 + 64 * 16) * 512)))
        .collect()
}

fn opts(level: Level, ppl: bool) -> CreateOptions {
    let mut o = CreateOptions::new(level);
    o.chunk_sectors = Some(16);
    o.assume_clean = true;
    o.data_offset_sectors = Some(4096);
    o.ppl = ppl;
    o
}

/// Newest generation in the PPL area of any member (0: only empty headers).
fn newest_generation(m: &[Arc<MemMember>]) -> u64 {
    m.iter()
        .map(|m| {
            let sb = read_superblock(m.as_ref()).unwrap();
            let mut b = vec![0u8; 4096];
            m.read_at(&mut b, (sb.super_offset + 8) * 512).unwrap();
            PplHeader::decode_for(&b, signature(&sb.set_uuid))
                .map(|h| h.generation)
                .unwrap_or(0)
        })
        .max()
        .unwrap()
}

fn policy(a: &uraid_engine::Array) -> String {
    a.tunables()
        .into_iter()
        .find(|(k, _)| *k == "consistency_policy")
        .unwrap()
        .1
}

#[test]
fn ppl_and_resync_switch_both_ways_on_a_running_array() {
    let m = members(4);
    let a = create(as_members(&m), &opts(Level::Raid5, true)).unwrap();
    assert_eq!(policy(&a), "ppl");
    a.write(4096, &[7u8; 4096]).unwrap();
    assert!(newest_generation(&m) >= 1, "a write was logged");

    a.set_tunable("consistency_policy", "resync").unwrap();
    assert_eq!(policy(&a), "resync");
    assert!(!a.has_ppl());
    for mm in &m {
        assert_eq!(
            read_superblock(mm.as_ref()).unwrap().feature_map & FEATURE_PPL,
            0
        );
    }

    a.set_tunable("consistency_policy", "ppl").unwrap();
    assert!(a.has_ppl());
    for mm in &m {
        let sb = read_superblock(mm.as_ref()).unwrap();
        assert_ne!(sb.feature_map & FEATURE_PPL, 0);
        assert_eq!(sb.ppl(), (8, 2048));
    }
    assert_eq!(newest_generation(&m), 0, "the areas start empty");
    a.write(8192, &[9u8; 4096]).unwrap();
    assert_eq!(newest_generation(&m), 1, "writes are logged again");
    let mut back = vec![0u8; 4096];
    a.read(8192, &mut back).unwrap();
    assert_eq!(back, vec![9u8; 4096]);
}

#[test]
fn ppl_where_md_refuses_it_changes_nothing() {
    let m = members(4);
    let a = create(as_members(&m), &opts(Level::Raid6, false)).unwrap();
    let before: Vec<Vec<u8>> = m.iter().map(|m| m.snapshot()).collect();
    let e = a.set_tunable("consistency_policy", "ppl").unwrap_err();
    assert!(e.to_string().contains("raid5 only"), "{e}");
    let e = a.set_tunable("consistency_policy", "wal").unwrap_err();
    assert!(e.to_string().contains("ppl or resync"), "{e}");
    let after: Vec<Vec<u8>> = m.iter().map(|m| m.snapshot()).collect();
    assert!(before == after, "nothing was written");
    // A raid5 whose bad block log sits right after the superblock has no room (as mdadm).
    let m = members(4);
    let mut o = opts(Level::Raid5, false);
    o.data_offset_sectors = Some(64);
    let a = create(as_members(&m), &o).unwrap();
    let before: Vec<Vec<u8>> = m.iter().map(|m| m.snapshot()).collect();
    let e = a.set_tunable("consistency_policy", "ppl").unwrap_err();
    assert!(
        e.to_string().contains("no room for a partial parity log"),
        "{e}"
    );
    assert!(!a.has_ppl());
    let after: Vec<Vec<u8>> = m.iter().map(|m| m.snapshot()).collect();
    assert!(before == after, "nothing was written");
}
