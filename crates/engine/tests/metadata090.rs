//! Metadata 0.90 arrays through the engine, on memory members: create for every level,
//! the 0.90 records on the members, reassembly with the same data; failure, add and
//! rebuild written as 0.90 device tables; a member being rebuilt comes back as a spare;
//! what uraid does not do with 0.90 is refused by name before anything is written.

use std::sync::Arc;
use uraid_core::superblock090::{
    sb090_offset_sectors, Superblock090, DISK_ACTIVE, DISK_FAULTY, DISK_REMOVED, DISK_SYNC,
    SB090_BYTES, SB090_STATE_BITMAP_PRESENT,
};
use uraid_core::{Level, MemberIdx};
use uraid_engine::{
    assemble, read_superblock, AssembleOptions, CreateOptions, MemMember, Member, MemberOutcome,
    SyncKind,
};
use uraid_testkit::engine::as_members;

fn mem(name: &str, mib: u64) -> Arc<MemMember> {
    Arc::new(MemMember::new(name, mib << 20))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// Whether every byte of `m` is zero, read in 1 MiB pieces and compared as slices (a byte
/// at a time over a 4 GiB snapshot took over a minute in a debug build).
fn all_zero(m: &MemMember) -> bool {
    let zero = vec![0u8; 1 << 20];
    let mut buf = vec![0u8; 1 << 20];
    let size = m.size_bytes();
    let mut at = 0;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        m.read_at(&mut buf[..n], at).unwrap();
        if buf[..n] != zero[..n] {
            return false;
        }
        at += n as u64;
    }
    true
}

fn place(m: &MemMember) -> u64 {
    sb090_offset_sectors(m.size_bytes() / 512).unwrap() * 512
}

/// The member's 0.90 record, decoded from its bytes.
fn record(m: &MemMember) -> Superblock090 {
    let at = place(m) as usize;
    Superblock090::decode(&m.snapshot()[at..at + SB090_BYTES]).unwrap()
}

fn rewrite(m: &MemMember, rec: &Superblock090) {
    m.write_at(&rec.encode(), place(m)).unwrap();
}

fn opts090(level: Level) -> CreateOptions {
    let mut o = CreateOptions::new(level);
    o.metadata = uraid_engine::Metadata::V0_90;
    o.chunk_sectors = Some(64);
    o
}

fn dyn_members(m: &[Arc<MemMember>]) -> Vec<Arc<dyn Member>> {
    m.iter().map(|d| d.clone() as Arc<dyn Member>).collect()
}

#[test]
fn every_level_writes_0_90_records_and_reassembles_with_its_data() {
    for (level, disks) in [
        (Level::Raid0, 2),
        (Level::Raid1, 2),
        (Level::Raid4, 3),
        (Level::Raid5, 3),
        (Level::Raid6, 4),
        (Level::Raid10, 4),
    ] {
        let devs: Vec<Arc<MemMember>> = (0..disks)
            .map(|i| mem(&format!("{level}-{i}"), 8))
            .collect();
        let a = uraid_engine::create(as_members(&devs), &opts090(level)).unwrap();
        assert_eq!(a.meta().metadata_name(), "0.90", "{level}");
        let data = pattern(a.size_bytes() as usize, disks as u8);
        a.write(0, &data).unwrap();
        a.stop().unwrap();
        for (i, d) in devs.iter().enumerate() {
            let rec = record(d);
            assert!(rec.is_clean(), "{level} member {i}");
            assert_eq!((rec.minor_version, rec.level), (90, level.md_level()));
            assert_eq!(rec.raid_disks as usize, disks);
            assert_eq!(rec.this_disk.number as usize, i);
            assert_eq!(rec.this_disk.raid_disk as usize, i);
            assert_eq!(rec.this_disk.state, DISK_ACTIVE | DISK_SYNC);
            assert_eq!((rec.active_disks, rec.failed_disks), (disks as u32, 0));
            // The v1 search finds no 1.x superblock: the model comes from the 0.90 record.
            let sb = read_superblock(d.as_ref()).unwrap();
            assert_eq!(sb.super_offset * 512, place(d));
            assert_eq!((sb.data_offset, sb.events), (0, rec.events));
        }
        if level == Level::Raid1 {
            // Data from sector 0 on every mirror.
            assert!(devs[1].snapshot()[..data.len()] == data[..]);
        }
        let (b, rep) = assemble(dyn_members(&devs), &AssembleOptions::default()).unwrap();
        assert!(!rep.unclean && !b.is_degraded(), "{level}");
        let mut got = vec![0u8; data.len()];
        b.read(0, &mut got).unwrap();
        assert!(got == data, "{level}: data differs after reassembly");
        if level != Level::Raid0 {
            assert_eq!(b.check().unwrap(), 0, "{level}");
        }
        b.stop().unwrap();
    }
}

#[test]
fn fail_add_and_rebuild_are_written_as_0_90_device_tables() {
    let devs: Vec<Arc<MemMember>> = (0..3).map(|i| mem(&format!("f{i}"), 8)).collect();
    let mut o = opts090(Level::Raid5);
    o.assume_clean = true;
    let a = uraid_engine::create(as_members(&devs), &o).unwrap();
    let data = pattern(a.size_bytes() as usize, 5);
    a.write(0, &data).unwrap();
    a.fail_member(MemberIdx(1)).unwrap();
    let rec = record(&devs[0]);
    assert_eq!(rec.disks[1].state & DISK_FAULTY, DISK_FAULTY);
    assert_eq!((rec.active_disks, rec.failed_disks), (2, 1));
    a.remove_member(MemberIdx(1)).unwrap();
    // A new device, not yet rebuilt: 0.90 has no recovery_offset, so every record says
    // spare for it (md rebuilds such a member from the start).
    let new = mem("new", 9);
    a.add_member(new.clone()).unwrap();
    let mid = record(&devs[0]);
    let n = record(&new).this_disk.number as usize;
    assert_eq!(mid.disks[n].state, 0, "{mid:?}");
    assert_eq!(mid.spare_disks, 1);
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    a.stop().unwrap();
    let done = record(&new);
    assert_eq!(done.this_disk.state, DISK_ACTIVE | DISK_SYNC);
    assert_eq!(done.this_disk.raid_disk, 1);
    assert_eq!((done.active_disks, done.failed_disks), (3, 0));
    assert!(done.is_clean());
    let members = dyn_members(&[devs[0].clone(), new.clone(), devs[2].clone()]);
    let (b, _) = assemble(members, &AssembleOptions::default()).unwrap();
    assert!(!b.is_degraded());
    let mut got = vec![0u8; data.len()];
    b.read(0, &mut got).unwrap();
    assert!(got == data, "data differs after the rebuild");
    assert_eq!(b.check().unwrap(), 0);
}

#[test]
fn a_member_stopped_during_its_rebuild_comes_back_as_a_spare() {
    let devs: Vec<Arc<MemMember>> = (0..2).map(|i| mem(&format!("s{i}"), 8)).collect();
    let a = uraid_engine::create(as_members(&devs), &opts090(Level::Raid1)).unwrap();
    let data = pattern(a.size_bytes() as usize, 8);
    a.write(0, &data).unwrap();
    a.fail_member(MemberIdx(0)).unwrap();
    a.remove_member(MemberIdx(0)).unwrap();
    let new = mem("half", 8);
    a.add_member(new.clone()).unwrap();
    a.stop().unwrap();
    assert_eq!(record(&new).this_disk.state, 0);
    let (b, rep) = assemble(
        dyn_members(&[new.clone(), devs[1].clone()]),
        &AssembleOptions::default(),
    )
    .unwrap();
    assert_eq!(rep.members[0].outcome, MemberOutcome::Spare);
    assert!(b.is_degraded());
    let mut got = vec![0u8; data.len()];
    b.read(0, &mut got).unwrap();
    assert!(got == data);
}

#[test]
fn assembly_refuses_what_it_cannot_honour_in_a_0_90_record_and_writes_nothing() {
    type Edit = fn(&mut Superblock090);
    let cases: [(&str, Edit); 3] = [
        ("big-endian", |r| {
            r.byte_order = uraid_core::superblock090::ByteOrder::Big
        }),
        // A bitmap flag with no bitmap behind it: the bitmap read finds no magic.
        ("internal bitmap", |r| r.state |= SB090_STATE_BITMAP_PRESENT),
        ("not persistent", |r| r.not_persistent = 1),
    ];
    for (what, edit) in cases {
        let devs: Vec<Arc<MemMember>> = (0..2).map(|i| mem(&format!("b{i}"), 4)).collect();
        let a = uraid_engine::create(as_members(&devs), &opts090(Level::Raid1)).unwrap();
        a.stop().unwrap();
        for d in &devs {
            let mut rec = record(d);
            edit(&mut rec);
            rewrite(d, &rec);
        }
        let before: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
        let err = match assemble(dyn_members(&devs), &AssembleOptions::default()) {
            Ok(_) => panic!("{what}: assembled"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(what), "{what}: {err}");
        let after: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
        assert!(before == after, "{what}: a member was written");
    }
}

#[test]
fn create_refuses_what_0_90_cannot_hold_before_writing() {
    let wide: Vec<Arc<MemMember>> = (0..28).map(|i| mem(&format!("w{i}"), 1)).collect();
    let e = uraid_engine::create(as_members(&wide), &opts090(Level::Raid5))
        .err()
        .expect("28 devices refused")
        .to_string();
    assert!(e.contains("at most 27 devices"), "{e}");
    assert!(wide.iter().all(|d| all_zero(d)));
    // A bitmap chunk so small that its bits need more than the 60 KiB after the superblock.
    let two: Vec<Arc<MemMember>> = (0..2).map(|i| mem(&format!("t{i}"), 4096)).collect();
    let mut o = opts090(Level::Raid1);
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(4096);
    let e = uraid_engine::create(as_members(&two), &o)
        .err()
        .expect("bitmap too large refused")
        .to_string();
    assert!(
        e.contains("0.90 internal bitmap holds at most 60 KiB"),
        "{e}"
    );
    assert!(two.iter().all(|d| all_zero(d)));
}

/// The internal bitmap superblock of a 0.90 member: 4 KiB after its superblock.
fn bitmap_super(m: &MemMember) -> uraid_core::bitmap::BitmapSuper {
    let at = place(m) as usize + SB090_BYTES;
    uraid_core::bitmap::BitmapSuper::decode(&m.snapshot()[at..at + 256]).unwrap()
}

#[test]
fn a_0_90_internal_bitmap_sits_after_the_superblock_and_drives_the_resync_after_a_crash() {
    const BM_CHUNK: u32 = 64 * 1024;
    let devs: Vec<Arc<MemMember>> = (0..2).map(|i| mem(&format!("bm{i}"), 4)).collect();
    let mut o = opts090(Level::Raid1);
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(BM_CHUNK);
    let a = uraid_engine::create(as_members(&devs), &o).unwrap();
    let model = pattern(a.size_bytes() as usize, 3);
    a.write(0, &model).unwrap();
    a.stop().unwrap();
    for d in &devs {
        let rec = record(d);
        assert!(rec.state & SB090_STATE_BITMAP_PRESENT != 0, "{rec:?}");
        let bms = bitmap_super(d);
        // md copies the set_uuid words as they lie in memory: little-endian words.
        let mut uuid = [0u8; 16];
        for (k, w) in rec.set_uuid.iter().enumerate() {
            uuid[4 * k..4 * k + 4].copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(bms.uuid, uuid);
        assert_eq!(bms.chunksize, BM_CHUNK);
        assert_eq!(bms.sync_size, rec.size_sectors());
        assert_eq!(bms.events, rec.events);
    }
    // A write, then a crash: its chunk is dirty.
    a.write(8192, &model[8192..8192 + 4096]).unwrap();
    assert!(a.bitmap_dirty_chunks().unwrap().0 > 0);
    std::mem::forget(a);
    // Damage the second mirror (resync and repair copy from the first) in the dirty chunk
    // and in a clean one (0.90 data starts at sector 0).
    devs[1].write_at(&[0xEE; 4096], 8192).unwrap();
    devs[1].write_at(&[0xEE; 4096], 2 << 20).unwrap();
    let (b, rep) = assemble(dyn_members(&devs), &AssembleOptions::default()).unwrap();
    assert!(rep.unclean, "crash not detected");
    assert!(
        b.bitmap_dirty_chunks().unwrap().0 > 0,
        "bitmap not read back"
    );
    b.resync().unwrap();
    // The resync followed the bitmap: the clean chunk's damage is still there.
    assert!(b.check().unwrap() > 0, "resync touched a clean chunk");
    b.repair().unwrap();
    assert_eq!(b.check().unwrap(), 0);
    b.stop().unwrap();
    drop(b);
    let (b, rep) = assemble(dyn_members(&devs), &AssembleOptions::default()).unwrap();
    assert!(!rep.unclean);
    let mut got = vec![0u8; model.len()];
    b.read(0, &mut got).unwrap();
    assert!(got == model, "data differs after the bitmap resync");
}

#[test]
fn the_0_90_table_is_renumbered_as_md_does_after_fail_remove_add_and_rebuild() {
    let devs: Vec<Arc<MemMember>> = (0..3).map(|i| mem(&format!("r{i}"), 8)).collect();
    let mut o = opts090(Level::Raid5);
    o.assume_clean = true;
    let a = uraid_engine::create(as_members(&devs), &o).unwrap();
    a.fail_member(MemberIdx(1)).unwrap();
    // The faulty device, still present, leaves its role's entry (removed, faulty) for
    // the first entry after the roles.
    let rec = record(&devs[0]);
    assert_eq!(rec.disks[1].state, DISK_REMOVED | DISK_FAULTY, "{rec:?}");
    assert_eq!(
        (
            rec.disks[3].number,
            rec.disks[3].raid_disk,
            rec.disks[3].state
        ),
        (3, 3, DISK_FAULTY),
        "{rec:?}"
    );
    assert_eq!(rec.nr_disks, 3);
    a.remove_member(MemberIdx(1)).unwrap();
    let rec = record(&devs[0]);
    assert_eq!(rec.disks[3], Default::default(), "{rec:?}");
    assert_eq!(rec.nr_disks, 2);
    // A new device: a spare in entry 3 while it is rebuilt ...
    let new = mem("r-new", 8);
    a.add_member(new.clone()).unwrap();
    let rec = record(&new);
    assert_eq!(rec.this_disk.number, 3, "{rec:?}");
    assert_eq!(rec.this_disk.state, 0);
    // ... and in its role's entry once in sync, in every member's record.
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    a.stop().unwrap();
    for (i, d) in [&devs[0], &new, &devs[2]].into_iter().enumerate() {
        let rec = record(d);
        assert_eq!(rec.this_disk.number as usize, i, "{rec:?}");
        for r in 0..3 {
            let e = rec.disks[r];
            assert_eq!((e.number, e.raid_disk), (r as u32, r as u32), "{rec:?}");
            assert_eq!(e.state, DISK_ACTIVE | DISK_SYNC, "{rec:?}");
        }
        assert_eq!(rec.disks[3], Default::default(), "{rec:?}");
        assert_eq!(
            (rec.nr_disks, rec.active_disks, rec.failed_disks),
            (3, 3, 0)
        );
    }
    let members = dyn_members(&[devs[0].clone(), new.clone(), devs[2].clone()]);
    let (b, rep) = assemble(members, &AssembleOptions::default()).unwrap();
    assert!(!b.is_degraded(), "{rep:?}");
    assert_eq!(b.check().unwrap(), 0);
}
