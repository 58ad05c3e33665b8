//! Property tests for md's data layouts: every level and layout, random disk counts, chunk
//! sizes (4 KiB .. 4 MiB) and member sizes.
//!
//! Checked at chunk granularity over the whole array (every chunk start maps to a
//! chunk-aligned member sector, with `contiguous_sectors` to the chunk end), plus sample
//! sectors inside chunks; together these make the per-sector map injective.

use proptest::prelude::*;
use std::collections::HashSet;
use uraid_core::geometry::raid0::Raid0;
use uraid_core::geometry::raid10::Raid10;
use uraid_core::geometry::{ArrayGeometry, ParityGeometry};
use uraid_core::{Level, MemberIdx};

fn chunk_sectors() -> impl Strategy<Value = u64> {
    (3u32..=13).prop_map(|s| 1u64 << s) // 8 .. 8192 sectors
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("GEOMETRY_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(192),
        // Failures print their minimal input; no regression files next to the tests.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn raid0_case() -> impl Strategy<Value = (u64, u32, Vec<u64>, u64)> {
    (chunk_sectors(), 1u32..=2, 1usize..=8).prop_flat_map(|(chunk, layout, disks)| {
        (
            Just(chunk),
            Just(layout),
            prop::collection::vec(
                (1u64..=24, 0..chunk).prop_map(move |(c, r)| c * chunk + r),
                disks,
            ),
            any::<u64>(),
        )
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn raid0_map_is_a_bijection_onto_the_rounded_members((chunk, layout, sizes, seed) in raid0_case()) {
        let r = Raid0::new(&ArrayGeometry {
            level: Level::Raid0,
            layout,
            chunk_sectors: chunk,
            raid_disks: sizes.len(),
            dev_sectors: 0,
            member_sectors: sizes.clone(),
        }).unwrap();
        let rounded: Vec<u64> = sizes.iter().map(|s| s / chunk * chunk).collect();
        prop_assert_eq!(r.array_sectors(), rounded.iter().sum::<u64>());
        let mut seen = HashSet::new();
        let mut per_member = vec![0u64; sizes.len()];
        for c in 0..r.array_sectors() / chunk {
            let m = r.map(c * chunk);
            prop_assert_eq!(m.member_sector % chunk, 0);
            prop_assert_eq!(m.contiguous_sectors, chunk);
            prop_assert!(m.member_sector + chunk <= rounded[m.member.0]);
            prop_assert!(seen.insert((m.member, m.member_sector)), "chunk {} collides", c);
            per_member[m.member.0] += chunk;
        }
        // Every rounded member sector is used exactly once.
        prop_assert_eq!(per_member, rounded);
        // Inside a chunk the map is the chunk start plus the offset.
        let total = r.array_sectors();
        for k in 0..16u64 {
            let s = (seed.wrapping_mul(k * 2 + 1) >> 7) % total;
            let m = r.map(s);
            let start = r.map(s - s % chunk);
            prop_assert_eq!(m.member, start.member);
            prop_assert_eq!(m.member_sector, start.member_sector + s % chunk);
            prop_assert_eq!(m.contiguous_sectors, chunk - s % chunk);
            let last = r.map(s + m.contiguous_sectors - 1);
            prop_assert_eq!((last.member, last.member_sector), (m.member, m.member_sector + m.contiguous_sectors - 1));
        }
    }
}

/// (layout word, disks, chunk, dev_sectors)
fn raid10_case() -> impl Strategy<Value = (u32, usize, u64, u64)> {
    (
        1u32..=4,
        1u32..=4,
        any::<bool>(),
        0u32..=2,
        2usize..=12,
        chunk_sectors(),
        1u64..=48,
        any::<u64>(),
    )
        .prop_filter("2 <= copies <= disks", |(n, f, _, _, d, ..)| {
            let c = (n * f) as usize;
            c >= 2 && c <= *d
        })
        .prop_map(|(n, f, offset, variant, disks, chunk, dev_chunks, rest)| {
            let offset = offset && f > 1;
            let layout = n | f << 8 | if offset { 1 << 16 } else { 0 } | variant << 17;
            (layout, disks, chunk, dev_chunks * chunk + rest % chunk)
        })
}

fn raid10(layout: u32, disks: usize, chunk: u64, dev_sectors: u64) -> Raid10 {
    Raid10::new(&ArrayGeometry {
        level: Level::Raid10,
        layout,
        chunk_sectors: chunk,
        raid_disks: disks,
        dev_sectors,
        member_sectors: Vec::new(),
    })
    .unwrap()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn raid10_copies_are_distinct_and_in_range((layout, disks, chunk, dev_sectors) in raid10_case(), seed in any::<u64>()) {
        let r = raid10(layout, disks, chunk, dev_sectors);
        prop_assert!(r.used_dev_sectors <= dev_sectors);
        // md's own map collides for some layouts mdadm never creates (see layout_is_sound);
        // the rest of the checks hold for every layout.
        let sound = r.layout_is_sound();
        let mut seen = HashSet::new();
        for c in 0..r.array_sectors() / chunk {
            let m = r.map(c * chunk);
            prop_assert_eq!(m.copies.len(), r.copies());
            prop_assert_eq!(m.contiguous_sectors, chunk);
            let devices: HashSet<MemberIdx> = m.copies.iter().map(|(d, _)| *d).collect();
            prop_assert!(!sound || devices.len() == r.copies(), "chunk {} copies share a device: {:?}", c, m.copies);
            for &(d, s) in &m.copies {
                prop_assert!(d.0 < disks);
                prop_assert_eq!(s % chunk, 0);
                prop_assert!(s + chunk <= r.used_dev_sectors, "chunk {} copy {:?} beyond {}", c, (d, s), r.used_dev_sectors);
                prop_assert!(seen.insert((d, s)) || !sound, "chunk {} copy {:?} collides", c, (d, s));
            }
        }
        let total = r.array_sectors();
        if total > 0 {
            for k in 0..16u64 {
                let s = (seed.wrapping_mul(k * 2 + 1) >> 7) % total;
                let m = r.map(s);
                let start = r.map(s - s % chunk);
                prop_assert_eq!(m.contiguous_sectors, chunk - s % chunk);
                for (a, b) in m.copies.iter().zip(&start.copies) {
                    prop_assert_eq!(*a, (b.0, b.1 + s % chunk));
                }
            }
        }
    }

    #[test]
    fn raid10_survives_matches_brute_force((layout, disks, chunk, dev_sectors) in raid10_case(), missing_bits in any::<u16>()) {
        let r = raid10(layout, disks, chunk, dev_sectors);
        let chunks = r.array_sectors() / chunk;
        let lost = |bits: u32| -> Vec<MemberIdx> {
            (0..disks).filter(|d| bits & (1 << d) != 0).map(MemberIdx).collect()
        };
        // Naive model: every chunk of the array keeps a copy.
        let naive = |missing: &[MemberIdx]| {
            (0..chunks).all(|c| r.map(c * chunk).copies.iter().any(|(d, _)| !missing.contains(d)))
        };
        let missing = lost(missing_bits as u32);
        prop_assert_eq!(r.survives(&missing), naive(&missing));
        if layout >> 17 == 0 && chunks >= disks as u64 {
            // md's enough() is exact for far-set variant 0.
            prop_assert_eq!(r.md_enough(&missing), r.survives(&missing));
        }
        if disks <= 10 && chunks > 0 {
            let best = (0u32..1 << disks)
                .filter(|&b| naive(&lost(b)))
                .map(|b| b.count_ones() as usize)
                .max()
                .unwrap();
            prop_assert_eq!(r.max_degraded(), best);
        }
    }

    #[test]
    fn raid10_array_size_is_md_raid10_size_of_the_component_size((layout, disks, chunk, dev_sectors) in raid10_case()) {
        // md applies raid10_size to the used size (conf->dev_sectors); that must give the
        // same as applying it to the component size.
        let r = raid10(layout, disks, chunk, dev_sectors);
        let chunks = (dev_sectors / chunk) / r.far_copies as u64 * disks as u64 / r.near_copies as u64;
        prop_assert_eq!(r.array_sectors(), chunks * chunk);
    }
}

fn parity_case() -> impl Strategy<Value = (Level, u32, usize, u64, u64)> {
    let layouts = prop_oneof![
        (Just(Level::Raid4), 0u32..=5, 2usize..=16),
        (Just(Level::Raid5), 0u32..=5, 2usize..=16),
        (Just(Level::Raid6), 0u32..=5, 4usize..=16),
        (Just(Level::Raid6), 16u32..=20, 4usize..=16),
        (Just(Level::Raid6), 8u32..=10, 4usize..=16),
    ];
    (layouts, chunk_sectors(), 1u64..=40, any::<u64>()).prop_map(
        |((level, layout, disks), chunk, stripes, rest)| {
            (level, layout, disks, chunk, stripes * chunk + rest % chunk)
        },
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn parity_stripes_are_permutations((level, layout, disks, chunk, dev_sectors) in parity_case(), seed in any::<u64>()) {
        let g = ParityGeometry::new(&ArrayGeometry {
            level,
            layout,
            chunk_sectors: chunk,
            raid_disks: disks,
            dev_sectors,
            member_sectors: Vec::new(),
        }).unwrap();
        let d = g.data_disks();
        prop_assert_eq!(d, disks - if level == Level::Raid6 { 2 } else { 1 });
        prop_assert_eq!(g.array_sectors(), dev_sectors / chunk * chunk * d as u64);
        // A whole period of the rotation (lcm of disks and disks - 1 covers all layouts).
        for stripe in 0..(disks * (disks - 1)) as u64 {
            let m = g.stripe_map(stripe);
            let mut all: Vec<usize> = m.data.iter().map(|x| x.0).collect();
            all.push(m.p.0);
            if let Some(q) = m.q {
                all.push(q.0);
            }
            prop_assert_eq!(m.q.is_some(), level == Level::Raid6);
            all.sort_unstable();
            prop_assert_eq!(all, (0..disks).collect::<Vec<_>>(), "stripe {}", stripe);
            let mut order = m.syndrome_order.clone();
            order.sort_unstable();
            if level == Level::Raid6 {
                prop_assert_eq!(order.to_vec(), (0..d).collect::<Vec<_>>());
                // Coefficient slots: distinct and increasing; for md's layouts 0..d, for the
                // DDF layouts the disk numbers of the data disks.
                prop_assert_eq!(m.syndrome_slots.len(), d);
                prop_assert!(m.syndrome_slots.windows(2).all(|w| w[0] < w[1]));
                for (k, &i) in m.syndrome_order.iter().enumerate() {
                    let want = if (8..=10).contains(&layout) { m.data[i].0 } else { k };
                    prop_assert_eq!(m.syndrome_slots[k], want);
                }
            } else {
                prop_assert!(order.is_empty());
            }
        }
        // locate / array_sector round trip, and member sectors inside the members.
        let total = g.array_sectors();
        for k in 0..32u64 {
            let s = (seed.wrapping_mul(k * 2 + 1) >> 5) % total;
            let loc = g.locate(s);
            prop_assert!(loc.data_index < d);
            prop_assert!(loc.offset_sectors < chunk);
            prop_assert!(loc.stripe < g.stripes());
            prop_assert_eq!(g.array_sector(loc.stripe, loc.data_index) + loc.offset_sectors, s);
            prop_assert!(g.member_sector(loc.stripe, loc.offset_sectors) < dev_sectors);
            prop_assert_eq!(g.locate(g.array_sector(loc.stripe, loc.data_index)).data_index, loc.data_index);
        }
    }

    #[test]
    fn parity_data_map_is_injective((level, layout, disks, chunk, dev_sectors) in parity_case()) {
        let g = ParityGeometry::new(&ArrayGeometry {
            level,
            layout,
            chunk_sectors: chunk,
            raid_disks: disks,
            dev_sectors,
            member_sectors: Vec::new(),
        }).unwrap();
        let mut seen = HashSet::new();
        for c in 0..g.array_sectors() / chunk {
            let loc = g.locate(c * chunk);
            let member = g.stripe_map(loc.stripe).data[loc.data_index];
            let ms = g.member_sector(loc.stripe, 0);
            prop_assert!(ms + chunk <= dev_sectors);
            prop_assert!(seen.insert((member, ms)));
        }
    }
}

/// md's `only_parity` (which roles a recovering member may hold while the array starts
/// dirty) names exactly the roles that hold no data chunk in any stripe.
#[test]
fn only_parity_names_the_roles_that_never_hold_data() {
    use uraid_core::geometry::raid5::{RAID5_LAYOUTS, RAID6_LAYOUTS};
    for (level, layouts) in [
        (Level::Raid4, &[5u32][..]),
        (Level::Raid5, RAID5_LAYOUTS),
        (Level::Raid6, RAID6_LAYOUTS),
    ] {
        for &layout in layouts {
            for disks in 4..=8 {
                let g = ParityGeometry::new(&ArrayGeometry {
                    level,
                    layout,
                    chunk_sectors: 8,
                    raid_disks: disks,
                    dev_sectors: 8 * 1024,
                    member_sectors: Vec::new(),
                })
                .unwrap();
                for r in 0..disks {
                    let never_data = (0..(4 * disks * disks) as u64)
                        .all(|s| !g.stripe_map(s).data.contains(&MemberIdx(r)));
                    assert_eq!(
                        g.only_parity(MemberIdx(r)),
                        never_data,
                        "{level} layout {layout}, {disks} disks, role {r}"
                    );
                }
            }
        }
    }
}
