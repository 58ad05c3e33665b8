//! Placeholder for the restripe engine (raid4/5/6 --raid-devices, --chunk, --layout that
//! move data), which lives in `reshape.rs` on its own branch and replaces this file when
//! the branches merge. It has the same signature, so `uraid grow` routes to it already.

use crate::array::Array;
use crate::error::ArrayError;
use uraid_core::Level;

/// A change that moves data (md's reshape): any field left `None` stays as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReshapeRequest {
    /// The new level (a takeover that needs a restripe after it).
    pub level: Option<Level>,
    /// The new number of member roles.
    pub raid_disks: Option<usize>,
    /// The new chunk size in sectors.
    pub chunk_sectors: Option<u64>,
    /// The new md layout number.
    pub layout: Option<u32>,
}

impl Array {
    /// Start a restripe to the shape `req` asks for. Not in this build: always refused,
    /// before anything is written.
    pub fn start_reshape(&self, req: &ReshapeRequest) -> Result<(), ArrayError> {
        Err(ArrayError::Refused(format!(
            "restriping {} ({req:?}) moves data and is not in this build of uraid: nothing \
             was written; use a build with the reshape engine, or mdadm --grow",
            self.level()
        )))
    }
}
