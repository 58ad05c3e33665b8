//! raid0: chunk striping over all members; members of different sizes make several zones.
//!
//! API contract (used by the engine):
//! - `Raid0::new(&ArrayGeometry)` uses `member_sectors` (per-role data sizes), `chunk_sectors`
//!   and `layout` (md's raid0 layout: 0 = unset (only valid with a single zone), 1 = RAID0_ORIG_LAYOUT,
//!   2 = RAID0_ALT_MULTIZONE_LAYOUT).
//! - `map(sector) -> Raid0Map` gives the member, the member sector (relative to data_offset)
//!   and how many sectors from there on are contiguous on that member (to the chunk end).

use super::{ArrayGeometry, GeometryError};
use crate::types::MemberIdx;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raid0Map {
    pub member: MemberIdx,
    pub member_sector: u64,
    /// Sectors from `member_sector` on that map contiguously (at least 1).
    pub contiguous_sectors: u64,
}

#[derive(Clone, Debug)]
pub struct Raid0 {
    pub chunk_sectors: u64,
    pub raid_disks: usize,
}

impl Raid0 {
    pub fn new(g: &ArrayGeometry) -> Result<Raid0, GeometryError> {
        let _ = g;
        unimplemented!("raid0 geometry")
    }

    pub fn array_sectors(&self) -> u64 {
        unimplemented!("raid0 geometry")
    }

    pub fn map(&self, sector: u64) -> Raid0Map {
        let _ = sector;
        unimplemented!("raid0 geometry")
    }
}
