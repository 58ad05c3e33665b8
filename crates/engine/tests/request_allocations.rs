//! The healthy request paths allocate nothing per request (or, for a raid4/5/6 write that
//! reads the rest of its stripe, one block map): a stripe's member IOs, its map, its plan
//! and its parity sources are kept inline (issue 18: allocation was 6% of a raid5 4 KiB
//! randrw profile and took the partition lock's time when a stripe became active).
//!
//! A counting global allocator counts the allocations made on the test's own thread (the
//! engine runs a request on its caller's thread over memory members), so tests running
//! beside it in other threads do not disturb the count. No timing is involved.

use rand::Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use uraid_core::Level;
use uraid_testkit::engine::*;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

const REQUESTS: u64 = 400;

/// Allocations per request of `REQUESTS` random 4 KiB reads and then writes, after as many
/// of each to warm the array up (stripe heads, buffer pools, maps at their size).
fn per_request(level: Level, disks: usize) -> (f64, f64) {
    let mut cfg = Config::new(level, None, disks);
    cfg.chunk_sectors = 128;
    cfg.member_bytes = vec![8 << 20; disks];
    let mems = mem_members(&cfg, "alloc");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&cfg)).unwrap();
    let blocks = a.size_bytes() / 4096;
    let mut rng = rng(18);
    let mut buf = vec![0u8; 4096];
    let run = |write: bool, n: u64, rng: &mut rand::rngs::StdRng, buf: &mut Vec<u8>| {
        let before = allocations();
        for _ in 0..n {
            let at = rng.gen_range(0..blocks) * 4096;
            if write {
                buf[0] = buf[0].wrapping_add(1);
                a.write(at, buf).unwrap();
            } else {
                a.read(at, buf).unwrap();
            }
        }
        (allocations() - before) as f64 / n as f64
    };
    run(true, REQUESTS, &mut rng, &mut buf);
    run(false, REQUESTS, &mut rng, &mut buf);
    let reads = run(false, REQUESTS, &mut rng, &mut buf);
    let writes = run(true, REQUESTS, &mut rng, &mut buf);
    (reads, writes)
}

#[test]
fn healthy_4k_requests_allocate_nothing_or_one_block_map() {
    for (level, disks, writes_max) in [
        (Level::Raid1, 2, 0.05),
        (Level::Raid10, 4, 0.05),
        (Level::Raid5, 4, 1.05),
        (Level::Raid6, 5, 1.05),
    ] {
        let (reads, writes) = per_request(level, disks);
        println!(
            "{level} on {disks}: {reads:.2} allocations per 4 KiB read, {writes:.2} per write"
        );
        assert!(
            reads < 0.05,
            "{level} on {disks}: {reads:.2} allocations per 4 KiB read (none expected)"
        );
        assert!(
            writes <= writes_max,
            "{level} on {disks}: {writes:.2} allocations per 4 KiB write (at most {writes_max})"
        );
    }
}
