//! A raid0's reshapes, as mdadm does them (Grow.c analyse_change reshapes a raid0 at level
//! 4): md's takeover to a raid4 whose parity role is missing, a restripe of that raid4,
//! and md's takeover back to raid0 (raid0_takeover_raid45).
//!
//! - `--raid-devices` more ([`grow_raid0`]): the raid4 restriped to more data roles.
//! - `--chunk`: the raid4 restriped to the new chunk, its parity role missing throughout.
//! - `--raid-devices` fewer with `--array-size` ([`shrink_raid0`]): the raid4 of N + 1
//!   shrunk to N (md's backwards reshape; the missing parity role goes, the last kept role
//!   becomes the parity, which the reshape writes), then the takeover back, where the
//!   member of that parity role leaves the array as mdadm's `--level=0` makes it leave
//!   ([`leave_for_raid0`]).
//!
//! Each step leaves superblocks Linux md assembles (level 4 while the data moves, so that md
//! can continue it); every refusal comes before the first write.

use super::{
    check_new_superblocks, plan, rewrite_superblocks, takeover_then_restripe, Change, GrowReport,
};
use super::{GrowRequest, GrowState, Plan};
use crate::array::Array;
use crate::assemble::{assemble, AssembleOptions, AssembleReport};
use crate::error::ArrayError;
use crate::member::Member;
use crate::meta::write_superblock;
use crate::restripe::{ReshapeOptions, ReshapeRequest};
use std::sync::Arc;
use uraid_core::superblock::{Superblock, ROLE_FAULTY};
use uraid_core::Level;

/// A device and the superblock it has (or gets).
pub(super) type Device = (Arc<dyn Member>, Superblock);

fn refuse(msg: impl Into<String>) -> ArrayError {
    ArrayError::Refused(msg.into())
}

/// The sectors each member of a raid0 gives its one zone (whole chunks), or md's refusal of
/// a raid0 with more than one zone, which its takeovers need.
pub(super) fn one_zone_sectors(st: &GrowState) -> Result<u64, ArrayError> {
    let s = &st.raid0_member_sectors;
    let chunk = u64::from(st.template.chunksize).max(1);
    if s.iter().any(|&x| x / chunk != s[0] / chunk) {
        // md/raid0: "cannot takeover raid0 with more than one zone".
        return Err(refuse(
            "md cannot take over a raid0 with more than one zone (members of different \
             sizes), and a raid0 changes level, devices or chunk only through such a \
             takeover: nothing was written; copy the data to a new array",
        ));
    }
    Ok(s[0] / chunk * chunk)
}

/// A raid0 asked for another device count or chunk: [`Plan::Raid0Grow`], or
/// [`Plan::Raid0Shrink`] with md's checks of the kept size made here (the ones that need
/// the members, room after the data among them, are the restripe's, made before the first
/// write all the same).
pub(super) fn plan_raid0(st: &GrowState, req: &GrowRequest) -> Result<Plan, ArrayError> {
    let t = &st.template;
    let n = t.raid_disks as usize;
    let chunk = u64::from(t.chunksize);
    if req.layout.is_some_and(|l| l != t.layout) {
        return Err(refuse(
            "a raid0's --layout names how md reads its zones (RAID0_ORIG/ALT_MULTIZONE), \
             not a restripe: uraid does not change it; nothing was written",
        ));
    }
    let want = req.raid_disks.unwrap_or(n);
    if want >= n {
        return Ok(Plan::Raid0Grow(
            want,
            req.chunk_sectors.filter(|&c| c != chunk),
        ));
    }
    if want == 0 {
        return Err(refuse(
            "a raid0 needs at least 1 device: nothing was written",
        ));
    }
    if req.chunk_sectors.is_some_and(|c| c != chunk) {
        return Err(refuse(
            "a raid0's shrink and its chunk change are two reshapes: shrink first \
             (--raid-devices with --array-size), then change the chunk; nothing was written",
        ));
    }
    let zone = one_zone_sectors(st)?;
    let most = zone * want as u64;
    let Some(keep) = req.array_sectors else {
        return Err(refuse(format!(
            "shrinking a raid0 from {n} to {want} devices reduces it to at most {}K: give \
             --array-size SIZE (at most that) with --raid-devices to confirm that the data \
             past it goes (md: \"array size must be reduced before number of disks\"); \
             nothing was written",
            most / 2
        )));
    };
    if keep == 0 || keep > most {
        return Err(refuse(format!(
            "--array-size {}K: a raid0 of {want} devices holds at most {}K of this array's \
             data ({}K on each){}; nothing was written",
            keep / 2,
            most / 2,
            zone / 2,
            if keep == 0 {
                " and needs more than 0"
            } else {
                ""
            }
        )));
    }
    if !keep.is_multiple_of(chunk) {
        let down = keep / chunk * chunk;
        return Err(refuse(format!(
            "--array-size {}K is not a whole number of {}K chunks, and a raid0 holds whole \
             chunks (md's raid0_size): give {}; nothing was written",
            keep / 2,
            chunk / 2,
            if down > 0 {
                format!("{}K", down / 2)
            } else {
                format!("{}K", chunk / 2)
            }
        )));
    }
    Ok(Plan::Raid0Shrink(want, keep))
}

/// mdadm's way to grow a raid0: the takeover to a raid4 whose parity role is missing, the
/// restripe of that raid4 to `want` data roles with its new parity role left missing, then
/// the takeover back to raid0. md gives the first new device the old parity role and lets
/// the reshape fill it; uraid rebuilds that parity onto it first
/// ([`takeover_then_restripe`]), so that the reshape starts from a whole raid4: the end is
/// the same raid0.
pub(super) fn grow_raid0(
    array: Array,
    devs: Vec<Arc<dyn Member>>,
    report: &AssembleReport,
    st: &GrowState,
    (want, chunk): (usize, Option<u64>),
    mut reshape: ReshapeOptions,
    utime: u64,
) -> Result<GrowReport, ArrayError> {
    let n = st.template.raid_disks as usize;
    let needed = want - n;
    if reshape.add.len() < needed {
        let e = raid0_lacks_devices(n, want, reshape.add.len());
        array.stop()?;
        return Err(e);
    }
    // The degraded raid4 the restripe leaves is md's way, not a choice: no --force needed.
    reshape.force = true;
    // Only a growth gives the raid4's parity a device: a chunk change restripes the raid4
    // with its parity role missing throughout, as md does.
    if needed == 0 {
        reshape.add.clear();
    }
    let adds = reshape.add.clone();
    let r = ReshapeRequest {
        level: Some(Level::Raid4),
        raid_disks: Some(want + 1),
        chunk_sectors: chunk,
        ..Default::default()
    };
    let done = takeover_then_restripe(
        array,
        devs.clone(),
        report,
        st,
        &r,
        reshape,
        (utime, needed > 0),
    )?;
    // The devices the steps took, in the order they took them (the takeover's role
    // first, then the new roles): every --add up to the count the restripe reports.
    let added = done.reshape.as_ref().map_or(0, |d| d.added);
    let mut all = devs;
    all.extend(adds.into_iter().take(added));
    back_to_raid0(done, &all, utime)
}

/// mdadm's raid0 shrink (`--raid-devices` fewer after `--array-size`; mdadm 4.2 on Linux
/// 6.12 cannot do it in one command, as its takeover resets the array size, but does it
/// by hand: `--level=4`, `--array-size`, `--raid-devices --backup-file`, `--level=0`): the
/// takeover to a raid4 of N + 1 with its parity role missing, md's backwards shrink of that
/// raid4 to `want` + 1 devices keeping `keep` sectors (the missing parity role goes; role
/// `want` becomes the parity, written by the reshape; no backup file: the data offset moves
/// up into room after the data, [`crate::restripe`]), then the takeover back to raid0, the
/// parity member leaving the array ([`leave_for_raid0`]). Stopped mid-way it is a raid4
/// mid-reshape that uraid (`uraid grow --continue`, then `--level 0`) and Linux md continue.
pub(super) fn shrink_raid0(
    array: Array,
    devs: Vec<Arc<dyn Member>>,
    report: &AssembleReport,
    st: &GrowState,
    (want, keep): (usize, u64),
    reshape: ReshapeOptions,
    utime: u64,
) -> Result<GrowReport, ArrayError> {
    if !reshape.add.is_empty() {
        array.stop()?;
        return Err(refuse(
            "a raid0 shrink takes no new devices (--add), and a raid0 keeps no spares: \
             nothing was written",
        ));
    }
    let r = ReshapeRequest {
        level: Some(Level::Raid4),
        raid_disks: Some(want + 1),
        array_sectors: Some(keep),
        ..Default::default()
    };
    let done =
        takeover_then_restripe(array, devs.clone(), report, st, &r, reshape, (utime, false))?;
    back_to_raid0(done, &devs, utime)
}

/// After the raid4's restripe: md's takeover back to raid0 on `all` (the members the raid4
/// has), or, where the restripe stopped before its end, what is left to do.
fn back_to_raid0(
    done: GrowReport,
    all: &[Arc<dyn Member>],
    utime: u64,
) -> Result<GrowReport, ArrayError> {
    if !done.reshape.as_ref().is_some_and(|r| r.finished) {
        return Ok(GrowReport {
            summary: format!(
                "{} (then md's takeover back to raid0 once it finishes: uraid grow --continue, \
                 then uraid grow --level 0)",
                done.summary
            ),
            ..done
        });
    }
    let (array, report) = assemble(all.to_vec(), &AssembleOptions::default())?;
    let st = array.grow_state();
    let planned = plan(
        &st,
        &GrowRequest {
            level: Some(Level::Raid0),
            ..Default::default()
        },
    );
    array.stop()?;
    drop(array);
    let Plan::Superblocks(c) = planned? else {
        return Err(refuse(
            "the raid4 did not end with every data role in place after its restripe",
        ));
    };
    let took = rewrite_superblocks(all, &report, &st, c, utime)?;
    Ok(GrowReport {
        summary: format!("{}, then {}", done.summary, took.summary),
        events: took.events,
        missing_roles: took.missing_roles,
        restripe: true,
        reshape: done.reshape,
    })
}

/// mdadm's refusal of a raid0 growth from `n` to `want` devices with only `given` new ones:
/// "Need N spares to create working array, and only have M."
pub(crate) fn raid0_lacks_devices(n: usize, want: usize, given: usize) -> ArrayError {
    let needed = want - n;
    refuse(format!(
        "growing a raid0 from {n} to {want} devices needs {needed} new device(s) and {given} \
         were given with --add (mdadm: \"Need {needed} spare{} to create working array, and \
         only have {given}\"): nothing was written",
        if needed == 1 { "" } else { "s" },
    ))
}

/// The first of the two records of md's takeover of a raid4/5 as raid0 (`c`), on the
/// devices that keep a data role (`kept`); the others (`leaving`: the parity member, any
/// spare) leave the array. mdadm's `--level=0` fails and removes every device that holds
/// no data role before it asks md for the takeover (Grow.c impose_level): md records a
/// failed device as faulty in the others' superblocks and writes nothing to it again, and
/// its own superblock stays as it was (a member of the raid4, its events behind). md's
/// raid0_takeover_raid45 then sets each kept member's size to the component size, which
/// md writes as its `data_size`.
///
/// uraid writes both as one raid4/5 record on the kept members, events + 1: the leaving
/// devices' roles faulty (0xfffe), `data_size` at most the component size. A power cut
/// part-way leaves a raid4 with its parity role failed (read without it) and members one
/// event apart; the takeover's record that follows (events + 2) then finds every kept
/// member with the same `data_size` (a raid0 of one zone whichever record a cut leaves
/// each member), and the leaving devices two events behind it, named faulty: neither
/// uraid nor mdadm (which accepts a member one event behind) takes one as a member of the
/// raid0. Nothing is written when no device leaves and no size changes. Returns the kept
/// devices with the superblocks they now have.
pub(super) fn leave_for_raid0(
    kept: Vec<Device>,
    leaving: &[Device],
    c: &Change,
    utime: u64,
) -> Result<Vec<Device>, ArrayError> {
    let shrinks = kept.iter().any(|(_, sb)| sb.data_size > c.dev_sectors);
    if leaving.is_empty() && !shrinks {
        return Ok(kept);
    }
    let events = kept
        .iter()
        .chain(leaving)
        .map(|(_, sb)| sb.events)
        .max()
        .unwrap_or(0)
        + 1;
    let new: Vec<Superblock> = kept
        .iter()
        .map(|(_, sb)| {
            let mut n = sb.clone();
            for (_, l) in leaving {
                if let Some(r) = n.dev_roles.get_mut(l.dev_number as usize) {
                    *r = ROLE_FAULTY;
                }
            }
            n.data_size = n.data_size.min(c.dev_sectors);
            n.events = events;
            n.utime = utime;
            n
        })
        .collect();
    check_new_superblocks(&new)?;
    for ((dev, _), sb) in kept.iter().zip(&new) {
        write_superblock(dev.as_ref(), sb)?;
    }
    Ok(kept.into_iter().map(|(d, _)| d).zip(new).collect())
}
