//! md's raid1 resync barrier, bucketed by region (raid1.c's wait_barrier / raise_barrier,
//! since the "bucket" rework), for raid1 and raid10.
//!
//! Normal IO and sync work (resync, recovery, check, repair) on the same region must not
//! overlap: sync reads every copy and rewrites some, and moves a recovering member's cursor,
//! which must never happen under a request that has already chosen its copies. Instead of a
//! mutex per region, each of [`BARRIER_BUCKETS`] hashed buckets has three counters:
//!
//! - `nr_pending`: requests inside the bucket,
//! - `nr_waiting`: requests parked because a barrier is up,
//! - `barrier`: sync passes working in the bucket.
//!
//! A request increments `nr_pending` and, if no barrier is up, goes on: one atomic add and
//! one load, no lock. Sync raises the barrier and waits for `nr_pending` to drain; a request
//! that then arrives backs out and parks until the barrier is lowered. Waking needs the one
//! shared wait queue (Mutex + Condvar), and is skipped unless someone sleeps on it
//! (`sleepers`), which is what made md's raid1 scale with many submitters.
//!
//! Memory ordering: the fast path is a Dekker pair. A request does `nr_pending += 1` then
//! reads `barrier`; sync does `barrier += 1` then reads `nr_pending`. Both sides use SeqCst,
//! so in the single total order at least one of them sees the other's store: either the
//! request sees the barrier and backs out, or sync sees the request pending and waits for
//! it. (md uses smp_mb__after_atomic on both sides for the same reason.) Wake-ups are the
//! same pattern: a sleeper increments `sleepers` then re-checks its condition, under the
//! queue mutex; a waker changes the counters then reads `sleepers`, all SeqCst, and only
//! takes the mutex and notifies when it is non-zero. Either the waker sees the sleeper, or
//! the sleeper's re-check sees the change; and since the sleeper holds the mutex from its
//! re-check until it waits, a notify under the mutex cannot slip in between.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Number of barrier buckets (md: BARRIER_BUCKETS_NR, 1024 on 4 KiB pages).
pub(crate) const BARRIER_BUCKETS: usize = 1024;

/// One bucket, on its own cache line so that submitters in different buckets do not share
/// lines.
#[repr(align(64))]
#[derive(Default)]
struct Bucket {
    nr_pending: AtomicU32,
    nr_waiting: AtomicU32,
    barrier: AtomicU32,
}

pub(crate) struct Barriers {
    buckets: Box<[Bucket]>,
    /// Threads asleep on `wait` (requests parked on a barrier, sync waiting for a drain).
    sleepers: AtomicU32,
    lock: Mutex<()>,
    wait: Condvar,
}

impl Default for Barriers {
    fn default() -> Barriers {
        Barriers {
            buckets: (0..BARRIER_BUCKETS).map(|_| Bucket::default()).collect(),
            sleepers: AtomicU32::new(0),
            lock: Mutex::new(()),
            wait: Condvar::new(),
        }
    }
}

/// A request inside a bucket (md's nr_pending reference); leaving wakes sync if it waits.
#[must_use]
pub(crate) struct Pending<'a> {
    b: &'a Barriers,
    idx: usize,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.b.buckets[self.idx].nr_pending.fetch_sub(1, SeqCst);
        self.b.wake();
    }
}

/// A raised barrier (sync owns the bucket); lowering wakes parked requests if any.
#[must_use]
pub(crate) struct Raised<'a> {
    b: &'a Barriers,
    idx: usize,
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.b.buckets[self.idx].barrier.fetch_sub(1, SeqCst);
        self.b.wake();
    }
}

/// Fibonacci hashing, so that neighbouring regions land in different buckets.
pub(crate) fn bucket_of(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) as usize % BARRIER_BUCKETS
}

impl Barriers {
    /// Enter the bucket of region `key` for normal IO (md's wait_barrier).
    pub(crate) fn wait_barrier(&self, key: u64) -> Pending<'_> {
        let idx = bucket_of(key);
        let bk = &self.buckets[idx];
        // Dekker with raise(): see the module comment.
        bk.nr_pending.fetch_add(1, SeqCst);
        if bk.barrier.load(SeqCst) == 0 {
            return Pending { b: self, idx };
        }
        // Slow path: back out (sync may be waiting for us to drain), park until the
        // barrier is lowered, then re-enter under the queue lock so that raise(), which
        // bumps the barrier under the same lock, sees a consistent pair.
        let mut g = self.lock.lock().unwrap();
        bk.nr_waiting.fetch_add(1, SeqCst);
        bk.nr_pending.fetch_sub(1, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            self.wait.notify_all();
        }
        g = self.sleep_until(g, || bk.barrier.load(SeqCst) == 0);
        bk.nr_pending.fetch_add(1, SeqCst);
        bk.nr_waiting.fetch_sub(1, SeqCst);
        // A second sync pass on this bucket may be waiting for the parked requests to go.
        if self.sleepers.load(SeqCst) > 0 {
            self.wait.notify_all();
        }
        drop(g);
        Pending { b: self, idx }
    }

    /// Raise the barrier of region `key` and wait until no request is inside its bucket
    /// (md's raise_barrier). Requests already parked there go first, as md lets them, so
    /// that a long sync pass cannot starve IO on one region.
    pub(crate) fn raise(&self, key: u64) -> Raised<'_> {
        let idx = bucket_of(key);
        let bk = &self.buckets[idx];
        let mut g = self.lock.lock().unwrap();
        g = self.sleep_until(g, || bk.nr_waiting.load(SeqCst) == 0);
        bk.barrier.fetch_add(1, SeqCst);
        g = self.sleep_until(g, || bk.nr_pending.load(SeqCst) == 0);
        drop(g);
        Raised { b: self, idx }
    }

    /// Sleep on the queue until `cond` holds; `sleepers` counts us while we may sleep.
    fn sleep_until<'g>(
        &self,
        mut g: MutexGuard<'g, ()>,
        cond: impl Fn() -> bool,
    ) -> MutexGuard<'g, ()> {
        loop {
            self.sleepers.fetch_add(1, SeqCst);
            if cond() {
                self.sleepers.fetch_sub(1, SeqCst);
                return g;
            }
            g = self.wait.wait(g).unwrap();
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }

    /// Wake the queue, only if someone may sleep on it (the caller has already changed a
    /// counter with SeqCst; see the module comment).
    fn wake(&self) {
        if self.sleepers.load(SeqCst) > 0 {
            let _g = self.lock.lock().unwrap();
            self.wait.notify_all();
        }
    }

    #[cfg(test)]
    fn counts(&self, key: u64) -> (u32, u32, u32) {
        let bk = &self.buckets[bucket_of(key)];
        (
            bk.nr_pending.load(SeqCst),
            bk.nr_waiting.load(SeqCst),
            bk.barrier.load(SeqCst),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64};

    #[test]
    fn requests_count_and_release() {
        let b = Barriers::default();
        let p1 = b.wait_barrier(5);
        let p2 = b.wait_barrier(5);
        assert_eq!(b.counts(5), (2, 0, 0));
        drop(p1);
        drop(p2);
        assert_eq!(b.counts(5), (0, 0, 0));
        let r = b.raise(5);
        assert_eq!(b.counts(5), (0, 0, 1));
        // Another bucket is not affected.
        let other = (0..).find(|k| bucket_of(*k) != bucket_of(5)).unwrap();
        drop(b.wait_barrier(other));
        drop(r);
        assert_eq!(b.counts(5), (0, 0, 0));
    }

    #[test]
    fn a_raised_barrier_holds_requests_and_waits_for_pending() {
        let b = Barriers::default();
        let entered = AtomicBool::new(false);
        let raised = AtomicBool::new(false);
        std::thread::scope(|s| {
            let p = b.wait_barrier(7);
            s.spawn(|| {
                let _r = b.raise(7);
                raised.store(true, SeqCst);
                // Hold it until a request has parked.
                while b.counts(7).1 == 0 {
                    std::thread::yield_now();
                }
                assert!(!entered.load(SeqCst), "a request entered under the barrier");
            });
            // The sync thread cannot raise while we are pending.
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!raised.load(SeqCst), "raised while a request was pending");
            drop(p);
            while !raised.load(SeqCst) {
                std::thread::yield_now();
            }
            let _p = b.wait_barrier(7);
            entered.store(true, SeqCst);
        });
        assert_eq!(b.counts(7), (0, 0, 0));
    }

    /// Seeded stress: many requests and sync passes on a few buckets; a shared "owner"
    /// word per key catches a request and a sync inside one bucket at once, and the run
    /// must finish (no lost wake-up). `URAID_FULL=1` runs longer.
    #[test]
    fn stress_requests_never_overlap_sync() {
        let seed: u64 = std::env::var("URAID_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::random::<u32>() as u64);
        let rounds = if std::env::var("URAID_FULL").is_ok() {
            20_000
        } else {
            2_000
        };
        let b = Barriers::default();
        const KEYS: u64 = 3;
        // Per key: requests inside (low 32 bits), syncs inside (high 32 bits).
        let inside: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::thread::scope(|s| {
                for t in 0..6u64 {
                    let (b, inside) = (&b, &inside);
                    s.spawn(move || {
                        let mut x = seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        for _ in 0..rounds {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let key = x % KEYS;
                            let sync = t < 2;
                            if sync {
                                let _r = b.raise(key);
                                let v = inside[key as usize].fetch_add(1 << 32, SeqCst);
                                assert_eq!(v & 0xffff_ffff, 0, "sync entered over requests");
                                std::hint::spin_loop();
                                inside[key as usize].fetch_sub(1 << 32, SeqCst);
                            } else {
                                let _p = b.wait_barrier(key);
                                let v = inside[key as usize].fetch_add(1, SeqCst);
                                assert_eq!(v >> 32, 0, "request entered under sync");
                                std::hint::spin_loop();
                                inside[key as usize].fetch_sub(1, SeqCst);
                            }
                        }
                    });
                }
            })
        }));
        assert!(
            res.is_ok(),
            "barrier stress failed (replay: URAID_SEED={seed})"
        );
        for k in 0..KEYS {
            assert_eq!(b.counts(k), (0, 0, 0));
        }
    }
}
