//! The raid5/6 journal device (md's raid5-cache): the log, its replay, and the appends of
//! write-through (data and parity per stripe write) and write-back (data-only records, then
//! parity at write-out; the cache itself is in `writeback.rs`).
//!
//! Write-through closes the write hole: before a stripe's member writes begin, its new data
//! and parity are appended to the journal and flushed. After a crash, replay on assembly
//! rewrites every complete row found after `journal_tail`, so parity matches data again
//! whatever subset of the member writes landed.
//!
//! The hook API, for the raid5 write path and assembly:
//! - [`Journal::format`] (create) / [`Journal::load`] (assemble) over the journal member;
//! - [`Journal::replay`] once on assembly, before any write; persist the tail it returns;
//! - per stripe write, under the stripe lock: [`Journal::append_stripe`] before the member
//!   writes, [`Journal::stripe_written`] with its ticket after them (even if they failed:
//!   the array records member failures itself).
//!
//! The journal never overwrites a record whose member writes may not be durable: when the
//! ring is full it asks its [`JournalHost`] to flush the members and to record the new
//! `journal_tail` in the journal device's superblock, then reuses the space behind it.
//! The tail always points at a valid meta block: the oldest record still in flight, or
//! else a new empty meta block at the head.

use crate::error::ArrayError;
use crate::member::Member;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use thiserror::Error;
use uraid_core::geometry::ParityGeometry;
use uraid_core::journal::{
    self as fmt, LogLayout, LogRing, LogSeed, MetaBlock, Payload, Scan, ScanEnd, ScanStart,
    BLOCK_BYTES, BLOCK_SECTORS, SEQ_JUMP_AFTER_RECOVERY,
};
use uraid_core::{MemberIdx, MemberMap, SECTOR_BYTES};

/// Why the journal failed.
#[derive(Debug, Error)]
pub enum JournalError {
    /// IO on the journal device.
    #[error("journal {dev}: {source}")]
    Io {
        /// The journal device's name.
        dev: String,
        /// The error, kept whole.
        source: io::Error,
    },
    /// The journal superblock's tail points at no valid log.
    #[error("journal {dev}: no valid meta block at journal_tail {tail_sectors}: {source}")]
    NoLog {
        /// The journal device's name.
        dev: String,
        /// The tail, in sectors.
        tail_sectors: u64,
        /// What is wrong with the block there.
        source: fmt::JournalError,
    },
    /// The journal device has no room for a log.
    #[error("journal {dev}: data area of {sectors} sectors is too small")]
    TooSmall {
        /// The journal device's name.
        dev: String,
        /// Sectors in its data area.
        sectors: u64,
    },
    /// A write does not fit in the log even after reclaim.
    #[error("journal {dev}: {need_sectors} sectors do not fit in the ring ({free_sectors} free after reclaim)")]
    Full {
        /// The journal device's name.
        dev: String,
        /// Sectors the write needs.
        need_sectors: u64,
        /// Sectors free.
        free_sectors: u64,
    },
    /// A write the journal cannot log as given.
    #[error("journal: {0}")]
    BadWrite(&'static str),
    /// IO on the array's members (during replay).
    #[error("journal: array members: {0}")]
    Members(io::Error),
}

/// A journal that cannot log stops writes with its reason; reads go on. An IO error on
/// the journal device is a journal failure (EROFS for exports).
impl From<JournalError> for ArrayError {
    fn from(e: JournalError) -> ArrayError {
        match e {
            e @ JournalError::Io { .. } => ArrayError::JournalFailed(e.to_string()),
            e => ArrayError::Failed(format!("write journal: {e}")),
        }
    }
}

impl From<JournalError> for io::Error {
    fn from(e: JournalError) -> io::Error {
        match e {
            JournalError::Io { source, .. } | JournalError::Members(source) => source,
            other => io::Error::other(other.to_string()),
        }
    }
}

/// A meta block and the pages that follow it.
type Record<'a> = (MetaBlock, Vec<&'a [u8]>);

/// Where the journal lives on its member: md's data area of the journal device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalArea {
    /// Where the log starts on the journal device, in bytes.
    pub data_offset_bytes: u64,
    /// The journal superblock's `data_size`.
    pub size_sectors: u64,
}

/// What the journal needs from the array to reclaim space.
pub trait JournalHost {
    /// Make every completed member write durable (flush all members).
    fn flush_members(&self) -> io::Result<()>;
    /// Record `journal_tail` (the journal superblock's `recovery_offset`) durably.
    fn set_journal_tail(&self, tail_sectors: u64) -> io::Result<()>;
}

/// Where replay writes rows: the array's members.
pub trait ReplayTarget {
    /// Write one 4 KiB block at `member_sector` (relative to the data area) of `role`; a
    /// missing member is skipped (Ok).
    fn write_block(&self, role: MemberIdx, member_sector: u64, page: &[u8]) -> io::Result<()>;
    /// Makes the members' writes durable.
    fn flush(&self) -> io::Result<()>;
    /// Write one row of write-back data (`pages`: array sector, page) straight to the
    /// members, with parity computed from the other data members; Ok(false), having
    /// written nothing, when that cannot be done safely (a data member it needs is
    /// missing). Replay's fallback when the rows do not fit the new log.
    fn write_data_row(
        &self,
        _g: &ParityGeometry,
        _stripe_sector: u64,
        _pages: &[(u64, &[u8])],
    ) -> io::Result<bool> {
        Ok(false)
    }
}

/// Plain member devices and their data offsets (tests, tools).
pub struct MemberSet {
    /// The members by role; None where missing.
    pub devs: MemberMap<Option<Arc<dyn Member>>>,
    /// Each member's data offset, in bytes, by role.
    pub data_offset_bytes: MemberMap<u64>,
}

impl ReplayTarget for MemberSet {
    fn write_block(&self, role: MemberIdx, member_sector: u64, page: &[u8]) -> io::Result<()> {
        match &self.devs[role] {
            Some(dev) => dev.write_at(
                page,
                self.data_offset_bytes[role] + member_sector * SECTOR_BYTES,
            ),
            None => Ok(()),
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.devs.values().flatten().try_for_each(|d| d.flush())
    }
}

/// One md stripe (a 4 KiB row) of a write: its new data pages and its parity.
#[derive(Clone, Debug)]
pub struct RowWrite<'a> {
    /// Member sector of the row (md's `sh->sector`), a multiple of 8.
    pub stripe_sector: u64,
    /// (array sector, 4 KiB page) of every data page the write changes in this row.
    pub data: Vec<(u64, &'a [u8])>,
    /// P, then Q for raid6; 4 KiB each.
    pub parity: Vec<&'a [u8]>,
}

/// The rows of one chunk-high stripe write, for [`Journal::append_stripe`].
///
/// `pieces[i]` is the byte range written in logical data chunk `i` (start in the chunk,
/// new bytes); `p`/`q` hold parity for chunk bytes `[lo, hi)`, the union of the pieces.
/// Every start and length must be a multiple of 4 KiB: the journal logs whole pages, so a
/// sub-page write must be widened to pages (with the old bytes) first, as md does.
pub fn rows_for_stripe<'a>(
    g: &ParityGeometry,
    stripe: u64,
    pieces: &[Option<(usize, &'a [u8])>],
    p: &'a [u8],
    q: Option<&'a [u8]>,
) -> Result<Vec<RowWrite<'a>>, JournalError> {
    let page = BLOCK_BYTES;
    let lo = pieces.iter().flatten().map(|(s, _)| *s).min();
    let hi = pieces.iter().flatten().map(|(s, d)| s + d.len()).max();
    let (Some(lo), Some(hi)) = (lo, hi) else {
        return Ok(Vec::new());
    };
    let aligned = pieces
        .iter()
        .flatten()
        .all(|(s, d)| s % page == 0 && d.len() % page == 0);
    if !aligned {
        return Err(JournalError::BadWrite(
            "a stripe write is not in whole pages",
        ));
    }
    let chunk_bytes = (g.chunk_sectors * SECTOR_BYTES) as usize;
    if hi > chunk_bytes {
        return Err(JournalError::BadWrite("a piece runs past its chunk"));
    }
    if p.len() != hi - lo || q.is_some_and(|q| q.len() != hi - lo) {
        return Err(JournalError::BadWrite("parity does not cover the write"));
    }
    if pieces.len() != g.data_disks() || (q.is_some() != (g.parity_disks() == 2)) {
        return Err(JournalError::BadWrite("pieces do not match the geometry"));
    }
    let mut rows = Vec::new();
    for row in (lo..hi).step_by(page) {
        let row_sectors = (row / page) as u64 * BLOCK_SECTORS;
        let mut data = Vec::new();
        for (i, pc) in pieces.iter().enumerate() {
            if let Some((s, d)) = pc {
                if (*s..s + d.len()).contains(&row) {
                    let loc = g.array_sector(stripe, i) + row_sectors;
                    data.push((loc, &d[row - s..row - s + page]));
                }
            }
        }
        if data.is_empty() {
            continue;
        }
        let mut parity = vec![&p[row - lo..row - lo + page]];
        if let Some(q) = q {
            parity.push(&q[row - lo..row - lo + page]);
        }
        rows.push(RowWrite {
            stripe_sector: g.member_sector(stripe, row_sectors),
            data,
            parity,
        });
    }
    Ok(rows)
}

/// A logged stripe whose member writes are under way; give it back to
/// [`Journal::stripe_written`].
#[derive(Debug)]
#[must_use = "a ticket pins its journal space until stripe_written"]
pub struct LogTicket {
    first_seq: u64,
}

impl LogTicket {
    /// Sequence number of the ticket's first record (log order).
    pub(crate) fn seq(&self) -> u64 {
        self.first_seq
    }
}

/// What a replay did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayReport {
    /// Rows rewritten to the members.
    pub stripes: usize,
    /// Rows with data but no parity: write-back data, carried over into the new log and
    /// handed to the array with [`Journal::take_recovered`].
    pub data_only: usize,
    /// Pages in the data-only rows.
    pub data_only_pages: usize,
    /// Meta blocks read.
    pub meta_blocks: u64,
    /// The new `journal_tail`: the caller records it in the journal superblock.
    pub tail_sectors: u64,
    /// Why the scan of the log stopped.
    pub why_stopped: ScanEnd,
}

struct LogState {
    /// Where the next record goes, and its seq.
    head: u64,
    seq: u64,
    /// journal_tail as last recorded, and the seq of the meta block there.
    tail: u64,
    tail_seq: u64,
    /// Records whose member writes are in flight: seq -> position.
    inflight: BTreeMap<u64, u64>,
}

/// A journal member in md's raid5-cache format.
pub struct Journal {
    dev: Arc<dyn Member>,
    area: JournalArea,
    ring: LogRing,
    seed: LogSeed,
    state: Mutex<LogState>,
    /// An IO error on the journal device failed the journal: no more appends.
    failed: AtomicBool,
    /// Sectors kept free for write-back's write-outs: added by data-only appends, given
    /// back by the cache ([`Journal::unreserve`]).
    reserved: AtomicU64,
    /// Write-back data found by replay and logged again in the new log, until the array
    /// takes it ([`Journal::take_recovered`]) and writes it out.
    recovered: Mutex<Option<Recovered>>,
}

/// Write-back data (data-only rows) that replay carried over into the new log: the pages
/// and the tickets that pin them there until they reach the members.
pub struct Recovered {
    /// (array sector, 4 KiB page), newest copy of each page, in log order per row.
    pub pages: Vec<(u64, Vec<u8>)>,
    /// The tickets that keep those pages in the log.
    pub tickets: Vec<LogTicket>,
}

impl Journal {
    fn new(
        dev: Arc<dyn Member>,
        area: JournalArea,
        set_uuid: &[u8; 16],
    ) -> Result<(Journal, LogRing), JournalError> {
        let ring = LogRing::new(area.size_sectors).ok_or_else(|| JournalError::TooSmall {
            dev: dev.name(),
            sectors: area.size_sectors,
        })?;
        let j = Journal {
            dev,
            area,
            ring,
            seed: LogSeed::from_uuid(set_uuid),
            state: Mutex::new(LogState {
                head: 0,
                seq: 0,
                tail: 0,
                tail_seq: 0,
                inflight: BTreeMap::new(),
            }),
            failed: AtomicBool::new(false),
            reserved: AtomicU64::new(0),
            recovered: Mutex::new(None),
        };
        Ok((j, ring))
    }

    /// A new, empty journal (create, or md's reaction to no log at the tail): an empty meta
    /// block at sector 0 with `seq` (md picks it at random). The tail is 0.
    pub fn format(
        dev: Arc<dyn Member>,
        area: JournalArea,
        set_uuid: &[u8; 16],
        seq: u64,
    ) -> Result<Journal, JournalError> {
        let (j, ring) = Journal::new(dev, area, set_uuid)?;
        j.write_empty(0, seq)?;
        j.flush_log()?;
        let mut st = j.state.lock().unwrap();
        st.head = ring.add(0, BLOCK_SECTORS);
        st.seq = seq.wrapping_add(1);
        st.tail = 0;
        st.tail_seq = seq;
        drop(st);
        Ok(j)
    }

    /// Open an existing journal at `tail_sectors` (the superblock's journal_tail). Call
    /// [`Journal::replay`] before appending.
    pub fn load(
        dev: Arc<dyn Member>,
        area: JournalArea,
        set_uuid: &[u8; 16],
        tail_sectors: u64,
    ) -> Result<Journal, JournalError> {
        let (j, ring) = Journal::new(dev, area, set_uuid)?;
        let no_log = |source| JournalError::NoLog {
            dev: j.dev.name(),
            tail_sectors,
            source,
        };
        if !ring.is_block(tail_sectors) {
            return Err(no_log(fmt::JournalError::BadPayload {
                offset: 0,
                why: "journal_tail is not a block of the data area",
            }));
        }
        let mut b = vec![0u8; BLOCK_BYTES];
        j.read_block(tail_sectors, &mut b)?;
        let mb = MetaBlock::decode(&b, j.seed).map_err(no_log)?;
        if mb.position_sectors != tail_sectors {
            return Err(no_log(fmt::JournalError::BadPayload {
                offset: 24,
                why: "meta block at journal_tail names another position",
            }));
        }
        let mut st = j.state.lock().unwrap();
        // Until replay, appending is not allowed: head == tail marks "not replayed".
        st.head = tail_sectors;
        st.seq = mb.seq;
        st.tail = tail_sectors;
        st.tail_seq = mb.seq;
        drop(st);
        Ok(j)
    }

    /// The log's tail (md's journal_tail), in sectors.
    pub fn tail_sectors(&self) -> u64 {
        self.state.lock().unwrap().tail
    }

    /// The ring's geometry.
    pub fn ring(&self) -> LogRing {
        self.ring
    }

    /// The journal device failed an IO (or was failed by request): appends are refused.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Fail the journal (an IO error elsewhere, or by request).
    pub fn set_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// The journal device's name.
    pub fn device_name(&self) -> String {
        self.dev.name()
    }

    /// (sectors in use between tail and head, size of the ring).
    pub fn space(&self) -> (u64, u64) {
        let st = self.state.lock().unwrap();
        (
            self.ring.distance(st.tail, st.head),
            self.ring.size_sectors(),
        )
    }

    /// Make every record appended so far durable (write-back's flush and FUA).
    pub fn flush(&self) -> Result<(), JournalError> {
        if self.is_failed() {
            return Err(self.failed_err());
        }
        self.flush_log()
    }

    fn failed_err(&self) -> JournalError {
        JournalError::Io {
            dev: self.dev.name(),
            source: io::Error::other("the journal has failed"),
        }
    }

    /// Move the tail up to the oldest pinned record now (flushing the members), instead of
    /// waiting for the ring to fill. Write-back calls it when half the ring is in use, so
    /// that the log after the tail stays short: replay must fit the cached data into the
    /// space the old log leaves free.
    pub fn reclaim_now(&self, host: &dyn JournalHost) -> Result<(), JournalError> {
        if self.is_failed() {
            return Err(self.failed_err());
        }
        let mut st = self.state.lock().unwrap();
        if st.head == st.tail {
            return Ok(()); // not replayed yet
        }
        self.reclaim(&mut st, host)
    }

    /// The write-back data that replay carried over, once.
    pub fn take_recovered(&self) -> Option<Recovered> {
        self.recovered.lock().unwrap().take()
    }

    fn byte(&self, pos: u64) -> u64 {
        self.area.data_offset_bytes + pos * SECTOR_BYTES
    }

    fn io_err(&self, source: io::Error) -> JournalError {
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(
                "journal {}: {source}; the journal has failed",
                self.dev.name()
            );
        }
        JournalError::Io {
            dev: self.dev.name(),
            source,
        }
    }

    fn read_block(&self, pos: u64, buf: &mut [u8]) -> Result<(), JournalError> {
        self.dev
            .read_at(buf, self.byte(pos))
            .map_err(|e| self.io_err(e))
    }

    fn write_block(&self, pos: u64, buf: &[u8]) -> Result<(), JournalError> {
        assert!(self.ring.is_block(pos) && buf.len() == BLOCK_BYTES);
        self.dev
            .write_at(buf, self.byte(pos))
            .map_err(|e| self.io_err(e))
    }

    fn flush_log(&self) -> Result<(), JournalError> {
        self.dev.flush().map_err(|e| self.io_err(e))
    }

    fn write_empty(&self, pos: u64, seq: u64) -> Result<(), JournalError> {
        let mb = MetaBlock {
            seq,
            position_sectors: pos,
            payloads: Vec::new(),
        };
        let b = mb.encode(self.seed).expect("an empty meta block fits");
        self.write_block(pos, &b)
    }

    /// Scan the log from the tail without changing anything.
    pub fn scan(&self, layout: &dyn LogLayout) -> Result<Scan, JournalError> {
        let st = self.state.lock().unwrap();
        let start = ScanStart {
            tail_sectors: st.tail,
            seq: st.tail_seq,
        };
        drop(st);
        fmt::scan(&self.ring, self.seed, layout, start, |pos, buf| {
            self.read_block(pos, buf)
        })
    }

    /// Recovery on assembly: rewrite every complete row found after the tail to the members,
    /// flush them, then start a new log after the last valid record, with the seq jumped as
    /// md does. Returns the new tail, which the caller records as journal_tail.
    ///
    /// A crash during replay is safe: the old tail and log stay valid until the new empty
    /// meta block is written, and replaying the same rows twice writes the same bytes.
    pub fn replay(
        &self,
        g: &ParityGeometry,
        target: &dyn ReplayTarget,
    ) -> Result<ReplayReport, JournalError> {
        let scan_start_tail = self.state.lock().unwrap().tail;
        let scan = {
            let st = self.state.lock().unwrap();
            assert_eq!(st.head, st.tail, "replay runs once, right after load");
            let start = ScanStart {
                tail_sectors: st.tail,
                seq: st.seq,
            };
            drop(st);
            fmt::scan(&self.ring, self.seed, g, start, |pos, buf| {
                self.read_block(pos, buf)
            })?
        };
        let mut page = vec![0u8; BLOCK_BYTES];
        for s in &scan.stripes {
            let stripe = s.stripe_sector / g.chunk_sectors;
            let row = s.stripe_sector % g.chunk_sectors;
            let map = g.stripe_map(stripe);
            for d in &s.data {
                let loc = g.locate(d.location_sectors);
                assert!(
                    loc.stripe == stripe && loc.offset_sectors == row,
                    "scan mapped it"
                );
                self.read_page(d, &mut page)?;
                target
                    .write_block(map.data[loc.data_index], s.stripe_sector, &page)
                    .map_err(JournalError::Members)?;
            }
            let roles = [Some(map.p), map.q];
            for (p, role) in s.parity.iter().zip(roles.iter().flatten()) {
                self.read_page(p, &mut page)?;
                target
                    .write_block(*role, s.stripe_sector, &page)
                    .map_err(JournalError::Members)?;
            }
        }
        target.flush().map_err(JournalError::Members)?;
        // Write-back data (rows with data but no parity) is carried over into the new log,
        // as md does: read it now, log it again after the new tail block, and only then
        // may the caller record the new tail. A crash before that finds the old log whole.
        let mut cached: Vec<(u64, Vec<u8>)> = Vec::new();
        for s in &scan.data_only {
            for d in &s.data {
                let mut b = vec![0u8; BLOCK_BYTES];
                self.read_page(d, &mut b)?;
                cached.push((d.location_sectors, b));
            }
        }
        let end = scan.end;
        // The old log (old tail .. end) must stay intact until the new tail is recorded, so
        // the carried-over records must fit in the rest of the ring. If they do not, write
        // the rows straight to the members instead: parity from the logged pages and the
        // other data members, which this does not change, so a crash during it replays the
        // same way (a row whose unlogged data member is missing cannot be done so).
        let old_used = self.ring.distance(scan_start_tail, end.tail_sectors);
        let relog_sectors: u64 = {
            let refs: Vec<(u64, &[u8])> = cached.iter().map(|(l, b)| (*l, &b[..])).collect();
            self.data_records(&refs)?
                .iter()
                .map(|(m, _)| m.record_sectors())
                .sum()
        };
        if !cached.is_empty()
            && relog_sectors + BLOCK_SECTORS + old_used >= self.ring.size_sectors()
        {
            let mut at = 0;
            for s in &scan.data_only {
                let row: Vec<(u64, &[u8])> = cached[at..at + s.data.len()]
                    .iter()
                    .map(|(l, b)| (*l, &b[..]))
                    .collect();
                at += s.data.len();
                let done = target
                    .write_data_row(g, s.stripe_sector, &row)
                    .map_err(JournalError::Members)?;
                if !done {
                    return Err(JournalError::Full {
                        dev: self.dev.name(),
                        need_sectors: relog_sectors,
                        free_sectors: self.ring.size_sectors() - old_used - BLOCK_SECTORS,
                    });
                }
            }
            target.flush().map_err(JournalError::Members)?;
            tracing::info!(
                "journal: {} pages of write-back data written straight to the members",
                cached.len()
            );
            cached.clear();
        }
        let seq = end.seq.wrapping_add(SEQ_JUMP_AFTER_RECOVERY);
        self.write_empty(end.tail_sectors, seq)?;
        let mut st = self.state.lock().unwrap();
        st.tail = end.tail_sectors;
        st.tail_seq = seq;
        st.head = self.ring.add(end.tail_sectors, BLOCK_SECTORS);
        st.seq = seq.wrapping_add(1);
        let mut tickets = Vec::new();
        if !cached.is_empty() {
            let refs: Vec<(u64, &[u8])> = cached.iter().map(|(l, b)| (*l, &b[..])).collect();
            let records = self.data_records(&refs)?;
            let first_seq = self.write_records(&mut st, records)?;
            tickets.push(LogTicket { first_seq });
        }
        drop(st);
        self.flush_log()?;
        let data_only_pages = cached.len();
        if !cached.is_empty() {
            *self.recovered.lock().unwrap() = Some(Recovered {
                pages: cached,
                tickets,
            });
        }
        Ok(ReplayReport {
            stripes: scan.stripes.len(),
            data_only: scan.data_only.len(),
            data_only_pages,
            meta_blocks: scan.meta_blocks,
            tail_sectors: end.tail_sectors,
            why_stopped: scan.why,
        })
    }

    fn read_page(&self, p: &fmt::LoggedPage, buf: &mut [u8]) -> Result<(), JournalError> {
        self.read_block(p.log_sectors, buf)?;
        // The scan verified it; nothing writes the log during replay.
        assert_eq!(
            self.seed.page_checksum(buf),
            p.checksum,
            "journal page changed"
        );
        Ok(())
    }

    /// The raid5 write path's hook: [`rows_for_stripe`] then [`Journal::append_stripe`].
    pub fn log_stripe(
        &self,
        g: &ParityGeometry,
        stripe: u64,
        pieces: &[Option<(usize, &[u8])>],
        p: &[u8],
        q: Option<&[u8]>,
        host: &dyn JournalHost,
    ) -> Result<LogTicket, JournalError> {
        let rows = rows_for_stripe(g, stripe, pieces, p, q)?;
        self.append_stripe(&rows, host)
    }

    /// Log the rows of one stripe write and flush the journal (write-through). Returns once
    /// the rows are durable; the caller then writes the members and hands the ticket to
    /// [`Journal::stripe_written`].
    pub fn append_stripe(
        &self,
        rows: &[RowWrite<'_>],
        host: &dyn JournalHost,
    ) -> Result<LogTicket, JournalError> {
        self.append_rows(rows, host, true)
    }

    /// Reserve log space for write-back's write-outs (cached data that came without an
    /// append: carried over by replay).
    pub(crate) fn reserve(&self, sectors: u64) {
        self.reserved.fetch_add(sectors, Ordering::SeqCst);
    }

    /// Give back log space reserved by [`Journal::append_data`] (write-back's cache no
    /// longer needs it: written out, or less than reserved).
    pub(crate) fn unreserve(&self, sectors: u64) {
        let prev = self.reserved.fetch_sub(sectors, Ordering::SeqCst);
        assert!(prev >= sectors, "unreserve more than was reserved");
    }

    /// Write-back's write-out hook: log only the parity of rows whose data pages are
    /// already in the log as data-only records (md's r5c logs parity at write-out the
    /// same way), and flush. `pieces` must be all the cached pages of every row touched:
    /// replay pairs the parity with every data page logged for the row since its last
    /// parity.
    pub fn log_parity(
        &self,
        g: &ParityGeometry,
        stripe: u64,
        pieces: &[Option<(usize, &[u8])>],
        p: &[u8],
        q: Option<&[u8]>,
        host: &dyn JournalHost,
    ) -> Result<LogTicket, JournalError> {
        let rows = rows_for_stripe(g, stripe, pieces, p, q)?;
        self.append_rows(&rows, host, false)
    }

    fn append_rows(
        &self,
        rows: &[RowWrite<'_>],
        host: &dyn JournalHost,
        with_data: bool,
    ) -> Result<LogTicket, JournalError> {
        let parity_pages = rows.first().map_or(0, |r| r.parity.len());
        for r in rows {
            let pages_ok = r
                .data
                .iter()
                .all(|(loc, d)| d.len() == BLOCK_BYTES && loc % 8 == 0)
                && r.parity.iter().all(|p| p.len() == BLOCK_BYTES);
            if !pages_ok || r.data.is_empty() || r.parity.len() != parity_pages || parity_pages == 0
            {
                return Err(JournalError::BadWrite(
                    "a row is not whole pages of data and parity",
                ));
            }
            if r.stripe_sector % BLOCK_SECTORS != 0 {
                return Err(JournalError::BadWrite("a row does not start on a page"));
            }
        }
        // Pack rows into meta blocks; a row never spans two records (md keeps a stripe's
        // payloads in one io_unit).
        let mut records: Vec<(MetaBlock, Vec<&[u8]>)> = Vec::new();
        let mut cur: Vec<Payload> = Vec::new();
        let mut cur_pages: Vec<&[u8]> = Vec::new();
        let mut cur_bytes = fmt::META_HEADER_BYTES;
        for r in rows {
            let data = if with_data { &r.data[..] } else { &[] };
            let mut payloads: Vec<Payload> = data
                .iter()
                .map(|(loc, d)| Payload::Data {
                    flags: 0,
                    location_sectors: *loc,
                    checksums: vec![self.seed.page_checksum(d)],
                })
                .collect();
            payloads.push(Payload::Parity {
                flags: 0,
                location_sectors: r.stripe_sector,
                checksums: r
                    .parity
                    .iter()
                    .map(|p| self.seed.page_checksum(p))
                    .collect(),
            });
            let bytes: usize = payloads.iter().map(Payload::encoded_bytes).sum();
            if cur_bytes + bytes > BLOCK_BYTES && !cur.is_empty() {
                records.push((
                    meta(std::mem::take(&mut cur)),
                    std::mem::take(&mut cur_pages),
                ));
                cur_bytes = fmt::META_HEADER_BYTES;
            }
            if cur_bytes + bytes > BLOCK_BYTES {
                return Err(JournalError::BadWrite("a row does not fit one meta block"));
            }
            cur_bytes += bytes;
            cur.extend(payloads);
            cur_pages.extend(data.iter().map(|(_, d)| *d));
            cur_pages.extend(r.parity.iter().copied());
        }
        if !cur.is_empty() {
            records.push((meta(cur), cur_pages));
        }
        fn meta(payloads: Vec<Payload>) -> MetaBlock {
            MetaBlock {
                seq: 0,
                position_sectors: 0,
                payloads,
            }
        }
        // Appends with data leave write-back's reserve alone; parity-only ones (write-outs)
        // may use it.
        self.append_records(records, host, true, with_data, 0)
    }

    /// Log data pages without parity (write-back, md's data-only records): `pages` are
    /// (array sector, 4 KiB page). Not flushed: [`Journal::flush`] makes them durable.
    /// The ticket pins the records until the data reaches the members.
    pub fn append_data(
        &self,
        pages: &[(u64, &[u8])],
        host: &dyn JournalHost,
        keep_free_sectors: u64,
    ) -> Result<LogTicket, JournalError> {
        if pages.is_empty()
            || pages
                .iter()
                .any(|(l, p)| l % 8 != 0 || p.len() != BLOCK_BYTES)
        {
            return Err(JournalError::BadWrite("data pages are not whole pages"));
        }
        let records = self.data_records(pages)?;
        self.append_records(records, host, false, true, keep_free_sectors)
    }

    /// Data-only records for `pages`, packed into as few meta blocks as fit.
    fn data_records<'a>(&self, pages: &[(u64, &'a [u8])]) -> Result<Vec<Record<'a>>, JournalError> {
        let per = (BLOCK_BYTES - fmt::META_HEADER_BYTES) / (fmt::DATA_PARITY_HEADER_BYTES + 4);
        Ok(pages
            .chunks(per)
            .map(|c| {
                let payloads = c
                    .iter()
                    .map(|(loc, d)| Payload::Data {
                        flags: 0,
                        location_sectors: *loc,
                        checksums: vec![self.seed.page_checksum(d)],
                    })
                    .collect();
                let mb = MetaBlock {
                    seq: 0,
                    position_sectors: 0,
                    payloads,
                };
                (mb, c.iter().map(|(_, d)| *d).collect())
            })
            .collect())
    }

    /// Append records. With `respect_reserve`, write-back's reserve (space to log the
    /// parity of its cache) plus `add_reserve` must stay free after them, and
    /// `add_reserve` joins the reserve: md reserves log space the same way, or the oldest
    /// cached stripe could pin the tail with no room left to log its parity.
    fn append_records(
        &self,
        records: Vec<Record<'_>>,
        host: &dyn JournalHost,
        flush: bool,
        respect_reserve: bool,
        add_reserve: u64,
    ) -> Result<LogTicket, JournalError> {
        if self.is_failed() {
            return Err(self.failed_err());
        }
        let need: u64 = records.iter().map(|(m, _)| m.record_sectors()).sum();
        let mut st = self.state.lock().unwrap();
        // Read under the state lock: reservations are added under it too.
        let keep_free = if respect_reserve {
            self.reserved.load(Ordering::SeqCst) + add_reserve
        } else {
            0
        };
        assert_ne!(st.head, st.tail, "append before replay");
        if !self.fits(&st, need + keep_free) {
            self.reclaim(&mut st, host)?;
        }
        // A stripe write (flush) may wait a little for space pinned by stripe writes in
        // flight in other threads; data-only appends return at once (write-back frees
        // space by writing its cache out).
        let mut waits = 0;
        while flush && !self.fits(&st, need + keep_free) && !st.inflight.is_empty() && waits < 1000
        {
            drop(st);
            std::thread::sleep(std::time::Duration::from_millis(1));
            waits += 1;
            st = self.state.lock().unwrap();
            self.reclaim(&mut st, host)?;
        }
        if !self.fits(&st, need + keep_free) {
            let used = self.ring.distance(st.tail, st.head);
            return Err(JournalError::Full {
                dev: self.dev.name(),
                need_sectors: need,
                free_sectors: self.ring.size_sectors() - used,
            });
        }
        let first_seq = self.write_records(&mut st, records)?;
        self.reserved.fetch_add(add_reserve, Ordering::SeqCst);
        // Write-through: durable before any member write of the stripe begins.
        if flush {
            self.flush_log()?;
        }
        Ok(LogTicket { first_seq })
    }

    /// Write records at the head; the first one is pinned (in flight) from now on.
    fn write_records(
        &self,
        st: &mut LogState,
        records: Vec<Record<'_>>,
    ) -> Result<u64, JournalError> {
        let first_seq = st.seq;
        let first_pos = st.head;
        for (mut mb, pages) in records {
            mb.seq = st.seq;
            mb.position_sectors = st.head;
            let b = mb.encode(self.seed).expect("packed to fit");
            self.write_block(st.head, &b)?;
            let mut pos = self.ring.add(st.head, BLOCK_SECTORS);
            for p in pages {
                self.write_block(pos, p)?;
                pos = self.ring.add(pos, BLOCK_SECTORS);
            }
            st.head = pos;
            st.seq = st.seq.wrapping_add(1);
        }
        st.inflight.insert(first_seq, first_pos);
        Ok(first_seq)
    }

    /// The member writes of a logged stripe are done (issued and completed, failed or
    /// not); its journal space may be reclaimed once the members are flushed.
    pub fn stripe_written(&self, ticket: LogTicket) {
        let mut st = self.state.lock().unwrap();
        let was = st.inflight.remove(&ticket.first_seq);
        assert!(was.is_some(), "ticket of this journal, given back once");
    }

    /// Whether `need` sectors fit between head and tail, leaving the tail block alone.
    fn fits(&self, st: &LogState, need: u64) -> bool {
        let used = self.ring.distance(st.tail, st.head);
        used + need < self.ring.size_sectors()
    }

    /// Move the tail up to the oldest record still in flight: flush the members so that
    /// everything before it is durable in place, then record the tail. With nothing in
    /// flight the whole log is done: an empty meta block at the head becomes the tail (as
    /// after a replay), so only that block stays pinned.
    fn reclaim(&self, st: &mut LogState, host: &dyn JournalHost) -> Result<(), JournalError> {
        host.flush_members().map_err(JournalError::Members)?;
        let (new_tail, new_tail_seq) = match st.inflight.first_key_value() {
            Some((&seq, &pos)) => (pos, seq),
            None => {
                // Fits: after every append the log leaves at least one block free.
                let (pos, seq) = (st.head, st.seq);
                self.write_empty(pos, seq)?;
                self.flush_log()?;
                st.head = self.ring.add(pos, BLOCK_SECTORS);
                st.seq = seq.wrapping_add(1);
                (pos, seq)
            }
        };
        if new_tail == st.tail {
            return Ok(());
        }
        host.set_journal_tail(new_tail)
            .map_err(JournalError::Members)?;
        st.tail = new_tail;
        st.tail_seq = new_tail_seq;
        Ok(())
    }
}
