//! md's data layouts: where each array sector lives on the members.
//!
//! One module per level family. The engine builds a [`Personality`] from the superblock fields
//! and asks it; it never matches on the level to compute an address itself.
//!
//! All addresses here are in 512-byte sectors and relative to the start of each member's
//! data area (`data_offset` is added by the engine).

pub mod raid0;
pub mod raid1;
pub mod raid10;
pub mod raid5;
pub mod reshape;
pub mod reshape10;
pub mod takeover;

use crate::types::{Level, MemberIdx};
use thiserror::Error;

pub use raid0::Raid0;
pub use raid1::Raid1;
pub use raid10::Raid10;
pub use raid5::{ParityGeometry, StripeLocation, StripeMap};

/// One entry per member of a stripe (a raid5/6 stripe's data members, a raid10 chunk's
/// copies), inline up to 16 entries: a map is computed for every request, and a heap
/// allocation per request showed in the engine's profile.
pub type StripeList<T> = smallvec::SmallVec<[T; 16]>;
pub use reshape::{ReshapeState, ReshapeStep, ReshapeWalk, Side};
pub use reshape10::Raid10Reshape;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GeometryError {
    #[error("unsupported layout {layout:#x} for {level}")]
    UnsupportedLayout { level: Level, layout: u32 },
    #[error(
        "chunk size {chunk_sectors} sectors is not a power of two of at least 8 sectors (4 KiB)"
    )]
    BadChunk { chunk_sectors: u64 },
    #[error("{level} needs at least {min} member(s), got {got}")]
    TooFewDisks {
        level: Level,
        min: usize,
        got: usize,
    },
    #[error("invalid geometry: {0}")]
    Invalid(String),
}

/// What the superblock says about the array's shape; the input to every layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayGeometry {
    pub level: Level,
    /// md's layout number exactly as stored in the superblock (raid5 algorithm, raid10 copies
    /// encoding, raid0 zone layout).
    pub layout: u32,
    /// Chunk size in sectors (ignored for raid1).
    pub chunk_sectors: u64,
    /// Number of member roles (md's `raid_disks`).
    pub raid_disks: usize,
    /// Sectors of each member used for data (md's superblock `size` field, "component size").
    /// For raid0 this is not used for the mapping; see `member_sectors`.
    pub dev_sectors: u64,
    /// raid0 only: the data sectors of each member in role order (md's per-device `data_size`,
    /// rounded down to the chunk size by the layout). Members of different sizes make several
    /// zones. Empty for other levels.
    pub member_sectors: Vec<u64>,
}

/// One level's layout, ready to map addresses.
#[derive(Clone, Debug)]
pub enum Personality {
    Raid0(Raid0),
    Raid1(Raid1),
    Raid10(Raid10),
    /// raid4, raid5 and raid6 share the striped-parity layout family.
    Parity(ParityGeometry),
}

impl Personality {
    pub fn new(g: &ArrayGeometry) -> Result<Personality, GeometryError> {
        Ok(match g.level {
            Level::Raid0 => Personality::Raid0(Raid0::new(g)?),
            Level::Raid1 => Personality::Raid1(Raid1::new(g)?),
            Level::Raid10 => Personality::Raid10(Raid10::new(g)?),
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                Personality::Parity(ParityGeometry::new(g)?)
            }
        })
    }

    /// Size of the array in sectors.
    pub fn array_sectors(&self) -> u64 {
        match self {
            Personality::Raid0(r) => r.array_sectors(),
            Personality::Raid1(r) => r.array_sectors(),
            Personality::Raid10(r) => r.array_sectors(),
            Personality::Parity(r) => r.array_sectors(),
        }
    }

    /// How many members may be missing while every sector stays readable, in the best case
    /// for raid10 (one per mirror set); the engine checks the actual set with
    /// [`Personality::survives`].
    pub fn max_degraded(&self) -> usize {
        match self {
            Personality::Raid0(_) => 0,
            Personality::Raid1(r) => r.raid_disks - 1,
            Personality::Raid10(r) => r.max_degraded(),
            Personality::Parity(r) => r.parity_disks(),
        }
    }

    /// Whether all data is still reachable when exactly the members in `missing` are gone.
    pub fn survives(&self, missing: &[MemberIdx]) -> bool {
        match self {
            Personality::Raid0(_) => missing.is_empty(),
            Personality::Raid1(r) => missing.len() < r.raid_disks,
            Personality::Raid10(r) => r.survives(missing),
            Personality::Parity(r) => missing.len() <= r.parity_disks(),
        }
    }
}

/// Parse a chunk size in mdadm's spelling ("64", "64K", "512k", "1M", "4096B") into sectors.
/// A bare number means KiB, as in mdadm.
pub fn parse_chunk(s: &str) -> Option<u64> {
    parse_size_bytes(s, 1024).map(|b| b / 512)
}

/// Parse a size with an optional K/M/G/T suffix (or B for bytes, S for sectors); a bare number
/// is multiplied by `bare_unit`.
pub fn parse_size_bytes(s: &str, bare_unit: u64) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'B' => 1,
                'S' => 512,
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return None,
            };
            (&s[..i], m)
        }
        _ => (s, bare_unit),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}
