//! Where an array is known to hold nothing: NBD's `base:allocation` for the export
//! ([`crate::nbd::ArrayBackend`]). A range of the array is a hole only when every member
//! that holds it (data and parity, every in-sync copy) is a hole there, as SEEK_DATA says
//! ([`crate::Member::is_hole`]), or when the array knows it was never written since it was
//! zeroed as a whole ([`crate::written`]; members that cannot say, such as disks);
//! anything unknown is data, which is always a true answer.
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
    /// Reads as zeros: a hole, or a range the array knows was never written (allocated or
    /// not on the members, which cannot say).
    pub zero: bool,
}

impl Array {
    /// The allocation status of `len` bytes at `offset` (in range): runs in order from
    /// `offset`, covering at least its first byte and at most `len` bytes. A run is a hole
    /// (and zeros) where every member that holds it is a hole there, and zeros where the
    /// array knows it was never written, zeroed as a whole and untouched since (see
    /// [`Array::never_written_bytes`]), on any level. Where neither can tell (raid10 and
    /// raid0 with several zones, whose members are not asked; a journal whose cache may
    /// hold data not on the members; devices that do not say), everything is data.
    pub fn allocation(&self, offset: u64, len: u64) -> Vec<AllocExtent> {
        let end = offset.saturating_add(len).min(self.size_bytes());
        let all_data = vec![AllocExtent {
            len_bytes: end.saturating_sub(offset),
            hole: false,
            zero: false,
        }];
        if offset >= end || self.has_journal() {
            return all_data;
        }
        let chunk = self.geometry.chunk_sectors * SECTOR_BYTES;
        // Array bytes of one unit, and the member bytes each member holds of it: unit
        // `u` is at member byte `u * member_bytes` (after the data offset) on every member.
        let by_members = match &self.personality {
            Personality::Raid1(_) => Some((RAID1_UNIT_BYTES, RAID1_UNIT_BYTES)),
            Personality::Parity(g) => Some((chunk * g.data_disks() as u64, chunk)),
            Personality::Raid0(_)
                if self
                    .geometry
                    .member_sectors
                    .windows(2)
                    .all(|w| w[0] == w[1]) =>
            {
                Some((chunk * self.raid_disks() as u64, chunk))
            }
            _ => None,
        }
        .filter(|&(unit, _)| unit != 0);
        let asked: Vec<_> = match by_members {
            Some(_) => (0..self.raid_disks())
                .map(MemberIdx)
                .filter(|&r| self.slot_state(r) == SlotState::InSync)
                .map(|r| self.slot(r))
                .collect(),
            None => Vec::new(),
        };
        // Without members to ask, the map's regions are the units.
        let (unit, member_bytes) = match by_members {
            Some(u) if !asked.is_empty() => u,
            _ if self.written.never_written_sectors() != 0 => {
                ((1u64 << self.written.extent().0) * SECTOR_BYTES, 0)
            }
            _ => return all_data,
        };
        let mut out: Vec<AllocExtent> = Vec::new();
        let mut at = offset;
        let mut units = 0;
        while at < end && units < MAX_UNITS {
            let u = at / unit;
            let next = ((u + 1) * unit).min(end);
            let known = self.never_written(at / SECTOR_BYTES, (next - at).div_ceil(SECTOR_BYTES));
            // A hole only by the members (the map says zeros, not unallocated).
            let hole = !asked.is_empty()
                && asked.iter().all(|slot| {
                    let Some(dev) = slot.device() else {
                        return false;
                    };
                    let from = slot.data_offset_bytes() + u * member_bytes;
                    dev.is_hole(from, member_bytes).unwrap_or(false)
                });
            let zero = hole || known;
            match out.last_mut() {
                Some(e) if (e.hole, e.zero) == (hole, zero) => e.len_bytes += next - at,
                _ => out.push(AllocExtent {
                    len_bytes: next - at,
                    hole,
                    zero,
                }),
            }
            at = next;
            units += 1;
        }
        out
    }
}
