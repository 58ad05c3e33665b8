//! md's run-time knobs (`Array::set_tunable`, `uraid set`): values take effect, bad input gets
//! a clear error and changes nothing, and a write under each setting reads back.

use uraid_core::Level;
use uraid_engine::Array;
use uraid_testkit::engine::*;

fn array(level: Level, disks: usize) -> Array {
    let cfg = Config {
        level,
        layout: None,
        disks,
        chunk_sectors: 16,
        member_bytes: vec![1 << 20; disks],
    };
    uraid_engine::create(as_members(&mem_members(&cfg, "t")), &create_opts(&cfg)).expect("create")
}

fn get(a: &Array, name: &str) -> String {
    a.tunables()
        .into_iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no tunable {name}"))
}

#[test]
fn knobs_take_effect_and_show_md_names() {
    let a = array(Level::Raid5, 4);
    assert_eq!(get(&a, "stripe_cache_size"), "256");
    assert_eq!(get(&a, "group_thread_cnt"), "0");
    assert_eq!(get(&a, "rmw_level"), "1");
    assert_eq!(get(&a, "skip_copy"), "1");
    assert_eq!(get(&a, "join_wait_us"), "500");
    for (k, v) in [
        ("stripe_cache_size", "1024"),
        ("group_thread_cnt", "3"),
        ("rmw_level", "2"),
        ("skip_copy", "0"),
        ("batching", "0"),
        ("join_wait_us", "0"),
        ("join_wait_us", "2000"),
        ("sync_threads", "1"),
        ("sync_threads", "3"),
    ] {
        a.set_tunable(k, v).unwrap();
        assert_eq!(get(&a, k), v, "{k}");
        let data: Vec<u8> = (0..20480u32)
            .map(|i| (i * 7 + v.len() as u32) as u8)
            .collect();
        a.write(4096, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        a.read(4096, &mut back).unwrap();
        assert_eq!(back, data, "read back after {k}={v}");
    }
    assert_eq!(a.stripe_cache().size(), 1024);
    assert_eq!(a.group_thread_cnt(), 3);
    a.set_tunable("group_thread_cnt", "0").unwrap();
    assert_eq!(a.group_thread_cnt(), 0);
}

#[test]
fn bad_values_are_refused_and_change_nothing() {
    let a = array(Level::Raid6, 5);
    for (k, v) in [
        ("stripe_cache_size", "7"),
        ("stripe_cache_size", "32769"),
        ("stripe_cache_size", "lots"),
        ("rmw_level", "3"),
        ("skip_copy", "2"),
        ("join_wait_us", "10000001"),
        ("sync_threads", "0"),
        ("sync_threads", "17"),
        ("group_thread_cnt", "-1"),
        ("no_such_knob", "1"),
    ] {
        let e = a.set_tunable(k, v).expect_err(&format!("{k}={v} accepted"));
        assert!(e.to_string().contains(k), "{k}={v}: unclear error {e}");
    }
    assert_eq!(get(&a, "stripe_cache_size"), "256");
    assert_eq!(get(&a, "rmw_level"), "1");
    assert_eq!(get(&a, "skip_copy"), "1");
    // Mirrors have no stripe cache; their one knob is the sync threads.
    let m = array(Level::Raid1, 2);
    assert!(m.set_tunable("stripe_cache_size", "512").is_err());
    let default = default_sync_threads();
    assert_eq!(m.tunables(), vec![("sync_threads", default.to_string())]);
    m.set_tunable("sync_threads", "3").unwrap();
    assert_eq!(get(&m, "sync_threads"), "3");
    for bad in ["0", "17", "two"] {
        let e = m.set_tunable("sync_threads", bad).unwrap_err();
        assert!(e.to_string().contains("sync_threads"), "{bad}: {e}");
    }
}

/// The write-path knobs are raid4/5/6's, kept in the level's conf: `set_tunable` reaches
/// them there and the mirrors and raid0 have none.
#[test]
fn write_path_knobs_live_in_the_parity_level() {
    use std::sync::atomic::Ordering;
    let a = array(Level::Raid6, 5);
    a.set_tunable("rmw_level", "2").unwrap();
    a.set_tunable("skip_copy", "0").unwrap();
    a.set_tunable("batching", "0").unwrap();
    let t = a.tuning().expect("raid6 has the write-path knobs");
    assert_eq!(t.rmw_level.load(Ordering::Relaxed), 2);
    assert!(!t.skip_copy.load(Ordering::Relaxed));
    assert!(!t.batching.load(Ordering::Relaxed));
    assert_eq!(t.sync_batch_bytes.load(Ordering::Relaxed), 1 << 20);
    a.set_tunable("sync_threads", "4").unwrap();
    assert_eq!(t.sync_threads.load(Ordering::Relaxed), 4);
    for (level, disks) in [(Level::Raid0, 2), (Level::Raid1, 2), (Level::Raid10, 4)] {
        let m = array(level, disks);
        assert!(m.tuning().is_none(), "{level:?} has raid5's knobs");
        assert!(m.set_tunable("rmw_level", "0").is_err(), "{level:?}");
        assert_eq!(
            m.set_tunable("sync_threads", "1").is_ok(),
            level != Level::Raid0,
            "{level:?}: the mirrors have sync threads, raid0 has no sync"
        );
    }
}

/// What `sync_threads` starts at: 2 on a machine with two CPUs or more.
fn default_sync_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}
