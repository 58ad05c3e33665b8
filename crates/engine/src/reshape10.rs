//! A raid10 array in the middle of a reshape (md's near/offset reshape with a moving data
//! offset), as a personality that reads through both geometries.
//!
//! Each request is cut at the position ([`Raid10Reshape::split`]); each run is read in its
//! side's geometry at that side's data offset on each member (md's raid10_find_phys and
//! choose_data_offset), from the first copy that reads. uraid serves it read-only (writes
//! are refused with the reason) until `uraid grow --continue` has finished the reshape
//! (`restripe/raid10.rs`).

use crate::array::{Array, Personality};
use crate::array::{SyncCtx, ZeroKind};
use crate::error::ArrayError;
use crate::io::{execute, Op};
use std::any::Any;
use std::sync::RwLock;
use uraid_core::geometry::{Raid10Reshape, Side};
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// The personality of a raid10 mid-reshape.
pub(crate) struct Reshape10Pers {
    st: RwLock<Raid10Reshape>,
    /// Per role: where the new geometry's data area starts, in bytes (data_offset +
    /// new_offset of that member's superblock; 0 for a role without a member).
    new_data_offset_bytes: Vec<u64>,
    max_degraded: usize,
}

impl Reshape10Pers {
    pub(crate) fn new(state: Raid10Reshape, new_data_offset_bytes: Vec<u64>) -> Reshape10Pers {
        let max_degraded = state.old.max_degraded().min(state.new.max_degraded());
        Reshape10Pers {
            st: RwLock::new(state),
            new_data_offset_bytes,
            max_degraded,
        }
    }

    /// The reshape as recorded when the array was assembled.
    pub(crate) fn state(&self) -> Raid10Reshape {
        self.st.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The array size while the reshape runs.
    pub(crate) fn array_sectors(&self) -> u64 {
        self.state().array_sectors()
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

    fn refuse(&self, what: &str) -> ArrayError {
        ArrayError::Refused(format!(
            "{what} refused: {}; run uraid grow --continue on its members to finish it",
            self.reason()
        ))
    }
}

impl Personality for Reshape10Pers {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        let st = self.state();
        let mut off = 0usize;
        for (start, n, side) in st.split(sector.0, buf.len() as u64 / SECTOR_BYTES) {
            let len = (n * SECTOR_BYTES) as usize;
            self.read_side(a, &st, side, start, &mut buf[off..off + len])?;
            off += len;
        }
        Ok(())
    }

    fn write(&self, _a: &Array, _sector: Sector, _buf: &[u8]) -> Result<(), ArrayError> {
        Err(self.refuse("write"))
    }

    fn zero(
        &self,
        _a: &Array,
        _sector: Sector,
        _sectors: u64,
        _kind: ZeroKind,
    ) -> Result<(), ArrayError> {
        Err(self.refuse("discard"))
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
        self.state().new.chunk_sectors * SECTOR_BYTES
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
        let st = self.state();
        st.geometry(st.side_of(sector.0))
            .map(sector.0)
            .copies
            .into_iter()
            .map(|(m, s)| (m, Sector(s)))
            .collect()
    }

    /// Every sector keeps a copy in the geometry that holds it.
    fn survives(&self, missing: &[MemberIdx]) -> bool {
        let st = self.state();
        let old: Vec<MemberIdx> = missing
            .iter()
            .copied()
            .filter(|m| m.0 < st.old.raid_disks)
            .collect();
        let new: Vec<MemberIdx> = missing
            .iter()
            .copied()
            .filter(|m| m.0 < st.new.raid_disks)
            .collect();
        st.old.survives(&old) && st.new.survives(&new)
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
