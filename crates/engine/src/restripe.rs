//! The restripe engine: md's reshape of a raid4/5/6 (`--raid-devices`, `--chunk`,
//! `--layout`) on the members of an array that is not served, in md's on-disk format, so
//! that a reshape uraid starts Linux md can finish and one Linux md left uraid continues.
//!
//! A reshape moves every stripe from the old geometry to the new one with the data offset
//! moving (md's FEATURE_NEW_OFFSET, `new_offset`), as mdadm does when there is room, so
//! no backup file is needed:
//!
//! 1. **Start** ([`reshape_members`]): the request is checked against the array (md's
//!    refusals, before anything is written; a degraded array reshapes within its parity,
//!    and a new role left without a device needs [`ReshapeOptions::force`], as mdadm's
//!    `--force`); devices for new roles come from the array's spares, then from
//!    [`ReshapeOptions::add`] (added as spares first); every superblock
//!    is rewritten with FEATURE_RESHAPE_ACTIVE, `reshape_position` 0, the new level,
//!    layout, chunk, `raid_disks` and `delta_disks`, and `new_offset` (the room before the
//!    data, at most [`MAX_OFFSET_MOVE_SECTORS`]). A shrink (fewer devices, with the array
//!    size the user keeps) is md's backwards reshape instead: RESHAPE_BACKWARDS,
//!    `reshape_position` at the end of the smaller shape, a positive `new_offset` into the
//!    room after the data (made by a smaller component size where the kept size allows).
//! 2. **Copy** ([`continue_reshape`], also after a crash or from Linux): windows of whole
//!    new-geometry stripes are read through the old geometry (rebuilt from P where a
//!    member is missing) and written with fresh parity at the new offset, as far as
//!    [`ReshapeState::next_step`] allows against the position the superblocks record;
//!    when it asks for a checkpoint, the members are flushed and then every superblock
//!    records the new position (events + 1). Sectors past the old array's end are zeros.
//! 3. **Finish**: every superblock drops the reshape: the new shape, `data_offset` moved by
//!    `new_offset`, events + 1.
//!
//! A power cut at any instant leaves superblocks at most one event apart, each recording a
//! state whose data is on the members: assembly takes the newest, and a member whose
//! superblock recorded a finished reshape without clearing it is read as finished
//! ([`uraid_core::geometry::reshape::fold_finished`]).

// raid10's reshape (md's raid10 reshape_request): its own windows, the same records.
mod raid10;

use crate::array::Array;
use crate::assemble::{assemble, AssembleOptions, AssembleReport, MemberOutcome};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::io::{execute, Op};
use crate::member::Member;
use crate::meta::{read_superblock, write_superblock};
use crate::reshape::ReshapePers;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::geometry::{ParityGeometry, ReshapeState, ReshapeStep, ReshapeWalk, Side};
use uraid_core::superblock::{
    MetadataVersion, Superblock, FEATURE_BITMAP_OFFSET, FEATURE_NEW_OFFSET, FEATURE_PPL,
    FEATURE_RECOVERY_OFFSET, FEATURE_RESHAPE_ACTIVE, FEATURE_RESHAPE_BACKWARDS,
};
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};

/// A change that moves data (md's reshape): any field left `None` stays as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReshapeRequest {
    /// The new level (a takeover that needs a restripe after it).
    pub level: Option<Level>,
    /// The new number of member roles.
    pub raid_disks: Option<usize>,
    /// The new chunk size in sectors.
    pub chunk_sectors: Option<u64>,
    /// The new md layout number.
    pub layout: Option<u32>,
    /// A shrink: the array size the user keeps, in sectors (mdadm's `--array-size`, the
    /// confirmation md asks for that the data past the smaller shape's end goes).
    pub array_sectors: Option<u64>,
}

/// The most the data offset moves at the start of a reshape (32 MiB): enough for large
/// windows from the first one, and leaving the rest of the room for the next reshape.
pub const MAX_OFFSET_MOVE_SECTORS: u64 = 65536;

/// The most array data one window copies (16 MiB).
const MAX_WINDOW_SECTORS: u64 = 32768;

/// A checkpoint at least this often (md records its progress every few seconds too), so a
/// restart repeats little and Linux sees the progress.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

/// How a reshape runs.
#[derive(Default)]
pub struct ReshapeOptions {
    /// Devices for the new roles once the array's spares are used, added as spares first.
    pub add: Vec<Arc<dyn Member>>,
    /// Leave the reshape once the recorded position has reached or passed this array
    /// sector (forwards; backwards: reached or gone below it), recorded in the superblocks,
    /// for a later [`continue_reshape`] or for Linux md to finish.
    pub stop_at: Option<u64>,
    /// Only start the reshape (its superblocks written, nothing moved), whichever way it
    /// runs: a served array's daemons move the data.
    pub start_only: bool,
    /// Copy at most this many bytes of array data per second (md's sync_speed_max).
    pub max_bytes_per_sec: Option<u64>,
    /// Called after each window with the sectors done and the sectors in all.
    pub progress: Option<Box<dyn FnMut(u64, u64) + Send>>,
    /// mdadm's `--force`: start a grow with fewer devices than new roles, the rest left
    /// missing (the array ends degraded), where md's own check allows it.
    pub force: bool,
}

impl ReshapeOptions {
    /// After a window: tell `progress` (`done` of `total` sectors) and sleep as long as
    /// `copied` sectors since `began` are ahead of `max_bytes_per_sec`.
    pub(crate) fn window_done(&mut self, done: u64, total: u64, copied: u64, began: Instant) {
        if let Some(p) = self.progress.as_mut() {
            p(done, total);
        }
        if let Some(rate) = self.max_bytes_per_sec.filter(|&r| r > 0) {
            let due = Duration::from_secs_f64((copied * SECTOR_BYTES) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(began.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
}

/// What a reshape did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReshapeReport {
    /// One line: the shape change and where it stands.
    pub summary: String,
    /// The reshape is complete and the superblocks say the new shape.
    pub finished: bool,
    /// The position the superblocks record (md's reshape_position).
    pub position_sectors: u64,
    /// Windows copied in this run.
    pub windows: u64,
    /// Checkpoints recorded in this run.
    pub checkpoints: u64,
    /// The events count last written.
    pub events: u64,
    /// How many of [`ReshapeOptions::add`] took a role (the rest are spares).
    pub added: usize,
}

/// Why uraid does not start a reshape of a 0.90 array. md restripes one in place (0.90 data
/// always starts at sector 0, so there is no new_offset to move it to), and mdadm keeps the
/// stripes of the critical section in a backup file, which uraid does not write.
pub(crate) const RESHAPE_090_REFUSAL: &str =
    "a reshape of a 0.90 array cannot move its data offset (0.90 data always starts at \
     sector 0), so md reshapes it in place and mdadm must keep the critical section in a \
     backup file, which uraid does not write: start it with mdadm --grow --backup-file=FILE \
     (uraid continues a 0.90 grow past its critical section, with uraid grow --continue or \
     while served)";

pub(crate) fn refused(what: impl std::fmt::Display) -> ArrayError {
    ArrayError::Refused(format!("{what}: nothing was written"))
}

/// The devices with a superblock to keep in step: active members and spares.
fn targets(devs: &[Arc<dyn Member>], report: &AssembleReport) -> Vec<Arc<dyn Member>> {
    devs.iter()
        .zip(&report.members)
        .filter(|(_, m)| matches!(m.outcome, MemberOutcome::Active(_) | MemberOutcome::Spare))
        .map(|(d, _)| d.clone())
        .collect()
}

/// The lowest sector the data area may start at: past the superblock, its internal
/// bitmap (`bitmap_bytes`, the whole area md writes) and its bad block log (1.1/1.2; the
/// caller refuses PPL).
pub(crate) fn metadata_end(sb: &Superblock, bitmap_bytes: u64) -> u64 {
    let mut end = sb.super_offset + 8;
    if sb.feature_map & FEATURE_BITMAP_OFFSET != 0 && sb.bitmap_offset > 0 {
        let at = sb.super_offset + sb.bitmap_offset as u64;
        end = end.max(at + bitmap_bytes.div_ceil(SECTOR_BYTES));
    }
    if sb.bblog_size != 0 && sb.bblog_offset > 0 {
        end = end.max(sb.super_offset + sb.bblog_offset as u64 + u64::from(sb.bblog_size));
    }
    end
}

/// Keep a member's internal bitmap in step with its superblock's new events (md writes the
/// bitmap's superblock with the array's events before the superblock: a bitmap behind
/// is stale, and stale means a full resync). The bits stay as they are.
fn rewrite_bitmap(d: &dyn Member, old: &Superblock, new: &Superblock) -> Result<(), ArrayError> {
    if let Some(bm) = crate::bitmap::BitmapState::load(d, old)? {
        bm.write(d, new, new.events)?;
    }
    Ok(())
}

/// Rewrite every target's superblock with `change`, events one above the newest, each
/// written and flushed in turn. Returns the events written.
pub(crate) fn rewrite(
    targets: &[Arc<dyn Member>],
    change: &dyn Fn(&mut Superblock),
) -> Result<u64, ArrayError> {
    let mut sbs = Vec::with_capacity(targets.len());
    let mut recs = Vec::with_capacity(targets.len());
    for d in targets {
        let (sb, rec) = crate::meta::read_member_superblock(d.as_ref())?;
        sbs.push(sb);
        recs.push(rec);
    }
    // The array-wide fields come from the newest superblock (one a power cut left behind
    // missed the last rewrite); each device keeps its own.
    let newest = sbs
        .iter()
        .max_by_key(|s| s.events)
        .cloned()
        .ok_or_else(|| ArrayError::Failed("a reshape without members".into()))?;
    let events = newest.events + 1;
    // 0.90 members (a 0.91 reshape, continued): written as 0.90 records, the device table
    // listing every target.
    let cx090 = recs.iter().flatten().max_by_key(|r| r.events).map(|r| {
        let mut cx = uraid_core::superblock090::Sb090Context::from_record(r);
        cx.present = sbs.iter().map(|s| s.dev_number).collect();
        cx
    });
    for (d, own) in targets.iter().zip(sbs) {
        let mut sb = newest.clone();
        sb.dev_number = own.dev_number;
        let mut sb = crate::meta::Meta::merge_into(sb, &own);
        change(&mut sb);
        sb.events = events;
        rewrite_bitmap(d.as_ref(), &own, &sb)?;
        match &cx090 {
            Some(cx) => crate::meta::write_superblock_090(d.as_ref(), &sb, cx)?,
            None => write_superblock(d.as_ref(), &sb)?,
        }
    }
    Ok(events)
}

/// md's reshape of the members of an array that is not running: check, start, and run it
/// to the end (or to [`ReshapeOptions::stop_at`]). Refusals come before anything is
/// written.
pub fn reshape_members(
    devs: Vec<Arc<dyn Member>>,
    req: &ReshapeRequest,
    mut opts: ReshapeOptions,
) -> Result<ReshapeReport, ArrayError> {
    let (array, report) = assemble(devs.clone(), &AssembleOptions::default())?;
    let planned = if array.level() == Level::Raid10 {
        raid10::plan_start10(&array, &report, req, &opts.add)
    } else {
        plan_start(&array, &report, req, &opts.add, None, opts.force)
    };
    let stopped = array.stop();
    drop(array);
    let start = planned?;
    stopped?;
    // New devices become spares first (each gets its superblock and place as md's add).
    let mut all = devs;
    let mut added = 0;
    if !opts.add.is_empty() {
        let (array, _) = assemble(all.clone(), &AssembleOptions::default())?;
        let need = start.roles_wanted.saturating_sub(start.spares_ready);
        for dev in std::mem::take(&mut opts.add) {
            // A spare, even where a role is missing: the reshape gives it a new role.
            array.add_spare(dev.clone())?;
            all.push(dev);
            added += 1;
            if added == need {
                break;
            }
        }
        array.stop()?;
    }
    let (array, report) = assemble(all.clone(), &AssembleOptions::default())?;
    array.stop()?;
    drop(array);
    let spares: Vec<Arc<dyn Member>> = all
        .iter()
        .zip(&report.members)
        .filter(|(_, m)| matches!(m.outcome, MemberOutcome::Spare))
        .map(|(d, _)| d.clone())
        .collect();
    // The spares that take the new roles, in order, by their device numbers.
    let mut takers: Vec<(u32, u16)> = Vec::new();
    for (k, dev) in spares.iter().take(start.roles_wanted).enumerate() {
        let sb = read_superblock(dev.as_ref())?;
        let room = sb
            .data_offset
            .saturating_sub(metadata_end(&sb, start.bitmap_bytes));
        if room < start.offset_move {
            return Err(refused(format!(
                "{}: only {room} sectors before its data, the reshape moves the data offset by {}",
                dev.name(),
                start.offset_move
            )));
        }
        takers.push((sb.dev_number, (start.old_disks + k) as u16));
    }
    // Fewer than wanted only with --force (checked at the plan): those roles stay missing.
    if takers.len() < start.roles_wanted && !opts.force {
        return Err(refused(format!(
            "growing to {} devices needs {} device(s) for the new roles and the array has {}: \
             give them with --add",
            start.new.raid_disks,
            start.roles_wanted,
            takers.len()
        )));
    }
    let new = &start.new;
    let delta = new.raid_disks as i64 - start.old_disks as i64;
    let move_by = start.offset_move;
    let shrink = start.shrink.as_ref();
    let events = rewrite(&targets(&all, &report), &|sb| {
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
        sb.feature_map &= !FEATURE_RESHAPE_BACKWARDS;
        sb.reshape_position = 0;
        sb.new_offset = -(move_by as i32);
        if let Some(s) = shrink {
            // md's backwards reshape: from the end of the smaller shape, the data moving up.
            sb.feature_map |= FEATURE_RESHAPE_BACKWARDS;
            sb.reshape_position = s.position;
            sb.new_offset = move_by as i32;
            sb.size = s.dev_sectors;
        }
        sb.new_level = new.level.md_level();
        sb.new_layout = new.layout;
        sb.new_chunk = new.chunk_sectors as u32;
        sb.delta_disks = delta as i32;
        sb.raid_disks = new.raid_disks as u32;
        for &(number, role) in &takers {
            if let Some(r) = sb.dev_roles.get_mut(number as usize) {
                *r = role;
            }
        }
    })?;
    tracing::info!("reshape started: {} (events {events})", start.summary);
    let mut r = continue_reshape(all, opts)?;
    r.added = added;
    Ok(r)
}

/// The shape a reshape goes to, as the superblock's `new_*` fields and `raid_disks` say it.
pub(crate) struct NewShape {
    pub(crate) level: Level,
    pub(crate) layout: u32,
    pub(crate) chunk_sectors: u64,
    pub(crate) raid_disks: usize,
}

/// What starting a reshape needs, checked against the running array.
pub(crate) struct Start {
    pub(crate) new: NewShape,
    pub(crate) old_disks: usize,
    /// New roles to fill.
    pub(crate) roles_wanted: usize,
    /// Spares the array already has.
    pub(crate) spares_ready: usize,
    pub(crate) offset_move: u64,
    /// The internal bitmap's area (0 without one): the data offset stays past it.
    pub(crate) bitmap_bytes: u64,
    pub(crate) summary: String,
    /// A shrink: md's backwards reshape, the data offset moving up by `offset_move`.
    pub(crate) shrink: Option<Shrink>,
}

/// What a shrink starts from (md's RESHAPE_BACKWARDS with a new offset above the old).
pub(crate) struct Shrink {
    /// The component size while and after it runs (smaller than before when the room
    /// after the data was made by the smaller array size the user gave).
    pub(crate) dev_sectors: u64,
    /// The first reshape_position: the end of the smaller shape.
    pub(crate) position: u64,
}

/// The sectors from a member's data offset that its data may use: md's `data_size` (its
/// rdev sectors), within the device, and below any metadata that lies past the data start
/// (1.0 keeps its superblock, bitmap and bad block log after the data).
pub(crate) fn data_room(sb: &Superblock, dev: Option<&Arc<dyn Member>>) -> u64 {
    let mut end = sb.data_offset + sb.data_size;
    if let Some(d) = dev {
        end = end.min(d.size_bytes() / SECTOR_BYTES);
    }
    let at = |rel: i64| (sb.super_offset as i64 + rel).max(0) as u64;
    let mut starts = vec![sb.super_offset];
    if sb.feature_map & FEATURE_BITMAP_OFFSET != 0 {
        starts.push(at(i64::from(sb.bitmap_offset)));
    }
    if sb.bblog_size != 0 {
        starts.push(at(i64::from(sb.bblog_offset)));
    }
    for s in starts {
        if s >= sb.data_offset {
            end = end.min(s);
        }
    }
    end.saturating_sub(sb.data_offset)
}

/// md's shrink of a raid4/5/6 (`--raid-devices` fewer, after `--array-size`): a backwards
/// reshape from the end of the smaller shape down to sector 0, the data offset moving up
/// into the room after the data (mdadm's way without a backup file). The component size
/// shrinks where the kept size leaves room for that and the members have none after their
/// data. md's checks, then uraid's: the kept size within the smaller shape, room for the
/// offset to move. A degraded array shrinks as md shrinks one (its missing roles read from
/// parity; one below the new count stays missing, for the device that leaves to recover).
fn plan_shrink(
    a: &Array,
    report: &AssembleReport,
    g: &uraid_core::geometry::ArrayGeometry,
    mut ng: uraid_core::geometry::ArrayGeometry,
    keep: Option<u64>,
    bitmap_bytes: u64,
) -> Result<Start, ArrayError> {
    let level = g.level;
    let (from, to) = (g.raid_disks, ng.raid_disks);
    // md shrinks a degraded array too (raid5_start_reshape's spares check passes for any
    // shrink within the parity): a missing role below the new count stays missing, for
    // the device that leaves (a spare after the finish) to recover; one at or above it
    // is read from parity and goes.
    let old = ParityGeometry::new(g)?;
    let new = ParityGeometry::new(&ng).map_err(|e| refused(format!("{to} devices: {e}")))?;
    let unit = old.chunk_sectors.max(new.chunk_sectors);
    let dev = g.dev_sectors / unit * unit;
    let most = dev * new.data_disks() as u64;
    let Some(keep) = keep else {
        return Err(refused(format!(
            "shrinking a {level} from {from} to {to} devices reduces the array to at most \
             {}K: give --array-size SIZE (at most that) with --raid-devices to confirm that \
             the data past it goes (mdadm: \"use --grow --array-size first to truncate array\")",
            most / 2
        )));
    };
    if keep == 0 || keep > most {
        return Err(refused(format!(
            "--array-size {}K: a {level} of {to} devices holds at most {}K of this array's \
             data{}",
            keep / 2,
            most / 2,
            if keep == 0 {
                " and needs more than 0"
            } else {
                ""
            }
        )));
    }
    // What every member's data may use, and the room the offset moves up into.
    // (A raid0 shrinking through its raid4 has no member for the takeover's parity role.)
    let rooms: Vec<u64> = (0..g.raid_disks.min(a.raid_disks()))
        .filter_map(|r| {
            let sb = a.meta().member_sb(MemberIdx(r)).cloned()?;
            Some(data_room(&sb, a.live(MemberIdx(r)).as_ref()))
        })
        .collect();
    let limit = rooms.iter().copied().min().unwrap_or(0);
    // Rows the kept data needs in the smaller shape, and the component size: as it is
    // when the members have room after it, smaller (not below what the kept data needs)
    // to make that room when they have not.
    let needs = keep.div_ceil(new.data_disks() as u64).div_ceil(unit) * unit;
    let dev_after = dev
        .min(limit.saturating_sub(MAX_OFFSET_MOVE_SECTORS) / unit * unit)
        .max(needs);
    let offset_move = limit.saturating_sub(dev_after).min(MAX_OFFSET_MOVE_SECTORS) / unit * unit;
    let advice = || {
        let best = limit.saturating_sub(unit) / unit * unit * new.data_disks() as u64;
        format!(
            "md moves the data offset up into room after the data, and the members have {} \
             sectors there{}; mdadm would need a backup file, which uraid does not implement",
            limit.saturating_sub(dev),
            if best > 0 {
                format!(": an --array-size of at most {}K leaves enough", best / 2)
            } else {
                String::new()
            }
        )
    };
    if offset_move == 0 {
        return Err(refused(format!(
            "shrinking to {to} devices keeping {}K: {}",
            keep / 2,
            advice()
        )));
    }
    if dev_after != dev && bitmap_bytes > 0 {
        return Err(refused(format!(
            "shrinking to {to} devices keeping {}K makes room after the data by reducing the \
             component size from {dev} to {dev_after} sectors, and uraid does not resize the \
             internal bitmap within a reshape: remove it first (uraid grow --bitmap none) and \
             add it again after",
            keep / 2
        )));
    }
    let mut os = old.clone();
    os.dev_sectors = dev_after;
    let mut ns = new.clone();
    ns.dev_sectors = dev_after;
    let st = ReshapeState::begin(os, ns, offset_move as i64)
        .and_then(|st| st.can_finish().map(|()| st))
        .map_err(|e| refused(format!("{e} ({})", advice())))?;
    ng.dev_sectors = dev_after;
    let spares_ready = report
        .members
        .iter()
        .filter(|m| matches!(m.outcome, MemberOutcome::Spare))
        .count();
    let mut summary = shape_change(&old, &new);
    if dev_after != dev {
        summary.push_str(&format!(", component size {dev} -> {dev_after} sectors"));
    }
    Ok(Start {
        new: NewShape {
            level: new.level,
            layout: new.algorithm,
            chunk_sectors: new.chunk_sectors,
            raid_disks: new.raid_disks,
        },
        old_disks: old.raid_disks,
        roles_wanted: 0,
        spares_ready,
        offset_move,
        bitmap_bytes,
        summary,
        shrink: Some(Shrink {
            dev_sectors: dev_after,
            position: st.position_sectors,
        }),
    })
}

/// The checks a restripe after a takeover will make, made before the takeover is written:
/// `after` is the takeover's (level, layout, raid_disks); its new roles need devices too.
pub(crate) fn precheck_after_takeover(
    a: &Array,
    report: &AssembleReport,
    req: &ReshapeRequest,
    add: &[Arc<dyn Member>],
    after: (Level, u32, usize),
    (force, fill): (bool, bool),
) -> Result<(), ArrayError> {
    plan_start(a, report, req, add, Some((after, fill)), force).map(|_| ())
}

/// `after`: the takeover the restripe follows, and whether its new roles get devices
/// before the restripe (`false`: a raid0's chunk change, its raid4 parity left missing).
fn plan_start(
    a: &Array,
    report: &AssembleReport,
    req: &ReshapeRequest,
    add: &[Arc<dyn Member>],
    after: Option<((Level, u32, usize), bool)>,
    force: bool,
) -> Result<Start, ArrayError> {
    a.check_writable("a reshape")?;
    let mut g = a.geometry().clone();
    let mut takeover_roles = 0;
    let mut unfilled = 0;
    if let Some(((level, layout, disks), fill)) = after {
        takeover_roles = disks.saturating_sub(g.raid_disks);
        if !fill {
            unfilled = std::mem::take(&mut takeover_roles);
        }
        if g.level == Level::Raid0 {
            // md's raid0 takeover: each member's one zone, whole chunks (raid0 keeps no
            // dev_sectors of its own).
            let least = g.member_sectors.iter().copied().min().unwrap_or(0);
            g.dev_sectors = least / g.chunk_sectors.max(1) * g.chunk_sectors.max(1);
        }
        g.level = level;
        g.layout = layout;
        g.raid_disks = disks;
    }
    let level = g.level;
    if !level.has_parity() {
        return Err(refused(format!("uraid restripes raid4/5/6, not {level}")));
    }
    if let Some(to) = req.level.filter(|&l| l != level) {
        return Err(refused(format!(
            "a restripe from {level} to {to} (a level change with the data moving) is not in \
             this build of uraid; mdadm --grow does it"
        )));
    }
    let meta = a.meta();
    let tmpl = meta.template().clone();
    if meta.is_090() {
        return Err(refused(RESHAPE_090_REFUSAL));
    }
    // md keeps an internal bitmap through a raid4/5/6 reshape: it counts member sectors,
    // which a restripe does not change, so it needs no resize.
    let bitmap_bytes = meta.bitmap.as_ref().map_or(0, |b| b.sb.space_bytes());
    if meta.journal.is_some() {
        return Err(refused(
            "the array has a write journal, and md does not reshape an array with one",
        ));
    }
    if tmpl.feature_map & FEATURE_PPL != 0 {
        return Err(refused(
            "the array keeps a partial parity log, and md does not reshape with PPL: switch \
             it to resync first (uraid set ARRAY consistency_policy=resync)",
        ));
    }
    if meta.needs_resync() {
        return Err(refused(
            "the array was not shut down cleanly and owes a resync: let it finish (uraid check --repair or serve it) first",
        ));
    }
    drop(meta);
    // md's raid5_start_reshape: no reshape while a recovery runs (EBUSY); a degraded array
    // reshapes, its missing members rebuilt from parity as the old stripes are read.
    let recovering = a.recovering_roles();
    if !recovering.is_empty() || !a.replacing_roles().is_empty() {
        return Err(refused(format!(
            "a recovery or replace is in progress (role(s) {}): md does not start a reshape \
             while one runs; let it finish (uraid wait), then grow",
            recovering
                .iter()
                .chain(a.replacing_roles().iter())
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let degraded = a.missing_roles().len();
    let old = ParityGeometry::new(&g)?;
    let mut ng = g.clone();
    ng.raid_disks = req.raid_disks.unwrap_or(g.raid_disks);
    ng.chunk_sectors = req.chunk_sectors.unwrap_or(g.chunk_sectors);
    ng.layout = req.layout.unwrap_or(g.layout);
    if ng.raid_disks < g.raid_disks {
        // md shrinks a raid0 as the raid4 of its takeover (mdadm's analyse_change), with
        // the parity role the takeover leaves missing; no other takeover is followed by a
        // shrink.
        if after.is_some() && a.level() != Level::Raid0 {
            return Err(refused(format!(
                "a shrink to {} devices after a takeover is not something md does",
                ng.raid_disks
            )));
        }
        return plan_shrink(a, report, &g, ng, req.array_sectors, bitmap_bytes);
    }
    let new = ParityGeometry::new(&ng)?;
    if new.raid_disks == old.raid_disks
        && new.chunk_sectors == old.chunk_sectors
        && new.algorithm == old.algorithm
    {
        return Err(refused("the new shape is the shape the array has"));
    }
    // The room before the data on every member: the data offset moves down into it.
    let devs_sbs: Vec<Superblock> = (0..g.raid_disks)
        .filter_map(|r| a.meta().member_sb(MemberIdx(r)).cloned())
        .collect();
    if devs_sbs
        .iter()
        .any(|s| s.version() == MetadataVersion::V1_0)
    {
        return Err(refused(
            "a 1.0 array keeps its data at sector 0 with no room before it, so the data \
             offset cannot move down; md would need a backup file, which uraid does not \
             implement",
        ));
    }
    let room = devs_sbs
        .iter()
        .map(|s| s.data_offset.saturating_sub(metadata_end(s, bitmap_bytes)))
        .min()
        .unwrap_or(0);
    let unit = old.chunk_sectors.max(new.chunk_sectors);
    let offset_move = room.min(MAX_OFFSET_MOVE_SECTORS) / unit * unit;
    // The planner refuses what cannot make its first window.
    let mut ns = new.clone();
    ns.dev_sectors = g.dev_sectors;
    ReshapeState::begin(old.clone(), ns, -(offset_move as i64))
        .and_then(|st| st.can_finish())
        .map_err(|e| {
            refused(format!(
                "{e}: the members have {room} sectors between their metadata and their data \
             (mdadm would need a backup file)"
            ))
        })?;
    let spares_ready = report
        .members
        .iter()
        .filter(|m| matches!(m.outcome, MemberOutcome::Spare))
        .count();
    let roles_wanted = new.raid_disks - old.raid_disks;
    if spares_ready + add.len() < takeover_roles {
        return Err(refused(format!(
            "the takeover to {level} needs {takeover_roles} device(s) for the new roles it \
             makes; the array has {spares_ready} spare(s) and {} were given with --add",
            add.len()
        )));
    }
    let devices = spares_ready + add.len() - takeover_roles;
    // mdadm's check before it asks md: a new role without a device leaves the array
    // degraded, which it does only with --force.
    if devices < roles_wanted && !force {
        return Err(refused(format!(
            "growing to {} devices needs {roles_wanted} device(s) for the new roles and the \
             array has {devices} (spares and --add): mdadm says \"Need {roles_wanted} spare{} \
             to avoid degraded array, and only have {devices}\"; give them with --add, or \
             --force to leave the new role(s) missing",
            new.raid_disks,
            if roles_wanted == 1 { "" } else { "s" },
        )));
    }
    // md's raid5_start_reshape: the new shape must hold the data with the roles it has
    // no device for (the missing ones and the new ones without a spare).
    let lacking = degraded + unfilled + roles_wanted.saturating_sub(devices);
    if lacking > new.parity_disks() {
        return Err(refused(format!(
            "a {level} of {} devices would miss {lacking} role(s) ({degraded} missing now, {} \
             new without a device) and keeps its data with at most {} missing, so md refuses \
             this reshape: give devices with --add{}",
            new.raid_disks,
            roles_wanted.saturating_sub(devices),
            new.parity_disks(),
            if degraded > 0 {
                " or recover the missing member(s) first"
            } else {
                ""
            }
        )));
    }
    let need = (g.dev_sectors + devs_sbs[0].data_offset) * SECTOR_BYTES;
    if let Some(d) = add.iter().find(|d| d.size_bytes() < need) {
        return Err(refused(format!(
            "{} is {} bytes, a member of this array needs at least {need}",
            d.name(),
            d.size_bytes()
        )));
    }
    let summary = shape_change(&old, &new);
    Ok(Start {
        new: NewShape {
            level: new.level,
            layout: new.algorithm,
            chunk_sectors: new.chunk_sectors,
            raid_disks: new.raid_disks,
        },
        old_disks: old.raid_disks,
        roles_wanted,
        spares_ready,
        offset_move,
        bitmap_bytes,
        summary,
        shrink: None,
    })
}

/// After the windows of a reshape: stop the array they ran on (after an error too, which
/// is then what is returned). `Ok(None)` when the reshape finished and the caller writes
/// the new shape; otherwise the report of a reshape left at array sector `safe`
/// (`counts`: windows, checkpoints, events), for a later [`continue_reshape`] or Linux.
pub(crate) fn stop_after_windows(
    array: Array,
    result: Result<bool, ArrayError>,
    what: &str,
    (safe, total): (u64, u64),
    (windows, checkpoints, events): (u64, u64, u64),
) -> Result<Option<ReshapeReport>, ArrayError> {
    let finished = match result {
        Ok(f) => f,
        Err(e) => {
            let _ = array.stop();
            return Err(e);
        }
    };
    array.stop()?;
    drop(array);
    if finished {
        return Ok(None);
    }
    Ok(Some(ReshapeReport {
        summary: format!("reshape {what} stopped at array sector {safe} of {total}"),
        finished: false,
        position_sectors: safe,
        windows,
        checkpoints,
        events,
        added: 0,
    }))
}

/// One line naming a reshape from `old` to `new` (reports and logs).
fn shape_change(old: &ParityGeometry, new: &ParityGeometry) -> String {
    format!(
        "{} {} -> {} devices, chunk {} -> {} KiB, layout {} -> {}",
        old.level,
        old.raid_disks,
        new.raid_disks,
        old.chunk_sectors / 2,
        new.chunk_sectors / 2,
        old.algorithm,
        new.algorithm
    )
}

/// Go on with the reshape the members' superblocks record (one uraid or Linux md left
/// mid-way, or one just started), to the end or to [`ReshapeOptions::stop_at`].
pub fn continue_reshape(
    devs: Vec<Arc<dyn Member>>,
    mut opts: ReshapeOptions,
) -> Result<ReshapeReport, ArrayError> {
    let (array, report) = assemble(devs.clone(), &AssembleOptions::default())?;
    if array.reshaping10().is_some() {
        let targets = targets(&devs, &report);
        return raid10::continue_reshape10(array, report, &devs, &targets, opts);
    }
    let Some(pers) = array.pers().as_any().downcast_ref::<ReshapePers>() else {
        let events = report.events;
        array.stop()?;
        return Err(ArrayError::Refused(format!(
            "{} is not in the middle of a reshape (events {events}): nothing to continue",
            report.uuid
        )));
    };
    // Only this function writes (stripes and superblocks); the array, read-only, reads.
    array.set_read_only(true);
    // The new stripes go to every member in sync and to those the reshape rebuilds.
    let by_role = pers.new_writers(&array);
    // A rebuilt member's superblock is written first at each checkpoint: a power cut
    // part-way then leaves the others behind it (they were flushed), never it behind them
    // with a recovery_offset that misses rows.
    let following: Vec<Arc<dyn Member>> =
        pers.following(&array).into_iter().map(|(_, d)| d).collect();
    let follow_numbers: Vec<u32> = pers
        .following(&array)
        .iter()
        .filter_map(|(r, _)| array.meta().member_sb(*r).map(|sb| sb.dev_number))
        .collect();
    let mut targets = targets(&devs, &report);
    targets.sort_by_key(|d| !following.iter().any(|f| same_device(f, d)));
    let mut st = pers.state();
    if let Err(e) = st.can_finish() {
        let _ = array.stop();
        return Err(ArrayError::Refused(format!(
            "{}: uraid cannot continue this reshape to its end ({e}); nothing was written: \
             finish it with mdadm --grow --continue (and its backup file, if it used one)",
            report.uuid
        )));
    }
    let total = st.new_array_sectors().max(st.array_sectors());
    let summary = |st: &ReshapeState| shape_change(&st.old, &st.new);
    let mut safe = st.position_sectors;
    let (mut windows, mut checkpoints, mut events) = (0u64, 0u64, report.events);
    let began = Instant::now();
    let mut last_checkpoint = Instant::now();
    let mut copied: u64 = 0;
    let reached = |st: &ReshapeState, at: u64| {
        if st.backwards {
            st.position_sectors <= at
        } else {
            st.position_sectors >= at
        }
    };
    // The window read last, whose new stripes are written while the next one is read (the
    // rule keeps them apart: new stripes land only on rows of data below the recorded
    // position, the next window reads rows of data at or past it).
    let mut pending: Option<(u64, u64, AlignedBuf)> = None;
    let result: Result<bool, ArrayError> = (|| loop {
        let due = last_checkpoint.elapsed() >= CHECKPOINT_EVERY && safe != st.position_sectors;
        let stop_due = opts.start_only || opts.stop_at.is_some_and(|at| reached(&st, at));
        // The end is recorded as a position first, so that a power cut while the
        // superblocks are rewritten as finished leaves only states that read the same.
        let end_due = st.is_done() && safe != st.position_sectors;
        let step = if due || end_due || (stop_due && safe != st.position_sectors) {
            ReshapeStep::Checkpoint
        } else if stop_due {
            return Ok(false);
        } else {
            // Windows end at the stopping point when there is one.
            let max = opts.stop_at.map_or(MAX_WINDOW_SECTORS, |at| {
                let unit = st.window_unit();
                let left = at.abs_diff(st.position_sectors).div_ceil(unit) * unit;
                left.clamp(unit, MAX_WINDOW_SECTORS)
            });
            st.next_step(safe, max)?
        };
        match step {
            ReshapeStep::Done => {
                if let Some((ps, pn, pd)) = pending.take() {
                    write_window(&array, pers, &by_role, &st.new, ps, pn, &pd)?;
                }
                return Ok(true);
            }
            ReshapeStep::Checkpoint => {
                if let Some((ps, pn, pd)) = pending.take() {
                    write_window(&array, pers, &by_role, &st.new, ps, pn, &pd)?;
                }
                flush_all(&targets)?;
                let at = st.position_sectors;
                let rebuilt_to = st.recovery_offset_at(at);
                events = rewrite(&targets, &|sb| {
                    sb.reshape_position = at;
                    // md's reshape_request moves a rebuilt member's recovery_offset
                    // with the position.
                    if let Some(to) = rebuilt_to {
                        if follow_numbers.contains(&sb.dev_number)
                            && sb.feature_map & FEATURE_RECOVERY_OFFSET != 0
                        {
                            sb.recovery_offset = sb.recovery_offset.max(to);
                        }
                    }
                })?;
                safe = at;
                checkpoints += 1;
                last_checkpoint = Instant::now();
            }
            ReshapeStep::Copy { start, sectors } => {
                let prev = pending.take();
                let (read, written) = std::thread::scope(|sc| {
                    let writer = prev.as_ref().map(|(ps, pn, pd)| {
                        let (array, by_role, new) = (&array, &by_role, &st.new);
                        sc.spawn(move || write_window(array, pers, by_role, new, *ps, *pn, pd))
                    });
                    let read = read_window(&array, pers, &st, start, sectors);
                    let written = writer
                        .map_or(Ok(()), |w| w.join().expect("window writer"))
                        .map_err(ArrayError::from);
                    (read, written)
                });
                written?;
                pending = Some((start, sectors, read?));
                st.advance(step);
                windows += 1;
                copied += sectors;
                opts.window_done(st.done_sectors(), total, copied, began);
            }
        }
    })();
    let counts = (windows, checkpoints, events);
    if let Some(stopped) = stop_after_windows(array, result, &summary(&st), (safe, total), counts)?
    {
        return Ok(stopped);
    }
    // Done: the new stripes are durable before any superblock says the new shape.
    flush_all(&targets)?;
    let (new, dev_sectors, move_by) = (st.new.clone(), st.dev_sectors(), st.new_offset_sectors);
    events = rewrite(&targets, &|sb| {
        uraid_core::geometry::reshape::finish_superblock(sb, &new, dev_sectors, move_by)
    })?;
    Ok(ReshapeReport {
        summary: format!("reshape {} finished", summary(&st)),
        finished: true,
        position_sectors: st.end_position(),
        windows,
        checkpoints,
        events,
        added: 0,
    })
}

/// Whether two handles are one device (the same object).
fn same_device(a: &Arc<dyn Member>, b: &Arc<dyn Member>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

fn flush_all(targets: &[Arc<dyn Member>]) -> Result<(), ArrayError> {
    for d in targets {
        d.flush()?;
    }
    Ok(())
}

/// Read one window, `[start, start + sectors)`, through the old geometry; zeros past the
/// old array's end (nothing to move there, as md writes there).
fn read_window(
    a: &Array,
    pers: &ReshapePers,
    st: &ReshapeState,
    start: u64,
    sectors: u64,
) -> Result<AlignedBuf, ArrayError> {
    let old_end = st.dev_sectors() * st.old.data_disks() as u64;
    let mut data = AlignedBuf::new((sectors * SECTOR_BYTES) as usize);
    let readable = old_end.saturating_sub(start).min(sectors);
    if readable > 0 {
        let out = &mut data[..(readable * SECTOR_BYTES) as usize];
        if !read_old_rows(a, pers, st, start, out) {
            // A member missing or a read failing: chunk by chunk, rebuilt from P.
            pers.read_old(a, st, start, out)?;
        }
    }
    Ok(data)
}

/// Write one window's data as whole stripes of the new geometry `g` with their parity, at
/// the new data offset, one request per member.
fn write_window(
    a: &Array,
    pers: &ReshapePers,
    devs: &[Option<Arc<dyn Member>>],
    g: &ParityGeometry,
    start: u64,
    sectors: u64,
    data: &[u8],
) -> Result<(), WindowFailed> {
    let chunk = (g.chunk_sectors * SECTOR_BYTES) as usize;
    let first = start / g.stripe_data_sectors();
    let stripes = (sectors / g.stripe_data_sectors()) as usize;
    // One contiguous buffer per role: its rows of these stripes.
    let mut rows: Vec<AlignedBuf> = (0..g.raid_disks)
        .map(|_| AlignedBuf::new(stripes * chunk))
        .collect();
    let mut p = vec![0u8; chunk];
    let mut q = vec![0u8; chunk];
    for k in 0..stripes {
        let map = g.stripe_map(first + k as u64);
        let base = k * g.data_disks() * chunk;
        let srcs: Vec<&[u8]> = (0..g.data_disks())
            .map(|i| &data[base + i * chunk..base + (i + 1) * chunk])
            .collect();
        for (i, role) in map.data.iter().enumerate() {
            rows[role.0][k * chunk..(k + 1) * chunk].copy_from_slice(srcs[i]);
        }
        let qbuf = map.q.map(|_| &mut q[..]);
        crate::raid5::gen_parity(&map, &srcs, &mut p, qbuf);
        rows[map.p.0][k * chunk..(k + 1) * chunk].copy_from_slice(&p);
        if let Some(qr) = map.q {
            rows[qr.0][k * chunk..(k + 1) * chunk].copy_from_slice(&q);
        }
    }
    let row0 = g.member_sector(first, 0);
    let mut ops: Vec<Op> = Vec::new();
    let mut roles = Vec::new();
    for (r, dev) in devs.iter().enumerate() {
        if let Some(dev) = dev {
            let at = pers.member_byte(a, Side::New, MemberIdx(r), row0);
            ops.push(Op::write(dev.as_ref(), at, &rows[r]));
            roles.push(r);
        }
    }
    let failed: Vec<(MemberIdx, std::io::Error)> = execute(&mut ops)
        .into_iter()
        .zip(roles)
        .filter_map(|(res, r)| res.err().map(|e| (MemberIdx(r), e)))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(WindowFailed { row0, failed })
    }
}

/// Members whose write of a window's new stripes failed.
struct WindowFailed {
    row0: u64,
    failed: Vec<(MemberIdx, std::io::Error)>,
}

impl WindowFailed {
    fn error(&self) -> ArrayError {
        let (r, e) = &self.failed[0];
        ArrayError::Failed(format!(
            "reshape: writing the new stripes at member sector {} of member {r} failed: {e}; \
             the reshape stops at the recorded position and continues from there",
            self.row0
        ))
    }
}

impl From<WindowFailed> for ArrayError {
    fn from(w: WindowFailed) -> ArrayError {
        w.error()
    }
}

/// Read array sectors from `start` through the old geometry the fast way: each member's
/// rows of the old stripes involved in one request per member, all at once, then the data
/// chunks gathered in array order. A role that holds no data there (a missing Q of md's
/// `-6` layouts) is not read. False when a data chunk's member is missing or a read fails
/// (the caller falls back to the chunk-by-chunk path, which rebuilds from parity).
fn read_old_rows(
    a: &Array,
    pers: &ReshapePers,
    st: &ReshapeState,
    start: u64,
    out: &mut [u8],
) -> bool {
    let g = &st.old;
    let sectors = out.len() as u64 / SECTOR_BYTES;
    let (first, last) = (
        start / g.stripe_data_sectors(),
        (start + sectors).div_ceil(g.stripe_data_sectors()),
    );
    let row0 = g.member_sector(first, 0);
    let row_bytes = ((last - first) * g.chunk_sectors * SECTOR_BYTES) as usize;
    let devs: Vec<Option<Arc<dyn Member>>> =
        (0..g.raid_disks).map(|r| a.live(MemberIdx(r))).collect();
    let mut holds_data = vec![false; g.raid_disks];
    for stripe in first..last {
        for role in g.stripe_map(stripe).data {
            holds_data[role.0] = true;
        }
    }
    if (0..g.raid_disks).any(|r| holds_data[r] && devs[r].is_none()) {
        return false;
    }
    let mut rows: Vec<AlignedBuf> = (0..g.raid_disks)
        .map(|r| AlignedBuf::new(if holds_data[r] { row_bytes } else { 0 }))
        .collect();
    {
        let mut ops: Vec<Op> = devs
            .iter()
            .zip(rows.iter_mut())
            .enumerate()
            .filter(|(r, _)| holds_data[*r])
            .map(|(r, (d, buf))| {
                let at = pers.member_byte(a, Side::Old, MemberIdx(r), row0);
                Op::read(d.as_ref().expect("present").as_ref(), at, buf)
            })
            .collect();
        if execute(&mut ops).iter().any(|r| r.is_err()) {
            return false;
        }
    }
    let chunk = g.chunk_sectors;
    let mut s = start;
    let mut off = 0usize;
    while off < out.len() {
        let loc = g.locate(s);
        let n = ((chunk - loc.offset_sectors) * SECTOR_BYTES) as usize;
        let n = n.min(out.len() - off);
        let role = g.stripe_map(loc.stripe).data[loc.data_index];
        let at = ((g.member_sector(loc.stripe, loc.offset_sectors) - row0) * SECTOR_BYTES) as usize;
        out[off..off + n].copy_from_slice(&rows[role.0][at..at + n]);
        off += n;
        s += n as u64 / SECTOR_BYTES;
    }
    true
}

/// Windows of a served reshape: small, as requests wait while one moves.
const SERVED_WINDOW_SECTORS: u64 = 2048;

impl Array {
    /// The reshape this array is in the middle of, if any.
    pub(crate) fn reshaping(&self) -> Option<&ReshapePers> {
        self.pers().as_any().downcast_ref::<ReshapePers>()
    }

    /// A reshape's progress in array sectors of the new shape: (done, in all); None when
    /// the array is not reshaping.
    pub fn reshape_progress(&self) -> Option<(u64, u64)> {
        if let Some(r10) = self.reshaping10() {
            let p = r10.progress();
            if p.finished {
                return None;
            }
            return Some((p.st.done_sectors(), p.st.new_array_sectors()));
        }
        let pers = self.reshaping()?;
        let p = pers.progress();
        if p.finished {
            return None;
        }
        let total = p.st.new_array_sectors();
        Some((p.st.done_sectors(), total))
    }

    /// Whether the array is in the middle of a reshape (and, read-write, goes on with it
    /// while it is served).
    pub fn is_reshaping(&self) -> bool {
        self.reshaping10().is_some_and(|p| !p.progress().finished)
            || self.reshaping().is_some_and(|p| !p.progress().finished)
    }

    /// The raid10 reshape this array is in the middle of, if any.
    pub(crate) fn reshaping10(&self) -> Option<&crate::reshape10::Reshape10Pers> {
        self.pers()
            .as_any()
            .downcast_ref::<crate::reshape10::Reshape10Pers>()
    }
}

/// A window whose new stripes or copies some members did not take: those members (to fail)
/// and the error to stop with when the array cannot go on without them.
pub(crate) struct Unmoved {
    pub(crate) failed: Vec<(MemberIdx, std::io::Error)>,
    pub(crate) error: ArrayError,
}

/// One personality's part of a served reshape (raid4/5/6's here, raid10's in
/// `restripe/raid10.rs`).
pub(crate) trait ServedReshape: crate::array::Personality {
    type Plan: ReshapeWalk;
    /// The plan in memory, and the position the superblocks record.
    fn now(&self) -> (Self::Plan, u64);
    /// Move the window of `step` under the window lock: read through the old geometry,
    /// written through the new, the position advanced (unless some member did not take it).
    fn move_window(&self, a: &Array, step: ReshapeStep) -> Result<Option<Unmoved>, ArrayError>;
    /// Flush, then record `at` in every superblock (md's reshape_safe).
    fn record(&self, a: &Array, at: u64) -> Result<(), ArrayError>;
    /// The new shape in every superblock, after the new data is durable.
    fn finish(&self, a: &Array, st: &Self::Plan) -> Result<(), ArrayError>;
}

/// Run the reshape of a served array (md's reshape in raid5d/md_do_sync) until it is done,
/// `stop` is set, or it fails: each window is moved under the window lock (requests wait
/// for it, and it waits for those running), positions are recorded through the array's
/// superblocks after the new stripes are flushed, at most `max_kib_s` KiB/s (0: no limit).
/// `percent` hears each 20% step (mdadm's RebuildNN). Returns whether the reshape finished.
pub(crate) fn run_served(
    a: &Array,
    stop: &std::sync::atomic::AtomicBool,
    max_kib_s: u64,
    percent: &mut dyn FnMut(u32),
) -> Result<bool, ArrayError> {
    if let Some(pers) = a.reshaping10() {
        return raid10::run_served10(a, pers, stop, max_kib_s, percent);
    }
    let pers = a
        .reshaping()
        .ok_or_else(|| ArrayError::Refused("the array is not in the middle of a reshape".into()))?;
    a.check_writable("a reshape")?;
    drive_served(a, pers, stop, max_kib_s, percent)
}

/// The served reshape loop both personalities share.
pub(crate) fn drive_served<P: ServedReshape>(
    a: &Array,
    pers: &P,
    stop: &std::sync::atomic::AtomicBool,
    max_kib_s: u64,
    percent: &mut dyn FnMut(u32),
) -> Result<bool, ArrayError> {
    use std::sync::atomic::Ordering;
    let began = Instant::now();
    let mut copied = 0u64;
    let mut last_checkpoint = Instant::now();
    let mut last_percent = 0;
    loop {
        let (st, safe) = pers.now();
        let stopping = stop.load(Ordering::SeqCst) || a.sync_intr.load(Ordering::SeqCst);
        // The end is recorded as a position first.
        let due = last_checkpoint.elapsed() >= CHECKPOINT_EVERY || stopping || st.is_done();
        if due && safe != st.position() {
            pers.record(a, st.position())?;
            last_checkpoint = Instant::now();
            continue;
        }
        if stopping && !st.is_done() {
            return Ok(false);
        }
        let unit = st.window_unit();
        let max = SERVED_WINDOW_SECTORS.div_ceil(unit) * unit;
        let step = st.next_step(safe, max)?;
        match step {
            ReshapeStep::Done => {
                pers.finish(a, &st)?;
                return Ok(true);
            }
            ReshapeStep::Checkpoint => {
                pers.record(a, st.position())?;
                last_checkpoint = Instant::now();
            }
            ReshapeStep::Copy { sectors, .. } => {
                if let Some(w) = pers.move_window(a, step)? {
                    // Failed outside the window lock (the failure is written to the
                    // superblocks); the window is moved again without them.
                    for (r, e) in &w.failed {
                        a.member_error(*r, e);
                    }
                    if !a.is_running() || !pers.survives(&a.missing_roles()) {
                        return Err(w.error);
                    }
                    continue;
                }
                copied += sectors;
                let total = st.new_array_sectors().max(1);
                let done = pers.now().0.done_sectors();
                let pct = (done.min(total) * 100 / total) as u32 / 20 * 20;
                if pct > last_percent && pct < 100 {
                    last_percent = pct;
                    percent(pct);
                }
                if max_kib_s > 0 {
                    let due = Duration::from_secs_f64(
                        (copied * SECTOR_BYTES) as f64 / (max_kib_s * 1024) as f64,
                    );
                    while let Some(wait) = due.checked_sub(began.elapsed()) {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        std::thread::sleep(wait.min(Duration::from_millis(50)));
                    }
                }
            }
        }
    }
}

impl ServedReshape for ReshapePers {
    type Plan = ReshapeState;

    fn now(&self) -> (ReshapeState, u64) {
        let p = self.progress();
        (p.st.clone(), p.safe)
    }

    fn move_window(&self, a: &Array, step: ReshapeStep) -> Result<Option<Unmoved>, ArrayError> {
        let ReshapeStep::Copy { start, sectors } = step else {
            return Ok(None);
        };
        let mut p = self.progress_mut();
        let data = read_window(a, self, &p.st, start, sectors)?;
        let devs = self.new_writers(a);
        match write_window(a, self, &devs, &p.st.new, start, sectors, &data) {
            Ok(()) => {
                p.st.advance(step);
                Ok(None)
            }
            Err(w) => Ok(Some(Unmoved {
                error: w.error(),
                failed: w.failed,
            })),
        }
    }

    fn record(&self, a: &Array, at: u64) -> Result<(), ArrayError> {
        record_position(a, self, at)
    }

    fn finish(&self, a: &Array, st: &ReshapeState) -> Result<(), ArrayError> {
        finish_served(a, self, st)
    }
}

/// Flush what the windows wrote, then record `at` as the reshape position in every
/// superblock, with the recovery_offset of the members the reshape rebuilds moved to it
/// (md's reshape_request); from then on writes below it go to the new geometry only.
fn record_position(a: &Array, pers: &ReshapePers, at: u64) -> Result<(), ArrayError> {
    flush_writers(a, pers);
    // Taken before the metadata lock: a request that holds the position may wait for it.
    let st = pers.state();
    {
        let mut m = a.meta();
        pers.advance_rebuilt(a, &st, at);
        m.template.reshape_position = at;
        m.write_all(a)?;
    }
    pers.progress_mut().safe = at;
    Ok(())
}

/// Flush every member in sync; one that fails is failed.
fn flush_live(a: &Array) {
    for r in 0..a.geometry().raid_disks {
        if let Some(d) = a.live(MemberIdx(r)) {
            if let Err(e) = d.flush() {
                a.member_error(MemberIdx(r), &e);
            }
        }
    }
}

/// Flush every member the new stripes went to (in sync, or rebuilt by the reshape); one
/// that fails is failed.
fn flush_writers(a: &Array, pers: &ReshapePers) {
    for (r, d) in pers.new_writers(a).into_iter().enumerate() {
        if let Some(d) = d {
            if let Err(e) = d.flush() {
                a.member_error(MemberIdx(r), &e);
            }
        }
    }
}

/// The end of a served reshape: the new stripes durable, then every superblock says the
/// new shape (md's raid5_finish_reshape). The array keeps serving through the new
/// geometry; its larger size (a grow) is exported from the next start.
fn finish_served(a: &Array, pers: &ReshapePers, st: &ReshapeState) -> Result<(), ArrayError> {
    use uraid_core::geometry::reshape::finish_superblock;
    flush_writers(a, pers);
    let (new, dev_sectors, move_by) = (st.new.clone(), st.dev_sectors(), st.new_offset_sectors);
    {
        let mut m = a.meta();
        // A member the reshape rebuilt whole is in sync now (md's end_reshape).
        pers.rebuilt_in_sync(a, st);
        finish_superblock(&mut m.template, &new, dev_sectors, move_by);
        for (_, own) in m.members.iter_mut() {
            if let Some(own) = own {
                finish_superblock(own, &new, dev_sectors, move_by);
            }
        }
        for (_, own) in m.spares.iter_mut() {
            finish_superblock(own, &new, dev_sectors, move_by);
        }
        if m.needs_resync {
            // Stripes written when the power went were in either geometry: all of it.
            m.template.resync_offset = 0;
        }
        m.write_all(a)?;
    }
    let mut p = pers.progress_mut();
    p.safe = p.st.position_sectors;
    p.finished = true;
    Ok(())
}
