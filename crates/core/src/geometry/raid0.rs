//! raid0: chunk striping over all members; members of different sizes make several zones.
//!
//! API contract (used by the engine):
//! - `Raid0::new(&ArrayGeometry)` uses `member_sectors` (per-role data sizes), `chunk_sectors`
//!   and `layout` (md's raid0 layout: 0 = unset (only valid with a single zone), 1 = RAID0_ORIG_LAYOUT,
//!   2 = RAID0_ALT_MULTIZONE_LAYOUT).
//! - `map(sector) -> Raid0Map` gives the member, the member sector (relative to data_offset)
//!   and how many sectors from there on are contiguous on that member (to the chunk end).
//!
//! Zones, as md's `create_strip_zones` builds them:
//! - every member's size is rounded down to a whole number of chunks;
//! - zone 0 stripes over all members, in role order, up to the smallest member's size;
//! - each further zone starts on the members (`dev_start`) where the previous zone stopped and
//!   stripes over the members still larger than that, in role order, up to the smallest of them.
//!
//! Inside a zone the member sector is `dev_start + (zone offset / (width * chunk)) * chunk +
//! offset in chunk`. Which member of the zone holds a chunk is `chunk number % width`, where
//! md's two multi-zone layouts disagree on the chunk number: RAID0_ORIG_LAYOUT (the layout
//! before Linux 3.14) counts chunks from the start of the array, RAID0_ALT_MULTIZONE_LAYOUT
//! (Linux 3.14 to 5.3, by accident) from the start of the zone. With one zone, or when the
//! second zone has a single member, both give the same map.

use super::{ArrayGeometry, GeometryError};
use crate::types::{Level, MemberIdx};

/// md's `RAID0_ORIG_LAYOUT`: the device in a zone is chosen from the array chunk number.
pub const RAID0_ORIG_LAYOUT: u32 = 1;
/// md's `RAID0_ALT_MULTIZONE_LAYOUT`: the device in a zone is chosen from the chunk number
/// relative to the zone start.
pub const RAID0_ALT_MULTIZONE_LAYOUT: u32 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raid0Map {
    pub member: MemberIdx,
    pub member_sector: u64,
    /// Sectors from `member_sector` on that map contiguously (at least 1).
    pub contiguous_sectors: u64,
}

/// One of md's `strip_zone`s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripZone {
    /// First array sector after this zone (md's `zone_end`).
    pub zone_end: u64,
    /// Member sector where this zone starts on each of its members (md's `dev_start`).
    pub dev_start: u64,
    /// The zone's members in the order md stripes over them (role order).
    pub members: Vec<MemberIdx>,
}

#[derive(Clone, Debug)]
pub struct Raid0 {
    pub chunk_sectors: u64,
    pub raid_disks: usize,
    /// The layout in force: RAID0_ORIG_LAYOUT or RAID0_ALT_MULTIZONE_LAYOUT (always ORIG
    /// where both give the same map, as md does).
    pub layout: u32,
    /// Each member's size rounded down to whole chunks: the sectors the map may use.
    pub member_sectors: Vec<u64>,
    pub zones: Vec<StripZone>,
}

impl Raid0 {
    pub fn new(g: &ArrayGeometry) -> Result<Raid0, GeometryError> {
        if g.raid_disks < 1 {
            return Err(GeometryError::TooFewDisks {
                level: Level::Raid0,
                min: 1,
                got: g.raid_disks,
            });
        }
        if g.member_sectors.len() != g.raid_disks {
            return Err(GeometryError::Invalid(format!(
                "raid0 has {} member sizes for {} members",
                g.member_sectors.len(),
                g.raid_disks
            )));
        }
        // md's raid0 takes any chunk that is a whole number of logical blocks, a power of two
        // or not; mdadm only creates multiples of 4 KiB.
        let chunk = g.chunk_sectors;
        if chunk < 8 || !chunk.is_multiple_of(8) {
            return Err(GeometryError::Invalid(format!(
                "raid0 chunk size {chunk} sectors is not a multiple of 8 sectors (4 KiB)"
            )));
        }
        let member_sectors: Vec<u64> = g.member_sectors.iter().map(|s| s / chunk * chunk).collect();
        if let Some(m) = member_sectors.iter().position(|&s| s == 0) {
            return Err(GeometryError::Invalid(format!(
                "raid0 member {m} is smaller than one chunk"
            )));
        }
        let zones = strip_zones(&member_sectors);
        // md: one zone, or a second zone of a single member, cannot tell the layouts apart.
        let layout = if zones.len() == 1 || zones[1].members.len() == 1 {
            RAID0_ORIG_LAYOUT
        } else if g.layout == RAID0_ORIG_LAYOUT || g.layout == RAID0_ALT_MULTIZONE_LAYOUT {
            g.layout
        } else {
            return Err(GeometryError::UnsupportedLayout {
                level: Level::Raid0,
                layout: g.layout,
            });
        };
        Ok(Raid0 {
            chunk_sectors: chunk,
            raid_disks: g.raid_disks,
            layout,
            member_sectors,
            zones,
        })
    }

    /// md's `raid0_size`: the sum of the rounded member sizes.
    pub fn array_sectors(&self) -> u64 {
        self.zones.last().map_or(0, |z| z.zone_end)
    }

    pub fn map(&self, sector: u64) -> Raid0Map {
        // md's find_zone: the first zone whose end lies beyond the sector.
        let zi = self
            .zones
            .iter()
            .position(|z| sector < z.zone_end)
            .unwrap_or_else(|| panic!("raid0 sector {sector} beyond the array end"));
        let zone = &self.zones[zi];
        let zone_start = if zi == 0 {
            0
        } else {
            self.zones[zi - 1].zone_end
        };
        let zone_offset = sector - zone_start;
        let width = zone.members.len() as u64;
        // md's map_sector: the chunk number that picks the member depends on the layout.
        let pick = if self.layout == RAID0_ORIG_LAYOUT {
            sector
        } else {
            zone_offset
        };
        let in_chunk = pick % self.chunk_sectors;
        let member = zone.members[((pick / self.chunk_sectors) % width) as usize];
        let row = zone_offset / (width * self.chunk_sectors);
        Raid0Map {
            member,
            member_sector: zone.dev_start + row * self.chunk_sectors + in_chunk,
            contiguous_sectors: (self.chunk_sectors - in_chunk).min(zone.zone_end - sector),
        }
    }
}

/// md's `create_strip_zones` over member sizes already rounded to whole chunks.
fn strip_zones(sizes: &[u64]) -> Vec<StripZone> {
    let mut zones = Vec::new();
    let mut dev_start = 0u64;
    let mut zone_end = 0u64;
    loop {
        let members: Vec<MemberIdx> = (0..sizes.len())
            .filter(|&m| sizes[m] > dev_start)
            .map(MemberIdx)
            .collect();
        let Some(smallest) = members.iter().map(|m| sizes[m.0]).min() else {
            return zones;
        };
        zone_end += (smallest - dev_start) * members.len() as u64;
        zones.push(StripZone {
            zone_end,
            dev_start,
            members,
        });
        dev_start = smallest;
    }
}
