//! Rebuild throughput against the raw sequential read bandwidth of one member, measured in
//! the same run (a benchmark, not a test).
//!
//! cargo run --release -p uraid-engine --example rebuild_bench -- [member MiB] [file dir]
//!
//! For raid5 (4 disks) and raid6 (6 disks), on memory members and on file members: fill the
//! array, time a sequential read of one whole member (the physical limit of a rebuild, which
//! must read every surviving member and write one), then fail a member, add a fresh one and
//! time the recovery.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use uraid_core::{Level, MemberIdx};
use uraid_engine::file::{DirectMode, FileMember};
use uraid_engine::{CreateOptions, MemMember, Member, SyncKind};

fn raw_read_mb_s(m: &dyn Member) -> f64 {
    let mut buf = uraid_engine::buf::AlignedBuf::new(1 << 20);
    let t = Instant::now();
    let mut off = 0;
    while off + (1 << 20) <= m.size_bytes() {
        m.read_at(&mut buf, off).unwrap();
        off += 1 << 20;
    }
    off as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn run(
    level: Level,
    disks: usize,
    members: Vec<Arc<dyn Member>>,
    spare: Arc<dyn Member>,
    label: &str,
) {
    let mut o = CreateOptions::new(level);
    o.chunk_sectors = Some(1024);
    o.assume_clean = true;
    let a = uraid_engine::create(members.iter().map(|m| Some(m.clone())).collect(), &o).unwrap();
    // Fill with non-zero data so that nothing is a hole.
    let mut buf = vec![0u8; 8 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    let mut off = 0;
    while off < a.size_bytes() {
        let n = (a.size_bytes() - off).min(buf.len() as u64) as usize;
        a.write(off, &buf[..n]).unwrap();
        off += n as u64;
    }
    a.flush().unwrap();
    let raw = raw_read_mb_s(members[2].as_ref());
    a.fail_member(MemberIdx(1)).unwrap();
    a.remove_member(MemberIdx(1)).unwrap();
    a.add_member(spare).unwrap();
    let rebuilt_bytes = a.geometry().dev_sectors * 512;
    let t = Instant::now();
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let speed = rebuilt_bytes as f64 / secs / 1e6;
    println!(
        "| {label} | raid{} {disks} disks | {} MiB | {raw:.0} | {speed:.0} | {:.2} |",
        level.md_level(),
        rebuilt_bytes >> 20,
        speed / raw
    );
    assert!(!a.is_degraded());
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let dir = PathBuf::from(
        args.get(2)
            .cloned()
            .unwrap_or_else(|| "/var/tmp/uraid-rebuild-bench".into()),
    );
    let size = (mib << 20) + (4 << 20);
    println!("| members | array | rebuilt | raw member read MB/s | rebuild MB/s | ratio |");
    println!("|---|---|---|---|---|---|");
    for (level, disks) in [(Level::Raid5, 4usize), (Level::Raid6, 6)] {
        let mems: Vec<Arc<dyn Member>> = (0..disks)
            .map(|i| Arc::new(MemMember::new(format!("m{i}"), size)) as Arc<dyn Member>)
            .collect();
        run(
            level,
            disks,
            mems,
            Arc::new(MemMember::new("spare", size)),
            "memory",
        );
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let open = |name: String| -> Arc<dyn Member> {
            let p = dir.join(name);
            std::fs::File::create(&p).unwrap().set_len(size).unwrap();
            Arc::new(FileMember::open(&p, DirectMode::Auto).unwrap())
        };
        let files: Vec<Arc<dyn Member>> = (0..disks).map(|i| open(format!("f{i}.img"))).collect();
        run(
            level,
            disks,
            files,
            open("spare.img".into()),
            "files (O_DIRECT)",
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
