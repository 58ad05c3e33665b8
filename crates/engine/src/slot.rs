//! One role of the array and the state of the device filling it.
//!
//! States (md's rdev flags, simplified):
//! - `Missing`: no device.
//! - `InSync`: the device holds valid data everywhere.
//! - `Recovering`: a device rebuilding this role; valid below `recovery_cursor`, in the
//!   level's recovery unit (stripe for raid4/5/6, sector for raid1, array chunk for raid10).
//! - `Faulty`: failed; kept until removed so that reports can name it.

use crate::member::Member;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Missing,
    InSync,
    Recovering,
    Faulty,
}

impl SlotState {
    fn from_u8(v: u8) -> SlotState {
        match v {
            1 => SlotState::InSync,
            2 => SlotState::Recovering,
            3 => SlotState::Faulty,
            _ => SlotState::Missing,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            SlotState::Missing => 0,
            SlotState::InSync => 1,
            SlotState::Recovering => 2,
            SlotState::Faulty => 3,
        }
    }

    /// mdadm --detail's words.
    pub fn describe(self) -> &'static str {
        match self {
            SlotState::Missing => "removed",
            SlotState::InSync => "active sync",
            SlotState::Recovering => "spare rebuilding",
            SlotState::Faulty => "faulty",
        }
    }
}

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
}

impl Slot {
    pub fn new(dev: Option<Arc<dyn Member>>, data_offset_bytes: u64) -> Slot {
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
        }
    }

    pub fn state(&self) -> SlotState {
        SlotState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn set_state(&self, s: SlotState) {
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

    pub fn device(&self) -> Option<Arc<dyn Member>> {
        self.dev.read().unwrap().clone()
    }

    pub fn device_name(&self) -> Option<String> {
        self.dev.read().unwrap().as_ref().map(|d| d.name())
    }

    pub(crate) fn set_device(&self, dev: Option<Arc<dyn Member>>, data_offset_bytes: u64) {
        let mut d = self.dev.write().unwrap();
        *d = dev;
        self.data_offset_bytes
            .store(data_offset_bytes, Ordering::Release);
        // A new device has its own history: no corrected reads, no recovery progress.
        self.corrected_reads.store(0, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

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

    pub fn data_offset_bytes(&self) -> u64 {
        self.data_offset_bytes.load(Ordering::Acquire)
    }

    pub fn recovery_cursor(&self) -> u64 {
        self.recovery_cursor.load(Ordering::Acquire)
    }

    pub(crate) fn set_recovery_cursor(&self, unit: u64) {
        self.recovery_cursor.store(unit, Ordering::Release);
    }

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
    /// no reference count, for the per-stripe "what is lost" checks (a device that goes away
    /// meanwhile is caught when the IO asks [`Slot::usable`]).
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
