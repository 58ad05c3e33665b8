//! Where an array is known to hold nothing: NBD's `base:allocation` for the export
//! ([`crate::nbd::ArrayBackend`]). A range of the array is a hole only when every member
//! that holds it (data and parity, every in-sync copy) is a hole there, as SEEK_DATA says
//! ([`crate::Member::is_hole`]); anything unknown is data, which is always a true answer.
//!
//! Members that are missing, faulty or recovering are not asked: their blocks are the
//! others' copy or their parity, and zeros on every member that is asked rebuild as zeros
//! (the parity of zeros is zeros, for raid4/5 and raid6's P and Q alike).

use crate::array::Array;
use crate::slot::SlotState;
use uraid_core::geometry::Personality;
use uraid_core::{MemberIdx, SECTOR_BYTES};

/// Units looked at per call at most: a client asking about a whole large array gets the
/// first part and asks again from there, as the NBD spec allows.
const MAX_UNITS: u64 = 4096;
/// raid1's unit (it has no chunks).
const RAID1_UNIT_BYTES: u64 = 64 * 1024;

/// One run of the array's allocation status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocExtent {
    /// Bytes it covers.
    pub len_bytes: u64,
    /// Unallocated on every member that holds it, so it reads as zeros.
    pub hole: bool,
}

impl Array {
    /// The allocation status of `len` bytes at `offset` (in range): runs in order from
    /// `offset`, covering at least its first byte and at most `len` bytes. Where the array
    /// cannot tell (raid10, raid0 with several zones, a journal whose cache may hold data
    /// not on the members, devices that do not say), everything is data.
    pub fn allocation(&self, offset: u64, len: u64) -> Vec<AllocExtent> {
        let end = offset.saturating_add(len).min(self.size_bytes());
        let all_data = vec![AllocExtent {
            len_bytes: end.saturating_sub(offset),
            hole: false,
        }];
        let chunk = self.geometry.chunk_sectors * SECTOR_BYTES;
        // Array bytes of one unit, and the member bytes each member holds of it: unit
        // `u` is at member byte `u * member_bytes` (after the data offset) on every member.
        let (unit, member_bytes) = match &self.personality {
            Personality::Raid1(_) => (RAID1_UNIT_BYTES, RAID1_UNIT_BYTES),
            Personality::Parity(g) => (chunk * g.data_disks() as u64, chunk),
            Personality::Raid0(_)
                if self
                    .geometry
                    .member_sectors
                    .windows(2)
                    .all(|w| w[0] == w[1]) =>
            {
                (chunk * self.raid_disks() as u64, chunk)
            }
            _ => return all_data,
        };
        if unit == 0 || offset >= end || self.has_journal() {
            return all_data;
        }
        let asked: Vec<_> = (0..self.raid_disks())
            .map(MemberIdx)
            .filter(|&r| self.slot_state(r) == SlotState::InSync)
            .map(|r| self.slot(r))
            .collect();
        if asked.is_empty() {
            return all_data;
        }
        let mut out: Vec<AllocExtent> = Vec::new();
        let mut at = offset;
        let mut units = 0;
        while at < end && units < MAX_UNITS {
            let u = at / unit;
            let next = ((u + 1) * unit).min(end);
            let hole = asked.iter().all(|slot| {
                let Some(dev) = slot.device() else {
                    return false;
                };
                let from = slot.data_offset_bytes() + u * member_bytes;
                dev.is_hole(from, member_bytes).unwrap_or(false)
            });
            match out.last_mut() {
                Some(e) if e.hole == hole => e.len_bytes += next - at,
                _ => out.push(AllocExtent {
                    len_bytes: next - at,
                    hole,
                }),
            }
            at = next;
            units += 1;
        }
        out
    }
}
