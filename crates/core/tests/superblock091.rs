//! md's 0.91 record (a 0.90 array mid-reshape) against hand-written words (md_p.h's
//! `mdp_super_t`: reshape_position in words 44-45, new_level 46, delta_disks 47, new_layout
//! 48, new_chunk 49 in bytes): decoded, carried into the v1 model as a reshape in place
//! (FEATURE_RESHAPE_ACTIVE, no new_offset), written back byte for byte; the finish as
//! minor 90 with the fields zero; what 0.90 cannot say refused by name; and md's rule on
//! which in-place reshapes the members alone describe.

use uraid_core::geometry::reshape::{finish_superblock, ReshapeState};
use uraid_core::superblock::{
    FEATURE_NEW_OFFSET, FEATURE_RESHAPE_ACTIVE, FEATURE_RESHAPE_BACKWARDS, MAX_SECTOR,
};
use uraid_core::superblock090::*;

mod common;
use common::{put, seal, Record090, Reshape091, DEVICE_SECTORS};

/// A raid5 md is growing from 3 to 4 devices (left-symmetric, 64 KiB chunks), stopped at
/// array sector `position`, member 1, as a little-endian md writes it: minor 91,
/// raid_disks the new count, events 21, new level 5, new layout left-symmetric, new
/// chunk 64 KiB.
fn record(position: u64, delta: i32, raid_disks: u32) -> Vec<u8> {
    Record090 {
        minor_version: 91,
        raid_disks,
        md_minor: 3,
        events: 21,
        reshape: Some(Reshape091 {
            position,
            new_level: 5,
            delta_disks: delta,
            new_layout: 2,
            new_chunk: 65_536,
        }),
        ..Record090::raid5(ByteOrder::Little)
    }
    .bytes()
}

#[test]
fn a_0_91_record_decodes_its_reshape_words() {
    let rec = Superblock090::decode(&record(0x1_0000_1800, 1, 4)).unwrap();
    assert_eq!((rec.major_version, rec.minor_version), (0, 91));
    assert_eq!(rec.reshape_position, 0x1_0000_1800);
    assert_eq!((rec.new_level, rec.delta_disks), (5, 1));
    assert_eq!((rec.new_layout, rec.new_chunk), (2, 65_536));
    assert_eq!(rec.raid_disks, 4);
    let shrink = Superblock090::decode(&record(0x1800, -1, 3)).unwrap();
    assert_eq!(shrink.delta_disks, -1, "delta_disks is signed");
}

#[test]
fn a_0_91_grow_is_a_reshape_in_place_in_the_v1_model_and_written_back_byte_for_byte() {
    let bytes = record(0x1800, 1, 4);
    let rec = Superblock090::decode(&bytes).unwrap();
    let v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
    assert_eq!(
        v1.feature_map & (FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET | FEATURE_RESHAPE_BACKWARDS),
        FEATURE_RESHAPE_ACTIVE
    );
    assert_eq!(v1.reshape_position, 0x1800);
    assert_eq!((v1.new_level, v1.delta_disks, v1.raid_disks), (5, 1, 4));
    assert_eq!(
        (v1.new_layout, v1.new_chunk),
        (2, 128),
        "new_chunk in sectors"
    );
    assert_eq!((v1.new_offset, v1.data_offset), (0, 0));
    assert_eq!(&v1.dev_roles[..4], &[0, 1, 2, 3]);
    // Past the critical section: the new stripes at 0x1800 are rows below the old ones.
    let st = ReshapeState::from_superblock(&v1)
        .unwrap()
        .expect("a reshape");
    assert_eq!((st.old.raid_disks, st.new.raid_disks), (3, 4));
    assert_eq!((st.new_offset_sectors, st.backwards), (0, false));
    assert_eq!(uraid_core::support::check090(&rec), Ok(()));
    assert_eq!(uraid_core::support::check(&v1), Ok(()));
    // Back to the same bytes (a checkpoint writes this record with its new position).
    let cx = Sb090Context {
        present: vec![0, 1, 2, 3],
        ..Sb090Context::from_record(&rec)
    };
    let back = Superblock090::from_v1(&v1, &cx).unwrap();
    assert!(back.encode() == bytes, "0.91 bytes differ");
    let mut moved = v1.clone();
    moved.reshape_position = 0x1_0000_1800;
    moved.events = 22;
    let rec2 =
        Superblock090::decode(&Superblock090::from_v1(&moved, &cx).unwrap().encode()).unwrap();
    assert_eq!(
        (rec2.minor_version, rec2.reshape_position, rec2.events),
        (91, 0x1_0000_1800, 22)
    );
}

#[test]
fn the_finished_grow_is_written_as_minor_90_with_the_reshape_fields_zero() {
    let rec = Superblock090::decode(&record(0x1800, 1, 4)).unwrap();
    let mut v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
    let st = ReshapeState::from_superblock(&v1).unwrap().unwrap();
    finish_superblock(&mut v1, &st.new, st.dev_sectors(), 0);
    v1.events = 23;
    let cx = Sb090Context {
        present: vec![0, 1, 2, 3],
        ..Sb090Context::from_record(&rec)
    };
    let done = Superblock090::from_v1(&v1, &cx).unwrap();
    assert_eq!(done.minor_version, 90);
    assert_eq!(
        (
            done.reshape_position,
            done.new_level,
            done.delta_disks,
            done.new_layout,
            done.new_chunk
        ),
        (0, 0, 0, 0, 0)
    );
    assert_eq!(
        (done.raid_disks, done.active_disks, done.nr_disks),
        (4, 4, 4)
    );
    assert_eq!((done.layout, done.chunk_size, done.events), (2, 65_536, 23));
    assert!(done.is_clean());
    // md zeroes them in a 0.90 record and reads them only in a 0.91 one.
    let mut stale = done.clone();
    stale.new_level = 6;
    stale.reshape_position = 77;
    let v = Superblock090::decode(&stale.encode())
        .unwrap()
        .to_v1(DEVICE_SECTORS)
        .unwrap();
    assert_eq!(
        (
            v.feature_map & FEATURE_RESHAPE_ACTIVE,
            v.reshape_position,
            v.new_level
        ),
        (0, 0, 0)
    );
    assert_eq!(v.resync_offset, MAX_SECTOR);
    // A 0.91 whose position is MaxSector records no reshape (md's and mdadm's test).
    let mut none = Superblock090::decode(&record(0x1800, 1, 4)).unwrap();
    none.reshape_position = u64::MAX;
    let v = none.to_v1(DEVICE_SECTORS).unwrap();
    assert_eq!(v.feature_map & FEATURE_RESHAPE_ACTIVE, 0);
}

#[test]
fn what_a_0_91_record_cannot_say_is_refused_by_name() {
    let rec = Superblock090::decode(&record(0x1800, 1, 4)).unwrap();
    let v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
    let cx = Sb090Context {
        present: vec![0, 1, 2, 3],
        ..Sb090Context::default()
    };
    let field = |sb: &uraid_core::superblock::Superblock| match Superblock090::from_v1(sb, &cx) {
        Err(Sb090Error::Invalid { field, why }) => (field, why),
        other => panic!("not refused: {other:?}"),
    };
    let mut moving = v1.clone();
    moving.feature_map |= FEATURE_NEW_OFFSET;
    moving.new_offset = -2048i32;
    let (f, why) = field(&moving);
    assert_eq!(f, "new_offset");
    assert!(why.contains("-2048"), "{why}");
    let mut back = v1.clone();
    back.feature_map |= FEATURE_RESHAPE_BACKWARDS;
    assert_eq!(
        field(&back).0,
        "feature_map",
        "backwards without removing devices"
    );
}

#[test]
fn md_s_in_place_rules_decide_what_the_members_alone_describe() {
    let check = |bytes: Vec<u8>| {
        let rec = Superblock090::decode(&bytes).unwrap();
        let v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
        uraid_core::support::check(&v1).map_err(|e| e.to_string())
    };
    // The first stripes of a grow: new rows over old rows still to be read, in the
    // backup file only.
    let e = check(record(3 * 128, 1, 4)).unwrap_err();
    assert!(
        e.contains("critical section") && e.contains("--backup-file"),
        "{e}"
    );
    // A shrink (md runs it backwards: delta_disks < 0) is in the backup file the whole way.
    let rec = Superblock090::decode(&record(0x1800, -1, 3)).unwrap();
    let v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
    assert_ne!(v1.feature_map & FEATURE_RESHAPE_BACKWARDS, 0);
    let e = uraid_core::support::check(&v1).unwrap_err().to_string();
    assert!(
        e.contains("a shrink in place") && e.contains("--backup-file"),
        "{e}"
    );
    // And so is a same-size restripe (a chunk change).
    let mut chunk = record(0x1800, 0, 3);
    put(&mut chunk, 49, 131_072, ByteOrder::Little);
    seal(&mut chunk, ByteOrder::Little);
    let e = check(chunk).unwrap_err();
    assert!(
        e.contains("same-size restripe") && e.contains("--backup-file"),
        "{e}"
    );
    assert_eq!(check(record(0x1800, 1, 4)), Ok(()));
}
