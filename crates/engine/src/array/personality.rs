//! md's `md_personality`: what the array (md's mddev) asks of a RAID level.
//!
//! One implementation per level, each owning its private state (its "conf", as md's
//! r1conf/r10conf/r5conf): `raid0::Raid0Conf`, `raid1::Raid1Conf`, `raid10::Raid10Conf`
//! and the raid4/5/6 one in `raid5_pers`. [`crate::levels::build`] makes the one a
//! geometry asks for; nothing else looks at the level. The trait lives in the `array`
//! module, beside the struct that holds it, so that levels import `array` and `array`
//! imports no level.
//!
//! Addresses at this boundary are [`Sector`]s (512-byte array sectors); member sectors
//! are relative to the member's data area. Recovery units are the level's: see
//! [`Personality::total_units`].

use super::Array;
use crate::error::ArrayError;
use crate::member::ZeroHow;
use std::any::Any;
use uraid_core::geometry::ParityGeometry;
use uraid_core::{MemberIdx, Sector};

/// What a range change (discard, write-zeroes) does on the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZeroKind {
    Discard,
    Zero(ZeroHow),
}

/// What to do with copies (or parity) that differ.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum SyncMode {
    /// Count mismatches only (md's check).
    Check,
    /// Make every copy equal to the first readable one (resync, repair).
    Repair,
}

/// What a level's sync_range is asked to do.
pub(crate) struct SyncCtx<'a> {
    pub mode: SyncMode,
    /// Recovering members to rebuild.
    pub targets: &'a [MemberIdx],
    /// Each target slot's generation when the step began (see `Slot::advance_cursor`).
    pub generations: &'a [u64],
    /// Skip ranges whose bitmap chunks are clean (bitmap-guided resync and re-add).
    pub skip_clean: bool,
}

impl SyncCtx<'_> {
    /// Credit recovery progress up to `unit` to the targets that still hold their device.
    pub(crate) fn advance(&self, a: &Array, unit: u64) {
        for (t, g) in self.targets.iter().zip(self.generations) {
            a.slot(*t).advance_cursor(*g, unit);
        }
    }
}

/// A RAID level as the array drives it (md's md_personality).
pub(crate) trait Personality: Send + Sync {
    /// Read array sectors from `sector` into `buf` (whole sectors), serving around
    /// missing or failing members where the level has redundancy.
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError>;

    /// Write whole array sectors from `sector`; a member that fails is failed and the
    /// write goes on degraded where the level allows.
    fn write(&self, a: &Array, sector: Sector, buf: &[u8]) -> Result<(), ArrayError>;

    /// Discard or zero `sectors` array sectors from `sector`, a range made of whole
    /// [`Personality::zero_unit`]s.
    fn zero(
        &self,
        a: &Array,
        sector: Sector,
        sectors: u64,
        kind: ZeroKind,
    ) -> Result<(), ArrayError>;

    /// The unit a discard or member zeroing works in, in array sectors, and its name for
    /// messages: sectors, or whole stripes where parity must stay right.
    fn zero_unit(&self) -> (u64, &'static str) {
        (1, "sectors")
    }

    /// One sync step (resync, check, repair, recovery): recovery units
    /// [start, start + max). Returns (units done, mismatched sectors).
    fn sync_range(
        &self,
        a: &Array,
        start: u64,
        max: u64,
        ctx: &SyncCtx,
    ) -> Result<(u64, u64), ArrayError>;

    /// Recovery units in the array (what a resync/recovery cursor step covers); 0 for a
    /// level without redundancy.
    fn total_units(&self) -> u64;

    /// Array bytes one recovery unit covers.
    fn unit_bytes(&self) -> u64;

    /// md's recovery_offset (member sectors below which a recovering member is valid)
    /// for a cursor in recovery units; conservative where the layout is not monotonic.
    fn recovery_offset_sectors(&self, cursor: u64) -> u64;

    /// The recovery cursor for md's recovery_offset (the inverse, rounded down).
    fn cursor_for_offset(&self, offset_sectors: u64) -> u64;

    /// The recovery units [u0, u1) that cover member sectors [start, end) of any member,
    /// for read-error repair; None where the mapping is not simple.
    fn member_units(&self, start: u64, end: u64) -> Option<(u64, u64)>;

    /// Where the bitmap counts a write of array sectors [sector, sector+sectors): array
    /// sectors for the mirrors, whole chunk rows of member sectors for raid4/5/6.
    fn bitmap_range(&self, sector: Sector, sectors: u64) -> (u64, u64) {
        (sector.0, sectors)
    }

    /// A second range the same write is counted in: while a reshape has the array in two
    /// geometries, the rows of md's previous geometry (the first range holds the new
    /// one's). A request may move from one side of the reshape to the other between the
    /// bits being set and the data being written, so both are counted.
    fn bitmap_range_previous(&self, _sector: Sector, _sectors: u64) -> Option<(u64, u64)> {
        None
    }

    /// Where array sector `sector`'s data lives: (member, member sector) of every copy
    /// (one for raid0 and raid4/5/6, where it is the data chunk, not parity). Reshape
    /// will map through this between the old and the new geometry.
    #[cfg_attr(not(test), allow(dead_code))] // reshape maps through it; tested now
    fn locate(&self, sector: Sector) -> Vec<(MemberIdx, Sector)>;

    /// Whether the array holds all its data with `missing` members gone.
    fn survives(&self, missing: &[MemberIdx]) -> bool;

    /// Members the level can lose.
    fn max_degraded(&self) -> usize;

    /// Whether a member can be rebuilt (added to a missing role, replaced); raid0 has no
    /// redundancy to rebuild from.
    fn rebuilds(&self) -> bool {
        true
    }

    /// The level's run-time knobs by md's sysfs names, with their values.
    fn tunables(&self, _a: &Array) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Set a run-time knob by its md sysfs name.
    fn set_tunable(&self, a: &Array, name: &str, _value: &str) -> Result<(), ArrayError> {
        Err(ArrayError::Failed(format!(
            "{} has no tunable {name}",
            a.level()
        )))
    }

    /// The striped-parity geometry, for raid4/5/6.
    fn parity(&self) -> Option<&ParityGeometry> {
        None
    }

    /// Write out what the level caches (raid4/5/6 write-back) before a clean stop.
    fn stop(&self, _a: &Array) -> Result<(), ArrayError> {
        Ok(())
    }

    /// Make what the level logs durable before the members are flushed (the raid4/5/6
    /// journal: write-back acknowledges a write once it is there).
    fn flush(&self, _a: &Array) -> Result<(), ArrayError> {
        Ok(())
    }

    /// The same for a forced stop: no waiting on the array's locks; the error, if any.
    fn force_flush(&self) -> Option<String> {
        None
    }

    /// Whether the level holds acknowledged writes not yet on the members.
    fn has_cached_writes(&self) -> bool {
        false
    }

    /// For the level's own module to find its conf again (a downcast).
    fn as_any(&self) -> &dyn Any;

    fn as_any_mut(&mut self) -> &mut dyn Any;
}
