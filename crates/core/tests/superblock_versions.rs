//! Metadata 1.0 / 1.1 / 1.2: where the superblock lives, and mdadm's placement of the data,
//! bitmap and bad block log around it at create (mdadm 4.x `write_init_super1` and
//! `validate_geometry1`; md's `super_1_load` for the superblock's sector).

use uraid_core::superblock::*;

#[test]
fn superblock_sector_per_version() {
    use MetadataVersion::*;
    // 1.0: 8 KiB before the end, rounded down to a 4 KiB boundary.
    assert_eq!(V1_0.super_offset_sectors(131_072), Some(131_056));
    assert_eq!(V1_0.super_offset_sectors(131_079), Some(131_056));
    assert_eq!(V1_0.super_offset_sectors(131_080), Some(131_064));
    assert_eq!(V1_0.super_offset_sectors(24), Some(8));
    assert_eq!(V1_0.super_offset_sectors(15), None);
    assert_eq!(V1_1.super_offset_sectors(131_072), Some(0));
    assert_eq!(
        V1_1.super_offset_sectors(7),
        None,
        "no room for the 4 KiB block"
    );
    assert_eq!(V1_2.super_offset_sectors(131_072), Some(8));
    assert_eq!(V1_2.super_offset_sectors(15), None);
    for v in MetadataVersion::ALL {
        let at = v.super_offset_sectors(1 << 20).unwrap();
        assert_eq!(MetadataVersion::of_super_offset(at, 1 << 20), Some(v));
        assert_eq!(MetadataVersion::parse(v.name()), Some(v));
    }
    // A 1.0 superblock of a device that has grown is no version's place any more.
    assert_eq!(MetadataVersion::of_super_offset(131_056, 262_144), None);
    assert_eq!(MetadataVersion::parse("1"), Some(V1_2));
    assert_eq!(MetadataVersion::parse("0.90"), None);
}

#[test]
fn superblock_version_from_super_offset() {
    let mut sb = new_sb(MetadataVersion::V1_2, 131_072, None);
    assert_eq!(sb.version(), MetadataVersion::V1_2);
    sb.super_offset = 0;
    assert_eq!(sb.version(), MetadataVersion::V1_1);
    sb.super_offset = 131_056;
    assert_eq!(sb.version(), MetadataVersion::V1_0);
}

fn spec(version: MetadataVersion, data_offset: u64, bitmap: Option<(i32, u64)>) -> CreateSpec {
    CreateSpec {
        set_uuid: [0x5a; 16],
        set_name: "host:vers".into(),
        ctime_secs: 1_700_000_000,
        level: 1,
        layout: 0,
        chunk_sectors: 0,
        raid_disks: 2,
        spares: 0,
        missing: vec![],
        size_sectors: 130_944,
        data_offset_sectors: data_offset,
        internal_bitmap: bitmap,
        bad_block_log: true,
        clean: true,
        version,
    }
}

fn new_sb(v: MetadataVersion, sectors: u64, bitmap: Option<(i32, u64)>) -> Superblock {
    let data_offset = if v.at_end() { 0 } else { 2048 };
    let mut s = spec(v, data_offset, bitmap);
    if !v.at_end() {
        s.size_sectors = 128_000;
    }
    Superblock::new_for_create(&s, 0, [1; 16], sectors).unwrap()
}

#[test]
fn v10_create_places_everything_below_the_superblock() {
    // 64 MiB device: 4 KiB default bitmap reserve, so the component gets
    // (131072 & !7) - 16 - 8 - 8 = 131040 sectors, 130944 after raid1's 64 KiB rounding.
    assert_eq!(v10_avail_sectors(131_072), 131_040);
    assert_eq!(v10_avail_sectors(131_079), 131_040);
    let sb = new_sb(MetadataVersion::V1_0, 131_072, None);
    assert_eq!(sb.super_offset, 131_056);
    assert_eq!(sb.data_offset, 0);
    // Reserve below the superblock: the default bitmap space (8) + the log (8).
    assert_eq!(sb.data_size, 131_056 - 16);
    assert_eq!((sb.bblog_offset, sb.bblog_size), (-8, 8));
    assert_eq!(sb.bblog_sector(), Some((131_048, 8)));
    assert_eq!(sb.feature_map, 0);
    assert!(uraid_core::support::check(&sb).is_ok());
    let back = Superblock::decode(&sb.encode()).unwrap();
    assert_eq!(back.super_offset, 131_056);

    // With a 2-block bitmap: it ends where the log begins, the data ends where it begins.
    assert_eq!(v10_bitmap_offset(16), Some(-24));
    let sb = new_sb(MetadataVersion::V1_0, 131_072, Some((-24, 16)));
    assert_eq!(sb.feature_map, FEATURE_BITMAP_OFFSET);
    assert_eq!(sb.bitmap_sector(), Some(131_056 - 24));
    assert_eq!(sb.data_size, 131_056 - 24);
    assert_eq!(sb.bblog_sector(), Some((131_048, 8)));

    // A component that leaves less than the reserve: md shrinks the reserve, and drops
    // the log below 8 sectors.
    let tight = CreateSpec {
        size_sectors: 131_056 - 10,
        ..spec(MetadataVersion::V1_0, 0, None)
    };
    let sb = Superblock::new_for_create(&tight, 0, [1; 16], 131_072).unwrap();
    assert_eq!(sb.data_size, 131_046);
    assert_eq!((sb.bblog_offset, sb.bblog_size), (-8, 8));
    let tighter = CreateSpec {
        size_sectors: 131_056 - 7,
        ..spec(MetadataVersion::V1_0, 0, None)
    };
    let sb = Superblock::new_for_create(&tighter, 0, [1; 16], 131_072).unwrap();
    assert_eq!(sb.data_size, 131_049);
    assert_eq!((sb.bblog_offset, sb.bblog_size), (0, 0));
}

#[test]
fn v11_create_places_everything_after_the_superblock() {
    let sb = new_sb(MetadataVersion::V1_1, 131_072, None);
    assert_eq!(sb.super_offset, 0);
    assert_eq!(sb.data_offset, 2048);
    assert_eq!(sb.data_size, 131_072 - 2048);
    // Default bitmap reserve 8 sectors at offset 8, the log right after it.
    assert_eq!((sb.bblog_offset, sb.bblog_size), (16, 8));
    assert_eq!(sb.bblog_sector(), Some((16, 8)));
    let sb = new_sb(MetadataVersion::V1_1, 131_072, Some((8, 16)));
    assert_eq!(sb.bitmap_sector(), Some(8));
    assert_eq!(sb.bblog_sector(), Some((24, 8)));
    // Same rules as 1.2, counted from sector 0.
    assert_eq!(bblog_placement_after_super(0, 2048, 8, 8), Some((16, 8)));
    assert_eq!(bblog_placement_after_super(0, 24, 8, 16), Some((16, 8)));
    assert_eq!(bblog_placement_after_super(0, 16, 8, 16), Some((8, 8)));
    assert_eq!(bblog_placement_after_super(0, 15, 8, 16), None);
}
