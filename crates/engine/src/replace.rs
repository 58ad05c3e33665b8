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
use crate::slot::{BadCheck, SlotState};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use uraid_core::geometry::Personality;
use uraid_core::superblock::{
    Superblock, FEATURE_RECOVERY_OFFSET, FEATURE_REPLACEMENT, MAX_SECTOR, ROLE_FAULTY,
};
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};

/// Bytes of member data copied per step (and held back from writers meanwhile).
const COPY_STEP_BYTES: usize = 1 << 20;

/// The old member of a role with its replacement being rebuilt beside it.
pub struct Replacing {
    old: Arc<dyn Member>,
    pub(crate) new: Arc<dyn Member>,
    /// The data area on the old member, in bytes. Writes outside it (superblock, bitmap)
    /// belong to the old member alone: the replacement has its own.
    data_start: u64,
    data_bytes: u64,
    /// Where the replacement's data area starts.
    pub(crate) new_data_start: u64,
    st: Mutex<CopyState>,
    cv: Condvar,
    failed: AtomicBool,
    /// The old device's bad blocks: the copy must not take data from them.
    bad: BadCheck,
}

struct CopyState {
    /// Data-area bytes already copied: the replacement is valid below it.
    cursor: u64,
    /// The range being copied now: writes overlapping it wait.
    window: Option<(u64, u64)>,
    /// Writes in flight (data-area byte ranges): the copier waits for those overlapping its
    /// window, so it never copies data a write is about to change behind its back.
    inflight: Vec<(u64, u64)>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// What one copy step did.
pub(crate) enum CopyStep {
    /// Copied up to this data-area byte.
    Copied(u64),
    /// Everything is copied.
    Done,
    /// The old member could not read [start, end) (data-area bytes).
    ReadError(u64, u64, io::Error),
    /// The replacement could not be written: it is failed.
    WriteError,
}

impl Replacing {
    pub(crate) fn new(
        old: Arc<dyn Member>,
        data_start: u64,
        data_bytes: u64,
        new: Arc<dyn Member>,
        new_data_start: u64,
        cursor_bytes: u64,
        bad: BadCheck,
    ) -> Replacing {
        Replacing {
            old,
            new,
            data_start,
            data_bytes,
            new_data_start,
            st: Mutex::new(CopyState {
                cursor: cursor_bytes.min(data_bytes),
                window: None,
                inflight: Vec::new(),
            }),
            cv: Condvar::new(),
            failed: AtomicBool::new(false),
            bad,
        }
    }

    pub(crate) fn old(&self) -> Arc<dyn Member> {
        self.old.clone()
    }

    pub fn new_name(&self) -> String {
        self.new.name()
    }

    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    pub(crate) fn fail_with(&self, e: &io::Error) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            tracing::warn!("replacement {} failed: {e}", self.new.name());
        }
    }

    /// The replacement's recovery_offset: member sectors already rebuilt.
    pub fn cursor_sectors(&self) -> u64 {
        self.st.lock().unwrap().cursor / SECTOR_BYTES
    }

    fn total_sectors(&self) -> u64 {
        self.data_bytes / SECTOR_BYTES
    }

    /// Copy the next range (at most `buf.len()` bytes) from the old member to the
    /// replacement and move the cursor past it once it is written.
    pub(crate) fn copy_step(&self, buf: &mut [u8]) -> CopyStep {
        if self.failed() {
            return CopyStep::WriteError;
        }
        let (start, end) = {
            let mut st = self.st.lock().unwrap();
            let start = st.cursor;
            if start >= self.data_bytes {
                return CopyStep::Done;
            }
            let end = (start + buf.len() as u64).min(self.data_bytes);
            st.window = Some((start, end));
            while st.inflight.iter().any(|&w| overlaps(w, (start, end))) {
                st = self.cv.wait(st).unwrap();
            }
            (start, end)
        };
        let n = (end - start) as usize;
        let first = (self.data_start + start) / SECTOR_BYTES;
        let r = if self.bad.overlaps(first, n as u64 / SECTOR_BYTES) {
            Err(io::Error::other("recorded in the bad block log"))
        } else {
            self.old.read_at(&mut buf[..n], self.data_start + start)
        };
        let r = r.map_err(|e| (true, e)).and_then(|()| {
            self.new
                .write_at(&buf[..n], self.new_data_start + start)
                .map_err(|e| (false, e))
        });
        let mut st = self.st.lock().unwrap();
        st.window = None;
        let out = match r {
            Ok(()) => {
                st.cursor = end;
                CopyStep::Copied(end)
            }
            Err((true, e)) => CopyStep::ReadError(start, end, e),
            Err((false, e)) => {
                self.fail_with(&e);
                CopyStep::WriteError
            }
        };
        drop(st);
        self.cv.notify_all();
        out
    }
}

impl Replacing {
    /// Run a change of the old member's [offset, offset+len) on it and, below the copy
    /// cursor, on the replacement: `op(device, device offset, bytes into the range, bytes)`.
    fn on_both(
        &self,
        offset: u64,
        len: u64,
        op: impl Fn(&dyn Member, u64, u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let end = offset + len;
        let data_end = self.data_start + self.data_bytes;
        if end <= self.data_start || offset >= data_end {
            return op(self.old.as_ref(), offset, 0, len);
        }
        let range = (
            offset.max(self.data_start) - self.data_start,
            end.min(data_end) - self.data_start,
        );
        let mirror = {
            let mut st = self.st.lock().unwrap();
            while st.window.is_some_and(|w| overlaps(w, range)) {
                st = self.cv.wait(st).unwrap();
            }
            st.inflight.push(range);
            // Above the cursor the copy will bring the data over later (it waits for this
            // write first); at or below it only this write can.
            !self.failed() && range.0 < st.cursor
        };
        let r = op(self.old.as_ref(), offset, 0, len);
        if mirror {
            // Also when the old member failed: the replacement then carries on alone as a
            // recovering member and must hold every write below its cursor.
            let skip = self.data_start + range.0 - offset;
            let at = self.new_data_start + range.0;
            if let Err(e) = op(self.new.as_ref(), at, skip, range.1 - range.0) {
                self.fail_with(&e);
            }
        }
        let mut st = self.st.lock().unwrap();
        if let Some(i) = st.inflight.iter().position(|&w| w == range) {
            st.inflight.swap_remove(i);
        }
        drop(st);
        self.cv.notify_all();
        r
    }
}

impl Member for Replacing {
    fn size_bytes(&self) -> u64 {
        self.old.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.old.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.on_both(offset, buf.len() as u64, |dev, at, skip, len| {
            dev.write_at(&buf[skip as usize..(skip + len) as usize], at)
        })
    }

    /// Reads go to the old device in the batch (on its ring if it has one); writes go to
    /// both devices through `write_at`.
    fn submit<'a>(
        &'a self,
        ops: &mut [crate::member::MemberOp<'a>],
        batch: &mut crate::member::Batch<'a>,
    ) {
        for op in ops.iter_mut().filter(|o| o.is_write() && !o.is_complete()) {
            op.run_sync(self);
        }
        self.old.submit(ops, batch);
    }

    fn flush(&self) -> io::Result<()> {
        if !self.failed() {
            if let Err(e) = self.new.flush() {
                self.fail_with(&e);
            }
        }
        self.old.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.discard_zeroes() {
            // Advisory: the replacement keeps whatever it holds.
            return self.old.discard(offset, len);
        }
        self.on_both(offset, len, |dev, at, _, len| dev.discard(at, len))
    }

    /// Only when both read back zeros: the copy below the cursor must stay equal.
    fn discard_zeroes(&self) -> bool {
        self.old.discard_zeroes() && self.new.discard_zeroes()
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: crate::member::ZeroHow) -> io::Result<()> {
        self.on_both(offset, len, |dev, at, _, len| {
            dev.write_zeroes(at, len, how)
        })
    }

    fn zeroes_fast(&self, unmap: bool) -> bool {
        self.old.zeroes_fast(unmap) && self.new.zeroes_fast(unmap)
    }

    fn name(&self) -> String {
        self.old.name()
    }

    fn device_id(&self) -> crate::identity::DeviceId {
        self.old.device_id()
    }
}

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
        if self.level() == Level::Raid0 {
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
        let old = slot.device().expect("an in-sync member has a device");
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
        meta.replacements[role.0] = Some(sb);
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
        self.meta().replacements[role.0] = Some(sb);
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
        let Some(mut sb) = meta.replacements[role.0].take() else {
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
        meta.members[role.0] = Some(sb);
        slot.set_device(Some(r.new.clone()), data_start);
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
        if let Some(sb) = meta.replacements[role.0].take() {
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
        let Some(mut sb) = meta.replacements[role.0].take() else {
            return Ok(());
        };
        // Writes stop reaching the old member: pending until the superblocks say it left.
        let change = self.begin_sb_change();
        meta.mark_faulty(role);
        meta.keep_faulty(role, r.old());
        sb.feature_map &= !(FEATURE_REPLACEMENT | FEATURE_RECOVERY_OFFSET);
        sb.recovery_offset = MAX_SECTOR;
        meta.members[role.0] = Some(sb);
        let old = r.old().name();
        slot.set_device(Some(r.new.clone()), r.new_data_start);
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
        let units = match self.personality() {
            Personality::Raid1(_) => Some((s, e)),
            Personality::Parity(g) => Some((s / g.chunk_sectors, e.div_ceil(g.chunk_sectors))),
            Personality::Raid10(r) if r.far_copies == 1 => {
                // Member chunk row k holds array chunks [k*disks/near, (k+1)*disks/near).
                let per_row = r.raid_disks as u64;
                let row = |x: u64| x / r.chunk_sectors;
                Some((
                    row(s) * per_row / r.near_copies as u64,
                    (row(e.saturating_sub(1)) + 1) * per_row / r.near_copies as u64 + 1,
                ))
            }
            _ => None,
        };
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
