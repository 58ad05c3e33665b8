//! Many threads against every level, with overlapping writes, concurrent readers and a member
//! failing in the middle of the run.
//!
//! What is checked, and why that is the guarantee (it is what Linux md gives a block device):
//! - **Disjoint phase**: the array is cut into spans of random length (crossing chunk and stripe
//!   boundaries) owned by one thread each. A thread writes random bytes into its spans and reads
//!   them back at any time; both the read-backs and the final image must equal the model
//!   exactly. Threads share stripes, so this catches parity updates that race (a lost
//!   read-modify-write shows up as wrong data on a degraded read).
//! - **Overlapping phase**: writers write tagged sectors (magic, write id = thread and
//!   sequence, array sector, block and sector index inside the request, and a body derived
//!   from all of these) at random overlapping offsets, 4 KiB-aligned or not, with lengths that
//!   cross chunk and stripe boundaries. Every sector is checked on its own: it must hold a
//!   whole sector of one write that covered exactly that sector (never torn, never moved,
//!   never data nobody wrote), and it must not hold a write W when another write of that
//!   sector began after W had completed (per-sector real-time order: the last write wins).
//!   A request spanning several sectors is *not* checked for atomicity as a whole: md splits
//!   requests at stripe and chunk boundaries and so does uraid, so two overlapping concurrent
//!   writes may interleave sector by sector, and that is allowed.
//! - **Readers** run beside the writers; for each sector a read may return a write that had
//!   started before the read ended and that no write completed before the read began has
//!   superseded (or zeros, if no write of the sector had completed before the read began).
//!   Time here is a logical clock: one SeqCst counter taken before and after every request.
//! - **Redundancy**: after the run, a healthy array must resync with 0 mismatches (parity or
//!   mirror copies). After a member failed mid-run, every further degraded view that the
//!   level survives (rebuilt over copies of the surviving members) must read the same bytes.
//! - **Stress mode**: many threads on two stripes (or mirror regions), for the lock splitting.
//!
//! Seeds: the seed fixes every thread's requests and which member fails; the interleaving is
//! up to the scheduler, so a failure may need a few replays. `URAID_SEED=n` replays a seed,
//! `URAID_FULL=1` runs longer.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use uraid_core::geometry::raid5::*;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{Array, MemMember, Member};
use uraid_sim::{FaultMember, Verdict};
use uraid_testkit::engine::*;

const SECTOR: usize = 512;
const MAGIC: [u8; 8] = *b"uRAIDtag";
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

fn cfg(level: Level, layout: Option<u32>, disks: usize, chunk_sectors: u64) -> Config {
    Config {
        level,
        layout,
        disks,
        chunk_sectors,
        member_bytes: vec![MEMBER_BYTES; disks],
    }
}

/// Every level, raid10's three layouts, a symmetric and an asymmetric raid5 layout.
fn configs() -> Vec<(&'static str, Config)> {
    vec![
        ("raid0", cfg(Level::Raid0, None, 3, 8)),
        ("raid1-2", cfg(Level::Raid1, None, 2, 0)),
        ("raid1-3", cfg(Level::Raid1, None, 3, 0)),
        ("raid10-n2", cfg(Level::Raid10, Some(0x102), 4, 8)),
        ("raid10-f2", cfg(Level::Raid10, Some(0x201), 3, 8)),
        ("raid10-o2", cfg(Level::Raid10, Some(0x10201), 4, 16)),
        ("raid4", cfg(Level::Raid4, None, 4, 8)),
        (
            "raid5-ls",
            cfg(Level::Raid5, Some(ALGORITHM_LEFT_SYMMETRIC), 4, 8),
        ),
        (
            "raid5-ra",
            cfg(Level::Raid5, Some(ALGORITHM_RIGHT_ASYMMETRIC), 5, 16),
        ),
        (
            "raid6-ls",
            cfg(Level::Raid6, Some(ALGORITHM_LEFT_SYMMETRIC), 5, 8),
        ),
        (
            "raid6-la6",
            cfg(Level::Raid6, Some(ALGORITHM_LEFT_ASYMMETRIC_6), 6, 8),
        ),
    ]
}

/// Sectors of one lock unit: a stripe's data (parity levels), a row of chunks (raid0/10), a
/// mirror lock region (raid1, 64 KiB).
fn unit_sectors(c: &Config) -> u64 {
    let d = c.disks as u64;
    match c.level {
        Level::Raid1 => 128,
        Level::Raid4 | Level::Raid5 => c.chunk_sectors * (d - 1),
        Level::Raid6 => c.chunk_sectors * (d - 2),
        Level::Raid0 | Level::Raid10 => c.chunk_sectors * d,
    }
}

struct Rig {
    cfg: Config,
    mems: Vec<Arc<MemMember>>,
    a: Array,
}

fn rig(cfg: &Config) -> Rig {
    rig_with(cfg, |m, _| m)
}

/// An array whose members are `wrap`ped (fault injection); `mems` stay the bare memory.
fn rig_with(cfg: &Config, wrap: impl Fn(Arc<dyn Member>, usize) -> Arc<dyn Member>) -> Rig {
    let mems = mem_members(cfg, "cc");
    let devs = as_members(&mems)
        .into_iter()
        .enumerate()
        .map(|(i, d)| d.map(|d| wrap(d, i)))
        .collect();
    let a = uraid_engine::create(devs, &create_opts(cfg)).expect("create");
    Rig {
        cfg: cfg.clone(),
        mems,
        a,
    }
}

fn sectors_of(a: &Array) -> u64 {
    a.size_bytes() / SECTOR as u64
}

/// A logical clock that orders request starts and ends (SeqCst, so "W ended before R began"
/// implies W's member writes happen before R's member reads).
struct Clock(AtomicU64);

impl Clock {
    fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// Roles that can fail alone, and the one the seed picks (None for raid0).
fn pick_victim(a: &Array, rng: &mut StdRng) -> Option<MemberIdx> {
    let cands: Vec<MemberIdx> = (0..a.raid_disks())
        .map(MemberIdx)
        .filter(|r| a.personality().survives(&[*r]))
        .collect();
    if cands.is_empty() {
        None
    } else {
        Some(cands[rng.gen_range(0..cands.len())])
    }
}

/// Fail `victim` once `progress` reaches `at` (or all work is done).
fn chaos(a: &Array, victim: MemberIdx, progress: &AtomicU64, at: u64, done: &AtomicBool) {
    while progress.load(Ordering::Acquire) < at && !done.load(Ordering::Acquire) {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    a.fail_member(victim)
        .unwrap_or_else(|e| panic!("fail_member({victim}) during the run: {e}"));
}

/// When a member fails: never, before the threads start, or in the middle of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Healthy,
    FailBefore,
    FailDuring,
}

/// Pick the victim for `mode` and fail it now if the mode says so.
fn prepare(a: &Array, rng: &mut StdRng, mode: Mode) -> Option<MemberIdx> {
    let v = match mode {
        Mode::Healthy => None,
        _ => pick_victim(a, rng),
    };
    if let (Mode::FailBefore, Some(v)) = (mode, v) {
        a.fail_member(v).expect("fail a member before the run");
    }
    v
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

// ---------------------------------------------------------------------------------------------
// Redundancy checks.

fn copy_member(m: &MemMember, name: String) -> Arc<MemMember> {
    let snap = m.snapshot();
    let c = MemMember::new(name, snap.len() as u64);
    c.write_at(&snap, 0).expect("copy member");
    Arc::new(c)
}

/// A healthy array resyncs with no mismatch; a degraded one reads the same bytes through every
/// further degraded view it survives (each built over copies of the surviving members).
fn check_redundancy(r: &Rig, failed: &[MemberIdx], reference: &[u8]) {
    if failed.is_empty() {
        let n = r.a.resync().expect("resync");
        assert_eq!(
            n, 0,
            "redundancy inconsistent after the run: resync rewrote {n} regions"
        );
        return;
    }
    for extra in 0..r.cfg.disks {
        let mut missing = failed.to_vec();
        if missing.contains(&MemberIdx(extra)) {
            continue;
        }
        missing.push(MemberIdx(extra));
        if !r.a.personality().survives(&missing) {
            continue;
        }
        let devs: Vec<Option<Arc<dyn Member>>> = (0..r.cfg.disks)
            .map(|i| {
                if missing.contains(&MemberIdx(i)) {
                    None
                } else {
                    Some(copy_member(&r.mems[i], format!("view{i}")) as Arc<dyn Member>)
                }
            })
            .collect();
        let v = uraid_engine::create(devs, &create_opts(&r.cfg)).expect("degraded view");
        assert_eq!(v.size_bytes(), r.a.size_bytes(), "view has another size");
        let mut got = vec![0u8; reference.len()];
        v.read(0, &mut got).expect("read degraded view");
        if let Some(i) = first_diff(&got, reference) {
            panic!(
                "redundancy inconsistent: the view without members {missing:?} differs at \
                 byte {i} (sector {})",
                i / SECTOR
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// (a) Disjoint regions: exact model.

struct Span {
    off: u64,
    len: u64,
    owner: usize,
}

fn disjoint(r: &Rig, seed: u64, mode: Mode) {
    let threads = 8usize;
    let ops: u64 = if full() { 3000 } else { 150 };
    let a = &r.a;
    let unit = unit_sectors(&r.cfg);
    let region = (24 * unit).min(sectors_of(a));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut spans = Vec::new();
    let mut s = 0;
    while s < region {
        let len = rng.gen_range(1..=unit * 3 / 2).min(region - s);
        spans.push(Span {
            off: s,
            len,
            owner: rng.gen_range(0..threads),
        });
        s += len;
    }
    let victim = prepare(a, &mut rng, mode);
    let progress = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let total = ops * threads as u64;
    let models: Vec<Vec<(u64, Vec<u8>)>> = std::thread::scope(|sc| {
        if let (Mode::FailDuring, Some(v)) = (mode, victim) {
            let (progress, done) = (&progress, &done);
            sc.spawn(move || chaos(a, v, progress, total / 3, done));
        }
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let own: Vec<(u64, u64)> = spans
                    .iter()
                    .filter(|sp| sp.owner == t)
                    .map(|sp| (sp.off, sp.len))
                    .collect();
                let progress = &progress;
                sc.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 1) << 48));
                    let mut model: Vec<(u64, Vec<u8>)> = own
                        .iter()
                        .map(|&(o, l)| (o, vec![0u8; l as usize * SECTOR]))
                        .collect();
                    for i in 0..ops {
                        if model.is_empty() {
                            break;
                        }
                        let k = rng.gen_range(0..model.len());
                        let (off, ref mut m) = model[k];
                        let len = m.len() as u64 / SECTOR as u64;
                        let lo = rng.gen_range(0..len);
                        let hi = rng.gen_range(lo + 1..=len);
                        let range = lo as usize * SECTOR..hi as usize * SECTOR;
                        rng.fill(&mut m[range.clone()]);
                        a.write((off + lo) * SECTOR as u64, &m[range.clone()])
                            .unwrap_or_else(|e| panic!("thread {t} write {i}: {e}"));
                        progress.fetch_add(1, Ordering::Release);
                        if i % 3 == 0 {
                            let k = rng.gen_range(0..model.len());
                            let (off, ref m) = model[k];
                            let mut got = vec![0u8; m.len()];
                            a.read(off * SECTOR as u64, &mut got)
                                .unwrap_or_else(|e| panic!("thread {t} read {i}: {e}"));
                            if let Some(d) = first_diff(&got, m) {
                                panic!(
                                    "thread {t} op {i}: its own span at sector {off} reads \
                                     back wrong at sector {} (degraded: {:?})",
                                    off + (d / SECTOR) as u64,
                                    a.missing_roles()
                                );
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        // Stop the helpers before a writer's panic propagates, or the scope never ends.
        let out: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
        done.store(true, Ordering::Release);
        out.into_iter()
            .map(|r| r.expect("writer panicked"))
            .collect()
    });
    let failed = a.missing_roles();
    assert_eq!(failed, victim.into_iter().collect::<Vec<_>>());
    let mut expect = vec![0u8; a.size_bytes() as usize];
    for m in models.iter().flatten() {
        let o = m.0 as usize * SECTOR;
        expect[o..o + m.1.len()].copy_from_slice(&m.1);
    }
    let mut got = vec![0u8; expect.len()];
    a.read(0, &mut got).expect("final read");
    if let Some(i) = first_diff(&got, &expect) {
        panic!(
            "final image differs from the model at sector {} (failed: {failed:?})",
            i / SECTOR
        );
    }
    check_redundancy(r, &failed, &got);
}

// ---------------------------------------------------------------------------------------------
// (b, c) Overlapping tagged writes with concurrent readers.

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn write_id(thread: usize, seq: u64) -> u64 {
    ((thread as u64 + 1) << 32) | seq
}

/// Fill one sector with the tag of write `id`, sector `idx` of the request, at array `lba`.
fn put_tag(sec: &mut [u8], id: u64, lba: u64, idx: u64) {
    sec[0..8].copy_from_slice(&MAGIC);
    sec[8..16].copy_from_slice(&id.to_le_bytes());
    sec[16..24].copy_from_slice(&lba.to_le_bytes());
    sec[24..28].copy_from_slice(&(((id >> 32) - 1) as u32).to_le_bytes()); // thread
    sec[28..32].copy_from_slice(&(id as u32).to_le_bytes()); // sequence
    sec[32..36].copy_from_slice(&((idx / 8) as u32).to_le_bytes()); // 4 KiB block
    sec[36..40].copy_from_slice(&((idx % 8) as u32).to_le_bytes()); // sector in block
    let mut st = id ^ lba.rotate_left(29) ^ idx.rotate_left(47);
    for w in sec[40..].chunks_mut(8) {
        let v = splitmix(&mut st).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

/// What one sector holds: None for zeros (never written), else (write id, index in request).
/// Anything else (torn, moved, garbage) is an error.
fn read_tag(sec: &[u8], lba: u64) -> Result<Option<(u64, u64)>, String> {
    if sec.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    if sec[0..8] != MAGIC {
        return Err(format!(
            "sector {lba}: no tag (data nobody wrote): {:02x?}",
            &sec[..16]
        ));
    }
    let u64_at = |o: usize| u64::from_le_bytes(sec[o..o + 8].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(sec[o..o + 4].try_into().unwrap()) as u64;
    let id = u64_at(8);
    let at = u64_at(16);
    if at != lba {
        return Err(format!(
            "sector {lba}: holds a sector written for sector {at} (write {id:#x})"
        ));
    }
    let idx = u32_at(32) * 8 + u32_at(36);
    let mut want = [0u8; SECTOR];
    put_tag(&mut want, id, lba, idx);
    if sec != want {
        return Err(format!(
            "sector {lba}: torn or corrupt sector of write {id:#x} (thread {}, seq {}), \
             first bad byte {}",
            (id >> 32) - 1,
            id as u32,
            first_diff(sec, &want).unwrap_or(0)
        ));
    }
    Ok(Some((id, idx)))
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
    seen: Vec<Option<(u64, u64)>>,
}

/// The writes of one sector sorted by end, with the one that began latest among each prefix:
/// answers "which write began last among those that had ended before t" in O(log n).
struct SectorHistory {
    /// (end, start), sorted by end.
    by_end: Vec<(u64, u64)>,
    /// Index in `by_end` of the latest start among `by_end[..=i]`.
    latest: Vec<usize>,
}

impl SectorHistory {
    fn new(writes: Vec<(u64, u64)>) -> SectorHistory {
        let mut by_end: Vec<(u64, u64)> = writes.into_iter().map(|(s, e)| (e, s)).collect();
        by_end.sort_unstable();
        let mut latest: Vec<usize> = Vec::with_capacity(by_end.len());
        for i in 0..by_end.len() {
            let best = match latest.last() {
                Some(&j) if by_end[j].1 > by_end[i].1 => j,
                _ => i,
            };
            latest.push(best);
        }
        SectorHistory { by_end, latest }
    }

    /// (start, end) of the write that began last among those that ended before `t`.
    fn latest_ended_before(&self, t: u64) -> Option<(u64, u64)> {
        let n = self.by_end.partition_point(|&(e, _)| e < t);
        let (e, s) = self.by_end[*self.latest.get(n.checked_sub(1)?)?];
        Some((s, e))
    }
}

struct Overlap {
    writers: usize,
    readers: usize,
    ops_per_writer: u64,
    /// Hot region in lock units.
    units: u64,
}

/// Offset and length (sectors) of a random request in [lo, hi): half 4 KiB-aligned.
fn random_range(rng: &mut StdRng, lo: u64, hi: u64, max_len: u64) -> (u64, u64) {
    let span = hi - lo;
    if rng.gen_bool(0.5) && span >= 8 {
        let len = rng.gen_range(1..=(max_len / 8).clamp(1, span / 8)) * 8;
        let off = lo + rng.gen_range(0..=(span - len) / 8) * 8;
        (off, len)
    } else {
        let len = rng.gen_range(1..=max_len.min(span));
        (lo + rng.gen_range(0..=span - len), len)
    }
}

fn overlapping(r: &Rig, seed: u64, mode: Mode, p: &Overlap) {
    let a = &r.a;
    let unit = unit_sectors(&r.cfg);
    let hot = (p.units * unit).min(sectors_of(a));
    let max_len = 2 * unit + 8;
    let clock = Clock(AtomicU64::new(1));
    let mut rng = StdRng::seed_from_u64(seed);
    let victim = prepare(a, &mut rng, mode);
    let progress = AtomicU64::new(0);
    let writers_done = AtomicBool::new(false);
    let total = p.ops_per_writer * p.writers as u64;
    let reads: Mutex<Vec<ReadRec>> = Mutex::new(Vec::new());
    let logs: Vec<Vec<(u64, WriteRec)>> = std::thread::scope(|sc| {
        if let (Mode::FailDuring, Some(v)) = (mode, victim) {
            let (progress, done) = (&progress, &writers_done);
            sc.spawn(move || chaos(a, v, progress, total / 3, done));
        }
        for t in 0..p.readers {
            let (clock, reads, done) = (&clock, &reads, &writers_done);
            sc.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 101) << 48));
                let mut mine = Vec::new();
                // Bounded, so that long runs keep the check's memory small; at least one
                // read even when the scheduler runs this thread only after the writers.
                while mine.is_empty() || (!done.load(Ordering::Acquire) && mine.len() < 20_000) {
                    let (off, len) = random_range(&mut rng, 0, hot, max_len);
                    let mut buf = vec![0u8; len as usize * SECTOR];
                    let start = clock.tick();
                    a.read(off * SECTOR as u64, &mut buf)
                        .unwrap_or_else(|e| panic!("reader {t}: read {off}+{len}: {e}"));
                    let end = clock.tick();
                    let seen = buf
                        .chunks(SECTOR)
                        .enumerate()
                        .map(|(i, sec)| {
                            read_tag(sec, off + i as u64)
                                .unwrap_or_else(|e| panic!("reader {t}: concurrent read: {e}"))
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
                let (clock, progress) = (&clock, &progress);
                sc.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 1) << 48));
                    let mut log = Vec::new();
                    for seq in 1..=p.ops_per_writer {
                        let (off, len) = random_range(&mut rng, 0, hot, max_len);
                        let id = write_id(t, seq);
                        let mut buf = vec![0u8; len as usize * SECTOR];
                        for (i, sec) in buf.chunks_mut(SECTOR).enumerate() {
                            put_tag(sec, id, off + i as u64, i as u64);
                        }
                        let start = clock.tick();
                        a.write(off * SECTOR as u64, &buf)
                            .unwrap_or_else(|e| panic!("writer {t}: write {off}+{len}: {e}"));
                        let end = clock.tick();
                        log.push((
                            id,
                            WriteRec {
                                off,
                                len,
                                start,
                                end,
                            },
                        ));
                        progress.fetch_add(1, Ordering::Release);
                    }
                    log
                })
            })
            .collect();
        let logs: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
        writers_done.store(true, Ordering::Release);
        logs.into_iter()
            .map(|r| r.expect("writer panicked"))
            .collect()
    });
    let failed = a.missing_roles();
    assert_eq!(failed, victim.into_iter().collect::<Vec<_>>());

    let writes: HashMap<u64, WriteRec> = logs.into_iter().flatten().collect();
    // Per hot sector: (start, end) of every write that covered it.
    let mut covers: Vec<Vec<(u64, u64)>> = vec![Vec::new(); hot as usize];
    for w in writes.values() {
        for s in w.off..w.off + w.len {
            covers[s as usize].push((w.start, w.end));
        }
    }
    let by_sector: Vec<SectorHistory> = covers.into_iter().map(SectorHistory::new).collect();
    let lookup = |lba: u64, seen: (u64, u64)| -> WriteRec {
        let (id, idx) = seen;
        let w = *writes
            .get(&id)
            .unwrap_or_else(|| panic!("sector {lba}: write {id:#x} was never issued"));
        assert!(
            lba >= w.off && lba < w.off + w.len && idx == lba - w.off,
            "sector {lba}: holds sector {idx} of write {id:#x} at {}+{}: misplaced",
            w.off,
            w.len
        );
        w
    };

    // (c) Every read saw, per sector, a write that was not superseded before the read began.
    let reads = reads.into_inner().unwrap();
    let mut observed = 0u64;
    for rd in &reads {
        for (i, seen) in rd.seen.iter().enumerate() {
            let lba = rd.off + i as u64;
            let cover = &by_sector[lba as usize];
            observed += 1;
            match *seen {
                None => {
                    if let Some((ws, we)) = cover.latest_ended_before(rd.start) {
                        panic!(
                            "sector {lba}: a read [{}, {}] saw zeros after a write [{ws}, {we}] \
                             had completed",
                            rd.start, rd.end
                        );
                    }
                }
                Some(seen) => {
                    let w = lookup(lba, seen);
                    assert!(
                        w.start < rd.end,
                        "sector {lba}: a read [{}, {}] saw write {:#x} that began later ({})",
                        rd.start,
                        rd.end,
                        seen.0,
                        w.start
                    );
                    if let Some((ws, we)) = cover
                        .latest_ended_before(rd.start)
                        .filter(|&(ws, _)| ws > w.end)
                    {
                        panic!(
                            "sector {lba}: a read [{}, {}] saw write {:#x} [{}, {}] although \
                             write [{ws}, {we}] replaced it before the read began (stale read)",
                            rd.start, rd.end, seen.0, w.start, w.end
                        );
                    }
                }
            }
        }
    }
    if p.readers > 0 {
        assert!(observed > 0, "readers observed nothing");
    }

    // (b) Final image: the last write of each sector (or one concurrent with it) wins.
    let mut img = vec![0u8; a.size_bytes() as usize];
    a.read(0, &mut img).expect("final read");
    for (i, sec) in img.chunks(SECTOR).enumerate() {
        let lba = i as u64;
        let seen = read_tag(sec, lba).unwrap_or_else(|e| panic!("final image: {e}"));
        let last = if lba < hot {
            by_sector[i].latest_ended_before(u64::MAX)
        } else {
            None
        };
        match seen {
            None => assert!(
                last.is_none(),
                "final image: sector {lba} is zero although a write covered it"
            ),
            Some(seen) => {
                let w = lookup(lba, seen);
                let last_start = last.map_or(0, |l| l.0);
                assert!(
                    w.end > last_start,
                    "final image: sector {lba} holds write {:#x} [{}, {}] but a write starting \
                     at {last_start} came after it (lost write)",
                    seen.0,
                    w.start,
                    w.end
                );
            }
        }
    }
    check_redundancy(r, &failed, &img);
}

// ---------------------------------------------------------------------------------------------
// Drivers.

fn each_config(test: &str, modes: &[Mode], f: impl Fn(&Rig, u64, Mode)) {
    each_config_tuned(test, modes, |_| {}, f)
}

/// The raid4/5/6 knobs away from their defaults: two stripe workers, skip_copy off, the
/// smallest stripe cache (one head per partition, so heads are waited for all the time).
fn tuned(a: &Array) {
    if matches!(a.level(), Level::Raid4 | Level::Raid5 | Level::Raid6) {
        a.set_tunable("group_thread_cnt", "2")
            .expect("group_thread_cnt");
        a.set_tunable("skip_copy", "0").expect("skip_copy");
        a.set_tunable("stripe_cache_size", "8")
            .expect("stripe_cache_size");
    }
}

fn each_config_tuned(
    test: &str,
    modes: &[Mode],
    tune: impl Fn(&Array),
    f: impl Fn(&Rig, u64, Mode),
) {
    let seed = base_seed();
    let rounds = if full() { 4 } else { 1 };
    for round in 0..rounds {
        for (name, c) in configs() {
            for &mode in modes {
                let seed = seed.wrapping_add(round * 7919);
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let r = rig(&c);
                    tune(&r.a);
                    f(&r, seed, mode);
                    let sc = r.a.stripe_cache();
                    assert_eq!(sc.active(), 0, "a stripe head leaked");
                    assert!(sc.stats.max_heads.load(Ordering::Relaxed) <= sc.cap());
                }));
                if res.is_err() {
                    panic!(
                        "{test}: {name} ({c:?}) {mode:?} failed with seed {seed} \
                         (replay: URAID_SEED={seed})"
                    );
                }
            }
        }
    }
}

/// Healthy, and degraded from the start (a member fails before the threads start).
const MODES: &[Mode] = &[Mode::Healthy, Mode::FailBefore];

#[test]
fn disjoint_regions_match_the_model_exactly() {
    each_config("disjoint", MODES, disjoint);
}

#[test]
fn overlapping_writes_and_readers_keep_sectors_whole_and_ordered() {
    let p = Overlap {
        writers: 6,
        readers: 2,
        ops_per_writer: if full() { 3000 } else { 100 },
        units: 8,
    };
    each_config("overlapping", MODES, |r, s, d| overlapping(r, s, d, &p));
}

#[test]
fn stress_many_threads_on_few_stripes() {
    let p = Overlap {
        writers: 12,
        readers: 4,
        ops_per_writer: if full() { 2000 } else { 60 },
        units: 2,
    };
    each_config("stress", MODES, |r, s, d| overlapping(r, s, d, &p));
}

/// A member fails while the threads run (md's `mdadm --fail` under load): nothing written
/// may be lost, and what redundancy is left must be consistent.
#[test]
fn a_member_failing_mid_run_loses_nothing() {
    each_config("fail-during/disjoint", &[Mode::FailDuring], disjoint);
    let p = Overlap {
        writers: 6,
        readers: 2,
        ops_per_writer: if full() { 3000 } else { 100 },
        units: 8,
    };
    each_config("fail-during/overlapping", &[Mode::FailDuring], |r, s, d| {
        overlapping(r, s, d, &p)
    });
}

/// The same checks with every raid4/5/6 knob away from its default.
#[test]
fn overlapping_and_disjoint_with_workers_skip_copy_and_a_tiny_stripe_cache() {
    let p = Overlap {
        writers: 12,
        readers: 4,
        ops_per_writer: if full() { 2000 } else { 60 },
        units: 2,
    };
    each_config_tuned("tuned/stress", MODES, tuned, |r, s, d| {
        overlapping(r, s, d, &p)
    });
    each_config_tuned("tuned/disjoint", MODES, tuned, disjoint);
    each_config_tuned("tuned/fail-during", &[Mode::FailDuring], tuned, disjoint);
}

#[test]
fn sector_history_finds_the_latest_write_ended_before() {
    // (start, end)
    let h = SectorHistory::new(vec![(1, 10), (5, 6), (8, 20), (2, 3)]);
    assert_eq!(h.latest_ended_before(3), None);
    assert_eq!(h.latest_ended_before(4), Some((2, 3)));
    assert_eq!(h.latest_ended_before(7), Some((5, 6)));
    assert_eq!(h.latest_ended_before(11), Some((5, 6)));
    assert_eq!(h.latest_ended_before(21), Some((8, 20)));
    assert_eq!(SectorHistory::new(vec![]).latest_ended_before(9), None);
}

/// The oracle itself must catch what it claims to: a torn sector, a moved sector, a stale
/// final value.
#[test]
fn the_tag_oracle_rejects_torn_and_moved_sectors() {
    let mut sec = [0u8; SECTOR];
    put_tag(&mut sec, write_id(3, 9), 77, 5);
    assert_eq!(read_tag(&sec, 77).unwrap(), Some((write_id(3, 9), 5)));
    assert!(read_tag(&sec, 78).is_err(), "moved sector accepted");
    let mut other = [0u8; SECTOR];
    put_tag(&mut other, write_id(4, 1), 77, 5);
    let mut torn = sec;
    torn[256..].copy_from_slice(&other[256..]);
    assert!(read_tag(&torn, 77).is_err(), "torn sector accepted");
    let mut garbage = [0u8; SECTOR];
    garbage[100] = 1;
    assert!(read_tag(&garbage, 77).is_err(), "garbage accepted");
    assert_eq!(read_tag(&[0u8; SECTOR], 77).unwrap(), None);
}

/// A member that silently drops every `every`-th write to its data area: a lost write.
fn drops_writes(inner: Arc<dyn Member>, every: u64) -> FaultMember {
    let n = AtomicU64::new(0);
    FaultMember::new(inner)
        .zeroes_by_writing()
        .with_hook(move |io| {
            // Superblocks (below the data offset of 64 sectors) always land.
            if io.write
                && io.offset >= 64 * 512
                && n.fetch_add(1, Ordering::Relaxed) % every == every - 1
            {
                Verdict::Lose
            } else {
                Verdict::Pass
            }
        })
}

/// The whole check must catch an engine that loses writes: run the overlapping phase over a
/// member that drops some writes and expect it to fail.
#[test]
fn the_checks_catch_a_member_that_loses_writes() {
    // Enough writes, and enough of them dropped, that the oracle always has something to
    // find (with fewer, a dropped write was sometimes overwritten before the end).
    let p = Overlap {
        writers: 4,
        readers: 1,
        ops_per_writer: 200,
        units: 4,
    };
    for (name, c) in configs() {
        if !matches!(name, "raid1-2" | "raid5-ls" | "raid6-ls" | "raid10-n2") {
            continue;
        }
        let r = rig_with(&c, |m, i| {
            if i == 0 {
                Arc::new(drops_writes(m, 3))
            } else {
                m
            }
        });
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            overlapping(&r, 1, Mode::Healthy, &p)
        }));
        assert!(caught.is_err(), "{name}: lost writes went unnoticed");
    }
}
