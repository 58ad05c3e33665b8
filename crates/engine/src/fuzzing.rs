//! Fuzz target bodies for the engine's parsers of on-disk bytes (see `uraid_core::fuzzing`
//! for the superblock, bitmap and journal). Run on stable by `tests/fuzz.rs`.

use crate::badblocks::BadBlocks;

fn check_badblocks(log: &[u8], shift: u8) {
    let Ok(bb) = BadBlocks::decode(log, shift) else {
        return;
    };
    // Every entry before the end marker is recorded at the sectors it names: nothing wraps.
    for c in log.chunks_exact(8) {
        let e = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        if e == u64::MAX {
            break;
        }
        let start = u128::from(e >> 10) << shift;
        let end = start + (u128::from(e & 0x3ff) << shift);
        assert!(
            end <= u128::from(u64::MAX),
            "entry {e:#x} << {shift} was accepted"
        );
        assert!(
            bb.overlaps(start as u64, 1) && bb.overlaps(end as u64 - 1, 1),
            "entry {e:#x} (shift {shift}) is not in the list {:?}",
            bb.ranges()
        );
    }
    let ranges = bb.ranges();
    for w in ranges.windows(2) {
        assert!(
            w[0].0 + w[0].1 < w[1].0,
            "ranges overlap or touch: {ranges:?}"
        );
    }
    // Written back into a log as large, it reads the same.
    let sectors = u16::try_from(log.len().div_ceil(512).max(1)).unwrap_or(u16::MAX);
    if let Some(bytes) = bb.encode(shift, sectors) {
        assert_eq!(BadBlocks::decode(&bytes, shift).as_ref(), Ok(&bb));
    }
}

/// md's bad block log: the first byte is `bblog_shift` (as the superblock gives it, any
/// value, and reduced to the small shifts md uses), the rest the log area.
pub fn badblocks(data: &[u8]) {
    let Some((&shift, log)) = data.split_first() else {
        return;
    };
    check_badblocks(log, shift);
    check_badblocks(log, shift & 7);
}

/// Logs to mutate: a few entries at shift 0 and 3, and an empty log.
pub fn badblocks_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for shift in [0u8, 3] {
        let mut bb = BadBlocks::default();
        bb.add(8, 1);
        bb.add(4096, 700);
        bb.add(1 << 40, 16);
        let mut v = vec![shift];
        v.extend(bb.encode(shift, 1).expect("fits one sector"));
        out.push(v);
    }
    out.push([vec![0], vec![0xff; 512]].concat());
    out
}
