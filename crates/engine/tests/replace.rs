//! md's --replace: a spare rebuilt beside an active member, which it then takes over from,
//! without the array ever losing redundancy; the old member or the replacement failing
//! midway; an interrupted replace resuming after a restart.
//!
//! Seeds: `URAID_SEED=n` replays one seed; `URAID_FULL=1` runs more seeds per config.

use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use uraid_core::superblock::{Superblock, FEATURE_RECOVERY_OFFSET, FEATURE_REPLACEMENT};
use uraid_core::{Level, MemberIdx};
use uraid_engine::{
    assemble, Array, AssembleOptions, Event, MemMember, Member, MemberOutcome, SlotState, SyncKind,
};
use uraid_sim::{FaultMember, Verdict};
use uraid_testkit::engine::*;

const MEMBER_BYTES: u64 = 2 << 20;
const ROLE: MemberIdx = MemberIdx(1);

fn cfg(level: Level, layout: Option<u32>, disks: usize) -> Config {
    Config {
        level,
        layout,
        disks,
        chunk_sectors: 16,
        member_bytes: vec![MEMBER_BYTES; disks],
    }
}

fn configs() -> Vec<Config> {
    vec![
        cfg(Level::Raid1, None, 2),
        cfg(Level::Raid1, None, 3),
        cfg(Level::Raid10, Some(0x102), 4),
        cfg(Level::Raid10, Some(0x201), 3),
        cfg(Level::Raid10, Some(0x10201), 4),
        cfg(Level::Raid4, None, 4),
        cfg(Level::Raid5, None, 4),
        cfg(Level::Raid6, None, 5),
        cfg(Level::Raid6, Some(1), 6),
    ]
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("URAID_SEED") {
        return vec![s.parse().expect("URAID_SEED is a number")];
    }
    let n = if std::env::var("URAID_FULL").is_ok() {
        20
    } else {
        2
    };
    (1..=n).collect()
}

/// Run `f` for every config and seed, naming the seed of a failure.
fn for_all(f: impl Fn(&Config, u64) + std::panic::RefUnwindSafe) {
    for c in configs() {
        for seed in seeds() {
            let r = std::panic::catch_unwind(|| f(&c, seed));
            if r.is_err() {
                panic!("failed: {c:?} with seed {seed} (replay: URAID_SEED={seed})");
            }
        }
    }
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut v = vec![0u8; a.size_bytes() as usize];
    a.read(0, &mut v).unwrap();
    v
}

/// An array filled with random data, its model, and a spare added.
fn setup(c: &Config, seed: u64, spare: Arc<dyn Member>) -> (Array, Vec<Arc<MemMember>>, Vec<u8>) {
    let mems = mem_members(c, "m");
    let a = uraid_engine::create(as_members(&mems), &create_opts(c)).unwrap();
    let mut model = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    a.add_member(spare).unwrap();
    (a, mems, model)
}

fn write_model(a: &Array, model: &Mutex<Vec<u8>>, r: &mut rand::rngs::StdRng) {
    let (off, data) = random_write(r, a.size_bytes(), 64 << 10);
    let mut m = model.lock().unwrap();
    a.write(off, &data).unwrap();
    m[off as usize..off as usize + data.len()].copy_from_slice(&data);
}

/// The array's data survives losing any other member as far as the level allows: the
/// replacement holds what it should.
fn assert_redundant(a: &Array, model: &[u8], what: &str) {
    assert_eq!(a.check().unwrap(), 0, "{what}: redundancy inconsistent");
    for r in (0..a.raid_disks()).filter(|&r| r != ROLE.0) {
        let mut trial = a.missing_roles();
        trial.push(MemberIdx(r));
        if a.personality().survives(&trial) {
            a.fail_member(MemberIdx(r)).unwrap();
        }
    }
    assert!(
        read_all(a) == model,
        "{what}: data wrong without the other members"
    );
}

fn drain(rx: &std::sync::mpsc::Receiver<Event>) -> Vec<Event> {
    rx.try_iter().collect()
}

#[test]
fn replace_under_concurrent_io_keeps_redundancy_and_data() {
    for_all(|c, seed| {
        let spare = Arc::new(MemMember::new("spare", MEMBER_BYTES));
        let (a, mems, model) = setup(c, seed, spare.clone());
        let a = Arc::new(a);
        let events = a.subscribe();
        assert_eq!(a.replace(ROLE, None).unwrap(), "spare");
        assert_eq!(a.replacing_roles(), vec![ROLE]);
        assert_eq!(a.slot(ROLE).replacement_name().as_deref(), Some("spare"));
        let model = Arc::new(Mutex::new(model));
        let stop = Arc::new(AtomicBool::new(false));
        // A writer and a reader run while the replacement is rebuilt.
        let writer = {
            let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut r = rng(seed ^ 0x5eed);
                while !stop.load(Ordering::SeqCst) {
                    write_model(&a, &model, &mut r);
                }
            })
        };
        let reader = {
            let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut r = rng(seed ^ 0xead);
                let mut buf = vec![0u8; 32 << 10];
                while !stop.load(Ordering::SeqCst) {
                    let off = r.gen_range(0..a.size_bytes() - buf.len() as u64);
                    let m = model.lock().unwrap();
                    a.read(off, &mut buf).unwrap();
                    assert!(
                        buf[..] == m[off as usize..off as usize + buf.len()],
                        "read at {off}"
                    );
                }
            })
        };
        // Small steps, with writes of our own between them, so that writes land on both
        // sides of the copy cursor.
        let mut r = rng(seed);
        let mut buf = vec![0u8; 16 << 10];
        let mut steps = 0;
        while let Some(p) = a.replace_step(ROLE, &mut buf).unwrap() {
            assert!(!a.is_degraded(), "degraded while replacing");
            assert_eq!(a.slot_state(ROLE), SlotState::InSync);
            assert!(p.done_units <= p.total_units);
            steps += 1;
            if steps % 16 == 0 {
                write_model(&a, &model, &mut r);
            }
        }
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        reader.join().unwrap();
        assert!(steps > 10);
        assert_eq!(
            a.stats.degraded_reads.load(Ordering::Relaxed),
            0,
            "reads were served degraded while replacing"
        );
        assert_eq!(a.slot(ROLE).device_name().as_deref(), Some("spare"));
        assert_eq!(a.slot_state(ROLE), SlotState::InSync);
        assert!(a.replacing_roles().is_empty());
        assert!(a.spares().is_empty());
        let ev: Vec<String> = drain(&events).iter().map(|e| e.name()).collect();
        for want in ["RebuildStarted", "RebuildFinished", "SpareActive", "Fail"] {
            assert!(ev.iter().any(|e| e == want), "no {want} event in {ev:?}");
        }
        // The old member is out: its role in the superblocks is faulty.
        let meta = a.meta();
        let old_sb = uraid_engine::read_superblock(mems[ROLE.0].as_ref()).unwrap();
        assert_eq!(
            meta.template().dev_roles[old_sb.dev_number as usize],
            uraid_core::superblock::ROLE_FAULTY
        );
        drop(meta);
        let model = model.lock().unwrap().clone();
        assert!(read_all(&a) == model, "data wrong after the replace");
        assert_redundant(&a, &model, "after replace");
    });
}

#[test]
fn old_member_failing_mid_replace_becomes_a_recovery() {
    for_all(|c, seed| {
        let spare = Arc::new(MemMember::new("spare", MEMBER_BYTES));
        let mems = mem_members(c, "m");
        // Role 1 sits behind a fault switch.
        let old = Arc::new(FaultMember::new(mems[ROLE.0].clone()));
        let mut devs = as_members(&mems);
        devs[ROLE.0] = Some(old.clone());
        let a = uraid_engine::create(devs, &create_opts(c)).unwrap();
        let mut model = vec![0u8; a.size_bytes() as usize];
        rng(seed).fill(&mut model[..]);
        a.write(0, &model).unwrap();
        a.add_member(spare).unwrap();
        a.replace(ROLE, Some("spare")).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut r = rng(seed);
        let half = MEMBER_BYTES / 512 / 2;
        while let Some(p) = a.replace_step(ROLE, &mut buf).unwrap() {
            if p.done_units >= half {
                break;
            }
        }
        // The old member dies on a write.
        old.fail_writes.store(true, Ordering::SeqCst);
        let m = Mutex::new(model);
        for _ in 0..100 {
            if a.replacing_roles().is_empty() {
                break;
            }
            write_model(&a, &m, &mut r);
        }
        let mut model = m.into_inner().unwrap();
        assert!(a.replacing_roles().is_empty());
        assert_eq!(a.slot(ROLE).device_name().as_deref(), Some("spare"));
        assert_eq!(a.slot_state(ROLE), SlotState::Recovering);
        let far = matches!(a.personality(), uraid_core::geometry::Personality::Raid10(g) if g.far_copies > 1);
        if !far {
            assert!(
                a.slot(ROLE).recovery_cursor() > 0,
                "the recovery should start where the copy got to"
            );
        }
        assert!(
            read_all(&a) == model,
            "data wrong after the old member failed"
        );
        let (off, data) = random_write(&mut r, a.size_bytes(), 64 << 10);
        a.write(off, &data).unwrap();
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        assert_eq!(a.slot_state(ROLE), SlotState::InSync);
        assert!(!a.is_degraded());
        assert!(read_all(&a) == model);
        assert_redundant(&a, &model, "after the recovery");
    });
}

#[test]
fn replacement_failing_mid_replace_leaves_the_old_member() {
    for_all(|c, seed| {
        let spare = Arc::new(FaultMember::new(Arc::new(MemMember::new(
            "spare",
            MEMBER_BYTES,
        ))));
        let (a, mems, model) = setup(c, seed, spare.clone());
        let events = a.subscribe();
        a.replace(ROLE, None).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let third = MEMBER_BYTES / 512 / 3;
        let m = Mutex::new(model);
        let mut r = rng(seed);
        while let Some(p) = a.replace_step(ROLE, &mut buf).unwrap() {
            assert!(!a.is_degraded());
            if p.done_units >= third {
                spare.fail_writes.store(true, Ordering::SeqCst);
                // Writes go on whatever the replacement does.
                write_model(&a, &m, &mut r);
            }
        }
        let model = m.into_inner().unwrap();
        assert!(a.replacing_roles().is_empty());
        assert_eq!(a.slot_state(ROLE), SlotState::InSync);
        assert_eq!(
            a.slot(ROLE).device_name(),
            Some(mems[ROLE.0].name()),
            "the old member keeps its role"
        );
        assert!(!a.is_degraded());
        let ev = drain(&events);
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::FailSpare { device } if device == "spare")),
            "no FailSpare in {ev:?}"
        );
        assert!(!ev.iter().any(|e| matches!(e, Event::Fail { .. })));
        assert_eq!(a.stats.degraded_reads.load(Ordering::Relaxed), 0);
        assert!(read_all(&a) == model);
        assert_redundant(&a, &model, "after the replacement failed");
    });
}

fn sb_of(m: &dyn Member) -> Superblock {
    uraid_engine::read_superblock(m).unwrap()
}

#[test]
fn interrupted_replace_resumes_after_restart() {
    for_all(|c, seed| {
        for old_present in [true, false] {
            let spare = Arc::new(MemMember::new("spare", MEMBER_BYTES));
            let (a, mems, mut model) = setup(c, seed, spare.clone());
            a.replace(ROLE, None).unwrap();
            let mut buf = vec![0u8; 32 << 10];
            let total = MEMBER_BYTES / 512;
            let mut at = 0;
            while let Some(p) = a.replace_step(ROLE, &mut buf).unwrap() {
                at = p.done_units;
                if at >= total / 3 {
                    break;
                }
            }
            // A write below and one above the cursor before the stop.
            let mut r = rng(seed);
            for _ in 0..4 {
                let (off, data) = random_write(&mut r, a.size_bytes(), 64 << 10);
                a.write(off, &data).unwrap();
                model[off as usize..off as usize + data.len()].copy_from_slice(&data);
            }
            a.stop().unwrap();
            drop(a);
            // The replacement's superblock, as md writes it.
            let sb = sb_of(spare.as_ref());
            assert_ne!(sb.feature_map & FEATURE_REPLACEMENT, 0);
            assert_ne!(sb.feature_map & FEATURE_RECOVERY_OFFSET, 0);
            assert_eq!(sb.recovery_offset, at, "recovery_offset in member sectors");
            assert_eq!(sb.dev_roles[sb.dev_number as usize], ROLE.0 as u16);
            let old_sb = sb_of(mems[ROLE.0].as_ref());
            assert_eq!(old_sb.feature_map & FEATURE_REPLACEMENT, 0);
            assert_eq!(old_sb.dev_roles[old_sb.dev_number as usize], ROLE.0 as u16);

            let mut devs: Vec<Arc<dyn Member>> = vec![spare.clone()];
            devs.extend(
                mems.iter()
                    .enumerate()
                    .filter(|&(i, _)| old_present || i != ROLE.0)
                    .map(|(_, m)| m.clone() as Arc<dyn Member>),
            );
            let (b, rep) = assemble(devs, &AssembleOptions::default()).unwrap();
            if old_present {
                assert_eq!(rep.members[0].outcome, MemberOutcome::Replacement(ROLE.0));
                assert_eq!(b.slot(ROLE).replacement_cursor_sectors(), Some(at));
                assert_eq!(b.slot_state(ROLE), SlotState::InSync);
                assert!(!b.is_degraded());
            } else {
                // Without its member the replacement carries on as a recovery.
                assert_eq!(rep.members[0].outcome, MemberOutcome::Active(ROLE.0));
                assert_eq!(b.slot_state(ROLE), SlotState::Recovering);
                assert!(b.replacing_roles().is_empty());
            }
            assert!(
                read_all(&b) == model,
                "old_present={old_present}: reads wrong"
            );
            b.run_sync(SyncKind::Recovery, |_| {}).unwrap();
            assert_eq!(b.slot(ROLE).device_name().as_deref(), Some("spare"));
            assert_eq!(b.slot_state(ROLE), SlotState::InSync);
            assert!(b.replacing_roles().is_empty());
            let sb = sb_of(spare.as_ref());
            assert_eq!(
                sb.feature_map & (FEATURE_REPLACEMENT | FEATURE_RECOVERY_OFFSET),
                0
            );
            assert!(read_all(&b) == model);
            assert_redundant(&b, &model, "after the resumed replace");
        }
    });
}

#[test]
fn replace_refuses_what_md_refuses() {
    let c = cfg(Level::Raid5, None, 4);
    let mems = mem_members(&c, "m");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    // No spare.
    let e = a.replace(ROLE, None).unwrap_err().to_string();
    assert!(e.contains("no spare"), "{e}");
    a.add_member(Arc::new(MemMember::new("spare", MEMBER_BYTES)))
        .unwrap();
    let e = a.replace(ROLE, Some("other")).unwrap_err().to_string();
    assert!(e.contains("not a spare"), "{e}");
    let e = a.replace(MemberIdx(9), None).unwrap_err().to_string();
    assert!(e.contains("no member"), "{e}");
    // A faulty member is not replaced but recovered.
    a.fail_member(MemberIdx(2)).unwrap();
    let e = a.replace(MemberIdx(2), None).unwrap_err().to_string();
    assert!(e.contains("in-sync"), "{e}");
}

/// A member with a bad range (`bad`) that reads fail on until it is rewritten (a disk
/// remapping a sector on write).
fn bad_until_written(inner: Arc<MemMember>, bad: Arc<Mutex<Option<(u64, u64)>>>) -> FaultMember {
    FaultMember::new(inner)
        .zeroes_by_writing()
        .with_hook(move |io| {
            let mut bad = bad.lock().unwrap();
            if let Some((s, e)) = *bad {
                if io.write {
                    if io.offset <= s && io.offset + io.len >= e {
                        *bad = None;
                    }
                } else if io.offset < e && io.offset + io.len > s {
                    return Verdict::Fail(std::io::Error::other("injected bad sector"));
                }
            }
            Verdict::Pass
        })
}

#[test]
fn read_error_on_the_old_member_is_repaired_from_redundancy() {
    for_all(|c, seed| {
        let mems = mem_members(c, "m");
        let bad = Arc::new(Mutex::new(None));
        let old = Arc::new(bad_until_written(mems[ROLE.0].clone(), bad.clone()));
        let mut devs = as_members(&mems);
        devs[ROLE.0] = Some(old.clone());
        let a = uraid_engine::create(devs, &create_opts(c)).unwrap();
        let mut model = vec![0u8; a.size_bytes() as usize];
        rng(seed).fill(&mut model[..]);
        a.write(0, &model).unwrap();
        a.add_member(Arc::new(MemMember::new("spare", MEMBER_BYTES)))
            .unwrap();
        let events = a.subscribe();
        // One bad sector somewhere in the data area (data offset 64 sectors).
        let sector = 64 + rng(seed).gen_range(0..(MEMBER_BYTES / 512 - 200));
        *bad.lock().unwrap() = Some((sector * 512, sector * 512 + 512));
        a.replace(ROLE, None).unwrap();
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        assert_eq!(a.slot(ROLE).device_name().as_deref(), Some("spare"));
        assert_eq!(a.slot_state(ROLE), SlotState::InSync);
        let ev: Vec<String> = drain(&events).iter().map(|e| e.name()).collect();
        let far = matches!(a.personality(), uraid_core::geometry::Personality::Raid10(g) if g.far_copies > 1);
        if !far {
            assert!(bad.lock().unwrap().is_none(), "bad sector not rewritten");
            assert!(
                !ev.iter().any(|e| e == "DegradedArray"),
                "the old member was failed over one bad sector: {ev:?}"
            );
        }
        assert!(read_all(&a) == model);
        assert_redundant(&a, &model, "after a repaired read error");
    });
}

/// mdadm reads a replacement's superblock as md's: "Replacement device" in the role's slot.
#[test]
fn mdadm_examine_shows_the_replacement() {
    use uraid_engine::{DirectMode, FileMember};
    if !uraid_testkit::need_tool("mdadm", "mdadm_examine_shows_the_replacement") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uraid-repl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let open = |name: &str| -> Arc<dyn Member> {
        let p = dir.join(name);
        std::fs::File::create(&p).unwrap().set_len(8 << 20).unwrap();
        Arc::new(FileMember::open(&p, DirectMode::Off).unwrap())
    };
    let c = cfg(Level::Raid5, None, 3);
    let members: Vec<Option<Arc<dyn Member>>> =
        (0..3).map(|i| Some(open(&format!("m{i}.img")))).collect();
    let a = uraid_engine::create(members, &create_opts(&c)).unwrap();
    a.write(0, &vec![3u8; 1 << 20]).unwrap();
    a.add_member(open("new.img")).unwrap();
    a.replace(ROLE, None).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..20 {
        a.replace_step(ROLE, &mut buf).unwrap();
    }
    a.stop().unwrap();
    drop(a);
    let out = std::process::Command::new("mdadm")
        .arg("--examine")
        .arg(dir.join("new.img"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Replacement device 1"), "mdadm -E:\n{text}");
    assert!(text.contains("Recovery Offset"), "mdadm -E:\n{text}");
}

/// After an unclean stop a replacement starts its copy again (writes in flight at the crash
/// may have reached only one of the two), and one whose superblock is behind is stale.
#[test]
fn unclean_restart_copies_again_and_a_stale_replacement_is_left_out() {
    let c = cfg(Level::Raid5, None, 4);
    let spare = Arc::new(MemMember::new("spare", MEMBER_BYTES));
    let (a, mems, mut model) = setup(&c, 7, spare.clone());
    a.replace(ROLE, None).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..10 {
        a.replace_step(ROLE, &mut buf).unwrap();
    }
    // A write marks the array dirty; persist the copy position, then "crash" (no stop).
    let (off, data) = random_write(&mut rng(70), a.size_bytes(), 64 << 10);
    a.write(off, &data).unwrap();
    model[off as usize..off as usize + data.len()].copy_from_slice(&data);
    a.write_superblocks().unwrap();
    let at = sb_of(spare.as_ref()).recovery_offset;
    assert!(at > 0);
    let images: Vec<Vec<u8>> = mems.iter().map(|m| m.snapshot()).collect();
    let spare_image = spare.snapshot();
    std::mem::forget(a); // no clean stop
    let restore = |name: &str, img: &[u8]| {
        let m = Arc::new(MemMember::new(name, img.len() as u64));
        m.write_at(img, 0).unwrap();
        m
    };
    let mut devs: Vec<Arc<dyn Member>> = vec![restore("spare", &spare_image)];
    devs.extend(
        images
            .iter()
            .enumerate()
            .map(|(i, img)| restore(&format!("m-mem{i}"), img) as Arc<dyn Member>),
    );
    let (b, rep) = assemble(devs.clone(), &AssembleOptions::default()).unwrap();
    assert!(rep.unclean);
    assert_eq!(rep.members[0].outcome, MemberOutcome::Replacement(ROLE.0));
    assert_eq!(b.slot(ROLE).replacement_cursor_sectors(), Some(0));
    b.resync().unwrap();
    b.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    assert_eq!(b.slot(ROLE).device_name().as_deref(), Some("spare"));
    assert!(read_all(&b) == model);
    assert_redundant(&b, &model, "after an unclean restart mid-replace");

    // A replacement whose superblock is behind the others is stale.
    let c2 = cfg(Level::Raid1, None, 2);
    let spare2 = Arc::new(MemMember::new("spare2", MEMBER_BYTES));
    let (a2, mems2, _) = setup(&c2, 8, spare2.clone());
    a2.replace(ROLE, None).unwrap();
    a2.replace_step(ROLE, &mut buf).unwrap();
    a2.stop().unwrap();
    let behind = spare2.snapshot();
    a2.write_superblocks().unwrap();
    a2.stop().unwrap();
    drop(a2);
    let old_spare = restore("spare2", &behind);
    let mut devs2: Vec<Arc<dyn Member>> = vec![old_spare];
    devs2.extend(mems2.iter().map(|m| m.clone() as Arc<dyn Member>));
    let (b2, rep2) = assemble(devs2, &AssembleOptions::default()).unwrap();
    assert_eq!(rep2.members[0].outcome, MemberOutcome::Stale);
    assert!(b2.replacing_roles().is_empty());
}
