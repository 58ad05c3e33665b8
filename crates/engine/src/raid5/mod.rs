//! raid4/5/6 IO over chunk-high stripes. The recovery unit is the stripe.
//!
//! Per stripe, holding the stripe's head in the stripe cache ([`crate::stripe_cache`]; a
//! write without journal or PPL holds only the rows it writes):
//! - reads go straight to the data members (waiting first for a write in progress on the
//!   stripe, without holding the head); a piece on a missing member is rebuilt from the
//!   rest of its rows (XOR for one loss, P and Q for two); a piece whose read fails is
//!   rebuilt the same way and written back to the member (read-error repair);
//! - writes are full-stripe (no reads), read-modify-write (old data and parity) or
//!   reconstruct-write (the untouched data), whichever reads fewer member blocks, as md
//!   counts them; a degraded stripe always reconstructs, rebuilding missing blocks first.
//!   Each stripe write is analyse -> plan ([`crate::stripe_plan`], pure) -> execute.
//!
//! Row ranges `[lo, hi)` are byte offsets inside the chunk.
//!
//! The files, by responsibility (md's raid5.c in parts):
//! - this one: the entry points' shared helpers and the level's state, `Conf` (md's
//!   r5conf: stripe cache, stripe workers, journal, write-back, the level's knobs);
//! - `read`: reads, degraded reads, read-error repair;
//! - `write`: stripe writes (full-stripe batches, rmw, rcw), journal and PPL logging, discard;
//! - `ppl`: md's partial parity log (raid5-ppl): logging and recovery;
//! - `sync`: resync, recovery, check and repair of parity;
//! - `stripe`: one stripe's blocks (loading, reconstruction, parity).

mod join;
pub(crate) mod pers;
pub(crate) mod ppl;
mod read;
mod stripe;
mod sync;
mod write;
pub(crate) mod writeback;

pub use join::JoinStats;
pub(crate) use read::read;
pub(crate) use stripe::gen_parity;
#[cfg(test)]
pub(crate) use sync::locate_bad_data;
pub(crate) use sync::sync_range;
pub(crate) use write::{write, write_pieces_locked, zero, Log};

use crate::array::{no_redundancy, Array};
use crate::error::ArrayError;
use crate::journal::{Journal, LogTicket};
use crate::raid5::writeback::WriteBack;
use crate::stripe_workers::Workers;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::RwLock;
use uraid_core::geometry::{ParityGeometry, StripeMap};
use uraid_core::{MemberIdx, SECTOR_BYTES};

/// raid4/5/6's stripe cache: cached heads keep the journal's handles of their records.
pub(crate) type StripeCache = crate::stripe_cache::StripeCache<LogTicket>;
/// A head of it.
pub(crate) type StripeHead<'a> = crate::stripe_cache::StripeHead<'a, LogTicket>;

/// raid4/5/6's run-time knobs (md's sysfs tunables of the same names, but
/// `sync_batch_bytes`), in the level's conf: no other level reads them. Set them through
/// `Array::set_tunable` (`uraid set`); [`Array::tuning`] shows them.
pub struct Tuning {
    /// Write runs of full stripes in one pass, with merged member IOs.
    pub batching: AtomicBool,
    /// md's rmw_level: 0 = never read-modify-write (always reconstruct-write), 1 = when it
    /// reads fewer blocks (md's default), 2 = also when it reads as many.
    pub rmw_level: AtomicU8,
    /// Member bytes per batched sync pass: each pass reads every member once and writes
    /// once, overlapped with the next pass's reads.
    pub sync_batch_bytes: AtomicUsize,
    /// Threads that run batched sync passes side by side (uraid's own; md's sync has its
    /// stripe state machine and async parity engines for the same overlap): one pass's
    /// parity is computed while another's member IO runs. 1 runs every pass on the sync's
    /// own thread. Default: 2 where the machine has two CPUs or more.
    pub sync_threads: AtomicUsize,
    /// md's skip_copy: write straight from the caller's buffer instead of copying the new
    /// data into the stripe's buffers first. On by default (md's default is off): a write
    /// borrows its buffer as `&[u8]`, which nobody can change during the call, and uraid's
    /// exports hand it buffers they own. Off is for callers that share the buffer with
    /// another process or the kernel: then a change during the write cannot make data and
    /// parity disagree.
    pub skip_copy: AtomicBool,
    /// Microseconds a partial-stripe write of at least 64 KiB (or a chunk) waits, holding
    /// no stripe head, for concurrent writes that fill the rest of its stripe, so that the
    /// stripe goes out whole without reads (md's delayed stripes; `raid5::join`); it waits less
    /// once the stripe is covered or when nobody else could come. A piece of a
    /// sequential stream whose stripes have been joining lately waits up to 8 times this
    /// (`SEQUENTIAL_JOIN_WAITS`): the rest of its stripe is the stream's next or previous
    /// write, which may still be on its way in or not yet scheduled. 0 turns joining off.
    pub join_wait_us: AtomicU64,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            batching: AtomicBool::new(true),
            rmw_level: AtomicU8::new(1),
            sync_batch_bytes: AtomicUsize::new(1 << 20),
            sync_threads: AtomicUsize::new(crate::in_order::default_sync_threads()),
            skip_copy: AtomicBool::new(true),
            join_wait_us: AtomicU64::new(DEFAULT_JOIN_WAIT_US),
        }
    }
}

/// `join_wait_us`'s default.
pub const DEFAULT_JOIN_WAIT_US: u64 = 500;
/// How many `join_wait_us` a leading piece of a joining sequential stream waits (any
/// piece: its stream's writes reach the array in any order, behind a scheduler that runs
/// more threads than CPUs). Measured (docs/PERFORMANCE.md, "Joining"): 1 MiB sequential writes at QD8 over
/// NBD into a raid5 of 4 with 512 KiB chunks (1.5 MiB stripes) went out whole for 45% of
/// the stripes with 500 us and 92% with 2 ms: a 1 MiB payload is read off the socket
/// before its request starts, so the next write arrives a payload's copy later.
pub const SEQUENTIAL_JOIN_WAITS: u64 = 8;
/// `join_wait_us`'s largest value (10 s: more is never useful; tests use long waits so that
/// they do not depend on timing).
pub const MAX_JOIN_WAIT_US: u64 = 10_000_000;

/// What only a raid4/5/6 array holds (md's r5conf). The array keeps one, for the parity
/// levels only; the level's code reaches its state through it.
pub(crate) struct Conf {
    /// Stripe ownership and buffers (md's stripe cache).
    pub(crate) stripe_cache: StripeCache,
    /// Stripe workers (md's group_thread_cnt); None = submitters do the work.
    workers: RwLock<Option<Workers>>,
    /// Workers in `workers`, so that the common case (none) takes no lock.
    group_threads: AtomicUsize,
    /// The write journal (md's raid5-cache).
    pub(crate) journal: Option<Journal>,
    /// The journal's write-back mode and its cache.
    pub(crate) wb: WriteBack,
    /// md's partial parity log (raid5 only; never with a journal). A lock so that the
    /// policy can switch while serving; a stripe write holds a clone of the Arc.
    pub(crate) ppl: RwLock<Option<std::sync::Arc<ppl::Ppl>>>,
    /// The level's run-time knobs.
    pub(crate) tuning: Tuning,
    /// Partial-stripe writes pending for joiners ([`join`]).
    pub(crate) joins: join::Joins,
}

impl Conf {
    pub(crate) fn new() -> Conf {
        Conf {
            stripe_cache: StripeCache::new(
                crate::stripe_cache::DEFAULT_SIZE,
                crate::stripe_cache::PARTITIONS,
            ),
            workers: RwLock::new(None),
            group_threads: AtomicUsize::new(0),
            journal: None,
            wb: WriteBack::default(),
            ppl: RwLock::new(None),
            tuning: Tuning::default(),
            joins: join::Joins::default(),
        }
    }

    /// md's group_thread_cnt: stripe worker threads (0 = each submitter handles its stripes).
    pub(crate) fn group_thread_cnt(&self) -> usize {
        self.workers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |w| w.threads())
    }

    /// Set group_thread_cnt (checked by the caller): the old workers finish what they hold
    /// and stop.
    pub(crate) fn set_group_thread_cnt(&self, n: usize) {
        let new = (n > 0).then(|| Workers::new(n));
        let old = {
            let mut w = self.workers.write().unwrap_or_else(|e| e.into_inner());
            self.group_threads.store(n, Ordering::SeqCst);
            std::mem::replace(&mut *w, new)
        };
        drop(old);
    }

    /// Pages that write-back holds in cached heads (none without write-back).
    pub(crate) fn cached_pages(&self) -> usize {
        self.stripe_cache.cached_pages()
    }

    /// Run one stripe's work: on a stripe worker if there are any, else here.
    pub(crate) fn run_stripe<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if self.group_threads.load(Ordering::Relaxed) == 0 {
            return f();
        }
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        match w.as_ref() {
            Some(w) => w.run(f),
            None => {
                drop(w);
                f()
            }
        }
    }
}

impl Default for Conf {
    fn default() -> Conf {
        Conf::new()
    }
}

pub(super) enum Outcome {
    Done,
    /// Reads failed on these members: redo the stripe treating them as missing.
    Retry(Vec<MemberIdx>),
}

pub(super) fn chunk_bytes(g: &ParityGeometry) -> usize {
    (g.chunk_sectors * SECTOR_BYTES) as usize
}

pub(super) fn sectors(bytes: usize) -> u64 {
    bytes as u64 / SECTOR_BYTES
}

/// The stripe's roles: its data chunks in order, then P, then Q (raid6). An iterator, not
/// a list: it is walked on every request, and building a list cost two allocations.
pub(super) fn stripe_roles(map: &StripeMap) -> impl Iterator<Item = MemberIdx> + '_ {
    map.data.iter().copied().chain([map.p]).chain(map.q)
}

/// Roles of the stripe that cannot be read for it: missing, faulty, recovering above their
/// cursor, or excluded after a read error.
pub(super) fn lost_roles(
    a: &Array,
    map: &StripeMap,
    stripe: u64,
    exclude: &[MemberIdx],
) -> Vec<MemberIdx> {
    stripe_roles(map)
        .filter(|r| exclude.contains(r) || !a.slot(*r).is_usable(stripe))
        .collect()
}

/// Run a stripe operation, retrying with members whose reads failed treated as missing;
/// afterwards the blocks of those members are repaired by the operation itself (`f` gets the
/// exclude list). If too many members fail, the failed ones are failed for good.
pub(super) fn retrying(
    a: &Array,
    map: &StripeMap,
    stripe: u64,
    g: &ParityGeometry,
    mut f: impl FnMut(&[MemberIdx]) -> Result<Outcome, ArrayError>,
) -> Result<(), ArrayError> {
    let mut exclude: Vec<MemberIdx> = Vec::new();
    // Each retry follows a member that failed meanwhile, so a few are enough; the bound
    // only guards against a bug turning into a hang.
    for _ in 0..4 * a.raid_disks() + 4 {
        match f(&exclude)? {
            Outcome::Done => return Ok(()),
            Outcome::Retry(more) => {
                for r in more {
                    if !exclude.contains(&r) {
                        exclude.push(r);
                    }
                }
                if lost_roles(a, map, stripe, &exclude).len() > g.parity_disks() {
                    for r in &exclude {
                        a.member_error(*r, &std::io::Error::other("unrecoverable read error"));
                    }
                    return Err(no_redundancy(a, "read"));
                }
            }
        }
    }
    Err(ArrayError::Failed(format!(
        "stripe {stripe}: members kept changing state; giving up"
    )))
}
