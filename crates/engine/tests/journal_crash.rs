//! The raid5 write hole, found without a journal and closed by the write-through journal.
//!
//! Every member (and the journal) is a crash member: writes go to a live image, a flush
//! copies live to durable, and a power cut after a seeded number of writes and flushes
//! stops all later IO; the crash then keeps, drops or tears (sector by sector) each write
//! since the last flush, in random order. After the crash one data member is lost, and the
//! array is assembled degraded: a block that no write touched must read back unchanged.
//!
//! Without a journal some crash points leave new data beside stale parity, and the lost
//! block is rebuilt wrong (the write hole): the test requires that it finds some. With the
//! journal (append and flush before the member writes, replay on recovery) it must find
//! none, parity must match data in every row, and every acknowledged write must be there.
//!
//! `URAID_FULL=1` runs thousands of crash points per mode; CI runs a few hundred;
//! `URAID_SEED=n` runs one. Every run fails unless some crash had unflushed writes to keep,
//! drop or tear and some crash point had a block to check.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use uraid_core::geometry::ParityGeometry;
use uraid_core::{Level, MemberIdx};
use uraid_engine::journal::*;
use uraid_engine::read_superblock;
use uraid_engine::{assemble, create, AssembleOptions, CreateOptions, MemMember, Member};
use uraid_testkit::engine::as_members;

const PAGE: usize = 4096;
const CHUNK_SECTORS: u64 = 16;
/// Small members (a 32 KiB metadata area, 16 stripes) keep thousands of crashes fast.
const MEMBER_BYTES: u64 = (64 + 16 * CHUNK_SECTORS) * 512;
/// Stripes the test writes in (their contents are a known pattern).
const STRIPES: u64 = 4;
/// Three records fill the ring: later writes wrap around and reclaim.
const JOURNAL_BLOCKS: u64 = 8;

use uraid_sim::{Power, SimDisk};

/// The array's side of reclaim: flush the members, keep journal_tail "in the superblock".
struct Host {
    members: Vec<Arc<SimDisk>>,
    power: Arc<Power>,
    tail: Mutex<u64>,
    reclaims: Mutex<u32>,
}

impl JournalHost for Host {
    fn flush_members(&self) -> io::Result<()> {
        self.members.iter().try_for_each(|m| m.flush())
    }
    fn set_journal_tail(&self, tail_sectors: u64) -> io::Result<()> {
        // A superblock write (FUA): durable if the power is still on.
        *self.reclaims.lock().unwrap() += 1;
        if self.power.tick() {
            *self.tail.lock().unwrap() = tail_sectors;
        }
        Ok(())
    }
}

/// A clean raid5 with a known pattern in the first stripes, made once.
struct Base {
    images: Vec<Vec<u8>>,
    data_offset_bytes: Vec<u64>,
    uuid: [u8; 16],
    g: ParityGeometry,
}

fn base(level: Level) -> &'static Base {
    static RAID5: OnceLock<Base> = OnceLock::new();
    static RAID6: OnceLock<Base> = OnceLock::new();
    let (cell, members) = match level {
        Level::Raid6 => (&RAID6, 5),
        _ => (&RAID5, 4),
    };
    cell.get_or_init(|| {
        let mems: Vec<Arc<MemMember>> = (0..members)
            .map(|i| Arc::new(MemMember::new(format!("m{i}"), MEMBER_BYTES)))
            .collect();
        let mut opts = CreateOptions::new(level);
        opts.chunk_sectors = Some(CHUNK_SECTORS);
        opts.assume_clean = true;
        opts.data_offset_sectors = Some(64);
        let devs = as_members(&mems);
        let a = create(devs, &opts).unwrap();
        let g = match a.personality() {
            uraid_core::geometry::Personality::Parity(g) => g.clone(),
            _ => unreachable!(),
        };
        let mut rng = StdRng::seed_from_u64(0xba5e);
        let bytes = (STRIPES * g.stripe_data_sectors() * 512) as usize;
        let pattern: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
        a.write(0, &pattern).unwrap();
        a.stop().unwrap();
        let sb = read_superblock(mems[0].as_ref()).unwrap();
        Base {
            images: mems.iter().map(|m| m.snapshot()).collect(),
            data_offset_bytes: mems
                .iter()
                .map(|m| read_superblock(m.as_ref()).unwrap().data_offset * 512)
                .collect(),
            uuid: sb.set_uuid,
            g,
        }
    })
}

/// One page of the array: stripe, logical data index, page within the chunk.
type Page = (u64, usize, u64);

fn array_offset(g: &ParityGeometry, (s, i, p): Page) -> u64 {
    (g.array_sector(s, i) + p * 8) * 512
}

fn base_page(b: &Base, pg: Page) -> Vec<u8> {
    let (s, i, p) = pg;
    let role = b.g.stripe_map(s).data[i];
    let off = (b.data_offset_bytes[role.0] + b.g.member_sector(s, p * 8) * 512) as usize;
    b.images[role.0][off..off + PAGE].to_vec()
}

#[derive(Debug, Default)]
struct Outcome {
    /// A never-written block read back wrong from the degraded array.
    hole: bool,
    /// Rows whose parity does not match their data after recovery.
    inconsistent_rows: usize,
    /// Acknowledged writes missing after recovery.
    lost_acked: usize,
    /// Times the journal moved its tail to reuse space.
    reclaims: u32,
    skipped: bool,
    /// The power went off before the last write was done.
    cut: bool,
    /// Unflushed writes on the devices at the crash (what it could keep, drop or tear).
    in_flight: usize,
}

fn run_case(level: Level, seed: u64, journal: bool) -> Outcome {
    let b = base(level);
    let g = &b.g;
    let mut rng = StdRng::seed_from_u64(seed);
    let power = Arc::new(Power {
        ops_left: AtomicI64::new(i64::MAX),
    });
    let members: Vec<Arc<SimDisk>> = (0..b.images.len())
        .map(|i| {
            Arc::new(SimDisk::crash_disk(
                &format!("m{i}"),
                power.clone(),
                b.images[i].clone(),
                b.data_offset_bytes[i],
            ))
        })
        .collect();
    let (a, _) = assemble(
        members
            .iter()
            .map(|m| m.clone() as Arc<dyn Member>)
            .collect(),
        &AssembleOptions::default(),
    )
    .unwrap();
    let jdev = Arc::new(SimDisk::crash_disk(
        "journal",
        power.clone(),
        vec![0u8; JOURNAL_BLOCKS as usize * PAGE],
        0,
    ));
    let area = JournalArea {
        data_offset_bytes: 0,
        size_sectors: JOURNAL_BLOCKS * 8,
    };
    let host = Host {
        members: members.clone(),
        power: power.clone(),
        tail: Mutex::new(0),
        reclaims: Mutex::new(0),
    };
    let j = journal.then(|| Journal::format(jdev.clone(), area, &b.uuid, rng.gen()).unwrap());

    // Partial-stripe writes of one page each, then the power cut somewhere among their IO.
    let nwrites = rng.gen_range(1..=4);
    let writes: Vec<(Page, Vec<u8>)> = (0..nwrites)
        .map(|_| {
            let pg = (
                rng.gen_range(0..2),
                rng.gen_range(0..g.data_disks()),
                rng.gen_range(0..2),
            );
            let data: Vec<u8> = (0..PAGE).map(|_| rng.gen()).collect();
            (pg, data)
        })
        .collect();
    power
        .ops_left
        .store(rng.gen_range(0..12 * nwrites as i64), Ordering::SeqCst);
    // Per page: the last acknowledged value, then the values of writes not acknowledged.
    let mut acked: BTreeMap<Page, Vec<u8>> = BTreeMap::new();
    let mut maybe: BTreeMap<Page, Vec<Vec<u8>>> = BTreeMap::new();
    for (pg, data) in &writes {
        let (s, i, p) = *pg;
        let ticket = j.as_ref().map(|j| {
            // What the raid5 write path has in hand: the row's new data and parity.
            let mut row: Vec<Vec<u8>> = (0..g.data_disks())
                .map(|k| {
                    let mut d = vec![0u8; PAGE];
                    a.read(array_offset(g, (s, k, p)), &mut d).unwrap();
                    d
                })
                .collect();
            row[i] = data.clone();
            let (parity, q) = parity_of(g, s, &row);
            let mut pieces: Vec<Option<(usize, &[u8])>> = vec![None; g.data_disks()];
            pieces[i] = Some((p as usize * PAGE, &data[..]));
            let rows = rows_for_stripe(g, s, &pieces, &parity, q.as_deref()).unwrap();
            j.append_stripe(&rows, &host).unwrap()
        });
        // Write-through: acknowledged once the journal flush went through.
        if journal && power.on() {
            acked.insert(*pg, data.clone());
            maybe.remove(pg);
        } else {
            maybe.entry(*pg).or_default().push(data.clone());
        }
        a.write(array_offset(g, *pg), data).unwrap();
        if let (Some(j), Some(t)) = (&j, ticket) {
            j.stripe_written(t);
        }
    }
    let cut = !power.on();
    let in_flight =
        members.iter().map(|m| m.unflushed_writes()).sum::<usize>() + jdev.unflushed_writes();
    drop(a);

    // Crash and recover.
    let imgs: Vec<Vec<u8>> = members.iter().map(|m| m.crash(&mut rng)).collect();
    let jimg = jdev.crash(&mut rng);
    let mems: Vec<Arc<MemMember>> = imgs
        .iter()
        .enumerate()
        .map(|(i, img)| {
            let m = Arc::new(MemMember::new(format!("r{i}"), img.len() as u64));
            m.write_at(img, 0).unwrap();
            m
        })
        .collect();
    if journal {
        let jm = Arc::new(MemMember::new("journal", jimg.len() as u64));
        jm.write_at(&jimg, 0).unwrap();
        let tail = *host.tail.lock().unwrap();
        let set = MemberSet {
            devs: as_members(&mems).into(),
            data_offset_bytes: b.data_offset_bytes.clone().into(),
        };
        Journal::load(jm, area, &b.uuid, tail)
            .unwrap()
            .replay(g, &set)
            .unwrap();
    }

    let mut out = Outcome {
        reclaims: *host.reclaims.lock().unwrap(),
        cut,
        in_flight,
        ..Outcome::default()
    };
    // Parity of every row written to.
    let snaps: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
    for &((s, _, p), _) in &writes {
        let map = g.stripe_map(s);
        let at = |r: MemberIdx| {
            let off = (b.data_offset_bytes[r.0] + g.member_sector(s, p * 8) * 512) as usize;
            snaps[r.0][off..off + PAGE].to_vec()
        };
        let data: Vec<Vec<u8>> = map.data.iter().map(|r| at(*r)).collect();
        let (want_p, want_q) = parity_of(g, s, &data);
        if at(map.p) != want_p || map.q.is_some_and(|q| Some(at(q)) != want_q) {
            out.inconsistent_rows += 1;
        }
    }
    // Lose a data member of the first written row that holds no written page there.
    let ((s, i, p), _) = writes[0];
    let written = |pg: Page| writes.iter().any(|(w, _)| *w == pg);
    // raid6 loses two: the unwritten data members, then P if there is only one.
    let map = g.stripe_map(s);
    let lost: Vec<usize> = (0..g.data_disks())
        .filter(|&k| k != i && !written((s, k, p)))
        .take(g.parity_disks())
        .collect();
    if lost.is_empty() {
        out.skipped = true;
        return out;
    }
    let mut lost_roles: Vec<MemberIdx> = lost.iter().map(|&k| map.data[k]).collect();
    if lost_roles.len() < g.parity_disks() {
        lost_roles.push(map.p);
    }
    let survivors: Vec<Arc<dyn Member>> = mems
        .iter()
        .enumerate()
        .filter(|(r, _)| !lost_roles.contains(&MemberIdx(*r)))
        .map(|(_, m)| m.clone() as Arc<dyn Member>)
        .collect();
    let (d, _) = assemble(
        survivors,
        &AssembleOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut buf = vec![0u8; PAGE];
    for &k in &lost {
        d.read(array_offset(g, (s, k, p)), &mut buf).unwrap();
        out.hole |= buf != base_page(b, (s, k, p));
    }
    for (pg, v) in &acked {
        d.read(array_offset(g, *pg), &mut buf).unwrap();
        let later = maybe.get(pg).is_some_and(|m| m.contains(&buf));
        if buf != *v && !later {
            out.lost_acked += 1;
        }
    }
    out
}

/// P (and Q) of one row's data pages, in logical order, as the engine computes them.
fn parity_of(g: &ParityGeometry, stripe: u64, data: &[Vec<u8>]) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut p = vec![0u8; PAGE];
    if g.parity_disks() == 1 {
        let srcs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        uraid_parity::xor_gen(&mut p, &srcs);
        return (p, None);
    }
    let map = g.stripe_map(stripe);
    let ordered: Vec<&[u8]> = map.syndrome_order.iter().map(|&i| &data[i][..]).collect();
    let mut q = vec![0u8; PAGE];
    uraid_parity::gen_pq(&ordered, &mut p, &mut q);
    (p, Some(q))
}

/// The seeds to run: `URAID_SEED=n` alone, else a few hundred (thousands with URAID_FULL=1).
fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("URAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    if std::env::var("URAID_FULL").is_ok_and(|v| v == "1") {
        (0..10000).collect()
    } else {
        (0..300).collect()
    }
}

/// Runs every seed; fails unless some crash had unflushed writes to keep, drop or tear and
/// some crash point was checked (a block left to lose), so that the test tested something.
fn run_seeds(level: Level, journal: bool) -> Vec<(u64, Outcome)> {
    let seeds = seeds();
    let n = seeds.len();
    let out: Vec<(u64, Outcome)> = seeds
        .into_iter()
        .map(|seed| (seed, run_case(level, seed, journal)))
        .collect();
    let cut = out.iter().filter(|(_, o)| o.cut).count();
    let crashes = out.iter().filter(|(_, o)| o.in_flight > 0).count();
    let checked = out.iter().filter(|(_, o)| !o.skipped).count();
    eprintln!(
        "{level} journal={journal}: {n} seeds, {crashes} crashes with writes in flight, \
         {cut} power cuts inside the IO, {checked} checked"
    );
    assert!(
        crashes > 0,
        "{level}: in {n} seeds no crash had an unflushed write to keep, drop or tear: \
         no crash was tested"
    );
    assert!(
        checked > 0,
        "{level}: none of {n} crash points had a never-written block to check"
    );
    out
}

fn find_the_hole(level: Level) {
    let out = run_seeds(level, false);
    let holes: Vec<u64> = out
        .iter()
        .filter(|(_, o)| o.hole)
        .map(|(s, _)| *s)
        .collect();
    eprintln!(
        "{level} without a journal: {} of {} crash points corrupt a never-written block (first seeds {:?})",
        holes.len(),
        out.len(),
        &holes[..holes.len().min(5)]
    );
    assert!(
        out.len() == 1 || !holes.is_empty(),
        "{level}: the crash rig never produced the write hole: the test could not fail"
    );
}

fn journal_closes_the_hole(level: Level) {
    let out = run_seeds(level, true);
    let n = out.len();
    let (mut skipped, mut reclaims) = (0, 0);
    for (seed, o) in &out {
        skipped += o.skipped as u64;
        reclaims += o.reclaims;
        assert!(
            !o.hole && o.inconsistent_rows == 0 && o.lost_acked == 0,
            "{level} journal: seed {seed} (rerun with URAID_SEED={seed}): {o:?}"
        );
    }
    eprintln!(
        "{level} with the journal: {n} crash points ({skipped} without a never-written block to lose, {reclaims} reclaims); none corrupt"
    );
    assert!(n == 1 || reclaims > 0, "the journal never wrapped around");
}

#[test]
fn raid5_without_a_journal_the_write_hole_is_found() {
    find_the_hole(Level::Raid5);
}

#[test]
fn raid5_with_the_journal_no_crash_point_corrupts_data() {
    journal_closes_the_hole(Level::Raid5);
}

#[test]
fn raid6_without_a_journal_the_write_hole_is_found() {
    find_the_hole(Level::Raid6);
}

#[test]
fn raid6_with_the_journal_no_crash_point_corrupts_data() {
    journal_closes_the_hole(Level::Raid6);
}
