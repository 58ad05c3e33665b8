//! Arbitrary bytes into the raid5-cache journal: the meta block parser, and the replay
//! scanner over a ring made of the input. Corrupt, truncated and out-of-order meta blocks
//! must stop the scan at the last valid record, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::convert::Infallible;
use uraid_core::geometry::{ArrayGeometry, ParityGeometry};
use uraid_core::journal::*;
use uraid_core::Level;

const SEED: LogSeed = LogSeed(0x0bad_cafe);

/// Give a block carrying the magic a valid checksum, so the fuzzer reaches the payloads.
fn sign(block: &mut [u8]) {
    if block[0..4] == R5LOG_MAGIC.to_le_bytes() {
        block[4..8].fill(0);
        let crc = crc32c_le(SEED.0, block);
        block[4..8].copy_from_slice(&crc.to_le_bytes());
    }
}

fuzz_target!(|data: &[u8]| {
    // The parser on the raw bytes (almost always a checksum error) and re-signed.
    let mut block = vec![0u8; BLOCK_BYTES];
    let n = data.len().min(BLOCK_BYTES);
    block[..n].copy_from_slice(&data[..n]);
    let _ = MetaBlock::decode(&block, SEED);
    sign(&mut block);
    if let Ok(m) = MetaBlock::decode(&block, SEED) {
        let again = m.encode(SEED).expect("a decoded block encodes");
        assert_eq!(MetaBlock::decode(&again, SEED), Ok(m));
    }

    // The scanner over a ring of the input's blocks, each meta block re-signed; pages keep
    // whatever checksums the input gives them.
    let blocks = (data.len() / BLOCK_BYTES).clamp(2, 64);
    let mut ring_bytes = vec![0u8; blocks * BLOCK_BYTES];
    let n = data.len().min(ring_bytes.len());
    ring_bytes[..n].copy_from_slice(&data[..n]);
    for b in ring_bytes.chunks_mut(BLOCK_BYTES) {
        sign(b);
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
        seq: u64::from_le_bytes(ring_bytes[16..24].try_into().unwrap()),
    };
    let r: Result<Scan, Infallible> = scan(&ring, SEED, &g, start, |pos, buf| {
        let at = pos as usize * 512;
        buf.copy_from_slice(&ring_bytes[at..at + BLOCK_BYTES]);
        Ok(())
    });
    let s = r.unwrap();
    assert!(s.meta_blocks <= blocks as u64);
    for st in s.stripes.iter().chain(&s.data_only) {
        for p in st.data.iter().chain(&st.parity) {
            let at = p.log_sectors as usize * 512;
            assert_eq!(
                SEED.page_checksum(&ring_bytes[at..at + BLOCK_BYTES]),
                p.checksum
            );
        }
    }
    assert!(s.stripes.iter().all(|st| st.is_complete()));
});
