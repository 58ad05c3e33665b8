//! `mdadm --grow` without a restripe: the shape changes that move no data, as md does
//! them, persisted in md's superblocks so that Linux md reads the same array.
//!
//! - raid1 `--raid-devices N`: more mirrors (the new roles stay empty until a spare is
//!   recovered into them) or fewer (md's raid1_reshape: only as many roles as there are
//!   members; members above the new count move down into empty roles, mirrors being alike).
//! - `--size max|SIZE`: the per-member size (md's dev_sectors); a grown region is resynced
//!   (resync_offset is set to the old size, as md's recovery_cp); an internal bitmap is
//!   resized in place, its chunk doubled where the bits would not fit (md_bitmap_resize).
//! - `--bitmap internal|none`: an internal bitmap is added where md puts it for 1.1/1.2
//!   (right after the superblock, in the room before the bad block log or the data; its
//!   area is written, all clean, before any superblock names it), or dropped.
//! - md's takeovers (raid0.c, raid1.c, raid5.c, raid10.c `*_takeover`): raid0 -> raid4/5
//!   (parity-last, the parity role missing), raid4 <-> raid5 (parity-last), raid4/raid5
//!   (parity-last, only the parity role missing) -> raid0, raid1 <-> raid5 with 2 members,
//!   raid5 -> raid6 with the `-6` layouts (Q role missing), raid6 (`-6` layouts,
//!   parity-last) -> raid5, raid0 <-> raid10 near-2.
//!
//! Anything that moves data goes to the restripe engine ([`reshape_members`]) as a
//! [`ReshapeRequest`] (a shrink with the `--array-size` it needs as its confirmation); a
//! raid0 `--raid-devices` grow or shrink or `--chunk` change goes there as mdadm sends it,
//! as a raid4 between two takeovers ([`raid0`]). The takeover of a raid4/5 as raid0 makes
//! the parity member leave the array first, as mdadm's `--level=0` does.
//!
//! Safe at every instant: the new superblocks carry the events count plus one and keep
//! every surviving role's data where it was, so a power cut after some of them were
//! written leaves members one event apart, which assembly accepts (md accepts a member
//! one event behind) under the newest superblock: the new shape, with the same data.
//! Nothing is written before a refusal.

// A raid0's reshapes through raid4: grows, chunk changes, shrinks.
mod raid0;
pub(crate) use raid0::raid0_lacks_devices;

use crate::array::Array;
use crate::assemble::{assemble, AssembleOptions, MemberOutcome};
use crate::error::ArrayError;
use crate::member::Member;
use crate::meta::{read_member_superblock, write_superblock};
use crate::restripe::{reshape_members, ReshapeOptions, ReshapeRequest};
use std::sync::Arc;
use uraid_core::bitmap::{self as bm, BitmapSuper};
use uraid_core::bitmap::{v10_grow_bitmap_offset, v10_grow_bitmap_room};
use uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC;
use uraid_core::geometry::raid5::ALGORITHM_PARITY_N;
use uraid_core::geometry::takeover;
use uraid_core::superblock::{
    MetadataVersion, Superblock, BBLOG_SECTORS, FEATURE_BITMAP_OFFSET, FEATURE_RAID0_LAYOUT,
    ROLE_MAX, ROLE_SPARE,
};
use uraid_core::{Level, MemberIdx};

/// [`GrowState::busy`] of an array in the middle of a reshape.
const RESHAPE_BUSY: &str = "a reshape";

/// Where md puts an internal bitmap on 1.1/1.2: right after the 4 KiB superblock.
const BITMAP_OFFSET_SECTORS: u64 = 8;

/// raid10's near-2 layout (2 near copies, 1 far copy), md's default.
const RAID10_NEAR2: u32 = 0x102;

/// `--size`: md's per-member size (component size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrowSize {
    /// All the space the members have.
    Max,
    /// This many sectors of each member.
    Sectors(u64),
}

/// `--bitmap`: add or drop the internal write-intent bitmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitmapChange {
    /// An internal bitmap where md puts it for the metadata version.
    Internal,
    /// No bitmap.
    None,
}

/// What `uraid grow` (mdadm --grow) asks for; `None` fields stay as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrowRequest {
    /// `--raid-devices`.
    pub raid_disks: Option<usize>,
    /// `--size`.
    pub size: Option<GrowSize>,
    /// `--level`.
    pub level: Option<Level>,
    /// `--layout`, as md's layout number.
    pub layout: Option<u32>,
    /// `--chunk`, in sectors.
    pub chunk_sectors: Option<u64>,
    /// `--bitmap`.
    pub bitmap: Option<BitmapChange>,
    /// `--array-size`, in sectors ([`ARRAY_SIZE_MAX`]: `max`): md's in-memory array size.
    /// Alone, on a served array, it sets the size the array is exported at
    /// ([`crate::Array::set_array_size_limit`]); with the `--raid-devices` of a
    /// raid0/4/5/6/10 shrink it is the confirmation md asks for (the array truncated to the
    /// smaller shape first), which a served array takes from an earlier `--array-size` too.
    pub array_sectors: Option<u64>,
}

/// What a grow did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowReport {
    /// One line in md's words: what changed.
    pub summary: String,
    /// The events count of the new superblocks (unchanged when nothing was written).
    pub events: u64,
    /// Roles of the new shape that have no member yet (a spare recovers them).
    pub missing_roles: Vec<usize>,
    /// Whether the change was handed to the restripe engine instead.
    pub restripe: bool,
    /// What the restripe engine did (offline grows that restripe).
    pub reshape: Option<crate::restripe::ReshapeReport>,
}

/// The array as planning needs to see it: pure input, so the rules are tested without
/// disks.
#[derive(Clone, Debug)]
pub(crate) struct GrowState {
    /// The freshest superblock.
    pub template: Superblock,
    /// Roles with an in-sync member.
    pub present: Vec<usize>,
    /// A recovery, replace or owed resync is under way.
    pub busy: Option<&'static str>,
    /// raid0: each role's data sectors rounded to the chunk (the zones).
    pub raid0_member_sectors: Vec<u64>,
    /// The most sectors every present member could give (`--size max`).
    pub max_dev_sectors: u64,
    /// Metadata 0.90.
    pub is_090: bool,
    /// A write journal.
    pub journal: bool,
    /// Sectors every present member has for a bitmap: 1.1/1.2 between the end of its
    /// superblock (8 sectors) and its bad block log or data; 1.0 between the data's end
    /// and the bad block log below the superblock (mdadm's room, [`v10_grow_bitmap_room`]).
    pub bitmap_room_sectors: u64,
    /// 1.0: the bad block log's sectors below the superblock (the bitmap ends there), or
    /// `None` when a member has under 6 sectors there (mdadm's bitmap after the
    /// superblock, which uraid does not write).
    pub v10_bitmap_log: Option<Option<u64>>,
    /// The array's size in sectors (what a raid10 bitmap covers).
    pub array_sectors: u64,
    /// The internal bitmap's superblock, and the sectors its area may take on every
    /// present member (to the nearest of the bad block log, the data or the superblock
    /// above its start): what a resize has to fit in.
    pub bitmap: Option<(BitmapSuper, u64)>,
}

/// A superblock rewrite: the new array-wide fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    level: Level,
    layout: u32,
    chunk_sectors: u64,
    raid_disks: usize,
    dev_sectors: u64,
    /// Old role -> new role; `None`: the device becomes a spare.
    role_map: Vec<Option<usize>>,
    /// Set resync_offset (a grown region to resync).
    resync_from: Option<u64>,
    drop_bitmap: bool,
    /// A new internal bitmap and its `bitmap_offset` (8 sectors after a 1.1/1.2
    /// superblock, before a 1.0 one).
    add_bitmap: Option<Box<(BitmapSuper, i32)>>,
    /// The internal bitmap's new sync size and chunk bytes (a `--size` change): the bits
    /// of the old range kept (merged where the chunk grew), those of a grown range set
    /// (its resync must not skip them).
    resize_bitmap: Option<(u64, u32)>,
    /// md's takeover of a raid4/5 as raid0: only the data roles stay (a parity member and
    /// spares leave, recorded faulty) and each member's `data_size` becomes the component
    /// size, both written first as a raid4/5 record ([`raid0::leave_for_raid0`]).
    to_raid0: bool,
    summary: String,
}

impl Change {
    /// The (level, layout, raid_disks) the change leaves.
    pub(crate) fn shape(&self) -> (Level, u32, usize) {
        (self.level, self.layout, self.raid_disks)
    }
}

/// What [`plan`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Superblocks(Change),
    Restripe(ReshapeRequest),
    /// raid0 `--raid-devices N` (more) and `--chunk`: md's way through raid4
    /// ([`raid0::grow_raid0`]): the new device count and the new chunk (`None`: as it is).
    Raid0Grow(usize, Option<u64>),
    /// raid0 `--raid-devices N` (fewer) with `--array-size`: md's way through raid4
    /// ([`raid0::shrink_raid0`]): the new device count and the sectors kept.
    Raid0Shrink(usize, u64),
    Nothing(String),
}

fn refuse(msg: impl Into<String>) -> ArrayError {
    ArrayError::Refused(msg.into())
}

/// Decide a grow from the array's state, or refuse it with md's reason.
pub(crate) fn plan(st: &GrowState, req: &GrowRequest) -> Result<Plan, ArrayError> {
    let t = &st.template;
    let level = Level::from_md(t.level).ok_or_else(|| refuse("unknown level"))?;
    let n = t.raid_disks as usize;
    let chunk = u64::from(t.chunksize);
    if *req == GrowRequest::default() {
        return Err(refuse(
            "nothing to change: give --raid-devices, --size, --level, --layout, --chunk or --bitmap",
        ));
    }
    let restripe = req.raid_disks.is_some_and(|d| d != n)
        || req.level.is_some()
        || req.layout.is_some()
        || req.chunk_sectors.is_some();
    if st.is_090 && restripe {
        return Err(refuse(format!(
            "{}: nothing was written",
            crate::restripe::RESHAPE_090_REFUSAL
        )));
    }
    if st.is_090 {
        return Err(refuse(
            "uraid grow rewrites 1.x superblocks only; this array has 0.90 metadata: use mdadm --grow",
        ));
    }
    if st.journal {
        return Err(refuse(
            "the array has a write journal, and md does not reshape a journalled array",
        ));
    }
    if let Some(why) = st.busy {
        // md: a reshape cannot start while a sync runs (EBUSY), nor a takeover while a
        // reshape does.
        let how = if why == RESHAPE_BUSY {
            "uraid grow --continue on the members of a stopped array; a served one goes on \
             by itself"
        } else {
            "uraid wait"
        };
        return Err(refuse(format!(
            "{why} is in progress: let it finish ({how}) and grow then; nothing was written"
        )));
    }
    let shape = req.raid_disks.is_some()
        || req.level.is_some()
        || req.layout.is_some()
        || req.chunk_sectors.is_some();
    if req.bitmap.is_some() && (shape || req.size.is_some()) {
        return Err(refuse(
            "--bitmap must be the only change of one grow (as mdadm)",
        ));
    }
    if req.size.is_some() && shape {
        return Err(refuse(
            "--size cannot be combined with a change of level, devices, layout or chunk: grow one at a time",
        ));
    }
    if req.only_array_size() {
        return Err(refuse(
            "--array-size on its own sets md's in-memory size of a running array, and this \
             one is not served: serve it and give --array-size with --control (or give it \
             with the --raid-devices of a shrink); nothing was written",
        ));
    }
    if req.array_sectors == Some(ARRAY_SIZE_MAX) {
        return Err(refuse(
            "--array-size max restores a served array's full size; with another change it \
             confirms nothing: give the size the shrink keeps; nothing was written",
        ));
    }
    if req.array_sectors.is_some()
        && !((level.has_parity() || level == Level::Raid10 || level == Level::Raid0)
            && req.raid_disks.is_some_and(|d| d < n)
            && req.level.is_none_or(|l| l == level))
    {
        return Err(refuse(
            "--array-size: uraid keeps no in-memory array size (md's array_size), so it \
             takes --array-size only with the --raid-devices of a raid0/4/5/6/10 shrink, as the \
             confirmation that the data past the smaller shape goes; nothing was written",
        ));
    }
    let same = |role_map: Vec<Option<usize>>| Change {
        level,
        layout: t.layout,
        chunk_sectors: chunk,
        raid_disks: n,
        dev_sectors: t.size,
        role_map,
        resync_from: None,
        drop_bitmap: false,
        add_bitmap: None,
        resize_bitmap: None,
        to_raid0: false,
        summary: String::new(),
    };
    let identity: Vec<Option<usize>> = (0..n).map(Some).collect();
    if let Some(b) = req.bitmap {
        let has = t.feature_map & FEATURE_BITMAP_OFFSET != 0;
        return match b {
            BitmapChange::None if !has => Ok(Plan::Nothing("the array has no bitmap".into())),
            BitmapChange::None => Ok(Plan::Superblocks(Change {
                drop_bitmap: true,
                summary: "internal bitmap removed".into(),
                ..same(identity)
            })),
            BitmapChange::Internal if has => Ok(Plan::Nothing(
                "the array has an internal bitmap already".into(),
            )),
            BitmapChange::Internal => plan_add_bitmap(st, level).map(|b| {
                Plan::Superblocks(Change {
                    summary: format!("internal bitmap added (chunk {}K)", b.0.chunksize / 1024),
                    add_bitmap: Some(Box::new(b)),
                    ..same(identity)
                })
            }),
        };
    }
    if let Some(size) = req.size {
        return plan_size(st, level, size, same(identity));
    }
    let new_level = req.level.unwrap_or(level);
    if new_level != level {
        return plan_takeover(st, level, new_level, req, &same);
    }
    // The same level: raid1 changes its mirror count; anything else moves data.
    if level == Level::Raid1 {
        if req.layout.is_some() || req.chunk_sectors.is_some() {
            return Err(refuse("raid1 has no layout or chunk to change"));
        }
        let want = req.raid_disks.expect("a shape change");
        return plan_raid1_disks(st, want, same);
    }
    let changes = req.raid_disks.is_some_and(|d| d != n)
        || req.layout.is_some_and(|l| l != t.layout)
        || req.chunk_sectors.is_some_and(|c| c != chunk);
    if !changes {
        return Ok(Plan::Nothing(format!("{level} already has this shape")));
    }
    if level == Level::Raid0 {
        // mdadm restripes a raid0 as a degraded raid4 (analyse_change: raid0 reshapes at
        // level 4), and so does uraid: more devices, fewer, another chunk.
        return raid0::plan_raid0(st, req);
    }
    let shrink = req.raid_disks.is_some_and(|d| d < n);
    if shrink && req.array_sectors.is_none() && level.has_parity() {
        let p = if level == Level::Raid6 { 2 } else { 1 };
        let want = req.raid_disks.unwrap_or(n);
        let keeps = (t.size * want.saturating_sub(p) as u64) / 2;
        return Err(refuse(format!(
            "shrinking a {level} from {n} to {want} devices reduces the array to at most \
             {keeps}K: give --array-size SIZE (at most {keeps}K) with --raid-devices to confirm \
             that the data past it goes (mdadm: \"use --grow --array-size first to truncate \
             array\"); nothing was written"
        )));
    }
    Ok(Plan::Restripe(ReshapeRequest {
        level: None,
        raid_disks: req.raid_disks.filter(|&d| d != n),
        chunk_sectors: req.chunk_sectors.filter(|&c| c != chunk),
        layout: req.layout.filter(|&l| l != t.layout),
        array_sectors: req.array_sectors.filter(|_| shrink),
    }))
}

fn plan_raid1_disks(
    st: &GrowState,
    want: usize,
    same: impl Fn(Vec<Option<usize>>) -> Change,
) -> Result<Plan, ArrayError> {
    let n = st.template.raid_disks as usize;
    if want == n {
        return Ok(Plan::Nothing(format!("raid1 has {n} devices already")));
    }
    if want == 0 {
        return Err(refuse("raid1 needs at least 1 device"));
    }
    // md's raid1_reshape: no more members than roles (EBUSY).
    if st.present.len() > want {
        return Err(refuse(format!(
            "raid1 has {} active members, more than {want}: fail and remove members first \
             (uraid fail, uraid remove), then shrink",
            st.present.len()
        )));
    }
    // Members above the new count move down into the empty roles, in order.
    let mut free = (0..want).filter(|r| !st.present.contains(r));
    let role_map: Vec<Option<usize>> = (0..n)
        .map(|r| {
            if !st.present.contains(&r) {
                None
            } else if r < want {
                Some(r)
            } else {
                free.next()
            }
        })
        .collect();
    Ok(Plan::Superblocks(Change {
        raid_disks: want,
        summary: format!("raid1 raid-devices {n} -> {want}"),
        ..same(role_map)
    }))
}

fn plan_add_bitmap(st: &GrowState, level: Level) -> Result<(BitmapSuper, i32), ArrayError> {
    let t = &st.template;
    if level == Level::Raid0 {
        return Err(refuse(
            "raid0 has no redundancy, so it cannot have a bitmap",
        ));
    }
    let v10_log = match st.v10_bitmap_log {
        Some(None) => {
            return Err(refuse(
                "a member has under 6 sectors between its data and its 1.0 superblock, so \
                 mdadm would put the bitmap in the 3 KiB after the superblock, which uraid \
                 does not write: nothing was written; use mdadm --grow --bitmap=internal",
            ))
        }
        Some(Some(log)) => Some(log),
        None => None,
    };
    // md's bitmap covers member sectors, except for raid10 where it covers the array.
    let sync_size = if level == Level::Raid10 {
        st.array_sectors
    } else {
        t.size
    };
    let chunk = bm::default_chunk_bytes(sync_size, st.bitmap_room_sectors).ok_or_else(|| {
        refuse(format!(
            "no room for an internal bitmap: {} sectors between the superblock and the data",
            st.bitmap_room_sectors
        ))
    })?;
    let b = BitmapSuper::new(t.set_uuid, sync_size, chunk, bm::DEFAULT_DAEMON_SLEEP_SECS)
        .map_err(|e| refuse(format!("bitmap: {e}")))?;
    let Some(log) = v10_log else {
        if b.space_bytes() / 512 > st.bitmap_room_sectors {
            return Err(refuse("the bitmap does not fit before the data"));
        }
        return Ok((b, BITMAP_OFFSET_SECTORS as i32));
    };
    // 1.0: below the superblock and its bad block log, above the data.
    let offset = v10_grow_bitmap_offset(sync_size, chunk, log)
        .ok_or_else(|| refuse("bitmap: offset out of range"))?;
    let area = u64::from(offset.unsigned_abs()) - log;
    if area > st.bitmap_room_sectors || b.space_bytes() / 512 > area {
        return Err(refuse(format!(
            "the bitmap ({area} sectors) does not fit between the data and the 1.0 \
             superblock's bad block log ({} sectors)",
            st.bitmap_room_sectors
        )));
    }
    Ok((b, offset))
}

fn plan_size(
    st: &GrowState,
    level: Level,
    size: GrowSize,
    base: Change,
) -> Result<Plan, ArrayError> {
    let t = &st.template;
    if level == Level::Raid0 {
        // md's raid0 has no resize: it always uses all of each member.
        return Err(refuse(
            "raid0 has no --size to change: it uses all of each member",
        ));
    }
    // md's raid10_resize: a far layout's copies sit at a distance set by the size.
    if level == Level::Raid10 && (t.layout >> 8) & 0xff > 1 && t.layout & 0x10000 == 0 {
        return Err(refuse(
            "md cannot resize a raid10 with the far layout: its far copies sit at a distance \
             set by the size",
        ));
    }
    let with_bitmap = t.feature_map & FEATURE_BITMAP_OFFSET != 0;
    let round = |s: u64| {
        if level == Level::Raid1 || t.chunksize == 0 {
            s
        } else {
            s / u64::from(t.chunksize) * u64::from(t.chunksize)
        }
    };
    let max = round(st.max_dev_sectors);
    let want = match size {
        GrowSize::Max => max,
        GrowSize::Sectors(s) if round(s) > max => {
            return Err(refuse(format!(
                "--size {s} sectors is beyond the members: each can give at most {max} sectors \
                 (--size max)"
            )))
        }
        GrowSize::Sectors(s) => round(s),
    };
    if want == 0 {
        return Err(refuse("--size 0 would leave no data: give a size or max"));
    }
    if want == t.size {
        return Ok(Plan::Nothing(format!("the size is {want} sectors already")));
    }
    // The bitmap keeps its place, and its chunk when the bits fit the room it has; when
    // they do not, the chunk doubles until they do, as md's md_bitmap_resize does (each new
    // bit covers the old bits it merges; a dirty one keeps it dirty).
    let mut summary = format!("component size {} -> {want} sectors", t.size);
    let resize_bitmap = if with_bitmap {
        let Some((b, space)) = &st.bitmap else {
            return Err(refuse("the array's internal bitmap could not be read"));
        };
        let room = if b.sectors_reserved != 0 {
            (*space).min(u64::from(b.sectors_reserved))
        } else {
            *space
        };
        // A raid10's bitmap counts array sectors (md's resync_max_sectors), the mirrors'
        // and parity levels' member sectors.
        let bits_for = if level == Level::Raid10 {
            raid10_array_sectors(t, want)?
        } else {
            want
        };
        let Some(chunk) = crate::bitmap::bitmap_chunk_for(bits_for, b.chunksize, room) else {
            return Err(refuse(format!(
                "the internal bitmap would need more than its {room} sectors even at a chunk \
                 of {}M for the new size: remove it (uraid grow --bitmap none), change the \
                 size, then add it again",
                crate::bitmap::MAX_BITMAP_CHUNK_BYTES >> 20
            )));
        };
        let want = bits_for;
        if chunk != b.chunksize {
            summary.push_str(&format!(
                ", bitmap chunk {}K -> {}K",
                b.chunksize / 1024,
                chunk / 1024
            ));
        }
        Some((want, chunk))
    } else {
        None
    };
    // md resyncs a grown region from the old end (recovery_cp), unless a resync was
    // owed from further down already; a raid10's resync counts array sectors.
    let old_end = if level == Level::Raid10 {
        raid10_array_sectors(t, t.size)?
    } else {
        t.size
    };
    let resync_from = (want > t.size).then(|| t.resync_offset.min(old_end));
    Ok(Plan::Superblocks(Change {
        dev_sectors: want,
        resync_from,
        resize_bitmap,
        summary,
        ..base
    }))
}

fn plan_takeover(
    st: &GrowState,
    from: Level,
    to: Level,
    req: &GrowRequest,
    same: &dyn Fn(Vec<Option<usize>>) -> Change,
) -> Result<Plan, ArrayError> {
    let t = &st.template;
    let n = t.raid_disks as usize;
    let missing: Vec<usize> = (0..n).filter(|r| !st.present.contains(r)).collect();
    let identity: Vec<Option<usize>> = (0..n).map(Some).collect();
    let raid0_single_zone = || raid0::one_zone_sectors(st);
    let change = match (from, to) {
        (Level::Raid0, Level::Raid4 | Level::Raid5) => Change {
            level: to,
            layout: if to == Level::Raid4 {
                0
            } else {
                ALGORITHM_PARITY_N
            },
            raid_disks: n + 1,
            dev_sectors: raid0_single_zone()?,
            summary: format!("raid0 -> {to} (parity-last), parity role {n} missing"),
            ..same(identity)
        },
        (Level::Raid4, Level::Raid5) => Change {
            level: to,
            layout: ALGORITHM_PARITY_N,
            summary: "raid4 -> raid5 (parity-last)".into(),
            ..same(identity)
        },
        (Level::Raid5, Level::Raid4) if t.layout == ALGORITHM_PARITY_N => Change {
            level: to,
            layout: 0,
            summary: "raid5 (parity-last) -> raid4".into(),
            ..same(identity)
        },
        (Level::Raid5, Level::Raid4) => {
            return restripe_or_refuse(
                req,
                to,
                "raid5 becomes raid4 only from the parity-last layout",
            )
        }
        (Level::Raid4 | Level::Raid5, Level::Raid0) => {
            // md's raid0_takeover_raid45: parity-last, degraded by exactly its parity role
            // (the last); the data roles keep their places.
            if from == Level::Raid5 && t.layout != ALGORITHM_PARITY_N {
                return restripe_or_refuse(
                    req,
                    to,
                    "md takes over a raid5 as raid0 only from the parity-last layout",
                );
            }
            // mdadm's --level=0 fails and removes the parity member first (Grow.c
            // impose_level); md then needs every data role.
            let lost: Vec<String> = missing
                .iter()
                .filter(|&&r| r < n - 1)
                .map(|r| r.to_string())
                .collect();
            if !lost.is_empty() {
                return Err(refuse(format!(
                    "md takes over a {from} as raid0 only with every data role present (roles \
                     0 to {}; its parity role {} leaves); missing now: {}: recover the data \
                     roles first: nothing was written",
                    n - 2,
                    n - 1,
                    lost.join(", ")
                )));
            }
            // md's raid0 runs no bitmap (raid0_run refuses one).
            if t.feature_map & FEATURE_BITMAP_OFFSET != 0 {
                return Err(refuse(format!(
                    "the {from} has an internal bitmap, and md's raid0 runs without one: \
                     remove it first (uraid grow --bitmap none), then --level 0: nothing was \
                     written"
                )));
            }
            let summary = if missing.is_empty() {
                format!(
                    "{from} -> raid0: the parity member (role {}) leaves the array, recorded \
                     faulty, as mdadm --grow --level=0 fails and removes it",
                    n - 1
                )
            } else {
                format!("{from} -> raid0, parity role {} dropped", n - 1)
            };
            Change {
                level: to,
                layout: 0,
                raid_disks: n - 1,
                to_raid0: true,
                summary,
                ..same((0..n - 1).map(Some).collect())
            }
        }
        (Level::Raid1, Level::Raid5) => {
            // md's raid5_takeover_raid1.
            if n != 2 {
                return Err(refuse(format!(
                    "md takes over a raid1 as raid5 only with 2 devices; this one has {n}: \
                     grow it to 2 first (--raid-devices 2)"
                )));
            }
            let chunk = takeover::raid1_to_raid5_chunk_sectors(t.size).ok_or_else(|| {
                refuse(format!(
                    "the raid1's size ({} sectors) is not a multiple of 4 KiB: md cannot take it over",
                    t.size
                ))
            })?;
            Change {
                level: to,
                layout: ALGORITHM_LEFT_SYMMETRIC,
                chunk_sectors: chunk,
                summary: format!("raid1 -> raid5 (left-symmetric, chunk {}K)", chunk / 2),
                ..same(identity)
            }
        }
        (Level::Raid5, Level::Raid1) => {
            if n != 2 {
                return Err(refuse(format!(
                    "md takes over a raid5 as raid1 only with 2 devices; this one has {n}: \
                     reshape it to 2 first"
                )));
            }
            Change {
                level: to,
                layout: 0,
                chunk_sectors: 0,
                summary: "raid5 -> raid1".into(),
                ..same(identity)
            }
        }
        (Level::Raid5, Level::Raid6) => {
            let layout = takeover::raid6_layout_of_raid5(t.layout).ok_or_else(|| {
                refuse(format!(
                    "md has no raid6 layout for raid5 layout {}",
                    t.layout
                ))
            })?;
            Change {
                level: to,
                layout,
                raid_disks: n + 1,
                summary: format!(
                    "raid5 -> raid6 ({}), Q role {n} missing",
                    uraid_core::geometry::raid5::layout_name(layout).unwrap_or("?")
                ),
                ..same(identity)
            }
        }
        (Level::Raid6, Level::Raid5) => {
            let layout = takeover::raid5_layout_of_raid6(t.layout).ok_or_else(|| {
                refuse(format!(
                    "md turns a raid6 into raid5 only from the -6 layouts or parity-last, whose \
                     last device holds only Q; layout {} needs a restripe",
                    uraid_core::geometry::raid5::layout_name(t.layout).unwrap_or("?")
                ))
            })?;
            // Without its Q role, the raid5 must still hold the data.
            if missing.iter().filter(|&&r| r < n - 1).count() > 1 {
                return Err(refuse(
                    "the raid6 misses two data/P members: without Q it would lose data; recover first",
                ));
            }
            let mut role_map = identity.clone();
            role_map[n - 1] = None;
            Change {
                level: to,
                layout,
                raid_disks: n - 1,
                summary: format!("raid6 -> raid5, role {} (Q) becomes a spare", n - 1),
                ..same(role_map)
            }
        }
        (Level::Raid0, Level::Raid10) => {
            // md's raid10_takeover_raid0: near-2, each raid0 member the first copy of a pair.
            let dev_sectors = raid0_single_zone()?;
            Change {
                level: to,
                layout: RAID10_NEAR2,
                raid_disks: 2 * n,
                dev_sectors,
                role_map: (0..n).map(|r| Some(2 * r)).collect(),
                summary: format!(
                    "raid0 -> raid10 (near=2), roles {} missing",
                    (0..n)
                        .map(|r| (2 * r + 1).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                ..same(Vec::new())
            }
        }
        (Level::Raid10, Level::Raid0) => {
            // md's raid0_takeover_raid10: near-2 only, and "all mirrors must be already
            // degraded": one member of each pair.
            if t.layout != RAID10_NEAR2 || !n.is_multiple_of(2) {
                return Err(refuse(
                    "md takes over a raid10 as raid0 only from the near=2 layout with an even \
                     number of devices",
                ));
            }
            let mut role_map = vec![None; n];
            for pair in 0..n / 2 {
                let here: Vec<usize> = [2 * pair, 2 * pair + 1]
                    .into_iter()
                    .filter(|r| st.present.contains(r))
                    .collect();
                if here.len() != 1 {
                    return Err(refuse(format!(
                        "md takes over a raid10 as raid0 only when all mirrors are already \
                         degraded; roles {} and {} are both {}: fail and remove one of each pair first",
                        2 * pair,
                        2 * pair + 1,
                        if here.is_empty() { "missing" } else { "present" }
                    )));
                }
                role_map[here[0]] = Some(pair);
            }
            Change {
                level: to,
                layout: 0,
                raid_disks: n / 2,
                summary: "raid10 (near=2) -> raid0".into(),
                ..same(role_map)
            }
        }
        _ => {
            return restripe_or_refuse(req, to, &format!("md has no takeover from {from} to {to}"))
        }
    };
    // A takeover and a restripe after it in one request go to the restripe engine whole.
    let after = req.raid_disks.is_some_and(|d| d != change.raid_disks)
        || req.layout.is_some_and(|l| l != change.layout)
        || req.chunk_sectors.is_some_and(|c| c != change.chunk_sectors);
    if after {
        if !matches!(to, Level::Raid4 | Level::Raid5 | Level::Raid6) {
            return Err(refuse(format!(
                "{from} -> {to} with another layout, chunk or device count is not something md does"
            )));
        }
        return Ok(Plan::Restripe(ReshapeRequest {
            level: Some(to),
            raid_disks: req.raid_disks,
            chunk_sectors: req.chunk_sectors,
            layout: req.layout,
            array_sectors: None,
        }));
    }
    Ok(Plan::Superblocks(change))
}

/// A level change without a takeover is a restripe where md restripes one (raid4/5/6 to
/// raid4/5/6), else md's refusal.
fn restripe_or_refuse(req: &GrowRequest, to: Level, why: &str) -> Result<Plan, ArrayError> {
    if matches!(to, Level::Raid4 | Level::Raid5 | Level::Raid6) {
        return Ok(Plan::Restripe(ReshapeRequest {
            level: Some(to),
            raid_disks: req.raid_disks,
            chunk_sectors: req.chunk_sectors,
            layout: req.layout,
            array_sectors: None,
        }));
    }
    Err(refuse(format!("{why}: nothing was written")))
}

impl Change {
    /// One device's new superblock: the array-wide fields, roles and events.
    fn apply(&self, sb: &Superblock, events: u64, dev_sectors: u64, utime: u64) -> Superblock {
        let mut n = sb.clone();
        n.level = self.level.md_level();
        n.layout = self.layout;
        n.chunksize = self.chunk_sectors as u32;
        n.raid_disks = self.raid_disks as u32;
        n.size = self.dev_sectors;
        n.events = events;
        n.utime = utime;
        for r in n.dev_roles.iter_mut() {
            if *r < ROLE_MAX {
                *r = match self.role_map.get(usize::from(*r)).copied().flatten() {
                    Some(new) => new as u16,
                    None => ROLE_SPARE,
                };
            }
        }
        if self.level != Level::Raid0 {
            n.feature_map &= !FEATURE_RAID0_LAYOUT;
        }
        // md's raid0_takeover_raid45 sets each member's size to the component size.
        if self.to_raid0 {
            n.data_size = n.data_size.min(self.dev_sectors);
        }
        if self.drop_bitmap {
            n.feature_map &= !FEATURE_BITMAP_OFFSET;
            n.bitmap_offset = 0;
        }
        if let Some(&(_, offset)) = self.add_bitmap.as_deref() {
            n.feature_map |= FEATURE_BITMAP_OFFSET;
            n.bitmap_offset = offset;
        }
        if let Some(from) = self.resync_from {
            n.resync_offset = from;
        }
        // A member that grew (1.1/1.2: data from data_offset to the end) offers it.
        if self.dev_sectors > n.data_size && sb.version() != MetadataVersion::V1_0 {
            n.data_size = dev_sectors.saturating_sub(n.data_offset);
        }
        n
    }
}

/// The sectors a member can give from its data offset: to its end for 1.1/1.2 (the
/// superblock sits before the data), its recorded data_size for 1.0 (the superblock at
/// the end stays where it is).
fn available_sectors(sb: &Superblock, dev: &dyn Member) -> u64 {
    if sb.version() == MetadataVersion::V1_0 {
        sb.data_size
    } else {
        (dev.size_bytes() / 512)
            .saturating_sub(sb.data_offset)
            .max(sb.data_size)
    }
}

/// The size of the raid10 `t` describes with a component size of `dev_sectors` (md's
/// raid10_size), in array sectors.
fn raid10_array_sectors(t: &Superblock, dev_sectors: u64) -> Result<u64, ArrayError> {
    let g = uraid_core::geometry::ArrayGeometry {
        level: Level::Raid10,
        layout: t.layout,
        chunk_sectors: u64::from(t.chunksize),
        raid_disks: t.raid_disks as usize,
        dev_sectors,
        member_sectors: Vec::new(),
    };
    Ok(uraid_core::geometry::Raid10::new(&g)?.array_sectors())
}

impl GrowRequest {
    /// Whether the request is `--array-size` and nothing else (md's in-memory size).
    pub fn only_array_size(&self) -> bool {
        self.array_sectors.is_some()
            && GrowRequest {
                array_sectors: None,
                ..self.clone()
            } == GrowRequest::default()
    }
}

/// [`GrowRequest::array_sectors`] for `--array-size max` (md's `max`: the whole array
/// again).
pub const ARRAY_SIZE_MAX: u64 = u64::MAX;

impl Array {
    /// What planning needs to know about this array.
    pub(crate) fn grow_state(&self) -> GrowState {
        let meta = self.meta();
        let present: Vec<usize> = (0..self.raid_disks())
            .filter(|&r| self.live(MemberIdx(r)).is_some())
            .collect();
        let reshaping = self.is_reshaping()
            || meta.template().feature_map & uraid_core::superblock::FEATURE_RESHAPE_ACTIVE != 0;
        let busy = if reshaping {
            Some(RESHAPE_BUSY)
        } else if !self.recovering_roles().is_empty() {
            Some("a recovery")
        } else if !self.replacing_roles().is_empty() {
            Some("a replace")
        } else if meta.needs_resync() {
            Some("a resync")
        } else {
            None
        };
        let max_dev_sectors = present
            .iter()
            .filter_map(|&r| {
                let sb = meta.member_sb(MemberIdx(r))?;
                let dev = self.slot(MemberIdx(r)).device()?;
                Some(available_sectors(sb, dev.as_ref()))
            })
            .min()
            .unwrap_or(0);
        let sbs: Vec<&Superblock> = present
            .iter()
            .filter_map(|&r| meta.member_sb(MemberIdx(r)))
            .collect();
        let v10_bitmap_log = (meta.template().version() == MetadataVersion::V1_0).then(|| {
            sbs.iter()
                .map(|sb| v10_grow_bitmap_room(sb).map(|(_, log)| log))
                .collect::<Option<Vec<u64>>>()
                .map(|logs| logs.into_iter().max().unwrap_or(u64::from(BBLOG_SECTORS)))
        });
        let bitmap_room_sectors = sbs
            .iter()
            .map(|sb| {
                if sb.version() == MetadataVersion::V1_0 {
                    // Every member's bitmap ends where the longest log begins.
                    let longest = v10_bitmap_log.flatten().unwrap_or(0);
                    return v10_grow_bitmap_room(sb)
                        .map_or(0, |(room, log)| (room + log).saturating_sub(longest));
                }
                let end = if sb.bblog_size != 0 && sb.bblog_offset > 0 {
                    sb.super_offset + sb.bblog_offset as u64
                } else {
                    sb.data_offset
                };
                end.saturating_sub(sb.super_offset + BITMAP_OFFSET_SECTORS)
            })
            .min()
            .unwrap_or(0);
        let bitmap = meta.bitmap.as_ref().map(|b| {
            let space = sbs
                .iter()
                .map(|sb| crate::bitmap::bitmap_space_sectors(sb, meta.is_090()))
                .min()
                .unwrap_or(0);
            (b.sb.clone(), space)
        });
        GrowState {
            bitmap,
            bitmap_room_sectors,
            v10_bitmap_log,
            array_sectors: self.personality().array_sectors(),
            template: meta.template().clone(),
            present,
            busy,
            raid0_member_sectors: self.geometry().member_sectors.clone(),
            max_dev_sectors,
            is_090: meta.is_090(),
            journal: meta.journal.is_some(),
        }
    }
}

/// `mdadm --grow` on the members of an array that is not running: assemble it, plan the
/// change (refusing with md's reason before anything is written), then rewrite every
/// member's superblock (events + 1, flushed one by one). A restripe runs in the restripe
/// engine ([`reshape_members`]) with default options (no devices to add).
pub fn grow_members(
    devs: Vec<Arc<dyn Member>>,
    req: &GrowRequest,
) -> Result<GrowReport, ArrayError> {
    grow_members_with(devs, req, ReshapeOptions::default())
}

/// [`grow_members`] with the options a restripe runs under: the devices for new roles,
/// the speed limit, progress, a stopping point.
pub fn grow_members_with(
    devs: Vec<Arc<dyn Member>>,
    req: &GrowRequest,
    reshape: ReshapeOptions,
) -> Result<GrowReport, ArrayError> {
    let (array, report) = assemble(devs.clone(), &AssembleOptions::default())?;
    let st = array.grow_state();
    let utime = array.now_secs() & ((1 << 40) - 1);
    if raid6_needs_restripe_to_become_raid5(array.level(), &st, req) {
        return restripe_then_takeover(array, devs, &st, req, reshape);
    }
    let planned = array.check_writable("grow").and_then(|()| plan(&st, req));
    let events = array.meta().events();
    let c = match planned {
        Err(e) => {
            array.stop()?;
            return Err(e);
        }
        Ok(Plan::Nothing(why)) => {
            array.stop()?;
            return Ok(GrowReport {
                summary: format!("nothing to change: {why}"),
                events,
                missing_roles: Vec::new(),
                restripe: false,
                reshape: None,
            });
        }
        Ok(Plan::Raid0Grow(want, chunk)) => {
            return raid0::grow_raid0(array, devs, &report, &st, (want, chunk), reshape, utime);
        }
        Ok(Plan::Raid0Shrink(want, keep)) => {
            return raid0::shrink_raid0(array, devs, &report, &st, (want, keep), reshape, utime);
        }
        Ok(Plan::Restripe(r)) if r.level.is_some_and(|l| l != array.level()) => {
            return takeover_then_restripe(array, devs, &report, &st, &r, reshape, (utime, true));
        }
        Ok(Plan::Restripe(r)) => {
            array.stop()?;
            drop(array);
            let done = reshape_members(devs, &r, reshape)?;
            return Ok(GrowReport {
                summary: done.summary.clone(),
                events: done.events,
                missing_roles: Vec::new(),
                restripe: true,
                reshape: Some(done),
            });
        }
        Ok(Plan::Superblocks(c)) => c,
    };
    array.stop()?;
    drop(array);
    rewrite_superblocks(&devs, &report, &st, c, utime)
}

/// md's way to a restripe at another level (mdadm --grow --level 6 --layout ... or with
/// more devices): the takeover first (a superblock rewrite, its new role missing), that
/// role rebuilt onto a spare or the first --add (unless `rebuild` is false: a raid0's
/// chunk change restripes its raid4 with the parity role missing), then the restripe
/// within the new level. Every step ends in an array md assembles; everything the steps will refuse is checked
/// before the first is written.
fn takeover_then_restripe(
    array: Array,
    devs: Vec<Arc<dyn Member>>,
    report: &crate::assemble::AssembleReport,
    st: &GrowState,
    r: &ReshapeRequest,
    mut reshape: ReshapeOptions,
    (utime, rebuild): (u64, bool),
) -> Result<GrowReport, ArrayError> {
    let from = array.level();
    let to = r.level.expect("a level change");
    let take = match plan(
        st,
        &GrowRequest {
            level: Some(to),
            ..Default::default()
        },
    ) {
        Ok(Plan::Superblocks(c)) => Ok(c),
        Ok(_) => Err(refuse(format!(
            "md has no takeover from {from} to {to} to start the restripe from: nothing was written"
        ))),
        Err(e) => Err(e),
    };
    let then = ReshapeRequest {
        level: None,
        ..r.clone()
    };
    let pre = match &take {
        Ok(c) => crate::restripe::precheck_after_takeover(
            &array,
            report,
            &then,
            &reshape.add,
            (c.level, c.layout, c.raid_disks),
            (reshape.force, rebuild),
        ),
        Err(_) => Ok(()),
    };
    array.stop()?;
    drop(array);
    let c = take?;
    pre?;
    let took = rewrite_superblocks(&devs, report, st, c, utime)?;
    let (array, _) = assemble(devs.clone(), &AssembleOptions::default())?;
    let mut all = devs;
    let mut adds = std::mem::take(&mut reshape.add);
    let mut added = 0;
    for _ in took.missing_roles.iter().filter(|_| rebuild) {
        if array.activate_spare()?.is_none() {
            let dev = adds.remove(0);
            array.add_member(dev.clone())?;
            all.push(dev);
            added += 1;
        }
    }
    if !array.recovering_roles().is_empty() {
        array.run_sync(crate::recovery::SyncKind::Recovery, |_| {})?;
    }
    array.stop()?;
    drop(array);
    reshape.add = adds;
    let mut done = reshape_members(all, &then, reshape)?;
    done.added += added;
    Ok(GrowReport {
        summary: format!(
            "{}{}, then {}",
            took.summary,
            if rebuild { " (then rebuilt)" } else { "" },
            done.summary
        ),
        events: done.events,
        missing_roles: Vec::new(),
        restripe: true,
        reshape: Some(done),
    })
}

/// A rotating raid6 -> raid5 planned on `st`: the `-6` layout to restripe to first (of the
/// raid5 layout asked for, or of the raid6's own), and md's takeover after it, checked on
/// the state that restripe leaves.
pub(crate) fn plan_raid6_to_raid5(
    st: &GrowState,
    req: &GrowRequest,
) -> Result<(u32, GrowRequest), ArrayError> {
    let want5 = req.layout.unwrap_or(st.template.layout);
    let l6 = takeover::raid6_layout_of_raid5(want5).ok_or_else(|| {
        refuse(format!(
            "md has no raid6 layout that becomes raid5 layout {want5}: nothing was written"
        ))
    })?;
    let take = GrowRequest {
        level: Some(Level::Raid5),
        layout: req.layout,
        ..Default::default()
    };
    let mut after = st.clone();
    after.template.layout = l6;
    match plan(&after, &take)? {
        Plan::Superblocks(_) => Ok((l6, take)),
        _ => Err(refuse(
            "the takeover after the restripe would not be md's raid6 -> raid5: nothing was written",
        )),
    }
}

/// A raid6 in a rotating layout asked to become a raid5 (and nothing else): md's way is a
/// restripe within raid6 to the matching `-6` layout (Q on the last device), then the
/// takeover.
pub(crate) fn raid6_needs_restripe_to_become_raid5(
    level: Level,
    st: &GrowState,
    req: &GrowRequest,
) -> bool {
    level == Level::Raid6
        && req.level == Some(Level::Raid5)
        && req.raid_disks.is_none()
        && req.chunk_sectors.is_none()
        && req.size.is_none()
        && req.bitmap.is_none()
        && takeover::raid5_layout_of_raid6(st.template.layout).is_none()
}

/// raid6 (rotating) -> raid5: restripe to the `-6` layout of the raid5 layout asked for (or
/// of the raid6's own), then md's takeover drops Q (its device becomes a spare). The
/// takeover is planned on the state the restripe leaves before anything is written.
fn restripe_then_takeover(
    array: Array,
    devs: Vec<Arc<dyn Member>>,
    st: &GrowState,
    req: &GrowRequest,
    reshape: ReshapeOptions,
) -> Result<GrowReport, ArrayError> {
    let checked = array
        .check_writable("grow")
        .and_then(|()| plan_raid6_to_raid5(st, req));
    array.stop()?;
    drop(array);
    let (l6, take) = checked?;
    let done = reshape_members(
        devs.clone(),
        &ReshapeRequest {
            layout: Some(l6),
            ..Default::default()
        },
        reshape,
    )?;
    if !done.finished {
        return Ok(GrowReport {
            summary: format!(
                "{} (then md's takeover to raid5, once it finishes)",
                done.summary
            ),
            events: done.events,
            missing_roles: Vec::new(),
            restripe: true,
            reshape: Some(done),
        });
    }
    let (array, report) = assemble(devs.clone(), &AssembleOptions::default())?;
    let st = array.grow_state();
    let utime = array.now_secs() & ((1 << 40) - 1);
    let planned = plan(&st, &take);
    array.stop()?;
    drop(array);
    let Plan::Superblocks(c) = planned? else {
        return Err(refuse(
            "the raid6 did not end in a -6 layout after its restripe",
        ));
    };
    let took = rewrite_superblocks(&devs, &report, &st, c, utime)?;
    Ok(GrowReport {
        summary: format!("{}, then {}", done.summary, took.summary),
        events: took.events,
        missing_roles: took.missing_roles,
        restripe: true,
        reshape: Some(done),
    })
}

/// Each target's internal bitmap resized for sync size `to` and chunk `chunk`
/// ([`BitmapState::resize`], a grown range dirty), written where its new superblock puts
/// it with `events`, flushed. Bits a shrunk bitmap no longer has are cleared on the disk.
fn write_resized_bitmaps(
    targets: &[(Arc<dyn Member>, Superblock)],
    new: &[Superblock],
    (to, chunk): (u64, u32),
    events: u64,
) -> Result<(), ArrayError> {
    for ((dev, old_sb), sb) in targets.iter().zip(new) {
        // A journal device has no bitmap.
        if sb.bitmap_sector().is_none() {
            continue;
        }
        let Some(mut b) = crate::bitmap::BitmapState::load(dev.as_ref(), old_sb)? else {
            continue;
        };
        let old_bytes = b.sb.space_bytes();
        b.resize(to, chunk, true)
            .map_err(|e| ArrayError::Failed(format!("{}: {e}", dev.name())))?;
        b.write(dev.as_ref(), sb, events)?;
        let new_bytes = b.sb.space_bytes();
        if old_bytes > new_bytes {
            let zeros = crate::buf::AlignedBuf::new((old_bytes - new_bytes) as usize);
            let at = sb.bitmap_sector().unwrap_or_default() * 512 + new_bytes;
            dev.write_at(&zeros, at)?;
        }
        dev.flush()?;
    }
    Ok(())
}

/// Refuses, before any is written, new superblocks that uraid could not itself assemble
/// (a feature or field it does not support), naming the feature.
pub(super) fn check_new_superblocks(new: &[Superblock]) -> Result<(), ArrayError> {
    for sb in new {
        uraid_core::support::check(sb).map_err(|what| ArrayError::Unsupported {
            array: sb.set_name.clone(),
            member: "new superblock".into(),
            what,
        })?;
    }
    Ok(())
}

/// Rewrite every member's superblock for a change that moves no data (events + 1).
fn rewrite_superblocks(
    devs: &[Arc<dyn Member>],
    report: &crate::assemble::AssembleReport,
    st: &GrowState,
    c: Change,
    utime: u64,
) -> Result<GrowReport, ArrayError> {
    // The devices that belong to the array now: members, spares, the journal. Stale and
    // faulty ones keep their old superblocks (and stay out).
    let mut found: Vec<(&Arc<dyn Member>, &MemberOutcome)> = Vec::new();
    let mut sbs: Vec<Superblock> = Vec::new();
    for (dev, m) in devs.iter().zip(&report.members) {
        if matches!(
            m.outcome,
            MemberOutcome::Active(_) | MemberOutcome::Spare | MemberOutcome::Journal
        ) {
            found.push((dev, &m.outcome));
            sbs.push(read_member_superblock(dev.as_ref())?.0);
        }
    }
    // As assembly read them: a finished reshape whose clearing a power cut interrupted is
    // the shape the change starts from.
    crate::assemble::fold_finished_reshapes(&mut sbs);
    // The array-wide fields (the roles among them) from the newest superblock: a member a
    // power cut left one event behind missed the last rewrite; each device keeps its own.
    if let Some(newest) = sbs.iter().max_by_key(|s| s.events).cloned() {
        for sb in sbs.iter_mut() {
            let mut n = newest.clone();
            n.dev_number = sb.dev_number;
            *sb = crate::meta::Meta::merge_into(n, sb);
        }
    }
    let mut targets: Vec<(Arc<dyn Member>, Superblock)> = Vec::new();
    let mut leaving: Vec<(Arc<dyn Member>, Superblock)> = Vec::new();
    for ((dev, outcome), sb) in found.into_iter().zip(sbs) {
        // A raid0 keeps its data roles only: the others leave (see to_raid0).
        let data_role = matches!(outcome, MemberOutcome::Active(r)
            if c.role_map.get(*r).copied().flatten().is_some());
        if c.to_raid0 && !data_role {
            leaving.push((dev.clone(), sb));
        } else {
            targets.push((dev.clone(), sb));
        }
    }
    if c.to_raid0 {
        targets = raid0::leave_for_raid0(targets, &leaving, &c, utime)?;
    }
    let events = targets.iter().map(|(_, sb)| sb.events).max().unwrap_or(0) + 1;
    let new: Vec<Superblock> = targets
        .iter()
        .map(|(dev, sb)| c.apply(sb, events, dev.size_bytes() / 512, utime))
        .collect();
    // Every new superblock must say the same thing before the first is written.
    check_new_superblocks(&new)?;
    // A new bitmap's area first, all clean and in step with the new events: no old
    // superblock looks there, and every new one finds it written.
    if let Some((b, _)) = c.add_bitmap.as_deref() {
        let mut b = b.clone();
        b.events = events;
        b.events_cleared = events;
        let mut area = bm::initial_area(&b);
        area[bm::BITMAP_SUPER_BYTES..].fill(0);
        let mut buf = crate::buf::AlignedBuf::new(area.len());
        buf.copy_from_slice(&area);
        for (dev, sb) in targets.iter().map(|(d, _)| d).zip(&new) {
            let at = sb
                .bitmap_sector()
                .expect("the new superblock names its bitmap");
            dev.write_at(&buf, at * 512)?;
            dev.flush()?;
        }
    }
    // A resized bitmap: bits for the larger of the two sizes are on disk whichever record
    // a crash leaves, so grown, the bitmap goes first (an old superblock reads the extra
    // bits as beyond its end), and shrunk, the superblocks (a new one reads the old, longer
    // bitmap; its older events make it stale: a full resync, never a skipped chunk).
    let resize = c.resize_bitmap.map(|to| (to, to.0 > st.template.size));
    if let Some((to, true)) = resize {
        write_resized_bitmaps(&targets, &new, to, events)?;
    }
    for ((dev, _), sb) in targets.iter().zip(&new) {
        write_superblock(dev.as_ref(), sb)?;
    }
    if let Some((to, false)) = resize {
        write_resized_bitmaps(&targets, &new, to, events)?;
    }
    let missing_roles = (0..c.raid_disks)
        .filter(|&r| {
            !st.present
                .iter()
                .any(|&p| c.role_map.get(p) == Some(&Some(r)))
        })
        .collect();
    Ok(GrowReport {
        summary: c.summary,
        events,
        missing_roles,
        restripe: false,
        reshape: None,
    })
}
