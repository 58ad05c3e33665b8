//! `Array::force_stop`, the quickest safe stop (a second SIGTERM while a clean stop hangs):
//! completed writes are flushed where members answer, a member that cannot be flushed is
//! marked faulty in the others' superblocks, and the superblocks are left dirty so that the
//! next assembly resyncs and reads back every acknowledged write.

use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{assemble, AssembleOptions, MemMember, Member, MemberOutcome, SlotState};
use uraid_sim::FaultMember;
use uraid_testkit::engine::*;

fn cfg() -> Config {
    Config {
        level: Level::Raid5,
        layout: None,
        disks: 3,
        chunk_sectors: 16,
        member_bytes: vec![2 << 20; 3],
    }
}

fn restore(name: &str, img: &[u8]) -> Arc<dyn Member> {
    let m = Arc::new(MemMember::new(name, img.len() as u64));
    m.write_at(img, 0).unwrap();
    m
}

#[test]
fn a_member_that_cannot_flush_is_marked_faulty_and_the_array_resyncs() {
    let c = cfg();
    let mems = mem_members(&c, "fs");
    let flaky = Arc::new(FaultMember::new(mems[1].clone()));
    let mut devs = as_members(&mems);
    devs[1] = Some(flaky.clone());
    let a = uraid_engine::create(devs, &create_opts(&c)).unwrap();
    let mut model = vec![0u8; a.size_bytes() as usize];
    rng(7).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    flaky.fail_flushes.store(true, Ordering::SeqCst);

    let r = a.force_stop();
    assert_eq!(r.marked_faulty, vec![flaky.name()], "{r:?}");
    assert!(r.unrecorded.is_empty(), "{r:?}");
    assert_eq!(r.flushed.len(), 2, "{r:?}");
    assert!(r.dirty, "{r:?}");
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::Faulty);
    // The process exits here: no clean stop runs.
    let images: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
    std::mem::forget(a);

    let devs: Vec<Arc<dyn Member>> = images
        .iter()
        .enumerate()
        .map(|(i, img)| restore(&format!("fs-mem{i}"), img))
        .collect();
    let (b, rep) = assemble(
        devs,
        &AssembleOptions {
            // Dirty and degraded after the cut: md needs start_dirty_degraded for it.
            start_dirty_degraded: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(rep.unclean, "superblocks must still say active: {rep:?}");
    assert_eq!(rep.members[1].outcome, MemberOutcome::Faulty, "{rep:?}");
    assert!(b.is_degraded());
    let mut back = vec![0u8; model.len()];
    b.read(0, &mut back).unwrap();
    assert!(back == model, "acknowledged data lost after a forced stop");
}

#[test]
fn a_forced_stop_of_a_clean_array_changes_nothing() {
    let c = cfg();
    let mems = mem_members(&c, "fc");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    a.write(0, &vec![0x5a; 1 << 16]).unwrap();
    a.stop().unwrap();
    let before: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
    let r = a.force_stop();
    assert!(!r.dirty && r.marked_faulty.is_empty() && r.unrecorded.is_empty());
    assert_eq!(r.flushed.len(), 3);
    let after: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
    assert!(
        before == after,
        "a forced stop of a clean array wrote something"
    );
}
