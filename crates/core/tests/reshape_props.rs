//! A raid4/5/6 reshape in progress (`uraid_core::geometry::ReshapeState`): the state as the
//! superblock records it, and which geometry and data offset hold each array sector, against
//! a naive model of md's rule (raid5.c's `ahead_of_reshape` and `use_new_offset`).

use proptest::prelude::*;
use uraid_core::geometry::{ArrayGeometry, ParityGeometry, ReshapeState, Side};
use uraid_core::superblock::*;
use uraid_core::Level;

fn sb(level: i32, layout: u32, chunk: u32, raid_disks: u32, size: u64) -> Superblock {
    let spec = CreateSpec {
        set_uuid: [0x42; 16],
        set_name: "host:grow".into(),
        ctime_secs: 1_700_000_000,
        level,
        layout,
        chunk_sectors: chunk,
        raid_disks,
        spares: 0,
        missing: vec![],
        size_sectors: size,
        data_offset_sectors: 4096,
        internal_bitmap: None,
        bad_block_log: true,
        clean: true,
        version: MetadataVersion::V1_2,
    };
    Superblock::new_for_create(&spec, 0, [9; 16], size + 8192).unwrap()
}

/// A superblock mid-reshape, through the codec as assembly reads it.
#[allow(clippy::too_many_arguments)]
fn mid_reshape(
    level: i32,
    old: (u32, u32, u32),
    new: (u32, u32, u32),
    size: u64,
    position: u64,
    backwards: bool,
    new_offset: Option<i32>,
) -> Superblock {
    let (old_layout, old_chunk, old_disks) = old;
    let (new_layout, new_chunk, new_disks) = new;
    let mut s = sb(level, old_layout, old_chunk, new_disks, size);
    s.feature_map |= FEATURE_RESHAPE_ACTIVE;
    // As md writes it (super_1_sync): the bit only where the device count stays; a shrink
    // is backwards by its negative delta_disks, a grow forwards.
    if backwards && old_disks == new_disks {
        s.feature_map |= FEATURE_RESHAPE_BACKWARDS;
    }
    if let Some(o) = new_offset {
        s.feature_map |= FEATURE_NEW_OFFSET;
        s.new_offset = o;
    }
    s.reshape_position = position;
    s.new_level = level;
    s.new_layout = new_layout;
    s.new_chunk = new_chunk;
    s.delta_disks = new_disks as i32 - old_disks as i32;
    Superblock::decode(&s.encode()).unwrap()
}

fn parity(level: Level, layout: u32, chunk: u64, disks: usize, size: u64) -> ParityGeometry {
    ParityGeometry::new(&ArrayGeometry {
        level,
        layout,
        chunk_sectors: chunk,
        raid_disks: disks,
        dev_sectors: size,
        member_sectors: Vec::new(),
    })
    .unwrap()
}

/// The old and new geometry come from md's fields: level/layout/chunksize with
/// raid_disks - delta_disks, and new_level/new_layout/new_chunk with raid_disks.
#[test]
fn a_grow_from_three_to_four_disks_reads_its_geometries_from_md_fields() {
    let s = mid_reshape(
        5,
        (2, 128, 3),
        (2, 128, 4),
        65_536,
        3 * 128 * 6,
        false,
        Some(-2048),
    );
    let r = ReshapeState::from_superblock(&s).unwrap().unwrap();
    assert_eq!((r.old.raid_disks, r.new.raid_disks), (3, 4));
    assert_eq!((r.old.chunk_sectors, r.new.chunk_sectors), (128, 128));
    assert_eq!(r.position_sectors, 2304);
    assert!(!r.backwards);
    assert_eq!(r.new_offset_sectors, -2048);
    assert_eq!(r.data_offset_sectors(Side::Old, 4096), 4096);
    assert_eq!(r.data_offset_sectors(Side::New, 4096), 2048);
    // md sizes the array by the smaller shape until the reshape is done.
    assert_eq!(r.array_sectors(), 65_536 * 2);
    assert_eq!(r.new_array_sectors(), 65_536 * 3);
    // Without FEATURE_NEW_OFFSET the field means nothing.
    let mut s2 = s.clone();
    s2.feature_map &= !FEATURE_NEW_OFFSET;
    let r2 = ReshapeState::from_superblock(&s2).unwrap().unwrap();
    assert_eq!(r2.data_offset_sectors(Side::New, 4096), 4096);
    // No reshape: no state.
    assert!(ReshapeState::from_superblock(&sb(5, 2, 128, 3, 65_536))
        .unwrap()
        .is_none());
}

/// A chunk change sizes by the larger chunk: md rounds the component size down to both.
#[test]
fn a_chunk_change_rounds_the_size_to_both_chunks() {
    let s = mid_reshape(5, (2, 64, 4), (2, 256, 4), 1000, 0, false, Some(-1024));
    let r = ReshapeState::from_superblock(&s).unwrap().unwrap();
    assert_eq!(r.reshape_sectors(), 256);
    assert_eq!(r.array_sectors(), 768 * 3);
}

/// What md would not start from is refused, saying what it is.
#[test]
fn states_md_refuses_are_refused_by_name() {
    let msg = |s: Superblock| ReshapeState::from_superblock(&s).unwrap_err().to_string();
    // md's raid5_run: the position must be on a stripe boundary of the new geometry.
    let m = msg(mid_reshape(
        5,
        (2, 128, 3),
        (2, 128, 4),
        65_536,
        128,
        false,
        None,
    ));
    assert!(m.contains("not on a stripe boundary"), "{m}");
    let m = msg(mid_reshape(
        5,
        (2, 128, 3),
        (2, 128, 4),
        65_536,
        384 * 1000,
        false,
        None,
    ));
    assert!(m.contains("past the end of the array"), "{m}");
    let mut s = mid_reshape(5, (2, 128, 3), (2, 128, 4), 65_536, 0, false, None);
    s.new_level = 6;
    let m = msg(Superblock::decode(&s.encode()).unwrap());
    assert!(m.contains("changes the level from 5 to 6"), "{m}");
    let mut s = sb(10, 0x102, 128, 4, 65_536);
    s.feature_map |= FEATURE_RESHAPE_ACTIVE;
    s.new_level = 10;
    let m = msg(s);
    assert!(m.contains("raid10") && m.contains("only raid4/5/6"), "{m}");
    let m = msg(mid_reshape(
        5,
        (2, 128, 3),
        (2, 128, 4),
        65_536,
        0,
        false,
        Some(-5000),
    ));
    assert!(m.contains("before the device start"), "{m}");
    let m = msg(mid_reshape(
        5,
        (2, 128, 3),
        (7, 128, 4),
        65_536,
        0,
        false,
        None,
    ));
    assert!(m.contains("unsupported layout"), "{m}");
}

fn layouts(level: Level) -> Vec<u32> {
    match level {
        Level::Raid4 => vec![5],
        Level::Raid5 => vec![0, 1, 2, 3, 4, 5],
        _ => vec![0, 1, 2, 3, 4, 5, 16, 17, 18, 19, 20],
    }
}

#[derive(Debug, Clone)]
struct Case {
    level: Level,
    old: (u32, u32, u32),
    new: (u32, u32, u32),
    size: u64,
    rows: u64,
    backwards: bool,
    new_offset: Option<i32>,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop_oneof![Just(Level::Raid4), Just(Level::Raid5), Just(Level::Raid6)],
        0usize..16,
        0usize..16,
        0u32..3,
        0u32..3,
        0u32..4,
        0u32..4,
        1u64..40,
        0u64..1000,
        any::<bool>(),
        // Without FEATURE_NEW_OFFSET a reshape is mdadm's backup-file case, refused (see
        // in_place_reshapes_need_mdadm_s_backup_file).
        (-2048i32..2048).prop_map(Some),
    )
        .prop_map(|(level, l1, l2, c1, c2, d1, d2, chunks, rows, back, off)| {
            let ls = layouts(level);
            let min = if level == Level::Raid6 { 4 } else { 2 };
            Case {
                level,
                old: (ls[l1 % ls.len()], 8 << c1, min + d1),
                new: (ls[l2 % ls.len()], 8 << c2, min + d2),
                size: chunks * 64 + 5,
                rows,
                // md's direction: a shrink backwards, a grow forwards, otherwise either.
                backwards: match d2.cmp(&d1) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Greater => false,
                    std::cmp::Ordering::Equal => back,
                },
                new_offset: off,
            }
        })
}

fn state(c: &Case) -> ReshapeState {
    let boundary = u64::from(c.old.1.max(c.new.1)) * u64::from(c.new.2 - c.level_parity());
    let probe = mid_reshape(
        c.level.md_level(),
        c.old,
        c.new,
        c.size,
        0,
        c.backwards,
        c.new_offset,
    );
    let end = ReshapeState::from_superblock(&probe)
        .unwrap()
        .unwrap()
        .array_sectors()
        .max(
            ReshapeState::from_superblock(&probe)
                .unwrap()
                .unwrap()
                .new_array_sectors(),
        );
    let position = (c.rows * boundary).min(end / boundary * boundary);
    ReshapeState::from_superblock(&mid_reshape(
        c.level.md_level(),
        c.old,
        c.new,
        c.size,
        position,
        c.backwards,
        c.new_offset,
    ))
    .unwrap()
    .unwrap()
}

impl Case {
    fn level_parity(&self) -> u32 {
        if self.level == Level::Raid6 {
            2
        } else {
            1
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Every array sector is in exactly the geometry md's rule says, at that geometry's
    /// place and data offset; a request cut at the position gives runs of one side each
    /// that cover it exactly.
    #[test]
    fn each_sector_maps_through_the_geometry_md_would_use(c in cases()) {
        let r = state(&c);
        let old = parity(c.level, c.old.0, u64::from(c.old.1), c.old.2 as usize, c.size);
        let new = parity(c.level, c.new.0, u64::from(c.new.1), c.new.2 as usize, c.size);
        let p = r.position_sectors;
        let data_offset = 4096;
        let new_off = match c.new_offset { Some(o) => (4096 + i64::from(o)) as u64, None => 4096 };
        let size = r.array_sectors();
        // md's ahead_of_reshape: forwards, at or past the position is old.
        let model_side = |s: u64| match (c.backwards, s < p) {
            (false, true) | (true, false) => Side::New,
            _ => Side::Old,
        };
        let step = (size / 512).max(1);
        let mut s = 0;
        while s < size {
            for t in [s, s.saturating_sub(1), (p + s % 7).min(size - 1), p.saturating_sub(1 + s % 5)] {
                let (g, off) = match model_side(t) {
                    Side::Old => (&old, data_offset),
                    Side::New => (&new, new_off),
                };
                let loc = g.locate(t);
                let want = (
                    model_side(t),
                    g.stripe_map(loc.stripe).data[loc.data_index],
                    off + g.member_sector(loc.stripe, loc.offset_sectors),
                );
                prop_assert_eq!(r.locate(t, data_offset), want, "sector {} position {}", t, p);
            }
            s += step;
        }
        // Splitting: runs in order, contiguous, each of one side.
        for (start, len) in [(0, size), (p.saturating_sub(3), 6), (p, 1), (p.saturating_sub(1), 1)] {
            let len = len.min(size - start.min(size));
            let runs = r.split(start, len);
            let mut at = start;
            for &(a, n, side) in &runs {
                prop_assert_eq!(a, at);
                prop_assert!(n > 0);
                prop_assert_eq!(side, model_side(a));
                prop_assert_eq!(side, model_side(a + n - 1));
                at += n;
            }
            prop_assert_eq!(at, start + len);
            prop_assert!(runs.len() <= 2);
        }
        // md's size while reshaping: the smaller shape over both chunk sizes.
        let chunk = u64::from(c.old.1.max(c.new.1));
        let dd = old.data_disks().min(new.data_disks()) as u64;
        prop_assert_eq!(size, c.size / chunk * chunk * dd);
    }
}

/// A reshape whose data offset does not move (no FEATURE_NEW_OFFSET) keeps data in mdadm's
/// backup file: refused, naming it, except a grow past its critical section (md's
/// "reshape_position too early for auto-recovery" rule), which the members alone describe.
#[test]
fn in_place_reshapes_need_mdadm_s_backup_file() {
    let refused = |old: (u32, u32, u32), new: (u32, u32, u32), pos: u64, back: bool| {
        let sb = mid_reshape(5, old, new, 64 * 128, pos, back, None);
        ReshapeState::from_superblock(&sb)
            .err()
            .map(|e| e.to_string())
    };
    let e = refused((2, 64, 4), (2, 64, 3), 128 * 2 * 8, true).expect("a shrink");
    assert!(
        e.contains("a shrink in place") && e.contains("--backup-file"),
        "{e}"
    );
    let e = refused((2, 64, 4), (2, 32, 4), 128 * 3 * 4, false).expect("a chunk change");
    assert!(e.contains("same-size"), "{e}");
    let e = refused((2, 64, 3), (2, 64, 4), 0, false).expect("a grow at its start");
    assert!(e.contains("critical section"), "{e}");
    assert_eq!(
        refused((2, 64, 3), (2, 64, 4), 64 * 3 * 40, false),
        None,
        "a grow past it"
    );
}
