//! raid10 IO: md's near/far/offset copies, one piece per chunk. The recovery unit is the
//! array chunk: a recovering member holds valid copies of every chunk below its cursor.

use crate::array::{Array, Personality, ZeroKind};
use crate::error::ArrayError;
use crate::in_order::in_order;
use crate::mirror::{self, bytes, MirrorConf, SyncCtx};
use std::sync::atomic::{AtomicU64, Ordering};
use uraid_core::geometry::Raid10;
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

fn for_pieces(
    g: &Raid10,
    sector: u64,
    len: usize,
    mut f: impl FnMut(
        u64,
        uraid_core::geometry::StripeList<(MemberIdx, u64)>,
        usize,
        usize,
    ) -> Result<(), ArrayError>,
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

pub(crate) fn read(
    a: &Array,
    c: &MirrorConf,
    g: &Raid10,
    sector: u64,
    buf: &mut [u8],
) -> Result<(), ArrayError> {
    for_pieces(g, sector, buf.len(), |s, copies, off, n| {
        let chunk = s / g.chunk_sectors;
        let _pending = c.barriers.wait_barrier(chunk);
        mirror::read_piece(a, c, &copies, chunk, &mut buf[off..off + n])
    })
}

pub(crate) fn write(
    a: &Array,
    c: &MirrorConf,
    g: &Raid10,
    sector: u64,
    buf: &[u8],
) -> Result<(), ArrayError> {
    for_pieces(g, sector, buf.len(), |s, copies, off, n| {
        // Pieces never cross a chunk: the chunk's barrier keeps sync out, its write lock
        // serialises overlapping writes (reads take only the barrier).
        let chunk = s / g.chunk_sectors;
        let _pending = c.barriers.wait_barrier(chunk);
        let _g = c.lock_bucket(chunk);
        mirror::write_piece(a, &copies, (chunk, chunk), &buf[off..off + n])
    })
}

/// Discard or zero array sectors [sector, sector+sectors) on every copy, chunk by chunk as
/// writes go.
pub(crate) fn zero(
    a: &Array,
    c: &MirrorConf,
    g: &Raid10,
    sector: u64,
    sectors: u64,
    kind: ZeroKind,
) -> Result<(), ArrayError> {
    let len = (sectors * SECTOR_BYTES) as usize;
    for_pieces(g, sector, len, |s, copies, _, n| {
        let chunk = s / g.chunk_sectors;
        let _pending = c.barriers.wait_barrier(chunk);
        let _g = c.lock_bucket(chunk);
        mirror::zero_piece(a, &copies, chunk, n as u64 / SECTOR_BYTES, kind)
    })
}

/// Sync whole chunks from array sector `start` (chunk aligned), at most `max` sectors;
/// returns (sectors done, mismatched sectors).
pub(crate) fn sync_range(
    a: &Array,
    c: &MirrorConf,
    g: &Raid10,
    start: u64,
    max: u64,
    ctx: &SyncCtx,
) -> Result<(u64, u64), ArrayError> {
    let total = g.array_sectors();
    let end = (start + max.max(g.chunk_sectors)).min(total);
    let mismatches = AtomicU64::new(0);
    let mut s = start;
    // Pieces side by side on the sync threads (`in_order`); the cursor moves in order.
    // An item is one piece to sync, after the pieces before it that need nothing.
    in_order(
        c.sync_threads.load(Ordering::Relaxed),
        || {
            let from = s;
            while s < end {
                let m = g.map(s);
                let n = m.contiguous_sectors.min(total - s);
                // A recovery rebuilds its targets only, as md's raid10 recovery does: a
                // chunk with no copy on a target is passed over (comparing copies is a
                // resync's job), and taken with the next piece that needs work, so that
                // every item gives a thread something to do.
                let needed =
                    ctx.targets.is_empty() || m.copies.iter().any(|(r, _)| ctx.targets.contains(r));
                s += n;
                if needed {
                    let raised = c.barriers.raise((s - n) / g.chunk_sectors);
                    return Some((s - n, n, Some((m.copies, raised))));
                }
            }
            // Only pieces that need nothing were left: the cursor still passes them.
            (s > from).then_some((s, 0, None))
        },
        |(s, n, piece)| {
            let Some((copies, _)) = piece else {
                return Ok(0);
            };
            if ctx.skip_clean && a.bitmap_clean(*s, *n) {
                return Ok(0);
            }
            let chunk = *s / g.chunk_sectors;
            mirror::sync_piece(a, *s, copies, chunk, bytes(*n), ctx.mode, ctx.targets)
        },
        |(s, n, piece), mismatched| {
            mismatches.fetch_add(mismatched?, Ordering::Relaxed);
            if (s + n).is_multiple_of(g.chunk_sectors) {
                ctx.advance(a, (s + n) / g.chunk_sectors);
            }
            // The barrier drops after the cursor has moved.
            drop(piece);
            Ok(())
        },
    )?;
    Ok((s - start, mismatches.into_inner()))
}

/// raid10's conf (md's r10conf): the mirror's barriers, write locks and read heads.
pub(crate) struct Raid10Conf {
    map: Raid10,
    mirror: MirrorConf,
}

impl Raid10Conf {
    pub(crate) fn new(map: Raid10) -> Raid10Conf {
        // md's raid10 balances reads without looking at write-mostly (md.rst: the flag
        // "applies only to raid1 arrays"); failfast it honours.
        let mirror = MirrorConf::new(map.raid_disks, false);
        Raid10Conf { map, mirror }
    }
}

impl Personality for Raid10Conf {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        read(a, &self.mirror, &self.map, sector.0, buf)
    }

    fn write(&self, a: &Array, sector: Sector, buf: &[u8]) -> Result<(), ArrayError> {
        write(a, &self.mirror, &self.map, sector.0, buf)
    }

    fn zero(
        &self,
        a: &Array,
        sector: Sector,
        sectors: u64,
        kind: ZeroKind,
    ) -> Result<(), ArrayError> {
        zero(a, &self.mirror, &self.map, sector.0, sectors, kind)
    }

    /// Units are array chunks; the level's sync works in sectors.
    fn sync_range(
        &self,
        a: &Array,
        start: u64,
        max: u64,
        ctx: &SyncCtx,
    ) -> Result<(u64, u64), ArrayError> {
        let g = &self.map;
        let (sectors, mism) = sync_range(
            a,
            &self.mirror,
            g,
            start * g.chunk_sectors,
            max * g.chunk_sectors,
            ctx,
        )?;
        Ok((sectors.div_ceil(g.chunk_sectors), mism))
    }

    /// The recovery unit is the array chunk.
    fn total_units(&self) -> u64 {
        self.map.array_sectors() / self.map.chunk_sectors
    }

    fn unit_bytes(&self) -> u64 {
        self.map.chunk_sectors * SECTOR_BYTES
    }

    fn recovery_offset_sectors(&self, cursor: u64) -> u64 {
        let r = &self.map;
        if r.far_copies == 1 {
            cursor * r.near_copies as u64 / r.raid_disks as u64 * r.chunk_sectors
        } else {
            // far/offset copies land out of order: claim nothing until done.
            0
        }
    }

    fn cursor_for_offset(&self, offset_sectors: u64) -> u64 {
        let r = &self.map;
        if r.far_copies == 1 {
            offset_sectors / r.chunk_sectors * r.raid_disks as u64 / r.near_copies as u64
        } else {
            0
        }
    }

    fn member_units(&self, s: u64, e: u64) -> Option<(u64, u64)> {
        let r = &self.map;
        if r.far_copies != 1 {
            return None;
        }
        // Member chunk row k holds array chunks [k*disks/near, (k+1)*disks/near).
        let per_row = r.raid_disks as u64;
        let row = |x: u64| x / r.chunk_sectors;
        Some((
            row(s) * per_row / r.near_copies as u64,
            (row(e.saturating_sub(1)) + 1) * per_row / r.near_copies as u64 + 1,
        ))
    }

    fn locate(&self, sector: Sector) -> Vec<(MemberIdx, Sector)> {
        self.map
            .map(sector.0)
            .copies
            .into_iter()
            .map(|(m, s)| (m, Sector(s)))
            .collect()
    }

    fn survives(&self, missing: &[MemberIdx]) -> bool {
        self.map.survives(missing)
    }

    fn tunables(&self, _a: &Array) -> Vec<(&'static str, String)> {
        self.mirror.tunables()
    }

    fn set_tunable(&self, a: &Array, name: &str, value: &str) -> Result<(), ArrayError> {
        self.mirror.set_tunable(a, name, value)
    }

    fn max_degraded(&self) -> usize {
        self.map.max_degraded()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
