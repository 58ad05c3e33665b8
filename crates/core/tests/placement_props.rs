//! Property: for any device size, where create puts the superblock, data, bitmap and bad
//! block log of a metadata 1.0, 1.1 or 0.90 member follows mdadm's rules (super1.c's
//! `write_init_super1`, super0.c's `MD_NEW_SIZE_SECTORS` and `add_internal_bitmap0`), and
//! no two areas overlap or leave the device.

use proptest::prelude::*;
use uraid_core::superblock::*;
use uraid_core::superblock090::{new_v1_for_create, sb090_offset_sectors};

fn spec(
    version: MetadataVersion,
    size: u64,
    data_offset: u64,
    bitmap: Option<(i32, u64)>,
) -> CreateSpec {
    CreateSpec {
        set_uuid: [0x3c; 16],
        set_name: "host:place".into(),
        ctime_secs: 1_700_000_000,
        level: 1,
        layout: 0,
        chunk_sectors: 0,
        raid_disks: 2,
        spares: 0,
        missing: vec![],
        size_sectors: size,
        data_offset_sectors: data_offset,
        internal_bitmap: bitmap,
        bad_block_log: true,
        clean: true,
        version,
    }
}

/// Sectors [start, start + len) of the member.
type Area = (&'static str, u64, u64);

fn disjoint_and_inside(areas: &[Area], device_sectors: u64) -> Result<(), TestCaseError> {
    for &(name, start, len) in areas {
        prop_assert!(
            start + len <= device_sectors,
            "{name} {start}+{len} past {device_sectors}"
        );
    }
    for (i, a) in areas.iter().enumerate() {
        for b in &areas[i + 1..] {
            let apart = a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1;
            prop_assert!(apart, "{a:?} overlaps {b:?}");
        }
    }
    Ok(())
}

fn areas(sb: &Superblock) -> Vec<Area> {
    let mut v: Vec<Area> = vec![
        ("superblock", sb.super_offset, 8),
        ("data", sb.data_offset, sb.data_size),
    ];
    if let Some((at, len)) = sb.bblog_sector() {
        v.push(("bad block log", at, u64::from(len)));
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn v1_0_lives_at_the_end_below_it_its_log_and_bitmap(
        device_sectors in 2048u64..(1 << 42),
        bitmap_blocks in prop::option::of(1u64..16),
    ) {
        let v = MetadataVersion::V1_0;
        // mdadm: 8 KiB from the end, rounded down to 4 KiB.
        let at = (device_sectors - 16) & !7;
        prop_assert_eq!(v.super_offset_sectors(device_sectors), Some(at));
        let size = v10_avail_sectors(device_sectors) / 128 * 128;
        prop_assume!(size > 0);
        let bitmap = bitmap_blocks.map(|b| (v10_bitmap_offset(b * 8).unwrap(), b * 8));
        let made = Superblock::new_for_create(&spec(v, size, 0, bitmap), 0, [1; 16], device_sectors);
        if let Some((_, space)) = bitmap.filter(|&(_, space)| size + space + 8 > at) {
            // A bitmap larger than the default reserve the component was sized by: refused,
            // never a data area over the bitmap.
            let e = made.unwrap_err().to_string();
            prop_assert!(e.contains("no room for the"), "{} ({} sectors)", e, space);
            return Ok(());
        }
        let sb = made.unwrap();
        prop_assert_eq!(sb.super_offset, at);
        prop_assert_eq!(sb.version(), v);
        prop_assert_eq!(sb.data_offset, 0);
        prop_assert!(sb.data_size >= size);
        // The log is the 8 sectors right below the superblock.
        prop_assert_eq!(sb.bblog_sector(), Some((at - 8, 8)));
        let mut a = areas(&sb);
        if let Some((off, space)) = bitmap {
            // The bitmap ends where the log begins and the data ends where it begins.
            let start = sb.bitmap_sector().unwrap();
            prop_assert_eq!(start as i64, at as i64 + i64::from(off));
            prop_assert_eq!(start + space, at - 8);
            prop_assert_eq!(sb.data_size, start);
            a.push(("bitmap", start, space));
        } else {
            // No bitmap: the default reserve is left for one.
            prop_assert_eq!(sb.data_size, at - 8 - default_bitmap_space_sectors(device_sectors));
        }
        disjoint_and_inside(&a, device_sectors)?;
        let back = Superblock::decode(&sb.encode()).unwrap();
        prop_assert_eq!(MetadataVersion::of_super_offset(back.super_offset, device_sectors), Some(v));
    }

    #[test]
    fn v1_1_lives_at_sector_0_with_its_bitmap_and_log_before_the_data(
        device_sectors in 8192u64..(1 << 42),
        bitmap_blocks in prop::option::of(1u64..16),
    ) {
        let v = MetadataVersion::V1_1;
        prop_assert_eq!(v.super_offset_sectors(device_sectors), Some(0));
        let space = bitmap_blocks.map_or(default_bitmap_space_sectors(device_sectors), |b| b * 8);
        let data_offset = default_data_offset_sectors(device_sectors, 0, space);
        prop_assume!(data_offset + 128 <= device_sectors);
        // mdadm rounds the data offset to 1 MiB.
        prop_assert_eq!(data_offset % 2048, 0);
        let size = (device_sectors - data_offset) / 128 * 128;
        let bitmap = bitmap_blocks.map(|b| (8, b * 8));
        let sb = Superblock::new_for_create(&spec(v, size, data_offset, bitmap), 0, [1; 16], device_sectors).unwrap();
        prop_assert_eq!(sb.super_offset, 0);
        prop_assert_eq!(sb.version(), v);
        prop_assert_eq!(sb.data_offset, data_offset);
        prop_assert_eq!(sb.data_size, device_sectors - data_offset);
        // The bitmap 4 KiB after the superblock, the log right after the bitmap's room.
        let (log, _) = sb.bblog_sector().unwrap();
        prop_assert_eq!(log, 8 + space);
        let mut a = areas(&sb);
        if let Some((_, s)) = bitmap {
            prop_assert_eq!(sb.bitmap_sector(), Some(8));
            a.push(("bitmap", 8, s));
        }
        disjoint_and_inside(&a, device_sectors)?;
    }

    #[test]
    fn v0_90_lives_in_the_last_aligned_64k_with_its_bitmap_after_it(
        // 0.90 records the component in 32 bits of KiB.
        device_sectors in 256u64..(1 << 33),
        bitmap in any::<bool>(),
    ) {
        let at = (device_sectors & !127) - 128;
        prop_assert_eq!(sb090_offset_sectors(device_sectors), Some(at));
        let size = at / 128 * 128;
        prop_assume!(size > 0 && size / 2 <= u64::from(u32::MAX));
        let bm = bitmap.then_some((8, 120));
        let sb = new_v1_for_create(&spec(MetadataVersion::V1_2, size, 0, bm), 0, device_sectors).unwrap();
        prop_assert_eq!(sb.super_offset, at);
        prop_assert_eq!((sb.data_offset, sb.data_size), (0, at));
        prop_assert!(uraid_core::superblock090::is_090_place(sb.super_offset, device_sectors) == (at >= 8));
        let mut a = vec![("superblock", at, 8), ("data", 0, at)];
        if bitmap {
            prop_assert_eq!(sb.bitmap_sector(), Some(at + 8));
            a.push(("bitmap", at + 8, 120));
        } else {
            prop_assert_eq!(sb.bitmap_sector(), None);
        }
        // The whole 64 KiB reserve ends inside the device.
        prop_assert!(at + 128 <= device_sectors);
        disjoint_and_inside(&a, device_sectors)?;
        // A 1.x superblock never sits at the 0.90 place.
        for v in MetadataVersion::ALL {
            prop_assert_ne!(v.super_offset_sectors(device_sectors), Some(at));
        }
    }
}
