//! The engine's one clock.
//!
//! Every time-dependent policy of an array reads the clock it was created or assembled
//! with ([`crate::CreateOptions::clock`], [`crate::AssembleOptions::clock`]): safe mode's
//! idle delay, the bitmap daemon's period, the age of write-back stripes, resync
//! throttling, read-error decay, and the superblock's ctime and utime. The default is the
//! system's; tests and the simulator give a [`ManualClock`], whose time moves only when
//! they move it, so a policy that waits is tested without waiting.
//!
//! Two readings, as the kernel has two: monotonic milliseconds for intervals (never
//! jumps back when the wall clock is set) and wall seconds for what is recorded on disk
//! or compared across runs (md's utime, read-error decay).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a clock must tell. Implement it to drive an array's time from elsewhere (a
/// simulator); [`SystemClock`] and [`ManualClock`] are the two the engine ships.
pub trait ClockSource: Send + Sync {
    /// Monotonic milliseconds from an arbitrary start.
    fn now_ms(&self) -> u64;
    /// Seconds since the Unix epoch.
    fn wall_secs(&self) -> u64;
    /// Let `d` pass: the system clock sleeps, a manual clock moves its time on by `d`
    /// (resync throttling then costs no real time).
    fn sleep(&self, d: Duration);
}

/// A shared handle on a [`ClockSource`]; cheap to clone. `Default` is the system clock.
#[derive(Clone)]
pub struct Clock(Arc<dyn ClockSource>);

impl Clock {
    /// The system's clocks (`Instant` and `SystemTime`).
    pub fn system() -> Clock {
        Clock(Arc::new(SystemClock))
    }

    /// A clock that reads `source`.
    pub fn from_source(source: Arc<dyn ClockSource>) -> Clock {
        Clock(source)
    }

    /// Monotonic milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }

    /// Seconds since the Unix epoch.
    pub fn wall_secs(&self) -> u64 {
        self.0.wall_secs()
    }

    /// Let `d` pass (see [`ClockSource::sleep`]).
    pub fn sleep(&self, d: Duration) {
        self.0.sleep(d)
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Clock(now_ms={})", self.now_ms())
    }
}

impl From<ManualClock> for Clock {
    fn from(m: ManualClock) -> Clock {
        Clock(Arc::new(m))
    }
}

/// The system's time: `Instant` for intervals, `SystemTime` for wall seconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl ClockSource for SystemClock {
    fn now_ms(&self) -> u64 {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_millis() as u64
    }

    fn wall_secs(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// A virtual clock for tests and the simulator: its time moves only through
/// [`ManualClock::advance`] (or a [`ClockSource::sleep`] on it). Clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<ManualInner>);

#[derive(Debug)]
struct ManualInner {
    ms: AtomicU64,
    wall_base_secs: u64,
}

impl ManualClock {
    /// A clock at monotonic 0 ms whose wall time is `wall_secs` then.
    pub fn new(wall_secs: u64) -> ManualClock {
        ManualClock(Arc::new(ManualInner {
            ms: AtomicU64::new(0),
            wall_base_secs: wall_secs,
        }))
    }

    /// Move time on by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.ms.fetch_add(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// The clock as the engine takes it.
    pub fn clock(&self) -> Clock {
        self.clone().into()
    }
}

impl ClockSource for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.ms.load(Ordering::SeqCst)
    }

    fn wall_secs(&self) -> u64 {
        self.0.wall_base_secs + self.now_ms() / 1000
    }

    fn sleep(&self, d: Duration) {
        self.advance(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_moved() {
        let m = ManualClock::new(1_000);
        let c = m.clock();
        assert_eq!((c.now_ms(), c.wall_secs()), (0, 1_000));
        m.advance(Duration::from_millis(2_500));
        assert_eq!((c.now_ms(), c.wall_secs()), (2_500, 1_002));
        c.sleep(Duration::from_millis(500));
        assert_eq!((m.now_ms(), m.wall_secs()), (3_000, 1_003));
    }

    #[test]
    fn system_clock_is_monotonic_and_near_the_wall() {
        let c = Clock::system();
        let a = c.now_ms();
        let b = c.now_ms();
        assert!(b >= a);
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(c.wall_secs().abs_diff(wall) <= 1);
    }
}
