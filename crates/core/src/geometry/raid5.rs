//! raid4, raid5 and raid6: chunk-high stripes with one (P) or two (P, Q) parity chunks.
//!
//! md numbers the layouts ("algorithms") as stored in the superblock `layout` field:
//!
//! | n  | name                   | parity placement (stripe s, n disks)                       |
//! |----|------------------------|------------------------------------------------------------|
//! | 0  | left-asymmetric        | P on disk (d - s % n) [raid6: n-1 - s % n], data in order, skipping P (and Q) |
//! | 1  | right-asymmetric       | P on disk (s % n), data in order skipping P (and Q)         |
//! | 2  | left-symmetric (default)| P as left-asymmetric, data starts right after P (Q) and wraps |
//! | 3  | right-symmetric        | P as right-asymmetric, data starts right after P (Q) and wraps |
//! | 4  | parity-first           | P on disk 0 (raid6: Q on disk 1), data after               |
//! | 5  | parity-last            | P on disk d (raid6: Q on d+1), data first; raid4 always    |
//! | 16-20 | raid6 only: the raid5 layouts 0-4 over n-1 disks, with Q on the last disk |
//!
//! where d is the number of data disks. For raid6 the Q syndrome weighs data by its position
//! in md's syndrome order: starting at the disk after Q and walking the disks upwards
//! (wrapping), skipping P and Q; the k-th data chunk met gets coefficient {02}^k. For the
//! symmetric layouts 2 and 3 this is the logical order; for the others (including the
//! symmetric layouts 18 and 19, whose Q is fixed on the last disk) it is a rotation of it.
//! The DDF layouts (8, 9, 10) are not supported.

use super::StripeList;
use super::{ArrayGeometry, GeometryError};
use crate::types::{Level, MemberIdx};

pub const ALGORITHM_LEFT_ASYMMETRIC: u32 = 0;
pub const ALGORITHM_RIGHT_ASYMMETRIC: u32 = 1;
pub const ALGORITHM_LEFT_SYMMETRIC: u32 = 2;
pub const ALGORITHM_RIGHT_SYMMETRIC: u32 = 3;
pub const ALGORITHM_PARITY_0: u32 = 4;
pub const ALGORITHM_PARITY_N: u32 = 5;
/// raid6 only, the DDF layouts: Q's coefficients follow the disk numbers (P and Q count as
/// zero blocks), not the order after Q.
pub const ALGORITHM_ROTATING_ZERO_RESTART: u32 = 8;
pub const ALGORITHM_ROTATING_N_RESTART: u32 = 9;
pub const ALGORITHM_ROTATING_N_CONTINUE: u32 = 10;
pub const ALGORITHM_LEFT_ASYMMETRIC_6: u32 = 16;
pub const ALGORITHM_RIGHT_ASYMMETRIC_6: u32 = 17;
pub const ALGORITHM_LEFT_SYMMETRIC_6: u32 = 18;
pub const ALGORITHM_RIGHT_SYMMETRIC_6: u32 = 19;
pub const ALGORITHM_PARITY_0_6: u32 = 20;

/// The raid5 layouts md implements (raid4 always uses parity-last).
pub const RAID5_LAYOUTS: &[u32] = &[
    ALGORITHM_LEFT_ASYMMETRIC,
    ALGORITHM_RIGHT_ASYMMETRIC,
    ALGORITHM_LEFT_SYMMETRIC,
    ALGORITHM_RIGHT_SYMMETRIC,
    ALGORITHM_PARITY_0,
    ALGORITHM_PARITY_N,
];

/// The raid6 layouts md implements: the raid5 ones, the DDF ones and the raid5-with-Q-last
/// ones.
pub const RAID6_LAYOUTS: &[u32] = &[
    ALGORITHM_LEFT_ASYMMETRIC,
    ALGORITHM_RIGHT_ASYMMETRIC,
    ALGORITHM_LEFT_SYMMETRIC,
    ALGORITHM_RIGHT_SYMMETRIC,
    ALGORITHM_PARITY_0,
    ALGORITHM_PARITY_N,
    ALGORITHM_ROTATING_ZERO_RESTART,
    ALGORITHM_ROTATING_N_RESTART,
    ALGORITHM_ROTATING_N_CONTINUE,
    ALGORITHM_LEFT_ASYMMETRIC_6,
    ALGORITHM_RIGHT_ASYMMETRIC_6,
    ALGORITHM_LEFT_SYMMETRIC_6,
    ALGORITHM_RIGHT_SYMMETRIC_6,
    ALGORITHM_PARITY_0_6,
];

/// mdadm's names for the layouts, in its spelling.
pub const LAYOUT_NAMES: &[(u32, &str)] = &[
    (ALGORITHM_LEFT_ASYMMETRIC, "left-asymmetric"),
    (ALGORITHM_RIGHT_ASYMMETRIC, "right-asymmetric"),
    (ALGORITHM_LEFT_SYMMETRIC, "left-symmetric"),
    (ALGORITHM_RIGHT_SYMMETRIC, "right-symmetric"),
    (ALGORITHM_PARITY_0, "parity-first"),
    (ALGORITHM_PARITY_N, "parity-last"),
    (ALGORITHM_ROTATING_ZERO_RESTART, "ddf-zero-restart"),
    (ALGORITHM_ROTATING_N_RESTART, "ddf-N-restart"),
    (ALGORITHM_ROTATING_N_CONTINUE, "ddf-N-continue"),
    (ALGORITHM_LEFT_ASYMMETRIC_6, "left-asymmetric-6"),
    (ALGORITHM_RIGHT_ASYMMETRIC_6, "right-asymmetric-6"),
    (ALGORITHM_LEFT_SYMMETRIC_6, "left-symmetric-6"),
    (ALGORITHM_RIGHT_SYMMETRIC_6, "right-symmetric-6"),
    (ALGORITHM_PARITY_0_6, "parity-first-6"),
];

/// Parse a layout name (mdadm spelling, plus the short forms "la", "ra", "ls", "rs").
pub fn parse_layout(name: &str) -> Option<u32> {
    let n = name.to_ascii_lowercase();
    let short = match n.as_str() {
        "la" => Some(ALGORITHM_LEFT_ASYMMETRIC),
        "ra" => Some(ALGORITHM_RIGHT_ASYMMETRIC),
        "ls" | "default" => Some(ALGORITHM_LEFT_SYMMETRIC),
        "rs" => Some(ALGORITHM_RIGHT_SYMMETRIC),
        _ => None,
    };
    short.or_else(|| {
        LAYOUT_NAMES
            .iter()
            .find(|(_, s)| s.to_ascii_lowercase() == n)
            .map(|(v, _)| *v)
    })
}

/// The mdadm name of a layout number.
pub fn layout_name(layout: u32) -> Option<&'static str> {
    LAYOUT_NAMES
        .iter()
        .find(|(v, _)| *v == layout)
        .map(|(_, s)| *s)
}

/// Where one array sector lives in the stripe grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeLocation {
    /// Stripe number (chunk rows from the start of the members' data area).
    pub stripe: u64,
    /// Logical data index within the stripe, 0..data_disks.
    pub data_index: usize,
    /// Offset in sectors inside the chunk.
    pub offset_sectors: u64,
}

/// Which member holds which chunk of one stripe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeMap {
    /// Member of each logical data chunk, in array order.
    pub data: StripeList<MemberIdx>,
    /// Member holding P.
    pub p: MemberIdx,
    /// Member holding Q (raid6 only).
    pub q: Option<MemberIdx>,
    /// raid6: `syndrome_order[k]` is the logical data index whose chunk gets coefficient
    /// {02}^k in Q. Empty for raid4/5.
    pub syndrome_order: StripeList<usize>,
    /// raid6: the coefficient exponent of each `syndrome_order` entry: 0, 1, 2, ... for md's
    /// layouts; the disk number for the DDF layouts, whose P and Q take slots of their own
    /// (as zero blocks). Empty for raid4/5.
    pub syndrome_slots: StripeList<usize>,
}

impl StripeMap {
    /// Number of coefficient slots in the syndrome (holes included).
    pub fn syndrome_width(&self) -> usize {
        self.syndrome_slots.last().map_or(0, |&s| s + 1)
    }
}

impl StripeMap {
    /// The role a member plays in this stripe.
    pub fn role_of(&self, m: MemberIdx) -> ChunkRole {
        if m == self.p {
            ChunkRole::P
        } else if Some(m) == self.q {
            ChunkRole::Q
        } else {
            ChunkRole::Data(
                self.data
                    .iter()
                    .position(|&d| d == m)
                    .expect("member not in stripe"),
            )
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkRole {
    Data(usize),
    P,
    Q,
}

#[derive(Clone, Debug)]
pub struct ParityGeometry {
    pub level: Level,
    pub algorithm: u32,
    pub raid_disks: usize,
    pub chunk_sectors: u64,
    pub dev_sectors: u64,
}

impl ParityGeometry {
    pub fn new(g: &ArrayGeometry) -> Result<ParityGeometry, GeometryError> {
        let (min, parity) = match g.level {
            Level::Raid4 | Level::Raid5 => (2, 1),
            Level::Raid6 => (4, 2),
            other => {
                return Err(GeometryError::Invalid(format!(
                    "{other} is not a parity level"
                )))
            }
        };
        if g.raid_disks < min {
            return Err(GeometryError::TooFewDisks {
                level: g.level,
                min,
                got: g.raid_disks,
            });
        }
        if g.chunk_sectors < 8 || !g.chunk_sectors.is_power_of_two() {
            return Err(GeometryError::BadChunk {
                chunk_sectors: g.chunk_sectors,
            });
        }
        let ok = match g.level {
            // md's raid4 ignores the layout field and always puts parity last.
            Level::Raid4 => true,
            Level::Raid5 => RAID5_LAYOUTS.contains(&g.layout),
            _ => RAID6_LAYOUTS.contains(&g.layout),
        };
        if !ok {
            return Err(GeometryError::UnsupportedLayout {
                level: g.level,
                layout: g.layout,
            });
        }
        let _ = parity;
        Ok(ParityGeometry {
            level: g.level,
            algorithm: if g.level == Level::Raid4 {
                ALGORITHM_PARITY_N
            } else {
                g.layout
            },
            raid_disks: g.raid_disks,
            chunk_sectors: g.chunk_sectors,
            dev_sectors: g.dev_sectors,
        })
    }

    pub fn parity_disks(&self) -> usize {
        if self.level == Level::Raid6 {
            2
        } else {
            1
        }
    }

    pub fn data_disks(&self) -> usize {
        self.raid_disks - self.parity_disks()
    }

    /// Whether `role` holds only parity in every stripe (md's `only_parity`): raid4's
    /// parity, the `-6` layouts' Q, and the fixed parity roles of PARITY_0/N.
    pub fn only_parity(&self, role: crate::MemberIdx) -> bool {
        let (r, n, p) = (role.0, self.raid_disks, self.parity_disks());
        match self.algorithm {
            ALGORITHM_PARITY_0 => r < p,
            ALGORITHM_PARITY_N => r >= n - p,
            ALGORITHM_PARITY_0_6 => r == 0 || r == n - 1,
            ALGORITHM_LEFT_ASYMMETRIC_6
            | ALGORITHM_RIGHT_ASYMMETRIC_6
            | ALGORITHM_LEFT_SYMMETRIC_6
            | ALGORITHM_RIGHT_SYMMETRIC_6 => r == n - 1,
            _ => false,
        }
    }

    /// Number of whole stripes on each member.
    pub fn stripes(&self) -> u64 {
        self.dev_sectors / self.chunk_sectors
    }

    pub fn array_sectors(&self) -> u64 {
        self.stripes() * self.chunk_sectors * self.data_disks() as u64
    }

    /// Sectors of array data in one stripe.
    pub fn stripe_data_sectors(&self) -> u64 {
        self.chunk_sectors * self.data_disks() as u64
    }

    pub fn locate(&self, sector: u64) -> StripeLocation {
        let chunk_number = sector / self.chunk_sectors;
        let offset_sectors = sector % self.chunk_sectors;
        let dd = self.data_disks() as u64;
        StripeLocation {
            stripe: chunk_number / dd,
            data_index: (chunk_number % dd) as usize,
            offset_sectors,
        }
    }

    /// Array sector of a logical data chunk's first sector.
    pub fn array_sector(&self, stripe: u64, data_index: usize) -> u64 {
        (stripe * self.data_disks() as u64 + data_index as u64) * self.chunk_sectors
    }

    /// Member sector (relative to data_offset) of a stripe's chunk at `offset_sectors`.
    pub fn member_sector(&self, stripe: u64, offset_sectors: u64) -> u64 {
        stripe * self.chunk_sectors + offset_sectors
    }

    pub fn stripe_map(&self, stripe: u64) -> StripeMap {
        let n = self.raid_disks;
        let d = self.data_disks();
        let r = (stripe % n as u64) as usize;
        let raid6 = self.level == Level::Raid6;
        // Each closure maps a logical data index to a disk for this stripe.
        let (p, q, data): (usize, Option<usize>, StripeList<usize>) = if !raid6 {
            let (p, sym) = match self.algorithm {
                ALGORITHM_LEFT_ASYMMETRIC => (d - r, false),
                ALGORITHM_RIGHT_ASYMMETRIC => (r, false),
                ALGORITHM_LEFT_SYMMETRIC => (d - r, true),
                ALGORITHM_RIGHT_SYMMETRIC => (r, true),
                ALGORITHM_PARITY_0 => (0, false),
                _ => (d, false),
            };
            let data = (0..d)
                .map(|i| {
                    if sym {
                        (p + 1 + i) % n
                    } else if i >= p {
                        i + 1
                    } else {
                        i
                    }
                })
                .collect();
            (p, None, data)
        } else {
            match self.algorithm {
                ALGORITHM_LEFT_ASYMMETRIC
                | ALGORITHM_RIGHT_ASYMMETRIC
                | ALGORITHM_ROTATING_ZERO_RESTART
                | ALGORITHM_ROTATING_N_RESTART => {
                    // DDF zero-restart places like right-asymmetric; N-restart like
                    // left-asymmetric one stripe on, so that stripe 0 is D D D P Q.
                    let p = match self.algorithm {
                        ALGORITHM_LEFT_ASYMMETRIC => n - 1 - r,
                        ALGORITHM_ROTATING_N_RESTART => n - 1 - ((stripe + 1) % n as u64) as usize,
                        _ => r,
                    };
                    let (q, data) = if p == n - 1 {
                        // Q wraps to disk 0: Q D D D P
                        (0, (0..d).map(|i| i + 1).collect())
                    } else {
                        (
                            p + 1,
                            (0..d).map(|i| if i >= p { i + 2 } else { i }).collect(),
                        )
                    };
                    (p, Some(q), data)
                }
                ALGORITHM_LEFT_SYMMETRIC | ALGORITHM_RIGHT_SYMMETRIC => {
                    let p = if self.algorithm == ALGORITHM_LEFT_SYMMETRIC {
                        n - 1 - r
                    } else {
                        r
                    };
                    let data = (0..d).map(|i| (p + 2 + i) % n).collect();
                    (p, Some((p + 1) % n), data)
                }
                ALGORITHM_PARITY_0 => (0, Some(1), (0..d).map(|i| i + 2).collect()),
                ALGORITHM_PARITY_N => (d, Some(d + 1), (0..d).collect()),
                ALGORITHM_ROTATING_N_CONTINUE => {
                    // left-symmetric with Q before P.
                    let p = n - 1 - r;
                    let data = (0..d).map(|i| (p + 1 + i) % n).collect();
                    (p, Some((p + n - 1) % n), data)
                }
                _ => {
                    // The raid5 layouts over n-1 disks, Q on the last disk.
                    let m = n - 1;
                    let r5 = (stripe % m as u64) as usize;
                    let (p, sym) = match self.algorithm {
                        ALGORITHM_LEFT_ASYMMETRIC_6 => (d - r5, false),
                        ALGORITHM_RIGHT_ASYMMETRIC_6 => (r5, false),
                        ALGORITHM_LEFT_SYMMETRIC_6 => (d - r5, true),
                        ALGORITHM_RIGHT_SYMMETRIC_6 => (r5, true),
                        _ => (0, false), // PARITY_0_6
                    };
                    let data = (0..d)
                        .map(|i| {
                            if sym {
                                (p + 1 + i) % m
                            } else if i >= p {
                                i + 1
                            } else {
                                i
                            }
                        })
                        .collect();
                    (p, Some(n - 1), data)
                }
            }
        };
        let ddf = (ALGORITHM_ROTATING_ZERO_RESTART..=ALGORITHM_ROTATING_N_CONTINUE)
            .contains(&self.algorithm);
        let (syndrome_order, syndrome_slots) = match q {
            None => (StripeList::new(), StripeList::new()),
            Some(q) => {
                let mut order = StripeList::new();
                let mut slots = StripeList::new();
                // md: the syndrome starts after Q; for DDF it starts at disk 0 and every
                // disk, P and Q included, takes a coefficient slot.
                let mut disk = if ddf { 0 } else { (q + 1) % n };
                for k in 0..n {
                    if disk != p && disk != q {
                        let idx = data.iter().position(|&x| x == disk).expect("data disk");
                        slots.push(if ddf { k } else { order.len() });
                        order.push(idx);
                    }
                    disk = (disk + 1) % n;
                }
                (order, slots)
            }
        };
        StripeMap {
            data: data.into_iter().map(MemberIdx).collect(),
            p: MemberIdx(p),
            q: q.map(MemberIdx),
            syndrome_order,
            syndrome_slots,
        }
    }
}
