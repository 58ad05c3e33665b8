//! Fuzz target bodies for the parsers of on-disk bytes, which a member hands us and which
//! may be anything. Each body panics only on a broken promise: a decoder must return an
//! error for bad bytes, never panic, and what it accepts must encode back to a record that
//! decodes the same. The `fuzz/` cargo-fuzz targets (nightly) and the stable driver in each
//! crate's `tests/fuzz.rs` call these; `*_seeds` are valid encodings to start mutating from.

use crate::bitmap::{self, BitmapSuper};
use crate::geometry::{ArrayGeometry, ParityGeometry};
use crate::journal::*;
use crate::superblock::{self, CreateSpec, Superblock, SB_FIXED_BYTES};
use crate::Level;
use std::convert::Infallible;

/// Without a valid checksum the decoders stop at it; fuzzing both the raw input and a copy
/// with the checksum fixed reaches the fields behind it.
fn resign_superblock(b: &mut [u8]) {
    if b.len() < SB_FIXED_BYTES {
        return;
    }
    let max_dev = superblock::le::u32_at(b, superblock::off::MAX_DEV) as usize;
    let need = SB_FIXED_BYTES + 2 * max_dev.min(1 << 16);
    if b.len() < need {
        return;
    }
    let csum = superblock::checksum(&b[..need]);
    superblock::le::put(b, superblock::off::SB_CSUM, &csum.to_le_bytes());
}

fn check_superblock(b: &[u8]) {
    let Ok(sb) = Superblock::decode(b) else {
        return;
    };
    // decode validated it, so encode (which asserts validity) must take it.
    let again = sb.encode();
    let mut back = Superblock::decode(&again).expect("an encoded superblock decodes");
    // The checksum differs when the input had bytes after set_name's NUL (ignored, as md
    // and mdadm ignore them, and written back as zeros); every field must survive.
    back.sb_csum = sb.sb_csum;
    assert_eq!(back, sb, "a superblock changed through encode and decode");
    // The accessors the engine and the reports use must take any accepted record.
    let _ = (
        sb.name(),
        sb.homehost(),
        sb.bitmap_sector(),
        sb.bblog_sector(),
    );
    let _ = (
        sb.ppl(),
        sb.slot_counts(),
        sb.role_of_this_device(),
        sb.active_slot(),
    );
    let _ = (
        sb.sb_bytes(),
        sb.max_dev(),
        sb.is_clean(),
        sb.ctime_secs(),
        sb.utime_secs(),
    );
}

/// md superblock v1.x (1.0, 1.1 and 1.2 differ only in where it sits): decode, and decode
/// after the checksum is fixed.
pub fn superblock(data: &[u8]) {
    check_superblock(data);
    let mut b = data.to_vec();
    resign_superblock(&mut b);
    check_superblock(&b);
}

/// Valid v1.x superblocks: raid5 with a bitmap and a bad block log, raid1 as v1.0 (at the
/// end) and v1.1 (at the start), raid6 degraded with a spare.
pub fn superblock_seeds() -> Vec<Vec<u8>> {
    let spec = |level: i32, raid_disks: u32, bitmap: bool| CreateSpec {
        set_uuid: [0x5a; 16],
        set_name: "host:md0".into(),
        ctime_secs: 1_700_000_000,
        level,
        layout: if level == 1 { 0 } else { 2 },
        chunk_sectors: if level == 1 { 0 } else { 1024 },
        raid_disks,
        spares: 1,
        missing: vec![1],
        size_sectors: 126_976,
        data_offset_sectors: 4096,
        internal_bitmap: bitmap.then_some((8, 8)),
        bad_block_log: true,
        clean: false,
        version: superblock::MetadataVersion::V1_2,
    };
    let mut out = Vec::new();
    for (s, dev) in [
        (spec(5, 4, true), 0),
        (spec(6, 5, false), 5),
        (spec(1, 2, true), 0),
    ] {
        let sb = Superblock::new_for_create(&s, dev, [7; 16], 131_072).expect("seed superblock");
        out.push(sb.encode());
        if s.level == 1 {
            for super_offset in [0, 131_072 - 16] {
                let mut v = sb.clone();
                v.super_offset = super_offset;
                if v.validate().is_ok() {
                    out.push(v.encode());
                }
            }
        }
    }
    out
}

/// A 0.90 record's checksum, fixed in the byte order its magic reads in.
fn resign_superblock090(b: &mut [u8]) {
    use crate::superblock090::{checksum090, ByteOrder, MD_SB_MAGIC, SB090_BYTES};
    if b.len() < SB090_BYTES {
        return;
    }
    let magic = [b[0], b[1], b[2], b[3]];
    let order = if u32::from_le_bytes(magic) == MD_SB_MAGIC {
        ByteOrder::Little
    } else if u32::from_be_bytes(magic) == MD_SB_MAGIC {
        ByteOrder::Big
    } else {
        return;
    };
    let csum = checksum090(b, order);
    let bytes = match order {
        ByteOrder::Little => csum.to_le_bytes(),
        ByteOrder::Big => csum.to_be_bytes(),
    };
    // sb_csum is word 38.
    b[152..156].copy_from_slice(&bytes);
}

fn check_superblock090(b: &[u8]) {
    use crate::superblock090::{Sb090Context, Superblock090};
    let Ok(rec) = Superblock090::decode(b) else {
        return;
    };
    // decode validated it, so encode (which asserts validity) must take it, and the record
    // must come back whole (words md does not define are written as zeros, which changes
    // only the checksum).
    let again = rec.encode();
    let mut back = Superblock090::decode(&again).expect("an encoded 0.90 record decodes");
    back.sb_csum = rec.sb_csum;
    assert_eq!(back, rec, "a 0.90 record changed through encode and decode");
    let _ = (rec.uuid_string(), rec.is_clean(), rec.size_sectors());
    let _ = crate::support::check090(&rec);
    // The v1 model on devices of a few sizes, and back: errors, never a panic.
    for device_sectors in [
        0,
        127,
        128,
        255,
        8192,
        u64::from(rec.size_kib) * 2 + 128,
        u64::MAX,
    ] {
        let Ok(sb) = rec.to_v1(device_sectors) else {
            continue;
        };
        let _ = crate::support::check(&sb);
        let cx = Sb090Context::from_record(&rec);
        if let Ok(rec2) = Superblock090::from_v1(&sb, &cx) {
            let _ = Superblock090::decode(&rec2.encode()).expect("from_v1 writes a valid record");
        }
    }
}

/// md superblock 0.90 (either byte order): decode, and decode after the checksum is fixed;
/// what decodes goes through encode, the v1 model and back.
pub fn superblock090(data: &[u8]) {
    check_superblock090(data);
    let mut b = data.to_vec();
    resign_superblock090(&mut b);
    check_superblock090(&b);
}

/// Valid 0.90 records: raid5 degraded with a spare and a bitmap (little-endian), raid1
/// dirty (big-endian), raid0.
pub fn superblock090_seeds() -> Vec<Vec<u8>> {
    use crate::superblock090::{new_v1_for_create, ByteOrder, Sb090Context, Superblock090};
    let spec = |level: i32, raid_disks: u32, bitmap: bool, clean: bool| CreateSpec {
        set_uuid: [0x90; 16],
        set_name: String::new(),
        ctime_secs: 1_700_000_000,
        level,
        layout: if level == 5 { 2 } else { 0 },
        chunk_sectors: if level == 1 { 0 } else { 128 },
        raid_disks,
        spares: 1,
        missing: if level == 0 { vec![] } else { vec![1] },
        size_sectors: 16_128,
        data_offset_sectors: 0,
        internal_bitmap: bitmap.then_some((8, 8)),
        bad_block_log: false,
        clean,
        version: superblock::MetadataVersion::V1_0,
    };
    let mut out = Vec::new();
    for (s, order) in [
        (spec(5, 4, true, true), ByteOrder::Little),
        (spec(1, 2, false, false), ByteOrder::Big),
        (spec(0, 3, false, true), ByteOrder::Little),
    ] {
        let sb = new_v1_for_create(&s, 0, 16_384).expect("seed 0.90 superblock");
        let cx = Sb090Context {
            present: (0..s.raid_disks + s.spares).collect(),
            ..Sb090Context::default()
        };
        let mut rec = Superblock090::from_v1(&sb, &cx).expect("seed 0.90 record");
        rec.byte_order = order;
        out.push(rec.encode());
    }
    out
}

fn resign_bitmap(b: &mut [u8]) {
    // The bitmap superblock has no checksum; its magic and version gate it.
    if b.len() >= 8 {
        b[0..4].copy_from_slice(&bitmap::BITMAP_MAGIC.to_le_bytes());
    }
}

fn check_bitmap(b: &[u8]) {
    let Ok(bms) = BitmapSuper::decode(b) else {
        return;
    };
    let again = bms.encode();
    assert_eq!(
        BitmapSuper::decode(&again).as_ref(),
        Ok(&bms),
        "a bitmap superblock changed through encode and decode"
    );
    let _ = (
        bms.chunks(),
        bms.bits_bytes(),
        bms.space_bytes(),
        bms.chunk_sectors(),
    );
    let _ = (bms.cluster_name_str(), bms.chunk_of_sector(u64::MAX >> 9));
}

/// md's bitmap superblock: decode the input, and decode it with the magic set.
pub fn bitmap_super(data: &[u8]) {
    check_bitmap(data);
    let mut b = data.to_vec();
    resign_bitmap(&mut b);
    check_bitmap(&b);
}

/// Valid bitmap superblocks: small and large arrays, the default daemon sleep.
pub fn bitmap_super_seeds() -> Vec<Vec<u8>> {
    [(126_976, 64 << 20), (30_721 * 8, 4096), (1 << 40, 1 << 30)]
        .iter()
        .filter_map(|&(sectors, chunk)| BitmapSuper::new([9; 16], sectors, chunk, 5).ok())
        .map(|b| b.encode().to_vec())
        .collect()
}

const JOURNAL_SEED: LogSeed = LogSeed(0x0bad_cafe);

/// Give a block carrying the magic a valid checksum, so mutations reach the payloads.
fn sign_meta(block: &mut [u8]) {
    if block[0..4] == R5LOG_MAGIC.to_le_bytes() {
        block[4..8].fill(0);
        let crc = crc32c_le(JOURNAL_SEED.0, block);
        block[4..8].copy_from_slice(&crc.to_le_bytes());
    }
}

/// The raid5-cache journal: the meta block parser on the input's first block (raw and
/// re-signed), and the replay scanner over a ring made of the input's blocks. Corrupt,
/// truncated and out-of-order meta blocks must stop the scan at the last valid record.
pub fn journal(data: &[u8]) {
    let mut block = vec![0u8; BLOCK_BYTES];
    let n = data.len().min(BLOCK_BYTES);
    block[..n].copy_from_slice(&data[..n]);
    let _ = MetaBlock::decode(&block, JOURNAL_SEED);
    sign_meta(&mut block);
    if let Ok(m) = MetaBlock::decode(&block, JOURNAL_SEED) {
        let again = m.encode(JOURNAL_SEED).expect("a decoded block encodes");
        assert_eq!(MetaBlock::decode(&again, JOURNAL_SEED), Ok(m));
    }

    // The scanner over a ring of the input's blocks, each meta block re-signed; pages keep
    // whatever checksums the input gives them.
    let blocks = (data.len() / BLOCK_BYTES).clamp(2, 64);
    let mut ring_bytes = vec![0u8; blocks * BLOCK_BYTES];
    let n = data.len().min(ring_bytes.len());
    ring_bytes[..n].copy_from_slice(&data[..n]);
    for b in ring_bytes.chunks_mut(BLOCK_BYTES) {
        sign_meta(b);
    }
    let level = if data.first().is_some_and(|b| b & 1 == 1) {
        Level::Raid6
    } else {
        Level::Raid5
    };
    let g = ParityGeometry::new(&ArrayGeometry {
        level,
        layout: 2,
        chunk_sectors: 16,
        raid_disks: 5,
        dev_sectors: 16 * 8,
        member_sectors: Vec::new(),
    })
    .expect("geometry");
    let ring = LogRing::new(blocks as u64 * BLOCK_SECTORS).expect("two blocks");
    let start = ScanStart {
        tail_sectors: 0,
        seq: u64::from_le_bytes(ring_bytes[16..24].try_into().expect("8 bytes")),
    };
    let r: Result<Scan, Infallible> = scan(&ring, JOURNAL_SEED, &g, start, |pos, buf| {
        let at = pos as usize * 512;
        buf.copy_from_slice(&ring_bytes[at..at + BLOCK_BYTES]);
        Ok(())
    });
    let s = r.expect("reads do not fail");
    assert!(s.meta_blocks <= blocks as u64);
    for st in s.stripes.iter().chain(&s.data_only) {
        for p in st.data.iter().chain(&st.parity) {
            let at = p.log_sectors as usize * 512;
            assert_eq!(
                JOURNAL_SEED.page_checksum(&ring_bytes[at..at + BLOCK_BYTES]),
                p.checksum,
                "the scan took a page whose checksum does not match"
            );
        }
    }
    assert!(s.stripes.iter().all(|st| st.is_complete()));
}

/// Journal rings to mutate: an empty meta block, and a record with data, parity and flush
/// payloads followed by its pages and an empty block.
pub fn journal_seeds() -> Vec<Vec<u8>> {
    let empty = MetaBlock {
        seq: 10,
        position_sectors: 0,
        payloads: Vec::new(),
    };
    let page = vec![0x5au8; BLOCK_BYTES];
    let sum = JOURNAL_SEED.page_checksum(&page);
    let full = MetaBlock {
        seq: 7,
        position_sectors: 0,
        payloads: vec![
            Payload::Data {
                flags: 0,
                location_sectors: 0,
                checksums: vec![sum],
            },
            Payload::Parity {
                flags: 0,
                location_sectors: 0,
                checksums: vec![sum, sum],
            },
            Payload::Flush {
                flags: 0,
                stripe_sectors: vec![16],
            },
        ],
    };
    let next = MetaBlock {
        seq: 8,
        position_sectors: full.record_sectors(),
        payloads: Vec::new(),
    };
    let mut ring = full.encode(JOURNAL_SEED).expect("seed block");
    for _ in 0..3 {
        ring.extend_from_slice(&page);
    }
    ring.extend(next.encode(JOURNAL_SEED).expect("seed block"));
    vec![empty.encode(JOURNAL_SEED).expect("seed block"), ring]
}

/// md's PPL: the header decoder (raw, and re-signed so the entries are reached), the area
/// walk over the input as an area, and each accepted entry's extent, which must stay inside
/// one stripe.
pub fn ppl(data: &[u8]) {
    use crate::ppl::*;
    let mut page = vec![0u8; PPL_HEADER_SIZE];
    let n = data.len().min(PPL_HEADER_SIZE);
    page[..n].copy_from_slice(&data[..n]);
    let _ = PplHeader::decode(&page);
    // Re-sign: checksum over the page with the field zero.
    page[532..536].fill(0);
    let crc = crc32c::crc32c(&page);
    page[532..536].copy_from_slice(&crc.to_le_bytes());
    if let Ok(h) = PplHeader::decode(&page) {
        assert_eq!(PplHeader::decode(&h.encode()), Ok(h.clone()));
        let chunk = 1u64 << (data.first().copied().unwrap_or(3) % 8 + 3);
        let dd = u64::from(data.get(1).copied().unwrap_or(2) % 7 + 1);
        for (i, e) in h.entries.iter().enumerate() {
            if let Ok(x) = entry_extent(i, e, chunk, dd) {
                let stripe = chunk * dd;
                let end = x.first_sector - x.first_sector % stripe + stripe;
                for d in 0..x.data_disks {
                    let rows = x.rows_of(d, chunk);
                    assert!(rows == 0 || x.first_sector + d * chunk + rows <= end);
                }
            }
        }
    }
    let sectors = (data.len() / 512) as u64;
    let _ = find_latest(sectors, 0, |at| {
        let o = (at * 512) as usize;
        data.get(o..o + PPL_HEADER_SIZE).map(|b| b.to_vec())
    });
}

/// An empty header and one with entries of each kind.
pub fn ppl_seeds() -> Vec<Vec<u8>> {
    use crate::ppl::*;
    let full = PplHeader {
        signature: 0,
        generation: 3,
        entries: vec![
            PplEntry {
                data_sector: 8,
                pp_size: 4096,
                data_size: 8192,
                parity_disk: 2,
                checksum: 1,
            },
            PplEntry {
                data_sector: 0,
                pp_size: 0,
                data_size: 3 * 4096,
                parity_disk: 3,
                checksum: 0,
            },
        ],
    };
    let mut two = PplHeader::empty(0).encode().to_vec();
    two.extend_from_slice(&[0u8; 4096]);
    vec![
        PplHeader::empty(0).encode().to_vec(),
        full.encode().to_vec(),
        two,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds are what they claim: valid records (so mutations start deep).
    #[test]
    fn seeds_decode() {
        for s in superblock_seeds() {
            Superblock::decode(&s).expect("superblock seed");
        }
        assert!(superblock_seeds().len() >= 3);
        for s in bitmap_super_seeds() {
            BitmapSuper::decode(&s).expect("bitmap seed");
        }
        for s in journal_seeds() {
            MetaBlock::decode(&s[..BLOCK_BYTES], JOURNAL_SEED).expect("journal seed");
        }
    }
}
