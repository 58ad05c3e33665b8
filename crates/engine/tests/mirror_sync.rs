//! raid1/raid10 under sync and reconfiguration while many threads write overlapping ranges
//! and read: the resync barriers, the per-region write locks, read balancing and quiesce.
//!
//! Each written sector carries a tag (magic, write id, array sector, and a body derived from
//! both), so a sector is either zero, or whole and in its place. A logical clock (one SeqCst
//! counter, ticked before and after every request) orders requests, and per sector:
//! - a read sees zeros only if no write of the sector had completed when it began, or a
//!   write that began before the read ended and that no completed write had replaced when
//!   the read began;
//! - the final image holds a write that no later-started write followed (last write wins).
//!
//! Beside the IO, one thread runs sync passes: `check` and `repair` must count no mismatch
//! even in the middle of the writes (a sync piece runs with no request inside its barrier,
//! and writes keep the copies equal), `resync` must not lose a write, and recovery onto a
//! re-added member must leave every copy equal. Another variant stops the array, quiesces it
//! and fails/removes/re-adds members while the IO runs. At the end, `check` finds no
//! mismatch (every copy equal).
//!
//! `URAID_SEED=n` replays a seed (the interleaving is the scheduler's, so a failure may need
//! a few replays), `URAID_FULL=1` runs longer.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use uraid_core::{Level, MemberIdx};
use uraid_engine::{AddOutcome, Array, MemMember, Member, SlotState, SyncKind};
use uraid_sim::{FaultMember, Verdict};
use uraid_testkit::engine::*;

const SECTOR: usize = 512;
const MAGIC: [u8; 8] = *b"uRAIDmir";
const MEMBER_BYTES: u64 = 1 << 20;

fn full() -> bool {
    std::env::var("URAID_FULL").is_ok()
}

fn base_seed() -> u64 {
    match std::env::var("URAID_SEED") {
        Ok(s) => s.parse().expect("URAID_SEED is a number"),
        Err(_) => rand::random::<u32>() as u64,
    }
}

fn configs() -> Vec<(&'static str, Config)> {
    let c = |level, layout, disks, chunk_sectors| Config {
        level,
        layout,
        disks,
        chunk_sectors,
        member_bytes: vec![MEMBER_BYTES; disks],
    };
    vec![
        ("raid1-2", c(Level::Raid1, None, 2, 0)),
        ("raid1-3", c(Level::Raid1, None, 3, 0)),
        ("raid10-n2", c(Level::Raid10, Some(0x102), 4, 8)),
        ("raid10-f2", c(Level::Raid10, Some(0x201), 3, 8)),
        ("raid10-o2", c(Level::Raid10, Some(0x10201), 4, 16)),
    ]
}

fn body(id: u64, lba: u64, i: usize) -> u8 {
    (id.wrapping_mul(31)
        .wrapping_add(lba.wrapping_mul(7))
        .wrapping_add(i as u64)
        % 251) as u8
}

fn put_tag(sec: &mut [u8], id: u64, lba: u64) {
    sec[..8].copy_from_slice(&MAGIC);
    sec[8..16].copy_from_slice(&id.to_le_bytes());
    sec[16..24].copy_from_slice(&lba.to_le_bytes());
    for (i, b) in sec[24..].iter_mut().enumerate() {
        *b = body(id, lba, i);
    }
}

/// The write id a sector holds (None: zeros), or why it is not a whole sector of one write.
fn read_tag(sec: &[u8], lba: u64) -> Result<Option<u64>, String> {
    if sec.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    if sec[..8] != MAGIC {
        return Err(format!("sector {lba}: not a tagged sector"));
    }
    let id = u64::from_le_bytes(sec[8..16].try_into().unwrap());
    let at = u64::from_le_bytes(sec[16..24].try_into().unwrap());
    if at != lba {
        return Err(format!("sector {lba}: holds sector {at} of write {id:#x}"));
    }
    if sec[24..]
        .iter()
        .enumerate()
        .any(|(i, &b)| b != body(id, lba, i))
    {
        return Err(format!("sector {lba}: torn (write {id:#x})"));
    }
    Ok(Some(id))
}

#[derive(Clone, Copy)]
struct WriteRec {
    off: u64,
    len: u64,
    start: u64,
    end: u64,
}

struct ReadRec {
    off: u64,
    start: u64,
    end: u64,
    seen: Vec<Option<u64>>,
}

/// What runs beside the IO threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Beside {
    /// check, repair and resync passes, one after another.
    Sync,
    /// A member is failed, removed and re-added; recovery runs, then checks.
    Recovery,
    /// stop, quiesce, and member fail/remove/re-add with recovery, repeatedly.
    Reconfig,
}

struct Run {
    writers: usize,
    readers: usize,
    ops: u64,
    /// Sectors the requests fall into (small, so that they overlap a lot).
    hot: u64,
}

fn clock(c: &AtomicU64) -> u64 {
    c.fetch_add(1, Ordering::SeqCst)
}

fn fresh_member(name: String) -> Arc<dyn Member> {
    Arc::new(MemMember::new(name, MEMBER_BYTES))
}

/// Fail a survivable member, remove it and add a fresh device in its place; the caller runs
/// recovery.
fn swap_member(a: &Array, rng: &mut StdRng, n: &mut u32) {
    let cands: Vec<MemberIdx> = (0..a.raid_disks())
        .map(MemberIdx)
        .filter(|r| a.personality().survives(&[*r]))
        .collect();
    let role = cands[rng.gen_range(0..cands.len())];
    a.fail_member(role).expect("fail a member");
    a.remove_member(role).expect("remove the failed member");
    *n += 1;
    match a.add_member(fresh_member(format!("new{n}"))).expect("add") {
        AddOutcome::Recovering(r) => assert_eq!(r, role),
        other => panic!("the new device became {other:?}"),
    }
}

fn beside(a: &Array, seed: u64, what: Beside, done: &AtomicBool) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut added = 0;
    if what == Beside::Recovery {
        swap_member(a, &mut rng, &mut added);
        a.run_sync(SyncKind::Recovery, |_| {})
            .expect("recovery under IO");
        assert!(!a.is_degraded(), "recovery left the array degraded");
    }
    let mut passes = 0;
    while passes == 0 || !done.load(Ordering::Acquire) {
        passes += 1;
        match (what, rng.gen_range(0..3)) {
            (Beside::Reconfig, 0) => {
                a.stop().expect("stop under IO");
            }
            (Beside::Reconfig, 1) => {
                let _q = a.quiesce();
                let before = (
                    a.stats.member_reads.load(Ordering::SeqCst),
                    a.stats.member_writes.load(Ordering::SeqCst),
                );
                for _ in 0..50 {
                    std::thread::yield_now();
                }
                let after = (
                    a.stats.member_reads.load(Ordering::SeqCst),
                    a.stats.member_writes.load(Ordering::SeqCst),
                );
                assert_eq!(before, after, "member IO ran while the array was quiesced");
            }
            (Beside::Reconfig, _) => {
                swap_member(a, &mut rng, &mut added);
                a.run_sync(SyncKind::Recovery, |_| {})
                    .expect("recovery under IO");
            }
            (_, 0) => assert_eq!(a.check().expect("check"), 0, "check under IO mismatched"),
            (_, 1) => assert_eq!(a.repair().expect("repair"), 0, "repair under IO mismatched"),
            (_, _) => {
                a.resync().expect("resync under IO");
            }
        }
    }
}

fn run(a: &Array, seed: u64, what: Beside, p: &Run) {
    let hot = p.hot.min(a.size_bytes() / SECTOR as u64);
    let max_len = 160;
    let tick = AtomicU64::new(1);
    let done = AtomicBool::new(false);
    let reads: Mutex<Vec<ReadRec>> = Mutex::new(Vec::new());
    let writes: Vec<(u64, WriteRec)> = std::thread::scope(|sc| {
        let done = &done;
        let side = sc.spawn(move || beside(a, seed, what, done));
        for t in 0..p.readers {
            let (tick, reads) = (&tick, &reads);
            sc.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 101) << 40));
                let mut mine = Vec::new();
                while mine.is_empty() || (!done.load(Ordering::Acquire) && mine.len() < 20_000) {
                    let len = rng.gen_range(1..=max_len);
                    let off = rng.gen_range(0..=hot - len);
                    let mut buf = vec![0u8; len as usize * SECTOR];
                    let start = clock(tick);
                    a.read(off * SECTOR as u64, &mut buf)
                        .unwrap_or_else(|e| panic!("reader {t}: read {off}+{len}: {e}"));
                    let end = clock(tick);
                    let seen = buf
                        .chunks(SECTOR)
                        .enumerate()
                        .map(|(i, s)| {
                            read_tag(s, off + i as u64).unwrap_or_else(|e| panic!("reader: {e}"))
                        })
                        .collect();
                    mine.push(ReadRec {
                        off,
                        start,
                        end,
                        seen,
                    });
                }
                reads.lock().unwrap().extend(mine);
            });
        }
        let hs: Vec<_> = (0..p.writers)
            .map(|t| {
                let tick = &tick;
                sc.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 1) << 40));
                    let mut log = Vec::new();
                    for seq in 1..=p.ops {
                        let len = rng.gen_range(1..=max_len);
                        let off = rng.gen_range(0..=hot - len);
                        let id = (t as u64) << 32 | seq;
                        let mut buf = vec![0u8; len as usize * SECTOR];
                        for (i, s) in buf.chunks_mut(SECTOR).enumerate() {
                            put_tag(s, id, off + i as u64);
                        }
                        let start = clock(tick);
                        a.write(off * SECTOR as u64, &buf)
                            .unwrap_or_else(|e| panic!("writer {t}: write {off}+{len}: {e}"));
                        let end = clock(tick);
                        log.push((
                            id,
                            WriteRec {
                                off,
                                len,
                                start,
                                end,
                            },
                        ));
                    }
                    log
                })
            })
            .collect();
        let logs: Vec<_> = hs
            .into_iter()
            .flat_map(|h| h.join().expect("writer panicked"))
            .collect();
        done.store(true, Ordering::Release);
        side.join().expect("sync/reconfig thread panicked");
        logs
    });
    let by_id: std::collections::HashMap<u64, WriteRec> = writes.iter().copied().collect();
    // Per hot sector: (start, end) of every write that covered it.
    let mut covers: Vec<Vec<(u64, u64)>> = vec![Vec::new(); hot as usize];
    for w in by_id.values() {
        for s in w.off..w.off + w.len {
            covers[s as usize].push((w.start, w.end));
        }
    }
    // The write of a sector that ended last before `t` (by end), if any.
    let ended_before = |lba: u64, t: u64| -> Option<(u64, u64)> {
        covers[lba as usize]
            .iter()
            .copied()
            .filter(|&(_, e)| e < t)
            .max_by_key(|&(_, e)| e)
    };
    let lookup = |lba: u64, id: u64| -> WriteRec {
        let w = *by_id
            .get(&id)
            .unwrap_or_else(|| panic!("sector {lba}: write {id:#x} was never issued"));
        assert!(
            lba >= w.off && lba < w.off + w.len,
            "sector {lba}: misplaced"
        );
        w
    };
    for rd in reads.into_inner().unwrap() {
        for (i, seen) in rd.seen.iter().enumerate() {
            let lba = rd.off + i as u64;
            let done_before = ended_before(lba, rd.start);
            match *seen {
                None => assert!(
                    done_before.is_none(),
                    "sector {lba}: a read [{}, {}] saw zeros after a write {done_before:?} \
                     had completed",
                    rd.start,
                    rd.end
                ),
                Some(id) => {
                    let w = lookup(lba, id);
                    assert!(
                        w.start < rd.end,
                        "sector {lba}: a read saw a write that began after it"
                    );
                    // Stale: a write that began after W ended had completed before the read.
                    let replaced = covers[lba as usize]
                        .iter()
                        .any(|&(s, e)| s > w.end && e < rd.start);
                    assert!(
                        !replaced,
                        "sector {lba}: a read [{}, {}] saw write {id:#x} [{}, {}] although a \
                         later write had replaced it (stale read)",
                        rd.start, rd.end, w.start, w.end
                    );
                }
            }
        }
    }
    let mut img = vec![0u8; (hot as usize) * SECTOR];
    a.read(0, &mut img).expect("final read");
    for (i, sec) in img.chunks(SECTOR).enumerate() {
        let lba = i as u64;
        match read_tag(sec, lba).unwrap_or_else(|e| panic!("final image: {e}")) {
            None => assert!(
                covers[i].is_empty(),
                "final image: sector {lba} is zero although a write covered it"
            ),
            Some(id) => {
                let w = lookup(lba, id);
                assert!(
                    !covers[i].iter().any(|&(s, _)| s > w.end),
                    "final image: sector {lba} holds write {id:#x} but a later write came \
                     after it (lost write)"
                );
            }
        }
    }
    assert!(!a.is_degraded(), "the array ended degraded");
    assert!(
        (0..a.raid_disks()).all(|r| a.slot_state(MemberIdx(r)) == SlotState::InSync),
        "a member is not in sync at the end"
    );
    assert_eq!(
        a.check().expect("final check"),
        0,
        "copies differ at the end"
    );
}

fn each(test: &str, what: Beside, p: &Run) {
    let seed = base_seed();
    let rounds = if full() { 5 } else { 1 };
    for round in 0..rounds {
        let seed = seed.wrapping_add(round * 7919);
        for (name, c) in configs() {
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mems = mem_members(&c, "ms");
                let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).expect("create");
                run(&a, seed, what, p);
            }));
            if res.is_err() {
                panic!(
                    "{test}: {name} {what:?} failed with seed {seed} (replay: URAID_SEED={seed})"
                );
            }
        }
    }
}

#[test]
fn check_repair_and_resync_under_overlapping_writes() {
    let p = Run {
        writers: 6,
        readers: 2,
        ops: if full() { 2000 } else { 150 },
        hot: 1024,
    };
    each("sync", Beside::Sync, &p);
}

#[test]
fn recovery_under_overlapping_writes_leaves_copies_equal() {
    let p = Run {
        writers: 6,
        readers: 2,
        ops: if full() { 2000 } else { 150 },
        hot: 2048,
    };
    each("recovery", Beside::Recovery, &p);
}

#[test]
fn stop_quiesce_and_member_changes_under_io_do_not_deadlock() {
    let p = Run {
        writers: 4,
        readers: 2,
        ops: if full() { 1500 } else { 120 },
        hot: 1024,
    };
    each("reconfig", Beside::Reconfig, &p);
}

/// The oracle must catch what it claims to.
#[test]
fn the_tag_oracle_rejects_torn_and_moved_sectors() {
    let mut s = [0u8; SECTOR];
    put_tag(&mut s, 9, 77);
    assert_eq!(read_tag(&s, 77).unwrap(), Some(9));
    assert!(read_tag(&s, 78).is_err());
    let mut o = [0u8; SECTOR];
    put_tag(&mut o, 10, 77);
    let mut torn = s;
    torn[300..].copy_from_slice(&o[300..]);
    assert!(read_tag(&torn, 77).is_err());
}

/// The shape changes (a new epoch, as reshape will make) while requests run: requests keep
/// working, and every shape read is whole (its fields are those of one version).
#[test]
fn shape_changes_under_io_are_seen_whole() {
    let seed = base_seed();
    let (_, c) = configs().remove(0);
    let mems = mem_members(&c, "shape");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).expect("create");
    let base = a.shape();
    let changes = if full() { 2000 } else { 200 };
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (a, done) = (&a, &done);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ t);
                let mut buf = vec![0u8; 4096];
                while !done.load(Ordering::Acquire) {
                    let sh = a.shape();
                    // Only the epoch and the layout word change, together.
                    assert_eq!(
                        u64::from(sh.layout),
                        sh.epoch % 7,
                        "torn shape (seed {seed})"
                    );
                    assert_eq!(sh.raid_disks, base.raid_disks);
                    // Each thread its own blocks (block % 3 == t): a read-back must see
                    // this thread's write, not another's.
                    let off = (rng.gen_range(0..a.size_bytes() / 4096 / 3) * 3 + t) * 4096;
                    rng.fill(&mut buf[..]);
                    a.write(off, &buf).expect("write");
                    let mut back = vec![0u8; 4096];
                    a.read(off, &mut back).expect("read");
                    assert_eq!(back, buf, "read back (seed {seed})");
                }
            });
        }
        for k in 1..=changes {
            a.set_shape(uraid_engine::Shape {
                epoch: k,
                layout: (k % 7) as u32,
                ..base
            });
        }
        done.store(true, Ordering::Release);
    });
    assert_eq!(a.shape().epoch, changes);
}

/// Read balancing: a sequential stream stays on the copy where it started (md's
/// head-position rule), and once that copy is faulty the stream moves to another.
#[test]
fn a_sequential_stream_stays_on_one_copy() {
    for (name, c) in configs() {
        let mems = mem_members(&c, "seq");
        // Reads of the data area (past the 64-sector data offset), per member.
        let counted: Vec<Arc<AtomicU64>> = mems.iter().map(|_| Arc::default()).collect();
        let devs = as_members(&mems)
            .into_iter()
            .zip(&counted)
            .map(|(m, n)| {
                let n = n.clone();
                let m = FaultMember::new(m.unwrap())
                    .zeroes_by_writing()
                    .with_hook(move |io| {
                        if !io.write && io.offset >= 64 * 512 {
                            n.fetch_add(1, Ordering::SeqCst);
                        }
                        Verdict::Pass
                    });
                Some(Arc::new(m) as Arc<dyn Member>)
            })
            .collect();
        let a = uraid_engine::create(devs, &create_opts(&c)).expect("create");
        let counts = || -> Vec<u64> { counted.iter().map(|n| n.load(Ordering::SeqCst)).collect() };
        let base = counts();
        let mut buf = vec![0u8; 4096];
        // 64 KiB in 4 KiB reads, chunk-aligned so raid10 pieces follow each other too.
        let start = 0u64;
        for i in 0..16u64 {
            a.read(start + i * 4096, &mut buf).expect("read");
        }
        let used: Vec<usize> = counts()
            .iter()
            .zip(&base)
            .enumerate()
            .filter(|(_, (n, b))| *n > *b)
            .map(|(i, _)| i)
            .collect();
        if c.level == Level::Raid1 {
            assert_eq!(
                used.len(),
                1,
                "{name}: a sequential stream used members {used:?}"
            );
            // Fail that copy: the stream continues elsewhere, and stays there.
            a.fail_member(MemberIdx(used[0])).expect("fail");
            let before = counts();
            for i in 16..32u64 {
                a.read(start + i * 4096, &mut buf).expect("read");
            }
            let moved: Vec<usize> = counts()
                .iter()
                .zip(&before)
                .enumerate()
                .filter(|(_, (n, b))| *n > *b)
                .map(|(i, _)| i)
                .collect();
            assert_eq!(
                moved.len(),
                1,
                "{name}: after the failure, members {moved:?}"
            );
            assert_ne!(moved[0], used[0], "{name}: read from the failed member");
        } else if name == "raid10-n2" {
            // Chunks alternate between the pairs (0,1) and (2,3); member sectors advance
            // every other chunk, so each pair's stream continues on the copy it started on:
            // one member per pair.
            assert_eq!(
                used.len(),
                2,
                "{name}: a sequential stream used members {used:?}"
            );
            assert!(used[0] < 2 && used[1] >= 2, "{name}: used {used:?}");
        }
    }
}
