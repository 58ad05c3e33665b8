//! Member lifecycle and long-running sync work: add (spare or re-add), remove, spare
//! activation, recovery onto a new member, resync, check and repair.
//!
//! All sync work goes through one driver, [`Array::sync_step`], which hands a range of
//! recovery units (stripes for raid4/5/6, sectors for raid1, array chunks for raid10) to the
//! level's `sync_range`. A recovering member's cursor advances under the unit's lock (raid4/5/6)
//! or with the unit's resync barrier raised (raid1/raid10, see `barrier`), so IO
//! sees it valid exactly where it has been rebuilt.

use crate::array::Array;
use crate::array::{SyncCtx, SyncMode};
use crate::error::ArrayError;
use crate::events::Event;
use crate::member::Member;
use crate::slot::SlotState;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::superblock::{
    MemberFlags, Superblock, FEATURE_RECOVERY_OFFSET, MAX_SECTOR, ROLE_FAULTY, ROLE_SPARE,
};
use uraid_core::{MemberIdx, SECTOR_BYTES};

/// What a sync pass does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// Recompute redundancy everywhere (after an unclean stop).
    Resync,
    /// Count mismatches, change nothing (md's check).
    Check,
    /// Count and fix mismatches (md's repair).
    Repair,
    /// Rebuild recovering members.
    Recovery,
}

impl SyncKind {
    /// md's name for it (sync_action's words).
    pub fn name(self) -> &'static str {
        match self {
            SyncKind::Resync => "resync",
            SyncKind::Check => "check",
            SyncKind::Repair => "repair",
            SyncKind::Recovery => "recovery",
        }
    }
}

/// Where a sync pass stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncProgress {
    /// What runs.
    pub kind: SyncKind,
    /// Units done.
    pub done_units: u64,
    /// Units in all.
    pub total_units: u64,
    /// Bytes of array data one unit covers (for speed reports).
    pub unit_bytes: u64,
    /// Sectors found to differ so far (check and repair; md's mismatch_cnt).
    pub mismatch_sectors: u64,
    /// Array bytes found reading as zeros on every member so far (never written, or
    /// discarded), so neither read nor rebuilt: a recovery zeroed its targets there (md
    /// cannot tell, and rebuilds them).
    pub zero_bytes: u64,
}

impl SyncProgress {
    /// Percent done (100 for nothing to do).
    pub fn percent(&self) -> f64 {
        if self.total_units == 0 {
            100.0
        } else {
            self.done_units as f64 * 100.0 / self.total_units as f64
        }
    }
}

/// What `add_member` did with a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddOutcome {
    /// It took a missing role and recovery started.
    Recovering(MemberIdx),
    /// No role is missing: it waits as a spare.
    Spare,
}

impl Array {
    /// Recovery units in the whole array (the level's, see `Personality::total_units`).
    pub fn total_units(&self) -> u64 {
        self.pers().total_units()
    }

    /// Array bytes per recovery unit.
    pub fn unit_bytes(&self) -> u64 {
        self.pers().unit_bytes()
    }

    /// The recovery cursor for md's recovery_offset (the inverse, rounded down).
    pub(crate) fn cursor_for_offset(&self, offset_sectors: u64) -> u64 {
        self.pers().cursor_for_offset(offset_sectors)
    }

    /// Roles whose member is being recovered.
    pub fn recovering_roles(&self) -> Vec<MemberIdx> {
        (0..self.raid_disks())
            .map(MemberIdx)
            .filter(|&r| self.slot_state(r) == SlotState::Recovering)
            .collect()
    }

    pub(crate) fn any_recovering(&self) -> bool {
        (0..self.raid_disks()).any(|r| self.slot_state(MemberIdx(r)) == SlotState::Recovering)
    }

    /// One step of a sync pass: units [start, start + max). Returns (units done, mismatched
    /// sectors).
    pub fn sync_step(
        &self,
        kind: SyncKind,
        start: u64,
        max: u64,
    ) -> Result<(u64, u64), ArrayError> {
        // A sync step counts as a request for quiesce.
        let _active = self.enter()?;
        let targets = if kind == SyncKind::Recovery {
            self.recovering_roles()
        } else {
            Vec::new()
        };
        let mode = match kind {
            SyncKind::Check => SyncMode::Check,
            _ => SyncMode::Repair,
        };
        // A resync after an unclean stop, and the recovery of re-added members, only need
        // the chunks the bitmap marks; check and repair read everything.
        let skip_clean = match kind {
            SyncKind::Resync => self.has_bitmap(),
            SyncKind::Recovery => {
                !targets.is_empty() && targets.iter().all(|t| self.slot(*t).bitmap_recovery())
            }
            _ => false,
        };
        let generations: Vec<u64> = targets.iter().map(|t| self.slot(*t).generation()).collect();
        let ctx = SyncCtx {
            mode,
            targets: &targets,
            generations: &generations,
            skip_clean,
        };
        self.pers().sync_range(self, start, max, &ctx)
    }

    /// `Err` when the daemons asked the running sync to stop (md's MD_RECOVERY_INTR);
    /// sync loops check it between steps.
    pub(crate) fn check_sync_intr(&self) -> Result<(), ArrayError> {
        if self.sync_intr.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ArrayError::Failed(
                "sync interrupted: the array is stopping".into(),
            ));
        }
        Ok(())
    }

    /// Run a whole sync pass, calling `progress` after each step (it may sleep to limit
    /// speed). Returns the mismatched sectors found (resync/check/repair).
    pub fn run_sync(
        &self,
        kind: SyncKind,
        mut progress: impl FnMut(&SyncProgress),
    ) -> Result<u64, ArrayError> {
        // md's check only reads; the others write members.
        if kind != SyncKind::Check {
            self.check_writable(kind.name())?;
        }
        // md runs no sync action while a reshape runs (its sync_action says "reshape"): a
        // member the reshape rebuilds gets its rows from the reshape itself and is in sync
        // at its end, and a check would compare nothing (the reshaping personality has no
        // sync units), so it is refused rather than reported as 0 mismatches.
        if self.is_reshaping() {
            return Err(ArrayError::Refused(format!(
                "{} refused: a reshape is in progress; it can run once the reshape is done \
                 (uraid grow --continue finishes it)",
                kind.name()
            )));
        }
        if matches!(kind, SyncKind::Resync | SyncKind::Check | SyncKind::Repair)
            && self.is_degraded()
        {
            return Err(ArrayError::Failed(format!(
                "cannot {} a degraded array: there is no redundancy to compare",
                kind.name()
            )));
        }
        let total = self.total_units();
        if kind == SyncKind::Recovery && self.recovering_roles().is_empty() {
            // Replacements (md's --replace) are rebuilt by copying; one whose old member
            // failed meanwhile continues below as an ordinary recovery.
            self.run_replace(&mut progress)?;
        }
        let start = if kind == SyncKind::Recovery {
            let roles = self.recovering_roles();
            if roles.is_empty() {
                return Ok(0);
            }
            self.events.emit(Event::RebuildStarted {
                role: roles.first().copied(),
            });
            roles
                .iter()
                .map(|r| self.slot(*r).recovery_cursor())
                .min()
                .unwrap_or(0)
        } else {
            0
        };
        // About 32 MiB of array data per step: large enough for several batched passes of
        // the parity levels (which overlap one pass's writes with the next one's reads),
        // small enough for progress and throttling to stay responsive.
        let step = ((32u64 << 20) / self.unit_bytes().max(1)).max(1);
        let mut p = SyncProgress {
            kind,
            done_units: start,
            total_units: total,
            unit_bytes: self.unit_bytes(),
            mismatch_sectors: 0,
            zero_bytes: 0,
        };
        let zero_bytes_before = self.stats.sync_zero_bytes.load(Ordering::Relaxed);
        let mut last_pct = (p.percent() / 20.0) as u32;
        let mut last_persist = start;
        while p.done_units < total {
            self.check_sync_intr()?;
            if kind == SyncKind::Recovery {
                // Follow the targets as they are now: one may have failed and a spare
                // taken its role, starting again from zero.
                let roles = self.recovering_roles();
                if roles.is_empty() {
                    return Err(ArrayError::Failed("recovery target failed".into()));
                }
                p.done_units = roles
                    .iter()
                    .map(|r| self.slot(*r).recovery_cursor())
                    .min()
                    .unwrap_or(0);
                if p.done_units >= total {
                    break;
                }
            }
            let (n, m) = self.sync_step(kind, p.done_units, step)?;
            p.done_units += n.max(1);
            p.mismatch_sectors += m;
            p.zero_bytes = self
                .stats
                .sync_zero_bytes
                .load(Ordering::Relaxed)
                .saturating_sub(zero_bytes_before);
            progress(&p);
            let pct = (p.percent() / 20.0) as u32;
            if kind == SyncKind::Recovery && pct > last_pct && pct < 5 {
                self.events.emit(Event::Rebuild { percent: pct * 20 });
                last_pct = pct;
            }
            // Persist the recovery position now and then, so a restart resumes near it.
            if kind == SyncKind::Recovery && p.done_units - last_persist > total / 64 {
                let mut meta = self.meta();
                meta.write_all(self)?;
                last_persist = p.done_units;
            }
        }
        match kind {
            SyncKind::Recovery => {
                self.finish_recovery()?;
                // Replacements wait while a role is being recovered (md too rebuilds
                // missing roles first).
                self.run_replace(&mut progress)?;
            }
            SyncKind::Resync | SyncKind::Repair => {
                let degraded = self.is_degraded() || self.any_recovering();
                let mut meta = self.meta();
                meta.set_resync_done();
                let events = meta.events();
                if let Some(b) = meta.bitmap.as_mut() {
                    b.clear_idle(degraded, events);
                }
                if !self.is_dirty() {
                    // Nothing is being written: the array is clean on disk now.
                    meta.set_dirty(false);
                }
                meta.write_all(self)?;
            }
            SyncKind::Check => {}
        }
        if matches!(kind, SyncKind::Check | SyncKind::Repair) {
            self.events.emit(Event::CheckFinished {
                mismatch_sectors: p.mismatch_sectors,
            });
        }
        Ok(p.mismatch_sectors)
    }

    /// Recompute redundancy over the whole array (md's resync after an unclean shutdown).
    /// Returns the mismatched sectors found and rewritten.
    pub fn resync(&self) -> Result<u64, ArrayError> {
        self.run_sync(SyncKind::Resync, |_| {})
    }

    /// md's check: count mismatched sectors, change nothing.
    pub fn check(&self) -> Result<u64, ArrayError> {
        self.run_sync(SyncKind::Check, |_| {})
    }

    /// md's repair: count and fix mismatched sectors.
    pub fn repair(&self) -> Result<u64, ArrayError> {
        self.run_sync(SyncKind::Repair, |_| {})
    }

    fn finish_recovery(&self) -> Result<(), ArrayError> {
        let _g = self.reconfig.lock().unwrap();
        let done: Vec<MemberIdx> = self
            .recovering_roles()
            .into_iter()
            .filter(|r| self.slot(*r).recovery_cursor() >= self.total_units())
            .collect();
        if done.is_empty() {
            return Ok(());
        }
        for r in &done {
            self.slot(*r)
                .transition(SlotState::Recovering, SlotState::InSync);
        }
        self.refresh_failfast();
        let mut meta = self.meta();
        for r in &done {
            if let Some(sb) = meta.members[*r].as_mut() {
                sb.feature_map &= !FEATURE_RECOVERY_OFFSET;
                sb.recovery_offset = MAX_SECTOR;
            }
        }
        meta.write_all(self)?;
        drop(meta);
        for r in done {
            self.events.emit(Event::RebuildFinished { role: Some(r) });
            let device = self.slot(r).device_name().unwrap_or_default();
            self.events.emit(Event::SpareActive { role: r, device });
        }
        Ok(())
    }

    /// Add a device: it takes a missing role (and recovery must then run, see
    /// [`Array::run_sync`] with [`SyncKind::Recovery`]) or waits as a spare. A device that
    /// was a member of this array before is re-added in its old role if that role is free.
    pub fn add_member(&self, dev: Arc<dyn Member>) -> Result<AddOutcome, ArrayError> {
        self.add_member_with(dev, MemberFlags::default())
    }

    /// [`Array::add_member`] with md's member flags (mdadm --add --write-mostly
    /// --failfast). A re-added member keeps the flags its superblock had, plus these; the
    /// flags go with the device: as a spare, as the role it takes, as a replacement.
    pub fn add_member_with(
        &self,
        dev: Arc<dyn Member>,
        flags: MemberFlags,
    ) -> Result<AddOutcome, ArrayError> {
        self.add_device(dev, flags, true)
    }

    /// Add a device as a spare even where a role is missing (as md adds one to a frozen
    /// array: mdadm --grow --add, where the reshape gives it its role).
    pub(crate) fn add_spare(&self, dev: Arc<dyn Member>) -> Result<AddOutcome, ArrayError> {
        self.add_device(dev, MemberFlags::default(), false)
    }

    fn add_device(
        &self,
        dev: Arc<dyn Member>,
        flags: MemberFlags,
        take_role: bool,
    ) -> Result<AddOutcome, ArrayError> {
        self.check_writable("adding a member")?;
        if !self.pers().rebuilds() {
            return Err(ArrayError::Failed(
                "raid0 has no redundancy: members cannot be added".into(),
            ));
        }
        // Quiesce before the reconfig lock: a request inside may need that lock (failure
        // handling activates spares) before it can leave.
        let _quiet = self.quiesce();
        let _g = self.reconfig.lock().unwrap();
        let name = dev.name();
        // By what the device is, not how its path is spelt: the same file under another
        // name must not become a spare too (its superblock would be rewritten as one).
        // Read once: the identity wants its device UUID, the role choice below its set.
        let found = crate::meta::superblock_if_any(dev.as_ref());
        let id = crate::identity::Identity {
            device: dev.device_id(),
            device_uuid: found.as_ref().map(|sb| sb.device_uuid),
        };
        let mut meta = self.meta();
        if let Some((place, known, why)) = crate::placement::locate(self, &meta, &id) {
            return Err(ArrayError::Failed(match place {
                crate::identity::Place::Member(_, SlotState::Faulty) => format!(
                    "{name} is still in the array as {place}, named {known}: remove it first"
                ),
                _ => format!(
                    "{name} is already in the array as {place}, named {known} ({why}); \
                     nothing was changed"
                ),
            }));
        }
        let tmpl_member = meta
            .members
            .values()
            .flatten()
            .next()
            .cloned()
            .ok_or_else(|| {
                ArrayError::Failed("no member superblock to copy the layout from".into())
            })?;
        let data_offset = tmpl_member.data_offset;
        // The new member's superblock goes where the array's metadata version puts it on
        // this device; 1.0 keeps the same reserve (bitmap, bad block log) below it.
        let dev_sectors = dev.size_bytes() / SECTOR_BYTES;
        let version = tmpl_member.version();
        let is_090 = meta.is_090();
        // 0.90: everything below the superblock is data; 1.0 keeps the same reserve
        // (bitmap, bad block log) below its superblock.
        let placed = if is_090 {
            uraid_core::superblock090::sb090_offset_sectors(dev_sectors).map(|at| (at, at))
        } else {
            version.super_offset_sectors(dev_sectors).and_then(|at| {
                if version.at_end() {
                    let reserve = tmpl_member
                        .super_offset
                        .checked_sub(tmpl_member.data_offset + tmpl_member.data_size)?;
                    let size = at.checked_sub(reserve)?.checked_sub(data_offset)?;
                    Some((at, size))
                } else {
                    Some((at, dev_sectors.checked_sub(data_offset)?))
                }
            })
        };
        let need = (data_offset + self.geometry().dev_sectors) * SECTOR_BYTES;
        let Some((super_offset, data_size)) =
            placed.filter(|&(_, size)| size >= self.geometry().dev_sectors)
        else {
            return Err(ArrayError::Failed(format!(
                "{name} is too small: {} bytes, the array needs {need} (data offset {} sectors + {} sectors of data) plus its {} metadata",
                dev.size_bytes(),
                data_offset,
                self.geometry().dev_sectors,
                meta.metadata_name()
            )));
        };
        // An old member of this array comes back in its old role if it is free.
        let old = found.filter(|sb| sb.set_uuid == meta.template.set_uuid);
        let used: Vec<u32> = meta
            .members
            .values()
            .flatten()
            .map(|s| s.dev_number)
            .chain(meta.spares.iter().map(|(_, s)| s.dev_number))
            .collect();
        let free_role = |want: Option<usize>| -> Option<usize> {
            if let Some(w) = want.filter(|&w| w < self.raid_disks()) {
                if matches!(
                    self.slot_state(MemberIdx(w)),
                    SlotState::Missing | SlotState::Faulty
                ) {
                    return Some(w);
                }
            }
            (0..self.raid_disks()).find(|&r| {
                matches!(
                    self.slot_state(MemberIdx(r)),
                    SlotState::Missing | SlotState::Faulty
                )
            })
        };
        let old_role = old
            .as_ref()
            .and_then(|sb| sb.dev_roles.get(sb.dev_number as usize).copied())
            .map(usize::from);
        let dev_number = match &old {
            Some(sb) if !used.contains(&sb.dev_number) => sb.dev_number,
            _ => (0u32..).find(|n| !used.contains(n)).expect("a free number"),
        };
        if dev_number as usize >= meta.template.dev_roles.len() {
            return Err(ArrayError::Failed(
                "no free device number in the superblock".into(),
            ));
        }
        let mut sb: Superblock = meta.template.clone();
        sb.dev_number = dev_number;
        sb.device_uuid = old
            .as_ref()
            .map(|o| o.device_uuid)
            .unwrap_or_else(crate::create::random_uuid);
        if let Some(cx) = meta.v090.as_mut() {
            // 0.90 has no device uuid: the model's follows the number; and the number's
            // old major:minor is another device's.
            sb.device_uuid = uraid_core::superblock090::device_uuid_for(&sb.set_uuid, dev_number);
            if let Some(id) = cx.dev_ids.get_mut(dev_number as usize) {
                *id = (0, 0);
            }
        }
        sb.data_offset = data_offset;
        sb.data_size = data_size;
        sb.super_offset = super_offset;
        sb.bblog_offset = tmpl_member.bblog_offset;
        sb.bblog_size = tmpl_member.bblog_size;
        sb.bblog_shift = tmpl_member.bblog_shift;
        // md's flags: those asked for, and a re-added member keeps its own (md reads them
        // from its superblock; `set_member_flags` clears them).
        sb.devflags = old
            .as_ref()
            .map_or(MemberFlags::default(), |o| o.member_flags())
            .union(flags)
            .devflags();
        sb.cnt_corrected_read = 0;
        // A new member has an empty bad block log.
        sb.feature_map &= !uraid_core::superblock::FEATURE_BAD_BLOCKS;
        // md's re-add: an old member whose events are not older than the bitmap's last
        // clearing missed only writes the bitmap still marks.
        let bitmap_readd = |role: usize| {
            old.as_ref().is_some_and(|o| {
                old_role == Some(role)
                    && meta
                        .bitmap
                        .as_ref()
                        .is_some_and(|b| o.events >= b.sb.events_cleared)
            })
        };
        // A spare taking a role changes what writes skip: pending until recorded.
        let change = self.begin_sb_change();
        let outcome = match free_role(old_role).filter(|_| take_role) {
            Some(role) => {
                self.slot(MemberIdx(role))
                    .set_bitmap_recovery(bitmap_readd(role));
                sb.feature_map |= FEATURE_RECOVERY_OFFSET;
                sb.recovery_offset = 0;
                meta.template.dev_roles[dev_number as usize] = role as u16;
                let flags = sb.member_flags();
                meta.members[MemberIdx(role)] = Some(sb);
                let slot = self.slot(MemberIdx(role));
                slot.set_recovery_cursor(0);
                slot.set_device(Some(dev.clone()), data_offset * SECTOR_BYTES, flags);
                slot.set_state(SlotState::Recovering);
                AddOutcome::Recovering(MemberIdx(role))
            }
            None => {
                meta.template.dev_roles[dev_number as usize] = ROLE_SPARE;
                meta.spares.push((dev.clone(), sb));
                AddOutcome::Spare
            }
        };
        let written = meta.write_all(self);
        match outcome {
            // Only a role taken is a change writes depend on; a spare that could not be
            // recorded is just refused.
            AddOutcome::Recovering(_) => change.recorded(written)?,
            AddOutcome::Spare => written?,
        }
        drop(change);
        drop(meta);
        self.events.emit(Event::SpareAdded {
            device: name.clone(),
        });
        // RebuildStarted comes when the recovery runs (`run_sync`), as md's when its sync
        // thread starts: once per recovery.
        Ok(outcome)
    }

    /// Give a missing or faulty role to a spare, if there is one.
    pub fn activate_spare(&self) -> Result<Option<MemberIdx>, ArrayError> {
        let _quiet = self.quiesce();
        self.activate_spare_now()
    }

    /// [`Array::activate_spare`] without quiescing, for failure handling inside a request.
    pub(crate) fn activate_spare_now(&self) -> Result<Option<MemberIdx>, ArrayError> {
        let _g = self.reconfig.lock().unwrap();
        let Some(role) = (0..self.raid_disks())
            .map(MemberIdx)
            .find(|&r| matches!(self.slot_state(r), SlotState::Missing | SlotState::Faulty))
        else {
            return Ok(None);
        };
        let mut meta = self.meta();
        let Some((dev, mut sb)) = meta.spares.pop() else {
            return Ok(None);
        };
        let change = self.begin_sb_change();
        sb.feature_map |= FEATURE_RECOVERY_OFFSET;
        sb.recovery_offset = 0;
        meta.template.dev_roles[sb.dev_number as usize] = role.0 as u16;
        let data_offset = sb.data_offset;
        let flags = sb.member_flags();
        let slot = self.slot(role);
        if slot.state() == SlotState::Faulty {
            if let Some(old) = slot.device() {
                meta.keep_faulty(role, old);
            }
        }
        meta.members[role] = Some(sb);
        slot.set_recovery_cursor(0);
        slot.set_bitmap_recovery(false);
        slot.set_device(Some(dev.clone()), data_offset * SECTOR_BYTES, flags);
        slot.set_state(SlotState::Recovering);
        change.recorded(meta.write_all(self))?;
        drop(change);
        drop(meta);
        Ok(Some(role))
    }

    /// Remove a faulty member (or a spare, by device name) from the array, as mdadm --remove.
    pub fn remove_member(&self, role: MemberIdx) -> Result<(), ArrayError> {
        let _quiet = self.quiesce();
        let _g = self.reconfig.lock().unwrap();
        if role.0 >= self.raid_disks() {
            return Err(ArrayError::Failed(format!("there is no member {role}")));
        }
        match self.slot_state(role) {
            SlotState::Faulty => {}
            SlotState::Missing => {
                return Err(ArrayError::Failed(format!("role {role} is already empty")))
            }
            _ => {
                return Err(ArrayError::Failed(format!(
                    "member {role} is active: fail it first (uraid fail), as mdadm requires"
                )))
            }
        }
        let slot = self.slot(role);
        let device = slot.device_name().unwrap_or_default();
        let mut meta = self.meta();
        let change = self.begin_sb_change();
        slot.set_device(None, 0, MemberFlags::default());
        slot.set_state(SlotState::Missing);
        if let Some(sb) = meta.members[role].take() {
            meta.template.dev_roles[sb.dev_number as usize] = ROLE_FAULTY;
        }
        change.recorded(meta.write_all(self))?;
        drop(change);
        drop(meta);
        self.events.emit(Event::DeviceRemoved { device });
        Ok(())
    }

    /// Set a member's md flags (md's dev-N/state `writemostly`, `-writemostly`, `failfast`,
    /// `-failfast`; `uraid set --member`): the next IO sees them, and they are written to
    /// the superblocks at once (only kept in memory when opened read-only, as every
    /// superblock change then). A faulty member keeps them for the record.
    pub fn set_member_flags(&self, role: MemberIdx, flags: MemberFlags) -> Result<(), ArrayError> {
        if role.0 >= self.raid_disks() {
            return Err(ArrayError::Failed(format!("there is no member {role}")));
        }
        let slot = self.slot(role);
        // Under the superblock lock: a spare cannot take the role meanwhile.
        let mut meta = self.meta();
        if slot.state() == SlotState::Missing {
            return Err(ArrayError::Failed(format!(
                "role {role} has no device to set flags on"
            )));
        }
        if slot.member_flags() == flags {
            return Ok(());
        }
        // The superblock write takes the slot's flags (Meta::write_all).
        slot.set_member_flags(flags);
        meta.write_all(self)
    }

    /// Remove a spare by device name.
    pub fn remove_spare(&self, name: &str) -> Result<(), ArrayError> {
        let _g = self.reconfig.lock().unwrap();
        let mut meta = self.meta();
        let Some(i) = meta.spares.iter().position(|(d, _)| d.name() == name) else {
            return Err(ArrayError::Failed(format!(
                "{name} is not a spare of this array"
            )));
        };
        let (_, sb) = meta.spares.remove(i);
        meta.template.dev_roles[sb.dev_number as usize] = ROLE_FAULTY;
        meta.write_all(self)?;
        drop(meta);
        self.events.emit(Event::DeviceRemoved {
            device: name.to_string(),
        });
        Ok(())
    }

    /// Names of the members that failed and lost their role to another device, kept until
    /// removed (md's faulty rdevs with no raid_disk).
    /// With each, its md device number (`u32::MAX` if unknown).
    pub fn faulty_devices(&self) -> Vec<(String, u32)> {
        self.meta()
            .faulty
            .iter()
            .map(|(d, n)| (d.name(), *n))
            .collect()
    }

    /// Remove a faulty member that no longer holds a role (see
    /// [`Array::faulty_devices`]), by device name, as mdadm --remove; the superblocks are
    /// written as md writes them then.
    pub fn remove_faulty(&self, name: &str) -> Result<(), ArrayError> {
        let _g = self.reconfig.lock().unwrap();
        let mut meta = self.meta();
        let Some(i) = meta.faulty.iter().position(|(d, _)| d.name() == name) else {
            return Err(ArrayError::Failed(format!(
                "{name} is not a faulty member of this array"
            )));
        };
        meta.faulty.remove(i);
        // md writes the superblocks when it kicks an rdev (events advance): a 0.90 record
        // drops the device's entry and counts it out of nr_disks.
        let change = self.begin_sb_change();
        change.recorded(meta.write_all(self))?;
        drop(change);
        drop(meta);
        self.events.emit(Event::DeviceRemoved {
            device: name.to_string(),
        });
        Ok(())
    }

    /// Names of spare devices.
    pub fn spares(&self) -> Vec<String> {
        self.meta().spares.iter().map(|(d, _)| d.name()).collect()
    }

    /// Spare devices with the md flags their superblocks carry (they keep them when they
    /// take a role).
    pub fn spares_with_flags(&self) -> Vec<(String, MemberFlags)> {
        self.meta()
            .spares
            .iter()
            .map(|(d, sb)| (d.name(), sb.member_flags()))
            .collect()
    }

    /// Subscribe to the array's events.
    pub fn subscribe(&self) -> std::sync::mpsc::Receiver<Event> {
        self.events.subscribe()
    }
}

/// md's sync_speed_min / sync_speed_max, in KiB/s of array data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncLimits {
    /// Speed kept even while the array is busy with other IO.
    pub min_kib_s: u64,
    /// Speed never exceeded.
    pub max_kib_s: u64,
}

impl Default for SyncLimits {
    /// md's defaults: 1000 and 200000 KiB/s.
    fn default() -> SyncLimits {
        SyncLimits {
            min_kib_s: 1000,
            max_kib_s: 200_000,
        }
    }
}

/// Paces a sync pass as md does: at most `max` always, and down to `min` while other IO
/// is going on (the pass backs off for the array's users).
pub struct Throttle {
    limits: SyncLimits,
    /// The array clock's milliseconds at the first step (set then).
    started_ms: Option<u64>,
    start_units: Option<u64>,
    last_requests: u64,
    /// Bytes that count as done "for free" so that the pace restarts after a busy spell.
    credit_bytes: f64,
}

impl Throttle {
    /// A throttle that starts now with these limits.
    pub fn new(limits: SyncLimits) -> Throttle {
        Throttle {
            limits,
            started_ms: None,
            start_units: None,
            last_requests: 0,
            credit_bytes: 0.0,
        }
    }

    /// Call after each step; sleeps as needed (on the array's clock). Returns the current
    /// speed in bytes/s.
    pub fn pace(&mut self, a: &Array, p: &SyncProgress) -> f64 {
        let clock = a.clock();
        let started = *self.started_ms.get_or_insert_with(|| clock.now_ms());
        let start = *self.start_units.get_or_insert(p.done_units);
        let done = (p.done_units - start) as f64 * p.unit_bytes as f64;
        let requests = a.stats.requests.load(std::sync::atomic::Ordering::Relaxed);
        let busy = requests != self.last_requests;
        self.last_requests = requests;
        let speed_kib = if busy {
            self.limits.min_kib_s
        } else {
            self.limits.max_kib_s
        }
        .max(1) as f64;
        let elapsed = clock.now_ms().saturating_sub(started) as f64 / 1000.0;
        let want = (done - self.credit_bytes) / (speed_kib * 1024.0);
        if want > elapsed {
            let nap = (want - elapsed).min(1.0);
            clock.sleep(std::time::Duration::from_secs_f64(nap));
        } else if elapsed - want > 1.0 {
            // Far behind the target (slow members): do not burst later to catch up.
            self.credit_bytes = done - elapsed * speed_kib * 1024.0;
        }
        let total = (clock.now_ms().saturating_sub(started) as f64 / 1000.0).max(1e-6);
        done / total
    }
}
