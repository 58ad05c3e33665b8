//! The raid5/6 journal in Linux md's raid5-cache format: meta block codec and replay scanner.
//!
//! The journal device's data area is a ring of 4 KiB blocks. Each record is one meta block
//! followed by the pages its payloads describe, in payload order:
//!
//! ```text
//! | meta(seq n, pos p) | data | data | P | Q | meta(seq n+1, pos p') | ...
//! ```
//!
//! - a DATA payload is one 4 KiB page of array data; `location` is its array sector;
//! - a PARITY payload is P (and Q for raid6) of one md stripe (a 4 KiB row across the
//!   members); `location` is the row's member sector (md's `sh->sector`);
//! - a FLUSH payload lists rows that reached the members (write-back only; no pages).
//!
//! Every checksum is md's `crc32c_le` (no pre/post inversion) seeded with the crc of the
//! array UUID, so that a journal of another array never replays here. The meta block checksum
//! covers the whole 4 KiB block with the checksum field zero; page checksums cover one page.
//!
//! Replay starts at `journal_tail` (the journal device's superblock `recovery_offset`),
//! whose meta block gives the first sequence number; each next meta block must sit right
//! after the previous record with the next sequence number. The first block that is not
//! such a meta block, or whose pages fail their checksums, ends the log. See
//! docs/FORMAT.md, "Journal (raid5-cache)".

use crate::geometry::ParityGeometry;
use std::collections::BTreeMap;
use thiserror::Error;

pub const R5LOG_MAGIC: u32 = 0x6433_c509;
pub const R5LOG_VERSION: u8 = 1;
/// Journal block (md's PAGE_SIZE on x86).
pub const BLOCK_BYTES: usize = 4096;
pub const BLOCK_SECTORS: u64 = 8;
/// `struct r5l_meta_block` without its payloads.
pub const META_HEADER_BYTES: usize = 32;
/// `struct r5l_payload_data_parity` without its checksums.
pub const DATA_PARITY_HEADER_BYTES: usize = 16;
/// `struct r5l_payload_flush` without its stripe list.
pub const FLUSH_HEADER_BYTES: usize = 8;

pub const PAYLOAD_DATA: u16 = 0;
pub const PAYLOAD_PARITY: u16 = 1;
pub const PAYLOAD_FLUSH: u16 = 2;

/// After a replay md restarts the log this far ahead in sequence, so that valid records of
/// an older lap beyond the new start can never pass for the continuation.
pub const SEQ_JUMP_AFTER_RECOVERY: u64 = 10_000;

mod off {
    pub const MAGIC: usize = 0;
    pub const CHECKSUM: usize = 4;
    pub const VERSION: usize = 8;
    pub const META_SIZE: usize = 12;
    pub const SEQ: usize = 16;
    pub const POSITION: usize = 24;
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum JournalError {
    #[error("journal block is {0} bytes, need {BLOCK_BYTES}")]
    ShortBlock(usize),
    #[error("no journal meta block (magic {0:#010x}, expected {R5LOG_MAGIC:#010x})")]
    BadMagic(u32),
    #[error("unsupported journal version {0} (uraid reads version {R5LOG_VERSION})")]
    BadVersion(u8),
    #[error(
        "journal meta block checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
    )]
    BadChecksum { stored: u32, computed: u32 },
    #[error("journal meta_size {0} is outside {META_HEADER_BYTES}..={BLOCK_BYTES}")]
    BadMetaSize(u32),
    #[error("journal payload at byte {offset}: {why}")]
    BadPayload { offset: usize, why: &'static str },
    #[error("journal meta block needs {0} bytes of payload headers, more than one block")]
    TooLarge(usize),
}

/// md's `crc32c_le(seed, data)`: CRC-32C with the register starting at `seed` and no final
/// inversion (the `crc32c` crate inverts on the way in and out).
pub fn crc32c_le(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// The seed of every journal checksum: md's `log->uuid_checksum`, the crc of the array UUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSeed(pub u32);

impl LogSeed {
    pub fn from_uuid(set_uuid: &[u8; 16]) -> LogSeed {
        LogSeed(crc32c_le(!0, set_uuid))
    }

    /// Checksum of one 4 KiB data or parity page.
    pub fn page_checksum(self, page: &[u8]) -> u32 {
        crc32c_le(self.0, page)
    }
}

/// One payload of a meta block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Array data; one checksum per 4 KiB page (md writes one page per payload).
    Data {
        flags: u16,
        location_sectors: u64,
        checksums: Vec<u32>,
    },
    /// P (and Q) of the row at member sector `location_sectors`; one checksum per page.
    Parity {
        flags: u16,
        location_sectors: u64,
        checksums: Vec<u32>,
    },
    /// Rows (member sectors) whose cached data reached the members.
    Flush {
        flags: u16,
        stripe_sectors: Vec<u64>,
    },
}

impl Payload {
    /// Bytes this payload takes in the meta block.
    pub fn encoded_bytes(&self) -> usize {
        match self {
            Payload::Data { checksums, .. } | Payload::Parity { checksums, .. } => {
                DATA_PARITY_HEADER_BYTES + 4 * checksums.len()
            }
            Payload::Flush { stripe_sectors, .. } => FLUSH_HEADER_BYTES + 8 * stripe_sectors.len(),
        }
    }

    /// Sectors of pages this payload places after the meta block.
    pub fn log_sectors(&self) -> u64 {
        match self {
            Payload::Data { checksums, .. } | Payload::Parity { checksums, .. } => {
                checksums.len() as u64 * BLOCK_SECTORS
            }
            Payload::Flush { .. } => 0,
        }
    }
}

/// One meta block (`struct r5l_meta_block` and its payloads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaBlock {
    pub seq: u64,
    /// Sector of this block in the journal's data area (md checks it against where it is).
    pub position_sectors: u64,
    pub payloads: Vec<Payload>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl MetaBlock {
    /// `meta_size`: header plus payload headers, in bytes.
    pub fn meta_size(&self) -> usize {
        META_HEADER_BYTES
            + self
                .payloads
                .iter()
                .map(Payload::encoded_bytes)
                .sum::<usize>()
    }

    /// Sectors of pages that follow this meta block.
    pub fn payload_sectors(&self) -> u64 {
        self.payloads.iter().map(Payload::log_sectors).sum()
    }

    /// Sectors of the whole record: the meta block and its pages.
    pub fn record_sectors(&self) -> u64 {
        BLOCK_SECTORS + self.payload_sectors()
    }

    /// Encode into one 4 KiB block, zero beyond `meta_size`, checksummed.
    pub fn encode(&self, seed: LogSeed) -> Result<Vec<u8>, JournalError> {
        let meta_size = self.meta_size();
        if meta_size > BLOCK_BYTES {
            return Err(JournalError::TooLarge(meta_size));
        }
        let mut b = vec![0u8; BLOCK_BYTES];
        b[off::MAGIC..off::MAGIC + 4].copy_from_slice(&R5LOG_MAGIC.to_le_bytes());
        b[off::VERSION] = R5LOG_VERSION;
        b[off::META_SIZE..off::META_SIZE + 4].copy_from_slice(&(meta_size as u32).to_le_bytes());
        b[off::SEQ..off::SEQ + 8].copy_from_slice(&self.seq.to_le_bytes());
        b[off::POSITION..off::POSITION + 8].copy_from_slice(&self.position_sectors.to_le_bytes());
        let mut at = META_HEADER_BYTES;
        for (i, p) in self.payloads.iter().enumerate() {
            let bad = |why| JournalError::BadPayload { offset: at, why };
            let (ty, flags) = match p {
                Payload::Data { flags, .. } => (PAYLOAD_DATA, *flags),
                Payload::Parity { flags, .. } => (PAYLOAD_PARITY, *flags),
                Payload::Flush { flags, .. } => (PAYLOAD_FLUSH, *flags),
            };
            b[at..at + 2].copy_from_slice(&ty.to_le_bytes());
            b[at + 2..at + 4].copy_from_slice(&flags.to_le_bytes());
            match p {
                Payload::Data {
                    location_sectors,
                    checksums,
                    ..
                }
                | Payload::Parity {
                    location_sectors,
                    checksums,
                    ..
                } => {
                    if checksums.is_empty() {
                        return Err(bad("a data or parity payload without pages"));
                    }
                    let size = u32::try_from(checksums.len() as u64 * BLOCK_SECTORS)
                        .map_err(|_| bad("payload size does not fit 32 bits"))?;
                    b[at + 4..at + 8].copy_from_slice(&size.to_le_bytes());
                    b[at + 8..at + 16].copy_from_slice(&location_sectors.to_le_bytes());
                    for (k, c) in checksums.iter().enumerate() {
                        let o = at + DATA_PARITY_HEADER_BYTES + 4 * k;
                        b[o..o + 4].copy_from_slice(&c.to_le_bytes());
                    }
                }
                Payload::Flush { stripe_sectors, .. } => {
                    let size = u32::try_from(stripe_sectors.len() * 8)
                        .map_err(|_| bad("flush size does not fit 32 bits"))?;
                    b[at + 4..at + 8].copy_from_slice(&size.to_le_bytes());
                    for (k, s) in stripe_sectors.iter().enumerate() {
                        let o = at + FLUSH_HEADER_BYTES + 8 * k;
                        b[o..o + 8].copy_from_slice(&s.to_le_bytes());
                    }
                }
            }
            at += self.payloads[i].encoded_bytes();
        }
        assert_eq!(at, meta_size, "payload bytes add up to meta_size");
        let crc = crc32c_le(seed.0, &b);
        b[off::CHECKSUM..off::CHECKSUM + 4].copy_from_slice(&crc.to_le_bytes());
        // Check the record again on the way out: what we write must read back.
        debug_assert_eq!(MetaBlock::decode(&b, seed).as_ref(), Ok(self));
        Ok(b)
    }

    /// Decode and validate one 4 KiB block. Never panics; any problem is an error.
    ///
    /// As md, the padding bytes are not checked (the checksum covers them).
    pub fn decode(block: &[u8], seed: LogSeed) -> Result<MetaBlock, JournalError> {
        if block.len() < BLOCK_BYTES {
            return Err(JournalError::ShortBlock(block.len()));
        }
        let b = &block[..BLOCK_BYTES];
        let magic = u32_at(b, off::MAGIC);
        if magic != R5LOG_MAGIC {
            return Err(JournalError::BadMagic(magic));
        }
        if b[off::VERSION] != R5LOG_VERSION {
            return Err(JournalError::BadVersion(b[off::VERSION]));
        }
        let stored = u32_at(b, off::CHECKSUM);
        let mut zeroed = [0u8; BLOCK_BYTES];
        zeroed.copy_from_slice(b);
        zeroed[off::CHECKSUM..off::CHECKSUM + 4].fill(0);
        let computed = crc32c_le(seed.0, &zeroed);
        if stored != computed {
            return Err(JournalError::BadChecksum { stored, computed });
        }
        let meta_size_raw = u32_at(b, off::META_SIZE);
        let meta_size = meta_size_raw as usize;
        if !(META_HEADER_BYTES..=BLOCK_BYTES).contains(&meta_size) {
            return Err(JournalError::BadMetaSize(meta_size_raw));
        }
        let mut payloads = Vec::new();
        let mut at = META_HEADER_BYTES;
        while at < meta_size {
            let bad = |why| JournalError::BadPayload { offset: at, why };
            if at + 4 > meta_size {
                return Err(bad("payload header runs past meta_size"));
            }
            let ty = u16_at(b, at);
            let flags = u16_at(b, at + 2);
            match ty {
                PAYLOAD_DATA | PAYLOAD_PARITY => {
                    if at + DATA_PARITY_HEADER_BYTES > meta_size {
                        return Err(bad("payload header runs past meta_size"));
                    }
                    let size = u32_at(b, at + 4) as u64;
                    if size == 0 || !size.is_multiple_of(BLOCK_SECTORS) {
                        return Err(bad("payload size is not a positive number of pages"));
                    }
                    let pages = (size / BLOCK_SECTORS) as usize;
                    let end = at + DATA_PARITY_HEADER_BYTES + 4 * pages;
                    if end > meta_size {
                        return Err(bad("payload checksums run past meta_size"));
                    }
                    let location_sectors = u64_at(b, at + 8);
                    let checksums = (0..pages)
                        .map(|k| u32_at(b, at + DATA_PARITY_HEADER_BYTES + 4 * k))
                        .collect();
                    payloads.push(if ty == PAYLOAD_DATA {
                        Payload::Data {
                            flags,
                            location_sectors,
                            checksums,
                        }
                    } else {
                        Payload::Parity {
                            flags,
                            location_sectors,
                            checksums,
                        }
                    });
                    at = end;
                }
                PAYLOAD_FLUSH => {
                    if at + FLUSH_HEADER_BYTES > meta_size {
                        return Err(bad("payload header runs past meta_size"));
                    }
                    let size = u32_at(b, at + 4) as usize;
                    if !size.is_multiple_of(8) {
                        return Err(bad("flush size is not a multiple of 8 bytes"));
                    }
                    let end = at + FLUSH_HEADER_BYTES + size;
                    if end > meta_size {
                        return Err(bad("flush stripe list runs past meta_size"));
                    }
                    let stripe_sectors = (0..size / 8)
                        .map(|k| u64_at(b, at + FLUSH_HEADER_BYTES + 8 * k))
                        .collect();
                    payloads.push(Payload::Flush {
                        flags,
                        stripe_sectors,
                    });
                    at = end;
                }
                _ => return Err(bad("unknown payload type")),
            }
        }
        Ok(MetaBlock {
            seq: u64_at(b, off::SEQ),
            position_sectors: u64_at(b, off::POSITION),
            payloads,
        })
    }
}

/// The journal's data area as md sees it: a ring of whole 4 KiB blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRing {
    size_sectors: u64,
}

impl LogRing {
    /// A ring over `device_sectors` of data area (rounded down to whole blocks, as md's
    /// `device_size`). None when it holds fewer than two blocks.
    pub fn new(device_sectors: u64) -> Option<LogRing> {
        let size_sectors = device_sectors - device_sectors % BLOCK_SECTORS;
        (size_sectors >= 2 * BLOCK_SECTORS).then_some(LogRing { size_sectors })
    }

    pub fn size_sectors(&self) -> u64 {
        self.size_sectors
    }

    /// `pos + inc` around the ring (md's `r5l_ring_add`).
    pub fn add(&self, pos: u64, inc: u64) -> u64 {
        assert!(pos < self.size_sectors && inc <= self.size_sectors);
        let end = pos + inc;
        if end >= self.size_sectors {
            end - self.size_sectors
        } else {
            end
        }
    }

    /// Sectors from `from` forward to `to` (md's `r5l_ring_distance`).
    pub fn distance(&self, from: u64, to: u64) -> u64 {
        assert!(from < self.size_sectors && to < self.size_sectors);
        if to >= from {
            to - from
        } else {
            to + self.size_sectors - from
        }
    }

    /// Whether `pos` is a block start inside the ring.
    pub fn is_block(&self, pos: u64) -> bool {
        pos < self.size_sectors && pos.is_multiple_of(BLOCK_SECTORS)
    }
}

/// What the scanner needs to know about the array.
pub trait LogLayout {
    /// Pages in a parity payload: 1 for raid4/5, 2 for raid6 (md's `max_degraded`).
    fn parity_pages(&self) -> usize;
    /// Row (member sector) of a data page at array sector `location`; None if the location
    /// is not a page of the array.
    fn data_stripe_sector(&self, location_sectors: u64) -> Option<u64>;
    /// Whether `stripe_sector` is the start of a row of the array.
    fn valid_stripe_sector(&self, stripe_sector: u64) -> bool;
}

impl LogLayout for ParityGeometry {
    fn parity_pages(&self) -> usize {
        self.parity_disks()
    }

    fn data_stripe_sector(&self, location_sectors: u64) -> Option<u64> {
        if !location_sectors.is_multiple_of(BLOCK_SECTORS)
            || location_sectors >= self.array_sectors()
        {
            return None;
        }
        let l = self.locate(location_sectors);
        Some(self.member_sector(l.stripe, l.offset_sectors))
    }

    fn valid_stripe_sector(&self, stripe_sector: u64) -> bool {
        stripe_sector.is_multiple_of(BLOCK_SECTORS)
            && stripe_sector < self.stripes() * self.chunk_sectors
    }
}

/// A page of array data in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedPage {
    /// Array sector of the page.
    pub location_sectors: u64,
    /// Where the page sits in the journal's data area.
    pub log_sectors: u64,
    pub checksum: u32,
}

/// One md stripe (a 4 KiB row across the members) found in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedStripe {
    /// Member sector of the row (md's `sh->sector`).
    pub stripe_sector: u64,
    /// The newest logged page of each data location in the row.
    pub data: Vec<LoggedPage>,
    /// P, then Q for raid6, when the row's parity is in the log.
    pub parity: Vec<LoggedPage>,
}

impl LoggedStripe {
    fn new(stripe_sector: u64) -> LoggedStripe {
        LoggedStripe {
            stripe_sector,
            data: Vec::new(),
            parity: Vec::new(),
        }
    }

    /// Data and parity both logged: replaying it makes the row consistent.
    pub fn is_complete(&self) -> bool {
        !self.parity.is_empty() && !self.data.is_empty()
    }
}

/// Where a scan starts: `journal_tail` and the sequence number of the meta block there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanStart {
    pub tail_sectors: u64,
    pub seq: u64,
}

/// Why a scan stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// No valid meta block at the expected place (or the wrong seq/position there).
    NotMeta(JournalError),
    WrongSeq {
        found: u64,
    },
    WrongPosition {
        found: u64,
    },
    /// A meta block whose payloads do not make sense for this array.
    BadRecord(&'static str),
    /// A page does not match its checksum: the record was torn.
    PageChecksum {
        log_sectors: u64,
    },
    /// The log came round to where it started.
    RingFull,
}

/// What a scan found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// Rows with data and parity, in the order md replays them.
    pub stripes: Vec<LoggedStripe>,
    /// Rows with data but no parity (write-back's cached data), in log order.
    pub data_only: Vec<LoggedStripe>,
    /// Valid meta blocks read.
    pub meta_blocks: u64,
    /// The first place that did not continue the log, and the seq it should have had: the
    /// new log starts here.
    pub end: ScanStart,
    pub why: ScanEnd,
}

/// Walk the log from `start`, verifying every meta block and page, and collect the rows to
/// replay. Stops at the first block that does not continue the log: everything before it
/// is used, nothing after. Only errors of `read` (IO) are returned.
///
/// `read(pos, block)` fills one 4 KiB block at sector `pos` of the data area.
pub fn scan<E>(
    ring: &LogRing,
    seed: LogSeed,
    layout: &dyn LogLayout,
    start: ScanStart,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<Scan, E> {
    let mut pos = start.tail_sectors;
    let mut seq = start.seq;
    let mut used = 0u64;
    let mut meta_blocks = 0u64;
    let mut done: Vec<LoggedStripe> = Vec::new();
    // Open rows by stripe sector, with the order they were opened in.
    let mut open: BTreeMap<u64, (u64, LoggedStripe)> = BTreeMap::new();
    let mut opened = 0u64;
    let mut block = vec![0u8; BLOCK_BYTES];
    let parity_pages = layout.parity_pages();

    let why = loop {
        if !ring.is_block(pos) {
            break ScanEnd::BadRecord("tail is not a block of the ring");
        }
        read(pos, &mut block)?;
        let mb = match MetaBlock::decode(&block, seed) {
            Ok(mb) => mb,
            Err(e) => break ScanEnd::NotMeta(e),
        };
        if mb.seq != seq {
            break ScanEnd::WrongSeq { found: mb.seq };
        }
        if mb.position_sectors != pos {
            break ScanEnd::WrongPosition {
                found: mb.position_sectors,
            };
        }
        let record = mb.record_sectors();
        if used.saturating_add(record) > ring.size_sectors() {
            break ScanEnd::RingFull;
        }
        if let Err(why) = check_record(&mb, layout, parity_pages) {
            break ScanEnd::BadRecord(why);
        }
        // Every page must match before any of the record is used (md drops the record).
        let mut pages: Vec<LoggedPage> = Vec::new();
        let mut page_pos = ring.add(pos, BLOCK_SECTORS);
        let mut torn = None;
        'pages: for p in &mb.payloads {
            let (location_sectors, checksums) = match p {
                Payload::Data {
                    location_sectors,
                    checksums,
                    ..
                }
                | Payload::Parity {
                    location_sectors,
                    checksums,
                    ..
                } => (*location_sectors, checksums),
                Payload::Flush { .. } => continue,
            };
            for &checksum in checksums {
                read(page_pos, &mut block)?;
                if seed.page_checksum(&block) != checksum {
                    torn = Some(page_pos);
                    break 'pages;
                }
                pages.push(LoggedPage {
                    location_sectors,
                    log_sectors: page_pos,
                    checksum,
                });
                page_pos = ring.add(page_pos, BLOCK_SECTORS);
            }
        }
        if let Some(log_sectors) = torn {
            break ScanEnd::PageChecksum { log_sectors };
        }
        let mut pages = pages.into_iter();
        for p in &mb.payloads {
            match p {
                Payload::Data {
                    location_sectors, ..
                } => {
                    let page = pages.next().expect("one page per data payload");
                    let row = layout
                        .data_stripe_sector(*location_sectors)
                        .expect("checked above");
                    // New data for a row whose parity is logged: that row reached the
                    // members before this write began; replay it first (as md does).
                    if open.get(&row).is_some_and(|(_, s)| !s.parity.is_empty()) {
                        let (_, s) = open.remove(&row).expect("present");
                        if s.is_complete() {
                            done.push(s);
                        }
                    }
                    let (_, s) = open.entry(row).or_insert_with(|| {
                        opened += 1;
                        (opened, LoggedStripe::new(row))
                    });
                    s.data
                        .retain(|d| d.location_sectors != page.location_sectors);
                    s.data.push(page);
                }
                Payload::Parity {
                    location_sectors, ..
                } => {
                    let row = *location_sectors;
                    let (_, s) = open.entry(row).or_insert_with(|| {
                        opened += 1;
                        (opened, LoggedStripe::new(row))
                    });
                    s.parity = (0..parity_pages)
                        .map(|_| pages.next().expect("parity pages"))
                        .collect();
                }
                Payload::Flush { stripe_sectors, .. } => {
                    for row in stripe_sectors {
                        open.remove(row);
                    }
                }
            }
        }
        meta_blocks += 1;
        used += record;
        pos = ring.add(pos, record);
        seq = seq.wrapping_add(1);
    };

    let mut rest: Vec<(u64, LoggedStripe)> = open.into_values().collect();
    rest.sort_by_key(|(order, _)| *order);
    let mut data_only = Vec::new();
    for (_, s) in rest {
        if s.is_complete() {
            done.push(s);
        } else if !s.data.is_empty() {
            data_only.push(s);
        }
    }
    Ok(Scan {
        stripes: done,
        data_only,
        meta_blocks,
        end: ScanStart {
            tail_sectors: pos,
            seq,
        },
        why,
    })
}

/// Payload rules the scanner relies on, as md's writer keeps them.
fn check_record(
    mb: &MetaBlock,
    layout: &dyn LogLayout,
    parity_pages: usize,
) -> Result<(), &'static str> {
    for p in &mb.payloads {
        match p {
            Payload::Data {
                location_sectors,
                checksums,
                ..
            } => {
                if checksums.len() != 1 {
                    return Err("a data payload is not one page");
                }
                if layout.data_stripe_sector(*location_sectors).is_none() {
                    return Err("a data payload lies outside the array");
                }
            }
            Payload::Parity {
                location_sectors,
                checksums,
                ..
            } => {
                if checksums.len() != parity_pages {
                    return Err("a parity payload has the wrong number of pages");
                }
                if !layout.valid_stripe_sector(*location_sectors) {
                    return Err("a parity payload lies outside the members");
                }
            }
            Payload::Flush { .. } => {}
        }
    }
    Ok(())
}
