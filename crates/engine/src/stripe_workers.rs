//! Stripe workers (md's group_thread_cnt): threads that share stripe handling.
//!
//! A submitter that owns a stripe head puts the stripe's work on the handle list and waits
//! for it; `group_thread_cnt` workers take work from the list. Workers are woken in
//! proportion to pending work (one more awake worker per [`WORK_PER_WORKER`] pending
//! stripes, md's worker_cnt_per_group idea) and sleep when the list is empty; a submission
//! wakes nobody when enough workers are awake or none sleeps. The threads stop when the pool
//! is dropped (the array is dropped, or group_thread_cnt changes).
//!
//! Work borrows from the submitter's stack (its buffers, its stripe head): the submitter
//! blocks until the work has run, which is what makes lending it to another thread sound.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Pending stripes per awake worker before another one is woken.
pub const WORK_PER_WORKER: usize = 2;

type Panic = Box<dyn std::any::Any + Send>;

/// One submitted stripe: the work (a borrowed closure, lifetime erased) and its completion.
struct Job {
    work: *mut (dyn FnMut() + Send + 'static),
    done: Arc<Done>,
}

// SAFETY: the closure is Send, and the submitter keeps it alive and untouched until `done`.
unsafe impl Send for Job {}

#[derive(Default)]
struct Done {
    state: Mutex<Option<Result<(), Panic>>>,
    cv: Condvar,
}

struct Queue {
    jobs: VecDeque<Job>,
    sleeping: usize,
    stop: bool,
}

struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Wake-ups sent, for tests.
    wakeups: AtomicU64,
    threads: usize,
}

pub struct Workers {
    shared: Arc<Shared>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    pub fn new(n: usize) -> Workers {
        assert!(n > 0, "a pool needs a worker");
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue {
                jobs: VecDeque::new(),
                sleeping: 0,
                stop: false,
            }),
            cv: Condvar::new(),
            wakeups: AtomicU64::new(0),
            threads: n,
        });
        let handles = (0..n)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("uraid-stripe-{i}"))
                    .spawn(move || worker(&s))
                    .expect("spawn stripe worker")
            })
            .collect();
        Workers { shared, handles }
    }

    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Run `f` on a worker and wait for it. A panic in `f` is resumed here.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let mut f = Some(f);
        let mut out: Option<R> = None;
        let mut call = || {
            if let Some(f) = f.take() {
                out = Some(f());
            }
        };
        let done = Arc::new(Done::default());
        let dyn_call: &mut (dyn FnMut() + Send + '_) = &mut call;
        // SAFETY: only the lifetime is erased; this function does not return (or unwind)
        // before the worker has finished with the closure (we wait on `done` below, and
        // nothing between here and the wait can panic).
        let work: *mut (dyn FnMut() + Send + 'static) = unsafe { std::mem::transmute(dyn_call) };
        {
            let mut q = self.shared.q.lock().unwrap_or_else(|e| e.into_inner());
            q.jobs.push_back(Job {
                work,
                done: done.clone(),
            });
            let awake = self.shared.threads - q.sleeping;
            if q.sleeping > 0 && (awake == 0 || q.jobs.len() > awake * WORK_PER_WORKER) {
                self.shared.wakeups.fetch_add(1, Ordering::Relaxed);
                self.shared.cv.notify_one();
            }
        }
        let mut st = done.state.lock().unwrap_or_else(|e| e.into_inner());
        while st.is_none() {
            st = done.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(Err(p)) = st.take() {
            drop(st);
            std::panic::resume_unwind(p);
        }
        drop(st);
        out.expect("stripe work ran")
    }
}

fn worker(s: &Shared) {
    let mut q = s.q.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(job) = q.jobs.pop_front() {
            drop(q);
            // SAFETY: the submitter waits on `done` and keeps the closure alive until then.
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job.work)() }));
            let mut st = job.done.state.lock().unwrap_or_else(|e| e.into_inner());
            *st = Some(r);
            job.done.cv.notify_one();
            drop(st);
            q = s.q.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        }
        if q.stop {
            return;
        }
        q.sleeping += 1;
        q = s.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        q.sleeping -= 1;
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shared.q.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.shared.cv.notify_all();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_a_worker_with_borrowed_data() {
        let w = Workers::new(2);
        let mut v = vec![1u32, 2, 3];
        let me = std::thread::current().id();
        let (sum, other) = w.run(|| {
            v.push(4);
            (v.iter().sum::<u32>(), std::thread::current().id() != me)
        });
        assert_eq!(sum, 10);
        assert!(other, "work ran on the submitter");
        assert_eq!(v.len(), 4);
    }

    #[test]
    fn many_submitters_all_complete_and_threads_stop_on_drop() {
        let w = Workers::new(3);
        let total = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|sc| {
            for t in 0..16u64 {
                let (w, total) = (&w, &total);
                sc.spawn(move || {
                    for i in 0..200 {
                        let x = w.run(|| t * 1000 + i);
                        total.fetch_add(x, Ordering::Relaxed);
                    }
                });
            }
        });
        let want: u64 = (0..16u64)
            .map(|t| (0..200).map(|i| t * 1000 + i).sum::<u64>())
            .sum();
        assert_eq!(total.load(Ordering::Relaxed), want);
        drop(w);
    }

    #[test]
    fn a_panic_in_work_reaches_the_submitter() {
        let w = Workers::new(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            w.run(|| panic!("boom"));
        }));
        assert!(r.is_err());
        // The worker survived.
        assert_eq!(w.run(|| 5), 5);
    }
}
