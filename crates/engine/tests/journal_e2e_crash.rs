//! End-to-end crash test of the write journal, through `Array::write` and `Array::flush`.
//!
//! Every member and the journal device are crash members: writes land in a live image, a
//! flush copies it to the durable one, and a power cut after a seeded number of IOs stops
//! all later IO (the array does not notice). The crash keeps, drops or tears (sector by
//! sector) every write since the last flush, in random order. The workload: partial-stripe
//! writes (and some whole-stripe ones), flushes, FUA writes (write + flush), and in some
//! runs a member failed on the way.
//!
//! After the crash the array is assembled twice from copies of the crashed images:
//! - whole (when no member was failed): the journal is replayed, and a check must find no
//!   parity mismatch (journal modes), and every page must hold a legal value;
//! - degraded (members lost up to the tolerance): every page must hold a legal value.
//!
//! A legal value, per 512-byte sector: if a write was acknowledged before a completed
//! flush (or was a FUA write), that write or a later one; otherwise the old data or any
//! value written. A never-written block read back wrong is the write hole.
//!
//! Modes: no journal (the test must find the write hole, so it can fail), write-through
//! and write-back (none may be found). `URAID_FULL=1` runs thousands of seeds per mode;
//! `URAID_SEED=n` runs one seed (all modes and levels), prints what it did and checks it
//! as the sweep does. Either way a run fails unless some crash had unflushed writes to
//! keep, drop or tear and some seed was checked whole: a rig that crashes nothing tests
//! nothing.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use uraid_core::geometry::{ParityGeometry, Personality};
use uraid_core::{Level, MemberIdx};
use uraid_engine::read_superblock;
use uraid_engine::JournalMode;
use uraid_engine::{assemble, create, AssembleOptions, CreateOptions, MemMember, Member};
use uraid_testkit::engine::as_members;

const PAGE: usize = 4096;
const CHUNK_SECTORS: u64 = 16;
const DATA_OFFSET_SECTORS: u64 = 64;
/// Small members (16 stripes) keep thousands of crashes fast.
const MEMBER_BYTES: u64 = (DATA_OFFSET_SECTORS + 16 * CHUNK_SECTORS) * 512;
/// Stripes the workload writes in.
const STRIPES: u64 = 4;
/// The smallest journal create accepts: a ring of 64 blocks, so the log wraps and
/// write-back meets log pressure.
const JOURNAL_BYTES: u64 = (DATA_OFFSET_SECTORS + 512) * 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    NoJournal,
    WriteThrough,
    WriteBack,
}

use uraid_sim::{Power, SimDisk};

/// A clean array with random data in the workload's stripes, made once per level and
/// journal choice. The last image is the journal's, if any.
struct Base {
    images: Vec<Vec<u8>>,
    tear_from: Vec<u64>,
    g: ParityGeometry,
    /// The array's bytes in the workload region before the workload.
    data: Vec<u8>,
}

fn base(level: Level, journal: bool) -> &'static Base {
    static CELLS: [OnceLock<Base>; 4] = [const { OnceLock::new() }; 4];
    let idx = usize::from(level == Level::Raid6) * 2 + usize::from(journal);
    CELLS[idx].get_or_init(|| {
        let n = if level == Level::Raid6 { 5 } else { 4 };
        let mems: Vec<Arc<MemMember>> = (0..n)
            .map(|i| Arc::new(MemMember::new(format!("m{i}"), MEMBER_BYTES)))
            .collect();
        let jm = Arc::new(MemMember::new("journal", JOURNAL_BYTES));
        let mut opts = CreateOptions::new(level);
        opts.chunk_sectors = Some(CHUNK_SECTORS);
        opts.assume_clean = true;
        opts.data_offset_sectors = Some(DATA_OFFSET_SECTORS);
        if journal {
            opts.journal = Some(jm.clone());
        }
        let devs = as_members(&mems);
        let a = create(devs, &opts).unwrap();
        let Personality::Parity(g) = a.personality().clone() else {
            unreachable!()
        };
        let mut rng = StdRng::seed_from_u64(0xba5e);
        let bytes = (STRIPES * g.stripe_data_sectors() * 512) as usize;
        let data: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
        a.write(0, &data).unwrap();
        a.stop().unwrap();
        drop(a);
        let mut all: Vec<&Arc<MemMember>> = mems.iter().collect();
        if journal {
            all.push(&jm);
        }
        Base {
            images: all.iter().map(|m| m.snapshot()).collect(),
            tear_from: all
                .iter()
                .map(|m| read_superblock(m.as_ref()).unwrap().data_offset * 512)
                .collect(),
            g,
            data,
        }
    })
}

/// What may be read back from one page after the crash.
#[derive(Clone, Default)]
struct PageModel {
    /// Every value written to the page, in order.
    history: Vec<Vec<u8>>,
    /// Values acknowledged but not yet covered by a completed flush: history indices.
    acked_unflushed: Option<usize>,
    /// The oldest history index a read may return: set by a completed flush or FUA.
    required: Option<usize>,
}

#[derive(Debug, Default)]
struct Outcome {
    /// A never-written page read back wrong from the degraded array.
    hole: bool,
    /// Pages (written ones included) holding an illegal value.
    bad_pages: Vec<u64>,
    mismatches: u64,
    skipped_whole: bool,
    failed_member: Option<usize>,
    /// Write-back stripes written out during the run.
    written_out: u64,
    cut: bool,
    /// Unflushed writes on the devices at the crash (what it could keep, drop or tear).
    in_flight: usize,
}

fn legal(m: &PageModel, base: &[u8], got: &[u8]) -> bool {
    let allowed: Vec<&[u8]> = match m.required {
        Some(k) => m.history[k..].iter().map(|v| &v[..]).collect(),
        None => std::iter::once(base)
            .chain(m.history.iter().map(|v| &v[..]))
            .collect(),
    };
    (0..PAGE)
        .step_by(512)
        .all(|s| allowed.iter().any(|v| v[s..s + 512] == got[s..s + 512]))
}

fn run_case(level: Level, seed: u64, mode: Mode, verbose: bool) -> Outcome {
    let b = base(level, mode != Mode::NoJournal);
    let g = &b.g;
    let mut rng = StdRng::seed_from_u64(seed);
    let power = Arc::new(Power {
        ops_left: AtomicI64::new(i64::MAX),
    });
    let devs: Vec<Arc<SimDisk>> = b
        .images
        .iter()
        .enumerate()
        .map(|(i, img)| {
            Arc::new(SimDisk::crash_disk(
                &format!("d{i}"),
                power.clone(),
                img.clone(),
                b.tear_from[i],
            ))
        })
        .collect();
    let (a, _) = assemble(
        devs.iter().map(|m| m.clone() as Arc<dyn Member>).collect(),
        &AssembleOptions::default(),
    )
    .unwrap();
    if mode == Mode::WriteBack {
        a.set_journal_mode(JournalMode::WriteBack).unwrap();
        // A small cache: write-outs under cache pressure happen in most runs.
        a.set_writeback_max_pages(rng.gen_range(2..12));
    }
    let pages = (b.data.len() / PAGE) as u64;
    let mut model: Vec<PageModel> = vec![PageModel::default(); pages as usize];
    let nops = rng.gen_range(2..=12);
    power
        .ops_left
        .store(rng.gen_range(0..20 * nops as i64), Ordering::SeqCst);
    let mut out = Outcome::default();
    let fail_at = rng.gen_bool(0.3).then(|| rng.gen_range(0..nops));
    let complete_flush = |model: &mut Vec<PageModel>| {
        for m in model.iter_mut() {
            if let Some(k) = m.acked_unflushed.take() {
                m.required = Some(m.required.map_or(k, |r| r.max(k)));
            }
        }
    };
    for op in 0..nops {
        if fail_at == Some(op) {
            let role = rng.gen_range(0..g.data_disks() + g.parity_disks());
            if a.fail_member(MemberIdx(role)).is_ok() && power.on() {
                out.failed_member = Some(role);
            } else if a.slot_state(MemberIdx(role)) != uraid_engine::SlotState::InSync {
                // Failed without power: whether it is recorded is up to the crash.
                out.failed_member = Some(role);
            }
            if verbose {
                eprintln!("op {op}: fail member {role}");
            }
        }
        match rng.gen_range(0..10) {
            0..=6 => {
                let fua = rng.gen_bool(0.2);
                // Mostly partial-stripe writes; sometimes a whole stripe (no reads).
                let stripe_pages = pages / STRIPES;
                let (first, n) = if rng.gen_bool(0.15) {
                    (rng.gen_range(0..STRIPES) * stripe_pages, stripe_pages)
                } else {
                    let n = rng.gen_range(1..=3u64);
                    (rng.gen_range(0..=pages - n), n)
                };
                let data: Vec<u8> = (0..n as usize * PAGE).map(|_| rng.gen()).collect();
                let r = a.write(first * PAGE as u64, &data);
                for k in 0..n {
                    let m = &mut model[(first + k) as usize];
                    m.history
                        .push(data[k as usize * PAGE..(k as usize + 1) * PAGE].to_vec());
                    if r.is_ok() && power.on() {
                        m.acked_unflushed = Some(m.history.len() - 1);
                    }
                }
                if verbose {
                    eprintln!(
                        "op {op}: write pages {first}..{} fua={fua} -> {r:?} power={}",
                        first + n,
                        power.on()
                    );
                }
                if fua && r.is_ok() && a.flush().is_ok() && power.on() {
                    complete_flush(&mut model);
                }
            }
            _ => {
                let r = a.flush();
                if verbose {
                    eprintln!("op {op}: flush -> {r:?} power={}", power.on());
                }
                if r.is_ok() && power.on() {
                    complete_flush(&mut model);
                }
            }
        }
    }
    out.written_out = a.writeback_stats().map_or(0, |s| s.written_out_stripes);
    out.cut = !power.on();
    out.in_flight = devs.iter().map(|d| d.unflushed_writes()).sum();
    // Crash: nothing more reaches the devices (the drop's clean stop goes nowhere).
    power.ops_left.store(i64::MIN / 2, Ordering::SeqCst);
    drop(a);
    let imgs: Vec<Vec<u8>> = devs.iter().map(|m| m.crash(&mut rng)).collect();
    let fresh = |keep: &dyn Fn(usize) -> bool| -> Vec<Arc<dyn Member>> {
        imgs.iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(i, img)| {
                let m = Arc::new(MemMember::new(format!("r{i}"), img.len() as u64));
                m.write_at(img, 0).unwrap();
                m as Arc<dyn Member>
            })
            .collect()
    };
    let check_pages = |a: &uraid_engine::Array, out: &mut Outcome, degraded: bool| {
        let mut got = vec![0u8; PAGE];
        for p in 0..pages {
            a.read(p * PAGE as u64, &mut got).unwrap();
            let m = &model[p as usize];
            let base_page = &b.data[p as usize * PAGE..(p as usize + 1) * PAGE];
            if !legal(m, base_page, &got) {
                if verbose {
                    eprintln!(
                        "page {p} illegal (degraded={degraded}, writes {})",
                        m.history.len()
                    );
                }
                out.bad_pages.push(p);
                if m.history.is_empty() && degraded {
                    out.hole = true;
                }
            }
        }
    };
    let members = g.data_disks() + g.parity_disks();
    let is_journal = |i: usize| i >= members;
    let opts = AssembleOptions {
        force: true,
        ..Default::default()
    };

    // Whole: replay, then check parity and data.
    if out.failed_member.is_none() {
        let (w, _) = assemble(fresh(&|_| true), &opts).unwrap();
        if w.is_degraded() {
            out.skipped_whole = true;
        } else {
            check_pages(&w, &mut out, false);
            out.mismatches = w.check().unwrap();
        }
        power.ops_left.store(i64::MAX, Ordering::SeqCst);
        drop(w);
    } else {
        out.skipped_whole = true;
    }

    // Degraded: lose members up to the tolerance (the failed one counts).
    let mut lost: Vec<usize> = out.failed_member.into_iter().collect();
    let mut roles: Vec<usize> = (0..members).filter(|r| !lost.contains(r)).collect();
    roles.shuffle(&mut rng);
    lost.extend(roles.into_iter().take(g.parity_disks() - lost.len()));
    let (d, _) = assemble(fresh(&|i| is_journal(i) || !lost.contains(&i)), &opts).unwrap();
    if verbose {
        eprintln!("lost {lost:?}; degraded={}", d.is_degraded());
    }
    check_pages(&d, &mut out, true);
    out
}

fn seeds() -> u64 {
    if std::env::var("URAID_FULL").is_ok_and(|v| v == "1") {
        5000
    } else {
        300
    }
}

fn one_seed() -> Option<u64> {
    std::env::var("URAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
}

fn run_mode(level: Level, mode: Mode) {
    // A given seed runs alone, verbosely, under the same checks as the sweep.
    let one = one_seed();
    let seeds: Vec<u64> = match one {
        Some(seed) => vec![seed],
        None => (0..seeds()).collect(),
    };
    let n = seeds.len();
    let mut holes = Vec::new();
    let (mut cut, mut written_out, mut whole, mut crashes) = (0, 0, 0, 0);
    for seed in seeds {
        let o = run_case(level, seed, mode, one.is_some());
        if one.is_some() {
            eprintln!("{level} {mode:?} seed {seed}: {o:?}");
        }
        cut += u64::from(o.cut);
        written_out += o.written_out;
        whole += u64::from(!o.skipped_whole);
        crashes += u64::from(o.in_flight > 0);
        if o.hole {
            holes.push(seed);
        }
        if mode != Mode::NoJournal {
            assert!(
                o.bad_pages.is_empty() && o.mismatches == 0,
                "{level} {mode:?}: seed {seed} (rerun: URAID_SEED={seed} cargo test -p uraid-engine \
                 --test journal_e2e_crash): {o:?}"
            );
        }
    }
    eprintln!(
        "{level} {mode:?}: {n} seeds, {crashes} crashes with writes in flight, {cut} power cuts \
         mid-run, {whole} checked whole, {written_out} stripes written out, write hole in {} \
         (first {:?})",
        holes.len(),
        &holes[..holes.len().min(5)]
    );
    // Without these the test would pass having tested no crash.
    assert!(
        crashes > 0,
        "{level} {mode:?}: in {n} seeds no crash had an unflushed write to keep, drop or tear: \
         no crash was tested{}",
        if one.is_some() {
            " (this seed tests nothing; try another)"
        } else {
            ""
        }
    );
    assert!(
        whole > 0,
        "{level} {mode:?}: none of {n} seeds was checked whole (replay, check, every page){}",
        if one.is_some() {
            " (this seed fails a member; try another)"
        } else {
            ""
        }
    );
    if one.is_some() {
        return; // one seed need not show the hole nor a write-out
    }
    if mode == Mode::NoJournal {
        assert!(
            !holes.is_empty(),
            "{level}: the crash rig never produced the write hole without a journal: the test could not fail"
        );
    } else if mode == Mode::WriteBack {
        assert!(written_out > 0, "write-back never wrote a stripe out");
    }
}

#[test]
fn raid5_no_journal_has_the_write_hole() {
    run_mode(Level::Raid5, Mode::NoJournal);
}

#[test]
fn raid5_write_through_survives_every_crash() {
    run_mode(Level::Raid5, Mode::WriteThrough);
}

#[test]
fn raid5_write_back_survives_every_crash() {
    run_mode(Level::Raid5, Mode::WriteBack);
}

#[test]
fn raid6_no_journal_has_the_write_hole() {
    run_mode(Level::Raid6, Mode::NoJournal);
}

#[test]
fn raid6_write_through_survives_every_crash() {
    run_mode(Level::Raid6, Mode::WriteThrough);
}

#[test]
fn raid6_write_back_survives_every_crash() {
    run_mode(Level::Raid6, Mode::WriteBack);
}
