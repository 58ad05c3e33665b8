//! Array events in md's (mdadm --monitor's) vocabulary, delivered to subscribers.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use uraid_core::MemberIdx;

/// Something that happened to an array, in md's (mdadm --monitor's) vocabulary; see
/// [`Array::subscribe`](crate::Array::subscribe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A member failed and was marked faulty.
    Fail {
        /// The role it held.
        role: MemberIdx,
        /// The member's device name.
        device: String,
    },
    /// The array runs with members missing.
    DegradedArray,
    /// A spare was added to the array.
    SpareAdded {
        /// The spare's device name.
        device: String,
    },
    /// A spare took the role of a missing member and recovery begins.
    SpareActive {
        /// The role it took.
        role: MemberIdx,
        /// The spare's device name.
        device: String,
    },
    /// Recovery (or resync) started.
    RebuildStarted {
        /// The role being recovered; None for a resync of the whole array.
        role: Option<MemberIdx>,
    },
    /// Recovery passed NN percent (20, 40, 60, 80), as mdadm's RebuildNN.
    Rebuild {
        /// Percent done.
        percent: u32,
    },
    /// Recovery (or resync) finished.
    RebuildFinished {
        /// The role recovered; None for a resync of the whole array.
        role: Option<MemberIdx>,
    },
    /// A spare being rebuilt (e.g. a replacement) failed, as mdadm's FailSpare.
    FailSpare {
        /// The spare's device name.
        device: String,
    },
    /// A member was removed from the array.
    DeviceRemoved {
        /// The member's device name.
        device: String,
    },
    /// A scrub (check or repair) finished with this many mismatched sectors.
    CheckFinished {
        /// Sectors found to differ (md's mismatch_cnt).
        mismatch_sectors: u64,
    },
}

impl Event {
    /// mdadm's event name.
    pub fn name(&self) -> String {
        match self {
            Event::Fail { .. } => "Fail".into(),
            Event::DegradedArray => "DegradedArray".into(),
            Event::SpareAdded { .. } => "SpareAdded".into(),
            Event::SpareActive { .. } => "SpareActive".into(),
            Event::RebuildStarted { .. } => "RebuildStarted".into(),
            Event::Rebuild { percent } => format!("Rebuild{percent}"),
            Event::RebuildFinished { .. } => "RebuildFinished".into(),
            Event::DeviceRemoved { .. } => "DeviceDisappeared".into(),
            Event::FailSpare { .. } => "FailSpare".into(),
            Event::CheckFinished { .. } => "CheckFinished".into(),
        }
    }

    /// The member device the event is about, if any (mdadm passes it to the program).
    pub fn device(&self) -> Option<&str> {
        match self {
            Event::Fail { device, .. }
            | Event::SpareAdded { device }
            | Event::FailSpare { device }
            | Event::SpareActive { device, .. }
            | Event::DeviceRemoved { device } => Some(device),
            _ => None,
        }
    }
}

#[derive(Default)]
pub struct EventBus {
    subs: Mutex<Vec<Sender<Event>>>,
}

impl EventBus {
    pub fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = channel();
        self.subs.lock().unwrap().push(tx);
        rx
    }

    /// Take `old`'s subscribers (an array replaced by its new shape keeps its monitors).
    pub fn adopt(&self, old: &EventBus) {
        let moved = std::mem::take(&mut *old.subs.lock().unwrap());
        self.subs.lock().unwrap().extend(moved);
    }

    pub fn emit(&self, e: Event) {
        tracing::info!("event {}", e.name());
        self.subs
            .lock()
            .unwrap()
            .retain(|s| s.send(e.clone()).is_ok());
    }
}
