//! Where array data lives, asked of the level's geometry: which members a range needs,
//! which redundancy blocks may be corrupted for a scrub test, and the budget unit (stripe,
//! chunk or mirror region) of a sector.

use uraid_core::geometry::Personality;
use uraid_core::{MemberIdx, SECTOR_BYTES};

/// Mirror region for raid1 budget units (md's resync works in such windows too).
const RAID1_UNIT_SECTORS: u64 = 128;

/// The budget unit of an array sector: a stripe (raid4/5/6), a chunk (raid0/10) or a
/// region (raid1). Faults of different members in one unit add up.
pub fn unit_of(p: &Personality, sector: u64) -> u64 {
    match p {
        Personality::Raid0(g) => sector / g.chunk_sectors,
        Personality::Raid1(_) => sector / RAID1_UNIT_SECTORS,
        Personality::Raid10(g) => sector / g.chunk_sectors,
        Personality::Parity(g) => g.locate(sector).stripe,
    }
}

/// First array sector of a unit and its length in sectors.
pub fn unit_span(p: &Personality, unit: u64) -> (u64, u64) {
    let n = match p {
        Personality::Raid0(g) => g.chunk_sectors,
        Personality::Raid1(_) => RAID1_UNIT_SECTORS,
        Personality::Raid10(g) => g.chunk_sectors,
        Personality::Parity(g) => g.stripe_data_sectors(),
    };
    (unit * n, n.min(p.array_sectors() - unit * n))
}

pub fn units(p: &Personality) -> u64 {
    let (_, n) = unit_span(p, 0);
    p.array_sectors().div_ceil(n)
}

/// Whether array sectors `[sector, sector + count)` can be served when exactly the members
/// in `gone` cannot be read.
pub fn readable(p: &Personality, gone: &[MemberIdx], sector: u64, count: u64) -> bool {
    let end = sector + count;
    let mut s = sector;
    while s < end {
        let (ok, contiguous) = match p {
            Personality::Raid0(g) => {
                let m = g.map(s);
                (!gone.contains(&m.member), m.contiguous_sectors)
            }
            Personality::Raid1(_) => (gone.len() < p_raid_disks(p), end - s),
            Personality::Raid10(g) => {
                let m = g.map(s);
                (
                    m.copies.iter().any(|(r, _)| !gone.contains(r)),
                    m.contiguous_sectors,
                )
            }
            Personality::Parity(g) => {
                let loc = g.locate(s);
                let map = g.stripe_map(loc.stripe);
                let lost = map
                    .data
                    .iter()
                    .chain(std::iter::once(&map.p))
                    .chain(map.q.iter())
                    .filter(|r| gone.contains(r))
                    .count();
                let ok = !gone.contains(&map.data[loc.data_index]) || lost <= g.parity_disks();
                (ok, g.chunk_sectors - loc.offset_sectors)
            }
        };
        if !ok {
            return false;
        }
        s += contiguous.max(1);
    }
    true
}

fn p_raid_disks(p: &Personality) -> usize {
    match p {
        Personality::Raid1(r) => r.raid_disks,
        _ => unreachable!("raid1 only"),
    }
}

/// A block that holds only redundancy for a unit: (member, member sector, sectors).
pub type RedundantBlock = (MemberIdx, u64, u64);

/// The blocks of a unit that resync rewrites from the others when they differ: parity
/// (P, Q) for raid4/5/6, every copy but the first for mirrors (md's resync copies from the
/// first readable mirror). Corrupting up to the level's redundancy of them in one unit is
/// what a scrub must find and repair.
pub fn redundant_blocks(p: &Personality, unit: u64) -> Vec<RedundantBlock> {
    let (start, len) = unit_span(p, unit);
    match p {
        Personality::Raid0(_) => Vec::new(),
        Personality::Raid1(r) => (1..r.raid_disks)
            .map(|i| (MemberIdx(i), start, len))
            .collect(),
        Personality::Raid10(g) => {
            let m = g.map(start);
            m.copies[1..]
                .iter()
                .map(|&(r, ms)| (r, ms, len.min(m.contiguous_sectors)))
                .collect()
        }
        Personality::Parity(g) => {
            let map = g.stripe_map(unit);
            let ms = g.member_sector(unit, 0);
            std::iter::once(map.p)
                .chain(map.q)
                .map(|r| (r, ms, g.chunk_sectors))
                .collect()
        }
    }
}

/// The members whose blocks make up a unit (for the per-unit budget).
pub fn unit_members(p: &Personality, unit: u64) -> Vec<MemberIdx> {
    let (start, _) = unit_span(p, unit);
    let mut v: Vec<MemberIdx> = match p {
        Personality::Raid0(g) => vec![g.map(start).member],
        Personality::Raid1(r) => (0..r.raid_disks).map(MemberIdx).collect(),
        Personality::Raid10(g) => g.map(start).copies.iter().map(|c| c.0).collect(),
        Personality::Parity(g) => {
            let map = g.stripe_map(unit);
            let mut v = map.data.to_vec();
            v.push(map.p);
            v.extend(map.q);
            v
        }
    };
    v.sort();
    v.dedup();
    v
}

pub fn bytes(sectors: u64) -> u64 {
    sectors * SECTOR_BYTES
}

/// The block of member `m` in a unit: (member sector, sectors), if it holds one.
pub fn member_block(p: &Personality, unit: u64, m: MemberIdx) -> Option<(u64, u64)> {
    let (start, len) = unit_span(p, unit);
    match p {
        Personality::Raid0(_) => None,
        Personality::Raid1(_) => Some((start, len)),
        Personality::Raid10(g) => {
            let map = g.map(start);
            map.copies
                .iter()
                .find(|(r, _)| *r == m)
                .map(|&(_, ms)| (ms, len.min(map.contiguous_sectors)))
        }
        Personality::Parity(g) => {
            let map = g.stripe_map(unit);
            let holds = map.data.contains(&m) || map.p == m || map.q == Some(m);
            holds.then(|| (g.member_sector(unit, 0), g.chunk_sectors))
        }
    }
}
