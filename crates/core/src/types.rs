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
