//! Plugging: adjacent small writes from one submitter merge into larger requests (fewer
//! member IOs), the data is what the writes say, overlapping writes keep their order, and a
//! plug shared by threads loses nothing.

use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::atomic::Ordering;
use uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC;
use uraid_core::Level;
use uraid_engine::Array;
use uraid_testkit::engine::*;

fn seed() -> u64 {
    std::env::var("URAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64)
}

fn configs() -> Vec<Config> {
    let c = |level, layout, disks, chunk_sectors| Config {
        level,
        layout,
        disks,
        chunk_sectors,
        member_bytes: vec![2 << 20; disks],
    };
    vec![
        c(Level::Raid1, None, 2, 0),
        c(Level::Raid10, Some(0x102), 4, 128),
        c(Level::Raid5, Some(ALGORITHM_LEFT_SYMMETRIC), 4, 128),
        c(Level::Raid6, Some(ALGORITHM_LEFT_SYMMETRIC), 5, 128),
    ]
}

fn array(c: &Config, tag: &str) -> Array {
    let mems = mem_members(c, tag);
    uraid_engine::create(as_members(&mems), &create_opts(c)).expect("create")
}

fn member_writes(a: &Array) -> u64 {
    a.stats.member_writes.load(Ordering::SeqCst)
}

/// 256 adjacent 4 KiB writes (1 MiB), submitted in a random order.
#[test]
fn adjacent_small_writes_merge_into_fewer_member_ios() {
    let seed = seed();
    for c in configs() {
        let mut rng = rng(seed);
        let mut data = vec![0u8; 1 << 20];
        rng.fill(&mut data[..]);
        let mut order: Vec<usize> = (0..256).collect();
        order.shuffle(&mut rng);

        let direct = array(&c, "direct");
        let before = member_writes(&direct);
        for &i in &order {
            direct
                .write((i * 4096) as u64, &data[i * 4096..(i + 1) * 4096])
                .unwrap();
        }
        let direct_ios = member_writes(&direct) - before;

        let plugged = array(&c, "plugged");
        let before = member_writes(&plugged);
        let plug = plugged.plug();
        for &i in &order {
            plug.write((i * 4096) as u64, &data[i * 4096..(i + 1) * 4096])
                .unwrap();
        }
        plug.finish().unwrap();
        let plugged_ios = member_writes(&plugged) - before;

        let mut back = vec![0u8; 1 << 20];
        plugged.read(0, &mut back).unwrap();
        assert!(
            back == data,
            "{c:?}: plugged writes read back wrong (seed {seed})"
        );
        eprintln!(
            "{:?} x{}: {direct_ios} member writes unplugged, {plugged_ios} plugged",
            c.level, c.disks
        );
        assert!(
            plugged_ios < direct_ios,
            "{c:?}: {plugged_ios} member writes plugged, {direct_ios} unplugged (seed {seed})"
        );
    }
}

#[test]
fn overlapping_plugged_writes_keep_their_order_and_bad_ranges_are_refused() {
    let a = array(&configs()[0], "order");
    let plug = a.plug();
    plug.write(0, &[1u8; 8192]).unwrap();
    plug.write(8192, &[2u8; 4096]).unwrap();
    plug.write(4096, &[3u8; 4096]).unwrap();
    assert!(plug.write(a.size_bytes() - 512, &[0u8; 4096]).is_err());
    plug.finish().unwrap();
    let mut back = vec![0u8; 12288];
    a.read(0, &mut back).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 1));
    assert!(
        back[4096..8192].iter().all(|&b| b == 3),
        "the later write lost"
    );
    assert!(back[8192..].iter().all(|&b| b == 2));
}

/// Threads share one plug: contended writes go out unmerged, none is lost.
#[test]
fn a_shared_plug_loses_no_write() {
    let seed = seed();
    let a = array(&configs()[2], "shared");
    let plug = a.plug();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let plug = &plug;
            s.spawn(move || {
                let mut rng = rng(seed ^ t);
                for i in 0..64u64 {
                    let blk = t * 64 + i;
                    let mut buf = vec![0u8; 4096];
                    rng.fill(&mut buf[..8]);
                    buf[8..16].copy_from_slice(&blk.to_le_bytes());
                    plug.write(blk * 4096, &buf).unwrap();
                }
            });
        }
    });
    plug.finish().unwrap();
    for blk in 0..256u64 {
        let mut back = vec![0u8; 4096];
        a.read(blk * 4096, &mut back).unwrap();
        assert_eq!(
            u64::from_le_bytes(back[8..16].try_into().unwrap()),
            blk,
            "block {blk} lost (seed {seed})"
        );
    }
}
