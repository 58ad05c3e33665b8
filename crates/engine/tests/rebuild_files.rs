//! End to end: rebuild a file member while a workload runs, with checksums of the whole
//! array before and after. Quick mode uses 256 MiB members; URAID_FULL=1 uses 1 GiB.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{CreateOptions, Member, SlotState, SyncKind};
use uraid_engine::{DirectMode, FileMember};
use uraid_testkit::tmp::{TempDir, MIB};

const BLOCK: usize = 64 * 1024;

/// Contents of block `i` at version `v`: cheap to generate and to check.
fn pattern(i: u64, v: u32, out: &mut [u8]) {
    let mut x = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((v as u64) << 32)) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn checksum(a: &uraid_engine::Array) -> u64 {
    // FNV-1a over the whole array, block by block.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < a.size_bytes() {
        let n = (a.size_bytes() - off).min(buf.len() as u64) as usize;
        a.read(off, &mut buf[..n]).unwrap();
        for &b in &buf[..n] {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        off += n as u64;
    }
    h
}

fn model_checksum(blocks: u64, versions: &[AtomicU32], tail: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut buf = vec![0u8; BLOCK];
    for i in 0..blocks {
        pattern(i, versions[i as usize].load(Ordering::SeqCst), &mut buf);
        for &b in &buf {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    for _ in 0..tail {
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

#[test]
fn rebuild_a_file_member_under_load() {
    let full = std::env::var("URAID_FULL").is_ok();
    let member_bytes: u64 = if full {
        (1 << 30) + (8 << 20)
    } else {
        (256 << 20) + (8 << 20)
    };
    let dir = TempDir::new("rebuild");
    let paths = dir.images(4, member_bytes / MIB, "m");
    let open = |p: &PathBuf| -> Arc<dyn Member> {
        Arc::new(FileMember::open(p, DirectMode::Auto).unwrap())
    };
    let mut o = CreateOptions::new(Level::Raid5);
    o.chunk_sectors = Some(128);
    let a = Arc::new(
        uraid_engine::create(paths[..3].iter().map(|p| Some(open(p))).collect(), &o).unwrap(),
    );
    let blocks = a.size_bytes() / BLOCK as u64;
    let tail = a.size_bytes() - blocks * BLOCK as u64;
    let versions: Arc<Vec<AtomicU32>> = Arc::new((0..blocks).map(|_| AtomicU32::new(0)).collect());
    let mut buf = vec![0u8; BLOCK * 16];
    for i in (0..blocks).step_by(16) {
        let n = (blocks - i).min(16) as usize;
        for k in 0..n {
            pattern(i + k as u64, 0, &mut buf[k * BLOCK..(k + 1) * BLOCK]);
        }
        a.write(i * BLOCK as u64, &buf[..n * BLOCK]).unwrap();
    }
    let before = checksum(&a);
    assert_eq!(
        before,
        model_checksum(blocks, &versions, tail),
        "checksum before the failure"
    );

    a.fail_member(MemberIdx(1)).unwrap();
    a.remove_member(MemberIdx(1)).unwrap();
    a.add_member(open(&paths[3])).unwrap();
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::Recovering);

    // Workload: writers bump block versions, readers verify; recovery runs meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for t in 0..2u64 {
        let (a, versions, stop) = (a.clone(), versions.clone(), stop.clone());
        workers.push(std::thread::spawn(move || {
            let mut x = 0x1234_5678_u64 + t;
            let mut buf = vec![0u8; BLOCK];
            let mut got = vec![0u8; BLOCK];
            let mut ops = 0u64;
            while !stop.load(Ordering::SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Each thread owns the blocks of its parity, so versions are exact.
                let i = (x % (blocks / 2)) * 2 + t;
                if x.is_multiple_of(3) {
                    let v = versions[i as usize].load(Ordering::SeqCst) + 1;
                    pattern(i, v, &mut buf);
                    a.write(i * BLOCK as u64, &buf).unwrap();
                    versions[i as usize].store(v, Ordering::SeqCst);
                } else {
                    a.read(i * BLOCK as u64, &mut got).unwrap();
                    pattern(i, versions[i as usize].load(Ordering::SeqCst), &mut buf);
                    assert!(got == buf, "block {i} read wrong during recovery");
                }
                ops += 1;
            }
            ops
        }));
    }
    let t0 = std::time::Instant::now();
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let ops: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    eprintln!(
        "rebuilt {} MiB member in {secs:.1} s ({:.0} MB/s) while the workload did {ops} ops",
        member_bytes >> 20,
        member_bytes as f64 / secs / 1e6
    );
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::InSync);
    let want = model_checksum(blocks, &versions, tail);
    assert_eq!(checksum(&a), want, "checksum after the rebuild");
    // The rebuilt member carries its share: fail another one and check again.
    a.fail_member(MemberIdx(0)).unwrap();
    assert_eq!(
        checksum(&a),
        want,
        "checksum with the rebuilt member carrying data"
    );
    drop(a);
}
