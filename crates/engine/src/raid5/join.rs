//! Partial-stripe writes that join (md's delayed stripes: a partial stripe waits a moment so
//! that the next writes fill it, and bios that find the stripe busy are added to it).
//!
//! A raid4/5/6 write of part of a stripe would read the rest of the stripe (or the old data
//! and parity) to compute parity. When the writes that together cover the stripe are in
//! flight at once (sequential writes at queue depth > 1, each smaller than a stripe), they
//! can instead go out as one full-stripe write whose parity comes from the new data alone.
//!
//! The first such piece of a stripe *leads* (if it is large, see `write`, and another write
//! is in progress or its request continues or precedes one of the last few large ones: a
//! sequential stream's next write may still be arriving; a stream whose last [`MISS_LIMIT`]
//! leaders nobody joined leads only beside another write): it opens a pending entry for the
//! stripe, holding no stripe head, and, once its request has offered all its pieces, waits
//! a bounded moment (`join_wait_us`) for others. A piece
//! of the same stripe that finds the entry open and overlaps no piece in it *joins*: it
//! gives its bytes (below), goes on with the rest of its request, and at the request's end
//! sleeps until the leader reports. The leader stops waiting when
//! the pieces cover the stripe, when the moment is over, or when every write in progress
//! is waiting here and a piece joined already or the stream is not sequential (nobody
//! else could come); it then closes the entry (nobody joins after
//! that), takes the stripe's head as any write does and writes the stripe whole, or, if the
//! pieces did not cover it, writes them as the ordinary path would (adjacent ones merged).
//! With skip_copy (the default) no piece is copied: each piece's bytes stay in its
//! request's buffer, *lent* to the leader, and a chunk that lies inside one piece is
//! written (and its parity computed) from there, as md writes a bio's pages straight to
//! the members with skip_copy. Only a chunk that two pieces share, or a stripe that goes
//! out as pieces, is copied into the entry's buffer. Without skip_copy every piece is
//! copied in as it arrives. A lent buffer outlives the leader's use of it: its request
//! does not return, and does not unwind past it, before the leader reports
//! ([`Joined::wait`], or the drop of a `Joined` that was not waited for).
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
/// Large writes remembered to tell a sequential stream: a stream's writes in flight at
/// once (over NBD, one per worker) start in any order, so the one just before is not
/// enough (it took three writes in four of a 1 MiB stream at queue depth 8 for random
/// ones, and their stripes waited the short moment).
const RECENT: usize = 16;

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
    /// The array sectors of the last [`RECENT`] large writes to start, plus one (0: none),
    /// by start and by end: a write that starts where one of them ended, or ends where one
    /// of them started, is part of a sequential stream, whose next write may still be on
    /// its way in.
    recent_start: [AtomicU64; RECENT],
    recent_end: [AtomicU64; RECENT],
    /// Where the next write goes in `recent_*` (modulo RECENT).
    recent_next: AtomicUsize,
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

/// The address of a piece's bytes in its request's buffer, lent to the leader
/// ([`Pending`]); the piece's range gives the length.
#[derive(Clone, Copy)]
struct Lent(*const u8);

// SAFETY: the bytes behind a `Lent` are only read, by the leader, while the request they
// belong to waits for the leader's report (see the module's text): they are neither
// written nor freed meanwhile.
unsafe impl Send for Lent {}
unsafe impl Sync for Lent {}

/// A piece of a pending stripe: its stripe byte range, and where its bytes are.
#[derive(Clone)]
pub(crate) struct Piece {
    pub(crate) range: Range<usize>,
    /// In the giver's buffer (skip_copy); None: copied into the entry's buffer.
    lent: Option<Lent>,
}

#[derive(Default)]
struct Pending {
    /// The stripe's data bytes, as the pieces gave them (chunk by chunk, data index order):
    /// those copied in; lent ones stay in their buffers until needed here.
    data: Option<AlignedBuf>,
    /// The pieces given; their ranges are disjoint.
    pieces: Vec<Piece>,
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

/// A piece that joined a pending stripe: its bytes are in the entry or lent to it; the
/// leader writes them. The request goes on with its other pieces (it may lead the next stripe, which the
/// next request's first piece then joins) and waits for this one at its end, holding no
/// head: a joiner that waited at once would reach its next stripe only after this one's
/// member writes, too late for the request behind it to join.
/// `'a` also bounds the buffer the piece came from, which it may have lent.
pub(crate) struct Joined<'a> {
    joins: &'a Joins,
    slot: Arc<Slot>,
    waited: bool,
}

impl Joined<'_> {
    /// The leader's result, once its member writes are done (counted as waiting here
    /// meanwhile, so that leaders know nobody else is coming).
    pub(crate) fn wait(mut self) -> Result<(), ArrayError> {
        self.waited = true;
        self.wait_for_leader()
    }

    fn wait_for_leader(&self) -> Result<(), ArrayError> {
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

impl Drop for Joined<'_> {
    /// A piece's bytes may be lent to the leader: whatever happens to its request (an
    /// error or a panic in a later piece), it waits for the leader before the buffer can
    /// go.
    fn drop(&mut self) {
        if !self.waited {
            let _ = self.wait_for_leader();
        }
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

    /// A large write of array sectors [start, end) starts: whether it continues or
    /// precedes one of the last [`RECENT`] (a sequential stream).
    pub(crate) fn sequential(&self, start: u64, end: u64) -> bool {
        let me = self.recent_next.fetch_add(1, Ordering::Relaxed) % RECENT;
        self.recent_start[me].store(start + 1, Ordering::Relaxed);
        self.recent_end[me].store(end + 1, Ordering::Relaxed);
        (0..RECENT).any(|i| {
            i != me
                && (self.recent_end[i].load(Ordering::Relaxed) == start + 1
                    || self.recent_start[i].load(Ordering::Relaxed) == end + 1)
        })
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
    /// join an open entry of the stripe, or with `may_lead` open one. With `lend` the
    /// piece's bytes stay in `data` (which the returned `Joined` or `Leader` borrows) until
    /// the leader needs them; without, they are copied in now.
    pub(crate) fn offer<'a>(
        &'a self,
        stripe: u64,
        start: usize,
        data: &'a [u8],
        stripe_bytes: usize,
        may_lead: bool,
        lend: bool,
    ) -> Offer<'a> {
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
                    .any(|q| q.range.start < range.end && range.start < q.range.end);
            if !fits {
                return Offer::Alone;
            }
            let piece = give(p.data.as_mut().expect("data"), range, data, lend);
            p.covered += data.len();
            p.pieces.push(piece);
            self.stats.joined.fetch_add(1, Ordering::Relaxed);
            if p.covered == stripe_bytes {
                slot.cv.notify_all();
            }
            drop(p);
            return Offer::Joined(Joined {
                joins: self,
                slot,
                waited: false,
            });
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
        let piece = give(&mut buf, range, data, lend);
        p.data = Some(buf);
        p.covered = data.len();
        p.pieces.push(piece);
        p.open = true;
        drop(p);
        self.stats.led.fetch_add(1, Ordering::Relaxed);
        Offer::Lead(Leader {
            joins: self,
            stripe,
            slot,
            stripe_bytes,
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
    closed: bool,
    done: bool,
}

impl Piece {
    /// A lent piece's bytes.
    fn lent_bytes(&self) -> Option<&[u8]> {
        // SAFETY: a lent piece's bytes stay valid and unchanged until the leader reports,
        // and the leader reports only after it has given up its pieces ([`Leader::finish`]
        // takes the `Gathered` that holds them, see `Lent`); the slice borrows the piece.
        self.lent
            .map(|l| unsafe { std::slice::from_raw_parts(l.0, self.range.len()) })
    }
}

/// The piece `data` at stripe bytes `range`: lent (its address kept), or copied into `buf`.
fn give(buf: &mut [u8], range: Range<usize>, data: &[u8], lend: bool) -> Piece {
    if lend {
        Piece {
            range,
            lent: Some(Lent(data.as_ptr())),
        }
    } else {
        buf[range.clone()].copy_from_slice(data);
        Piece { range, lent: None }
    }
}

/// What a leader writes: the stripe's data buffer and the pieces, sorted by their place
/// in the stripe. Their bytes are in `data` or lent; lent ones can be read until the
/// leader's [`Leader::finish`], which takes this.
pub(crate) struct Gathered {
    data: AlignedBuf,
    pieces: Vec<Piece>,
    covered: usize,
}

impl Gathered {
    /// Whether the pieces cover the stripe.
    pub(crate) fn is_full(&self) -> bool {
        self.covered == self.data.len()
    }

    /// The lent piece that holds all of `r`, if one does.
    fn lent_over(&self, r: &Range<usize>) -> Option<&Piece> {
        self.pieces
            .iter()
            .find(|p| p.lent.is_some() && p.range.start <= r.start && r.end <= p.range.end)
    }

    /// Copies into `data` the lent bytes of every part of `parts` that no single lent
    /// piece holds, so that [`Gathered::part`] can serve each of them.
    fn settle(&mut self, parts: &[Range<usize>]) {
        for r in parts {
            if self.lent_over(r).is_some() {
                continue;
            }
            for p in &self.pieces {
                let (lo, hi) = (p.range.start.max(r.start), p.range.end.min(r.end));
                if lo < hi {
                    if let Some(b) = p.lent_bytes() {
                        self.data[lo..hi]
                            .copy_from_slice(&b[lo - p.range.start..hi - p.range.start]);
                    }
                }
            }
        }
    }

    /// The stripe bytes `r`, after [`Gathered::settle`] with `r` among its parts: from a
    /// lent buffer when one piece holds them all, else from `data`.
    fn part(&self, r: &Range<usize>) -> &[u8] {
        match self.lent_over(r) {
            Some(p) => {
                let b = p.lent_bytes().expect("lent");
                &b[r.start - p.range.start..r.end - p.range.start]
            }
            None => &self.data[r.clone()],
        }
    }

    /// The stripe's chunks of `chunk_bytes` each, when the pieces cover it: a chunk inside
    /// one lent piece from there, the others from `data` (copied in as needed).
    pub(crate) fn chunks(&mut self, chunk_bytes: usize) -> Vec<&[u8]> {
        assert!(self.is_full());
        let parts: Vec<Range<usize>> = (0..self.data.len() / chunk_bytes)
            .map(|i| i * chunk_bytes..(i + 1) * chunk_bytes)
            .collect();
        self.settle(&parts);
        parts.iter().map(|r| self.part(r)).collect()
    }

    /// The pieces' bytes as runs of adjacent pieces (array order), each with its first
    /// stripe byte: what goes out when the stripe is not written whole.
    pub(crate) fn runs(&mut self) -> Vec<(usize, &[u8])> {
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(self.pieces.len());
        for p in &self.pieces {
            match merged.last_mut() {
                Some(m) if m.end == p.range.start => m.end = p.range.end,
                _ => merged.push(p.range.clone()),
            }
        }
        self.settle(&merged);
        merged.iter().map(|r| (r.start, self.part(r))).collect()
    }
}

impl Leader<'_> {
    /// The stripe this leader leads.
    pub(crate) fn stripe(&self) -> u64 {
        self.stripe
    }

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
        let mut pieces = std::mem::take(&mut p.pieces);
        if pieces.len() > 1 {
            j.misses.store(0, Ordering::Relaxed);
        } else if sequential {
            j.misses.fetch_add(1, Ordering::Relaxed);
        }
        pieces.sort_by_key(|q| q.range.start);
        let g = Gathered {
            data: p.data.take().expect("data"),
            pieces,
            covered: p.covered,
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

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: usize = 8192;
    const STRIPE: usize = 3 * CHUNK;

    fn bytes(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    }

    /// Three pieces cover a stripe of three chunks: [0, 1.5 chunks) leads, then
    /// [1.5, 2) and [2, 3) join. Returns the gathered stripe with each piece's buffer.
    fn three_pieces(lend: bool, f: impl FnOnce(&mut Gathered, [&[u8]; 3])) {
        let joins = Joins::default();
        let (a, b, c) = (
            bytes(1, CHUNK * 3 / 2),
            bytes(2, CHUNK / 2),
            bytes(3, CHUNK),
        );
        let Offer::Lead(mut leader) = joins.offer(7, 0, &a, STRIPE, true, lend) else {
            panic!("the first piece leads");
        };
        let Offer::Joined(jb) = joins.offer(7, CHUNK * 3 / 2, &b, STRIPE, false, lend) else {
            panic!("the second piece joins");
        };
        // Overlapping an earlier piece: not joined.
        assert!(matches!(
            joins.offer(7, CHUNK, &b, STRIPE, false, lend),
            Offer::Alone
        ));
        let Offer::Joined(jc) = joins.offer(7, 2 * CHUNK, &c, STRIPE, false, lend) else {
            panic!("the third piece joins");
        };
        let mut g = leader.gather(Duration::from_secs(10), true);
        assert!(g.is_full());
        f(&mut g, [&a, &b, &c]);
        leader.finish(g, &Ok(()));
        assert!(jb.wait().is_ok());
        assert!(jc.wait().is_ok());
    }

    #[test]
    fn a_stream_is_sequential_whatever_order_its_writes_start_in() {
        let j = Joins::default();
        assert!(!j.sequential(2048, 4096), "nothing before it");
        assert!(j.sequential(0, 2048), "it precedes one remembered");
        assert!(!j.sequential(6144, 8192), "a gap");
        assert!(j.sequential(4096, 6144), "it fills the gap");
        assert!(!j.sequential(100_000, 102_048), "elsewhere");
        // Forgotten after RECENT others.
        for k in 0..RECENT as u64 {
            assert!(!j.sequential(1 << 20 | k << 10, (1 << 20 | k << 10) + 8));
        }
        assert!(!j.sequential(8192, 10240));
    }

    #[test]
    fn lent_pieces_serve_their_whole_chunks_in_place_and_shared_chunks_are_copied() {
        three_pieces(true, |g, [a, b, c]| {
            let chunks = g.chunks(CHUNK);
            // Chunk 0 lies in piece a, chunk 2 is piece c: their own buffers, no copy.
            assert_eq!(chunks[0].as_ptr(), a.as_ptr());
            assert_eq!(chunks[2].as_ptr(), c.as_ptr());
            // Chunk 1 is half a's, half b's: assembled in the entry's buffer.
            assert!(chunks[1].as_ptr() != a[CHUNK..].as_ptr());
            assert_eq!(&chunks[1][..CHUNK / 2], &a[CHUNK..]);
            assert_eq!(&chunks[1][CHUNK / 2..], b);
            assert_eq!(chunks[2], c);
        });
    }

    #[test]
    fn without_lending_every_piece_is_copied() {
        three_pieces(false, |g, [a, b, c]| {
            let chunks = g.chunks(CHUNK);
            for (i, ch) in chunks.iter().enumerate() {
                for buf in [a, b, c] {
                    let r = buf.as_ptr_range();
                    assert!(!r.contains(&ch.as_ptr()), "chunk {i} read from a request");
                }
            }
            let whole: Vec<u8> = [a, b, c].concat();
            assert_eq!(chunks.concat(), whole);
        });
    }

    #[test]
    fn runs_merge_adjacent_pieces_and_keep_a_lone_one_in_place() {
        let joins = Joins::default();
        let (a, b, c) = (bytes(1, CHUNK), bytes(2, CHUNK / 2), bytes(3, CHUNK / 2));
        let Offer::Lead(mut leader) = joins.offer(3, 0, &a, STRIPE, true, true) else {
            panic!("leads");
        };
        let Offer::Joined(jb) = joins.offer(3, CHUNK, &b, STRIPE, false, true) else {
            panic!("joins");
        };
        let Offer::Joined(jc) = joins.offer(3, 5 * CHUNK / 2, &c, STRIPE, false, true) else {
            panic!("joins");
        };
        let mut g = leader.gather(Duration::ZERO, false);
        assert!(!g.is_full());
        let runs = g.runs();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].0, 0);
        assert_eq!(runs[0].1, [&a[..], &b[..]].concat());
        assert_eq!(runs[1].0, 5 * CHUNK / 2);
        assert_eq!(
            runs[1].1.as_ptr(),
            c.as_ptr(),
            "a lone piece goes out in place"
        );
        drop(runs);
        leader.finish(g, &Err(ArrayError::Failed("member gone".into())));
        assert!(jb.wait().is_err());
        // Dropped without a wait: it waits for the leader's report all the same.
        drop(jc);
    }
}
