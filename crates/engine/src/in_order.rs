//! Work taken in order, done on several threads at once, committed in order: the shape of
//! every sync loop (raid4/5/6 passes in `raid5/sync.rs`, raid1 and raid10 pieces), so that
//! one piece's member IO runs while another's is read, compared or rebuilt, and members
//! whose IO is a copy by the calling thread (memory, the page cache) are copied by every
//! CPU. md gets the same overlap from many sync requests in flight (RESYNC_DEPTH) and
//! from its stripe state machine.
//!
//! The recovery cursor must still move in order, so an item that is done early waits for
//! its turn, holding what it took (stripe heads, a raised barrier). That cannot deadlock
//! as long as an item never waits on a later one: items are taken in order by one thread
//! at a time, and the earliest item not committed waits on nobody.

use crate::error::ArrayError;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

/// The number of sync threads by default: 2 with two CPUs or more (measured in
/// docs/PERFORMANCE.md, "Rebuild passes on two threads"), else 1.
pub(crate) fn default_sync_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// The largest number of sync threads accepted.
pub(crate) const MAX_SYNC_THREADS: usize = 16;

/// A `sync_threads` tunable's value: 1..=[`MAX_SYNC_THREADS`] (every level that has it).
pub(crate) fn parse_sync_threads(value: &str) -> Result<usize, ArrayError> {
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_SYNC_THREADS).contains(&n) => Ok(n),
        _ => Err(ArrayError::Failed(format!(
            "sync_threads is 1..={MAX_SYNC_THREADS}, not {value:?}"
        ))),
    }
}

/// Run items on `threads` threads: this one and `threads - 1` scoped helpers.
///
/// - `take` gives the next item (None when there is none), called by one thread at a time,
///   in item order; it may wait (for a stripe head, a barrier), but only on earlier items
///   or on requests, never on a later item.
/// - `work` runs on the items side by side.
/// - `commit` runs for each item once every earlier item is committed, in the order taken,
///   on whichever thread commits the item before it or finished its own work last.
///
/// A thread whose item is done before its turn does not wait for it: it parks the item
/// (with what the item holds) for the thread that commits the one before, and takes the
/// next, up to [`parked_max`] parked items; only then does it wait. Waiting would leave its
/// CPU idle while the earlier item's IO or copies finish.
///
/// The first error of a `commit` stops every thread before its next item and is returned;
/// items taken meanwhile are dropped without their commit.
pub(crate) fn in_order<I: Send, R: Send>(
    threads: usize,
    take: impl FnMut() -> Option<I> + Send,
    work: impl Fn(&mut I) -> R + Sync,
    commit: impl Fn(I, R) -> Result<(), ArrayError> + Sync,
) -> Result<(), ArrayError> {
    let run = InOrder {
        take: Mutex::new((0, take)),
        turn: Mutex::new(Turn {
            done: 0,
            failed: None,
            waiting: 0,
            parked: VecDeque::new(),
        }),
        moved: Condvar::new(),
        parked_max: parked_max(threads),
    };
    if threads <= 1 {
        run.worker(&work, &commit);
    } else {
        std::thread::scope(|sc| {
            let mut helpers = Vec::new();
            for _ in 1..threads {
                let (run, work, commit) = (&run, &work, &commit);
                helpers.push(sc.spawn(move || run.worker(work, commit)));
            }
            run.worker(&work, &commit);
            for h in helpers {
                if let Err(panic) = h.join() {
                    std::panic::resume_unwind(panic);
                }
            }
        });
    }
    let turn = run.turn.into_inner().unwrap_or_else(|e| e.into_inner());
    match turn.failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Items parked at most with `threads` threads: one per thread besides the one committing,
/// so that what items hold (a pass's buffers, stripe heads, a barrier) stays within twice
/// what the threads work on.
fn parked_max(threads: usize) -> usize {
    threads.saturating_sub(1)
}

struct InOrder<T, I, R> {
    /// The next item's number, and what takes it.
    take: Mutex<(u64, T)>,
    turn: Mutex<Turn<I, R>>,
    /// `turn` changed.
    moved: Condvar,
    parked_max: usize,
}

struct Turn<I, R> {
    /// Items committed (the next to commit).
    done: u64,
    /// The first error; every thread stops at its next item.
    failed: Option<ArrayError>,
    /// Threads waiting on `moved`: a commit wakes them only when there are some (a
    /// notification is a system call even with nobody to wake).
    waiting: usize,
    /// Items done before their turn, by number, in ascending order.
    parked: VecDeque<(u64, I, R)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T, I, R> InOrder<T, I, R> {
    fn worker(&self, work: &impl Fn(&mut I) -> R, commit: &impl Fn(I, R) -> Result<(), ArrayError>)
    where
        T: FnMut() -> Option<I>,
    {
        loop {
            let (n, mut item) = {
                let mut take = lock(&self.take);
                if lock(&self.turn).failed.is_some() {
                    return;
                }
                let Some(item) = (take.1)() else { return };
                take.0 += 1;
                (take.0 - 1, item)
            };
            let r = work(&mut item);
            let mut t = lock(&self.turn);
            if t.done != n && t.failed.is_none() && t.parked.len() < self.parked_max {
                // Ascending: items are parked by the threads in any order.
                let at = t.parked.partition_point(|(m, _, _)| *m < n);
                t.parked.insert(at, (n, item, r));
                continue;
            }
            while t.done != n && t.failed.is_none() {
                t.waiting += 1;
                t = self.moved.wait(t).unwrap_or_else(|e| e.into_inner());
                t.waiting -= 1;
            }
            // Commit this item, then every parked one whose turn that makes.
            let mut next = Some((item, r));
            while let Some((item, r)) = next.take() {
                if t.failed.is_some() {
                    return;
                }
                drop(t);
                // Only the thread whose turn it is moves `done`: no lock held while
                // committing.
                let res = commit(item, r);
                t = lock(&self.turn);
                match res {
                    Ok(()) => t.done += 1,
                    Err(e) => {
                        t.failed.get_or_insert(e);
                    }
                }
                let done = t.done;
                if t.failed.is_none() && t.parked.front().is_some_and(|(m, _, _)| *m == done) {
                    next = t.parked.pop_front().map(|(_, item, r)| (item, r));
                }
            }
            let failed = t.failed.is_some();
            if t.waiting > 0 {
                self.moved.notify_all();
            }
            drop(t);
            if failed {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Items are committed in the order taken, however the work's durations interleave,
    /// and every item is committed once.
    #[test]
    fn commits_in_the_order_taken() {
        for threads in [1, 2, 4] {
            let mut next = 0u32;
            let committed = Mutex::new(Vec::new());
            in_order(
                threads,
                || {
                    next += 1;
                    (next <= 200).then_some(next)
                },
                |i: &mut u32| {
                    // Uneven work, so that later items often finish first.
                    let spin = (*i as u64 * 7919) % 50_000;
                    (0..spin).fold(0u64, |a, x| a.wrapping_add(x * x))
                },
                |i, _| {
                    lock(&committed).push(i);
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(
                committed.into_inner().unwrap(),
                (1..=200).collect::<Vec<_>>(),
                "{threads} threads"
            );
        }
    }

    /// The first commit error stops the threads and is returned; nothing after the failed
    /// item is committed.
    #[test]
    fn the_first_error_stops_every_thread() {
        let mut next = 0u32;
        let committed = AtomicUsize::new(0);
        let e = in_order(
            2,
            || {
                next += 1;
                (next <= 1000).then_some(next)
            },
            |_: &mut u32| (),
            |i, _| {
                if i == 10 {
                    return Err(ArrayError::Failed("item 10".into()));
                }
                assert!(i < 10, "item {i} committed after the failed one");
                committed.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("item 10"));
        assert_eq!(committed.load(Ordering::SeqCst), 9);
    }

    /// A thread whose item is done before its turn parks it and takes the next item: here
    /// item 0's work cannot finish until item 2's work has started, which with two threads
    /// happens only if the thread that did item 1 went on instead of waiting for item 0.
    #[test]
    fn a_thread_done_early_takes_the_next_item() {
        let started = (Mutex::new(false), Condvar::new());
        let stuck = std::sync::atomic::AtomicBool::new(false);
        let mut next = 0u32;
        let committed = Mutex::new(Vec::new());
        in_order(
            2,
            || {
                next += 1;
                (next <= 6).then_some(next - 1)
            },
            |&mut i: &mut u32| {
                let (flag, cv) = &started;
                if i == 2 {
                    *lock(flag) = true;
                    cv.notify_all();
                }
                if i == 0 {
                    let (_flag, waited) = cv
                        .wait_timeout_while(lock(flag), std::time::Duration::from_secs(10), |s| !*s)
                        .unwrap();
                    // Not a panic here: the other thread would wait for item 0 forever.
                    if waited.timed_out() {
                        stuck.store(true, Ordering::SeqCst);
                    }
                }
            },
            |i, _| {
                lock(&committed).push(i);
                Ok(())
            },
        )
        .unwrap();
        assert!(
            !stuck.load(Ordering::SeqCst),
            "item 2 did not start while item 0 worked: the thread done early waited"
        );
        assert_eq!(committed.into_inner().unwrap(), (0..6).collect::<Vec<_>>());
    }
}
