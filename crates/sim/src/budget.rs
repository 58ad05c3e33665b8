//! The fault budget: faults are injected only where the array must survive them.
//!
//! Two kinds of damage add up:
//! - **member faults** (errors, disappearance, a stale or missing member at assembly): the
//!   engine fails the whole member on any IO error, so such a fault counts against every
//!   unit of the array, from the moment it is scheduled (it may fire at any later IO);
//! - **unit faults** (silent corruption of one block): counted only in that unit (stripe,
//!   chunk or mirror region) until a resync or scrub repairs it.
//!
//! A new fault is allowed only if, for every unit, the members damaged there (member
//! faults plus that unit's own) still leave the data reachable: at most 1 for raid4/5, 2
//! for raid6, n-1 copies for raid1, and per mirror set for raid10 (the level's
//! `survives`), none for raid0.

use super::layout;
use std::collections::{BTreeMap, BTreeSet};
use uraid_core::geometry::Personality;
use uraid_core::MemberIdx;

pub struct FaultBudget {
    personality: Personality,
    members: BTreeSet<usize>,
    units: BTreeMap<u64, BTreeSet<usize>>,
}

impl FaultBudget {
    pub fn new(personality: Personality) -> FaultBudget {
        FaultBudget {
            personality,
            members: BTreeSet::new(),
            units: BTreeMap::new(),
        }
    }

    fn survives(&self, set: &BTreeSet<usize>) -> bool {
        let v: Vec<MemberIdx> = set.iter().map(|&i| MemberIdx(i)).collect();
        self.personality.survives(&v)
    }

    /// Whether a member fault on `m` stays within the budget (free if `m` already has one).
    pub fn can_fault_member(&self, m: usize) -> bool {
        let mut set = self.members.clone();
        set.insert(m);
        self.survives(&set)
            && self.units.values().all(|u| {
                let mut s = set.clone();
                s.extend(u);
                self.survives(&s)
            })
    }

    /// Record a member fault; panics if it breaks the budget (a simulator bug).
    pub fn fault_member(&mut self, m: usize) {
        assert!(self.can_fault_member(m), "member fault on {m} over budget");
        self.members.insert(m);
    }

    /// Record a member fault that is meant to break the budget (over-budget runs).
    pub fn fault_member_over_budget(&mut self, m: usize) {
        self.members.insert(m);
    }

    /// Whether a silent corruption of `m`'s block in `unit` stays within the budget.
    pub fn can_fault_unit(&self, unit: u64, m: usize) -> bool {
        let mut s = self.members.clone();
        if let Some(u) = self.units.get(&unit) {
            s.extend(u);
        }
        s.insert(m);
        // The member must hold a block of the unit for the fault to mean anything.
        let holds = layout::unit_members(&self.personality, unit).contains(&MemberIdx(m));
        holds && self.survives(&s)
    }

    pub fn fault_unit(&mut self, unit: u64, m: usize) {
        assert!(self.can_fault_unit(unit, m), "unit fault over budget");
        self.units.entry(unit).or_default().insert(m);
    }

    /// One unit fault went away (a latent sector error was rewritten).
    pub fn unit_cleared(&mut self, unit: u64, m: usize) {
        if let Some(u) = self.units.get_mut(&unit) {
            u.remove(&m);
            if u.is_empty() {
                self.units.remove(&unit);
            }
        }
    }

    /// A resync or scrub rewrote every unit's redundancy.
    pub fn units_repaired(&mut self) {
        self.units.clear();
    }

    /// A member was replaced by a fresh one and rebuilt (a lifecycle hook).
    pub fn member_replaced(&mut self, m: usize) {
        self.members.remove(&m);
    }

    pub fn faulted_members(&self) -> Vec<usize> {
        self.members.iter().copied().collect()
    }

    pub fn unit_faults(&self) -> usize {
        self.units.values().map(|u| u.len()).sum()
    }

    pub fn is_clear(&self) -> bool {
        self.members.is_empty() && self.units.is_empty()
    }

    /// Whether the array can still serve everything (false only in over-budget runs).
    pub fn within(&self) -> bool {
        self.survives(&self.members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uraid_core::geometry::ArrayGeometry;
    use uraid_core::Level;

    fn personality(level: Level, layout: u32, disks: usize) -> Personality {
        Personality::new(&ArrayGeometry {
            level,
            layout,
            chunk_sectors: 8,
            raid_disks: disks,
            dev_sectors: 8 * 16,
            member_sectors: vec![8 * 16; disks],
        })
        .unwrap()
    }

    #[test]
    fn raid5_allows_one_member_and_corruption_only_on_that_member() {
        let mut b = FaultBudget::new(personality(Level::Raid5, 2, 4));
        assert!(b.can_fault_member(1));
        b.fault_member(1);
        assert!(
            b.can_fault_member(1),
            "more faults on a faulted member are free"
        );
        assert!(!b.can_fault_member(2));
        assert!(b.can_fault_unit(3, 1));
        assert!(!b.can_fault_unit(3, 0));
    }

    #[test]
    fn raid6_counts_corruption_per_stripe() {
        let mut b = FaultBudget::new(personality(Level::Raid6, 2, 5));
        b.fault_unit(0, 0);
        b.fault_unit(0, 1);
        assert!(!b.can_fault_unit(0, 2), "third fault in one stripe");
        assert!(b.can_fault_unit(1, 2), "other stripes keep their budget");
        assert!(
            !b.can_fault_member(3),
            "a member fault adds to stripe 0's two"
        );
        b.units_repaired();
        assert!(b.can_fault_member(3));
    }

    #[test]
    fn raid10_near_counts_per_mirror_set_and_raid0_gets_nothing() {
        let mut b = FaultBudget::new(personality(Level::Raid10, 0x102, 4));
        b.fault_member(0);
        assert!(!b.can_fault_member(1), "same mirror set");
        assert!(b.can_fault_member(2));
        let b0 = FaultBudget::new(personality(Level::Raid0, 0, 3));
        assert!(!b0.can_fault_member(0));
    }
}
