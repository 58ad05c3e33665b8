//! raid1 IO: n-way mirror, every member holds the whole array at the same offset.

use crate::array::Array;
use crate::error::ArrayError;
use crate::mirror::{self, bytes, RESYNC_STEP_SECTORS};
use uraid_core::{MemberIdx, SECTOR_BYTES};

fn copies(a: &Array, sector: u64) -> mirror::Copies {
    (0..a.raid_disks())
        .map(|i| (MemberIdx(i), sector))
        .collect()
}

pub(crate) fn read(a: &Array, sector: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
    // Sequential affinity: 1 MiB regions stick to one member, neighbours go to the next.
    let hint = (sector >> 11) as usize;
    mirror::read_piece(a, &copies(a, sector), hint, buf)
}

pub(crate) fn write(a: &Array, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
    // Lock region by region so that two overlapping writes cannot leave the copies different.
    let mut s = sector;
    let mut off = 0;
    while off < buf.len() {
        let region_end = (s / 128 + 1) * 128;
        let n = (((region_end - s) * SECTOR_BYTES) as usize).min(buf.len() - off);
        let _g = a.lock_mirror_region(s);
        mirror::write_piece(a, &copies(a, s), &buf[off..off + n])?;
        off += n;
        s += (n as u64) / SECTOR_BYTES;
    }
    Ok(())
}

pub(crate) fn resync(a: &Array) -> Result<u64, ArrayError> {
    let total = a.personality().array_sectors();
    let mut mismatches = 0;
    let mut s = 0;
    while s < total {
        let n = RESYNC_STEP_SECTORS.min(total - s);
        let _g = a.lock_mirror_region(s);
        if mirror::resync_piece(a, &copies(a, s), bytes(n))? {
            mismatches += 1;
        }
        s += n;
    }
    Ok(mismatches)
}
