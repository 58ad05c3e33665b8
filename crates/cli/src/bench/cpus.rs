//! How far apart the CPUs are: the round trip of one cache line between the first two CPUs
//! the bench may run on. Under a hypervisor the host may place two vCPUs on cores that
//! share a cache or on cores that do not, and move them; every cache line the engine's
//! threads share costs several times more in the second case. The bench measures it before
//! each point, so that runs compared with each other can be told apart by it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Round trips per measurement, after as many again to warm up.
const TRIPS: u64 = 20_000;
/// A measurement that has not finished by then (a CPU busy with something else) is given up.
const LIMIT: Duration = Duration::from_millis(300);

/// The first two CPUs this process may run on.
fn two_cpus() -> Option<(usize, usize)> {
    // SAFETY: an all-zero cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a cpu_set_t of the size passed; pid 0 is this thread.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return None;
    }
    // SAFETY: every index is below CPU_SETSIZE.
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some((cpus.next()?, cpus.next()?))
}

/// Pin the calling thread to `cpu`.
fn pin(cpu: usize) -> bool {
    // SAFETY: an all-zero cpu_set_t is an empty set; `cpu` is below CPU_SETSIZE (it came
    // from `two_cpus`); pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The line that bounces, alone in its cache line.
#[repr(align(128))]
struct Line(AtomicU64);

/// Nanoseconds for one round trip of a cache line between the first two CPUs (one thread
/// on each writes it in turn), or None with fewer than two CPUs, when a thread cannot be
/// pinned, or when it takes longer than [`LIMIT`].
pub fn round_trip_ns() -> Option<f64> {
    let (a, b) = two_cpus()?;
    let line = Line(AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + LIMIT;
    std::thread::scope(|s| {
        let answerer = s.spawn(|| {
            if !pin(b) {
                stop.store(true, Ordering::Relaxed);
                return;
            }
            for i in 0..2 * TRIPS {
                while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::hint::spin_loop();
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        });
        let asker = s.spawn(|| {
            if !pin(a) {
                stop.store(true, Ordering::Relaxed);
                return None;
            }
            let mut start = Instant::now();
            for i in 0..2 * TRIPS {
                if i == TRIPS {
                    start = Instant::now();
                }
                line.0.store(2 * i + 1, Ordering::Release);
                while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                    if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                        stop.store(true, Ordering::Relaxed);
                        return None;
                    }
                    std::hint::spin_loop();
                }
            }
            Some(start.elapsed().as_nanos() as f64 / TRIPS as f64)
        });
        let ns = asker.join().ok().flatten();
        let _ = answerer.join();
        ns
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With two CPUs the round trip is measured and plausible (a cache line cannot cross
    /// between CPUs in no time, and 300 ms for 20 000 trips would have been given up); with
    /// one there is nothing to measure.
    #[test]
    fn round_trip_is_measured_where_there_are_two_cpus() {
        match two_cpus() {
            Some(_) => {
                let ns = round_trip_ns();
                // A loaded test machine may give up (None); a figure must be sane.
                if let Some(ns) = ns {
                    assert!(ns > 1.0 && ns < 15_000.0, "round trip {ns} ns");
                }
            }
            None => assert_eq!(round_trip_ns(), None),
        }
    }
}
