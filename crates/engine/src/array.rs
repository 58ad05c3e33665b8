//! An assembled array: the members by role, the layout, and the superblock state.
//!
//! IO entry points ([`Array::read`], [`Array::write`], ...) split requests at the layout's
//! boundaries and hand them to the level's module (`raid0`, `raid1`, `raid10`, `raid5`).
//! A member IO error is an event: the member is marked faulty, the superblocks of the others
//! record it, and the request is retried degraded; the caller sees EIO only when no
//! redundancy is left for the range.

use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::io::{execute, Op, OpBuf};
use crate::member::Member;
use crate::meta::Meta;
pub use crate::slot::{Slot, SlotState};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use uraid_core::geometry::{ArrayGeometry, Personality};
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};

/// Number of lock buckets that serialise writes to the same stripe (parity levels) or
/// region (mirrors).
const LOCK_BUCKETS: usize = 1024;

/// Run-time knobs of the write path (md's sysfs tunables of the same names).
pub struct Tuning {
    /// Write runs of full stripes in one pass, with merged member IOs.
    pub batching: AtomicBool,
    /// md's rmw_level: 0 = never read-modify-write (always reconstruct-write), 1 = when it
    /// reads fewer blocks (md's default), 2 = also when it reads as many.
    pub rmw_level: std::sync::atomic::AtomicU8,
    /// Member bytes per batched sync pass (raid4/5/6): each pass reads every member once
    /// and writes once, overlapped with the next pass's reads.
    pub sync_batch_bytes: std::sync::atomic::AtomicUsize,
    /// md's skip_copy: write straight from the caller's buffer instead of copying the new
    /// data into the stripe's buffers first. On by default (md's default is off): a write
    /// borrows its buffer as `&[u8]`, which nobody can change during the call, and uraid's
    /// exports hand it buffers they own. Off is for callers that share the buffer with
    /// another process or the kernel: then a change during the write cannot make data and
    /// parity disagree.
    pub skip_copy: AtomicBool,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            batching: AtomicBool::new(true),
            rmw_level: std::sync::atomic::AtomicU8::new(1),
            sync_batch_bytes: std::sync::atomic::AtomicUsize::new(2 << 20),
            skip_copy: AtomicBool::new(true),
        }
    }
}

/// Counters, for `detail` and tests.
#[derive(Default)]
pub struct Stats {
    /// Requests from the array's users (reads, writes), for sync throttling.
    pub requests: AtomicU64,
    /// Member reads issued.
    pub member_reads: AtomicU64,
    /// Member writes issued.
    pub member_writes: AtomicU64,
    /// Array reads served by reconstruction or from another copy (md's degraded reads).
    pub degraded_reads: AtomicU64,
    /// Read errors corrected by rewriting the block from redundancy (md's corrected_errors).
    pub corrected_reads: AtomicU64,
}

/// md fails a member after this many corrected read errors (max_corr_read_errors).
pub const MAX_CORRECTED_READ_ERRORS: u32 = 20;

/// Member IOs that failed in one batch.
#[derive(Default, Debug)]
pub(crate) struct Failures {
    pub reads: Vec<MemberIdx>,
    /// Indices (in submission order) of the reads that failed.
    pub read_ops: Vec<usize>,
    /// Already failed (marked faulty) by the time the caller sees them.
    pub writes: Vec<MemberIdx>,
}

impl Failures {
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }
}

/// An assembled array (md's mddev): the members, their superblocks, events, bitmap and
/// state, and the level's personality. Made by [`create`](crate::create) or
/// [`assemble`](crate::assemble); shared between threads as `Arc<Array>`; every request method
/// takes `&self`.
pub struct Array {
    pub(crate) geometry: ArrayGeometry,
    pub(crate) personality: Personality,
    pub(crate) slots: Vec<Slot>,
    pub(crate) meta: Mutex<Meta>,
    dirty: AtomicBool,
    writes_in_flight: AtomicU64,
    last_write_ms: AtomicU64,
    /// A member failure could not be written to any superblock.
    metadata_failed: AtomicBool,
    /// Member changes whose superblock update is not durable yet (md's
    /// MD_SB_CHANGE_PENDING); writes wait for them before they complete.
    sb_pending: SbPending,
    locks: Vec<Mutex<()>>,
    unaligned: Mutex<()>,
    array_bytes: u64,
    /// Request and member IO counters.
    pub stats: Stats,
    /// Run-time knobs (md's sysfs tunables); set them through [`Array::set_tunable`].
    pub tuning: Tuning,
    pub(crate) events: crate::events::EventBus,
    /// Serialises member changes (add, remove, spare activation, recovery completion).
    pub(crate) reconfig: Mutex<()>,
    has_bitmap: bool,
    /// raid4/5/6 write journal (md's raid5-cache).
    pub(crate) journal: Option<crate::journal::Journal>,
    /// Wall clock in seconds, for read-error decay; tests inject their own.
    clock: std::sync::RwLock<Clock>,
    /// The journal's write-back mode and its stripe cache.
    pub(crate) wb: crate::writeback::WriteBack,
    /// raid1/raid10 resync barriers (normal IO against sync, per region bucket).
    pub(crate) barriers: crate::barrier::Barriers,
    /// Request references, for [`Array::quiesce`].
    pub(crate) quiesce: crate::quiesce::Quiesce,
    /// Per-role read state for mirror read balancing.
    pub(crate) heads: Vec<crate::read_balance::Head>,
    /// The shape requests read, under a sequence counter (see [`crate::shape`]).
    shape: crate::shape::ShapeLock,
    /// raid4/5/6: stripe ownership and buffers (md's stripe cache).
    pub(crate) stripe_cache: crate::stripe_cache::StripeCache,
    /// raid4/5/6: stripe workers (md's group_thread_cnt); None = submitters do the work.
    workers: std::sync::RwLock<Option<crate::stripe_workers::Workers>>,
    /// Workers in `workers`, so that the common case (none) takes no lock.
    group_threads: std::sync::atomic::AtomicUsize,
    /// Opened with --readonly: writes, repairs and rebuilds are refused (EROFS).
    read_only: AtomicBool,
}

/// A source of seconds (the array's notion of "now").
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

impl crate::journal::JournalHost for Array {
    fn flush_members(&self) -> io::Result<()> {
        Array::flush_members(self).map_err(io::Error::from)
    }

    /// journal_tail lives in the journal device's superblock (its recovery_offset field);
    /// md records it with a superblock update, and so do we.
    fn set_journal_tail(&self, tail_sectors: u64) -> io::Result<()> {
        let mut meta = self.meta();
        if let Some((_, sb)) = meta.journal.as_mut() {
            sb.recovery_offset = tail_sectors;
        }
        meta.write_all(self).map_err(io::Error::from)
    }
}

impl Array {
    /// Put an array together from its geometry, its role slots and its superblock state.
    pub(crate) fn new(
        geometry: ArrayGeometry,
        slots: Vec<Slot>,
        meta: Meta,
    ) -> Result<Array, ArrayError> {
        let personality = Personality::new(&geometry)?;
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
            slots,
            meta: Mutex::new(meta),
            dirty: AtomicBool::new(false),
            writes_in_flight: AtomicU64::new(0),
            last_write_ms: AtomicU64::new(0),
            metadata_failed: AtomicBool::new(false),
            sb_pending: SbPending::default(),
            locks: (0..LOCK_BUCKETS).map(|_| Mutex::new(())).collect(),
            unaligned: Mutex::new(()),
            array_bytes,
            stats: Stats::default(),
            tuning: Tuning::default(),
            events: crate::events::EventBus::default(),
            reconfig: Mutex::new(()),
            has_bitmap,
            journal: None,
            clock: std::sync::RwLock::new(Arc::new(crate::meta::now_secs)),
            wb: crate::writeback::WriteBack::default(),
            barriers: Default::default(),
            quiesce: Default::default(),
            heads: (0..raid_disks).map(|_| Default::default()).collect(),
            shape,
            stripe_cache: crate::stripe_cache::StripeCache::new(
                crate::stripe_cache::DEFAULT_SIZE,
                crate::stripe_cache::PARTITIONS,
            ),
            workers: std::sync::RwLock::new(None),
            group_threads: std::sync::atomic::AtomicUsize::new(0),
            read_only: AtomicBool::new(false),
        };
        let missing = a.missing_roles();
        if !a.personality.survives(&missing) {
            return Err(ArrayError::Assemble(format!(
                "{} with {} of {} members present cannot run: members {} are missing and {} tolerates {}",
                a.geometry.level,
                a.geometry.raid_disks - missing.len(),
                a.geometry.raid_disks,
                missing.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", "),
                a.geometry.level,
                a.personality.max_degraded()
            )));
        }
        Ok(a)
    }

    /// mdadm's --readonly (assembly sets it): writes fail with [`ArrayError::ReadOnly`]
    /// (EROFS), read errors are not rewritten, resync/repair/recovery are refused.
    pub(crate) fn set_read_only(&self, on: bool) {
        self.read_only.store(on, Ordering::SeqCst);
    }

    /// Whether writes are refused (md's read-only or read-auto state).
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::SeqCst)
    }

    /// `Err(ReadOnly)` when opened with --readonly; `what` names the refused operation.
    pub(crate) fn check_writable(&self, what: &str) -> Result<(), ArrayError> {
        if self.is_read_only() {
            return Err(ArrayError::ReadOnly(format!(
                "{what} refused: the array was opened with --readonly, nothing is written to its members"
            )));
        }
        Ok(())
    }

    /// Attach the write journal (create and assemble do, before the array is shared).
    pub fn set_journal(&mut self, j: crate::journal::Journal) {
        self.journal = Some(j);
    }

    /// Replace the clock (seconds) used for read-error decay (tests).
    pub fn set_clock(&self, clock: Clock) {
        *self.clock.write().unwrap() = clock;
    }

    pub(crate) fn now_secs(&self) -> u64 {
        (self.clock.read().unwrap())()
    }

    /// Whether the array has a write journal (raid4/5/6 with `--write-journal`).
    pub fn has_journal(&self) -> bool {
        self.journal.is_some()
    }

    /// Whether the write journal failed (writes are refused, reads go on).
    pub fn journal_failed(&self) -> bool {
        self.journal.as_ref().is_some_and(|j| j.is_failed())
    }

    /// The journal device's name, with a journal.
    pub fn journal_device(&self) -> Option<String> {
        self.journal.as_ref().map(|j| j.device_name())
    }

    pub(crate) fn parity_geometry(&self) -> Option<&uraid_core::geometry::ParityGeometry> {
        match &self.personality {
            Personality::Parity(g) => Some(g),
            _ => None,
        }
    }

    /// A journal error on the write path: an IO error fails the journal, which the
    /// superblocks record (the journal's role faulty, as md does), so that assembly will
    /// not trust it again without --force.
    pub(crate) fn journal_error(&self, e: crate::journal::JournalError) -> ArrayError {
        if let Some(j) = &self.journal {
            if matches!(e, crate::journal::JournalError::Io { .. }) || j.is_failed() {
                j.set_failed();
                self.record_journal_failure();
            }
        }
        e.into()
    }

    fn record_journal_failure(&self) {
        let mut meta = self.meta();
        if meta.mark_journal_faulty() {
            tracing::error!("write journal failed: writes are refused from now on");
            if let Err(e) = meta.write_all(self) {
                tracing::error!("could not record the journal failure: {e}");
            }
        }
    }

    pub(crate) fn journal_failed_error(&self) -> ArrayError {
        ArrayError::JournalFailed(format!(
            "journal {} failed earlier",
            self.journal_device().unwrap_or_default()
        ))
    }

    /// Fail the journal on request (tests, `uraid fail` of the journal device).
    pub fn fail_journal(&self) -> Result<(), ArrayError> {
        let Some(j) = &self.journal else {
            return Err(ArrayError::Failed("the array has no write journal".into()));
        };
        j.set_failed();
        self.record_journal_failure();
        Ok(())
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
    pub fn personality(&self) -> &Personality {
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
        self.shape.write(s);
    }

    /// Usable size of the array in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.array_bytes
    }

    /// Number of member roles (md's raid_disks).
    pub fn raid_disks(&self) -> usize {
        self.slots.len()
    }

    /// The member slot of a role: device, state, recovery cursor, bad blocks.
    pub fn slot(&self, role: MemberIdx) -> &Slot {
        &self.slots[role.0]
    }

    /// The state of a role's member.
    pub fn slot_state(&self, role: MemberIdx) -> SlotState {
        self.slots[role.0].state()
    }

    /// The device of a role if it is fully in sync.
    pub(crate) fn live(&self, role: MemberIdx) -> Option<Arc<dyn Member>> {
        self.slots[role.0].in_sync()
    }

    /// The device of a role if it holds valid data for recovery unit `unit` (see
    /// [`Slot`]: a recovering member is valid below its cursor).
    pub(crate) fn usable(&self, role: MemberIdx, unit: u64) -> Option<Arc<dyn Member>> {
        self.slots[role.0].usable(unit)
    }

    /// Roles without a working device.
    pub fn missing_roles(&self) -> Vec<MemberIdx> {
        (0..self.slots.len())
            .map(MemberIdx)
            .filter(|&r| self.live(r).is_none())
            .collect()
    }

    /// Whether a role has no in-sync member.
    pub fn is_degraded(&self) -> bool {
        !self.missing_roles().is_empty()
    }

    /// Whether the array still holds all its data.
    pub fn is_running(&self) -> bool {
        self.personality.survives(&self.missing_roles())
    }

    /// The superblock state (locked while the guard lives): the template and each member's.
    pub fn meta(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().unwrap()
    }

    /// The stripe cache of a raid4/5/6 array (counters, size).
    pub fn stripe_cache(&self) -> &crate::stripe_cache::StripeCache {
        &self.stripe_cache
    }

    /// Set md's stripe_cache_size (raid4/5/6; heads in the stripe cache).
    pub fn set_stripe_cache_size(&self, n: usize) -> Result<(), ArrayError> {
        use crate::stripe_cache::{MAX_SIZE, MIN_SIZE};
        if !matches!(self.personality, Personality::Parity(_)) {
            return Err(ArrayError::Failed(format!(
                "stripe_cache_size applies to raid4/5/6, not {}",
                self.geometry.level
            )));
        }
        if !(MIN_SIZE..=MAX_SIZE).contains(&n) {
            return Err(ArrayError::Failed(format!(
                "stripe_cache_size must be {MIN_SIZE}..={MAX_SIZE}, not {n}"
            )));
        }
        self.stripe_cache.set_size(n);
        Ok(())
    }

    /// md's group_thread_cnt: stripe worker threads (0 = each submitter handles its stripes).
    pub fn group_thread_cnt(&self) -> usize {
        self.workers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |w| w.threads())
    }

    /// Set group_thread_cnt: the old workers finish what they hold and stop.
    pub fn set_group_thread_cnt(&self, n: usize) -> Result<(), ArrayError> {
        const MAX_WORKERS: usize = 8192; // md's limit
        if n > MAX_WORKERS {
            return Err(ArrayError::Failed(format!(
                "group_thread_cnt must be at most {MAX_WORKERS}, not {n}"
            )));
        }
        let new = (n > 0).then(|| crate::stripe_workers::Workers::new(n));
        let old = {
            let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
            self.group_threads.store(n, Ordering::SeqCst);
            std::mem::replace(&mut *w, new)
        };
        drop(old);
        Ok(())
    }

    /// Run one stripe's work: on a stripe worker if there are any, else here.
    pub(crate) fn run_stripe<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if self.group_threads.load(Ordering::Relaxed) == 0 {
            return f();
        }
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        match w.as_ref() {
            Some(w) => w.run(f),
            None => {
                drop(w);
                f()
            }
        }
    }

    /// The run-time knobs by md's sysfs names, with their values.
    pub fn tunables(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if matches!(self.personality, Personality::Parity(_)) {
            let t = &self.tuning;
            v.push(("stripe_cache_size", self.stripe_cache.size().to_string()));
            v.push((
                "stripe_cache_active",
                self.stripe_cache.active().to_string(),
            ));
            v.push(("group_thread_cnt", self.group_thread_cnt().to_string()));
            v.push(("rmw_level", t.rmw_level.load(Ordering::Relaxed).to_string()));
            v.push((
                "skip_copy",
                u8::from(t.skip_copy.load(Ordering::Relaxed)).to_string(),
            ));
            v.push((
                "batching",
                u8::from(t.batching.load(Ordering::Relaxed)).to_string(),
            ));
        }
        v
    }

    /// Set a run-time knob by its md sysfs name (see [`Array::tunables`]).
    pub fn set_tunable(&self, name: &str, value: &str) -> Result<(), ArrayError> {
        let num = || {
            value
                .trim()
                .parse::<usize>()
                .map_err(|_| ArrayError::Failed(format!("{name}: {value:?} is not a number")))
        };
        let flag = || match num()? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(ArrayError::Failed(format!("{name} is 0 or 1, not {n}"))),
        };
        if !matches!(self.personality, Personality::Parity(_)) {
            return Err(ArrayError::Failed(format!(
                "{} has no tunable {name}",
                self.geometry.level
            )));
        }
        match name {
            "stripe_cache_size" => self.set_stripe_cache_size(num()?),
            "group_thread_cnt" => self.set_group_thread_cnt(num()?),
            "rmw_level" => match num()? {
                n @ 0..=2 => {
                    self.tuning.rmw_level.store(n as u8, Ordering::Relaxed);
                    Ok(())
                }
                n => Err(ArrayError::Failed(format!("rmw_level is 0..=2, not {n}"))),
            },
            "skip_copy" => {
                self.tuning.skip_copy.store(flag()?, Ordering::Relaxed);
                Ok(())
            }
            "batching" => {
                self.tuning.batching.store(flag()?, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(ArrayError::Failed(format!(
                "unknown tunable {name} (known: stripe_cache_size, group_thread_cnt, \
                 rmw_level, skip_copy, batching)"
            ))),
        }
    }

    fn bucket_of(key: u64) -> usize {
        // Fibonacci hashing spreads neighbouring stripes over buckets.
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) as usize % LOCK_BUCKETS
    }

    pub(crate) fn lock_bucket(&self, key: u64) -> MutexGuard<'_, ()> {
        self.locks[Self::bucket_of(key)].lock().unwrap()
    }

    /// Byte offset on a member of a member sector (relative to the data area).
    pub(crate) fn member_byte(&self, role: MemberIdx, member_sector: u64) -> u64 {
        self.slots[role.0].data_offset_bytes() + member_sector * SECTOR_BYTES
    }

    /// Run member IOs. A failed write fails its member at once (md does the same: the
    /// member no longer holds what the array says it holds). Failed reads are returned so
    /// the caller can answer from redundancy and repair the block.
    pub(crate) fn run_ops(&self, ops: &mut [Op<'_>], roles: &[MemberIdx]) -> Failures {
        debug_assert_eq!(ops.len(), roles.len());
        let results = execute(ops);
        let mut f = Failures::default();
        for (i, ((op, mut r), role)) in ops.iter().zip(results).zip(roles).enumerate() {
            let is_read = matches!(op.buf, crate::io::OpBuf::Read(_));
            // md's bad block log: a recorded range reads as an error (answered from
            // redundancy, whatever the device returned); a write over it clears it.
            let len = match &op.buf {
                crate::io::OpBuf::Read(b) => b.len(),
                crate::io::OpBuf::Write(b) => b.len(),
            } as u64;
            let (first, sectors) = (op.offset / SECTOR_BYTES, len.div_ceil(SECTOR_BYTES));
            let slot = &self.slots[role.0];
            if r.is_ok() {
                if is_read && slot.is_bad(first, sectors) {
                    r = Err(io::Error::other("recorded in the bad block log"));
                } else if !is_read {
                    slot.clear_bad(first, sectors);
                }
            }
            if is_read {
                self.stats.member_reads.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.member_writes.fetch_add(1, Ordering::Relaxed);
            }
            if let Err(e) = r {
                if is_read {
                    tracing::debug!("member {role}: read error at {}: {e}", op.offset);
                    f.read_ops.push(i);
                    if !f.reads.contains(role) {
                        f.reads.push(*role);
                    }
                } else {
                    self.member_error(*role, &e);
                    if !f.writes.contains(role) {
                        f.writes.push(*role);
                    }
                }
            }
        }
        f
    }

    /// A member failed: mark it faulty and record that in the other members' superblocks
    /// before any request that saw the failure completes (md holds such completions until
    /// the metadata is durable). A spare, if there is one, takes the role.
    pub(crate) fn member_error(&self, role: MemberIdx, err: &io::Error) {
        let slot = &self.slots[role.0];
        // Under the superblock lock, so that a spare cannot take the role between the
        // failure and its recording (the wrong device would be marked faulty).
        let mut meta = self.meta();
        // Pending before the slot turns faulty: a write that sees it faulty and skips it
        // then waits until the superblocks say so (md's MD_SB_CHANGE_PENDING).
        let change = self.begin_sb_change();
        let prev = slot.state();
        if !matches!(prev, SlotState::InSync | SlotState::Recovering)
            || !slot.transition(prev, SlotState::Faulty)
        {
            return;
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
    }

    /// A member read failed but redundancy answered: write the good data back. A member
    /// whose rewrite fails, or that keeps failing, is failed (md's max_corr_read_errors;
    /// the count halves for each hour without errors, as md's check_decay_read_errors).
    pub(crate) fn repair_read(&self, role: MemberIdx, member_sector: u64, good: &[u8]) {
        let slot = &self.slots[role.0];
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
        if role.0 >= self.slots.len() {
            return Err(ArrayError::Failed(format!("there is no member {role}")));
        }
        let state = self.slot_state(role);
        if !matches!(state, SlotState::InSync | SlotState::Recovering) {
            return Err(ArrayError::Failed(format!("member {role} is not active")));
        }
        let mut missing = self.missing_roles();
        if !missing.contains(&role) {
            missing.push(role);
        }
        if !self.personality.survives(&missing) {
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
        let size = self.shape().array_sectors * SECTOR_BYTES;
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
        if !self.dirty.load(Ordering::SeqCst) || self.writes_in_flight.load(Ordering::SeqCst) > 0 {
            return Ok(false);
        }
        let idle_ms = now_ms().saturating_sub(self.last_write_ms.load(Ordering::SeqCst));
        if u128::from(idle_ms) < delay.as_millis() {
            return Ok(false);
        }
        let mut meta = self.meta();
        self.dirty.store(false, Ordering::SeqCst);
        if self.writes_in_flight.load(Ordering::SeqCst) > 0 {
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(false);
        }
        // Completed writes must be durable before the superblock says clean (md writes
        // superblocks with a preflush).
        for s in &self.slots {
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
        let _active = self.quiesce.enter();
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
        let _active = self.quiesce.enter();
        self.check_range(offset, buf.len() as u64)?;
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if buf.is_empty() {
            return Ok(());
        }
        self.check_writable("write")?;
        let _in_flight = InFlight::new(self);
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
    fn complete_write(&self) -> Result<(), ArrayError> {
        self.sb_pending.wait();
        self.check_metadata()
    }

    /// Writes that are waiting for a member change to reach the superblocks (tests).
    #[doc(hidden)]
    pub fn writes_waiting_for_superblocks(&self) -> u64 {
        self.sb_pending.waiters.load(Ordering::SeqCst)
    }

    /// Start a member change that writes may depend on (a failure, a removal, a spare or
    /// replacement taking a role): call it before the slot changes, and hand the
    /// superblock update's result to [`SbChange::recorded`]. Writes that complete
    /// meanwhile wait until the guard drops.
    pub(crate) fn begin_sb_change(&self) -> SbChange<'_> {
        self.sb_pending.changes.fetch_add(1, Ordering::SeqCst);
        SbChange(self)
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
        let start = offset / SECTOR_BYTES * SECTOR_BYTES;
        let end = (offset + len as u64).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
        (start, AlignedBuf::new((end - start) as usize))
    }

    fn read_sectors(&self, sector: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        match &self.personality {
            Personality::Raid0(g) => crate::raid0::read(self, g, sector, buf),
            Personality::Raid1(_) => crate::raid1::read(self, sector, buf),
            Personality::Raid10(g) => crate::raid10::read(self, g, sector, buf),
            Personality::Parity(g) => {
                // Write-back: cached pages are newer than the members. Taken before the
                // member read, so a write-out finishing meanwhile cannot hide them.
                let cached = match &self.journal {
                    Some(_) => crate::writeback::cached_for_read(
                        self,
                        g,
                        sector,
                        buf.len() as u64 / SECTOR_BYTES,
                    ),
                    None => Vec::new(),
                };
                crate::raid5::read(self, g, sector, buf)?;
                crate::writeback::overlay(&cached, sector, buf);
                Ok(())
            }
        }
    }

    /// Where the bitmap counts a write of array sectors [sector, sector+sectors): array
    /// sectors for raid1/raid10, whole chunk rows of member sectors for raid4/5/6.
    fn bitmap_range(&self, sector: u64, sectors: u64) -> (u64, u64) {
        match &self.personality {
            Personality::Parity(g) => {
                let a = g.locate(sector).stripe;
                let b = g.locate(sector + sectors - 1).stripe;
                (a * g.chunk_sectors, (b - a + 1) * g.chunk_sectors)
            }
            _ => (sector, sectors),
        }
    }

    /// Whether the array has a write-intent bitmap.
    pub fn has_bitmap(&self) -> bool {
        self.has_bitmap
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
        let changed = meta
            .bitmap
            .as_mut()
            .is_some_and(|b| b.daemon_pass(degraded, events));
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
        {
            let mut meta = self.meta();
            let newly = meta
                .bitmap
                .as_mut()
                .is_some_and(|b| b.start_write(bstart, blen));
            if newly {
                meta.write_bitmap(self)?;
            }
        }
        let r = f();
        if let Some(b) = self.meta().bitmap.as_mut() {
            b.end_write(bstart, blen);
        }
        r
    }

    fn write_mapped(&self, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
        match &self.personality {
            Personality::Raid0(g) => crate::raid0::write(self, g, sector, buf),
            Personality::Raid1(_) => crate::raid1::write(self, sector, buf),
            Personality::Raid10(g) => crate::raid10::write(self, g, sector, buf),
            Personality::Parity(g) => match &self.journal {
                None => crate::raid5::write(self, g, sector, buf),
                Some(j) => {
                    if j.is_failed() {
                        return Err(self.journal_failed_error());
                    }
                    self.writeback_fallback()?;
                    let _gate = self.wb.gate.read().unwrap();
                    if self.wb.is_on() {
                        crate::writeback::write(self, g, sector, buf)
                    } else {
                        crate::raid5::write(self, g, sector, buf)
                    }
                }
            },
        }
    }

    /// Make a range read as zeros (NBD WRITE_ZEROES, ublk WRITE_ZEROES) with the members'
    /// zeroing where parity allows (see [`crate::discard`]). `how.unmap` lets the members
    /// deallocate it; `fast` refuses with [`ArrayError::NotFast`], before changing anything,
    /// when some member would have to write zeros.
    pub fn write_zeroes_with(
        &self,
        offset: u64,
        len: u64,
        how: crate::member::ZeroHow,
        fast: bool,
    ) -> Result<(), ArrayError> {
        self.check_writable("write-zeroes")?;
        crate::discard::write_zeroes(self, offset, len, how, fast)?;
        // Zeroing skips failed members like a write: acknowledged only once recorded.
        self.complete_write()
    }

    /// Make a range read as zeros; the members may deallocate it.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.write_zeroes_with(offset, len, crate::member::ZeroHow { unmap: true }, false)
    }

    /// Discard is advisory: the range then reads as zeros or keeps its data. It reaches the
    /// members only where every copy and parity stays consistent (see [`crate::discard`]).
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.check_writable("discard")?;
        crate::discard::discard(self, offset, len)?;
        self.complete_write()
    }

    /// Make every completed write durable: the journal first (write-back acknowledges a
    /// write once it is in the journal), then every live member.
    pub fn flush(&self) -> Result<(), ArrayError> {
        if let Some(j) = &self.journal {
            if j.is_failed() && !self.wb.is_empty() {
                // Cached writes were durable only in the journal, which failed.
                return Err(self.journal_failed_error());
            }
            if !j.is_failed() && (self.wb.is_on() || !self.wb.is_empty()) {
                j.flush().map_err(|e| self.journal_error(e))?;
            }
        }
        self.flush_members()?;
        // Writes this flush makes durable may have skipped a member whose failure is not
        // recorded yet; the flush answers for them only once it is.
        self.complete_write()
    }

    /// Flush every live member.
    pub(crate) fn flush_members(&self) -> Result<(), ArrayError> {
        let mut first_err = None;
        for (i, s) in self.slots.iter().enumerate() {
            let dev = match s.state() {
                SlotState::InSync | SlotState::Recovering => s.device(),
                _ => None,
            };
            if let Some(d) = dev {
                if let Err(e) = d.flush() {
                    self.member_error(MemberIdx(i), &e);
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
        if let (Some(_), Some(g)) = (&self.journal, self.parity_geometry()) {
            // Even with a failed journal: the cached data then goes straight to the members.
            let _gate = self.wb.gate.write().unwrap();
            crate::writeback::drain(self, g)?;
        }
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
        if let Some(j) = &self.journal {
            if !j.is_failed() {
                if let Err(e) = j.flush() {
                    out.journal_error = Some(e.to_string());
                }
            }
        }
        let mut failed = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if !matches!(s.state(), SlotState::InSync | SlotState::Recovering) {
                continue;
            }
            let Some(d) = s.device() else { continue };
            match d.flush() {
                Ok(()) => out.flushed.push(d.name()),
                Err(e) => {
                    tracing::error!("{}: flush failed during a forced stop: {e}", d.name());
                    failed.push((MemberIdx(i), d.name()));
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
            let slot = &self.slots[role.0];
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

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// md's MD_SB_CHANGE_PENDING as a count of member changes whose superblock update is in
/// progress. The common case (none) costs a write one atomic load.
#[derive(Default)]
struct SbPending {
    changes: AtomicU64,
    /// Writes waiting in [`SbPending::wait`].
    waiters: AtomicU64,
    lock: Mutex<()>,
    done: Condvar,
}

impl SbPending {
    /// Wait until no member change is pending. A change that starts meanwhile is waited
    /// for too: the writer cannot tell whether it skipped that member.
    fn wait(&self) {
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
}

/// A member change in progress (see [`Array::begin_sb_change`]); dropping it lets the
/// writes that wait for it complete.
pub(crate) struct SbChange<'a>(&'a Array);

impl SbChange<'_> {
    /// The change's superblock update finished with `r`. If it reached no superblock,
    /// nothing on disk records the change: no write is acknowledged from now on (set
    /// before the waiting writes wake, so that they see it).
    pub(crate) fn recorded(&self, r: Result<(), ArrayError>) -> Result<(), ArrayError> {
        if let Err(e) = &r {
            tracing::error!("a member change could not be recorded in any superblock: {e}");
            self.0.metadata_failed.store(true, Ordering::SeqCst);
        }
        r
    }
}

impl Drop for SbChange<'_> {
    fn drop(&mut self) {
        let p = &self.0.sb_pending;
        let _g = p.lock.lock().unwrap_or_else(|e| e.into_inner());
        p.changes.fetch_sub(1, Ordering::SeqCst);
        p.done.notify_all();
    }
}

/// Counts a write in flight for safe mode; notes when the last one ended.
pub(crate) struct InFlight<'a>(&'a Array);

impl<'a> InFlight<'a> {
    pub(crate) fn new(a: &'a Array) -> InFlight<'a> {
        a.writes_in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(a)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.last_write_ms.store(now_ms(), Ordering::SeqCst);
        self.0.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if self.dirty.load(Ordering::Acquire) || !self.wb.is_empty() {
            if let Err(e) = self.stop() {
                tracing::error!("could not stop the array cleanly: {e}");
            }
        }
    }
}

/// Helper for level modules: one op per (role, member sector, buffer).
pub(crate) struct OpList<'a> {
    devs: Vec<Arc<dyn Member>>,
    pending: Vec<(u64, OpBuf<'a>)>,
    roles: Vec<MemberIdx>,
}

impl<'a> OpList<'a> {
    pub fn new() -> OpList<'a> {
        OpList {
            devs: Vec::new(),
            pending: Vec::new(),
            roles: Vec::new(),
        }
    }

    pub fn read(
        &mut self,
        a: &Array,
        dev: Arc<dyn Member>,
        role: MemberIdx,
        member_sector: u64,
        buf: &'a mut [u8],
    ) {
        self.devs.push(dev);
        self.pending
            .push((a.member_byte(role, member_sector), OpBuf::Read(buf)));
        self.roles.push(role);
    }

    pub fn write(
        &mut self,
        a: &Array,
        dev: Arc<dyn Member>,
        role: MemberIdx,
        member_sector: u64,
        buf: &'a [u8],
    ) {
        self.devs.push(dev);
        self.pending
            .push((a.member_byte(role, member_sector), OpBuf::Write(buf)));
        self.roles.push(role);
    }

    /// Run all; write failures have failed their members, read failures are returned.
    pub fn run(self, a: &Array) -> Failures {
        if self.pending.is_empty() {
            return Failures::default();
        }
        let mut ops: Vec<Op<'_>> = self
            .pending
            .into_iter()
            .zip(&self.devs)
            .map(|((offset, buf), dev)| Op {
                member: dev.as_ref(),
                offset,
                buf,
            })
            .collect();
        a.run_ops(&mut ops, &self.roles)
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
