//! The journal's write-back mode: reads see cached data, a flush makes acknowledged writes
//! survive a crash (replayed on assembly), mode switches, degraded fallback, and a failed
//! journal that stops writes but not reads.

use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::JournalMode;
use uraid_engine::{assemble, ArrayError, AssembleOptions, MemMember, Member};
use uraid_sim::FaultMember;
use uraid_testkit::engine::as_members;
use uraid_testkit::engine::*;

fn setup(
    level: Level,
    disks: usize,
    journal_bytes: u64,
) -> (Vec<Arc<MemMember>>, Arc<MemMember>, uraid_engine::Array) {
    journaled_array(level, disks, journal_bytes, "wb")
}

/// Random page-aligned and unaligned writes against a byte model, in write-back mode;
/// a small journal forces write-outs under log pressure.
#[test]
fn write_back_reads_match_a_model_through_write_outs() {
    for (level, disks) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let (mems, journal, a) = setup(level, disks, 2 << 20);
        a.set_journal_mode(JournalMode::WriteBack).unwrap();
        a.set_writeback_max_pages(64);
        let size = a.size_bytes().min(1 << 20);
        let mut model = vec![0u8; size as usize];
        a.read(0, &mut model).unwrap();
        let mut r = rng(7);
        for i in 0..300 {
            let (off, data) = if r.gen_bool(0.8) {
                let pages = r.gen_range(1..=12u64);
                let off = r.gen_range(0..size / 4096 - pages) * 4096;
                let d: Vec<u8> = (0..pages * 4096).map(|_| r.gen()).collect();
                (off, d)
            } else {
                random_write(&mut r, size, 20000)
            };
            a.write(off, &data).unwrap();
            model[off as usize..off as usize + data.len()].copy_from_slice(&data);
            if i % 37 == 0 {
                let mut got = vec![0u8; size as usize];
                a.read(0, &mut got).unwrap();
                assert!(got == model, "{level}: read after write {i} differs");
            }
        }
        let st = a.writeback_stats().unwrap();
        assert!(
            st.written_out_stripes > 0,
            "{level}: nothing was written out: {st:?}"
        );
        a.flush().unwrap();
        // Crash with data still cached: assembly replays the journal.
        let cached = a.writeback_stats().unwrap().cached_pages;
        assert!(cached > 0, "{level}: the crash should find cached data");
        std::mem::forget(a);
        let (b, _) = assemble(with_journal(&mems, &journal), &AssembleOptions::default()).unwrap();
        assert_eq!(b.journal_mode(), Some(JournalMode::WriteThrough));
        let mut got = vec![0u8; size as usize];
        b.read(0, &mut got).unwrap();
        assert!(
            got == model,
            "{level}: data after replay of {cached} cached pages differs"
        );
        assert_eq!(b.check().unwrap(), 0, "{level}: parity after replay");
        // A second crash right after that assembly replays again to the same data.
        std::mem::forget(b);
        let (c, _) = assemble(with_journal(&mems, &journal), &AssembleOptions::default()).unwrap();
        c.read(0, &mut got).unwrap();
        assert!(got == model, "{level}: data after a second replay differs");
        assert_eq!(c.check().unwrap(), 0);
    }
}

#[test]
fn switching_to_write_through_writes_the_cache_out() {
    let (mems, journal, a) = setup(Level::Raid5, 4, 4 << 20);
    assert!(a.set_journal_mode(JournalMode::WriteBack).is_ok());
    a.write(4096, &[7u8; 8192]).unwrap();
    assert!(a.writeback_stats().unwrap().cached_pages == 2);
    // Not on the members yet: a degraded-free check reads the members only.
    a.set_journal_mode(JournalMode::WriteThrough).unwrap();
    assert_eq!(a.writeback_stats().unwrap().cached_pages, 0);
    assert_eq!(a.check().unwrap(), 0);
    a.stop().unwrap();
    drop(a);
    let (b, _) = assemble(with_journal(&mems, &journal), &AssembleOptions::default()).unwrap();
    let mut got = vec![0u8; 8192];
    b.read(4096, &mut got).unwrap();
    assert_eq!(got, vec![7u8; 8192]);
}

#[test]
fn write_back_is_refused_while_degraded_and_falls_back_on_a_failure() {
    let (_mems, _journal, a) = setup(Level::Raid5, 4, 4 << 20);
    a.set_journal_mode(JournalMode::WriteBack).unwrap();
    a.write(0, &[9u8; 4096]).unwrap();
    a.fail_member(uraid_core::MemberIdx(1)).unwrap();
    // The next write writes the cache out and goes write-through.
    a.write(65536, &[3u8; 4096]).unwrap();
    assert_eq!(a.journal_mode(), Some(JournalMode::WriteThrough));
    assert_eq!(a.writeback_stats().unwrap().cached_pages, 0);
    let e = a.set_journal_mode(JournalMode::WriteBack).unwrap_err();
    assert!(e.to_string().contains("degraded"), "{e}");
    let mut got = vec![0u8; 4096];
    a.read(0, &mut got).unwrap();
    assert_eq!(got, vec![9u8; 4096]);
}

#[test]
fn a_failed_journal_stops_writes_and_keeps_reads() {
    let c = Config::new(Level::Raid5, None, 4);
    let mems = mem_members(&c, "jf");
    let jm = Arc::new(MemMember::new("journal", 4 << 20));
    let fj = Arc::new(FaultMember::new(jm.clone()));
    let mut o = create_opts(&c);
    o.journal = Some(fj.clone());
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    a.set_journal_mode(JournalMode::WriteBack).unwrap();
    a.write(0, &[5u8; 8192]).unwrap();
    fj.fail_writes.store(true, Ordering::SeqCst);
    let e = a.write(65536, &[6u8; 4096]).unwrap_err();
    assert!(matches!(e, ArrayError::JournalFailed(_)), "{e}");
    assert_eq!(e.errno(), libc::EROFS);
    assert!(a.journal_failed());
    // Later writes are refused at once, reads go on and still see the cached data.
    assert!(matches!(
        a.write(0, &[1u8; 4096]).unwrap_err(),
        ArrayError::JournalFailed(_)
    ));
    let mut got = vec![0u8; 8192];
    a.read(0, &mut got).unwrap();
    assert_eq!(got, vec![5u8; 8192]);
    // A flush cannot promise the cached writes any more; stop writes them to the members
    // without the journal, so the acknowledged data is kept.
    assert!(matches!(
        a.flush().unwrap_err(),
        ArrayError::JournalFailed(_)
    ));
    a.stop().unwrap();
    drop(a);
    // The members' superblocks record the journal as faulty: assembly needs --force.
    let members: Vec<Arc<dyn Member>> = mems
        .iter()
        .map(|m| m.clone() as Arc<dyn Member>)
        .chain([jm.clone() as Arc<dyn Member>])
        .collect();
    let b = assemble_needs_force(members, "journal");
    assert!(!b.has_journal());
    b.read(0, &mut got).unwrap();
    assert_eq!(got, vec![5u8; 8192]);
    assert_eq!(b.check().unwrap(), 0);
}

/// Threads write and read their own pages (interleaved, so they share stripes) while the
/// reclaim daemon writes stripes out: every read sees the thread's last write, and after a
/// clean stop and assembly the data and parity are right.
#[test]
fn concurrent_writers_and_the_reclaim_daemon_agree() {
    use std::sync::atomic::AtomicBool;
    const THREADS: u64 = 4;
    for (level, disks) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let (mems, journal, a) = setup(level, disks, 2 << 20);
        a.set_journal_mode(JournalMode::WriteBack).unwrap();
        a.set_writeback_max_pages(48);
        let a = Arc::new(a);
        let stop = Arc::new(AtomicBool::new(false));
        let daemon = {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || a.writeback_daemon(&stop))
        };
        let pages = 256u64;
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    let mut r = rng(100 + t);
                    let mut mine: Vec<Option<u8>> = vec![None; pages as usize];
                    for _ in 0..400 {
                        let p = r.gen_range(0..pages / THREADS) * THREADS + t;
                        if r.gen_bool(0.7) {
                            let v: u8 = r.gen();
                            a.write(p * 4096, &[v; 4096]).unwrap();
                            mine[p as usize] = Some(v);
                        } else if let Some(v) = mine[p as usize] {
                            let mut got = vec![0u8; 4096];
                            a.read(p * 4096, &mut got).unwrap();
                            assert!(got.iter().all(|b| *b == v), "thread {t} page {p}");
                        }
                    }
                    mine
                })
            })
            .collect();
        let owned: Vec<Vec<Option<u8>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::SeqCst);
        daemon.join().unwrap();
        let check = |a: &uraid_engine::Array| {
            let mut got = vec![0u8; 4096];
            for (t, mine) in owned.iter().enumerate() {
                for (p, v) in mine.iter().enumerate() {
                    if let Some(v) = v {
                        a.read(p as u64 * 4096, &mut got).unwrap();
                        assert!(got.iter().all(|b| b == v), "{level}: thread {t} page {p}");
                    }
                }
            }
        };
        check(&a);
        a.stop().unwrap();
        assert_eq!(a.writeback_stats().unwrap().cached_pages, 0);
        drop(Arc::try_unwrap(a).ok().expect("one owner"));
        let (b, _) = assemble(with_journal(&mems, &journal), &AssembleOptions::default()).unwrap();
        check(&b);
        assert_eq!(b.check().unwrap(), 0, "{level}: parity after a clean stop");
    }
}

/// A log so full that replay cannot carry the write-back rows over into the new log:
/// replay writes them straight to the members (parity from the logged pages and the other
/// data members), unless a data member it would need is missing.
#[test]
fn write_back_rows_that_do_not_fit_the_new_log_are_written_in_place() {
    use uraid_core::geometry::Personality;
    use uraid_engine::journal::{Journal, JournalArea, JournalHost, MemberSet};
    use uraid_engine::{read_superblock, write_superblock};
    struct NoHost;
    impl JournalHost for NoHost {
        fn flush_members(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn set_journal_tail(&self, _: u64) -> std::io::Result<()> {
            Ok(())
        }
    }
    // Drop none, a member whose page is logged, or one whose data must be read.
    for lose in [None, Some(0usize), Some(2usize)] {
        let c = Config {
            level: Level::Raid5,
            layout: None,
            disks: 4,
            chunk_sectors: 16,
            member_bytes: vec![(64 + 256) * 512; 4],
        };
        let mems = mem_members(&c, "fit");
        let mut o = create_opts(&c);
        o.data_offset_sectors = Some(64);
        // The smallest journal: a ring of 64 blocks.
        let jm = Arc::new(MemMember::new("journal", (64 + 512) * 512));
        o.journal = Some(jm.clone());
        let a = uraid_engine::create(as_members(&mems), &o).unwrap();
        let Personality::Parity(g) = a.personality().clone() else {
            unreachable!()
        };
        let before: Vec<u8> = (0..3 * 16 * 512).map(|i| (i % 251) as u8).collect();
        a.write(0, &before).unwrap();
        a.stop().unwrap();
        drop(a);
        // Log write-back data for row 0 of data chunks 0 and 1 again and again, by hand,
        // until the log holds nearly the whole ring.
        let mut jsb = read_superblock(jm.as_ref()).unwrap();
        let area = JournalArea {
            data_offset_bytes: jsb.data_offset * 512,
            size_sectors: jsb.data_size,
        };
        let j = Journal::load(jm.clone(), area, &jsb.set_uuid, jsb.recovery_offset).unwrap();
        let set = MemberSet {
            devs: as_members(&mems).into(),
            data_offset_bytes: vec![64 * 512; 4].into(),
        };
        let rep = j.replay(&g, &set).unwrap();
        jsb.recovery_offset = rep.tail_sectors;
        write_superblock(jm.as_ref(), &jsb).unwrap();
        let locs = [g.array_sector(0, 0), g.array_sector(0, 1)];
        let mut last = Vec::new();
        for k in 0..20u8 {
            let pages: Vec<Vec<u8>> = (0..2).map(|i| vec![k * 2 + i; 4096]).collect();
            let refs: Vec<(u64, &[u8])> = locs
                .iter()
                .copied()
                .zip(pages.iter().map(|p| &p[..]))
                .collect();
            let t = j.append_data(&refs, &NoHost, 0).unwrap();
            let _pinned = t; // never released: these records stay in the log
            last = pages;
        }
        j.flush().unwrap();
        drop(j);
        let members: Vec<Arc<dyn Member>> = mems
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != lose)
            .map(|(_, m)| m.clone() as Arc<dyn Member>)
            .chain([jm.clone() as Arc<dyn Member>])
            .collect();
        // Which role holds data chunk 2 of stripe 0 (its data is not logged).
        let unlogged_role = g.stripe_map(0).data[2].0;
        let r = assemble(
            members,
            &AssembleOptions {
                force: true,
                ..Default::default()
            },
        );
        if lose == Some(unlogged_role) {
            let e = r.err().expect("refused");
            assert!(e.to_string().contains("fit"), "{e}");
            continue;
        }
        let (b, _) = r.unwrap();
        let mut got = vec![0u8; 4096];
        for (loc, want) in locs.iter().zip(&last) {
            b.read(loc * 512, &mut got).unwrap();
            assert_eq!(&got, want, "lose {lose:?}: logged page");
        }
        // The unlogged chunk of the row is unchanged.
        b.read(g.array_sector(0, 2) * 512, &mut got).unwrap();
        let off = (g.array_sector(0, 2) * 512) as usize;
        assert_eq!(got, before[off..off + 4096], "lose {lose:?}: unlogged page");
        if lose.is_none() {
            assert_eq!(b.check().unwrap(), 0);
        }
    }
}

/// Write-back's cached heads are bounded: reclaim keeps them under the page limit
/// (`set_writeback_max_pages`), over it by at most the stripe one writer is adding.
#[test]
fn cached_heads_stay_within_the_page_limit() {
    for (level, disks, parity) in [(Level::Raid5, 4, 1), (Level::Raid6, 5, 2)] {
        let (_mems, _journal, a) = setup(level, disks, 8 << 20);
        a.set_journal_mode(JournalMode::WriteBack).unwrap();
        let limit = 40;
        a.set_writeback_max_pages(limit);
        let size = a.size_bytes().min(1 << 20);
        let mut r = rng(11);
        for _ in 0..300 {
            let pages = r.gen_range(1..=12u64);
            let off = r.gen_range(0..size / 4096 - pages) * 4096;
            let d: Vec<u8> = (0..pages * 4096).map(|_| r.gen()).collect();
            a.write(off, &d).unwrap();
            let now = a.writeback_stats().unwrap().cached_pages;
            assert_eq!(now, a.stripe_cache().cached_pages(), "{level}: one count");
        }
        // chunk_sectors 16: two pages per data chunk.
        let stripe_pages = 2 * (disks - parity);
        let high = a
            .stripe_cache()
            .stats
            .max_cached_pages
            .load(Ordering::Relaxed);
        assert!(
            high >= limit / 2,
            "{level}: the writes should fill the cache ({high})"
        );
        assert!(
            high < limit + stripe_pages,
            "{level}: {high} cached pages with a limit of {limit}"
        );
    }
}
