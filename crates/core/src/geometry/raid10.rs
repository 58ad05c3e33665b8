//! raid10: md's near / far / offset copies.
//!
//! API contract (used by the engine):
//! - `Raid10::new(&ArrayGeometry)` decodes md's layout word (near copies in bits 0-7, far copies
//!   in bits 8-15, bit 16 = offset, bits 17+ = far-set variant) and computes md's stride from
//!   `dev_sectors`.
//! - `map(sector) -> Raid10Map`: all copies of the sector, in md's copy order, and the number of
//!   sectors from there that stay contiguous for every copy (to the chunk end).

use super::{ArrayGeometry, GeometryError};
use crate::types::MemberIdx;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raid10Map {
    /// (member, member sector relative to data_offset) for each copy, in md's order.
    pub copies: Vec<(MemberIdx, u64)>,
    pub contiguous_sectors: u64,
}

#[derive(Clone, Debug)]
pub struct Raid10 {
    pub raid_disks: usize,
    pub chunk_sectors: u64,
    pub near_copies: usize,
    pub far_copies: usize,
    pub far_offset: bool,
}

impl Raid10 {
    pub fn new(g: &ArrayGeometry) -> Result<Raid10, GeometryError> {
        let _ = g;
        unimplemented!("raid10 geometry")
    }

    pub fn copies(&self) -> usize {
        self.near_copies * self.far_copies
    }

    pub fn array_sectors(&self) -> u64 {
        unimplemented!("raid10 geometry")
    }

    pub fn map(&self, sector: u64) -> Raid10Map {
        let _ = sector;
        unimplemented!("raid10 geometry")
    }

    /// Best-case number of members that can be missing (one per mirror set).
    pub fn max_degraded(&self) -> usize {
        unimplemented!("raid10 geometry")
    }

    /// Whether every sector keeps at least one copy when exactly `missing` are gone.
    pub fn survives(&self, missing: &[MemberIdx]) -> bool {
        let _ = missing;
        unimplemented!("raid10 geometry")
    }
}

/// Parse mdadm's raid10 layout spelling ("n2", "f2", "o2", "n3", ...) into md's layout word.
pub fn parse_layout(s: &str) -> Option<u32> {
    let _ = s;
    unimplemented!("raid10 layout names")
}

/// mdadm's spelling of a raid10 layout word ("near=2", "far=2", "offset=2"); also "n2" style.
pub fn layout_name(layout: u32) -> String {
    let _ = layout;
    unimplemented!("raid10 layout names")
}
