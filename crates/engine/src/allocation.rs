//! Where an array is known to hold nothing: NBD's `base:allocation` for the export
//! ([`crate::nbd::ArrayBackend`]). A range of the array is a hole only when every member
//! that holds it (data and parity, every in-sync copy) is a hole there, as SEEK_DATA says
//! ([`crate::Member::is_hole`]); it reads zeros also where the array knows it was never
//! written since it was zeroed as a whole ([`crate::written`]; members that cannot say,
//! such as disks); anything unknown is data, which is always a true answer.
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
    /// [`Array::never_written_bytes`]), on any level. Where neither can tell (raid0 with
    /// several zones, whose members are not asked; a journal whose cache may hold data
    /// not on the members; devices that do not say), everything is data.
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
        let in_sync = |r: MemberIdx| self.slot_state(r) == SlotState::InSync;
        // How the members hold a unit of the array.
        let by_members = match &self.personality {
            // A row: unit `u` is at member byte `u * member_bytes` (after the data offset)
            // on every member.
            Personality::Raid1(_) => Some(Units::Rows(RAID1_UNIT_BYTES, RAID1_UNIT_BYTES)),
            Personality::Parity(g) => Some(Units::Rows(chunk * g.data_disks() as u64, chunk)),
            Personality::Raid0(_)
                if self
                    .geometry
                    .member_sectors
                    .windows(2)
                    .all(|w| w[0] == w[1]) =>
            {
                Some(Units::Rows(chunk * self.raid_disks() as u64, chunk))
            }
            // An array chunk: its copies, wherever the layout (near, far, offset) puts them.
            Personality::Raid10(g) => Some(Units::Copies(g)),
            _ => None,
        }
        .filter(|u| u.unit_bytes(chunk) != 0 && (0..self.raid_disks()).map(MemberIdx).any(in_sync));
        // Without members to ask, the map's regions are the units.
        let units = match by_members {
            Some(u) => u,
            None if self.written.never_written_sectors() != 0 => {
                Units::MapOnly((1u64 << self.written.extent().0) * SECTOR_BYTES)
            }
            None => return all_data,
        };
        let unit = units.unit_bytes(chunk);
        let is_hole = |role: MemberIdx, member_byte: u64, bytes: u64| {
            let slot = self.slot(role);
            slot.device().is_some_and(|dev| {
                dev.is_hole(slot.data_offset_bytes() + member_byte, bytes)
                    .unwrap_or(false)
            })
        };
        let mut out: Vec<AllocExtent> = Vec::new();
        let mut at = offset;
        let mut n = 0;
        while at < end && n < MAX_UNITS {
            let u = at / unit;
            let next = ((u + 1) * unit).min(end);
            let known = self.never_written(at / SECTOR_BYTES, (next - at).div_ceil(SECTOR_BYTES));
            // A hole only by the members (the map says zeros, not unallocated), asking
            // every in-sync member that holds the unit; data if none does.
            let hole = match &units {
                Units::Rows(_, member_bytes) => (0..self.raid_disks())
                    .map(MemberIdx)
                    .filter(|&r| in_sync(r))
                    .all(|r| is_hole(r, u * member_bytes, *member_bytes)),
                Units::Copies(g) => {
                    let m = g.map(u * g.chunk_sectors);
                    let mut held = m.copies.iter().filter(|(r, _)| in_sync(*r)).peekable();
                    held.peek().is_some()
                        && held.all(|&(r, msec)| is_hole(r, msec * SECTOR_BYTES, unit))
                }
                Units::MapOnly(_) => false,
            };
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
            n += 1;
        }
        out
    }
}

/// How an array's units lie on its members, for [`Array::allocation`].
enum Units<'g> {
    /// (array bytes of a unit, bytes each member holds of it), at the same place on every
    /// member.
    Rows(u64, u64),
    /// raid10: a unit is an array chunk, held by its copies.
    Copies(&'g uraid_core::geometry::Raid10),
    /// No member is asked: units of the never-written map's regions (bytes).
    MapOnly(u64),
}

impl Units<'_> {
    fn unit_bytes(&self, chunk: u64) -> u64 {
        match self {
            Units::Rows(unit, _) => *unit,
            Units::Copies(_) => chunk,
            Units::MapOnly(region) => *region,
        }
    }
}
