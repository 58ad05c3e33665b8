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
use uraid_testkit::engine::rng;

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
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i} (sector {})", i / 512);
    }
}

fn read_all(a: &Array, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    a.read(0, &mut v).unwrap();
    v
}

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
    // Degraded.
    let a = open(&devs);
    a.fail_member(uraid_core::MemberIdx(2)).unwrap();
    a.stop().unwrap();
    check(&devs[..2], &grow, members(1, 6 * MB, "x"), "degraded");
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
    let size = 2 * MB;
    for (n, (level, disks, req)) in [
        (
            Level::Raid5,
            3,
            ReshapeRequest {
                raid_disks: Some(4),
                ..Default::default()
            },
        ),
        (
            Level::Raid6,
            4,
            ReshapeRequest {
                chunk_sectors: Some(64),
                ..Default::default()
            },
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let world = SimWorld::new();
        let new_disks = req.raid_disks.unwrap_or(disks);
        let disks_v: Vec<Arc<SimDisk>> = (0..new_disks)
            .map(|i| Arc::new(SimDisk::new(format!("pc{n}-{i}"), size, world.clone())))
            .collect();
        let devs: Vec<Arc<dyn Member>> = disks_v
            .iter()
            .map(|d| d.clone() as Arc<dyn Member>)
            .collect();
        let mut o = opts(level, ALGORITHM_LEFT_SYMMETRIC, 16);
        o.data_offset_sectors = Some(256);
        let data = made(&devs[..disks], &o, 40 + n as u64);
        let images: Vec<Vec<u8>> = disks_v.iter().map(|d| d.durable_image()).collect();
        let (mut saw_mid, mut saw_done) = (false, false);
        let mut ops = 0i64;
        loop {
            let power = Power::new(ops);
            let cut = SimDisk::crash_set(&format!("pc{n}-"), &power, &images);
            let cut_devs: Vec<Arc<dyn Member>> =
                cut.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
            let _ = reshape_members(
                cut_devs[..disks].to_vec(),
                &req,
                ReshapeOptions {
                    add: cut_devs[disks..].to_vec(),
                    ..Default::default()
                },
            );
            let finished = power.on();
            let after = SimDisk::after_cut(&cut);
            // Only the devices that joined before the cut: an added disk without a
            // superblock is not offered.
            let joined: Vec<Arc<dyn Member>> = after
                .iter()
                .filter(|d| read_superblock(d.as_ref()).is_ok())
                .cloned()
                .collect();
            let a = open(&joined);
            if read_all(&a, data.len()) != data {
                for d in &joined {
                    let sb = read_superblock(d.as_ref()).unwrap();
                    eprintln!(
                        "{}: events {} features {:#x} pos {} roles {:?} dev_number {} do {} no {}",
                        d.name(),
                        sb.events,
                        sb.feature_map,
                        sb.reshape_position,
                        &sb.dev_roles[..6],
                        sb.dev_number,
                        sb.data_offset,
                        sb.new_offset
                    );
                }
                let (_, rep) = assemble(joined.clone(), &AssembleOptions::default()).unwrap();
                eprintln!("{rep:?} missing {:?}", a.missing_roles());
            }
            same(
                &read_all(&a, data.len()),
                &data,
                &format!("case {n}: cut after {ops} writes"),
            );
            let mid = a.is_reshaping();
            saw_mid |= mid;
            a.stop().unwrap();
            if mid {
                let r = continue_reshape(joined.clone(), ReshapeOptions::default())
                    .unwrap_or_else(|e| panic!("case {n}: cut after {ops}: {e}"));
                assert!(r.finished);
            }
            let (a, rep) = assemble(joined.clone(), &AssembleOptions::default()).unwrap();
            if !a.missing_roles().is_empty() {
                for d in &joined {
                    let sb = read_superblock(d.as_ref()).unwrap();
                    eprintln!(
                        "{}: events {} features {:#x} pos {} roles {:?} dev_number {} do {}",
                        d.name(),
                        sb.events,
                        sb.feature_map,
                        sb.reshape_position,
                        &sb.dev_roles[..6],
                        sb.dev_number,
                        sb.data_offset
                    );
                }
                panic!("case {n}: cut after {ops}: degraded after continuing (mid {mid}): {rep:?}");
            }
            if a.raid_disks() == new_disks
                && a.geometry().chunk_sectors == req.chunk_sectors.unwrap_or(32)
            {
                saw_done = true;
                assert_eq!(
                    a.run_sync(SyncKind::Check, |_| {}).unwrap(),
                    0,
                    "case {n}: cut after {ops}"
                );
            }
            same(
                &read_all(&a, data.len()),
                &data,
                &format!("case {n}: cut after {ops} writes, continued"),
            );
            a.stop().unwrap();
            if finished {
                break;
            }
            ops += 1 + ops / 8;
        }
        assert!(
            saw_mid && saw_done,
            "case {n}: mid {saw_mid} done {saw_done}"
        );
    }
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
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET | FEATURE_RESHAPE_BACKWARDS;
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
