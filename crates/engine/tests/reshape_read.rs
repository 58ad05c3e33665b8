//! Issue 12: an array in the middle of a raid4/5/6 reshape is readable. Members are left as
//! md leaves them mid-reshape: the reshaped part rewritten in the new geometry at
//! `data_offset + new_offset`, the rest untouched in the old geometry, every superblock
//! recording the reshape (FEATURE_RESHAPE_ACTIVE, reshape_position, new_*, delta_disks,
//! FEATURE_NEW_OFFSET, RESHAPE_BACKWARDS). uraid must read back exactly the bytes written
//! before the reshape began, healthy and with a member missing, serve it read-only saying
//! why, and write nothing to any member.

use std::sync::Arc;
use uraid_core::geometry::{ArrayGeometry, ParityGeometry};
use uraid_core::superblock::*;
use uraid_core::{Level, SECTOR_BYTES};
use uraid_engine::{
    assemble, read_superblock, write_superblock, ArrayError, AssembleOptions, CreateOptions,
    MemMember, Member,
};
use uraid_testkit::engine::as_members;

const DATA_OFFSET: u64 = 256;
const MEMBER_BYTES: u64 = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Shape {
    layout: u32,
    chunk: u64,
    disks: usize,
}

struct Case {
    level: Level,
    old: Shape,
    new: Shape,
    new_offset: i32,
    backwards: bool,
    /// reshape_position in units of md's boundary (max chunk x new data disks).
    rows: u64,
}

fn geometry(level: Level, s: Shape, dev_sectors: u64) -> ParityGeometry {
    ParityGeometry::new(&ArrayGeometry {
        level,
        layout: s.layout,
        chunk_sectors: s.chunk,
        raid_disks: s.disks,
        dev_sectors,
        member_sectors: Vec::new(),
    })
    .unwrap()
}

/// Members mid-reshape, the data written before it, and the reshape position.
fn mid_reshape(c: &Case) -> (Vec<Arc<MemMember>>, Vec<u8>, u64) {
    let devs: Vec<Arc<MemMember>> = (0..c.old.disks.max(c.new.disks))
        .map(|i| Arc::new(MemMember::new(format!("m{i}"), MEMBER_BYTES)))
        .collect();
    let mut opts = CreateOptions::new(c.level);
    opts.layout = Some(c.old.layout);
    opts.chunk_sectors = Some(c.old.chunk);
    opts.assume_clean = true;
    opts.data_offset_sectors = Some(DATA_OFFSET);
    // Room after the data area for a reshape that moves it forwards.
    opts.size_sectors = Some(MEMBER_BYTES / SECTOR_BYTES - DATA_OFFSET - 256);
    let a = uraid_engine::create(as_members(&devs[..c.old.disks]), &opts).unwrap();
    let data: Vec<u8> = (0..a.size_bytes() as usize)
        .map(|i| {
            (i as u64)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(17) as u8
        })
        .collect();
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    drop(a);

    let sb0 = read_superblock(devs[0].as_ref()).unwrap();
    let dev_sectors = sb0.size;
    let (old, new) = (
        geometry(c.level, c.old, dev_sectors),
        geometry(c.level, c.new, dev_sectors),
    );
    let boundary = c.old.chunk.max(c.new.chunk) * new.data_disks() as u64;
    let max_chunk = c.old.chunk.max(c.new.chunk);
    let rounded = dev_sectors / max_chunk * max_chunk;
    let size = rounded * old.data_disks().min(new.data_disks()) as u64;
    let position = c.rows * boundary;
    assert!(
        position <= size,
        "position {position} past the array ({size})"
    );
    // The reshaped part, in the new geometry at the new offset: whole new stripes.
    let new_base = (DATA_OFFSET as i64 + i64::from(c.new_offset)) as u64;
    let nsd = new.stripe_data_sectors();
    let stripes: Vec<u64> = if c.backwards {
        (position / nsd..size / nsd).collect()
    } else {
        (0..position / nsd).collect()
    };
    let cb = (c.new.chunk * SECTOR_BYTES) as usize;
    for stripe in stripes {
        let map = new.stripe_map(stripe);
        let chunks: Vec<Vec<u8>> = (0..new.data_disks())
            .map(|k| {
                let at = (new.array_sector(stripe, k) * SECTOR_BYTES) as usize;
                data.get(at..at + cb)
                    .map(|d| d.to_vec())
                    .unwrap_or_else(|| vec![0; cb])
            })
            .collect();
        let mut p = vec![0u8; cb];
        let srcs: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
        uraid_parity::xor_gen(&mut p, &srcs);
        let at = |m: uraid_core::MemberIdx| {
            (
                m.0,
                (new_base + new.member_sector(stripe, 0)) * SECTOR_BYTES,
            )
        };
        for (k, chunk) in chunks.iter().enumerate() {
            let (m, off) = at(map.data[k]);
            devs[m].write_at(chunk, off).unwrap();
        }
        let (m, off) = at(map.p);
        devs[m].write_at(&p, off).unwrap();
        if let Some(q) = map.q {
            let mut p2 = vec![0u8; cb];
            let mut qb = vec![0u8; cb];
            let ordered: Vec<&[u8]> = map.syndrome_order.iter().map(|&k| &chunks[k][..]).collect();
            uraid_parity::gen_pq(&ordered, &mut p2, &mut qb);
            let (m, off) = at(q);
            devs[m].write_at(&qb, off).unwrap();
        }
    }
    // Every superblock records the reshape; a grown-into member gets its role.
    let mut roles = sb0.dev_roles.clone();
    while roles.len() < c.new.disks {
        roles.push(ROLE_SPARE);
    }
    for (r, role) in roles.iter_mut().enumerate().take(c.new.disks) {
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
        if c.backwards && c.new.disks == c.old.disks {
            sb.feature_map |= FEATURE_RESHAPE_BACKWARDS;
        }
        sb.reshape_position = position;
        sb.new_level = c.level.md_level();
        sb.new_layout = c.new.layout;
        sb.new_chunk = c.new.chunk as u32;
        sb.delta_disks = c.new.disks as i32 - c.old.disks as i32;
        sb.new_offset = c.new_offset;
        sb.events += 1;
        write_superblock(d.as_ref(), &sb).unwrap();
    }
    (
        devs,
        data[..(size * SECTOR_BYTES) as usize].to_vec(),
        position,
    )
}

fn members(devs: &[Arc<MemMember>], skip: Option<usize>) -> Vec<Arc<dyn Member>> {
    devs.iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != skip)
        .map(|(_, d)| d.clone() as Arc<dyn Member>)
        .collect()
}

/// Reads every byte, in one request and in pieces that straddle the position and chunk
/// edges, healthy and with each member missing in turn (assembled --readonly, so no
/// member byte changes and a write is refused); then writes pieces across the position
/// and chunk edges, healthy and then with a member missing, and reads every byte back.
fn reads_back(c: Case) {
    let (devs, data, position) = mid_reshape(&c);
    let before: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
    let ro = AssembleOptions {
        readonly: true,
        ..Default::default()
    };
    for skip in std::iter::once(None).chain((0..devs.len()).map(Some)) {
        let (a, _) = assemble(members(&devs, skip), &ro)
            .unwrap_or_else(|e| panic!("assemble without {skip:?}: {e}"));
        assert_eq!(a.size_bytes(), data.len() as u64, "md's size mid-reshape");
        assert!(a.is_reshaping());
        let mut got = vec![0u8; data.len()];
        a.read(0, &mut got).unwrap();
        let first_bad = got.iter().zip(&data).position(|(x, y)| x != y);
        assert_eq!(first_bad, None, "without {skip:?}, position {position}");
        // Pieces of 3 KiB + 512 from just below the position, and odd offsets.
        let p = position * SECTOR_BYTES;
        for start in [
            p.saturating_sub(3 * 512),
            p.saturating_sub(1),
            7,
            data.len() as u64 - 700,
        ] {
            let len = (3584u64).min(data.len() as u64 - start);
            let mut piece = vec![0u8; len as usize];
            a.read(start, &mut piece).unwrap();
            assert!(
                piece[..] == data[start as usize..(start + len) as usize],
                "piece at {start} without {skip:?}"
            );
        }
        match a.write(0, &data[..4096]) {
            Err(e @ ArrayError::ReadOnly(_)) => assert_eq!(e.errno(), libc::EROFS),
            other => panic!("a write to a --readonly array must be refused, got {other:?}"),
        }
        a.stop().unwrap();
    }
    for (d, old) in devs.iter().zip(&before) {
        assert!(d.snapshot() == *old, "{} was written", d.name());
    }
    // Written mid-reshape (each piece in the geometry that holds it), healthy, then with
    // the last member missing; every byte reads back, and again after a restart.
    let mut want = data.clone();
    let p = position * SECTOR_BYTES;
    let len = data.len() as u64;
    let mut seed = 0u8;
    for skip in [None, Some(devs.len() - 1)] {
        let (a, _) = assemble(members(&devs, skip), &AssembleOptions::default())
            .unwrap_or_else(|e| panic!("assemble without {skip:?}: {e}"));
        assert!(a.is_reshaping() && !a.is_read_only());
        for start in [
            p.saturating_sub(3 * 512),
            p.saturating_sub(1),
            7,
            len - 700,
            0,
        ] {
            let n = 5000u64.min(len - start) as usize;
            seed = seed.wrapping_add(37);
            let piece: Vec<u8> = (0..n)
                .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
                .collect();
            a.write(start, &piece).unwrap();
            want[start as usize..start as usize + n].copy_from_slice(&piece);
        }
        let mut got = vec![0u8; data.len()];
        a.read(0, &mut got).unwrap();
        let first_bad = got.iter().zip(&want).position(|(x, y)| x != y);
        assert_eq!(
            first_bad, None,
            "written without {skip:?}, position {position}"
        );
        a.stop().unwrap();
        let (a, _) = assemble(members(&devs, skip), &ro).unwrap();
        let mut got = vec![0u8; data.len()];
        a.read(0, &mut got).unwrap();
        let first_bad = got.iter().zip(&want).position(|(x, y)| x != y);
        assert_eq!(first_bad, None, "after a restart, without {skip:?}");
        a.stop().unwrap();
    }
}

fn ls(chunk: u64, disks: usize) -> Shape {
    Shape {
        layout: 2,
        chunk,
        disks,
    }
}

/// mdadm's default grow: one more disk, the data offset moved down, going forwards.
#[test]
fn a_raid5_growing_from_three_to_four_disks_reads_as_before() {
    for rows in [0, 1, 5, 12] {
        reads_back(Case {
            level: Level::Raid5,
            old: ls(16, 3),
            new: ls(16, 4),
            new_offset: -128,
            backwards: false,
            rows,
        });
    }
}

#[test]
fn a_raid5_chunk_change_reads_as_before() {
    reads_back(Case {
        level: Level::Raid5,
        old: ls(16, 4),
        new: ls(32, 4),
        new_offset: -128,
        backwards: false,
        rows: 7,
    });
}

/// A layout change with the data moving forwards runs backwards (md's
/// RESHAPE_BACKWARDS): below the position is still old.
#[test]
fn a_backwards_layout_change_reads_as_before() {
    reads_back(Case {
        level: Level::Raid5,
        old: ls(16, 4),
        new: Shape {
            layout: 0,
            chunk: 16,
            disks: 4,
        },
        new_offset: 128,
        backwards: true,
        rows: 9,
    });
}

#[test]
fn a_raid6_and_a_raid4_growing_read_as_before() {
    reads_back(Case {
        level: Level::Raid6,
        old: ls(16, 4),
        new: ls(16, 5),
        new_offset: -128,
        backwards: false,
        rows: 4,
    });
    reads_back(Case {
        level: Level::Raid4,
        old: Shape {
            layout: 5,
            chunk: 16,
            disks: 3,
        },
        new: Shape {
            layout: 5,
            chunk: 16,
            disks: 4,
        },
        new_offset: -128,
        backwards: false,
        rows: 3,
    });
}

/// A shrink (4 -> 3 disks, backwards, the data offset moving up): the leaving role's member
/// still holds old stripes, and reads go through both geometries as for a grow.
#[test]
fn a_shrink_mid_reshape_reads_as_before() {
    reads_back(Case {
        level: Level::Raid5,
        old: ls(16, 4),
        new: ls(16, 3),
        new_offset: 128,
        backwards: true,
        rows: 2,
    });
}

/// A raid6 mid-reshape with two members missing: every chunk of the lost pair is rebuilt
/// from P and Q in its own geometry (md's two-failure recovery), each pair in turn.
#[test]
fn a_raid6_growing_reads_as_before_with_any_two_members_missing() {
    let c = Case {
        level: Level::Raid6,
        old: ls(16, 4),
        new: ls(16, 5),
        new_offset: -128,
        backwards: false,
        rows: 3,
    };
    let (devs, data, position) = mid_reshape(&c);
    for x in 0..devs.len() {
        for y in x + 1..devs.len() {
            let two: Vec<Arc<dyn Member>> = devs
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != x && *i != y)
                .map(|(_, d)| d.clone() as Arc<dyn Member>)
                .collect();
            let (a, _) = assemble(two, &AssembleOptions::default())
                .unwrap_or_else(|e| panic!("without {x} and {y}: {e}"));
            let mut got = vec![0u8; data.len()];
            a.read(0, &mut got).unwrap();
            let first_bad = got.iter().zip(&data).position(|(p, q)| p != q);
            assert_eq!(first_bad, None, "without {x} and {y}, position {position}");
            a.stop().unwrap();
        }
    }
}
