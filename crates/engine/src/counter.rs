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

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
