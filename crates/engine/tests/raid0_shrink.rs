//! A raid0's shrink (`uraid grow -n N-1 --array-size SIZE`), md's way through raid4: the
//! takeover to a raid4 of N + 1 with its parity role missing, md's backwards shrink of that
//! raid4 to N devices (the last kept role becoming the parity), and md's takeover back to
//! raid0, the parity member leaving the array as mdadm's `--level=0` makes it leave.
//! Stopped mid-way and continued, refusals that write nothing, a power cut after every
//! write of the whole operation, and a device that left a raid0 as Linux leaves it.

use rand::Rng;
use std::sync::Arc;
use uraid_core::superblock::{
    FEATURE_NEW_OFFSET, FEATURE_RESHAPE_ACTIVE, FEATURE_RESHAPE_BACKWARDS, ROLE_FAULTY, ROLE_SPARE,
};
use uraid_core::Level;
use uraid_engine::{
    assemble, continue_reshape, create, grow_members, grow_members_with, read_superblock,
    write_superblock, Array, AssembleOptions, CreateOptions, GrowRequest, MemMember, Member,
    MemberOutcome, ReshapeOptions, SyncKind,
};
use uraid_sim::disk::{Power, SimDisk, SimWorld};
use uraid_testkit::engine::{read_all, rng, same};

const MB: u64 = 1 << 20;

fn members(n: usize, bytes: u64, tag: &str) -> Vec<Arc<dyn Member>> {
    (0..n)
        .map(|i| Arc::new(MemMember::new(format!("{tag}{i}"), bytes)) as Arc<dyn Member>)
        .collect()
}

/// A raid0 with `chunk_kib` chunks and data from `data_offset`, filled with seeded bytes;
/// the bytes.
fn raid0(devs: &[Arc<dyn Member>], chunk_kib: u64, data_offset: u64, seed: u64) -> Vec<u8> {
    let mut o = CreateOptions::new(Level::Raid0);
    o.chunk_sectors = Some(chunk_kib * 2);
    o.data_offset_sectors = Some(data_offset);
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    data
}

fn open(devs: &[Arc<dyn Member>]) -> (Array, uraid_engine::AssembleReport) {
    assemble(devs.to_vec(), &AssembleOptions::default()).unwrap()
}

fn all_bytes(devs: &[Arc<dyn Member>]) -> Vec<Vec<u8>> {
    devs.iter()
        .map(|d| {
            let mut b = vec![0u8; d.size_bytes() as usize];
            d.read_at(&mut b, 0).unwrap();
            b
        })
        .collect()
}

fn shrink(to: usize, keep: Option<u64>) -> GrowRequest {
    GrowRequest {
        raid_disks: Some(to),
        array_sectors: keep,
        ..Default::default()
    }
}

fn to_raid0() -> GrowRequest {
    GrowRequest {
        level: Some(Level::Raid0),
        ..Default::default()
    }
}

/// The finished raid0 of `disks` on `kept` (the leaving devices `left` offered with them):
/// every kept byte, its superblocks md's (level 0, the count, the chunk, `size` and
/// `data_size` the component size), each leaving device left out (faulty or stale, never
/// a member or a spare) with its own superblock behind by at least two events.
fn verify_raid0(
    kept: &[Arc<dyn Member>],
    left: &[Arc<dyn Member>],
    data: &[u8],
    chunk: u64,
    what: &str,
) {
    let mut all = kept.to_vec();
    all.extend(left.iter().cloned());
    let (a, rep) = open(&all);
    assert_eq!(
        (a.level(), a.raid_disks()),
        (Level::Raid0, kept.len()),
        "{what}: {rep:?}"
    );
    same(&read_all(&a, data.len()), data, what);
    let size = a.size_bytes();
    a.stop().unwrap();
    for m in &rep.members[kept.len()..] {
        assert!(
            matches!(m.outcome, MemberOutcome::Faulty | MemberOutcome::Stale),
            "{what}: the device that left: {rep:?}"
        );
    }
    let sb0 = read_superblock(kept[0].as_ref()).unwrap();
    assert_eq!(size, sb0.size * 512 * kept.len() as u64, "{what}: size");
    for d in kept {
        let sb = read_superblock(d.as_ref()).unwrap();
        assert_eq!(
            (sb.level, sb.raid_disks as usize, u64::from(sb.chunksize)),
            (0, kept.len(), chunk),
            "{what}: {}",
            d.name()
        );
        assert_eq!((sb.size, sb.data_size), (sb0.size, sb0.size), "{what}");
        assert_eq!(
            sb.feature_map & (FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET),
            0,
            "{what}"
        );
        for l in left {
            let n = read_superblock(l.as_ref()).unwrap().dev_number as usize;
            assert_eq!(
                sb.dev_roles[n], ROLE_FAULTY,
                "{what}: the leaving device's role"
            );
        }
    }
    for l in left {
        let sb = read_superblock(l.as_ref()).unwrap();
        assert_eq!(sb.level, 4, "{what}: {} keeps its raid4 record", l.name());
        assert!(sb.events + 2 <= sb0.events, "{what}: events {}", sb.events);
    }
}

/// `-n 2 --array-size` on a raid0 of 3, stopped mid-way: a raid4 of 4 -> 3 mid-reshape as
/// md records one (backwards, a new offset up, role 3 missing), with every kept byte (its
/// old geometry has no parity, so md's check has nothing to compare yet) and no takeover
/// while it runs; continued, a whole raid4 of 3 (parity on role 2, check 0); `--level 0`
/// then takes it to a raid0 of 2 as mdadm does (the parity member leaves). The same in one
/// request without a stop.
#[test]
fn a_raid0_shrinks_through_raid4_stopped_mid_way_and_continued() {
    let devs = members(3, 6 * MB, "s0a-");
    let data = raid0(&devs, 64, 2048, 71);
    let chunk = 128;
    let zone = read_superblock(devs[0].as_ref()).unwrap().data_size / chunk * chunk;
    let keep = 2 * zone - 4 * chunk;
    let kept = &data[..(keep * 512) as usize];
    let r = grow_members_with(
        devs.clone(),
        &shrink(2, Some(keep)),
        ReshapeOptions {
            stop_at: Some(keep / 2),
            ..Default::default()
        },
    )
    .unwrap();
    let done = r.reshape.clone().unwrap();
    assert!(!done.finished && done.position_sectors <= keep / 2, "{r:?}");
    assert!(r.summary.contains("uraid grow --continue"), "{}", r.summary);
    for d in &devs {
        let sb = read_superblock(d.as_ref()).unwrap();
        assert_eq!(
            (sb.level, sb.raid_disks, sb.delta_disks, sb.new_level),
            (4, 3, -1, 4)
        );
        assert_eq!(
            sb.feature_map
                & (FEATURE_RESHAPE_ACTIVE | FEATURE_RESHAPE_BACKWARDS | FEATURE_NEW_OFFSET),
            FEATURE_RESHAPE_ACTIVE | FEATURE_RESHAPE_BACKWARDS | FEATURE_NEW_OFFSET
        );
        assert!(sb.new_offset > 0);
        // The takeover's parity role (3) has no device.
        assert!(!sb.dev_roles.contains(&3), "{:?}", &sb.dev_roles[..4]);
    }
    let (a, _) = open(&devs);
    assert!(a.is_reshaping());
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid4, 4));
    same(&read_all(&a, kept.len()), kept, "mid-way");
    a.stop().unwrap();
    // No takeover while the reshape runs (md's EBUSY): --level 0 now is refused.
    let before = all_bytes(&devs);
    let e = grow_members(devs.clone(), &to_raid0())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a reshape is in progress") && e.contains("nothing was written"),
        "{e}"
    );
    assert!(all_bytes(&devs) == before, "a refusal wrote");
    let c = continue_reshape(devs.clone(), ReshapeOptions::default()).unwrap();
    assert!(c.finished, "{c:?}");
    let (a, _) = open(&devs);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid4, 3));
    assert!(a.missing_roles().is_empty());
    same(&read_all(&a, kept.len()), kept, "the raid4 of 3");
    assert_eq!(
        a.run_sync(SyncKind::Check, |_| {}).unwrap(),
        0,
        "raid4 of 3"
    );
    a.stop().unwrap();
    let t = grow_members(devs.clone(), &to_raid0()).unwrap();
    assert!(t.summary.contains("leaves the array"), "{}", t.summary);
    verify_raid0(&devs[..2], &devs[2..], kept, chunk, "continued");

    // The same in one request.
    let devs = members(3, 6 * MB, "s0b-");
    let data = raid0(&devs, 64, 2048, 72);
    let r = grow_members(devs.clone(), &shrink(2, Some(keep))).unwrap();
    assert!(r.reshape.as_ref().is_some_and(|d| d.finished), "{r:?}");
    assert!(
        r.summary.contains("raid0 -> raid4") && r.summary.contains("-> raid0"),
        "{}",
        r.summary
    );
    verify_raid0(
        &devs[..2],
        &devs[2..],
        &data[..(keep * 512) as usize],
        chunk,
        "one request",
    );
}

/// Every refusal md or mdadm would make comes before anything is written, with the reason
/// and the way out: no --array-size, a size larger than the smaller raid0 holds, none, a
/// size that is not whole chunks, no room after the data for the offset to move up into,
/// a chunk change or --add with it, a raid0 of two zones (md's raid0 takeover takes one).
#[test]
fn raid0_shrink_refusals_write_nothing() {
    let devs = members(3, 6 * MB, "s0r-");
    raid0(&devs, 64, 2048, 73);
    let zone = read_superblock(devs[0].as_ref()).unwrap().data_size / 128 * 128;
    let most = 2 * zone;
    let before = all_bytes(&devs);
    let with_chunk = GrowRequest {
        chunk_sectors: Some(64),
        ..shrink(2, Some(most - 512))
    };
    for (req, add, want) in [
        (shrink(2, None), false, "give --array-size"),
        (shrink(2, Some(most + 128)), false, "holds at most"),
        (shrink(2, Some(0)), false, "more than 0"),
        (
            shrink(2, Some(most - 512 - 8)),
            false,
            "whole number of 64K chunks",
        ),
        (shrink(2, Some(most)), false, "backup file"),
        (with_chunk, false, "two reshapes"),
        (shrink(2, Some(most - 512)), true, "takes no new devices"),
    ] {
        let add = if add {
            members(1, 6 * MB, "s0r-add")
        } else {
            Vec::new()
        };
        let e = grow_members_with(
            devs.clone(),
            &req,
            ReshapeOptions {
                add,
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(want), "{req:?}: {e}");
        assert!(e.contains("nothing was written"), "{req:?}: {e}");
        assert!(all_bytes(&devs) == before, "{req:?}: a refusal wrote");
    }
    let (a, _) = open(&devs);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid0, 3));
    a.stop().unwrap();
    // Two zones: members of 4 and 6 MiB.
    let devs: Vec<Arc<dyn Member>> = vec![
        Arc::new(MemMember::new("s0z0", 4 * MB)),
        Arc::new(MemMember::new("s0z1", 6 * MB)),
        Arc::new(MemMember::new("s0z2", 6 * MB)),
    ];
    raid0(&devs, 64, 2048, 74);
    let before = all_bytes(&devs);
    let e = grow_members(devs.clone(), &shrink(2, Some(1024)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("more than one zone") && e.contains("nothing was written"),
        "{e}"
    );
    assert!(all_bytes(&devs) == before, "a refusal wrote");
}

/// A power cut after every write of the whole shrink (the takeover, the reshape's start,
/// windows and checkpoints, its finish, the parity member's failure record and the
/// takeover back): every cut assembles from all three devices with every kept byte, and
/// goes on to the raid0 of 2 the way a user would (`uraid grow --continue` mid-reshape,
/// `--level 0` for a raid4, the request again from a raid0 of 3), the device that left
/// never a member.
#[test]
fn a_power_cut_anywhere_in_a_raid0_shrink_loses_no_kept_byte() {
    let world = SimWorld::new();
    let size = 2 * MB;
    let disks: Vec<Arc<SimDisk>> = (0..3)
        .map(|i| Arc::new(SimDisk::new(format!("s0p{i}"), size, world.clone())))
        .collect();
    let devs: Vec<Arc<dyn Member>> = disks.iter().map(|d| d.clone() as _).collect();
    let data = raid0(&devs, 16, 256, 75);
    let chunk = 32;
    let zone = read_superblock(devs[0].as_ref()).unwrap().data_size / chunk * chunk;
    let keep = 2 * zone - 8 * chunk;
    let kept = &data[..(keep * 512) as usize];
    let images: Vec<Vec<u8>> = disks.iter().map(|d| d.durable_image()).collect();
    let (mut saw_mid, mut saw_leaving) = (false, false);
    let mut ops = 0i64;
    loop {
        let power = Power::new(ops);
        let cut = SimDisk::crash_set("s0p", &power, &images);
        let cut_devs: Vec<Arc<dyn Member>> = cut.iter().map(|d| d.clone() as _).collect();
        let _ = grow_members(cut_devs, &shrink(2, Some(keep)));
        let finished = power.on();
        let after = SimDisk::after_cut(&cut);
        let what = format!("cut after {ops} writes");
        let (a, rep) = open(&after);
        same(&read_all(&a, kept.len()), kept, &what);
        let (level, n, mid) = (a.level(), a.raid_disks(), a.is_reshaping());
        a.stop().unwrap();
        saw_mid |= mid;
        saw_leaving |= level == Level::Raid4
            && rep
                .members
                .iter()
                .any(|m| m.outcome == MemberOutcome::Faulty);
        if mid {
            let c = continue_reshape(after.clone(), ReshapeOptions::default())
                .unwrap_or_else(|e| panic!("{what}: continue: {e}"));
            assert!(c.finished, "{what}");
        }
        let (a, _) = open(&after);
        let (level, n) = if mid {
            (a.level(), a.raid_disks())
        } else {
            (level, n)
        };
        a.stop().unwrap();
        match (level, n) {
            (Level::Raid0, 2) => {
                // A cut in the takeover's record: members one event apart, read as the
                // raid0; its first write (here the kept bytes again) brings them level.
                let (a, _) = open(&after);
                a.write(0, &kept[..4096]).unwrap();
                a.stop().unwrap();
            }
            (Level::Raid4, 3) => {
                grow_members(after.clone(), &to_raid0())
                    .unwrap_or_else(|e| panic!("{what}: --level 0: {e}"));
            }
            (Level::Raid4, 4) | (Level::Raid0, 3) => {
                if level == Level::Raid4 {
                    grow_members(after.clone(), &to_raid0())
                        .unwrap_or_else(|e| panic!("{what}: back to raid0: {e}"));
                }
                grow_members(after.clone(), &shrink(2, Some(keep)))
                    .unwrap_or_else(|e| panic!("{what}: the shrink again: {e}"));
            }
            other => panic!("{what}: {other:?}"),
        }
        verify_raid0(&after[..2], &after[2..], kept, chunk, &what);
        if finished {
            break;
        }
        ops += 1;
    }
    assert!(
        saw_mid && saw_leaving,
        "mid {saw_mid} leaving {saw_leaving}"
    );
}

/// A raid0 that Linux took back from its raid4 (mdadm --grow --level=0): md failed and
/// removed the parity member, and its superblock writes after that give its device number
/// the role md writes for a removed device (0xffff, as a spare). md's raid0 keeps no spares
/// (it refuses to start with one): offered with the members, that device is left out, and
/// what uraid writes does not reach it.
#[test]
fn a_device_linux_removed_from_a_raid0_is_no_spare_of_it() {
    let devs = members(3, 6 * MB, "s0l-");
    let data = raid0(&devs, 64, 2048, 76);
    let zone = read_superblock(devs[0].as_ref()).unwrap().data_size / 128 * 128;
    let keep = 2 * zone - 4 * 128;
    grow_members(devs.clone(), &shrink(2, Some(keep))).unwrap();
    // md's removal and its raid0 superblocks after it.
    let left = read_superblock(devs[2].as_ref()).unwrap();
    for d in &devs[..2] {
        let mut sb = read_superblock(d.as_ref()).unwrap();
        sb.dev_roles[left.dev_number as usize] = ROLE_SPARE;
        sb.events += 1;
        write_superblock(d.as_ref(), &sb).unwrap();
    }
    let before = all_bytes(&devs[2..]);
    let (a, rep) = open(&devs);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid0, 2));
    assert_eq!(rep.members[2].outcome, MemberOutcome::Stale, "{rep:?}");
    assert!(a.spares().is_empty());
    same(
        &read_all(&a, (keep * 512) as usize),
        &data[..(keep * 512) as usize],
        "kept",
    );
    a.write(0, &[7u8; 4096]).unwrap();
    a.stop().unwrap();
    assert!(
        all_bytes(&devs[2..]) == before,
        "uraid wrote to the device that left"
    );
    // Not even --force takes it in.
    let (a, rep) = assemble(
        devs.clone(),
        &AssembleOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(rep.members[2].outcome, MemberOutcome::Stale, "{rep:?}");
    a.stop().unwrap();
}
