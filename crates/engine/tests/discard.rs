//! Discard and write-zeroes reach the members: against a byte model on every level, the
//! range the members can change as a whole reads zeros and everything else keeps its data;
//! a check finds no mismatch; file members give their blocks back; the bitmap counts a
//! discard as a write, so a crash in the middle of one resyncs it.
//!
//! Seeds: `URAID_SEED=n` replays one seed. The byte-model tests run a sample of the
//! configurations (every level and kind of layout) in quick mode, all of them with
//! `URAID_FULL=1`.

use rand::Rng;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use uraid_core::geometry::Personality;
use uraid_core::Level;
use uraid_engine::{assemble, Array, ArrayError, AssembleOptions, Member, ZeroHow};
use uraid_engine::{DirectMode, FileMember};
use uraid_sim::FaultMember;
use uraid_testkit::engine::as_members;
use uraid_testkit::engine::*;

/// Bytes [start, end) of `offset+len` that the members change as a whole: whole sectors,
/// whole stripes on raid4/5/6 (computed here from the geometry, not asked of the engine).
fn inner(a: &Array, offset: u64, len: u64) -> (u64, u64) {
    let unit = match a.personality() {
        Personality::Parity(g) => g.stripe_data_sectors() * 512,
        _ => 512,
    };
    let (s, e) = (offset.div_ceil(unit) * unit, (offset + len) / unit * unit);
    if e > s {
        (s, e)
    } else {
        (0, 0)
    }
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut got = vec![0u8; a.size_bytes() as usize];
    a.read(0, &mut got).unwrap();
    got
}

fn assert_model(a: &Array, model: &[u8], ctx: &str) {
    let got = read_all(a);
    if let Some(i) = got.iter().zip(model).position(|(x, y)| x != y) {
        panic!(
            "{ctx}: byte {i} reads {:#x}, the model says {:#x}",
            got[i], model[i]
        );
    }
}

fn seeds() -> Vec<u64> {
    match std::env::var("URAID_SEED") {
        Ok(s) => vec![s.parse().expect("URAID_SEED is a number")],
        Err(_) => vec![1],
    }
}

/// Random data everywhere, then `rounds` random changes by `op`, each checked against the
/// model; at the end a check pass finds no mismatch and more writes still land.
fn run_model(op: &str, rounds: usize, change: impl Fn(&Array, u64, u64) -> Result<(), ArrayError>) {
    let configs = sampled_configs();
    println!(
        "{op}: {} configs (all of them with URAID_FULL=1)",
        configs.len()
    );
    for cfg in configs {
        for seed in seeds() {
            let ctx = format!("{op} {cfg:?} seed {seed}");
            let mut rng = rng(seed);
            let mems = mem_members(&cfg, "d");
            let a = uraid_engine::create(as_members(&mems), &create_opts(&cfg)).unwrap();
            let size = a.size_bytes();
            let mut model = vec![0u8; size as usize];
            rng.fill(&mut model[..]);
            a.write(0, &model).unwrap();
            let mut zeroed = 0u64;
            for i in 0..rounds {
                let len = rng.gen_range(1..=size / 3);
                let off = rng.gen_range(0..=size - len);
                change(&a, off, len).unwrap_or_else(|e| panic!("{ctx}: {op} {i}: {e}"));
                let (s, e) = if op == "discard" {
                    inner(&a, off, len)
                } else {
                    (off, off + len)
                };
                model[s as usize..e as usize].fill(0);
                zeroed += e - s;
                assert_model(&a, &model, &format!("{ctx} after {op} {i} of {off}+{len}"));
            }
            assert!(zeroed > 0, "{ctx}: no round covered a whole unit");
            if a.personality().max_degraded() > 0 {
                assert_eq!(a.check().unwrap(), 0, "{ctx}: check after {op}");
            }
            // Writes over zeroed ranges (read-modify-write uses the zeroed parity).
            for _ in 0..8 {
                let (off, data) = random_write(&mut rng, size, size / 4);
                a.write(off, &data).unwrap();
                model[off as usize..off as usize + data.len()].copy_from_slice(&data);
            }
            assert_model(&a, &model, &format!("{ctx} writes after {op}"));
            if a.personality().max_degraded() > 0 {
                assert_eq!(a.check().unwrap(), 0, "{ctx}: check after writes");
                // Degraded: what the lost member held comes back from the rest.
                a.fail_member(uraid_core::MemberIdx(0)).unwrap();
                assert_model(&a, &model, &format!("{ctx} degraded"));
            }
        }
    }
}

#[test]
fn discard_zeroes_whole_units_and_keeps_the_rest_on_every_level() {
    run_model("discard", 4, |a, off, len| a.discard(off, len));
}

#[test]
fn write_zeroes_zeroes_exactly_the_range_on_every_level() {
    run_model("write-zeroes", 4, |a, off, len| a.write_zeroes(off, len));
}

#[test]
fn write_zeroes_without_holes_zeroes_exactly_the_range() {
    run_model("write-zeroes-no-hole", 3, |a, off, len| {
        a.write_zeroes_with(off, len, ZeroHow { unmap: false }, false)
    });
}

#[test]
fn fast_zero_is_refused_before_anything_changes_when_it_cannot_be_fast() {
    let cfg = Config {
        level: Level::Raid5,
        layout: None,
        disks: 4,
        chunk_sectors: 8,
        member_bytes: vec![2 << 20; 4],
    };
    let mems = mem_members(&cfg, "fz");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&cfg)).unwrap();
    assert!(a.can_fast_zero(true) && a.can_fast_zero(false));
    let mut model = vec![0u8; a.size_bytes() as usize];
    rng(5).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    let stripe = 8 * 512 * 3;
    // A partial stripe would need a normal write: refused, nothing changed.
    let e = a
        .write_zeroes_with(stripe / 2, stripe * 2, ZeroHow { unmap: true }, true)
        .unwrap_err();
    assert!(matches!(e, ArrayError::NotFast(_)), "{e}");
    assert_eq!(e.errno(), libc::EOPNOTSUPP);
    assert_model(&a, &model, "after a refused fast zero");
    // Whole stripes: done by the members.
    a.write_zeroes_with(stripe, stripe * 2, ZeroHow { unmap: true }, true)
        .unwrap();
    model[stripe as usize..3 * stripe as usize].fill(0);
    assert_model(&a, &model, "after a fast zero");

    // Members that can only write zeros: no fast zeroing at all.
    let slow: Vec<Option<Arc<dyn Member>>> = mem_members(&cfg, "fs")
        .into_iter()
        // Members that zero only by writing (as the simulator's disks do).
        .map(|m| Some(Arc::new(FaultMember::new(m).zeroes_by_writing()) as Arc<dyn Member>))
        .collect();
    let b = uraid_engine::create(slow, &create_opts(&cfg)).unwrap();
    assert!(!b.can_fast_zero(true));
    b.write(0, &model).unwrap();
    let e = b
        .write_zeroes_with(0, stripe, ZeroHow { unmap: true }, true)
        .unwrap_err();
    assert!(matches!(e, ArrayError::NotFast(_)), "{e}");
    assert_model(&b, &model, "slow members after a refused fast zero");
    // Without the fast flag they zero by writing; a discard leaves their data.
    b.discard(0, stripe).unwrap();
    assert_model(
        &b,
        &model,
        "a discard on members that do not read back zeros",
    );
    b.write_zeroes(0, stripe).unwrap();
    model[..stripe as usize].fill(0);
    assert_model(&b, &model, "slow members after write-zeroes");
    assert_eq!(b.check().unwrap(), 0);
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uraid-discard-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn blocks(paths: &[PathBuf]) -> u64 {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().blocks())
        .sum()
}

#[test]
fn file_members_give_their_blocks_back_after_a_discard() {
    for (level, disks) in [
        (Level::Raid0, 3),
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
    ] {
        let dir = temp_dir(&format!("{level}"));
        let member_bytes: u64 = 8 << 20;
        let paths: Vec<PathBuf> = (0..disks).map(|i| dir.join(format!("m{i}.img"))).collect();
        for p in &paths {
            std::fs::File::create(p)
                .unwrap()
                .set_len(member_bytes)
                .unwrap();
        }
        let members: Vec<Option<Arc<dyn Member>>> = paths
            .iter()
            .map(|p| {
                Some(Arc::new(FileMember::open(p, DirectMode::Off).unwrap()) as Arc<dyn Member>)
            })
            .collect();
        let mut o = uraid_engine::CreateOptions::new(level);
        if level != Level::Raid1 {
            o.chunk_sectors = Some(128);
        }
        o.assume_clean = true;
        let a = uraid_engine::create(members, &o).unwrap();
        let size = a.size_bytes();
        let mut data = vec![0u8; size as usize];
        rng(9).fill(&mut data[..]);
        a.write(0, &data).unwrap();
        a.flush().unwrap();
        let full = blocks(&paths);
        a.discard(0, size).unwrap();
        a.flush().unwrap();
        let after = blocks(&paths);
        // Every data block is gone; what stays is metadata (superblock, bitmap).
        let data_blocks = size / 512;
        assert!(
            full - after >= data_blocks * 9 / 10,
            "{level}: {full} blocks before, {after} after a discard of {data_blocks} sectors"
        );
        assert!(read_all(&a).iter().all(|&b| b == 0), "{level}: not zeros");
        if level != Level::Raid0 {
            assert_eq!(a.check().unwrap(), 0, "{level}: check after discard");
        }
        drop(a);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn file_members_zero_without_holes_when_asked() {
    let dir = temp_dir("nohole");
    let paths: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("m{i}.img"))).collect();
    for p in &paths {
        std::fs::File::create(p).unwrap().set_len(8 << 20).unwrap();
    }
    let members: Vec<Option<Arc<dyn Member>>> = paths
        .iter()
        .map(|p| Some(Arc::new(FileMember::open(p, DirectMode::Off).unwrap()) as Arc<dyn Member>))
        .collect();
    let mut o = uraid_engine::CreateOptions::new(Level::Raid1);
    o.assume_clean = true;
    let a = uraid_engine::create(members, &o).unwrap();
    let size = a.size_bytes();
    a.write(0, &vec![0xA5u8; size as usize]).unwrap();
    a.flush().unwrap();
    let full = blocks(&paths);
    a.write_zeroes_with(0, size, ZeroHow { unmap: false }, false)
        .unwrap();
    a.flush().unwrap();
    assert!(read_all(&a).iter().all(|&b| b == 0), "not zeros");
    // NO_HOLE keeps the blocks allocated; with holes allowed they go.
    assert!(blocks(&paths) >= full * 9 / 10, "NO_HOLE punched holes");
    a.write(0, &vec![0xA5u8; size as usize]).unwrap();
    a.write_zeroes(0, size).unwrap();
    a.flush().unwrap();
    assert!(read_all(&a).iter().all(|&b| b == 0), "not zeros");
    assert!(blocks(&paths) < full / 10, "write-zeroes kept the blocks");
    assert_eq!(a.check().unwrap(), 0);
    drop(a);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A crash in the middle of a discard: one member kept its old data in the range (its
/// discard never happened). The bitmap bits set before the discard make the resync cover
/// the range, so the array reads zeros or the old data there, and check finds nothing.
#[test]
fn a_crash_mid_discard_is_resynced_by_the_bitmap() {
    for (level, disks) in [(Level::Raid5, 4), (Level::Raid1, 2), (Level::Raid6, 5)] {
        let cfg = Config {
            level,
            layout: None,
            disks,
            chunk_sectors: 16,
            member_bytes: vec![4 << 20; disks],
        };
        let ctx = format!("{level}");
        let mems = mem_members(&cfg, "cr");
        let mut o = create_opts(&cfg);
        o.bitmap = true;
        o.bitmap_chunk_bytes = Some(64 * 1024);
        o.data_offset_sectors = Some(2048);
        let a = uraid_engine::create(as_members(&mems), &o).unwrap();
        let size = a.size_bytes();
        let mut model = vec![0u8; size as usize];
        rng(3).fill(&mut model[..]);
        a.write(0, &model).unwrap();
        a.stop().unwrap();
        a.bitmap_daemon().unwrap();
        a.bitmap_daemon().unwrap();
        assert_eq!(a.bitmap_dirty_chunks().unwrap().0, 0, "{ctx}");
        let before = mems[1].snapshot();
        let (off, len) = (size / 4, size / 2);
        a.discard(off, len).unwrap();
        let (s, e) = inner(&a, off, len);
        let mut zeroed = model.clone();
        zeroed[s as usize..e as usize].fill(0);
        assert_model(&a, &zeroed, &format!("{ctx} after discard"));
        assert!(
            a.bitmap_dirty_chunks().unwrap().0 > 0,
            "{ctx}: a discard set no bitmap bit"
        );
        std::mem::forget(a);
        // Member 1's data area never saw the discard.
        let data_off = 2048 * 512;
        mems[1]
            .write_at(&before[data_off..], data_off as u64)
            .unwrap();
        let devs: Vec<Arc<dyn Member>> =
            mems.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
        let (b, rep) = assemble(devs, &AssembleOptions::default()).unwrap();
        assert!(rep.unclean, "{ctx}: crash not detected");
        b.resync().unwrap();
        assert_eq!(b.check().unwrap(), 0, "{ctx}: check after resync");
        let got = read_all(&b);
        for i in 0..got.len() {
            assert!(
                got[i] == model[i] || (got[i] == 0 && (s..e).contains(&(i as u64))),
                "{ctx}: byte {i} reads {:#x}: neither the old data nor a discarded zero",
                got[i]
            );
        }
    }
}

/// Loop devices detached when dropped.
struct Loops(Vec<String>);

impl Drop for Loops {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = std::process::Command::new("losetup")
                .args(["-d", l])
                .status();
        }
    }
}

/// Block-device members with a write-zeroes offload (loop devices over sparse files): a
/// raid5 discard reaches them as zeroing with unmap, so the backing files give their
/// blocks back, the array reads zeros and check finds nothing. Needs root and losetup.
#[test]
fn loop_device_members_with_a_zeroing_offload_give_their_blocks_back() {
    let tool = std::process::Command::new("losetup")
        .arg("--version")
        .output();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if tool.is_err() || !root || !std::path::Path::new("/dev/loop-control").exists() {
        uraid_testkit::skip(
            "loop_device_members_with_a_zeroing_offload_give_their_blocks_back",
            "needs root, /dev/loop-control and losetup",
        );
        return;
    }
    let dir = temp_dir("loop");
    let files: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("b{i}.img"))).collect();
    let mut loops = Loops(Vec::new());
    for f in &files {
        std::fs::File::create(f).unwrap().set_len(16 << 20).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show"])
            .arg(f)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        loops
            .0
            .push(String::from_utf8(out.stdout).unwrap().trim().to_string());
    }
    let members: Vec<Arc<FileMember>> = loops
        .0
        .iter()
        .map(|l| Arc::new(FileMember::open(l.as_ref(), DirectMode::Auto).unwrap()))
        .collect();
    assert!(
        members
            .iter()
            .all(|m| m.discard_zeroes() && m.zeroes_fast(true)),
        "loop devices offload write-zeroes"
    );
    let mut o = uraid_engine::CreateOptions::new(Level::Raid5);
    o.chunk_sectors = Some(128);
    o.assume_clean = true;
    let a = uraid_engine::create(as_members(&members), &o).unwrap();
    assert!(a.can_fast_zero(true));
    let size = a.size_bytes();
    // The zeroing offload, then BLKDISCARD under md's devices_handle_discard_safely (a loop
    // device punches a hole either way). No other test here uses block devices.
    for safely in [false, true] {
        uraid_engine::set_devices_handle_discard_safely(safely);
        let mut data = vec![0u8; size as usize];
        rng(4).fill(&mut data[..]);
        a.write(0, &data).unwrap();
        a.flush().unwrap();
        let full = blocks(&files);
        a.discard(0, size).unwrap();
        a.flush().unwrap();
        let after = blocks(&files);
        assert!(
            full - after >= size / 512,
            "safely={safely}: {full} blocks before, {after} after a discard of {} sectors",
            size / 512
        );
        assert!(read_all(&a).iter().all(|&b| b == 0), "not zeros");
        assert_eq!(a.check().unwrap(), 0);
    }
    uraid_engine::set_devices_handle_discard_safely(false);
    drop(a);
    drop(members);
    drop(loops);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mirror copy whose discard (and the zeroing that replaces it) fails is failed, as for a
/// failed write: the copies never silently differ, and the array reads zeros from the rest.
#[test]
fn a_copy_that_cannot_discard_is_failed_not_left_different() {
    let faults: Vec<Arc<FaultMember>> = (0..2)
        .map(|i| {
            Arc::new(FaultMember::new(Arc::new(uraid_engine::MemMember::new(
                format!("fm{i}"),
                2 << 20,
            ))))
        })
        .collect();
    let mut o = uraid_engine::CreateOptions::new(Level::Raid1);
    o.assume_clean = true;
    let a = uraid_engine::create(
        faults
            .iter()
            .map(|f| Some(f.clone() as Arc<dyn Member>))
            .collect(),
        &o,
    )
    .unwrap();
    let size = a.size_bytes();
    let mut model = vec![0u8; size as usize];
    rng(8).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    let data_off = a.slot(uraid_core::MemberIdx(1)).data_offset_bytes();
    faults[1].set_range(data_off, data_off + (1 << 20));
    faults[1]
        .fail_writes
        .store(true, std::sync::atomic::Ordering::SeqCst);
    a.discard(4096, 65536).unwrap();
    model[4096..4096 + 65536].fill(0);
    assert_eq!(
        a.slot_state(uraid_core::MemberIdx(1)),
        uraid_engine::SlotState::Faulty,
        "the copy that kept its data is still in sync"
    );
    assert_model(&a, &model, "after a failed discard on one copy");
}
