//! md's daemons driven without the CLI: spare activation and rebuild, safe mode and the
//! bitmap daemon on a virtual clock, and a stop that interrupts a running sync.

use rand::Rng;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uraid_core::{Level, MemberIdx};
use uraid_engine::read_superblock;
use uraid_engine::{
    assemble, AddOutcome, Array, AssembleOptions, DaemonNote, DaemonOptions, ManualClock,
    MemMember, Member, SlotState, SyncLimits,
};
use uraid_testkit::engine::*;

fn raid5() -> Config {
    Config {
        level: Level::Raid5,
        layout: None,
        disks: 4,
        chunk_sectors: 16,
        member_bytes: vec![2 << 20; 4],
    }
}

fn fill(a: &Array, seed: u64) -> Vec<u8> {
    let mut model = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    model
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut got = vec![0u8; a.size_bytes() as usize];
    a.read(0, &mut got).unwrap();
    got
}

/// Notes the daemons gave, and options that collect them.
fn collecting(opts: DaemonOptions) -> (DaemonOptions, Arc<Mutex<Vec<DaemonNote>>>) {
    let notes = Arc::new(Mutex::new(Vec::new()));
    let n = notes.clone();
    let opts = DaemonOptions {
        notify: Some(Arc::new(move |note: &DaemonNote| {
            n.lock().unwrap().push(note.clone())
        })),
        ..opts
    };
    (opts, notes)
}

/// Waits (bounded, so a hang fails instead of blocking) until `done` holds.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_daemons_give_a_spare_the_missing_role_and_rebuild_it() {
    let c = raid5();
    let mems = mem_members(&c, "dsp");
    let clock = ManualClock::new(1_700_000_000);
    let mut o = create_opts(&c);
    o.clock = clock.clock();
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    let model = fill(&a, 7);
    let spare = Arc::new(MemMember::new("spare", 2 << 20));
    assert_eq!(a.add_member(spare.clone()).unwrap(), AddOutcome::Spare);
    a.stop().unwrap();
    drop(a);

    // Member 2 is gone at the next assembly; the spare is there, waiting.
    let mut devs: Vec<Arc<dyn Member>> = mems
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, m)| m.clone() as Arc<dyn Member>)
        .collect();
    devs.push(spare.clone());
    let opts = AssembleOptions {
        clock: clock.clock(),
        ..AssembleOptions::default()
    };
    let (a, _) = assemble(devs, &opts).unwrap();
    let a = Arc::new(a);
    assert!(a.is_degraded());
    assert_eq!(a.spares(), vec!["spare".to_string()]);

    let (dopts, notes) = collecting(DaemonOptions::default());
    let d = a.start_daemons(dopts).unwrap();
    wait_for("the rebuild onto the spare", || {
        !d.sync_running() && a.recovering_roles().is_empty()
    });
    assert!(!a.is_degraded(), "the spare did not take the role");
    assert_eq!(a.slot_state(MemberIdx(2)), SlotState::InSync);
    assert!(a.spares().is_empty());
    let notes = notes.lock().unwrap().clone();
    assert!(
        notes.contains(&DaemonNote::SpareActivated {
            role: MemberIdx(2),
            device: "spare".into()
        }),
        "{notes:?}"
    );
    assert!(notes.contains(&DaemonNote::RecoveryFinished), "{notes:?}");
    d.stop();
    assert!(read_all(&a) == model, "the rebuilt array lost data");
    // The rebuilt spare holds its share: fail another member and read through it.
    a.fail_member(MemberIdx(0)).unwrap();
    assert!(read_all(&a) == model, "the spare's rebuilt data is wrong");
}

#[test]
fn a_member_failing_under_the_daemons_is_rebuilt_onto_a_spare() {
    let c = raid5();
    let mems = mem_members(&c, "dfl");
    let mut o = create_opts(&c);
    o.clock = ManualClock::new(0).clock();
    let a = Arc::new(uraid_engine::create(as_members(&mems), &o).unwrap());
    let model = fill(&a, 8);
    let (dopts, notes) = collecting(DaemonOptions::default());
    let d = a.start_daemons(dopts).unwrap();
    let spare = Arc::new(MemMember::new("spare", 2 << 20));
    assert_eq!(a.add_member(spare).unwrap(), AddOutcome::Spare);
    a.fail_member(MemberIdx(1)).unwrap();
    wait_for("the recovery after the failure", || {
        notes
            .lock()
            .unwrap()
            .contains(&DaemonNote::RecoveryFinished)
    });
    wait_for("the sync thread to end", || !d.sync_running());
    assert!(!a.is_degraded());
    assert!(a.recovering_roles().is_empty());
    drop(d);
    assert!(read_all(&a) == model);
}

#[test]
fn safe_mode_marks_the_array_clean_after_the_delay_on_the_array_clock() {
    let c = raid5();
    let mems = mem_members(&c, "dsm");
    let clock = ManualClock::new(0);
    let mut o = create_opts(&c);
    o.clock = clock.clock();
    let a = Arc::new(uraid_engine::create(as_members(&mems), &o).unwrap());
    let on_disk_clean = || read_superblock(mems[0].as_ref()).unwrap().is_clean();
    let d = a.start_daemons(DaemonOptions::default()).unwrap();
    a.write(0, &[5u8; 4096]).unwrap();
    assert!(!on_disk_clean(), "the write did not mark the array active");
    // The clock stands still: however often the daemon looks, the array stays active.
    d.run_pass();
    assert!(!on_disk_clean(), "marked clean with no time passed");
    clock.advance(Duration::from_millis(199));
    d.run_pass();
    assert!(!on_disk_clean(), "marked clean before safe_mode_delay");
    clock.advance(Duration::from_millis(1));
    d.run_pass();
    assert!(on_disk_clean(), "not marked clean after safe_mode_delay");
    assert!(!a.is_dirty());
    // The next write marks it active again, before it reaches a member.
    a.write(4096, &[6u8; 4096]).unwrap();
    assert!(!on_disk_clean());
    d.stop();
    let mut got = vec![0u8; 8192];
    a.read(0, &mut got).unwrap();
    assert_eq!(&got[..4096], &[5u8; 4096][..]);
    assert_eq!(&got[4096..], &[6u8; 4096][..]);
}

#[test]
fn the_bitmap_daemon_runs_on_its_period_of_the_array_clock() {
    let c = Config {
        level: Level::Raid1,
        layout: None,
        disks: 2,
        chunk_sectors: 0,
        member_bytes: vec![4 << 20; 2],
    };
    let mems = mem_members(&c, "dbm");
    let clock = ManualClock::new(0);
    let mut o = create_opts(&c);
    o.clock = clock.clock();
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(64 << 10);
    let a = Arc::new(uraid_engine::create(as_members(&mems), &o).unwrap());
    let every = Duration::from_secs(u64::from(a.bitmap_daemon_sleep_secs().unwrap()));
    let opts = DaemonOptions {
        // Safe mode would clear idle bits too; keep it out of this test.
        safe_mode_delay: Duration::from_secs(1 << 30),
        ..DaemonOptions::default()
    };
    let d = a.start_daemons(opts).unwrap();
    d.run_pass(); // notes when the period starts
    a.write(0, &[1u8; 4096]).unwrap();
    let dirty = a.bitmap_dirty_chunks().unwrap().0;
    assert!(dirty >= 1);
    clock.advance(every - Duration::from_millis(1));
    d.run_pass();
    // One period: one daemon pass, which only notes the chunks idle.
    clock.advance(Duration::from_millis(1));
    d.run_pass();
    assert_eq!(
        a.bitmap_dirty_chunks().unwrap().0,
        dirty,
        "cleared too early"
    );
    clock.advance(every - Duration::from_millis(1));
    d.run_pass();
    assert_eq!(
        a.bitmap_dirty_chunks().unwrap().0,
        dirty,
        "cleared before the period"
    );
    clock.advance(Duration::from_millis(1));
    d.run_pass();
    assert_eq!(
        a.bitmap_dirty_chunks().unwrap().0,
        0,
        "the daemon left bits"
    );
    d.stop();
}

#[test]
fn stopping_the_daemons_interrupts_a_recovery_which_resumes_later() {
    // Two sync steps (32 MiB of array data each): a stop is always seen between them.
    let c = Config {
        member_bytes: vec![16 << 20; 4],
        ..raid5()
    };
    let mems = mem_members(&c, "dint");
    let a = Arc::new(uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap());
    let model = fill(&a, 9);
    a.fail_member(MemberIdx(3)).unwrap();
    a.remove_member(MemberIdx(3)).unwrap();
    let new = Arc::new(MemMember::new("new", 16 << 20));
    // 1 KiB/s on the system clock: each 32 MiB step would wait long; the stop must not.
    let opts = DaemonOptions {
        sync_limits: SyncLimits {
            min_kib_s: 1,
            max_kib_s: 1,
        },
        ..DaemonOptions::default()
    };
    let (opts, notes) = collecting(opts);
    let d = a.start_daemons(opts).unwrap();
    assert_eq!(
        a.add_member(new.clone()).unwrap(),
        AddOutcome::Recovering(MemberIdx(3))
    );
    d.start_recovery();
    assert!(d.sync_running());
    d.stop();
    assert_eq!(
        a.recovering_roles(),
        vec![MemberIdx(3)],
        "the stop did not interrupt the recovery"
    );
    assert!(!notes
        .lock()
        .unwrap()
        .contains(&DaemonNote::RecoveryFinished));
    let stopped: Vec<DaemonNote> = notes
        .lock()
        .unwrap()
        .iter()
        .filter(|n| matches!(n, DaemonNote::SyncStopped { .. }))
        .cloned()
        .collect();
    assert!(
        stopped.is_empty(),
        "an interruption was reported as an error: {stopped:?}"
    );
    // Daemons started again finish it.
    let (opts, notes) = collecting(DaemonOptions::default());
    let d = a.start_daemons(opts).unwrap();
    d.start_recovery();
    wait_for("the resumed recovery", || {
        !d.sync_running() && a.recovering_roles().is_empty()
    });
    assert!(!a.is_degraded());
    drop(d);
    let _ = notes;
    assert!(read_all(&a) == model);
    a.fail_member(MemberIdx(0)).unwrap();
    assert!(read_all(&a) == model, "the rebuilt member's data is wrong");
}
