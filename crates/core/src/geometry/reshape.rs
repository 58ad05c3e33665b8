//! A raid4/5/6 reshape in progress: md's old ("previous") and new geometry, and which one
//! holds each array sector.
//!
//! md keeps both shapes in one superblock: `level`, `layout`, `chunksize` and
//! `raid_disks - delta_disks` describe the old geometry; `new_level`, `new_layout`,
//! `new_chunk` and `raid_disks` the new one. `reshape_position` is an *array* sector (the
//! same logical address in both geometries). md's raid5 decides per request
//! (`make_stripe_request`, its `ahead_of_reshape`): going forwards, a sector at or past
//! the position is still in the old geometry and one below it is in the new; going
//! backwards (`FEATURE_RESHAPE_BACKWARDS`, a shrink or an offset moving forwards) a sector
//! below the position is still old and one at or past it is new.
//!
//! The new geometry's chunks sit at `data_offset + new_offset` on every member
//! (`FEATURE_NEW_OFFSET`, a signed 32-bit sector count), the old ones at `data_offset`:
//! md's `use_new_offset` picks the offset with the geometry. Without the feature both are
//! at `data_offset` (mdadm then protected the critical section with a backup file).
//!
//! While a reshape runs, md sizes the array by the smaller of the two shapes
//! (`raid5_size` with `min(raid_disks, previous_raid_disks)`, the component size rounded
//! down to both chunk sizes).

use super::{ArrayGeometry, GeometryError, ParityGeometry};
use crate::superblock::{
    Superblock, FEATURE_NEW_OFFSET, FEATURE_RESHAPE_ACTIVE, FEATURE_RESHAPE_BACKWARDS,
};
use crate::types::Level;

/// Which geometry holds a sector (md's `previous` flag of `raid5_compute_sector`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Not yet reshaped: the old geometry at `data_offset`.
    Old,
    /// Already reshaped: the new geometry at `data_offset + new_offset`.
    New,
}

/// A reshape in progress, as the superblock records it.
#[derive(Clone, Debug)]
pub struct ReshapeState {
    /// The geometry being left (md's previous_raid_disks, prev_algo, prev_chunk_sectors).
    pub old: ParityGeometry,
    /// The geometry being reshaped into.
    pub new: ParityGeometry,
    /// md's reshape_position: an array sector, the boundary between the two.
    pub position_sectors: u64,
    /// md's FEATURE_RESHAPE_BACKWARDS: the reshape runs from the end towards the start.
    pub backwards: bool,
    /// md's new_offset: where the new geometry's data area starts, relative to
    /// `data_offset`, in sectors (0 without FEATURE_NEW_OFFSET).
    pub new_offset_sectors: i64,
}

/// What the reshape does next ([`ReshapeState::next_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReshapeStep {
    /// Read array sectors `[start, start + sectors)` through the old geometry and write
    /// them as whole stripes of the new one; the position then moves past them.
    Copy {
        /// First array sector of the window.
        start: u64,
        /// Length of the window (whole new-geometry stripe rows of both chunk sizes).
        sectors: u64,
    },
    /// Flush the members and record the current position in every superblock first:
    /// the next window's stripes would land on old-geometry rows that the recorded
    /// position still says hold data to be copied.
    Checkpoint,
    /// Every sector is in the new geometry.
    Done,
}

/// A reshape state that md would not start from, with md's reason.
fn invalid(what: String) -> GeometryError {
    GeometryError::Invalid(what)
}

impl ReshapeState {
    /// The reshape a v1 superblock records; `None` when FEATURE_RESHAPE_ACTIVE is clear.
    /// Only restripes within raid4/5/6 (the same level before and after) are reshapes
    /// here; everything else is refused with what it is.
    pub fn from_superblock(sb: &Superblock) -> Result<Option<ReshapeState>, GeometryError> {
        if sb.feature_map & FEATURE_RESHAPE_ACTIVE == 0 {
            return Ok(None);
        }
        let level = Level::from_md(sb.level)
            .ok_or_else(|| invalid(format!("a reshape of raid level {}", sb.level)))?;
        if !level.has_parity() {
            return Err(invalid(format!(
                "a reshape of a {level} array (uraid reshapes only raid4/5/6)"
            )));
        }
        if sb.new_level != sb.level {
            return Err(invalid(format!(
                "a reshape that changes the level from {} to {} (uraid reshapes within one level)",
                sb.level, sb.new_level
            )));
        }
        let old_disks = i64::from(sb.raid_disks) - i64::from(sb.delta_disks);
        if !(0..=4096).contains(&old_disks) {
            return Err(invalid(format!(
                "raid_disks {} with delta_disks {} gives {old_disks} disks before the reshape",
                sb.raid_disks, sb.delta_disks
            )));
        }
        let geometry = |layout: u32, chunk: u32, raid_disks: usize| ArrayGeometry {
            level,
            layout,
            chunk_sectors: u64::from(chunk),
            raid_disks,
            dev_sectors: sb.size,
            member_sectors: Vec::new(),
        };
        let old = ParityGeometry::new(&geometry(sb.layout, sb.chunksize, old_disks as usize))?;
        let new = ParityGeometry::new(&geometry(
            sb.new_layout,
            sb.new_chunk,
            sb.raid_disks as usize,
        ))?;
        let new_offset_sectors = if sb.feature_map & FEATURE_NEW_OFFSET != 0 {
            i64::from(sb.new_offset)
        } else {
            0
        };
        if i64::try_from(sb.data_offset).unwrap_or(i64::MAX) + new_offset_sectors < 0 {
            return Err(invalid(format!(
                "new_offset {new_offset_sectors} puts the new data area before the device start (data_offset {})",
                sb.data_offset
            )));
        }
        let state = ReshapeState {
            old,
            new,
            position_sectors: sb.reshape_position,
            backwards: sb.reshape_backwards(),
            new_offset_sectors,
        };
        state.check()?;
        state.check_without_backup_file(sb.feature_map & FEATURE_NEW_OFFSET != 0)?;
        Ok(Some(state))
    }

    /// A reshape whose data offset does not move is mdadm's in-place reshape: mdadm keeps
    /// the stripes being moved in its backup file (a shrink or a same-size restripe the whole
    /// way, a grow its first stripes), so the members alone do not say where that data is.
    /// Only a grow past that critical section is on the members alone (md's own check,
    /// "reshape_position too early for auto-recovery"); the rest is refused with the way
    /// out.
    fn check_without_backup_file(&self, new_offset: bool) -> Result<(), GeometryError> {
        if new_offset {
            return Ok(());
        }
        let what = if self.new.raid_disks < self.old.raid_disks {
            "a shrink"
        } else if self.new.raid_disks == self.old.raid_disks {
            "a same-size restripe (chunk or layout)"
        } else {
            "a grow"
        };
        let advice = "mdadm keeps part of its data in its backup file: assemble it with \
                      mdadm --assemble --backup-file=FILE (uraid does not read mdadm's backup file)";
        if self.backwards || self.new.raid_disks <= self.old.raid_disks {
            return Err(invalid(format!(
                "{what} in place (the data offset does not move, no FEATURE_NEW_OFFSET): {advice}"
            )));
        }
        let r = self.reshape_sectors();
        let here_new = self.position_sectors / (r * self.new.data_disks() as u64);
        let here_old = self.position_sectors / (r * self.old.data_disks() as u64);
        if here_new >= here_old {
            return Err(invalid(format!(
                "{what} in place still in its critical section (reshape_position {}): {advice}",
                self.position_sectors
            )));
        }
        Ok(())
    }

    /// A reshape about to start from `old` to `new`, the new data area `new_offset_sectors`
    /// from the old one (md's new_offset, the same on every member). A negative offset runs
    /// forwards (from sector 0: the new stripes land below the old rows still to be
    /// read), a positive one backwards from the end (md's RESHAPE_BACKWARDS). An offset of
    /// 0 (an in-place reshape, which needs mdadm's backup file), or one too small for the
    /// first window, is refused with the reason.
    pub fn begin(
        old: ParityGeometry,
        new: ParityGeometry,
        new_offset_sectors: i64,
    ) -> Result<ReshapeState, GeometryError> {
        if new_offset_sectors == 0 {
            return Err(invalid(
                "a reshape in place (the data offset does not move) needs mdadm's backup file, \
                 which uraid does not implement; leave room before or after the data"
                    .into(),
            ));
        }
        let backwards = new_offset_sectors > 0;
        let mut state = ReshapeState {
            old,
            new,
            position_sectors: 0,
            backwards,
            new_offset_sectors,
        };
        if backwards {
            state.position_sectors = state.array_sectors();
        }
        state.check()?;
        let first = state.next_step(state.position_sectors, u64::MAX);
        if !matches!(first, Ok(ReshapeStep::Copy { .. })) {
            return Err(invalid(format!(
                "the data offset moves by {new_offset_sectors} sectors, less than the first \
                 stripe row of the new geometry needs ({} sectors)",
                state.reshape_sectors()
            )));
        }
        Ok(state)
    }

    /// The unit a window is made of: one row of the larger chunk across the new data
    /// disks (md's reshape_sectors times the new data disks), so that every window ends
    /// on a stripe boundary of both geometries' rows.
    pub fn window_unit(&self) -> u64 {
        self.reshape_sectors() * self.new.data_disks() as u64
    }

    /// First old-geometry row (member sector from the old data offset) that holds data
    /// at or past array sector `sector`.
    fn old_row_floor(&self, sector: u64) -> u64 {
        sector / self.old.stripe_data_sectors() * self.old.chunk_sectors
    }

    /// The old-geometry row past the last one that holds data below array sector `sector`.
    fn old_row_ceil(&self, sector: u64) -> u64 {
        sector.div_ceil(self.old.stripe_data_sectors()) * self.old.chunk_sectors
    }

    /// The next step from the current position when `safe` is the position every
    /// superblock records (durable), the window at most `max_sectors` long (at least one
    /// unit is always allowed when it is safe).
    ///
    /// The rule (md's reshape_request with a moving data offset): the new stripes of a
    /// window may only overwrite old-geometry rows whose data the *recorded* position
    /// already calls new. Forwards, the rows written end at or before the first old row
    /// holding data at or past `safe`; backwards, they start at or after the end of the
    /// last old row holding data below `safe`. Then a power cut at any instant leaves every
    /// sector readable where the superblocks say it is, and repeating a window from the
    /// recorded position reads the same old data again.
    pub fn next_step(&self, safe: u64, max_sectors: u64) -> Result<ReshapeStep, GeometryError> {
        if self.is_done() {
            return Ok(ReshapeStep::Done);
        }
        let unit = self.window_unit();
        let ndd = self.new.data_disks() as i128;
        let off = i128::from(self.new_offset_sectors);
        let p = i128::from(self.position_sectors);
        // The longest window the rule allows, in array sectors (may be negative).
        let (allowed, left) = if self.backwards {
            let lowest_row = i128::from(self.old_row_ceil(safe)) - off;
            (p - lowest_row * ndd, self.position_sectors)
        } else {
            let highest_row = i128::from(self.old_row_floor(safe)) - off;
            (
                highest_row * ndd - p,
                self.end_position() - self.position_sectors,
            )
        };
        let cap = i128::from(max_sectors.max(unit).min(left));
        let w = allowed.min(cap).max(0) as u64 / unit * unit;
        if w > 0 {
            let start = if self.backwards {
                self.position_sectors - w
            } else {
                self.position_sectors
            };
            return Ok(ReshapeStep::Copy { start, sectors: w });
        }
        if safe != self.position_sectors {
            return Ok(ReshapeStep::Checkpoint);
        }
        Err(invalid(format!(
            "the reshape cannot move past array sector {}: the data offset moves by {} \
             sectors, too little room for the next stripe row ({} sectors per member)",
            self.position_sectors,
            self.new_offset_sectors,
            self.reshape_sectors()
        )))
    }

    /// md's checks when it starts an array mid-reshape (raid5_run): the position lies on
    /// a stripe boundary of the new geometry (at the larger chunk size) and in the array.
    pub fn check(&self) -> Result<(), GeometryError> {
        if self.old.level != self.new.level {
            return Err(invalid("the old and new geometry differ in level".into()));
        }
        let boundary = self.reshape_sectors() * self.new.data_disks() as u64;
        if !self.position_sectors.is_multiple_of(boundary) {
            return Err(invalid(format!(
                "reshape_position {} not on a stripe boundary (a multiple of {boundary} sectors)",
                self.position_sectors
            )));
        }
        // Forwards the position runs up to the new size; backwards it starts at the end
        // of the smaller shape.
        let end = self.new_array_sectors().max(self.array_sectors());
        if self.position_sectors > end {
            return Err(invalid(format!(
                "reshape_position {} lies past the end of the array ({end} sectors)",
                self.position_sectors
            )));
        }
        Ok(())
    }

    /// The unit md's reshape moves per member: the larger of the two chunk sizes.
    pub fn reshape_sectors(&self) -> u64 {
        self.old.chunk_sectors.max(self.new.chunk_sectors)
    }

    /// Component sectors both geometries use (rounded down to both chunk sizes).
    pub fn dev_sectors(&self) -> u64 {
        self.old.dev_sectors / self.reshape_sectors() * self.reshape_sectors()
    }

    /// The array size while the reshape runs (md's raid5_size: the smaller shape).
    pub fn array_sectors(&self) -> u64 {
        let dd = self.old.data_disks().min(self.new.data_disks()) as u64;
        self.dev_sectors() * dd
    }

    /// The array size once the reshape is done.
    pub fn new_array_sectors(&self) -> u64 {
        self.dev_sectors() * self.new.data_disks() as u64
    }

    /// Which geometry holds array sector `sector`.
    pub fn side_of(&self, sector: u64) -> Side {
        let ahead = if self.backwards {
            sector < self.position_sectors
        } else {
            sector >= self.position_sectors
        };
        if ahead {
            Side::Old
        } else {
            Side::New
        }
    }

    /// The geometry of one side.
    pub fn geometry(&self, side: Side) -> &ParityGeometry {
        match side {
            Side::Old => &self.old,
            Side::New => &self.new,
        }
    }

    /// md's `recovery_offset` of a member the reshape rebuilds (one that filled an empty
    /// role when the reshape started, md's `raid5_start_reshape`) once `position` is
    /// recorded: the new geometry's member sectors below the position (md's `sector_nr`
    /// in `reshape_request`), which hold whole new stripes on every member. md advances
    /// it only going forwards; backwards it stays where it was (`None`).
    pub fn recovery_offset_at(&self, position: u64) -> Option<u64> {
        (!self.backwards).then(|| position / self.new.data_disks() as u64)
    }

    /// Where a side's data area starts on a member whose superblock says `data_offset`.
    pub fn data_offset_sectors(&self, side: Side, data_offset: u64) -> u64 {
        match side {
            Side::Old => data_offset,
            Side::New => (data_offset as i64 + self.new_offset_sectors) as u64,
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

    /// Where array sector `sector`'s data lives: its side, the member, and the member
    /// sector counted from the start of the device, for members whose superblock says
    /// `data_offset` (md gives all members one).
    pub fn locate(&self, sector: u64, data_offset: u64) -> (Side, crate::MemberIdx, u64) {
        let side = self.side_of(sector);
        let g = self.geometry(side);
        let loc = g.locate(sector);
        let member = g.stripe_map(loc.stripe).data[loc.data_index];
        let at = self.data_offset_sectors(side, data_offset)
            + g.member_sector(loc.stripe, loc.offset_sectors);
        (side, member, at)
    }
}

/// Rewrite `sb` as the superblock of a completed reshape: the new shape (`new`, component
/// size `dev_sectors`), the data offset moved by `new_offset_sectors` (and the data size
/// with it), the reshape fields cleared (md's end of reshape: `reshape_position` gone,
/// `delta_disks` 0, the `new_*` fields equal to the current ones).
pub fn finish_superblock(
    sb: &mut Superblock,
    new: &ParityGeometry,
    dev_sectors: u64,
    new_offset_sectors: i64,
) {
    sb.feature_map &= !(FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET | FEATURE_RESHAPE_BACKWARDS);
    sb.level = new.level.md_level();
    sb.layout = new.algorithm;
    sb.chunksize = new.chunk_sectors as u32;
    sb.raid_disks = new.raid_disks as u32;
    sb.new_level = sb.level;
    sb.new_layout = sb.layout;
    sb.new_chunk = sb.chunksize;
    sb.delta_disks = 0;
    sb.reshape_position = 0;
    sb.new_offset = 0;
    sb.data_offset = (sb.data_offset as i64 + new_offset_sectors) as u64;
    sb.data_size = (sb.data_size as i64 - new_offset_sectors).max(0) as u64;
    sb.size = dev_sectors;
    // A member the reshape rebuilt that holds every row of the new shape is in sync (md's
    // end_reshape); one whose recovery_offset stayed below (it missed rows) goes on
    // recovering from there in the new shape.
    if sb.feature_map & crate::superblock::FEATURE_RECOVERY_OFFSET != 0
        && sb.feature_map & crate::superblock::FEATURE_REPLACEMENT == 0
        && sb.recovery_offset >= dev_sectors
    {
        sb.feature_map &= !crate::superblock::FEATURE_RECOVERY_OFFSET;
        sb.recovery_offset = 0;
    }
    // Roles a shrink removed become spares (md's raid5_finish_reshape).
    for r in sb.dev_roles.iter_mut() {
        if *r < crate::superblock::ROLE_MAX && usize::from(*r) >= new.raid_disks {
            *r = crate::superblock::ROLE_SPARE;
        }
    }
}

/// A superblock recording a reshape whose position already reached its end (written just
/// before the finishing rewrite, which a power cut interrupted) is read as the finished
/// shape it stands for. Returns whether `sb` changed.
pub fn fold_finished(sb: &mut Superblock) -> bool {
    if sb.level == 10 {
        return super::reshape10::fold_finished10(sb);
    }
    match ReshapeState::from_superblock(sb) {
        Ok(Some(st)) if st.is_done() => {
            let new = st.new.clone();
            finish_superblock(sb, &new, st.dev_sectors(), st.new_offset_sectors);
            true
        }
        _ => false,
    }
}

/// The walk of a reshape through its windows, the same for raid4/5/6 ([`ReshapeState`])
/// and raid10 ([`super::Raid10Reshape`]): each gives its next window under its own rule
/// and its sizes; the walk's end, progress, check and bookkeeping are these. The engine's
/// reshape loops (offline and served) run over it.
pub trait ReshapeWalk: Clone {
    /// The next window to copy, given the position `safe` recorded last on the members,
    /// at most `max_sectors` long (each level's inherent `next_step`).
    fn next_step(&self, safe: u64, max_sectors: u64) -> Result<ReshapeStep, GeometryError>;

    /// The reshape's position (array sectors), to move.
    fn position_mut(&mut self) -> &mut u64;

    /// The reshape's position (array sectors).
    fn position(&self) -> u64;

    /// Whether the reshape runs backwards (a shrink, from the end down).
    fn backwards(&self) -> bool;

    /// The array size while the reshape runs.
    fn array_sectors(&self) -> u64;

    /// The array size once the reshape is done.
    fn new_array_sectors(&self) -> u64;

    /// The unit every window is a whole number of (each level's inherent `window_unit`).
    fn window_unit(&self) -> u64;

    /// The position at which every sector is in the new geometry: the new size going
    /// forwards (raid10 writes zeros past the old end where md resyncs them after its
    /// reshape), 0 going backwards (md starts a backwards reshape at the reshaping size).
    fn end_position(&self) -> u64 {
        if self.backwards() {
            0
        } else {
            self.new_array_sectors()
        }
    }

    /// Whether the reshape is complete.
    fn is_done(&self) -> bool {
        self.position() == self.end_position()
    }

    /// How far the reshape has got, in array sectors from where it began (md's reshape
    /// progress): the position going forwards, what lies past it going backwards.
    fn done_sectors(&self) -> u64 {
        if self.backwards() {
            self.array_sectors().saturating_sub(self.position())
        } else {
            self.position()
        }
    }

    /// Whether the reshape can run from its position to the end under the rule, with a
    /// checkpoint wherever one is needed (checked before anything is written: a reshape
    /// that would stop part-way, such as one mdadm protected with a backup file near its
    /// end, is refused whole). The error names the sector it cannot pass.
    fn can_finish(&self) -> Result<(), GeometryError> {
        let mut st = self.clone();
        let mut safe = st.position();
        loop {
            match st.next_step(safe, u64::MAX)? {
                ReshapeStep::Done => return Ok(()),
                ReshapeStep::Checkpoint => safe = st.position(),
                step => st.advance(step),
            }
        }
    }

    /// Record that a window returned by [`ReshapeWalk::next_step`] was copied.
    fn advance(&mut self, step: ReshapeStep) {
        if let ReshapeStep::Copy { start, sectors } = step {
            let backwards = self.backwards();
            *self.position_mut() = if backwards { start } else { start + sectors };
        }
    }
}

/// The trait's view of a type's own fields and sizes.
macro_rules! reshape_walk_fields {
    ($t:ty) => {
        impl $crate::geometry::reshape::ReshapeWalk for $t {
            fn next_step(&self, safe: u64, max_sectors: u64) -> Result<ReshapeStep, GeometryError> {
                <$t>::next_step(self, safe, max_sectors)
            }

            fn position_mut(&mut self) -> &mut u64 {
                &mut self.position_sectors
            }

            fn position(&self) -> u64 {
                self.position_sectors
            }

            fn backwards(&self) -> bool {
                self.backwards
            }

            fn array_sectors(&self) -> u64 {
                <$t>::array_sectors(self)
            }

            fn new_array_sectors(&self) -> u64 {
                <$t>::new_array_sectors(self)
            }

            fn window_unit(&self) -> u64 {
                <$t>::window_unit(self)
            }
        }
    };
}
pub(crate) use reshape_walk_fields;

reshape_walk_fields!(ReshapeState);
