//! md's `--replace`: a spare is rebuilt as a role's *replacement* while the old member
//! stays active and in sync, so the array never loses redundancy.
//!
//! The replacement is copied from the old member in member-sector order (md's
//! recovery_offset on the replacement counts member sectors, whatever the level), and
//! every write to the old member also reaches the replacement below the copy cursor.
//! Both happen in [`Replacing`], which takes the old device's place in its slot: the
//! levels' read and write paths keep addressing one device per role and need no change
//! (reads go to the old member only).
//!
//! Outcomes, as in md:
//! - the copy completes: the replacement takes the role, the old member is marked faulty
//!   (md's Faulty flag) and leaves the array;
//! - the old member fails: the replacement goes on as an ordinary recovery from where
//!   the copy stood (see `Array::member_error`);
//! - the replacement fails: it is dropped and the old member stays.
//!
//! A read error on the old member during the copy is answered from redundancy first: the
//! range is repaired through the level (which rewrites the bad block on the old member)
//! and read again; only if that fails too is the old member failed.

use crate::array::Array;
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::events::Event;
use crate::member::Member;
use crate::recovery::{SyncKind, SyncProgress};
pub use crate::replacing::Replacing;
use crate::replacing::{CopyStep, COPY_STEP_BYTES};
use crate::slot::SlotState;
use std::sync::Arc;
use uraid_core::superblock::{
    Superblock, FEATURE_RECOVERY_OFFSET, FEATURE_REPLACEMENT, MAX_SECTOR, ROLE_FAULTY,
};
use uraid_core::{MemberIdx, SECTOR_BYTES};

impl Array {
    /// Roles with a replacement being rebuilt.
    pub fn replacing_roles(&self) -> Vec<MemberIdx> {
        (0..self.raid_disks())
            .map(MemberIdx)
            .filter(|&r| self.slot(r).replacement().is_some())
            .collect()
    }

    /// md's `--replace`: make a spare (the one named `with`, or any) the replacement of the
    /// in-sync member `role`; [`Array::run_sync`] with [`SyncKind::Recovery`] (or
    /// [`Array::run_replace`]) then rebuilds it. Returns the replacement's name.
    pub fn replace(&self, role: MemberIdx, with: Option<&str>) -> Result<String, ArrayError> {
        self.check_writable("replacing a member")?;
        if !self.pers().rebuilds() {
            return Err(ArrayError::Failed(
                "raid0 has no redundancy: members cannot be replaced".into(),
            ));
        }
        let _g = self.reconfig.lock().unwrap();
        if role.0 >= self.raid_disks() {
            return Err(ArrayError::Failed(format!("there is no member {role}")));
        }
        let slot = self.slot(role);
        if slot.state() != SlotState::InSync {
            return Err(ArrayError::Failed(format!(
                "member {role} is {}: only an active, in-sync member can be replaced",
                slot.state().describe()
            )));
        }
        if let Some(n) = slot.replacement_name() {
            return Err(ArrayError::Failed(format!(
                "member {role} is already being replaced by {n}"
            )));
        }
        let mut meta = self.meta();
        // Checked again under the metadata lock: the member may have failed and been
        // removed since the check above.
        let old = match slot.device() {
            Some(d) if slot.state() == SlotState::InSync => d,
            _ => {
                return Err(ArrayError::Failed(format!(
                    "member {role} failed or was removed meanwhile: only an active, in-sync \
                     member can be replaced (see `uraid detail`)"
                )))
            }
        };
        let pick = match with {
            Some(name) => meta.spares.iter().position(|(d, _)| d.name() == name),
            None => (!meta.spares.is_empty()).then_some(0),
        };
        let Some(i) = pick else {
            return Err(ArrayError::Failed(match with {
                Some(name) => format!("{name} is not a spare of this array: add it first"),
                None => "there is no spare to replace with: add one first".into(),
            }));
        };
        let (new, mut sb) = meta.spares.remove(i);
        sb.feature_map |= FEATURE_REPLACEMENT | FEATURE_RECOVERY_OFFSET;
        sb.recovery_offset = 0;
        meta.template.dev_roles[sb.dev_number as usize] = role.0 as u16;
        let r = Arc::new(Replacing::new(
            old,
            slot.data_offset_bytes(),
            self.geometry().dev_sectors * SECTOR_BYTES,
            new.clone(),
            sb.data_offset * SECTOR_BYTES,
            0,
            slot.bad_check(),
        ));
        meta.replacements[role] = Some(sb);
        slot.set_replacement(Some(r.clone()), r.clone());
        meta.write_all(self)?;
        drop(meta);
        let name = new.name();
        tracing::info!("member {role}: {name} is its replacement; rebuilding");
        self.events.emit(Event::RebuildStarted { role: Some(role) });
        Ok(name)
    }

    /// Put a replacement found at assembly back beside its member (an interrupted replace
    /// resumes from the replacement's recovery_offset).
    pub(crate) fn attach_replacement(&self, role: MemberIdx, new: Arc<dyn Member>, sb: Superblock) {
        let slot = self.slot(role);
        let old = slot.device().expect("attached to a present member");
        let offset = if sb.recovery_offset == MAX_SECTOR {
            0
        } else {
            sb.recovery_offset
        };
        let r = Arc::new(Replacing::new(
            old,
            slot.data_offset_bytes(),
            self.geometry().dev_sectors * SECTOR_BYTES,
            new,
            sb.data_offset * SECTOR_BYTES,
            offset * SECTOR_BYTES,
            slot.bad_check(),
        ));
        self.meta().replacements[role] = Some(sb);
        slot.set_replacement(Some(r.clone()), r);
    }

    /// The old member of `role` failed while being replaced: the replacement takes the role
    /// as a recovering member, valid where the copy got to. Called under the superblock
    /// lock, with the role already marked faulty; false if there is no usable replacement.
    pub(crate) fn promote_replacement(
        &self,
        role: MemberIdx,
        meta: &mut crate::meta::Meta,
    ) -> bool {
        let slot = self.slot(role);
        let Some(r) = slot.replacement() else {
            return false;
        };
        let Some(mut sb) = meta.replacements[role].take() else {
            return false;
        };
        if r.failed() {
            // Both failed: the replacement missed writes and must never be taken for a
            // member of this role again.
            meta.template.dev_roles[sb.dev_number as usize] = ROLE_FAULTY;
            slot.set_replacement(None, r.old());
            return false;
        }
        sb.feature_map &= !FEATURE_REPLACEMENT;
        sb.feature_map |= FEATURE_RECOVERY_OFFSET;
        let cursor = self.cursor_for_offset(r.cursor_sectors());
        let data_start = r.new_data_start;
        meta.keep_faulty(role, r.old());
        // The replacement keeps its own flags (those it was added with as a spare).
        let flags = sb.member_flags();
        meta.members[role] = Some(sb);
        slot.set_device(Some(r.new.clone()), data_start, flags);
        slot.set_recovery_cursor(cursor);
        slot.set_bitmap_recovery(false);
        slot.set_state(SlotState::Recovering);
        tracing::warn!(
            "member {role} failed while being replaced: {} goes on as a recovery",
            r.new_name()
        );
        true
    }

    /// The replacement failed: drop it; the old member keeps the role.
    fn drop_replacement(&self, role: MemberIdx, r: &Arc<Replacing>) -> Result<(), ArrayError> {
        let _g = self.reconfig.lock().unwrap();
        let slot = self.slot(role);
        if !slot.replacement().is_some_and(|c| Arc::ptr_eq(&c, r)) {
            return Ok(());
        }
        let mut meta = self.meta();
        // Writes stop reaching the replacement: pending until its superblock says faulty,
        // or a restart would resume it with the writes it missed.
        let change = self.begin_sb_change();
        slot.set_replacement(None, r.old());
        if let Some(sb) = meta.replacements[role].take() {
            meta.template.dev_roles[sb.dev_number as usize] = ROLE_FAULTY;
        }
        change.recorded(meta.write_all(self))?;
        drop(change);
        drop(meta);
        // mdadm's name for a rebuilding spare that failed.
        self.events.emit(Event::FailSpare {
            device: r.new_name(),
        });
        Ok(())
    }

    /// The copy is complete: the replacement takes the role, the old member is marked
    /// faulty (md's raid5_spare_active / raid1_spare_active) and leaves the array.
    fn finish_replace(&self, role: MemberIdx, r: &Arc<Replacing>) -> Result<(), ArrayError> {
        let _g = self.reconfig.lock().unwrap();
        let slot = self.slot(role);
        if !slot.replacement().is_some_and(|c| Arc::ptr_eq(&c, r))
            || slot.state() != SlotState::InSync
        {
            return Ok(());
        }
        // What the replacement holds must be durable before its superblock says in sync.
        r.new.flush()?;
        let mut meta = self.meta();
        let Some(mut sb) = meta.replacements[role].take() else {
            return Ok(());
        };
        // Writes stop reaching the old member: pending until the superblocks say it left.
        let change = self.begin_sb_change();
        meta.mark_faulty(role);
        meta.keep_faulty(role, r.old());
        sb.feature_map &= !(FEATURE_REPLACEMENT | FEATURE_RECOVERY_OFFSET);
        sb.recovery_offset = MAX_SECTOR;
        let flags = sb.member_flags();
        meta.members[role] = Some(sb);
        let old = r.old().name();
        slot.set_device(Some(r.new.clone()), r.new_data_start, flags);
        change.recorded(meta.write_all(self))?;
        drop(change);
        drop(meta);
        self.events
            .emit(Event::RebuildFinished { role: Some(role) });
        self.events.emit(Event::SpareActive {
            role,
            device: r.new_name(),
        });
        self.events.emit(Event::Fail { role, device: old });
        Ok(())
    }

    /// Rebuild every replacement (see [`Array::replace`]), calling `progress` after each
    /// step. A replacement whose old member fails meanwhile becomes an ordinary recovery,
    /// which [`Array::run_sync`] with [`SyncKind::Recovery`] finishes.
    pub fn run_replace(&self, mut progress: impl FnMut(&SyncProgress)) -> Result<(), ArrayError> {
        let mut buf = AlignedBuf::new(COPY_STEP_BYTES);
        for role in self.replacing_roles() {
            while let Some(p) = self.replace_step(role, &mut buf)? {
                self.check_sync_intr()?;
                progress(&p);
            }
        }
        Ok(())
    }

    /// One copy step of `role`'s replacement (at most `buf.len()` bytes). Returns where it
    /// stands, or None once the replace is over: completed (the replacement took the
    /// role), the replacement failed (dropped), or the old member failed (the role is now
    /// recovering).
    pub fn replace_step(
        &self,
        role: MemberIdx,
        buf: &mut [u8],
    ) -> Result<Option<SyncProgress>, ArrayError> {
        let mut retried = false;
        loop {
            let Some(r) = self.slot(role).replacement() else {
                return Ok(None);
            };
            if self.slot_state(role) != SlotState::InSync {
                // The old member failed on a path that did not hand over (it should not
                // happen): hand over now, or drop a failed replacement.
                let _g = self.reconfig.lock().unwrap();
                let mut meta = self.meta();
                let change = self.begin_sb_change();
                if self.slot_state(role) == SlotState::Faulty
                    && self.promote_replacement(role, &mut meta)
                {
                    change.recorded(meta.write_all(self))?;
                    return Ok(None);
                }
                drop(change);
                drop(meta);
                drop(_g);
                self.drop_replacement(role, &r)?;
                return Ok(None);
            }
            let total = r.total_sectors();
            let before = r.cursor_sectors();
            match r.copy_step(buf) {
                CopyStep::Done => {
                    self.finish_replace(role, &r)?;
                    return Ok(None);
                }
                CopyStep::WriteError => {
                    self.drop_replacement(role, &r)?;
                    return Ok(None);
                }
                CopyStep::Copied(end) => {
                    let done = end / SECTOR_BYTES;
                    // Persist the position about every 1/64 of the way, so that a restart
                    // resumes near it.
                    let mark = (total / 64).max(1);
                    if done / mark != before / mark {
                        self.meta().write_all(self)?;
                    }
                    return Ok(Some(SyncProgress {
                        kind: SyncKind::Recovery,
                        done_units: done,
                        total_units: total,
                        unit_bytes: SECTOR_BYTES,
                        mismatch_sectors: 0,
                        zero_bytes: 0,
                    }));
                }
                CopyStep::ReadError(start, end, e) => {
                    // md answers a read error from redundancy and rewrites the block on
                    // the member; try that once, then give up on the member.
                    if !retried && self.repair_member_range(role, start, end) {
                        retried = true;
                        continue;
                    }
                    self.member_error(role, &e);
                    return Ok(None);
                }
            }
        }
    }

    /// Run the level's repair over the recovery units that cover data-area bytes
    /// [start, end) of `role`'s member: unreadable blocks are rebuilt from redundancy and
    /// written back (read-error repair). False where the mapping is not simple (raid10
    /// far/offset copies) or the repair failed.
    fn repair_member_range(&self, role: MemberIdx, start: u64, end: u64) -> bool {
        let (s, e) = (start / SECTOR_BYTES, end.div_ceil(SECTOR_BYTES));
        let units = self.pers().member_units(s, e);
        let Some((u0, u1)) = units else { return false };
        let u1 = u1.min(self.total_units());
        let _ = role;
        let mut u = u0;
        while u < u1 {
            match self.sync_step(SyncKind::Repair, u, u1 - u) {
                Ok((n, _)) => u += n.max(1),
                Err(_) => return false,
            }
        }
        self.slot_state(role) == SlotState::InSync
    }
}
