//! md's safe mode: an idle array is marked clean on disk, and the next write marks it
//! active again before it reaches a member.

use std::time::Duration;
use uraid_core::Level;
use uraid_engine::read_superblock;
use uraid_testkit::engine::*;

#[test]
fn idle_array_is_marked_clean_and_the_next_write_dirties_it() {
    let c = Config::new(Level::Raid5, None, 4);
    let mems = mem_members(&c, "sm");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    let on_disk_clean = || read_superblock(mems[0].as_ref()).unwrap().is_clean();
    assert!(on_disk_clean());
    a.write(0, &[7u8; 4096]).unwrap();
    assert!(
        !on_disk_clean(),
        "a write did not mark the superblock active first"
    );
    assert!(
        !a.safemode(Duration::from_secs(3600)).unwrap(),
        "marked clean before the delay"
    );
    assert!(!on_disk_clean());
    assert!(a.safemode(Duration::ZERO).unwrap());
    assert!(on_disk_clean(), "safe mode did not mark the array clean");
    assert!(!a.is_dirty());
    a.write(8192, &[9u8; 4096]).unwrap();
    assert!(
        !on_disk_clean(),
        "write after safe mode did not mark it active"
    );
    let events_before = read_superblock(mems[0].as_ref()).unwrap().events;
    assert!(a.safemode(Duration::ZERO).unwrap());
    assert!(read_superblock(mems[0].as_ref()).unwrap().events > events_before);
    let mut got = vec![0u8; 4096];
    a.read(8192, &mut got).unwrap();
    assert_eq!(got, vec![9u8; 4096]);
}
