//! Journal codec and replay scanner against a naive model: round trips, damage of every
//! kind stops the scan at the last valid record, arbitrary input never panics.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::convert::Infallible;
use uraid_core::geometry::{ArrayGeometry, ParityGeometry};
use uraid_core::journal::*;
use uraid_core::Level;

const SEED: LogSeed = LogSeed(0x5eed_1234);

fn geometry(level: Level) -> ParityGeometry {
    ParityGeometry::new(&ArrayGeometry {
        level,
        layout: 2,
        chunk_sectors: 16, // two pages per chunk
        raid_disks: if level == Level::Raid6 { 5 } else { 4 },
        dev_sectors: 16 * 4,
        member_sectors: Vec::new(),
    })
    .unwrap()
}

/// A page whose every word is `tag`, so the model can tell pages apart.
fn page(tag: u32) -> Vec<u8> {
    tag.to_le_bytes().repeat(1024)
}

fn tag_of(p: &[u8]) -> u32 {
    u32::from_le_bytes(p[..4].try_into().unwrap())
}

/// One md stripe of a write: data pages (array sector, tag) and parity tags.
#[derive(Clone, Debug)]
struct Row {
    stripe_sector: u64,
    data: Vec<(u64, u32)>,
    parity: Vec<u32>,
}

/// A journal data area in memory and a writer that logs as md does.
struct Log {
    ring: LogRing,
    bytes: Vec<u8>,
    head: u64,
    seq: u64,
    /// Meta block position of each record.
    records: Vec<u64>,
}

impl Log {
    fn new(blocks: u64, head: u64, seq: u64) -> Log {
        Log {
            ring: LogRing::new(blocks * 8).unwrap(),
            bytes: vec![0; blocks as usize * 4096],
            head,
            seq,
            records: Vec::new(),
        }
    }

    fn block_mut(&mut self, pos: u64) -> &mut [u8] {
        let at = pos as usize * 512;
        &mut self.bytes[at..at + 4096]
    }

    fn put(&mut self, pos: u64, b: &[u8]) {
        self.block_mut(pos).copy_from_slice(b);
    }

    fn append_payloads(&mut self, payloads: Vec<Payload>, pages: Vec<Vec<u8>>) {
        let mb = MetaBlock {
            seq: self.seq,
            position_sectors: self.head,
            payloads,
        };
        let b = mb.encode(SEED).unwrap();
        self.records.push(self.head);
        self.put(self.head, &b);
        let mut pos = self.ring.add(self.head, 8);
        for p in pages {
            self.put(pos, &p);
            pos = self.ring.add(pos, 8);
        }
        self.head = pos;
        self.seq += 1;
    }

    fn append(&mut self, rows: &[Row]) {
        let mut payloads = Vec::new();
        let mut pages = Vec::new();
        for r in rows {
            for &(loc, tag) in &r.data {
                let p = page(tag);
                payloads.push(Payload::Data {
                    flags: 0,
                    location_sectors: loc,
                    checksums: vec![SEED.page_checksum(&p)],
                });
                pages.push(p);
            }
            if !r.parity.is_empty() {
                let ps: Vec<Vec<u8>> = r.parity.iter().map(|&t| page(t)).collect();
                payloads.push(Payload::Parity {
                    flags: 0,
                    location_sectors: r.stripe_sector,
                    checksums: ps.iter().map(|p| SEED.page_checksum(p)).collect(),
                });
                pages.extend(ps);
            }
        }
        self.append_payloads(payloads, pages);
    }

    fn scan(&self, g: &ParityGeometry, start: ScanStart) -> Scan {
        let r: Result<Scan, Infallible> = scan(&self.ring, SEED, g, start, |pos, buf| {
            let at = pos as usize * 512;
            buf.copy_from_slice(&self.bytes[at..at + 4096]);
            Ok(())
        });
        r.unwrap()
    }

    fn tag_at(&self, pos: u64) -> u32 {
        let at = pos as usize * 512;
        tag_of(&self.bytes[at..at + 4096])
    }
}

/// What the members hold after replay: data tag per array sector, parity tags per row.
type State = (BTreeMap<u64, u32>, BTreeMap<u64, Vec<u32>>);

fn apply_rows(state: &mut State, rows: &[Row]) {
    for r in rows {
        for &(loc, tag) in &r.data {
            state.0.insert(loc, tag);
        }
        state.1.insert(r.stripe_sector, r.parity.clone());
    }
}

fn apply_scan(log: &Log, scan: &Scan) -> State {
    let mut s = State::default();
    for st in &scan.stripes {
        for d in &st.data {
            s.0.insert(d.location_sectors, log.tag_at(d.log_sectors));
        }
        s.1.insert(
            st.stripe_sector,
            st.parity
                .iter()
                .map(|p| log.tag_at(p.log_sectors))
                .collect(),
        );
    }
    s
}

/// A write-through row of stripe `stripe`, page `row` of the chunk, data disks in `mask`.
fn make_row(g: &ParityGeometry, stripe: u64, row: u64, mask: u32, tag: &mut u32) -> Row {
    let mut next = || {
        *tag += 1;
        *tag
    };
    let data = (0..g.data_disks())
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| (g.array_sector(stripe, i) + row * 8, next()))
        .collect();
    Row {
        stripe_sector: g.member_sector(stripe, row * 8),
        data,
        parity: (0..g.parity_disks()).map(|_| next()).collect(),
    }
}

#[test]
fn write_through_rows_replay_in_order() {
    let g = geometry(Level::Raid5);
    let mut log = Log::new(64, 0, 7);
    log.append_payloads(vec![], vec![]); // the empty block at the tail
    let mut tag = 0;
    let r1 = make_row(&g, 1, 0, 0b011, &mut tag);
    let r2 = make_row(&g, 1, 1, 0b100, &mut tag);
    let r3 = make_row(&g, 1, 0, 0b110, &mut tag); // same row again, later
    log.append(&[r1.clone(), r2.clone()]);
    log.append(std::slice::from_ref(&r3));
    let scan = log.scan(
        &g,
        ScanStart {
            tail_sectors: 0,
            seq: 7,
        },
    );
    assert_eq!(scan.meta_blocks, 3);
    assert_eq!(
        scan.end,
        ScanStart {
            tail_sectors: 8 + (8 + 8 * 5) + (8 + 8 * 3),
            seq: 10
        }
    );
    assert!(matches!(scan.why, ScanEnd::NotMeta(_)));
    // Row (1,0) appears twice: the older one is replayed before the newer one.
    assert_eq!(scan.stripes.len(), 3);
    assert_eq!(scan.stripes[0].stripe_sector, 16);
    assert_eq!(scan.stripes[0].data.len(), 2);
    let mut want = State::default();
    apply_rows(&mut want, &[r1, r2, r3]);
    assert_eq!(apply_scan(&log, &scan), want);
}

#[test]
fn flush_drops_cached_rows_and_data_only_rows_are_not_replayed() {
    let g = geometry(Level::Raid5);
    let mut log = Log::new(64, 0, 1);
    let mut tag = 0;
    let mut cached = make_row(&g, 0, 0, 0b001, &mut tag);
    cached.parity.clear();
    let mut cached2 = make_row(&g, 2, 1, 0b001, &mut tag);
    cached2.parity.clear();
    let mut parity_only = make_row(&g, 3, 0, 0, &mut tag);
    parity_only.data.clear();
    log.append(&[cached.clone(), cached2.clone(), parity_only]);
    log.append_payloads(
        vec![Payload::Flush {
            flags: 0,
            stripe_sectors: vec![cached.stripe_sector],
        }],
        vec![],
    );
    let scan = log.scan(
        &g,
        ScanStart {
            tail_sectors: 0,
            seq: 1,
        },
    );
    assert_eq!(scan.meta_blocks, 2);
    assert!(scan.stripes.is_empty(), "parity-only rows are not replayed");
    assert_eq!(scan.data_only.len(), 1);
    assert_eq!(scan.data_only[0].stripe_sector, cached2.stripe_sector);
}

#[test]
fn scan_refuses_rows_outside_the_array() {
    let g = geometry(Level::Raid5);
    let mut log = Log::new(64, 0, 1);
    let mut tag = 0;
    log.append(&[make_row(&g, 0, 0, 1, &mut tag)]);
    let mut bad = make_row(&g, 0, 0, 1, &mut tag);
    bad.data[0].0 = g.array_sectors(); // one page past the end
    log.append(&[bad]);
    log.append(&[make_row(&g, 1, 0, 1, &mut tag)]);
    let scan = log.scan(
        &g,
        ScanStart {
            tail_sectors: 0,
            seq: 1,
        },
    );
    assert_eq!(scan.meta_blocks, 1);
    assert_eq!(
        scan.why,
        ScanEnd::BadRecord("a data payload lies outside the array")
    );
    // raid5 parity payloads are one page; a two-page one is not md's.
    let mut log = Log::new(64, 0, 1);
    let mut r = make_row(&g, 0, 0, 1, &mut tag);
    r.parity.push(99);
    log.append(&[r]);
    let scan = log.scan(
        &g,
        ScanStart {
            tail_sectors: 0,
            seq: 1,
        },
    );
    assert_eq!(scan.meta_blocks, 0);
    assert!(matches!(scan.why, ScanEnd::BadRecord(_)));
}

#[derive(Clone, Debug)]
enum Damage {
    None,
    /// Flip a byte of record k's meta block.
    MetaByte(usize, usize),
    /// Flip a byte of one page of record k.
    PageByte(usize, usize, usize),
    /// Record k and everything after it never reached the disk.
    Truncate(usize),
    /// Record k is a valid meta block of another lap (seq off).
    StaleSeq(usize),
    /// Record k claims another position.
    WrongPosition(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        Just(Damage::None),
        (any::<usize>(), 0..4096usize).prop_map(|(k, b)| Damage::MetaByte(k, b)),
        (any::<usize>(), any::<usize>(), 0..4096usize)
            .prop_map(|(k, p, b)| Damage::PageByte(k, p, b)),
        any::<usize>().prop_map(Damage::Truncate),
        any::<usize>().prop_map(Damage::StaleSeq),
        any::<usize>().prop_map(Damage::WrongPosition),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn damaged_logs_stop_at_the_last_valid_record(
        raid6 in any::<bool>(),
        start_block in 0u64..40,
        seq in any::<u64>(),
        writes in prop::collection::vec(
            prop::collection::vec((0u64..4, 0u64..2, 1u32..8), 1..3), 1..8),
        dmg in damage(),
    ) {
        let g = geometry(if raid6 { Level::Raid6 } else { Level::Raid5 });
        let blocks = 40u64;
        let mut log = Log::new(blocks, start_block * 8, seq);
        let mut tag = 0;
        let mut records: Vec<Vec<Row>> = Vec::new();
        let mut used = 0;
        for w in &writes {
            let mut rows: Vec<Row> = Vec::new();
            for &(stripe, row, mask) in w {
                let mask = mask & ((1 << g.data_disks()) - 1);
                let r = make_row(&g, stripe, row, mask.max(1), &mut tag);
                if rows.iter().all(|x| x.stripe_sector != r.stripe_sector) {
                    rows.push(r);
                }
            }
            let sectors: u64 = 8 + rows.iter()
                .map(|r| 8 * (r.data.len() + r.parity.len()) as u64).sum::<u64>();
            if used + sectors > log.ring.size_sectors() - 8 {
                break;
            }
            used += sectors;
            log.append(&rows);
            records.push(rows);
        }
        let n = records.len();
        let pick = |k: usize| k % n;
        let valid = match dmg {
            Damage::None => n,
            Damage::MetaByte(k, b) => {
                let k = pick(k);
                let pos = log.records[k];
                log.block_mut(pos)[b] ^= 0x40;
                k
            }
            Damage::PageByte(k, p, b) => {
                let k = pick(k);
                let pages: u64 = records[k].iter()
                    .map(|r| (r.data.len() + r.parity.len()) as u64).sum();
                let p = p as u64 % pages;
                let pos = log.ring.add(log.records[k], 8 + 8 * p);
                log.block_mut(pos)[b] ^= 0x01;
                k
            }
            Damage::Truncate(k) => {
                let k = pick(k);
                for &pos in &log.records[k..].to_vec() {
                    log.block_mut(pos).fill(0);
                }
                k
            }
            Damage::StaleSeq(k) | Damage::WrongPosition(k) => {
                let k = pick(k);
                let pos = log.records[k];
                let mut mb = MetaBlock::decode(log.block_mut(pos), SEED).unwrap();
                if matches!(dmg, Damage::StaleSeq(_)) {
                    mb.seq = mb.seq.wrapping_sub(blocks);
                } else {
                    mb.position_sectors = log.ring.add(mb.position_sectors, 8);
                }
                let b = mb.encode(SEED).unwrap();
                log.put(pos, &b);
                k
            }
        };
        let scan = log.scan(&g, ScanStart { tail_sectors: start_block * 8, seq });
        prop_assert_eq!(scan.meta_blocks, valid as u64);
        let end = if valid < n { log.records[valid] } else { log.head };
        prop_assert_eq!(scan.end, ScanStart { tail_sectors: end, seq: seq.wrapping_add(valid as u64) });
        let mut want = State::default();
        for r in &records[..valid] {
            apply_rows(&mut want, r);
        }
        prop_assert_eq!(apply_scan(&log, &scan), want);
    }

    #[test]
    fn meta_blocks_round_trip(
        seq in any::<u64>(),
        pos in any::<u64>(),
        payloads in prop::collection::vec(
            prop_oneof![
                (any::<u16>(), any::<u64>(), prop::collection::vec(any::<u32>(), 1..4))
                    .prop_map(|(flags, location_sectors, checksums)| Payload::Data { flags, location_sectors, checksums }),
                (any::<u16>(), any::<u64>(), prop::collection::vec(any::<u32>(), 1..4))
                    .prop_map(|(flags, location_sectors, checksums)| Payload::Parity { flags, location_sectors, checksums }),
                (any::<u16>(), prop::collection::vec(any::<u64>(), 0..6))
                    .prop_map(|(flags, stripe_sectors)| Payload::Flush { flags, stripe_sectors }),
            ],
            0..60),
        seed in any::<u32>(),
    ) {
        let m = MetaBlock { seq, position_sectors: pos, payloads };
        let seed = LogSeed(seed);
        match m.encode(seed) {
            Ok(b) => {
                prop_assert_eq!(b.len(), 4096);
                prop_assert_eq!(MetaBlock::decode(&b, seed), Ok(m.clone()));
                // Any one damaged byte is caught (crc32c finds every burst under 32 bits).
                let i = (seq % 4096) as usize;
                let mut bad = b.clone();
                bad[i] ^= (pos as u8) | 1;
                prop_assert!(MetaBlock::decode(&bad, seed).is_err());
            }
            Err(JournalError::TooLarge(n)) => prop_assert!(n > 4096 && m.meta_size() == n),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    /// Arbitrary bytes with a valid header and checksum reach the payload parser: it must
    /// not panic, and what it accepts must encode back to a block that decodes the same.
    #[test]
    fn arbitrary_signed_blocks_never_panic(
        body in prop::collection::vec(any::<u8>(), 4096),
        meta_size in 0u32..5000,
        small_types in any::<bool>(),
    ) {
        let mut b = body;
        b[0..4].copy_from_slice(&R5LOG_MAGIC.to_le_bytes());
        b[8] = R5LOG_VERSION;
        b[12..16].copy_from_slice(&meta_size.to_le_bytes());
        if small_types {
            // Make payload types and sizes plausible so parsing goes deep.
            let mut at = 32;
            while at + 8 <= 4096 {
                b[at] %= 3;
                b[at + 1] = 0;
                b[at + 4] = (b[at + 4] % 3) * 8;
                b[at + 5] = 0;
                b[at + 6] = 0;
                b[at + 7] = 0;
                at += 16 + 4 * (b[at + 4] as usize / 8);
            }
        }
        b[4..8].fill(0);
        let crc = crc32c_le(SEED.0, &b);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        if let Ok(m) = MetaBlock::decode(&b, SEED) {
            prop_assert_eq!(m.meta_size(), meta_size as usize);
            let again = m.encode(SEED).unwrap();
            prop_assert_eq!(MetaBlock::decode(&again, SEED), Ok(m));
        }
    }

    #[test]
    fn random_logs_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 4096 * 4),
        tail in any::<u64>(),
        seq in any::<u64>(),
    ) {
        let g = geometry(Level::Raid6);
        let ring = LogRing::new(32).unwrap();
        let r: Result<Scan, Infallible> = scan(&ring, SEED, &g, ScanStart { tail_sectors: tail, seq }, |pos, buf| {
            let at = pos as usize * 512;
            buf.copy_from_slice(&bytes[at..at + 4096]);
            Ok(())
        });
        let s = r.unwrap();
        prop_assert_eq!(s.meta_blocks, 0);
        prop_assert!(s.stripes.is_empty());
    }
}
