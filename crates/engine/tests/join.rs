//! Partial-stripe writes that join (raid4/5/6, `join_wait_us`): concurrent writes that
//! together cover a stripe go out as one full-stripe write without member reads, every
//! joined request completes with the stripe's result, and concurrent overlapping and
//! adjacent partial writes keep block-device semantics (checked against a model).
//!
//! No test here depends on timing: the deterministic ones set a long wait (10 s) and make
//! the moment of each step visible (a member write held by a hook, the join counters), so
//! a wait that ended early shows up as member reads or wrong counts, not as a slow test.

use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC;
use uraid_core::Level;
use uraid_engine::{Array, ArrayError, Member};
use uraid_sim::{FaultMember, Verdict};
use uraid_testkit::engine::*;

const LONG_WAIT_US: &str = "10000000";

/// A gate that a member write can be held at: `arm` it for member bytes [lo, hi), then
/// the first write there blocks until `release` (superblock writes pass).
#[derive(Default)]
struct Gate {
    armed: AtomicBool,
    lo: AtomicU64,
    hi: AtomicU64,
    held: AtomicUsize,
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn pass(&self, write: bool, offset: u64) {
        let inside =
            self.lo.load(Ordering::SeqCst) <= offset && offset < self.hi.load(Ordering::SeqCst);
        if write && inside && self.armed.swap(false, Ordering::SeqCst) {
            self.held.fetch_add(1, Ordering::SeqCst);
            let mut o = self.open.lock().unwrap();
            while !*o {
                o = self.cv.wait(o).unwrap();
            }
        }
    }
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
    fn reset(&self) {
        *self.open.lock().unwrap() = false;
        self.held.store(0, Ordering::SeqCst);
    }
}

struct Rig {
    a: Arc<Array>,
    faults: Vec<Arc<FaultMember>>,
    gate: Arc<Gate>,
    stripe_bytes: u64,
    chunk_sectors: u64,
}

fn rig(level: Level, disks: usize, chunk_sectors: u64) -> Rig {
    let cfg = Config {
        level,
        layout: Some(ALGORITHM_LEFT_SYMMETRIC),
        disks,
        chunk_sectors,
        member_bytes: vec![4 << 20; disks],
    };
    let gate = Arc::new(Gate::default());
    let faults: Vec<Arc<FaultMember>> = mem_members(&cfg, "join")
        .into_iter()
        .map(|m| {
            let g = gate.clone();
            Arc::new(FaultMember::new(m as Arc<dyn Member>).with_hook(move |io| {
                g.pass(io.write, io.offset);
                Verdict::Pass
            }))
        })
        .collect();
    let devs = faults
        .iter()
        .map(|f| Some(f.clone() as Arc<dyn Member>))
        .collect();
    let a = uraid_engine::create(devs, &create_opts(&cfg)).expect("create");
    let parity = if level == Level::Raid6 { 2 } else { 1 };
    let stripe_bytes = chunk_sectors * 512 * (disks - parity) as u64;
    Rig {
        a: Arc::new(a),
        faults,
        gate,
        stripe_bytes,
        chunk_sectors,
    }
}

fn eventually(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "never happened: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8)
        .collect()
}

fn stat(a: &Array, f: impl Fn(&uraid_engine::JoinStats) -> &AtomicU64) -> u64 {
    f(a.join_stats().expect("parity array")).load(Ordering::SeqCst)
}

/// A rig whose leaders wait 10 s for joiners, with a whole-stripe write of `held_stripe`
/// held at its member (so that a leader always has someone who could still join).
fn waiting_rig(
    level: Level,
    disks: usize,
    chunk_sectors: u64,
    held_stripe: u64,
) -> (Rig, std::thread::JoinHandle<Result<(), ArrayError>>) {
    let r = rig(level, disks, chunk_sectors);
    r.a.set_tunable("join_wait_us", LONG_WAIT_US).unwrap();
    let held = hold_a_writer(&r, held_stripe);
    (r, held)
}

/// A write of `d` at array byte `off` on its own thread.
fn spawn_write(
    a: &Arc<Array>,
    off: u64,
    d: &[u8],
) -> std::thread::JoinHandle<Result<(), ArrayError>> {
    let (a, d) = (a.clone(), d.to_vec());
    std::thread::spawn(move || a.write(off, &d))
}

/// The array reads `want` back at byte `off`, and its parity is consistent.
fn reads_back(a: &Array, off: u64, want: &[u8], what: &str) {
    let mut back = vec![0u8; want.len()];
    a.read(off, &mut back).unwrap();
    assert!(back == want, "{what} read back wrong");
    assert_eq!(a.check().unwrap(), 0, "{what}: parity mismatches");
}

/// Hold a whole-stripe write of stripe `stripe` at its first member write (in flight, not
/// waiting for joins: so that a leader has someone who could still join); returns its
/// thread.
fn hold_a_writer(r: &Rig, stripe: u64) -> std::thread::JoinHandle<Result<(), ArrayError>> {
    // create_opts puts the data at member sector 64.
    let lo = (64 + stripe * r.chunk_sectors) * 512;
    r.gate.lo.store(lo, Ordering::SeqCst);
    r.gate
        .hi
        .store(lo + r.chunk_sectors * 512, Ordering::SeqCst);
    r.gate.armed.store(true, Ordering::SeqCst);
    let a = r.a.clone();
    let sb = r.stripe_bytes;
    let t = std::thread::spawn(move || a.write(stripe * sb, &pattern(9, sb as usize)));
    eventually("the held write reaches its member", || {
        r.gate.held.load(Ordering::SeqCst) == 1
    });
    t
}

/// Two writers of the two halves of a stripe (split inside a chunk, so neither covers
/// whole chunks only): the second joins the first, the stripe goes out whole, and no
/// member is read; data and parity are right (md's check finds no mismatch).
fn halves_join_without_reads(level: Level, disks: usize) {
    let r = rig(level, disks, 128); // 64 KiB chunks
    let a = &r.a;
    a.set_tunable("join_wait_us", LONG_WAIT_US).unwrap();
    let held = hold_a_writer(&r, 7);
    let sb = r.stripe_bytes as usize;
    let stripe = 2u64;
    let base = stripe * r.stripe_bytes;
    let cut = sb / 2 + 4096;
    let (first, second) = (pattern(1, cut), pattern(2, sb - cut));
    let reads0 = a.stats.member_reads.load(Ordering::SeqCst);
    let t1 = {
        let (a, d) = (a.clone(), first.clone());
        std::thread::spawn(move || a.write(base, &d))
    };
    eventually("the first half leads", || stat(a, |s| &s.led) == 1);
    let t2 = {
        let (a, d) = (a.clone(), second.clone());
        std::thread::spawn(move || a.write(base + cut as u64, &d))
    };
    t1.join().unwrap().expect("first half");
    t2.join().unwrap().expect("second half");
    assert_eq!(
        stat(a, |s| &s.joined),
        1,
        "{level:?}: the second half did not join"
    );
    assert_eq!(
        stat(a, |s| &s.full),
        1,
        "{level:?}: the stripe did not go out whole"
    );
    assert_eq!(
        a.stats.member_reads.load(Ordering::SeqCst) - reads0,
        0,
        "{level:?}: a joined full stripe read members"
    );
    r.gate.release();
    held.join().unwrap().expect("held write");
    let mut back = vec![0u8; sb];
    a.read(base, &mut back).unwrap();
    assert!(
        back[..cut] == first[..],
        "{level:?}: first half reads back wrong"
    );
    assert!(
        back[cut..] == second[..],
        "{level:?}: second half reads back wrong"
    );
    assert_eq!(a.check().unwrap(), 0, "{level:?}: parity mismatches");
}

#[test]
fn raid5_halves_of_a_stripe_join_without_reads() {
    halves_join_without_reads(Level::Raid5, 4);
}

#[test]
fn raid6_halves_of_a_stripe_join_without_reads() {
    halves_join_without_reads(Level::Raid6, 5);
}

/// A request that joins a stripe goes on to its next stripe at once, before the stripe it
/// joined is written: it leads that next stripe, and the request behind it joins. (A joiner
/// that waited for its leader's member writes first reached its next stripe only after
/// them, and the next request, come meanwhile, found nothing to join: sequential 1 MiB
/// writes into 1.5 MiB stripes went out in pieces.) The first stripe's write is held at its
/// member until the end, so a joiner that waited would never lead the second.
#[test]
fn a_joiner_leads_its_next_stripe_while_the_one_it_joined_is_written() {
    let (r, held) = waiting_rig(Level::Raid5, 4, 128, 7); // 64 KiB chunks, 192 KiB stripes
    let a = &r.a;
    let sb = r.stripe_bytes as usize;
    let (s2, s3) = (2 * r.stripe_bytes, 3 * r.stripe_bytes);
    // Hold the first member write of stripe 2 too (its leader's, once covered).
    let lo = (64 + 2 * r.chunk_sectors) * 512;
    r.gate.lo.store(lo, Ordering::SeqCst);
    r.gate
        .hi
        .store(lo + r.chunk_sectors * 512, Ordering::SeqCst);
    r.gate.armed.store(true, Ordering::SeqCst);
    let (cut2, cut3) = (sb / 2 + 4096, sb / 3 + 8192);
    let x = pattern(21, cut2);
    let y = pattern(22, sb - cut2 + cut3);
    let z = pattern(23, sb - cut3);
    let reads0 = a.stats.member_reads.load(Ordering::SeqCst);
    let spawn = |off: u64, d: &Vec<u8>| spawn_write(a, off, d);
    let tx = spawn(s2, &x);
    eventually("x leads stripe 2", || stat(a, |s| &s.led) == 1);
    let ty = spawn(s2 + cut2 as u64, &y);
    eventually("stripe 2's write is held at its member", || {
        r.gate.held.load(Ordering::SeqCst) == 2
    });
    eventually("y, having joined stripe 2, leads stripe 3", || {
        stat(a, |s| &s.led) == 2
    });
    let tz = spawn(s3 + cut3 as u64, &z);
    tz.join().unwrap().expect("z");
    assert_eq!(stat(a, |s| &s.joined), 2, "y and z joined");
    assert_eq!(stat(a, |s| &s.full), 2, "both stripes went out whole");
    assert!(
        !ty.is_finished(),
        "y completed before the stripe it joined was written"
    );
    r.gate.release();
    tx.join().unwrap().expect("x");
    ty.join().unwrap().expect("y");
    held.join().unwrap().expect("held write");
    assert_eq!(a.stats.member_reads.load(Ordering::SeqCst) - reads0, 0);
    reads_back(a, s2, &[x, y, z].concat(), "stripes 2 and 3");
}

/// A request that leads a stripe offers its next piece before it waits for joiners: here
/// its next piece is what the stripe after needs, whose leader came first. (A leader that
/// waited before going on kept that stripe from filling, and the stripes of a sequential
/// stream whose requests start out of order went out in pieces.) Stripe 2's last part
/// comes only once stripe 3 is written, so a request that waited at stripe 2 first would
/// leave stripe 3 to its leader's 10 s wait and both stripes in pieces.
#[test]
fn a_leader_offers_its_next_piece_before_it_waits() {
    let (r, held) = waiting_rig(Level::Raid5, 4, 128, 7); // 64 KiB chunks, 192 KiB stripes
    let a = &r.a;
    let sb = r.stripe_bytes as usize;
    let (s2, s3) = (2 * r.stripe_bytes, 3 * r.stripe_bytes);
    let (cut2, cut3) = (32 << 10, 64 << 10);
    // x: the start of stripe 2, last; y: the rest of stripe 2 and the start of stripe 3;
    // z: the rest of stripe 3, first.
    let x = pattern(31, cut2);
    let y = pattern(32, sb - cut2 + cut3);
    let z = pattern(33, sb - cut3);
    let reads0 = a.stats.member_reads.load(Ordering::SeqCst);
    let spawn = |off: u64, d: &Vec<u8>| spawn_write(a, off, d);
    let tz = spawn(s3 + cut3 as u64, &z);
    eventually("z leads stripe 3", || stat(a, |s| &s.led) == 1);
    let ty = spawn(s2 + cut2 as u64, &y);
    tz.join().unwrap().expect("z");
    assert_eq!(stat(a, |s| &s.led), 2, "y leads stripe 2");
    assert_eq!(stat(a, |s| &s.joined), 1, "y joined stripe 3");
    assert_eq!(stat(a, |s| &s.full), 1, "stripe 3 went out whole");
    assert!(!ty.is_finished(), "y completed with stripe 2 not covered");
    let tx = spawn(s2, &x);
    tx.join().unwrap().expect("x");
    ty.join().unwrap().expect("y");
    assert_eq!(stat(a, |s| &s.full), 2, "stripe 2 went out whole");
    assert_eq!(stat(a, |s| &s.partial), 0);
    assert_eq!(a.stats.member_reads.load(Ordering::SeqCst) - reads0, 0);
    r.gate.release();
    held.join().unwrap().expect("held write");
    reads_back(a, s2, &[x, y, z].concat(), "stripes 2 and 3");
}

/// Three pieces, the middle one last, each crossing a chunk boundary: all join the first.
#[test]
fn three_pieces_in_any_order_make_one_full_stripe() {
    let (r, held) = waiting_rig(Level::Raid5, 5, 64, 9); // 32 KiB chunks, 4 data chunks
    let a = &r.a;
    let sb = r.stripe_bytes as usize;
    let base = 3 * r.stripe_bytes;
    let cuts = [0, 40 << 10, 90 << 10, sb];
    let parts: Vec<Vec<u8>> = (0..3)
        .map(|i| pattern(10 + i as u8, cuts[i + 1] - cuts[i]))
        .collect();
    let reads0 = a.stats.member_reads.load(Ordering::SeqCst);
    let mut ts = Vec::new();
    for (k, i) in [0usize, 2, 1].into_iter().enumerate() {
        let (a2, d, off) = (a.clone(), parts[i].clone(), base + cuts[i] as u64);
        ts.push(std::thread::spawn(move || a2.write(off, &d)));
        if k == 0 {
            eventually("the first piece leads", || stat(a, |s| &s.led) == 1);
        } else {
            eventually("a piece joins", || stat(a, |s| &s.joined) == k as u64);
        }
    }
    for t in ts {
        t.join().unwrap().expect("piece");
    }
    assert_eq!(stat(a, |s| &s.full), 1);
    assert_eq!(a.stats.member_reads.load(Ordering::SeqCst) - reads0, 0);
    r.gate.release();
    held.join().unwrap().expect("held write");
    let mut back = vec![0u8; sb];
    a.read(base, &mut back).unwrap();
    assert!(back == parts.concat(), "the stripe reads back wrong");
    assert_eq!(a.check().unwrap(), 0);
}

/// A partial write with no other write in progress, not continuing the last write, does
/// not wait for joiners (a queue depth of one would pay the whole moment on every write),
/// even with a long wait set.
#[test]
fn a_lone_random_partial_write_does_not_lead() {
    let r = rig(Level::Raid5, 4, 128);
    let a = &r.a;
    a.set_tunable("join_wait_us", LONG_WAIT_US).unwrap();
    for k in [5u64, 1, 9, 3] {
        a.write(k * (96 << 10), &pattern(k as u8, 96 << 10))
            .unwrap();
    }
    assert_eq!(stat(a, |s| &s.led), 0);
    assert_eq!(a.check().unwrap(), 0);
}

/// A lone sequential stream (queue depth one) leads while its next write might still be on
/// its way, but after 8 leaders in a row that nobody joined it stops leading.
#[test]
fn a_lone_sequential_stream_stops_leading_after_misses() {
    let r = rig(Level::Raid5, 4, 128);
    let a = &r.a;
    a.set_tunable("join_wait_us", "1000").unwrap();
    for k in 0..20u64 {
        a.write(k * (96 << 10), &pattern(k as u8, 96 << 10))
            .unwrap();
    }
    assert_eq!(stat(a, |s| &s.led), 8);
    assert_eq!(stat(a, |s| &s.joined), 0);
    let mut back = vec![0u8; 20 * (96 << 10)];
    a.read(0, &mut back).unwrap();
    for k in 0..20usize {
        let part = &back[k * (96 << 10)..(k + 1) * (96 << 10)];
        assert!(
            part == &pattern(k as u8, 96 << 10)[..],
            "write {k} reads back wrong"
        );
    }
    assert_eq!(a.check().unwrap(), 0);
}

/// `join_wait_us=0` turns joining off: two halves then go their own ways (and read).
#[test]
fn join_wait_zero_turns_joining_off() {
    let r = rig(Level::Raid5, 4, 128);
    let a = &r.a;
    a.set_tunable("join_wait_us", "0").unwrap();
    let held = hold_a_writer(&r, 7);
    let sb = r.stripe_bytes as usize;
    let (t1, t2) = {
        let (a1, a2) = (a.clone(), a.clone());
        (
            std::thread::spawn(move || a1.write(0, &pattern(1, sb / 2))),
            std::thread::spawn(move || a2.write(sb as u64 / 2, &pattern(2, sb / 2))),
        )
    };
    t1.join().unwrap().unwrap();
    t2.join().unwrap().unwrap();
    assert_eq!(stat(a, |s| &s.led) + stat(a, |s| &s.joined), 0);
    r.gate.release();
    held.join().unwrap().expect("held write");
    assert_eq!(a.check().unwrap(), 0);
    assert!(a.set_tunable("join_wait_us", "10000001").is_err());
}

/// The stripe write of a leader fails (two members of a raid5 fail their writes): the
/// error reaches the joined request too.
#[test]
fn an_error_reaches_every_joined_request() {
    let (r, held) = waiting_rig(Level::Raid5, 4, 128, 7);
    let a = &r.a;
    let sb = r.stripe_bytes as usize;
    let t1 = {
        let a = a.clone();
        std::thread::spawn(move || a.write(0, &pattern(1, sb / 2)))
    };
    eventually("the first half leads", || stat(a, |s| &s.led) == 1);
    for f in &r.faults[..2] {
        f.fail_writes.store(true, Ordering::SeqCst);
    }
    let t2 = {
        let a = a.clone();
        std::thread::spawn(move || a.write(sb as u64 / 2, &pattern(2, sb / 2)))
    };
    let (e1, e2) = (t1.join().unwrap(), t2.join().unwrap());
    assert_eq!(stat(a, |s| &s.joined), 1);
    assert!(e1.is_err(), "the leader's write succeeded on a lost array");
    assert!(e2.is_err(), "the joined write did not get the error");
    r.gate.release();
    let _ = held.join();
}

/// Seeded: rounds of concurrent writes, overlapping and adjacent, on a few stripes, with
/// lengths around the chunk (so that they lead, join and cover stripes), against a model:
/// after each round every sector holds the data of one of the round's writes that covered
/// it (whole, from the right place), or its previous content if none did (the last write
/// wins across rounds); at the end md's check finds no mismatch. `URAID_SEED` replays.
/// raid5 with skip_copy (leaders write their whole chunks in place), raid6 without.
fn concurrent_partial_writes_against_a_model(level: Level, disks: usize, skip_copy: bool) {
    let seed: u64 = match std::env::var("URAID_SEED") {
        Ok(s) => s.parse().expect("URAID_SEED is a number"),
        Err(_) => rand::random::<u32>() as u64,
    };
    eprintln!("{level:?}: seed {seed} (URAID_SEED={seed} replays it)");
    let chunk_sectors = 16u64; // 8 KiB chunks
    let r = rig(level, disks, chunk_sectors);
    let a = &r.a;
    // Each round holds a write of another stripe at its member write, so that leaders wait
    // for the round's writers (up to 5 ms: how many join is up to the scheduler).
    a.set_tunable("join_wait_us", "5000").unwrap();
    a.set_tunable("skip_copy", if skip_copy { "1" } else { "0" })
        .unwrap();
    let stripes = 4u64;
    let span = stripes * r.stripe_bytes;
    let mut model = vec![0u8; span as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let rounds = if std::env::var("URAID_FULL").is_ok() {
        400
    } else {
        80
    };
    let threads = 4usize;
    for round in 0..rounds {
        // Boundaries on 4 KiB (and sometimes 512 B) steps, so pieces meet end to end.
        let writes: Vec<(u64, Vec<u8>)> = (0..threads)
            .map(|t| {
                let step = if rng.gen_bool(0.2) { 512 } else { 4096 };
                let steps = span / step;
                let start = rng.gen_range(0..steps - 1);
                let max = ((r.stripe_bytes * 3 / 2) / step).max(1);
                let len = rng.gen_range(1..=max).min(steps - start);
                let tag = (round * threads + t) as u32;
                let data: Vec<u8> = (0..len * step)
                    .map(|i| (tag.wrapping_mul(0x9e37_79b9) >> 24) as u8 ^ (i / 512) as u8)
                    .collect();
                (start * step, data)
            })
            .collect();
        r.gate.reset();
        let held = hold_a_writer(&r, 100);
        let start = std::sync::Barrier::new(writes.len());
        std::thread::scope(|s| {
            let hs: Vec<_> = writes
                .iter()
                .map(|(off, d)| {
                    let start = &start;
                    s.spawn(move || {
                        start.wait();
                        a.write(*off, d)
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap().expect("write");
            }
        });
        r.gate.release();
        held.join().unwrap().expect("held write");
        let mut back = vec![0u8; span as usize];
        a.read(0, &mut back).unwrap();
        for sec in 0..(span / 512) as usize {
            let (lo, hi) = (sec * 512, sec * 512 + 512);
            let got = &back[lo..hi];
            let covering: Vec<&[u8]> = writes
                .iter()
                .filter(|(off, d)| *off as usize <= lo && hi <= *off as usize + d.len())
                .map(|(off, d)| &d[lo - *off as usize..hi - *off as usize])
                .collect();
            let ok = if covering.is_empty() {
                got == &model[lo..hi]
            } else {
                covering.contains(&got)
            };
            assert!(
                ok,
                "{level:?} round {round}: sector {sec} holds data no write of it left \
                 (seed {seed}; URAID_SEED={seed} replays)"
            );
        }
        model = back;
    }
    assert_eq!(
        a.check().unwrap(),
        0,
        "{level:?}: parity mismatches (seed {seed})"
    );
    let s = a.join_stats().unwrap();
    eprintln!(
        "{level:?}: led {} joined {} full {} partial {}",
        s.led.load(Ordering::SeqCst),
        s.joined.load(Ordering::SeqCst),
        s.full.load(Ordering::SeqCst),
        s.partial.load(Ordering::SeqCst)
    );
}

#[test]
fn raid5_concurrent_partial_writes_against_a_model() {
    concurrent_partial_writes_against_a_model(Level::Raid5, 4, true);
}

#[test]
fn raid6_concurrent_partial_writes_against_a_model() {
    concurrent_partial_writes_against_a_model(Level::Raid6, 6, false);
}
