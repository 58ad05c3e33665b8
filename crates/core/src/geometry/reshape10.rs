//! A raid10 reshape in progress: md's old ("previous") and new near/offset geometry, and
//! which one holds each array sector.
//!
//! md's raid10 reshape (raid10_check_reshape, raid10_start_reshape, reshape_request) changes
//! the number of devices, the chunk size, or near <-> offset, never the number of copies and
//! never to or from "far" copies. It always moves the data: the new geometry's chunks sit at
//! `data_offset + new_offset` on each member (FEATURE_NEW_OFFSET; md's `new_data_offset`,
//! which may differ per member), the old ones at `data_offset`, and md refuses to start or
//! continue unless every member's offset moves, in the reshape's direction, by at least one
//! chunk times the far copies of either geometry (md's `offset_diff` check, "offset
//! difference not enough to continue reshape").
//!
//! `reshape_position` is an *array* sector. md's raid10_find_phys picks the previous
//! geometry for a sector at or past the position going forwards (a grow: the offset moves
//! down), below it going backwards (FEATURE_RESHAPE_BACKWARDS, a shrink: the offset moves
//! up); its choose_data_offset then takes the old data offset with the old geometry and the
//! new one with the new. While it runs md sizes the array by `raid10_size` with the smaller
//! device count and the new geometry's used device sectors.

use super::raid10::Raid10;
use super::reshape::{ReshapeStep, ReshapeWalk, Side};
use super::{ArrayGeometry, GeometryError};
use crate::superblock::{
    Superblock, FEATURE_NEW_OFFSET, FEATURE_RESHAPE_ACTIVE, FEATURE_RESHAPE_BACKWARDS,
};
use crate::types::Level;

/// A raid10 reshape in progress, as the superblock records it.
#[derive(Clone, Debug)]
pub struct Raid10Reshape {
    /// The geometry being left (md's conf->prev).
    pub old: Raid10,
    /// The geometry being reshaped into (md's conf->geo).
    pub new: Raid10,
    /// md's reshape_position: an array sector, the boundary between the two.
    pub position_sectors: u64,
    /// md's FEATURE_RESHAPE_BACKWARDS: the reshape runs from the end towards the start.
    pub backwards: bool,
    /// md's conf->offset_diff: how far, at least, the data area moves on every member in
    /// the reshape's direction (down forwards, up backwards), in sectors. From one
    /// superblock it is that member's; the engine lowers it to the smallest of the array's.
    pub offset_diff_sectors: u64,
    /// This superblock's new_offset (signed sectors from data_offset).
    pub new_offset_sectors: i64,
}

fn invalid(what: String) -> GeometryError {
    GeometryError::Invalid(what)
}

/// md's first_dev_address: the first member sector (from the data area's start) that may
/// hold data of the chunk containing array sector `s`.
pub fn first_dev_address(s: u64, g: &Raid10) -> u64 {
    let chunk = s / g.chunk_sectors;
    chunk * g.near_copies as u64 / g.raid_disks as u64 * g.far_copies as u64 * g.chunk_sectors
}

/// md's last_dev_address: the member sector just past any data of the chunk containing
/// array sector `s` (chunk aligned).
pub fn last_dev_address(s: u64, g: &Raid10) -> u64 {
    let chunks = s / g.chunk_sectors + 1;
    (chunks * g.near_copies as u64).div_ceil(g.raid_disks as u64)
        * g.far_copies as u64
        * g.chunk_sectors
}

impl Raid10Reshape {
    /// The reshape a raid10 v1 superblock records; `None` when FEATURE_RESHAPE_ACTIVE is
    /// clear. What md would not run is refused with md's reason.
    pub fn from_superblock(sb: &Superblock) -> Result<Option<Raid10Reshape>, GeometryError> {
        if sb.feature_map & FEATURE_RESHAPE_ACTIVE == 0 {
            return Ok(None);
        }
        if sb.level != 10 || sb.new_level != 10 {
            return Err(invalid(format!(
                "a reshape from level {} to level {} (md reshapes raid10 only to raid10)",
                sb.level, sb.new_level
            )));
        }
        let old_disks = i64::from(sb.raid_disks) - i64::from(sb.delta_disks);
        if !(1..=4096).contains(&old_disks) {
            return Err(invalid(format!(
                "raid_disks {} with delta_disks {} gives {old_disks} disks before the reshape",
                sb.raid_disks, sb.delta_disks
            )));
        }
        let geometry = |layout: u32, chunk: u32, raid_disks: usize| ArrayGeometry {
            level: Level::Raid10,
            layout,
            chunk_sectors: u64::from(chunk),
            raid_disks,
            dev_sectors: sb.size,
            member_sectors: Vec::new(),
        };
        let old = Raid10::new(&geometry(sb.layout, sb.chunksize, old_disks as usize))?;
        let new = Raid10::new(&geometry(
            sb.new_layout,
            sb.new_chunk,
            sb.raid_disks as usize,
        ))?;
        let far = |g: &Raid10| g.far_copies > 1 && !g.far_offset;
        if far(&old) || far(&new) {
            return Err(invalid(
                "a reshape of a raid10 with far copies (md reshapes near and offset layouts \
                 only: raid10_check_reshape)"
                    .into(),
            ));
        }
        if old.copies() != new.copies() {
            return Err(invalid(format!(
                "a reshape from {} to {} copies (md never changes the number of raid10 copies)",
                old.copies(),
                new.copies()
            )));
        }
        if sb.feature_map & FEATURE_NEW_OFFSET == 0 {
            return Err(invalid(
                "a raid10 reshape that does not move the data offset (md reshapes raid10 \
                 only with a new data offset)"
                    .into(),
            ));
        }
        let backwards = sb.reshape_backwards();
        let new_offset_sectors = i64::from(sb.new_offset);
        if i64::try_from(sb.data_offset).unwrap_or(i64::MAX) + new_offset_sectors < 0 {
            return Err(invalid(format!(
                "new_offset {new_offset_sectors} puts the new data area before the device start (data_offset {})",
                sb.data_offset
            )));
        }
        let mut state = Raid10Reshape {
            old,
            new,
            position_sectors: sb.reshape_position,
            backwards,
            offset_diff_sectors: 0,
            new_offset_sectors,
        };
        state.offset_diff_sectors = state.offset_diff_of(new_offset_sectors);
        state.check()?;
        Ok(Some(state))
    }

    /// md's per-member offset_diff: how far a member's data area moves in the reshape's
    /// direction (0 when it moves the other way).
    pub fn offset_diff_of(&self, new_offset_sectors: i64) -> u64 {
        let d = if self.backwards {
            new_offset_sectors
        } else {
            -new_offset_sectors
        };
        d.max(0) as u64
    }

    /// The least offset_diff md runs with: one chunk times the far copies of either
    /// geometry (raid10_run, raid10_start_reshape).
    pub fn min_offset_diff(&self) -> u64 {
        let len = |g: &Raid10| g.chunk_sectors * g.far_copies as u64;
        len(&self.old).max(len(&self.new))
    }

    /// md's checks when it starts an array mid-reshape: the offset moves far enough and the
    /// position lies inside the array.
    pub fn check(&self) -> Result<(), GeometryError> {
        if self.offset_diff_sectors < self.min_offset_diff() {
            return Err(invalid(format!(
                "the data offset moves by {} sectors towards the reshape's direction, less than \
                 the {} md needs (md: \"offset difference not enough to continue reshape\")",
                self.offset_diff_sectors,
                self.min_offset_diff()
            )));
        }
        let limit = self.array_sectors().max(self.new_array_sectors());
        if self.position_sectors > limit {
            return Err(invalid(format!(
                "reshape_position {} is past the array's end ({limit} sectors)",
                self.position_sectors
            )));
        }
        Ok(())
    }

    /// The array size while the reshape runs (md's raid10_size with the smaller device
    /// count and the new geometry's used device sectors).
    pub fn array_sectors(&self) -> u64 {
        let g = &self.new;
        let disks = self.old.raid_disks.min(g.raid_disks) as u64;
        let shift = g.chunk_sectors.trailing_zeros();
        (((g.used_dev_sectors >> shift) / g.far_copies as u64) * disks / g.near_copies as u64)
            << shift
    }

    /// The array size once the reshape is done.
    pub fn new_array_sectors(&self) -> u64 {
        self.new.array_sectors()
    }

    /// The array size before the reshape: the old geometry holds data below it.
    pub fn old_array_sectors(&self) -> u64 {
        self.old.array_sectors()
    }

    /// Which geometry holds array sector `sector` (md's raid10_find_phys).
    pub fn side_of(&self, sector: u64) -> Side {
        if (sector >= self.position_sectors) != self.backwards {
            Side::Old
        } else {
            Side::New
        }
    }

    /// The geometry of one side.
    pub fn geometry(&self, side: Side) -> &Raid10 {
        match side {
            Side::Old => &self.old,
            Side::New => &self.new,
        }
    }

    /// Array sectors [sector, sector + sectors) cut at the position: up to two runs
    /// `(start, sectors, side)`, in address order.
    pub fn split(&self, sector: u64, sectors: u64) -> Vec<(u64, u64, Side)> {
        let end = sector + sectors;
        let p = self.position_sectors;
        if sectors == 0 {
            return Vec::new();
        }
        if sector < p && p < end {
            vec![
                (sector, p - sector, self.side_of(sector)),
                (p, end - p, self.side_of(p)),
            ]
        } else {
            vec![(sector, sectors, self.side_of(sector))]
        }
    }

    /// Windows start and end on multiples of the smaller chunk (md copies at most one such
    /// chunk at a time; uraid copies as many as the rule below allows).
    pub fn window_unit(&self) -> u64 {
        self.old.chunk_sectors.min(self.new.chunk_sectors)
    }

    /// Whether a window `[s, e)` may be written with `safe` the recorded position (md's
    /// reshape_request test): forwards the new copies end at or before the first member
    /// sector the old geometry may still need after a restart from `safe`, backwards they
    /// start at or after the last one, both across the data areas' distance.
    fn window_fits(&self, s: u64, e: u64, safe: u64) -> bool {
        let diff = self.offset_diff_sectors;
        if self.backwards {
            if safe == 0 {
                return true;
            }
            first_dev_address(s, &self.new) + diff >= last_dev_address(safe - 1, &self.old)
        } else {
            last_dev_address(e - 1, &self.new) <= first_dev_address(safe, &self.old) + diff
        }
    }

    /// The next step from the current position when `safe` is the position every
    /// superblock records, the window at most `max_sectors` long (at least one unit).
    pub fn next_step(&self, safe: u64, max_sectors: u64) -> Result<ReshapeStep, GeometryError> {
        if self.is_done() {
            return Ok(ReshapeStep::Done);
        }
        let unit = self.window_unit();
        let p = self.position_sectors;
        let max = max_sectors.max(unit);
        // Candidate windows: from the position to the k-th unit boundary past it (or, going
        // backwards, before it), clamped to the end; the rule is monotonic in k.
        let window = |k: u64| -> (u64, u64) {
            if self.backwards {
                let s = ((p - 1) / unit).saturating_sub(k - 1) * unit;
                (s, p)
            } else {
                let e = ((p / unit + k) * unit).min(self.end_position());
                (p, e)
            }
        };
        let most = if self.backwards {
            (p - 1) / unit + 1
        } else {
            (self.end_position() - p).div_ceil(unit) + 1
        };
        let most = most.min(max / unit).max(1);
        let fits = |k: u64| {
            let (s, e) = window(k);
            self.window_fits(s, e, safe)
        };
        if fits(1) {
            let (mut lo, mut hi) = (1u64, most);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if fits(mid) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            let (s, e) = window(lo);
            return Ok(ReshapeStep::Copy {
                start: s,
                sectors: e - s,
            });
        }
        if safe != p {
            return Ok(ReshapeStep::Checkpoint);
        }
        Err(invalid(format!(
            "the reshape cannot move past array sector {p}: the data offset moves by {} \
             sectors, too little room for the next chunk",
            self.offset_diff_sectors
        )))
    }
}

super::reshape::reshape_walk_fields!(Raid10Reshape);

/// Rewrite `sb` as the superblock of a completed raid10 reshape (md's end_reshape,
/// md_finish_reshape and raid10_finish_reshape): the new layout, chunk and device count,
/// the data offset moved by this member's new_offset (its data size with it), the
/// component size md's calc_sectors gives the new geometry, the reshape fields cleared.
pub fn finish_superblock10(sb: &mut Superblock, new: &Raid10) {
    let move_by = if sb.feature_map & FEATURE_NEW_OFFSET != 0 {
        i64::from(sb.new_offset)
    } else {
        0
    };
    sb.feature_map &= !(FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET | FEATURE_RESHAPE_BACKWARDS);
    sb.layout = new.layout;
    sb.chunksize = new.chunk_sectors as u32;
    sb.raid_disks = new.raid_disks as u32;
    sb.new_level = sb.level;
    sb.new_layout = sb.layout;
    sb.new_chunk = sb.chunksize;
    sb.delta_disks = 0;
    sb.reshape_position = 0;
    sb.new_offset = 0;
    sb.data_offset = (sb.data_offset as i64 + move_by) as u64;
    sb.data_size = (sb.data_size as i64 - move_by).max(0) as u64;
    sb.size = new.used_dev_sectors;
    for r in sb.dev_roles.iter_mut() {
        if *r < crate::superblock::ROLE_MAX && usize::from(*r) >= new.raid_disks {
            *r = crate::superblock::ROLE_SPARE;
        }
    }
}

/// A raid10 superblock recording a reshape whose position already reached its end is read
/// as the finished shape. Returns whether `sb` changed.
pub fn fold_finished10(sb: &mut Superblock) -> bool {
    match Raid10Reshape::from_superblock(sb) {
        Ok(Some(st)) if st.is_done() => {
            finish_superblock10(sb, &st.new);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r10(layout: u32, chunk: u64, disks: usize, dev: u64) -> Raid10 {
        Raid10::new(&ArrayGeometry {
            level: Level::Raid10,
            layout,
            chunk_sectors: chunk,
            raid_disks: disks,
            dev_sectors: dev,
            member_sectors: Vec::new(),
        })
        .unwrap()
    }

    fn state(old: usize, new: usize, pos: u64, diff: u64) -> Raid10Reshape {
        let dev = 64 * 128;
        Raid10Reshape {
            old: r10(0x102, 128, old, dev),
            new: r10(0x102, 128, new, dev),
            position_sectors: pos,
            backwards: new < old,
            offset_diff_sectors: diff,
            new_offset_sectors: if new < old {
                diff as i64
            } else {
                -(diff as i64)
            },
        }
    }

    /// Forwards the old geometry holds the position and above, backwards below it.
    #[test]
    fn side_follows_md_find_phys() {
        let f = state(4, 5, 1000, 128);
        assert_eq!(f.side_of(999), Side::New);
        assert_eq!(f.side_of(1000), Side::Old);
        let b = state(5, 4, 1000, 128);
        assert_eq!(b.side_of(999), Side::Old);
        assert_eq!(b.side_of(1000), Side::New);
        assert_eq!(
            f.split(900, 200),
            vec![(900, 100, Side::New), (1000, 100, Side::Old)]
        );
        assert_eq!(
            b.split(900, 200),
            vec![(900, 100, Side::Old), (1000, 100, Side::New)]
        );
    }

    /// md's device-address helpers on a 4-disk near-2 array: chunk c sits in row c*2/4.
    #[test]
    fn dev_addresses_are_mds() {
        let g = r10(0x102, 128, 4, 64 * 128);
        assert_eq!(first_dev_address(0, &g), 0);
        assert_eq!(last_dev_address(0, &g), 128);
        assert_eq!(first_dev_address(3 * 128, &g), 128);
        assert_eq!(last_dev_address(3 * 128 + 5, &g), 256);
        let o = r10(0x10201, 128, 4, 64 * 128);
        assert_eq!(last_dev_address(0, &o), 256);
    }

    /// Array sizes: the smaller device count while the reshape runs.
    #[test]
    fn sizes_take_the_smaller_shape_while_running() {
        let s = state(4, 5, 0, 128);
        assert_eq!(s.array_sectors(), 64 * 128 * 4 / 2);
        assert_eq!(s.new_array_sectors(), 64 * 128 * 5 / 2);
        assert_eq!(s.old_array_sectors(), 64 * 128 * 4 / 2);
    }

    /// Every window the steps produce, replayed against a naive model, keeps the rule: the
    /// new copies written never reach a member sector that the old geometry still needs
    /// after a restart from the recorded position, and the reshape reaches its end.
    #[test]
    fn steps_never_overwrite_data_a_restart_needs() {
        for (old, new, diff) in [(4, 5, 128), (4, 5, 1024), (5, 4, 128), (4, 6, 256)] {
            let mut st = state(old, new, 0, diff);
            if st.backwards {
                st.position_sectors = st.array_sectors();
            }
            let mut safe = st.position_sectors;
            let mut checkpoints = 0;
            for _ in 0..100_000 {
                match st.next_step(safe, 4096).unwrap() {
                    ReshapeStep::Done => break,
                    ReshapeStep::Checkpoint => {
                        checkpoints += 1;
                        safe = st.position_sectors
                    }
                    step @ ReshapeStep::Copy { start, sectors } => {
                        // Absolute member sectors, old data area at `diff` forwards (new at
                        // 0), at 0 backwards (new at `diff`).
                        let (old_at, new_at) = if st.backwards { (0, diff) } else { (diff, 0) };
                        let w_lo = new_at + first_dev_address(start, &st.new);
                        let w_hi = new_at + last_dev_address(start + sectors - 1, &st.new);
                        // What a restart from `safe` reads of the old geometry.
                        let (r_lo, r_hi) = if st.backwards {
                            (old_at, old_at + last_dev_address(safe.max(1) - 1, &st.old))
                        } else {
                            (old_at + first_dev_address(safe, &st.old), u64::MAX)
                        };
                        if !(st.backwards && safe == 0) {
                            assert!(
                                w_hi <= r_lo || w_lo >= r_hi,
                                "{old}->{new} diff {diff}: window {start}+{sectors} writes \
                                 {w_lo}..{w_hi}, restart reads {r_lo}..{r_hi}"
                            );
                        }
                        st.advance(step);
                    }
                }
            }
            assert!(st.is_done(), "{old}->{new} diff {diff}");
            assert!(checkpoints > 0, "{old}->{new}: a long reshape checkpoints");
        }
    }

    /// md's refusals: far copies, a change of copies, no offset move, too small a move.
    #[test]
    fn refuses_what_md_refuses() {
        let spec = crate::superblock::CreateSpec {
            set_uuid: [0x42; 16],
            set_name: "host:r10".into(),
            ctime_secs: 1_700_000_000,
            level: 10,
            layout: 0x102,
            chunk_sectors: 128,
            raid_disks: 5,
            spares: 0,
            missing: vec![],
            size_sectors: 8192,
            data_offset_sectors: 2048,
            internal_bitmap: None,
            bad_block_log: true,
            clean: true,
            version: crate::superblock::MetadataVersion::V1_2,
        };
        let mut sb = Superblock::new_for_create(&spec, 0, [9; 16], 8192 + 4096).unwrap();
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
        sb.new_level = 10;
        sb.new_layout = 0x102;
        sb.new_chunk = 128;
        sb.delta_disks = 1;
        sb.new_offset = -1024;
        sb.reshape_position = 512;
        let ok = Raid10Reshape::from_superblock(&sb).unwrap().unwrap();
        assert_eq!(ok.offset_diff_sectors, 1024);
        assert_eq!((ok.old.raid_disks, ok.new.raid_disks), (4, 5));
        let err = |sb: &Superblock| match Raid10Reshape::from_superblock(sb) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted {sb:?}"),
        };
        let mut far = sb.clone();
        far.layout = 0x201;
        far.new_layout = 0x201;
        assert!(err(&far).contains("far copies"), "{}", err(&far));
        let mut copies = sb.clone();
        copies.new_layout = 0x103;
        assert!(err(&copies).contains("copies"));
        let mut fixed = sb.clone();
        fixed.feature_map &= !FEATURE_NEW_OFFSET;
        assert!(err(&fixed).contains("data offset"));
        sb.new_offset = -64;
        assert!(err(&sb).contains("offset difference not enough"));
    }
}
