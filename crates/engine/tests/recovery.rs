//! Member lifecycle and sync work: recovery onto a new member (also resumed after a
//! restart), spares taking over, remove, read-error repair, check/repair with raid6 locate.

use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{
    assemble, AddOutcome, Array, AssembleOptions, MemMember, Member, SlotState, SyncKind,
};
use uraid_sim::FaultMember;
use uraid_testkit::engine::*;

fn fill(a: &Array, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let mut model = vec![0u8; a.size_bytes() as usize];
    r.fill(&mut model[..]);
    a.write(0, &model).unwrap();
    model
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut v = vec![0u8; a.size_bytes() as usize];
    a.read(0, &mut v).unwrap();
    v
}

fn cfg(level: Level, layout: Option<u32>, disks: usize) -> Config {
    Config::new(level, layout, disks)
}

fn redundant_configs() -> Vec<Config> {
    vec![
        cfg(Level::Raid1, None, 2),
        cfg(Level::Raid1, None, 3),
        cfg(Level::Raid10, Some(0x102), 4),
        cfg(Level::Raid10, Some(0x201), 3),
        cfg(Level::Raid10, Some(0x10201), 4),
        cfg(Level::Raid4, None, 4),
        cfg(Level::Raid5, None, 4),
        cfg(Level::Raid5, Some(0), 3),
        cfg(Level::Raid6, None, 5),
        cfg(Level::Raid6, Some(1), 6),
    ]
}

#[test]
fn recovery_rebuilds_a_failed_member_for_every_level() {
    for c in redundant_configs() {
        let mems = mem_members(&c, "r");
        let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
        let model = fill(&a, 1);
        a.fail_member(MemberIdx(1)).unwrap();
        a.remove_member(MemberIdx(1)).unwrap();
        let new = Arc::new(MemMember::new("new", 2 << 20));
        let out = a.add_member(new.clone()).unwrap();
        assert_eq!(out, AddOutcome::Recovering(MemberIdx(1)), "{c:?}");
        assert_eq!(a.slot_state(MemberIdx(1)), SlotState::Recovering);
        // Writes during recovery land on both sides of the cursor.
        let mut model = model;
        let (off, data) = random_write(&mut rng(5), a.size_bytes(), 100_000);
        a.write(off, &data).unwrap();
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
        let mut steps = 0;
        a.run_sync(SyncKind::Recovery, |_| steps += 1).unwrap();
        assert!(steps > 0);
        assert_eq!(a.slot_state(MemberIdx(1)), SlotState::InSync, "{c:?}");
        assert!(!a.is_degraded());
        assert_eq!(
            a.check().unwrap(),
            0,
            "{c:?}: redundancy inconsistent after recovery"
        );
        // The rebuilt member must hold the data: fail others so that reads need it.
        for r in 0..c.disks {
            if r == 1 {
                continue;
            }
            let mut trial = a.missing_roles();
            trial.push(MemberIdx(r));
            if a.personality().survives(&trial) {
                a.fail_member(MemberIdx(r)).unwrap();
            }
        }
        assert!(read_all(&a) == model, "{c:?}: data differs after recovery");
    }
}

/// A raid6 recovery of one member reads one parity per stripe, not both: P where the lost
/// block is data or P (rebuilt by XOR), the data alone where it is Q. Every layout's
/// rotation puts each role on the lost member somewhere, and the data comes back whole.
#[test]
fn raid6_recovery_of_one_member_reads_one_parity() {
    for layout in [None, Some(1), Some(8)] {
        let c = cfg(Level::Raid6, layout, 5);
        let mems = mem_members(&c, "q");
        let reads: Arc<std::sync::Mutex<Vec<(usize, u64, u64)>>> = Arc::default();
        let members: Vec<Option<Arc<dyn Member>>> = mems
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let reads = reads.clone();
                let f = FaultMember::new(m.clone() as Arc<dyn Member>).with_hook(move |io| {
                    if !io.write {
                        reads.lock().unwrap().push((i, io.offset, io.len));
                    }
                    uraid_sim::Verdict::Pass
                });
                Some(Arc::new(f) as Arc<dyn Member>)
            })
            .collect();
        let a = uraid_engine::create(members, &create_opts(&c)).unwrap();
        let model = fill(&a, 4);
        a.fail_member(MemberIdx(1)).unwrap();
        a.remove_member(MemberIdx(1)).unwrap();
        a.add_member(Arc::new(MemMember::new("new", 2 << 20)))
            .unwrap();
        reads.lock().unwrap().clear();
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        let g = uraid_core::geometry::ParityGeometry::new(a.geometry()).unwrap();
        let chunk = c.chunk_sectors * 512;
        let data_start = 64 * 512;
        let read_chunk = |role: usize, stripe: u64| {
            let (lo, hi) = (
                data_start + stripe * chunk,
                data_start + (stripe + 1) * chunk,
            );
            reads
                .lock()
                .unwrap()
                .iter()
                .any(|&(m, off, len)| m == role && off < hi && off + len > lo)
        };
        for stripe in 0..a.geometry().dev_sectors / c.chunk_sectors {
            let map = g.stripe_map(stripe);
            let q = map.q.unwrap();
            let lost = MemberIdx(1);
            let unread = if lost == q { map.p } else { q };
            assert!(
                !read_chunk(unread.0, stripe),
                "{c:?}: stripe {stripe} read its unneeded parity on member {unread:?}"
            );
            for r in map.data.iter().chain([&map.p, &q]) {
                if *r != lost && *r != unread {
                    assert!(
                        read_chunk(r.0, stripe),
                        "{c:?}: stripe {stripe}: {r:?} not read"
                    );
                }
            }
        }
        assert_eq!(a.check().unwrap(), 0, "{c:?}");
        for r in [0, 2] {
            a.fail_member(MemberIdx(r)).unwrap();
        }
        assert!(read_all(&a) == model, "{c:?}: data differs after recovery");
    }
}

#[test]
fn recovery_resumes_after_restart_from_recovery_offset() {
    for c in [
        cfg(Level::Raid5, None, 4),
        cfg(Level::Raid6, None, 5),
        cfg(Level::Raid1, None, 2),
        cfg(Level::Raid10, Some(0x102), 4),
    ] {
        let mems = mem_members(&c, "s");
        let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
        let model = fill(&a, 2);
        a.fail_member(MemberIdx(0)).unwrap();
        a.remove_member(MemberIdx(0)).unwrap();
        let new = Arc::new(MemMember::new("new0", 2 << 20));
        a.add_member(new.clone()).unwrap();
        // Part of the way, then persist and stop.
        let half = a.total_units() / 2;
        let mut done = 0;
        while done < half {
            done += a.sync_step(SyncKind::Recovery, done, 8).unwrap().0;
        }
        a.write_superblocks().unwrap();
        a.stop().unwrap();
        drop(a);
        let mut devs: Vec<Arc<dyn Member>> = vec![new.clone()];
        devs.extend(mems[1..].iter().map(|m| m.clone() as Arc<dyn Member>));
        let (b, _) = assemble(devs, &AssembleOptions::default()).unwrap();
        assert_eq!(b.slot_state(MemberIdx(0)), SlotState::Recovering, "{c:?}");
        let cursor = b.slot(MemberIdx(0)).recovery_cursor();
        assert!(
            cursor > 0 && cursor <= done,
            "{c:?}: resumed at {cursor}, stopped at {done}"
        );
        assert!(read_all(&b) == model, "{c:?}: reads wrong while recovering");
        b.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        assert_eq!(b.slot_state(MemberIdx(0)), SlotState::InSync);
        assert_eq!(b.check().unwrap(), 0, "{c:?}");
        for r in 1..c.disks {
            let mut trial = b.missing_roles();
            trial.push(MemberIdx(r));
            if b.personality().survives(&trial) {
                b.fail_member(MemberIdx(r)).unwrap();
            }
        }
        assert!(read_all(&b) == model, "{c:?}: rebuilt member lacks data");
    }
}

#[test]
fn a_spare_takes_over_a_failed_member() {
    let c = cfg(Level::Raid5, None, 4);
    let mems = mem_members(&c, "sp");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    let model = fill(&a, 3);
    let spare = Arc::new(MemMember::new("spare", 2 << 20));
    assert_eq!(a.add_member(spare.clone()).unwrap(), AddOutcome::Spare);
    assert_eq!(a.spares(), vec!["spare".to_string()]);
    let events = a.subscribe();
    a.fail_member(MemberIdx(2)).unwrap();
    assert_eq!(a.slot_state(MemberIdx(2)), SlotState::Recovering);
    assert!(a.spares().is_empty());
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    let names: Vec<String> = events.try_iter().map(|e| e.name()).collect();
    for want in ["Fail", "RebuildStarted", "RebuildFinished", "SpareActive"] {
        assert!(
            names.iter().any(|n| n == want),
            "no {want} event in {names:?}"
        );
    }
    // Once per recovery, as md's monitor sees it: when it runs, not also when the spare
    // took the role.
    assert_eq!(
        names.iter().filter(|n| *n == "RebuildStarted").count(),
        1,
        "{names:?}"
    );
    a.fail_member(MemberIdx(0)).unwrap();
    assert!(read_all(&a) == model);
    // A faulty member's role is free for a new device, as md's remove_and_add_spares.
    let new = Arc::new(MemMember::new("new", 2 << 20));
    assert_eq!(
        a.add_member(new).unwrap(),
        AddOutcome::Recovering(MemberIdx(0))
    );
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    assert!(!a.is_degraded());
    assert!(read_all(&a) == model);
}

#[test]
fn remove_refuses_active_members() {
    let c = cfg(Level::Raid1, None, 2);
    let mems = mem_members(&c, "rm");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    let e = a.remove_member(MemberIdx(0)).unwrap_err().to_string();
    assert!(e.contains("active"), "{e}");
    a.fail_member(MemberIdx(0)).unwrap();
    a.remove_member(MemberIdx(0)).unwrap();
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::Missing);
    let e = a.fail_member(MemberIdx(1)).unwrap_err().to_string();
    assert!(e.contains("without its data"), "{e}");
}

#[test]
fn read_errors_are_answered_from_redundancy_and_repaired() {
    for c in redundant_configs() {
        let mems = mem_members(&c, "re");
        let faults: Vec<Arc<FaultMember>> = mems
            .iter()
            .map(|m| Arc::new(FaultMember::new(m.clone() as Arc<dyn Member>)))
            .collect();
        let devs = faults
            .iter()
            .map(|f| Some(f.clone() as Arc<dyn Member>))
            .collect();
        let a = uraid_engine::create(devs, &create_opts(&c)).unwrap();
        let model = fill(&a, 4);
        // Member 1 fails reads in a window of its data area.
        faults[1].set_range(64 * 512 + 8192, 64 * 512 + 24 * 1024);
        faults[1].fail_reads.store(true, Ordering::SeqCst);
        for _ in 0..2 {
            assert!(
                read_all(&a) == model,
                "{c:?}: read with errors returned wrong data"
            );
        }
        assert_eq!(
            a.slot_state(MemberIdx(1)),
            SlotState::InSync,
            "{c:?}: member failed on a read error"
        );
        // raid1/raid10 may never read that member in a full read; a check reads everything.
        a.check().unwrap();
        assert!(
            a.stats.corrected_reads.load(Ordering::Relaxed) > 0,
            "{c:?}: nothing repaired"
        );
        faults[1].fail_reads.store(false, Ordering::SeqCst);
        assert_eq!(a.check().unwrap(), 0, "{c:?}");
    }
}

/// A mirror's check counts mismatches as md does, per 64 KiB resync block, however large
/// the pieces it syncs: raid1's are 1 MiB, raid10's a chunk (512 KiB here). 4 KiB corrupted
/// inside one block counts 128 sectors; 4 KiB across a block boundary counts 256.
#[test]
fn mirror_mismatches_are_counted_per_64k_block() {
    for (level, layout, disks) in [(Level::Raid1, None, 2), (Level::Raid10, Some(0x102), 4)] {
        let c = Config {
            chunk_sectors: 1024,
            member_bytes: vec![8 << 20; disks],
            ..cfg(level, layout, disks)
        };
        let mems = mem_members(&c, "mb");
        let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
        fill(&a, 9);
        assert_eq!(a.check().unwrap(), 0, "{c:?}: fresh array has mismatches");
        let data = 64 * 512 + (1 << 20);
        for (corrupt_at, want) in [(data + 200 * 1024, 128), (data + 318 * 1024, 256)] {
            mems[1].write_at(&[0xa5u8; 4096], corrupt_at).unwrap();
            assert_eq!(a.check().unwrap(), want, "{c:?}: corrupted at {corrupt_at}");
            assert_eq!(a.repair().unwrap(), want, "{c:?}");
            assert_eq!(a.check().unwrap(), 0, "{c:?}: repair left mismatches");
        }
    }
}

#[test]
fn check_counts_and_repair_fixes_mismatches_raid6_locates_bad_data() {
    for c in [
        cfg(Level::Raid5, None, 4),
        cfg(Level::Raid6, None, 5),
        cfg(Level::Raid6, Some(0), 6),
        cfg(Level::Raid1, None, 3),
        cfg(Level::Raid10, Some(0x102), 4),
    ] {
        let mems = mem_members(&c, "sc");
        let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
        let model = fill(&a, 6);
        assert_eq!(a.check().unwrap(), 0, "{c:?}: fresh array has mismatches");
        // Silently corrupt 4 KiB of member 2's data area.
        let off = 64 * 512 + 40 * 1024;
        mems[2].write_at(&[0x5au8; 4096], off).unwrap();
        // md counts parity levels per page and mirrors per resync block (64 KiB at most).
        let want = match c.level {
            Level::Raid10 => c.chunk_sectors.min(128),
            Level::Raid1 => 128,
            _ => 8,
        };
        let m = a.check().unwrap();
        assert_eq!(m, want, "{c:?}: check should count {want} sectors, got {m}");
        assert_eq!(a.check().unwrap(), want, "{c:?}: check changed something");
        assert_eq!(a.repair().unwrap(), want, "{c:?}");
        assert_eq!(a.check().unwrap(), 0, "{c:?}: repair left mismatches");
        if c.level == Level::Raid6 {
            // raid6 repair located the bad block, so every byte is right again, whichever
            // member held data or parity there.
            assert!(
                read_all(&a) == model,
                "{c:?}: raid6 repair did not restore the data"
            );
        }
    }
}

/// md halves a member's corrected-read-error count for every hour without errors
/// (check_decay_read_errors), so only a member that keeps failing passes the limit of 20.
#[test]
fn corrected_read_errors_decay_hourly() {
    use std::sync::atomic::AtomicU64;
    let c = cfg(Level::Raid1, None, 2);
    let mems = mem_members(&c, "d");
    let flaky = Arc::new(FaultMember::new(mems[0].clone()));
    let mut devs = as_members(&mems);
    devs[0] = Some(flaky.clone());
    let a = uraid_engine::create(devs, &create_opts(&c)).unwrap();
    let model = fill(&a, 9);
    let now = Arc::new(AtomicU64::new(1_000_000));
    let clock = now.clone();
    a.set_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
    // Reads of the first 4 KiB fail on member 0 (and are answered by member 1).
    flaky.set_range(32 << 10, (32 << 10) + 4096);
    flaky.fail_reads.store(true, Ordering::SeqCst);
    let read_bad = |a: &Array| {
        let mut b = vec![0u8; 4096];
        a.read(0, &mut b).unwrap();
        assert!(b[..] == model[..4096]);
    };
    let count = |a: &Array| a.slot(MemberIdx(0)).corrected_reads.load(Ordering::SeqCst);
    for _ in 0..20 {
        read_bad(&a);
    }
    assert_eq!(count(&a), 20);
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::InSync);
    // An hour later the count has halved: 10 + 1, where 21 would have failed the member.
    now.fetch_add(3600, Ordering::SeqCst);
    read_bad(&a);
    assert_eq!(count(&a), 11);
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::InSync);
    // Ten more within the hour pass the limit.
    for _ in 0..10 {
        read_bad(&a);
    }
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::Faulty);
}

/// raid4/5/6 recovery in small pipelined passes (one pass's writes in flight with the next
/// one's reads) while a writer and a reader run: the rebuilt member must hold exactly what
/// the model says, as degraded reads through it show.
#[test]
fn pipelined_recovery_under_concurrent_io_rebuilds_exactly() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;
    let seeds: Vec<u64> = match std::env::var("URAID_SEED") {
        Ok(s) => vec![s.parse().expect("URAID_SEED is a number")],
        Err(_) if std::env::var("URAID_FULL").is_ok() => (1..=20).collect(),
        Err(_) => (1..=2).collect(),
    };
    let configs = [
        cfg(Level::Raid4, None, 4),
        cfg(Level::Raid5, None, 4),
        cfg(Level::Raid6, None, 5),
        cfg(Level::Raid6, Some(1), 6),
    ];
    for c in configs {
        for seed in seeds.iter().copied() {
            let run = std::panic::catch_unwind(|| {
                let mems = mem_members(&c, "p");
                let a =
                    Arc::new(uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap());
                // Passes of two chunks per member: many passes, each overlapped.
                a.tuning()
                    .expect("raid4/5/6")
                    .sync_batch_bytes
                    .store(2 * 16 * 512, Ordering::Relaxed);
                let model = Arc::new(Mutex::new(fill(&a, seed)));
                a.fail_member(MemberIdx(2)).unwrap();
                a.remove_member(MemberIdx(2)).unwrap();
                a.add_member(Arc::new(MemMember::new("new", 2 << 20)))
                    .unwrap();
                let stop = Arc::new(AtomicBool::new(false));
                let writer = {
                    let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut r = rng(seed ^ 0x77);
                        while !stop.load(Ordering::SeqCst) {
                            let (off, data) = random_write(&mut r, a.size_bytes(), 48 << 10);
                            let mut m = model.lock().unwrap();
                            a.write(off, &data).unwrap();
                            m[off as usize..off as usize + data.len()].copy_from_slice(&data);
                        }
                    })
                };
                let reader = {
                    let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut r = rng(seed ^ 0x99);
                        let mut buf = vec![0u8; 24 << 10];
                        while !stop.load(Ordering::SeqCst) {
                            let off = r.gen_range(0..a.size_bytes() - buf.len() as u64);
                            let m = model.lock().unwrap();
                            a.read(off, &mut buf).unwrap();
                            assert!(buf[..] == m[off as usize..off as usize + buf.len()]);
                        }
                    })
                };
                // Small steps so that the writer gets in between.
                let mut done = 0;
                while done < a.total_units() {
                    done += a.sync_step(SyncKind::Recovery, done, 16).unwrap().0;
                }
                a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
                stop.store(true, Ordering::SeqCst);
                writer.join().unwrap();
                reader.join().unwrap();
                assert_eq!(a.slot_state(MemberIdx(2)), SlotState::InSync);
                let model = model.lock().unwrap().clone();
                assert!(read_all(&a) == model, "data wrong after recovery");
                assert_eq!(a.check().unwrap(), 0, "parity wrong after recovery");
                // Read through the rebuilt member: fail as many others as the level allows.
                for r in [0, 1, 3] {
                    let mut trial = a.missing_roles();
                    trial.push(MemberIdx(r));
                    if a.personality().survives(&trial) {
                        a.fail_member(MemberIdx(r)).unwrap();
                    }
                }
                assert!(read_all(&a) == model, "rebuilt member holds wrong data");
            });
            if run.is_err() {
                panic!("failed: {c:?} with seed {seed} (replay: URAID_SEED={seed})");
            }
        }
    }
}

/// A member that lost its role (to a spare after failing, or to its replacement at the end
/// of a replace) stays as a faulty device until removed, as md keeps the rdev, so that
/// detail can name it and remove can take it out.
#[test]
fn a_member_that_lost_its_role_stays_faulty_until_removed() {
    let c = cfg(Level::Raid5, None, 4);
    let mems = mem_members(&c, "fk");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    let model = fill(&a, 9);
    assert!(a.faulty_devices().is_empty());
    a.add_member(Arc::new(MemMember::new("spare", 2 << 20)))
        .unwrap();
    a.fail_member(MemberIdx(2)).unwrap();
    assert_eq!(a.faulty_devices(), vec![("fk-mem2".to_string(), 2)]);
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    assert_eq!(a.faulty_devices(), vec![("fk-mem2".to_string(), 2)]);
    let events = a.subscribe();
    a.remove_faulty("fk-mem2").unwrap();
    assert!(a.faulty_devices().is_empty());
    assert!(events.try_iter().any(|e| e.name() == "DeviceDisappeared"));
    assert!(a.remove_faulty("fk-mem2").is_err());
    // After a replace, the old member is faulty until removed.
    a.add_member(Arc::new(MemMember::new("new", 2 << 20)))
        .unwrap();
    a.replace(MemberIdx(1), Some("new")).unwrap();
    a.run_replace(|_| {}).unwrap();
    assert_eq!(a.slot(MemberIdx(1)).device_name().as_deref(), Some("new"));
    assert_eq!(a.faulty_devices(), vec![("fk-mem1".to_string(), 1)]);
    assert!(read_all(&a) == model);
}
