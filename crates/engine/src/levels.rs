//! The one place that picks a level: the personality a geometry asks for (md's
//! find_pers and the level's run). create and assemble build their arrays through it.

use crate::array::{Array, Personality, Slot};
use crate::error::ArrayError;
use crate::meta::Meta;
use uraid_core::geometry::{ArrayGeometry, Personality as Map};
use uraid_core::MemberMap;

/// The personality, with a fresh conf, for a geometry's address map.
pub(crate) fn build(map: &Map) -> Box<dyn Personality> {
    match map {
        Map::Raid0(g) => Box::new(crate::raid0::Raid0Conf::new(g.clone())),
        Map::Raid1(g) => Box::new(crate::raid1::Raid1Conf::new(g.clone())),
        Map::Raid10(g) => Box::new(crate::raid10::Raid10Conf::new(g.clone())),
        Map::Parity(g) => Box::new(crate::raid5::pers::Raid5Pers::new(g.clone())),
    }
}

/// An array of `geometry`'s level on `slots` (one per role), with its superblocks.
pub(crate) fn new_array(
    geometry: ArrayGeometry,
    slots: MemberMap<Slot>,
    meta: Meta,
    clock: crate::clock::Clock,
) -> Result<Array, ArrayError> {
    let map = Map::new(&geometry)?;
    let pers = build(&map);
    Array::new(geometry, map, pers, slots, meta, clock)
}

/// An array in the middle of a raid4/5/6 reshape: `geometry` is the new one (its roles
/// are the slots), `state` has both. Served read-write (the restripe goes on while it is
/// served), with an internal bitmap too (`ReshapePers::bitmap_range`).
pub(crate) fn new_reshaping_array(
    geometry: ArrayGeometry,
    state: uraid_core::geometry::ReshapeState,
    new_data_offset_bytes: Vec<u64>,
    mut rebuilt: Vec<crate::reshape::Rebuilt>,
    slots: MemberMap<Slot>,
    meta: Meta,
    clock: crate::clock::Clock,
) -> Result<Array, ArrayError> {
    let map = Map::new(&geometry)?;
    for b in rebuilt.iter_mut() {
        b.generation = slots[b.role].generation();
    }
    let pers = crate::reshape::ReshapePers::new(state, new_data_offset_bytes, rebuilt);
    let size = pers.array_sectors();
    let mut a = Array::new(geometry, map, Box::new(pers), slots, meta, clock)?;
    a.set_reshape_size(size);
    Ok(a)
}

/// An array in the middle of a raid10 reshape: `geometry` gives the roles (the slots),
/// `state` both geometries. Served read-write, the reshape going on while served; with an
/// internal bitmap (`bitmap`) read-only with the reason until uraid grow --continue has
/// finished the reshape.
pub(crate) fn new_reshaping10_array(
    geometry: ArrayGeometry,
    state: uraid_core::geometry::Raid10Reshape,
    new_data_offset_bytes: Vec<u64>,
    bitmap_short: Option<(u64, u64)>,
    slots: MemberMap<Slot>,
    meta: Meta,
    clock: crate::clock::Clock,
) -> Result<Array, ArrayError> {
    let map = Map::new(&geometry)?;
    let pers = crate::reshape10::Reshape10Pers::new(state, new_data_offset_bytes);
    let (size, reason) = (pers.array_sectors(), pers.reason());
    let mut a = Array::new(geometry, map, Box::new(pers), slots, meta, clock)?;
    a.set_reshape_size(size);
    if let Some((bits, size)) = bitmap_short {
        a.set_read_only_for(format!(
            "{reason}, and its internal bitmap covers {bits} array sectors of the {size} the \
             array has while it reshapes, so writes past them would go unrecorded: uraid \
             reads it through both geometries but does not write it while the reshape is \
             unfinished: run uraid grow --continue on its members (or assemble it with \
             Linux md / mdadm) to finish the reshape"
        ));
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use uraid_core::{Level, MemberIdx, Sector};

    fn geometry(level: Level, layout: u32, raid_disks: usize) -> ArrayGeometry {
        let dev_sectors = 64 * 16;
        ArrayGeometry {
            level,
            layout,
            chunk_sectors: 16,
            raid_disks,
            dev_sectors,
            member_sectors: if level == Level::Raid0 {
                vec![dev_sectors; raid_disks]
            } else {
                Vec::new()
            },
        }
    }

    fn cases() -> Vec<ArrayGeometry> {
        vec![
            geometry(Level::Raid0, 0, 3),
            geometry(Level::Raid1, 0, 3),
            geometry(Level::Raid10, 0x102, 4),   // near 2
            geometry(Level::Raid10, 0x201, 4),   // far 2
            geometry(Level::Raid10, 0x10201, 3), // offset 2
            geometry(Level::Raid4, 5, 4),
            geometry(Level::Raid5, 2, 4), // left-symmetric
            geometry(Level::Raid5, 0, 5), // left-asymmetric
            geometry(Level::Raid6, 2, 5),
        ]
    }

    /// Every array sector has its own place on the members: no two sectors (or two copies
    /// of one) share a member sector, copies sit on distinct members, everything lies in
    /// the members' data area, and raid4/5/6 data never sits where the stripe's parity is.
    #[test]
    fn locate_gives_each_sector_its_own_place_as_the_geometry_says() {
        for g in cases() {
            let map = Map::new(&g).unwrap();
            let pers = build(&map);
            let mut used = HashSet::new();
            for s in 0..map.array_sectors() {
                let places = pers.locate(Sector(s));
                let copies = match &map {
                    Map::Raid0(_) | Map::Parity(_) => 1,
                    Map::Raid1(r) => r.raid_disks,
                    Map::Raid10(r) => r.near_copies * r.far_copies,
                };
                assert_eq!(places.len(), copies, "{:?} sector {s}", g.level);
                let members: HashSet<MemberIdx> = places.iter().map(|p| p.0).collect();
                assert_eq!(
                    members.len(),
                    copies,
                    "{:?} sector {s}: copies share a member",
                    g.level
                );
                for &(m, ms) in &places {
                    assert!(m.0 < g.raid_disks && ms.0 < g.dev_sectors, "{g:?} {s}");
                    assert!(
                        used.insert((m, ms)),
                        "{:?}: sector {s} reuses {m}:{ms}",
                        g.level
                    );
                }
                match &map {
                    Map::Raid0(r) => {
                        let m = r.map(s);
                        assert_eq!(places, vec![(m.member, Sector(m.member_sector))]);
                    }
                    Map::Raid1(_) => assert!(places.iter().all(|p| p.1 == Sector(s))),
                    Map::Raid10(r) => {
                        let want: Vec<_> = r
                            .map(s)
                            .copies
                            .into_iter()
                            .map(|(m, x)| (m, Sector(x)))
                            .collect();
                        assert_eq!(places, want);
                    }
                    Map::Parity(p) => {
                        let stripe = s / p.stripe_data_sectors();
                        let sm = p.stripe_map(stripe);
                        let m = places[0].0;
                        assert!(
                            m != sm.p && Some(m) != sm.q,
                            "{:?} sector {s} on parity",
                            g.level
                        );
                        assert_eq!(places[0].1 .0 / p.chunk_sectors, stripe);
                    }
                }
            }
        }
    }

    /// Only raid0 has nothing to rebuild a member from (add and replace are refused).
    #[test]
    fn every_level_but_raid0_rebuilds_members() {
        for g in cases() {
            let pers = build(&Map::new(&g).unwrap());
            assert_eq!(pers.rebuilds(), g.level != Level::Raid0, "{:?}", g.level);
        }
    }

    /// The personality and the core geometry agree on which members the array can lose.
    #[test]
    fn survives_as_the_core_geometry_says_for_every_set_of_missing_members() {
        for g in cases() {
            let map = Map::new(&g).unwrap();
            let pers = build(&map);
            assert_eq!(pers.max_degraded(), map.max_degraded(), "{:?}", g.level);
            for bits in 0u32..(1 << g.raid_disks) {
                let missing: Vec<MemberIdx> = (0..g.raid_disks)
                    .filter(|i| bits & (1 << i) != 0)
                    .map(MemberIdx)
                    .collect();
                assert_eq!(
                    pers.survives(&missing),
                    map.survives(&missing),
                    "{:?} missing {missing:?}",
                    g.level
                );
            }
        }
    }

    /// Recovery units cover the array, and a cursor survives the trip through md's
    /// recovery_offset where the layout is monotonic.
    #[test]
    fn recovery_units_cover_the_array_and_offsets_round_trip() {
        for g in cases() {
            let map = Map::new(&g).unwrap();
            let pers = build(&map);
            let (units, unit_bytes) = (pers.total_units(), pers.unit_bytes());
            if g.level == Level::Raid0 {
                assert_eq!((units, unit_bytes), (0, 0));
                continue;
            }
            assert_eq!(
                units * unit_bytes,
                map.array_sectors() * uraid_core::SECTOR_BYTES,
                "{:?}",
                g.level
            );
            let monotonic = !matches!(&map, Map::Raid10(r) if r.far_copies > 1);
            for cursor in [0, 1, units / 2, units] {
                let off = pers.recovery_offset_sectors(cursor);
                assert!(off <= g.dev_sectors, "{:?}", g.level);
                if monotonic {
                    let back = pers.cursor_for_offset(off);
                    assert!(back <= cursor, "{:?}: {cursor} -> {off} -> {back}", g.level);
                    if !matches!(map, Map::Raid10(_)) {
                        assert_eq!(back, cursor, "{:?}", g.level);
                    }
                } else {
                    assert_eq!(off, 0, "far/offset copies claim nothing");
                }
            }
        }
    }

    /// The bitmap counts a raid4/5/6 write over whole chunk rows; the mirrors count the
    /// array sectors themselves.
    #[test]
    fn bitmap_range_is_chunk_rows_for_parity_and_sectors_for_mirrors() {
        let g = geometry(Level::Raid5, 2, 4); // 3 data chunks of 16 sectors per stripe
        let pers = build(&Map::new(&g).unwrap());
        assert_eq!(pers.bitmap_range(Sector(0), 1), (0, 16));
        assert_eq!(pers.bitmap_range(Sector(47), 2), (0, 32));
        assert_eq!(pers.bitmap_range(Sector(100), 1), (32, 16));
        let g = geometry(Level::Raid1, 0, 2);
        let pers = build(&Map::new(&g).unwrap());
        assert_eq!(pers.bitmap_range(Sector(47), 2), (47, 2));
    }
}
