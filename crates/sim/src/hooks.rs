//! The engine's member lifecycle (spares, add, remove, recovery, check/repair) behind the
//! simulator's [`Lifecycle`] hooks. Kept in one place so that the simulator core does not
//! change when these APIs do.

use super::run::Lifecycle;
use std::sync::Arc;
use uraid_core::MemberIdx;
use uraid_engine::Array;
use uraid_engine::ArrayError;
use uraid_engine::Member;
use uraid_engine::{AddOutcome, SyncKind};

/// The engine's own lifecycle features.
pub struct EngineLifecycle;

impl Lifecycle for EngineLifecycle {
    fn scrub(&self, array: &Array, repair: bool) -> Option<Result<u64, ArrayError>> {
        Some(if repair {
            array.repair()
        } else {
            array.check()
        })
    }

    fn check_range(
        &self,
        array: &Array,
        start: u64,
        sectors: u64,
    ) -> Option<Result<u64, ArrayError>> {
        let unit = array.unit_bytes() / uraid_core::SECTOR_BYTES;
        if unit == 0 {
            return None;
        }
        let (mut at, end) = (start / unit, (start + sectors).div_ceil(unit));
        let mut mismatched = 0;
        while at < end {
            match array.sync_step(SyncKind::Check, at, end - at) {
                Ok((n, m)) => {
                    at += n.max(1);
                    mismatched += m;
                }
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(mismatched))
    }

    fn add_member(
        &self,
        array: &Array,
        disk: Arc<dyn Member>,
    ) -> Option<Result<Option<MemberIdx>, ArrayError>> {
        Some(array.add_member(disk).map(|o| match o {
            AddOutcome::Recovering(r) => Some(r),
            AddOutcome::Spare => None,
        }))
    }

    fn remove_member(&self, array: &Array, role: MemberIdx) -> Option<Result<(), ArrayError>> {
        Some(array.remove_member(role))
    }

    fn recover(&self, array: &Array) -> Option<Result<(), ArrayError>> {
        Some(array.run_sync(SyncKind::Recovery, |_| {}).map(|_| ()))
    }

    fn spares(&self, array: &Array) -> Vec<String> {
        array.spares()
    }

    fn replace(&self, array: &Array, role: MemberIdx) -> Option<Result<String, ArrayError>> {
        Some(array.replace(role, None))
    }
}
