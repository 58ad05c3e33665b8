//! Quiescing the array: wait until no request is inside, and hold new ones at the door
//! (md's mddev_suspend / the personalities' quiesce), for stop, member changes and, later,
//! reshape.
//!
//! Every request holds an `Active` reference while it runs. The reference is a count in
//! one of `STRIPES` padded counters, picked per thread, so that submitters on different
//! CPUs do not bounce one cache line (md uses a percpu_ref for the same reason). Taking it
//! is one atomic add and one load of the `quiescing` flag; no lock.
//!
//! Ordering (Dekker, SeqCst on both sides): a request adds its reference, then reads
//! `quiescing`; `Quiesce::quiesce` sets `quiescing`, then sums the counters. In the single
//! total order one of them sees the other: the request sees the flag and backs out, or the
//! quiescer counts the request and waits for it. Leaving: a request drops its reference,
//! then reads `quiescing`, and only then takes the quiescer's lock to wake it. Requests held
//! at the door sleep on their own condition variable, and the quiescer on another, so that
//! neither wakes the other needlessly (and neither shares the barrier or stripe queues).

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Reference counters; a power of two.
const STRIPES: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Stripe(AtomicU64);

pub(crate) struct Quiesce {
    refs: [Stripe; STRIPES],
    quiescing: std::sync::atomic::AtomicBool,
    /// Requests asleep at the door.
    held: AtomicU32,
    /// One quiescer at a time; held for as long as its guard lives.
    owner: Mutex<()>,
    /// Where the quiescer waits for the references to drain.
    drain_lock: Mutex<()>,
    drained: Condvar,
    /// Where requests wait for the quiescer to finish.
    door_lock: Mutex<()>,
    door: Condvar,
}

impl Default for Quiesce {
    fn default() -> Quiesce {
        Quiesce {
            refs: Default::default(),
            quiescing: Default::default(),
            held: AtomicU32::new(0),
            owner: Mutex::new(()),
            drain_lock: Mutex::new(()),
            drained: Condvar::new(),
            door_lock: Mutex::new(()),
            door: Condvar::new(),
        }
    }
}

thread_local! {
    /// This thread's stripe (assigned round robin on first use) and how many references it
    /// holds (a thread that holds one must not quiesce: it would wait for itself).
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    static HELD: Cell<u32> = const { Cell::new(0) };
}

fn my_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    STRIPE.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, SeqCst) % STRIPES);
        }
        s.get()
    })
}

/// A request's reference; dropping it may wake the quiescer. Not `Send`: it is counted in
/// its thread's `HELD`, so it must be dropped where it was taken.
#[must_use]
pub(crate) struct Active<'a> {
    q: &'a Quiesce,
    stripe: usize,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.q.refs[self.stripe].0.fetch_sub(1, SeqCst);
        HELD.with(|h| h.set(h.get() - 1));
        if self.q.quiescing.load(SeqCst) {
            let _g = self.q.drain_lock.lock().unwrap();
            self.q.drained.notify_all();
        }
    }
}

/// The array is quiesced while this lives; dropping it lets held requests in.
#[must_use]
pub struct QuiesceGuard<'a> {
    q: &'a Quiesce,
    _owner: MutexGuard<'a, ()>,
}

impl Drop for QuiesceGuard<'_> {
    fn drop(&mut self) {
        self.q.quiescing.store(false, SeqCst);
        // Dekker with enter()'s held += 1 then re-check of the flag.
        if self.q.held.load(SeqCst) > 0 {
            let _g = self.q.door_lock.lock().unwrap();
            self.q.door.notify_all();
        }
    }
}

impl Quiesce {
    /// Take a request reference, waiting while the array is quiesced.
    pub(crate) fn enter(&self) -> Active<'_> {
        let stripe = my_stripe();
        let c = &self.refs[stripe].0;
        loop {
            c.fetch_add(1, SeqCst);
            if !self.quiescing.load(SeqCst) {
                HELD.with(|h| h.set(h.get() + 1));
                return Active {
                    q: self,
                    stripe,
                    _not_send: std::marker::PhantomData,
                };
            }
            // Back out, tell the quiescer, wait at the door.
            c.fetch_sub(1, SeqCst);
            {
                let _g = self.drain_lock.lock().unwrap();
                self.drained.notify_all();
            }
            let mut g = self.door_lock.lock().unwrap();
            self.held.fetch_add(1, SeqCst);
            while self.quiescing.load(SeqCst) {
                g = self.door.wait(g).unwrap();
            }
            self.held.fetch_sub(1, SeqCst);
        }
    }

    /// Stop new requests and wait for those inside to leave.
    ///
    /// Panics if the calling thread holds a request reference (it would wait for itself):
    /// code that runs inside a request, such as failure handling, must not quiesce.
    pub(crate) fn quiesce(&self) -> QuiesceGuard<'_> {
        assert_eq!(
            HELD.with(|h| h.get()),
            0,
            "quiesce called from inside a request"
        );
        let owner = self.owner.lock().unwrap();
        self.quiescing.store(true, SeqCst);
        let mut g = self.drain_lock.lock().unwrap();
        while self.inside() > 0 {
            g = self.drained.wait(g).unwrap();
        }
        drop(g);
        QuiesceGuard {
            q: self,
            _owner: owner,
        }
    }

    /// References held now (exact only while quiescing).
    pub(crate) fn inside(&self) -> u64 {
        // A reference is dropped on the stripe it was taken on, so no counter underflows.
        self.refs.iter().map(|s| s.0.load(SeqCst)).sum()
    }

    #[cfg(test)]
    pub(crate) fn is_quiesced(&self) -> bool {
        self.quiescing.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn quiesce_waits_for_requests_and_holds_new_ones() {
        let q = Quiesce::default();
        let inside = AtomicBool::new(true);
        let quiesced = AtomicBool::new(false);
        std::thread::scope(|s| {
            let a = q.enter();
            s.spawn(|| {
                let _g = q.quiesce();
                assert!(!inside.load(SeqCst), "quiesced with a request inside");
                quiesced.store(true, SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(20));
                quiesced.store(false, SeqCst);
            });
            while !q.is_quiesced() {
                std::thread::yield_now();
            }
            inside.store(false, SeqCst);
            drop(a);
            // A new request waits for the quiescer to finish.
            let _b = q.enter();
            assert!(!quiesced.load(SeqCst), "entered while quiesced");
        });
        assert_eq!(q.inside(), 0);
    }

    #[test]
    #[should_panic(expected = "inside a request")]
    fn quiescing_from_inside_a_request_is_refused() {
        let q = Quiesce::default();
        let _a = q.enter();
        let _g = q.quiesce();
    }
}
