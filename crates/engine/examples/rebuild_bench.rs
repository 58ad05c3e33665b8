//! Rebuild throughput against the raw sequential read bandwidth of one member, measured in
//! the same run (a benchmark, not a test).
//!
//! cargo run --release -p uraid-engine --example rebuild_bench -- [member MiB] [file dir] [memory|files|nbd|loop|opaque]
//!
//! URAID_SYNC_BATCH_KIB sets the member bytes per batched sync pass (`Array::tuning`), and
//! URAID_SYNC_THREADS the threads that run passes side by side (the `sync_threads` tunable).
//! URAID_REBUILD_RUNS (default 3) rebuilds that many times, each onto a fresh member, and
//! reports the median and every run.
//! URAID_REBUILD_LEVELS (for example `5,1`) runs only those levels.
//! URAID_PERF_CTL=FIFO writes `enable` and `disable` into FIFO around each rebuild, for
//! `perf record -D -1 --control fifo:FIFO`: a profile of the rebuilds alone.
//! URAID_FILL_PERCENT (default 100) writes only that share of the array, from its start: on
//! sparse file members (and loop devices on sparse files, memory members and NBD members,
//! which know the regions never written) the
//! rest stays a hole on every member, which the recovery zeroes on the new member instead
//! of rebuilding it.
//!
//! URAID_NBD_NO_SR=1 starts the nbd mode's servers without structured replies, hence
//! without block status (members that cannot say where they were never written).
//! The `opaque` mode runs memory members that hide where they were never written, as disks
//! do; URAID_ZERO_FIRST=1 zeroes the whole array through it (WRITE_ZEROES) before the
//! fill, after which the array itself knows what was not written since.
//!
//! For raid5 (4 disks), raid6 (6 disks), raid1 (2 disks) and raid10 (4 disks, near 2), on
//! memory members and on file members: fill the array, then time
//! - a sequential read of one whole member (the goal's reference: rebuild at 0.8x of it);
//! - the data movement a rebuild cannot avoid: every surviving member read and the new one
//!   written, all at once (one thread each). Members that share a device (files on one disk,
//!   memory behind one memory bus) share its bandwidth, so this is the rebuild's real limit.
//!
//! Then, as many times as URAID_REBUILD_RUNS says: fail a member, add a fresh one (written
//! over once beforehand, as a real disk that needs no page faults or block allocation) and
//! time the recovery.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{CreateOptions, MemMember, Member, SyncKind};
use uraid_engine::{DirectMode, FileMember};

fn raw_read_mb_s(m: &dyn Member) -> f64 {
    let mut buf = uraid_engine::AlignedBuf::new(1 << 20);
    let t = Instant::now();
    let mut off = 0;
    while off + (1 << 20) <= m.size_bytes() {
        m.read_at(&mut buf, off).unwrap();
        off += 1 << 20;
    }
    off as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// Read every member in `reads` and write `write` whole, concurrently; MB/s per member.
fn concurrent_mb_s(reads: &[Arc<dyn Member>], write: &Arc<dyn Member>) -> f64 {
    let size = write.size_bytes() / (1 << 20) * (1 << 20);
    let t = Instant::now();
    std::thread::scope(|s| {
        for m in reads {
            s.spawn(move || raw_read_mb_s(m.as_ref()));
        }
        s.spawn(move || overwrite(write.as_ref()));
    });
    size as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// Write the whole member once, in 1 MiB IOs.
fn overwrite(m: &dyn Member) {
    let buf = uraid_engine::AlignedBuf::new(1 << 20);
    let mut off = 0;
    while off + (1 << 20) <= m.size_bytes() {
        m.write_at(&buf, off).unwrap();
        off += 1 << 20;
    }
}

fn run(
    level: Level,
    disks: usize,
    members: Vec<Arc<dyn Member>>,
    spare: &dyn Fn(usize) -> Arc<dyn Member>,
    label: &str,
) {
    let mut o = CreateOptions::new(level);
    if level != Level::Raid1 {
        o.chunk_sectors = Some(1024);
    }
    o.assume_clean = true;
    let a = uraid_engine::create(members.iter().map(|m| Some(m.clone())).collect(), &o).unwrap();
    if let Some(kib) = std::env::var("URAID_SYNC_BATCH_KIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        // raid4/5/6 only: the mirrors sync in pieces of md's RESYNC_STEP.
        if let Some(t) = a.tuning() {
            t.sync_batch_bytes
                .store(kib << 10, std::sync::atomic::Ordering::Relaxed);
        }
    }
    if let Ok(n) = std::env::var("URAID_SYNC_THREADS") {
        a.set_tunable("sync_threads", &n).unwrap();
    }
    // Fill with non-zero data so that nothing is a hole.
    let mut buf = vec![0u8; 8 << 20];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    let pct: u64 = std::env::var("URAID_FILL_PERCENT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
        .min(100);
    if std::env::var("URAID_ZERO_FIRST").is_ok_and(|v| v == "1") {
        a.write_zeroes(0, a.size_bytes()).unwrap();
    }
    let fill = a.size_bytes() * pct / 100;
    let mut off = 0;
    while off < fill {
        let n = (fill - off).min(buf.len() as u64) as usize;
        a.write(off, &buf[..n]).unwrap();
        off += n as u64;
    }
    a.flush().unwrap();
    let raw = raw_read_mb_s(members[0].as_ref());
    let first = spare(0);
    overwrite(first.as_ref());
    let survivors: Vec<Arc<dyn Member>> = members
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 1)
        .map(|(_, m)| m.clone())
        .collect();
    let floor = concurrent_mb_s(&survivors, &first);
    let runs: usize = std::env::var("URAID_REBUILD_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let rebuilt_bytes = a.geometry().dev_sectors * 512;
    let mut speeds = Vec::new();
    for run in 0..runs {
        let new = if run == 0 {
            first.clone()
        } else {
            let m = spare(run);
            overwrite(m.as_ref());
            m
        };
        a.fail_member(MemberIdx(1)).unwrap();
        a.remove_member(MemberIdx(1)).unwrap();
        a.add_member(new).unwrap();
        let ctl = std::env::var("URAID_PERF_CTL").ok();
        if let Some(c) = &ctl {
            std::fs::write(c, "enable\n").unwrap();
        }
        let t = Instant::now();
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        if let Some(c) = &ctl {
            std::fs::write(c, "disable\n").unwrap();
        }
        speeds.push(rebuilt_bytes as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    let all: Vec<String> = speeds.iter().map(|s| format!("{s:.0}")).collect();
    speeds.sort_by(f64::total_cmp);
    let speed = speeds[speeds.len() / 2];
    println!(
        "| {label}, {pct}% written | raid{} {disks} disks | {} MiB | {raw:.0} | {floor:.0} | {speed:.0} ({}) | {:.2} | {:.2} |",
        level.md_level(),
        rebuilt_bytes >> 20,
        all.join(", "),
        speed / raw,
        speed / floor
    );
    assert!(!a.is_degraded());
}

/// A member on a new `nbdkit memory` export of `size` bytes on a Unix socket in `dir`.
fn nbdkit_member(
    dir: &std::path::Path,
    name: &str,
    size: u64,
    servers: &std::sync::Mutex<Vec<std::process::Child>>,
) -> Arc<dyn Member> {
    let sock = dir.join(format!("{name}.sock"));
    let child = std::process::Command::new("nbdkit")
        .args(["-f", "--exit-with-parent", "-U"])
        .arg(&sock)
        // Without structured replies there is no block status: members that cannot say
        // where they were never written.
        .args(
            std::env::var("URAID_NBD_NO_SR")
                .is_ok_and(|v| v == "1")
                .then_some("--no-sr"),
        )
        .args(["memory", &size.to_string()])
        .spawn()
        .expect("nbdkit (the nbd mode needs it)");
    servers.lock().unwrap().push(child);
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let t = Instant::now();
    loop {
        match uraid_engine::NbdMember::connect(&uri, &Default::default()) {
            Ok(m) => return Arc::new(m),
            Err(e) if t.elapsed().as_secs() > 10 => panic!("{uri}: {e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// URAID_REBUILD_LEVELS (for example `1,10`) runs only those levels; all by default.
fn levels_wanted(level: Level) -> bool {
    std::env::var("URAID_REBUILD_LEVELS").map_or(true, |v| {
        v.split(',')
            .any(|l| l.trim().trim_start_matches("raid") == level.md_level().to_string())
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let dir = PathBuf::from(
        args.get(2)
            .cloned()
            .unwrap_or_else(|| "/var/tmp/uraid-rebuild-bench".into()),
    );
    // Optional third argument: "memory" or "files" runs only those members; "nbd" runs
    // members on `nbdkit memory` exports over Unix sockets (remote members) instead.
    // "loop" runs members on loop devices over sparse files in the directory (root).
    let only = args.get(3).cloned();
    let size = (mib << 20) + (4 << 20);
    println!(
        "| members | array | rebuilt | one member read MB/s | all read + one written at once, MB/s per member | rebuild MB/s, median (each run) | ratio to one member | ratio to all at once |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (level, disks) in [
        (Level::Raid5, 4usize),
        (Level::Raid6, 6),
        (Level::Raid1, 2),
        (Level::Raid10, 4),
    ] {
        if !levels_wanted(level) {
            continue;
        }
        if only.as_deref() == Some("nbd") {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let servers = std::sync::Mutex::new(Vec::new());
            let open =
                |name: String| -> Arc<dyn Member> { nbdkit_member(&dir, &name, size, &servers) };
            let members = (0..disks).map(|i| open(format!("n{i}"))).collect();
            run(
                level,
                disks,
                members,
                &|i| open(format!("spare{i}")),
                "nbdkit memory",
            );
            for mut c in servers.into_inner().unwrap() {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        if only.as_deref() == Some("loop") {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let loops = std::sync::Mutex::new(Vec::new());
            let open = |name: String| -> Arc<dyn Member> {
                let p = dir.join(name);
                std::fs::File::create(&p).unwrap().set_len(size).unwrap();
                let out = std::process::Command::new("losetup")
                    .args(["-f", "--show"])
                    .arg(&p)
                    .output()
                    .expect("losetup (the loop mode needs it, and root)");
                assert!(out.status.success(), "losetup: {out:?}");
                let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
                loops.lock().unwrap().push(dev.clone());
                Arc::new(FileMember::open(dev.as_ref(), DirectMode::Auto).unwrap())
            };
            let members = (0..disks).map(|i| open(format!("l{i}.img"))).collect();
            run(
                level,
                disks,
                members,
                &|i| open(format!("spare{i}.img")),
                "loop devices",
            );
            for l in loops.into_inner().unwrap() {
                let _ = std::process::Command::new("losetup")
                    .args(["-d", &l])
                    .status();
            }
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        if only.as_deref() == Some("opaque") {
            // Memory that hides where it was never written, as a disk does.
            let open = |name: String| -> Arc<dyn Member> {
                uraid_testkit::engine::Counting::hiding_holes(Arc::new(MemMember::new(name, size)))
            };
            let members = (0..disks).map(|i| open(format!("o{i}"))).collect();
            let label = if std::env::var("URAID_ZERO_FIRST").is_ok_and(|v| v == "1") {
                "memory, holes hidden, zeroed first"
            } else {
                "memory, holes hidden"
            };
            run(level, disks, members, &|i| open(format!("spare{i}")), label);
            continue;
        }
        let mems: Vec<Arc<dyn Member>> = (0..disks)
            .map(|i| Arc::new(MemMember::new(format!("m{i}"), size)) as Arc<dyn Member>)
            .collect();
        if only.as_deref() != Some("files") {
            run(
                level,
                disks,
                mems,
                &|i| Arc::new(MemMember::new(format!("spare{i}"), size)),
                "memory",
            );
        }
        if only.as_deref() == Some("memory") {
            continue;
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let open_file = |name: String| -> FileMember {
            let p = dir.join(name);
            std::fs::File::create(&p).unwrap().set_len(size).unwrap();
            FileMember::open(&p, DirectMode::Auto).unwrap()
        };
        let open = |name: String| -> Arc<dyn Member> { Arc::new(open_file(name)) };
        let first = open_file("f0.img".into());
        // Auto opens with O_DIRECT where the file system takes it: say which it got.
        let label = if first.uses_direct() {
            "files (O_DIRECT)"
        } else {
            "files (page cache)"
        };
        let files: Vec<Arc<dyn Member>> = std::iter::once(Arc::new(first) as Arc<dyn Member>)
            .chain((1..disks).map(|i| open(format!("f{i}.img"))))
            .collect();
        run(
            level,
            disks,
            files,
            &|i| open(format!("spare{i}.img")),
            label,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
