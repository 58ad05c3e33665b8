//! The stripe cache of raid4/5/6 (md's stripe_head pool): who owns a stripe, and the
//! reusable buffers that the owner works in.
//!
//! A write, a degraded read or a sync step on a stripe first takes the stripe's *head*. A
//! head is owned by one thread at a time: taking it is the stripe's lock, and the head brings
//! its buffers along, so a request does not allocate. Heads come from a bounded pool
//! (`stripe_cache_size`, md's default 256) split into [`PARTITIONS`] partitions by stripe
//! hash (md's NR_STRIPE_HASH_LOCKS), each with its own lock, map of active stripes, free list
//! and wait queue, so that requests on different partitions never meet.
//!
//! Waiting, as md's exclusive wake-ups: a thread that finds its stripe owned, or no free head
//! in its partition, queues itself and sleeps. A release hands free heads straight to the
//! queued threads that can use them now (in queue order, those whose stripe nobody owns:
//! usually the one waiting for the stripe just released, or one waiting for any head) and
//! wakes exactly those; with nobody queued (an atomic count says so) it takes no wake-up path
//! at all. A woken thread owns its head already: no re-check, no lost or wasted wake-ups.
//! (A plain condvar with notify_one can wake a thread waiting for another, still busy
//! stripe and so lose the wake-up; and handing over only the released head strands a second
//! waiter while free heads sit idle, which the seeded stress test below caught in an early
//! version.)
//!
//! Size: each partition's quota is its share of `stripe_cache_size`. Under sustained
//! pressure (a partition's getters had to wait for a free head [`GROW_AFTER_WAITS`] times in
//! a row) the quota grows by one head, up to [`GROW_FACTOR`] times the share (md grows its
//! cache when stripes run short); when a partition goes idle (no head active) it drops back
//! to its share, freeing the extra heads (md shrinks back to min_nr_stripes).
//!
//! Row heads: a head may hold only some rows of its stripe ([`StripeCache::get_rows`], byte
//! ranges inside the chunk, the same on every member); heads of one stripe whose rows do not
//! overlap are owned at once, and a head of the whole stripe ([`WHOLE`], what
//! [`StripeCache::get`] takes) excludes every other. A small raid4/5/6 write without a
//! journal or PPL takes its rows only, so writes to other rows of the stripe do not sleep on
//! it; everything else takes whole stripes.
//!
//! ## Head states
//!
//! A head is *free* (on its partition's free list, with buffers, no stripe), *active*
//! (owned by one thread for one stripe: a write, a degraded read, a sync step, a write-out;
//! owning it is the stripe's lock) and, in the journal's write-back mode, *cached*: it keeps
//! the stripe's pages that are acknowledged but not on the members yet until reclaim writes
//! them out (md's r5c caching phase). A cached head stays in the cache whether or not it is
//! active; its pages change only while it is active (through [`StripeHead`]), readers see
//! them at any time. Active heads are bounded by `stripe_cache_size`, cached ones by
//! write-back's page limit (`set_writeback_max_pages`, enforced by reclaim in
//! [`crate::raid5::writeback`]). The pages' flags and their legal transitions: [`head`].

use crate::buf::AlignedBuf;
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::Thread;

pub mod head;
pub(crate) use head::{Cached, CachedHead, IllegalTransition, PageEvent, Released};

/// Hash partitions (md's NR_STRIPE_HASH_LOCKS).
pub const PARTITIONS: usize = 8;
/// md's default stripe_cache_size.
pub const DEFAULT_SIZE: usize = 256;
/// Largest stripe_cache_size accepted (md's limit).
pub const MAX_SIZE: usize = 32768;
/// Smallest: one head per partition (md refuses <= 16 with its 8 partitions; uraid accepts
/// the smallest size that leaves every partition a head, which the stress tests use).
pub const MIN_SIZE: usize = PARTITIONS;
/// A partition may grow to this many times its share under sustained pressure.
pub const GROW_FACTOR: usize = 4;
/// Waits for a free head in a row that count as sustained pressure.
pub const GROW_AFTER_WAITS: u32 = 8;
/// Bytes of buffers a head keeps between owners (beyond that, buffers are freed on release),
/// so that the default cache keeps at most 256 x 64 KiB = 16 MiB.
pub const HEAD_KEEP_BYTES: usize = 64 * 1024;
/// Largest single buffer a head keeps.
const HEAD_KEEP_BUF_BYTES: usize = 16 * 1024;

/// The reusable buffers of a head.
#[derive(Default)]
pub struct HeadBufs {
    bufs: Vec<AlignedBuf>,
}

impl HeadBufs {
    /// A buffer of `len` bytes whose contents are unspecified (the caller overwrites it):
    /// one the head kept, or a new one.
    pub fn take(&mut self, len: usize) -> AlignedBuf {
        match self.bufs.iter().position(|b| b.len() == len) {
            Some(i) => self.bufs.swap_remove(i),
            None => AlignedBuf::scratch(len),
        }
    }

    /// Give a buffer back; the head keeps it if it is small and the head is under its cap.
    pub fn put(&mut self, b: AlignedBuf) {
        if b.len() <= HEAD_KEEP_BUF_BYTES && self.kept_bytes() + b.len() <= HEAD_KEEP_BYTES {
            self.bufs.push(b);
        }
    }

    pub fn kept_bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }
}

struct Waiter {
    stripe: u64,
    rows: Range<usize>,
    id: u64,
    thread: Thread,
}

/// Stripe numbers hash well enough by one multiplication; SipHash would cost more than the
/// rest of a lookup.
#[derive(Default, Clone, Copy)]
struct StripeHasher(u64);

impl std::hash::Hasher for StripeHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ self.0)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

type StripeMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<StripeHasher>>;

/// Slots of the lock-free "maybe active" hint behind [`StripeCache::is_active`].
const HINT_SLOTS: usize = 4096;

/// The rows of a whole stripe: a head that holds them excludes every other head of the stripe.
pub const WHOLE: Range<usize> = 0..usize::MAX;

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

struct PartState {
    /// Owned stripes, with the rows each of their heads holds (one entry per head; inline
    /// for two, so that owning a stripe allocates nothing under the partition's lock).
    active: StripeMap<SmallVec<[Range<usize>; 2]>>,
    free: Vec<HeadBufs>,
    /// Heads of this partition: active + free.
    heads: usize,
    /// Heads allowed now (share, or more after growth).
    quota: usize,
    share: usize,
    waitq: VecDeque<Waiter>,
    /// Heads handed to woken waiters, by waiter id.
    grants: StripeMap<HeadBufs>,
    next_id: u64,
    /// Waits for a free head since the last growth or idle moment.
    pressure: u32,
}

impl PartState {
    /// Whether a head of `stripe` that is owned now overlaps `rows`.
    fn conflicts(&self, stripe: u64, rows: &Range<usize>) -> bool {
        self.active
            .get(&stripe)
            .is_some_and(|held| held.iter().any(|r| overlaps(r, rows)))
    }

    /// Whether one of the first `n` queued threads waits for rows of `stripe` that overlap
    /// `rows`.
    fn queued_before(&self, n: usize, stripe: u64, rows: &Range<usize>) -> bool {
        self.waitq
            .iter()
            .take(n)
            .any(|w| w.stripe == stripe && overlaps(&w.rows, rows))
    }
}

struct Partition {
    st: Mutex<PartState>,
    /// Threads in `waitq`; read without the lock so a release with nobody waiting skips
    /// the wake-up path.
    waiters: AtomicUsize,
}

/// Counters for tests and `detail`.
#[derive(Default)]
pub struct CacheStats {
    /// Stripe heads taken.
    pub gets: crate::Counter,
    /// Takes that waited for a head.
    pub waits: AtomicU64,
    /// Waiters woken.
    pub wakeups: AtomicU64,
    /// Times the cache grew past its size under pressure.
    pub grown: AtomicU64,
    /// Times it shrank back.
    pub shrunk: AtomicU64,
    /// Most heads that existed at once.
    pub max_heads: AtomicUsize,
    /// Most pages cached heads held at once.
    pub max_cached_pages: AtomicUsize,
}

/// raid4/5/6's stripe cache (md's stripe heads and stripe_cache_size); exposed for its
/// counters: [`StripeCache::size`], [`StripeCache::active`], [`StripeCache::stats`]. `T` is
/// the journal's handle of a logged record, which cached heads keep until their pages are
/// on the members.
pub struct StripeCache<T = ()> {
    parts: Box<[Partition]>,
    /// Owned heads per stripe hash slot: zero means no stripe of the slot is owned, so a
    /// healthy read can skip the partition lock (it is one atomic load).
    hint: Box<[AtomicUsize]>,
    size: AtomicUsize,
    heads: AtomicUsize,
    /// Counters since the array started.
    pub stats: CacheStats,
    /// Cached heads (write-back), with the lists reclaim picks from.
    cached: Mutex<Cached<T>>,
    /// Pages of cached heads, read without the lock (reads skip the cache when zero).
    cached_pages: AtomicUsize,
}

/// How a stripe's head is asked for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Get {
    /// Wait until it is ours.
    Wait,
    /// Only if it is free and a head is at hand now (for the 2nd.. stripes of a batch,
    /// which must not wait while holding heads).
    Try,
}

fn shares(size: usize, parts: usize) -> impl Iterator<Item = usize> {
    (0..parts).map(move |i| (size / parts + usize::from(i < size % parts)).max(1))
}

impl<T> StripeCache<T> {
    /// A cache of `size` heads over `parts` partitions (every partition gets at least one).
    pub(crate) fn new(size: usize, parts: usize) -> StripeCache<T> {
        assert!(parts > 0, "a stripe cache needs a partition");
        let parts: Box<[Partition]> = shares(size, parts)
            .map(|share| Partition {
                st: Mutex::new(PartState {
                    active: StripeMap::default(),
                    free: Vec::new(),
                    heads: 0,
                    quota: share,
                    share,
                    waitq: VecDeque::new(),
                    grants: StripeMap::default(),
                    next_id: 0,
                    pressure: 0,
                }),
                waiters: AtomicUsize::new(0),
            })
            .collect();
        StripeCache {
            parts,
            hint: (0..HINT_SLOTS).map(|_| AtomicUsize::new(0)).collect(),
            size: AtomicUsize::new(size),
            heads: AtomicUsize::new(0),
            stats: CacheStats::default(),
            cached: Mutex::new(Cached::default()),
            cached_pages: AtomicUsize::new(0),
        }
    }

    fn part_of(&self, stripe: u64) -> usize {
        // Fibonacci hashing: neighbouring stripes land in different partitions.
        ((stripe.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % self.parts.len() as u64) as usize
    }

    fn hint_slot(stripe: u64) -> usize {
        (stripe.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % HINT_SLOTS
    }

    /// Mark rows `rows` of `stripe` owned (under its partition's lock).
    fn activate(&self, st: &mut PartState, stripe: u64, rows: Range<usize>) {
        self.hint[Self::hint_slot(stripe)].fetch_add(1, Ordering::SeqCst);
        st.active.entry(stripe).or_default().push(rows);
    }

    fn lock(&self, p: usize) -> MutexGuard<'_, PartState> {
        self.parts[p].st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// stripe_cache_size as set.
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// Heads that exist now (owned or free).
    pub fn heads(&self) -> usize {
        self.heads.load(Ordering::Relaxed)
    }

    /// Most heads allowed now, growth included.
    pub fn limit(&self) -> usize {
        (0..self.parts.len()).map(|p| self.lock(p).quota).sum()
    }

    /// Most heads that can ever exist at this size.
    pub fn cap(&self) -> usize {
        shares(self.size(), self.parts.len())
            .map(|s| s * GROW_FACTOR)
            .sum()
    }

    fn new_head(&self) {
        let n = self.heads.fetch_add(1, Ordering::Relaxed) + 1;
        self.stats.max_heads.fetch_max(n, Ordering::Relaxed);
    }

    /// A free head of the partition, or a new one within the quota.
    fn take_free(&self, st: &mut PartState) -> Option<HeadBufs> {
        if let Some(h) = st.free.pop() {
            return Some(h);
        }
        if st.heads < st.quota {
            st.heads += 1;
            self.new_head();
            return Some(HeadBufs::default());
        }
        None
    }

    /// Take the head of `stripe`, the whole stripe: wait for it (`Get::Wait`), or only if
    /// at hand (`Get::Try`).
    pub(crate) fn get(&self, stripe: u64, how: Get) -> Option<StripeHead<'_, T>> {
        self.get_rows(stripe, WHOLE, how)
    }

    /// Take a head of `stripe` for the rows `rows` only (byte offsets inside the chunk, the
    /// same on every member): heads of one stripe whose rows do not overlap are owned at
    /// once, so that small writes to different rows of a stripe do not wait for each other
    /// (a write touches only its rows, on the data members and on parity). A head of
    /// [`WHOLE`] excludes every other head of the stripe. A request queues behind an
    /// earlier queued one that it overlaps, so whole-stripe work is not starved by a
    /// stream of row writes.
    pub(crate) fn get_rows(
        &self,
        stripe: u64,
        rows: Range<usize>,
        how: Get,
    ) -> Option<StripeHead<'_, T>> {
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
        let p = self.part_of(stripe);
        let mut st = self.lock(p);
        let busy = st.conflicts(stripe, &rows)
            || (self.parts[p].waiters.load(Ordering::SeqCst) > 0
                && st.queued_before(st.waitq.len(), stripe, &rows));
        if !busy {
            if let Some(bufs) = self.take_free(&mut st) {
                self.activate(&mut st, stripe, rows.clone());
                return Some(self.head(p, stripe, rows, bufs));
            }
        }
        if how == Get::Try {
            return None;
        }
        self.stats.waits.fetch_add(1, Ordering::Relaxed);
        if !busy {
            // Sustained pressure grows the partition by one head (at most GROW_FACTOR x).
            st.pressure += 1;
            if st.pressure >= GROW_AFTER_WAITS && st.quota < st.share * GROW_FACTOR {
                st.pressure = 0;
                st.quota += 1;
                st.heads += 1;
                self.new_head();
                self.stats.grown.fetch_add(1, Ordering::Relaxed);
                self.activate(&mut st, stripe, rows.clone());
                return Some(self.head(p, stripe, rows, HeadBufs::default()));
            }
        }
        let id = st.next_id;
        st.next_id += 1;
        st.waitq.push_back(Waiter {
            stripe,
            rows: rows.clone(),
            id,
            thread: std::thread::current(),
        });
        self.parts[p].waiters.fetch_add(1, Ordering::SeqCst);
        loop {
            drop(st);
            std::thread::park();
            st = self.lock(p);
            if let Some(bufs) = st.grants.remove(&id) {
                return Some(self.head(p, stripe, rows, bufs));
            }
        }
    }

    fn head(
        &self,
        part: usize,
        stripe: u64,
        rows: Range<usize>,
        bufs: HeadBufs,
    ) -> StripeHead<'_, T> {
        StripeHead {
            cache: self,
            part,
            stripe,
            rows,
            bufs: Some(bufs),
        }
    }

    /// Whether a head of `stripe` is owned now (a write or sync may be in progress). Without
    /// any owned stripe in its hint slot, this takes no lock.
    pub fn is_active(&self, stripe: u64) -> bool {
        if self.hint[Self::hint_slot(stripe)].load(Ordering::SeqCst) == 0 {
            return false;
        }
        self.lock(self.part_of(stripe)).active.contains_key(&stripe)
    }

    /// Hand free heads (or new ones within the quota) to the queued threads that can use
    /// them, in queue order: those whose rows no one owns and no one queued before them
    /// waits for. Wakes exactly those threads.
    fn dispatch(&self, p: usize, st: &mut PartState) {
        while self.parts[p].waiters.load(Ordering::SeqCst) > 0 {
            let Some(i) = (0..st.waitq.len()).find(|&i| {
                let w = &st.waitq[i];
                !st.conflicts(w.stripe, &w.rows) && !st.queued_before(i, w.stripe, &w.rows)
            }) else {
                return;
            };
            let Some(bufs) = self.take_free(st) else {
                return;
            };
            let w = st.waitq.remove(i).expect("waiter");
            self.activate(st, w.stripe, w.rows.clone());
            st.grants.insert(w.id, bufs);
            self.parts[p].waiters.fetch_sub(1, Ordering::SeqCst);
            self.stats.wakeups.fetch_add(1, Ordering::Relaxed);
            w.thread.unpark();
        }
    }

    fn release(&self, p: usize, stripe: u64, rows: &Range<usize>, bufs: HeadBufs) {
        let mut guard = self.lock(p);
        let st = &mut *guard;
        let holders = st.active.get_mut(&stripe);
        let i = holders
            .as_ref()
            .and_then(|h| h.iter().position(|r| r == rows));
        let (Some(holders), Some(i)) = (holders, i) else {
            panic!("released stripe {stripe} (rows {rows:?}) was not active");
        };
        holders.swap_remove(i);
        if holders.is_empty() {
            st.active.remove(&stripe);
        }
        self.hint[Self::hint_slot(stripe)].fetch_sub(1, Ordering::SeqCst);
        if st.heads > st.quota {
            // The cache shrank: this head goes away.
            st.heads -= 1;
            self.heads.fetch_sub(1, Ordering::Relaxed);
        } else {
            st.free.push(bufs);
        }
        // With nobody queued (the common case) this is one atomic load.
        self.dispatch(p, st);
        if st.active.is_empty() && st.quota > st.share {
            // Idle: back to the share.
            st.pressure = 0;
            st.quota = st.share;
            let drop_n = st.free.len().min(st.heads.saturating_sub(st.quota));
            let keep = st.free.len() - drop_n;
            st.free.truncate(keep);
            st.heads -= drop_n;
            self.heads.fetch_sub(drop_n, Ordering::Relaxed);
            self.stats.shrunk.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Set stripe_cache_size. Shrinking frees free heads now and owned ones as they are
    /// released; growing hands new heads to waiters at once.
    pub(crate) fn set_size(&self, size: usize) {
        self.size.store(size, Ordering::Relaxed);
        let n = self.parts.len();
        for (p, share) in shares(size, n).enumerate() {
            let mut st = self.lock(p);
            st.share = share;
            st.quota = share;
            st.pressure = 0;
            while st.heads > st.quota && st.free.pop().is_some() {
                st.heads -= 1;
                self.heads.fetch_sub(1, Ordering::Relaxed);
            }
            self.dispatch(p, &mut st);
        }
    }

    /// Threads waiting now (for tests).
    pub fn waiting(&self) -> usize {
        self.parts
            .iter()
            .map(|p| p.waiters.load(Ordering::SeqCst))
            .sum()
    }

    /// Heads owned now (for tests: none may be leaked).
    pub fn active(&self) -> usize {
        (0..self.parts.len())
            .map(|p| self.lock(p).active.values().map(|h| h.len()).sum::<usize>())
            .sum()
    }

    /// Bytes the free heads keep.
    pub fn kept_bytes(&self) -> usize {
        (0..self.parts.len())
            .map(|p| {
                self.lock(p)
                    .free
                    .iter()
                    .map(|h| h.kept_bytes())
                    .sum::<usize>()
            })
            .sum()
    }
}

/// Ownership of one stripe, with the head's buffers; released on drop.
pub struct StripeHead<'a, T = ()> {
    cache: &'a StripeCache<T>,
    part: usize,
    stripe: u64,
    /// The rows it holds ([`WHOLE`] for the whole stripe).
    rows: Range<usize>,
    bufs: Option<HeadBufs>,
}

impl<T> StripeHead<'_, T> {
    pub fn stripe(&self) -> u64 {
        self.stripe
    }

    pub fn bufs(&mut self) -> &mut HeadBufs {
        self.bufs.as_mut().expect("head buffers")
    }
}

impl<T> Drop for StripeHead<'_, T> {
    fn drop(&mut self) {
        let bufs = self.bufs.take().unwrap_or_default();
        self.cache.release(self.part, self.stripe, &self.rows, bufs);
    }
}

impl<T> StripeCache<T> {
    fn cached(&self) -> MutexGuard<'_, Cached<T>> {
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pages of cached heads (no lock).
    pub fn cached_pages(&self) -> usize {
        self.cached_pages.load(Ordering::SeqCst)
    }

    /// Look at the cached heads and their lists (under the cache's lock: keep it short).
    pub(crate) fn with_cached<R>(&self, f: impl FnOnce(&Cached<T>) -> R) -> R {
        f(&self.cached())
    }

    fn sync_count(&self, c: &Cached<T>) {
        self.cached_pages.store(c.pages(), Ordering::SeqCst);
        self.stats
            .max_cached_pages
            .fetch_max(c.pages(), Ordering::Relaxed);
    }
}

impl<T> StripeHead<'_, T> {
    /// Cache pages of this stripe, (data member, row, data) each, logged under `ticket`
    /// (Cache). `data_disks` and `seq` (log order) make the head if it is not cached yet.
    /// Returns the rows new to the head.
    pub(crate) fn cache_pages(
        &self,
        data_disks: usize,
        pages: &[(usize, u64, &[u8])],
        ticket: Option<T>,
        seq: u64,
        now_ms: u64,
    ) -> Result<usize, IllegalTransition> {
        let mut c = self.cache.cached();
        let r = c
            .update(
                self.stripe,
                Some(|| CachedHead::new(data_disks, seq, now_ms)),
                |h| {
                    if let Some(&(dev, row, _)) = pages.first() {
                        if h.writing() {
                            return Err(IllegalTransition {
                                from: h.flags(dev, row),
                                event: PageEvent::Cache,
                            });
                        }
                    }
                    let rows = h.rows();
                    for (dev, row, data) in pages {
                        h.cache(*dev, *row, data)?;
                    }
                    h.tickets.extend(ticket);
                    Ok(h.rows() - rows)
                },
            )
            .expect("made");
        self.cache.sync_count(&c);
        r
    }

    /// This head's cached pages, copied: (data member, row, data).
    pub fn cached_pages(&self) -> Vec<(usize, u64, Box<[u8]>)> {
        let c = self.cache.cached();
        c.head(self.stripe).map_or_else(Vec::new, |h| {
            h.all_pages().map(|(d, r, p)| (d, r, p.into())).collect()
        })
    }

    /// Write-out of rows `rows` starts (BeginWrite).
    pub(crate) fn begin_write(&self, rows: Range<u64>) -> Result<(), IllegalTransition> {
        let mut c = self.cache.cached();
        c.update(self.stripe, None::<fn() -> CachedHead<T>>, |h| {
            h.begin_write(rows)
        })
        .unwrap_or(Ok(()))
    }

    /// Rows `rows` are on the members (WriteDone).
    pub(crate) fn write_done(&self, rows: Range<u64>) -> Result<(), IllegalTransition> {
        let mut c = self.cache.cached();
        c.update(self.stripe, None::<fn() -> CachedHead<T>>, |h| {
            h.write_done(rows)
        })
        .unwrap_or(Ok(()))
    }

    /// The write-out failed: the head stays cached, every page Cached (WriteFailed).
    pub(crate) fn write_failed(&self) -> Result<(), IllegalTransition> {
        let mut c = self.cache.cached();
        c.update(self.stripe, None::<fn() -> CachedHead<T>>, |h| {
            h.write_failed()
        })
        .unwrap_or(Ok(()))
    }

    /// Every page is on its member: the head leaves the cache (Finish). Nothing if it
    /// was not cached.
    pub(crate) fn finish(&self) -> Result<Released<T>, IllegalTransition> {
        let mut c = self.cache.cached();
        let r = c.remove(self.stripe, PageEvent::Finish);
        self.cache.sync_count(&c);
        r
    }

    /// A full-stripe write replaced the head's data: it leaves the cache (Supersede).
    pub(crate) fn supersede(&self) -> Result<Released<T>, IllegalTransition> {
        let mut c = self.cache.cached();
        let r = c.remove(self.stripe, PageEvent::Supersede);
        self.cache.sync_count(&c);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Wait (bounded) until `f` holds; a hang becomes a failure, not a stuck test.
    fn eventually(what: &str, f: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_stripe_has_one_owner_and_try_does_not_wait() {
        let c = StripeCache::<()>::new(4, 2);
        let h = c.get(7, Get::Wait).expect("head");
        assert!(c.is_active(7));
        assert!(c.get(7, Get::Try).is_none(), "second owner of stripe 7");
        drop(h);
        assert!(!c.is_active(7));
        assert!(c.get(7, Get::Try).is_some());
        assert_eq!(c.active(), 0);
    }

    #[test]
    fn the_count_is_bounded_and_a_release_wakes_exactly_one_waiter() {
        // One partition of two heads: two owners exhaust it.
        let c = Arc::new(StripeCache::<()>::new(2, 1));
        let h1 = c.get(1, Get::Wait).unwrap();
        let h2 = c.get(2, Get::Wait).unwrap();
        assert!(
            c.get(3, Get::Try).is_none(),
            "a third head beyond the bound"
        );
        let got = Arc::new(AtomicUsize::new(0));
        let hold = Arc::new(AtomicBool::new(true));
        let ts: Vec<_> = (0..3)
            .map(|i| {
                let (c, got, hold) = (c.clone(), got.clone(), hold.clone());
                std::thread::spawn(move || {
                    let _h = c.get(10 + i, Get::Wait).unwrap();
                    got.fetch_add(1, Ordering::SeqCst);
                    // Keep the head until the test lets go.
                    while hold.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
            })
            .collect();
        eventually("three waiters", || c.waiting() == 3);
        let wakeups0 = c.stats.wakeups.load(Ordering::SeqCst);
        drop(h1);
        eventually("one waiter got the head", || {
            got.load(Ordering::SeqCst) == 1
        });
        assert_eq!(c.waiting(), 2, "a release woke more than one waiter");
        assert_eq!(c.stats.wakeups.load(Ordering::SeqCst) - wakeups0, 1);
        assert!(c.heads() <= 2 * GROW_FACTOR);
        drop(h2);
        eventually("second waiter", || got.load(Ordering::SeqCst) == 2);
        assert_eq!(c.waiting(), 1);
        hold.store(false, Ordering::SeqCst);
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(c.active(), 0, "a head leaked");
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn row_heads_share_a_stripe_unless_their_rows_overlap() {
        let c = StripeCache::<()>::new(8, 1);
        let a = c.get_rows(3, 0..4096, Get::Wait).expect("rows 0..4096");
        let b = c.get_rows(3, 4096..8192, Get::Try);
        assert!(b.is_some(), "disjoint rows of one stripe must not wait");
        assert!(
            c.get_rows(3, 4000..4100, Get::Try).is_none(),
            "rows overlapping two holders were granted"
        );
        assert!(
            c.get(3, Get::Try).is_none(),
            "a whole head beside row heads"
        );
        assert!(c.get(4, Get::Try).is_some(), "another stripe is unaffected");
        assert_eq!(c.active(), 2);
        drop(a);
        assert!(
            c.get(3, Get::Try).is_none(),
            "a whole head beside a row head"
        );
        drop(b);
        let w = c
            .get(3, Get::Try)
            .expect("whole head once the rows are free");
        assert!(
            c.get_rows(3, 0..512, Get::Try).is_none(),
            "rows under a whole head"
        );
        drop(w);
        assert_eq!(c.active(), 0);
        assert!(!c.is_active(3));
    }

    #[test]
    fn a_queued_whole_head_is_not_overtaken_by_row_heads() {
        let c = Arc::new(StripeCache::<()>::new(8, 1));
        let r = c.get_rows(9, 0..4096, Get::Wait).unwrap();
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.get(9, Get::Wait).map(|h| h.stripe()));
        eventually("whole head queued", || c.waiting() == 1);
        // Free rows, but a whole-stripe request waits for the stripe: rows queue behind it.
        assert!(
            c.get_rows(9, 8192..12288, Get::Try).is_none(),
            "a row head overtook a queued whole head"
        );
        assert!(
            c.get_rows(10, 0..4096, Get::Try).is_some(),
            "other stripes go on"
        );
        drop(r);
        assert_eq!(t.join().unwrap(), Some(9));
        assert_eq!(c.active(), 0);
        assert_eq!(c.waiting(), 0);
    }

    /// Seeded stress of row heads beside whole heads on few stripes: at any time a row
    /// (of 4 per stripe) has one owner, whole heads own all of them; no deadlock, no leak.
    #[test]
    fn stress_row_heads_and_whole_heads() {
        const STRIPES: u64 = 6;
        const ROWS: usize = 4;
        let seed = stress_seed(std::env::var("URAID_SEED").ok());
        let c = Arc::new(StripeCache::<()>::new(4, 2));
        let owners: Arc<Vec<AtomicUsize>> = Arc::new(
            (0..STRIPES as usize * ROWS)
                .map(|_| AtomicUsize::new(0))
                .collect(),
        );
        let ts: Vec<_> = (0..12u64)
            .map(|t| {
                let (c, owners) = (c.clone(), owners.clone());
                std::thread::spawn(move || {
                    let mut x = seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    for _ in 0..1500 {
                        let stripe = next() % STRIPES;
                        let (rows, slots) = match next() % 6 {
                            0 => (WHOLE, 0..ROWS),
                            k => {
                                let lo = (k as usize - 1) % ROWS;
                                let hi = (lo + 1 + (next() % 2) as usize).min(ROWS);
                                (lo * 4096..hi * 4096, lo..hi)
                            }
                        };
                        let h = c.get_rows(stripe, rows, Get::Wait).unwrap();
                        for r in slots.clone() {
                            let i = stripe as usize * ROWS + r;
                            let n = owners[i].fetch_add(1, Ordering::SeqCst);
                            assert_eq!(n, 0, "stripe {stripe} row {r}: two owners (seed {seed})");
                        }
                        if next() % 4 == 0 {
                            std::thread::yield_now();
                        }
                        for r in slots {
                            owners[stripe as usize * ROWS + r].fetch_sub(1, Ordering::SeqCst);
                        }
                        drop(h);
                    }
                })
            })
            .collect();
        let t0 = Instant::now();
        while !ts.iter().all(|t| t.is_finished()) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "deadlock (replay: URAID_SEED={seed})"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(c.active(), 0, "a head leaked (seed {seed})");
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn a_release_with_nobody_waiting_wakes_nobody() {
        let c = StripeCache::<()>::new(16, 4);
        for s in 0..1000u64 {
            let _h = c.get(s % 5, Get::Wait).unwrap();
        }
        assert_eq!(c.stats.wakeups.load(Ordering::SeqCst), 0);
        assert_eq!(c.stats.waits.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_waiter_for_a_busy_stripe_gets_it_on_release() {
        let c = Arc::new(StripeCache::<()>::new(8, 1));
        let h = c.get(5, Get::Wait).unwrap();
        let c2 = c.clone();
        let t = std::thread::spawn(move || {
            let h = c2.get(5, Get::Wait).unwrap();
            h.stripe()
        });
        eventually("waiter queued", || c.waiting() == 1);
        drop(h);
        assert_eq!(t.join().unwrap(), 5);
        assert_eq!(c.active(), 0);
    }

    #[test]
    fn it_grows_under_pressure_and_shrinks_back_when_idle() {
        let c = Arc::new(StripeCache::<()>::new(1, 1));
        let stop = Arc::new(AtomicBool::new(false));
        let ts: Vec<_> = (0..4u64)
            .map(|i| {
                let (c, stop) = (c.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut k = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let _h = c.get(i * 1000 + k % 3, Get::Wait).unwrap();
                        k += 1;
                        std::thread::sleep(Duration::from_micros(200));
                    }
                })
            })
            .collect();
        eventually("growth", || c.stats.grown.load(Ordering::SeqCst) > 0);
        stop.store(true, Ordering::Relaxed);
        for t in ts {
            t.join().unwrap();
        }
        assert!(c.stats.max_heads.load(Ordering::SeqCst) <= GROW_FACTOR);
        assert!(c.stats.max_heads.load(Ordering::SeqCst) > 1);
        // The last release found the partition idle: back to the share.
        assert_eq!(c.limit(), 1);
        assert_eq!(c.heads(), 1);
        assert_eq!(c.active(), 0);
    }

    #[test]
    fn set_size_shrinks_free_heads_and_feeds_waiters_when_growing() {
        let c = Arc::new(StripeCache::<()>::new(8, 1));
        let hs: Vec<_> = (0..8).map(|s| c.get(s, Get::Wait).unwrap()).collect();
        assert_eq!(c.heads(), 8);
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.get(100, Get::Wait).map(|h| h.stripe()));
        eventually("waiter", || c.waiting() == 1);
        c.set_size(9);
        assert_eq!(t.join().unwrap(), Some(100));
        drop(hs);
        c.set_size(2);
        assert_eq!(c.heads(), 2);
        assert_eq!(c.active(), 0);
    }

    #[test]
    fn head_buffers_are_reused_and_capped() {
        let c = StripeCache::<()>::new(8, 1);
        {
            let mut h = c.get(1, Get::Wait).unwrap();
            for _ in 0..10 {
                let b = h.bufs().take(4096);
                h.bufs().put(b);
            }
            let bs: Vec<_> = (0..40).map(|_| h.bufs().take(4096)).collect();
            for b in bs {
                h.bufs().put(b);
            }
            let big = h.bufs().take(1 << 20);
            h.bufs().put(big);
        }
        assert!(c.kept_bytes() <= HEAD_KEEP_BYTES);
        assert!(c.kept_bytes() > 0);
    }

    /// Seeded stress: many threads, a tiny cache, mixed stripes and batches taken with
    /// Try after a Wait (as the write path does). Checks one owner per stripe at any time,
    /// the bound, no deadlock (a watchdog fails with the seed), no leak. The seed is
    /// printed; `URAID_SEED=n` replays one (threads interleave as they will, but each
    /// thread's sequence of stripes is the seed's).
    #[test]
    fn stress_tiny_cache_many_threads() {
        let seed = stress_seed(std::env::var("URAID_SEED").ok());
        eprintln!("stripe cache stress: seed {seed} (URAID_SEED={seed} replays it)");
        let full = std::env::var("URAID_FULL").is_ok();
        for (size, parts) in [(2, 1), (3, 2), (4, 4), (8, 8)] {
            stress_once(seed, size, parts, if full { 20_000 } else { 2_000 });
        }
    }

    /// The stress run's seed when none is given.
    const DEFAULT_STRESS_SEED: u64 = 13;

    /// `URAID_SEED`'s value, else the default; never the clock, so every run can be
    /// replayed. A value that is not a number is refused rather than ignored.
    fn stress_seed(var: Option<String>) -> u64 {
        match var {
            None => DEFAULT_STRESS_SEED,
            Some(v) => v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("URAID_SEED={v:?} is not a number; give e.g. 42")),
        }
    }

    #[test]
    fn stress_seed_is_given_or_fixed() {
        assert_eq!(stress_seed(None), DEFAULT_STRESS_SEED);
        assert_eq!(stress_seed(None), stress_seed(None));
        assert_eq!(stress_seed(Some("42".into())), 42);
        let junk = std::panic::catch_unwind(|| stress_seed(Some("x1".into())));
        assert!(
            junk.is_err(),
            "a bad URAID_SEED must not fall back silently"
        );
    }

    fn stress_once(seed: u64, size: usize, parts: usize, ops: usize) {
        const STRIPES: u64 = 12;
        let c = Arc::new(StripeCache::<()>::new(size, parts));
        let owners: Arc<Vec<AtomicUsize>> =
            Arc::new((0..STRIPES).map(|_| AtomicUsize::new(0)).collect());
        let done = Arc::new(AtomicUsize::new(0));
        let threads = 16;
        let ts: Vec<_> = (0..threads)
            .map(|t| {
                let (c, owners, done) = (c.clone(), owners.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut x = seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    for _ in 0..ops / threads {
                        let first = next() % STRIPES;
                        let run = 1 + next() % 3;
                        let mut hs = vec![c.get(first, Get::Wait).unwrap()];
                        for s in first + 1..(first + run).min(STRIPES) {
                            match c.get(s, Get::Try) {
                                Some(h) => hs.push(h),
                                None => break,
                            }
                        }
                        for h in &hs {
                            let n = owners[h.stripe() as usize].fetch_add(1, Ordering::SeqCst);
                            assert_eq!(n, 0, "stripe {} had two owners (seed {seed})", h.stripe());
                        }
                        assert!(c.heads() <= c.cap(), "heads above the bound (seed {seed})");
                        if next() % 4 == 0 {
                            std::thread::yield_now();
                        }
                        for h in &hs {
                            owners[h.stripe() as usize].fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        let t0 = Instant::now();
        while done.load(Ordering::SeqCst) < threads {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "deadlock: size {size}, {parts} partitions (replay: URAID_SEED={seed})"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(c.active(), 0, "a head leaked (seed {seed})");
        assert_eq!(c.waiting(), 0);
        assert!(c.stats.max_heads.load(Ordering::SeqCst) <= c.cap());
    }
}
