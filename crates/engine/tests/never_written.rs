//! Recovery over members that cannot say where they were never written (block devices):
//! the array remembers the regions it zeroed as a whole (WRITE_ZEROES, a discard that the
//! members turn into zeros) and that no write touched since, and a recovery zeroes the new
//! member there instead of rebuilding it, which md cannot (issue 18: "recovery skips what
//! was never written when the array knows it (ranges discarded since creation)").

use rand::Rng;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{
    assemble, read_superblock, write_superblock, AssembleOptions, CreateOptions, KeptWritten,
    MemMember, Member,
};
use uraid_testkit::engine::{as_members, recover_role_1, recovered_holds, rng, Counting};
use uraid_testkit::tmp::{TempDir, MIB};

/// A used disk of `size` bytes: garbage everywhere, and no say about where it was never
/// written; its reads and writes counted.
fn disk(name: &str, size: u64, seed: u64) -> Arc<Counting> {
    let inner = MemMember::new(name, size);
    let mut junk = vec![0u8; size as usize];
    rng(seed).fill(&mut junk[..]);
    inner.write_at(&junk, 0).unwrap();
    Counting::hiding_holes(Arc::new(inner))
}

/// Whether `len` bytes at `offset` of a disk read as zeros.
fn zeros(d: &Counting, offset: u64, len: u64) -> bool {
    let mut b = vec![1u8; len as usize];
    d.inner.read_at(&mut b, offset).unwrap();
    b.iter().all(|&x| x == 0)
}

const LEVELS: [(Level, usize); 4] = [
    (Level::Raid1, 2),
    (Level::Raid10, 4),
    (Level::Raid5, 4),
    (Level::Raid6, 5),
];

const MEMBER: u64 = 16 * MIB;

fn create(level: Level, devs: &[Arc<Counting>]) -> uraid_engine::Array {
    let mut o = CreateOptions::new(level);
    if level != Level::Raid1 {
        o.chunk_sectors = Some(128);
    }
    o.assume_clean = true;
    uraid_engine::create(as_members(devs), &o).unwrap()
}

/// An array made zeros as a whole (WRITE_ZEROES, or a discard its members turn into
/// zeros), then partly written: a recovery onto a used disk reads and writes about what
/// was written since, every byte reads as the model, parity and copies agree, and the new
/// member carries its share. Without the zeroing the same recovery moves everything.
#[test]
fn a_recovery_rebuilds_only_what_was_written_since_the_array_was_zeroed() {
    for (level, disks) in LEVELS {
        for discard in [false, true] {
            let what = format!(
                "{level} after {}",
                if discard { "a discard" } else { "write-zeroes" }
            );
            let devs: Vec<Arc<Counting>> = (0..disks)
                .map(|i| disk(&format!("d{i}"), MEMBER, i as u64))
                .collect();
            let a = create(level, &devs);
            let size = a.size_bytes();
            assert_eq!(
                a.never_written_bytes(),
                0,
                "{what}: a new array over used disks"
            );
            if discard {
                assert!(a.discard_passes_down(), "{what}");
                a.discard(0, size).unwrap();
            } else {
                a.write_zeroes(0, size).unwrap();
            }
            // raid5/6 zero whole stripes only: the tail past the last whole region of
            // them stays written.
            assert!(
                a.never_written_bytes() >= size - 2 * MIB,
                "{what}: {} of {size} bytes known never written after zeroing it all",
                a.never_written_bytes()
            );
            let mut model = vec![0u8; size as usize];
            let mut r = rng(18);
            let ranges = [(0u64, MIB), (5 * MIB + 4096, 192 << 10)];
            for (at, len) in ranges {
                let (s, e) = (at as usize, (at + len) as usize);
                r.fill(&mut model[s..e]);
                a.write(at, &model[s..e]).unwrap();
                assert!(!a.knows_never_written(at, len), "{what}: written at {at}");
            }
            assert!(a.knows_never_written(8 * MIB, MIB), "{what}");
            a.flush().unwrap();

            for d in &devs {
                d.reset();
            }
            let new = disk("new", MEMBER, 99);
            let zero_bytes = recover_role_1(&a, new.clone());
            assert!(
                zero_bytes >= size / 4,
                "{what}: {zero_bytes} bytes of {size} passed over as never written"
            );
            let read: Vec<u64> = devs.iter().map(|d| d.read.load(SeqCst)).collect();
            let rebuilt = new.written.load(SeqCst);
            assert!(
                read.iter().all(|&n| n < MEMBER / 4) && rebuilt < MEMBER / 4,
                "{what}: the recovery read {read:?} bytes from the others and wrote \
                 {rebuilt} to the new member, of {MEMBER} each"
            );
            recovered_holds(&a, &model, &what);
        }
    }
}

/// The export's `base:allocation` ([`uraid_engine::Array::allocation`]) says zeros where
/// the array knows it was never written, on every level, so that a client copying the
/// array (nbdcopy, qemu-img convert) skips it; data everywhere before the zeroing (the disks are full of garbage) and wherever a
/// write went since. Every run it calls zeros reads as zeros. Never a hole: the disks
/// cannot say what is allocated.
#[test]
fn block_status_says_zeros_where_the_array_knows_it_never_wrote() {
    for (level, disks) in LEVELS {
        let devs: Vec<Arc<Counting>> = (0..disks)
            .map(|i| disk(&format!("d{i}"), MEMBER, 40 + i as u64))
            .collect();
        let a = create(level, &devs);
        let size = a.size_bytes();
        let runs = |a: &uraid_engine::Array| {
            let mut out = Vec::new();
            let mut at = 0;
            while at < size {
                for e in a.allocation(at, size - at) {
                    assert!(
                        !e.hole,
                        "{level}: a hole at {at} on members that cannot say"
                    );
                    out.push((at, e.len_bytes, e.zero));
                    at += e.len_bytes;
                }
            }
            out
        };
        assert!(
            runs(&a).iter().all(|&(_, _, zero)| !zero),
            "{level}: zeros claimed on a new array over used disks"
        );
        a.write_zeroes(0, size).unwrap();
        // In a unit of raid5/6 (192 KiB) that begins in the region before.
        let (at, len) = (5 * MIB + 4096, 8192);
        a.write(at, &[0x5au8; 8192]).unwrap();
        let got = runs(&a);
        let zero_bytes: u64 = got.iter().filter(|r| r.2).map(|r| r.1).sum();
        assert!(
            zero_bytes >= size - 4 * MIB,
            "{level}: {zero_bytes} of {size} bytes said zeros: {got:?}"
        );
        let mut b = vec![0u8; MIB as usize];
        for &(start, n, zero) in &got {
            if start < at + len && at < start + n {
                assert!(!zero, "{level}: the written range said zeros: {got:?}");
            }
            if zero {
                for off in (start..start + n).step_by(MIB as usize) {
                    let k = (start + n - off).min(MIB) as usize;
                    a.read(off, &mut b[..k]).unwrap();
                    assert!(b[..k].iter().all(|&x| x == 0), "{level}: data at {off}");
                }
            }
        }
    }
}

/// mdadm's `--write-zeroes` at create ([`CreateOptions::write_zeroes`]) over used disks:
/// every member's share of the array reads zeros, with no initial sync; copies and parity
/// agree; the array knows it was never written, so a recovery writes zeros and reads
/// nothing; and no byte outside the data area (the superblock, md's reserved space before
/// the data) was zeroed.
#[test]
fn create_with_write_zeroes_zeroes_the_data_areas_and_knows_it() {
    for (level, disks) in LEVELS.into_iter().chain([(Level::Raid0, 2)]) {
        let devs: Vec<Arc<Counting>> = (0..disks)
            .map(|i| disk(&format!("d{i}"), MEMBER, 60 + i as u64))
            .collect();
        let mut o = CreateOptions::new(level);
        if level != Level::Raid1 {
            o.chunk_sectors = Some(128);
        }
        o.write_zeroes = true;
        let a = uraid_engine::create(as_members(&devs), &o).unwrap();
        let size = a.size_bytes();
        let read: u64 = devs.iter().map(|d| d.read.load(SeqCst)).sum();
        assert!(
            read < MIB,
            "{level}: create read {read} bytes: no initial sync"
        );
        assert_eq!(a.never_written_bytes(), size, "{level}");
        let mut b = vec![1u8; size as usize];
        a.read(0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0), "{level}: the array reads zeros");
        for (i, d) in devs.iter().enumerate() {
            let off = a.slot(MemberIdx(i)).data_offset_bytes();
            assert!(off > 4096, "{level}: 1.2 puts data after the superblock");
            assert!(
                !zeros(d, 4096 + 512, off - 4096 - 512),
                "{level}: member {i} zeroed before its data area"
            );
        }
        if level == Level::Raid0 {
            continue;
        }
        assert_eq!(a.check().unwrap(), 0, "{level}");
        for d in &devs {
            d.reset();
        }
        let new = disk("new", MEMBER, 98);
        recover_role_1(&a, new.clone());
        let read: u64 = devs.iter().map(|d| d.read.load(SeqCst)).sum();
        assert!(
            read < MIB && new.written.load(SeqCst) < MIB,
            "{level}: the recovery read {read} bytes and wrote {}",
            new.written.load(SeqCst)
        );
        recovered_holds(&a, &vec![0u8; size as usize], &format!("{level}"));
    }
}

/// Without a zeroing the array knows nothing, and a recovery rebuilds every byte (as md
/// does): the test above depends on what the array remembers, not on its members.
#[test]
fn without_a_zeroing_a_recovery_rebuilds_everything() {
    let devs: Vec<Arc<Counting>> = (0..2).map(|i| disk(&format!("d{i}"), MEMBER, i)).collect();
    let a = create(Level::Raid1, &devs);
    a.write(0, &vec![7u8; MIB as usize]).unwrap();
    let new = disk("new", MEMBER, 99);
    recover_role_1(&a, new.clone());
    assert!(new.written.load(SeqCst) >= a.size_bytes());
    assert_eq!(a.check().unwrap(), 0);
}

/// A write and a zeroing of its region at once, in seeded rounds, each member write
/// taking a millisecond: wherever the array then says "never written", every member
/// reads zeros (a write under way when the zeroing began is waited for; one that entered
/// after it leaves the region written, whichever reached the members last), and a
/// recovery leaves the copies equal. `URAID_SEED` repeats a seed.
#[test]
fn zeroings_beside_writes_never_forget_a_write() {
    let seeds: Vec<u64> = match std::env::var("URAID_SEED") {
        Ok(s) => vec![s.parse().expect("URAID_SEED is a number")],
        Err(_) => (1..=4).collect(),
    };
    for seed in seeds {
        eprintln!("seed {seed} (URAID_SEED={seed} repeats it)");
        let devs: Vec<Arc<Counting>> = (0..2)
            .map(|i| disk(&format!("d{i}"), 8 * MIB, seed * 10 + i))
            .collect();
        let a = create(Level::Raid1, &devs);
        for d in &devs {
            d.slow.store(true, SeqCst);
        }
        let regions = a.size_bytes() / MIB;
        let mut r = rng(seed);
        let mut forgotten = 0;
        for round in 0..40 {
            let reg = r.gen_range(0..regions);
            let (write_after, zero_after) = (r.gen_range(0..1500u64), r.gen_range(0..1500u64));
            let at = reg * MIB + r.gen_range(0..MIB / 4096) * 4096;
            std::thread::scope(|s| {
                let a = &a;
                s.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_micros(write_after));
                    a.write(at, &[round as u8 + 1; 4096]).unwrap();
                });
                std::thread::sleep(std::time::Duration::from_micros(zero_after));
                a.write_zeroes(reg * MIB, MIB).unwrap();
            });
            if a.knows_never_written(reg * MIB, MIB) {
                forgotten += 1;
                for (i, d) in devs.iter().enumerate() {
                    let off = a.slot(MemberIdx(i)).data_offset_bytes() + reg * MIB;
                    assert!(
                        zeros(d, off, MIB),
                        "seed {seed} round {round}: region {reg} said never written, \
                         member {i} holds data"
                    );
                }
            }
        }
        eprintln!("seed {seed}: 40 rounds, {forgotten} left the region never written");
        for d in &devs {
            d.slow.store(false, SeqCst);
        }
        recover_role_1(&a, disk("new", 8 * MIB, 7));
        assert_eq!(
            a.check().unwrap(),
            0,
            "seed {seed}: copies differ after recovery"
        );
    }
}

fn dyn_members(devs: &[Arc<Counting>]) -> Vec<Arc<dyn Member>> {
    devs.iter().map(|d| d.clone() as Arc<dyn Member>).collect()
}

/// An array zeroed as a whole, partly written and stopped cleanly, with its map kept in
/// `dir`; returns its members and the model of its content.
fn zeroed_written_stopped(
    level: Level,
    disks: usize,
    dir: &std::path::Path,
) -> (Vec<Arc<Counting>>, Vec<u8>) {
    let devs: Vec<Arc<Counting>> = (0..disks)
        .map(|i| disk(&format!("d{i}"), MEMBER, i as u64))
        .collect();
    let a = create(level, &devs);
    assert_eq!(a.keep_written_in(dir).unwrap(), KeptWritten::Nothing);
    let size = a.size_bytes();
    a.write_zeroes(0, size).unwrap();
    let mut model = vec![0u8; size as usize];
    rng(3).fill(&mut model[MIB as usize..2 * MIB as usize]);
    a.write(MIB, &model[MIB as usize..2 * MIB as usize])
        .unwrap();
    a.stop().unwrap();
    (devs, model)
}

fn saved_file(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "written"))
}

/// A clean stop saves what the array knows was never written, stamped in the superblocks'
/// utime microseconds (the seconds stay right for md and mdadm); the next assembly takes
/// it back (and removes the file), and a recovery then rebuilds only what was written.
#[test]
fn a_clean_stop_keeps_what_was_never_written_for_the_next_start() {
    for (level, disks) in [(Level::Raid1, 2), (Level::Raid5, 4)] {
        let dir = TempDir::new("keep-written");
        let (devs, model) = zeroed_written_stopped(level, disks, &dir.0);
        assert!(
            saved_file(&dir.0).is_some(),
            "{level}: no map saved at the stop"
        );
        let sb = read_superblock(devs[0].as_ref()).unwrap();
        assert_ne!(
            sb.utime >> 40,
            0,
            "{level}: the stamp is in utime's microseconds"
        );
        assert!(
            sb.utime_secs() > 1_600_000_000,
            "{level}: utime's seconds stay a date"
        );

        let (a, _) = assemble(dyn_members(&devs), &AssembleOptions::default()).unwrap();
        let size = a.size_bytes();
        match a.keep_written_in(&dir.0).unwrap() {
            KeptWritten::Restored {
                never_written_bytes,
            } => assert!(
                never_written_bytes >= size - 4 * MIB,
                "{level}: {never_written_bytes} of {size} bytes restored as never written"
            ),
            other => panic!("{level}: {other}"),
        }
        assert!(
            saved_file(&dir.0).is_none(),
            "{level}: the file is taken once"
        );
        assert!(!a.knows_never_written(MIB, MIB) && a.knows_never_written(8 * MIB, MIB));

        let new = disk("new", MEMBER, 99);
        recover_role_1(&a, new.clone());
        assert!(
            new.written.load(SeqCst) < MEMBER / 4,
            "{level}: the recovery wrote {} bytes",
            new.written.load(SeqCst)
        );
        recovered_holds(&a, &model, &level.to_string());
    }
}

/// A saved map is not trusted once anything else wrote the array: Linux md (its
/// superblock writes carry whole seconds in utime, and may end at the same events), or an
/// unclean uraid session (its first write changed the superblocks); nor is a damaged file.
#[test]
fn a_saved_map_is_not_trusted_after_another_writer() {
    let dir = TempDir::new("keep-written-stale");
    // Linux md assembled it, wrote, and marked it clean again at the same events.
    let (devs, _) = zeroed_written_stopped(Level::Raid1, 2, &dir.0);
    for d in &devs {
        let mut sb = read_superblock(d.as_ref()).unwrap();
        sb.utime &= (1 << 40) - 1;
        write_superblock(d.as_ref(), &sb).unwrap();
    }
    let (a, _) = assemble(dyn_members(&devs), &AssembleOptions::default()).unwrap();
    let kept = a.keep_written_in(&dir.0).unwrap();
    assert!(
        matches!(kept, KeptWritten::Stale(ref w) if w.contains("written since")),
        "{kept}"
    );
    assert_eq!(a.never_written_bytes(), 0);
    assert!(saved_file(&dir.0).is_none(), "a stale file is removed");
    drop(a);

    // A session that wrote and did not stop cleanly, with an old file still lying there.
    let (devs, _) = zeroed_written_stopped(Level::Raid1, 2, &dir.0);
    let file = saved_file(&dir.0).unwrap();
    let copy = std::fs::read(&file).unwrap();
    let (a, _) = assemble(dyn_members(&devs), &AssembleOptions::default()).unwrap();
    assert!(matches!(
        a.keep_written_in(&dir.0).unwrap(),
        KeptWritten::Restored { .. }
    ));
    a.write(8 * MIB, &[5u8; 4096]).unwrap();
    let _ = a.force_stop();
    std::mem::forget(a); // no clean stop on drop: the process died
    std::fs::write(&file, &copy).unwrap();
    let (a, _) = assemble(dyn_members(&devs), &AssembleOptions::default()).unwrap();
    let kept = a.keep_written_in(&dir.0).unwrap();
    assert!(matches!(kept, KeptWritten::Stale(_)), "{kept}");
    assert!(!a.knows_never_written(8 * MIB, 4096));
    drop(a);

    // A damaged file.
    let (devs, _) = zeroed_written_stopped(Level::Raid1, 2, &dir.0);
    let file = saved_file(&dir.0).unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[66] ^= 0x10; // in the map
    std::fs::write(&file, &bytes).unwrap();
    let (a, _) = assemble(dyn_members(&devs), &AssembleOptions::default()).unwrap();
    let kept = a.keep_written_in(&dir.0).unwrap();
    assert!(
        matches!(kept, KeptWritten::Stale(ref w) if w.contains("checksum")),
        "{kept}"
    );
    assert_eq!(a.never_written_bytes(), 0);
}
