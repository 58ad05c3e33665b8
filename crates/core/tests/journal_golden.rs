//! Golden bytes for md's raid5-cache meta block, derived by hand from md_p.h.

use uraid_core::journal::*;

/// CRC-32C one bit at a time, reflected polynomial 0x82F63B78, register starting at `seed`,
/// no final inversion: the definition of the kernel's crc32c_le, written independently of
/// the code under test.
fn crc_bitwise(seed: u32, data: &[u8]) -> u32 {
    let mut crc = seed;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    crc
}

const UUID: [u8; 16] = [
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10,
];

#[test]
fn crc32c_matches_the_kernel_definition() {
    // The CRC-32C check value: standard CRC-32C is the inverted register of crc32c_le(~0).
    assert_eq!(!crc_bitwise(!0, b"123456789"), 0xe306_9283);
    assert_eq!(!crc32c_le(!0, b"123456789"), 0xe306_9283);
    for seed in [0u32, 1, !0, 0xdead_beef, 0x1234_5678] {
        for data in [&b""[..], b"a", b"123456789", &[0u8; 4096][..], &UUID[..]] {
            assert_eq!(
                crc32c_le(seed, data),
                crc_bitwise(seed, data),
                "seed {seed:#x}"
            );
        }
    }
}

#[test]
fn seed_is_the_crc_of_the_uuid() {
    assert_eq!(LogSeed::from_uuid(&UUID).0, crc_bitwise(!0, &UUID));
    let page: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let seed = LogSeed::from_uuid(&UUID);
    assert_eq!(seed.page_checksum(&page), crc_bitwise(seed.0, &page));
}

fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// A meta block with one DATA, one raid6 PARITY and one FLUSH payload, byte by byte.
fn hand_block(seed: u32) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    put(&mut b, 0, &[0x09, 0xc5, 0x33, 0x64]); // magic 0x6433c509, little-endian
    b[8] = 1; // version
              // meta_size = 32 header + (16 + 4) data + (16 + 8) parity + (8 + 16) flush = 100
    put(&mut b, 12, &[100, 0, 0, 0]);
    put(
        &mut b,
        16,
        &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11],
    ); // seq
    put(&mut b, 24, &[0x18, 0, 0, 0, 0, 0, 0, 0]); // position 24
                                                   // DATA: type 0, flags 0, size 8 sectors, location 0x1000, checksum 0xaabbccdd
    put(&mut b, 32, &[0, 0, 0, 0, 8, 0, 0, 0]);
    put(&mut b, 40, &[0x00, 0x10, 0, 0, 0, 0, 0, 0]);
    put(&mut b, 48, &[0xdd, 0xcc, 0xbb, 0xaa]);
    // PARITY: type 1, flags 0, size 16 sectors (P and Q), location 0x40, two checksums
    put(&mut b, 52, &[1, 0, 0, 0, 16, 0, 0, 0]);
    put(&mut b, 60, &[0x40, 0, 0, 0, 0, 0, 0, 0]);
    put(&mut b, 68, &[1, 0, 0, 0, 2, 0, 0, 0]);
    // FLUSH: type 2, flags 1, size 16 bytes, stripes 8 and 0x1_0000_0000
    put(&mut b, 76, &[2, 0, 1, 0, 16, 0, 0, 0]);
    put(&mut b, 84, &[8, 0, 0, 0, 0, 0, 0, 0]);
    put(&mut b, 92, &[0, 0, 0, 0, 1, 0, 0, 0]);
    let crc = crc_bitwise(seed, &b);
    put(&mut b, 4, &crc.to_le_bytes());
    b
}

fn hand_struct() -> MetaBlock {
    MetaBlock {
        seq: 0x1122_3344_5566_7788,
        position_sectors: 24,
        payloads: vec![
            Payload::Data {
                flags: 0,
                location_sectors: 0x1000,
                checksums: vec![0xaabb_ccdd],
            },
            Payload::Parity {
                flags: 0,
                location_sectors: 0x40,
                checksums: vec![1, 2],
            },
            Payload::Flush {
                flags: 1,
                stripe_sectors: vec![8, 0x1_0000_0000],
            },
        ],
    }
}

#[test]
fn meta_block_golden_bytes() {
    let seed = LogSeed::from_uuid(&UUID);
    let want = hand_block(seed.0);
    let m = hand_struct();
    assert_eq!(m.meta_size(), 100);
    assert_eq!(m.record_sectors(), 8 + 8 + 16);
    assert_eq!(m.encode(seed).unwrap(), want);
    assert_eq!(MetaBlock::decode(&want, seed).unwrap(), m);
}

#[test]
fn empty_meta_block_golden_bytes() {
    // What md writes at a fresh tail and after recovery: header only, meta_size 32.
    let seed = LogSeed::from_uuid(&UUID);
    let mut want = vec![0u8; 4096];
    put(&mut want, 0, &[0x09, 0xc5, 0x33, 0x64]);
    want[8] = 1;
    want[12] = 32;
    put(&mut want, 16, &10_005u64.to_le_bytes());
    put(&mut want, 24, &4096u64.to_le_bytes());
    let crc = crc_bitwise(seed.0, &want);
    put(&mut want, 4, &crc.to_le_bytes());
    let m = MetaBlock {
        seq: 10_005,
        position_sectors: 4096,
        payloads: vec![],
    };
    assert_eq!(m.encode(seed).unwrap(), want);
}

#[test]
fn decode_rejects_each_kind_of_damage() {
    let seed = LogSeed::from_uuid(&UUID);
    let good = hand_block(seed.0);
    let resign = |mut b: Vec<u8>| {
        b[4..8].fill(0);
        let crc = crc_bitwise(seed.0, &b);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    };
    assert_eq!(
        MetaBlock::decode(&good[..4095], seed),
        Err(JournalError::ShortBlock(4095))
    );
    let mut b = good.clone();
    b[0] ^= 1;
    assert!(matches!(
        MetaBlock::decode(&b, seed),
        Err(JournalError::BadMagic(_))
    ));
    let mut b = good.clone();
    b[8] = 2;
    assert_eq!(
        MetaBlock::decode(&resign(b), seed),
        Err(JournalError::BadVersion(2))
    );
    // Another array's UUID: every checksum differs.
    let other = LogSeed::from_uuid(&[0u8; 16]);
    assert!(matches!(
        MetaBlock::decode(&good, other),
        Err(JournalError::BadChecksum { .. })
    ));
    // A bit flipped beyond meta_size is still covered by the checksum (md sums the page).
    let mut b = good.clone();
    b[4000] = 1;
    assert!(matches!(
        MetaBlock::decode(&b, seed),
        Err(JournalError::BadChecksum { .. })
    ));
    let mut b = good.clone();
    b[12..16].copy_from_slice(&4097u32.to_le_bytes());
    assert_eq!(
        MetaBlock::decode(&resign(b), seed),
        Err(JournalError::BadMetaSize(4097))
    );
    let mut b = good.clone();
    b[12..16].copy_from_slice(&31u32.to_le_bytes());
    assert_eq!(
        MetaBlock::decode(&resign(b), seed),
        Err(JournalError::BadMetaSize(31))
    );
    // Unknown payload type.
    let mut b = good.clone();
    b[32] = 3;
    assert!(matches!(
        MetaBlock::decode(&resign(b), seed),
        Err(JournalError::BadPayload { offset: 32, .. })
    ));
    // Data size not a whole page, and a checksum list running past meta_size.
    let mut b = good.clone();
    b[36] = 9;
    assert!(matches!(
        MetaBlock::decode(&resign(b), seed),
        Err(JournalError::BadPayload { offset: 32, .. })
    ));
    let mut b = good.clone();
    b[56] = 24; // parity claims 3 pages: its checksums overrun into the flush payload...
    b[12] = 72; // ...and meta_size cut right after the data payload and parity header
    assert!(matches!(
        MetaBlock::decode(&resign(b), seed),
        Err(JournalError::BadPayload { offset: 52, .. })
    ));
    // Flush size not a multiple of 8.
    let mut b = good.clone();
    b[80] = 12;
    assert!(matches!(
        MetaBlock::decode(&resign(b), seed),
        Err(JournalError::BadPayload { offset: 76, .. })
    ));
    // A truncated payload header.
    let mut b = good;
    b[12] = 34;
    assert!(matches!(
        MetaBlock::decode(&resign(b), seed),
        Err(JournalError::BadPayload { offset: 32, .. })
    ));
}

#[test]
fn encode_refuses_what_md_cannot_read() {
    let seed = LogSeed(0);
    let too_many = MetaBlock {
        seq: 1,
        position_sectors: 0,
        payloads: (0..204)
            .map(|i| Payload::Data {
                flags: 0,
                location_sectors: i * 8,
                checksums: vec![0],
            })
            .collect(),
    };
    // 32 + 204 * 20 = 4112 > 4096
    assert_eq!(too_many.encode(seed), Err(JournalError::TooLarge(4112)));
    let no_pages = MetaBlock {
        seq: 1,
        position_sectors: 0,
        payloads: vec![Payload::Parity {
            flags: 0,
            location_sectors: 0,
            checksums: vec![],
        }],
    };
    assert!(matches!(
        no_pages.encode(seed),
        Err(JournalError::BadPayload { .. })
    ));
}

#[test]
fn ring_wraps_as_md() {
    let r = LogRing::new(8 * 10 + 5).unwrap();
    assert_eq!(r.size_sectors(), 80);
    assert_eq!(r.add(72, 8), 0);
    assert_eq!(r.add(72, 16), 8);
    assert_eq!(r.add(0, 8), 8);
    assert_eq!(r.distance(72, 8), 16);
    assert_eq!(r.distance(8, 72), 64);
    assert_eq!(r.distance(8, 8), 0);
    assert!(LogRing::new(15).is_none());
}
