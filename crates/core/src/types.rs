//! Newtypes and units shared across uraid.

use std::fmt;

/// Bytes per sector: md counts everything in 512-byte sectors.
pub const SECTOR_BYTES: u64 = 512;

/// A member's role (slot) in the array: 0..raid_disks. md calls this the "raid disk" number,
/// and stores it in `dev_roles[dev_number]` of the v1 superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MemberIdx(pub usize);

impl fmt::Display for MemberIdx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One value per member role, indexable only by [`MemberIdx`] (so a member number cannot be
/// confused with any other index). Iteration yields each role with its value, in role order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MemberMap<T>(Vec<T>);

impl<T> MemberMap<T> {
    /// A map of `n` roles, each value made by `f(role)`.
    pub fn from_fn(n: usize, mut f: impl FnMut(MemberIdx) -> T) -> MemberMap<T> {
        MemberMap((0..n).map(|i| f(MemberIdx(i))).collect())
    }

    /// Roles in the map (md's raid_disks for the array's slots).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `role`, or None if the map has no such role.
    pub fn get(&self, role: MemberIdx) -> Option<&T> {
        self.0.get(role.0)
    }

    pub fn get_mut(&mut self, role: MemberIdx) -> Option<&mut T> {
        self.0.get_mut(role.0)
    }

    /// Whether `role` is one of the map's roles.
    pub fn contains(&self, role: MemberIdx) -> bool {
        role.0 < self.0.len()
    }

    /// Every role, in order.
    pub fn roles(&self) -> impl ExactSizeIterator<Item = MemberIdx> + Clone {
        (0..self.0.len()).map(MemberIdx)
    }

    /// `(role, &value)` for every role, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (MemberIdx, &T)> {
        self.0.iter().enumerate().map(|(i, v)| (MemberIdx(i), v))
    }

    /// The values alone, in role order.
    pub fn values(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    /// The values alone, in role order, taken out of the map.
    pub fn into_values(self) -> std::vec::IntoIter<T> {
        self.0.into_iter()
    }

    pub fn iter_mut(&mut self) -> impl ExactSizeIterator<Item = (MemberIdx, &mut T)> {
        self.0
            .iter_mut()
            .enumerate()
            .map(|(i, v)| (MemberIdx(i), v))
    }
}

impl<T> From<Vec<T>> for MemberMap<T> {
    /// Role `i` gets `v[i]`.
    fn from(v: Vec<T>) -> MemberMap<T> {
        MemberMap(v)
    }
}

impl<T> FromIterator<T> for MemberMap<T> {
    /// Roles are numbered in the iterator's order from 0.
    fn from_iter<I: IntoIterator<Item = T>>(it: I) -> MemberMap<T> {
        MemberMap(it.into_iter().collect())
    }
}

impl<T> std::ops::Index<MemberIdx> for MemberMap<T> {
    type Output = T;
    fn index(&self, role: MemberIdx) -> &T {
        &self.0[role.0]
    }
}

impl<T> std::ops::IndexMut<MemberIdx> for MemberMap<T> {
    fn index_mut(&mut self, role: MemberIdx) -> &mut T {
        &mut self.0[role.0]
    }
}

/// A count of 512-byte sectors (an address or a length), where it meets bytes at a layer
/// boundary: `Sector(n).bytes()` is the one conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Sector(pub u64);

impl Sector {
    /// The sector's byte offset (or the length in bytes).
    pub const fn bytes(self) -> u64 {
        self.0 * SECTOR_BYTES
    }

    /// The sector holding byte `bytes` (rounded down).
    pub const fn of_byte(bytes: u64) -> Sector {
        Sector(bytes / SECTOR_BYTES)
    }
}

impl fmt::Display for Sector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// RAID level, numbered as md numbers them in the superblock's `level` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    Raid0,
    Raid1,
    Raid4,
    Raid5,
    Raid6,
    Raid10,
}

impl Level {
    /// md's numeric level.
    pub fn md_level(self) -> i32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid4 => 4,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid10 => 10,
        }
    }

    /// From md's numeric level; `None` for levels uraid does not support (linear, multipath, faulty...).
    pub fn from_md(level: i32) -> Option<Level> {
        Some(match level {
            0 => Level::Raid0,
            1 => Level::Raid1,
            4 => Level::Raid4,
            5 => Level::Raid5,
            6 => Level::Raid6,
            10 => Level::Raid10,
            _ => return None,
        })
    }

    /// Parse "raid5", "5", "mirror", "stripe" (mdadm's spellings).
    pub fn parse(s: &str) -> Option<Level> {
        let s = s.to_ascii_lowercase();
        Some(match s.as_str() {
            "0" | "raid0" | "stripe" => Level::Raid0,
            "1" | "raid1" | "mirror" => Level::Raid1,
            "4" | "raid4" => Level::Raid4,
            "5" | "raid5" => Level::Raid5,
            "6" | "raid6" => Level::Raid6,
            "10" | "raid10" => Level::Raid10,
            _ => return None,
        })
    }

    /// Uses a chunk size (raid1 does not).
    pub fn has_chunks(self) -> bool {
        self != Level::Raid1
    }

    /// Uses parity stripes (raid4/5/6).
    pub fn has_parity(self) -> bool {
        matches!(self, Level::Raid4 | Level::Raid5 | Level::Raid6)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raid{}", self.md_level())
    }
}

#[cfg(test)]
mod member_map_tests {
    use super::*;

    #[test]
    fn values_are_taken_out_in_role_order() {
        let m: MemberMap<Option<u8>> = vec![Some(1), None, Some(3)].into();
        assert_eq!(m.into_values().flatten().collect::<Vec<_>>(), [1, 3]);
    }

    #[test]
    fn indexed_by_role_and_iterated_with_roles() {
        let mut m = MemberMap::from_fn(3, |r| r.0 * 10);
        assert_eq!(m.len(), 3);
        assert_eq!(m[MemberIdx(2)], 20);
        m[MemberIdx(1)] = 7;
        assert_eq!(m.get(MemberIdx(1)), Some(&7));
        assert_eq!(m.get(MemberIdx(3)), None);
        assert!(m.contains(MemberIdx(2)) && !m.contains(MemberIdx(3)));
        let pairs: Vec<(MemberIdx, usize)> = m.iter().map(|(r, v)| (r, *v)).collect();
        assert_eq!(
            pairs,
            vec![(MemberIdx(0), 0), (MemberIdx(1), 7), (MemberIdx(2), 20)]
        );
        assert_eq!(m.roles().collect::<Vec<_>>(), [0, 1, 2].map(MemberIdx));
        for (r, v) in m.iter_mut() {
            *v += r.0;
        }
        assert_eq!(m.values().copied().collect::<Vec<_>>(), [0, 8, 22]);
        let from_vec: MemberMap<u8> = vec![5, 6].into();
        assert_eq!(from_vec[MemberIdx(1)], 6);
        assert!(MemberMap::<u8>::default().is_empty());
    }

    #[test]
    #[should_panic]
    fn indexing_past_the_roles_panics() {
        let m: MemberMap<u8> = vec![1].into();
        let _ = m[MemberIdx(1)];
    }

    #[test]
    fn sectors_and_bytes() {
        assert_eq!(Sector(3).bytes(), 1536);
        assert_eq!(Sector::of_byte(1535), Sector(2));
    }
}
