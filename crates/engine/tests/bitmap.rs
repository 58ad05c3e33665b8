//! The write-intent bitmap: bits set before data, cleared by the daemon, resync after a
//! crash touches only dirty chunks, and a re-added member gets only what it missed.

use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{assemble, AddOutcome, Array, AssembleOptions, Member, SlotState, SyncKind};
use uraid_sim::FaultMember;
use uraid_testkit::engine::*;

const BM_CHUNK: u32 = 64 * 1024;

fn cfg(level: Level, disks: usize) -> Config {
    Config {
        level,
        layout: None,
        disks,
        chunk_sectors: 16,
        member_bytes: vec![4 << 20; disks],
    }
}

fn make(c: &Config, tag: &str) -> (Vec<Arc<uraid_engine::MemMember>>, Array) {
    let mems = mem_members(c, tag);
    let mut o = create_opts(c);
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(BM_CHUNK);
    o.data_offset_sectors = Some(2048);
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    (mems, a)
}

fn devs(m: &[Arc<uraid_engine::MemMember>]) -> Vec<Arc<dyn Member>> {
    m.iter().map(|x| x.clone() as Arc<dyn Member>).collect()
}

#[test]
fn bits_are_set_by_writes_and_cleared_by_the_daemon() {
    for c in [
        cfg(Level::Raid1, 2),
        cfg(Level::Raid5, 4),
        cfg(Level::Raid10, 4),
        cfg(Level::Raid6, 5),
    ] {
        let (_m, a) = make(&c, "bd");
        assert_eq!(
            a.bitmap_dirty_chunks().unwrap().0,
            0,
            "{c:?}: fresh bitmap dirty"
        );
        a.write(0, &[1u8; 4096]).unwrap();
        a.write(a.size_bytes() - 4096, &[2u8; 4096]).unwrap();
        let (dirty, total) = a.bitmap_dirty_chunks().unwrap();
        assert!(
            dirty >= 2 && dirty < total,
            "{c:?}: {dirty} of {total} dirty"
        );
        a.bitmap_daemon().unwrap(); // first pass: idle noted
        assert_eq!(
            a.bitmap_dirty_chunks().unwrap().0,
            dirty,
            "{c:?}: cleared too early"
        );
        a.bitmap_daemon().unwrap();
        assert_eq!(
            a.bitmap_dirty_chunks().unwrap().0,
            0,
            "{c:?}: daemon left bits"
        );
    }
}

/// A crash after a few writes, one block of redundancy damaged in a dirty chunk and one in
/// a clean chunk, then `daemon_passes` passes of the bitmap daemon before the resync:
/// the mismatches a check finds after the resync.
fn crash_then_resync(c: &Config, tag: &str, daemon_passes: usize) -> u64 {
    let (mems, a) = make(c, tag);
    let mut r = rng(11);
    let mut model = vec![0u8; a.size_bytes() as usize];
    r.fill(&mut model[..]);
    a.write(0, &model).unwrap();
    a.stop().unwrap(); // clean: no bits
    assert_eq!(a.bitmap_dirty_chunks().unwrap().0, 0);
    // A few writes, then a crash (no clean stop).
    let w = 3 * 4096;
    a.write(8192, &model[8192..8192 + w]).unwrap();
    let dirty = a.bitmap_dirty_chunks().unwrap().0;
    std::mem::forget(a);
    // Damage redundancy in a dirty chunk (a torn write) and in a clean one.
    let data_off = 2048 * 512;
    let dirty_spot = data_off + 8192; // member 0, first bitmap chunk(s)
    let clean_spot = data_off + (5 << 19); // far from any write
    mems[0].write_at(&[0xEE; 4096], dirty_spot).unwrap();
    mems[0].write_at(&[0xEE; 4096], clean_spot).unwrap();
    let (b, rep) = assemble(devs(&mems), &AssembleOptions::default()).unwrap();
    assert!(rep.unclean, "{c:?}: crash not detected");
    for _ in 0..daemon_passes {
        b.bitmap_daemon().unwrap();
    }
    let before = b.stats.member_reads.load(Ordering::Relaxed);
    b.resync().unwrap();
    let reads = b.stats.member_reads.load(Ordering::Relaxed) - before;
    // Only the dirty chunks were read: far fewer reads than a full pass.
    let full_units = b.total_units();
    assert!(
        reads <= (dirty * BM_CHUNK as u64 / 512 + 4096) * c.disks as u64 / 8,
        "{c:?}: resync read {reads} blocks for {dirty} dirty chunks ({full_units} units)"
    );
    // The damage in a clean chunk is still there, which proves the resync skipped it.
    let left = b.check().unwrap();
    assert!(left > 0, "{c:?}: resync touched a clean chunk");
    b.repair().unwrap();
    assert_eq!(b.check().unwrap(), 0);
    drop(b);
    let (b, rep) = assemble(devs(&mems), &AssembleOptions::default()).unwrap();
    assert!(!rep.unclean, "{c:?}: still unclean after resync and stop");
    let _ = b;
    left
}

#[test]
fn resync_after_a_crash_touches_only_dirty_chunks() {
    for c in [
        cfg(Level::Raid5, 4),
        cfg(Level::Raid1, 2),
        cfg(Level::Raid6, 5),
        cfg(Level::Raid10, 4),
    ] {
        // What is left is the clean chunk's damage alone: a second one as large...
        let left = crash_then_resync(&c, "rc", 0);
        // ...would double it (4 KiB on one member, counted per stripe or block).
        let one = crash_then_resync_clean_only(&c);
        assert_eq!(left, one, "{c:?}: the resync left a dirty chunk's damage");
    }
}

/// The bits a crash left are what the resync owes: the bitmap daemon, running while the
/// resync has not reached them (a large array resyncs for hours, the daemon passes every
/// few seconds), must not clear them as idle (md keeps them NEEDED until the resync).
#[test]
fn the_daemon_keeps_the_bits_a_resync_owes() {
    for c in [
        cfg(Level::Raid5, 4),
        cfg(Level::Raid1, 2),
        cfg(Level::Raid10, 4),
    ] {
        let left = crash_then_resync(&c, "dk", 3);
        let one = crash_then_resync_clean_only(&c);
        assert_eq!(
            left, one,
            "{c:?}: after daemon passes the resync skipped a chunk the crash left dirty"
        );
    }
}

/// A raid1 resync after a crash syncs the dirty bitmap chunk only, not the rest of the
/// 1 MiB piece it lies in: damage in a clean 64 KiB chunk beside it, in the same piece,
/// is still there for a check to find (and a repair to mend).
#[test]
fn a_raid1_resync_leaves_the_clean_chunks_of_a_dirty_piece() {
    let c = cfg(Level::Raid1, 2);
    let (mems, a) = make(&c, "rp");
    let mut model = vec![0u8; a.size_bytes() as usize];
    rng(13).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    a.stop().unwrap();
    let (a, _) = assemble(devs(&mems), &AssembleOptions::default()).unwrap();
    a.write(8192, &model[8192..8192 + 4096]).unwrap();
    std::mem::forget(a); // a crash: the first chunk's bit stays set
    let data_off = 2048 * 512;
    // The next chunk but one: clean, and inside the same 1 MiB piece.
    mems[1]
        .write_at(&[0xEE; 4096], data_off + 2 * BM_CHUNK as u64)
        .unwrap();
    let (b, rep) = assemble(devs(&mems), &AssembleOptions::default()).unwrap();
    assert!(rep.unclean);
    b.resync().unwrap();
    assert_eq!(
        b.check().unwrap(),
        128,
        "the clean chunk's damage was synced over"
    );
    b.repair().unwrap();
    assert_eq!(b.check().unwrap(), 0);
}

/// What a check finds with only the clean chunk's damage (the reference for the above).
fn crash_then_resync_clean_only(c: &Config) -> u64 {
    let (mems, a) = make(c, "co");
    let mut model = vec![0u8; a.size_bytes() as usize];
    rng(11).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    a.stop().unwrap();
    drop(a);
    mems[0]
        .write_at(&[0xEE; 4096], 2048 * 512 + (5 << 19))
        .unwrap();
    let (b, _) = assemble(devs(&mems), &AssembleOptions::default()).unwrap();
    b.check().unwrap()
}

#[test]
fn a_re_added_member_gets_only_the_chunks_written_while_it_was_away() {
    for c in [
        cfg(Level::Raid1, 2),
        cfg(Level::Raid5, 4),
        cfg(Level::Raid6, 5),
    ] {
        let mems = mem_members(&c, "ra");
        let faults: Vec<Arc<FaultMember>> = mems
            .iter()
            .map(|m| Arc::new(FaultMember::new(m.clone() as Arc<dyn Member>)))
            .collect();
        let mut o = create_opts(&c);
        o.bitmap = true;
        o.bitmap_chunk_bytes = Some(BM_CHUNK);
        o.data_offset_sectors = Some(2048);
        let a = uraid_engine::create(
            faults
                .iter()
                .map(|f| Some(f.clone() as Arc<dyn Member>))
                .collect(),
            &o,
        )
        .unwrap();
        let mut r = rng(12);
        let mut model = vec![0u8; a.size_bytes() as usize];
        r.fill(&mut model[..]);
        a.write(0, &model).unwrap();
        a.bitmap_daemon().unwrap();
        a.bitmap_daemon().unwrap();
        assert_eq!(a.bitmap_dirty_chunks().unwrap().0, 0);
        a.fail_member(MemberIdx(1)).unwrap();
        a.remove_member(MemberIdx(1)).unwrap();
        // Writes while it is away; the daemon must not clear bits of a degraded array.
        let off = 100 * 1024;
        r.fill(&mut model[off..off + 8192]);
        a.write(off as u64, &model[off..off + 8192]).unwrap();
        a.bitmap_daemon().unwrap();
        a.bitmap_daemon().unwrap();
        let dirty = a.bitmap_dirty_chunks().unwrap().0;
        assert!(dirty >= 1, "{c:?}: bits cleared while degraded");
        let writes_before = faults[1].writes.load(Ordering::Relaxed);
        assert_eq!(
            a.add_member(faults[1].clone()).unwrap(),
            AddOutcome::Recovering(MemberIdx(1))
        );
        assert!(
            a.slot(MemberIdx(1)).bitmap_recovery(),
            "{c:?}: not a bitmap re-add"
        );
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        assert_eq!(a.slot_state(MemberIdx(1)), SlotState::InSync);
        let data_writes = faults[1].writes.load(Ordering::Relaxed) - writes_before;
        // Superblock/bitmap writes plus the dirty chunks' blocks: far below a full rebuild.
        assert!(
            data_writes < 40,
            "{c:?}: re-add wrote {data_writes} times for {dirty} dirty chunks"
        );
        // The re-added member is right: make reads depend on it.
        for m in 0..c.disks {
            if m != 1 {
                let mut t = a.missing_roles();
                t.push(MemberIdx(m));
                if a.personality().survives(&t) {
                    a.fail_member(MemberIdx(m)).unwrap();
                }
            }
        }
        let mut got = vec![0u8; model.len()];
        a.read(0, &mut got).unwrap();
        assert!(got == model, "{c:?}: re-added member holds stale data");
    }
}

/// /proc/mdstat's "bitmap: used/total pages": 2048 chunks to a page, a page used while
/// a chunk on it is dirty.
#[test]
fn bitmap_pages_count_as_mdstat() {
    let c = Config {
        member_bytes: vec![20 << 20; 2],
        ..cfg(Level::Raid1, 2)
    };
    let mems = mem_members(&c, "bp");
    let mut o = create_opts(&c);
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(4096);
    o.data_offset_sectors = Some(2048);
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    let (_, chunks) = a.bitmap_dirty_chunks().unwrap();
    assert!(chunks > 2 * 2048, "{chunks} chunks");
    let p = a.bitmap_pages().unwrap();
    assert_eq!(p.total, chunks.div_ceil(2048));
    assert_eq!(p.used, 0);
    assert_eq!(p.chunk_sectors, 8);
    a.write(0, &[1u8; 4096]).unwrap();
    a.write(a.size_bytes() - 4096, &[2u8; 4096]).unwrap();
    assert_eq!(a.bitmap_pages().unwrap().used, 2);
}
