//! Partial-stripe writes that join (md's delayed stripes: a partial stripe waits a moment so
//! that the next writes fill it, and bios that find the stripe busy are added to it).
//!
//! A raid4/5/6 write of part of a stripe would read the rest of the stripe (or the old data
//! and parity) to compute parity. When the writes that together cover the stripe are in
//! flight at once (sequential writes at queue depth > 1, each smaller than a stripe), they
//! can instead go out as one full-stripe write whose parity comes from the new data alone.
//!
//! The first such piece of a stripe *leads* (if it is large, see `write`, and another write
//! is in progress or its request continues the last one: a sequential stream's next write
//! may still be arriving; a stream whose last [`MISS_LIMIT`] leaders nobody joined leads
//! only beside another write): it opens a pending entry for the stripe, holding no stripe
//! head, and waits a bounded moment (`join_wait_us`) for others. A piece
//! of the same stripe that finds the entry open and overlaps no piece in it *joins*: it
//! copies its bytes in, goes on with the rest of its request, and at the request's end
//! sleeps until the leader reports. The leader stops waiting when
//! the pieces cover the stripe, when the moment is over, or when every write in progress
//! is waiting here and a piece joined already or the stream is not sequential (nobody
//! else could come); it then closes the entry (nobody joins after
//! that), takes the stripe's head as any write does and writes the stripe whole, or, if the
//! pieces did not cover it, writes them as the ordinary path would (adjacent ones merged).
//! The entry holds a copy of the joiners' bytes (their buffers stay theirs); with skip_copy
//! the leader writes the whole chunks of its own piece from its own buffer.
//! Each joined request completes when the leader's member writes are done, with the
//! leader's result (an error reaches every one of them).
//!
//! Why this cannot deadlock: a joiner holds no head and waits only for its leader; a leader
//! holds no head while it waits (bounded), and afterwards waits only for the stripe's head,
//! like any write; nobody holding a head ever waits here. Why order is kept: pieces in an
//! entry never overlap (an overlapping one goes its own way, as two concurrent writes of
//! the same bytes may land in either order), and no request completes before its bytes are
//! on the members, so a write issued after another completed still lands after it.
//!
//! This module is the meeting point only (no IO); `write` does the writing.

use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A leader that waits re-checks whether anyone could still join this often.
const POLL: Duration = Duration::from_micros(50);
/// Stripe buffers kept for the next leaders.
const KEEP_BUFS: usize = 16;
/// Leaders of a sequential stream in a row that nobody joined, after which a sequential
/// piece leads only when another write is in progress (a queue depth of one).
const MISS_LIMIT: u32 = 8;

/// Counters of joined writes (for tests and `detail`).
#[derive(Default)]
pub struct JoinStats {
    /// Pieces that led a pending stripe.
    pub led: AtomicU64,
    /// Pieces that joined one.
    pub joined: AtomicU64,
    /// Pending stripes that were covered and went out whole, without reads.
    pub full: AtomicU64,
    /// Pending stripes that went out as pieces (not covered in time).
    pub partial: AtomicU64,
}

/// The pending stripes of an array and the counts the leaders decide by.
#[derive(Default)]
pub(crate) struct Joins {
    open: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Entries in `open`, read without the lock.
    n_open: AtomicUsize,
    /// raid4/5/6 writes in progress.
    writers: crate::counter::InUse,
    /// Of those, the ones waiting here (leaders in their moment, joiners).
    waiting: AtomicUsize,
    /// Where the last write to start ended (array sector): a write that starts there is
    /// part of a sequential stream, whose next write may still be on its way in.
    last_end: AtomicU64,
    /// Sequential leaders in a row that nobody joined.
    misses: AtomicU32,
    bufs: Mutex<Vec<AlignedBuf>>,
    pub(crate) stats: JoinStats,
}

#[derive(Default)]
struct Slot {
    st: Mutex<Pending>,
    cv: Condvar,
}

#[derive(Default)]
struct Pending {
    /// The stripe's data bytes, as the pieces gave them (chunk by chunk, data index order).
    data: Option<AlignedBuf>,
    /// Byte ranges of `data` that pieces gave; disjoint.
    pieces: Vec<Range<usize>>,
    covered: usize,
    open: bool,
    /// The leader's result, for the joiners (None while it runs).
    done: Option<Result<(), String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What became of an offered piece.
pub(crate) enum Offer<'a> {
    /// Nothing pending to join (or it overlaps): write it the ordinary way.
    Alone,
    /// Joined: the leader writes it; [`Joined::wait`] for its result, holding nothing.
    Joined(Joined<'a>),
    /// This piece leads its stripe: [`Leader::gather`], write, [`Leader::finish`].
    Lead(Leader<'a>),
}

/// A piece that joined a pending stripe: its bytes are in the entry; the leader writes
/// them. The request goes on with its other pieces (it may lead the next stripe, which the
/// next request's first piece then joins) and waits for this one at its end, holding no
/// head: a joiner that waited at once would reach its next stripe only after this one's
/// member writes, too late for the request behind it to join.
pub(crate) struct Joined<'a> {
    joins: &'a Joins,
    slot: Arc<Slot>,
}

impl Joined<'_> {
    /// The leader's result, once its member writes are done (counted as waiting here
    /// meanwhile, so that leaders know nobody else is coming).
    pub(crate) fn wait(self) -> Result<(), ArrayError> {
        let j = self.joins;
        j.waiting.fetch_add(1, Ordering::SeqCst);
        let mut p = lock(&self.slot.st);
        let r = loop {
            if let Some(r) = &p.done {
                break r.clone();
            }
            p = self.slot.cv.wait(p).unwrap_or_else(|e| e.into_inner());
        };
        drop(p);
        j.waiting.fetch_sub(1, Ordering::SeqCst);
        r.map_err(ArrayError::Failed)
    }
}

/// A write in progress (counted while it lives, on the stripe it entered by).
pub(crate) struct Writing<'a>(&'a Joins, usize);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.writers.leave(self.1);
    }
}

impl Joins {
    /// Count a raid4/5/6 write in progress until the guard drops.
    pub(crate) fn writing(&self) -> Writing<'_> {
        Writing(self, self.writers.enter())
    }

    /// A write of array sectors [start, end) starts: whether it continues the last one
    /// (a sequential stream).
    pub(crate) fn sequential(&self, start: u64, end: u64) -> bool {
        self.last_end.swap(end, Ordering::Relaxed) == start
    }

    /// Whether a piece may lead: another write is in progress beside the caller's (so
    /// someone may join), or it is part of a sequential stream whose leaders were joined
    /// lately (its next write may still be arriving: over NBD it is not in progress until
    /// its payload is in).
    pub(crate) fn may_lead(&self, sequential: bool) -> bool {
        self.writers.count() > 1 || (sequential && self.misses.load(Ordering::Relaxed) < MISS_LIMIT)
    }

    /// Whether sequential streams' stripes have been joining lately (fewer than
    /// [`MISS_LIMIT`] leaders in a row went out alone): a stream's next write is then
    /// worth a longer wait.
    pub(crate) fn streams_join(&self) -> bool {
        self.misses.load(Ordering::Relaxed) < MISS_LIMIT
    }

    /// Whether some stripe is pending (one atomic load).
    pub(crate) fn any_open(&self) -> bool {
        self.n_open.load(Ordering::SeqCst) > 0
    }

    /// Offer the piece `data` at byte `start` of `stripe`'s data (`stripe_bytes` in all):
    /// join an open entry of the stripe, or with `may_lead` open one. A joiner copies its
    /// bytes in; a leader copies all but `keep` (stripe bytes inside its piece that it
    /// writes from its own buffer, [`Gathered::kept`]).
    pub(crate) fn offer(
        &self,
        stripe: u64,
        start: usize,
        data: &[u8],
        stripe_bytes: usize,
        may_lead: bool,
        keep: Range<usize>,
    ) -> Offer<'_> {
        if !may_lead && self.n_open.load(Ordering::SeqCst) == 0 {
            return Offer::Alone;
        }
        let range = start..start + data.len();
        let mut open = lock(&self.open);
        if let Some(slot) = open.get(&stripe).cloned() {
            drop(open);
            let mut p = lock(&slot.st);
            let fits = p.open
                && p.data.as_ref().is_some_and(|d| d.len() == stripe_bytes)
                && !p
                    .pieces
                    .iter()
                    .any(|r| r.start < range.end && range.start < r.end);
            if !fits {
                return Offer::Alone;
            }
            p.data.as_mut().expect("data")[range.clone()].copy_from_slice(data);
            p.covered += data.len();
            p.pieces.push(range);
            self.stats.joined.fetch_add(1, Ordering::Relaxed);
            if p.covered == stripe_bytes {
                slot.cv.notify_all();
            }
            drop(p);
            return Offer::Joined(Joined { joins: self, slot });
        }
        if !may_lead {
            return Offer::Alone;
        }
        let slot = Arc::new(Slot::default());
        let mut p = lock(&slot.st);
        open.insert(stripe, slot.clone());
        self.n_open.fetch_add(1, Ordering::SeqCst);
        drop(open);
        let mut buf = self.take_buf(stripe_bytes);
        let keep = if keep.is_empty() {
            range.end..range.end
        } else {
            keep
        };
        assert!(range.start <= keep.start && keep.end <= range.end);
        buf[range.start..keep.start].copy_from_slice(&data[..keep.start - start]);
        buf[keep.end..range.end].copy_from_slice(&data[keep.end - start..]);
        p.data = Some(buf);
        p.covered = data.len();
        p.pieces.push(range);
        p.open = true;
        drop(p);
        self.stats.led.fetch_add(1, Ordering::Relaxed);
        Offer::Lead(Leader {
            joins: self,
            stripe,
            slot,
            stripe_bytes,
            kept: keep,
            closed: false,
            done: false,
        })
    }

    fn take_buf(&self, len: usize) -> AlignedBuf {
        let mut bufs = lock(&self.bufs);
        match bufs.iter().position(|b| b.len() == len) {
            Some(i) => bufs.swap_remove(i),
            None => AlignedBuf::scratch(len),
        }
    }

    fn put_buf(&self, b: AlignedBuf) {
        let mut bufs = lock(&self.bufs);
        if bufs.len() < KEEP_BUFS {
            bufs.push(b);
        }
    }
}

/// The leader of a pending stripe.
pub(crate) struct Leader<'a> {
    joins: &'a Joins,
    stripe: u64,
    slot: Arc<Slot>,
    stripe_bytes: usize,
    kept: Range<usize>,
    closed: bool,
    done: bool,
}

/// What a leader writes: the stripe's data buffer and the byte ranges in it that pieces
/// gave, sorted and with adjacent ones merged (the whole stripe when covered). The bytes
/// `kept` are not in `data` but in the leader's own buffer.
pub(crate) struct Gathered {
    pub(crate) data: AlignedBuf,
    pub(crate) ranges: Vec<Range<usize>>,
    pub(crate) kept: Range<usize>,
}

impl Gathered {
    pub(crate) fn is_full(&self) -> bool {
        self.ranges.len() == 1 && self.ranges[0] == (0..self.data.len())
    }
}

impl Leader<'_> {
    /// Wait up to `wait` for joiners (less once the stripe is covered, or when every write
    /// in progress waits here and either someone joined already or the write is not
    /// `sequential`: nobody else is coming), close the entry and take what the pieces gave.
    pub(crate) fn gather(&mut self, wait: Duration, sequential: bool) -> Gathered {
        let j = self.joins;
        let deadline = Instant::now() + wait;
        j.waiting.fetch_add(1, Ordering::SeqCst);
        {
            let mut p = lock(&self.slot.st);
            loop {
                let now = Instant::now();
                let all_here = j.writers.count() <= j.waiting.load(Ordering::SeqCst) as u64;
                if p.covered == self.stripe_bytes
                    || now >= deadline
                    || (all_here && (p.pieces.len() > 1 || !sequential))
                {
                    break;
                }
                let slice = (deadline - now).min(POLL);
                p = self
                    .slot
                    .cv
                    .wait_timeout(p, slice)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        j.waiting.fetch_sub(1, Ordering::SeqCst);
        self.close();
        let mut p = lock(&self.slot.st);
        let mut ranges = std::mem::take(&mut p.pieces);
        if ranges.len() > 1 {
            j.misses.store(0, Ordering::Relaxed);
        } else if sequential {
            j.misses.fetch_add(1, Ordering::Relaxed);
        }
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(m) if m.end == r.start => m.end = r.end,
                _ => merged.push(r),
            }
        }
        let g = Gathered {
            data: p.data.take().expect("data"),
            ranges: merged,
            kept: self.kept.clone(),
        };
        let stat = if g.is_full() {
            &j.stats.full
        } else {
            &j.stats.partial
        };
        stat.fetch_add(1, Ordering::Relaxed);
        g
    }

    /// No more joiners: the entry leaves the map, then stops taking pieces.
    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let j = self.joins;
        {
            let mut open = lock(&j.open);
            if open
                .get(&self.stripe)
                .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
            {
                open.remove(&self.stripe);
                j.n_open.fetch_sub(1, Ordering::SeqCst);
            }
        }
        lock(&self.slot.st).open = false;
    }

    /// The leader's write is over (its member writes done): every joiner completes with
    /// `r`. The buffer goes back for the next leader.
    pub(crate) fn finish(mut self, g: Gathered, r: &Result<(), ArrayError>) {
        self.joins.put_buf(g.data);
        self.report(r.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    }

    fn report(&mut self, r: Result<(), String>) {
        self.close();
        self.done = true;
        let mut p = lock(&self.slot.st);
        p.done = Some(r);
        self.slot.cv.notify_all();
    }
}

impl Drop for Leader<'_> {
    /// A leader that did not finish (it panicked) still releases its joiners, with an error.
    fn drop(&mut self) {
        if !self.done {
            self.report(Err(format!(
                "stripe {}: the write that carried this one did not finish",
                self.stripe
            )));
        }
    }
}
