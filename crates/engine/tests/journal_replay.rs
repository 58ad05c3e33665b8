//! The write-through journal over memory members: append, wrap-around with reclaim, replay.

use std::io;
use std::sync::{Arc, Mutex};
use uraid_core::geometry::{ArrayGeometry, ParityGeometry};
use uraid_core::journal::ScanEnd;
use uraid_core::{Level, MemberIdx};
use uraid_engine::journal::*;
use uraid_engine::{MemMember, Member};
use uraid_testkit::engine::as_members;

const UUID: [u8; 16] = *b"journal-test-uid";
const PAGE: usize = 4096;

fn geometry(level: Level, disks: usize) -> ParityGeometry {
    ParityGeometry::new(&ArrayGeometry {
        level,
        layout: 2,
        chunk_sectors: 16,
        raid_disks: disks,
        dev_sectors: 16 * 32,
        member_sectors: Vec::new(),
    })
    .unwrap()
}

fn members(n: usize) -> (Vec<Arc<MemMember>>, MemberSet) {
    let mems: Vec<Arc<MemMember>> = (0..n)
        .map(|i| Arc::new(MemMember::new(format!("m{i}"), 16 * 32 * 512)))
        .collect();
    let set = MemberSet {
        devs: as_members(&mems).into(),
        data_offset_bytes: vec![0; n].into(),
    };
    (mems, set)
}

/// Records the tail the journal asks to persist and counts member flushes.
#[derive(Default)]
struct Host {
    tail: Mutex<Option<u64>>,
    flushes: Mutex<u32>,
}

impl JournalHost for Host {
    fn flush_members(&self) -> io::Result<()> {
        *self.flushes.lock().unwrap() += 1;
        Ok(())
    }
    fn set_journal_tail(&self, tail_sectors: u64) -> io::Result<()> {
        *self.tail.lock().unwrap() = Some(tail_sectors);
        Ok(())
    }
}

fn page(tag: u32) -> Vec<u8> {
    tag.to_le_bytes().repeat(PAGE / 4)
}

/// Data pages (logical index -> page) and parity of one chunk-high stripe write, in the
/// shape the raid5 write path has them.
struct StripeData {
    stripe: u64,
    pieces: Vec<Option<(usize, Vec<u8>)>>,
    p: Vec<u8>,
    q: Option<Vec<u8>>,
}

/// A write of `pages` pages at page `first` of data chunk `idx`, with every other data
/// chunk all zero (the members start zeroed), parity computed as the engine does.
fn stripe_write(
    g: &ParityGeometry,
    stripe: u64,
    idx: usize,
    first: usize,
    pages: usize,
    tag: u32,
) -> StripeData {
    let dd = g.data_disks();
    let mut bytes = Vec::new();
    for k in 0..pages {
        bytes.extend(page(tag + k as u32));
    }
    let lo = first * PAGE;
    let hi = lo + pages * PAGE;
    let mut cols: Vec<Vec<u8>> = vec![vec![0u8; hi - lo]; dd];
    cols[idx].copy_from_slice(&bytes);
    let srcs: Vec<&[u8]> = cols.iter().map(|c| &c[..]).collect();
    let mut p = vec![0u8; hi - lo];
    let q = if g.parity_disks() == 2 {
        let map = g.stripe_map(stripe);
        let ordered: Vec<&[u8]> = map.syndrome_order.iter().map(|&i| srcs[i]).collect();
        let mut q = vec![0u8; hi - lo];
        uraid_parity::gen_pq(&ordered, &mut p, &mut q);
        Some(q)
    } else {
        uraid_parity::xor_gen(&mut p, &srcs);
        None
    };
    let mut pieces: Vec<Option<(usize, Vec<u8>)>> = vec![None; dd];
    pieces[idx] = Some((lo, bytes));
    StripeData {
        stripe,
        pieces,
        p,
        q,
    }
}

fn rows<'a>(g: &ParityGeometry, s: &'a StripeData) -> Vec<RowWrite<'a>> {
    let pieces: Vec<Option<(usize, &[u8])>> = s
        .pieces
        .iter()
        .map(|p| p.as_ref().map(|(st, d)| (*st, &d[..])))
        .collect();
    rows_for_stripe(g, s.stripe, &pieces, &s.p, s.q.as_deref()).unwrap()
}

fn read_member(m: &MemMember, member_sector: u64) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    m.read_at(&mut b, member_sector * 512).unwrap();
    b
}

/// Check that the members hold the stripe write: data pages and parity where they belong.
fn assert_on_members(g: &ParityGeometry, mems: &[Arc<MemMember>], s: &StripeData) {
    let map = g.stripe_map(s.stripe);
    let (idx, (lo, bytes)) = s
        .pieces
        .iter()
        .enumerate()
        .find_map(|(i, p)| p.as_ref().map(|p| (i, p)))
        .unwrap();
    for k in 0..bytes.len() / PAGE {
        let row = (lo / PAGE + k) as u64 * 8;
        let msec = g.member_sector(s.stripe, row);
        assert_eq!(
            read_member(&mems[map.data[idx].0], msec),
            bytes[k * PAGE..(k + 1) * PAGE],
            "data of stripe {} page {k}",
            s.stripe
        );
        assert_eq!(
            read_member(&mems[map.p.0], msec),
            s.p[k * PAGE..(k + 1) * PAGE]
        );
        if let (Some(q), Some(qr)) = (&s.q, map.q) {
            assert_eq!(read_member(&mems[qr.0], msec), q[k * PAGE..(k + 1) * PAGE]);
        }
    }
}

fn area(blocks: u64) -> JournalArea {
    JournalArea {
        data_offset_bytes: 8192,
        size_sectors: blocks * 8,
    }
}

#[test]
fn rows_follow_md_stripes() {
    let g = geometry(Level::Raid5, 4);
    let s = stripe_write(&g, 3, 1, 1, 1, 100);
    let r = rows(&g, &s);
    assert_eq!(r.len(), 1);
    // md: data location is the page's array sector, parity location the row's member sector.
    assert_eq!(r[0].data[0].0, g.array_sector(3, 1) + 8);
    assert_eq!(r[0].stripe_sector, 3 * 16 + 8);
    assert_eq!(r[0].parity.len(), 1);
    // Sub-page writes must be widened by the caller.
    let pieces = [None, Some((512usize, &[0u8; 4096][..])), None];
    assert!(rows_for_stripe(&g, 0, &pieces, &[0u8; 4096], None).is_err());
    // A piece must stay inside its chunk (two pages here).
    let pieces = [None, Some((4096usize, &[0u8; 8192][..])), None];
    assert!(rows_for_stripe(&g, 0, &pieces, &[0u8; 8192], None).is_err());
}

#[test]
fn replay_rewrites_logged_stripes_raid5_and_raid6() {
    for (level, disks) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let g = geometry(level, disks);
        let jdev = Arc::new(MemMember::new("journal", 8192 + 64 * 4096));
        let host = Host::default();
        let j = Journal::format(jdev.clone(), area(64), &UUID, 41).unwrap();
        let writes: Vec<StripeData> = (0..4)
            .map(|k| {
                stripe_write(
                    &g,
                    k as u64 * 5,
                    k % g.data_disks(),
                    k % 2,
                    2 - k % 2,
                    10 * k as u32 + 1,
                )
            })
            .collect();
        for w in &writes {
            let t = j.append_stripe(&rows(&g, w), &host).unwrap();
            // The crash: no member write happened.
            j.stripe_written(t);
        }
        // Assembly: a new journal object from the tail, replay into blank members.
        let (mems, set) = members(disks);
        let j2 = Journal::load(jdev.clone(), area(64), &UUID, 0).unwrap();
        let rep = j2.replay(&g, &set).unwrap();
        assert_eq!(
            rep.stripes,
            writes.iter().map(|w| rows(&g, w).len()).sum::<usize>()
        );
        assert_eq!(rep.meta_blocks, 5, "{level}: empty block and four records");
        assert!(matches!(rep.why_stopped, ScanEnd::NotMeta(_)));
        for w in &writes {
            assert_on_members(&g, &mems, w);
        }
        // The new tail holds an empty block with the seq jumped: a second assembly finds
        // nothing to replay, and the old records beyond it are not taken for the log.
        let j3 = Journal::load(jdev.clone(), area(64), &UUID, rep.tail_sectors).unwrap();
        let (mems3, set3) = members(disks);
        let rep3 = j3.replay(&g, &set3).unwrap();
        assert_eq!(rep3.stripes, 0);
        assert_eq!(rep3.meta_blocks, 1);
        assert!(mems3.iter().all(|m| m.snapshot().iter().all(|&b| b == 0)));
        // Another array's UUID reads nothing.
        assert!(Journal::load(jdev, area(64), b"another-array-id", 0).is_err());
    }
}

#[test]
fn wrap_around_reclaims_only_written_stripes() {
    let g = geometry(Level::Raid5, 4);
    let blocks = 20; // each record is 3 blocks: the ring wraps every few writes
    let jdev = Arc::new(MemMember::new("journal", 8192 + blocks * 4096));
    let host = Host::default();
    let j = Journal::format(jdev.clone(), area(blocks), &UUID, 7).unwrap();
    let mut last = Vec::new();
    for k in 0..40u32 {
        let w = stripe_write(&g, (k % 7) as u64, (k % 3) as usize, 0, 1, 1000 + k);
        let t = j.append_stripe(&rows(&g, &w), &host).unwrap();
        j.stripe_written(t);
        last.push(w);
    }
    assert!(
        *host.flushes.lock().unwrap() >= 5,
        "reclaim flushed the members"
    );
    let tail = host.tail.lock().unwrap().expect("tail moved");
    assert_eq!(tail, j.tail_sectors());
    // Crash with blank members: replay from the persisted tail restores the newest writes,
    // however the log wrapped.
    let (mems, set) = members(4);
    let j2 = Journal::load(jdev, area(blocks), &UUID, tail).unwrap();
    let rep = j2.replay(&g, &set).unwrap();
    assert!(
        rep.stripes >= 1 && rep.stripes < 7,
        "replayed {}",
        rep.stripes
    );
    let newest = last.last().unwrap();
    assert_on_members(&g, &mems, newest);
}

#[test]
fn in_flight_stripes_pin_their_space() {
    let g = geometry(Level::Raid5, 4);
    let blocks = 8;
    let jdev = Arc::new(MemMember::new("journal", 8192 + blocks * 4096));
    let host = Host::default();
    let j = Journal::format(jdev, area(blocks), &UUID, 1).unwrap();
    let w = stripe_write(&g, 0, 0, 0, 1, 5);
    let t1 = j.append_stripe(&rows(&g, &w), &host).unwrap();
    let t2 = j.append_stripe(&rows(&g, &w), &host).unwrap();
    // 1 + 3 + 3 blocks used of 8: the next record would reach the tail.
    let err = j.append_stripe(&rows(&g, &w), &host).unwrap_err();
    assert!(matches!(err, JournalError::Full { .. }), "{err}");
    j.stripe_written(t1);
    // Reclaim moves the tail to t2's record, the oldest in flight.
    let t3 = j.append_stripe(&rows(&g, &w), &host).unwrap();
    assert_eq!(*host.tail.lock().unwrap(), Some(32));
    j.stripe_written(t2);
    j.stripe_written(t3);
}

#[test]
fn a_torn_append_replays_only_whole_records() {
    let g = geometry(Level::Raid5, 4);
    let jdev = Arc::new(MemMember::new("journal", 8192 + 64 * 4096));
    let host = Host::default();
    let j = Journal::format(jdev.clone(), area(64), &UUID, 3).unwrap();
    let a = stripe_write(&g, 1, 0, 0, 1, 1);
    let b = stripe_write(&g, 2, 1, 0, 1, 2);
    let t = j.append_stripe(&rows(&g, &a), &host).unwrap();
    j.stripe_written(t);
    let t = j.append_stripe(&rows(&g, &b), &host).unwrap();
    j.stripe_written(t);
    // Tear b's parity page (block 1 + 3 + 2 = 6 of the ring).
    jdev.write_at(&[0xffu8; 512], 8192 + 6 * 4096 + 1024)
        .unwrap();
    let (mems, set) = members(4);
    let rep = Journal::load(jdev, area(64), &UUID, 0)
        .unwrap()
        .replay(&g, &set)
        .unwrap();
    assert_eq!(rep.stripes, 1);
    assert!(matches!(
        rep.why_stopped,
        ScanEnd::PageChecksum { log_sectors: 48 }
    ));
    assert_eq!(
        rep.tail_sectors, 32,
        "the new log starts at the torn record"
    );
    assert_on_members(&g, &mems, &a);
    let map = g.stripe_map(2);
    assert!(read_member(&mems[map.p.0], g.member_sector(2, 0))
        .iter()
        .all(|&x| x == 0));
    let _ = MemberIdx(0);
}

#[test]
fn replay_into_an_assembled_array() {
    use uraid_engine::{create, CreateOptions};
    let mems: Vec<Arc<MemMember>> = (0..4)
        .map(|i| Arc::new(MemMember::new(format!("a{i}"), 2 << 20)))
        .collect();
    let mut opts = CreateOptions::new(Level::Raid5);
    opts.chunk_sectors = Some(16);
    opts.assume_clean = true;
    let a = create(as_members(&mems), &opts).unwrap();
    let g = match a.personality() {
        uraid_core::geometry::Personality::Parity(g) => g.clone(),
        _ => unreachable!(),
    };
    // Log a write of two pages into data chunk 2 of stripe 3; the members never see it.
    let w = stripe_write(&g, 3, 2, 0, 2, 77);
    let jdev = Arc::new(MemMember::new("journal", 8192 + 64 * 4096));
    let j = Journal::format(jdev.clone(), area(64), &UUID, 5).unwrap();
    let pieces: Vec<Option<(usize, &[u8])>> = w
        .pieces
        .iter()
        .map(|p| p.as_ref().map(|(st, d)| (*st, &d[..])))
        .collect();
    let t = j
        .log_stripe(&g, w.stripe, &pieces, &w.p, None, &Host::default())
        .unwrap();
    j.stripe_written(t);
    let rep = Journal::load(jdev, area(64), &UUID, 0)
        .unwrap()
        .replay(&g, &a)
        .unwrap();
    assert_eq!(rep.stripes, 2);
    let mut buf = vec![0u8; 2 * PAGE];
    a.read(g.array_sector(3, 2) * 512, &mut buf).unwrap();
    assert_eq!(buf, w.pieces[2].as_ref().unwrap().1);
    // Parity went to the P member at its data offset: a degraded read of the chunk agrees.
    a.fail_member(g.stripe_map(3).data[2]).unwrap();
    let mut again = vec![0u8; 2 * PAGE];
    a.read(g.array_sector(3, 2) * 512, &mut again).unwrap();
    assert_eq!(again, buf);
}
