//! md's bad block log: a read error whose rewrite fails is recorded instead of failing the
//! member, reads of a recorded range are answered from redundancy, a successful write clears
//! it, the log is written in md's format (mdadm --examine-badblocks lists it) and loaded again
//! at assembly.

use rand::Rng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_core::superblock::FEATURE_BAD_BLOCKS;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{assemble, Array, AssembleOptions, Member, SlotState};
use uraid_engine::{DirectMode, FileMember};
use uraid_sim::FaultMember;
use uraid_testkit::engine::*;

fn cfg(level: Level, disks: usize) -> Config {
    Config {
        level,
        layout: None,
        disks,
        chunk_sectors: 16,
        member_bytes: vec![2 << 20; disks],
    }
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut v = vec![0u8; a.size_bytes() as usize];
    a.read(0, &mut v).unwrap();
    v
}

/// A random 4 KiB-aligned array offset that lies on member 0: (array byte, member 0's
/// data-area byte).
fn on_member0(a: &Array, seed: u64) -> (u64, u64) {
    let mut r = rng(seed);
    loop {
        let off = r.gen_range(0..a.size_bytes() / 4096) * 4096;
        match a.personality() {
            uraid_core::geometry::Personality::Parity(g) => {
                let loc = g.locate(off / 512);
                if g.stripe_map(loc.stripe).data[loc.data_index].0 == 0 {
                    return (off, g.member_sector(loc.stripe, loc.offset_sectors) * 512);
                }
            }
            // raid1 reads 1 MiB regions from member (region % disks) first.
            _ if ((off / 512) >> 11) % a.raid_disks() as u64 == 0 => return (off, off),
            _ => {}
        }
    }
}

/// Member 0 has a sector that can be neither read nor rewritten.
fn run_level(level: Level, disks: usize, seed: u64) {
    let c = cfg(level, disks);
    let mems = mem_members(&c, "b");
    let flaky = Arc::new(FaultMember::new(mems[0].clone()));
    let mut devs = as_members(&mems);
    devs[0] = Some(flaky.clone());
    let a = uraid_engine::create(devs, &create_opts(&c)).unwrap();
    let mut model = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    let (off, member_off) = on_member0(&a, seed);
    let data_offset = a.slot(MemberIdx(0)).data_offset_bytes();
    let bad_byte = data_offset + member_off;
    flaky.set_range(bad_byte, bad_byte + 512);
    flaky.fail_reads.store(true, Ordering::SeqCst);
    flaky.fail_writes.store(true, Ordering::SeqCst);
    let mut b = vec![0u8; 4096];
    let at = off;
    a.read(at, &mut b).unwrap();
    assert!(
        b[..] == model[at as usize..at as usize + 4096],
        "{level}: read wrong"
    );
    assert_eq!(
        a.slot_state(MemberIdx(0)),
        SlotState::InSync,
        "{level}: member failed over one bad sector"
    );
    let bb = a.slot(MemberIdx(0)).bad_blocks();
    assert!(bb.overlaps(bad_byte / 512, 1), "{level}: {bb:?}");
    let sb = uraid_engine::read_superblock(mems[0].as_ref()).unwrap();
    assert_ne!(sb.feature_map & FEATURE_BAD_BLOCKS, 0);
    // The device now reads the sector, but the log still says bad: redundancy answers.
    flaky.fail_reads.store(false, Ordering::SeqCst);
    mems[0].write_at(&[0xa5; 512], bad_byte).unwrap();
    assert!(
        read_all(&a) == model,
        "{level}: a recorded bad block was read"
    );
    // Restart: the log comes back from the member.
    a.stop().unwrap();
    drop(a);
    let devs: Vec<Arc<dyn Member>> = std::iter::once(flaky.clone() as Arc<dyn Member>)
        .chain(mems[1..].iter().map(|m| m.clone() as Arc<dyn Member>))
        .collect();
    let (a, _) = assemble(devs, &AssembleOptions::default()).unwrap();
    assert!(a
        .slot(MemberIdx(0))
        .bad_blocks()
        .overlaps(bad_byte / 512, 1));
    assert!(read_all(&a) == model, "{level}: read wrong after restart");
    // A write over the range that succeeds clears it, on disk at the next update.
    flaky.fail_writes.store(false, Ordering::SeqCst);
    let mut fresh = vec![0u8; 4096];
    rng(seed ^ 1).fill(&mut fresh[..]);
    a.write(at, &fresh).unwrap();
    model[at as usize..at as usize + 4096].copy_from_slice(&fresh);
    {
        assert!(
            a.slot(MemberIdx(0)).bad_blocks().is_empty(),
            "{level}: {:?} bad_byte {bad_byte} at {at}",
            a.slot(MemberIdx(0)).bad_blocks()
        );
        a.stop().unwrap();
        let sb = uraid_engine::read_superblock(mems[0].as_ref()).unwrap();
        assert_eq!(sb.feature_map & FEATURE_BAD_BLOCKS, 0);
    }
    assert!(read_all(&a) == model);
    assert_eq!(a.check().unwrap(), 0);
}

#[test]
fn unrewritable_sector_is_recorded_not_failed() {
    for seed in 1..=3 {
        run_level(Level::Raid1, 2, seed);
        run_level(Level::Raid5, 4, seed);
        run_level(Level::Raid6, 5, seed);
    }
}

/// Without a log (or with a full one) md fails the member, and so do we.
#[test]
fn without_a_log_the_member_is_failed() {
    let c = cfg(Level::Raid1, 2);
    let mems = mem_members(&c, "n");
    let flaky = Arc::new(FaultMember::new(mems[0].clone()));
    let mut devs = as_members(&mems);
    devs[0] = Some(flaky.clone());
    // Data right after the superblock: no room for a log (mdadm makes none either).
    let mut o = create_opts(&c);
    o.data_offset_sectors = Some(16);
    let a = uraid_engine::create(devs, &o).unwrap();
    let sb = uraid_engine::read_superblock(mems[0].as_ref()).unwrap();
    assert_eq!(sb.bblog_size * (sb.bblog_offset != 0) as u16, 0, "{sb:?}");
    flaky.set_range(16 * 512, 17 * 512);
    flaky.fail_reads.store(true, Ordering::SeqCst);
    flaky.fail_writes.store(true, Ordering::SeqCst);
    let mut b = vec![0u8; 4096];
    a.read(0, &mut b).unwrap();
    assert_eq!(a.slot_state(MemberIdx(0)), SlotState::Faulty);
}

/// mdadm reads the log uraid writes.
#[test]
fn mdadm_examine_badblocks_lists_our_log() {
    if !uraid_testkit::need_tool("mdadm", "mdadm_examine_badblocks_lists_our_log") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uraid-bb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<_> = (0..2).map(|i| dir.join(format!("m{i}.img"))).collect();
    let files: Vec<Arc<dyn Member>> = paths
        .iter()
        .map(|p| {
            std::fs::File::create(p).unwrap().set_len(8 << 20).unwrap();
            Arc::new(FileMember::open(p, DirectMode::Off).unwrap()) as Arc<dyn Member>
        })
        .collect();
    let flaky = Arc::new(FaultMember::new(files[0].clone()));
    let c = cfg(Level::Raid1, 2);
    let a = uraid_engine::create(
        vec![
            Some(flaky.clone() as Arc<dyn Member>),
            Some(files[1].clone()),
        ],
        &create_opts(&c),
    )
    .unwrap();
    a.write(0, &vec![7u8; 1 << 20]).unwrap();
    let data_offset = a.slot(MemberIdx(0)).data_offset_bytes();
    let bad = data_offset + 300 * 512;
    flaky.set_range(bad, bad + 1024);
    flaky.fail_reads.store(true, Ordering::SeqCst);
    flaky.fail_writes.store(true, Ordering::SeqCst);
    let mut b = vec![0u8; 1024];
    a.read(300 * 512, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 7));
    a.stop().unwrap();
    drop(a);
    let out = std::process::Command::new("mdadm")
        .arg("--examine-badblocks")
        .arg(&paths[0])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "mdadm failed: {text}");
    let want = format!("{} for 2 sectors", bad / 512);
    assert!(
        text.contains(&want),
        "mdadm --examine-badblocks: {text}\nwanted {want}"
    );
}
