//! A raid10 array in the middle of a reshape (md's near/offset reshape with a moving data
//! offset), as a personality that reads and writes through both geometries.
//!
//! Each request is cut at the position ([`Raid10Reshape::split`]); each run is read in its
//! side's geometry at that side's data offset on each member (md's raid10_find_phys and
//! choose_data_offset), from the first copy that reads, and written to every copy of its
//! side that has a member (a missing one is skipped, as raid10 does), under a per-chunk
//! lock so that overlapping writes leave the copies equal.
//!
//! A write to data the reshape has copied but whose position no superblock records yet
//! (between the recorded and the in-memory position) goes to both geometries: after a
//! power cut the reshape goes on from the recorded position and copies it again from the
//! old one. The window rule ([`Raid10Reshape::next_step`]) keeps the old copies of every
//! sector from the recorded position on clear of the new copies written so far, so that
//! write to the old geometry clobbers nothing (md makes such writes wait for the
//! superblock update instead; uraid's raid4/5/6 reshape does the same as here).
//!
//! The position lives under a read-write lock that is also the window lock: a request
//! holds it shared while it runs; the reshape of a served array
//! (`restripe::raid10::run_served10`) holds it exclusively while it moves one window, so
//! no request sees a window half moved.

use crate::array::{Array, Personality};
use crate::array::{SyncCtx, ZeroKind};
use crate::error::ArrayError;
use crate::io::{execute, Op};
use std::any::Any;
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use uraid_core::geometry::{Raid10Reshape, Side};
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// Where a raid10 reshape stands while the array runs.
#[derive(Clone, Debug)]
pub(crate) struct Progress10 {
    /// Both geometries and the in-memory position (data before it, forwards, is in the new
    /// one).
    pub st: Raid10Reshape,
    /// The position the superblocks record (md's reshape_safe).
    pub safe: u64,
    /// The superblocks say the new shape (the reshape is over; every sector is new-side).
    pub finished: bool,
}

/// Chunk locks (hashed by side and chunk): writes of one chunk take turns, so every copy
/// gets the same last write.
const CHUNK_LOCKS: usize = 64;

/// The personality of a raid10 mid-reshape.
pub(crate) struct Reshape10Pers {
    live: RwLock<Progress10>,
    /// Per role: where the new geometry's data area starts, in bytes (data_offset +
    /// new_offset of that member's superblock; 0 for a role without a member).
    new_data_offset_bytes: Vec<u64>,
    locks: Vec<Mutex<()>>,
    /// Fixed for the whole reshape; read without the lock (member failure handling asks
    /// while a request holds it).
    old: uraid_core::geometry::Raid10,
    new: uraid_core::geometry::Raid10,
    max_degraded: usize,
}

impl Reshape10Pers {
    pub(crate) fn new(state: Raid10Reshape, new_data_offset_bytes: Vec<u64>) -> Reshape10Pers {
        let max_degraded = state.old.max_degraded().min(state.new.max_degraded());
        Reshape10Pers {
            old: state.old.clone(),
            new: state.new.clone(),
            live: RwLock::new(Progress10 {
                safe: state.position_sectors,
                finished: false,
                st: state,
            }),
            new_data_offset_bytes,
            locks: (0..CHUNK_LOCKS).map(|_| Mutex::new(())).collect(),
            max_degraded,
        }
    }

    /// The position, shared (requests hold it while they run).
    pub(crate) fn progress(&self) -> RwLockReadGuard<'_, Progress10> {
        self.live.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The position, exclusive: the window lock of a served reshape.
    pub(crate) fn progress_mut(&self) -> RwLockWriteGuard<'_, Progress10> {
        self.live.write().unwrap_or_else(|e| e.into_inner())
    }

    fn chunk_lock(&self, side: Side, chunk: u64) -> std::sync::MutexGuard<'_, ()> {
        let k = (chunk.wrapping_mul(2) + u64::from(side == Side::New)) as usize % CHUNK_LOCKS;
        self.locks[k].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reshape as it stands in memory (its position may be ahead of the superblocks').
    pub(crate) fn state(&self) -> Raid10Reshape {
        self.progress().st.clone()
    }

    /// The array size while the reshape runs.
    pub(crate) fn array_sectors(&self) -> u64 {
        self.progress().st.array_sectors()
    }

    /// What the array is doing, for messages.
    pub(crate) fn reason(&self) -> String {
        let st = self.state();
        let (o, n) = (&st.old, &st.new);
        format!(
            "a raid10 reshape is in progress (at array sector {} of {}, {} -> {} disks, chunk {} -> {} sectors, layout {} -> {}{})",
            st.position_sectors,
            st.new_array_sectors(),
            o.raid_disks,
            n.raid_disks,
            o.chunk_sectors,
            n.chunk_sectors,
            uraid_core::geometry::raid10::layout_name(o.layout),
            uraid_core::geometry::raid10::layout_name(n.layout),
            if st.backwards { ", backwards" } else { "" }
        )
    }

    /// Byte offset on role `role`'s device of member sector `ms` of `side`'s data area.
    pub(crate) fn member_byte(&self, a: &Array, side: Side, role: MemberIdx, ms: u64) -> u64 {
        let base = match side {
            Side::Old => a.slot(role).data_offset_bytes(),
            Side::New => self.new_data_offset_bytes[role.0],
        };
        base + ms * SECTOR_BYTES
    }

    /// Read array sectors `[sector, ..)` of one side into `buf`, each chunk piece from the
    /// first of its copies that reads. Old-side sectors past the old array's end read as
    /// zeros (nothing was there; the reshape writes them as zeros).
    pub(crate) fn read_side(
        &self,
        a: &Array,
        st: &Raid10Reshape,
        side: Side,
        sector: u64,
        buf: &mut [u8],
    ) -> Result<(), ArrayError> {
        let g = st.geometry(side);
        let limit = match side {
            Side::Old => st.old_array_sectors(),
            Side::New => st.new_array_sectors(),
        };
        let mut s = sector;
        let mut off = 0usize;
        while off < buf.len() {
            let m = g.map(s);
            let n = ((m.contiguous_sectors * SECTOR_BYTES) as usize).min(buf.len() - off);
            let out = &mut buf[off..off + n];
            if s >= limit {
                out.fill(0);
            } else {
                let mut done = false;
                for &(role, ms) in &m.copies {
                    let Some(dev) = a.live(role) else { continue };
                    let at = self.member_byte(a, side, role, ms);
                    let mut ops = [Op::read(dev.as_ref(), at, out)];
                    match execute(&mut ops).pop() {
                        Some(Ok(())) => {
                            done = true;
                            break;
                        }
                        Some(Err(e)) => tracing::warn!(
                            "member {role}: read error mid-reshape at member sector {ms}: {e}; \
                             trying the next copy"
                        ),
                        None => {}
                    }
                }
                if !done {
                    return Err(ArrayError::Failed(format!(
                        "cannot read array sector {s} mid-reshape: no copy of it is readable"
                    )));
                }
            }
            off += n;
            s += n as u64 / SECTOR_BYTES;
        }
        Ok(())
    }

    /// Write array sectors `[sector, ..)` of one side to every copy with a member, chunk
    /// piece by chunk piece, each under its chunk's lock. A member whose write fails is
    /// failed; the write goes on while the array keeps its data.
    pub(crate) fn write_side(
        &self,
        a: &Array,
        st: &Raid10Reshape,
        side: Side,
        sector: u64,
        data: &[u8],
    ) -> Result<(), ArrayError> {
        let g = st.geometry(side);
        let mut s = sector;
        let mut off = 0usize;
        while off < data.len() {
            let m = g.map(s);
            let n = ((m.contiguous_sectors * SECTOR_BYTES) as usize).min(data.len() - off);
            let piece = &data[off..off + n];
            let _held = self.chunk_lock(side, s / g.chunk_sectors);
            let devs: Vec<(MemberIdx, u64, std::sync::Arc<dyn crate::member::Member>)> = m
                .copies
                .iter()
                .filter_map(|&(role, ms)| a.live(role).map(|d| (role, ms, d)))
                .collect();
            let mut ops: Vec<Op> = devs
                .iter()
                .map(|(role, ms, d)| {
                    Op::write(d.as_ref(), self.member_byte(a, side, *role, *ms), piece)
                })
                .collect();
            let results = execute(&mut ops);
            drop(ops);
            for ((role, ms, _), res) in devs.iter().zip(results) {
                if let Err(e) = res {
                    tracing::warn!(
                        "member {role}: write error mid-reshape at member sector {ms}: {e}"
                    );
                    a.member_error(*role, &e);
                }
            }
            if !self.survives(&a.missing_roles()) {
                return Err(ArrayError::Failed(format!(
                    "write at array sector {s} mid-reshape failed: too many members lost"
                )));
            }
            off += n;
            s += n as u64 / SECTOR_BYTES;
        }
        Ok(())
    }

    fn refuse(&self, what: &str) -> ArrayError {
        ArrayError::Refused(format!(
            "{what} refused: {}; it can run once the reshape is done",
            self.reason()
        ))
    }
}

impl Personality for Reshape10Pers {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        let p = self.progress();
        crate::reshape::read_pieces(
            p.st.split(sector.0, buf.len() as u64 / SECTOR_BYTES),
            buf,
            |side, start, piece| self.read_side(a, &p.st, side, start, piece),
        )
    }

    fn write(&self, a: &Array, sector: Sector, buf: &[u8]) -> Result<(), ArrayError> {
        let p = self.progress();
        crate::reshape::write_pieces(
            p.st.split(sector.0, buf.len() as u64 / SECTOR_BYTES),
            (p.st.backwards, p.st.position_sectors, p.safe),
            buf,
            |side, start, data| self.write_side(a, &p.st, side, start, data),
        )
    }

    /// Discard and write-zeroes write zeros to every copy of the side
    /// ([`crate::reshape::zero_by_writing`]).
    fn zero(
        &self,
        a: &Array,
        sector: Sector,
        sectors: u64,
        _kind: ZeroKind,
    ) -> Result<(), ArrayError> {
        crate::reshape::zero_by_writing(sector, sectors, |s, zeros| self.write(a, s, zeros))
    }

    fn sync_range(
        &self,
        _a: &Array,
        _start: u64,
        _max: u64,
        _ctx: &SyncCtx,
    ) -> Result<(u64, u64), ArrayError> {
        Err(self.refuse("resync"))
    }

    fn total_units(&self) -> u64 {
        0
    }

    fn unit_bytes(&self) -> u64 {
        self.new.chunk_sectors * SECTOR_BYTES
    }

    fn recovery_offset_sectors(&self, _cursor: u64) -> u64 {
        0
    }

    fn cursor_for_offset(&self, _offset_sectors: u64) -> u64 {
        0
    }

    fn member_units(&self, _start: u64, _end: u64) -> Option<(u64, u64)> {
        None
    }

    fn locate(&self, sector: Sector) -> Vec<(MemberIdx, Sector)> {
        let p = self.progress();
        let st = &p.st;
        st.geometry(st.side_of(sector.0))
            .map(sector.0)
            .copies
            .into_iter()
            .map(|(m, s)| (m, Sector(s)))
            .collect()
    }

    /// Every sector keeps a copy in the geometry that holds it (asked without the lock:
    /// member failure handling runs while a request holds it).
    fn survives(&self, missing: &[MemberIdx]) -> bool {
        let (o, n) = (&self.old, &self.new);
        let old: Vec<MemberIdx> = missing
            .iter()
            .copied()
            .filter(|m| m.0 < o.raid_disks)
            .collect();
        let new: Vec<MemberIdx> = missing
            .iter()
            .copied()
            .filter(|m| m.0 < n.raid_disks)
            .collect();
        o.survives(&old) && n.survives(&new)
    }

    fn max_degraded(&self) -> usize {
        self.max_degraded
    }

    fn rebuilds(&self) -> bool {
        false
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
