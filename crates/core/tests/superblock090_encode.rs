//! The md 0.90 encoder: the inverse of the decoder (bytes and records, both byte orders),
//! the v1 model it is kept in by the engine and back, md's device table and counts, and
//! what 0.90 cannot record refused by name.

use proptest::prelude::*;
use uraid_core::superblock::{
    CreateSpec, MetadataVersion, FEATURE_BAD_BLOCKS, FEATURE_RECOVERY_OFFSET, MAX_SECTOR,
    ROLE_FAULTY, ROLE_SPARE,
};
use uraid_core::superblock090::*;

mod common;
use common::{Record090, DEVICE_SECTORS};

/// The sample: a clean 3-disk raid5 as Linux md writes it (recovery_cp MaxSector cut to
/// 32 bits, cp_events = events), member 1, in the given byte order.
fn record(order: ByteOrder) -> Vec<u8> {
    Record090::raid5(order).bytes()
}

#[test]
fn encode_gives_back_the_bytes_md_wrote_in_either_byte_order() {
    for order in [ByteOrder::Little, ByteOrder::Big] {
        let bytes = record(order);
        let sb = Superblock090::decode(&bytes).unwrap();
        assert_eq!(sb.byte_order, order);
        assert!(sb.encode() == bytes, "{order:?}: bytes differ");
    }
}

#[test]
fn the_v1_model_round_trips_to_the_same_record() {
    let rec = Superblock090::decode(&record(ByteOrder::Little)).unwrap();
    let v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
    assert_eq!(
        v1.super_offset,
        sb090_offset_sectors(DEVICE_SECTORS).unwrap()
    );
    assert_eq!((v1.data_offset, v1.data_size), (0, v1.super_offset));
    assert_eq!(v1.size, 130_944);
    assert_eq!(v1.dev_number, 1);
    assert_eq!(&v1.dev_roles[..4], &[0, 1, 2, ROLE_SPARE]);
    assert_eq!(v1.dev_roles.len(), SB090_DISKS);
    assert!(v1.is_clean());
    assert_eq!(v1.events, 0x1_0000_0002);
    assert_eq!(v1.chunksize, 128);
    // The uuid prints as mdadm prints the 0.90 one.
    assert_eq!(
        uraid_core::superblock::uuid_string(&v1.set_uuid),
        rec.uuid_string()
    );
    let mut cx = Sb090Context::from_record(&rec);
    cx.present = vec![0, 1, 2];
    let back = Superblock090::from_v1(&v1, &cx).unwrap();
    assert_eq!(
        Superblock090 {
            sb_csum: rec.sb_csum,
            ..back.clone()
        },
        rec
    );
    assert!(back.encode() == record(ByteOrder::Little));
}

#[test]
fn dirty_and_part_resynced_states_round_trip() {
    let rec = Superblock090::decode(&record(ByteOrder::Little)).unwrap();
    let mut v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
    let cx = Sb090Context {
        present: vec![0, 1, 2],
        ..Default::default()
    };
    for resync_offset in [0, 4096, MAX_SECTOR] {
        v1.resync_offset = resync_offset;
        let out = Superblock090::from_v1(&v1, &cx).unwrap();
        assert_eq!(out.is_clean(), resync_offset == MAX_SECTOR);
        let again = Superblock090::decode(&out.encode()).unwrap();
        assert_eq!(
            again.to_v1(DEVICE_SECTORS).unwrap().resync_offset,
            resync_offset
        );
    }
}

#[test]
fn the_device_table_is_md_s_for_a_degraded_array_with_a_rebuild_and_a_spare() {
    let rec = Superblock090::decode(&record(ByteOrder::Little)).unwrap();
    let mut v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
    // Role 2's device is gone (assembly records it as 0xffff); device 3 rebuilds role 1,
    // device 4 is a spare; this is device 3's superblock.
    v1.dev_roles[1] = ROLE_FAULTY;
    v1.dev_roles[2] = ROLE_SPARE;
    v1.dev_roles[3] = 1;
    v1.dev_number = 3;
    v1.feature_map |= FEATURE_RECOVERY_OFFSET;
    let cx = Sb090Context {
        present: vec![0, 1, 3, 4],
        rebuilding: vec![3],
        ..Default::default()
    };
    let out = Superblock090::from_v1(&v1, &cx).unwrap();
    let d = |n: usize| {
        (
            out.disks[n].number,
            out.disks[n].raid_disk,
            out.disks[n].state,
        )
    };
    // md renumbers at every write: in-sync devices in their role's entry, the others
    // (faulty device 1, rebuilding device 3, spare 4) from raid_disks (3) on.
    assert_eq!(d(0), (0, 0, DISK_ACTIVE | DISK_SYNC));
    assert_eq!(d(1), (1, 1, DISK_REMOVED | DISK_FAULTY));
    assert_eq!(d(2), (2, 2, DISK_REMOVED | DISK_FAULTY));
    assert_eq!(d(3), (3, 3, DISK_FAULTY));
    // Being rebuilt: a spare (0.90 has no recovery_offset; md rebuilds it from the start).
    assert_eq!(d(4), (4, 4, 0));
    assert_eq!(d(5), (5, 5, 0));
    assert_eq!(out.disks[6], Disk090::default());
    assert_eq!(out.this_disk, out.disks[4]);
    assert_eq!(
        (
            out.nr_disks,
            out.active_disks,
            out.working_disks,
            out.failed_disks,
            out.spare_disks
        ),
        (4, 1, 3, 2, 2)
    );
    // Read back, the rebuilding device is a spare and the roles no device holds are free.
    let back = Superblock090::decode(&out.encode())
        .unwrap()
        .to_v1(DEVICE_SECTORS)
        .unwrap();
    assert_eq!(
        &back.dev_roles[..6],
        &[
            0,
            ROLE_FAULTY,
            ROLE_FAULTY,
            ROLE_FAULTY,
            ROLE_SPARE,
            ROLE_SPARE
        ]
    );
    assert_eq!(back.dev_number, 4);
}

#[test]
fn what_0_90_cannot_record_is_refused_by_name() {
    let rec = Superblock090::decode(&record(ByteOrder::Little)).unwrap();
    let v1 = rec.to_v1(DEVICE_SECTORS).unwrap();
    let cx = Sb090Context::default();
    let field = |sb: &uraid_core::superblock::Superblock| match Superblock090::from_v1(sb, &cx) {
        Err(Sb090Error::Invalid { field, .. }) => field,
        other => panic!("not refused: {other:?}"),
    };
    let mut bb = v1.clone();
    bb.feature_map |= FEATURE_BAD_BLOCKS;
    assert_eq!(field(&bb), "feature_map");
    let mut far = v1.clone();
    far.dev_number = 27;
    assert_eq!(field(&far), "raid_disks");
    let mut big = v1.clone();
    big.size = 1 << 33;
    big.data_size = 1 << 34;
    assert_eq!(field(&big), "size");
    let mut moved = v1.clone();
    moved.data_offset = 2048;
    assert_eq!(field(&moved), "data_offset");
}

#[test]
fn a_created_member_reads_back_as_the_model_it_was_written_from() {
    let spec = CreateSpec {
        set_uuid: [7; 16],
        set_name: "ignored:name".into(),
        ctime_secs: 1_750_000_000,
        level: 5,
        layout: 2,
        chunk_sectors: 128,
        raid_disks: 3,
        spares: 0,
        missing: vec![2],
        size_sectors: 130_944,
        data_offset_sectors: 0,
        internal_bitmap: None,
        bad_block_log: true,
        clean: false,
        version: MetadataVersion::V1_2,
    };
    let sb = new_v1_for_create(&spec, 1, DEVICE_SECTORS).unwrap();
    assert_eq!(sb.super_offset, 130_944);
    assert_eq!(&sb.dev_roles[..3], &[0, 1, ROLE_FAULTY]);
    let cx = Sb090Context {
        present: vec![0, 1],
        ..Default::default()
    };
    let rec = Superblock090::from_v1(&sb, &cx).unwrap();
    assert_eq!(rec.disks[2].state, DISK_REMOVED | DISK_FAULTY);
    assert_eq!((rec.active_disks, rec.failed_disks), (2, 1));
    let back = Superblock090::decode(&rec.encode())
        .unwrap()
        .to_v1(DEVICE_SECTORS)
        .unwrap();
    assert_eq!(
        uraid_core::superblock::Superblock { sb_csum: 0, ..back },
        sb
    );
    // Limits: 27 devices; a bitmap only at its 0.90 place, within the 60 KiB after the
    // superblock.
    let mut wide = spec.clone();
    wide.raid_disks = 28;
    wide.missing.clear();
    assert!(new_v1_for_create(&wide, 0, DEVICE_SECTORS).is_err());
    let mut bm = spec.clone();
    bm.internal_bitmap = Some((8, 120));
    let with = new_v1_for_create(&bm, 0, DEVICE_SECTORS).unwrap();
    assert_eq!(with.bitmap_sector(), Some(with.super_offset + 8));
    let rec = Superblock090::from_v1(&with, &cx).unwrap();
    assert!(rec.state & uraid_core::superblock090::SB090_STATE_BITMAP_PRESENT != 0);
    let back = Superblock090::decode(&rec.encode())
        .unwrap()
        .to_v1(DEVICE_SECTORS)
        .unwrap();
    assert_eq!(back.bitmap_sector(), with.bitmap_sector());
    for wrong in [(8, 121), (-16, 8), (16, 8)] {
        bm.internal_bitmap = Some(wrong);
        let e = new_v1_for_create(&bm, 0, DEVICE_SECTORS).unwrap_err();
        assert!(
            e.to_string().contains("0.90 internal bitmap"),
            "{wrong:?}: {e}"
        );
    }
    // The bitmap's uuid: the set_uuid words as a little-endian writer holds them.
    let u: [u8; 16] = std::array::from_fn(|i| i as u8);
    let b = uraid_core::superblock090::bitmap_uuid090(&u);
    assert_eq!(&b[..8], &[3, 2, 1, 0, 7, 6, 5, 4]);
}

fn arb_disk() -> impl Strategy<Value = Disk090> {
    (
        0u32..27,
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(number, major, minor, raid_disk, state)| Disk090 {
            number,
            major,
            minor,
            raid_disk,
            state,
        })
}

fn arb_record() -> impl Strategy<Value = Superblock090> {
    let head = (
        prop_oneof![Just(ByteOrder::Little), Just(ByteOrder::Big)],
        90u32..=91,
        any::<[u32; 4]>(),
        any::<(u32, i32, u32, u32, u32, u32)>(),
        0u32..=27,
        0u32..=27,
    );
    let counts = (any::<[u32; 6]>(), any::<[u64; 3]>(), any::<[u32; 3]>());
    let table = (
        proptest::collection::vec(arb_disk(), 27),
        arb_disk(),
        any::<(i32, i32)>(),
    );
    (head, counts, table).prop_map(|(h, c, t)| {
        let (byte_order, minor, uuid, (ctime, level, size, md_minor, utime, state), rd, nd) = h;
        let (
            [patch, active, working, failed, spare, np],
            [events, cp_events, reshape],
            [rcp, layout, chunk],
        ) = c;
        let (disks, this_disk, (new_level, delta)) = t;
        Superblock090 {
            byte_order,
            major_version: 0,
            minor_version: minor,
            patch_version: patch,
            set_uuid: uuid,
            ctime,
            level,
            size_kib: size,
            nr_disks: nd,
            raid_disks: rd,
            md_minor,
            not_persistent: np,
            utime,
            state,
            active_disks: active,
            working_disks: working,
            failed_disks: failed,
            spare_disks: spare,
            sb_csum: 0,
            events,
            cp_events,
            recovery_cp: rcp,
            reshape_position: reshape,
            new_level,
            delta_disks: delta,
            new_layout: layout ^ 1,
            new_chunk: chunk ^ 1,
            layout,
            chunk_size: chunk,
            disks: disks.try_into().expect("27"),
            this_disk,
        }
    })
}

proptest! {
    #[test]
    fn decode_of_encode_is_the_record(rec in arb_record()) {
        let bytes = rec.encode();
        let back = Superblock090::decode(&bytes).unwrap();
        prop_assert_eq!(back.sb_csum, checksum090(&bytes, rec.byte_order));
        prop_assert_eq!(Superblock090 { sb_csum: 0, ..back }, rec);
    }
}
