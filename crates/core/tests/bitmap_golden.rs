//! The md bitmap superblock codec against hand-written bytes (offsets from md-bitmap.h),
//! the bit layout, and mdadm's default chunk rule.

use proptest::prelude::*;
use uraid_core::bitmap::*;

fn sample() -> BitmapSuper {
    let mut cluster_name = [0u8; 64];
    cluster_name[..4].copy_from_slice(b"clst");
    BitmapSuper {
        version: BITMAP_MAJOR_HI,
        uuid: [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54,
            0x32, 0x10,
        ],
        events: 0x0102_0304_0506_0708,
        events_cleared: 0x42,
        sync_size: 126_976,
        state: BITMAP_STATE_STALE,
        chunksize: 64 << 20,
        daemon_sleep: 5,
        write_behind: 256,
        sectors_reserved: 8,
        nodes: 0,
        cluster_name,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn golden_bytes_match_md_bitmap_h_layout() {
    let b = sample().encode();
    assert_eq!(b.len(), 256);
    assert_eq!(&b[0..4], b"bitm", "magic 0x6d746962 little-endian");
    assert_eq!(u32_at(&b, 4), 4, "version");
    assert_eq!(b[8], 0x01, "uuid[0]");
    assert_eq!(b[23], 0x10, "uuid[15]");
    assert_eq!(&b[24..32], &[8, 7, 6, 5, 4, 3, 2, 1], "events");
    assert_eq!(u64_at(&b, 32), 0x42, "events_cleared");
    assert_eq!(u64_at(&b, 40), 126_976, "sync_size");
    assert_eq!(u32_at(&b, 48), 2, "state: stale");
    assert_eq!(u32_at(&b, 52), 0x0400_0000, "chunksize");
    assert_eq!(u32_at(&b, 56), 5, "daemon_sleep");
    assert_eq!(u32_at(&b, 60), 256, "write_behind");
    assert_eq!(u32_at(&b, 64), 8, "sectors_reserved");
    assert_eq!(u32_at(&b, 68), 0, "nodes");
    assert_eq!(&b[72..76], b"clst", "cluster_name");
    assert!(b[76..256].iter().all(|&x| x == 0), "name padding and pad");
}

#[test]
fn decode_inverts_encode_on_sample() {
    let bms = sample();
    let bytes = bms.encode();
    assert_eq!(BitmapSuper::decode(&bytes), Ok(bms.clone()));
    let mut longer = bytes.to_vec();
    longer.extend_from_slice(&[0xff; 4000]);
    assert_eq!(
        BitmapSuper::decode(&longer),
        Ok(bms.clone()),
        "bits after it are not read"
    );
    assert_eq!(bms.cluster_name_str(), "clst");
}

#[test]
fn new_is_what_mdadm_writes() {
    let bms = BitmapSuper::new([9; 16], 126_976, 64 << 20, DEFAULT_DAEMON_SLEEP_SECS).unwrap();
    assert_eq!(bms.version, 4);
    assert_eq!((bms.events, bms.events_cleared, bms.state), (0, 0, 0));
    assert_eq!(
        (bms.write_behind, bms.sectors_reserved, bms.nodes),
        (0, 0, 0)
    );
    assert_eq!(bms.cluster_name, [0; 64]);
    assert!(BitmapSuper::new([9; 16], 1, 1000, 5).is_err());
}

#[test]
fn truncated_and_bad_magic() {
    let b = sample().encode();
    for len in 0..256 {
        assert_eq!(
            BitmapSuper::decode(&b[..len]),
            Err(BitmapError::Truncated {
                got: len,
                need: 256
            })
        );
    }
    let mut bad = b;
    bad[3] = 0;
    assert_eq!(
        BitmapSuper::decode(&bad),
        Err(BitmapError::BadMagic { found: 0x0074_6962 })
    );
}

fn invalid_field(r: Result<BitmapSuper, BitmapError>) -> &'static str {
    match r {
        Err(BitmapError::Invalid { field, .. }) => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

fn edited(edit: impl FnOnce(&mut [u8; 256])) -> Result<BitmapSuper, BitmapError> {
    let mut b = sample().encode();
    edit(&mut b);
    BitmapSuper::decode(&b)
}

#[test]
fn field_checks_on_decode() {
    assert_eq!(edited(|b| b[4] = 5), Err(BitmapError::BadVersion(5)));
    assert_eq!(edited(|b| b[4] = 2), Err(BitmapError::BadVersion(2)));
    assert_eq!(edited(|b| b[4] = 3).unwrap().version, 3);
    assert_eq!(
        invalid_field(edited(|b| b[52..56].copy_from_slice(&256u32.to_le_bytes()))),
        "chunksize"
    );
    assert_eq!(
        invalid_field(edited(|b| b[52..56].copy_from_slice(&4097u32.to_le_bytes()))),
        "chunksize"
    );
    assert_eq!(invalid_field(edited(|b| b[56..60].fill(0))), "daemon_sleep");
    assert_eq!(
        invalid_field(edited(
            |b| b[60..64].copy_from_slice(&16384u32.to_le_bytes())
        )),
        "write_behind"
    );
    assert_eq!(invalid_field(edited(|b| b[40..48].fill(0xff))), "sync_size");
    assert_eq!(invalid_field(edited(|b| b[68] = 2)), "nodes");
    assert_eq!(
        edited(|b| b[52..56].copy_from_slice(&512u32.to_le_bytes()))
            .unwrap()
            .chunksize,
        512
    );
}

#[test]
#[should_panic(expected = "refusing to encode")]
fn encode_refuses_an_invalid_record() {
    let bms = BitmapSuper {
        chunksize: 3000,
        ..sample()
    };
    let _ = bms.encode();
}

#[test]
fn sizes() {
    // 62 MiB at 64 MiB per bit: one bit, one byte, one 4 KiB block.
    assert_eq!(chunks_for(126_976, 64 << 20), 1);
    assert_eq!(chunks_for(131_072, 64 << 20), 1);
    assert_eq!(chunks_for(131_073, 64 << 20), 2, "a partial chunk counts");
    assert_eq!(chunks_for(0, 4096), 0);
    assert_eq!(chunks_for(u64::MAX / 512, 512), u64::MAX / 512);
    assert_eq!(bits_bytes(0), 0);
    assert_eq!(bits_bytes(1), 1);
    assert_eq!(bits_bytes(8), 1);
    assert_eq!(bits_bytes(9), 2);
    assert_eq!(space_bytes(126_976, 64 << 20), 4096);
    // 8 * (4096 - 256) bits fill the first block exactly; one more needs a second.
    assert_eq!(space_bytes(30_720 * 8, 4096), 4096);
    assert_eq!(space_bytes(30_721 * 8, 4096), 8192);
    let bms = sample();
    assert_eq!(
        (bms.chunks(), bms.bits_bytes(), bms.space_bytes()),
        (1, 1, 4096)
    );
    assert_eq!(bms.chunk_sectors(), 131_072);
    assert_eq!(bms.chunk_of_sector(131_071), 0);
    assert_eq!(bms.chunk_of_sector(131_072), 1);
}

#[test]
fn mdadm_default_chunk() {
    // Small arrays: the 64 MiB floor.
    assert_eq!(default_chunk_bytes(126_976, 8), Some(64 << 20));
    // 16 TiB component in 128 KiB: 32 MiB would fit, the floor wins.
    assert_eq!(default_chunk_bytes(1 << 35, 256), Some(64 << 20));
    // 64 TiB: 2^34 + 1 bits at 4 KiB, halved 15 times to fit 1,046,528 bits: 128 MiB.
    assert_eq!(default_chunk_bytes(1 << 37, 256), Some(128 << 20));
    // The room is capped at 128 KiB when mdadm chooses.
    assert_eq!(default_chunk_bytes(1 << 37, 100_000), Some(128 << 20));
    // 4 KiB room: (4096 - 256) * 8 = 30,720 bits; 2 TiB needs 2^29 + 1 bits at 4 KiB.
    assert_eq!(default_chunk_bytes(1 << 32, 8), Some(128 << 20));
    assert_eq!(default_chunk_bytes(1 << 32, 1), None);
    assert_eq!(default_chunk_bytes(1 << 32, 0), None);
}

#[test]
fn bit_order_is_little_endian() {
    let mut bits = vec![0u8; 4];
    set_dirty(&mut bits, 0, true);
    set_dirty(&mut bits, 9, true);
    set_dirty(&mut bits, 31, true);
    assert_eq!(bits, [0x01, 0x02, 0x00, 0x80]);
    assert!(is_dirty(&bits, 9));
    assert!(!is_dirty(&bits, 8));
    assert!(is_dirty(&bits, 32), "past the end reads dirty");
    assert_eq!(count_dirty(&bits, 32), 3);
    set_dirty(&mut bits, 9, false);
    assert_eq!(bits, [0x01, 0x00, 0x00, 0x80]);
}

#[test]
fn initial_area_is_all_dirty() {
    let bms = BitmapSuper::new([9; 16], 30_721 * 8, 4096, 5).unwrap();
    let area = initial_area(&bms);
    assert_eq!(area.len(), 8192);
    assert_eq!(BitmapSuper::decode(&area), Ok(bms.clone()));
    assert_eq!(&area[..256], &bms.encode());
    assert!(area[256..].iter().all(|&x| x == 0xff));
    assert_eq!(count_dirty(&area[256..], bms.chunks()), 30_721);
}

fn arb_bitmap() -> impl Strategy<Value = BitmapSuper> {
    (
        prop_oneof![Just(BITMAP_MAJOR_HI), Just(BITMAP_MAJOR_HOSTENDIAN)],
        any::<[u8; 16]>(),
        any::<(u64, u64, u32)>(),
        0u64..=u64::MAX / 512,
        9u32..32,
        1u32..,
        0u32..=MAX_WRITE_BEHIND,
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 64),
    )
        .prop_map(
            |(
                version,
                uuid,
                (events, events_cleared, state),
                sync_size,
                shift,
                daemon_sleep,
                write_behind,
                sectors_reserved,
                name,
            )| {
                BitmapSuper {
                    version,
                    uuid,
                    events,
                    events_cleared,
                    sync_size,
                    state,
                    chunksize: 1 << shift,
                    daemon_sleep,
                    write_behind,
                    sectors_reserved,
                    nodes: 0,
                    cluster_name: name.try_into().unwrap(),
                }
            },
        )
}

proptest! {
    #[test]
    fn decode_encode_round_trip(bms in arb_bitmap()) {
        let bytes = bms.encode();
        prop_assert_eq!(BitmapSuper::decode(&bytes), Ok(bms.clone()));
        prop_assert_eq!(space_bytes(bms.sync_size, bms.chunksize) % 4096, 0);
    }

    #[test]
    fn garbage_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..300), magic in any::<bool>()) {
        if magic && bytes.len() >= 4 {
            bytes[0..4].copy_from_slice(&BITMAP_MAGIC.to_le_bytes());
        }
        if let Ok(bms) = BitmapSuper::decode(&bytes) {
            prop_assert_eq!(&bms.encode()[..136], &bytes[..136]);
        }
    }

    #[test]
    fn dirty_bits_match_a_naive_model(ops in prop::collection::vec((0u64..200, any::<bool>()), 0..100)) {
        let mut bits = vec![0u8; 25];
        let mut model = [false; 200];
        for (chunk, dirty) in ops {
            set_dirty(&mut bits, chunk, dirty);
            model[chunk as usize] = dirty;
        }
        for (chunk, &want) in model.iter().enumerate() {
            prop_assert_eq!(is_dirty(&bits, chunk as u64), want);
            prop_assert_eq!(bits[chunk / 8] >> (chunk % 8) & 1 == 1, want);
        }
        prop_assert_eq!(count_dirty(&bits, 200), model.iter().filter(|&&d| d).count() as u64);
    }
}
