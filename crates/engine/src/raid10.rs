//! raid10 IO: md's near/far/offset copies, one piece per chunk.

use crate::array::Array;
use crate::error::ArrayError;
use crate::mirror::{self, bytes};
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
    let hint = (sector >> 11) as usize;
    for_pieces(g, sector, buf.len(), |_, copies, off, n| {
        mirror::read_piece(a, &copies, hint, &mut buf[off..off + n])
    })
}

pub(crate) fn write(a: &Array, g: &Raid10, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
    for_pieces(g, sector, buf.len(), |s, copies, off, n| {
        // Pieces never cross a chunk, so locking the chunk serialises overlapping writes.
        let _g = a.lock_bucket(s / g.chunk_sectors);
        mirror::write_piece(a, &copies, &buf[off..off + n])
    })
}

pub(crate) fn resync(a: &Array, g: &Raid10) -> Result<u64, ArrayError> {
    let total = g.array_sectors();
    let mut mismatches = 0;
    let mut s = 0;
    while s < total {
        let m = g.map(s);
        let n = m.contiguous_sectors.min(total - s);
        let _g = a.lock_bucket(s / g.chunk_sectors);
        if mirror::resync_piece(a, &m.copies, bytes(n))? {
            mismatches += 1;
        }
        s += n;
    }
    Ok(mismatches)
}
