//! md's daemons: the background work an array needs while it runs, in one place for every
//! embedder (`uraid serve`, a program that links the engine).
//!
//! What md does in `md_check_recovery` and its threads, [`Daemons`] does here:
//! - **safe mode**: an array with no write for `safe_mode_delay` (md: 200 ms) is flushed and
//!   marked clean, so a crash while idle needs no resync ([`Array::safemode`]);
//! - **the bitmap daemon**: every `daemon_sleep` seconds (the bitmap's own field) bits of
//!   chunks idle for a whole pass are cleared ([`Array::bitmap_daemon`]);
//! - **the r5c reclaim thread**: with a write journal, write-back's write-out when the log
//!   or cache fills and when stripes get old (the policy is write-back's, in
//!   `writeback.rs`; this only runs it);
//! - **spare activation**: a spare takes a missing role when the daemons start and after
//!   every member failure;
//! - **the sync thread**: at start an interrupted recovery or replace is finished, else a
//!   resync owed after an unclean stop is run (not degraded: there is nothing to compare);
//!   one sync at a time, paced by md's sync_speed_min/max ([`crate::Throttle`]).
//!
//! - **the re-add daemon** (with [`DaemonOptions::readd_interval`]): a member lost with
//!   its host is reopened on each pass and re-added once the host is back, so that the
//!   bitmap resyncs what it missed (`readd.rs`; mdadm's incremental re-add).
//!
//! Every policy reads the array's clock ([`crate::clock`]); the threads only decide how
//! often they look. [`Daemons::run_pass`] runs the periodic part once on the caller's
//! thread, so a test on a [`crate::clock::ManualClock`] drives it step by step.
//!
//! Stopping ([`Daemons::stop`], or dropping the handle) interrupts a running sync at its
//! next step (md's MD_RECOVERY_INTR), as md stops its sync thread before the array, and
//! joins every thread. Stop the daemons before [`Array::stop`].

use crate::array::Array;
use crate::events::Event;
use crate::recovery::{SyncKind, SyncLimits, SyncProgress, Throttle};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use uraid_core::MemberIdx;

/// md's safe_mode_delay default.
pub const SAFE_MODE_DELAY: Duration = Duration::from_millis(200);
/// How often the md thread looks at the array.
pub const DAEMON_TICK: Duration = Duration::from_millis(100);
/// The bitmap daemon's period when the bitmap gives none (md's default daemon_sleep).
pub const DEFAULT_BITMAP_DAEMON_SLEEP_SECS: u32 = 5;

/// Something the daemons did or failed to do, for the embedder to report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DaemonNote {
    /// A spare took a missing role when the daemons started.
    SpareActivated {
        /// The role it took.
        role: MemberIdx,
        /// The spare's device name.
        device: String,
    },
    /// A spare took the role of a member that failed while the array ran.
    SpareTookFailedRole {
        /// The role it took.
        role: MemberIdx,
    },
    /// No spare could be activated.
    SpareActivationFailed(String),
    /// A resync started because the array was not stopped cleanly.
    ResyncStarted,
    /// A recovery (or replace) finished.
    RecoveryFinished,
    /// A resync, check or repair finished.
    SyncFinished {
        /// Which sync.
        kind: SyncKind,
        /// The mismatched sectors it found (and rewrote, for resync and repair).
        mismatches: u64,
    },
    /// A sync stopped on an error (not an interruption by [`Daemons::stop`]).
    SyncStopped {
        /// Which sync.
        kind: SyncKind,
        /// Why it stopped.
        error: String,
    },
    /// Safe mode could not mark the array clean.
    SafeModeFailed(String),
    /// A bitmap daemon pass failed.
    BitmapDaemonFailed(String),
    /// A member lost with its host answered again and was re-added in its role.
    MemberReadded {
        /// Its role.
        role: MemberIdx,
        /// Its device (URI).
        device: String,
    },
    /// A lost member answered again but is not re-added (noted once per reason).
    ReaddRefused {
        /// Its role.
        role: MemberIdx,
        /// Its device (URI).
        device: String,
        /// Why, and what to do.
        why: String,
    },
    /// The served array's reshape goes on (md continues one when it starts an array).
    ReshapeStarted(String),
    /// The reshape finished; the superblocks record the new shape.
    ReshapeFinished,
    /// The reshape stopped on an error; the superblocks record where it got to.
    ReshapeStopped(String),
}

impl fmt::Display for DaemonNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaemonNote::SpareActivated { role, device } => write!(
                f,
                "the array is degraded: a spare takes role {role} ({device}) and is rebuilt"
            ),
            DaemonNote::SpareTookFailedRole { role } => {
                write!(f, "a spare takes role {role}; recovery started")
            }
            DaemonNote::SpareActivationFailed(e) => write!(f, "could not activate a spare: {e}"),
            DaemonNote::ResyncStarted => {
                write!(f, "the array was not stopped cleanly: resync started")
            }
            DaemonNote::RecoveryFinished => write!(f, "recovery finished"),
            DaemonNote::SyncFinished { kind, mismatches } => write!(
                f,
                "{} finished, {mismatches} mismatched sectors rewritten",
                kind.name()
            ),
            DaemonNote::SyncStopped { kind, error } => {
                write!(f, "{} stopped: {error}", kind.name())
            }
            DaemonNote::SafeModeFailed(e) => write!(f, "safe mode: {e}"),
            DaemonNote::BitmapDaemonFailed(e) => write!(f, "bitmap daemon: {e}"),
            DaemonNote::MemberReadded { role, device } => write!(
                f,
                "member {role} ({device}) answers again: re-added, recovery started"
            ),
            DaemonNote::ReaddRefused { role, device, why } => write!(
                f,
                "member {role} ({device}) answers again but is not re-added: {why}"
            ),
            DaemonNote::ReshapeStarted(what) => write!(f, "reshape going on: {what}"),
            DaemonNote::ReshapeFinished => write!(
                f,
                "reshape finished; the new size is served from the next start of the array"
            ),
            DaemonNote::ReshapeStopped(e) => write!(
                f,
                "reshape stopped: {e}; it goes on from the recorded position when the array is \
                 started again"
            ),
        }
    }
}

/// Where [`DaemonNote`]s go.
pub type DaemonNotify = Arc<dyn Fn(&DaemonNote) + Send + Sync>;

/// The daemons' tunables.
#[derive(Clone)]
pub struct DaemonOptions {
    /// md's safe_mode_delay: idle time after the last write before the array is marked
    /// clean.
    pub safe_mode_delay: Duration,
    /// How often the md thread looks (real time; what it decides reads the array's clock).
    pub tick: Duration,
    /// md's sync_speed_min/max for the syncs the daemons run.
    pub sync_limits: SyncLimits,
    /// Start an interrupted recovery or an owed resync when the daemons start, and give
    /// spares the missing roles (md does both when it runs an array).
    pub start_sync: bool,
    /// Where notes go; by default `tracing` at info (errors at warn).
    pub notify: Option<DaemonNotify>,
    /// Try to reopen failed members that can be ([`crate::Member::reopen`]: remote
    /// ones) this often, and re-add each that is this array's member again; `None` (the
    /// default): never, a lost member waits for `add`.
    pub readd_interval: Option<Duration>,
}

impl Default for DaemonOptions {
    fn default() -> DaemonOptions {
        DaemonOptions {
            safe_mode_delay: SAFE_MODE_DELAY,
            tick: DAEMON_TICK,
            sync_limits: SyncLimits::default(),
            start_sync: true,
            notify: None,
            readd_interval: None,
        }
    }
}

impl fmt::Debug for DaemonOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DaemonOptions")
            .field("safe_mode_delay", &self.safe_mode_delay)
            .field("tick", &self.tick)
            .field("sync_limits", &self.sync_limits)
            .field("start_sync", &self.start_sync)
            .field("notify", &self.notify.is_some())
            .field("readd_interval", &self.readd_interval)
            .finish()
    }
}

impl Array {
    /// Start md's daemons for this array (see [`Daemons::start`]).
    pub fn start_daemons(self: &Arc<Self>, opts: DaemonOptions) -> io::Result<Daemons> {
        Daemons::start(self.clone(), opts)
    }
}

/// Gives missing roles to waiting spares, as many as both allow, as md does when it starts
/// a degraded array that has spares; each activation is noted.
pub fn activate_spares(array: &Array, notify: &dyn Fn(&DaemonNote)) {
    while array.is_degraded() && !array.spares().is_empty() {
        match array.activate_spare() {
            Ok(Some(role)) => notify(&DaemonNote::SpareActivated {
                role,
                device: array.slot(role).device_name().unwrap_or_default(),
            }),
            Ok(None) => break,
            Err(e) => {
                notify(&DaemonNote::SpareActivationFailed(e.to_string()));
                break;
            }
        }
    }
}

/// The default [`DaemonNotify`]: `tracing`.
pub(crate) fn trace_note(n: &DaemonNote) {
    match n {
        DaemonNote::SpareActivationFailed(_)
        | DaemonNote::ReaddRefused { .. }
        | DaemonNote::SyncStopped { .. }
        | DaemonNote::ReshapeStopped(_)
        | DaemonNote::SafeModeFailed(_)
        | DaemonNote::BitmapDaemonFailed(_) => tracing::warn!("{n}"),
        _ => tracing::info!("{n}"),
    }
}

struct Shared {
    array: Arc<Array>,
    opts: DaemonOptions,
    notify: DaemonNotify,
    stop: Arc<AtomicBool>,
    /// Wakes the md thread before its tick (stop).
    wake: (Mutex<bool>, Condvar),
    /// The periodic pass: one at a time, and when the bitmap daemon last ran (clock ms).
    pass: Mutex<Option<u64>>,
    sync_running: AtomicBool,
    progress: Mutex<Option<SyncProgress>>,
    /// md's resync marks of the running sync, for its speed.
    marks: Mutex<SyncMarks>,
    sync_thread: Mutex<Option<JoinHandle<()>>>,
}

/// md's daemons running for one array; stopped by [`Daemons::stop`] or on drop.
pub struct Daemons {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Daemons {
    /// Start the md thread (safe mode, bitmap daemon), the failure watcher (spare
    /// activation, recovery), the r5c reclaim thread when the array has a journal, and,
    /// with [`DaemonOptions::start_sync`], activate spares and start the sync md would start.
    pub fn start(array: Arc<Array>, opts: DaemonOptions) -> io::Result<Daemons> {
        array.sync_intr.store(false, Ordering::SeqCst);
        let notify = opts.notify.clone().unwrap_or_else(|| Arc::new(trace_note));
        let shared = Arc::new(Shared {
            array: array.clone(),
            opts,
            notify,
            stop: Arc::new(AtomicBool::new(false)),
            wake: (Mutex::new(false), Condvar::new()),
            pass: Mutex::new(None),
            sync_running: AtomicBool::new(false),
            progress: Mutex::new(None),
            marks: Mutex::new(SyncMarks::default()),
            sync_thread: Mutex::new(None),
        });
        // Made first: if a thread cannot be started, dropping it stops those that were.
        let d = Daemons {
            shared: shared.clone(),
            threads: Mutex::new(Vec::new()),
        };
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| -> io::Result<()> {
            let t = std::thread::Builder::new().name(name.into()).spawn(f)?;
            lock(&d.threads).push(t);
            Ok(())
        };
        // Subscribed before anything can fail a member, so that no failure is missed.
        let events = array.subscribe();
        if array.has_journal() {
            let s = shared.clone();
            spawn(
                "r5c-reclaim",
                Box::new(move || s.array.writeback_daemon(&s.stop)),
            )?;
        }
        let s = shared.clone();
        spawn("md-daemon", Box::new(move || s.md_thread()))?;
        let s = shared.clone();
        spawn("md-events", Box::new(move || s.watch_failures(events)))?;
        if let Some(every) = shared.opts.readd_interval {
            let s = shared.clone();
            spawn("md-readd", Box::new(move || s.readd_daemon(every)))?;
        }
        if shared.opts.start_sync {
            activate_spares(&array, &*shared.notify);
            // As md does when it starts an array: finish an interrupted recovery, else
            // resync after an unclean stop (needs every member; degraded, the data is all
            // there is).
            if array.is_reshaping() {
                // md goes on with a reshape it finds; a resync owed waits for its end.
                if !array.is_read_only() {
                    let s = shared.clone();
                    spawn("md-reshape", Box::new(move || s.reshape_thread()))?;
                }
            } else if !array.recovering_roles().is_empty() || !array.replacing_roles().is_empty() {
                d.start_recovery();
            } else if array.meta().needs_resync() && !array.is_degraded() {
                d.start_sync(SyncKind::Resync);
            }
        }
        Ok(d)
    }

    /// The array the daemons run for.
    pub fn array(&self) -> &Arc<Array> {
        &self.shared.array
    }

    /// One pass of the md thread on the caller's thread: safe mode, then the bitmap daemon
    /// if its period has passed on the array's clock.
    pub fn run_pass(&self) {
        self.shared.pass();
    }

    /// Rebuild recovering members and replacements in the background (after an add or a
    /// replace); nothing if a sync is running already.
    pub fn start_recovery(&self) {
        self.shared.start_sync(SyncKind::Recovery);
    }

    /// Run a sync of `kind` in the background, one at a time: nothing if one is running.
    /// A resync goes on as a recovery while roles are left to rebuild.
    pub fn start_sync(&self, kind: SyncKind) {
        self.shared.start_sync(kind);
    }

    /// Whether a sync started by the daemons is running.
    pub fn sync_running(&self) -> bool {
        self.shared.sync_running.load(Ordering::SeqCst)
    }

    /// The running sync's progress, after its first step.
    pub fn sync_progress(&self) -> Option<SyncProgress> {
        *lock(&self.shared.progress)
    }

    /// How far the running sync got over the last half minute or so (md's resync mark,
    /// the base of /proc/mdstat's speed and finish): `None` before its first step.
    pub fn sync_mark(&self) -> Option<SyncMark> {
        let p = (*lock(&self.shared.progress))?;
        lock(&self.shared.marks).since_oldest(self.shared.array.clock().now_ms(), p.done_units)
    }

    /// Interrupt a running sync at its next step and stop every daemon thread, waiting
    /// for them. Once stopped they stay stopped (start new ones to run them again).
    pub fn stop(&self) {
        let s = &self.shared;
        if s.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        s.array.sync_intr.store(true, Ordering::SeqCst);
        {
            let mut w = lock(&s.wake.0);
            *w = true;
            s.wake.1.notify_all();
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        let sync = lock(&s.sync_thread).take();
        if let Some(t) = sync {
            let _ = t.join();
        }
        s.array.sync_intr.store(false, Ordering::SeqCst);
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        self.stop();
    }
}

/// md keeps SYNC_MARKS marks of a sync, one every SYNC_MARK_STEP (3 s), and reports the
/// speed since the oldest: a change of pace shows within half a minute, and one slow
/// start does not weigh on the whole sync.
const SYNC_MARKS: usize = 10;
const SYNC_MARK_STEP_MS: u64 = 3000;

/// Units a sync did in the time since a mark (see [`Daemons::sync_mark`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncMark {
    /// Milliseconds (array clock) since the mark.
    pub elapsed_ms: u64,
    /// Units done since the mark.
    pub units: u64,
}

/// The marks of one sync: (array clock ms, units done then), oldest first.
#[derive(Default, Debug)]
struct SyncMarks(std::collections::VecDeque<(u64, u64)>);

impl SyncMarks {
    /// A step of the sync: a new mark when the last is a step old (the first at once).
    fn record(&mut self, now_ms: u64, done_units: u64) {
        let due = self
            .0
            .back()
            .is_none_or(|&(t, _)| now_ms >= t + SYNC_MARK_STEP_MS);
        if due {
            if self.0.len() == SYNC_MARKS {
                self.0.pop_front();
            }
            self.0.push_back((now_ms, done_units));
        }
    }

    fn since_oldest(&self, now_ms: u64, done_units: u64) -> Option<SyncMark> {
        let &(t, u) = self.0.front()?;
        Some(SyncMark {
            elapsed_ms: now_ms.saturating_sub(t),
            units: done_units.saturating_sub(u),
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The md thread: a pass every tick until stopped.
    fn md_thread(&self) {
        while !self.stopping() {
            {
                let w = lock(&self.wake.0);
                let (mut w, _) = self
                    .wake
                    .1
                    .wait_timeout_while(w, self.opts.tick, |w| !*w)
                    .unwrap_or_else(|e| e.into_inner());
                *w = false;
            }
            if self.stopping() {
                break;
            }
            self.pass();
        }
    }

    fn pass(&self) {
        let mut last_bitmap = lock(&self.pass);
        let a = &self.array;
        if let Err(e) = a.safemode(self.opts.safe_mode_delay) {
            (self.notify)(&DaemonNote::SafeModeFailed(e.to_string()));
        }
        let now = a.clock().now_ms();
        let every_ms = u64::from(
            a.bitmap_daemon_sleep_secs()
                .unwrap_or(DEFAULT_BITMAP_DAEMON_SLEEP_SECS),
        ) * 1000;
        let since = *last_bitmap.get_or_insert(now);
        if now.saturating_sub(since) >= every_ms {
            *last_bitmap = Some(now);
            if let Err(e) = a.bitmap_daemon() {
                (self.notify)(&DaemonNote::BitmapDaemonFailed(e.to_string()));
            }
        }
    }

    /// md puts a waiting spare to work as soon as a member fails, whether by request or by
    /// an IO error.
    fn watch_failures(self: &Arc<Self>, events: std::sync::mpsc::Receiver<Event>) {
        use std::sync::mpsc::RecvTimeoutError;
        while !self.stopping() {
            let e = match events.recv_timeout(self.opts.tick) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            if !matches!(e, Event::Fail { .. }) {
                continue;
            }
            let a = &self.array;
            match a.activate_spare() {
                Ok(Some(role)) => (self.notify)(&DaemonNote::SpareTookFailedRole { role }),
                Ok(None) => {}
                Err(e) => (self.notify)(&DaemonNote::SpareActivationFailed(e.to_string())),
            }
            // The engine may already have given the role to a spare itself. Not while a
            // reshape runs: a member it rebuilds is recovering, and md runs no recovery
            // until the reshape ends.
            if !a.recovering_roles().is_empty() && !a.is_reshaping() {
                self.start_sync(SyncKind::Recovery);
            }
        }
    }

    fn readd_daemon(self: &Arc<Self>, every: Duration) {
        use crate::readd::Readd;
        // A refusal is noted once for each (role, reason), not on every pass.
        let mut refused = std::collections::HashSet::new();
        crate::readd::readd_thread(
            self.array.clone(),
            every,
            || self.stopping(),
            |r| match r {
                Readd::Readded { role, device } => {
                    refused.retain(|(r, _)| *r != role);
                    (self.notify)(&DaemonNote::MemberReadded { role, device });
                    self.start_sync(SyncKind::Recovery);
                }
                Readd::Refused { role, device, why } => {
                    if refused.insert((role, why.clone())) {
                        (self.notify)(&DaemonNote::ReaddRefused { role, device, why });
                    }
                }
                Readd::Failed {
                    role,
                    device,
                    error,
                } => (self.notify)(&DaemonNote::ReaddRefused {
                    role,
                    device,
                    why: format!("the re-add failed: {error}"),
                }),
            },
        );
    }

    /// The served array's reshape, to its end or until the daemons stop.
    fn reshape_thread(&self) {
        let a = &self.array;
        (self.notify)(&DaemonNote::ReshapeStarted(
            a.reshaping()
                .map(|p| p.reason())
                .or_else(|| a.reshaping10().map(|p| p.reason()))
                .unwrap_or_default(),
        ));
        a.events.emit(Event::RebuildStarted { role: None });
        let limit = self.opts.sync_limits.max_kib_s;
        let r = crate::restripe::run_served(a, &self.stop, limit, &mut |percent| {
            a.events.emit(Event::Rebuild { percent })
        });
        match r {
            Ok(true) => {
                (self.notify)(&DaemonNote::ReshapeFinished);
                a.events.emit(Event::RebuildFinished { role: None });
            }
            Ok(false) => {}
            Err(e) => (self.notify)(&DaemonNote::ReshapeStopped(e.to_string())),
        }
    }

    fn start_sync(self: &Arc<Self>, kind: SyncKind) {
        // Under the handle's lock, so that a stop either sees this thread or stops it.
        let mut handle = lock(&self.sync_thread);
        if self.stopping() || self.sync_running.swap(true, Ordering::SeqCst) {
            return;
        }
        let s = self.clone();
        let spawned = std::thread::Builder::new()
            .name(kind.name().into())
            .spawn(move || {
                s.sync_thread(kind);
                s.sync_running.store(false, Ordering::SeqCst);
            });
        match spawned {
            Ok(t) => {
                // The previous sync thread has finished (sync_running was false).
                if let Some(old) = handle.replace(t) {
                    let _ = old.join();
                }
            }
            Err(e) => {
                drop(handle);
                (self.notify)(&DaemonNote::SyncStopped {
                    kind,
                    error: format!("cannot start its thread: {e}"),
                });
                self.sync_running.store(false, Ordering::SeqCst);
            }
        }
    }

    fn sync_thread(&self, mut kind: SyncKind) {
        let array = &self.array;
        if kind == SyncKind::Resync {
            (self.notify)(&DaemonNote::ResyncStarted);
        }
        loop {
            let before = array.recovering_roles();
            let mut throttle = Throttle::new(self.opts.sync_limits);
            *lock(&self.marks) = SyncMarks::default();
            let r = array.run_sync(kind, |p| {
                *lock(&self.progress) = Some(*p);
                lock(&self.marks).record(array.clock().now_ms(), p.done_units);
                throttle.pace(array, p);
            });
            *lock(&self.progress) = None;
            let failed = match r {
                Ok(_) if kind == SyncKind::Recovery => {
                    (self.notify)(&DaemonNote::RecoveryFinished);
                    false
                }
                Ok(mismatches) => {
                    (self.notify)(&DaemonNote::SyncFinished { kind, mismatches });
                    false
                }
                Err(_) if self.stopping() => return,
                Err(e) => {
                    (self.notify)(&DaemonNote::SyncStopped {
                        kind,
                        error: e.to_string(),
                    });
                    true
                }
            };
            // A recovery goes on while roles are left to rebuild (a spare may have taken
            // over from a failed target, a replace may have been asked for meanwhile), but
            // not round and round on the same error.
            let left = array.recovering_roles();
            let replacing = !array.replacing_roles().is_empty();
            if kind != SyncKind::Recovery && (replacing || !left.is_empty()) && !failed {
                kind = SyncKind::Recovery;
                continue;
            }
            if kind != SyncKind::Recovery
                || (left.is_empty() && !replacing)
                || (failed && left == before)
                || self.stopping()
            {
                break;
            }
        }
    }
}

#[cfg(test)]
mod marks_tests {
    use super::*;

    /// The speed is over the last ten marks, three seconds apart, not since the start.
    #[test]
    fn marks_cover_the_last_half_minute() {
        let mut m = SyncMarks::default();
        assert_eq!(m.since_oldest(0, 0), None);
        m.record(1000, 0);
        // Steps within a mark's step add no mark.
        m.record(2000, 10);
        assert_eq!(
            m.since_oldest(2500, 10),
            Some(SyncMark {
                elapsed_ms: 1500,
                units: 10
            })
        );
        // A slow first minute, then 100 units a second.
        for s in 1..=20u64 {
            m.record(
                1000 + s * 3000,
                if s <= 10 { s } else { 10 + (s - 10) * 300 },
            );
        }
        assert_eq!(m.0.len(), SYNC_MARKS);
        let mark = m.since_oldest(61_000, 3010).unwrap();
        assert_eq!(
            mark,
            SyncMark {
                elapsed_ms: 27_000,
                units: 2700
            }
        );
    }
}
