//! The ublk export: `/dev/ublkbN` backed by the array, through the `libublk` crate.
//!
//! **Many requests in flight.** The kernel hands each queue's requests to one thread of ours
//! over io_uring. That thread takes the tag's buffer, hands the request to a pool of worker
//! threads ([`Pool`]) and goes back to its ring, so a request waiting on its members does not
//! hold the queue. A worker runs it on the array (which is synchronous: `Array::read`/`write`
//! block the calling thread), puts the tag, its buffer and the result on the queue's
//! completion list and writes the queue's eventfd; the queue's ring has a poll on that
//! eventfd, wakes, and commits every finished tag (COMMIT_AND_FETCH) with the byte count or
//! `-errno`. A tag's buffer is owned by exactly one side at a time, so it lives until its
//! request completes. Queues, depth and workers follow the machine's CPUs.
//!
//! While requests run without sleeping (members in memory, a ramdisk, the page cache:
//! [`Pace`]), the queue thread runs reads and writes itself instead and commits them at once,
//! as md runs a request in the task that submits it: the hand-over to a worker and back then
//! costs more than the request.
//!
//! No zero-copy or user-copy: the engine does its member IO on its own threads (and rings),
//! not on the ublk queue's ring, so the kernel's zero-copy (a fixed buffer of the request,
//! usable only by IO issued on the queue's ring) cannot reach it, and user-copy only moves
//! the one copy we have from the kernel into a `pread` of ours.
//!
//! **Restart without losing IO.** Every device is added with `UBLK_F_USER_RECOVERY` and
//! `UBLK_F_USER_RECOVERY_REISSUE`: when this process dies (SIGKILL, crash) the kernel keeps
//! `/dev/ublkbN`, holds new requests and requeues the ones we had been given. `uraid serve
//! --recover --ublk-id N` assembles the array again (unclean: the bitmap or a full resync as
//! usual), checks that device N is this array's (its size, read-only flag, and the array UUID
//! kept in libublk's json under /run/ublksrvd), then START_USER_RECOVERY, new queues, and
//! END_USER_RECOVERY: the held requests are served. Reissuing is safe because a block write
//! may be repeated (the array is unclean until the resync, as after any crash). `uraid stop
//! --keep-ublk` is the same hand-over without the crash ([`UblkExport::hand_over`]): the pool
//! lets its running requests finish, holds every later one unanswered, the array is stopped
//! clean, and the process exits leaving the device to `--recover`.
//!
//! **Read-only.** With `serve --readonly` the device gets `UBLK_ATTR_READ_ONLY`: the kernel
//! refuses writes (EROFS/EPERM) before they reach us; a write that reached us anyway fails
//! with EROFS.
//!
//! Teardown: `kill_dev` from another handle stops the queues; `run_target` returns and
//! deleting the control handle removes the device.
//!
//! Built only with the `ublk` cargo feature (libublk generates its kernel bindings with
//! bindgen, which needs libclang at build time); without it `--ublk` says so.

use anyhow::Result;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use uraid_engine::nbd::{RequestObserver, RequestOp};
use uraid_engine::{Array, ArrayCell};

/// What to tell the user when the kernel has no ublk.
pub const NO_UBLK_DRIVER: &str =
    "this kernel has no ublk driver (CONFIG_BLK_DEV_UBLK; try `modprobe ublk_drv`): \
     /dev/ublk-control is missing; use --nbd";

/// How `serve` wants its ublk device.
#[derive(Clone, Debug, Default)]
pub struct UblkOptions {
    /// Mark the device read-only (`UBLK_ATTR_READ_ONLY`).
    pub readonly: bool,
    /// The device id to add (or, with `recover`, to take over); the kernel picks one if none.
    pub id: Option<u32>,
    /// Take over device `id`, left by a server that died, instead of adding one.
    pub recover: bool,
    /// Take over device `id` if it is there (else add it): `--recover=auto`.
    pub recover_if_kept: bool,
}

/// One request as the kernel described it (the fields of `ublksrv_io_desc` we use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "ublk"), allow(dead_code))]
pub struct Req {
    /// `UBLK_IO_OP_*`.
    pub op: u32,
    /// `UBLK_IO_F_*`.
    pub flags: u32,
    /// Byte offset in the device.
    pub offset: u64,
    /// Bytes.
    pub len: usize,
}

/// What a worker hands back to its queue: the tag, its buffer, and the result for the kernel.
type Finished<B> = (u16, B, i32);

/// One queue's finished requests, and the eventfd that wakes the queue's ring for them.
pub struct Completions<B> {
    list: Mutex<Vec<Finished<B>>>,
    efd: std::os::fd::OwnedFd,
}

impl<B> Completions<B> {
    /// A list with a fresh non-blocking eventfd.
    pub fn new() -> std::io::Result<Completions<B>> {
        use std::os::fd::FromRawFd;
        // SAFETY: eventfd returns a new descriptor we own, or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Completions {
            list: Mutex::new(Vec::new()),
            // SAFETY: fd is ours and open.
            efd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The eventfd the queue polls.
    #[cfg_attr(not(feature = "ublk"), allow(dead_code))]
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.efd.as_raw_fd()
    }

    fn push(&self, done: Finished<B>) {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(done);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. It cannot fail short of
        // the counter overflowing (2^64 - 2 wakes unread), which never happens.
        unsafe { libc::write(self.fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Resets the eventfd, then takes what is finished: a worker finishing after the reset
    /// writes the eventfd again, so nothing waits unseen.
    pub fn take(&self) -> Vec<Finished<B>> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN (nothing written) is fine.
        unsafe { libc::read(self.fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        std::mem::take(&mut *self.list.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

struct Job<B> {
    tag: u16,
    req: Req,
    buf: B,
    done: Arc<Completions<B>>,
}

/// Which requests may still run: all of them until a hand-over closes it; then the ones
/// running finish and every later one is held, never run and never answered, so that the
/// kernel reissues it to the next server (`UBLK_F_USER_RECOVERY_REISSUE`).
#[derive(Default)]
struct Admission {
    state: Mutex<(bool, usize)>,
    idle: std::sync::Condvar,
}

impl Admission {
    /// Whether a request may run now (then [`Admission::leave`] follows); false once closed.
    fn enter(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.0 {
            return false;
        }
        st.1 += 1;
        true
    }

    fn leave(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.1 -= 1;
        if st.1 == 0 {
            self.idle.notify_all();
        }
    }

    /// Closes, then waits until no request runs.
    fn close_and_drain(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 = true;
        while st.1 > 0 {
            st = self.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Worker threads that run requests on the (synchronous) array and hand each one back to
/// its queue's [`Completions`].
pub struct Pool<B: Send + 'static> {
    tx: Option<mpsc::Sender<Job<B>>>,
    threads: Vec<JoinHandle<()>>,
    admission: Arc<Admission>,
    run: Arc<Runner<B>>,
    pace: Arc<Pace>,
}

type Runner<B> = dyn Fn(&Req, &mut B) -> i32 + Send + Sync;

/// The ublk ops that move data (`UBLK_IO_OP_READ`, `UBLK_IO_OP_WRITE`; checked against
/// libublk's bindings where those are built): the only ones that may run inline.
const OP_READ: u32 = 0;
const OP_WRITE: u32 = 1;

/// When the queue thread runs a request itself instead of handing it to a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inline {
    /// While requests run without sleeping ([`Pace`]): the default.
    Auto,
    /// Every read and write (measuring only).
    Always,
    /// Never: every request goes to a worker (measuring only).
    Never,
}

impl Inline {
    /// `URAID_UBLK_INLINE` (`auto`, `always`, `never`), for measuring; `auto` if unset.
    pub fn from_env() -> Inline {
        match std::env::var("URAID_UBLK_INLINE").as_deref() {
            Ok("always") => Inline::Always,
            Ok("never") => Inline::Never,
            _ => Inline::Auto,
        }
    }
}

/// How requests have been running lately, as moving averages over about the last 16:
/// their time on the clock and the part of it their thread was not on a CPU (sleeping on a
/// member's IO, a lock or a full queue, or preempted). A request that runs on the CPU from
/// start to end (members in memory, a page cache, a ramdisk) loses nothing by running on the
/// queue thread, and saves the two thread hand-overs of the pool (queue -> worker -> eventfd
/// -> queue); one that sleeps there would hold every other tag of its queue, so it goes to a
/// worker. Requests run inline while they spend less than a third of their time off the CPU
/// and take under 1 ms on average.
/// Updated with relaxed loads and stores: a lost update only shifts an average.
#[derive(Debug)]
pub struct Pace {
    wall_ns: std::sync::atomic::AtomicU64,
    off_cpu_ns: std::sync::atomic::AtomicU64,
    mode: Inline,
}

impl Pace {
    /// Requests that take longer than this on average, sleeping or not, go to the workers:
    /// a queue thread busy that long would hold its other tags.
    pub const WALL_BELOW_NS: u64 = 1_000_000;

    fn new(mode: Inline) -> Pace {
        Pace {
            // Start at the pool: requests prove they do not sleep before any runs inline.
            wall_ns: std::sync::atomic::AtomicU64::new(Self::WALL_BELOW_NS),
            off_cpu_ns: std::sync::atomic::AtomicU64::new(Self::WALL_BELOW_NS),
            mode,
        }
    }

    /// Counts one request that took `wall_ns`, `cpu_ns` of it on its thread's CPU.
    pub fn note(&self, wall_ns: u64, cpu_ns: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let off = wall_ns.saturating_sub(cpu_ns);
        let avg = |a: &std::sync::atomic::AtomicU64, x: u64| {
            let old = a.load(Relaxed);
            a.store(old - old / 16 + x / 16, Relaxed);
        };
        avg(&self.wall_ns, wall_ns.min(1 << 40));
        avg(&self.off_cpu_ns, off.min(1 << 40));
    }

    /// Whether the queue thread should run a request of kind `op` (`UBLK_IO_OP_*`) itself.
    pub fn inline(&self, op: u32) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        // Only reads and writes: a flush or a discard may wait on every member.
        if op != OP_READ && op != OP_WRITE {
            return false;
        }
        match self.mode {
            Inline::Always => true,
            Inline::Never => false,
            Inline::Auto => {
                // Mostly on the CPU: off it less than a third of the time (a thread is also
                // off its CPU when it is preempted, which is no reason to hand over).
                let wall = self.wall_ns.load(Relaxed);
                self.off_cpu_ns.load(Relaxed) * 3 < wall && wall < Self::WALL_BELOW_NS
            }
        }
    }
}

/// The calling thread's CPU time and the clock, in ns.
fn clocks() -> (u64, u64) {
    let read = |id| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: one live timespec; both clocks exist on every Linux.
        unsafe { libc::clock_gettime(id, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    (
        read(libc::CLOCK_MONOTONIC),
        read(libc::CLOCK_THREAD_CPUTIME_ID),
    )
}

/// Runs one request through `run`, timed into `pace`.
fn timed<B>(run: &Runner<B>, pace: &Pace, req: &Req, buf: &mut B) -> i32 {
    let (w0, c0) = clocks();
    let res = run(req, buf);
    let (w1, c1) = clocks();
    pace.note(w1.saturating_sub(w0), c1.saturating_sub(c0));
    res
}

/// A request admitted to run on the queue thread ([`Pool::admit_here`]); leaves on drop.
pub struct Admitted<'a, B: Send + 'static> {
    pool: &'a Pool<B>,
}

impl<B: Send + 'static> Admitted<'_, B> {
    /// Runs the request here, on the calling thread; the result for the kernel.
    pub fn run(&self, req: &Req, buf: &mut B) -> i32 {
        timed(&*self.pool.run, &self.pool.pace, req, buf)
    }
}

impl<B: Send + 'static> Drop for Admitted<'_, B> {
    fn drop(&mut self) {
        self.pool.admission.leave();
    }
}

impl<B: Send + 'static> Pool<B> {
    /// `workers` threads running `run` on each request with its buffer; `run` returns the
    /// result for the kernel (bytes or `-errno`).
    /// `inline` says when a queue thread runs a request itself instead ([`Pool::inline`]).
    pub fn new<F>(workers: usize, inline: Inline, run: F) -> std::io::Result<Pool<B>>
    where
        F: Fn(&Req, &mut B) -> i32 + Send + Sync + 'static,
    {
        let (tx, rx) = mpsc::channel::<Job<B>>();
        let rx = Arc::new(Mutex::new(rx));
        let run: Arc<Runner<B>> = Arc::new(run);
        let pace = Arc::new(Pace::new(inline));
        let admission = Arc::new(Admission::default());
        let mut threads = Vec::new();
        for i in 0..workers.max(1) {
            let rx = rx.clone();
            let run = run.clone();
            let pace = pace.clone();
            let admission = admission.clone();
            let t = std::thread::Builder::new()
                .name(format!("ublk-w{i}"))
                .spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok(mut job) = job else { return };
                    if !admission.enter() {
                        // Handed over: this request is the next server's. Its buffer stays
                        // untouched (the tag is never committed) until the process exits.
                        std::mem::forget(job);
                        continue;
                    }
                    let res = timed(&*run, &pace, &job.req, &mut job.buf);
                    // Answered before it counts as done: a hand-over waits for the answer
                    // to be queued, so the request is complete or reissued, never half run.
                    job.done.push((job.tag, job.buf, res));
                    admission.leave();
                })?;
            threads.push(t);
        }
        Ok(Pool {
            tx: Some(tx),
            threads,
            admission,
            run,
            pace,
        })
    }

    /// Whether the queue thread should run this request itself (see [`Pace`]).
    pub fn inline(&self, req: &Req) -> bool {
        self.pace.inline(req.op)
    }

    /// Admits a request to run on the calling (queue) thread, as a worker would: `None` once
    /// a hand-over holds the pool (the request is then never run nor answered). Answer it
    /// before dropping what this returns, so that a hand-over waits for the answer.
    pub fn admit_here(&self) -> Option<Admitted<'_, B>> {
        // Not `then_some`: an `Admitted` built and dropped unadmitted would leave.
        if self.admission.enter() {
            Some(Admitted { pool: self })
        } else {
            None
        }
    }

    /// For a hand-over to the next server: lets the running requests finish and holds every
    /// later one unanswered; returns once none runs.
    pub fn hold(&self) {
        self.admission.close_and_drain();
    }

    /// Queues one request; its result comes back on `done`.
    pub fn submit(&self, tag: u16, req: Req, buf: B, done: &Arc<Completions<B>>) {
        let job = Job {
            tag,
            req,
            buf,
            done: done.clone(),
        };
        if let Some(tx) = &self.tx {
            // The workers only stop when the pool is dropped, after every queue.
            let _ = tx.send(job);
        }
    }
}

impl<B: Send + 'static> Drop for Pool<B> {
    fn drop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Queues, requests per queue and worker threads for a machine with `cpus` CPUs: a queue per
/// CPU (at most 8), depth 128, and two workers per CPU (4 to 64). More workers than that
/// measured slower (docs/PERFORMANCE.md: 256 workers on 2 vCPUs served raid1 at a third of the
/// IOPS of 4): on fast members a request is CPU work, and extra threads only add wake-ups.
pub fn sizing(cpus: usize) -> (u16, u16, usize) {
    let queues = cpus.clamp(1, 8) as u16;
    let depth: u16 = 128;
    let workers = (cpus * 2).clamp(4, 64);
    (queues, depth, workers)
}

#[cfg(feature = "ublk")]
mod imp {
    use super::*;
    use anyhow::{anyhow, bail, Context};
    use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
    use libublk::helpers::IoBuf;
    use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
    use libublk::{sys, BufDesc, BufDescList, UblkFlags, UblkIORes};
    use std::time::Duration;
    use uraid_engine::ZeroHow;

    /// Largest read or write the kernel sends us.
    const IO_BUF_BYTES: u32 = 512 * 1024;
    /// Largest discard or write-zeroes range.
    const MAX_RANGE_SECTORS: u32 = 1 << 20;
    /// The target-IO op of the eventfd poll in a queue's ring.
    const EVENTFD_OP: u32 = 1;
    /// Where the array's UUID goes in libublk's json (`target_data`).
    const UUID_KEY: &str = "uraid_uuid";
    const _: () = assert!(OP_READ == sys::UBLK_IO_OP_READ && OP_WRITE == sys::UBLK_IO_OP_WRITE);

    type Buf = IoBuf<u8>;

    pub struct UblkExport {
        dev_id: u32,
        thread: Option<JoinHandle<()>>,
        /// The workers, once the device runs: a hand-over holds them.
        pool: Arc<std::sync::OnceLock<Arc<Pool<Buf>>>>,
    }

    impl UblkExport {
        /// Serve the array in `cell` as a ublk device; `observer` (metrics) hears every
        /// request as the NBD export's does.
        pub fn start(
            cell: Arc<ArrayCell>,
            opts: UblkOptions,
            observer: Option<Arc<dyn RequestObserver>>,
        ) -> Result<UblkExport> {
            if !std::path::Path::new("/dev/ublk-control").exists() {
                bail!("{NO_UBLK_DRIVER}");
            }
            let (tx, rx) = mpsc::channel::<Result<u32, String>>();
            let tx_started = tx.clone();
            let pool = Arc::new(std::sync::OnceLock::new());
            let pool_slot = pool.clone();
            let thread = std::thread::Builder::new()
                .name("ublk".into())
                .spawn(move || {
                    if let Err(e) = run(cell, opts, observer, tx_started, &pool_slot) {
                        let _ = tx.send(Err(format!("{e:#}")));
                    }
                })
                .context("starting the ublk thread")?;
            // A recovery waits up to 30 s for the dead server's device to be quiesced.
            match rx.recv_timeout(Duration::from_secs(90)) {
                Ok(Ok(dev_id)) => Ok(UblkExport {
                    dev_id,
                    thread: Some(thread),
                    pool,
                }),
                Ok(Err(e)) => {
                    let _ = thread.join();
                    bail!("ublk: {e}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = thread.join();
                    bail!("ublk: the device thread stopped before the device started")
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("ublk: the device did not start within 90 s")
                }
            }
        }

        pub fn bdev_path(&self) -> String {
            format!("/dev/ublkb{}", self.dev_id)
        }

        /// Stops the queues (in-flight requests complete first) and deletes the device.
        pub fn stop(mut self) -> Result<()> {
            let ctrl = UblkCtrl::new_simple(self.dev_id as i32)
                .map_err(|e| anyhow!("opening ublk device {}: {e}", self.dev_id))?;
            ctrl.kill_dev()
                .map_err(|e| anyhow!("stopping ublk device {}: {e}", self.dev_id))?;
            if let Some(t) = self.thread.take() {
                t.join().map_err(|_| anyhow!("the ublk thread panicked"))?;
            }
            Ok(())
        }

        /// `uraid stop --keep-ublk`: the requests running finish and are answered, every
        /// later one is held unanswered, and the device is left as it is: when this process
        /// exits the kernel keeps `/dev/ublkbN` and its requests (as after a crash) for
        /// `serve --recover`, which gets the held ones reissued. Returns the device id once
        /// no request runs; the array can then be stopped clean. Nothing of the device is
        /// torn down here or later (no drop): the process is to exit.
        pub fn hand_over(self) -> u32 {
            if let Some(pool) = self.pool.get() {
                pool.hold();
            }
            let id = self.dev_id;
            std::mem::forget(self);
            id
        }
    }

    fn uuid_of(array: &Array) -> String {
        uraid_core::superblock::uuid_string(&array.meta().template().set_uuid)
    }

    /// Refuses to take over device `id` unless a dead server of this array left it.
    fn check_recoverable(ctrl: &UblkCtrl, id: u32, array: &Array, readonly: bool) -> Result<()> {
        let info = ctrl.dev_info();
        if info.flags & sys::UBLK_F_USER_RECOVERY as u64 == 0 {
            bail!(
                "ublk device {id} was not added with user recovery (not by this uraid): \
                 it cannot be taken over; delete it and serve without --recover"
            );
        }
        let pid = info.ublksrv_pid;
        // SAFETY: kill with signal 0 only checks that the process exists.
        if info.state == sys::UBLK_S_DEV_LIVE as u16
            && pid > 0
            && unsafe { libc::kill(pid, 0) } == 0
        {
            bail!(
                "ublk device {id} is still served by process {pid}: stop it (or kill it) \
                 before --recover"
            );
        }
        let mut p = sys::ublk_params::default();
        ctrl.get_params(&mut p)
            .map_err(|e| anyhow!("reading ublk device {id}'s parameters: {e}"))?;
        let size = array.exported_bytes();
        if p.basic.dev_sectors != size >> 9 {
            bail!(
                "ublk device {id} is {} bytes and this array {size}: it served another array; \
                 name the right --ublk-id or the right members",
                p.basic.dev_sectors << 9
            );
        }
        let dev_ro = p.basic.attrs & sys::UBLK_ATTR_READ_ONLY != 0;
        if dev_ro != readonly {
            bail!(
                "ublk device {id} is {}, and the kernel keeps that across a recovery: serve {} \
                 --readonly",
                if dev_ro { "read-only" } else { "read-write" },
                if dev_ro { "with" } else { "without" }
            );
        }
        if let Some(t) = ctrl.get_target_data_from_json() {
            if let Some(u) = t.get(UUID_KEY).and_then(|v| v.as_str()) {
                let mine = uuid_of(array);
                if u != mine {
                    bail!(
                        "ublk device {id} served array {u}, not {mine}: name the right \
                         --ublk-id or the right members"
                    );
                }
            }
        }
        Ok(())
    }

    fn run(
        cell: Arc<ArrayCell>,
        opts: UblkOptions,
        observer: Option<Arc<dyn RequestObserver>>,
        started: mpsc::Sender<Result<u32, String>>,
        pool_slot: &std::sync::OnceLock<Arc<Pool<Buf>>>,
    ) -> Result<()> {
        // The device's size is the array's when it is added; a grow later does not change
        // it (the kernel here has no ublk command for that).
        let array = cell.current();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (nr_queues, depth, workers) = sizing(cpus);
        // For measuring only (docs/PERFORMANCE.md): the pool's size.
        let workers = std::env::var("URAID_UBLK_WORKERS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(workers);
        let id = opts.id.map_or(-1, |i| i as i32);
        let recover = opts.recover
            || (opts.recover_if_kept && std::path::Path::new(&format!("/dev/ublkc{id}")).exists());
        if opts.recover_if_kept {
            eprintln!(
                "uraid: ublk device {id} {}",
                if recover {
                    "is there: taking it over"
                } else {
                    "is not there: adding it"
                }
            );
        }
        let ctrl = if recover {
            let id = opts
                .id
                .context("--recover needs --ublk-id N: the device to take over")?;
            if !std::path::Path::new(&format!("/dev/ublkc{id}")).exists() {
                bail!(
                    "there is no ublk device {id} (/dev/ublkc{id} is missing): nothing to \
                     recover; serve without --recover"
                );
            }
            // The queues and depth are the device's: libublk sizes its tables from what
            // the builder says.
            let info = UblkCtrl::new_simple(id as i32)
                .map_err(|e| anyhow!("opening ublk device {id}: {e}"))?
                .dev_info();
            let ctrl = UblkCtrlBuilder::default()
                .name("uraid")
                .id(id as i32)
                .nr_queues(info.nr_hw_queues)
                .depth(info.queue_depth)
                .io_buf_bytes(info.max_io_buf_bytes)
                .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
                .build()
                .map_err(|e| anyhow!("opening ublk device {id} to recover it: {e}"))?;
            check_recoverable(&ctrl, id, &array, opts.readonly)?;
            ctrl.start_user_recover()
                .map_err(|e| anyhow!("START_USER_RECOVERY on ublk device {id}: {e}"))?;
            ctrl
        } else {
            UblkCtrlBuilder::default()
                .name("uraid")
                .id(id)
                .nr_queues(nr_queues)
                .depth(depth)
                .io_buf_bytes(IO_BUF_BYTES)
                .ctrl_flags((sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE) as u64)
                .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
                .build()
                .map_err(|e| match opts.id {
                    Some(i) => anyhow!("adding ublk device {i}: {e} (is the id taken?)"),
                    None => anyhow!("adding a ublk device: {e} (is ublk_drv loaded?)"),
                })?
        };
        let size = array.exported_bytes();
        let readonly = opts.readonly;
        let uuid = uuid_of(&array);
        let tgt_init = move |dev: &mut UblkDev| {
            dev.set_default_params(size);
            // Room in each queue's ring for every tag's command and the eventfd poll.
            let d = dev.dev_info.queue_depth;
            dev.tgt.sq_depth = d.saturating_mul(2);
            dev.tgt.cq_depth = d.saturating_mul(2);
            let p = &mut dev.tgt.params;
            if readonly {
                p.basic.attrs |= sys::UBLK_ATTR_READ_ONLY;
            }
            p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
            p.discard = sys::ublk_param_discard {
                discard_alignment: 0,
                discard_granularity: 4096,
                // 512 MiB per request keeps every byte count within the i32 result.
                max_discard_sectors: MAX_RANGE_SECTORS,
                max_write_zeroes_sectors: MAX_RANGE_SECTORS,
                max_discard_segments: 1,
                ..Default::default()
            };
            dev.set_target_json(serde_json::json!({ UUID_KEY: uuid }));
            Ok(())
        };
        drop(array);
        let pool = Arc::new(
            Pool::new(
                workers,
                Inline::from_env(),
                move |req: &Req, buf: &mut Buf| {
                    observed(observer.as_deref(), req, || {
                        handle(req, buf.as_mut_slice(), &cell, readonly)
                    })
                },
            )
            .context("starting the ublk workers")?,
        );
        let _ = pool_slot.set(pool.clone());
        let q_pool = pool.clone();
        let q_fn = move |qid: u16, dev: &UblkDev| queue_loop(qid, dev, &q_pool);
        let recovered = recover;
        ctrl.run_target(tgt_init, q_fn, move |ctrl: &UblkCtrl| {
            let _ = started.send(Ok(ctrl.dev_info().dev_id));
        })
        .map_err(|e| anyhow!("running the ublk device: {e}"))?;
        // A device we took over is not ours to delete on drop (libublk deletes only what it
        // added): delete it here, after a clean stop.
        if recovered {
            let _ = ctrl.del_dev();
        }
        drop(pool);
        Ok(())
    }

    /// Arms the poll on the queue's eventfd: one CQE when a worker has finished something.
    fn arm(q: &UblkQueue, fd: std::os::fd::RawFd) {
        let sqe = io_uring::opcode::PollAdd::new(io_uring::types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(UblkIOCtx::build_user_data(0, EVENTFD_OP, 0, true));
        if let Err(e) = q.ublk_submit_sqe_sync(sqe) {
            tracing::error!("ublk queue {}: arming the eventfd poll: {e}", q.get_qid());
        }
    }

    fn queue_loop(qid: u16, dev: &UblkDev, pool: &Pool<Buf>) {
        let done = match Completions::<Buf>::new() {
            Ok(d) => Arc::new(d),
            Err(e) => {
                tracing::error!("ublk queue {qid}: eventfd: {e}");
                return;
            }
        };
        let bufs = dev.alloc_queue_io_bufs();
        let q = match UblkQueue::new(qid, dev)
            .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
        {
            Ok(q) => q,
            Err(e) => {
                tracing::error!("ublk queue {qid}: {e}");
                return;
            }
        };
        // Each tag's buffer: here while the tag waits for a request, with a worker while it
        // runs one.
        let mut slots: Vec<Option<Buf>> = bufs.into_iter().map(Some).collect();
        arm(&q, done.fd());
        q.wait_and_handle_io(move |q: &UblkQueue, tag: u16, io: &UblkIOCtx| {
            if io.is_tgt_io() {
                for (tag, buf, res) in done.take() {
                    if let Err(e) = q.complete_io_cmd_unified(
                        tag,
                        BufDesc::Slice(buf.as_slice()),
                        Ok(UblkIORes::Result(res)),
                    ) {
                        tracing::error!("ublk: completing tag {tag}: {e}");
                    }
                    slots[tag as usize] = Some(buf);
                }
                arm(q, done.fd());
                return;
            }
            let iod = q.get_iod(tag);
            let req = Req {
                op: iod.op_flags & 0xff,
                flags: iod.op_flags,
                offset: iod.start_sector << 9,
                len: (iod.nr_sectors as usize) << 9,
            };
            let Some(mut buf) = slots[tag as usize].take() else {
                tracing::error!("ublk queue {qid}: tag {tag} came twice");
                return;
            };
            if !pool.inline(&req) {
                pool.submit(tag, req, buf, &done);
                return;
            }
            // Run here: requests have not been sleeping (memory-speed members), so the
            // hand-over to a worker and back would cost more than the request.
            let Some(admitted) = pool.admit_here() else {
                // Held for the next server: never answered; the buffer stays with the tag.
                slots[tag as usize] = Some(buf);
                return;
            };
            let res = admitted.run(&req, &mut buf);
            if let Err(e) = q.complete_io_cmd_unified(
                tag,
                BufDesc::Slice(buf.as_slice()),
                Ok(UblkIORes::Result(res)),
            ) {
                tracing::error!("ublk: completing tag {tag}: {e}");
            }
            drop(admitted);
            slots[tag as usize] = Some(buf);
        });
    }

    /// Runs `f`, one request, told to the observer if there is one (metrics).
    fn observed(obs: Option<&dyn RequestObserver>, req: &Req, f: impl FnOnce() -> i32) -> i32 {
        let Some(obs) = obs else {
            return f();
        };
        let Some(op) = request_op(req.op) else {
            return f();
        };
        let start = obs.wants_timing(op).then(std::time::Instant::now);
        let r = f();
        let bytes = if op == RequestOp::Flush {
            0
        } else {
            req.len as u64
        };
        obs.done(op, bytes, r >= 0, start.map(|s| s.elapsed()));
        r
    }

    /// Runs one request; the byte count or `-errno`.
    fn handle(req: &Req, buf: &mut [u8], cell: &ArrayCell, readonly: bool) -> i32 {
        let Req {
            op: raw,
            flags,
            offset,
            len,
        } = *req;
        let Some(op) = request_op(raw) else {
            return -libc::EOPNOTSUPP;
        };
        let fua = flags & sys::UBLK_IO_F_FUA != 0;
        let moves_data = matches!(op, RequestOp::Read | RequestOp::Write);
        if len > buf.len() && moves_data {
            return -libc::EINVAL;
        }
        if readonly && !matches!(op, RequestOp::Read | RequestOp::Flush) {
            return -libc::EROFS;
        }
        // On the array served now, again on its replacement if a grow replaced it.
        let r = cell.run(|array| match op {
            RequestOp::Read => array.read(offset, &mut buf[..len]),
            RequestOp::Write => array.write(offset, &buf[..len]),
            RequestOp::Flush => array.flush(),
            RequestOp::Trim => array.discard(offset, len as u64),
            RequestOp::WriteZeroes => {
                // REQ_NOUNMAP: the blocks stay allocated.
                let unmap = flags & sys::UBLK_IO_F_NOUNMAP == 0;
                array.write_zeroes_with(offset, len as u64, ZeroHow { unmap }, false)
            }
        });
        let r = r.and_then(|()| {
            if fua && !matches!(op, RequestOp::Flush | RequestOp::Read) {
                cell.run(|a| a.flush())
            } else {
                Ok(())
            }
        });
        match r {
            // Reads and writes report their byte count; the kernel ignores it for the rest.
            Ok(()) if moves_data => len as i32,
            Ok(()) => 0,
            Err(e) => {
                tracing::warn!("ublk: op {raw} at byte {offset} failed: {e}");
                -e.errno()
            }
        }
    }

    /// The request kind of a ublk op (`UBLK_IO_OP_*`), `None` for one uraid does not serve.
    fn request_op(op: u32) -> Option<RequestOp> {
        Some(match op {
            sys::UBLK_IO_OP_READ => RequestOp::Read,
            sys::UBLK_IO_OP_WRITE => RequestOp::Write,
            sys::UBLK_IO_OP_FLUSH => RequestOp::Flush,
            sys::UBLK_IO_OP_DISCARD => RequestOp::Trim,
            sys::UBLK_IO_OP_WRITE_ZEROES => RequestOp::WriteZeroes,
            _ => return None,
        })
    }
}

#[cfg(not(feature = "ublk"))]
mod imp {
    use super::*;

    pub struct UblkExport;

    impl UblkExport {
        pub fn start(
            _cell: Arc<ArrayCell>,
            _opts: UblkOptions,
            _observer: Option<Arc<dyn RequestObserver>>,
        ) -> Result<UblkExport> {
            if !std::path::Path::new("/dev/ublk-control").exists() {
                anyhow::bail!("{NO_UBLK_DRIVER}");
            }
            anyhow::bail!(
                "this uraid was built without ublk support (cargo feature `ublk`, which needs \
                 libclang to build); use --nbd"
            )
        }

        pub fn bdev_path(&self) -> String {
            String::new()
        }

        pub fn stop(self) -> Result<()> {
            Ok(())
        }

        pub fn hand_over(self) -> u32 {
            0
        }
    }
}

pub use imp::UblkExport;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Condvar;
    use std::time::Duration;

    /// Waits until `n` requests are inside the handler at once: a queue that runs one
    /// request at a time (or a pool smaller than the queue depth) never gets there.
    struct Gate {
        inside: Mutex<usize>,
        cv: Condvar,
        n: usize,
    }

    impl Gate {
        fn pass(&self) -> bool {
            let mut g = self.inside.lock().unwrap();
            *g += 1;
            self.cv.notify_all();
            // The bound only keeps a broken pool from hanging the test; it decides nothing
            // on a working one, where all n arrive.
            let (g, _) = self
                .cv
                .wait_timeout_while(g, Duration::from_secs(60), |g| *g < self.n)
                .unwrap();
            *g >= self.n
        }
    }

    fn wait_readable(fd: std::os::fd::RawFd) {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, 120_000) };
    }

    /// Issue 18: a queue's requests run at the same time (the queue hands them to the pool
    /// and goes on), and every tag comes back once with its own buffer and result.
    #[test]
    fn pool_runs_a_queue_depth_of_requests_at_once() {
        let depth = 32usize;
        let gate = Arc::new(Gate {
            inside: Mutex::new(0),
            cv: Condvar::new(),
            n: depth,
        });
        let g = gate.clone();
        let pool = Pool::new(depth, Inline::Never, move |req: &Req, buf: &mut Vec<u8>| {
            if !g.pass() {
                return -libc::ETIMEDOUT;
            }
            buf.fill(req.offset as u8);
            req.len as i32
        })
        .unwrap();
        let done = Arc::new(Completions::<Vec<u8>>::new().unwrap());
        for tag in 0..depth as u16 {
            let req = Req {
                op: 0,
                flags: 0,
                offset: tag as u64,
                len: 512 + tag as usize,
            };
            pool.submit(tag, req, vec![0u8; 16], &done);
        }
        let mut got = Vec::new();
        while got.len() < depth {
            wait_readable(done.fd());
            got.extend(done.take());
        }
        got.sort_by_key(|f| f.0);
        for (i, (tag, buf, res)) in got.iter().enumerate() {
            assert_eq!(*tag as usize, i);
            assert_eq!(
                *res,
                512 + i as i32,
                "tag {tag}: not all {depth} ran at once"
            );
            assert!(
                buf.iter().all(|&b| b == i as u8),
                "tag {tag} got another's buffer"
            );
        }
    }

    /// A hand-over (`stop --keep-ublk`): `hold` returns only once the request running has
    /// been answered, and a request after it is never run nor answered (the kernel reissues
    /// it to the next server).
    #[test]
    fn hold_waits_for_running_requests_and_holds_later_ones() {
        let (entered_tx, entered_rx) = mpsc::channel::<u64>();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let ran = Arc::new(Mutex::new(Vec::new()));
        let ran_in = ran.clone();
        let pool = Arc::new(
            Pool::new(2, Inline::Never, move |req: &Req, _buf: &mut Vec<u8>| {
                ran_in.lock().unwrap().push(req.offset);
                entered_tx.send(req.offset).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
                7
            })
            .unwrap(),
        );
        let done = Arc::new(Completions::<Vec<u8>>::new().unwrap());
        let req = |offset| Req {
            op: 0,
            flags: 0,
            offset,
            len: 512,
        };
        pool.submit(1, req(100), vec![0u8; 4], &done);
        assert_eq!(entered_rx.recv().unwrap(), 100);
        let (held_tx, held_rx) = mpsc::channel();
        let p = pool.clone();
        let holder = std::thread::spawn(move || {
            p.hold();
            held_tx.send(()).unwrap();
        });
        // hold cannot return while request 100 runs: it is still unanswered.
        assert!(done.take().is_empty());
        release_tx.send(()).unwrap();
        held_rx.recv().unwrap();
        holder.join().unwrap();
        let answered = done.take();
        assert_eq!(
            answered.len(),
            1,
            "the running request is answered before hold returns"
        );
        assert_eq!((answered[0].0, answered[0].2), (1, 7));
        // After the hold: taken by a worker, never run, never answered.
        pool.submit(2, req(200), vec![0u8; 4], &done);
        drop(Arc::try_unwrap(pool).ok().expect("the only handle")); // joins the workers
        assert_eq!(*ran.lock().unwrap(), vec![100]);
        assert!(
            done.take().is_empty(),
            "a held request must not be answered"
        );
    }

    /// Issue 18: a queue runs requests itself only while they run without sleeping, and
    /// goes back to the workers as soon as they sleep or take long; flushes and discards
    /// always go to a worker.
    #[test]
    fn inline_only_while_requests_do_not_sleep() {
        let p = Pace::new(Inline::Auto);
        assert!(!p.inline(0), "nothing measured yet: the workers");
        // Memory-speed requests: 4 us each, all of it on the CPU (about 100 move the
        // averages from where they start).
        for _ in 0..128 {
            p.note(4_000, 3_900);
        }
        assert!(p.inline(0) && p.inline(1), "reads and writes run inline");
        for op in 2..6 {
            assert!(!p.inline(op), "op {op} may wait on every member: a worker");
        }
        // Preempted now and then (a fifth of the time off the CPU): still inline.
        for _ in 0..64 {
            p.note(5_000, 4_000);
        }
        assert!(p.inline(0));
        // One request that slept 1 ms on a member: back to the workers at once.
        p.note(1_000_000, 4_000);
        assert!(!p.inline(0));
        // Requests on a device with a service time (12 us, 4 us of CPU: a fast NVMe) stay
        // there.
        for _ in 0..64 {
            p.note(12_000, 4_000);
        }
        assert!(!p.inline(0));
        // CPU-bound but long (3 ms of parity work): a worker too.
        for _ in 0..64 {
            p.note(3_000_000, 2_990_000);
        }
        assert!(!p.inline(0));
        // Fast again: inline again.
        for _ in 0..128 {
            p.note(4_000, 3_900);
        }
        assert!(p.inline(0));
        let never = Pace::new(Inline::Never);
        let always = Pace::new(Inline::Always);
        for _ in 0..64 {
            never.note(1_000, 1_000);
        }
        assert!(!never.inline(0) && always.inline(0) && always.inline(1));
        assert!(!always.inline(2), "a flush never runs inline");
    }

    /// A request run on the queue thread counts for a hand-over as a worker's does: `hold`
    /// waits until it is answered and dropped, and after the hold none is admitted.
    #[test]
    fn hold_waits_for_a_request_running_inline() {
        let pool = Arc::new(
            Pool::new(1, Inline::Always, |req: &Req, buf: &mut Vec<u8>| {
                buf.fill(req.offset as u8);
                req.len as i32
            })
            .unwrap(),
        );
        let admitted = pool.admit_here().expect("not held yet");
        let mut buf = vec![0u8; 8];
        let req = Req {
            op: 0,
            flags: 0,
            offset: 9,
            len: 8,
        };
        assert!(pool.inline(&req));
        assert_eq!(admitted.run(&req, &mut buf), 8);
        assert_eq!(buf, vec![9u8; 8]);
        let (held_tx, held_rx) = mpsc::channel();
        let p = pool.clone();
        let holder = std::thread::spawn(move || {
            p.hold();
            held_tx.send(()).unwrap();
        });
        // The bound only keeps a broken hold from passing by accident; a correct one never
        // returns while the request is admitted, whatever the wait.
        assert!(
            held_rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "hold returned while a request ran inline"
        );
        drop(admitted);
        held_rx.recv().unwrap();
        holder.join().unwrap();
        assert!(pool.admit_here().is_none(), "held: nothing more runs");
    }

    /// The sizing keeps more requests in flight than there are queues (the old export ran
    /// exactly one per queue), and never more workers than requests the queues can hold.
    #[test]
    fn sizing_runs_more_requests_than_queues() {
        for cpus in [1, 2, 4, 16, 64, 512] {
            let (q, d, w) = sizing(cpus);
            assert!(q >= 1 && d >= 32);
            assert!(w > q as usize, "{cpus} CPUs: {w} workers for {q} queues");
            assert!(w <= q as usize * d as usize);
        }
    }
}
