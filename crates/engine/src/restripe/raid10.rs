//! Continuing a raid10 reshape on the members of an array that is not served (md's
//! reshape_request), in md's on-disk format, so that one Linux md left mid-way uraid
//! finishes and one uraid stops part-way Linux md goes on with.
//!
//! Window by window ([`Raid10Reshape::next_step`]): the window's array sectors are read
//! through the old geometry at the old data offset (from any copy that reads; zeros past
//! the old array's end, which md resyncs after its reshape and uraid writes once) and
//! written to every copy of the new geometry at each member's new data offset. Before a
//! window would reach a member sector that the old geometry still needs after a restart
//! from the recorded position, the members are flushed and every superblock records the
//! position (`reshape_position`, events + 1), as md does. At the end the superblocks get
//! the new shape: layout, chunk, `raid_disks`, `data_offset` moved by each member's
//! `new_offset`, the reshape feature bits cleared.

use crate::array::Array;
use crate::assemble::{AssembleReport, MemberOutcome};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::io::{execute, Op};
use crate::member::Member;
use crate::reshape10::Reshape10Pers;
use crate::restripe::{ReshapeOptions, ReshapeReport};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::geometry::raid10::layout_name;
use uraid_core::geometry::{Raid10Reshape, ReshapeStep, ReshapeWalk, Side};
use uraid_core::{MemberIdx, SECTOR_BYTES};

/// The most array data one window copies (4 MiB).
const MAX_WINDOW_SECTORS: u64 = 8192;

/// A checkpoint at least this often, so a restart repeats little and Linux sees progress.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

fn shape_change(st: &Raid10Reshape) -> String {
    format!(
        "raid10 {} -> {} devices, chunk {} -> {} KiB, layout {} -> {}",
        st.old.raid_disks,
        st.new.raid_disks,
        st.old.chunk_sectors / 2,
        st.new.chunk_sectors / 2,
        layout_name(st.old.layout),
        layout_name(st.new.layout)
    )
}

/// Go on with the raid10 reshape of `array` (assembled from `devs`, read-only) to its end
/// or to [`ReshapeOptions::stop_at`]. Stops the array.
pub(crate) fn continue_reshape10(
    array: Array,
    report: AssembleReport,
    devs: &[Arc<dyn Member>],
    targets: &[Arc<dyn Member>],
    mut opts: ReshapeOptions,
) -> Result<ReshapeReport, ArrayError> {
    let pers = array
        .reshaping10()
        .expect("called for a raid10 mid-reshape");
    // Only this function writes (copies and superblocks); the array, read-only, reads (it
    // is assembled read-write now that a raid10 mid-reshape is served so).
    array.set_read_only(true);
    let mut st = pers.state();
    let mut by_role: Vec<Option<Arc<dyn Member>>> = vec![None; st.new.raid_disks];
    for (d, m) in devs.iter().zip(&report.members) {
        if let MemberOutcome::Active(r) = m.outcome {
            if r < by_role.len() && array.live(MemberIdx(r)).is_some() {
                by_role[r] = Some(d.clone());
            }
        }
    }
    if let Err(e) = st.can_finish() {
        let _ = array.stop();
        return Err(ArrayError::Refused(format!(
            "{}: uraid cannot continue this reshape to its end ({e}); nothing was written: \
             finish it with mdadm --grow --continue",
            report.uuid
        )));
    }
    let total = st.new_array_sectors().max(st.array_sectors());
    let mut safe = st.position_sectors;
    let (mut windows, mut checkpoints, mut events) = (0u64, 0u64, report.events);
    let began = Instant::now();
    let mut last_checkpoint = Instant::now();
    let mut copied = 0u64;
    let reached = |st: &Raid10Reshape, at: u64| {
        if st.backwards {
            st.position_sectors <= at
        } else {
            st.position_sectors >= at
        }
    };
    let result: Result<bool, ArrayError> = (|| loop {
        let due = last_checkpoint.elapsed() >= CHECKPOINT_EVERY && safe != st.position_sectors;
        let stop_due = opts.start_only || opts.stop_at.is_some_and(|at| reached(&st, at));
        // The end is recorded as a position first: a power cut while the superblocks are
        // rewritten as finished leaves only states that read the same.
        let end_due = st.is_done() && safe != st.position_sectors;
        let step = if due || end_due || (stop_due && safe != st.position_sectors) {
            ReshapeStep::Checkpoint
        } else if stop_due {
            return Ok(false);
        } else {
            let max = opts.stop_at.map_or(MAX_WINDOW_SECTORS, |at| {
                at.abs_diff(st.position_sectors)
                    .clamp(st.window_unit(), MAX_WINDOW_SECTORS)
            });
            st.next_step(safe, max)?
        };
        match step {
            ReshapeStep::Done => return Ok(true),
            ReshapeStep::Checkpoint => {
                flush_all(targets)?;
                let at = st.position_sectors;
                events = crate::restripe::rewrite(targets, &|sb| sb.reshape_position = at)?;
                safe = at;
                checkpoints += 1;
                last_checkpoint = Instant::now();
            }
            ReshapeStep::Copy { start, sectors } => {
                let mut data = AlignedBuf::new((sectors * SECTOR_BYTES) as usize);
                pers.read_side(&array, &st, Side::Old, start, &mut data)?;
                if let Some(f) = write_window(&array, pers, &by_role, &st, start, &data).first() {
                    return Err(window_failed(f));
                }
                st.advance(step);
                windows += 1;
                copied += sectors;
                opts.window_done(st.done_sectors(), total, copied, began);
            }
        }
    })();
    let counts = (windows, checkpoints, events);
    if let Some(stopped) = crate::restripe::stop_after_windows(
        array,
        result,
        &shape_change(&st),
        (safe, total),
        counts,
    )? {
        return Ok(stopped);
    }
    // Done: the new copies are durable before any superblock says the new shape; the
    // bitmap takes the new array's size before they do.
    flush_all(targets)?;
    let new = st.new.clone();
    resize_bitmaps10(targets, &new)?;
    events = crate::restripe::rewrite(targets, &|sb| {
        uraid_core::geometry::reshape10::finish_superblock10(sb, &new)
    })?;
    Ok(ReshapeReport {
        summary: format!("reshape {} finished", shape_change(&st)),
        finished: true,
        position_sectors: st.end_position(),
        windows,
        checkpoints,
        events,
        added: 0,
    })
}

/// `b` resized to the array size of `new` (md resizes a raid10's bitmap with the array),
/// its chunk kept where the bits fit `room` sectors and doubled until they do otherwise.
fn resize_bitmap10(
    b: &mut crate::bitmap::BitmapState,
    new: &uraid_core::geometry::Raid10,
    room: u64,
) -> Result<(), ArrayError> {
    let to = new.array_sectors();
    if b.sb.sync_size == to {
        return Ok(());
    }
    let chunk = crate::bitmap::bitmap_chunk_for(to, b.sb.chunksize, room).ok_or_else(|| {
        ArrayError::Failed(format!(
            "the internal bitmap for the reshaped array's {to} sectors needs more than the \
             {room} sectors its area has"
        ))
    })?;
    // The reshape wrote every copy of what it moved, zeros past the old end included:
    // nothing grown needs a resync.
    b.resize(to, chunk, false)
}

/// The internal bitmap of every target resized to `new`'s array size ([`resize_bitmap10`]),
/// in the room the finished data offset leaves it, its events as they are; flushed.
fn resize_bitmaps10(
    targets: &[Arc<dyn Member>],
    new: &uraid_core::geometry::Raid10,
) -> Result<(), ArrayError> {
    for d in targets {
        let sb = crate::meta::read_superblock(d.as_ref())?;
        let Some(mut b) = crate::bitmap::BitmapState::load(d.as_ref(), &sb)? else {
            continue;
        };
        let mut fin = sb.clone();
        uraid_core::geometry::reshape10::finish_superblock10(&mut fin, new);
        resize_bitmap10(
            &mut b,
            new,
            crate::bitmap::bitmap_space_sectors(&fin, false),
        )?;
        b.write(d.as_ref(), &sb, b.sb.events)?;
        d.flush()?;
    }
    Ok(())
}

fn flush_all(targets: &[Arc<dyn Member>]) -> Result<(), ArrayError> {
    for d in targets {
        d.flush()?;
    }
    Ok(())
}

/// A member's write of a window's new copies failed: (role, member sector, error).
type CopyFailed = (MemberIdx, u64, std::io::Error);

fn window_failed((role, ms, e): &CopyFailed) -> ArrayError {
    ArrayError::Failed(format!(
        "reshape: writing the new copies at member sector {ms} of member {role} \
         failed: {e}; the reshape stops at the recorded position and continues from there"
    ))
}

/// Write one window's data, array sectors from `start`, to every copy of the new geometry
/// at each member's new data offset (a role without a member is skipped: it is missing
/// in both geometries' view and gets its copies when it is rebuilt). Returns the writes
/// that failed.
fn write_window(
    a: &Array,
    pers: &Reshape10Pers,
    devs: &[Option<Arc<dyn Member>>],
    st: &Raid10Reshape,
    start: u64,
    data: &[u8],
) -> Vec<CopyFailed> {
    let g = &st.new;
    let mut ops: Vec<Op> = Vec::new();
    let mut at_of: Vec<(MemberIdx, u64)> = Vec::new();
    let mut s = start;
    let mut off = 0usize;
    while off < data.len() {
        let m = g.map(s);
        let n = ((m.contiguous_sectors * SECTOR_BYTES) as usize).min(data.len() - off);
        for &(role, ms) in &m.copies {
            if let Some(dev) = &devs[role.0] {
                let at = pers.member_byte(a, Side::New, role, ms);
                ops.push(Op::write(dev.as_ref(), at, &data[off..off + n]));
                at_of.push((role, ms));
            }
        }
        off += n;
        s += n as u64 / SECTOR_BYTES;
    }
    let results = execute(&mut ops);
    results
        .into_iter()
        .zip(at_of)
        .filter_map(|(res, (role, ms))| res.err().map(|e| (role, ms, e)))
        .collect()
}

/// Run the raid10 reshape of a served array (md's raid10 reshape_request from md_do_sync)
/// in the loop the raid4/5/6 one runs in ([`crate::restripe::drive_served`]): each window
/// read through the old geometry and written to every new copy under the window lock,
/// positions recorded (the members flushed, then every superblock through the array's
/// metadata) whenever [`Raid10Reshape::next_step`] asks, every few seconds, on a stop and
/// at the end; then the superblocks get the new shape as [`continue_reshape10`] writes it.
/// Returns whether the reshape finished.
pub(crate) fn run_served10(
    a: &Array,
    pers: &Reshape10Pers,
    stop: &std::sync::atomic::AtomicBool,
    max_kib_s: u64,
    percent: &mut dyn FnMut(u32),
) -> Result<bool, ArrayError> {
    a.check_writable("a reshape")?;
    {
        let p = pers.progress();
        if p.finished {
            return Ok(true);
        }
        if let Err(e) = p.st.can_finish() {
            return Err(ArrayError::Refused(format!(
                "uraid cannot continue this raid10 reshape to its end ({e}); nothing was \
                 written: finish it with mdadm --grow --continue"
            )));
        }
    }
    crate::restripe::drive_served(a, pers, stop, max_kib_s, percent)
}

impl crate::restripe::ServedReshape for Reshape10Pers {
    type Plan = Raid10Reshape;

    fn now(&self) -> (Raid10Reshape, u64) {
        let p = self.progress();
        (p.st.clone(), p.safe)
    }

    fn move_window(
        &self,
        a: &Array,
        step: ReshapeStep,
    ) -> Result<Option<crate::restripe::Unmoved>, ArrayError> {
        let ReshapeStep::Copy { start, sectors } = step else {
            return Ok(None);
        };
        let mut p = self.progress_mut();
        let mut data = AlignedBuf::new((sectors * SECTOR_BYTES) as usize);
        self.read_side(a, &p.st, Side::Old, start, &mut data)?;
        let devs: Vec<Option<Arc<dyn Member>>> = (0..p.st.new.raid_disks)
            .map(|r| a.live(MemberIdx(r)))
            .collect();
        let failed = write_window(a, self, &devs, &p.st, start, &data);
        if failed.is_empty() {
            p.st.advance(step);
            return Ok(None);
        }
        Ok(Some(crate::restripe::Unmoved {
            error: window_failed(&failed[0]),
            failed: failed.into_iter().map(|(r, _, e)| (r, e)).collect(),
        }))
    }

    fn record(&self, a: &Array, at: u64) -> Result<(), ArrayError> {
        record_position10(a, self, at)
    }

    fn finish(&self, a: &Array, st: &Raid10Reshape) -> Result<(), ArrayError> {
        finish_served10(a, self, st)
    }
}

/// Flush what the windows wrote, then record `at` as the reshape position in every
/// superblock; from then on writes on the new side of it go to the new geometry only.
fn record_position10(a: &Array, pers: &Reshape10Pers, at: u64) -> Result<(), ArrayError> {
    crate::restripe::flush_live(a);
    {
        let mut m = a.meta();
        m.template.reshape_position = at;
        m.write_all(a)?;
    }
    pers.progress_mut().safe = at;
    Ok(())
}

/// The end of a served raid10 reshape: the new copies durable, then every superblock says
/// the new shape ([`uraid_core::geometry::reshape10::finish_superblock10`], as
/// [`continue_reshape10`] writes it). The array keeps serving through the new geometry
/// until the cell assembles it again in its new shape.
fn finish_served10(a: &Array, pers: &Reshape10Pers, st: &Raid10Reshape) -> Result<(), ArrayError> {
    use uraid_core::geometry::reshape10::finish_superblock10;
    crate::restripe::flush_live(a);
    let new = st.new.clone();
    {
        let mut m = a.meta();
        finish_superblock10(&mut m.template, &new);
        for (_, own) in m.members.iter_mut() {
            if let Some(own) = own {
                finish_superblock10(own, &new);
            }
        }
        for (_, own) in m.spares.iter_mut() {
            finish_superblock10(own, &new);
        }
        if m.needs_resync {
            // Copies written when the power went may differ, in either geometry: all of it.
            m.template.resync_offset = 0;
        }
        // The bitmap takes the new array's size first (md's md_bitmap_resize), in the room
        // the finished data offsets leave it, then the superblocks the new shape, then the
        // bitmap their events.
        let rooms: Vec<u64> = m
            .members
            .iter()
            .filter_map(|(_, own)| own.as_ref())
            .map(|sb| crate::bitmap::bitmap_space_sectors(sb, false))
            .collect();
        if let Some(b) = m.bitmap.as_mut() {
            resize_bitmap10(b, &new, rooms.into_iter().min().unwrap_or(0))?;
            m.write_bitmap(a)?;
        }
        m.write_all(a)?;
        if m.bitmap.is_some() {
            m.write_bitmap(a)?;
        }
    }
    let mut p = pers.progress_mut();
    p.safe = p.st.position_sectors;
    p.finished = true;
    Ok(())
}

/// md's checks for starting a raid10 reshape (raid10_check_reshape, raid10_start_reshape)
/// against the array, before anything is written: near or offset copies only (never to
/// or from far), the same number of copies, the array size a whole number of new chunks,
/// the whole array present, and room before the data for the data offset to move down by at
/// least a chunk times the far copies (md's offset_diff). A shrink is md's backwards raid10
/// reshape ([`plan_shrink10`]).
pub(crate) fn plan_start10(
    a: &Array,
    report: &AssembleReport,
    req: &crate::restripe::ReshapeRequest,
    add: &[Arc<dyn Member>],
) -> Result<crate::restripe::Start, ArrayError> {
    use crate::restripe::{metadata_end, refused, NewShape, Start, MAX_OFFSET_MOVE_SECTORS};
    use uraid_core::geometry::{ArrayGeometry, Raid10};
    use uraid_core::superblock::{MetadataVersion, FEATURE_BITMAP_OFFSET};
    use uraid_core::Level;
    a.check_writable("a reshape")?;
    if let Some(to) = req.level.filter(|&l| l != Level::Raid10) {
        return Err(refused(format!(
            "md reshapes a raid10 only to raid10 (a raid10 -> {to} with the data moving is not \
             something md does)"
        )));
    }
    let meta = a.meta();
    let tmpl = meta.template().clone();
    if meta.is_090() {
        return Err(refused(crate::restripe::RESHAPE_090_REFUSAL));
    }
    // An internal bitmap stays through the reshape (it counts array sectors, which keep
    // their data), at its size until the finish resizes it to the new array's, as md does:
    // the room the data offset moves into leaves the area the larger of the two takes.
    let bitmap = meta
        .bitmap
        .as_ref()
        .filter(|_| tmpl.feature_map & FEATURE_BITMAP_OFFSET != 0)
        .map(|b| (b.sb.sync_size, b.sb.chunksize));
    if meta.needs_resync() {
        return Err(refused(
            "the array was not shut down cleanly and owes a resync: let it finish (uraid check --repair or serve it) first",
        ));
    }
    drop(meta);
    if !a.missing_roles().is_empty() || !a.recovering_roles().is_empty() {
        return Err(refused(
            "the array is degraded or recovering: uraid reshapes only a whole array; recover it first",
        ));
    }
    let g: ArrayGeometry = a.geometry().clone();
    let old = Raid10::new(&g)?;
    let far = |r: &Raid10| r.far_copies > 1 && !r.far_offset;
    if far(&old) {
        return Err(refused(
            "md does not reshape a raid10 with the far layout (raid10_check_reshape: near and \
             offset layouts only)",
        ));
    }
    let mut ng = g.clone();
    ng.raid_disks = req.raid_disks.unwrap_or(g.raid_disks);
    ng.chunk_sectors = req.chunk_sectors.unwrap_or(g.chunk_sectors);
    ng.layout = req.layout.unwrap_or(g.layout);
    let new = Raid10::new(&ng).map_err(|e| refused(format!("{} devices: {e}", ng.raid_disks)))?;
    if far(&new) {
        return Err(refused(
            "md cannot switch a raid10 to the far layout (raid10_check_reshape)",
        ));
    }
    if new.copies() != old.copies() {
        return Err(refused(format!(
            "md never changes the number of raid10 copies ({} -> {}; raid10_check_reshape)",
            old.copies(),
            new.copies()
        )));
    }
    if new.raid_disks == old.raid_disks
        && new.chunk_sectors == old.chunk_sectors
        && new.layout == old.layout
    {
        return Err(refused("the new shape is the shape the array has"));
    }
    if bitmap.is_some() && new.raid_disks > old.raid_disks {
        // Found in the VM: a grow uraid started with a bitmap and Linux finished left the
        // grown range's copies unsynced (Linux resyncs it by bits its own start sets in
        // memory, and it loads none past the old size when it assembles mid-reshape).
        return Err(refused(format!(
            "growing a raid10 with an internal bitmap from {} to {} devices: md marks the \
             grown range for its resync in the in-memory bitmap of the reshape it starts, \
             which uraid cannot hand to Linux md, so a grow uraid starts and Linux finishes \
             would leave that range's copies unsynced: remove the bitmap first (uraid grow \
             --bitmap none), grow, then add it again (or grow with mdadm, whose reshape \
             uraid continues with the bitmap)",
            old.raid_disks, new.raid_disks
        )));
    }
    let bitmap_bytes = bitmap.map_or(0, |(sync, chunk)| {
        uraid_core::bitmap::space_bytes(sync, chunk)
            .max(uraid_core::bitmap::space_bytes(new.array_sectors(), chunk))
    });
    if new.raid_disks < old.raid_disks {
        return plan_shrink10(a, report, &old, ng, req.array_sectors, bitmap_bytes);
    }
    if !a
        .size_bytes()
        .is_multiple_of(new.chunk_sectors * SECTOR_BYTES)
    {
        return Err(refused(format!(
            "the array size ({} sectors) is not a whole number of new chunks ({} sectors; md: \
             \"not factor of array size\")",
            a.size_bytes() / SECTOR_BYTES,
            new.chunk_sectors
        )));
    }
    let sbs: Vec<_> = (0..g.raid_disks)
        .filter_map(|r| a.meta().member_sb(MemberIdx(r)).cloned())
        .collect();
    if sbs.iter().any(|s| s.version() == MetadataVersion::V1_0) {
        return Err(refused(
            "a 1.0 array keeps its data at sector 0 with no room before it, so the data \
             offset cannot move down, and md reshapes a raid10 only by moving it",
        ));
    }
    let room = sbs
        .iter()
        .map(|s| s.data_offset.saturating_sub(metadata_end(s, bitmap_bytes)))
        .min()
        .unwrap_or(0);
    let unit = old.chunk_sectors.max(new.chunk_sectors);
    let offset_move = room.min(MAX_OFFSET_MOVE_SECTORS) / unit * unit;
    let st = Raid10Reshape {
        old: old.clone(),
        new: new.clone(),
        position_sectors: 0,
        backwards: false,
        offset_diff_sectors: offset_move,
        new_offset_sectors: -(offset_move as i64),
    };
    st.check().and_then(|()| st.can_finish()).map_err(|e| {
        refused(format!(
            "{e}: the members have {room} sectors between their metadata and their data, \
             and md moves a raid10's data offset by at least {} sectors to reshape it",
            st.min_offset_diff()
        ))
    })?;
    let spares_ready = report
        .members
        .iter()
        .filter(|m| matches!(m.outcome, MemberOutcome::Spare))
        .count();
    let roles_wanted = new.raid_disks - old.raid_disks;
    if spares_ready + add.len() < roles_wanted {
        return Err(refused(format!(
            "growing to {} devices needs {roles_wanted} device(s) for the new roles; the \
             array has {spares_ready} spare(s) and {} were given with --add",
            new.raid_disks,
            add.len()
        )));
    }
    let need = (g.dev_sectors + sbs[0].data_offset) * SECTOR_BYTES;
    if let Some(d) = add.iter().find(|d| d.size_bytes() < need) {
        return Err(refused(format!(
            "{} is {} bytes, a member of this array needs at least {need}",
            d.name(),
            d.size_bytes()
        )));
    }
    Ok(Start {
        new: NewShape {
            level: Level::Raid10,
            layout: new.layout,
            chunk_sectors: new.chunk_sectors,
            raid_disks: new.raid_disks,
        },
        old_disks: old.raid_disks,
        roles_wanted,
        spares_ready,
        offset_move,
        bitmap_bytes,
        summary: shape_change(&st),
        shrink: None,
    })
}

/// md's shrink of a raid10 (`--raid-devices` fewer, after `--array-size`; raid10_start_reshape
/// with reshape_backwards): the reshape runs from the end of the smaller shape down to
/// sector 0, the data offset moving up (positive `new_offset`, by at least md's
/// offset_diff) into the room after the data. Where the members have no room there, the
/// component size shrinks to make it, not below what the kept size needs in the new
/// geometry. md's checks: the kept size a whole number of new chunks and within the smaller
/// shape (md: "array size must be reduced before number of disks").
fn plan_shrink10(
    a: &Array,
    report: &AssembleReport,
    old: &uraid_core::geometry::Raid10,
    mut ng: uraid_core::geometry::ArrayGeometry,
    keep: Option<u64>,
    bitmap_bytes: u64,
) -> Result<crate::restripe::Start, ArrayError> {
    use crate::restripe::{data_room, refused, NewShape, Shrink, Start, MAX_OFFSET_MOVE_SECTORS};
    use uraid_core::geometry::Raid10;
    use uraid_core::Level;
    let (from, to) = (old.raid_disks, ng.raid_disks);
    let new = Raid10::new(&ng)?;
    let most = new.array_sectors();
    let Some(keep) = keep else {
        return Err(refused(format!(
            "shrinking a raid10 from {from} to {to} devices reduces the array to at most \
             {}K: give --array-size SIZE (at most that) with --raid-devices to confirm that \
             the data past it goes (md: \"array size must be reduced before number of disks\")",
            most / 2
        )));
    };
    if keep == 0 || keep > most {
        return Err(refused(format!(
            "--array-size {}K: a raid10 of {to} devices in this layout holds at most {}K of \
             this array's data",
            keep / 2,
            most / 2
        )));
    }
    if !keep.is_multiple_of(new.chunk_sectors) {
        return Err(refused(format!(
            "--array-size {}K is not a whole number of {}K chunks (md: \"not factor of array \
             size\")",
            keep / 2,
            new.chunk_sectors / 2
        )));
    }
    let unit = old.chunk_sectors.max(new.chunk_sectors) * old.far_copies.max(new.far_copies) as u64;
    // What every member's data may use; the new data area moves up inside it.
    let limit = (0..from)
        .filter_map(|r| {
            let sb = a.meta().member_sb(MemberIdx(r)).cloned()?;
            Some(data_room(&sb, a.live(MemberIdx(r)).as_ref()))
        })
        .min()
        .unwrap_or(0);
    let dev = ng.dev_sectors / unit * unit;
    // The component size the kept sectors need in the new geometry (md's last_dev_address
    // of the last kept sector), in whole units.
    let needs =
        uraid_core::geometry::reshape10::last_dev_address(keep - 1, &new).div_ceil(unit) * unit;
    let dev_after = dev
        .min(limit.saturating_sub(MAX_OFFSET_MOVE_SECTORS) / unit * unit)
        .max(needs);
    let offset_move = limit.saturating_sub(dev_after).min(MAX_OFFSET_MOVE_SECTORS) / unit * unit;
    let advice = || {
        format!(
            "md moves a raid10's data offset up into room after the data, by at least {unit} \
             sectors, and the members have {} sectors there at the component size the kept \
             size needs ({needs} sectors); a smaller --array-size leaves more",
            limit.saturating_sub(needs.min(dev)),
        )
    };
    ng.dev_sectors = dev_after;
    let mut og = ng.clone();
    og.raid_disks = from;
    og.layout = old.layout;
    og.chunk_sectors = old.chunk_sectors;
    let st = Raid10Reshape {
        old: Raid10::new(&og)?,
        new: Raid10::new(&ng)?,
        position_sectors: 0,
        backwards: true,
        offset_diff_sectors: offset_move,
        new_offset_sectors: offset_move as i64,
    };
    if offset_move == 0 || st.array_sectors() < keep {
        return Err(refused(format!(
            "shrinking to {to} devices keeping {}K: {}",
            keep / 2,
            advice()
        )));
    }
    let st = Raid10Reshape {
        position_sectors: st.array_sectors(),
        ..st
    };
    st.check()
        .and_then(|()| st.can_finish())
        .map_err(|e| refused(format!("{e} ({})", advice())))?;
    let spares_ready = report
        .members
        .iter()
        .filter(|m| matches!(m.outcome, MemberOutcome::Spare))
        .count();
    let mut summary = shape_change(&st);
    let dev_before = a.geometry().dev_sectors;
    if dev_after != dev_before {
        summary.push_str(&format!(
            ", component size {dev_before} -> {dev_after} sectors"
        ));
    }
    Ok(Start {
        new: NewShape {
            level: Level::Raid10,
            layout: st.new.layout,
            chunk_sectors: st.new.chunk_sectors,
            raid_disks: to,
        },
        old_disks: from,
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
