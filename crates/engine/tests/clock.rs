//! The array's one clock: what goes on disk (ctime, utime) and the write-back age that
//! reclaim writes out by both read the clock given at create and assemble.

use std::sync::Arc;
use std::time::Duration;
use uraid_core::Level;
use uraid_engine::read_superblock;
use uraid_engine::{assemble, AssembleOptions, ManualClock, MemMember, Member};
use uraid_engine::{JournalMode, PERIODIC_AGE};
use uraid_testkit::engine::*;

const T0: u64 = 1_600_000_000;

fn raid5() -> Config {
    Config {
        level: Level::Raid5,
        layout: None,
        disks: 4,
        chunk_sectors: 16,
        member_bytes: vec![2 << 20; 4],
    }
}

#[test]
fn superblock_times_come_from_the_array_clock() {
    let c = raid5();
    let mems = mem_members(&c, "ck");
    let clock = ManualClock::new(T0);
    let mut o = create_opts(&c);
    o.clock = clock.clock();
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    let sb = read_superblock(mems[0].as_ref()).unwrap();
    assert_eq!(sb.ctime, T0, "ctime is not the clock's");
    clock.advance(Duration::from_secs(42));
    a.write(0, &[1u8; 4096]).unwrap();
    let sb = read_superblock(mems[0].as_ref()).unwrap();
    assert_eq!(
        sb.utime,
        T0 + 42,
        "utime of the dirtying write is not the clock's"
    );
    assert_eq!(sb.ctime, T0);
    a.stop().unwrap();
    drop(a);

    // Assembled with another clock: the next update carries that clock's time.
    let later = ManualClock::new(T0 + 1_000);
    let devs: Vec<Arc<dyn Member>> = mems.iter().map(|m| m.clone() as _).collect();
    let opts = AssembleOptions {
        clock: later.clock(),
        ..AssembleOptions::default()
    };
    let (b, _) = assemble(devs, &opts).unwrap();
    b.write(4096, &[2u8; 4096]).unwrap();
    let sb = read_superblock(mems[1].as_ref()).unwrap();
    assert_eq!(sb.utime, T0 + 1_000);
    assert_eq!(sb.ctime, T0, "assembly changed the creation time");
}

#[test]
fn write_back_stripes_go_out_once_old_on_the_array_clock() {
    let c = raid5();
    let mems = mem_members(&c, "ckwb");
    let journal = Arc::new(MemMember::new("journal", 8 << 20));
    let clock = ManualClock::new(T0);
    let mut o = create_opts(&c);
    o.journal = Some(journal);
    o.clock = clock.clock();
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    a.set_journal_mode(JournalMode::WriteBack).unwrap();
    // One page of one stripe: cached, not a full stripe.
    a.write(0, &[3u8; 4096]).unwrap();
    let cached = || a.writeback_stats().unwrap().cached_stripes;
    assert_eq!(cached(), 1);
    a.writeback_periodic().unwrap();
    assert_eq!(cached(), 1, "written out with no time passed");
    clock.advance(PERIODIC_AGE - Duration::from_millis(1));
    a.writeback_periodic().unwrap();
    assert_eq!(cached(), 1, "written out before it was old");
    clock.advance(Duration::from_millis(1));
    a.writeback_periodic().unwrap();
    assert_eq!(cached(), 0, "an old stripe stayed cached");
    let mut got = vec![0u8; 4096];
    a.read(0, &mut got).unwrap();
    assert_eq!(got, vec![3u8; 4096]);
}
