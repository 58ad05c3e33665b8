//! The engine reads the simulated world's virtual time, never the real clock: superblock
//! times come from the simulated epoch and move only with simulated time.

use std::sync::Arc;
use std::time::Duration;
use uraid_engine::{create, read_superblock, CreateOptions, Level, Member};
use uraid_sim::{SimDisk, SimWorld};

/// 2024-01-01T00:00:00Z, the simulated world's start.
const EPOCH: u64 = 1_704_067_200;

#[test]
fn the_engine_clock_is_the_worlds_virtual_time() {
    let world = SimWorld::new();
    let clock = world.engine_clock();
    assert_eq!((clock.now_ms(), clock.wall_secs()), (0, EPOCH));
    world.clock.advance(2_500_000_000);
    assert_eq!((clock.now_ms(), clock.wall_secs()), (2_500, EPOCH + 2));
    // A throttled sync's sleep moves virtual time on instead of waiting.
    clock.sleep(Duration::from_secs(60));
    assert_eq!(clock.wall_secs(), EPOCH + 62);
}

#[test]
fn an_array_made_in_the_simulator_stamps_virtual_times() {
    let world = SimWorld::new();
    world.clock.advance(7_000_000_000);
    let disks: Vec<Arc<SimDisk>> = (0..3)
        .map(|i| Arc::new(SimDisk::new(format!("sim{i}"), 8 << 20, world.clone())))
        .collect();
    let mut opts = CreateOptions::new(Level::Raid5);
    opts.assume_clean = true;
    opts.clock = world.engine_clock();
    let devs = disks
        .iter()
        .map(|d| Some(d.clone() as Arc<dyn Member>))
        .collect();
    let a = create(devs, &opts).unwrap();
    world.clock.advance(3_000_000_000);
    a.write(0, &[0x5a; 4096]).unwrap();
    a.stop().unwrap();
    let sb = read_superblock(disks[0].as_ref()).unwrap();
    assert_eq!(sb.ctime, EPOCH + 7, "ctime is the virtual creation time");
    assert_eq!(sb.utime, EPOCH + 10, "utime moved with virtual time only");
}
