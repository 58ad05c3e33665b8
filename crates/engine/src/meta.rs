//! Superblock state of a running array, kept the way md keeps it.
//!
//! Array-wide fields (events, dev_roles, resync_offset, utime) live in one template taken
//! from the freshest member at assembly; each member keeps its own identity fields
//! (dev_number, device_uuid, data_offset, data_size, recovery_offset). Every update bumps
//! `events` and rewrites the superblock of every live member, then flushes them, before the
//! caller goes on: a crash can never leave a stale member looking fresh.

use crate::bitmap::BitmapState;
use crate::error::ArrayError;
use crate::member::Member;
use crate::slot::{Slot, SlotState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use uraid_core::superblock::{
    uuid_string, MetadataVersion, Superblock, SuperblockError, FEATURE_BAD_BLOCKS,
    FEATURE_RECOVERY_OFFSET, FEATURE_REPLACEMENT, MAX_SECTOR, ROLE_FAULTY, SB_IO_BYTES,
    SB_V12_OFFSET_SECTORS,
};
use uraid_core::superblock090::{sb090_offset_sectors, Sb090Context, Sb090Error, Superblock090};
use uraid_core::{MemberIdx, MemberMap};

/// What superblock writes need from the array above them (`Array` implements it): the
/// slots, the level's recovery_offset, and the two member-change hooks. A trait here, so
/// that the lower layer names no `Array`.
pub trait SbHost {
    /// The slot of `role`.
    fn slot(&self, role: MemberIdx) -> &Slot;
    /// md's recovery_offset for a recovering member's cursor (the level's unit).
    fn recovery_offset_sectors(&self, cursor: u64) -> u64;
    /// See [`SbChange`].
    fn begin_sb_change(&self) -> SbChange<'_>;
    /// A member being replaced failed: its replacement goes on as a recovery.
    fn promote_replacement(&self, role: MemberIdx, meta: &mut Meta) -> bool;
    /// Wall seconds of the array's clock (the superblocks' utime).
    fn now_secs(&self) -> u64;
    /// Members were failed here (their superblock could not be written): what the host
    /// derives from the members' states (md's failfast) must be looked at again, and the
    /// failures told as any other member failure is (a waiting spare then takes the role).
    fn members_failed(&self, roles: &[MemberIdx]);
}

/// md's MD_SB_CHANGE_PENDING as a count of member changes whose superblock update is in
/// progress. The common case (none) costs a write one atomic load.
#[derive(Default)]
pub(crate) struct SbPending {
    changes: AtomicU64,
    /// Writes waiting in [`SbPending::wait`].
    waiters: AtomicU64,
    lock: Mutex<()>,
    done: Condvar,
}

impl SbPending {
    /// Wait until no member change is pending. A change that starts meanwhile is waited
    /// for too: the writer cannot tell whether it skipped that member.
    pub(crate) fn wait(&self) {
        if self.changes.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while self.changes.load(Ordering::SeqCst) > 0 {
            g = self.done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Writes waiting now.
    pub(crate) fn waiters(&self) -> u64 {
        self.waiters.load(Ordering::SeqCst)
    }
}

/// A member change in progress: call [`SbChange::new`] before the slot changes, and hand
/// the superblock update's result to [`SbChange::recorded`]; dropping it lets the writes
/// that wait for it complete.
pub struct SbChange<'a> {
    pending: &'a SbPending,
    /// Set when a change reached no superblock (no write is acknowledged after).
    metadata_failed: &'a AtomicBool,
}

impl<'a> SbChange<'a> {
    pub(crate) fn new(pending: &'a SbPending, metadata_failed: &'a AtomicBool) -> SbChange<'a> {
        pending.changes.fetch_add(1, Ordering::SeqCst);
        SbChange {
            pending,
            metadata_failed,
        }
    }

    /// The change's superblock update finished with `r`. If it reached no superblock,
    /// nothing on disk records the change: no write is acknowledged from now on (set
    /// before the waiting writes wake, so that they see it).
    pub(crate) fn recorded(&self, r: Result<(), ArrayError>) -> Result<(), ArrayError> {
        if let Err(e) = &r {
            tracing::error!("a member change could not be recorded in any superblock: {e}");
            self.metadata_failed.store(true, Ordering::SeqCst);
        }
        r
    }
}

impl Drop for SbChange<'_> {
    fn drop(&mut self) {
        let p = self.pending;
        let _g = p.lock.lock().unwrap_or_else(|e| e.into_inner());
        p.changes.fetch_sub(1, Ordering::SeqCst);
        p.done.notify_all();
    }
}

/// The superblock state of a running array, kept as md keeps it: a template with the
/// array-wide state and each member's own superblock.
pub struct Meta {
    /// Array-wide state, from the freshest superblock.
    pub(crate) template: Superblock,
    /// Each role's own superblock (None for a missing role).
    pub(crate) members: MemberMap<Option<Superblock>>,
    /// A resync is owed (the array was not stopped cleanly) and has not run yet.
    pub(crate) needs_resync: bool,
    /// The internal write-intent bitmap, if the array has one.
    pub(crate) bitmap: Option<BitmapState>,
    /// Spare devices with their superblocks.
    pub(crate) spares: Vec<(Arc<dyn Member>, Superblock)>,
    /// Nesting of write_all while it records members whose superblock write failed.
    write_depth: u8,
    /// The journal device and its superblock (its recovery_offset is journal_tail).
    pub(crate) journal: Option<(Arc<dyn Member>, Superblock)>,
    /// Per role, the superblock of its replacement being rebuilt (md's --replace).
    pub(crate) replacements: MemberMap<Option<Superblock>>,
    /// Members that failed and lost their role (to a spare, or to their replacement at
    /// the end of a replace). md keeps such a device, faulty and without a role, until
    /// `mdadm --remove`; so do we, so that detail names it and remove can take it out.
    /// With each, its device number (md's dev_number, the index of its entry in dev_roles).
    pub(crate) faulty: Vec<(Arc<dyn Member>, u32)>,
    /// Opened with --readonly: superblocks and bitmaps are kept in memory only.
    pub(crate) read_only: bool,
    /// A metadata 0.90 array: its superblocks are kept in the v1 model like every other
    /// and written as 0.90 records; this holds what those records carry beyond the model
    /// (md_minor, the devices' major:minor). None for 1.x.
    pub(crate) v090: Option<Sb090Context>,
    /// A nonce for the next superblock write's utime microseconds (bits 40..64, which md
    /// leaves 0): the stamp that a saved written-map file names ([`crate::keep_written`]).
    pub(crate) stamp_micros: Option<u32>,
}

impl Meta {
    pub(crate) fn new(template: Superblock, members: Vec<Option<Superblock>>) -> Meta {
        let needs_resync = template.resync_offset != MAX_SECTOR;
        let replacements = MemberMap::from_fn(members.len(), |_| None);
        let members = MemberMap::from(members);
        Meta {
            replacements,
            template,
            members,
            needs_resync,
            bitmap: None,
            spares: Vec::new(),
            faulty: Vec::new(),
            write_depth: 0,
            journal: None,
            read_only: false,
            v090: None,
            stamp_micros: None,
        }
    }

    /// The metadata version as mdadm names it: "0.90", "1.0", "1.1" or "1.2".
    pub fn metadata_name(&self) -> &'static str {
        if self.v090.is_some() {
            "0.90"
        } else {
            self.template.version().name()
        }
    }

    /// Whether the array's superblocks are 0.90 records.
    pub fn is_090(&self) -> bool {
        self.v090.is_some()
    }

    /// The array-wide superblock (the freshest one, kept up to date).
    pub fn template(&self) -> &Superblock {
        &self.template
    }

    /// The superblock of the member in `role`, if there is one.
    pub fn member_sb(&self, role: MemberIdx) -> Option<&Superblock> {
        self.members.get(role).and_then(|m| m.as_ref())
    }

    /// The events count.
    pub fn events(&self) -> u64 {
        self.template.events
    }

    /// Whether a resync is pending (the array was not stopped cleanly).
    pub fn needs_resync(&self) -> bool {
        self.needs_resync
    }

    /// Whether the superblocks say the array is dirty (resync_offset not at the end).
    pub fn is_dirty(&self) -> bool {
        self.template.resync_offset != MAX_SECTOR
    }

    /// md: resync_offset 0 while writes may be in flight; MaxSector when clean, unless a
    /// resync is still owed, which keeps the old position.
    pub fn set_dirty(&mut self, dirty: bool) {
        if dirty {
            self.template.resync_offset = 0;
        } else if !self.needs_resync {
            self.template.resync_offset = MAX_SECTOR;
        }
    }

    /// Everything written is durable (the caller flushed): clear the bitmap's idle bits
    /// (not while degraded: they are what a returning member is recovered from, nor while a
    /// resync is owed) and write the superblocks clean.
    pub(crate) fn mark_clean(&mut self, a: &dyn SbHost, degraded: bool) -> Result<(), ArrayError> {
        let events = self.events() + 1;
        let needs_resync = self.needs_resync;
        if let Some(b) = self.bitmap.as_mut() {
            if !needs_resync {
                b.clear_idle(degraded, events);
            }
        }
        self.set_dirty(false);
        self.write_all(a)
    }

    pub(crate) fn set_resync_done(&mut self) {
        self.needs_resync = false;
    }

    /// The journal device failed: its role becomes faulty in dev_roles and its superblock
    /// is no longer written. Returns false if it was already done.
    pub(crate) fn mark_journal_faulty(&mut self) -> bool {
        let Some((_, sb)) = self.journal.take() else {
            return false;
        };
        let n = sb.dev_number as usize;
        if n < self.template.dev_roles.len() {
            self.template.dev_roles[n] = ROLE_FAULTY;
        }
        true
    }

    /// `role`'s device lost its role to `dev`ice `old`: keep it as a faulty device (see
    /// `faulty`), with the device number its superblock had.
    pub(crate) fn keep_faulty(&mut self, role: MemberIdx, old: Arc<dyn Member>) {
        let number = self
            .members
            .get(role)
            .and_then(|m| m.as_ref())
            .map_or(u32::MAX, |sb| sb.dev_number);
        self.faulty.push((old, number));
    }

    pub(crate) fn mark_faulty(&mut self, role: MemberIdx) {
        if let Some(sb) = self.members.get(role).and_then(|m| m.as_ref()) {
            let n = sb.dev_number as usize;
            if n < self.template.dev_roles.len() {
                self.template.dev_roles[n] = ROLE_FAULTY;
            }
        }
    }

    /// Write only the bitmap (bits and superblock, same events) on every member holding
    /// data, and flush: a write must not reach the members before its bits do.
    pub(crate) fn write_bitmap(&mut self, a: &dyn SbHost) -> Result<(), ArrayError> {
        let Some(bm) = self.bitmap.as_ref() else {
            return Ok(());
        };
        if self.read_only {
            return Ok(());
        }
        let events = self.template.events;
        let mut written = 0;
        let mut last_err = None;
        for (role, own) in self.members.iter() {
            let Some(own) = own else { continue };
            let slot = a.slot(role);
            if !matches!(slot.state(), SlotState::InSync | SlotState::Recovering) {
                continue;
            }
            let Some(dev) = slot.device() else { continue };
            let r = bm
                .write(dev.as_ref(), own, events)
                .and_then(|()| dev.flush().map_err(Into::into));
            match r {
                Ok(()) => written += 1,
                Err(e) => {
                    tracing::error!("{}: bitmap write failed: {e}", dev.name());
                    last_err = Some(e);
                }
            }
        }
        // A replacement keeps its own bitmap, as any member (best effort: it is not yet
        // what the array depends on).
        for (role, own) in self.replacements.iter() {
            let (Some(own), Some(r)) = (own, a.slot(role).replacement()) else {
                continue;
            };
            if !r.failed() {
                if let Err(e) = bm.write(r.new.as_ref(), own, events) {
                    tracing::warn!("{}: bitmap write failed: {e}", r.new_name());
                }
            }
        }
        if let Some(bm) = self.bitmap.as_mut() {
            bm.written(events);
        }
        match (written, last_err) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Bump events and write the superblock of every member that holds data (in sync or
    /// recovering) and of every spare, then flush them.
    pub(crate) fn write_all(&mut self, a: &dyn SbHost) -> Result<(), ArrayError> {
        // --readonly: md does not write superblocks of a read-only array either (a failed
        // member is then recorded by the next read-write assembly).
        if self.read_only {
            return Ok(());
        }
        self.template.events += 1;
        self.template.utime = a.now_secs() & ((1 << 40) - 1)
            | self.stamp_micros.take().map_or(0, |m| u64::from(m) << 40);
        let dirty = self.template.resync_offset != MAX_SECTOR;
        let mut targets: Vec<(Arc<dyn Member>, Superblock, Option<MemberIdx>)> = Vec::new();
        // Bad block logs to write before their superblocks: (device, byte offset, bytes).
        let mut logs: Vec<(Arc<dyn Member>, u64, Vec<u8>)> = Vec::new();
        for (role, own) in self.members.iter_mut() {
            let Some(own) = own else { continue };
            let slot = a.slot(role);
            let dev = match slot.state() {
                SlotState::InSync => {
                    own.feature_map &= !FEATURE_RECOVERY_OFFSET;
                    slot.device()
                }
                SlotState::Recovering => {
                    own.feature_map |= FEATURE_RECOVERY_OFFSET;
                    own.recovery_offset = a.recovery_offset_sectors(slot.recovery_cursor());
                    slot.device()
                }
                _ => None,
            };
            if let Some(dev) = dev {
                // The slot holds the member's flags at run time (`uraid set` changes them).
                own.devflags = slot.member_flags().devflags();
                // md's bad block log: the feature bit says it holds entries.
                let bb = slot.bad_blocks();
                if bb.is_empty() {
                    own.feature_map &= !FEATURE_BAD_BLOCKS;
                } else if let Some(bytes) = bb.encode(own.bblog_shift, own.bblog_size) {
                    let at = (own.super_offset as i64 + i64::from(own.bblog_offset)) as u64 * 512;
                    logs.push((dev.clone(), at, bytes));
                    own.feature_map |= FEATURE_BAD_BLOCKS;
                }
                let mut sb = self.template.clone();
                sb.dev_number = own.dev_number;
                targets.push((dev, Meta::merge_into(sb, own), Some(role)));
            }
        }
        // Members being rebuilt first: a power cut part-way leaves the others one event
        // behind it (their data flushed), never it behind them with a recovery_offset that
        // claims less than the newest superblocks' reshape position says it holds.
        targets.sort_by_key(|(_, sb, _)| sb.feature_map & FEATURE_RECOVERY_OFFSET == 0);
        if let Some((dev, own)) = &self.journal {
            let mut sb = self.template.clone();
            sb.dev_number = own.dev_number;
            targets.push((dev.clone(), Meta::merge_into(sb, own), None));
        }
        for (dev, own) in &self.spares {
            let mut sb = self.template.clone();
            sb.dev_number = own.dev_number;
            targets.push((dev.clone(), Meta::merge_into(sb, own), None));
        }
        // Replacements: md's MD_FEATURE_REPLACEMENT, the same role as the member they
        // replace, and recovery_offset in member sectors. What the copy wrote is flushed
        // first, so recovery_offset never claims data the device could still lose.
        let mut repl: Vec<(Arc<crate::replacing::Replacing>, Superblock, MemberIdx)> = Vec::new();
        for (role, own) in self.replacements.iter_mut() {
            let (Some(own), Some(r)) = (own.as_mut(), a.slot(role).replacement()) else {
                continue;
            };
            if r.failed() {
                continue;
            }
            own.feature_map |= FEATURE_REPLACEMENT | FEATURE_RECOVERY_OFFSET;
            own.recovery_offset = r.cursor_sectors();
            let mut sb = self.template.clone();
            sb.dev_number = own.dev_number;
            repl.push((r, Meta::merge_into(sb, own), role));
        }
        // 0.90: the device table lists the devices present and records those being rebuilt
        // as spares (it has no recovery_offset).
        let cx090 = self.v090.as_ref().map(|base| {
            let mut cx = base.clone();
            cx.present = targets
                .iter()
                .map(|(_, sb, _)| sb.dev_number)
                .chain(repl.iter().map(|(_, sb, _)| sb.dev_number))
                .chain(self.faulty.iter().map(|&(_, n)| n))
                .chain(self.members.iter().filter_map(|(role, own)| {
                    let slot = a.slot(role);
                    (slot.state() == SlotState::Faulty && slot.device().is_some())
                        .then_some(own.as_ref()?.dev_number)
                }))
                .collect();
            cx.rebuilding = targets
                .iter()
                .map(|(_, sb, _)| sb)
                .chain(repl.iter().map(|(_, sb, _)| sb))
                .filter(|sb| sb.feature_map & (FEATURE_RECOVERY_OFFSET | FEATURE_REPLACEMENT) != 0)
                .map(|sb| sb.dev_number)
                .collect();
            cx
        });
        let write_sb = |dev: &dyn Member, sb: &Superblock| match &cx090 {
            Some(cx) => write_superblock_090(dev, sb, cx),
            None => write_superblock(dev, sb),
        };
        let mut written = 0;
        let mut last_err = None;
        let mut failed_roles: Vec<MemberIdx> = Vec::new();
        for (dev, at, bytes) in &logs {
            let mut buf = crate::buf::AlignedBuf::new(bytes.len());
            buf.copy_from_slice(bytes);
            if let Err(e) = dev.write_at(&buf, *at) {
                tracing::error!("{}: bad block log write failed: {e}", dev.name());
            }
        }
        for (dev, merged, role) in targets {
            if let Some(bm) = self.bitmap.as_ref() {
                // The bitmap goes first and carries the same events: md takes a bitmap
                // whose events are behind the superblock's as stale.
                if let Err(e) = bm.write(dev.as_ref(), &merged, merged.events) {
                    tracing::error!("{}: bitmap write failed: {e}", dev.name());
                }
            }
            match write_sb(dev.as_ref(), &merged) {
                Ok(()) => {
                    if let Some(i) = role {
                        self.members[i] = Some(merged);
                    }
                    written += 1;
                }
                Err(e) => {
                    tracing::error!("{}: superblock write failed: {e}", dev.name());
                    if let Some(i) = role {
                        failed_roles.push(i);
                    }
                    last_err = Some(e);
                }
            }
        }
        for (r, merged, i) in repl {
            let wrote = r.new.flush().map_err(ArrayError::from).and_then(|()| {
                if let Some(bm) = self.bitmap.as_ref() {
                    bm.write(r.new.as_ref(), &merged, merged.events)?;
                }
                write_sb(r.new.as_ref(), &merged)
            });
            match wrote {
                Ok(()) => self.replacements[i] = Some(merged),
                // The copy notices and drops the replacement (the old member stays).
                Err(e) => r.fail_with(&std::io::Error::other(e.to_string())),
            }
        }
        // md fails a member whose superblock cannot be written: otherwise it would come
        // back at the next assembly with an old superblock and nobody would know why.
        // Pending before a slot turns faulty, as in Array::member_error: writes that skip
        // the member wait for the update below that records it.
        let change = (!failed_roles.is_empty()).then(|| a.begin_sb_change());
        let mut newly_failed = false;
        let mut failed_now = Vec::new();
        for i in failed_roles {
            let slot = a.slot(i);
            let prev = slot.state();
            if matches!(prev, SlotState::InSync | SlotState::Recovering)
                && slot.transition(prev, SlotState::Faulty)
            {
                self.mark_faulty(i);
                // A member being replaced: its replacement goes on as a recovery.
                a.promote_replacement(i, self);
                newly_failed = true;
                failed_now.push(i);
            }
        }
        if newly_failed {
            a.members_failed(&failed_now);
        }
        if newly_failed && written > 0 && self.write_depth < 4 {
            // Record those failures on the members that still take superblocks.
            self.write_depth += 1;
            let r = self.write_all(a);
            self.write_depth -= 1;
            return match &change {
                Some(c) if newly_failed => c.recorded(r),
                _ => r,
            };
        }
        let events = self.template.events;
        if let Some(bm) = self.bitmap.as_mut() {
            bm.written(events);
        }
        let _ = dirty;
        let r = match (written, last_err) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        };
        match &change {
            Some(c) if newly_failed => c.recorded(r),
            _ => r,
        }
    }

    pub(crate) fn merge_into(mut sb: Superblock, own: &Superblock) -> Superblock {
        // Per device: recovery_offset present, and whether it replaces the role's member.
        let own_bits = FEATURE_RECOVERY_OFFSET | FEATURE_REPLACEMENT | FEATURE_BAD_BLOCKS;
        sb.feature_map = (sb.feature_map & !own_bits) | (own.feature_map & own_bits);
        sb.device_uuid = own.device_uuid;
        sb.data_offset = own.data_offset;
        sb.data_size = own.data_size;
        sb.super_offset = own.super_offset;
        sb.recovery_offset = own.recovery_offset;
        sb.devflags = own.devflags;
        sb.bblog_shift = own.bblog_shift;
        sb.bblog_size = own.bblog_size;
        sb.bblog_offset = own.bblog_offset;
        sb.cnt_corrected_read = own.cnt_corrected_read;
        // md's new_data_offset is per device (a raid10 reshape may move each by its own).
        let moving = uraid_core::superblock::FEATURE_NEW_OFFSET;
        if sb.feature_map & own.feature_map & moving != 0 {
            sb.new_offset = own.new_offset;
        }
        sb
    }
}

/// Read and decode the superblock of a device, wherever its version puts it (1.0 at the
/// end, 1.1 at sector 0, 1.2 at sector 8, 0.90 in the last 64 KiB-aligned 64 KiB), as
/// mdadm does without `-e`. A 0.90 record comes back in the v1 model
/// ([`Superblock090::to_v1`]).
///
/// A superblock counts only where its own `super_offset` says it lives. Two valid ones
/// (a stale 1.0 at the end under a newer 1.2): mdadm takes the one created last (larger
/// `ctime`); with equal `ctime` there is no telling, so both are named and neither is used.
/// A 0.90 record is looked for only where no 1.x superblock is.
pub fn read_superblock(dev: &dyn Member) -> Result<Superblock, ArrayError> {
    read_member_superblock(dev).map(|(sb, _)| sb)
}

/// [`read_superblock`], with the 0.90 record when the superblock is one.
pub(crate) fn read_member_superblock(
    dev: &dyn Member,
) -> Result<(Superblock, Option<Superblock090>), ArrayError> {
    let (sb, computed, rec) = search_superblock(dev, true)?;
    if sb.sb_csum != computed {
        return Err(ArrayError::Superblock {
            member: dev.name(),
            source: uraid_core::superblock::SuperblockError::BadChecksum {
                stored: sb.sb_csum,
                computed,
            },
        });
    }
    Ok((sb, rec))
}

/// The member's superblock even when its checksum is wrong, with the checksum its bytes
/// have (for `examine`, which shows such a superblock as not trusted); never for assembly.
/// A superblock whose checksum holds is preferred to one whose checksum is wrong.
pub fn read_superblock_any_checksum(dev: &dyn Member) -> Result<(Superblock, u32), ArrayError> {
    search_superblock(dev, true).map(|(sb, c, _)| (sb, c))
}

/// [`read_superblock_any_checksum`], with the 0.90 record the superblock was read from
/// when it is one (the v1 model cannot say all of it: examine prints the record).
pub fn read_superblock_with_090(
    dev: &dyn Member,
) -> Result<(Superblock, u32, Option<Superblock090>), ArrayError> {
    search_superblock(dev, true)
}

/// The device's superblock if it has a valid one at a place its version puts it, else
/// None, without explaining why not: for a device that may well be blank (one being added),
/// which is then spared the search for a 1.0 superblock left behind by a grown device.
pub(crate) fn superblock_if_any(dev: &dyn Member) -> Option<Superblock> {
    search_superblock(dev, false)
        .ok()
        .filter(|(sb, computed, _)| sb.sb_csum == *computed)
        .map(|(sb, _, _)| sb)
}

/// The 0.90 record at its place on `dev` (the last 64 KiB-aligned 64 KiB), whatever its
/// checksum, with the checksum its bytes have; None when no 0.90 magic is there (or the
/// device is under 64 KiB). For `examine`, which prints 0.90 in mdadm's own 0.90 layout.
pub fn read_superblock090(dev: &dyn Member) -> Result<Option<(Superblock090, u32)>, ArrayError> {
    let Some(at) = sb090_offset_sectors(dev.size_bytes() / 512) else {
        return Ok(None);
    };
    let mut buf = crate::buf::AlignedBuf::new(uraid_core::superblock090::SB090_BYTES);
    dev.read_at(&mut buf, at * 512)?;
    match Superblock090::decode_any_checksum(&buf) {
        Ok(found) => Ok(Some(found)),
        // A 1.x magic or none: not a 0.90 record.
        Err(Sb090Error::BadMagic(_) | Sb090Error::BadVersion { .. }) => Ok(None),
        Err(e) => Err(ArrayError::Assemble(format!(
            "{} (0.90 superblock at sector {at}): {e}",
            dev.name()
        ))),
    }
}

/// Encode `sb` (a 0.90 member's, in the v1 model) as its 0.90 record and write it at its
/// place, then flush. Refuses, before writing, what 0.90 cannot record.
pub(crate) fn write_superblock_090(
    dev: &dyn Member,
    sb: &Superblock,
    cx: &Sb090Context,
) -> Result<(), ArrayError> {
    let at = sb090_offset_sectors(dev.size_bytes() / 512);
    if at != Some(sb.super_offset) {
        return Err(ArrayError::Failed(format!(
            "{}: a 0.90 superblock belongs at sector {at:?}, not {}",
            dev.name(),
            sb.super_offset
        )));
    }
    let rec = Superblock090::from_v1(sb, cx)
        .map_err(|e| ArrayError::Failed(format!("{}: cannot write as 0.90: {e}", dev.name())))?;
    let bytes = rec.encode();
    let mut buf = crate::buf::AlignedBuf::new(bytes.len());
    buf.copy_from_slice(&bytes);
    dev.write_at(&buf, sb.super_offset * 512)?;
    dev.flush()?;
    Ok(())
}

/// The three-place search behind [`read_superblock_any_checksum`]; `explain_missing` looks
/// further, for the reason no superblock was found (a grown 1.0 device).
fn search_superblock(
    dev: &dyn Member,
    explain_missing: bool,
) -> Result<(Superblock, u32, Option<Superblock090>), ArrayError> {
    let device_sectors = dev.size_bytes() / 512;
    let mut found: Vec<(MetadataVersion, Superblock)> = Vec::new();
    // A superblock in its place whose checksum is wrong: examine prints it, nothing uses it.
    let mut untrusted: Option<(Superblock, u32)> = None;
    // The most telling failure, for when nothing is found: a damaged superblock beats
    // a misplaced one, which beats no magic at all.
    let mut damaged: Option<(MetadataVersion, u64, SuperblockError)> = None;
    let mut misplaced: Option<(MetadataVersion, u64, u64)> = None;
    let mut read_error: Option<std::io::Error> = None;
    for v in MetadataVersion::ALL {
        let Some(at) = v.super_offset_sectors(device_sectors) else {
            continue;
        };
        let mut buf = crate::buf::AlignedBuf::new(SB_IO_BYTES);
        // A read error at one place says nothing about the others (a bad sector at the end
        // of a 1.2 member): it is reported only if no superblock is found anywhere.
        if let Err(e) = dev.read_at(&mut buf, at * 512) {
            read_error = read_error.or(Some(e));
            continue;
        }
        match Superblock::decode_any_checksum(&buf) {
            Ok((sb, computed)) if sb.super_offset == at && sb.sb_csum == computed => {
                found.push((v, sb))
            }
            Ok((sb, computed)) if sb.super_offset == at => {
                untrusted = untrusted.or(Some((sb, computed)))
            }
            // md rejects a superblock that does not say where it is: a copy found elsewhere.
            Ok((sb, _)) => misplaced = misplaced.or(Some((v, at, sb.super_offset))),
            Err(SuperblockError::BadMagic { .. }) => {}
            Err(e) => damaged = damaged.or(Some((v, at, e))),
        }
    }
    let chosen = match found.len() {
        0 => None,
        1 => Some(found.pop().expect("one")),
        _ => {
            found.sort_by_key(|(_, sb)| std::cmp::Reverse(sb.ctime_secs()));
            let (v0, a) = &found[0];
            let (v1, b) = &found[1];
            if a.ctime_secs() == b.ctime_secs() {
                return Err(ArrayError::Assemble(format!(
                    "{}: two md superblocks created at the same time: a {v0} one (array {}, sector {}) \
                     and a {v1} one (array {}, sector {}); uraid cannot tell which is current: \
                     erase the stale one (mdadm --zero-superblock --metadata={v1} or ={v0}) first",
                    dev.name(),
                    uuid_string(&a.set_uuid),
                    a.super_offset,
                    uuid_string(&b.set_uuid),
                    b.super_offset
                )));
            }
            tracing::warn!(
                "{}: using the {v0} superblock (array {}, created later); an older {v1} one \
                 (array {}) is also on the device",
                dev.name(),
                uuid_string(&a.set_uuid),
                uuid_string(&b.set_uuid)
            );
            Some(found.swap_remove(0))
        }
    };
    if let Some((v, sb)) = chosen {
        return newer_than_090(dev, device_sectors, v, sb);
    }
    if let Some((sb, c)) = untrusted {
        return Ok((sb, c, None));
    }
    // No 1.x superblock: a 0.90 record, in the v1 model.
    let v090 = read_superblock090(dev).and_then(|found| {
        found
            .map(|(rec, computed)| {
                let sb = rec.to_v1(device_sectors).map_err(|e| {
                    ArrayError::Assemble(format!("{}: 0.90 superblock: {e}", dev.name()))
                })?;
                Ok((sb, computed, Some(rec)))
            })
            .transpose()
    });
    match v090 {
        Ok(Some(found)) => return Ok(found),
        Ok(None) => {}
        // A 1.x superblock's damage or a read error elsewhere says more (as before 0.90).
        Err(e) if damaged.is_none() && read_error.is_none() => return Err(e),
        Err(_) => {}
    }
    if let Some((v, at, source)) = damaged {
        return Err(ArrayError::Superblock {
            member: format!("{} ({v} superblock at sector {at})", dev.name()),
            source,
        });
    }
    if let Some(e) = read_error {
        return Err(e.into());
    }
    if let Some(grown) = explain_missing
        .then(|| grown_v10(dev, device_sectors))
        .flatten()
    {
        return Err(ArrayError::Assemble(grown));
    }
    if let Some((v, at, says)) = misplaced {
        return Err(ArrayError::Assemble(format!(
            "{}: superblock found at sector {at} (where {v} keeps it) says it lives at sector \
             {says}: a copy, not this device's superblock",
            dev.name()
        )));
    }
    if device_sectors < SB_V12_OFFSET_SECTORS + SB_IO_BYTES as u64 / 512 {
        return Err(ArrayError::Assemble(format!(
            "{}: device of {} bytes is too small to hold an md superblock",
            dev.name(),
            dev.size_bytes()
        )));
    }
    Err(ArrayError::Assemble(format!(
        "{}: no md superblock: its magic a92b4efc is not at sector 0 (metadata 1.1), 8 (1.2), \
         {} (1.0) or {} (0.90)",
        dev.name(),
        MetadataVersion::V1_0
            .super_offset_sectors(device_sectors)
            .unwrap_or(0),
        sb090_offset_sectors(device_sectors).unwrap_or(0)
    )))
}

/// A 1.x superblock `sb` found on `dev`, unless a valid 0.90 record at its own place is
/// newer (mdadm's guess_super takes the superblock created last, of any version): a stale
/// 0.90 record left under a 1.x array is named in a warning and ignored, a newer one is
/// taken, and one created at the same second is refused, naming both.
fn newer_than_090(
    dev: &dyn Member,
    device_sectors: u64,
    v: MetadataVersion,
    sb: Superblock,
) -> Result<(Superblock, u32, Option<Superblock090>), ArrayError> {
    let old = match read_superblock090(dev) {
        Ok(Some((rec, computed))) if rec.sb_csum == computed => rec
            .to_v1(device_sectors)
            .ok()
            .map(|sb0| (rec, computed, sb0)),
        _ => None,
    };
    let csum = sb.sb_csum;
    let Some((rec, computed, sb0)) = old else {
        return Ok((sb, csum, None));
    };
    let at = sb0.super_offset;
    match sb0.ctime_secs().cmp(&sb.ctime_secs()) {
        std::cmp::Ordering::Less => {
            tracing::warn!(
                "{}: using the {v} superblock (array {}, created later); an older 0.90 one \
                 (array {}, sector {at}) is also on the device",
                dev.name(),
                uuid_string(&sb.set_uuid),
                rec.uuid_string()
            );
            Ok((sb, csum, None))
        }
        std::cmp::Ordering::Greater => {
            tracing::warn!(
                "{}: using the 0.90 superblock (array {}, created later); an older {v} one \
                 (array {}, sector {}) is also on the device",
                dev.name(),
                rec.uuid_string(),
                uuid_string(&sb.set_uuid),
                sb.super_offset
            );
            Ok((sb0, computed, Some(rec)))
        }
        std::cmp::Ordering::Equal => Err(ArrayError::Assemble(format!(
            "{}: two md superblocks created at the same time: a {v} one (array {}, sector {}) \
             and a 0.90 one (array {}, sector {at}); uraid cannot tell which is current: \
             erase the stale one (mdadm --zero-superblock --metadata=0.90 or ={v}) first",
            dev.name(),
            uuid_string(&sb.set_uuid),
            sb.super_offset,
            rec.uuid_string()
        ))),
    }
}

/// How far back from the end a 1.0 superblock of a device that has grown is looked for.
const GROWN_SCAN_BYTES: u64 = 64 << 20;

/// A 1.0 superblock no longer at the end of its device (the device has grown since): it is
/// looked for, in 4 KiB steps, in the last [`GROWN_SCAN_BYTES`], and described.
/// Best effort: a read error ends the search.
fn grown_v10(dev: &dyn Member, device_sectors: u64) -> Option<String> {
    let step = 1u64 << 20;
    let end = device_sectors * 512;
    let low = end.saturating_sub(GROWN_SCAN_BYTES);
    let mut hi = end / 4096 * 4096;
    let mut buf = crate::buf::AlignedBuf::new(step as usize);
    while hi > low {
        let lo = hi.saturating_sub(step).max(low) / 4096 * 4096;
        let len = (hi - lo) as usize;
        dev.read_at(&mut buf[..len], lo).ok()?;
        for block in (0..len).step_by(4096).rev() {
            let at = (lo + block as u64) / 512;
            let Ok(sb) = Superblock::decode(&buf[block..(block + 4096).min(len)]) else {
                continue;
            };
            if sb.super_offset == at && sb.version() == MetadataVersion::V1_0 {
                let was = at + 16;
                return Some(format!(
                    "{}: a metadata 1.0 superblock (array {} {}) is at sector {at}, but the \
                     device has grown to {device_sectors} sectors and md looks for it at the end \
                     (sector {}): it is no longer at the end. Shrink the device back to its old size \
                     (at least {was} sectors, {} KiB) so that md and uraid find it; once the \
                     array is assembled, mdadm --grow --size=max moves it to the new end",
                    dev.name(),
                    sb.set_name,
                    uuid_string(&sb.set_uuid),
                    MetadataVersion::V1_0
                        .super_offset_sectors(device_sectors)
                        .unwrap_or(0),
                    was / 2
                ));
            }
        }
        hi = lo;
    }
    None
}

/// Encode and write a superblock, then flush the device.
pub fn write_superblock(dev: &dyn Member, sb: &Superblock) -> Result<(), ArrayError> {
    let bytes = sb.encode();
    let mut buf = crate::buf::AlignedBuf::new(bytes.len());
    buf.copy_from_slice(&bytes);
    dev.write_at(&buf, sb.super_offset * 512)?;
    dev.flush()?;
    Ok(())
}
