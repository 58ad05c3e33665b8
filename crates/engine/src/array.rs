//! An assembled array: the members by role, the layout, and the superblock state.
//!
//! IO entry points ([`Array::read`], [`Array::write`], ...) split requests at the layout's
//! boundaries and hand them to the level's module (`raid0`, `raid1`, `raid10`, `raid5`).
//! A member IO error is an event: the member is marked faulty, the superblocks of the others
//! record it, and the request is retried degraded; the caller sees EIO only when no
//! redundancy is left for the range.

use crate::buf::AlignedBuf;
use crate::counter::Counter;
use crate::error::ArrayError;
use crate::member::Member;
use crate::member_io::MemberHost;
use crate::meta::{Meta, SbChange, SbHost};
pub use crate::slot::{Slot, SlotState};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use uraid_core::geometry::{self, ArrayGeometry};
use uraid_core::{Level, MemberIdx, MemberMap, Sector, SECTOR_BYTES};

mod personality;
pub(crate) use personality::{Personality, SyncCtx, SyncMode, ZeroKind};

/// Counters, for `detail` and tests.
#[derive(Default)]
pub struct Stats {
    /// Requests from the array's users (reads, writes), for sync throttling.
    pub requests: Counter,
    /// Member reads issued.
    pub member_reads: Counter,
    /// Member writes issued.
    pub member_writes: Counter,
    /// Array reads served by reconstruction or from another copy (md's degraded reads).
    pub degraded_reads: AtomicU64,
    /// Read errors corrected by rewriting the block from redundancy (md's corrected_errors).
    pub corrected_reads: AtomicU64,
    /// Array bytes syncs found reading as zeros on every member that holds them (never
    /// written, or discarded) and so did not read, compare or rebuild: a recovery zeroed
    /// its targets there instead ([`crate::Member::is_hole`]).
    pub sync_zero_bytes: AtomicU64,
}

impl Stats {
    /// Add `other`'s counts to these (an array built again in a new shape carries on the
    /// counts of the one it replaces: no counter goes backwards).
    pub fn add_from(&self, other: &Stats) {
        let Stats {
            requests,
            member_reads,
            member_writes,
            degraded_reads,
            corrected_reads,
            sync_zero_bytes,
        } = other;
        for (mine, theirs) in [
            (&self.requests, requests),
            (&self.member_reads, member_reads),
            (&self.member_writes, member_writes),
        ] {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        for (mine, theirs) in [
            (&self.degraded_reads, degraded_reads),
            (&self.corrected_reads, corrected_reads),
            (&self.sync_zero_bytes, sync_zero_bytes),
        ] {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// md fails a member after this many corrected read errors (max_corr_read_errors).
pub const MAX_CORRECTED_READ_ERRORS: u32 = 20;

/// An assembled array (md's mddev): the members, their superblocks, events, bitmap and
/// state, and the level's personality. Made by [`create`](fn@crate::create) or
/// [`assemble`](fn@crate::assemble); shared between threads as `Arc<Array>`; every request method
/// takes `&self`.
pub struct Array {
    pub(crate) geometry: ArrayGeometry,
    /// The level's address map (uraid-core's geometry).
    pub(crate) personality: geometry::Personality,
    /// The level, with its own state (md's mddev->pers and its conf).
    pers: Box<dyn Personality>,
    pub(crate) slots: MemberMap<Slot>,
    pub(crate) meta: Mutex<Meta>,
    dirty: AtomicBool,
    pub(crate) writes_in_flight: crate::counter::Generations,
    /// Regions the array knows were never written ([`crate::written`]).
    pub(crate) written: crate::written::Written,
    /// Where a clean stop saves `written` ([`Array::keep_written_in`]).
    pub(crate) written_dir: std::sync::OnceLock<std::path::PathBuf>,
    last_write_ms: AtomicU64,
    /// A member failure could not be written to any superblock.
    metadata_failed: AtomicBool,
    /// Member changes whose superblock update is not durable yet (md's
    /// MD_SB_CHANGE_PENDING); writes wait for them before they complete.
    sb_pending: crate::meta::SbPending,
    /// Sub-sector writes (read-modify-write of whole sectors) serialise here; rare.
    unaligned: Mutex<()>,
    array_bytes: u64,
    /// md's in-memory `array_size` set by `--array-size` (bytes; `u64::MAX`: none): the
    /// size exported and the end of what requests reach, below the array's own.
    size_limit: AtomicU64,
    /// Request and member IO counters.
    pub stats: Stats,
    pub(crate) events: crate::events::EventBus,
    /// Serialises member changes (add, remove, spare activation, recovery completion).
    pub(crate) reconfig: Mutex<()>,
    has_bitmap: bool,
    /// The array's one clock (see [`crate::clock`]), given at create or assemble.
    clock: crate::clock::Clock,
    /// Wall seconds from [`Array::set_clock`], read instead of the clock's.
    wall_override: std::sync::RwLock<Option<WallSecs>>,
    /// md's MD_RECOVERY_INTR: a running sync stops at its next step (set by the
    /// daemons' stop, see [`crate::daemon`]).
    pub(crate) sync_intr: AtomicBool,
    /// Request references, for [`Array::quiesce`].
    pub(crate) quiesce: crate::quiesce::Quiesce,
    /// The shape requests read, under a sequence counter (see [`crate::shape`]).
    shape: crate::shape::ShapeLock,
    /// Opened with --readonly: writes, repairs and rebuilds are refused (EROFS).
    read_only: AtomicBool,
    /// Why it is read-only when the user did not ask for it (a reshape in progress).
    read_only_reason: std::sync::OnceLock<String>,
    /// Replaced by a new shape ([`crate::ArrayCell::replace`]): requests get
    /// [`ArrayError::Replaced`] and run again on the new array.
    pub(crate) retired: AtomicBool,
    /// Counts this array among the live ones: the last to go empties the buffer pool.
    _pool_user: crate::buf::PoolUser,
}

/// A source of wall seconds, for [`Array::set_clock`].
pub type WallSecs = Arc<dyn Fn() -> u64 + Send + Sync>;

impl Array {
    /// Put an array together from its geometry, its address map and personality (see
    /// `levels::new_array`), its role slots and its superblock state.
    pub(crate) fn new(
        geometry: ArrayGeometry,
        personality: geometry::Personality,
        pers: Box<dyn Personality>,
        slots: MemberMap<Slot>,
        meta: Meta,
        clock: crate::clock::Clock,
    ) -> Result<Array, ArrayError> {
        assert_eq!(slots.len(), geometry.raid_disks, "one slot per role");
        let has_bitmap = meta.bitmap.is_some();
        let array_bytes = personality.array_sectors() * SECTOR_BYTES;
        let raid_disks = geometry.raid_disks;
        let shape = crate::shape::ShapeLock::new(crate::shape::Shape {
            level: geometry.level,
            raid_disks,
            chunk_sectors: geometry.chunk_sectors,
            layout: geometry.layout,
            array_sectors: personality.array_sectors(),
            epoch: 0,
        });
        let a = Array {
            geometry,
            personality,
            pers,
            slots,
            meta: Mutex::new(meta),
            dirty: AtomicBool::new(false),
            writes_in_flight: Default::default(),
            written: crate::written::Written::new(array_bytes / SECTOR_BYTES),
            written_dir: std::sync::OnceLock::new(),
            last_write_ms: AtomicU64::new(0),
            metadata_failed: AtomicBool::new(false),
            sb_pending: Default::default(),
            unaligned: Mutex::new(()),
            array_bytes,
            size_limit: AtomicU64::new(u64::MAX),
            stats: Stats::default(),
            events: crate::events::EventBus::default(),
            reconfig: Mutex::new(()),
            has_bitmap,
            clock,
            wall_override: std::sync::RwLock::new(None),
            sync_intr: AtomicBool::new(false),
            quiesce: Default::default(),
            shape,
            read_only: AtomicBool::new(false),
            read_only_reason: std::sync::OnceLock::new(),
            retired: AtomicBool::new(false),
            _pool_user: crate::buf::PoolUser::new(),
        };
        let missing = a.missing_roles();
        if !a.pers.survives(&missing) {
            return Err(ArrayError::Assemble(format!(
                "{} with {} of {} members present cannot run: members {} are missing and {} tolerates {}",
                a.geometry.level,
                a.geometry.raid_disks - missing.len(),
                a.geometry.raid_disks,
                missing.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", "),
                a.geometry.level,
                a.pers.max_degraded()
            )));
        }
        a.refresh_failfast();
        Ok(a)
    }

    /// mdadm's --readonly (assembly sets it): writes fail with [`ArrayError::ReadOnly`]
    /// (EROFS), read errors are not rewritten, resync/repair/recovery are refused.
    pub(crate) fn set_read_only(&self, on: bool) {
        self.read_only.store(on, Ordering::SeqCst);
    }

    /// Serve the array read-only for `reason` (not the user's --readonly): a reshape in
    /// progress that uraid reads but does not yet write.
    pub(crate) fn set_read_only_for(&self, reason: String) {
        let _ = self.read_only_reason.set(reason);
        self.set_read_only(true);
    }

    /// Why the array is read-only when uraid chose it (None for --readonly or read-write).
    pub fn read_only_reason(&self) -> Option<&str> {
        self.read_only_reason.get().map(|s| s.as_str())
    }

    /// The array size while a reshape runs (md's raid5_size of the smaller shape), which
    /// neither geometry alone gives.
    pub(crate) fn set_reshape_size(&mut self, sectors: u64) {
        self.array_bytes = sectors * SECTOR_BYTES;
        // Mid-reshape, members hold both layouts: the array claims to know nothing.
        self.written = crate::written::Written::new(0);
        let mut s = self.shape.read();
        s.array_sectors = sectors;
        self.shape.write(s);
    }

    /// Whether writes are refused (md's read-only or read-auto state).
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::SeqCst)
    }

    /// `Err(ReadOnly)` when opened with --readonly; `what` names the refused operation.
    pub(crate) fn check_writable(&self, what: &str) -> Result<(), ArrayError> {
        if self.is_read_only() {
            if let Some(why) = self.read_only_reason() {
                return Err(ArrayError::ReadOnly(format!("{what} refused: {why}")));
            }
            return Err(ArrayError::ReadOnly(format!(
                "{what} refused: the array was opened with --readonly, nothing is written to its members"
            )));
        }
        Ok(())
    }

    /// Read wall seconds from `wall_secs` instead of the array's clock (read-error decay,
    /// superblock utime). Kept for tests written before the clock became an option; new
    /// code gives a [`crate::clock::ManualClock`] at create or assemble instead.
    pub fn set_clock(&self, wall_secs: WallSecs) {
        *self.wall_override.write().unwrap() = Some(wall_secs);
    }

    /// The clock the array was created or assembled with.
    pub fn clock(&self) -> &crate::clock::Clock {
        &self.clock
    }

    /// Wall seconds, as the array's clock tells them.
    pub(crate) fn now_secs(&self) -> u64 {
        match &*self.wall_override.read().unwrap() {
            Some(f) => f(),
            None => self.clock.wall_secs(),
        }
    }

    /// Monotonic milliseconds of the array's clock.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn parity_geometry(&self) -> Option<&uraid_core::geometry::ParityGeometry> {
        self.pers.parity()
    }

    /// The RAID level.
    pub fn level(&self) -> Level {
        self.geometry.level
    }

    /// The array's geometry: level, members, chunk, layout and sizes.
    pub fn geometry(&self) -> &ArrayGeometry {
        &self.geometry
    }

    /// The level-specific address mapping.
    pub fn personality(&self) -> &geometry::Personality {
        &self.personality
    }

    /// The shape as requests see it (level, disks, chunk, layout, size, personality epoch):
    /// read without a lock under a sequence counter, retried if a change raced it.
    pub fn shape(&self) -> crate::shape::Shape {
        self.shape.read()
    }

    /// Change the shape (reshape will; tests do now). The array is quiesced meanwhile, so
    /// no request runs across the change; one that reads the shape during it retries.
    #[doc(hidden)]
    pub fn set_shape(&self, s: crate::shape::Shape) {
        let _quiet = self.quiesce();
        self.written.mark_all();
        self.shape.write(s);
    }

    /// Usable size of the array in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.array_bytes
    }

    /// The size the array is exported at: its own, or the smaller one `--array-size` set
    /// (md's in-memory `array_size`, which mdadm asks for before a shrink).
    pub fn exported_bytes(&self) -> u64 {
        self.size_bytes()
            .min(self.size_limit.load(Ordering::Relaxed))
    }

    /// The size `--array-size` set, if it did.
    pub fn array_size_limit(&self) -> Option<u64> {
        let l = self.size_limit.load(Ordering::Relaxed);
        (l != u64::MAX).then_some(l)
    }

    /// md's `array_size` (`mdadm --grow --array-size`): export `bytes` of the array (whole
    /// sectors, more than 0, at most its size), or again all of it (`None`, md's `max`).
    /// Nothing is written: it lasts while the array is served, as md's does while the array
    /// runs. Requests past it are refused from now on.
    pub fn set_array_size_limit(&self, bytes: Option<u64>) -> Result<(), ArrayError> {
        let size = self.size_bytes();
        if let Some(b) = bytes {
            if b == 0 || !b.is_multiple_of(SECTOR_BYTES) || b > size {
                return Err(ArrayError::Refused(format!(
                    "--array-size {}K: the array holds {}K, and the size it is exported at \
                     must be more than 0 and at most that, in whole sectors (md: E2BIG past \
                     the array's size); nothing was changed",
                    b / 1024,
                    size / 1024
                )));
            }
        }
        let _quiet = self.quiesce();
        self.size_limit
            .store(bytes.unwrap_or(u64::MAX), Ordering::SeqCst);
        Ok(())
    }

    /// Number of member roles (md's raid_disks).
    pub fn raid_disks(&self) -> usize {
        self.slots.len()
    }

    /// The member slot of a role: device, state, recovery cursor, bad blocks.
    pub fn slot(&self, role: MemberIdx) -> &Slot {
        &self.slots[role]
    }

    /// The state of a role's member.
    pub fn slot_state(&self, role: MemberIdx) -> SlotState {
        self.slots[role].state()
    }

    /// The device of a role if it is fully in sync.
    pub(crate) fn live(&self, role: MemberIdx) -> Option<Arc<dyn Member>> {
        self.slots[role].in_sync()
    }

    /// The device of a role if it holds valid data for recovery unit `unit` (see
    /// [`Slot`]: a recovering member is valid below its cursor).
    pub(crate) fn usable(&self, role: MemberIdx, unit: u64) -> Option<Arc<dyn Member>> {
        self.slots[role].usable(unit)
    }

    /// Roles without a working device.
    pub fn missing_roles(&self) -> Vec<MemberIdx> {
        self.slots
            .roles()
            .filter(|&r| self.live(r).is_none())
            .collect()
    }

    /// Whether a role has no in-sync member.
    pub fn is_degraded(&self) -> bool {
        !self.missing_roles().is_empty()
    }

    /// Whether the array still holds all its data.
    pub fn is_running(&self) -> bool {
        self.pers.survives(&self.missing_roles())
    }

    /// The superblock state (locked while the guard lives): the template and each member's.
    pub fn meta(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().unwrap()
    }

    /// Write every member's superblock now with the array's current state (events, member
    /// states, recovery cursors), as md does on a metadata update; a sync in progress is
    /// then resumed from here after a crash.
    pub fn write_superblocks(&self) -> Result<(), ArrayError> {
        self.meta().write_all(self)
    }

    /// The run-time knobs by md's sysfs names, with their values.
    pub fn tunables(&self) -> Vec<(&'static str, String)> {
        self.pers.tunables(self)
    }

    /// Set a run-time knob by its md sysfs name (see [`Array::tunables`]).
    pub fn set_tunable(&self, name: &str, value: &str) -> Result<(), ArrayError> {
        self.pers.set_tunable(self, name, value)
    }

    /// Byte offset on a member of a member sector (relative to the data area).
    pub(crate) fn member_byte(&self, role: MemberIdx, member_sector: u64) -> u64 {
        self.slots[role].data_offset_bytes() + member_sector * SECTOR_BYTES
    }

    /// A member failed: mark it faulty and record that in the other members' superblocks
    /// before any request that saw the failure completes (md holds such completions until
    /// the metadata is durable). A spare, if there is one, takes the role.
    pub(crate) fn member_error(&self, role: MemberIdx, err: &io::Error) {
        self.fail_member_io(role, err, false);
    }

    /// md's failfast: an IO error on a member flagged failfast fails it at once, without
    /// the read-error repair, but only while the array keeps its data without it (md's
    /// raid1_error/raid10_error never fail the last copy). Returns whether it failed the
    /// member; if not, the caller handles the error as for any member.
    pub(crate) fn failfast_error(&self, role: MemberIdx, err: &io::Error) -> bool {
        self.slots[role].member_flags().failfast && self.fail_member_io(role, err, true)
    }

    /// Whether the array keeps its data with `role` failed too.
    pub(crate) fn survives_without(&self, role: MemberIdx) -> bool {
        let mut missing = self.missing_roles();
        if !missing.contains(&role) {
            missing.push(role);
        }
        self.pers.survives(&missing)
    }

    /// Tells each member whether it is failfast now ([`Member::set_failfast`]): only
    /// while the array keeps its data without it, as md sets failfast on a request only
    /// while other members hold the data. Called when redundancy changes: at start, after
    /// a member fails, when a recovery finishes.
    pub(crate) fn refresh_failfast(&self) {
        for role in self.slots.roles() {
            if let Some(dev) = self.slots[role].device() {
                dev.set_failfast(self.survives_without(role));
            }
        }
    }

    /// [`Array::member_error`]; with `keep_last`, only if the array survives without the
    /// member (decided under the superblock lock, so that two such failures at once cannot
    /// both pass). Returns whether this call failed the member.
    fn fail_member_io(&self, role: MemberIdx, err: &io::Error, keep_last: bool) -> bool {
        let slot = &self.slots[role];
        // Under the superblock lock, so that a spare cannot take the role between the
        // failure and its recording (the wrong device would be marked faulty).
        let mut meta = self.meta();
        if keep_last && !self.survives_without(role) {
            return false;
        }
        // Pending before the slot turns faulty: a write that sees it faulty and skips it
        // then waits until the superblocks say so (md's MD_SB_CHANGE_PENDING).
        let change = self.begin_sb_change();
        let prev = slot.state();
        if !matches!(prev, SlotState::InSync | SlotState::Recovering)
            || !slot.transition(prev, SlotState::Faulty)
        {
            return false;
        }
        let name = slot.device_name().unwrap_or_default();
        tracing::warn!("member {role} ({name}) failed: {err}; marking it faulty");
        meta.mark_faulty(role);
        // A member failing while being replaced: its replacement goes on as a recovery.
        let promoted = self.promote_replacement(role, &mut meta);
        // On failure nothing on disk says the member is stale: neither a write that saw
        // the failure nor any later one is acknowledged.
        let _ = change.recorded(meta.write_all(self));
        drop(change);
        drop(meta);
        self.refresh_failfast();
        self.events
            .emit(crate::events::Event::Fail { role, device: name });
        if promoted {
            self.events
                .emit(crate::events::Event::RebuildStarted { role: Some(role) });
        }
        if self.is_degraded() {
            self.events.emit(crate::events::Event::DegradedArray);
        }
        // Inside a request: no quiesce (it would wait for this very request). The slot it
        // fills is one no request uses: missing or faulty, and recovering from zero after.
        if let Err(e) = self.activate_spare_now() {
            tracing::error!("could not activate a spare: {e}");
        }
        true
    }

    /// A member read failed but redundancy answered: write the good data back. A member
    /// whose rewrite fails, or that keeps failing, is failed (md's max_corr_read_errors;
    /// the count halves for each hour without errors, as md's check_decay_read_errors).
    pub(crate) fn repair_read(&self, role: MemberIdx, member_sector: u64, good: &[u8]) {
        let slot = &self.slots[role];
        let Some(dev) = slot.device() else { return };
        if self.is_read_only() {
            // The caller got the good data; the member keeps its bad sectors for a
            // read-write assembly to fix.
            return;
        }
        let off = self.member_byte(role, member_sector);
        let sectors = (good.len() as u64).div_ceil(SECTOR_BYTES);
        match dev.write_at(good, off) {
            Ok(()) => {
                slot.clear_bad(off / SECTOR_BYTES, sectors);
                let n = slot.note_corrected_read(self.now_secs());
                self.stats.corrected_reads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    "member {role}: read error at sector {member_sector} corrected ({n} so far)"
                );
                if n > MAX_CORRECTED_READ_ERRORS {
                    self.member_error(role, &io::Error::other("too many read errors"));
                }
            }
            // md's rdev_set_badblocks: remember the sectors that cannot be rewritten rather
            // than fail the member, if the member has a bad block log with room.
            Err(e) => {
                if !self.record_bad_blocks(role, dev.as_ref(), off, good) {
                    self.member_error(role, &e);
                }
            }
        }
    }

    /// Mark a member faulty on request (`uraid fail`).
    pub fn fail_member(&self, role: MemberIdx) -> Result<(), ArrayError> {
        if !self.slots.contains(role) {
            return Err(ArrayError::Failed(format!("there is no member {role}")));
        }
        let state = self.slot_state(role);
        if !matches!(state, SlotState::InSync | SlotState::Recovering) {
            return Err(ArrayError::Failed(format!("member {role} is not active")));
        }
        if !self.survives_without(role) {
            return Err(ArrayError::Failed(format!(
                "failing member {role} would leave {} without its data",
                self.geometry.level
            )));
        }
        self.member_error(role, &io::Error::other("failed by request"));
        Ok(())
    }

    /// Requests are checked against the shape's size (which reshape may change).
    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        let size = (self.shape().array_sectors * SECTOR_BYTES)
            .min(self.size_limit.load(Ordering::Relaxed));
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(ArrayError::OutOfRange { offset, len, size }),
        }
    }

    pub(crate) fn ensure_dirty(&self) -> Result<(), ArrayError> {
        // SeqCst pairs with safemode(): either it sees this write in flight, or this write
        // sees the array clean and waits for the superblock lock.
        if self.dirty.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut meta = self.meta();
        if !self.dirty.load(Ordering::SeqCst) {
            // md marks the array active before the first write reaches a member, so an
            // unclean stop is always detected.
            meta.set_dirty(true);
            meta.write_all(self)?;
            self.dirty.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// md's safe mode: once no write has been in flight for `delay` (md: 200 ms), flush the
    /// members and mark the superblocks clean, so that a crash while idle needs no resync.
    /// Returns whether it marked the array clean. Call it periodically while serving.
    pub fn safemode(&self, delay: std::time::Duration) -> Result<bool, ArrayError> {
        if !self.dirty.load(Ordering::SeqCst) || self.writes_in_flight.any() {
            return Ok(false);
        }
        let idle_ms = self
            .now_ms()
            .saturating_sub(self.last_write_ms.load(Ordering::SeqCst));
        if u128::from(idle_ms) < delay.as_millis() {
            return Ok(false);
        }
        let mut meta = self.meta();
        self.dirty.store(false, Ordering::SeqCst);
        if self.writes_in_flight.any() {
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(false);
        }
        // Completed writes must be durable before the superblock says clean (md writes
        // superblocks with a preflush).
        for s in self.slots.values() {
            if let Some(d) = s.in_sync().or_else(|| s.usable(0)) {
                if let Err(e) = d.flush() {
                    tracing::warn!("{}: flush failed, staying dirty: {e}", d.name());
                    self.dirty.store(true, Ordering::SeqCst);
                    return Ok(false);
                }
            }
        }
        let degraded = self.is_degraded() || self.any_recovering();
        meta.mark_clean(self, degraded)?;
        Ok(true)
    }

    /// Read `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        // The reference first: the shape cannot change while a request holds one.
        let _active = self.enter()?;
        self.check_range(offset, buf.len() as u64)?;
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if buf.is_empty() {
            return Ok(());
        }
        if !offset.is_multiple_of(SECTOR_BYTES) || !(buf.len() as u64).is_multiple_of(SECTOR_BYTES)
        {
            let (start, mut tmp) = self.covering(offset, buf.len());
            self.read_sectors(start / SECTOR_BYTES, &mut tmp)?;
            let skip = (offset - start) as usize;
            buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
            return Ok(());
        }
        self.read_sectors(offset / SECTOR_BYTES, buf)
    }

    /// Write `buf` at `offset`.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), ArrayError> {
        let _active = self.enter()?;
        self.check_range(offset, buf.len() as u64)?;
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if buf.is_empty() {
            return Ok(());
        }
        self.check_writable("write")?;
        let _in_flight = InFlight::new(self);
        let (first, sectors) = sector_span(offset, buf.len() as u64);
        self.written.mark(first, sectors);
        self.check_metadata()?;
        self.ensure_dirty()?;
        if !offset.is_multiple_of(SECTOR_BYTES) || !(buf.len() as u64).is_multiple_of(SECTOR_BYTES)
        {
            // Sub-sector writes are read-modify-write of whole sectors; rare, so one lock.
            let _g = self.unaligned.lock().unwrap();
            let (start, mut tmp) = self.covering(offset, buf.len());
            self.read_sectors(start / SECTOR_BYTES, &mut tmp)?;
            let skip = (offset - start) as usize;
            tmp[skip..skip + buf.len()].copy_from_slice(buf);
            self.write_sectors(start / SECTOR_BYTES, &tmp)?;
            drop(_g);
            return self.complete_write();
        }
        self.write_sectors(offset / SECTOR_BYTES, buf)?;
        self.complete_write()
    }

    /// The last step before a write (or flush) is acknowledged: it may have skipped a
    /// member whose failure, removal or replacement is not yet in the superblocks, and
    /// after a power cut that member would be taken for in sync with its old data. So it
    /// waits for every pending superblock update (md holds such completions while
    /// MD_SB_CHANGE_PENDING is set), and fails if one could not be written anywhere.
    pub(crate) fn complete_write(&self) -> Result<(), ArrayError> {
        self.sb_pending.wait();
        self.check_metadata()
    }

    /// Writes that are waiting for a member change to reach the superblocks (tests).
    #[doc(hidden)]
    pub fn writes_waiting_for_superblocks(&self) -> u64 {
        self.sb_pending.waiters()
    }

    /// Start a member change that writes may depend on (a failure, a removal, a spare or
    /// replacement taking a role): call it before the slot changes, and hand the
    /// superblock update's result to [`SbChange::recorded`]. Writes that complete
    /// meanwhile wait until the guard drops.
    pub(crate) fn begin_sb_change(&self) -> SbChange<'_> {
        SbChange::new(&self.sb_pending, &self.metadata_failed)
    }

    /// Writes are acknowledged only while member failures can be recorded on disk.
    pub(crate) fn check_metadata(&self) -> Result<(), ArrayError> {
        if self.metadata_failed.load(Ordering::SeqCst) {
            return Err(ArrayError::Failed(
                "a member failure could not be recorded in any superblock; refusing writes".into(),
            ));
        }
        Ok(())
    }

    fn covering(&self, offset: u64, len: usize) -> (u64, AlignedBuf) {
        let (first, sectors) = sector_span(offset, len as u64);
        (
            first * SECTOR_BYTES,
            AlignedBuf::new((sectors * SECTOR_BYTES) as usize),
        )
    }

    fn read_sectors(&self, sector: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        self.pers.read(self, Sector(sector), buf)
    }

    /// Where the bitmap counts a write of array sectors [sector, sector+sectors) (the
    /// level's [`Personality::bitmap_range`]).
    pub(crate) fn bitmap_range(&self, sector: u64, sectors: u64) -> (u64, u64) {
        self.pers.bitmap_range(Sector(sector), sectors)
    }

    /// Whether array sectors [sector, sector+sectors) lie in regions the array knows were
    /// never written since they read zeros on every member ([`crate::written`]): a sync
    /// passes over them as over holes. Never with a journal, whose log may hold data
    /// for them.
    pub(crate) fn never_written(&self, sector: u64, sectors: u64) -> bool {
        !self.has_journal() && self.written.never_written(sector, sectors)
    }

    /// Whether the array knows `len` bytes at `offset` were never written (tests).
    #[doc(hidden)]
    pub fn knows_never_written(&self, offset: u64, len: u64) -> bool {
        let (first, sectors) = sector_span(offset, len);
        self.never_written(first, sectors)
    }

    /// Bytes of the array in regions it knows were never written (`uraid detail`, tests).
    pub fn never_written_bytes(&self) -> u64 {
        self.written.never_written_sectors() * SECTOR_BYTES
    }

    /// The level (md's mddev->pers), for the modules that drive it.
    pub(crate) fn pers(&self) -> &dyn Personality {
        self.pers.as_ref()
    }

    /// The level, to change before the array is shared (attaching a journal).
    pub(crate) fn pers_mut(&mut self) -> &mut dyn Personality {
        self.pers.as_mut()
    }

    /// Whether the array has a write-intent bitmap.
    pub fn has_bitmap(&self) -> bool {
        self.has_bitmap
    }

    /// The write-intent bitmap's chunk in sectors of bitmap positions, if there is one.
    pub(crate) fn bitmap_chunk_sectors(&self) -> Option<u64> {
        self.meta().bitmap.as_ref().map(|b| b.chunk_sectors())
    }

    /// Whether the bitmap says [start, start+sectors) (bitmap positions) saw no write that
    /// could be unsynced. Without a bitmap nothing is known to be clean.
    pub(crate) fn bitmap_clean(&self, start: u64, sectors: u64) -> bool {
        let meta = self.meta();
        meta.bitmap
            .as_ref()
            .is_some_and(|b| !b.is_dirty(start, sectors))
    }

    /// One pass of md's bitmap daemon: flush the members, then clear the bits of chunks
    /// that stayed idle since the previous pass and write the bitmap. Call it every
    /// `daemon_sleep` seconds while the array runs.
    pub fn bitmap_daemon(&self) -> Result<(), ArrayError> {
        if !self.has_bitmap {
            return Ok(());
        }
        self.flush()?;
        let degraded = self.is_degraded() || self.any_recovering();
        let mut meta = self.meta();
        let events = meta.events();
        // Bits a resync still owes (loaded after an unclean stop, or set while it runs)
        // stay until it has passed them, as md keeps its NEEDED bits: cleared as idle, the
        // resync would skip chunks that may differ between members.
        let keep = degraded || meta.needs_resync();
        let changed = meta
            .bitmap
            .as_mut()
            .is_some_and(|b| b.daemon_pass(keep, events));
        if changed {
            meta.write_bitmap(self)?;
        }
        Ok(())
    }

    /// Seconds between bitmap daemon passes (md's daemon_sleep), if there is a bitmap.
    pub fn bitmap_daemon_sleep_secs(&self) -> Option<u32> {
        self.meta()
            .bitmap
            .as_ref()
            .map(|b| b.sb.daemon_sleep.max(1))
    }

    /// The bitmap's pages as /proc/mdstat counts them, if there is a bitmap.
    pub fn bitmap_pages(&self) -> Option<crate::bitmap::BitmapPages> {
        self.meta().bitmap.as_ref().map(|b| b.pages())
    }

    /// Dirty bitmap chunks and all chunks, if there is a bitmap.
    pub fn bitmap_dirty_chunks(&self) -> Option<(u64, u64)> {
        self.meta()
            .bitmap
            .as_ref()
            .map(|b| (b.dirty_chunks(), b.chunks()))
    }

    fn write_sectors(&self, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
        self.bitmap_write(sector, buf.len() as u64 / SECTOR_BYTES, || {
            self.write_mapped(sector, buf)
        })
    }

    /// Run `f`, a change of array sectors [sector, sector+sectors), counted in the bitmap:
    /// its bits are set and on disk before `f` runs (md's bitmap_startwrite), so that a
    /// crash meanwhile resyncs the range.
    pub(crate) fn bitmap_write<R>(
        &self,
        sector: u64,
        sectors: u64,
        f: impl FnOnce() -> Result<R, ArrayError>,
    ) -> Result<R, ArrayError> {
        if !self.has_bitmap {
            return f();
        }
        let (bstart, blen) = self.bitmap_range(sector, sectors);
        let prev = self.pers.bitmap_range_previous(Sector(sector), sectors);
        {
            let mut meta = self.meta();
            let newly = meta.bitmap.as_mut().is_some_and(|b| {
                let a = b.start_write(bstart, blen);
                let p = prev.is_some_and(|(s, n)| b.start_write(s, n));
                a || p
            });
            if newly {
                meta.write_bitmap(self)?;
            }
        }
        let r = f();
        if let Some(b) = self.meta().bitmap.as_mut() {
            b.end_write(bstart, blen);
            if let Some((s, n)) = prev {
                b.end_write(s, n);
            }
        }
        r
    }

    /// Whether the bitmap has a bit set that a write of array sectors [sector,
    /// sector+sectors) would set (in either geometry of a reshape).
    pub(crate) fn bitmap_dirty_for(
        &self,
        bitmap: &crate::bitmap::BitmapState,
        sector: u64,
        sectors: u64,
    ) -> bool {
        let (start, n) = self.bitmap_range(sector, sectors);
        bitmap.is_dirty(start, n)
            || self
                .pers
                .bitmap_range_previous(Sector(sector), sectors)
                .is_some_and(|(s, n)| bitmap.is_dirty(s, n))
    }

    fn write_mapped(&self, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
        self.pers.write(self, Sector(sector), buf)
    }

    /// Make every completed write durable: the journal first (write-back acknowledges a
    /// write once it is in the journal), then every live member.
    pub fn flush(&self) -> Result<(), ArrayError> {
        if self.retired.load(Ordering::SeqCst) {
            // Its writes were made durable when it was replaced; the new array has the rest.
            return Err(ArrayError::Replaced);
        }
        self.pers.flush(self)?;
        self.flush_members()?;
        // Writes this flush makes durable may have skipped a member whose failure is not
        // recorded yet; the flush answers for them only once it is.
        self.complete_write()
    }

    /// Flush every live member.
    pub(crate) fn flush_members(&self) -> Result<(), ArrayError> {
        let mut first_err = None;
        for (role, s) in self.slots.iter() {
            let dev = match s.state() {
                SlotState::InSync | SlotState::Recovering => s.device(),
                _ => None,
            };
            if let Some(d) = dev {
                if let Err(e) = d.flush() {
                    self.member_error(role, &e);
                    first_err.get_or_insert(e);
                }
            }
        }
        if !self.is_running() {
            return Err(ArrayError::Failed(format!(
                "flush failed: {}",
                first_err.map(|e| e.to_string()).unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// A request's reference (see [`crate::quiesce`]), or [`ArrayError::Replaced`] once
    /// the array was replaced by a new shape.
    pub(crate) fn enter(&self) -> Result<crate::quiesce::Active<'_>, ArrayError> {
        let active = self.quiesce.enter();
        if self.retired.load(Ordering::SeqCst) {
            return Err(ArrayError::Replaced);
        }
        Ok(active)
    }

    /// Every device of the array, to assemble it again: the members in role order, then
    /// the spares, then the journal.
    pub(crate) fn devices(&self) -> Vec<Arc<dyn Member>> {
        let mut devs: Vec<Arc<dyn Member>> = Vec::new();
        for (_, s) in self.slots.iter() {
            if matches!(s.state(), SlotState::InSync | SlotState::Recovering) {
                if let Some(d) = s.device() {
                    devs.push(d);
                }
            }
        }
        let meta = self.meta();
        devs.extend(meta.spares.iter().map(|(d, _)| d.clone()));
        if let Some((j, _)) = &meta.journal {
            devs.push(j.clone());
        }
        devs
    }

    /// Take over what the users of `old` see, when this array replaces it: its event
    /// subscribers, its counters and the run-time knobs this level has too.
    pub(crate) fn adopt(&self, old: &Array) {
        self.events.adopt(&old.events);
        // An --array-size lasts through a change of shape, as md's array_size does (a
        // limit past the new size is the new size).
        if let Some(l) = old.array_size_limit() {
            self.size_limit
                .store(l.min(self.size_bytes()), Ordering::SeqCst);
        }
        self.stats.add_from(&old.stats);
        let mine: Vec<&str> = self.tunables().into_iter().map(|(k, _)| k).collect();
        for (k, v) in old.tunables() {
            if mine.contains(&k) {
                if let Err(e) = self.set_tunable(k, &v) {
                    tracing::warn!("{k}={v} not kept in the new shape: {e}");
                }
            }
        }
        if let Some(w) = old
            .wall_override
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            *self
                .wall_override
                .write()
                .unwrap_or_else(|e| e.into_inner()) = Some(w);
        }
    }

    /// Hold new requests (and sync steps) and wait until none is inside; they resume when
    /// the guard drops (md's mddev_suspend). Used by stop and member changes; must not be
    /// called from inside a request (it panics rather than wait for itself).
    pub fn quiesce(&self) -> crate::quiesce::QuiesceGuard<'_> {
        self.quiesce.quiesce()
    }

    /// Flush and mark the array clean (md's clean shutdown): every superblock gets
    /// resync_offset = MaxSector unless a resync is still owed. Requests in flight finish
    /// first; requests that arrive meanwhile wait and then mark the array dirty again.
    pub fn stop(&self) -> Result<(), ArrayError> {
        let _quiet = self.quiesce();
        self.stop_quiesced()
    }

    /// [`Array::stop`] for a caller that holds the quiesce guard.
    pub(crate) fn stop_quiesced(&self) -> Result<(), ArrayError> {
        self.pers.stop(self)?;
        self.flush()?;
        let degraded = self.is_degraded() || self.any_recovering();
        let mut meta = self.meta();
        // Only what this assembly changed is written: an array that was dirty on disk and
        // still owes its resync stays exactly as it was (no events, no update time), so
        // that commands that only report (assemble, check, detail, read) write nothing.
        // One whose debt is paid (resync done, journal replayed) is marked clean.
        if self.dirty.load(Ordering::Acquire) || (meta.is_dirty() && !meta.needs_resync()) {
            meta.mark_clean(self, degraded)?;
            self.dirty.store(false, Ordering::Release);
        }
        drop(meta);
        // Not a reason to call the stop unclean: the next start then knows less.
        if let Err(e) = self.save_written() {
            tracing::warn!("could not save what the array knows was never written: {e}");
        }
        Ok(())
    }

    /// The quickest safe stop, for when a clean [`Array::stop`] cannot finish (a second
    /// SIGTERM): no quiesce and no waiting for the superblock lock, since a request or the
    /// clean stop itself may be what is stuck. Completed writes are made durable where the
    /// journal and members still answer; a member that cannot be flushed may have lost
    /// acknowledged writes, so it is marked faulty in the others' superblocks if the lock
    /// can be had, else reported as unrecorded. The superblocks are not marked clean: while
    /// writes may be in flight they already say active, and the next start resyncs.
    pub fn force_stop(&self) -> ForcedStop {
        let mut out = ForcedStop {
            dirty: self.dirty.load(Ordering::SeqCst),
            ..ForcedStop::default()
        };
        out.journal_error = self.pers.force_flush();
        let mut failed = Vec::new();
        for (role, s) in self.slots.iter() {
            if !matches!(s.state(), SlotState::InSync | SlotState::Recovering) {
                continue;
            }
            let Some(d) = s.device() else { continue };
            match d.flush() {
                Ok(()) => out.flushed.push(d.name()),
                Err(e) => {
                    tracing::error!("{}: flush failed during a forced stop: {e}", d.name());
                    failed.push((role, d.name()));
                }
            }
        }
        if failed.is_empty() {
            return out;
        }
        // The clean stop may hold the lock for a moment, or for ever on a hung device.
        let mut meta = None;
        for _ in 0..100 {
            if let Ok(m) = self.meta.try_lock() {
                meta = Some(m);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let Some(mut meta) = meta else {
            out.unrecorded = failed.into_iter().map(|(_, n)| n).collect();
            return out;
        };
        for (role, _) in &failed {
            let slot = &self.slots[*role];
            let prev = slot.state();
            if matches!(prev, SlotState::InSync | SlotState::Recovering)
                && slot.transition(prev, SlotState::Faulty)
            {
                meta.mark_faulty(*role);
            }
        }
        match meta.write_all(self) {
            Ok(()) => out.marked_faulty = failed.into_iter().map(|(_, n)| n).collect(),
            Err(e) => {
                tracing::error!("could not record the failed members: {e}");
                out.unrecorded = failed.into_iter().map(|(_, n)| n).collect();
            }
        }
        out
    }

    /// Whether a write has marked the array dirty since it was assembled or last stopped.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }
}

impl MemberHost for Array {
    fn slot(&self, role: MemberIdx) -> &Slot {
        &self.slots[role]
    }

    fn note_member_ios(&self, reads: u64, writes: u64) {
        if reads > 0 {
            self.stats.member_reads.fetch_add(reads, Ordering::Relaxed);
        }
        if writes > 0 {
            self.stats
                .member_writes
                .fetch_add(writes, Ordering::Relaxed);
        }
    }

    fn member_error(&self, role: MemberIdx, err: &io::Error) {
        Array::member_error(self, role, err)
    }
}

impl SbHost for Array {
    fn slot(&self, role: MemberIdx) -> &Slot {
        Array::slot(self, role)
    }

    fn recovery_offset_sectors(&self, cursor: u64) -> u64 {
        self.pers.recovery_offset_sectors(cursor)
    }

    fn begin_sb_change(&self) -> SbChange<'_> {
        Array::begin_sb_change(self)
    }

    fn promote_replacement(&self, role: MemberIdx, meta: &mut Meta) -> bool {
        Array::promote_replacement(self, role, meta)
    }

    fn now_secs(&self) -> u64 {
        Array::now_secs(self)
    }

    fn members_failed(&self, roles: &[MemberIdx]) {
        self.refresh_failfast();
        // Under the superblock lock: only events here (a channel send each); the daemons'
        // failure watcher gives a waiting spare the role once the lock is let go.
        for &role in roles {
            let name = self.slots[role].device_name().unwrap_or_default();
            tracing::warn!(
                "member {role} ({name}) failed: its superblock could not be written; \
                 marking it faulty"
            );
            self.events
                .emit(crate::events::Event::Fail { role, device: name });
        }
        if !roles.is_empty() && self.is_degraded() {
            self.events.emit(crate::events::Event::DegradedArray);
        }
    }
}

/// Member error handling, continued: md's bad block log.
impl Array {
    /// A rewrite of `good` at byte `off` failed: rewrite it sector by sector (md's
    /// narrow_write_error), record the sectors that still fail in the bad block log and
    /// write the log. False if the member has no log, it is full, or it could not be
    /// written.
    pub(crate) fn record_bad_blocks(
        &self,
        role: MemberIdx,
        dev: &dyn Member,
        off: u64,
        good: &[u8],
    ) -> bool {
        let slot = &self.slots[role];
        {
            let meta = self.meta();
            match meta.members[role].as_ref() {
                Some(sb) if sb.bblog_size != 0 && sb.bblog_offset != 0 => {}
                _ => return false,
            }
        }
        let sec = SECTOR_BYTES as usize;
        let mut failed = crate::badblocks::BadBlocks::default();
        let mut one = crate::buf::AlignedBuf::new(sec);
        for (k, piece) in good.chunks(sec).enumerate() {
            one[..piece.len()].copy_from_slice(piece);
            let at = off + (k * sec) as u64;
            if dev.write_at(&one[..piece.len()], at).is_err() {
                failed.add(at / SECTOR_BYTES, 1);
            } else {
                slot.clear_bad(at / SECTOR_BYTES, 1);
            }
        }
        let mut meta = self.meta();
        let Some(sb) = meta.members[role].as_ref() else {
            return false;
        };
        let mut trial = slot.bad_blocks();
        for (first, n) in failed.ranges() {
            trial.add(first, n);
        }
        if !trial.fits(sb.bblog_shift, sb.bblog_size) {
            tracing::warn!("member {role}: bad block log full");
            return false;
        }
        for (first, n) in failed.ranges() {
            slot.record_bad(first, n);
            tracing::warn!("member {role}: sectors {first}+{n} recorded as bad blocks");
        }
        if let Err(e) = meta.write_all(self) {
            tracing::error!("member {role}: could not write the bad block log: {e}");
            return false;
        }
        matches!(slot.state(), SlotState::InSync | SlotState::Recovering)
    }
}

/// What [`Array::force_stop`] managed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForcedStop {
    /// Members whose flush succeeded.
    pub flushed: Vec<String>,
    /// Members that could not be flushed and are now faulty in the superblocks.
    pub marked_faulty: Vec<String>,
    /// Members that could not be flushed, whose failure could not be recorded either.
    pub unrecorded: Vec<String>,
    /// The journal's flush error, if it had one.
    pub journal_error: Option<String>,
    /// Writes had marked the array dirty: the next start resyncs.
    pub dirty: bool,
}

/// Counts a write in flight for safe mode; notes when the last one ended.
pub(crate) struct InFlight<'a>(&'a Array, crate::counter::Entered);

impl<'a> InFlight<'a> {
    pub(crate) fn new(a: &'a Array) -> InFlight<'a> {
        InFlight(a, a.writes_in_flight.enter())
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Written only when the millisecond moved on (not by every write: a line that
        // every CPU writes costs each write a cache miss), and never backwards.
        let now = self.0.now_ms();
        if now > self.0.last_write_ms.load(Ordering::SeqCst) {
            self.0.last_write_ms.fetch_max(now, Ordering::SeqCst);
        }
        self.0.writes_in_flight.leave(self.1);
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if self.dirty.load(Ordering::Acquire) || self.pers.has_cached_writes() {
            if let Err(e) = self.stop() {
                tracing::error!("could not stop the array cleanly: {e}");
            }
        }
    }
}

/// Error for a range that lost all its redundancy.
pub(crate) fn no_redundancy(a: &Array, what: &str) -> ArrayError {
    ArrayError::Failed(format!(
        "{what}: {} has lost members {} and cannot rebuild this range",
        a.geometry.level,
        a.missing_roles()
            .iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The whole sectors that `len` bytes at byte `offset` touch: (first, count).
fn sector_span(offset: u64, len: u64) -> (u64, u64) {
    let first = offset / SECTOR_BYTES;
    (first, (offset + len).div_ceil(SECTOR_BYTES) - first)
}
