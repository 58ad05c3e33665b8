//! raid10 IO: md's near/far/offset copies, one piece per chunk. The recovery unit is the
//! array chunk: a recovering member holds valid copies of every chunk below its cursor.

use crate::array::Array;
use crate::error::ArrayError;
use crate::mirror::{self, bytes, SyncCtx};
use uraid_core::geometry::Raid10;
use uraid_core::SECTOR_BYTES;

fn for_pieces(
    g: &Raid10,
    sector: u64,
    len: usize,
    mut f: impl FnMut(u64, mirror::Copies, usize, usize) -> Result<(), ArrayError>,
) -> Result<(), ArrayError> {
    let mut s = sector;
    let mut off = 0usize;
    while off < len {
        let m = g.map(s);
        let n = ((m.contiguous_sectors * SECTOR_BYTES) as usize).min(len - off);
        f(s, m.copies, off, n)?;
        off += n;
        s += (n as u64) / SECTOR_BYTES;
    }
    Ok(())
}

pub(crate) fn read(a: &Array, g: &Raid10, sector: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
    for_pieces(g, sector, buf.len(), |s, copies, off, n| {
        let chunk = s / g.chunk_sectors;
        let _pending = a.barriers.wait_barrier(chunk);
        mirror::read_piece(a, &copies, chunk, &mut buf[off..off + n])
    })
}

pub(crate) fn write(a: &Array, g: &Raid10, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
    for_pieces(g, sector, buf.len(), |s, copies, off, n| {
        // Pieces never cross a chunk: the chunk's barrier keeps sync out, its write lock
        // serialises overlapping writes (reads take only the barrier).
        let chunk = s / g.chunk_sectors;
        let _pending = a.barriers.wait_barrier(chunk);
        let _g = a.lock_bucket(chunk);
        mirror::write_piece(a, &copies, chunk, &buf[off..off + n])
    })
}

/// Discard or zero array sectors [sector, sector+sectors) on every copy, chunk by chunk as
/// writes go.
pub(crate) fn zero(
    a: &Array,
    g: &Raid10,
    sector: u64,
    sectors: u64,
    kind: crate::discard::Kind,
) -> Result<(), ArrayError> {
    let len = (sectors * SECTOR_BYTES) as usize;
    for_pieces(g, sector, len, |s, copies, _, n| {
        let chunk = s / g.chunk_sectors;
        let _pending = a.barriers.wait_barrier(chunk);
        let _g = a.lock_bucket(chunk);
        mirror::zero_piece(a, &copies, chunk, n as u64 / SECTOR_BYTES, kind)
    })
}

/// Sync whole chunks from array sector `start` (chunk aligned), at most `max` sectors;
/// returns (sectors done, mismatched sectors).
pub(crate) fn sync_range(
    a: &Array,
    g: &Raid10,
    start: u64,
    max: u64,
    ctx: &SyncCtx,
) -> Result<(u64, u64), ArrayError> {
    let total = g.array_sectors();
    let end = (start + max.max(g.chunk_sectors)).min(total);
    let mut mismatches = 0;
    let mut s = start;
    while s < end {
        let m = g.map(s);
        let n = m.contiguous_sectors.min(total - s);
        let chunk = s / g.chunk_sectors;
        let _raised = a.barriers.raise(chunk);
        let skip = ctx.skip_clean && a.bitmap_clean(s, n);
        if !skip && mirror::sync_piece(a, &m.copies, chunk, bytes(n), ctx.mode, ctx.targets)? {
            mismatches += n;
        }
        s += n;
        if s.is_multiple_of(g.chunk_sectors) {
            ctx.advance(a, s / g.chunk_sectors);
        }
    }
    Ok((s - start, mismatches))
}
