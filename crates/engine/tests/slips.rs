//! Issue 19 in the engine: a dirty degraded raid4/5/6 does not start without force, a
//! dirty array opened and stopped without writes is left byte for byte, and a device that
//! is already in the array (or a copy of a member) is not added again.

use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::Place;
use uraid_engine::{assemble, AssembleOptions, MemMember, Member, SlotState};
use uraid_testkit::engine::*;

fn raid5() -> Config {
    Config::new(Level::Raid5, None, 4)
}

/// A raid5 with one write and then "killed": the array object is leaked, so it never
/// stops and its superblocks stay dirty.
fn dirty(tag: &str) -> Vec<Arc<MemMember>> {
    let c = raid5();
    let mems = mem_members(&c, tag);
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    a.write(0, &[0x5a; 65536]).unwrap();
    a.flush().unwrap();
    std::mem::forget(a);
    mems
}

fn dyns(m: &[Arc<MemMember>]) -> Vec<Arc<dyn Member>> {
    m.iter().map(|m| m.clone() as Arc<dyn Member>).collect()
}

#[test]
fn dirty_degraded_raid5_needs_force() {
    let mems = dirty("dd");
    let err = assemble(dyns(&mems[1..]), &AssembleOptions::default())
        .err()
        .expect("a dirty degraded raid5 started");
    let msg = err.to_string();
    assert!(msg.contains("cannot start dirty degraded"), "{msg}");
    assert!(msg.contains("--force"), "{msg}");
    for opts in [
        AssembleOptions {
            force: true,
            ..Default::default()
        },
        AssembleOptions {
            start_dirty_degraded: true,
            ..Default::default()
        },
    ] {
        let (a, rep) = assemble(dyns(&mems[1..]), &opts).unwrap();
        assert!(rep.unclean && a.is_degraded());
        let mut buf = vec![0u8; 65536];
        a.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0x5a));
    }
    // Every member: not degraded, it starts.
    assert!(assemble(dyns(&mems), &AssembleOptions::default()).is_ok());
}

#[test]
fn a_dirty_array_opened_checked_and_stopped_is_unchanged() {
    let mems = dirty("nw");
    let before: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
    let (a, rep) = assemble(dyns(&mems), &AssembleOptions::default()).unwrap();
    assert!(rep.unclean);
    let mut buf = vec![0u8; 65536];
    a.read(0, &mut buf).unwrap();
    a.check().unwrap();
    a.stop().unwrap();
    drop(a);
    for (m, b) in mems.iter().zip(&before) {
        assert!(m.snapshot() == *b, "{} was written", m.name());
    }
    // A resync pays the debt and is written.
    let (a, _) = assemble(dyns(&mems), &AssembleOptions::default()).unwrap();
    a.resync().unwrap();
    a.stop().unwrap();
    let (_, rep) = assemble(dyns(&mems), &AssembleOptions::default()).unwrap();
    assert!(!rep.unclean);
}

#[test]
fn a_member_or_a_copy_of_one_is_not_added_again() {
    let c = raid5();
    let mems = mem_members(&c, "id");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    // The same device object, and a byte-for-byte copy under another name.
    let same: Arc<dyn Member> = mems[1].clone();
    let copy = Arc::new(MemMember::new("copy-of-1", 2 << 20));
    copy.write_at(&mems[1].snapshot(), 0).unwrap();
    for dev in [same, copy.clone() as Arc<dyn Member>] {
        assert_eq!(
            a.locate_device(dev.as_ref()),
            Some(Place::Member(uraid_core::MemberIdx(1), SlotState::InSync))
        );
        let err = a.add_member(dev).expect_err("added twice").to_string();
        assert!(err.contains("already in the array as member 1"), "{err}");
    }
    assert!(a.spares().is_empty());
    assert!(
        copy.snapshot() == mems[1].snapshot(),
        "the refused add wrote"
    );
    let spare = Arc::new(MemMember::new("spare", 2 << 20));
    a.add_member(spare.clone()).unwrap();
    assert_eq!(
        a.locate_device(spare.as_ref()),
        Some(Place::Spare("spare".into()))
    );
    assert!(a.add_member(spare).is_err());
    assert_eq!(a.spares().len(), 1);
}

#[test]
fn create_asks_after_validating_and_before_writing() {
    let c = raid5();
    let mems = mem_members(&c, "ask");
    for m in &mems {
        m.write_at(&[0xee; 8192], 0).unwrap();
    }
    let before: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
    let mut asked = 0;
    let no = uraid_engine::create_confirmed(as_members(&mems), &create_opts(&c), &mut || {
        asked += 1;
        Err(uraid_engine::ArrayError::Create("answered no".into()))
    });
    assert_eq!(no.err().map(|e| e.to_string()), Some("answered no".into()));
    assert_eq!(asked, 1);
    for (m, b) in mems.iter().zip(&before) {
        assert!(m.snapshot() == *b, "{} written before the answer", m.name());
    }
    // Invalid input is refused before anything is asked.
    let mut bad = create_opts(&c);
    bad.chunk_sectors = Some(3);
    let mut asked = 0;
    let r = uraid_engine::create_confirmed(as_members(&mems), &bad, &mut || {
        asked += 1;
        Ok(())
    });
    assert!(r.is_err());
    assert_eq!(asked, 0);
    assert!(
        uraid_engine::create_confirmed(as_members(&mems), &create_opts(&c), &mut || Ok(())).is_ok()
    );
}
