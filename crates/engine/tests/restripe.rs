//! The restripe engine (md's reshape of raid4/5/6 on members not served): grows, chunk and
//! layout changes with the data verified after, each one stopped mid-way and continued,
//! refusals that write nothing, and a power cut after every write of a reshape: the
//! array assembles with every byte, and the reshape continues to the end from there.

use rand::Rng;
use std::sync::Arc;
use uraid_core::geometry::raid5::{
    ALGORITHM_LEFT_ASYMMETRIC, ALGORITHM_LEFT_SYMMETRIC, ALGORITHM_RIGHT_SYMMETRIC,
};
use uraid_core::superblock::{
    FEATURE_NEW_OFFSET, FEATURE_RESHAPE_ACTIVE, FEATURE_RESHAPE_BACKWARDS,
};
use uraid_core::Level;
use uraid_engine::{
    assemble, continue_reshape, create, read_superblock, reshape_members, write_superblock,
    AddOutcome, Array, AssembleOptions, CreateOptions, MemMember, Member, ReshapeOptions,
    ReshapeRequest, SyncKind,
};
use uraid_sim::disk::{Power, SimDisk, SimWorld};
use uraid_testkit::engine::{read_all, rng, same};

const MB: u64 = 1 << 20;

fn members(n: usize, bytes: u64, tag: &str) -> Vec<Arc<dyn Member>> {
    (0..n)
        .map(|i| Arc::new(MemMember::new(format!("{tag}{i}"), bytes)) as Arc<dyn Member>)
        .collect()
}

fn opts(level: Level, layout: u32, chunk_kib: u64) -> CreateOptions {
    let mut o = CreateOptions::new(level);
    o.layout = Some(layout);
    o.chunk_sectors = Some(chunk_kib * 2);
    o.assume_clean = true;
    o.data_offset_sectors = Some(2048);
    o
}

/// Create, fill with seeded random bytes, stop: the bytes written.
fn made(devs: &[Arc<dyn Member>], o: &CreateOptions, seed: u64) -> Vec<u8> {
    let a = create(devs.iter().cloned().map(Some).collect(), o).unwrap();
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    data
}

fn open(devs: &[Arc<dyn Member>]) -> Array {
    assemble(devs.to_vec(), &AssembleOptions::default())
        .unwrap()
        .0
}

/// Equal bytes, or the first difference named (not both buffers printed).
/// The array after a finished reshape: the new shape, the old bytes first, zeros after,
/// and md's check finds every parity block right.
fn verify_finished(
    devs: &[Arc<dyn Member>],
    data: &[u8],
    level: Level,
    disks: usize,
    chunk: u64,
    layout: u32,
) {
    let a = open(devs);
    assert!(!a.is_read_only(), "{:?}", a.read_only_reason());
    assert_eq!(a.level(), level);
    assert_eq!(a.raid_disks(), disks);
    let g = a.geometry().clone();
    assert_eq!(g.chunk_sectors, chunk);
    assert_eq!(g.layout, layout);
    let all = read_all(&a, a.size_bytes() as usize);
    same(&all[..data.len()], data, "the old bytes moved");
    assert!(
        all[data.len()..].iter().all(|&b| b == 0),
        "the grown part reads zeros"
    );
    assert_eq!(
        a.run_sync(SyncKind::Check, |_| {}).unwrap(),
        0,
        "check mismatches"
    );
    a.stop().unwrap();
    for d in devs {
        let sb = read_superblock(d.as_ref()).unwrap();
        assert_eq!(
            sb.feature_map & (FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET),
            0
        );
        assert_eq!(sb.delta_disks, 0);
    }
}

struct Case {
    level: Level,
    layout: u32,
    chunk_kib: u64,
    disks: usize,
    req: ReshapeRequest,
}

impl Case {
    /// The array after this case's reshape finished: its new shape, the bytes, the parity.
    fn verify(&self, all: &[Arc<dyn Member>], data: &[u8]) {
        verify_finished(
            all,
            data,
            self.level,
            self.req.raid_disks.unwrap_or(self.disks),
            self.req.chunk_sectors.unwrap_or(self.chunk_kib * 2),
            self.req.layout.unwrap_or(self.layout),
        );
    }
}

/// Every byte of every member (to show a refusal wrote nothing).
fn all_bytes(devs: &[Arc<dyn Member>]) -> Vec<Vec<u8>> {
    devs.iter()
        .map(|d| {
            let mut b = vec![0u8; d.size_bytes() as usize];
            d.read_at(&mut b, 0).unwrap();
            b
        })
        .collect()
}

fn cases() -> Vec<Case> {
    let r = |disks: Option<usize>, chunk_kib: Option<u64>, layout: Option<u32>| ReshapeRequest {
        raid_disks: disks,
        chunk_sectors: chunk_kib.map(|k| k * 2),
        layout,
        level: None,
        array_sectors: None,
    };
    vec![
        Case {
            level: Level::Raid5,
            layout: ALGORITHM_LEFT_SYMMETRIC,
            chunk_kib: 64,
            disks: 3,
            req: r(Some(4), None, None),
        },
        Case {
            level: Level::Raid5,
            layout: ALGORITHM_LEFT_SYMMETRIC,
            chunk_kib: 16,
            disks: 3,
            req: r(Some(5), Some(32), None),
        },
        Case {
            level: Level::Raid5,
            layout: ALGORITHM_LEFT_SYMMETRIC,
            chunk_kib: 64,
            disks: 4,
            req: r(None, Some(32), None),
        },
        Case {
            level: Level::Raid5,
            layout: ALGORITHM_LEFT_ASYMMETRIC,
            chunk_kib: 32,
            disks: 4,
            req: r(None, None, Some(ALGORITHM_RIGHT_SYMMETRIC)),
        },
        Case {
            level: Level::Raid6,
            layout: ALGORITHM_LEFT_SYMMETRIC,
            chunk_kib: 32,
            disks: 4,
            req: r(Some(5), None, None),
        },
        Case {
            level: Level::Raid6,
            layout: ALGORITHM_LEFT_SYMMETRIC,
            chunk_kib: 16,
            disks: 5,
            req: r(None, Some(64), None),
        },
        Case {
            level: Level::Raid4,
            layout: 5,
            chunk_kib: 32,
            disks: 3,
            req: r(Some(4), None, None),
        },
    ]
}

#[test]
fn every_restripe_keeps_the_data_and_the_parity_right() {
    for (n, c) in cases().into_iter().enumerate() {
        let devs = members(c.disks, 6 * MB, &format!("r{n}-"));
        let data = made(&devs, &opts(c.level, c.layout, c.chunk_kib), n as u64);
        let new_disks = c.req.raid_disks.unwrap_or(c.disks);
        let adds = members(new_disks - c.disks, 6 * MB, &format!("r{n}-add"));
        let before = read_superblock(devs[0].as_ref()).unwrap();
        let r = reshape_members(
            devs.clone(),
            &c.req,
            ReshapeOptions {
                add: adds.clone(),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("case {n}: {e}"));
        assert!(r.finished, "case {n}: {r:?}");
        assert_eq!(r.added, adds.len());
        assert!(r.checkpoints >= 1, "{r:?}");
        let after = read_superblock(devs[0].as_ref()).unwrap();
        assert!(
            after.data_offset < before.data_offset,
            "the data offset moved down"
        );
        let mut all = devs.clone();
        all.extend(adds);
        c.verify(&all, &data);
    }
}

/// Stopped mid-way (the superblocks record the position), the array reads the same bytes
/// read-only through both geometries, and continue_reshape finishes it.
#[test]
fn a_reshape_stopped_mid_way_reads_the_same_and_continues() {
    for (n, c) in cases().into_iter().enumerate() {
        let devs = members(c.disks, 6 * MB, &format!("s{n}-"));
        let data = made(&devs, &opts(c.level, c.layout, c.chunk_kib), 100 + n as u64);
        let new_disks = c.req.raid_disks.unwrap_or(c.disks);
        let adds = members(new_disks - c.disks, 6 * MB, &format!("s{n}-add"));
        let mut all = devs.clone();
        all.extend(adds.iter().cloned());
        let half = data.len() as u64 / 512 / 2;
        let r = reshape_members(
            devs.clone(),
            &c.req,
            ReshapeOptions {
                add: adds,
                stop_at: Some(half),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!r.finished, "case {n}: {r:?}");
        assert!(r.position_sectors >= half && r.position_sectors < data.len() as u64 / 512);
        let sb = read_superblock(all[0].as_ref()).unwrap();
        assert_ne!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0);
        assert_eq!(sb.reshape_position, r.position_sectors);
        let a = open(&all);
        assert!(a.is_reshaping());
        same(
            &read_all(&a, data.len()),
            &data,
            &format!("case {n}: mid-reshape read"),
        );
        a.stop().unwrap();
        let r = continue_reshape(all.clone(), ReshapeOptions::default()).unwrap();
        assert!(r.finished);
        c.verify(&all, &data);
    }
}

/// A member missing mid-reshape: the copy rebuilds its chunks from parity and the reshape
/// finishes degraded, with every byte.
#[test]
fn a_reshape_continues_with_a_member_missing() {
    let devs = members(3, 6 * MB, "dg");
    let data = made(&devs, &opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 64), 7);
    let add = members(1, 6 * MB, "dg-add");
    let mut all = devs.clone();
    all.extend(add.iter().cloned());
    let req = ReshapeRequest {
        raid_disks: Some(4),
        ..Default::default()
    };
    let r = reshape_members(
        devs.clone(),
        &req,
        ReshapeOptions {
            add,
            stop_at: Some(2048),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.finished);
    let without: Vec<Arc<dyn Member>> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, d)| d.clone())
        .collect();
    let r = continue_reshape(without.clone(), ReshapeOptions::default()).unwrap();
    assert!(r.finished);
    let a = open(&without);
    assert_eq!(a.missing_roles().len(), 1);
    same(&read_all(&a, data.len()), &data, "degraded");
}

#[test]
fn refusals_write_nothing_and_say_why() {
    let bytes = |devs: &[Arc<dyn Member>]| -> Vec<Vec<u8>> {
        devs.iter()
            .map(|d| {
                let mut b = vec![0u8; (3 * MB) as usize];
                d.read_at(&mut b, 0).unwrap();
                b
            })
            .collect()
    };
    let grow = ReshapeRequest {
        raid_disks: Some(4),
        ..Default::default()
    };
    let check =
        |devs: &[Arc<dyn Member>], req: &ReshapeRequest, add: Vec<Arc<dyn Member>>, want: &str| {
            let before = bytes(devs);
            let e = reshape_members(
                devs.to_vec(),
                req,
                ReshapeOptions {
                    add,
                    ..Default::default()
                },
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(want), "{e}");
            assert!(e.contains("nothing was written"), "{e}");
            assert_eq!(bytes(devs), before, "{want}: bytes changed");
        };
    // No device for the new role.
    let devs = members(3, 6 * MB, "rf");
    made(&devs, &opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 64), 1);
    check(&devs, &grow, vec![], "needs 1 device(s)");
    // A device too small for the new role.
    check(&devs, &grow, members(1, MB, "tiny"), "needs at least");
    // Shrinking.
    check(
        &devs,
        &ReshapeRequest {
            raid_disks: Some(2),
            ..Default::default()
        },
        vec![],
        "shrinking",
    );
    // The same shape.
    check(
        &devs,
        &ReshapeRequest {
            chunk_sectors: Some(128),
            ..Default::default()
        },
        vec![],
        "the shape the array has",
    );
    // A level change with a restripe.
    check(
        &devs,
        &ReshapeRequest {
            level: Some(Level::Raid6),
            raid_disks: Some(5),
            ..Default::default()
        },
        vec![],
        "level change",
    );
    // Degraded, with no device for the new role: mdadm wants --force, and md refuses even
    // then (the new shape would miss two roles).
    let a = open(&devs);
    a.fail_member(uraid_core::MemberIdx(2)).unwrap();
    a.stop().unwrap();
    check(
        &devs[..2],
        &grow,
        vec![],
        "Need 1 spare to avoid degraded array",
    );
    let before = bytes(&devs[..2]);
    let e = reshape_members(
        devs[..2].to_vec(),
        &grow,
        ReshapeOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("would miss 2 role(s)"), "{e}");
    assert!(e.contains("nothing was written"), "{e}");
    assert_eq!(bytes(&devs[..2]), before, "--force: bytes changed");
    // A recovery under way (a device added to the degraded array, not yet rebuilt).
    let a = open(&devs[..2]);
    let fresh = members(1, 6 * MB, "rec");
    assert!(matches!(
        a.add_member(fresh[0].clone()).unwrap(),
        AddOutcome::Recovering(_)
    ));
    a.stop().unwrap();
    let mut rec = devs[..2].to_vec();
    rec.extend(fresh);
    check(
        &rec,
        &grow,
        members(1, 6 * MB, "x"),
        "recovery or replace is in progress",
    );
    // No room before the data (mdadm's backup-file case).
    let devs = members(3, 6 * MB, "nr");
    let mut o = opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 64);
    o.data_offset_sectors = Some(24);
    made(&devs, &o, 2);
    check(
        &devs,
        &ReshapeRequest {
            chunk_sectors: Some(64),
            ..Default::default()
        },
        vec![],
        "backup file",
    );
}

/// A degraded raid5 grows (md reshapes within its parity): the missing member's blocks
/// are rebuilt from parity as the old stripes are read, the added device takes the new
/// role, the missing role stays missing at its number; recovered after, md's check finds
/// every parity block right.
#[test]
fn a_degraded_raid5_grows_and_recovers_after() {
    let devs = members(4, 6 * MB, "d5");
    let data = made(&devs, &opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 64), 21);
    let a = open(&devs);
    a.fail_member(uraid_core::MemberIdx(1)).unwrap();
    a.stop().unwrap();
    let left: Vec<Arc<dyn Member>> = [0, 2, 3].iter().map(|&i| devs[i].clone()).collect();
    let add = members(1, 6 * MB, "d5-add");
    let r = reshape_members(
        left.clone(),
        &ReshapeRequest {
            raid_disks: Some(5),
            ..Default::default()
        },
        ReshapeOptions {
            add: add.clone(),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.finished, "{r:?}");
    assert_eq!(r.added, 1);
    let mut all = left.clone();
    all.extend(add);
    let a = open(&all);
    assert_eq!(a.raid_disks(), 5);
    assert_eq!(a.missing_roles(), vec![uraid_core::MemberIdx(1)]);
    let sb = read_superblock(all[3].as_ref()).unwrap();
    assert_eq!(
        sb.role_of_this_device(),
        Some(4),
        "the added device holds the new role"
    );
    let got = read_all(&a, a.size_bytes() as usize);
    same(&got[..data.len()], &data, "degraded, after the reshape");
    let spare = members(1, 6 * MB, "d5-spare");
    assert!(matches!(
        a.add_member(spare[0].clone()).unwrap(),
        AddOutcome::Recovering(_)
    ));
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    a.stop().unwrap();
    all.extend(spare);
    verify_finished(&all, &data, Level::Raid5, 5, 128, ALGORITHM_LEFT_SYMMETRIC);
}

/// A raid6 with one member missing grows by one with --force and no new device (md allows
/// it: two missing is what raid6 holds), then gets both roles back by recovery.
#[test]
fn a_degraded_raid6_grows_with_force_to_two_missing() {
    let devs = members(5, 6 * MB, "d6");
    let data = made(&devs, &opts(Level::Raid6, ALGORITHM_LEFT_SYMMETRIC, 64), 22);
    let a = open(&devs);
    a.fail_member(uraid_core::MemberIdx(2)).unwrap();
    a.stop().unwrap();
    let left: Vec<Arc<dyn Member>> = [0, 1, 3, 4].iter().map(|&i| devs[i].clone()).collect();
    let req = ReshapeRequest {
        raid_disks: Some(6),
        ..Default::default()
    };
    // Without --force: mdadm's refusal, nothing written.
    let before = all_bytes(&left);
    let e = reshape_members(left.clone(), &req, ReshapeOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Need 1 spare to avoid degraded array"), "{e}");
    assert_eq!(all_bytes(&left), before);
    let r = reshape_members(
        left.clone(),
        &req,
        ReshapeOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.finished, "{r:?}");
    let a = open(&left);
    assert_eq!(a.raid_disks(), 6);
    assert_eq!(
        a.missing_roles(),
        vec![uraid_core::MemberIdx(2), uraid_core::MemberIdx(5)]
    );
    let got = read_all(&a, a.size_bytes() as usize);
    same(&got[..data.len()], &data, "two missing, after the reshape");
    let spares = members(2, 6 * MB, "d6-spare");
    for s in &spares {
        a.add_member(s.clone()).unwrap();
    }
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    if !a.missing_roles().is_empty() || !a.recovering_roles().is_empty() {
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    }
    a.stop().unwrap();
    let mut all = left;
    all.extend(spares);
    verify_finished(&all, &data, Level::Raid6, 6, 128, ALGORITHM_LEFT_SYMMETRIC);
}

/// An array with a spare uses it for the new role (mdadm --add, then --grow).
#[test]
fn a_spare_takes_the_new_role() {
    let devs = members(3, 6 * MB, "sp");
    let data = made(&devs, &opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 64), 9);
    let spare = members(1, 6 * MB, "sp-spare");
    let a = open(&devs);
    assert!(matches!(
        a.add_member(spare[0].clone()).unwrap(),
        AddOutcome::Spare
    ));
    a.stop().unwrap();
    let mut all = devs.clone();
    all.extend(spare);
    let r = reshape_members(
        all.clone(),
        &ReshapeRequest {
            raid_disks: Some(4),
            ..Default::default()
        },
        ReshapeOptions::default(),
    )
    .unwrap();
    assert!(r.finished);
    verify_finished(&all, &data, Level::Raid5, 4, 128, ALGORITHM_LEFT_SYMMETRIC);
}

/// A power cut after every write of a reshape (members with a live and a durable image):
/// the durable images assemble with every byte, mid-reshape or finished, and continuing
/// from there ends with the new shape and consistent parity.
#[test]
fn a_power_cut_anywhere_in_a_reshape_loses_nothing() {
    let grow = ReshapeRequest {
        raid_disks: Some(4),
        ..Default::default()
    };
    let chunk = ReshapeRequest {
        chunk_sectors: Some(64),
        ..Default::default()
    };
    cut_everywhere("pc0-", Level::Raid5, 3, &grow, None, 40);
    cut_everywhere("pc1-", Level::Raid6, 4, &chunk, None, 41);
    // A shrink (backwards, the data offset moving up into room that the smaller kept size
    // makes after the data): 2 MiB members, 256 sectors of data offset, 16 KiB chunks.
    let shrink = ReshapeRequest {
        raid_disks: Some(3),
        array_sectors: Some(3840 * 2 - 512),
        ..Default::default()
    };
    cut_everywhere("pc2-", Level::Raid5, 4, &shrink, None, 42);
}

/// The same for a degraded array (md reshapes one within its parity): the missing member's
/// blocks are rebuilt from parity as the old stripes are read, its role stays missing in
/// the new shape, and every cut assembles with every byte and continues to the end.
#[test]
fn a_power_cut_anywhere_in_a_degraded_reshape_loses_nothing() {
    let grow = ReshapeRequest {
        raid_disks: Some(4),
        ..Default::default()
    };
    let grow6 = ReshapeRequest {
        raid_disks: Some(5),
        ..Default::default()
    };
    cut_everywhere("dc0-", Level::Raid5, 3, &grow, Some(1), 50);
    cut_everywhere("dc1-", Level::Raid6, 4, &grow6, Some(0), 51);
    // Shrinks of a degraded raid5: the missing role stays (role 1) or leaves (role 3).
    let shrink = ReshapeRequest {
        raid_disks: Some(3),
        array_sectors: Some(3840 * 2 - 512),
        ..Default::default()
    };
    cut_everywhere("dc2-", Level::Raid5, 4, &shrink, Some(1), 52);
    cut_everywhere("dc3-", Level::Raid5, 4, &shrink, Some(3), 53);
}

/// Cut the power after 0, 1, 2, 3, ... (then sparser) writes of `req` on a `disks`-member
/// array (member `missing` failed first), check each cut and continue it.
fn cut_everywhere(
    tag: &str,
    level: Level,
    disks: usize,
    req: &ReshapeRequest,
    missing: Option<usize>,
    seed: u64,
) {
    let size = 2 * MB;
    let world = SimWorld::new();
    let new_disks = req.raid_disks.unwrap_or(disks);
    let disks_v: Vec<Arc<SimDisk>> = (0..new_disks.max(disks))
        .map(|i| Arc::new(SimDisk::new(format!("{tag}{i}"), size, world.clone())))
        .collect();
    let devs: Vec<Arc<dyn Member>> = disks_v
        .iter()
        .map(|d| d.clone() as Arc<dyn Member>)
        .collect();
    let mut o = opts(level, ALGORITHM_LEFT_SYMMETRIC, 16);
    o.data_offset_sectors = Some(256);
    let mut data = made(&devs[..disks], &o, seed);
    // A shrink keeps the size it was given (the confirmation md asks for).
    if let Some(keep) = req.array_sectors {
        data.truncate((keep * 512) as usize);
    }
    if let Some(m) = missing {
        let a = open(&devs[..disks]);
        a.fail_member(uraid_core::MemberIdx(m)).unwrap();
        a.stop().unwrap();
    }
    let images: Vec<Vec<u8>> = disks_v.iter().map(|d| d.durable_image()).collect();
    let (mut saw_mid, mut saw_done) = (false, false);
    let mut ops = 0i64;
    let old: Vec<usize> = (0..disks).filter(|&i| Some(i) != missing).collect();
    loop {
        let power = Power::new(ops);
        let cut = SimDisk::crash_set(tag, &power, &images);
        let cut_devs: Vec<Arc<dyn Member>> =
            cut.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
        let _ = reshape_members(
            old.iter().map(|&i| cut_devs[i].clone()).collect(),
            req,
            ReshapeOptions {
                add: cut_devs[disks.min(new_disks)..new_disks].to_vec(),
                ..Default::default()
            },
        );
        let finished = power.on();
        let after = SimDisk::after_cut(&cut);
        // Only the devices that joined before the cut (an added disk without a superblock
        // is not offered), and never the failed member.
        let joined: Vec<Arc<dyn Member>> = after
            .iter()
            .enumerate()
            .filter(|(i, d)| Some(*i) != missing && read_superblock(d.as_ref()).is_ok())
            .map(|(_, d)| d.clone())
            .collect();
        let a = open(&joined);
        same(
            &read_all(&a, data.len()),
            &data,
            &format!("{tag}: cut after {ops} writes"),
        );
        let mid = a.is_reshaping();
        saw_mid |= mid;
        a.stop().unwrap();
        if mid {
            let r = continue_reshape(joined.clone(), ReshapeOptions::default())
                .unwrap_or_else(|e| panic!("{tag}: cut after {ops}: {e}"));
            assert!(r.finished);
        }
        let (a, rep) = assemble(joined.clone(), &AssembleOptions::default()).unwrap();
        // A role the reshape keeps stays missing; one a shrink drops goes (a cut before
        // the start leaves the old shape, which still has it).
        let want_missing: Vec<uraid_core::MemberIdx> = missing
            .filter(|&m| m < a.raid_disks())
            .into_iter()
            .map(uraid_core::MemberIdx)
            .collect();
        assert_eq!(
            a.missing_roles(),
            want_missing,
            "{tag}: cut after {ops}: missing roles after continuing (mid {mid}): {rep:?}"
        );
        if a.raid_disks() == new_disks
            && a.geometry().chunk_sectors == req.chunk_sectors.unwrap_or(32)
        {
            saw_done = true;
            if missing.is_none() {
                assert_eq!(
                    a.run_sync(SyncKind::Check, |_| {}).unwrap(),
                    0,
                    "{tag}: cut after {ops}"
                );
            }
        }
        same(
            &read_all(&a, data.len()),
            &data,
            &format!("{tag}: cut after {ops} writes, continued"),
        );
        a.stop().unwrap();
        if finished {
            if let Some(m) = missing.filter(|&m| m < new_disks) {
                // The missing role recovered onto a fresh device: md's check finds every
                // parity block of the new shape right.
                let fresh: Arc<dyn Member> = Arc::new(MemMember::new(format!("{tag}fresh"), size));
                let mut whole = joined.clone();
                whole.push(fresh.clone());
                let a = open(&joined);
                a.add_member(fresh).unwrap();
                a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
                assert!(a.missing_roles().is_empty(), "{tag}: role {m} recovered");
                assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0, "{tag}");
                same(
                    &read_all(&a, data.len()),
                    &data,
                    &format!("{tag}: recovered"),
                );
                a.stop().unwrap();
            }
            break;
        }
        ops += 1 + ops / 8;
    }
    assert!(saw_mid && saw_done, "{tag}: mid {saw_mid} done {saw_done}");
}

/// Write the superblocks of a reshape as Linux md starts one going backwards (a shrink, or a
/// restripe whose data offset moves up), at `position`: what mdadm --grow leaves when the
/// room is after the data.
fn start_like_md_backwards(devs: &[Arc<dyn Member>], new_disks: u32, new_chunk: u32, move_up: i32) {
    let sbs: Vec<_> = devs
        .iter()
        .map(|d| read_superblock(d.as_ref()).unwrap())
        .collect();
    let events = sbs.iter().map(|s| s.events).max().unwrap() + 1;
    let old_disks = sbs[0].raid_disks;
    let dev = sbs[0].size / u64::from(new_chunk.max(sbs[0].chunksize))
        * u64::from(new_chunk.max(sbs[0].chunksize));
    let parity = if sbs[0].level == 6 { 2 } else { 1 };
    let dd = u64::from(old_disks.min(new_disks)) - parity;
    for (d, mut sb) in devs.iter().zip(sbs) {
        // As md writes it (super_1_sync): FEATURE_RESHAPE_BACKWARDS only where the device
        // count stays; a shrink is backwards by its negative delta_disks.
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
        if new_disks == old_disks {
            sb.feature_map |= FEATURE_RESHAPE_BACKWARDS;
        }
        sb.new_level = sb.level;
        sb.new_layout = sb.layout;
        sb.new_chunk = new_chunk;
        sb.delta_disks = new_disks as i32 - old_disks as i32;
        sb.raid_disks = new_disks;
        sb.new_offset = move_up;
        sb.reshape_position = dev * dd;
        sb.events = events;
        write_superblock(d.as_ref(), &sb).unwrap();
    }
}

/// A shrink Linux md left mid-way (4 -> 3 devices, backwards, the data offset moving up):
/// uraid reads the array's bytes through both geometries, continues it to the end, and the
/// device that left is a spare.
#[test]
fn a_backwards_shrink_from_md_reads_and_continues() {
    let devs = members(4, 8 * MB, "bk");
    let mut o = opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 64);
    o.size_sectors = Some(12288); // 6 MiB of each 8 MiB member: room after the data
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    // Only what the 3-device shape keeps (md shrinks the array size first).
    let keep = (12288 * 2 * 512) as usize;
    let mut data = vec![0u8; keep];
    rng(77).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    start_like_md_backwards(&devs, 3, 128, 256);
    let a = open(&devs);
    assert!(a.is_reshaping());
    same(&read_all(&a, keep), &data, "at the start of the shrink");
    a.stop().unwrap();
    let r = continue_reshape(
        devs.clone(),
        ReshapeOptions {
            stop_at: Some(6144),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.finished && r.position_sectors <= 6144, "{r:?}");
    let a = open(&devs);
    same(&read_all(&a, keep), &data, "half-way");
    a.stop().unwrap();
    let r = continue_reshape(devs.clone(), ReshapeOptions::default()).unwrap();
    assert!(r.finished, "{r:?}");
    let (a, rep) = assemble(devs.clone(), &AssembleOptions::default()).unwrap();
    assert_eq!(a.raid_disks(), 3);
    assert_eq!(a.size_bytes() as usize, keep);
    same(&read_all(&a, keep), &data, "after the shrink");
    assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
    assert_eq!(
        rep.members
            .iter()
            .filter(|m| matches!(m.outcome, uraid_engine::MemberOutcome::Spare))
            .count(),
        1,
        "{rep:?}"
    );
}

/// A chunk change md ran backwards (room after the data): continued to the end.
#[test]
fn a_backwards_chunk_change_from_md_continues() {
    let devs = members(4, 8 * MB, "bc");
    let mut o = opts(Level::Raid6, ALGORITHM_LEFT_SYMMETRIC, 32);
    o.size_sectors = Some(12288);
    let data = made(&devs, &o, 78);
    start_like_md_backwards(&devs, 4, 128, 512);
    let a = open(&devs);
    same(&read_all(&a, data.len()), &data, "at the start");
    a.stop().unwrap();
    let r = continue_reshape(devs.clone(), ReshapeOptions::default()).unwrap();
    assert!(r.finished, "{r:?}");
    verify_finished(&devs, &data, Level::Raid6, 4, 128, ALGORITHM_LEFT_SYMMETRIC);
}

/// One mdadm keeps with its backup file (no new data offset) is neither read nor continued:
/// refused by name, before anything is written.
#[test]
fn a_reshape_uraid_cannot_finish_is_refused_before_writing() {
    let devs = members(3, 8 * MB, "nf");
    let data = made(&devs, &opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 64), 79);
    let sbs: Vec<_> = devs
        .iter()
        .map(|d| read_superblock(d.as_ref()).unwrap())
        .collect();
    for (d, mut sb) in devs.iter().zip(sbs) {
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE;
        sb.new_level = sb.level;
        sb.new_layout = sb.layout;
        sb.new_chunk = 64;
        sb.reshape_position = 0;
        sb.events += 1;
        write_superblock(d.as_ref(), &sb).unwrap();
    }
    let before = all_bytes(&devs);
    let e = continue_reshape(devs.clone(), ReshapeOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("backup file"), "{e}");
    assert!(all_bytes(&devs) == before, "a refusal changed the members");
    // Not read either: where the data is depends on mdadm's backup file.
    let e = assemble(devs.clone(), &AssembleOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("in place") && e.contains("--backup-file"), "{e}");
    let _ = data;
}

/// raid5 -> raid6 with a restripe (mdadm --grow --level 6 --layout left-symmetric, or with
/// more devices): md's takeover, the Q role rebuilt onto the first added device, then the
/// restripe within raid6; every byte kept, parity and Q consistent. Too few devices is
/// refused before anything is written.
#[test]
fn raid5_becomes_raid6_by_takeover_then_restripe() {
    use uraid_engine::{grow_members_with, GrowRequest};
    for (n, (disks, want_disks, layout)) in [
        (4usize, None, Some(ALGORITHM_LEFT_SYMMETRIC)),
        (3, Some(5usize), None),
    ]
    .into_iter()
    .enumerate()
    {
        let devs = members(disks, 6 * MB, &format!("t{n}-"));
        let data = made(
            &devs,
            &opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 32),
            90 + n as u64,
        );
        let final_disks = want_disks.unwrap_or(disks + 1);
        let adds = members(final_disks - disks, 6 * MB, &format!("t{n}-add"));
        let req = GrowRequest {
            level: Some(Level::Raid6),
            raid_disks: want_disks,
            layout,
            ..Default::default()
        };
        // One device short: refused, nothing written.
        let before = all_bytes(&devs);
        let e = grow_members_with(
            devs.clone(),
            &req,
            ReshapeOptions {
                add: adds[1..].to_vec(),
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("device(s) for the new roles"), "case {n}: {e}");
        assert!(
            all_bytes(&devs) == before,
            "case {n}: a refusal changed the members"
        );
        let r = grow_members_with(
            devs.clone(),
            &req,
            ReshapeOptions {
                add: adds.clone(),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("case {n}: {e}"));
        let done = r.reshape.expect("restriped");
        assert!(done.finished && done.added == adds.len(), "{done:?}");
        let mut all = devs.clone();
        all.extend(adds);
        let a = open(&all);
        let want_layout = layout.unwrap_or(uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC_6);
        assert_eq!(
            (a.level(), a.raid_disks(), a.geometry().layout),
            (Level::Raid6, final_disks, want_layout)
        );
        a.stop().unwrap();
        verify_finished(&all, &data, Level::Raid6, final_disks, 64, want_layout);
    }
}

/// raid6 in a rotating layout -> raid5 (mdadm --grow --level 5): a restripe to the -6
/// layout, then md's takeover; the Q device is a spare after, every byte kept.
#[test]
fn raid6_becomes_raid5_by_restripe_then_takeover() {
    use uraid_engine::{grow_members, GrowRequest};
    let devs = members(5, 6 * MB, "r65-");
    let data = made(&devs, &opts(Level::Raid6, ALGORITHM_LEFT_SYMMETRIC, 32), 95);
    let r = grow_members(
        devs.clone(),
        &GrowRequest {
            level: Some(Level::Raid5),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.restripe && r.reshape.as_ref().unwrap().finished, "{r:?}");
    let (a, rep) = assemble(devs.clone(), &AssembleOptions::default()).unwrap();
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid5, 4));
    assert_eq!(a.geometry().layout, ALGORITHM_LEFT_SYMMETRIC);
    assert!(rep
        .members
        .iter()
        .any(|m| matches!(m.outcome, uraid_engine::MemberOutcome::Spare)));
    same(&read_all(&a, data.len()), &data, "raid6 -> raid5");
    assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
}

/// A raid6 reshape continues with two members gone: the copy rebuilds their chunks from P
/// and Q, and the array ends doubly degraded with every byte.
#[test]
fn a_raid6_reshape_continues_with_two_members_missing() {
    let devs = members(4, 6 * MB, "d6");
    let data = made(&devs, &opts(Level::Raid6, ALGORITHM_LEFT_SYMMETRIC, 32), 96);
    let add = members(1, 6 * MB, "d6-add");
    let mut all = devs.clone();
    all.extend(add.iter().cloned());
    let r = reshape_members(
        devs.clone(),
        &ReshapeRequest {
            raid_disks: Some(5),
            ..Default::default()
        },
        ReshapeOptions {
            add,
            stop_at: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.finished);
    let without: Vec<Arc<dyn Member>> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 0 && *i != 2)
        .map(|(_, d)| d.clone())
        .collect();
    let r = continue_reshape(without.clone(), ReshapeOptions::default()).unwrap();
    assert!(r.finished);
    let a = open(&without);
    assert_eq!((a.raid_disks(), a.missing_roles().len()), (5, 2));
    same(&read_all(&a, data.len()), &data, "raid6 without two");
}

/// mdadm's raid0 grow (`--grow -n 3 --add DEV`): a raid4 with its parity role missing,
/// restriped to 3 data roles with the new parity role missing, then a raid0 again: 3
/// members, every byte where it was, the size md's raid0 gives 3 members; the superblocks
/// say raid0 with 3 devices. With too few devices, mdadm's refusal and nothing written.
#[test]
fn a_raid0_grows_through_raid4_as_mdadm_does_it() {
    use uraid_engine::{grow_members_with, GrowRequest};
    for (tag, from, to) in [("g0a", 2usize, 3usize), ("g0b", 2, 4)] {
        let devs = members(from, 6 * MB, tag);
        let mut o = opts(Level::Raid0, 0, 64);
        o.layout = None;
        let data = made(&devs, &o, 31);
        let req = GrowRequest {
            raid_disks: Some(to),
            ..Default::default()
        };
        let adds = members(to - from, 6 * MB, &format!("{tag}-add"));
        let before = all_bytes(&devs);
        let e = grow_members_with(
            devs.clone(),
            &req,
            ReshapeOptions {
                add: adds[1..].to_vec(),
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("to create working array"), "{tag}: {e}");
        assert!(all_bytes(&devs) == before, "{tag}: a refusal wrote");
        let r = grow_members_with(
            devs.clone(),
            &req,
            ReshapeOptions {
                add: adds.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(r.summary.contains("raid0 -> raid4"), "{tag}: {}", r.summary);
        assert!(r.summary.ends_with("parity role dropped") || r.summary.contains("-> raid0"));
        assert!(r.missing_roles.is_empty(), "{tag}: {r:?}");
        assert_eq!(r.reshape.as_ref().map(|d| d.added), Some(to - from));
        let mut all = devs.clone();
        all.extend(adds);
        let a = open(&all);
        assert_eq!(a.level(), Level::Raid0);
        assert_eq!(a.raid_disks(), to);
        let per_member = a.geometry().member_sectors.clone();
        assert_eq!(per_member.len(), to);
        assert!(
            per_member.iter().all(|&s| s == per_member[0]),
            "{per_member:?}"
        );
        assert_eq!(a.size_bytes(), to as u64 * per_member[0] * 512, "{tag}");
        same(&read_all(&a, data.len()), &data, tag);
        a.stop().unwrap();
        for d in &all {
            let sb = read_superblock(d.as_ref()).unwrap();
            assert_eq!(sb.level, 0, "{tag}: {}", d.name());
            assert_eq!(sb.raid_disks as usize, to, "{tag}: {}", d.name());
            assert_eq!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0);
        }
    }
}

/// mdadm's shrink (`--grow --array-size SIZE` then `--raid-devices` fewer) as uraid takes
/// it in one request: refused without the size or with one the smaller shape cannot hold
/// (nothing written); then md's backwards reshape with the data offset moving up into the
/// room after the data, stopped mid-way (the superblocks say so as md does: backwards, a
/// positive new offset, raid_disks the new count), read there, continued to the end: the
/// kept bytes, md's check right, the device that left a spare, the data offset moved.
#[test]
fn a_shrink_runs_backwards_into_the_room_after_the_data() {
    use uraid_engine::{grow_members_with, GrowRequest};
    let devs = members(4, 8 * MB, "sh");
    let mut o = opts(Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 64);
    o.size_sectors = Some(12288); // 6 MiB of each 8 MiB member: room after the data
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(91).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    let most = 12288 * 2; // what 3 devices hold, in sectors
    let before = all_bytes(&devs);
    let grow = |n: usize, keep: Option<u64>| GrowRequest {
        raid_disks: Some(n),
        array_sectors: keep,
        ..Default::default()
    };
    for (req, want) in [
        (grow(3, None), "give --array-size"),
        (grow(3, Some(most + 128)), "holds at most"),
        (grow(3, Some(0)), "more than 0"),
        (grow(1, Some(most)), "1 devices"),
    ] {
        let e = grow_members_with(devs.clone(), &req, ReshapeOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{req:?}: {e}");
        assert!(e.contains("nothing was written"), "{e}");
        assert!(all_bytes(&devs) == before, "{req:?}: a refusal wrote");
    }
    let e = grow_members_with(
        devs.clone(),
        &GrowRequest {
            array_sectors: Some(most),
            ..Default::default()
        },
        ReshapeOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--array-size on its own") && e.contains("not served"),
        "{e}"
    );
    let data = &data[..(most * 512) as usize];
    let offset = read_superblock(devs[0].as_ref()).unwrap().data_offset;
    let r = uraid_engine::reshape_members(
        devs.clone(),
        &ReshapeRequest {
            raid_disks: Some(3),
            array_sectors: Some(most),
            ..Default::default()
        },
        ReshapeOptions {
            stop_at: Some(most / 2),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.finished && r.position_sectors <= most / 2, "{r:?}");
    for d in &devs {
        let sb = read_superblock(d.as_ref()).unwrap();
        assert_eq!(
            sb.feature_map
                & (FEATURE_RESHAPE_ACTIVE | FEATURE_RESHAPE_BACKWARDS | FEATURE_NEW_OFFSET),
            FEATURE_RESHAPE_ACTIVE | FEATURE_RESHAPE_BACKWARDS | FEATURE_NEW_OFFSET
        );
        assert_eq!((sb.raid_disks, sb.delta_disks), (3, -1));
        assert!(sb.new_offset > 0, "{}", sb.new_offset);
        assert_eq!(sb.reshape_position, r.position_sectors);
    }
    let a = open(&devs);
    assert_eq!(
        a.size_bytes(),
        most * 512,
        "the smaller shape's size while it runs"
    );
    same(&read_all(&a, data.len()), data, "half-way");
    a.stop().unwrap();
    let r = continue_reshape(devs.clone(), ReshapeOptions::default()).unwrap();
    assert!(r.finished, "{r:?}");
    verify_finished(&devs, data, Level::Raid5, 3, 128, ALGORITHM_LEFT_SYMMETRIC);
    let (a, rep) = assemble(devs.clone(), &AssembleOptions::default()).unwrap();
    assert_eq!(
        rep.members
            .iter()
            .filter(|m| matches!(m.outcome, uraid_engine::MemberOutcome::Spare))
            .count(),
        1,
        "{rep:?}"
    );
    a.stop().unwrap();
    let sb = read_superblock(devs[0].as_ref()).unwrap();
    assert!(sb.data_offset > offset, "{} -> {}", offset, sb.data_offset);
    assert!(sb.data_offset + sb.data_size <= 8 * MB / 512);
}

/// A shrink of members with no room after their data (created to fill them, as mdadm and
/// uraid do by default): keeping all the smaller shape holds needs mdadm's backup file and
/// is refused, naming the size that would do; keeping a little less makes the room by a
/// smaller component size, and the raid6 shrinks with every kept byte.
#[test]
fn a_shrink_without_room_after_the_data_makes_it_from_the_kept_size() {
    use uraid_engine::{grow_members_with, GrowRequest};
    let devs = members(5, 4 * MB, "sr");
    let o = opts(Level::Raid6, ALGORITHM_LEFT_SYMMETRIC, 64);
    let data = made(&devs, &o, 92);
    let dev = read_superblock(devs[0].as_ref()).unwrap().size;
    let most = dev / 128 * 128 * 2;
    let before = all_bytes(&devs);
    let req = |keep| GrowRequest {
        raid_disks: Some(4),
        array_sectors: Some(keep),
        ..Default::default()
    };
    let e = grow_members_with(devs.clone(), &req(most), ReshapeOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("backup file") && e.contains("leaves enough"),
        "{e}"
    );
    assert!(all_bytes(&devs) == before, "a refusal wrote");
    let keep = most - 1024;
    let r = grow_members_with(devs.clone(), &req(keep), ReshapeOptions::default()).unwrap();
    assert!(r.reshape.is_some_and(|d| d.finished));
    let sb = read_superblock(devs[0].as_ref()).unwrap();
    assert!(
        sb.size < dev,
        "the component size made room: {} -> {}",
        dev,
        sb.size
    );
    let a = open(&devs);
    assert_eq!(a.raid_disks(), 4);
    assert!(a.size_bytes() >= keep * 512 && a.size_bytes() < most * 512);
    same(
        &read_all(&a, (keep * 512) as usize),
        &data[..(keep * 512) as usize],
        "kept",
    );
    assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
    a.stop().unwrap();
}

/// mdadm's raid0 chunk change (`--grow --chunk`): a raid4 with its parity role missing,
/// restriped to the new chunk with that role still missing, then a raid0 again with the
/// same members and every byte.
#[test]
fn a_raid0_changes_its_chunk_through_raid4_as_mdadm_does_it() {
    use uraid_engine::{grow_members_with, GrowRequest};
    let devs = members(3, 6 * MB, "c0");
    let mut o = opts(Level::Raid0, 0, 64);
    o.layout = None;
    let data = made(&devs, &o, 93);
    let r = grow_members_with(
        devs.clone(),
        &GrowRequest {
            chunk_sectors: Some(64),
            ..Default::default()
        },
        ReshapeOptions::default(),
    )
    .unwrap();
    assert!(r.summary.contains("raid0 -> raid4"), "{}", r.summary);
    assert!(!r.summary.contains("rebuilt"), "{}", r.summary);
    assert!(r.missing_roles.is_empty(), "{r:?}");
    let a = open(&devs);
    assert_eq!(a.level(), Level::Raid0);
    assert_eq!(a.raid_disks(), 3);
    assert_eq!(a.geometry().chunk_sectors, 64);
    same(
        &read_all(&a, data.len().min(a.size_bytes() as usize)),
        &data[..data.len().min(a.size_bytes() as usize)],
        "raid0 with a 32K chunk",
    );
    a.stop().unwrap();
    for d in &devs {
        let sb = read_superblock(d.as_ref()).unwrap();
        assert_eq!(
            (sb.level, sb.raid_disks, sb.chunksize),
            (0, 3, 64),
            "{}",
            d.name()
        );
        assert_eq!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0);
    }
}
