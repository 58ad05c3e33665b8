//! md's safe mode: an idle array is marked clean on disk, and the next write marks it
//! active again before it reaches a member.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
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

/// A member that checks, before each write to its data area, that its superblock on disk
/// says active (not clean): a write must never reach a member while the array is marked
/// clean there.
struct Watch {
    inner: uraid_engine::MemMember,
    /// Where the data area starts; u64::MAX until the array is made.
    data_from: AtomicU64,
    data_writes: AtomicU64,
    while_clean: AtomicU64,
}

impl uraid_engine::Member for Watch {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if offset >= self.data_from.load(Ordering::SeqCst) {
            self.data_writes.fetch_add(1, Ordering::Relaxed);
            if read_superblock(&self.inner).unwrap().is_clean() {
                self.while_clean.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

/// Safe mode racing writers from several threads (the writes in flight are counted per
/// CPU): whenever a write reaches a member, that member's superblock says active, and safe
/// mode still marks the array clean in the gaps between writes.
#[test]
fn safe_mode_never_leaves_a_member_clean_under_a_write() {
    let c = Config::new(Level::Raid1, None, 2);
    let watches: Vec<Arc<Watch>> = c
        .member_bytes
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            Arc::new(Watch {
                inner: uraid_engine::MemMember::new(format!("race{i}"), b),
                data_from: AtomicU64::new(u64::MAX),
                data_writes: AtomicU64::new(0),
                while_clean: AtomicU64::new(0),
            })
        })
        .collect();
    let devs = watches
        .iter()
        .map(|w| Some(w.clone() as Arc<dyn uraid_engine::Member>))
        .collect();
    let a = uraid_engine::create(devs, &create_opts(&c)).unwrap();
    for (i, w) in watches.iter().enumerate() {
        let from = a.slot(uraid_core::MemberIdx(i)).data_offset_bytes();
        w.data_from.store(from, Ordering::SeqCst);
    }
    let size = a.size_bytes();
    let done = AtomicBool::new(false);
    let cleaned = AtomicU64::new(0);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let a = &a;
                s.spawn(move || {
                    for i in 0..200u64 {
                        let off = ((t * 7919 + i * 104_729) * 4096) % (size - 4096);
                        a.write(off / 4096 * 4096, &[t as u8 + 1; 4096]).unwrap();
                        if i % 8 == 0 {
                            // Gaps, so that safe mode finds the array idle now and then.
                            std::thread::sleep(Duration::from_micros(300));
                        }
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                if a.safemode(Duration::ZERO).unwrap() {
                    cleaned.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    let writes: u64 = watches
        .iter()
        .map(|w| w.data_writes.load(Ordering::Relaxed))
        .sum();
    let bad: u64 = watches
        .iter()
        .map(|w| w.while_clean.load(Ordering::Relaxed))
        .sum();
    assert!(writes >= 800, "{writes} member writes seen");
    assert_eq!(
        bad, 0,
        "{bad} of {writes} member writes found the superblock clean"
    );
    assert!(
        cleaned.load(Ordering::Relaxed) > 0,
        "safe mode never found the array idle: the race was not run"
    );
}
