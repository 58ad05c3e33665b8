//! `mdadm --grow` without a restripe (engine): raid1 mirror counts, --size, --bitmap none,
//! md's takeovers; each with the data verified before and after, a reassembly after each,
//! refusals that write nothing, and power cuts in the middle of the superblock rewrite.

use rand::Rng;
use std::sync::Arc;
use uraid_core::geometry::raid5::{
    ALGORITHM_LEFT_SYMMETRIC, ALGORITHM_LEFT_SYMMETRIC_6, ALGORITHM_PARITY_N,
};
use uraid_core::superblock::{MetadataVersion, ROLE_FAULTY};
use uraid_core::{Level, MemberIdx};
use uraid_engine::{
    assemble, create, grow_members, read_superblock, AddOutcome, Array, ArrayError,
    AssembleOptions, BitmapChange, CreateOptions, GrowRequest, GrowSize, MemMember, Member,
    MemberOutcome, SyncKind,
};
use uraid_sim::disk::{Power, SimDisk, SimWorld};
use uraid_testkit::engine::{read_all, rng};

const MB: u64 = 1 << 20;

fn members(n: usize, bytes: u64, tag: &str) -> Vec<Arc<dyn Member>> {
    (0..n)
        .map(|i| Arc::new(MemMember::new(format!("{tag}{i}"), bytes)) as Arc<dyn Member>)
        .collect()
}

fn opts(level: Level, layout: Option<u32>) -> CreateOptions {
    let mut o = CreateOptions::new(level);
    o.layout = layout;
    if level != Level::Raid1 {
        o.chunk_sectors = Some(16);
    }
    o.assume_clean = true;
    o.data_offset_sectors = Some(64);
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

fn superblock_bytes(devs: &[Arc<dyn Member>]) -> Vec<Vec<u8>> {
    devs.iter()
        .map(|d| {
            let mut b = vec![0u8; 8192];
            d.read_at(&mut b, 0).unwrap();
            b
        })
        .collect()
}

/// Add `dev` into the missing role and recover it: the array then has no missing role,
/// and md's check finds every copy or parity in agreement.
fn add_and_recover(a: &Array, dev: Arc<dyn Member>) {
    assert!(matches!(
        a.add_member(dev).unwrap(),
        AddOutcome::Recovering(_)
    ));
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    assert!(a.missing_roles().is_empty());
    assert_eq!(
        a.run_sync(SyncKind::Check, |_| {}).unwrap(),
        0,
        "check mismatches"
    );
}

#[test]
fn raid1_grows_to_three_mirrors_and_a_spare_fills_the_new_one() {
    let devs = members(2, 4 * MB, "r1-");
    let data = made(&devs, &opts(Level::Raid1, None), 1);
    let req = GrowRequest {
        raid_disks: Some(3),
        ..Default::default()
    };
    let r = grow_members(devs.clone(), &req).unwrap();
    assert_eq!(r.missing_roles, vec![2]);
    let a = open(&devs);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid1, 3));
    assert_eq!(a.missing_roles(), vec![MemberIdx(2)]);
    assert_eq!(read_all(&a, data.len()), data);
    let third: Arc<dyn Member> = Arc::new(MemMember::new("r1-2", 4 * MB));
    add_and_recover(&a, third.clone());
    a.stop().unwrap();
    drop(a);
    // The new mirror alone holds everything.
    let a = assemble(vec![third], &AssembleOptions::default())
        .unwrap()
        .0;
    assert_eq!(read_all(&a, data.len()), data);
}

#[test]
fn raid1_shrinks_only_to_its_member_count_and_moves_members_down() {
    let devs = members(3, 4 * MB, "r1s-");
    let data = made(&devs, &opts(Level::Raid1, None), 2);
    let two = GrowRequest {
        raid_disks: Some(2),
        ..Default::default()
    };
    let before = superblock_bytes(&devs);
    let e = grow_members(devs.clone(), &two).unwrap_err();
    assert!(matches!(e, ArrayError::Refused(_)), "{e}");
    assert!(e.to_string().contains("3 active members"), "{e}");
    assert_eq!(superblock_bytes(&devs), before, "a refusal writes nothing");
    // Without role 0's member, the two left shrink to 2 roles: role 2 moves down to 0.
    let left = vec![devs[1].clone(), devs[2].clone()];
    grow_members(left.clone(), &two).unwrap();
    let a = open(&left);
    assert_eq!(a.raid_disks(), 2);
    assert!(a.missing_roles().is_empty());
    assert_eq!(read_all(&a, data.len()), data);
}

#[test]
fn size_max_grows_into_the_members_and_resyncs_the_new_region() {
    let devs = members(3, 6 * MB, "sz-");
    let mut o = opts(Level::Raid5, None);
    o.size_sectors = Some(4 * MB / 512);
    let data = made(&devs, &o, 3);
    let r = grow_members(
        devs.clone(),
        &GrowRequest {
            size: Some(GrowSize::Max),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.summary.contains("component size"), "{}", r.summary);
    let a = open(&devs);
    assert!(a.size_bytes() > data.len() as u64, "the array grew");
    assert!(a.meta().needs_resync(), "the grown region is owed a resync");
    assert_eq!(read_all(&a, data.len()), data);
    a.run_sync(SyncKind::Resync, |_| {}).unwrap();
    assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
    a.stop().unwrap();
    // Beyond the members: refused.
    let e = grow_members(
        devs.clone(),
        &GrowRequest {
            size: Some(GrowSize::Sectors(100 * MB / 512)),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("beyond the members"), "{e}");
}

#[test]
fn bitmap_none_drops_the_internal_bitmap() {
    let devs = members(2, 4 * MB, "bm-");
    let mut o = opts(Level::Raid1, None);
    o.bitmap = true;
    let data = made(&devs, &o, 4);
    assert!(open(&devs).has_bitmap());
    grow_members(
        devs.clone(),
        &GrowRequest {
            bitmap: Some(BitmapChange::None),
            ..Default::default()
        },
    )
    .unwrap();
    let a = open(&devs);
    assert!(!a.has_bitmap());
    assert_eq!(read_all(&a, data.len()), data);
}

#[test]
fn raid5_takes_over_as_raid6_with_q_last_and_recovers_q() {
    let devs = members(3, 4 * MB, "r56-");
    let data = made(
        &devs,
        &opts(Level::Raid5, Some(ALGORITHM_LEFT_SYMMETRIC)),
        5,
    );
    let req = GrowRequest {
        level: Some(Level::Raid6),
        ..Default::default()
    };
    let r = grow_members(devs.clone(), &req).unwrap();
    assert_eq!(r.missing_roles, vec![3]);
    let a = open(&devs);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid6, 4));
    assert_eq!(a.geometry().layout, ALGORITHM_LEFT_SYMMETRIC_6);
    assert_eq!(read_all(&a, data.len()), data);
    let q: Arc<dyn Member> = Arc::new(MemMember::new("r56-3", 4 * MB));
    add_and_recover(&a, q.clone());
    a.stop().unwrap();
    drop(a);
    // Q is right: without two data members the data still reads back.
    let a = open(&[devs[0].clone(), q]);
    assert_eq!(read_all(&a, data.len()), data);
}

#[test]
fn raid6_minus_6_goes_back_to_raid5_and_the_q_device_is_a_spare() {
    let devs = members(4, 4 * MB, "r65-");
    let data = made(
        &devs,
        &opts(Level::Raid6, Some(ALGORITHM_LEFT_SYMMETRIC_6)),
        6,
    );
    grow_members(
        devs.clone(),
        &GrowRequest {
            level: Some(Level::Raid5),
            ..Default::default()
        },
    )
    .unwrap();
    let a = open(&devs);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid5, 3));
    assert_eq!(a.geometry().layout, ALGORITHM_LEFT_SYMMETRIC);
    assert_eq!(read_all(&a, data.len()), data);
    assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
}

#[test]
fn raid6_with_a_rotating_layout_needs_a_restripe_to_become_raid5() {
    let devs = members(4, 4 * MB, "r65r-");
    let data = made(
        &devs,
        &opts(Level::Raid6, Some(ALGORITHM_LEFT_SYMMETRIC)),
        7,
    );
    // md's way: a restripe to left-symmetric-6, then the takeover (the restripe engine's
    // part is tested in restripe.rs).
    let r = grow_members(
        devs.clone(),
        &GrowRequest {
            level: Some(Level::Raid5),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.restripe, "{r:?}");
    assert!(r.summary.contains("layout 2 -> 18"), "{}", r.summary);
    let a = open(&devs);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid5, 3));
    assert_eq!(read_all(&a, data.len()), data);
}

#[test]
fn raid0_takes_over_as_raid4_raid5_and_raid10() {
    for (to, layout, disks) in [
        (Level::Raid4, 0, 3),
        (Level::Raid5, ALGORITHM_PARITY_N, 3),
        (Level::Raid10, 0x102, 4),
    ] {
        let devs = members(2, 4 * MB, &format!("r0{to}-"));
        let data = made(&devs, &opts(Level::Raid0, None), 8);
        grow_members(
            devs.clone(),
            &GrowRequest {
                level: Some(to),
                ..Default::default()
            },
        )
        .unwrap();
        let a = open(&devs);
        assert_eq!((a.level(), a.raid_disks()), (to, disks), "{to}");
        assert_eq!(a.geometry().layout, layout);
        assert_eq!(&read_all(&a, data.len()), &data, "{to}");
        for (i, _) in a.missing_roles().into_iter().enumerate() {
            let d: Arc<dyn Member> = Arc::new(MemMember::new(format!("new{i}"), 4 * MB));
            assert!(matches!(
                a.add_member(d).unwrap(),
                AddOutcome::Recovering(_)
            ));
        }
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        assert!(a.missing_roles().is_empty());
        assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0, "{to}");
    }
}

#[test]
fn raid0_with_two_zones_is_refused_with_md_s_reason() {
    let devs: Vec<Arc<dyn Member>> = vec![
        Arc::new(MemMember::new("z0", 4 * MB)),
        Arc::new(MemMember::new("z1", 6 * MB)),
    ];
    made(&devs, &opts(Level::Raid0, None), 9);
    let before = superblock_bytes(&devs);
    let e = grow_members(
        devs.clone(),
        &GrowRequest {
            level: Some(Level::Raid5),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("more than one zone"), "{e}");
    assert_eq!(superblock_bytes(&devs), before);
}

#[test]
fn raid1_and_raid5_with_two_devices_take_over_each_other() {
    let devs = members(2, 4 * MB, "r15-");
    let data = made(&devs, &opts(Level::Raid1, None), 10);
    let to5 = GrowRequest {
        level: Some(Level::Raid5),
        ..Default::default()
    };
    grow_members(devs.clone(), &to5).unwrap();
    let a = open(&devs);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid5, 2));
    assert_eq!(read_all(&a, data.len()), data);
    assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
    a.stop().unwrap();
    drop(a);
    grow_members(
        devs.clone(),
        &GrowRequest {
            level: Some(Level::Raid1),
            ..Default::default()
        },
    )
    .unwrap();
    let a = open(&devs);
    assert_eq!(a.level(), Level::Raid1);
    assert_eq!(read_all(&a, data.len()), data);
    // A 3-mirror raid1 is refused.
    let three = members(3, 4 * MB, "r15t-");
    made(&three, &opts(Level::Raid1, None), 11);
    let e = grow_members(three, &to5).unwrap_err();
    assert!(e.to_string().contains("only with 2 devices"), "{e}");
}

#[test]
fn raid4_and_raid5_parity_last_take_over_each_other() {
    let devs = members(3, 4 * MB, "r45-");
    let data = made(&devs, &opts(Level::Raid4, None), 12);
    grow_members(
        devs.clone(),
        &GrowRequest {
            level: Some(Level::Raid5),
            ..Default::default()
        },
    )
    .unwrap();
    let a = open(&devs);
    assert_eq!(
        (a.level(), a.geometry().layout),
        (Level::Raid5, ALGORITHM_PARITY_N)
    );
    assert_eq!(read_all(&a, data.len()), data);
    assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
    a.stop().unwrap();
    drop(a);
    grow_members(
        devs.clone(),
        &GrowRequest {
            level: Some(Level::Raid4),
            ..Default::default()
        },
    )
    .unwrap();
    let a = open(&devs);
    assert_eq!(a.level(), Level::Raid4);
    assert_eq!(read_all(&a, data.len()), data);
}

/// md's raid0_takeover_raid45 takes a raid4 whose parity role (the last) is the one role
/// missing; mdadm's `--level=0` fails and removes the parity member first (Grow.c
/// impose_level), and so does uraid: the member leaves the array (its role recorded
/// faulty by the others, its own superblock untouched, two events behind), the data roles
/// keep their places and bytes, each member's data_size becomes the component size (md's
/// rdev sectors). A missing data role is refused, writing nothing.
#[test]
fn raid4_becomes_raid0_as_mdadm_takes_it_there() {
    let to0 = GrowRequest {
        level: Some(Level::Raid0),
        ..Default::default()
    };
    // A data member missing: refused.
    let devs = members(3, 4 * MB, "r40-");
    made(&devs, &opts(Level::Raid4, None), 14);
    let a = open(&devs);
    a.fail_member(MemberIdx(0)).unwrap();
    a.stop().unwrap();
    let before = superblock_bytes(&devs);
    let e = grow_members(devs[1..].to_vec(), &to0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing now: 0"), "{e}");
    assert!(e.contains("nothing was written"), "{e}");
    assert_eq!(superblock_bytes(&devs), before);
    // Whole: the parity member leaves.
    let devs = members(3, 4 * MB, "r40a-");
    let data1 = made(&devs, &opts(Level::Raid4, None), 16);
    let own = read_superblock(devs[2].as_ref()).unwrap();
    let r = grow_members(devs.clone(), &to0).unwrap();
    assert!(r.summary.contains("leaves the array"), "{r:?}");
    assert_eq!(
        read_superblock(devs[2].as_ref()).unwrap(),
        own,
        "the leaving member's superblock is not written"
    );
    let (a, rep) = assemble(devs.clone(), &AssembleOptions::default()).unwrap();
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid0, 2));
    assert_eq!(rep.members[2].outcome, MemberOutcome::Faulty, "{rep:?}");
    assert_eq!(read_all(&a, data1.len()), data1);
    a.stop().unwrap();
    for d in &devs[..2] {
        let sb = read_superblock(d.as_ref()).unwrap();
        assert_eq!(sb.dev_roles[own.dev_number as usize], ROLE_FAULTY);
        assert_eq!(sb.data_size, sb.size);
        assert!(sb.events >= own.events + 2, "{} {}", sb.events, own.events);
    }
    // The parity member missing already: a raid0 of the two data members.
    let devs = members(3, 4 * MB, "r40b-");
    let data2 = made(&devs, &opts(Level::Raid4, None), 15);
    let a = open(&devs);
    a.fail_member(MemberIdx(2)).unwrap();
    a.stop().unwrap();
    let r = grow_members(devs[..2].to_vec(), &to0).unwrap();
    assert!(r.missing_roles.is_empty(), "{r:?}");
    let a = open(&devs[..2]);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid0, 2));
    assert_eq!(read_all(&a, data2.len()), data2);
}

#[test]
fn restripes_go_to_the_reshape_engine_and_write_nothing_here() {
    let devs = members(3, 4 * MB, "rs-");
    made(&devs, &opts(Level::Raid5, None), 13);
    let before = superblock_bytes(&devs);
    let e = grow_members(
        devs.clone(),
        &GrowRequest {
            raid_disks: Some(4),
            ..Default::default()
        },
    )
    .unwrap_err();
    // The restripe engine's refusal: the new role needs a device, none was given.
    assert!(e.to_string().contains("needs 1 device(s)"), "{e}");
    assert!(e.to_string().contains("nothing was written"), "{e}");
    assert_eq!(superblock_bytes(&devs), before);
}

/// A power cut at every point of the superblock rewrite: reassembly finds the old shape
/// or the new one, never a mix, and every byte written before.
/// Runs `req` on members made from `images` (named `tag0`, `tag1`...) with the power cut
/// after 0, 1, 2... writes, until a run ends before its cut; after each, `check` gets the
/// array assembled from what was durable, and the number of writes let through.
fn cut_at_every_write(
    tag: &str,
    images: &[Vec<u8>],
    req: &GrowRequest,
    mut check: impl FnMut(Array, i64),
) {
    for ops in 0.. {
        let power = Power::new(ops);
        let cut: Vec<Arc<SimDisk>> = images
            .iter()
            .enumerate()
            .map(|(i, img)| {
                Arc::new(SimDisk::crash_disk(
                    &format!("{tag}{i}"),
                    power.clone(),
                    img.clone(),
                    4096,
                ))
            })
            .collect();
        let _ = grow_members(
            cut.iter().map(|d| d.clone() as Arc<dyn Member>).collect(),
            req,
        );
        let finished = power.on();
        let after: Vec<Arc<dyn Member>> = cut
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Arc::new(SimDisk::from_image(
                    format!("{tag}{i}"),
                    d.durable_image(),
                    SimWorld::new(),
                )) as Arc<dyn Member>
            })
            .collect();
        check(open(&after), ops);
        if finished {
            return;
        }
    }
}

#[test]
fn a_power_cut_mid_grow_leaves_the_old_shape_or_the_new_one() {
    let cases: Vec<(Level, Option<u32>, usize, GrowRequest, Level, usize)> = vec![
        (
            Level::Raid5,
            Some(ALGORITHM_LEFT_SYMMETRIC),
            3,
            GrowRequest {
                level: Some(Level::Raid6),
                ..Default::default()
            },
            Level::Raid6,
            4,
        ),
        (
            Level::Raid1,
            None,
            2,
            GrowRequest {
                raid_disks: Some(3),
                ..Default::default()
            },
            Level::Raid1,
            3,
        ),
        (
            Level::Raid0,
            None,
            3,
            GrowRequest {
                level: Some(Level::Raid5),
                ..Default::default()
            },
            Level::Raid5,
            4,
        ),
        // Same shape, and the bitmap either absent or whole (its area precedes the flip).
        (
            Level::Raid1,
            None,
            2,
            GrowRequest {
                bitmap: Some(BitmapChange::Internal),
                ..Default::default()
            },
            Level::Raid1,
            2,
        ),
    ];
    for (level, layout, n, req, new_level, new_n) in cases {
        let world = SimWorld::new();
        let disks: Vec<Arc<SimDisk>> = (0..n)
            .map(|i| Arc::new(SimDisk::new(format!("pc{i}"), 4 * MB, world.clone())))
            .collect();
        let devs: Vec<Arc<dyn Member>> =
            disks.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
        let mut o = opts(level, layout);
        if req.bitmap.is_some() {
            o.data_offset_sectors = None; // md's default leaves room for a bitmap
        }
        let data = made(&devs, &o, 14);
        let images: Vec<Vec<u8>> = disks.iter().map(|d| d.durable_image()).collect();
        let mut saw_old = false;
        let mut saw_new = false;
        cut_at_every_write("pc", &images, &req, |a, ops| {
            if req.bitmap.is_some() {
                // Old shape: no bitmap; new: a clean one that tracks writes.
                saw_old |= !a.has_bitmap();
                saw_new |= a.has_bitmap();
                if a.has_bitmap() {
                    assert_eq!(
                        a.bitmap_dirty_chunks().map(|(d, _)| d),
                        Some(0),
                        "cut after {ops}"
                    );
                }
                assert_eq!(read_all(&a, data.len()), data, "cut after {ops} writes");
                assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
                return;
            }
            let shape = (a.level(), a.raid_disks());
            assert!(
                shape == (level, n) || shape == (new_level, new_n),
                "{level} -> {new_level}, cut after {ops} writes: assembled as {shape:?}"
            );
            saw_old |= shape == (level, n);
            saw_new |= shape == (new_level, new_n);
            assert_eq!(read_all(&a, data.len()), data, "cut after {ops} writes");
        });
        assert!(
            saw_old && saw_new,
            "{level}: both sides of the cut were tried"
        );
    }
}

#[test]
fn a_degraded_raid5_takes_over_as_raid6_where_md_allows_it() {
    let devs = members(4, 4 * MB, "dg-");
    let data = made(
        &devs,
        &opts(Level::Raid5, Some(ALGORITHM_LEFT_SYMMETRIC)),
        15,
    );
    // Role 1 gone: the raid6 then misses roles 1 and 3 and still holds everything.
    let left = vec![devs[0].clone(), devs[2].clone(), devs[3].clone()];
    let r = grow_members(
        left.clone(),
        &GrowRequest {
            level: Some(Level::Raid6),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.missing_roles, vec![1, 4]);
    let a = open(&left);
    assert_eq!((a.level(), a.raid_disks()), (Level::Raid6, 5));
    assert_eq!(read_all(&a, data.len()), data);
}

#[test]
fn a_far_raid10_is_not_resized_as_md_refuses() {
    let devs = members(4, 6 * MB, "f2-");
    let mut o = opts(Level::Raid10, Some(0x201));
    o.size_sectors = Some(4 * MB / 512);
    made(&devs, &o, 16);
    let before = superblock_bytes(&devs);
    let e = grow_members(
        devs.clone(),
        &GrowRequest {
            size: Some(GrowSize::Max),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("far layout"), "{e}");
    assert_eq!(superblock_bytes(&devs), before);
}

#[test]
fn bitmap_internal_is_added_clean_and_tracks_writes() {
    for v in [
        MetadataVersion::V1_2,
        MetadataVersion::V1_1,
        MetadataVersion::V1_0,
    ] {
        bitmap_added(v);
    }
}

/// A 1.0 member (superblock at the end) gets its bitmap where mdadm's `--grow
/// --bitmap=internal` puts it: below the bad block log under the superblock, above the data.
#[test]
fn a_bitmap_added_to_1_0_sits_between_the_data_and_the_bad_block_log() {
    let devs = bitmap_added(MetadataVersion::V1_0);
    for d in &devs {
        let sb = uraid_engine::read_superblock(d.as_ref()).unwrap();
        // mdadm on an 8 MiB 1.0 member made without a bitmap: 16 sectors below the
        // superblock (its 4 KiB default reserve and the 8-sector log); room 16 - 8, so
        // the smallest chunk is 4 KiB and the default 64 MiB; 1 bit + 1 spare after the
        // 256-byte bitmap superblock round to one 4 KiB block: 8 sectors, then the log's 8.
        assert_eq!(
            sb.super_offset - (sb.data_offset + sb.data_size),
            16,
            "{}",
            d.name()
        );
        assert_eq!(sb.bitmap_offset, -16, "{}", d.name());
        assert_eq!(sb.bblog_offset, -8, "{}", d.name());
    }
}

fn bitmap_added(v: MetadataVersion) -> Vec<Arc<dyn Member>> {
    let devs = members(2, 8 * MB, &format!("bma{v:?}-"));
    let mut o = opts(Level::Raid1, None);
    o.data_offset_sectors = None; // md's default offset leaves room for a bitmap
    o.metadata = v.into();
    let data = made(&devs, &o, 17);
    assert!(!open(&devs).has_bitmap());
    let r = grow_members(
        devs.clone(),
        &GrowRequest {
            bitmap: Some(BitmapChange::Internal),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        r.summary.contains("internal bitmap added"),
        "{v:?}: {}",
        r.summary
    );
    let a = open(&devs);
    assert!(a.has_bitmap(), "{v:?}");
    assert_eq!(
        a.bitmap_dirty_chunks().map(|(d, _)| d),
        Some(0),
        "added clean"
    );
    assert_eq!(read_all(&a, data.len()), data);
    a.write(0, &[1u8; 4096]).unwrap();
    assert!(
        a.bitmap_dirty_chunks().unwrap().0 > 0,
        "a write marks its chunk"
    );
    a.stop().unwrap();
    drop(a);
    let a = open(&devs);
    assert!(a.has_bitmap(), "{v:?}");
    assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0, "{v:?}");
    // The data around the bitmap area is what it was (the area lies outside it).
    let mut got = vec![0u8; data.len()];
    a.read(4096, &mut got[4096..]).unwrap();
    assert!(
        got[4096..] == data[4096..],
        "{v:?}: data changed by the bitmap"
    );
    a.stop().unwrap();
    devs
}

/// `--size` on an array with an internal bitmap (md's bitmap resize): grown, the bitmap
/// covers the new size with its chunk and place kept, the old range's bits as they were and
/// the grown range's set, so the resync that follows passes it (it skips clean chunks);
/// shrunk, it covers the smaller size. A power cut at every write of the grow leaves an
/// array that assembles with the old size or the new, its data whole, and parity right
/// after the resync it owes.
#[test]
fn size_with_an_internal_bitmap_resizes_the_bitmap_and_survives_a_power_cut() {
    let grow = GrowRequest {
        size: Some(GrowSize::Max),
        ..Default::default()
    };
    // raid5's bitmap counts member sectors, raid10's array sectors (md's
    // resync_max_sectors): both resized with the size.
    for (level, tag) in [(Level::Raid5, "bz-"), (Level::Raid10, "bz10-")] {
        let mut o = opts(level, None);
        o.data_offset_sectors = None; // md's default: room for the bitmap
        o.bitmap = true;
        o.bitmap_chunk_bytes = Some(256 << 10);
        o.size_sectors = Some(2 * MB / 512);
        let devs = members(3, 6 * MB, tag);
        let data = made(&devs, &o, 21);
        let (clean, old_chunks) = open(&devs).bitmap_dirty_chunks().unwrap();
        assert_eq!(clean, 0, "{level}: a clean stop leaves no dirty chunk");
        grow_members(devs.clone(), &grow).unwrap();
        let a = open(&devs);
        assert!(
            a.size_bytes() > data.len() as u64,
            "{level}: the array grew"
        );
        let (dirty, chunks) = a.bitmap_dirty_chunks().unwrap();
        let bits_span = if level == Level::Raid10 {
            a.size_bytes() / 512
        } else {
            a.size_bytes() / 512 / 2
        };
        assert_eq!(
            chunks,
            bits_span.div_ceil(512),
            "{level}: the bitmap covers the grown size"
        );
        assert_eq!(
            dirty,
            chunks - old_chunks,
            "{level}: the grown range's bits, and only those"
        );
        assert_eq!(read_all(&a, data.len()), data);
        a.run_sync(SyncKind::Resync, |_| {}).unwrap();
        assert_eq!(a.run_sync(SyncKind::Check, |_| {}).unwrap(), 0);
        let grown = a.size_bytes();
        a.stop().unwrap();
        // Shrunk back: the bitmap covers the smaller size, the data below it stays.
        grow_members(
            devs.clone(),
            &GrowRequest {
                size: Some(GrowSize::Sectors(2 * MB / 512)),
                ..Default::default()
            },
        )
        .unwrap();
        let a = open(&devs);
        assert!(a.size_bytes() < grown);
        assert_eq!(a.bitmap_dirty_chunks().map(|(_, c)| c), Some(old_chunks));
        assert_eq!(read_all(&a, data.len()), data);
        a.stop().unwrap();
    }
    let mut o = opts(Level::Raid5, None);
    o.data_offset_sectors = None;
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(256 << 10);
    o.size_sectors = Some(2 * MB / 512);

    let world = SimWorld::new();
    let disks: Vec<Arc<SimDisk>> = (0..3)
        .map(|i| Arc::new(SimDisk::new(format!("bc{i}"), 6 * MB, world.clone())))
        .collect();
    let devs: Vec<Arc<dyn Member>> = disks.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
    let data = made(&devs, &o, 22);
    let images: Vec<Vec<u8>> = disks.iter().map(|d| d.durable_image()).collect();
    let (mut saw_old, mut saw_new) = (false, false);
    cut_at_every_write("bc", &images, &grow, |a, ops| {
        let grown = a.size_bytes() > data.len() as u64;
        saw_old |= !grown;
        saw_new |= grown;
        assert_eq!(read_all(&a, data.len()), data, "cut after {ops} writes");
        if a.meta().needs_resync() {
            a.run_sync(SyncKind::Resync, |_| {}).unwrap();
        }
        assert_eq!(
            a.run_sync(SyncKind::Check, |_| {}).unwrap(),
            0,
            "cut after {ops} writes: parity wrong after the resync"
        );
        a.stop().unwrap();
    });
    assert!(saw_old && saw_new, "both sides of the cut were tried");
}

/// `--size` growing past what the bitmap's room holds at its chunk: the chunk doubles until
/// the bits fit (md's md_bitmap_resize), said in the summary; the bitmap then covers the
/// new size with the grown range dirty, the data stays, the resync leaves parity right.
#[test]
fn size_past_the_bitmap_room_coarsens_its_chunk_as_md_does() {
    let mut o = opts(Level::Raid5, None);
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(4096);
    // 8 sectors of bitmap room after the superblock: 30720 bits, 120 MiB at a 4 KiB chunk.
    o.data_offset_sectors = Some(24);
    o.size_sectors = Some(2 * MB / 512);
    let devs = members(3, 136 * MB, "bk-");
    let data = made(&devs, &o, 23);
    let (_, old_chunks) = open(&devs).bitmap_dirty_chunks().unwrap();
    assert_eq!(old_chunks, 2 * MB / 4096);
    let r = grow_members(
        devs.clone(),
        &GrowRequest {
            size: Some(GrowSize::Max),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.summary.contains("bitmap chunk 4K -> 8K"), "{}", r.summary);
    let a = open(&devs);
    let member = a.size_bytes() / 2;
    let (dirty, chunks) = a.bitmap_dirty_chunks().unwrap();
    assert_eq!(
        chunks,
        member.div_ceil(8192),
        "8 KiB chunks over the new size"
    );
    assert_eq!(
        dirty,
        chunks - old_chunks / 2,
        "the grown range's bits, and only those"
    );
    assert_eq!(read_all(&a, data.len()), data);
    // The grown range takes writes through the coarser bitmap.
    let far = a.size_bytes() - 64 * 1024;
    a.write(far, &[0x5a; 4096]).unwrap();
    let mut back = vec![0u8; 4096];
    a.read(far, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    a.stop().unwrap();
}
