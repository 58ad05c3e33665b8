//! One role of the array and the state of the device filling it.
//!
//! States (md's rdev flags, simplified):
//! - `Missing`: no device.
//! - `InSync`: the device holds valid data everywhere.
//! - `Recovering`: a device rebuilding this role; valid below `recovery_cursor`, in the
//!   level's recovery unit (stripe for raid4/5/6, sector for raid1, array chunk for raid10).
//! - `Faulty`: failed; kept until removed so that reports can name it.
//!
//! The device's md flags (write-mostly, failfast: the superblock's `devflags`) live here
//! at run time, read per IO without a lock; superblock writes copy them back.
//!
//! An in-sync role may also carry a *replacement* (md's --replace): a second device being
//! rebuilt for the same role while the first stays active (see [`crate::replace`]).

use crate::badblocks::{BadBlocks, BadCheck};
use crate::member::Member;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use uraid_core::superblock::MemberFlags;

pub use crate::slot_state::SlotState;

/// One role of the array: its member device, state, recovery cursor and bad blocks.
pub struct Slot {
    dev: RwLock<Option<Arc<dyn Member>>>,
    data_offset_bytes: AtomicU64,
    state: AtomicU8,
    recovery_cursor: AtomicU64,
    /// Read errors corrected by rewriting from redundancy (md's corrected read count).
    pub corrected_reads: AtomicU32,
    /// A re-added member: only chunks the bitmap marks need rebuilding.
    bitmap_recovery: AtomicBool,
    /// Bumped whenever another device takes the slot, so that work begun for one device is
    /// never credited to the next.
    generation: AtomicU64,
    /// When the last read error was corrected (seconds of the array's clock), for md's
    /// hourly halving of `corrected_reads` (check_decay_read_errors).
    last_read_error_secs: AtomicU64,
    /// The device being rebuilt to take this role over (md's replacement), if any.
    replacement: RwLock<Option<Arc<crate::replacing::Replacing>>>,
    /// The device's bad blocks (md's bad block log), in absolute device sectors.
    bad: Arc<Mutex<BadBlocks>>,
    /// Whether `bad` holds anything: the IO path checks this first.
    has_bad: Arc<AtomicBool>,
    /// The device's write-mostly and failfast flags, as a `devflags` byte.
    flags: AtomicU8,
}

impl Slot {
    pub(crate) fn new(dev: Option<Arc<dyn Member>>, data_offset_bytes: u64) -> Slot {
        let state = if dev.is_some() {
            SlotState::InSync
        } else {
            SlotState::Missing
        };
        Slot {
            dev: RwLock::new(dev),
            data_offset_bytes: AtomicU64::new(data_offset_bytes),
            state: AtomicU8::new(state.as_u8()),
            recovery_cursor: AtomicU64::new(0),
            corrected_reads: AtomicU32::new(0),
            bitmap_recovery: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            last_read_error_secs: AtomicU64::new(0),
            replacement: RwLock::new(None),
            bad: Arc::new(Mutex::new(BadBlocks::default())),
            has_bad: Arc::new(AtomicBool::new(false)),
            flags: AtomicU8::new(0),
        }
    }

    /// The device's md flags (write-mostly, failfast).
    pub fn member_flags(&self) -> MemberFlags {
        MemberFlags::from_devflags(self.flags.load(Ordering::Relaxed))
    }

    /// Set the device's flags; the next superblock write records them.
    pub(crate) fn set_member_flags(&self, f: MemberFlags) {
        self.flags.store(f.devflags(), Ordering::Relaxed);
    }

    /// The device's recorded bad blocks.
    pub fn bad_blocks(&self) -> BadBlocks {
        self.bad.lock().unwrap().clone()
    }

    pub(crate) fn set_bad_blocks(&self, bb: BadBlocks) {
        let mut b = self.bad.lock().unwrap();
        self.has_bad.store(!bb.is_empty(), Ordering::Release);
        *b = bb;
    }

    /// Whether any of [start, start + sectors) (absolute device sectors) is recorded bad.
    pub(crate) fn is_bad(&self, start: u64, sectors: u64) -> bool {
        self.has_bad.load(Ordering::Acquire) && self.bad.lock().unwrap().overlaps(start, sectors)
    }

    pub(crate) fn record_bad(&self, start: u64, sectors: u64) {
        let mut b = self.bad.lock().unwrap();
        b.add(start, sectors);
        self.has_bad.store(true, Ordering::Release);
    }

    /// A write of [start, start + sectors) succeeded: those sectors are good again.
    pub(crate) fn clear_bad(&self, start: u64, sectors: u64) -> bool {
        if !self.has_bad.load(Ordering::Acquire) {
            return false;
        }
        let mut b = self.bad.lock().unwrap();
        let changed = b.clear(start, sectors);
        self.has_bad.store(!b.is_empty(), Ordering::Release);
        changed
    }

    /// A check of the old device's bad blocks, for a replacement copying from it.
    pub(crate) fn bad_check(&self) -> BadCheck {
        BadCheck::new(self.bad.clone(), self.has_bad.clone())
    }

    /// The replacement being rebuilt for this role, if any.
    pub(crate) fn replacement(&self) -> Option<Arc<crate::replacing::Replacing>> {
        self.replacement.read().unwrap().clone()
    }

    /// Name of the replacement device, if one is being rebuilt.
    pub fn replacement_name(&self) -> Option<String> {
        self.replacement().map(|r| r.new_name())
    }

    /// Member sectors of the replacement already rebuilt (its recovery_offset).
    pub fn replacement_cursor_sectors(&self) -> Option<u64> {
        self.replacement().map(|r| r.cursor_sectors())
    }

    /// Attach or detach the replacement. Attaching puts the replacing wrapper in place of
    /// the device (so every write reaches both); detaching puts `dev` back. The device's
    /// history (generation, corrected reads) is kept: it is the same device.
    pub(crate) fn set_replacement(
        &self,
        r: Option<Arc<crate::replacing::Replacing>>,
        dev: Arc<dyn Member>,
    ) {
        let mut d = self.dev.write().unwrap();
        *d = Some(dev);
        *self.replacement.write().unwrap() = r;
    }

    /// A corrected read error at `now_secs`: md first halves the count once per hour since
    /// the previous error (check_decay_read_errors), then counts this one. Returns the
    /// new count.
    pub(crate) fn note_corrected_read(&self, now_secs: u64) -> u32 {
        let last = self.last_read_error_secs.swap(now_secs, Ordering::AcqRel);
        let hours = now_secs.saturating_sub(last) / 3600;
        let cur = self.corrected_reads.load(Ordering::Acquire);
        let n = decay_read_errors(cur, hours) + 1;
        self.corrected_reads.store(n, Ordering::Release);
        n
    }

    /// The member's state.
    pub fn state(&self) -> SlotState {
        SlotState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, s: SlotState) {
        self.state.store(s.as_u8(), Ordering::Release);
    }

    /// Atomically move from `from` to `to`; false if the state was something else.
    pub(crate) fn transition(&self, from: SlotState, to: SlotState) -> bool {
        self.state
            .compare_exchange(
                from.as_u8(),
                to.as_u8(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// The member device, if any.
    pub fn device(&self) -> Option<Arc<dyn Member>> {
        self.dev.read().unwrap().clone()
    }

    /// The member device's name, if any.
    pub fn device_name(&self) -> Option<String> {
        self.dev.read().unwrap().as_ref().map(|d| d.name())
    }

    /// The IO engine of the member device, if it is a file or block device.
    pub fn io_engine(&self) -> Option<crate::io_engine::IoEngine> {
        self.dev
            .read()
            .unwrap()
            .as_ref()
            .and_then(|d| d.io_engine())
    }

    /// Put `dev` (with its own md flags, from its superblock) in the slot.
    pub(crate) fn set_device(
        &self,
        dev: Option<Arc<dyn Member>>,
        data_offset_bytes: u64,
        flags: MemberFlags,
    ) {
        let mut d = self.dev.write().unwrap();
        *d = dev;
        self.data_offset_bytes
            .store(data_offset_bytes, Ordering::Release);
        self.set_member_flags(flags);
        // A new device has its own history: no corrected reads, no recovery progress, no
        // bad blocks (assembly loads a member's own list afterwards).
        self.corrected_reads.store(0, Ordering::Release);
        self.set_bad_blocks(BadBlocks::default());
        *self.replacement.write().unwrap() = None;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Bumped each time the slot changes member, so a stale view can tell.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Move the recovery cursor to `unit`, but only if the slot still holds the device of
    /// generation `gen` and it is still recovering.
    pub(crate) fn advance_cursor(&self, gen: u64, unit: u64) {
        let _d = self.dev.read().unwrap();
        if self.generation() == gen && self.state() == SlotState::Recovering {
            self.recovery_cursor.store(unit, Ordering::Release);
        }
    }

    /// Where data starts on the member, in bytes.
    pub fn data_offset_bytes(&self) -> u64 {
        self.data_offset_bytes.load(Ordering::Acquire)
    }

    /// While recovering: array-relative sectors of the role rebuilt so far.
    pub fn recovery_cursor(&self) -> u64 {
        self.recovery_cursor.load(Ordering::Acquire)
    }

    pub(crate) fn set_recovery_cursor(&self, unit: u64) {
        self.recovery_cursor.store(unit, Ordering::Release);
    }

    /// Whether recovery covers only the bitmap's dirty chunks (a re-added member).
    pub fn bitmap_recovery(&self) -> bool {
        self.bitmap_recovery.load(Ordering::Acquire)
    }

    pub(crate) fn set_bitmap_recovery(&self, on: bool) {
        self.bitmap_recovery.store(on, Ordering::Release);
    }

    /// The device, if it holds valid data for recovery unit `unit`.
    pub fn usable(&self, unit: u64) -> Option<Arc<dyn Member>> {
        match self.state() {
            SlotState::InSync => self.device(),
            SlotState::Recovering if unit < self.recovery_cursor() => self.device(),
            _ => None,
        }
    }

    /// Whether [`Slot::usable`] would give a device for `unit`, by state alone: no lock and
    /// no reference count, for the per-stripe "what is lost" checks and read balancing (a
    /// device that goes away meanwhile is caught when the IO asks [`Slot::usable`]).
    pub fn is_usable(&self, unit: u64) -> bool {
        match self.state() {
            SlotState::InSync => true,
            SlotState::Recovering => unit < self.recovery_cursor(),
            _ => false,
        }
    }

    /// The device, if it is fully in sync.
    pub fn in_sync(&self) -> Option<Arc<dyn Member>> {
        match self.state() {
            SlotState::InSync => self.device(),
            _ => None,
        }
    }
}

/// md's check_decay_read_errors: the count halves for every whole hour since the last
/// error, and is forgotten after 32 hours (the shift would overflow).
pub(crate) fn decay_read_errors(count: u32, hours: u64) -> u32 {
    if hours >= 32 {
        0
    } else {
        count >> hours
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_errors_halve_per_hour() {
        assert_eq!(decay_read_errors(20, 0), 20);
        assert_eq!(decay_read_errors(20, 1), 10);
        assert_eq!(decay_read_errors(20, 2), 5);
        assert_eq!(decay_read_errors(21, 31), 0);
        assert_eq!(decay_read_errors(u32::MAX, 32), 0);
        assert_eq!(decay_read_errors(u32::MAX, 1000), 0);
    }

    #[test]
    fn note_corrected_read_decays_before_counting() {
        let s = Slot::new(None, 0);
        for _ in 0..20 {
            s.note_corrected_read(1000);
        }
        assert_eq!(s.corrected_reads.load(Ordering::Acquire), 20);
        // 59 minutes later: no whole hour has passed.
        assert_eq!(s.note_corrected_read(1000 + 3599), 21);
        // Two hours after that: 21 >> 2 = 5, plus this one.
        assert_eq!(s.note_corrected_read(1000 + 3599 + 7200), 6);
    }
}
