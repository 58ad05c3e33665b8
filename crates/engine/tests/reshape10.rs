//! Issues 12 and 15 for raid10: an array Linux md left in the middle of a raid10 reshape
//! (near/offset layouts, the data offset moving: FEATURE_RESHAPE_ACTIVE + FEATURE_NEW_OFFSET,
//! RESHAPE_BACKWARDS when the offset moves up) reads exactly what md would, and `uraid grow
//! --continue` finishes it in md's format.
//!
//! Members are left as md leaves them: the reshaped part written to every copy of the new
//! geometry at `data_offset + new_offset`, the rest untouched in the old geometry, every
//! superblock recording the reshape.

use std::sync::Arc;
use uraid_core::geometry::{ArrayGeometry, Raid10};
use uraid_core::superblock::*;
use uraid_core::{Level, SECTOR_BYTES};
use uraid_engine::{
    assemble, continue_reshape, read_superblock, write_superblock, AssembleOptions, CreateOptions,
    MemMember, Member, ReshapeOptions,
};
use uraid_testkit::engine::{as_members, same_but_unsure, writes_until_cut};

const DATA_OFFSET: u64 = 2048;
const MEMBER_BYTES: u64 = 8 << 20;

#[derive(Clone, Copy, Debug)]
struct Shape {
    layout: u32,
    chunk: u64,
    disks: usize,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    old: Shape,
    new: Shape,
    /// Sectors the data area moves (negative: down, a forwards reshape).
    new_offset: i32,
    /// reshape_position, in sectors (any multiple of md's 64 KiB window).
    position: u64,
}

impl Case {
    fn backwards(&self) -> bool {
        self.new_offset > 0
    }
}

fn r10(s: Shape, dev_sectors: u64) -> Raid10 {
    Raid10::new(&ArrayGeometry {
        level: Level::Raid10,
        layout: s.layout,
        chunk_sectors: s.chunk,
        raid_disks: s.disks,
        dev_sectors,
        member_sectors: Vec::new(),
    })
    .unwrap()
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64 ^ seed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(17) as u8
        })
        .collect()
}

/// Write array sectors `[s, e)` of `data` (zeros past its end) to every copy of `g` with
/// member `i`'s data area at `base(i)` sectors.
fn write_geometry(
    devs: &[Arc<MemMember>],
    g: &Raid10,
    base: &dyn Fn(usize) -> u64,
    data: &[u8],
    s: u64,
    e: u64,
) {
    let mut at = s;
    while at < e {
        let m = g.map(at);
        let n = m.contiguous_sectors.min(e - at);
        let from = (at * SECTOR_BYTES) as usize;
        let len = (n * SECTOR_BYTES) as usize;
        let mut piece = vec![0u8; len];
        if from < data.len() {
            let have = (data.len() - from).min(len);
            piece[..have].copy_from_slice(&data[from..from + have]);
        }
        for &(role, ms) in &m.copies {
            devs[role.0]
                .write_at(&piece, (base(role.0) + ms) * SECTOR_BYTES)
                .unwrap();
        }
        at += n;
    }
}

/// Members mid-reshape and the bytes the array held before it began (its size then).
fn mid_reshape(c: &Case) -> (Vec<Arc<MemMember>>, Vec<u8>) {
    mid_reshape_on(c, MEMBER_BYTES, DATA_OFFSET)
}

fn mid_reshape_on(c: &Case, member_bytes: u64, data_offset: u64) -> (Vec<Arc<MemMember>>, Vec<u8>) {
    let devs: Vec<Arc<MemMember>> = (0..c.old.disks.max(c.new.disks))
        .map(|i| Arc::new(MemMember::new(format!("m{i}"), member_bytes)))
        .collect();
    let mut opts = CreateOptions::new(Level::Raid10);
    opts.layout = Some(c.old.layout);
    opts.chunk_sectors = Some(c.old.chunk);
    opts.assume_clean = true;
    opts.data_offset_sectors = Some(data_offset);
    // Room after the data area for a reshape that moves it up.
    opts.size_sectors = Some(member_bytes / SECTOR_BYTES - 2 * data_offset);
    let a = uraid_engine::create(as_members(&devs[..c.old.disks]), &opts).unwrap();
    let data = pattern(a.size_bytes() as usize, c.position);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    drop(a);

    let sb0 = read_superblock(devs[0].as_ref()).unwrap();
    let (old, new) = (r10(c.old, sb0.size), r10(c.new, sb0.size));
    assert_eq!(old.array_sectors() * SECTOR_BYTES, data.len() as u64);
    // The reshaped part, in the new geometry at the new offset.
    // md keeps a new data offset per member (mdadm may give members different ones): odd
    // members move 128 sectors further.
    let new_base = |i: usize| (data_offset as i64 + i64::from(member_new_offset(c, i))) as u64;
    let min_disks = c.old.disks.min(c.new.disks);
    let running = new.used_dev_sectors / new.chunk_sectors / new.far_copies as u64
        * min_disks as u64
        / new.near_copies as u64
        * new.chunk_sectors;
    let (s, e) = if c.backwards() {
        (c.position, running)
    } else {
        (0, c.position)
    };
    // md reads the reshaped part only from the new geometry: its old copies are spoiled
    // here, so a reader that takes the wrong side fails.
    let junk = pattern(data.len(), !c.position);
    write_geometry(&devs, &old, &|_| data_offset, &junk, s, e);
    write_geometry(&devs, &new, &new_base, &data, s, e);
    let mut roles = sb0.dev_roles.clone();
    while roles.len() < c.new.disks.max(c.old.disks) {
        roles.push(ROLE_SPARE);
    }
    for (r, role) in roles
        .iter_mut()
        .enumerate()
        .take(c.new.disks.max(c.old.disks))
    {
        *role = r as u16;
    }
    for (r, d) in devs.iter().enumerate() {
        let mut sb = sb0.clone();
        sb.dev_number = r as u32;
        sb.device_uuid = [r as u8 + 1; 16];
        sb.dev_roles = roles.clone();
        sb.raid_disks = c.new.disks as u32;
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
        // As md writes it (super_1_sync): the bit only where the device count stays; a
        // shrink is backwards by its negative delta_disks.
        if c.backwards() && c.new.disks == c.old.disks {
            sb.feature_map |= FEATURE_RESHAPE_BACKWARDS;
        }
        sb.reshape_position = c.position;
        sb.new_level = 10;
        sb.new_layout = c.new.layout;
        sb.new_chunk = c.new.chunk as u32;
        sb.delta_disks = c.new.disks as i32 - c.old.disks as i32;
        sb.new_offset = member_new_offset(c, r);
        sb.events += 1;
        write_superblock(d.as_ref(), &sb).unwrap();
    }
    let keep = (running * SECTOR_BYTES) as usize;
    (devs, data[..keep.min(data.len())].to_vec())
}

/// Member `i`'s new_offset: the case's, odd members 128 sectors further the same way.
fn member_new_offset(c: &Case, i: usize) -> i32 {
    let extra = if i % 2 == 1 { 128 } else { 0 };
    if c.backwards() {
        c.new_offset + extra
    } else {
        c.new_offset - extra
    }
}

fn members(devs: &[Arc<MemMember>], skip: Option<usize>) -> Vec<Arc<dyn Member>> {
    devs.iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != skip)
        .map(|(_, d)| d.clone() as Arc<dyn Member>)
        .collect()
}

/// `n` (a range) memory members of `bytes`, named by `name`.
fn mem_devs(
    n: std::ops::Range<usize>,
    bytes: u64,
    name: impl Fn(usize) -> String,
) -> Vec<Arc<MemMember>> {
    n.map(|i| Arc::new(MemMember::new(name(i), bytes)))
        .collect()
}

/// A raid10 of `layout` and `chunk` sectors, assumed clean, its data at `data_offset`.
fn r10_options(layout: u32, chunk: u64, data_offset: u64) -> CreateOptions {
    let mut o = CreateOptions::new(Level::Raid10);
    o.layout = Some(layout);
    o.chunk_sectors = Some(chunk);
    o.assume_clean = true;
    o.data_offset_sectors = Some(data_offset);
    o
}

const N2: u32 = 0x102;
const N3: u32 = 0x103;
const O2: u32 = 0x10201;

fn cases() -> Vec<Case> {
    let sh = |layout, chunk, disks| Shape {
        layout,
        chunk,
        disks,
    };
    vec![
        // mdadm --grow --raid-devices=5 on a 4-member near=2 (the offset moves down).
        Case {
            old: sh(N2, 128, 4),
            new: sh(N2, 128, 5),
            new_offset: -1024,
            position: 7 * 128 + 128 * 3,
        },
        // Half a chunk in (md copies 64 KiB windows of a larger chunk).
        Case {
            old: sh(N2, 256, 4),
            new: sh(N2, 256, 6),
            new_offset: -512,
            position: 128 * 37,
        },
        // near=3 on 4 -> 5, chunk 64 -> 32 KiB.
        Case {
            old: sh(N3, 128, 4),
            new: sh(N3, 64, 5),
            new_offset: -256,
            position: 128 * 21,
        },
        // near -> offset on the same members, forwards.
        Case {
            old: sh(N2, 128, 4),
            new: sh(O2, 128, 4),
            new_offset: -1024,
            position: 128 * 30,
        },
        // A shrink 5 -> 4: backwards, the offset moves up.
        Case {
            old: sh(N2, 128, 5),
            new: sh(N2, 128, 4),
            new_offset: 1024,
            position: 128 * 50,
        },
        // offset -> near, backwards.
        Case {
            old: sh(O2, 128, 4),
            new: sh(N2, 128, 4),
            new_offset: 512,
            position: 128 * 44,
        },
    ]
}

/// Every byte reads as it was before the reshape, in one request and in pieces across the
/// position, healthy and with each member missing in turn (where the array survives that);
/// the array is served read-write (reading changes no member byte).
#[test]
fn mid_reshape_raid10_reads_what_md_would() {
    let mut refused = 0;
    for c in cases() {
        let (devs, data) = mid_reshape(&c);
        let before: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
        for skip in std::iter::once(None).chain((0..devs.len()).map(Some)) {
            let (a, _) = match assemble(members(&devs, skip), &AssembleOptions::default()) {
                Ok(x) => x,
                Err(e) if skip.is_some() => {
                    // A missing member of a near=2 shrink takes a whole mirror set with it
                    // in one of the geometries only where md refuses too.
                    eprintln!("{c:?} without {skip:?}: {e}");
                    refused += 1;
                    continue;
                }
                Err(e) => panic!("{c:?}: {e}"),
            };
            assert_eq!(
                a.size_bytes(),
                data.len() as u64,
                "{c:?}: md's size mid-reshape"
            );
            assert!(a.is_reshaping(), "{c:?}");
            assert!(!a.is_read_only(), "{c:?}: {:?}", a.read_only_reason());
            let mut got = vec![0u8; data.len()];
            a.read(0, &mut got).unwrap();
            let first_bad = got.iter().zip(&data).position(|(x, y)| x != y);
            assert_eq!(first_bad, None, "{c:?} without {skip:?}");
            let p = c.position * SECTOR_BYTES;
            for start in [p.saturating_sub(3 * 512), p.saturating_sub(1), 7] {
                let len = (7 * 1024 + 512).min(data.len() as u64 - start) as usize;
                let mut piece = vec![0u8; len];
                a.read(start, &mut piece).unwrap();
                assert!(
                    piece == data[start as usize..start as usize + len],
                    "{c:?}: piece at {start}"
                );
            }
            a.stop().unwrap();
        }
        for (d, b) in devs.iter().zip(&before) {
            assert!(d.snapshot() == *b, "{c:?}: {} changed", d.name());
        }
    }
    // A near=2 array survives any one member missing in both geometries.
    assert_eq!(refused, 0);
}

/// `uraid grow --continue`: the reshape runs to its end; the superblocks say the new shape
/// (raid_disks, layout, chunk, data_offset moved, reshape bits cleared); the array reads
/// what it held (zeros in the part a grow added), and every copy agrees (check: 0).
/// Stopped part-way first, at a recorded position that uraid (and md) read the same.
#[test]
fn grow_continue_finishes_a_raid10_reshape() {
    for c in cases() {
        let (devs, data) = mid_reshape(&c);
        // Part-way: stop a few windows on.
        let stop = if c.backwards() {
            c.position.saturating_sub(4096)
        } else {
            c.position + 4096
        };
        let r = continue_reshape(
            members(&devs, None),
            ReshapeOptions {
                stop_at: Some(stop),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!r.finished, "{c:?}: {r:?}");
        assert!(r.checkpoints > 0 && r.windows > 0, "{c:?}: {r:?}");
        let sb = read_superblock(devs[0].as_ref()).unwrap();
        assert_eq!(sb.reshape_position, r.position_sectors, "{c:?}");
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        let mut got = vec![0u8; data.len()];
        a.read(0, &mut got).unwrap();
        assert!(got == data, "{c:?}: stopped at {}", r.position_sectors);
        a.stop().unwrap();
        drop(a);

        let r = continue_reshape(members(&devs, None), ReshapeOptions::default()).unwrap();
        assert!(r.finished, "{c:?}: {r:?}");
        for (i, d) in devs.iter().enumerate().take(c.new.disks) {
            let sb = read_superblock(d.as_ref()).unwrap();
            assert_eq!(
                sb.feature_map
                    & (FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET | FEATURE_RESHAPE_BACKWARDS),
                0,
                "{c:?} member {i}"
            );
            assert_eq!(sb.raid_disks as usize, c.new.disks);
            assert_eq!(sb.layout, c.new.layout);
            assert_eq!(u64::from(sb.chunksize), c.new.chunk);
            assert_eq!(sb.delta_disks, 0);
            assert_eq!(
                sb.data_offset as i64,
                DATA_OFFSET as i64 + i64::from(member_new_offset(&c, i)),
                "{c:?} member {i}"
            );
        }
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        assert!(!a.is_reshaping());
        let new = r10(c.new, read_superblock(devs[0].as_ref()).unwrap().size);
        assert_eq!(a.size_bytes(), new.array_sectors() * SECTOR_BYTES, "{c:?}");
        let mut got = vec![0u8; a.size_bytes() as usize];
        a.read(0, &mut got).unwrap();
        let keep = data.len().min(got.len());
        assert!(got[..keep] == data[..keep], "{c:?}: data after the reshape");
        assert!(
            got[keep..].iter().all(|&b| b == 0),
            "{c:?}: the grown part reads as zeros"
        );
        assert_eq!(a.check().unwrap(), 0, "{c:?}: every copy equal");
        a.stop().unwrap();
    }
}

/// What md refuses to reshape is refused by name at assembly, before anything is written:
/// far copies, a change of copies.
#[test]
fn far_layouts_and_copy_changes_are_refused_by_name() {
    let base = cases()[0];
    for (layout, new_layout, what) in [(0x201u32, 0x201u32, "far copies"), (N2, N3, "copies")] {
        let c = Case {
            old: Shape { layout, ..base.old },
            new: Shape {
                layout: new_layout,
                ..base.new
            },
            ..base
        };
        let devs = mem_devs(0..5, MEMBER_BYTES, |i| format!("m{i}"));
        let opts = r10_options(c.old.layout, c.old.chunk, DATA_OFFSET);
        let a = uraid_engine::create(as_members(&devs[..4]), &opts).unwrap();
        a.stop().unwrap();
        drop(a);
        for d in &devs[..4] {
            let mut sb = read_superblock(d.as_ref()).unwrap();
            sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
            sb.new_level = 10;
            sb.new_layout = new_layout;
            sb.new_chunk = sb.chunksize;
            sb.raid_disks = 5;
            sb.delta_disks = 1;
            sb.new_offset = -1024;
            write_superblock(d.as_ref(), &sb).unwrap();
        }
        let before: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
        let err = match assemble(members(&devs[..4], None), &AssembleOptions::default()) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{what}: assembled"),
        };
        assert!(
            err.contains("FEATURE_RESHAPE_ACTIVE") && err.contains(what),
            "{what}: {err}"
        );
        for (d, b) in devs.iter().zip(&before) {
            assert!(d.snapshot() == *b);
        }
    }
}

/// A power cut after every write or flush of `uraid grow --continue` (each write since the
/// last flush kept, dropped or torn, drawn from a seeded generator): the members assemble
/// with every byte, mid-reshape or finished, and continuing from there finishes it with the
/// same bytes and every copy equal.
#[test]
fn a_power_cut_anywhere_in_a_raid10_continue_loses_nothing() {
    use uraid_sim::disk::{Power, SimDisk, SimWorld};
    let sh = |layout, disks| Shape {
        layout,
        chunk: 64,
        disks,
    };
    for (n, c) in [
        Case {
            old: sh(N2, 4),
            new: sh(N2, 5),
            new_offset: -128,
            position: 64 * 3,
        },
        Case {
            old: sh(N2, 5),
            new: sh(N2, 4),
            new_offset: 128,
            position: 64 * 20,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let (mems, data) = mid_reshape_on(&c, 1 << 20, 512);
        let images: Vec<Vec<u8>> = mems.iter().map(|d| d.snapshot()).collect();
        let mut ops = 0i64;
        let mut saw_mid = false;
        loop {
            let seed = 0x5eed_0000 + (n as u64) * 100_000 + ops as u64;
            let mut rng = uraid_testkit::engine::rng(seed);
            let power = Power::new(ops);
            let cut = SimDisk::crash_set(&format!("pc{n}-"), &power, &images);
            let cut_devs: Vec<Arc<dyn Member>> =
                cut.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
            let _ = continue_reshape(cut_devs, ReshapeOptions::default());
            let finished = power.on();
            let after: Vec<Arc<dyn Member>> = cut
                .iter()
                .map(|d| {
                    let img = d.crash(&mut rng);
                    Arc::new(SimDisk::from_image(d.name(), img, SimWorld::new())) as _
                })
                .collect();
            let what = format!("case {n}: cut after {ops} writes (seed {seed:#x})");
            let (a, _) = assemble(after.clone(), &AssembleOptions::default())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut got = vec![0u8; data.len()];
            a.read(0, &mut got)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(got == data, "{what}: bytes differ");
            let mid = a.is_reshaping();
            saw_mid |= mid;
            a.stop().unwrap();
            drop(a);
            if mid {
                let r = continue_reshape(after.clone(), ReshapeOptions::default())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(r.finished, "{what}");
            }
            let (a, _) = assemble(after, &AssembleOptions::default()).unwrap();
            assert!(!a.is_reshaping(), "{what}");
            let mut got = vec![0u8; data.len()];
            a.read(0, &mut got).unwrap();
            assert!(got == data, "{what}: bytes after the finish");
            assert_eq!(a.check().unwrap(), 0, "{what}: copies differ");
            a.stop().unwrap();
            if finished {
                break;
            }
            ops += 1;
        }
        assert!(saw_mid && ops > 10, "case {n}: {ops} cuts");
    }
}

/// `uraid grow` starts a raid10 reshape in md's format (near 4 -> 5 with a spare added, a
/// near -> offset switch, a chunk change): stopped part-way, the members record a reshape md
/// runs (FEATURE_NEW_OFFSET, the data offset moving down, forwards) and read the same bytes;
/// continued, it ends in the new shape with the same bytes and every copy equal.
#[test]
fn grow_starts_a_raid10_reshape_in_mds_format() {
    use uraid_engine::{reshape_members, ReshapeRequest};
    for (n, (req, add)) in [
        (
            ReshapeRequest {
                raid_disks: Some(5),
                ..Default::default()
            },
            1,
        ),
        (
            ReshapeRequest {
                layout: Some(O2),
                ..Default::default()
            },
            0,
        ),
        (
            ReshapeRequest {
                chunk_sectors: Some(64),
                ..Default::default()
            },
            0,
        ),
        // With an internal bitmap (case 3): kept through the reshape, in step at its end.
        (
            ReshapeRequest {
                layout: Some(O2),
                ..Default::default()
            },
            0,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let bitmap = n == 3;
        let devs = mem_devs(0..4 + add, MEMBER_BYTES, |i| format!("g{n}-{i}"));
        let mut opts = r10_options(N2, 128, DATA_OFFSET);
        opts.bitmap = bitmap;
        let a = uraid_engine::create(as_members(&devs[..4]), &opts).unwrap();
        let data = pattern(a.size_bytes() as usize, 77 + n as u64);
        a.write(0, &data).unwrap();
        a.stop().unwrap();
        drop(a);
        let r = reshape_members(
            members(&devs[..4], None),
            &req,
            ReshapeOptions {
                add: members(&devs[4..], None),
                stop_at: Some(4096),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{n}: {e}"));
        assert!(!r.finished, "{n}: {r:?}");
        for d in &devs {
            let sb = read_superblock(d.as_ref()).unwrap();
            assert_eq!(
                sb.feature_map
                    & (FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET | FEATURE_RESHAPE_BACKWARDS),
                FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET,
                "{n}"
            );
            assert!(sb.new_offset < 0, "{n}: the data offset moves down");
            assert_eq!(sb.reshape_position, r.position_sectors);
            assert_eq!(sb.raid_disks, 4 + add as u32);
        }
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        assert!(a.is_reshaping());
        let mut got = vec![0u8; data.len()];
        a.read(0, &mut got).unwrap();
        assert!(got == data, "{n}: mid-reshape");
        a.stop().unwrap();
        drop(a);
        let r = continue_reshape(members(&devs, None), ReshapeOptions::default()).unwrap();
        assert!(r.finished);
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        assert!(!a.is_reshaping());
        let sb = read_superblock(devs[0].as_ref()).unwrap();
        assert_eq!(sb.raid_disks, 4 + add as u32);
        assert_eq!(sb.layout, req.layout.unwrap_or(N2));
        assert_eq!(u64::from(sb.chunksize), req.chunk_sectors.unwrap_or(128));
        let mut got = vec![0u8; a.size_bytes() as usize];
        a.read(0, &mut got).unwrap();
        assert!(got[..data.len()] == data[..], "{n}: after the reshape");
        assert!(got[data.len()..].iter().all(|&b| b == 0));
        assert_eq!(a.check().unwrap(), 0, "{n}");
        if bitmap {
            let bm = uraid_engine::BitmapState::load(devs[3].as_ref(), &sb_of(&devs[3]))
                .unwrap()
                .expect("the bitmap stays");
            assert_eq!(
                bm.sb.sync_size,
                a.size_bytes() / 512,
                "{n}: the array's size"
            );
            assert_eq!(
                a.bitmap_dirty_chunks().map(|d| d.0),
                Some(0),
                "{n}: not stale"
            );
        }
        a.stop().unwrap();
    }
}

fn sb_of(d: &MemMember) -> Superblock {
    read_superblock(d).unwrap()
}

/// Issue 15: `uraid grow --raid-devices N --array-size SIZE` shrinks a raid10 as md does
/// (raid10_start_reshape with reshape_backwards): stopped part-way, the members record a
/// backwards reshape from the end of the smaller shape with the data offset moving up
/// (FEATURE_RESHAPE_BACKWARDS, a positive new_offset), the component size lowered to make
/// that room, and read the kept bytes; continued, the array ends with fewer devices, the
/// kept bytes, every copy equal and the device that left a spare.
#[test]
fn grow_shrinks_a_raid10_in_mds_format() {
    use uraid_engine::{reshape_members, ReshapeRequest};
    for (n, (layout, chunk, from, to, keep)) in [
        (N2, 128u64, 4usize, 3usize, 16384u64),
        (O2, 64, 5, 4, 16384),
        (N3, 128, 4, 3, 12288),
        // With an internal bitmap (case 3): kept, and resized to the smaller array.
        (N2, 128, 4, 3, 16384),
    ]
    .into_iter()
    .enumerate()
    {
        let bitmap = n == 3;
        let devs = mem_devs(0..from, MEMBER_BYTES, |i| format!("s{n}-{i}"));
        let mut opts = r10_options(layout, chunk, DATA_OFFSET);
        opts.bitmap = bitmap;
        let a = uraid_engine::create(as_members(&devs), &opts).unwrap();
        let data = pattern(a.size_bytes() as usize, 91 + n as u64);
        a.write(0, &data).unwrap();
        let dev_before = read_superblock(devs[0].as_ref()).unwrap().size;
        a.stop().unwrap();
        drop(a);
        let kept = (keep * SECTOR_BYTES) as usize;
        let req = ReshapeRequest {
            raid_disks: Some(to),
            array_sectors: Some(keep),
            ..Default::default()
        };
        let r = reshape_members(
            members(&devs, None),
            &req,
            ReshapeOptions {
                stop_at: Some(keep / 2),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{n}: {e}"));
        assert!(!r.finished, "{n}: {r:?}");
        for d in &devs {
            let sb = read_superblock(d.as_ref()).unwrap();
            assert_eq!(
                sb.feature_map
                    & (FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET | FEATURE_RESHAPE_BACKWARDS),
                FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET | FEATURE_RESHAPE_BACKWARDS,
                "{n}"
            );
            assert!(sb.new_offset > 0, "{n}: the data offset moves up");
            assert!(
                sb.size < dev_before,
                "{n}: the component size made the room"
            );
            assert_eq!(sb.reshape_position, r.position_sectors);
            assert!(
                r.position_sectors <= keep / 2 && r.position_sectors > 0,
                "{n}: {r:?}"
            );
            assert_eq!(sb.raid_disks, to as u32);
            assert_eq!(sb.delta_disks, to as i32 - from as i32);
            let st = uraid_core::geometry::Raid10Reshape::from_superblock(&sb)
                .unwrap()
                .unwrap();
            assert!(st.array_sectors() >= keep, "{n}: md's size while it runs");
        }
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        assert!(a.is_reshaping());
        let mut got = vec![0u8; kept];
        a.read(0, &mut got).unwrap();
        assert!(got == data[..kept], "{n}: mid-reshape");
        a.stop().unwrap();
        drop(a);
        let r = continue_reshape(members(&devs, None), ReshapeOptions::default()).unwrap();
        assert!(r.finished, "{n}: {r:?}");
        let (a, rep) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        assert!(!a.is_reshaping());
        assert!(a.size_bytes() >= keep * SECTOR_BYTES);
        let sb = read_superblock(devs[0].as_ref()).unwrap();
        assert_eq!(sb.raid_disks, to as u32);
        assert_eq!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0);
        let spares = rep
            .members
            .iter()
            .filter(|m| matches!(m.outcome, uraid_engine::MemberOutcome::Spare))
            .count();
        assert_eq!(spares, from - to, "{n}: the devices that left are spares");
        let mut got = vec![0u8; kept];
        a.read(0, &mut got).unwrap();
        assert!(got == data[..kept], "{n}: after the shrink");
        assert_eq!(a.check().unwrap(), 0, "{n}");
        if bitmap {
            let bm = uraid_engine::BitmapState::load(devs[0].as_ref(), &sb_of(&devs[0]))
                .unwrap()
                .expect("the bitmap stays");
            assert_eq!(bm.sb.sync_size, a.size_bytes() / 512, "{n}: resized");
        }
        a.stop().unwrap();
    }
}

/// A raid10 shrink md would refuse is refused by name before anything is written: without
/// --array-size, a size past what the smaller shape holds, a size that is not whole new
/// chunks, no room after the data even at the smallest component size.
#[test]
fn a_raid10_shrink_md_refuses_is_refused_by_name() {
    use uraid_engine::{reshape_members, ReshapeRequest};
    for (keep, want) in [
        (None, "array size must be reduced"),
        (Some(21504 + 128), "holds at most"),
        (Some(16384 + 8), "not a whole number"),
        (Some(21504), "room after the data"),
    ] {
        let devs = mem_devs(0..4, MEMBER_BYTES, |i| format!("r{i}"));
        let opts = r10_options(N2, 128, DATA_OFFSET);
        let a = uraid_engine::create(as_members(&devs), &opts).unwrap();
        a.stop().unwrap();
        drop(a);
        let before: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
        let err = reshape_members(
            members(&devs, None),
            &ReshapeRequest {
                raid_disks: Some(3),
                array_sectors: keep,
                ..Default::default()
            },
            ReshapeOptions::default(),
        )
        .map(|r| r.summary)
        .unwrap_err()
        .to_string();
        assert!(err.contains(want), "{want}: {err}");
        assert!(err.contains("nothing was written"), "{err}");
        for (d, b) in devs.iter().zip(&before) {
            assert!(d.snapshot() == *b, "{want}: {} changed", d.name());
        }
    }
}

/// What md refuses to start is refused by name before anything is written: far copies,
/// a change of copies, a switch to far, no room before the data, a grow with a bitmap.
#[test]
fn grow_refuses_what_md_refuses_for_raid10() {
    use uraid_engine::{reshape_members, ReshapeRequest};
    let far = 0x201u32;
    for (layout, data_offset, req, want) in [
        (
            far,
            DATA_OFFSET,
            ReshapeRequest {
                raid_disks: Some(5),
                ..Default::default()
            },
            "far layout",
        ),
        (
            N2,
            DATA_OFFSET,
            ReshapeRequest {
                layout: Some(N3),
                ..Default::default()
            },
            "copies",
        ),
        (
            N2,
            DATA_OFFSET,
            ReshapeRequest {
                layout: Some(far),
                ..Default::default()
            },
            "far layout",
        ),
        (
            N2,
            24,
            ReshapeRequest {
                chunk_sectors: Some(64),
                ..Default::default()
            },
            "sectors between their metadata",
        ),
        // A grow with an internal bitmap (the layout flag 0x80000000 asks for one here).
        (
            N2 | 0x8000_0000,
            DATA_OFFSET,
            ReshapeRequest {
                raid_disks: Some(5),
                ..Default::default()
            },
            "remove the bitmap first",
        ),
    ] {
        let devs = mem_devs(0..5, MEMBER_BYTES, |i| format!("f{i}"));
        let mut opts = r10_options(layout & 0x7fff_ffff, 128, data_offset);
        opts.bitmap = layout & 0x8000_0000 != 0;
        let a = uraid_engine::create(as_members(&devs[..4]), &opts).unwrap();
        a.stop().unwrap();
        drop(a);
        let before: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
        let err = reshape_members(
            members(&devs[..4], None),
            &req,
            ReshapeOptions {
                add: members(&devs[4..], None),
                ..Default::default()
            },
        )
        .map(|r| r.summary)
        .unwrap_err()
        .to_string();
        assert!(err.contains(want), "{want}: {err}");
        for (d, b) in devs.iter().zip(&before) {
            assert!(d.snapshot() == *b, "{want}: {} changed", d.name());
        }
    }
}

/// Issue 15: a raid10 left mid-way (as md leaves one, forwards and backwards) served
/// read-write: seeded writes below, across and above the position, each flushed, and a
/// power cut after every member write or flush in turn (each write since the last flush
/// kept, dropped or torn). After the cut every acknowledged write reads back where the
/// superblocks say, mid-reshape; continued offline, the reshape ends with the same bytes
/// and, once the resync an unclean stop owes has run, every copy equal.
#[test]
fn writes_to_a_raid10_mid_reshape_survive_a_power_cut_anywhere() {
    use rand::Rng;
    use uraid_engine::SyncKind;
    use uraid_sim::disk::{Power, SimDisk, SimWorld};
    let seed: u64 = std::env::var("URAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1015);
    let sh = |layout, disks| Shape {
        layout,
        chunk: 64,
        disks,
    };
    for (n, c) in [
        Case {
            old: sh(N2, 4),
            new: sh(N2, 5),
            new_offset: -128,
            position: 64 * 6,
        },
        Case {
            old: sh(N2, 5),
            new: sh(N2, 4),
            new_offset: 128,
            position: 64 * 20,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let (mems, data) = mid_reshape_on(&c, 1 << 20, 512);
        let images: Vec<Vec<u8>> = mems.iter().map(|d| d.snapshot()).collect();
        // Below, across and above the position, and at the array's two ends.
        let p = c.position;
        let end = data.len() as u64 / SECTOR_BYTES;
        let spans = [
            (p - 40, 24),
            (p - 16, 40),
            (p + 100, 30),
            (0, 8),
            (end - 16, 16),
        ];
        let mut ops = 0i64;
        let mut saw_mid = false;
        loop {
            let what = format!("case {n}: cut after {ops} IOs (URAID_SEED={seed})");
            let mut r = uraid_testkit::engine::rng(seed + (n as u64) * 100_000 + ops as u64);
            let power = Power::new(ops);
            let cut = SimDisk::crash_set(&format!("w{n}-"), &power, &images);
            let cut_devs: Vec<Arc<dyn Member>> =
                cut.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
            let mut model = data.clone();
            let mut unsure: Option<(usize, usize)> = None;
            let mut acked = 0;
            if let Ok((a, _)) = assemble(cut_devs, &AssembleOptions::default()) {
                assert!(!a.is_read_only(), "{what}: {:?}", a.read_only_reason());
                for &(s, len) in &spans {
                    let mut buf = vec![0u8; (len * SECTOR_BYTES) as usize];
                    r.fill(&mut buf[..]);
                    let off = s * SECTOR_BYTES;
                    let (lo, hi) = (off as usize, off as usize + buf.len());
                    let done = a.write(off, &buf).and_then(|_| a.flush());
                    if done.is_ok() && power.on() {
                        model[lo..hi].copy_from_slice(&buf);
                        acked += 1;
                    } else {
                        unsure = Some((lo, hi));
                        break;
                    }
                }
                let _ = a.stop();
            }
            let finished = power.on();
            let after: Vec<Arc<dyn Member>> = cut
                .iter()
                .map(|d| {
                    let img = d.crash(&mut r);
                    Arc::new(SimDisk::from_image(d.name(), img, SimWorld::new())) as _
                })
                .collect();
            let read = |a: &uraid_engine::Array, when: &str| {
                let mut got = vec![0u8; data.len()];
                a.read(0, &mut got)
                    .unwrap_or_else(|e| panic!("{what}: {when}: {e}"));
                if let Some((lo, hi)) = unsure {
                    got[lo..hi].copy_from_slice(&model[lo..hi]);
                }
                if let Some(i) = got.iter().zip(&model).position(|(x, y)| x != y) {
                    panic!(
                        "{what}: {when}: {acked} writes acknowledged, first difference at byte {i} (sector {})",
                        i / 512
                    );
                }
            };
            let (a, _) = assemble(after.clone(), &AssembleOptions::default())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            read(&a, "after the cut");
            let mid = a.is_reshaping();
            saw_mid |= mid;
            a.stop().unwrap();
            drop(a);
            if mid {
                let rep = continue_reshape(after.clone(), ReshapeOptions::default())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(rep.finished, "{what}");
            }
            let (a, _) = assemble(after, &AssembleOptions::default()).unwrap();
            assert!(!a.is_reshaping(), "{what}");
            assert_eq!(a.raid_disks(), c.new.disks, "{what}");
            read(&a, "after the reshape");
            if a.meta().needs_resync() {
                a.run_sync(SyncKind::Resync, |_| {}).unwrap();
            }
            assert_eq!(a.check().unwrap(), 0, "{what}: copies differ");
            a.stop().unwrap();
            if finished {
                assert_eq!(acked, spans.len(), "{what}");
                break;
            }
            ops += 1;
        }
        assert!(saw_mid && ops > 10, "case {n}: {ops} cuts");
    }
}

/// Issue 15: a raid10 reshape run while served (the daemons' reshape thread, windows
/// under the window lock, positions recorded as it goes), a writer flushing after every
/// seeded write until a power cut at seeded points: every acknowledged write reads back
/// after the cut, mid-reshape and after the reshape was served to its end, in the new
/// shape; after the resync an unclean stop owes, every copy is equal. Writes between the
/// recorded and the in-memory position (both geometries) are the ones a cut tests.
#[test]
fn a_power_cut_during_a_served_raid10_reshape_loses_no_acknowledged_write() {
    use rand::Rng;
    use std::time::{Duration, Instant};
    use uraid_engine::{reshape_members, DaemonOptions, ReshapeRequest, SyncKind};
    use uraid_sim::disk::{Power, SimDisk, SimWorld};
    let seed: u64 = std::env::var("URAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2027);
    let world = SimWorld::new();
    let sim: Vec<Arc<SimDisk>> = (0..5)
        .map(|i| Arc::new(SimDisk::new(format!("c10-{i}"), 2 << 20, world.clone())))
        .collect();
    let devs: Vec<Arc<dyn Member>> = sim.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
    let mut o = CreateOptions::new(Level::Raid10);
    o.layout = Some(N2);
    o.chunk_sectors = Some(32);
    o.assume_clean = true;
    o.data_offset_sectors = Some(256);
    let a = uraid_engine::create(devs[..4].iter().cloned().map(Some).collect(), &o).unwrap();
    let data = pattern(a.size_bytes() as usize, seed);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    drop(a);
    let rep = reshape_members(
        devs[..4].to_vec(),
        &ReshapeRequest {
            raid_disks: Some(5),
            ..Default::default()
        },
        ReshapeOptions {
            add: vec![devs[4].clone()],
            stop_at: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!rep.finished && rep.position_sectors == 0, "{rep:?}");
    let images: Vec<Vec<u8>> = sim.iter().map(|d| d.durable_image()).collect();
    let open = |devs: &[Arc<dyn Member>], what: &str| {
        assemble(devs.to_vec(), &AssembleOptions::default())
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .0
    };
    let wait_done = |a: &uraid_engine::Array| {
        let t = Instant::now();
        while a.is_reshaping() {
            if t.elapsed() > Duration::from_secs(60) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    };
    let mut r = uraid_testkit::engine::rng(seed ^ 0x5eed);
    let mut saw_mid = false;
    let mut budget = 8i64;
    let mut round = 0;
    loop {
        round += 1;
        let ops = budget + r.gen_range(0..=budget / 2);
        let what = format!("URAID_SEED={seed}, round {round}, cut after {ops} IOs");
        let power = Power::new(ops);
        let cut = SimDisk::crash_set("c10-", &power, &images);
        let cut_devs: Vec<Arc<dyn Member>> =
            cut.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
        let mut model = data.clone();
        let unsure = {
            let a = Arc::new(open(&cut_devs, &what));
            assert!(a.is_reshaping() && !a.is_read_only(), "{what}");
            let d = a.start_daemons(DaemonOptions::default()).unwrap();
            let unsure = writes_until_cut(&a, &mut model, &mut r, &|| power.on());
            d.stop();
            unsure
        };
        let finished = power.on();
        let after = SimDisk::after_cut(&cut);
        let check = |a: &uraid_engine::Array, when: &str| {
            same_but_unsure(a, &model, unsure, &format!("{what}: {when}"));
        };
        let a = Arc::new(open(&after, &what));
        check(&a, "after the cut");
        if a.is_reshaping() {
            saw_mid = true;
            let d = a.start_daemons(DaemonOptions::default()).unwrap();
            assert!(wait_done(&a), "{what}: not finished");
            d.stop();
            check(&a, "served to the end");
        }
        a.stop().unwrap();
        let a = open(&after, &what);
        assert!(!a.is_reshaping() && a.raid_disks() == 5, "{what}");
        check(&a, "in the new shape");
        if a.meta().needs_resync() {
            a.run_sync(SyncKind::Resync, |_| {}).unwrap();
        }
        assert_eq!(
            a.run_sync(SyncKind::Check, |_| {}).unwrap(),
            0,
            "{what}: check"
        );
        a.stop().unwrap();
        if finished {
            break;
        }
        budget = budget * 3 / 2 + 1;
    }
    assert!(saw_mid, "URAID_SEED={seed}: no cut fell mid-reshape");
}

/// Issue 15, degraded: a raid10 left mid-way with a member missing takes writes below,
/// across and above the position (each written to the copies that have a member, as
/// raid10 does), reads them back, and `uraid grow --continue` finishes the reshape
/// degraded with every byte.
#[test]
fn a_degraded_raid10_mid_reshape_takes_writes_and_finishes() {
    use rand::Rng;
    let seed = 0x1016u64;
    let c = Case {
        old: Shape {
            layout: N2,
            chunk: 64,
            disks: 4,
        },
        new: Shape {
            layout: N2,
            chunk: 64,
            disks: 5,
        },
        new_offset: -128,
        position: 64 * 6,
    };
    for skip in 0..5 {
        let what = format!("seed {seed}, member {skip} missing");
        let (devs, mut model) = mid_reshape_on(&c, 1 << 20, 512);
        let (a, _) = assemble(members(&devs, Some(skip)), &AssembleOptions::default())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(a.is_reshaping() && a.is_degraded(), "{what}");
        let mut r = uraid_testkit::engine::rng(seed + skip as u64);
        let p = c.position;
        for (s, len) in [(p - 40, 24), (p - 16, 40), (p + 100, 30)] {
            let mut buf = vec![0u8; (len * SECTOR_BYTES) as usize];
            r.fill(&mut buf[..]);
            let off = s * SECTOR_BYTES;
            a.write(off, &buf).unwrap_or_else(|e| panic!("{what}: {e}"));
            model[off as usize..off as usize + buf.len()].copy_from_slice(&buf);
        }
        let mut got = vec![0u8; model.len()];
        a.read(0, &mut got).unwrap();
        assert!(got == model, "{what}: mid-reshape");
        a.stop().unwrap();
        drop(a);
        let rep = continue_reshape(members(&devs, Some(skip)), ReshapeOptions::default())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(rep.finished, "{what}");
        let (a, _) = assemble(members(&devs, Some(skip)), &AssembleOptions::default()).unwrap();
        assert!(!a.is_reshaping() && a.raid_disks() == 5, "{what}");
        let mut got = vec![0u8; model.len()];
        a.read(0, &mut got).unwrap();
        if let Some(i) = got.iter().zip(&model).position(|(x, y)| x != y) {
            panic!("{what}: after the reshape, first difference at byte {i}");
        }
        a.stop().unwrap();
    }
}

/// Issue 15: a raid10 mid-reshape with an internal bitmap, as md leaves one (the bitmap at
/// the old array's size while it runs, resized at the end) is served read-write: a write
/// is recorded in the bitmap at its array sector, and `uraid grow --continue` finishes the
/// reshape with the bitmap covering the grown array at its chunk and the bytes written.
/// A bitmap that covers less than the array has while it reshapes keeps it read-only, named.
#[test]
fn a_raid10_mid_reshape_with_a_bitmap_takes_writes_and_ends_with_it_resized() {
    for short in [false, true] {
        let devs = mem_devs(0..5, MEMBER_BYTES, |i| format!("bm{i}"));
        let mut o = r10_options(N2, 128, DATA_OFFSET);
        o.bitmap = true;
        o.bitmap_chunk_bytes = Some(64 << 10);
        let a = uraid_engine::create(as_members(&devs[..4]), &o).unwrap();
        let mut data = pattern(a.size_bytes() as usize, 5);
        a.write(0, &data).unwrap();
        a.stop().unwrap();
        drop(a);
        let roles: Vec<u16> = (0..5).collect();
        let sb0 = read_superblock(devs[0].as_ref()).unwrap();
        assert!(sb0.feature_map & FEATURE_BITMAP_OFFSET != 0);
        for (r, d) in devs.iter().enumerate() {
            // Recorded at position 0: nothing moved yet, every byte in the old geometry.
            let old = read_superblock(devs[r.min(3)].as_ref()).unwrap();
            let mut sb = old.clone();
            if r == 4 {
                sb.dev_number = 4;
                sb.device_uuid = [9; 16];
            }
            sb.dev_roles = roles.clone();
            sb.raid_disks = 5;
            sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
            sb.reshape_position = 0;
            sb.new_level = 10;
            sb.new_layout = N2;
            sb.new_chunk = 128;
            sb.delta_disks = 1;
            sb.new_offset = -256;
            sb.events = sb0.events + 1;
            write_superblock(d.as_ref(), &sb).unwrap();
            // The bitmap as md leaves it: in step with the superblock, at the old size (or,
            // `short`, covering less than the array).
            let mut bm = uraid_engine::BitmapState::load(devs[r.min(3)].as_ref(), &old)
                .unwrap()
                .unwrap();
            if short {
                bm.sb.sync_size /= 2;
            }
            bm.write(d.as_ref(), &sb, sb.events).unwrap();
        }
        if short {
            let before: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
            let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
            assert!(a.is_reshaping() && a.is_read_only());
            let why = a.read_only_reason().unwrap_or_default().to_string();
            assert!(
                why.contains("bitmap covers") && why.contains("grow --continue"),
                "{why}"
            );
            let err = a.write(0, &[1u8; 512]).unwrap_err().to_string();
            assert!(err.contains("bitmap"), "{err}");
            let mut got = vec![0u8; data.len()];
            a.read(0, &mut got).unwrap();
            assert!(got == data);
            a.stop().unwrap();
            for (d, b) in devs.iter().zip(&before) {
                assert!(d.snapshot() == *b, "{} changed", d.name());
            }
            continue;
        }
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        assert!(
            a.is_reshaping() && !a.is_read_only(),
            "{:?}",
            a.read_only_reason()
        );
        let (dirty, chunks) = a.bitmap_dirty_chunks().unwrap();
        assert_eq!(dirty, 0);
        assert_eq!(chunks, a.size_bytes() / (64 << 10), "the old array's size");
        // A write far into the array (array sector 20480, bitmap chunk 160) is recorded.
        let at = 20480 * SECTOR_BYTES as usize;
        let w = pattern(8192, 99);
        a.write(at as u64, &w).unwrap();
        data[at..at + w.len()].copy_from_slice(&w);
        assert_eq!(a.bitmap_dirty_chunks().unwrap().0, 1);
        let sb = read_superblock(devs[1].as_ref()).unwrap();
        let bm = uraid_engine::BitmapState::load(devs[1].as_ref(), &sb)
            .unwrap()
            .unwrap();
        assert!(
            bm.is_dirty(20480, 16),
            "the bit is on the member before the data"
        );
        a.stop().unwrap();
        drop(a);
        let r = continue_reshape(members(&devs, None), ReshapeOptions::default()).unwrap();
        assert!(r.finished);
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        assert!(!a.is_reshaping() && !a.is_read_only());
        let size = a.size_bytes();
        assert!(size > data.len() as u64);
        let (dirty, chunks) = a.bitmap_dirty_chunks().unwrap();
        assert_eq!(
            chunks,
            size / (64 << 10),
            "the bitmap covers the grown array"
        );
        assert_eq!(dirty, 0, "nothing the reshape wrote needs a resync");
        let sb = read_superblock(devs[0].as_ref()).unwrap();
        let bm = uraid_engine::BitmapState::load(devs[0].as_ref(), &sb)
            .unwrap()
            .unwrap();
        assert_eq!((bm.sb.sync_size, bm.sb.chunksize), (size / 512, 64 << 10));
        let mut got = vec![0u8; data.len()];
        a.read(0, &mut got).unwrap();
        assert!(got == data, "the bytes, the one written mid-reshape too");
        assert_eq!(a.check().unwrap(), 0);
        a.stop().unwrap();
    }
}

/// Issue 15, a member failing while a raid10 reshape is served: once a third of the
/// reshape is done member 2 is failed; the reshape goes on without it (its old and new
/// copies skipped), a writer's every write reads back at once and at the end, and the
/// finished array assembles in the new shape, degraded, with every byte.
#[test]
fn a_member_failing_during_a_served_raid10_reshape_leaves_every_byte() {
    use rand::Rng;
    use std::time::{Duration, Instant};
    use uraid_engine::{reshape_members, DaemonOptions, MemberIdx, ReshapeRequest, SyncLimits};
    let seed = 0x1017u64;
    eprintln!("seed {seed}");
    let devs = mem_devs(0..5, 6 << 20, |i| format!("f{i}"));
    let o = r10_options(N2, 64, 4096);
    let a = uraid_engine::create(as_members(&devs[..4]), &o).unwrap();
    let mut model = pattern(a.size_bytes() as usize, seed);
    a.write(0, &model).unwrap();
    a.stop().unwrap();
    drop(a);
    reshape_members(
        members(&devs[..4], None),
        &ReshapeRequest {
            raid_disks: Some(5),
            ..Default::default()
        },
        ReshapeOptions {
            add: members(&devs[4..], None),
            stop_at: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
    let a = Arc::new(a);
    assert!(a.is_reshaping() && !a.is_read_only());
    let d = a
        .start_daemons(DaemonOptions {
            sync_limits: SyncLimits {
                min_kib_s: 0,
                max_kib_s: 4096,
            },
            ..Default::default()
        })
        .unwrap();
    let mut r = uraid_testkit::engine::rng(seed);
    let mut failed = false;
    let mut writes = 0;
    let began = Instant::now();
    while a.is_reshaping() {
        assert!(began.elapsed() < Duration::from_secs(120), "not finished");
        if let Some((done, total)) = a.reshape_progress() {
            if !failed && done * 3 >= total {
                a.fail_member(MemberIdx(2)).unwrap();
                failed = true;
            }
        }
        let sectors = r.gen_range(1..=64u64);
        let off = r.gen_range(0..model.len() as u64 / 512 - sectors) * 512;
        let mut buf = vec![0u8; (sectors * 512) as usize];
        r.fill(&mut buf[..]);
        a.write(off, &buf)
            .unwrap_or_else(|e| panic!("write at {off} (seed {seed}): {e}"));
        let mut back = vec![0u8; buf.len()];
        a.read(off, &mut back).unwrap();
        assert!(back == buf, "read back at {off} (seed {seed})");
        model[off as usize..off as usize + buf.len()].copy_from_slice(&buf);
        writes += 1;
    }
    d.stop();
    assert!(
        failed,
        "the reshape ended before a third of it was done (seed {seed})"
    );
    assert!(writes > 0);
    let mut got = vec![0u8; model.len()];
    a.read(0, &mut got).unwrap();
    assert!(got == model, "the bytes at the end (seed {seed})");
    a.stop().unwrap();
    drop(a);
    let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
    assert!(!a.is_reshaping());
    assert_eq!(a.raid_disks(), 5);
    assert!(a.is_degraded());
    let mut got = vec![0u8; model.len()];
    a.read(0, &mut got).unwrap();
    if let Some(i) = got.iter().zip(&model).position(|(x, y)| x != y) {
        panic!("in the new shape, degraded: first difference at byte {i} (seed {seed})");
    }
    a.stop().unwrap();
}

/// Issue 15: every reshape md leaves mid-way (grows, a chunk change, near <-> offset,
/// shrinks running backwards, each member's own new offset) goes on while served, a
/// writer's every write read back at once, to the new shape in md's format: the same
/// bytes where the writer left them, zeros in a grow's new part, every copy equal.
#[test]
fn every_md_raid10_reshape_left_mid_way_is_finished_while_served() {
    use rand::Rng;
    use std::time::{Duration, Instant};
    use uraid_engine::{DaemonOptions, SyncLimits};
    let seed = 0x1018u64;
    for (n, c) in cases().into_iter().enumerate() {
        let what = format!("{c:?} (seed {seed})");
        let (devs, mut model) = mid_reshape(&c);
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        let a = Arc::new(a);
        assert!(a.is_reshaping() && !a.is_read_only(), "{what}");
        // Slowed (about a second a case) so that the writer meets every stage of it.
        let d = a
            .start_daemons(DaemonOptions {
                sync_limits: SyncLimits {
                    min_kib_s: 0,
                    max_kib_s: 16384,
                },
                ..Default::default()
            })
            .unwrap();
        let mut r = uraid_testkit::engine::rng(seed + n as u64);
        let began = Instant::now();
        let mut writes = 0;
        while a.is_reshaping() {
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "{what}: not finished"
            );
            let sectors = r.gen_range(1..=48u64);
            let off = r.gen_range(0..model.len() as u64 / 512 - sectors) * 512;
            let mut buf = vec![0u8; (sectors * 512) as usize];
            r.fill(&mut buf[..]);
            a.write(off, &buf)
                .unwrap_or_else(|e| panic!("{what}: write at {off}: {e}"));
            let mut back = vec![0u8; buf.len()];
            a.read(off, &mut back).unwrap();
            assert!(back == buf, "{what}: read back at {off}");
            model[off as usize..off as usize + buf.len()].copy_from_slice(&buf);
            writes += 1;
        }
        d.stop();
        assert!(writes > 10, "{what}: {writes} writes while it ran");
        a.stop().unwrap();
        drop(a);
        let (a, _) = assemble(members(&devs, None), &AssembleOptions::default()).unwrap();
        assert!(!a.is_reshaping(), "{what}");
        let sb = read_superblock(devs[0].as_ref()).unwrap();
        assert_eq!(
            (sb.raid_disks as usize, sb.layout, u64::from(sb.chunksize)),
            (c.new.disks, c.new.layout, c.new.chunk),
            "{what}"
        );
        assert_eq!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0, "{what}");
        let mut got = vec![0u8; a.size_bytes() as usize];
        a.read(0, &mut got).unwrap();
        let keep = model.len().min(got.len());
        if let Some(i) = got[..keep].iter().zip(&model).position(|(x, y)| x != y) {
            panic!("{what}: first difference at byte {i}");
        }
        assert!(
            got[keep..].iter().all(|&b| b == 0),
            "{what}: the grown part"
        );
        assert_eq!(a.check().unwrap(), 0, "{what}: every copy equal");
        a.stop().unwrap();
    }
}
