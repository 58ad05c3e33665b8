//! raid1 IO: n-way mirror, every member holds the whole array at the same offset.
//! The recovery unit is the sector (member sector = array sector).

use crate::array::Array;
use crate::error::ArrayError;
use crate::mirror::{self, bytes, SyncCtx, RESYNC_STEP_SECTORS};
use uraid_core::{MemberIdx, SECTOR_BYTES};

/// Mirror write-lock region, in sectors: pieces never cross one.
pub(crate) const REGION_SECTORS: u64 = 128;

fn copies(a: &Array, sector: u64) -> mirror::Copies {
    (0..a.raid_disks())
        .map(|i| (MemberIdx(i), sector))
        .collect()
}

/// The recovery unit of a piece that starts at `sector`: a recovering member is valid for
/// it only when the whole piece lies below the cursor.
fn unit(sector: u64, len: usize) -> u64 {
    sector + (len as u64).div_ceil(SECTOR_BYTES) - 1
}

pub(crate) fn read(a: &Array, sector: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
    // Sequential affinity: 1 MiB regions stick to one member, neighbours go to the next.
    let hint = (sector >> 11) as usize;
    // Only a recovering member needs reads cut at its cursor's granularity.
    let split = a.any_recovering();
    let mut s = sector;
    let mut off = 0;
    while off < buf.len() {
        let n = if split {
            (((REGION_SECTORS - s % REGION_SECTORS) * SECTOR_BYTES) as usize).min(buf.len() - off)
        } else {
            buf.len() - off
        };
        mirror::read_piece(a, &copies(a, s), unit(s, n), hint, &mut buf[off..off + n])?;
        off += n;
        s += (n as u64) / SECTOR_BYTES;
    }
    Ok(())
}

pub(crate) fn write(a: &Array, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
    // Lock region by region so that two overlapping writes cannot leave the copies different.
    let mut s = sector;
    let mut off = 0;
    while off < buf.len() {
        let n =
            (((REGION_SECTORS - s % REGION_SECTORS) * SECTOR_BYTES) as usize).min(buf.len() - off);
        let _g = a.lock_bucket(s / REGION_SECTORS);
        mirror::write_piece(a, &copies(a, s), unit(s, n), &buf[off..off + n])?;
        off += n;
        s += (n as u64) / SECTOR_BYTES;
    }
    Ok(())
}

/// Sync (resync, check, repair, recovery) from array sector `start`, at most `max` sectors;
/// returns (sectors done, mismatched sectors).
pub(crate) fn sync_range(
    a: &Array,
    start: u64,
    max: u64,
    ctx: &SyncCtx,
) -> Result<(u64, u64), ArrayError> {
    let total = a.personality().array_sectors();
    let end = (start + max).min(total);
    let mut mismatches = 0;
    let mut s = start;
    while s < end {
        let n = RESYNC_STEP_SECTORS
            .min(REGION_SECTORS - s % REGION_SECTORS)
            .min(end - s);
        let _g = a.lock_bucket(s / REGION_SECTORS);
        let skip = ctx.skip_clean && a.bitmap_clean(s, n);
        if !skip
            && mirror::sync_piece(
                a,
                &copies(a, s),
                unit(s, bytes(n)),
                bytes(n),
                ctx.mode,
                ctx.targets,
            )?
        {
            mismatches += n;
        }
        ctx.advance(a, s + n);
        s += n;
    }
    Ok((s - start, mismatches))
}
