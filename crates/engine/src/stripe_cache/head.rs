//! A cached head of the stripe cache (write-back): its pages, their flags and the legal
//! transitions, as raid5.h writes them down. Pure: no IO, no locks, no clock; the stripe
//! cache ([`super`]) keeps the heads and changes them only for the head's owner.
//!
//! A cached head's pages, one per data member and page of the chunk, carry md's r5dev
//! flags:
//!
//! ```text
//! flags                               state
//! -                                   absent   the members hold the data
//! UPTODATE DIRTY IN_JOURNAL           Cached   acknowledged, in the log, newer than the members
//! UPTODATE DIRTY IN_JOURNAL WRITING   Writing  its member write is in flight
//! UPTODATE IN_JOURNAL                 Written  on the member; its log record still held
//! ```
//!
//! The legal transitions ([`next_page_state`]; any other is a bug, refused with
//! [`IllegalTransition`] and leaving the head as it was):
//!
//! ```text
//! absent           --Cache-->        Cached   a write-back write, once its data is logged
//! Cached           --Cache-->        Cached   a newer write of the page (a newer record)
//! Cached           --BeginWrite-->   Writing  write-out of the page's rows starts
//! Writing          --WriteDone-->    Written
//! Writing, Written --WriteFailed-->  Cached   write-out failed: the head stays cached
//! Written          --Finish-->       absent   every page of the head written: records released
//! Cached           --Supersede-->    absent   a full-stripe write put newer data on the members
//! ```
//!
//! And for the head as a whole: no page is cached while a write-out is under way (some
//! page Writing or Written), Finish needs every page Written and Supersede every page
//! Cached, so a page is never dropped before it is on its member.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Range, RangeInclusive};

/// Flags of a cached head's page (md's r5dev flags of the same meaning).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PageFlags(u8);

impl PageFlags {
    /// The page holds valid data (md's R5_UPTODATE).
    pub const UPTODATE: u8 = 1;
    /// Newer than its member (md's R5_Wantwrite, as r5c sets it for cached data).
    pub const DIRTY: u8 = 2;
    /// A log record holds it (md's R5_InJournal).
    pub const IN_JOURNAL: u8 = 4;
    /// Its member write is in flight (md's R5_LOCKED).
    pub const WRITING: u8 = 8;
    /// The Cached state.
    pub const CACHED: PageFlags = PageFlags(Self::UPTODATE | Self::DIRTY | Self::IN_JOURNAL);
    /// The Writing state.
    pub const WRITING_OUT: PageFlags = PageFlags(Self::CACHED.0 | Self::WRITING);
    /// The Written state.
    pub const WRITTEN: PageFlags = PageFlags(Self::UPTODATE | Self::IN_JOURNAL);

    #[cfg(test)]
    pub fn has(self, flag: u8) -> bool {
        self.0 & flag == flag
    }
}

/// What happens to a cached page (see the module's table).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PageEvent {
    Cache,
    BeginWrite,
    WriteDone,
    WriteFailed,
    Finish,
    Supersede,
}

/// A transition the state machine does not allow: a bug in the caller.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IllegalTransition {
    /// The page's state (None: absent), or for a head-wide rule the first page it broke.
    pub from: Option<PageFlags>,
    pub event: PageEvent,
}

impl std::fmt::Display for IllegalTransition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "illegal stripe page transition: {:?} on {:?}",
            self.event, self.from
        )
    }
}

/// The page state machine: a page's state after `event` (None: it leaves the cache).
pub fn next_page_state(
    from: Option<PageFlags>,
    event: PageEvent,
) -> Result<Option<PageFlags>, IllegalTransition> {
    use PageEvent::*;
    const C: PageFlags = PageFlags::CACHED;
    const W: PageFlags = PageFlags::WRITING_OUT;
    const D: PageFlags = PageFlags::WRITTEN;
    match (from, event) {
        (None | Some(C), Cache) => Ok(Some(C)),
        (Some(C), BeginWrite) => Ok(Some(W)),
        (Some(W), WriteDone) => Ok(Some(D)),
        (Some(W) | Some(D), WriteFailed) => Ok(Some(C)),
        (Some(D), Finish) | (Some(C), Supersede) => Ok(None),
        _ => Err(IllegalTransition { from, event }),
    }
}

struct Page {
    data: Box<[u8]>,
    flags: PageFlags,
}

/// The pages one cached head keeps (pure: no IO, no locks, no clock), with the counts
/// reclaim reads. Pages are per data member of the stripe (logical data index) and page of
/// the chunk ("row"); parity is never cached, it is computed at write-out.
pub struct CachedHead<T> {
    dev: Vec<BTreeMap<u64, Page>>,
    /// Row -> data members with a page in it (bit i = data member i).
    rows: BTreeMap<u64, u64>,
    full_rows: usize,
    pages: usize,
    /// Pages Writing or Written: a write-out is under way.
    out: usize,
    pub(super) tickets: Vec<T>,
    first_seq: u64,
    /// When its first data was cached, in the array clock's milliseconds.
    since_ms: u64,
}

/// What a head that leaves the cache gives back: its log handles and its row count (for
/// the log space reserved per row).
pub struct Released<T> {
    pub tickets: Vec<T>,
    pub rows: usize,
}

impl<T> CachedHead<T> {
    /// An empty head of a stripe with `data_disks` data members; `first_seq` orders heads
    /// oldest first, `since_ms` is when its first data was cached (array clock, ms).
    pub fn new(data_disks: usize, first_seq: u64, since_ms: u64) -> CachedHead<T> {
        CachedHead {
            dev: (0..data_disks).map(|_| BTreeMap::new()).collect(),
            rows: BTreeMap::new(),
            full_rows: 0,
            pages: 0,
            out: 0,
            tickets: Vec::new(),
            first_seq,
            since_ms,
        }
    }

    /// The mask of a row in which every data member has a page; None for arrays of more
    /// than 64 data members, whose rows are never counted full (their heads go out as
    /// partial ones, which is only slower).
    fn all(&self) -> Option<u64> {
        match self.dev.len() {
            64 => Some(u64::MAX),
            n if n > 64 => None,
            n => Some((1u64 << n) - 1),
        }
    }

    #[cfg(test)]
    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Every cached row has all its data pages (md's full stripe: no reads to write out).
    pub fn is_full(&self) -> bool {
        self.full_rows == self.rows.len()
    }

    #[cfg(test)]
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    pub fn since_ms(&self) -> u64 {
        self.since_ms
    }

    /// Whether a write-out is under way (some page Writing or Written).
    pub fn writing(&self) -> bool {
        self.out > 0
    }

    pub fn flags(&self, dev: usize, row: u64) -> Option<PageFlags> {
        self.dev[dev].get(&row).map(|p| p.flags)
    }

    /// Cache `data` as page `row` of data member `dev` (Cache). True if the page is new.
    pub fn cache(&mut self, dev: usize, row: u64, data: &[u8]) -> Result<bool, IllegalTransition> {
        let from = self.flags(dev, row);
        if self.out > 0 {
            return Err(IllegalTransition {
                from,
                event: PageEvent::Cache,
            });
        }
        let flags = next_page_state(from, PageEvent::Cache)?.expect("cached");
        if let Some(p) = self.dev[dev].get_mut(&row) {
            if p.data.len() == data.len() {
                p.data.copy_from_slice(data);
            } else {
                p.data = data.into();
            }
            p.flags = flags;
            return Ok(false);
        }
        self.dev[dev].insert(
            row,
            Page {
                data: data.into(),
                flags,
            },
        );
        let all = self.all();
        let mask = self.rows.entry(row).or_insert(0);
        *mask |= 1u64.checked_shl(dev as u32).unwrap_or(0);
        if Some(*mask) == all {
            self.full_rows += 1;
        }
        self.pages += 1;
        Ok(true)
    }

    /// Apply `event` to every page of rows `rows` for which `pick` says so: all or nothing.
    fn step(
        &mut self,
        rows: Range<u64>,
        event: PageEvent,
        pick: impl Fn(PageFlags) -> bool,
    ) -> Result<(), IllegalTransition> {
        let pages = || {
            self.dev
                .iter()
                .flat_map(|d| d.range(rows.clone()).map(|(_, p)| p.flags))
        };
        for f in pages().filter(|f| pick(*f)) {
            next_page_state(Some(f), event)?;
        }
        for d in &mut self.dev {
            for (_, p) in d.range_mut(rows.clone()) {
                if pick(p.flags) {
                    let to = next_page_state(Some(p.flags), event)?.expect("stays cached");
                    self.out = self.out + usize::from(to != PageFlags::CACHED)
                        - usize::from(p.flags != PageFlags::CACHED);
                    p.flags = to;
                }
            }
        }
        Ok(())
    }

    /// Write-out of rows `rows` starts (BeginWrite on their pages).
    pub fn begin_write(&mut self, rows: Range<u64>) -> Result<(), IllegalTransition> {
        self.step(rows, PageEvent::BeginWrite, |_| true)
    }

    /// The member writes of rows `rows` are done (WriteDone on their pages).
    pub fn write_done(&mut self, rows: Range<u64>) -> Result<(), IllegalTransition> {
        self.step(rows, PageEvent::WriteDone, |_| true)
    }

    /// The write-out failed: every page back to Cached (WriteFailed on the others).
    pub fn write_failed(&mut self) -> Result<(), IllegalTransition> {
        self.step(0..u64::MAX, PageEvent::WriteFailed, |f| {
            f != PageFlags::CACHED
        })
    }

    /// Whether the head may leave the cache by `event` (Finish or Supersede): every page
    /// must allow it (Finish: all Written, so none is dropped before it is on its member;
    /// Supersede: all Cached, no write-out under way).
    pub fn may_leave(&self, event: PageEvent) -> Result<(), IllegalTransition> {
        for p in self.dev.iter().flat_map(|d| d.values()) {
            if next_page_state(Some(p.flags), event)?.is_some() {
                return Err(IllegalTransition {
                    from: Some(p.flags),
                    event,
                });
            }
        }
        Ok(())
    }

    /// Pages of data member `dev` in rows `rows`: (row, data).
    pub fn dev_pages(&self, dev: usize, rows: Range<u64>) -> impl Iterator<Item = (u64, &[u8])> {
        self.dev[dev].range(rows).map(|(r, p)| (*r, &p.data[..]))
    }

    /// Every page: (data member, row, data).
    pub fn all_pages(&self) -> impl Iterator<Item = (usize, u64, &[u8])> {
        self.dev
            .iter()
            .enumerate()
            .flat_map(|(i, d)| d.iter().map(move |(r, p)| (i, *r, &p.data[..])))
    }
}

/// The cached heads and the lists reclaim picks from (md's r5c lists).
pub struct Cached<T> {
    heads: BTreeMap<u64, CachedHead<T>>,
    /// Cached stripes by log order of their first data (oldest first).
    order: BTreeSet<(u64, u64)>,
    /// Cached stripes whose every row has all its data pages.
    full: BTreeSet<u64>,
    rows: usize,
    pages: usize,
}

impl<T> Default for Cached<T> {
    fn default() -> Cached<T> {
        Cached {
            heads: BTreeMap::new(),
            order: BTreeSet::new(),
            full: BTreeSet::new(),
            rows: 0,
            pages: 0,
        }
    }
}

impl<T> Cached<T> {
    /// Cached stripes.
    pub fn heads(&self) -> usize {
        self.heads.len()
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Rows of all cached heads.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Full cached stripes, in stripe order.
    pub fn full(&self) -> impl Iterator<Item = u64> + '_ {
        self.full.iter().copied()
    }

    pub fn is_full(&self, stripe: u64) -> bool {
        self.full.contains(&stripe)
    }

    /// Full cached stripes.
    pub fn full_count(&self) -> usize {
        self.full.len()
    }

    /// Cached stripes, oldest first (log order of their first data).
    pub fn oldest(&self) -> impl Iterator<Item = u64> + '_ {
        self.order.iter().map(|(_, s)| *s)
    }

    pub fn head(&self, stripe: u64) -> Option<&CachedHead<T>> {
        self.heads.get(&stripe)
    }

    /// Cached heads of stripes `stripes`.
    pub fn range(
        &self,
        stripes: RangeInclusive<u64>,
    ) -> impl Iterator<Item = (u64, &CachedHead<T>)> {
        self.heads.range(stripes).map(|(s, h)| (*s, h))
    }

    /// Change the head of `stripe` (created by `new` if it is not cached) and keep the
    /// counts and lists right; a head left without pages leaves the cache.
    pub(super) fn update<R>(
        &mut self,
        stripe: u64,
        new: Option<impl FnOnce() -> CachedHead<T>>,
        f: impl FnOnce(&mut CachedHead<T>) -> R,
    ) -> Option<R> {
        let h = match (self.heads.contains_key(&stripe), new) {
            (true, _) => self.heads.get_mut(&stripe).expect("cached"),
            (false, Some(new)) => {
                let h = new();
                self.order.insert((h.first_seq, stripe));
                self.heads.entry(stripe).or_insert(h)
            }
            (false, None) => return None,
        };
        let (pages, rows) = (h.pages, h.rows.len());
        let r = f(h);
        self.pages = self.pages + h.pages - pages;
        self.rows = self.rows + h.rows.len() - rows;
        if h.is_full() {
            self.full.insert(stripe);
        } else {
            self.full.remove(&stripe);
        }
        if h.pages == 0 {
            let h = self.heads.remove(&stripe).expect("cached");
            self.order.remove(&(h.first_seq, stripe));
            self.full.remove(&stripe);
        }
        Some(r)
    }

    /// The head of `stripe` leaves the cache by `event` (Finish or Supersede) if every
    /// page allows it; otherwise it stays as it was. Nothing if it is not cached.
    pub(super) fn remove(
        &mut self,
        stripe: u64,
        event: PageEvent,
    ) -> Result<Released<T>, IllegalTransition> {
        let Some(h) = self.heads.get(&stripe) else {
            return Ok(Released {
                tickets: Vec::new(),
                rows: 0,
            });
        };
        h.may_leave(event)?;
        let h = self.heads.remove(&stripe).expect("cached");
        self.order.remove(&(h.first_seq, stripe));
        self.full.remove(&stripe);
        self.pages -= h.pages;
        self.rows -= h.rows.len();
        Ok(Released {
            tickets: h.tickets,
            rows: h.rows.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stripe_cache::{Get, StripeCache};
    use std::sync::atomic::Ordering;

    // The cached heads' state machine.

    const ALL_STATES: [Option<PageFlags>; 4] = [
        None,
        Some(PageFlags::CACHED),
        Some(PageFlags::WRITING_OUT),
        Some(PageFlags::WRITTEN),
    ];
    const ALL_EVENTS: [PageEvent; 6] = [
        PageEvent::Cache,
        PageEvent::BeginWrite,
        PageEvent::WriteDone,
        PageEvent::WriteFailed,
        PageEvent::Finish,
        PageEvent::Supersede,
    ];

    #[test]
    fn only_the_documented_page_transitions_are_legal() {
        use PageEvent::*;
        let (c, w, d) = (
            Some(PageFlags::CACHED),
            Some(PageFlags::WRITING_OUT),
            Some(PageFlags::WRITTEN),
        );
        // The module's table, written out again.
        let legal = [
            (None, Cache, c),
            (c, Cache, c),
            (c, BeginWrite, w),
            (w, WriteDone, d),
            (w, WriteFailed, c),
            (d, WriteFailed, c),
            (d, Finish, None),
            (c, Supersede, None),
        ];
        for from in ALL_STATES {
            for ev in ALL_EVENTS {
                let want = legal
                    .iter()
                    .find(|(f, e, _)| *f == from && *e == ev)
                    .map(|(_, _, to)| *to);
                match (next_page_state(from, ev), want) {
                    (Ok(to), Some(w)) => assert_eq!(to, w, "{ev:?} on {from:?}"),
                    (Err(e), None) => assert_eq!(e, IllegalTransition { from, event: ev }),
                    (got, want) => panic!("{ev:?} on {from:?}: {got:?}, the table says {want:?}"),
                }
            }
        }
        // Every state keeps UPTODATE (readers see the page) and IN_JOURNAL until it leaves.
        for f in [
            PageFlags::CACHED,
            PageFlags::WRITING_OUT,
            PageFlags::WRITTEN,
        ] {
            assert!(f.has(PageFlags::UPTODATE) && f.has(PageFlags::IN_JOURNAL));
        }
        assert!(!PageFlags::WRITTEN.has(PageFlags::DIRTY));
        assert!(PageFlags::WRITING_OUT.has(PageFlags::WRITING));
    }

    #[test]
    fn a_head_refuses_illegal_steps_and_stays_as_it_was() {
        let c = StripeCache::<u32>::new(8, 1);
        let h = c.get(5, Get::Wait).unwrap();
        let now = 0u64;
        assert_eq!(
            h.cache_pages(2, &[(0, 0, &[1; 8]), (1, 0, &[2; 8])], Some(7), 3, now),
            Ok(1)
        );
        assert_eq!(c.cached_pages(), 2);
        // Finish before the pages are written would drop data that is not on the members.
        assert_eq!(
            h.finish().err(),
            Some(IllegalTransition {
                from: Some(PageFlags::CACHED),
                event: PageEvent::Finish
            })
        );
        h.begin_write(0..1).unwrap();
        // No caching while the head is written out, and no second write-out.
        assert!(h.cache_pages(2, &[(0, 1, &[3; 8])], None, 0, now).is_err());
        assert!(h.begin_write(0..1).is_err());
        assert!(h.supersede().is_err());
        assert_eq!(c.cached_pages(), 2, "refused steps change nothing");
        h.write_done(0..1).unwrap();
        assert!(h.write_done(0..1).is_err(), "written twice");
        let r = h.finish().unwrap();
        assert_eq!((r.tickets, r.rows), (vec![7], 1));
        assert_eq!(c.cached_pages(), 0);
        assert_eq!(c.with_cached(|k| k.heads()), 0);
    }

    #[test]
    fn rows_of_wide_arrays_are_never_full() {
        let mut h = CachedHead::<()>::new(65, 0, 0);
        for dev in 0..64 {
            h.cache(dev, 0, &[0; 8]).unwrap();
        }
        assert!(!h.is_full(), "member 64 has no page");
        let mut h = CachedHead::<()>::new(64, 0, 0);
        for dev in 0..64 {
            h.cache(dev, 0, &[0; 8]).unwrap();
        }
        assert!(h.is_full());
    }

    /// What the naive model knows of a page.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum M {
        Cached,
        Writing,
        Written,
    }

    #[derive(Clone, Debug)]
    enum Op {
        Cache(u64, Vec<(usize, u64, u8)>),
        BeginWrite(u64, u64, u64),
        WriteDone(u64, u64, u64),
        WriteFailed(u64),
        Finish(u64),
        Supersede(u64),
    }

    const DD: usize = 3;
    const ROWS: u64 = 4;
    const STRIPES: u64 = 3;

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let s = 0..STRIPES;
        let rows = (0..ROWS, 1..=ROWS);
        prop_oneof![
            4 => (s.clone(), proptest::collection::vec((0..DD, 0..ROWS, any::<u8>()), 1..4))
                .prop_map(|(s, p)| Op::Cache(s, p)),
            2 => (s.clone(), rows.clone()).prop_map(|(s, (a, b))| Op::BeginWrite(s, a.min(b), a.max(b))),
            2 => (s.clone(), rows).prop_map(|(s, (a, b))| Op::WriteDone(s, a.min(b), a.max(b))),
            1 => s.clone().prop_map(Op::WriteFailed),
            2 => s.clone().prop_map(Op::Finish),
            1 => s.prop_map(Op::Supersede),
        ]
    }

    /// The naive model: per stripe, page -> (state, data byte), the tickets, first seq.
    #[derive(Default, Clone)]
    struct Model {
        pages: BTreeMap<(u64, usize, u64), (M, u8)>,
        tickets: BTreeMap<u64, Vec<u32>>,
        first: BTreeMap<u64, u64>,
    }

    impl Model {
        fn of(&self, s: u64) -> impl Iterator<Item = (usize, u64, M)> + '_ {
            self.pages
                .range((s, 0, 0)..(s + 1, 0, 0))
                .map(|((_, d, r), (m, _))| (*d, *r, *m))
        }
        fn in_rows(&self, s: u64, lo: u64, hi: u64) -> Vec<(usize, u64, M)> {
            self.of(s)
                .filter(|(_, r, _)| (lo..hi).contains(r))
                .collect()
        }
        fn clear(&mut self, s: u64) -> (Vec<u32>, usize) {
            let rows: BTreeSet<u64> = self.of(s).map(|(_, r, _)| r).collect();
            self.pages.retain(|(st, _, _), _| *st != s);
            self.first.remove(&s);
            (self.tickets.remove(&s).unwrap_or_default(), rows.len())
        }
        fn set(&mut self, s: u64, rows: (u64, u64), from: M, to: M) {
            for ((st, _, r), (m, _)) in self.pages.iter_mut() {
                if *st == s && (rows.0..rows.1).contains(r) && *m == from {
                    *m = to;
                }
            }
        }
    }

    fn check(c: &StripeCache<u32>, m: &Model) -> Result<(), proptest::test_runner::TestCaseError> {
        use proptest::prop_assert_eq;
        prop_assert_eq!(c.cached_pages(), m.pages.len());
        c.with_cached(|k| {
            prop_assert_eq!(k.pages(), m.pages.len());
            let mut rows_total = 0;
            let mut full = Vec::new();
            for s in 0..STRIPES {
                let rows: BTreeSet<u64> = m.of(s).map(|(_, r, _)| r).collect();
                rows_total += rows.len();
                let h = k.head(s);
                prop_assert_eq!(h.is_some(), !rows.is_empty(), "stripe {} cached", s);
                let Some(h) = h else { continue };
                let is_full = rows
                    .iter()
                    .all(|r| m.of(s).filter(|(_, pr, _)| pr == r).count() == DD);
                if is_full {
                    full.push(s);
                }
                prop_assert_eq!(h.is_full(), is_full);
                prop_assert_eq!(h.rows(), rows.len());
                prop_assert_eq!(h.pages(), m.of(s).count());
                prop_assert_eq!(h.writing(), m.of(s).any(|(_, _, x)| x != M::Cached));
                prop_assert_eq!(h.first_seq(), m.first[&s]);
                for ((st, d, r), (x, byte)) in &m.pages {
                    if *st != s {
                        continue;
                    }
                    let want = match x {
                        M::Cached => PageFlags::CACHED,
                        M::Writing => PageFlags::WRITING_OUT,
                        M::Written => PageFlags::WRITTEN,
                    };
                    prop_assert_eq!(h.flags(*d, *r), Some(want));
                    let data: Vec<u8> = h
                        .dev_pages(*d, *r..*r + 1)
                        .flat_map(|(_, p)| p.to_vec())
                        .collect();
                    prop_assert_eq!(data, vec![*byte; 8]);
                }
            }
            prop_assert_eq!(k.rows(), rows_total);
            prop_assert_eq!(k.full().collect::<Vec<_>>(), full);
            let mut oldest: Vec<(u64, u64)> = m.first.iter().map(|(s, q)| (*q, *s)).collect();
            oldest.sort();
            prop_assert_eq!(
                k.oldest().collect::<Vec<_>>(),
                oldest.into_iter().map(|(_, s)| s).collect::<Vec<_>>()
            );
            Ok(())
        })
    }

    proptest::proptest! {
        /// Cached heads against a naive model: every step is legal exactly when the model
        /// says so, a refused step changes nothing, and pages, flags, data, counts and the
        /// reclaim lists always agree with the model.
        #[test]
        fn cached_heads_follow_the_naive_model(ops in proptest::collection::vec(op(), 1..60)) {
            use proptest::prop_assert_eq;
            let c = StripeCache::<u32>::new(8, 2);
            let mut m = Model::default();
            let now = 0u64;
            for (n, op) in ops.into_iter().enumerate() {
                let n = n as u32;
                let before = m.clone();
                let legal = match &op {
                    Op::Cache(s, pages) => {
                        let h = c.get(*s, Get::Wait).unwrap();
                        let bytes: Vec<[u8; 8]> = pages.iter().map(|p| [p.2; 8]).collect();
                        let p: Vec<(usize, u64, &[u8])> =
                            pages.iter().zip(&bytes).map(|(p, b)| (p.0, p.1, &b[..])).collect();
                        let model_ok = m.of(*s).all(|(_, _, x)| x == M::Cached);
                        let rows_before: BTreeSet<u64> = m.of(*s).map(|(_, r, _)| r).collect();
                        let got = h.cache_pages(DD, &p, Some(n), u64::from(n), now);
                        if model_ok {
                            m.first.entry(*s).or_insert(u64::from(n));
                            m.tickets.entry(*s).or_default().push(n);
                            for (d, r, b) in pages {
                                m.pages.insert((*s, *d, *r), (M::Cached, *b));
                            }
                            let rows_after: BTreeSet<u64> = m.of(*s).map(|(_, r, _)| r).collect();
                            prop_assert_eq!(got, Ok(rows_after.len() - rows_before.len()));
                        }
                        model_ok
                    }
                    Op::BeginWrite(s, lo, hi) | Op::WriteDone(s, lo, hi) => {
                        let h = c.get(*s, Get::Wait).unwrap();
                        let begin = matches!(op, Op::BeginWrite(..));
                        let (from, to) = if begin { (M::Cached, M::Writing) } else { (M::Writing, M::Written) };
                        let ok = m.in_rows(*s, *lo, *hi).iter().all(|(_, _, x)| *x == from);
                        let got = if begin { h.begin_write(*lo..*hi) } else { h.write_done(*lo..*hi) };
                        if ok {
                            m.set(*s, (*lo, *hi), from, to);
                            prop_assert_eq!(got, Ok(()));
                        }
                        ok && got.is_ok()
                    }
                    Op::WriteFailed(s) => {
                        let h = c.get(*s, Get::Wait).unwrap();
                        prop_assert_eq!(h.write_failed(), Ok(()));
                        m.set(*s, (0, ROWS), M::Writing, M::Cached);
                        m.set(*s, (0, ROWS), M::Written, M::Cached);
                        true
                    }
                    Op::Finish(s) | Op::Supersede(s) => {
                        let h = c.get(*s, Get::Wait).unwrap();
                        let fin = matches!(op, Op::Finish(_));
                        let need = if fin { M::Written } else { M::Cached };
                        let ok = m.of(*s).all(|(_, _, x)| x == need);
                        let got = if fin { h.finish() } else { h.supersede() };
                        if ok {
                            let (t, rows) = m.clear(*s);
                            let r = got.map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
                            prop_assert_eq!((r.tickets, r.rows), (t, rows));
                        }
                        ok
                    }
                };
                if !legal {
                    m = before;
                }
                check(&c, &m)?;
            }
            prop_assert_eq!(c.active(), 0);
            proptest::prop_assert!(c.stats.max_cached_pages.load(Ordering::Relaxed) <= STRIPES as usize * DD * ROWS as usize);
        }
    }
}
