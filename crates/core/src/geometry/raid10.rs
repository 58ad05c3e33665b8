//! raid10: md's near / far / offset copies.
//!
//! API contract (used by the engine):
//! - `Raid10::new(&ArrayGeometry)` decodes md's layout word (near copies in bits 0-7, far copies
//!   in bits 8-15, bit 16 = offset, bits 17+ = far-set variant) and computes md's stride from
//!   `dev_sectors`.
//! - `map(sector) -> Raid10Map`: all copies of the sector, in md's copy order, and the number of
//!   sectors from there that stay contiguous for every copy (to the chunk end).
//!
//! md's map (`__raid10_find_phys`): array chunk `c` starts on device `(c * near) % raid_disks`
//! in row `(c * near) / raid_disks` (times `far` for the offset layout); its near copies take
//! the following devices, wrapping to the next row after the last device. Each near copy is
//! followed by its far copies: `stride` further down, on the device `near` further on, wrapping
//! inside its far set. For "far" layouts the stride is the used part of a device divided by
//! `far`; for "offset" layouts it is one chunk.

use super::{ArrayGeometry, GeometryError};
use crate::types::{Level, MemberIdx};

/// Bit 16 of the layout word: far copies sit in the next rows ("offset" layout).
pub const RAID10_OFFSET_BIT: u32 = 1 << 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raid10Map {
    /// (member, member sector relative to data_offset) for each copy, in md's order.
    pub copies: super::StripeList<(MemberIdx, u64)>,
    pub contiguous_sectors: u64,
}

#[derive(Clone, Debug)]
pub struct Raid10 {
    pub raid_disks: usize,
    pub chunk_sectors: u64,
    pub near_copies: usize,
    pub far_copies: usize,
    pub far_offset: bool,
    /// md's `far_set_size`: devices that hold far copies of each other (bits 17+ of the layout:
    /// 0 = all devices, 1 = raid_disks / far (the old, buggy variant), 2 = near * far).
    pub far_set_size: usize,
    /// md's `stride`: sectors between a copy and its next far copy on the members.
    pub stride_sectors: u64,
    /// md's `conf->dev_sectors`: the sectors of each member the layout uses (a whole number
    /// of chunks, at most the component size).
    pub used_dev_sectors: u64,
    /// The layout word as given.
    pub layout: u32,
}

impl Raid10 {
    pub fn new(g: &ArrayGeometry) -> Result<Raid10, GeometryError> {
        let unsupported = || GeometryError::UnsupportedLayout {
            level: Level::Raid10,
            layout: g.layout,
        };
        // md's setup_geo: bits above 18 are not defined.
        if g.layout >> 19 != 0 {
            return Err(unsupported());
        }
        let chunk = g.chunk_sectors;
        if chunk < 8 || !chunk.is_power_of_two() {
            return Err(GeometryError::BadChunk {
                chunk_sectors: chunk,
            });
        }
        let near = (g.layout & 0xff) as usize;
        let far = ((g.layout >> 8) & 0xff) as usize;
        let far_offset = g.layout & RAID10_OFFSET_BIT != 0;
        let disks = g.raid_disks;
        let copies = near * far;
        if copies < 2 {
            return Err(unsupported());
        }
        if copies > disks {
            return Err(GeometryError::TooFewDisks {
                level: Level::Raid10,
                min: copies,
                got: disks,
            });
        }
        let far_set_size = match g.layout >> 17 {
            0 => disks,
            1 => disks / far,
            2 => far * near,
            _ => return Err(unsupported()),
        };
        // md's calc_sectors: chunks in the array, then the chunks each device uses (rounded
        // up), of which the far copies take equal shares.
        let shift = chunk.trailing_zeros();
        let array_chunks = ((g.dev_sectors >> shift) / far as u64) * disks as u64 / near as u64;
        let used_chunks = (array_chunks * copies as u64).div_ceil(disks as u64);
        let stride_sectors = if far_offset {
            chunk
        } else {
            (used_chunks / far as u64) << shift
        };
        Ok(Raid10 {
            raid_disks: disks,
            chunk_sectors: chunk,
            near_copies: near,
            far_copies: far,
            far_offset,
            far_set_size,
            stride_sectors,
            used_dev_sectors: used_chunks << shift,
            layout: g.layout,
        })
    }

    pub fn copies(&self) -> usize {
        self.near_copies * self.far_copies
    }

    /// md's `raid10_size`, applied (as md does) to the used part of each device.
    pub fn array_sectors(&self) -> u64 {
        let shift = self.chunk_sectors.trailing_zeros();
        let chunks = ((self.used_dev_sectors >> shift) / self.far_copies as u64)
            * self.raid_disks as u64
            / self.near_copies as u64;
        chunks << shift
    }

    pub fn map(&self, sector: u64) -> Raid10Map {
        let disks = self.raid_disks as u64;
        let in_chunk = sector % self.chunk_sectors;
        let first = (sector / self.chunk_sectors) * self.near_copies as u64;
        let mut row = first / disks;
        if self.far_offset {
            row *= self.far_copies as u64;
        }
        let mut dev = (first % disks) as usize;
        let mut base = row * self.chunk_sectors + in_chunk;
        let mut copies = super::StripeList::with_capacity(self.copies());
        for _ in 0..self.near_copies {
            let mut d = dev;
            let mut s = base;
            copies.push((MemberIdx(d), s));
            for _ in 1..self.far_copies {
                d = self.next_far_device(d);
                s += self.stride_sectors;
                copies.push((MemberIdx(d), s));
            }
            dev += 1;
            if dev >= self.raid_disks {
                dev = 0;
                base += self.chunk_sectors;
            }
        }
        Raid10Map {
            copies,
            contiguous_sectors: self.chunk_sectors - in_chunk,
        }
    }

    /// The device of the next far copy after one on device `d`, as md computes it. The last
    /// far set absorbs the devices left over when `far_set_size` does not divide
    /// `raid_disks`; md tests the device *after* adding `near` against that set's start.
    fn next_far_device(&self, d: usize) -> usize {
        let fs = self.far_set_size;
        let last_set_start = (self.raid_disks / fs - 1) * fs;
        let last_set_size = fs + self.raid_disks % fs;
        let set = d / fs;
        let next = d + self.near_copies;
        if !self.raid_disks.is_multiple_of(fs) && next > last_set_start {
            (next - last_set_start) % last_set_size + last_set_start
        } else {
            next % fs + fs * set
        }
    }

    /// Whether md's map keeps every copy of every chunk on its own device and place.
    ///
    /// md runs some layout words whose map is not: far-set variant 1 when a far set is
    /// smaller than the number of copies (md only warns); near and far copies together when
    /// `far_set_size` does not divide `raid_disks` and there are two sets or more (md tests
    /// the device *after* adding `near` against the last set's start, so copies from the
    /// set before it land in the last set); and the offset layout with near copies when
    /// `near` does not divide `raid_disks` (a near copy that wraps to the next row takes the
    /// place of an offset copy). mdadm creates none of these: it writes only n/f/o layouts
    /// with far-set variant 0. The map here reproduces md's, collisions included.
    pub fn layout_is_sound(&self) -> bool {
        let (disks, fs, near) = (self.raid_disks, self.far_set_size, self.near_copies);
        let sets_misfit =
            near > 1 && self.far_copies > 1 && !disks.is_multiple_of(fs) && disks / fs >= 2;
        let offset_wraps = self.far_offset && near > 1 && !disks.is_multiple_of(near);
        fs >= self.copies() && !sets_misfit && !offset_wraps
    }

    /// The distinct sets of devices that hold all copies of some chunk. The set depends
    /// only on the chunk's first device, `(chunk * near) % raid_disks`, so `raid_disks`
    /// consecutive chunks show every set the array uses.
    fn copy_sets(&self) -> Vec<Vec<usize>> {
        let chunks = (self.array_sectors() / self.chunk_sectors).min(self.raid_disks as u64);
        let mut sets: Vec<Vec<usize>> = Vec::new();
        for c in 0..chunks {
            let mut set: Vec<usize> = self
                .map(c * self.chunk_sectors)
                .copies
                .iter()
                .map(|(m, _)| m.0)
                .collect();
            set.sort_unstable();
            set.dedup();
            if !sets.contains(&set) {
                sets.push(set);
            }
        }
        sets
    }

    /// Best-case number of members that can be missing (one per mirror set).
    ///
    /// Exactly: `raid_disks` minus the fewest members that hold a copy of every chunk.
    pub fn max_degraded(&self) -> usize {
        self.raid_disks - min_hitting_set(&self.copy_sets(), self.raid_disks)
    }

    /// Whether every sector keeps at least one copy when exactly `missing` are gone.
    pub fn survives(&self, missing: &[MemberIdx]) -> bool {
        self.copy_sets()
            .iter()
            .all(|set| set.iter().any(|d| !missing.contains(&MemberIdx(*d))))
    }

    /// md's own test (`enough()` in raid10.c) of whether the array can run with `missing`
    /// gone: every window of `copies` consecutive devices that starts at a multiple of
    /// `near` must keep a device. It is exact for near layouts and for far/offset layouts
    /// with far-set variant 0; md refuses to start an array that fails it.
    pub fn md_enough(&self, missing: &[MemberIdx]) -> bool {
        let disks = self.raid_disks;
        let mut first = 0;
        loop {
            let alive = (0..self.copies())
                .map(|i| (first + i) % disks)
                .any(|d| !missing.contains(&MemberIdx(d)));
            if !alive {
                return false;
            }
            first = (first + self.near_copies) % disks;
            if first == 0 {
                return true;
            }
        }
    }
}

/// Size of the smallest set of devices that meets every set in `sets`: exact by branch and
/// bound for up to 64 devices, else (or past a work limit) a greedy answer, which can only
/// overstate it and so understates `max_degraded`.
fn min_hitting_set(sets: &[Vec<usize>], disks: usize) -> usize {
    let greedy = greedy_hitting_set(sets, disks);
    if disks > 64 || sets.is_empty() {
        return greedy;
    }
    let masks: Vec<u64> = sets
        .iter()
        .map(|s| s.iter().fold(0u64, |m, d| m | 1 << d))
        .collect();
    let mut best = greedy;
    let mut budget = 200_000u32;
    branch(&masks, 0, &mut best, &mut budget);
    best
}

fn branch(open: &[u64], chosen: usize, best: &mut usize, budget: &mut u32) {
    if open.is_empty() {
        *best = (*best).min(chosen);
        return;
    }
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    // Lower bounds: sets with no device in common each need their own device, and no
    // device meets more open sets than the busiest one does.
    let mut used = 0u64;
    let mut disjoint = 0;
    for &m in open {
        if m & used == 0 {
            used |= m;
            disjoint += 1;
        }
    }
    let busiest = (0..64)
        .map(|d| open.iter().filter(|&&m| m & (1 << d) != 0).count())
        .max()
        .unwrap_or(1)
        .max(1);
    let bound = disjoint.max(open.len().div_ceil(busiest));
    if chosen + bound >= *best {
        return;
    }
    let first = open[0];
    for d in (0..64).filter(|d| first & (1u64 << d) != 0) {
        let rest: Vec<u64> = open.iter().copied().filter(|m| m & (1 << d) == 0).collect();
        branch(&rest, chosen + 1, best, budget);
    }
}

fn greedy_hitting_set(sets: &[Vec<usize>], disks: usize) -> usize {
    let mut open: Vec<&Vec<usize>> = sets.iter().collect();
    let mut count = 0;
    while !open.is_empty() {
        let d = (0..disks)
            .max_by_key(|d| open.iter().filter(|s| s.contains(d)).count())
            .expect("raid10 has devices");
        open.retain(|s| !s.contains(&d));
        count += 1;
    }
    count
}

/// Parse mdadm's raid10 layout spelling ("n2", "f2", "o2", "n3", ...) into md's layout word.
///
/// Like mdadm, the copies must be 1..=200 and the far-set variant is 0. mdadm's --detail
/// spelling ("near=2", "far=2", "offset=2", "near=2, far=2") is accepted as well.
pub fn parse_layout(s: &str) -> Option<u32> {
    let s = s.trim();
    if let Some((kind, num)) = s.split_at_checked(1) {
        if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) {
            let copies: u32 = num.parse().ok().filter(|c| (1..=200).contains(c))?;
            return match kind {
                "n" => Some((1 << 8) | copies),
                "f" => Some((copies << 8) | 1),
                "o" => Some(RAID10_OFFSET_BIT | (copies << 8) | 1),
                _ => None,
            };
        }
    }
    let (mut near, mut far, mut offset) = (None, None, false);
    for part in s.split(',') {
        let (key, val) = part.trim().split_once('=')?;
        let val: u32 = val.trim().parse().ok().filter(|c| (1..=255).contains(c))?;
        let slot = match key.trim() {
            "near" => &mut near,
            "far" => &mut far,
            "offset" => {
                offset = true;
                &mut far
            }
            _ => return None,
        };
        if slot.replace(val).is_some() {
            return None;
        }
    }
    if near.is_none() && far.is_none() {
        return None;
    }
    let word = (far.unwrap_or(1) << 8) | near.unwrap_or(1);
    Some(if offset {
        word | RAID10_OFFSET_BIT
    } else {
        word
    })
}

/// mdadm's spelling of a raid10 layout word ("near=2", "far=2", "offset=2"); also "n2" style.
///
/// The first form is what `mdadm --detail` prints after "Layout :" (without its leading
/// space): "near=N" unless near is 1, then ", far=N" or ", offset=N" unless far is 1, and
/// "NO REDUNDANCY" for a single copy. The "n2" form is [`short_layout_name`].
pub fn layout_name(layout: u32) -> String {
    let near = layout & 0xff;
    let far = (layout >> 8) & 0xff;
    let mut out = Vec::new();
    if near != 1 {
        out.push(format!("near={near}"));
    }
    if far != 1 {
        let kind = if layout & RAID10_OFFSET_BIT != 0 {
            "offset"
        } else {
            "far"
        };
        out.push(format!("{kind}={far}"));
    }
    if near * far == 1 {
        out.push("NO REDUNDANCY".to_string());
    }
    out.join(", ")
}

/// mdadm's --layout spelling ("n2", "f2", "o2") of a layout word that has one; `None` for
/// combined near and far copies or a far-set variant other than 0.
pub fn short_layout_name(layout: u32) -> Option<String> {
    if layout >> 17 != 0 {
        return None;
    }
    let near = layout & 0xff;
    let far = (layout >> 8) & 0xff;
    let offset = layout & RAID10_OFFSET_BIT != 0;
    match (near, far, offset) {
        (n, 1, false) => Some(format!("n{n}")),
        (1, f, false) => Some(format!("f{f}")),
        (1, f, true) => Some(format!("o{f}")),
        _ => None,
    }
}
