//! raid1 IO: n-way mirror, every member holds the whole array at the same offset.
//! The recovery unit is the sector (member sector = array sector).

use crate::array::{Array, Personality, ZeroKind};
use crate::barrier::{bucket_of, Barriers, Raised};
use crate::error::ArrayError;
use crate::in_order::in_order;
use crate::mirror::{self, bytes, MirrorConf, SyncCtx, RESYNC_STEP_SECTORS};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU64, Ordering};
use uraid_core::geometry::Raid1;
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// Mirror write-lock region, in sectors: zeroing pieces never cross one; a write takes the
/// locks of every region its piece covers (sync pieces take none: the barrier keeps
/// requests out of them).
pub(crate) const REGION_SECTORS: u64 = 128;

/// Resync barrier unit, 1 MiB: requests are split at its boundaries and enter its barrier
/// bucket; sync raises the bucket of the piece it works on (pieces never cross a unit; any
/// multiple of REGION_SECTORS works). md uses 64 MiB; that puts a small array in a few
/// buckets whose counters every request touches, which costs on few CPUs (ARCHITECTURE.md).
pub(crate) const BARRIER_UNIT_SECTORS: u64 = 1 << 11;

/// The most a sync piece made only of holes covers at once (64 MiB): one zeroing of the new
/// member's copy instead of one per barrier unit (a round trip each on an NBD member, a
/// punched hole through the loop driver on a loop device).
const HOLE_RUN_SECTORS: u64 = 64 << 11;

/// Sectors from `s` to the next multiple of `unit`.
fn to_boundary(s: u64, unit: u64) -> u64 {
    unit - s % unit
}

/// Every mirror's copy of `sector`, inline (no allocation per request) up to 4 mirrors.
fn copies(a: &Array, sector: u64) -> smallvec::SmallVec<[(MemberIdx, u64); 4]> {
    // The mirror count is read through the shape's sequence counter (reshape may grow it).
    (0..a.shape().raid_disks)
        .map(|i| (MemberIdx(i), sector))
        .collect()
}

/// The recovery unit of a piece that starts at `sector`: a recovering member is valid for
/// it only when the whole piece lies below the cursor.
fn unit(sector: u64, len: usize) -> u64 {
    sector + (len as u64).div_ceil(SECTOR_BYTES) - 1
}

pub(crate) fn read(
    a: &Array,
    c: &MirrorConf,
    sector: u64,
    buf: &mut [u8],
) -> Result<(), ArrayError> {
    // Only a recovering member needs reads cut at its cursor's granularity; every read is
    // cut at barrier units, so that it waits on one barrier at a time (as md splits).
    let split = if a.any_recovering() {
        REGION_SECTORS
    } else {
        BARRIER_UNIT_SECTORS
    };
    let mut s = sector;
    let mut off = 0;
    while off < buf.len() {
        let n = ((to_boundary(s, split) * SECTOR_BYTES) as usize).min(buf.len() - off);
        let _pending = c.barriers.wait_barrier(s / BARRIER_UNIT_SECTORS);
        mirror::read_piece(a, c, &copies(a, s), unit(s, n), &mut buf[off..off + n])?;
        off += n;
        s += (n as u64) / SECTOR_BYTES;
    }
    Ok(())
}

pub(crate) fn write(a: &Array, c: &MirrorConf, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
    // Barrier unit by barrier unit: each piece inside its unit's barrier (against sync) and
    // under the write locks of the regions it covers, so that two overlapping writes cannot
    // leave the copies different (reads never take them; see ARCHITECTURE.md); one member
    // write per copy and piece. A recovering member whose cursor lies inside a piece gets
    // the part below it (`mirror::write_piece`).
    let mut s = sector;
    let mut off = 0;
    while off < buf.len() {
        let n =
            ((to_boundary(s, BARRIER_UNIT_SECTORS) * SECTOR_BYTES) as usize).min(buf.len() - off);
        let last = unit(s, n);
        let _pending = c.barriers.wait_barrier(s / BARRIER_UNIT_SECTORS);
        let _g = c.lock_buckets(s / REGION_SECTORS, last / REGION_SECTORS);
        mirror::write_piece(a, &copies(a, s), (s, last), &buf[off..off + n])?;
        off += n;
        s += (n as u64) / SECTOR_BYTES;
    }
    Ok(())
}

/// Discard or zero array sectors [sector, sector+sectors) on every copy, region by region
/// as writes go (inside the barrier, under the region's write lock).
pub(crate) fn zero(
    a: &Array,
    c: &MirrorConf,
    sector: u64,
    sectors: u64,
    kind: ZeroKind,
) -> Result<(), ArrayError> {
    let end = sector + sectors;
    let mut s = sector;
    while s < end {
        let n = to_boundary(s, REGION_SECTORS).min(end - s);
        let _pending = c.barriers.wait_barrier(s / BARRIER_UNIT_SECTORS);
        let _g = c.lock_bucket(s / REGION_SECTORS);
        mirror::zero_piece(a, &copies(a, s), s + n - 1, n, kind)?;
        s += n;
    }
    Ok(())
}

/// Sync (resync, check, repair, recovery) from array sector `start`, at most `max` sectors;
/// returns (sectors done, mismatched sectors).
pub(crate) fn sync_range(
    a: &Array,
    c: &MirrorConf,
    start: u64,
    max: u64,
    ctx: &SyncCtx,
) -> Result<(u64, u64), ArrayError> {
    let total = a.personality().array_sectors();
    let end = (start + max).min(total);
    let mismatches = AtomicU64::new(0);
    let mut s = start;
    // Pieces side by side on the sync threads (`in_order`): one piece's write while the
    // next one's read runs; the cursor moves in order.
    in_order(
        c.sync_threads.load(Ordering::Relaxed),
        || {
            if s >= end {
                return None;
            }
            // A piece lies in one barrier unit: the barrier raised for it keeps every
            // request out of the whole piece. (It once also stopped at each write-lock
            // region, 64 KiB, from when sync took the region's lock; that made a recovery
            // over O_DIRECT members wait on one 64 KiB read and write at a time per thread.)
            let mut n = RESYNC_STEP_SECTORS
                .min(to_boundary(s, BARRIER_UNIT_SECTORS))
                .min(end - s);
            // A bitmap-guided resync skips clean pieces: a piece also stops at a bitmap
            // chunk (of 64 KiB at least, the old piece), so that a dirty chunk does not
            // take its clean neighbours along.
            if let Some(bc) = a.bitmap_chunk_sectors().filter(|_| ctx.skip_clean) {
                n = n.min(to_boundary(s, bc.max(REGION_SECTORS)));
            } else if n == BARRIER_UNIT_SECTORS {
                n = hole_run(a, s, end).unwrap_or(n);
            }
            // md's raise_barrier: no request is inside this piece's barrier units meanwhile,
            // and the recovery cursor moves before the barriers drop.
            let raised = raise_units(&c.barriers, s, n);
            s += n;
            Some((s - n, n, raised))
        },
        |&mut (s, n, _)| {
            let skip = ctx.skip_clean && a.bitmap_clean(s, n);
            if skip {
                return Ok(0);
            }
            if n > BARRIER_UNIT_SECTORS {
                // A run that was holes when it was taken: checked again now that its
                // barriers are up; if a write reached it before, unit by unit as usual.
                let len = bytes(n);
                if mirror::zero_if_holes(a, s, &copies(a, s), unit(s, len), len, ctx.targets) {
                    return Ok(0);
                }
                let mut mismatched = 0;
                for p in (s..s + n).step_by(BARRIER_UNIT_SECTORS as usize) {
                    let len = bytes(BARRIER_UNIT_SECTORS.min(s + n - p));
                    mismatched += mirror::sync_piece(
                        a,
                        p,
                        &copies(a, p),
                        unit(p, len),
                        len,
                        ctx.mode,
                        ctx.targets,
                    )?;
                }
                return Ok(mismatched);
            }
            mirror::sync_piece(
                a,
                s,
                &copies(a, s),
                unit(s, bytes(n)),
                bytes(n),
                ctx.mode,
                ctx.targets,
            )
        },
        |(s, n, raised), mismatched| {
            mismatches.fetch_add(mismatched?, Ordering::Relaxed);
            ctx.advance(a, s + n);
            drop(raised);
            Ok(())
        },
    )?;
    Ok((end - start, mismatches.into_inner()))
}

/// From `s`, at a barrier unit's start, with the unit a hole on every copy valid for it:
/// the longest of 64 MiB and 8 MiB (whole units, not past `end`) that is a hole on every
/// such copy, as one sync piece. A hint, asked before the barriers go up: the piece is
/// checked again under them.
fn hole_run(a: &Array, s: u64, end: u64) -> Option<u64> {
    let holes = |n: u64| {
        let len = bytes(n);
        mirror::holes_on_valid_copies(a, s, &copies(a, s), unit(s, len), len)
    };
    let whole = (end - s) / BARRIER_UNIT_SECTORS * BARRIER_UNIT_SECTORS;
    if whole <= BARRIER_UNIT_SECTORS || !holes(BARRIER_UNIT_SECTORS) {
        return None;
    }
    [HOLE_RUN_SECTORS, HOLE_RUN_SECTORS / 8]
        .into_iter()
        .map(|n| n.min(whole))
        .find(|&n| n > BARRIER_UNIT_SECTORS && holes(n))
}

/// Raise the barrier of every unit of sectors [s, s+n): each bucket once (a second raise of
/// a bucket this piece holds would wait for requests that wait for this piece), in
/// ascending order.
fn raise_units(b: &Barriers, s: u64, n: u64) -> SmallVec<[Raised<'_>; 1]> {
    let first = s / BARRIER_UNIT_SECTORS;
    let last = (s + n - 1) / BARRIER_UNIT_SECTORS;
    if first == last {
        return smallvec::smallvec![b.raise(first)];
    }
    let mut keys: Vec<u64> = (first..=last).collect();
    keys.sort_by_key(|&k| bucket_of(k));
    keys.dedup_by_key(|k| bucket_of(*k));
    keys.into_iter().map(|k| b.raise(k)).collect()
}

/// raid1's conf (md's r1conf): the mirror's barriers, write locks and read heads.
pub(crate) struct Raid1Conf {
    map: Raid1,
    mirror: MirrorConf,
}

impl Raid1Conf {
    pub(crate) fn new(map: Raid1) -> Raid1Conf {
        let mirror = MirrorConf::new(map.raid_disks, true);
        Raid1Conf { map, mirror }
    }
}

impl Personality for Raid1Conf {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        read(a, &self.mirror, sector.0, buf)
    }

    fn write(&self, a: &Array, sector: Sector, buf: &[u8]) -> Result<(), ArrayError> {
        write(a, &self.mirror, sector.0, buf)
    }

    fn zero(
        &self,
        a: &Array,
        sector: Sector,
        sectors: u64,
        kind: ZeroKind,
    ) -> Result<(), ArrayError> {
        zero(a, &self.mirror, sector.0, sectors, kind)
    }

    fn sync_range(
        &self,
        a: &Array,
        start: u64,
        max: u64,
        ctx: &SyncCtx,
    ) -> Result<(u64, u64), ArrayError> {
        sync_range(a, &self.mirror, start, max, ctx)
    }

    /// The recovery unit is the sector.
    fn total_units(&self) -> u64 {
        self.map.array_sectors()
    }

    fn unit_bytes(&self) -> u64 {
        SECTOR_BYTES
    }

    fn recovery_offset_sectors(&self, cursor: u64) -> u64 {
        cursor
    }

    fn cursor_for_offset(&self, offset_sectors: u64) -> u64 {
        offset_sectors
    }

    fn member_units(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        Some((start, end))
    }

    fn locate(&self, sector: Sector) -> Vec<(MemberIdx, Sector)> {
        (0..self.map.raid_disks)
            .map(|i| (MemberIdx(i), sector))
            .collect()
    }

    fn survives(&self, missing: &[MemberIdx]) -> bool {
        missing.len() < self.map.raid_disks
    }

    fn tunables(&self, _a: &Array) -> Vec<(&'static str, String)> {
        self.mirror.tunables()
    }

    fn set_tunable(&self, a: &Array, name: &str, value: &str) -> Result<(), ArrayError> {
        self.mirror.set_tunable(a, name, value)
    }

    fn max_degraded(&self) -> usize {
        self.map.raid_disks - 1
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
