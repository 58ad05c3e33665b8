//! `mdadm --grow` on a served array through [`ArrayCell`]: the array is built again in its
//! new shape while writers and readers go on through the cell, none of them sees an
//! error or a wrong byte, and the monitor's subscription and the counters carry over. A
//! raid1 gains a mirror (a superblock change, the new mirror rebuilt by the daemons); a
//! raid5 gains a member (a restripe started live, run by the daemons, and at its end the
//! array is served in its new shape at its new size).

use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uraid_core::Level;
use uraid_engine::{
    create, ArrayCell, ArrayError, CreateOptions, DaemonOptions, Event, GrowRequest, MemMember,
    Member, SyncKind, SyncLimits,
};
use uraid_testkit::engine::rng;

const MB: u64 = 1 << 20;
const BLOCK: u64 = 16 * 1024;
const WRITERS: u64 = 3;

fn members(n: usize, bytes: u64, tag: &str) -> Vec<Arc<dyn Member>> {
    (0..n)
        .map(|i| Arc::new(MemMember::new(format!("{tag}{i}"), bytes)) as Arc<dyn Member>)
        .collect()
}

/// Writers own every WRITERS-th block of the first `span` bytes and keep their last
/// bytes in `model`; each write is read back through the cell at once.
fn writers(
    cell: &Arc<ArrayCell>,
    span: u64,
    model: &Arc<Mutex<Vec<u8>>>,
    stop: &Arc<AtomicBool>,
    seed: u64,
) -> Vec<std::thread::JoinHandle<u64>> {
    (0..WRITERS)
        .map(|w| {
            let (cell, model, stop) = (cell.clone(), model.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut r = rng(seed + w);
                let blocks = span / BLOCK;
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let b = r.gen_range(0..blocks / WRITERS) * WRITERS + w;
                    let mut buf = vec![0u8; BLOCK as usize];
                    r.fill(&mut buf[..]);
                    let at = b * BLOCK;
                    cell.run(|a| a.write(at, &buf))
                        .unwrap_or_else(|e| panic!("write at {at} (seed {seed}): {e}"));
                    model.lock().unwrap()[at as usize..(at + BLOCK) as usize].copy_from_slice(&buf);
                    let mut back = vec![0u8; BLOCK as usize];
                    cell.run(|a| a.read(at, &mut back))
                        .unwrap_or_else(|e| panic!("read at {at} (seed {seed}): {e}"));
                    assert!(back == buf, "block {b} read back wrong (seed {seed})");
                    n += 1;
                }
                n
            })
        })
        .collect()
}

fn wait_until(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn check(cell: &ArrayCell, model: &Mutex<Vec<u8>>, what: &str) {
    let want = model.lock().unwrap().clone();
    let mut got = vec![0u8; want.len()];
    cell.run(|a| a.read(0, &mut got)).unwrap();
    if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i}");
    }
}

/// Options for an array that reshapes: 32 KiB chunks and room before the data to move
/// into (assume-clean where the level has redundancy).
fn reshape_options(level: Level) -> CreateOptions {
    let mut o = CreateOptions::new(level);
    o.assume_clean = level != Level::Raid0;
    o.chunk_sectors = Some(64);
    o.data_offset_sectors = Some(4096);
    o
}

/// Stops the writers; the writes they made.
fn stop_writers(stop: &AtomicBool, ws: Vec<std::thread::JoinHandle<u64>>) -> u64 {
    stop.store(true, Ordering::SeqCst);
    ws.into_iter().map(|w| w.join().unwrap()).sum()
}

/// The daemons stopped, md's check finds no parity mismatch in the array served now, which
/// is then stopped; the array, for more checks.
fn check_parity_and_stop(cell: &ArrayCell, what: &str) -> Arc<uraid_engine::Array> {
    cell.stop_daemons();
    let a = cell.current();
    assert_eq!(
        a.run_sync(SyncKind::Check, |_| {}).unwrap(),
        0,
        "parity mismatches {what}"
    );
    a.stop().unwrap();
    a
}

/// The array filled with seeded bytes, in a cell; the bytes, as the writers' model.
fn filled(a: uraid_engine::Array, seed: u64) -> (Arc<ArrayCell>, Arc<Mutex<Vec<u8>>>) {
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    (ArrayCell::new(Arc::new(a)), Arc::new(Mutex::new(data)))
}

#[test]
fn a_served_raid1_gains_a_mirror_under_writers() {
    let seed = 11;
    let devs = members(3, 8 * MB, "r1-");
    let mut o = CreateOptions::new(Level::Raid1);
    o.assume_clean = true;
    let a = create(vec![Some(devs[0].clone()), Some(devs[1].clone())], &o).unwrap();
    let size = a.size_bytes();
    let (cell, model) = filled(a, seed);
    cell.start_daemons(DaemonOptions::default()).unwrap();
    let events = cell.get().subscribe();
    let old = cell.current();
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, size, &model, &stop, seed);
    std::thread::sleep(Duration::from_millis(50));
    cell.get().add_member(devs[2].clone()).unwrap();
    let r = cell
        .grow(&GrowRequest {
            raid_disks: Some(3),
            ..Default::default()
        })
        .unwrap();
    assert!(r.summary.contains("2 -> 3"), "{r:?}");
    // The array served now is another one; the old one sends its requests on.
    assert!(!Arc::ptr_eq(&old, &cell.current()));
    let mut b = [0u8; 512];
    assert!(matches!(old.read(0, &mut b), Err(ArrayError::Replaced)));
    drop(old);
    wait_until(
        "the new mirror to be rebuilt",
        Duration::from_secs(60),
        || {
            let a = cell.get();
            a.raid_disks() == 3 && !a.is_degraded() && a.recovering_roles().is_empty()
        },
    );
    let writes = stop_writers(&stop, ws);
    assert!(writes > 0);
    check(&cell, &model, "after the grow");
    // The monitor subscribed before the grow hears the new array's rebuild.
    let heard: Vec<Event> = events.try_iter().collect();
    assert!(
        heard
            .iter()
            .any(|e| matches!(e, Event::RebuildFinished { .. })),
        "{heard:?}"
    );
    assert!(cell.get().stats.requests.load(Ordering::Relaxed) >= writes);
    cell.stop_daemons();
    cell.get().stop().unwrap();
    // The new mirror alone holds the bytes.
    let want = model.lock().unwrap().clone();
    let mut got = vec![0u8; want.len()];
    let off = uraid_engine::read_superblock(devs[2].as_ref())
        .unwrap()
        .data_offset
        * 512;
    devs[2].read_at(&mut got, off).unwrap();
    assert!(got == want, "the rebuilt mirror");
}

#[test]
fn a_served_raid5_grows_by_a_member_and_is_then_served_at_its_new_size() {
    served_raid5_grows(23, "r5-", false);
}

/// The same with an internal bitmap, as mdadm gives arrays over 100 GB: the writers' bits
/// are set in both geometries while the reshape runs, and the bitmap comes out of it in
/// step with the superblocks (not stale) and clean.
#[test]
fn a_served_raid5_with_a_bitmap_grows_by_a_member() {
    let devs = served_raid5_grows(29, "r5b-", true);
    let (a, _) = uraid_engine::assemble(devs, &Default::default()).unwrap();
    assert_eq!(a.raid_disks(), 4);
    assert_eq!(
        a.bitmap_dirty_chunks().map(|d| d.0),
        Some(0),
        "the bitmap after the live grow: gone, stale or dirty after a clean stop"
    );
}

/// A raid5 of 3 served with writers, grown to 4 live; the members, stopped clean.
fn served_raid5_grows(seed: u64, tag: &str, bitmap: bool) -> Vec<Arc<dyn Member>> {
    let devs = members(4, 6 * MB, tag);
    let mut o = reshape_options(Level::Raid5);
    o.bitmap = bitmap;
    o.bitmap_chunk_bytes = bitmap.then_some(64 * 1024);
    let a = create(devs[..3].iter().cloned().map(Some).collect(), &o).unwrap();
    let before = a.size_bytes();
    let (cell, model) = filled(a, seed);
    cell.start_daemons(DaemonOptions {
        sync_limits: SyncLimits {
            min_kib_s: 1000,
            max_kib_s: 4000,
        },
        ..Default::default()
    })
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, before, &model, &stop, seed);
    cell.get().add_member(devs[3].clone()).unwrap();
    let r = cell
        .grow(&GrowRequest {
            raid_disks: Some(4),
            ..Default::default()
        })
        .unwrap();
    assert!(r.restripe, "{r:?}");
    assert!(cell.get().is_reshaping());
    wait_until("the reshape to end", Duration::from_secs(120), || {
        let a = cell.get();
        !a.is_reshaping() && a.size_bytes() > before
    });
    stop_writers(&stop, ws);
    check(&cell, &model, "after the reshape");
    let a = cell.current();
    assert_eq!(a.raid_disks(), 4);
    assert_eq!(a.level(), Level::Raid5);
    // Three data members now: past the old end is writable.
    let tail = vec![0xa5u8; MB as usize];
    cell.run(|a| a.write(before, &tail)).unwrap();
    let mut back = vec![0u8; MB as usize];
    cell.run(|a| a.read(before, &mut back)).unwrap();
    assert!(back == tail);
    drop(a);
    cell.stop_daemons();
    let a = cell.current();
    assert_eq!(
        a.run_sync(SyncKind::Check, |_| {}).unwrap(),
        0,
        "parity mismatches after the live grow"
    );
    if bitmap {
        assert!(a.has_bitmap(), "the bitmap was dropped");
    }
    a.stop().unwrap();
    devs
}

/// `--level 6 --layout left-symmetric` on a served raid5 with a spare: md's two steps from
/// one request (the takeover to raid6 with the `-6` layout, its Q role rebuilt onto the
/// spare while served, then the restripe to the rotating layout, started by the cell), with
/// writers going on through both; the end is a whole raid6 in the rotating layout, every
/// byte the writers left, and no parity mismatch.
#[test]
fn a_served_raid5_becomes_a_rotating_raid6_from_one_request() {
    use uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC;
    let seed = 31;
    let devs = members(4, 6 * MB, "r56-");
    let o = reshape_options(Level::Raid5);
    let a = create(devs[..3].iter().cloned().map(Some).collect(), &o).unwrap();
    let size = a.size_bytes();
    let (cell, model) = filled(a, seed);
    cell.start_daemons(DaemonOptions::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, size, &model, &stop, seed);
    cell.get().add_member(devs[3].clone()).unwrap();
    let r = cell
        .grow(&GrowRequest {
            level: Some(Level::Raid6),
            layout: Some(ALGORITHM_LEFT_SYMMETRIC),
            ..Default::default()
        })
        .unwrap();
    assert!(r.summary.contains("the restripe starts once"), "{r:?}");
    wait_until(
        "the rebuild and then the restripe to end",
        Duration::from_secs(180),
        || {
            let a = cell.get();
            a.level() == Level::Raid6
                && a.geometry().layout == ALGORITHM_LEFT_SYMMETRIC
                && !a.is_reshaping()
                && !a.is_degraded()
                && a.recovering_roles().is_empty()
        },
    );
    stop_writers(&stop, ws);
    check(&cell, &model, "after the takeover and the restripe");
    let a = check_parity_and_stop(&cell, "after both steps");
    assert_eq!(a.raid_disks(), 4);
}

/// `--raid-devices 4 --add d3` on a served raid0 of 3: mdadm's three steps from one request
/// (the takeover to a raid4 with its parity role missing, d3 rebuilding that parity, the
/// restripe to 4 data roles with the new parity role left missing, the takeover back to
/// raid0), writers going on through all of them; the end is a raid0 of 4 at its new size
/// with every byte the writers left. Without a device the same request is refused and
/// nothing changes.
#[test]
fn a_served_raid0_grows_through_raid4_from_one_request() {
    let seed = 41;
    let devs = members(4, 6 * MB, "r0g-");
    let o = reshape_options(Level::Raid0);
    let a = create(devs[..3].iter().cloned().map(Some).collect(), &o).unwrap();
    let size = a.size_bytes();
    let (cell, model) = filled(a, seed);
    cell.start_daemons(DaemonOptions::default()).unwrap();
    let grow = GrowRequest {
        raid_disks: Some(4),
        ..Default::default()
    };
    let e = cell.grow(&grow).unwrap_err().to_string();
    assert!(
        e.contains("needs 1 new device") && e.contains("nothing was written"),
        "{e}"
    );
    assert_eq!(
        (cell.get().level(), cell.get().raid_disks()),
        (Level::Raid0, 3)
    );
    let e = cell
        .grow_adding(&grow, vec![devs[3].clone(), devs[3].clone()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("keeps no spares"), "{e}");
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, size, &model, &stop, seed);
    let r = cell.grow_adding(&grow, vec![devs[3].clone()]).unwrap();
    assert!(r.summary.contains("takeover back to raid0"), "{r:?}");
    wait_until(
        "the rebuild, the restripe and the takeover back to raid0",
        Duration::from_secs(180),
        || {
            let a = cell.get();
            a.level() == Level::Raid0 && a.raid_disks() == 4
        },
    );
    stop_writers(&stop, ws);
    check(&cell, &model, "after the raid0 grew");
    let a = cell.current();
    assert!(
        a.size_bytes() >= size / 3 * 4,
        "{} after {size}",
        a.size_bytes()
    );
    cell.stop_daemons();
    a.stop().unwrap();
}

/// `--level 5` on a served raid6 in a rotating layout: the restripe to its `-6` layout
/// started now, and md's takeover to raid5 by the cell when it ends, writers going on;
/// the end is a raid5 of one device fewer, every byte the writers left, no mismatch.
#[test]
fn a_served_rotating_raid6_becomes_a_raid5_from_one_request() {
    let seed = 43;
    let devs = members(5, 6 * MB, "r65-");
    let o = reshape_options(Level::Raid6);
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    let size = a.size_bytes();
    let (cell, model) = filled(a, seed);
    cell.start_daemons(DaemonOptions::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, size, &model, &stop, seed);
    let r = cell
        .grow(&GrowRequest {
            level: Some(Level::Raid5),
            ..Default::default()
        })
        .unwrap();
    assert!(r.summary.contains("takeover to raid5 follows"), "{r:?}");
    wait_until(
        "the restripe and then the takeover to raid5",
        Duration::from_secs(180),
        || cell.get().level() == Level::Raid5,
    );
    stop_writers(&stop, ws);
    check(&cell, &model, "after the restripe and the takeover");
    let a = check_parity_and_stop(&cell, "after both steps");
    assert_eq!(a.raid_disks(), 4);
    assert!(!a.is_reshaping());
}

/// mdadm's shrink on a served raid5 and raid10 (`--array-size` and `--raid-devices` fewer,
/// one request): refused without the size (nothing changed), then md's backwards reshape
/// while writers go on in the kept part; the end is an array of 3 served at the smaller
/// shape's size, every byte the writers left, no mismatch, the device that left a spare.
#[test]
fn a_served_raid5_or_raid10_shrinks_keeping_the_size_given() {
    // raid5: 2 data disks of 6144 sectors; raid10 near=2: 3 disks of 6144, 2 copies.
    for (level, keep_sectors, seed) in [(Level::Raid5, 6144 * 2, 61), (Level::Raid10, 9216, 63)] {
        let devs = members(4, 6 * MB, &format!("{level}s-"));
        let mut o = reshape_options(level);
        o.size_sectors = Some(6144); // room after the data for the offset to move up into
        let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
        let (cell, model) = filled(a, seed);
        let keep = keep_sectors * 512;
        model.lock().unwrap().truncate(keep as usize);
        cell.start_daemons(DaemonOptions::default()).unwrap();
        let e = cell
            .grow(&GrowRequest {
                raid_disks: Some(3),
                ..Default::default()
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("--array-size"), "{level}: {e}");
        assert_eq!(cell.get().raid_disks(), 4);
        let stop = Arc::new(AtomicBool::new(false));
        let ws = writers(&cell, keep, &model, &stop, seed);
        let r = cell
            .grow(&GrowRequest {
                raid_disks: Some(3),
                array_sectors: Some(keep_sectors),
                ..Default::default()
            })
            .unwrap();
        assert!(r.restripe, "{level}: {r:?}");
        wait_until("the shrink to 3 devices", Duration::from_secs(180), || {
            let a = cell.get();
            a.raid_disks() == 3 && !a.is_reshaping()
        });
        let n = stop_writers(&stop, ws);
        assert!(n > 0);
        check(&cell, &model, &format!("{level} after the shrink"));
        assert_eq!(cell.get().size_bytes(), keep, "{level}");
        let a = check_parity_and_stop(&cell, "after the shrink");
        drop(a);
        let (a, rep) = uraid_engine::assemble(devs.clone(), &Default::default()).unwrap();
        assert_eq!(a.raid_disks(), 3);
        assert_eq!(
            rep.members
                .iter()
                .filter(|m| matches!(m.outcome, uraid_engine::MemberOutcome::Spare))
                .count(),
            1,
            "{level}: {rep:?}"
        );
        a.stop().unwrap();
    }
}

/// mdadm's raid0 chunk change on a served raid0 (`--chunk`, one request): the takeover to
/// a raid4 with its parity role missing, the restripe to the new chunk with that role
/// still missing, and the takeover back, writers going on; the same members, every byte.
#[test]
fn a_served_raid0_changes_its_chunk_from_one_request() {
    let seed = 62;
    let devs = members(3, 6 * MB, "r0c-");
    let o = reshape_options(Level::Raid0);
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    let size = a.size_bytes();
    let (cell, model) = filled(a, seed);
    cell.start_daemons(DaemonOptions::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, size / 2, &model, &stop, seed);
    let r = cell
        .grow(&GrowRequest {
            chunk_sectors: Some(128),
            ..Default::default()
        })
        .unwrap();
    assert!(r.summary.contains("64K chunk"), "{r:?}");
    wait_until(
        "the restripe to a 64K chunk and the takeover back",
        Duration::from_secs(180),
        || {
            let a = cell.get();
            a.level() == Level::Raid0 && a.geometry().chunk_sectors == 128
        },
    );
    stop_writers(&stop, ws);
    let a = cell.current();
    assert_eq!(a.raid_disks(), 3);
    let mut want = model.lock().unwrap().clone();
    want.truncate(a.size_bytes() as usize);
    let mut got = vec![0u8; want.len()];
    a.read(0, &mut got).unwrap();
    assert!(got == want, "the bytes after the chunk change");
    cell.stop_daemons();
    a.stop().unwrap();
}

/// mdadm's raid0 shrink on a served raid0 of 3 (`--raid-devices 2 --array-size`, one
/// request): refused without the size or with one that is not whole chunks (nothing
/// changed); then the size served at once is the kept one (a write past it is refused), and
/// the takeover to a raid4 of 4, its backwards shrink to 3 run by the daemons and the
/// takeover back to a raid0 of 2 follow while writers go on in the kept part; the end is
/// every byte the writers left, and the device that left is no member when the members
/// are assembled again.
#[test]
fn a_served_raid0_shrinks_through_raid4_from_one_request() {
    let seed = 64;
    let devs = members(3, 6 * MB, "r0s-");
    let o = reshape_options(Level::Raid0);
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    let zone = a.size_bytes() / 3 / 512 / 64 * 64;
    let keep_sectors = 2 * zone - 4 * 64;
    let keep = keep_sectors * 512;
    let (cell, model) = filled(a, seed);
    model.lock().unwrap().truncate(keep as usize);
    cell.start_daemons(DaemonOptions::default()).unwrap();
    for (req, want) in [
        (None, "--array-size"),
        (Some(keep_sectors - 8), "whole number"),
    ] {
        let e = cell
            .grow(&GrowRequest {
                raid_disks: Some(2),
                array_sectors: req,
                ..Default::default()
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
        let a = cell.get();
        assert_eq!((a.level(), a.raid_disks()), (Level::Raid0, 3));
        assert_eq!(a.exported_bytes(), a.size_bytes(), "nothing changed");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, keep, &model, &stop, seed);
    let r = cell
        .grow(&GrowRequest {
            raid_disks: Some(2),
            array_sectors: Some(keep_sectors),
            ..Default::default()
        })
        .unwrap();
    assert!(r.summary.contains("takeover back to raid0"), "{r:?}");
    assert_eq!(cell.get().exported_bytes(), keep);
    let e = cell.run(|a| a.write(keep, &[1u8; 4096])).unwrap_err();
    assert!(matches!(e, ArrayError::OutOfRange { .. }), "{e}");
    wait_until(
        "the raid4's shrink and the takeover back to raid0",
        Duration::from_secs(180),
        || {
            let a = cell.get();
            a.level() == Level::Raid0 && a.raid_disks() == 2
        },
    );
    assert!(stop_writers(&stop, ws) > 0);
    check(&cell, &model, "after the raid0 shrank");
    let a = cell.current();
    assert!(
        a.size_bytes() >= keep && a.exported_bytes() == keep,
        "{}",
        a.size_bytes()
    );
    cell.stop_daemons();
    a.stop().unwrap();
    drop(a);
    let (a, rep) = uraid_engine::assemble(devs.clone(), &Default::default()).unwrap();
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid0, 2));
    assert_eq!(
        rep.members[2].outcome,
        uraid_engine::MemberOutcome::Faulty,
        "{rep:?}"
    );
    let mut got = vec![0u8; keep as usize];
    a.read(0, &mut got).unwrap();
    assert!(
        got == *model.lock().unwrap(),
        "the kept bytes, assembled again"
    );
    a.stop().unwrap();
}

/// Issue 15: `--raid-devices 5 --add d4` on a served raid10 near=2 of 4, one request: the
/// device added as a spare, md's raid10 reshape started on the served array (the data
/// offset moving down) and run by the daemons while writers go on, and at its end the
/// array served in its new shape at its new size; every byte the writers left, and md's
/// check finds every copy equal.
#[test]
fn a_served_raid10_grows_by_a_member_from_one_request() {
    served_raid10_grows(47, false);
}

/// The same with an internal bitmap is refused by name before anything changes (a grow
/// uraid starts and Linux finishes would leave the grown range unsynced), and so is
/// nothing else: a layout change with the bitmap runs served (no range grows).
#[test]
fn a_served_raid10_with_a_bitmap_refuses_a_grow_and_changes_its_layout() {
    let devs = members(5, 6 * MB, "r10gb-");
    let mut o = reshape_options(Level::Raid10);
    o.layout = Some(0x102);
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(64 * 1024);
    let a = create(devs[..4].iter().cloned().map(Some).collect(), &o).unwrap();
    let (cell, model) = filled(a, 53);
    cell.start_daemons(DaemonOptions::default()).unwrap();
    let e = cell
        .grow_adding(
            &GrowRequest {
                raid_disks: Some(5),
                ..Default::default()
            },
            vec![devs[4].clone()],
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("remove the bitmap first"), "{e}");
    assert_eq!(cell.get().raid_disks(), 4);
    let stop = Arc::new(AtomicBool::new(false));
    let size = cell.get().size_bytes();
    let ws = writers(&cell, size, &model, &stop, 53);
    let r = cell
        .grow(&GrowRequest {
            layout: Some(0x10201),
            ..Default::default()
        })
        .unwrap();
    assert!(r.restripe, "{r:?}");
    wait_until("the layout change", Duration::from_secs(180), || {
        let a = cell.get();
        !a.is_reshaping() && a.geometry().layout == 0x10201
    });
    assert!(stop_writers(&stop, ws) > 0);
    check(&cell, &model, "after the layout change");
    let a = check_parity_and_stop(&cell, "after the layout change");
    drop(a);
    let (a, _) = uraid_engine::assemble(devs[..4].to_vec(), &Default::default()).unwrap();
    let (dirty, chunks) = a.bitmap_dirty_chunks().expect("the bitmap stays");
    assert_eq!(chunks, a.size_bytes().div_ceil(64 << 10));
    assert_eq!(dirty, 0, "clean after the clean stop, not stale");
    a.stop().unwrap();
}

fn served_raid10_grows(seed: u64, bitmap: bool) -> Vec<Arc<dyn Member>> {
    eprintln!("seed {seed}");
    let devs = members(5, 6 * MB, if bitmap { "r10gb-" } else { "r10g-" });
    let mut o = reshape_options(Level::Raid10);
    o.layout = Some(0x102);
    o.bitmap = bitmap;
    o.bitmap_chunk_bytes = bitmap.then_some(64 * 1024);
    let a = create(devs[..4].iter().cloned().map(Some).collect(), &o).unwrap();
    let before = a.size_bytes();
    let (cell, model) = filled(a, seed);
    cell.start_daemons(DaemonOptions {
        sync_limits: SyncLimits {
            min_kib_s: 1000,
            max_kib_s: 4000,
        },
        ..Default::default()
    })
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, before, &model, &stop, seed);
    let r = cell
        .grow_adding(
            &GrowRequest {
                raid_disks: Some(5),
                ..Default::default()
            },
            vec![devs[4].clone()],
        )
        .unwrap();
    assert!(r.restripe, "{r:?}");
    assert!(r.summary.contains("4 -> 5"), "{r:?}");
    wait_until("the reshape to end", Duration::from_secs(120), || {
        let a = cell.get();
        !a.is_reshaping() && a.size_bytes() > before
    });
    let writes = stop_writers(&stop, ws);
    assert!(writes > 0);
    check(&cell, &model, "after the raid10 reshape");
    let a = cell.current();
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid10, 5));
    assert!(a.size_bytes() >= before / 4 * 5 - MB, "{}", a.size_bytes());
    // The grown part is there and writable.
    let tail = vec![0x5au8; MB as usize];
    cell.run(|a| a.write(before, &tail)).unwrap();
    let mut back = vec![0u8; MB as usize];
    cell.run(|a| a.read(before, &mut back)).unwrap();
    assert!(back == tail);
    drop(a);
    let a = check_parity_and_stop(&cell, "after the raid10 reshape");
    assert!(!a.is_reshaping());
    for d in &devs {
        let sb = uraid_engine::read_superblock(d.as_ref()).unwrap();
        assert_eq!(sb.raid_disks, 5, "{}", d.name());
        assert_eq!(
            sb.feature_map & uraid_core::superblock::FEATURE_RESHAPE_ACTIVE,
            0,
            "{}",
            d.name()
        );
    }
    devs
}

/// mdadm's two steps of a shrink on a served array: `--array-size` alone sets the size the
/// array is exported at (md's in-memory array_size: requests past it refused, the members
/// unchanged), then `--raid-devices` fewer takes it as the confirmation; `max` exports all
/// of the array again. A size past the array's, and `--array-size` alone on an array that
/// is not served, are refused by name.
#[test]
fn a_served_raid5_takes_mds_array_size_then_shrinks_by_it() {
    let seed = 67;
    let devs = members(4, 6 * MB, "r5as-");
    let mut o = reshape_options(Level::Raid5);
    o.size_sectors = Some(6144);
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    let size = a.size_bytes();
    let (cell, model) = filled(a, seed);
    cell.start_daemons(DaemonOptions::default()).unwrap();
    let keep = 6144 * 2 * 512;
    let sb_before = uraid_engine::read_superblock(devs[0].as_ref()).unwrap();
    let e = cell
        .grow(&GrowRequest {
            array_sectors: Some(size / 512 + 8),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most"), "{e}");
    let r = cell
        .grow(&GrowRequest {
            array_sectors: Some(keep / 512),
            ..Default::default()
        })
        .unwrap();
    assert!(r.summary.contains("in memory"), "{r:?}");
    let a = cell.get();
    assert_eq!((a.exported_bytes(), a.size_bytes()), (keep, size));
    let e = cell.run(|a| a.write(keep, &[1u8; 4096])).unwrap_err();
    assert!(matches!(e, ArrayError::OutOfRange { .. }), "{e}");
    let sb = uraid_engine::read_superblock(devs[0].as_ref()).unwrap();
    assert_eq!(
        (sb.raid_disks, sb.size, sb.feature_map),
        (sb_before.raid_disks, sb_before.size, sb_before.feature_map),
        "nothing written for the in-memory size"
    );
    drop(a);
    model.lock().unwrap().truncate(keep as usize);
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(&cell, keep, &model, &stop, seed);
    let r = cell
        .grow(&GrowRequest {
            raid_disks: Some(3),
            ..Default::default()
        })
        .unwrap();
    assert!(
        r.restripe,
        "the size set is the shrink's confirmation: {r:?}"
    );
    wait_until("the shrink to 3 devices", Duration::from_secs(180), || {
        let a = cell.get();
        a.raid_disks() == 3 && !a.is_reshaping()
    });
    assert!(stop_writers(&stop, ws) > 0);
    check(&cell, &model, "after the shrink");
    assert_eq!(cell.get().exported_bytes(), keep);
    let r = cell
        .grow(&GrowRequest {
            array_sectors: Some(uraid_engine::ARRAY_SIZE_MAX),
            ..Default::default()
        })
        .unwrap();
    assert!(r.summary.contains("all of it"), "{r:?}");
    let a = cell.get();
    assert_eq!(a.exported_bytes(), a.size_bytes());
    drop(a);
    let a = check_parity_and_stop(&cell, "after the shrink");
    drop(a);
    let e = uraid_engine::grow_members(
        devs.clone(),
        &GrowRequest {
            array_sectors: Some(keep / 512),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not served"), "{e}");
}

/// An `--array-size` on a served raid1 is no shrink's confirmation: dropping a mirror after
/// it goes on as md's does (the size set stays what is exported).
#[test]
fn a_served_raid1_with_an_array_size_still_drops_a_mirror() {
    let devs = members(3, 8 * MB, "r1as-");
    let mut o = CreateOptions::new(Level::Raid1);
    o.assume_clean = true;
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    let half = a.size_bytes() / 2 / 512 * 512;
    let cell = ArrayCell::new(Arc::new(a));
    cell.grow(&GrowRequest {
        array_sectors: Some(half / 512),
        ..Default::default()
    })
    .unwrap();
    // md's way: the mirror failed and removed first.
    cell.get().fail_member(uraid_core::MemberIdx(2)).unwrap();
    cell.get().remove_member(uraid_core::MemberIdx(2)).unwrap();
    let r = cell
        .grow(&GrowRequest {
            raid_disks: Some(2),
            ..Default::default()
        })
        .unwrap();
    assert!(!r.restripe, "{r:?}");
    let a = cell.get();
    assert_eq!((a.raid_disks(), a.exported_bytes()), (2, half));
    drop(a);
    cell.current().stop().unwrap();
}
