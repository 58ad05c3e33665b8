//! A statistics counter that every request adds to ([`crate::Stats`]' requests and member
//! IOs), without a cache line that every CPU writes.
//!
//! One `AtomicU64` that all threads add to moves its cache line from CPU to CPU on every
//! request, a cost that grows with the CPUs doing requests (md keeps such counts per CPU
//! too). Here each CPU adds to its own stripe, one cache line each, and a reader sums the
//! stripes: a read is exact once the adds it should see are done, and a sum taken while
//! adds go on is some value between the counts before and after them, as with one atomic.
//! Only `fetch_add` and `load` exist, with `AtomicU64`'s signatures, so that the counters
//! read as before.

use std::sync::atomic::{AtomicU64, Ordering};

/// Stripes; a power of two. CPUs past it share stripes (CPU n uses stripe n % STRIPES).
const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// A counter summed over per-CPU stripes.
#[derive(Default)]
pub struct Counter {
    stripes: [Stripe; STRIPES],
}

/// The stripe of the CPU this thread runs on now (the kernel's getcpu, a vDSO call); a
/// thread may move meanwhile, which costs only a shared line now and then.
fn stripe() -> usize {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    (cpu.max(0) as usize) % STRIPES
}

impl Counter {
    /// Adds `n`. Unlike `AtomicU64::fetch_add` it returns nothing: the previous total would
    /// need every stripe.
    pub fn fetch_add(&self, n: u64, order: Ordering) {
        self.stripes[stripe()].0.fetch_add(n, order);
    }

    /// The total.
    pub fn load(&self, order: Ordering) -> u64 {
        self.stripes
            .iter()
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(order)))
    }
}

/// How many of something are under way (writes in flight), counted in a [`Counter`]'s
/// stripes: a thread enters on its CPU's stripe and leaves on the same stripe (even if it
/// moved), so no stripe goes below zero and the sum is exact once the threads are out.
#[derive(Default)]
pub(crate) struct InUse(Counter);

impl InUse {
    /// One more under way (SeqCst, as the protocol that reads it needs); returns the stripe
    /// to leave by.
    pub(crate) fn enter(&self) -> usize {
        let i = stripe();
        self.0.stripes[i].0.fetch_add(1, Ordering::SeqCst);
        i
    }

    /// One fewer, on the stripe [`InUse::enter`] gave.
    pub(crate) fn leave(&self, stripe: usize) {
        self.0.stripes[stripe].0.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether any is under way (SeqCst loads of every stripe).
    pub(crate) fn any(&self) -> bool {
        self.0
            .stripes
            .iter()
            .any(|s| s.0.load(Ordering::SeqCst) > 0)
    }

    /// How many are under way: exact while nobody enters or leaves, otherwise a count
    /// that was true at some moment of the read or is off by those entering and leaving
    /// during it.
    pub(crate) fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Writes under way in two generations, so that one can wait for the writes that began
/// before it without waiting for those that begin after (a grace period, as the kernel's
/// SRCU gives): a write enters the current generation and leaves it; [`Generations::wait_for_earlier`]
/// makes the other generation current and waits until the one before is empty.
#[derive(Default)]
pub(crate) struct Generations {
    current: std::sync::atomic::AtomicUsize,
    sets: [InUse; 2],
    /// One waiter at a time: two flips in a row would leave a generation unwatched.
    flip: std::sync::Mutex<()>,
}

/// Where a write entered, to leave by.
#[derive(Clone, Copy)]
pub(crate) struct Entered {
    generation: usize,
    stripe: usize,
}

impl Generations {
    /// One more write under way (SeqCst, as [`InUse::enter`]).
    pub(crate) fn enter(&self) -> Entered {
        let generation = self.current.load(Ordering::SeqCst) & 1;
        Entered {
            generation,
            stripe: self.sets[generation].enter(),
        }
    }

    /// One fewer, where [`Generations::enter`] put it.
    pub(crate) fn leave(&self, e: Entered) {
        self.sets[e.generation].leave(e.stripe);
    }

    /// Whether any write is under way.
    pub(crate) fn any(&self) -> bool {
        self.sets.iter().any(InUse::any)
    }

    /// Waits until every write that entered before this call has left (writes entering
    /// meanwhile are not waited for). A write that loaded the old generation just before
    /// the flip and enters it after the wait saw it empty is not waited for either: it
    /// entered after this call's SeqCst flip, so whatever the caller stored (SeqCst)
    /// before calling is visible to its SeqCst loads after its enter.
    pub(crate) fn wait_for_earlier(&self) {
        let _one = self.flip.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current.fetch_add(1, Ordering::SeqCst) & 1;
        let mut spins = 0u32;
        while self.sets[old].any() {
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            spins = spins.saturating_add(1);
        }
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grace period waits for the writes that entered before it, and not for those
    /// that enter after it.
    #[test]
    fn a_grace_period_waits_for_earlier_writes_only() {
        use std::sync::atomic::AtomicBool;
        let g = Generations::default();
        let done = AtomicBool::new(false);
        let early = g.enter();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                g.wait_for_earlier();
                done.load(Ordering::SeqCst)
            });
            // A write that enters after the flip is not waited for: it stays in while
            // the early one leaves, and the wait must still end.
            while g.current.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            let late = g.enter();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(
                !waiter.is_finished(),
                "the wait ended with an earlier write in"
            );
            done.store(true, Ordering::SeqCst);
            g.leave(early);
            assert!(
                waiter.join().unwrap(),
                "the wait ended before the earlier write left"
            );
            assert!(g.any());
            g.leave(late);
        });
        assert!(!g.any());
    }

    /// Adds from many threads (on whatever CPUs they run) all arrive in the total.
    #[test]
    fn adds_from_many_threads_sum_exactly() {
        let c = Counter::default();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let c = &c;
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        c.fetch_add(1 + (i + t) % 3, Ordering::Relaxed);
                    }
                });
            }
        });
        let want: u64 = (0..8u64)
            .map(|t| (0..10_000u64).map(|i| 1 + (i + t) % 3).sum::<u64>())
            .sum();
        assert_eq!(c.load(Ordering::Relaxed), want);
    }
}
