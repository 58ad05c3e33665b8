//! Shared IO for the mirrored levels (raid1, raid10): read one live copy, write every live
//! copy. The level modules say where the copies of a sector are.

use crate::array::{no_redundancy, Array, OpList};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use std::sync::atomic::Ordering;
use uraid_core::{MemberIdx, SECTOR_BYTES};

/// Copies of one contiguous piece: (role, member sector) for each copy.
pub(crate) type Copies = Vec<(MemberIdx, u64)>;

/// Read `buf` (one piece, contiguous on every copy) from a live copy, trying the others on
/// error. `hint` spreads reads over the copies (sequential reads stay on one member).
pub(crate) fn read_piece(
    a: &Array,
    copies: &Copies,
    hint: usize,
    buf: &mut [u8],
) -> Result<(), ArrayError> {
    let n = copies.len();
    for attempt in 0..n {
        let (role, msec) = copies[(hint + attempt) % n];
        if a.live(role).is_none() {
            continue;
        }
        let mut ops = OpList::new();
        ops.read(a, role, msec, buf);
        if ops.run(a).is_empty() {
            if attempt > 0 {
                a.stats.degraded_reads.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        }
    }
    Err(no_redundancy(a, "read"))
}

/// Write one piece to every live copy. Succeeds while at least one copy took the data.
pub(crate) fn write_piece(a: &Array, copies: &Copies, buf: &[u8]) -> Result<(), ArrayError> {
    let mut ops = OpList::new();
    let mut live = 0;
    for &(role, msec) in copies {
        if a.live(role).is_some() {
            ops.write(a, role, msec, buf);
            live += 1;
        }
    }
    if live == 0 {
        return Err(no_redundancy(a, "write"));
    }
    let failed = ops.run(a);
    if failed.len() == live {
        return Err(no_redundancy(a, "write"));
    }
    Ok(())
}

/// Make all copies of a piece equal to the first live copy; returns whether they differed.
pub(crate) fn resync_piece(a: &Array, copies: &Copies, len: usize) -> Result<bool, ArrayError> {
    let live: Vec<(MemberIdx, u64)> = copies
        .iter()
        .copied()
        .filter(|(r, _)| a.live(*r).is_some())
        .collect();
    if live.len() < 2 {
        return Ok(false);
    }
    let mut bufs: Vec<AlignedBuf> = live.iter().map(|_| AlignedBuf::new(len)).collect();
    let mut ops = OpList::new();
    for ((role, msec), b) in live.iter().zip(bufs.iter_mut()) {
        ops.read(a, *role, *msec, b);
    }
    if !ops.run(a).is_empty() {
        return Err(ArrayError::Failed("read error during resync".into()));
    }
    let mut differ = false;
    let mut ops = OpList::new();
    for (i, (role, msec)) in live.iter().enumerate().skip(1) {
        if bufs[i][..] != bufs[0][..] {
            differ = true;
            ops.write(a, *role, *msec, &bufs[0]);
        }
    }
    ops.run(a);
    Ok(differ)
}

/// Sectors per resync step.
pub(crate) const RESYNC_STEP_SECTORS: u64 = 2048;

pub(crate) fn bytes(sectors: u64) -> usize {
    (sectors * SECTOR_BYTES) as usize
}
