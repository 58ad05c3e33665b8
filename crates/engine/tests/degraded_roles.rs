//! md's superblocks of a degraded array: once it writes, the present members record the
//! absent one's device as removed (0xffff in dev_roles, `AA.` in mdadm --examine) with a
//! new events count, so the absent member cannot come back as the holder of its role.

use rand::Rng;
use std::sync::Arc;
use uraid_core::superblock::ROLE_SPARE;
use uraid_core::Level;
use uraid_engine::read_superblock;
use uraid_engine::{assemble, AssembleOptions, MemMember, Member, MemberOutcome};
use uraid_testkit::engine::*;

fn restore(name: &str, img: &[u8]) -> Arc<dyn Member> {
    let m = Arc::new(MemMember::new(name, img.len() as u64));
    m.write_at(img, 0).unwrap();
    m
}

#[test]
fn a_degraded_write_records_the_absent_member_as_removed() {
    let c = Config::new(Level::Raid5, None, 3);
    let mems = mem_members(&c, "dr");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    a.stop().unwrap();
    drop(a);
    let before = read_superblock(mems[0].as_ref()).unwrap();
    assert_eq!(before.dev_roles[2], 2);
    let absent = mems[2].snapshot();

    // Degraded: members 0 and 1 only. Nothing is written before the first write.
    let devs: Vec<Arc<dyn Member>> = vec![mems[0].clone(), mems[1].clone()];
    let (b, _) = assemble(devs, &AssembleOptions::default()).unwrap();
    assert!(b.is_degraded());
    assert_eq!(read_superblock(mems[0].as_ref()).unwrap(), before);
    let mut model = vec![0u8; 1 << 20];
    rng(3).fill(&mut model[..]);
    b.write(0, &model).unwrap();
    for m in &mems[..2] {
        let sb = read_superblock(m.as_ref()).unwrap();
        assert!(sb.events > before.events, "events not bumped");
        assert_eq!(sb.dev_roles[2], ROLE_SPARE, "{:?}", &sb.dev_roles[..3]);
        assert_eq!(&sb.dev_roles[..2], &[0, 1]);
    }
    // A crash now (no clean stop): the absent member, one event behind, comes back. It
    // missed the write, so it must not take its role again.
    let images: Vec<Vec<u8>> = mems[..2].iter().map(|m| m.snapshot()).collect();
    std::mem::forget(b);
    let devs = vec![
        restore("dr-mem0", &images[0]),
        restore("dr-mem1", &images[1]),
        restore("dr-mem2", &absent),
    ];
    let (b, rep) = assemble(
        devs,
        &AssembleOptions {
            // Dirty and degraded after the cut: md needs start_dirty_degraded for it.
            start_dirty_degraded: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(rep.members[2].outcome, MemberOutcome::Stale, "{rep:?}");
    assert!(b.is_degraded());
    let mut back = vec![0u8; model.len()];
    b.read(0, &mut back).unwrap();
    assert!(back == model, "the returning member's stale data was read");
}
