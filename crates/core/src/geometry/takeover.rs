//! md's level takeovers: level changes that move no data, because the old layout's data
//! chunks already sit where the new layout wants them (md's `*_takeover` functions in
//! raid0.c, raid1.c, raid5.c, raid10.c). Pure: which layout the new level gets, and the
//! chunk md picks; the engine rewrites the superblocks.

use super::raid5::{
    ALGORITHM_LEFT_ASYMMETRIC, ALGORITHM_LEFT_ASYMMETRIC_6, ALGORITHM_LEFT_SYMMETRIC,
    ALGORITHM_LEFT_SYMMETRIC_6, ALGORITHM_PARITY_0, ALGORITHM_PARITY_0_6, ALGORITHM_PARITY_N,
    ALGORITHM_RIGHT_ASYMMETRIC, ALGORITHM_RIGHT_ASYMMETRIC_6, ALGORITHM_RIGHT_SYMMETRIC,
    ALGORITHM_RIGHT_SYMMETRIC_6,
};

/// raid5 layouts and the raid6 layout that keeps their P and data and adds Q on the new
/// last device (md's `-6` layouts; parity-last keeps its number: P then Q last).
const RAID5_TO_RAID6: [(u32, u32); 6] = [
    (ALGORITHM_LEFT_ASYMMETRIC, ALGORITHM_LEFT_ASYMMETRIC_6),
    (ALGORITHM_RIGHT_ASYMMETRIC, ALGORITHM_RIGHT_ASYMMETRIC_6),
    (ALGORITHM_LEFT_SYMMETRIC, ALGORITHM_LEFT_SYMMETRIC_6),
    (ALGORITHM_RIGHT_SYMMETRIC, ALGORITHM_RIGHT_SYMMETRIC_6),
    (ALGORITHM_PARITY_0, ALGORITHM_PARITY_0_6),
    (ALGORITHM_PARITY_N, ALGORITHM_PARITY_N),
];

/// The raid6 layout a raid5 of `layout` becomes by adding a Q device (md's raid6_takeover);
/// `None` for a layout md cannot take over.
pub fn raid6_layout_of_raid5(layout: u32) -> Option<u32> {
    RAID5_TO_RAID6
        .iter()
        .find(|&&(r5, _)| r5 == layout)
        .map(|&(_, r6)| r6)
}

/// The raid5 layout a raid6 of `layout` becomes by dropping its last device (md's
/// raid5_takeover_raid6): only the `-6` layouts and parity-last, whose last device holds
/// nothing but Q.
pub fn raid5_layout_of_raid6(layout: u32) -> Option<u32> {
    RAID5_TO_RAID6
        .iter()
        .find(|&&(_, r6)| r6 == layout)
        .map(|&(r5, _)| r5)
}

/// The chunk md gives a 2-device raid1 taken over as raid5 (raid5_takeover_raid1): the
/// largest power of two up to 64 KiB that divides the array size; `None` below one 4 KiB
/// page, which md refuses.
pub fn raid1_to_raid5_chunk_sectors(array_sectors: u64) -> Option<u64> {
    let mut chunk = 128u64;
    while chunk > 0 && array_sectors & (chunk - 1) != 0 {
        chunk >>= 1;
    }
    (chunk >= 8).then_some(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::raid5::{ParityGeometry, RAID5_LAYOUTS};
    use crate::geometry::ArrayGeometry;
    use crate::types::{Level, MemberIdx};
    use proptest::prelude::*;

    fn parity(level: Level, layout: u32, raid_disks: usize) -> ParityGeometry {
        ParityGeometry::new(&ArrayGeometry {
            level,
            layout,
            chunk_sectors: 8,
            raid_disks,
            dev_sectors: 1 << 20,
            member_sectors: Vec::new(),
        })
        .unwrap()
    }

    proptest! {
        // The takeover moves no data: every data chunk and P stay on their device and Q
        // lands on the new last one, so a raid5 read as the raid6 (or back) is the same.
        #[test]
        fn raid5_and_its_raid6_place_data_alike(
            layout in proptest::sample::select(RAID5_LAYOUTS.to_vec()),
            n in 3usize..10,
            stripe in 0u64..1000,
        ) {
            let r6_layout = raid6_layout_of_raid5(layout).expect("every raid5 layout");
            prop_assert_eq!(raid5_layout_of_raid6(r6_layout), Some(layout));
            let r5 = parity(Level::Raid5, layout, n).stripe_map(stripe);
            let r6 = parity(Level::Raid6, r6_layout, n + 1).stripe_map(stripe);
            prop_assert_eq!(&r5.data, &r6.data);
            prop_assert_eq!(r5.p, r6.p);
            prop_assert_eq!(r6.q, Some(MemberIdx(n)));
        }

        // raid0 of n devices is raid4/raid5 parity-last of n+1 with its parity device
        // missing: chunk c on device c mod n, row c / n.
        #[test]
        fn raid0_is_parity_last_without_parity(n in 1usize..10, chunk in 0u64..10_000) {
            for level in [Level::Raid4, Level::Raid5] {
                let g = parity(level, ALGORITHM_PARITY_N, n + 1);
                let loc = g.locate(chunk * 8);
                prop_assert_eq!(loc.stripe, chunk / n as u64);
                let map = g.stripe_map(loc.stripe);
                prop_assert_eq!(map.data[loc.data_index], MemberIdx((chunk % n as u64) as usize));
                prop_assert_eq!(map.p, MemberIdx(n));
            }
        }
    }

    #[test]
    fn layouts_md_cannot_take_over_are_refused() {
        assert_eq!(raid6_layout_of_raid5(99), None);
        assert_eq!(
            raid5_layout_of_raid6(super::super::raid5::ALGORITHM_ROTATING_N_RESTART),
            None
        );
        assert_eq!(raid5_layout_of_raid6(ALGORITHM_LEFT_SYMMETRIC), None);
    }

    #[test]
    fn raid1_takeover_chunk_is_md_s() {
        assert_eq!(raid1_to_raid5_chunk_sectors(1 << 20), Some(128));
        assert_eq!(raid1_to_raid5_chunk_sectors(1000), Some(8));
        assert_eq!(raid1_to_raid5_chunk_sectors(1001), None);
    }
}
