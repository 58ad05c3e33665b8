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
use uraid_core::geometry::{Raid10Reshape, ReshapeStep, Side};
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
        let stop_due = opts.stop_at.is_some_and(|at| reached(&st, at));
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
                write_window(&array, pers, &by_role, &st, start, &data)?;
                st.advance(step);
                windows += 1;
                copied += sectors;
                if let Some(p) = opts.progress.as_mut() {
                    p(st.done_sectors(), total);
                }
                if let Some(rate) = opts.max_bytes_per_sec.filter(|&r| r > 0) {
                    let due = Duration::from_secs_f64((copied * SECTOR_BYTES) as f64 / rate as f64);
                    if let Some(wait) = due.checked_sub(began.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            }
        }
    })();
    let finished = match result {
        Ok(f) => f,
        Err(e) => {
            let _ = array.stop();
            return Err(e);
        }
    };
    array.stop()?;
    drop(array);
    if !finished {
        return Ok(ReshapeReport {
            summary: format!(
                "reshape {} stopped at array sector {safe} of {total}",
                shape_change(&st)
            ),
            finished: false,
            position_sectors: safe,
            windows,
            checkpoints,
            events,
            added: 0,
        });
    }
    // Done: the new copies are durable before any superblock says the new shape.
    flush_all(targets)?;
    let new = st.new.clone();
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

fn flush_all(targets: &[Arc<dyn Member>]) -> Result<(), ArrayError> {
    for d in targets {
        d.flush()?;
    }
    Ok(())
}

/// Write one window's data, array sectors from `start`, to every copy of the new geometry
/// at each member's new data offset (a role without a member is skipped: it is missing
/// in both geometries' view and gets its copies when it is rebuilt).
fn write_window(
    a: &Array,
    pers: &Reshape10Pers,
    devs: &[Option<Arc<dyn Member>>],
    st: &Raid10Reshape,
    start: u64,
    data: &[u8],
) -> Result<(), ArrayError> {
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
    for (res, (role, ms)) in results.into_iter().zip(at_of) {
        if let Err(e) = res {
            return Err(ArrayError::Failed(format!(
                "reshape: writing the new copies at member sector {ms} of member {role} \
                 failed: {e}; the reshape stops at the recorded position and continues from there"
            )));
        }
    }
    Ok(())
}
