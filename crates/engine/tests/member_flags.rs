//! md's member flags (the superblock's devflags): write-mostly keeps raid1 reads off a
//! member while another copy is in sync; failfast fails a raid1/raid10 member on its first
//! read error instead of repairing it, but never the last copy of the data; both live in
//! the slot at run time and in the superblock on disk, through assemble, `set`, add, re-add,
//! spare activation and replace.

use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{assemble, Array, AssembleOptions, MemMember, Member, MemberFlags, SlotState};
use uraid_engine::{read_superblock, SyncKind};
use uraid_sim::FaultMember;
use uraid_testkit::engine::*;

const WM: MemberFlags = MemberFlags {
    write_mostly: true,
    failfast: false,
};
const FF: MemberFlags = MemberFlags {
    write_mostly: false,
    failfast: true,
};
const NONE: MemberFlags = MemberFlags {
    write_mostly: false,
    failfast: false,
};

/// `level` over memory members wrapped in fault members, created with `flags`, filled with
/// seeded data: the fault members, the array and the data.
fn array(
    level: Level,
    layout: Option<u32>,
    flags: &[MemberFlags],
) -> (Vec<Arc<FaultMember>>, Array, Vec<u8>) {
    let mut c = Config::new(level, layout, flags.len());
    c.chunk_sectors = if level == Level::Raid1 { 0 } else { 16 };
    let mems = mem_members(&c, "flags");
    let faults: Vec<Arc<FaultMember>> = mems
        .iter()
        .map(|m| Arc::new(FaultMember::new(m.clone() as Arc<dyn Member>)))
        .collect();
    let devs = faults
        .iter()
        .map(|f| Some(f.clone() as Arc<dyn Member>))
        .collect();
    let mut o = create_opts(&c);
    o.member_flags = flags.to_vec();
    let a = uraid_engine::create(devs, &o).unwrap();
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(7).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    (faults, a, data)
}

/// 256 reads of 4 KiB at seeded offsets, each checked against `data`.
fn random_reads(a: &Array, data: &[u8], seed: u64) {
    let mut r = rng(seed);
    let mut b = vec![0u8; 4096];
    for _ in 0..256 {
        let off = r.gen_range(0..a.size_bytes() / 4096) * 4096;
        a.read(off, &mut b).unwrap();
        assert!(
            b[..] == data[off as usize..off as usize + 4096],
            "read at {off}"
        );
    }
}

fn reads(f: &FaultMember) -> u64 {
    f.reads.load(Ordering::SeqCst)
}

fn zero_counts(fs: &[Arc<FaultMember>]) {
    for f in fs {
        f.reads.store(0, Ordering::SeqCst);
    }
}

#[test]
fn raid1_reads_avoid_a_write_mostly_member_while_another_copy_is_in_sync() {
    // Without the flag the balancer does send reads to member 1 (else this test could not
    // tell anything).
    let (f, a, data) = array(Level::Raid1, None, &[NONE, NONE]);
    zero_counts(&f);
    random_reads(&a, &data, 1);
    assert!(reads(&f[1]) > 0, "the balancer never used member 1");

    let (f, a, data) = array(Level::Raid1, None, &[NONE, WM]);
    assert_eq!(a.slot(MemberIdx(1)).member_flags(), WM);
    zero_counts(&f);
    random_reads(&a, &data, 1);
    assert_eq!(reads(&f[1]), 0, "a write-mostly member was read");
    assert!(reads(&f[0]) >= 256);
    // Writes still reach it: it is a full copy.
    let new = vec![0x5au8; 64 << 10];
    a.write(128 << 10, &new).unwrap();
    let mut back = vec![0u8; new.len()];
    f[1].read_at(
        &mut back,
        a.slot(MemberIdx(1)).data_offset_bytes() + (128 << 10),
    )
    .unwrap();
    assert_eq!(back, new);
    let mut data = data;
    data[128 << 10..(128 << 10) + new.len()].copy_from_slice(&new);

    // The only in-sync copy left: reads go to it.
    a.fail_member(MemberIdx(0)).unwrap();
    zero_counts(&f);
    random_reads(&a, &data, 2);
    assert!(reads(&f[1]) >= 256, "the only copy was not read");
    assert_eq!(reads(&f[0]), 0);
}

#[test]
fn raid1_retries_after_a_read_error_go_to_the_write_mostly_member_last() {
    let (f, a, data) = array(Level::Raid1, None, &[NONE, WM, NONE]);
    let off = 256u64 << 10;
    let at = a.slot(MemberIdx(0)).data_offset_bytes() + off;
    let mut b = vec![0u8; 4096];
    // Member 0 (the balancer's first choice) cannot read a range: member 2 answers, not
    // the write-mostly member 1 that comes first in the rotation.
    f[0].set_range(at, at + 4096);
    f[0].fail_reads.store(true, Ordering::SeqCst);
    zero_counts(&f);
    a.read(off, &mut b).unwrap();
    assert!(b[..] == data[off as usize..off as usize + 4096]);
    assert_eq!((reads(&f[0]), reads(&f[1]), reads(&f[2])), (1, 0, 1));
    // Members 0 and 2 cannot: the write-mostly copy is the last resort.
    f[2].set_range(at, at + 4096);
    f[2].fail_reads.store(true, Ordering::SeqCst);
    zero_counts(&f);
    a.read(off, &mut b).unwrap();
    assert!(b[..] == data[off as usize..off as usize + 4096]);
    assert_eq!(reads(&f[1]), 1, "the write-mostly copy is the last resort");
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::InSync);
    assert_eq!(a.slot_state(MemberIdx(2)), SlotState::InSync);
}

/// md's raid10 does not look at write-mostly when it balances reads (md.rst: the flag
/// "applies only to raid1 arrays"): the flag is kept, reads still use the member.
#[test]
fn raid10_keeps_the_flag_but_balances_reads_as_md() {
    let (f, a, data) = array(Level::Raid10, Some(0x102), &[NONE, WM, NONE, WM]);
    assert_eq!(a.slot(MemberIdx(1)).member_flags(), WM);
    zero_counts(&f);
    random_reads(&a, &data, 3);
    assert!(reads(&f[1]) + reads(&f[3]) > 0);
}

/// A read error on member 0 (member 1 is write-mostly, so member 0 is read first).
fn read_error_on_member0(flags0: MemberFlags) -> (Vec<Arc<FaultMember>>, Array, Vec<u8>) {
    let (f, a, data) = array(Level::Raid1, None, &[flags0, WM]);
    let off = 64u64 << 10;
    let at = a.slot(MemberIdx(0)).data_offset_bytes() + off;
    f[0].set_range(at, at + 512);
    f[0].fail_reads.store(true, Ordering::SeqCst);
    f[0].writes.store(0, Ordering::SeqCst);
    let mut b = vec![0u8; 4096];
    a.read(off, &mut b).unwrap();
    assert!(b[..] == data[off as usize..off as usize + 4096]);
    (f, a, data)
}

#[test]
fn failfast_fails_the_member_on_its_first_read_error_instead_of_repairing_it() {
    // Without the flag: md's read-error repair, the member stays.
    let (f, a, _) = read_error_on_member0(NONE);
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::InSync);
    assert_eq!(a.stats.corrected_reads.load(Ordering::SeqCst), 1);
    assert_eq!(
        f[0].writes.load(Ordering::SeqCst),
        1,
        "the repair's rewrite"
    );

    let (f, a, data) = read_error_on_member0(FF);
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::Faulty);
    assert_eq!(
        a.stats.corrected_reads.load(Ordering::SeqCst),
        0,
        "a failfast member was repaired"
    );
    assert_eq!(
        f[0].writes.load(Ordering::SeqCst),
        0,
        "the failed member got a rewrite"
    );
    assert!(a.is_running());
    // Recorded on disk: member 1's superblock says role 0 is faulty.
    let sb = read_superblock(f[1].as_ref()).unwrap();
    assert_eq!(sb.dev_roles[0], uraid_core::superblock::ROLE_FAULTY);
    random_reads(&a, &data, 4);
}

#[test]
fn raid10_failfast_fails_the_member_during_a_check_too() {
    let (f, a, _) = array(Level::Raid10, Some(0x102), &[FF, NONE, NONE, NONE]);
    f[0].fail_reads.store(true, Ordering::SeqCst);
    let mismatches = a.run_sync(SyncKind::Check, |_| {}).unwrap();
    assert_eq!(mismatches, 0);
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::Faulty);
    assert_eq!(a.stats.corrected_reads.load(Ordering::SeqCst), 0);
}

/// The only in-sync copy, flagged failfast, with a recovering member beside it that could
/// answer the read: failing it would leave the array without a full copy (md never fails
/// the last one), so the error is repaired as without the flag.
#[test]
fn failfast_never_fails_the_last_in_sync_copy() {
    let (f, a, data) = array(Level::Raid1, None, &[FF, NONE]);
    a.fail_member(MemberIdx(1)).unwrap();
    a.remove_member(MemberIdx(1)).unwrap();
    // Back as write-mostly, so that reads go to member 0 first; rebuilt up to 1 MiB.
    a.add_member_with(f[1].clone(), WM).unwrap();
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::Recovering);
    a.sync_step(SyncKind::Recovery, 0, 2048).unwrap();
    let off = 64u64 << 10;
    let at = a.slot(MemberIdx(0)).data_offset_bytes() + off;
    f[0].set_range(at, at + 512);
    f[0].fail_reads.store(true, Ordering::SeqCst);
    let mut b = vec![0u8; 4096];
    a.read(off, &mut b).unwrap();
    assert!(b[..] == data[off as usize..off as usize + 4096]);
    assert_eq!(
        a.slot_state(MemberIdx(0)),
        SlotState::InSync,
        "last copy failed"
    );
    assert_eq!(a.stats.corrected_reads.load(Ordering::SeqCst), 1);
    assert!(a.is_running());
}

fn flags_on_disk(m: &dyn Member) -> MemberFlags {
    read_superblock(m).unwrap().member_flags()
}

#[test]
fn flags_round_trip_through_the_superblock_assemble_and_set() {
    let both = MemberFlags {
        write_mostly: true,
        failfast: true,
    };
    let (f, a, data) = array(Level::Raid1, None, &[NONE, WM, both]);
    a.stop().unwrap();
    drop(a);
    let devs: Vec<Arc<dyn Member>> = f.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
    for (m, want) in devs.iter().zip([NONE, WM, both]) {
        assert_eq!(flags_on_disk(m.as_ref()), want, "{}", m.name());
    }
    // Given in another order: the flags are the members', not the positions'.
    let rev: Vec<Arc<dyn Member>> = devs.iter().rev().cloned().collect();
    let (a, _) = assemble(rev, &AssembleOptions::default()).unwrap();
    assert_eq!(a.slot(MemberIdx(0)).member_flags(), NONE);
    assert_eq!(a.slot(MemberIdx(1)).member_flags(), WM);
    assert_eq!(a.slot(MemberIdx(2)).member_flags(), both);
    // Changed at run time: on disk at once, and kept by later superblock writes.
    a.set_member_flags(MemberIdx(1), NONE).unwrap();
    a.set_member_flags(MemberIdx(0), FF).unwrap();
    assert_eq!(flags_on_disk(devs[1].as_ref()), NONE);
    assert_eq!(flags_on_disk(devs[0].as_ref()), FF);
    a.write(0, &data[..4096]).unwrap();
    a.stop().unwrap();
    drop(a);
    let (a, _) = assemble(devs.clone(), &AssembleOptions::default()).unwrap();
    assert_eq!(a.slot(MemberIdx(0)).member_flags(), FF);
    assert_eq!(a.slot(MemberIdx(1)).member_flags(), NONE);
    assert_eq!(a.slot(MemberIdx(2)).member_flags(), both);
    assert!(a.set_member_flags(MemberIdx(3), WM).is_err());
}

#[test]
fn flags_go_with_the_device_through_add_spare_activation_re_add_and_replace() {
    let (f, a, _) = array(Level::Raid1, None, &[NONE, WM]);
    // A spare added with flags keeps them in its superblock and takes them into a role.
    let spare = Arc::new(MemMember::new("spare", 2 << 20));
    assert_eq!(
        a.add_member_with(spare.clone(), FF).unwrap(),
        uraid_engine::AddOutcome::Spare
    );
    assert_eq!(flags_on_disk(spare.as_ref()), FF);
    a.fail_member(MemberIdx(0)).unwrap();
    assert_eq!(a.slot(MemberIdx(0)).device_name().as_deref(), Some("spare"));
    assert_eq!(a.slot(MemberIdx(0)).member_flags(), FF);
    assert_eq!(flags_on_disk(spare.as_ref()), FF);
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::InSync);

    // Re-added without flags, a member keeps its own.
    a.fail_member(MemberIdx(1)).unwrap();
    a.remove_member(MemberIdx(1)).unwrap();
    a.add_member(f[1].clone()).unwrap();
    assert_eq!(a.slot(MemberIdx(1)).member_flags(), WM);
    assert_eq!(flags_on_disk(f[1].as_ref()), WM);
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();

    // A replacement takes the role with the flags it was added with.
    let new = Arc::new(MemMember::new("new", 2 << 20));
    a.add_member_with(new.clone(), WM).unwrap();
    a.replace(MemberIdx(0), Some("new")).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    while a.replace_step(MemberIdx(0), &mut buf).unwrap().is_some() {}
    assert_eq!(a.slot(MemberIdx(0)).device_name().as_deref(), Some("new"));
    assert_eq!(a.slot(MemberIdx(0)).member_flags(), WM);
    assert_eq!(flags_on_disk(new.as_ref()), WM);
}

#[test]
fn create_refuses_flags_for_more_members_than_it_has() {
    let c = Config::new(Level::Raid1, None, 2);
    let mems = mem_members(&c, "many");
    let mut o = create_opts(&c);
    o.member_flags = vec![NONE, WM, WM];
    let e = uraid_engine::create(as_members(&mems), &o)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("member flags"), "{e}");
}
