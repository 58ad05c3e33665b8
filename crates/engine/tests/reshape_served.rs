//! A reshape of a served array (md's reshape while the array runs): writers and readers go
//! on through the whole restripe, each write landing in whichever geometry holds its
//! sectors; the reshape stopped mid-way goes on from its recorded position; a member
//! failing mid-way leaves a degraded array with every byte; and the finished array
//! assembles in its new shape with md's check clean.

use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC;
use uraid_core::superblock::FEATURE_RESHAPE_ACTIVE;
use uraid_core::Level;
use uraid_engine::{
    assemble, create, read_superblock, reshape_members, Array, AssembleOptions, CreateOptions,
    DaemonOptions, Event, MemMember, Member, MemberIdx, ReshapeOptions, ReshapeRequest, SyncKind,
};
use uraid_testkit::engine::{
    model_writers, read_all, rng, same, same_but_unsure, serve_reshape, wait_reshaped,
    writes_until_cut,
};

const MB: u64 = 1 << 20;
fn members(n: usize, bytes: u64, tag: &str) -> Vec<Arc<dyn Member>> {
    (0..n)
        .map(|i| Arc::new(MemMember::new(format!("{tag}{i}"), bytes)) as Arc<dyn Member>)
        .collect()
}

fn open(devs: &[Arc<dyn Member>]) -> Array {
    assemble(devs.to_vec(), &AssembleOptions::default())
        .unwrap()
        .0
}

/// A raid5 on the first `disks` of `devs` (chunk and data offset in sectors) filled with
/// seeded bytes, with a reshape to `disks + 1` started (recorded at position 0, the next
/// device taking the new role) and nothing moved yet: the bytes.
fn start_grow(
    devs: &[Arc<dyn Member>],
    disks: usize,
    chunk: u64,
    offset: u64,
    seed: u64,
) -> Vec<u8> {
    let mut o = CreateOptions::new(Level::Raid5);
    o.layout = Some(ALGORITHM_LEFT_SYMMETRIC);
    o.chunk_sectors = Some(chunk);
    o.assume_clean = true;
    o.data_offset_sectors = Some(offset);
    let a = create(devs[..disks].iter().cloned().map(Some).collect(), &o).unwrap();
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    let req = ReshapeRequest {
        raid_disks: Some(disks + 1),
        ..Default::default()
    };
    let r = reshape_members(
        devs[..disks].to_vec(),
        &req,
        ReshapeOptions {
            add: vec![devs[disks].clone()],
            stop_at: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.finished && r.position_sectors == 0, "{r:?}");
    data
}

/// [`start_grow`] on memory members of 6 MiB: the members (the new one last) and the bytes.
fn started(disks: usize, seed: u64, tag: &str) -> (Vec<Arc<dyn Member>>, Vec<u8>) {
    let devs = members(disks + 1, 6 * MB, tag);
    let data = start_grow(&devs, disks, 128, 2048, seed);
    (devs, data)
}

/// Served mid-reshape: the array, its daemons, and its events from before they started.
fn serve(
    devs: &[Arc<dyn Member>],
    max_kib_s: u64,
) -> (
    Arc<Array>,
    uraid_engine::Daemons,
    std::sync::mpsc::Receiver<Event>,
) {
    let a = Arc::new(open(devs));
    let events = a.subscribe();
    let d = serve_reshape(&a, max_kib_s);
    (a, d, events)
}

/// The finished array assembled again: its new shape, the model's bytes first, zeros
/// after, md's check clean when no member is `failed` (whose superblock keeps the shape it
/// had when it failed, as md leaves a faulty device's).
fn verify_finished(devs: &[Arc<dyn Member>], model: &[u8], disks: usize, failed: Option<usize>) {
    let whole = failed.is_none();
    let a = open(devs);
    assert!(!a.is_reshaping());
    assert_eq!(a.raid_disks(), disks);
    assert_eq!(a.level(), Level::Raid5);
    let all = read_all(&a, a.size_bytes() as usize);
    same(&all[..model.len()], model, "the bytes after the reshape");
    assert!(
        all[model.len()..].iter().all(|&b| b == 0),
        "the grown part reads zeros"
    );
    if whole {
        assert_eq!(
            a.run_sync(SyncKind::Check, |_| {}).unwrap(),
            0,
            "check mismatches"
        );
    }
    a.stop().unwrap();
    for (_, d) in devs.iter().enumerate().filter(|(i, _)| Some(*i) != failed) {
        let sb = read_superblock(d.as_ref()).unwrap();
        assert_eq!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0, "{}", d.name());
        assert_eq!(sb.raid_disks as usize, disks);
    }
}

#[test]
fn writes_go_on_through_a_served_reshape() {
    let (devs, data) = started(4, 11, "served");
    let (a, d, events) = serve(&devs, 4096);
    let model = Arc::new(Mutex::new(data));
    let done = AtomicBool::new(false);
    let seen_midway = AtomicBool::new(false);
    let writes = {
        let a2 = a.clone();
        let until = || {
            if !a2.is_reshaping() {
                return true;
            }
            let pos = a2.meta().template().reshape_position;
            if pos > 0 {
                seen_midway.store(true, Ordering::Relaxed);
            }
            done.load(Ordering::Relaxed)
        };
        model_writers(&a, &model, 1, &until)
    };
    assert!(
        wait_reshaped(&a, Duration::from_secs(120)),
        "the reshape did not finish"
    );
    assert!(writes > 50, "only {writes} writes while the reshape ran");
    assert!(
        seen_midway.load(Ordering::Relaxed),
        "no position was recorded mid-way"
    );
    let model = model.lock().unwrap().clone();
    // Served on, in the new geometry, before any restart.
    same(
        &read_all(&a, model.len()),
        &model,
        "the bytes when the reshape ends",
    );
    d.stop();
    a.stop().unwrap();
    let names: Vec<String> = events.try_iter().map(|e: Event| e.name()).collect();
    assert!(names.contains(&"RebuildStarted".to_string()), "{names:?}");
    assert!(names.contains(&"RebuildFinished".to_string()), "{names:?}");
    verify_finished(&devs, &model, 5, None);
}

#[test]
fn a_served_reshape_stopped_midway_goes_on_from_its_recorded_position() {
    let (devs, data) = started(3, 12, "stopped");
    let (a, d, _) = serve(&devs, 2048);
    let model = Arc::new(Mutex::new(data));
    let t = Instant::now();
    let a2 = a.clone();
    model_writers(&a, &model, 2, &|| {
        t.elapsed() > Duration::from_millis(1500) || !a2.is_reshaping()
    });
    d.stop();
    assert!(
        a.is_reshaping(),
        "the reshape finished before it was stopped"
    );
    a.stop().unwrap();
    let model = model.lock().unwrap().clone();
    let sb = read_superblock(devs[0].as_ref()).unwrap();
    assert_ne!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0);
    assert!(
        sb.reshape_position > 0,
        "no progress was recorded at the stop"
    );
    // Assembled again mid-reshape: every byte, then served to the end.
    let (a, d, _) = serve(&devs, 0);
    same(&read_all(&a, model.len()), &model, "the bytes mid-reshape");
    assert!(wait_reshaped(&a, Duration::from_secs(120)));
    d.stop();
    a.stop().unwrap();
    verify_finished(&devs, &model, 4, None);
}

#[test]
fn a_member_failing_mid_reshape_leaves_every_byte() {
    let (devs, data) = started(4, 13, "failing");
    let (a, d, _) = serve(&devs, 4096);
    let model = Arc::new(Mutex::new(data));
    let t = Instant::now();
    let failed = AtomicBool::new(false);
    let a2 = a.clone();
    model_writers(&a, &model, 3, &|| {
        if t.elapsed() > Duration::from_millis(700) && !failed.swap(true, Ordering::SeqCst) {
            a2.fail_member(MemberIdx(2)).unwrap();
        }
        !a2.is_reshaping()
    });
    assert!(wait_reshaped(&a, Duration::from_secs(120)));
    assert!(
        failed.load(Ordering::SeqCst),
        "the reshape ended before the failure"
    );
    let model = model.lock().unwrap().clone();
    same(&read_all(&a, model.len()), &model, "the bytes, degraded");
    d.stop();
    a.stop().unwrap();
    verify_finished(&devs, &model, 5, Some(2));
}

/// A power cut at seeded points of a served reshape with a writer flushing after every
/// write: after it, every write that was acknowledged (its flush returned before the cut)
/// reads back, mid-reshape and after the reshape was served to its end; a resync then
/// leaves md's check clean. The seed is printed with any failure.
#[test]
fn a_power_cut_during_a_served_reshape_loses_no_acknowledged_write() {
    use uraid_sim::disk::{Power, SimDisk, SimWorld};
    let seed: u64 = std::env::var("URAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026);
    let disks = 4;
    let world = SimWorld::new();
    let sim: Vec<Arc<SimDisk>> = (0..=disks)
        .map(|i| Arc::new(SimDisk::new(format!("cut{i}"), 2 * MB, world.clone())))
        .collect();
    let devs: Vec<Arc<dyn Member>> = sim.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
    let data = start_grow(&devs, disks, 32, 256, seed);
    let images: Vec<Vec<u8>> = sim.iter().map(|d| d.durable_image()).collect();
    let mut r = rng(seed ^ 0x5eed);
    let (mut saw_mid, mut saw_end) = (false, false);
    let mut budget = 8i64;
    let mut round = 0;
    loop {
        round += 1;
        let ops = budget + r.gen_range(0..=budget / 2);
        let what = format!("seed {seed} (URAID_SEED), round {round}, cut after {ops} IOs");
        let power = Power::new(ops);
        let cut = SimDisk::crash_set("cut", &power, &images);
        let cut_devs: Vec<Arc<dyn Member>> =
            cut.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
        let mut model = data.clone();
        let unsure = {
            let a = Arc::new(open(&cut_devs));
            let d = a.start_daemons(DaemonOptions::default()).unwrap();
            let unsure = writes_until_cut(&a, &mut model, &mut r, &|| power.on());
            d.stop();
            unsure
        };
        let finished = power.on();
        let after = SimDisk::after_cut(&cut);
        let check = |a: &Array, when: &str| {
            same_but_unsure(a, &model, unsure, &format!("{what}: {when}"));
        };
        let a = Arc::new(open(&after));
        check(&a, "after the cut");
        if a.is_reshaping() {
            saw_mid = true;
            let d = a.start_daemons(DaemonOptions::default()).unwrap();
            assert!(
                wait_reshaped(&a, Duration::from_secs(60)),
                "{what}: not finished"
            );
            d.stop();
            check(&a, "served to the end");
        } else {
            saw_end = true;
        }
        a.stop().unwrap();
        let a = open(&after);
        assert!(!a.is_reshaping() && a.raid_disks() == disks + 1, "{what}");
        check(&a, "in the new shape");
        if a.meta().needs_resync() {
            a.run_sync(SyncKind::Resync, |_| {}).unwrap();
        }
        assert_eq!(
            a.run_sync(SyncKind::Check, |_| {}).unwrap(),
            0,
            "{what}: check"
        );
        a.stop().unwrap();
        if finished {
            break;
        }
        budget = budget * 3 / 2 + 1;
    }
    assert!(saw_mid, "seed {seed}: no cut fell mid-reshape");
    let _ = saw_end;
}

/// A degraded raid5 reshaped while served (md reshapes a degraded array): the reshape
/// reads the missing member's blocks from parity, writers go on through it, and the end
/// is the new shape with every byte and the missing role still missing.
#[test]
fn a_degraded_array_reshapes_while_served() {
    let devs = members(5, 6 * MB, "served-deg");
    let mut o = CreateOptions::new(Level::Raid5);
    o.layout = Some(ALGORITHM_LEFT_SYMMETRIC);
    o.chunk_sectors = Some(128);
    o.assume_clean = true;
    o.data_offset_sectors = Some(2048);
    let a = create(devs[..4].iter().cloned().map(Some).collect(), &o).unwrap();
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(17).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    a.fail_member(MemberIdx(1)).unwrap();
    a.stop().unwrap();
    let left: Vec<Arc<dyn Member>> = [0, 2, 3, 4].iter().map(|&i| devs[i].clone()).collect();
    let r = reshape_members(
        left[..3].to_vec(),
        &ReshapeRequest {
            raid_disks: Some(5),
            ..Default::default()
        },
        ReshapeOptions {
            add: vec![left[3].clone()],
            stop_at: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.finished, "{r:?}");
    let (a, d, _events) = serve(&left, 4096);
    assert_eq!(a.missing_roles(), vec![MemberIdx(1)]);
    let model = Arc::new(Mutex::new(data));
    let writes = {
        let a2 = a.clone();
        let until = move || !a2.is_reshaping();
        model_writers(&a, &model, 7, &until)
    };
    assert!(
        wait_reshaped(&a, Duration::from_secs(120)),
        "the reshape did not finish"
    );
    assert!(writes > 0);
    let model = model.lock().unwrap().clone();
    same(&read_all(&a, model.len()), &model, "served, at the end");
    d.stop();
    a.stop().unwrap();
    // The missing role recovered onto a fresh device: md's check is clean.
    let a = open(&left);
    assert_eq!(a.missing_roles(), vec![MemberIdx(1)]);
    let fresh: Arc<dyn Member> = Arc::new(MemMember::new("served-deg-fresh", 6 * MB));
    a.add_member(fresh.clone()).unwrap();
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    assert!(a.missing_roles().is_empty());
    a.stop().unwrap();
    let mut all = left;
    all.push(fresh);
    verify_finished(&all, &model, 5, None);
}
