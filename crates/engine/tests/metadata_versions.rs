//! Metadata 1.0 and 1.1 arrays through the engine: create, reassemble, and a member added
//! to a 1.0 array gets its superblock at the end of its own device (which may be larger).

use std::sync::Arc;
use uraid_core::superblock::MetadataVersion;
use uraid_core::{Level, MemberIdx};
use uraid_engine::read_superblock;
use uraid_engine::{assemble, AssembleOptions, CreateOptions, MemMember, Member, SyncKind};
use uraid_testkit::engine::as_members;

fn mem(name: &str, mib: u64) -> Arc<MemMember> {
    Arc::new(MemMember::new(name, mib << 20))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_member_added_to_a_10_array_keeps_its_superblock_at_its_own_end() {
    for bitmap in [false, true] {
        let devs: Vec<Arc<MemMember>> = (0..3).map(|i| mem(&format!("m{i}"), 8)).collect();
        let mut opts = CreateOptions::new(Level::Raid5);
        opts.metadata = MetadataVersion::V1_0.into();
        opts.chunk_sectors = Some(16);
        opts.bitmap = bitmap;
        opts.assume_clean = true;
        let a = uraid_engine::create(as_members(&devs), &opts).unwrap();
        let data = pattern(a.size_bytes() as usize, 3);
        a.write(0, &data).unwrap();
        a.fail_member(MemberIdx(1)).unwrap();
        a.remove_member(MemberIdx(1)).unwrap();
        // A larger replacement disk: its superblock goes to its own end.
        let new = mem("new", 9);
        a.add_member(new.clone()).unwrap();
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        a.stop().unwrap();
        let sb = read_superblock(new.as_ref()).unwrap();
        let sectors = new.size_bytes() / 512;
        assert_eq!(
            sb.super_offset,
            MetadataVersion::V1_0.super_offset_sectors(sectors).unwrap()
        );
        assert_eq!(sb.data_offset, 0);
        let old = read_superblock(devs[0].as_ref()).unwrap();
        // Same reserve below the superblock as the array's other members.
        assert_eq!(
            sb.super_offset - sb.data_size,
            old.super_offset - old.data_size,
            "bitmap={bitmap}"
        );
        let members: Vec<Arc<dyn Member>> = vec![devs[0].clone(), new.clone(), devs[2].clone()];
        let (b, _) = assemble(members, &AssembleOptions::default()).unwrap();
        assert!(!b.is_degraded());
        let mut got = vec![0u8; data.len()];
        b.read(0, &mut got).unwrap();
        assert!(
            got == data,
            "bitmap={bitmap}: data differs after the rebuild"
        );
        assert_eq!(b.check().unwrap(), 0, "bitmap={bitmap}");
    }
}

#[test]
fn a_11_array_reassembles_with_its_data_after_the_superblock() {
    let devs: Vec<Arc<MemMember>> = (0..2).map(|i| mem(&format!("r{i}"), 8)).collect();
    let mut opts = CreateOptions::new(Level::Raid1);
    opts.metadata = MetadataVersion::V1_1.into();
    opts.bitmap = true;
    let a = uraid_engine::create(as_members(&devs), &opts).unwrap();
    let data = pattern(a.size_bytes() as usize, 9);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    let sb = read_superblock(devs[0].as_ref()).unwrap();
    assert_eq!((sb.super_offset, sb.version()), (0, MetadataVersion::V1_1));
    assert_eq!(sb.bitmap_sector(), Some(8));
    let raw = devs[1].snapshot();
    let at = sb.data_offset as usize * 512;
    assert!(
        raw[at..at + data.len()] == data[..],
        "mirror data not at data_offset"
    );
    let members: Vec<Arc<dyn Member>> = devs.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
    let (b, _) = assemble(members, &AssembleOptions::default()).unwrap();
    let mut got = vec![0u8; data.len()];
    b.read(0, &mut got).unwrap();
    assert!(got == data);
}
