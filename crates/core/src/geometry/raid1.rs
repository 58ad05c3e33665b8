//! raid1: every member holds a full copy at the same offset.

use super::{ArrayGeometry, GeometryError};
use crate::types::Level;

#[derive(Clone, Debug)]
pub struct Raid1 {
    pub raid_disks: usize,
    pub dev_sectors: u64,
}

impl Raid1 {
    pub fn new(g: &ArrayGeometry) -> Result<Raid1, GeometryError> {
        if g.raid_disks < 1 {
            return Err(GeometryError::TooFewDisks {
                level: Level::Raid1,
                min: 1,
                got: g.raid_disks,
            });
        }
        Ok(Raid1 {
            raid_disks: g.raid_disks,
            dev_sectors: g.dev_sectors,
        })
    }

    pub fn array_sectors(&self) -> u64 {
        self.dev_sectors
    }
}
