//! The md v1.2 superblock codec against hand-written bytes (offsets from md_p.h), and its
//! checks: round trips, corruption, garbage, truncation.

use proptest::prelude::*;
use uraid_core::superblock::*;

/// A superblock whose every field has a distinct, recognisable value.
fn sample() -> Superblock {
    let mut dev_roles = vec![ROLE_SPARE; 128];
    dev_roles[0] = 0;
    dev_roles[1] = 1;
    dev_roles[2] = ROLE_FAULTY;
    dev_roles[3] = 2;
    dev_roles[4] = ROLE_JOURNAL;
    Superblock {
        feature_map: FEATURE_BITMAP_OFFSET | FEATURE_RECOVERY_OFFSET,
        set_uuid: [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54,
            0x32, 0x10,
        ],
        set_name: "host:md0".into(),
        ctime: 0x0000_0001_6553_f100,
        level: 5,
        layout: 2,
        size: 0x0102_0304,
        chunksize: 1024,
        raid_disks: 3,
        bitmap_offset: 8,
        new_level: -1,
        reshape_position: 0x1122_3344_5566_7788,
        delta_disks: -2,
        new_layout: 3,
        new_chunk: 256,
        new_offset: -4096,
        data_offset: 2048,
        data_size: 0x0203_0405,
        super_offset: 8,
        recovery_offset: 0xdead_beef,
        dev_number: 3,
        cnt_corrected_read: 17,
        device_uuid: [0xa0; 16],
        devflags: DEVFLAG_WRITE_MOSTLY,
        bblog_shift: 3,
        bblog_size: 8,
        bblog_offset: -16,
        utime: 0x0000_0001_6553_f1ff,
        events: 0x0000_0100_0000_0042,
        resync_offset: MAX_SECTOR,
        sb_csum: 0,
        dev_roles,
        logical_block_size: 512,
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn golden_bytes_match_md_p_h_layout() {
    let b = sample().encode();
    assert_eq!(b.len(), 4096);
    // magic, "a92b4efc" little-endian
    assert_eq!(&b[0..4], &[0xfc, 0x4e, 0x2b, 0xa9]);
    assert_eq!(u32_at(&b, 4), 1, "major_version");
    assert_eq!(u32_at(&b, 8), 3, "feature_map");
    assert_eq!(u32_at(&b, 12), 0, "pad0");
    assert_eq!(b[16], 0x01, "set_uuid[0]");
    assert_eq!(b[31], 0x10, "set_uuid[15]");
    assert_eq!(&b[32..40], b"host:md0");
    assert!(b[40..64].iter().all(|&x| x == 0), "set_name NUL padded");
    assert_eq!(u64_at(&b, 64), 0x0000_0001_6553_f100, "ctime");
    assert_eq!(u32_at(&b, 72), 5, "level");
    assert_eq!(u32_at(&b, 76), 2, "layout");
    assert_eq!(u64_at(&b, 80), 0x0102_0304, "size");
    assert_eq!(u32_at(&b, 88), 1024, "chunksize");
    assert_eq!(u32_at(&b, 92), 3, "raid_disks");
    assert_eq!(u32_at(&b, 96), 8, "bitmap_offset");
    assert_eq!(u32_at(&b, 100), 0xffff_ffff, "new_level -1");
    assert_eq!(
        &b[104..112],
        &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]
    );
    assert_eq!(u32_at(&b, 112), 0xffff_fffe, "delta_disks -2");
    assert_eq!(u32_at(&b, 116), 3, "new_layout");
    assert_eq!(u32_at(&b, 120), 256, "new_chunk");
    assert_eq!(u32_at(&b, 124), 0xffff_f000, "new_offset -4096");
    assert_eq!(u64_at(&b, 128), 2048, "data_offset");
    assert_eq!(u64_at(&b, 136), 0x0203_0405, "data_size");
    assert_eq!(u64_at(&b, 144), 8, "super_offset");
    assert_eq!(u64_at(&b, 152), 0xdead_beef, "recovery_offset");
    assert_eq!(u32_at(&b, 160), 3, "dev_number");
    assert_eq!(u32_at(&b, 164), 17, "cnt_corrected_read");
    assert_eq!(&b[168..184], &[0xa0; 16], "device_uuid");
    assert_eq!(b[184], 1, "devflags");
    assert_eq!(b[185], 3, "bblog_shift");
    assert_eq!(u16_at(&b, 186), 8, "bblog_size");
    assert_eq!(u32_at(&b, 188), 0xffff_fff0, "bblog_offset -16");
    assert_eq!(u64_at(&b, 192), 0x0000_0001_6553_f1ff, "utime");
    assert_eq!(u64_at(&b, 200), 0x0000_0100_0000_0042, "events");
    assert_eq!(u64_at(&b, 208), u64::MAX, "resync_offset");
    assert_eq!(u32_at(&b, 220), 128, "max_dev");
    assert_eq!(
        u32_at(&b, 224),
        512,
        "logical_block_size (md 6.18, first word of pad3)"
    );
    assert!(b[228..256].iter().all(|&x| x == 0), "pad3");
    assert_eq!(u16_at(&b, 256), 0, "dev_roles[0]");
    assert_eq!(u16_at(&b, 258), 1, "dev_roles[1]");
    assert_eq!(&b[260..262], &[0xfe, 0xff], "dev_roles[2] faulty");
    assert_eq!(u16_at(&b, 262), 2, "dev_roles[3]");
    assert_eq!(&b[264..266], &[0xfd, 0xff], "dev_roles[4] journal");
    assert_eq!(u16_at(&b, 266), 0xffff, "dev_roles[5] spare");
    assert_eq!(u16_at(&b, 510), 0xffff, "dev_roles[127]");
    assert!(
        b[512..].iter().all(|&x| x == 0),
        "zero padded past 256 + 2*max_dev"
    );
    // The checksum as md computes it, by hand: u32 words of 512 bytes but the sb_csum word.
    let mut sum: u64 = 0;
    for at in (0..512).step_by(4) {
        if at != 216 {
            sum += u64::from(u32_at(&b, at));
        }
    }
    let folded = ((sum & 0xffff_ffff) + (sum >> 32)) as u32;
    assert_eq!(u32_at(&b, 216), folded, "sb_csum");
}

#[test]
fn checksum_known_answers() {
    assert_eq!(checksum(&[0u8; 256]), 0);
    // 63 words of ones (sb_csum's word is skipped): 0x3e_ffffffc1, folded 0xffffffff.
    assert_eq!(checksum(&[0xff; 256]), 0xffff_ffff);
    // An odd max_dev adds a trailing u16: 0x3f_0000ffc0, folded 0x0000ffff.
    assert_eq!(checksum(&[0xff; 258]), 0x0000_ffff);
    // The fold wraps in 32 bits: 0x1_ffffffff folds to 0.
    let mut b = [0u8; 256];
    b[0..8].fill(0xff);
    b[8] = 1;
    b[216..220].copy_from_slice(&[0x12, 0x34, 0x56, 0x78]); // ignored
    assert_eq!(checksum(&b), 0);
    // sb_csum's word is not summed whatever it holds.
    let mut c = [0u8; 256];
    c[216..220].fill(0xff);
    assert_eq!(checksum(&c), 0);
    // Words are little-endian.
    let mut d = [0u8; 256];
    d[4] = 0x01;
    d[7] = 0x02;
    assert_eq!(checksum(&d), 0x0200_0001);
}

#[test]
fn decode_inverts_encode_on_sample() {
    let sb = sample();
    let bytes = sb.encode();
    let back = Superblock::decode(&bytes).unwrap();
    assert_eq!(back.sb_csum, u32_at(&bytes, 216));
    assert_eq!(
        Superblock {
            sb_csum: sb.sb_csum,
            ..back.clone()
        },
        sb
    );
    assert_eq!(back.encode(), bytes, "re-encoding is byte-identical");
    assert_eq!(back.role_of_this_device(), Some(2));
    assert_eq!(back.active_slot(), Some(2));
    assert!(back.is_clean());
    assert_eq!(back.ctime_secs(), 0x0001_6553_f100);
    assert_eq!(back.utime_secs(), 0x0001_6553_f1ff);
    assert_eq!(back.name(), "md0");
    assert_eq!(back.homehost(), Some("host"));
    assert_eq!(back.bitmap_sector(), Some(16));
    assert_eq!(
        back.bblog_sector(),
        None,
        "bblog below the superblock at 8 sectors"
    );
    assert_eq!(back.slot_counts(), vec![1, 1, 1]);
}

#[test]
fn every_single_byte_corruption_is_caught() {
    let sb = sample();
    let good = sb.encode();
    let reference = Superblock::decode(&good).unwrap();
    let covered = sb.sb_bytes();
    for at in 0..covered {
        for delta in 1..=255u8 {
            let mut bad = good.clone();
            bad[at] = bad[at].wrapping_add(delta);
            match Superblock::decode(&bad) {
                Err(_) => {}
                Ok(other) => assert_ne!(other, reference, "byte {at} += {delta} went unnoticed"),
            }
        }
    }
    // Past 256 + 2*max_dev nothing is read: the record is unchanged.
    let mut tail = good.clone();
    tail[covered..].fill(0x5a);
    assert_eq!(Superblock::decode(&tail).unwrap(), reference);
}

#[test]
fn single_byte_corruption_fails_the_checksum() {
    let good = sample().encode();
    for at in [0usize, 8, 40, 72, 88, 128, 200, 216, 219, 220, 256, 511] {
        let mut bad = good.clone();
        bad[at] ^= 0x04;
        let err = Superblock::decode(&bad).unwrap_err();
        let expected_kind = match at {
            0 => matches!(err, SuperblockError::BadMagic { .. }),
            220 => matches!(
                err,
                SuperblockError::BadChecksum { .. } | SuperblockError::Truncated { .. }
            ),
            _ => matches!(err, SuperblockError::BadChecksum { .. }),
        };
        assert!(expected_kind, "byte {at}: {err}");
    }
}

#[test]
fn truncated_buffers() {
    let good = sample().encode();
    for len in 0..256 {
        assert_eq!(
            Superblock::decode(&good[..len]),
            Err(SuperblockError::Truncated {
                got: len,
                need: 256
            })
        );
    }
    for len in 256..512 {
        assert_eq!(
            Superblock::decode(&good[..len]),
            Err(SuperblockError::Truncated {
                got: len,
                need: 512
            })
        );
    }
    assert!(
        Superblock::decode(&good[..512]).is_ok(),
        "256 + 2*max_dev bytes suffice"
    );
}

/// Re-seals `bytes` after an edit so that only the field checks can reject it.
fn reseal(bytes: &mut [u8]) {
    let max_dev = u32_at(bytes, 220) as usize;
    let end = (256 + 2 * max_dev).min(bytes.len());
    let csum = checksum(&bytes[..end]);
    bytes[216..220].copy_from_slice(&csum.to_le_bytes());
}

fn edited(edit: impl FnOnce(&mut Vec<u8>)) -> Result<Superblock, SuperblockError> {
    let mut b = sample().encode();
    edit(&mut b);
    reseal(&mut b);
    Superblock::decode(&b)
}

fn invalid_field(r: Result<Superblock, SuperblockError>) -> &'static str {
    match r {
        Err(SuperblockError::Invalid { field, .. }) => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn field_checks_on_decode() {
    assert_eq!(
        edited(|b| b[0] = 0),
        Err(SuperblockError::BadMagic { found: 0xa92b_4e00 })
    );
    assert_eq!(edited(|b| b[4] = 2), Err(SuperblockError::BadVersion(2)));
    assert_eq!(
        edited(|b| b[220..224].copy_from_slice(&1921u32.to_le_bytes())),
        Err(SuperblockError::BadMaxDev(1921))
    );
    assert_eq!(invalid_field(edited(|b| b[12] = 1)), "padding");
    assert_eq!(invalid_field(edited(|b| b[255] = 1)), "padding");
    assert_eq!(
        invalid_field(edited(|b| b[88..92].copy_from_slice(&1000u32.to_le_bytes()))),
        "chunksize"
    );
    assert_eq!(
        invalid_field(edited(|b| b[92..96].copy_from_slice(&129u32.to_le_bytes()))),
        "raid_disks"
    );
    assert_eq!(invalid_field(edited(|b| b[92..96].fill(0))), "raid_disks");
    assert_eq!(
        invalid_field(edited(|b| b[128..136].fill(0xff))),
        "data_size"
    );
    assert_eq!(
        invalid_field(edited(
            |b| b[80..88].copy_from_slice(&u64::MAX.to_le_bytes())
        )),
        "size"
    );
    assert_eq!(invalid_field(edited(|b| b[32] = 0xc3)), "set_name");
    // Bytes after the name's NUL are ignored, as md does.
    assert_eq!(edited(|b| b[50] = b'x').unwrap().set_name, "host:md0");
    // chunksize 0 (raid1) and max_dev 1920 are fine.
    assert_eq!(edited(|b| b[88..92].fill(0)).unwrap().chunksize, 0);
    let mut big = sample();
    big.dev_roles.resize(1920, ROLE_SPARE);
    assert_eq!(Superblock::decode(&big.encode()).unwrap().max_dev(), 1920);
}

#[test]
#[should_panic(expected = "refusing to encode")]
fn encode_refuses_an_invalid_record() {
    let mut sb = sample();
    sb.chunksize = 3;
    let _ = sb.encode();
}

#[test]
#[should_panic(expected = "refusing to encode")]
fn encode_refuses_a_long_name() {
    let mut sb = sample();
    sb.set_name = "x".repeat(33);
    let _ = sb.encode();
}

#[test]
fn uuid_text_forms() {
    let u = sample().set_uuid;
    assert_eq!(uuid_string(&u), "01234567:89abcdef:fedcba98:76543210");
    assert_eq!(parse_uuid("01234567:89abcdef:fedcba98:76543210"), Some(u));
    assert_eq!(parse_uuid("01234567-89ab-cdef-fedc-ba9876543210"), Some(u));
    assert_eq!(parse_uuid("0123456789ABCDEFFEDCBA9876543210"), Some(u));
    assert_eq!(parse_uuid("01234567:89abcdef:fedcba98:7654321"), None);
    assert_eq!(parse_uuid("01234567:89abcdef:fedcba98:7654321g"), None);
    assert_eq!(parse_uuid("0123-4567:89abcdef:fedcba98:76543210"), None);
    assert_eq!(parse_uuid(""), None);
}

#[test]
fn time_packing() {
    assert_eq!(pack_time(1_700_000_000, 0), 1_700_000_000);
    let t = pack_time(1_700_000_000, 999_999);
    assert_eq!(t >> 40, 999_999);
    let sb = Superblock {
        ctime: t,
        utime: t,
        ..sample()
    };
    assert_eq!(sb.ctime_secs(), 1_700_000_000);
    assert_eq!(sb.utime_secs(), 1_700_000_000);
}

#[test]
fn updates_bump_events_and_state() {
    let mut sb = sample();
    sb.bump_events(1_700_000_123);
    assert_eq!(sb.events, 0x0000_0100_0000_0043);
    assert_eq!(sb.utime_secs(), 1_700_000_123);
    sb.set_clean(false);
    assert_eq!(sb.resync_offset, 0);
    assert!(!sb.is_clean());
    sb.set_clean(true);
    assert!(sb.is_clean());
    let b = sb.encode();
    assert_eq!(u64_at(&b, 200), 0x0000_0100_0000_0043);
    assert_eq!(u64_at(&b, 192), 1_700_000_123);
}

#[test]
fn mdadm_create_defaults() {
    // max_dev fills whole sectors: 128 roles for up to 128 devices.
    assert_eq!(max_dev_for(1), 128);
    assert_eq!(max_dev_for(128), 128);
    assert_eq!(max_dev_for(129), 384);
    // Bitmap reserve: 4 KiB, 64 KiB above 8 GiB, 128 KiB above 200 GiB.
    assert_eq!(default_bitmap_space_sectors(100), 0);
    assert_eq!(default_bitmap_space_sectors(131_072), 8);
    assert_eq!(default_bitmap_space_sectors(8 << 21), 8);
    assert_eq!(default_bitmap_space_sectors((8 << 21) + 9), 128);
    assert_eq!(default_bitmap_space_sectors((200 << 21) + 128), 256);
    // data_offset as mdadm 4.x prints it for such members.
    let off = |dev: u64, chunk| {
        default_data_offset_sectors(dev, chunk, default_bitmap_space_sectors(dev))
    };
    assert_eq!(
        off(131_072, 1024),
        4096,
        "64 MiB, 512K chunk: headroom floor of two chunks"
    );
    assert_eq!(off(131_072, 0), 2048, "64 MiB raid1");
    assert_eq!(off(10 << 21, 1024), 18432, "10 GiB");
    assert_eq!(off(1 << 31, 1024), 264_192, "1 TiB: 128 MiB headroom");
    // Bad block log: after the bitmap area, else just below the data.
    assert_eq!(default_bblog_placement(2048, 8, 8), Some((16, 8)));
    assert_eq!(default_bblog_placement(32, 8, 16), Some((16, 8)));
    assert_eq!(default_bblog_placement(31, 8, 16), Some((15, 8)));
    assert_eq!(default_bblog_placement(23, 8, 16), None);
}

fn create_spec() -> CreateSpec {
    CreateSpec {
        set_uuid: sample().set_uuid,
        set_name: "host:md0".into(),
        ctime_secs: 1_700_000_000,
        level: 5,
        layout: 2,
        chunk_sectors: 1024,
        raid_disks: 4,
        spares: 1,
        missing: vec![1],
        size_sectors: 126_976,
        data_offset_sectors: 4096,
        internal_bitmap: None,
        bad_block_log: true,
        clean: false,
        version: MetadataVersion::V1_2,
    }
}

#[test]
fn new_for_create_matches_mdadm() {
    let sb = Superblock::new_for_create(&create_spec(), 4, [7; 16], 131_072).unwrap();
    assert_eq!(sb.feature_map, 0);
    assert_eq!(sb.super_offset, 8);
    assert_eq!(sb.data_offset, 4096);
    assert_eq!(sb.data_size, 131_072 - 4096);
    assert_eq!(sb.size, 126_976);
    assert_eq!((sb.bblog_offset, sb.bblog_size, sb.bblog_shift), (16, 8, 0));
    assert_eq!(sb.events, 0);
    assert_eq!(sb.ctime, 1_700_000_000);
    assert_eq!(sb.utime, sb.ctime);
    assert_eq!(sb.resync_offset, 0);
    assert!(!sb.is_clean());
    assert_eq!(sb.dev_roles.len(), 128);
    assert_eq!(
        &sb.dev_roles[..6],
        &[0, ROLE_FAULTY, 2, 3, ROLE_SPARE, ROLE_SPARE]
    );
    assert_eq!(sb.role_of_this_device(), Some(ROLE_SPARE));
    assert_eq!(sb.active_slot(), None);
    assert_eq!(sb.slot_counts(), vec![1, 0, 1, 1]);

    let with_bitmap = CreateSpec {
        internal_bitmap: Some((8, 16)),
        clean: true,
        ..create_spec()
    };
    let sb = Superblock::new_for_create(&with_bitmap, 0, [7; 16], 131_072).unwrap();
    assert_eq!(sb.feature_map, FEATURE_BITMAP_OFFSET);
    assert_eq!(sb.bitmap_offset, 8);
    assert_eq!(sb.bitmap_sector(), Some(16));
    assert_eq!(
        (sb.bblog_offset, sb.bblog_size),
        (24, 8),
        "bblog after the bitmap"
    );
    assert_eq!(sb.bblog_sector(), Some((32, 8)));
    assert!(sb.is_clean());

    let no_bblog = CreateSpec {
        bad_block_log: false,
        ..create_spec()
    };
    let sb = Superblock::new_for_create(&no_bblog, 0, [7; 16], 131_072).unwrap();
    assert_eq!((sb.bblog_offset, sb.bblog_size), (0, 0));

    let err = |spec: &CreateSpec, dev, sectors| {
        Superblock::new_for_create(spec, dev, [7; 16], sectors).is_err()
    };
    assert!(
        err(&create_spec(), 5, 131_072),
        "dev_number past the members"
    );
    assert!(
        err(&create_spec(), 0, 4000),
        "device smaller than data_offset"
    );
    assert!(err(
        &CreateSpec {
            missing: vec![4],
            ..create_spec()
        },
        0,
        131_072
    ));
    assert!(err(
        &CreateSpec {
            size_sectors: 200_000,
            ..create_spec()
        },
        0,
        131_072
    ));
}

fn arb_superblock() -> impl Strategy<Value = Superblock> {
    let roles = prop_oneof![
        8 => prop::collection::vec(any::<u16>(), 1..300),
        1 => prop::collection::vec(any::<u16>(), 1920..=1920),
    ];
    let head = (
        any::<u32>(),
        any::<[u8; 16]>(),
        "[ -~&&[^:]]{0,20}(:[a-z0-9_]{1,11})?",
        any::<u64>(),
        any::<i32>(),
        any::<u32>(),
        prop_oneof![Just(0u32), (0u32..32).prop_map(|k| 1 << k)],
        any::<i32>(),
        any::<i32>(),
        any::<u64>(),
        any::<i32>(),
    );
    let mid = (
        any::<u32>(),
        any::<u32>(),
        any::<i32>(),
        0u64..(1 << 40),
        0u64..(1 << 40),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<[u8; 16]>(),
        any::<(u8, u8, u16, i32)>(),
    );
    let tail = (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<prop::sample::Index>(),
    );
    (roles, head, mid, tail, any::<prop::sample::Index>()).prop_map(
        |(dev_roles, h, m, t, disks)| {
            let raid_disks = disks.index(dev_roles.len()) as u32 + 1;
            let data_size = m.4;
            Superblock {
                feature_map: h.0,
                set_uuid: h.1,
                set_name: h.2,
                ctime: h.3,
                level: h.4,
                layout: h.5,
                size: t.3.index(data_size as usize + 1) as u64,
                chunksize: h.6,
                raid_disks,
                bitmap_offset: h.7,
                new_level: h.8,
                reshape_position: h.9,
                delta_disks: h.10,
                new_layout: m.0,
                new_chunk: m.1,
                new_offset: m.2,
                data_offset: m.3,
                data_size,
                super_offset: m.5,
                recovery_offset: m.6,
                dev_number: m.7,
                cnt_corrected_read: m.8,
                device_uuid: m.9,
                devflags: m.10 .0,
                bblog_shift: m.10 .1,
                bblog_size: m.10 .2,
                bblog_offset: m.10 .3,
                utime: t.0,
                events: t.1,
                resync_offset: t.2,
                sb_csum: 0,
                dev_roles,
                logical_block_size: t.1 as u32,
            }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn decode_encode_round_trip(sb in arb_superblock()) {
        let bytes = sb.encode();
        prop_assert_eq!(bytes.len(), SB_IO_BYTES);
        let back = Superblock::decode(&bytes).unwrap();
        prop_assert_eq!(back.sb_csum, checksum(&bytes[..sb.sb_bytes()]));
        prop_assert_eq!(&Superblock { sb_csum: 0, ..back.clone() }, &sb);
        prop_assert_eq!(back.encode(), bytes);
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..4200)) {
        let _ = Superblock::decode(&bytes);
    }

    /// Garbage behind a valid magic, version, max_dev and checksum reaches the field checks;
    /// whatever they accept must encode back to the same bytes.
    #[test]
    fn sealed_garbage_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 4096), max_dev in 0u32..=1920) {
        bytes[0..4].copy_from_slice(&MD_SB_MAGIC.to_le_bytes());
        bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
        bytes[220..224].copy_from_slice(&max_dev.to_le_bytes());
        reseal(&mut bytes);
        if let Ok(sb) = Superblock::decode(&bytes) {
            let again = Superblock::decode(&sb.encode()).unwrap();
            prop_assert_eq!(again, sb);
        }
    }

    #[test]
    fn valid_record_with_clean_pads_decodes(sb in arb_superblock()) {
        // The garbage test rarely gets past the pad check; this one always does.
        let mut bytes = sb.encode();
        let n = sb.sb_bytes();
        bytes[n..].fill(0xee);
        prop_assert!(Superblock::decode(&bytes).is_ok());
    }
}

/// examine shows a superblock whose checksum is wrong, with both checksums, and decode
/// still refuses it.
#[test]
fn a_wrong_checksum_is_reported_with_the_fields_as_found() {
    let good = sample().encode();
    let reference = Superblock::decode(&good).unwrap();
    let mut bad = good.clone();
    bad[38] ^= 0x04; // inside set_name: "host:md0" becomes "host:m`0"
    let (sb, computed) = Superblock::decode_any_checksum(&bad).unwrap();
    assert_eq!(sb.sb_csum, reference.sb_csum, "the stored checksum is kept");
    assert_ne!(computed, sb.sb_csum);
    assert_eq!(computed, checksum(&bad[..256 + 2 * 128]));
    assert_eq!(sb.set_name, "host:m`0");
    assert_eq!(sb.events, reference.events);
    assert_eq!(
        Superblock::decode(&bad),
        Err(SuperblockError::BadChecksum {
            stored: sb.sb_csum,
            computed
        })
    );
    // Correct bytes: the same record, and the computed checksum is the stored one.
    let (sb, computed) = Superblock::decode_any_checksum(&good).unwrap();
    assert_eq!((sb, computed), (reference.clone(), reference.sb_csum));
}
