//! The raid5/6 journal's write-back mode (md's r5c, `journal_mode = write-back`).
//!
//! A write is logged to the journal as data-only records and acknowledged when that log
//! write is done; its pages stay in the stripe's head, kept in the stripe cache as a
//! cached head ([`crate::stripe_cache::head`]: pages, flags, transitions), until they are
//! written out. This module is the policy: when to write out and which heads.
//! A flush (or FUA) flushes the journal device, so whatever was acknowledged before it
//! survives a crash. Reads take member data and lay the cached pages over it.
//!
//! Write-out (md's reclaim) goes through the ordinary stripe write: the new parity of each
//! row is computed against the members, logged alone (the row's data pages are in the log
//! already), the log flushed, then data and parity go to the members, and only then are the
//! data-only records released (so the journal tail may pass them). Replay pairs a parity
//! record with every data page logged for its row since the row's last parity, so all
//! cached pages of a row go out in one stripe write. A write of a whole stripe skips the
//! cache (logged with its parity, as in write-through).
//!
//! When to write out, as md decides: full stripes (every cached row has all its data
//! pages) in batches; partial stripes, oldest first, when the log is tight (free space
//! under three times what writing out the cache needs) or critical (under twice), when
//! the cache holds more than 3/4 of its pages, and when they are older than
//! [`PERIODIC_AGE`]; everything on stop and when switching to write-through. The reclaim
//! daemon ([`Array::writeback_daemon`]) does the work; the write path only when the log is
//! critical or the cache full.
//!
//! Locking: a stripe's cached pages change only while the stripe's head is held (owned),
//! which write-out also holds while it writes the members (its pages Writing, then
//! Written, then the head leaves the cache; on an error they are Cached again). Writes hold the
//! `gate` for reading; a mode switch holds it for writing, so no write is half-way
//! through the cache while the mode changes.

use crate::array::Array;
use crate::error::ArrayError;
use crate::journal::{Journal, LogTicket};
use crate::raid5::{Conf, Log, StripeHead};
use crate::stripe_cache::Get;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::Duration;
use uraid_core::geometry::ParityGeometry;

const PAGE: usize = 4096;
const PAGE_SECTORS: u64 = 8;

/// md's `journal_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalMode {
    /// Data reaches the members before the write completes.
    WriteThrough,
    /// Data is complete once in the journal; the members are written later.
    WriteBack,
}

impl JournalMode {
    /// md's spelling (sysfs `journal_mode`).
    pub fn name(self) -> &'static str {
        match self {
            JournalMode::WriteThrough => "write-through",
            JournalMode::WriteBack => "write-back",
        }
    }
}

impl std::fmt::Display for JournalMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for JournalMode {
    type Err = String;
    fn from_str(s: &str) -> Result<JournalMode, String> {
        match s {
            "write-through" => Ok(JournalMode::WriteThrough),
            "write-back" => Ok(JournalMode::WriteBack),
            other => Err(format!(
                "journal mode {other:?}: expected write-through or write-back"
            )),
        }
    }
}

/// Full stripes are written out once this many are cached (md batches them too:
/// R5C_FULL_STRIPE_FLUSH_BATCH).
const FULL_STRIPE_BATCH: usize = 8;
/// Times a write retries when the log is full (with 1 ms waits while nothing is cached).
const FULL_RETRIES: u32 = 2000;
/// Default cache size: 64 MiB of pages.
pub const DEFAULT_MAX_PAGES: usize = 16384;
/// The periodic pass writes out stripes cached longer than this.
pub const PERIODIC_AGE: Duration = Duration::from_secs(5);

/// Counters for `detail`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteBackStats {
    /// Stripes with data in the cache not yet on the members.
    pub cached_stripes: usize,
    /// Pages with data not yet on the members.
    pub cached_pages: usize,
    /// Stripes written out to the members since the array started.
    pub written_out_stripes: u64,
}

/// The mode and the reclaim policy's state; the cached data itself is in the stripe
/// cache's cached heads ([`crate::stripe_cache`]).
pub(crate) struct WriteBack {
    on: AtomicBool,
    pub(crate) gate: RwLock<()>,
    pub(crate) max_pages: AtomicUsize,
    written_out: AtomicU64,
    /// Tickets of write-back data carried over by replay, released once drained.
    recovered: Mutex<Vec<LogTicket>>,
    /// Wakes the reclaim daemon.
    wake_mx: Mutex<bool>,
    wake_cv: Condvar,
}

impl Default for WriteBack {
    fn default() -> WriteBack {
        WriteBack {
            on: AtomicBool::new(false),
            gate: RwLock::new(()),
            max_pages: AtomicUsize::new(DEFAULT_MAX_PAGES),
            written_out: AtomicU64::new(0),
            recovered: Mutex::new(Vec::new()),
            wake_mx: Mutex::new(false),
            wake_cv: Condvar::new(),
        }
    }
}

impl WriteBack {
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    pub(crate) fn mode(&self) -> JournalMode {
        if self.is_on() {
            JournalMode::WriteBack
        } else {
            JournalMode::WriteThrough
        }
    }

    fn wake(&self) {
        *self.wake_mx.lock().unwrap() = true;
        self.wake_cv.notify_one();
    }
}

fn stats(c: &Conf) -> WriteBackStats {
    let (cached_stripes, cached_pages) = c
        .stripe_cache
        .with_cached(|cached| (cached.heads(), cached.pages()));
    WriteBackStats {
        cached_stripes,
        cached_pages,
        written_out_stripes: c.wb.written_out.load(Ordering::Relaxed),
    }
}

fn is_empty(c: &Conf) -> bool {
    c.cached_pages() == 0
}

/// Cache `pages` (array sector, data) of the stripe whose head the caller holds, logged
/// under `t`; `reserved` is the log space the append reserved for their write-out.
fn insert(
    j: &Journal,
    g: &ParityGeometry,
    head: &StripeHead<'_>,
    pages: &[(u64, &[u8])],
    t: Option<LogTicket>,
    reserved: u64,
    now_ms: u64,
) {
    let by_dev: Vec<(usize, u64, &[u8])> = pages
        .iter()
        .map(|(sector, page)| {
            let loc = g.locate(*sector);
            assert_eq!(loc.stripe, head.stripe(), "a page of the head's stripe");
            (loc.data_index, loc.offset_sectors / PAGE_SECTORS, *page)
        })
        .collect();
    let seq = t.as_ref().map_or(0, LogTicket::seq);
    let new_rows = head
        .cache_pages(g.data_disks(), &by_dev, t, seq, now_ms)
        .unwrap_or_else(|e| panic!("stripe {}: {e}", head.stripe()));
    // The append reserved log space for a row per page; keep what the new rows need.
    let need = new_rows as u64 * row_reserve(g);
    if reserved >= need {
        j.unreserve(reserved - need);
    } else {
        j.reserve(need - reserved);
    }
}

/// A head left the cache: release its log space and records.
fn released(j: &Journal, g: &ParityGeometry, r: crate::stripe_cache::Released<LogTicket>) {
    j.unreserve(r.rows as u64 * row_reserve(g));
    for t in r.tickets {
        j.stripe_written(t);
    }
}

/// Cached pages overlapping array sectors [sector, sector + sectors): (array sector, data).
fn overlapping(c: &Conf, g: &ParityGeometry, sector: u64, sectors: u64) -> Vec<(u64, Box<[u8]>)> {
    let end = sector + sectors;
    let (first, last) = (g.locate(sector).stripe, g.locate(end - 1).stripe);
    c.stripe_cache.with_cached(|cached| {
        let mut out = Vec::new();
        for (stripe, h) in cached.range(first..=last) {
            for dev in 0..g.data_disks() {
                let chunk = g.array_sector(stripe, dev);
                let (lo, hi) = (sector.max(chunk), end.min(chunk + g.chunk_sectors));
                if lo >= hi {
                    continue;
                }
                let rows = (lo - chunk) / PAGE_SECTORS..(hi - chunk).div_ceil(PAGE_SECTORS);
                out.extend(
                    h.dev_pages(dev, rows)
                        .map(|(row, p)| (chunk + row * PAGE_SECTORS, p.into())),
                );
            }
        }
        out
    })
}

/// Log space the cache may need: every page again (carried over by a replay), plus
/// parity and a meta block per row for its write-out (md's
/// r5c_log_required_to_flush_cache, in our record shape, with margin).
fn required_sectors(c: &Conf, g: &ParityGeometry) -> u64 {
    let (pages, rows) = c
        .stripe_cache
        .with_cached(|cached| (cached.pages(), cached.rows()));
    PAGE_SECTORS * (pages + rows * (g.parity_disks() + 1)) as u64
}

/// Stripes to write out now, in order: full ones first (if `full`), then the oldest
/// partial ones (up to `partial`), then any older than `older` = (age, now in the array
/// clock's ms).
fn pick(c: &Conf, full: bool, partial: usize, older: Option<(Duration, u64)>) -> Vec<u64> {
    c.stripe_cache.with_cached(|cached| {
        let mut v: Vec<u64> = Vec::new();
        if full {
            v.extend(cached.full());
        }
        let mut rest = cached.oldest().filter(|s| !(full && cached.is_full(*s)));
        v.extend(rest.by_ref().take(partial));
        if let Some((age, now_ms)) = older {
            // Log order is age order: stop at the first young one.
            let age_ms = age.as_millis() as u64;
            v.extend(rest.take_while(|s| {
                cached
                    .head(*s)
                    .is_some_and(|h| now_ms.saturating_sub(h.since_ms()) >= age_ms)
            }));
        }
        v
    })
}

fn full_stripes(c: &Conf) -> usize {
    c.stripe_cache.with_cached(|cached| cached.full_count())
}

/// Log space a cached row keeps reserved for its write-out: a meta block and its parity.
fn row_reserve(g: &ParityGeometry) -> u64 {
    PAGE_SECTORS * (g.parity_disks() as u64 + 1)
}

impl Array {
    /// md's `journal_mode`: None without a journal.
    pub fn journal_mode(&self) -> Option<JournalMode> {
        self.journal().map(|_| self.r5().wb.mode())
    }

    /// Write-back cache counters, with a journal.
    pub fn writeback_stats(&self) -> Option<WriteBackStats> {
        self.journal().map(|_| stats(self.r5()))
    }

    /// Most pages the write-back cache holds before it writes out under pressure.
    pub fn set_writeback_max_pages(&self, pages: usize) {
        if let Some(c) = self.r5_conf() {
            c.wb.max_pages.store(pages.max(1), Ordering::Relaxed);
        }
    }

    /// Switch the journal mode at run time (md's `journal_mode` in sysfs). Write-back is
    /// refused while the array is degraded, as md refuses it; switching to write-through
    /// writes every cached stripe out first.
    pub fn set_journal_mode(&self, mode: JournalMode) -> Result<(), ArrayError> {
        let Some(j) = self.journal() else {
            return Err(ArrayError::Failed("the array has no write journal".into()));
        };
        let g = self
            .parity_geometry()
            .expect("a journal is on a parity level");
        let _gate = self.r5().wb.gate.write().unwrap();
        match mode {
            JournalMode::WriteBack => {
                if self.is_degraded() {
                    return Err(ArrayError::Failed(
                        "write-back needs every member: the array is degraded (md refuses it too)"
                            .into(),
                    ));
                }
                if j.is_failed() {
                    return Err(self.journal_failed_error());
                }
                self.r5().wb.on.store(true, Ordering::SeqCst);
            }
            JournalMode::WriteThrough => {
                drain(self, g)?;
                self.r5().wb.on.store(false, Ordering::SeqCst);
            }
        }
        tracing::info!("journal mode: {mode}");
        Ok(())
    }

    /// One pass of the reclaim daemon (md's r5c reclaim thread): fall back to
    /// write-through if a member failed, apply the reclaim rules, and write out stripes
    /// cached longer than [`PERIODIC_AGE`].
    pub fn writeback_periodic(&self) -> Result<(), ArrayError> {
        let Some(g) = self.parity_geometry() else {
            return Ok(());
        };
        self.writeback_fallback()?;
        if self.journal().is_none() || is_empty(self.r5()) || self.journal_failed() {
            return Ok(());
        }
        let _gate = self.r5().wb.gate.read().unwrap();
        reclaim(self, g, 0, false)?;
        for s in pick(self.r5(), false, 0, Some((PERIODIC_AGE, self.now_ms()))) {
            write_out_stripe(self, g, s)?;
        }
        Ok(())
    }

    /// The reclaim daemon: run [`Array::writeback_periodic`] whenever the write path asks
    /// (log tight, cache filling, full stripes) and at least every 100 ms, until `stop`.
    pub fn writeback_daemon(&self, stop: &AtomicBool) {
        let Some(c) = self.r5_conf() else {
            // No write-back on the other levels: only wait for the stop.
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
            }
            return;
        };
        while !stop.load(Ordering::SeqCst) {
            {
                let w = c.wb.wake_mx.lock().unwrap();
                let (mut w, _) =
                    c.wb.wake_cv
                        .wait_timeout_while(w, Duration::from_millis(100), |w| !*w)
                        .unwrap();
                *w = false;
            }
            if let Err(e) = self.writeback_periodic() {
                tracing::warn!("write-back reclaim: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// In write-back with a member gone: write the cache out and go write-through.
    pub(crate) fn writeback_fallback(&self) -> Result<(), ArrayError> {
        if self.r5_conf().is_some_and(|c| c.wb.is_on()) && self.is_degraded() {
            tracing::warn!(
                "a member failed while the journal was in write-back: writing the cache out \
                 and switching to write-through"
            );
            return self.set_journal_mode(JournalMode::WriteThrough);
        }
        Ok(())
    }

    /// Write-back data carried over by replay: cache it and write it out (assembly).
    pub(crate) fn adopt_recovered(&self, r: crate::journal::Recovered) -> Result<(), ArrayError> {
        let g = self
            .parity_geometry()
            .expect("a journal is on a parity level");
        let mut by_stripe: BTreeMap<u64, Vec<(u64, &[u8])>> = BTreeMap::new();
        for (sector, page) in &r.pages {
            by_stripe
                .entry(g.locate(*sector).stripe)
                .or_default()
                .push((*sector, &page[..]));
        }
        let j = self.journal().expect("journal attached");
        // The replay's tickets pin all of it until every stripe is out.
        for (stripe, pages) in by_stripe {
            let head = self
                .r5()
                .stripe_cache
                .get(stripe, Get::Wait)
                .expect("waited");
            insert(j, g, &head, &pages, None, 0, self.now_ms());
        }
        *self.r5().wb.recovered.lock().unwrap() = r.tickets;
        drain(self, g)?;
        for t in std::mem::take(&mut *self.r5().wb.recovered.lock().unwrap()) {
            j.stripe_written(t);
        }
        Ok(())
    }
}

/// Write `buf` at array `sector` in write-back mode (the caller holds the gate).
pub(crate) fn write(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    buf: &[u8],
) -> Result<(), ArrayError> {
    let j = a.journal().expect("write-back has a journal");
    let mut s = sector;
    let mut off = 0usize;
    while off < buf.len() {
        let loc = g.locate(s);
        let next_stripe = g.array_sector(loc.stripe + 1, 0);
        let n = (((next_stripe - s) * 512) as usize).min(buf.len() - off);
        let data = &buf[off..off + n];
        let stripe_bytes = (g.stripe_data_sectors() * 512) as usize;
        if n == stripe_bytes {
            // A whole stripe needs no reads and gains nothing from the cache: it goes
            // through (data and parity logged and flushed, then the members), and replaces
            // whatever the stripe had cached.
            let rows = g.chunk_sectors / PAGE_SECTORS;
            let need =
                g.stripe_data_sectors() + rows * PAGE_SECTORS * (g.parity_disks() as u64 + 1);
            reclaim(a, g, need, true)?;
            let mut head = a
                .r5()
                .stripe_cache
                .get(loc.stripe, Get::Wait)
                .expect("waited");
            let cb = (g.chunk_sectors * 512) as usize;
            let pieces: Vec<Option<(usize, &[u8])>> =
                data.chunks(cb).map(|c| Some((0, c))).collect();
            crate::raid5::write_pieces_locked(a, g, &mut head, &pieces, Log::Stripe)?;
            let gone = head
                .supersede()
                .unwrap_or_else(|e| panic!("stripe {}: {e}", loc.stripe));
            released(j, g, gone);
        } else if !s.is_multiple_of(PAGE_SECTORS) || !n.is_multiple_of(PAGE) {
            // Sub-page: the journal logs whole pages. Write the stripe's cache out and
            // write this piece through (rare: exports use 4 KiB blocks).
            write_out_stripe(a, g, loc.stripe)?;
            crate::raid5::write(a, g, s, data)?;
        } else {
            let need =
                (n / PAGE) as u64 * PAGE_SECTORS + PAGE_SECTORS * (1 + (n / PAGE) as u64 / 200);
            reclaim(a, g, need, true)?;
            let pages: Vec<(u64, &[u8])> = data
                .chunks(PAGE)
                .enumerate()
                .map(|(k, p)| (s + k as u64 * PAGE_SECTORS, p))
                .collect();
            let mut tries = 0;
            loop {
                // The stripe's head: no write-out of this stripe runs meanwhile.
                let lock = a
                    .r5()
                    .stripe_cache
                    .get(loc.stripe, Get::Wait)
                    .expect("waited");
                // Room to log the parity of these rows too, once they go out.
                let keep = pages.len() as u64 * row_reserve(g);
                match j.append_data(&pages, a, keep) {
                    Ok(t) => {
                        insert(j, g, &lock, &pages, Some(t), keep, a.now_ms());
                        break;
                    }
                    Err(crate::journal::JournalError::Full { .. }) if tries < FULL_RETRIES => {
                        // Other writers took the space: write out the oldest and retry. With
                        // nothing cached, the space is pinned by stripe writes in flight in
                        // other threads: give them a moment.
                        drop(lock);
                        tries += 1;
                        if is_empty(a.r5()) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        for st in pick(a.r5(), false, 16, None) {
                            write_out_stripe(a, g, st)?;
                        }
                        j.reclaim_now(a).map_err(|e| a.journal_error(e))?;
                    }
                    Err(e) => return Err(a.journal_error(e)),
                }
            }
        }
        off += n;
        s += (n / 512) as u64;
    }
    Ok(())
}

/// md's reclaim rules. In the write path (`foreground`, before appending `need` sectors)
/// only what cannot wait is done inline: the log critical (free space under twice what
/// writing the cache out needs) or the cache over its size, and the tail moved once three
/// quarters of the ring are in use; anything less wakes the reclaim daemon, which writes
/// out when the log is tight (under three times), the cache is 3/4 full, or full stripes
/// pile up, and moves the tail at half the ring (md's reclaim thread does the same).
fn reclaim(a: &Array, g: &ParityGeometry, need: u64, foreground: bool) -> Result<(), ArrayError> {
    let j = a.journal().expect("journal");
    // The cache also stays under an eighth of the ring: writing it out needs about three
    // times its size in log space, and the critical threshold is twice that.
    let max = a
        .r5()
        .wb
        .max_pages
        .load(Ordering::Relaxed)
        .min((j.space().1 / (8 * PAGE_SECTORS)) as usize)
        .max(1);
    for _ in 0..1024 {
        let (mut used, size) = j.space();
        let tail_at = if foreground { size / 4 * 3 } else { size / 2 };
        if used + need > tail_at {
            j.reclaim_now(a).map_err(|e| a.journal_error(e))?;
            used = j.space().0;
        }
        if is_empty(a.r5()) {
            return Ok(());
        }
        let free = size.saturating_sub(used + need);
        // What writing the cache out (or carrying it over at replay) needs, counting the
        // pages about to be logged.
        let required = required_sectors(a.r5(), g) + need;
        let critical = free < 2 * required;
        let tight = free < 3 * required;
        let pages = a.r5().cached_pages();
        let over = pages >= max;
        let pressure = pages > max * 3 / 4;
        let full = full_stripes(a.r5());
        let picked = if critical {
            pick(a.r5(), false, 8, None)
        } else if over {
            pick(a.r5(), false, 1, None)
        } else if foreground {
            if tight || pressure || full >= FULL_STRIPE_BATCH {
                a.r5().wb.wake();
            }
            return Ok(());
        } else if tight || pressure {
            pick(a.r5(), true, 4, None)
        } else if full >= FULL_STRIPE_BATCH {
            pick(a.r5(), true, 0, None)
        } else {
            return Ok(());
        };
        if picked.is_empty() {
            return Ok(());
        }
        for s in picked {
            write_out_stripe(a, g, s)?;
        }
    }
    Ok(())
}

/// Write every cached stripe out.
pub(crate) fn drain(a: &Array, g: &ParityGeometry) -> Result<(), ArrayError> {
    while !is_empty(a.r5()) {
        let picked = pick(a.r5(), false, usize::MAX, None);
        for s in picked {
            write_out_stripe(a, g, s)?;
        }
    }
    Ok(())
}

/// Write one cached stripe to the members (under its lock): rows grouped so that every
/// row's cached pages go out in one logged record with its parity.
pub(crate) fn write_out_stripe(
    a: &Array,
    g: &ParityGeometry,
    stripe: u64,
) -> Result<(), ArrayError> {
    // Member writes need the array marked active, as any write does.
    a.ensure_dirty()?;
    let j = a.journal().expect("journal");
    let mut head = a.r5().stripe_cache.get(stripe, Get::Wait).expect("waited");
    let pages = head.cached_pages();
    if pages.is_empty() {
        return Ok(());
    }
    let dd = g.data_disks();
    // row -> page per logical data chunk
    let mut rows: BTreeMap<u64, Vec<Option<&[u8]>>> = BTreeMap::new();
    for (dev, row, page) in &pages {
        rows.entry(*row).or_insert_with(|| vec![None; dd])[*dev] = Some(&page[..]);
    }
    let illegal =
        |e: crate::stripe_cache::IllegalTransition| -> ! { panic!("stripe {stripe}: {e}") };
    let present = |v: &Vec<Option<&[u8]>>| -> Vec<bool> { v.iter().map(Option::is_some).collect() };
    let rows: Vec<(u64, Vec<Option<&[u8]>>)> = rows.into_iter().collect();
    let mut i = 0;
    while i < rows.len() {
        // A run of consecutive rows with the same chunks cached: one stripe write.
        let m = present(&rows[i].1);
        let mut k = i + 1;
        while k < rows.len() && rows[k].0 == rows[k - 1].0 + 1 && present(&rows[k].1) == m {
            k += 1;
        }
        let bufs: Vec<Option<Vec<u8>>> = (0..dd)
            .map(|c| {
                m[c].then(|| {
                    rows[i..k]
                        .iter()
                        .flat_map(|(_, v)| v[c].expect("in mask").iter().copied())
                        .collect()
                })
            })
            .collect();
        let start = rows[i].0 as usize * PAGE;
        let pieces: Vec<Option<(usize, &[u8])>> = bufs
            .iter()
            .map(|b| b.as_ref().map(|b| (start, &b[..])))
            .collect();
        // With a failed journal the cache can only go straight to the members (stop):
        // acknowledged data is kept, without write-hole protection for these stripes.
        let log = if j.is_failed() {
            Log::Skip
        } else {
            Log::ParityOnly
        };
        let run = rows[i].0..rows[k - 1].0 + 1;
        head.begin_write(run.clone()).unwrap_or_else(|e| illegal(e));
        if let Err(e) = crate::raid5::write_pieces_locked(a, g, &mut head, &pieces, log) {
            // The head stays cached, all of it dirty again: a later write-out redoes it.
            head.write_failed().unwrap_or_else(|e| illegal(e));
            return Err(e);
        }
        head.write_done(run).unwrap_or_else(|e| illegal(e));
        i = k;
    }
    released(j, g, head.finish().unwrap_or_else(|e| illegal(e)));
    a.r5().wb.written_out.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Lay cached pages over `buf` (array data read from the members at `sector`).
pub(crate) fn overlay(cached: &[(u64, Box<[u8]>)], sector: u64, buf: &mut [u8]) {
    let start = sector * 512;
    let end = start + buf.len() as u64;
    for (s, page) in cached {
        let ps = s * 512;
        let pe = ps + PAGE as u64;
        let (a, b) = (ps.max(start), pe.min(end));
        if a < b {
            buf[(a - start) as usize..(b - start) as usize]
                .copy_from_slice(&page[(a - ps) as usize..(b - ps) as usize]);
        }
    }
}

/// Cached pages a read of [sector, sector + sectors) must see.
pub(crate) fn cached_for_read(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    sectors: u64,
) -> Vec<(u64, Box<[u8]>)> {
    if is_empty(a.r5()) {
        return Vec::new();
    }
    overlapping(a.r5(), g, sector, sectors)
}

/// Replay's fallback for one row of write-back data that does not fit the new log: write
/// the logged pages and the row's new parity straight to the members. Parity comes from the
/// logged pages and the other data members, which this never writes, so doing it again
/// after a crash gives the same result. A row whose unlogged data member is missing would
/// need the old parity, which an interrupted earlier attempt may have changed: refused.
pub(crate) fn write_row_direct(
    a: &Array,
    g: &ParityGeometry,
    stripe_sector: u64,
    pages: &[(u64, &[u8])],
) -> std::io::Result<bool> {
    use crate::buf::AlignedBuf;
    let stripe = stripe_sector / g.chunk_sectors;
    let map = g.stripe_map(stripe);
    let dd = g.data_disks();
    let mut data: Vec<AlignedBuf> = (0..dd).map(|_| AlignedBuf::new(PAGE)).collect();
    let mut logged = vec![false; dd];
    for (sector, page) in pages {
        let loc = g.locate(*sector);
        assert_eq!(loc.stripe, stripe, "page of this row");
        data[loc.data_index].copy_from_slice(page);
        logged[loc.data_index] = true;
    }
    for i in (0..dd).filter(|&i| !logged[i]) {
        let role = map.data[i];
        match a.live(role) {
            Some(dev) => dev.read_at(&mut data[i], a.member_byte(role, stripe_sector))?,
            None => {
                tracing::error!(
                    "write-back row at member sector {stripe_sector}: member {role} is \
                     missing and its data is not in the log"
                );
                return Ok(false);
            }
        }
    }
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let mut p = AlignedBuf::new(PAGE);
    let mut q = map.q.map(|_| AlignedBuf::new(PAGE));
    crate::raid5::gen_parity(&map, &refs, &mut p, q.as_deref_mut());
    let mut writes: Vec<(uraid_core::MemberIdx, &[u8])> = (0..dd)
        .filter(|&i| logged[i])
        .map(|i| (map.data[i], &data[i][..]))
        .collect();
    writes.push((map.p, &p[..]));
    if let (Some(qr), Some(q)) = (map.q, q.as_deref()) {
        writes.push((qr, q));
    }
    for (role, buf) in writes {
        if let Some(dev) = a.live(role) {
            dev.write_at(buf, a.member_byte(role, stripe_sector))?;
        }
    }
    Ok(true)
}
