//! Recovery over members that know where they were never written (sparse files by
//! SEEK_DATA, loop devices by SEEK_DATA on their backing files, memory members by their unwritten regions, NBD members by the server's
//! `base:allocation`): what is a hole on every member that holds it is zeroed on the new
//! member, not read, rebuilt and written (issue 18: "recovery skips what was never written
//! when the array knows it"). The new member starts full of garbage; the recovery reads and
//! writes about the written share only, every byte then reads as the model, parity and
//! copies agree, and the rebuilt member carries its share when another member fails.

use rand::Rng;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{
    read_superblock, CreateOptions, DirectMode, FileMember, Member, SlotState, SyncKind,
};
use uraid_testkit::engine::{
    as_members, read_all, recover_role_1, recovered_holds, rng, same, Counting,
};
use uraid_testkit::loopdev::Loop;
use uraid_testkit::tmp::{TempDir, MIB};

/// Every level with redundancy and its member count, for the tests that run on each.
const LEVELS: [(Level, usize); 4] = [
    (Level::Raid1, 2),
    (Level::Raid10, 4),
    (Level::Raid5, 4),
    (Level::Raid6, 5),
];

fn open(p: &Path) -> Arc<dyn Member> {
    Arc::new(FileMember::open(p, DirectMode::Off).unwrap())
}

fn allocated_bytes(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn recovery_zeroes_what_was_never_written_instead_of_rebuilding_it() {
    const MEMBER_MIB: u64 = 16;
    for (level, disks) in LEVELS {
        let dir = TempDir::new(&format!("sparse-rec-{level}"));
        let paths = dir.images(disks, MEMBER_MIB, "m");
        let spare = dir.path("spare.img");
        std::fs::File::create(&spare)
            .unwrap()
            .set_len(MEMBER_MIB * MIB)
            .unwrap();
        // The spare is written full of garbage first (a used disk: every block allocated).
        recovery_moves_only_what_was_written(
            level,
            paths.iter().map(|p| open(p)).collect(),
            open(&spare),
            &format!("{level} files"),
        );
        // The unwritten ranges were zeroed as holes, not rewritten: the new member keeps
        // about its share of the 1.2 MiB written (and the superblock), far from all of it.
        let kept = allocated_bytes(&spare);
        assert!(
            kept < MEMBER_MIB * MIB / 4,
            "{level}: the new member has {kept} bytes allocated of {}",
            MEMBER_MIB * MIB
        );
    }
}

/// A member that, when first asked whether a range is a hole, runs a hook (here: another
/// member of its array fails, as a write error on another thread would make it).
struct HookOnHole {
    inner: uraid_engine::MemMember,
    hook: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Member for HookOnHole {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn is_hole(&self, _offset: u64, _len: u64) -> std::io::Result<bool> {
        if let Some(hook) = self.hook.lock().unwrap().take() {
            hook();
        }
        Ok(false)
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

/// A mirror's sync piece looks at its copies (SEEK_DATA) before reading them; a copy whose
/// member fails in that moment is left out of the piece, the sync goes on with the others
/// and the array serves the same data (this lookup once expected the device still there and
/// would have panicked the sync).
#[test]
fn a_mirror_copy_that_fails_during_a_sync_piece_is_left_out() {
    for level in [Level::Raid1, Level::Raid10] {
        let disks = if level == Level::Raid1 { 3 } else { 4 };
        let first = Arc::new(HookOnHole {
            inner: uraid_engine::MemMember::new("m0", 4 * MIB),
            hook: std::sync::Mutex::new(None),
        });
        let mut devs: Vec<Option<Arc<dyn Member>>> = vec![Some(first.clone())];
        devs.extend((1..disks).map(|i| {
            Some(
                Arc::new(uraid_engine::MemMember::new(format!("m{i}"), 4 * MIB)) as Arc<dyn Member>,
            )
        }));
        let mut o = CreateOptions::new(level);
        if level == Level::Raid10 {
            o.chunk_sectors = Some(128);
        }
        o.assume_clean = true;
        let a = Arc::new(uraid_engine::create(devs, &o).unwrap());
        let size = a.size_bytes() as usize;
        let mut model = vec![0u8; size];
        rng(7).fill(&mut model[..]);
        a.write(0, &model).unwrap();
        // Member 1 holds a copy of the first piece beside member 0 (raid1: all of them;
        // raid10 near-2: members 0 and 1).
        let weak = Arc::downgrade(&a);
        *first.hook.lock().unwrap() = Some(Box::new(move || {
            if let Some(a) = weak.upgrade() {
                a.fail_member(MemberIdx(1)).unwrap();
            }
        }));
        let checked = a.check();
        assert_eq!(
            a.slot_state(MemberIdx(1)),
            SlotState::Faulty,
            "{level}: the hook ran"
        );
        // The check may stop (the array became degraded) but not panic, and nothing is lost.
        if let Ok(mismatches) = checked {
            assert_eq!(mismatches, 0, "{level}");
        }
        same(
            &read_all(&a, size),
            &model,
            &format!("{level}: after the check"),
        );
    }
}

/// A raid1 recovery takes a run of holes as one piece (up to 64 MiB: one zeroing of the
/// new member), asked before the run's barriers go up, and asks again under them: a run
/// that took data in between (here a member answers "hole" once for a run that holds
/// data, as if written right after it answered) is synced unit by unit, and the data
/// reaches the new member.
#[test]
fn a_hole_run_that_took_data_before_its_barriers_is_synced_as_usual() {
    let devs: Vec<Arc<Counting>> = (0..2)
        .map(|i| {
            Counting::new(Arc::new(uraid_engine::MemMember::new(
                format!("m{i}"),
                16 * MIB,
            )))
        })
        .collect();
    let mut o = CreateOptions::new(Level::Raid1);
    o.assume_clean = true;
    let a = uraid_engine::create(as_members(&devs), &o).unwrap();
    let size = a.size_bytes() as usize;
    let mut model = vec![0u8; size];
    let mut r = rng(21);
    // Data in the first unit, and 64 KiB in the fourth: the run from the second unit to
    // the end is not a hole, though its first unit is.
    for (at, len) in [(0usize, MIB as usize), (3 * MIB as usize, 64 << 10)] {
        r.fill(&mut model[at..at + len]);
        a.write(at as u64, &model[at..at + len]).unwrap();
    }
    a.flush().unwrap();
    a.fail_member(MemberIdx(1)).unwrap();
    a.remove_member(MemberIdx(1)).unwrap();
    let spare = Arc::new(uraid_engine::MemMember::new("spare", 16 * MIB));
    spare.write_at(&vec![0xa5u8; 16 * MIB as usize], 0).unwrap();
    a.add_member(spare).unwrap();
    devs[0]
        .stale_holes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    assert_eq!(
        devs[0]
            .stale_holes
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the recovery never asked about a run of holes"
    );
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::InSync);
    // Only the new member left: it must hold the data.
    a.fail_member(MemberIdx(0)).unwrap();
    same(
        &read_all(&a, size),
        &model,
        "the new member after a stale hole run",
    );
}

/// Recovery of member 1 of an array on `devs` onto `spare` (which holds old data): only
/// what was written since creation is read from the others and written to it, the rest
/// is zeroed; the array reads back the model, checks clean, and the rebuilt member
/// carries its share when member 0 fails.
fn recovery_moves_only_what_was_written(
    level: Level,
    devs: Vec<Arc<dyn Member>>,
    spare: Arc<dyn Member>,
    what: &str,
) {
    let member_bytes = devs[0].size_bytes();
    spare
        .write_at(&vec![0xa5u8; member_bytes as usize], 0)
        .unwrap();
    let counted: Vec<Arc<Counting>> = devs.into_iter().map(Counting::new).collect();
    let mut o = CreateOptions::new(level);
    if level != Level::Raid1 {
        o.chunk_sectors = Some(128);
    }
    o.assume_clean = true;
    let a = uraid_engine::create(as_members(&counted), &o).unwrap();
    let size = a.size_bytes() as usize;
    let mut model = vec![0u8; size];
    let mut r = rng(18);
    for (at, len) in [(0usize, 1 << 20), (5 << 20, 192 << 10)] {
        r.fill(&mut model[at..at + len]);
        a.write(at as u64, &model[at..at + len]).unwrap();
    }
    a.flush().unwrap();

    for c in &counted {
        c.reset();
    }
    let new = Counting::new(spare);
    let zero_bytes = recover_role_1(&a, new.clone());
    // The progress says what was skipped: much of the array (raid10's recovery of one
    // member looks at the half of it that member holds), never what was written.
    let written = (1 << 20) + (192 << 10);
    assert!(
        zero_bytes >= size as u64 / 4 && zero_bytes <= size as u64 - written,
        "{what}: {zero_bytes} bytes of {size} reported as zeros everywhere"
    );
    // About a member's share of the 1.2 MiB written, far from the whole member.
    let survivors_read: Vec<u64> = counted
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, c)| c.read.load(std::sync::atomic::Ordering::SeqCst))
        .collect();
    let rebuilt = new.written.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        survivors_read.iter().all(|&n| n < member_bytes / 4) && rebuilt < member_bytes / 4,
        "{what}: the recovery read {survivors_read:?} bytes from the others and wrote \
         {rebuilt} to the new member, of {member_bytes} each"
    );
    recovered_holds(&a, &model, what);
}

/// Memory members know which of their regions were never written.
#[test]
fn recovery_over_memory_members_moves_only_what_was_written() {
    for (level, disks) in LEVELS {
        let devs = (0..disks)
            .map(|i| {
                Arc::new(uraid_engine::MemMember::new(format!("m{i}"), 16 * MIB)) as Arc<dyn Member>
            })
            .collect();
        let spare = Arc::new(uraid_engine::MemMember::new("spare", 16 * MIB));
        recovery_moves_only_what_was_written(level, devs, spare, &format!("{level} memory"));
    }
}

/// Loop devices over sparse files ask their backing files (SEEK_DATA, past the loop's
/// offset): a recovery over them moves only what was written, as over the files, and the
/// new member's backing file keeps only about its share allocated. The spare is filled
/// through its page cache first, which the member must write back before it asks.
#[test]
fn recovery_over_loop_devices_moves_only_what_was_written() {
    const TEST: &str = "recovery_over_loop_devices_moves_only_what_was_written";
    const MEMBER_MIB: u64 = 16;
    for (level, disks) in LEVELS {
        let dir = TempDir::new(&format!("sparse-loop-{level}"));
        // One more MiB in front of each device: the loops start 1 MiB into their files.
        let paths = dir.images(disks + 1, MEMBER_MIB + 1, "m");
        let mut loops = Vec::new();
        for p in &paths {
            let Some(l) = Loop::attach_at_or_skip(p, MIB, TEST) else {
                return;
            };
            loops.push(l);
        }
        let dev = |l: &Loop| -> Arc<dyn Member> {
            Arc::new(FileMember::open(Path::new(&l.0), DirectMode::Auto).unwrap())
        };
        recovery_moves_only_what_was_written(
            level,
            loops[..disks].iter().map(dev).collect(),
            dev(&loops[disks]),
            &format!("{level} loop devices"),
        );
        let kept = allocated_bytes(&paths[disks]);
        assert!(
            kept < MEMBER_MIB * MIB / 4,
            "{level}: the new member's backing file has {kept} bytes allocated of {}",
            MEMBER_MIB * MIB
        );
    }
}

/// What a loop device says about its holes is its backing file's answer at the loop's
/// offset, including what was just written through the device's page cache or around it
/// (O_DIRECT); a loop device whose backing file is gone says nothing (never a hole).
#[test]
fn a_loop_devices_holes_are_its_backing_files() {
    const TEST: &str = "a_loop_devices_holes_are_its_backing_files";
    let dir = TempDir::new("loop-holes");
    let img = dir.image("b.img", 33);
    // 64 KiB of data 8 MiB into the device, which starts 1 MiB into the file.
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new().write(true).open(&img).unwrap(),
        &[7u8; 64 << 10],
        9 * MIB,
    )
    .unwrap();
    let Some(lo) = Loop::attach_at_or_skip(&img, MIB, TEST) else {
        return;
    };
    let m = FileMember::open(Path::new(&lo.0), DirectMode::Auto).unwrap();
    assert_eq!(m.size_bytes(), 32 * MIB);
    assert!(m.is_hole(0, 8 * MIB).unwrap(), "before the data");
    assert!(!m.is_hole(8 * MIB, 4096).unwrap(), "the data");
    assert!(
        !m.is_hole(0, 9 * MIB).unwrap(),
        "a range that ends in the data"
    );
    assert!(m.is_hole(9 * MIB, 2 * MIB).unwrap(), "after the data");
    assert!(!m.known_zero(), "a device with data is not all zeros");

    // Through the page cache (a buffer off the O_DIRECT alignment), not yet written back.
    let v = vec![9u8; 8192 + 1];
    m.write_at(&v[1..4097], 12 * MIB).unwrap();
    assert!(!m.is_hole(12 * MIB, 4096).unwrap(), "a buffered write");
    // Around it (O_DIRECT, an aligned buffer).
    let big = vec![5u8; 3 * 4096];
    let at = big.as_ptr().align_offset(4096);
    let aligned = &big[at..at + 4096];
    m.write_at(aligned, 16 * MIB).unwrap();
    assert!(!m.is_hole(16 * MIB, 4096).unwrap(), "a direct write");
    assert!(m.is_hole(17 * MIB, 15 * MIB).unwrap(), "the rest");
    let mut back = vec![0u8; 4096];
    m.read_at(&mut back, 12 * MIB).unwrap();
    assert_eq!(back, v[1..4097]);

    // A fresh device over a sparse file is all zeros.
    let fresh_img = dir.image("fresh.img", 8);
    let Some(fresh) = Loop::attach_or_skip(&fresh_img, TEST) else {
        return;
    };
    let f = FileMember::open(Path::new(&fresh.0), DirectMode::Auto).unwrap();
    assert!(f.known_zero() && f.is_hole(0, 8 * MIB).unwrap());
    drop(f);

    // The backing file deleted: the device keeps its bytes but nobody can ask the file.
    std::fs::remove_file(&fresh_img).unwrap();
    let f = FileMember::open(Path::new(&fresh.0), DirectMode::Auto).unwrap();
    assert!(!f.is_hole(0, 4096).unwrap() && !f.known_zero());
}

/// A partition of a loop device asks the backing file at the loop's offset plus the
/// partition's start.
#[test]
fn a_loop_partitions_holes_are_its_backing_files() {
    const TEST: &str = "a_loop_partitions_holes_are_its_backing_files";
    let dir = TempDir::new("loop-part");
    let img = dir.image("p.img", 17);
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    // The device starts 1 MiB into the file; an MBR there with one partition from sector
    // 2048 (1 MiB) for 10 MiB, and 64 KiB of data 4 MiB into the partition.
    let mut mbr = [0u8; 512];
    mbr[446 + 4] = 0x83;
    mbr[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
    mbr[446 + 12..446 + 16].copy_from_slice(&20480u32.to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    std::os::unix::fs::FileExt::write_all_at(&f, &mbr, MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[3u8; 64 << 10], 6 * MIB).unwrap();
    drop(f);
    let out = std::process::Command::new("losetup")
        .args(["-f", "--show", "-P", "-o", &MIB.to_string()])
        .arg(&img)
        .output();
    let Some(lo) = out
        .ok()
        .filter(|o| o.status.success())
        .map(|o| Loop(String::from_utf8_lossy(&o.stdout).trim().to_string()))
    else {
        uraid_testkit::skip(TEST, "cannot attach a loop device (needs root)");
        return;
    };
    let part = format!("{}p1", lo.0);
    // The kernel scans the table at attach; partx adds the partition where it did not.
    if !Path::new(&part).exists() {
        let _ = std::process::Command::new("partx")
            .args(["-a", &lo.0])
            .status();
    }
    for _ in 0..50 {
        if Path::new(&part).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if !Path::new(&part).exists() {
        uraid_testkit::skip(TEST, "the loop device's partition did not appear (partx)");
        return;
    }
    let m = FileMember::open(Path::new(&part), DirectMode::Auto).unwrap();
    assert_eq!(m.size_bytes(), 10 * MIB);
    assert!(m.is_hole(0, 4 * MIB).unwrap(), "before the data");
    assert!(!m.is_hole(4 * MIB, 4096).unwrap(), "the data");
    assert!(
        m.is_hole(4 * MIB + (64 << 10), MIB).unwrap(),
        "after the data"
    );
    assert!(!m.known_zero());
}

/// A raid1 recovery over members with long runs of holes, under writes that land all over
/// the array meanwhile (two threads on interleaved 4 KiB blocks, so that each block's last
/// write is known): hole runs go up as many barrier units at once and must neither
/// deadlock with the writes nor zero what a write put on the new member. Every byte then
/// reads as the model, from both members and from the new one alone. Seeded; a failure
/// prints its seed (`URAID_SEED` replays it).
#[test]
fn hole_runs_under_writes_lose_nothing() {
    const MEMBER: u64 = 24 * MIB;
    const BLOCK: u64 = 4096;
    let base: u64 = std::env::var("URAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64);
    for round in 0..10 {
        let seed = base + round;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(|| one_round(seed, MEMBER, BLOCK));
            let _ = tx.send(r);
        });
        match rx.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("seed {seed}: failed (URAID_SEED={seed} replays it)"),
            Err(_) => panic!("seed {seed}: no end in 120 s: a deadlock? (URAID_SEED={seed})"),
        }
    }
}

fn one_round(seed: u64, member: u64, block: u64) {
    use rand::SeedableRng;
    let devs: Vec<Arc<uraid_engine::MemMember>> = (0..2)
        .map(|i| Arc::new(uraid_engine::MemMember::new(format!("m{i}"), member)))
        .collect();
    let mut o = CreateOptions::new(Level::Raid1);
    o.assume_clean = true;
    let a = uraid_engine::create(as_members(&devs), &o).unwrap();
    let size = a.size_bytes();
    let blocks = size / block;
    let mut model = vec![0u8; size as usize];
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    // A little data here and there before the recovery: long runs of holes between.
    for _ in 0..6 {
        let b = r.gen_range(0..blocks);
        let at = (b * block) as usize;
        r.fill(&mut model[at..at + block as usize]);
        a.write(at as u64, &model[at..at + block as usize]).unwrap();
    }
    a.fail_member(MemberIdx(1)).unwrap();
    a.remove_member(MemberIdx(1)).unwrap();
    let spare = Arc::new(uraid_engine::MemMember::new("spare", member));
    spare.write_at(&vec![0xa5u8; member as usize], 0).unwrap();
    a.add_member(spare).unwrap();
    let model = std::sync::Mutex::new(model);
    std::thread::scope(|sc| {
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let (a, model) = (&a, &model);
                sc.spawn(move || {
                    let mut r = rand::rngs::StdRng::seed_from_u64(seed ^ ((t + 1) * 0x9e37));
                    let mut buf = vec![0u8; block as usize];
                    for _ in 0..400 {
                        // Blocks of this thread only (every other one), so the model
                        // holds each block's last write.
                        let b = r.gen_range(0..blocks / 2) * 2 + t;
                        r.fill(&mut buf[..]);
                        a.write(b * block, &buf).unwrap();
                        let at = (b * block) as usize;
                        model.lock().unwrap()[at..at + block as usize].copy_from_slice(&buf);
                    }
                })
            })
            .collect();
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        for w in writers {
            w.join().unwrap();
        }
    });
    let model = model.into_inner().unwrap();
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::InSync, "seed {seed}");
    same(
        &read_all(&a, size as usize),
        &model,
        &format!("seed {seed}: both"),
    );
    a.fail_member(MemberIdx(0)).unwrap();
    same(
        &read_all(&a, size as usize),
        &model,
        &format!("seed {seed}: the new member alone"),
    );
}

/// A member on a new 16 MiB export of uraid's own NBD server (memory, which calls zero
/// blocks holes in its `base:allocation`) on a Unix socket in `dir`; the server is kept in
/// `servers`.
fn nbd_member(
    dir: &TempDir,
    name: &str,
    servers: &mut Vec<uraid_nbd::RunningServer>,
) -> Arc<uraid_engine::NbdMember> {
    use uraid_nbd::{Backend, Listener, MemBackend, Server, ServerConfig};
    let socket = dir.path(&format!("{name}.sock"));
    let listener = Listener::bind_unix(&socket).unwrap();
    let backend = Arc::new(MemBackend::new((16 * MIB) as usize)) as Arc<dyn Backend>;
    servers.push(
        Server::new(ServerConfig::default())
            .unwrap()
            .spawn(listener, backend)
            .unwrap(),
    );
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let m = uraid_engine::NbdMember::connect(&uri, &Default::default()).unwrap();
    assert!(m.client().info().block_status, "{uri}: base:allocation");
    Arc::new(m)
}

/// An NBD member remembers where the server said zeros only until the next write to it:
/// a write by `write_at` or through the array's batches (the member's `submit`) anywhere
/// makes it ask again, so a range written after a "zeros" answer is data at once.
#[test]
fn an_nbd_members_zeros_are_forgotten_at_the_next_write() {
    let dir = TempDir::new("nbd-zero-cache");
    let mut servers = Vec::new();
    let members: Vec<_> = (0..2)
        .map(|i| nbd_member(&dir, &format!("m{i}"), &mut servers))
        .collect();
    let m = &members[0];
    assert!(m.is_hole(MIB, 4096).unwrap());
    m.write_at(&[1; 512], MIB + 512).unwrap();
    assert!(!m.is_hole(MIB, 4096).unwrap(), "written by write_at");
    assert!(m.is_hole(2 * MIB, 4096).unwrap());

    // Through an array: its writes reach the members in batches.
    let mut o = CreateOptions::new(Level::Raid1);
    o.assume_clean = true;
    let a = uraid_engine::create(as_members(&members), &o).unwrap();
    let at = 8 * MIB;
    let on_member = read_superblock(members[1].as_ref()).unwrap().data_offset * 512 + at;
    assert!(members[1].is_hole(on_member, 4096).unwrap());
    a.write(at, &[7; 4096]).unwrap();
    assert!(
        !members[1].is_hole(on_member, 4096).unwrap(),
        "written through the array"
    );
    // The array dirty and the bitmap bit set already: the next write, in the same
    // bitmap chunk, is the members' batch alone.
    assert!(members[1].is_hole(on_member + 65536, 4096).unwrap());
    a.write(at + 65536, &[8; 4096]).unwrap();
    assert!(
        !members[1].is_hole(on_member + 65536, 4096).unwrap(),
        "written through the array's batch"
    );
    drop(a);
    for s in servers {
        s.shutdown().unwrap();
    }
}

/// Remote members say where they read as zeros (NBD `base:allocation`, here from uraid's
/// own server over memory, which calls zero blocks holes).
#[test]
fn recovery_over_nbd_members_moves_only_what_was_written() {
    for (level, disks) in [(Level::Raid1, 2), (Level::Raid5, 4)] {
        let dir = TempDir::new(&format!("sparse-nbd-{level}"));
        let mut servers = Vec::new();
        let devs = (0..disks)
            .map(|i| nbd_member(&dir, &format!("m{i}"), &mut servers) as Arc<dyn Member>)
            .collect();
        let spare = nbd_member(&dir, "spare", &mut servers);
        recovery_moves_only_what_was_written(level, devs, spare, &format!("{level} over NBD"));
        for s in servers {
            s.shutdown().unwrap();
        }
    }
}

/// A real NBD server, killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A member on the export `cmd` serves on `sock` (connected once the server is up).
fn real_server_member(
    mut cmd: std::process::Command,
    sock: &Path,
    kept: &mut Vec<Killed>,
) -> Arc<dyn Member> {
    kept.push(Killed(cmd.spawn().unwrap()));
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let started = std::time::Instant::now();
    loop {
        match uraid_engine::NbdMember::connect(&uri, &Default::default()) {
            Ok(m) => {
                assert!(m.client().info().block_status, "{cmd:?}: base:allocation");
                return Arc::new(m);
            }
            Err(e) if started.elapsed() > std::time::Duration::from_secs(20) => {
                panic!("{cmd:?} did not serve {uri}: {e}")
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// The same over the servers users run: nbdkit's memory plugin (sparse pages) and
/// qemu-nbd on sparse raw images (SEEK_DATA underneath).
#[test]
fn recovery_over_nbdkit_and_qemu_nbd_moves_only_what_was_written() {
    const TEST: &str = "recovery_over_nbdkit_and_qemu_nbd_moves_only_what_was_written";
    for server in ["nbdkit", "qemu-nbd"] {
        if !uraid_testkit::need_tool(server, TEST) {
            continue;
        }
        let dir = TempDir::new(&format!("sparse-{server}"));
        let mut kept = Vec::new();
        let mut open_export = |name: &str| -> Arc<dyn Member> {
            let sock = dir.path(&format!("{name}.sock"));
            let mut cmd = std::process::Command::new(server);
            if server == "nbdkit" {
                cmd.args(["-f", "--exit-with-parent", "-U"])
                    .arg(&sock)
                    .args(["memory", "16M"]);
            } else {
                let img = dir.path(&format!("{name}.raw"));
                std::fs::File::create(&img)
                    .unwrap()
                    .set_len(16 * MIB)
                    .unwrap();
                cmd.args(["-t", "-f", "raw", "-k"]).arg(&sock).arg(&img);
            }
            real_server_member(cmd, &sock, &mut kept)
        };
        let devs = (0..4).map(|i| open_export(&format!("m{i}"))).collect();
        let spare = open_export("spare");
        recovery_moves_only_what_was_written(
            Level::Raid5,
            devs,
            spare,
            &format!("raid5 over {server}"),
        );
    }
}
