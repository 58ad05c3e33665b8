//! Putting an existing array together from its members' superblocks, as mdadm --assemble.

use crate::array::{Array, Slot};
use crate::error::ArrayError;
use crate::member::Member;
use crate::meta::{read_member_superblock, Meta};
use crate::slot::SlotState;
use std::sync::Arc;
use uraid_core::geometry::ArrayGeometry;
use uraid_core::superblock::{
    uuid_string, Superblock, FEATURE_JOURNAL, FEATURE_RAID0_LAYOUT, FEATURE_RECOVERY_BITMAP,
    FEATURE_RECOVERY_OFFSET, FEATURE_REPLACEMENT, FEATURE_RESHAPE_ACTIVE, MAX_SECTOR, ROLE_FAULTY,
    ROLE_JOURNAL, ROLE_MAX, ROLE_SPARE,
};
use uraid_core::{Level, SECTOR_BYTES};

/// How [`assemble`] puts members together (mdadm --assemble's options).
#[derive(Clone, Debug, Default)]
pub struct AssembleOptions {
    /// Start even with stale members or disagreeing superblocks, as mdadm --force (also
    /// a dirty degraded raid4/5/6).
    pub force: bool,
    /// Start a raid4/5/6 that is both dirty (not stopped cleanly) and degraded, which md
    /// refuses without its start_dirty_degraded parameter: the CLI sets it for commands
    /// that only report; an embedder that accepts the write hole's risk may set it.
    pub start_dirty_degraded: bool,
    /// mdadm's --readonly: nothing is written to any member (not even the dirty flag or a
    /// bitmap); writes fail with EROFS. An array that needs its journal replayed (which
    /// writes) is refused.
    pub readonly: bool,
    /// The array's clock (see [`Clock`](crate::Clock)); the system's by default.
    pub clock: crate::clock::Clock,
}

/// What assembly decided about each device, for the report.
#[derive(Clone, Debug)]
pub struct AssembleReport {
    /// The array's UUID, formatted as mdadm prints it.
    pub uuid: String,
    /// The events count the array was assembled at.
    pub events: u64,
    /// What happened to each device offered, in the order given.
    pub members: Vec<MemberReport>,
    /// The array was not stopped cleanly.
    pub unclean: bool,
}

/// What [`assemble`] did with one device.
#[derive(Clone, Debug)]
pub struct MemberReport {
    /// The device's name.
    pub name: String,
    /// The events count of its superblock.
    pub events: u64,
    /// Whether and how it joined the array.
    pub outcome: MemberOutcome,
}

/// Whether and how one device joined an assembled array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberOutcome {
    /// Joined in this role.
    Active(usize),
    /// Included although its events were behind (only with force).
    ForcedActive(usize),
    /// Left out: its events are behind the array's (it missed writes).
    Stale,
    /// Left out: its superblock says it failed.
    Faulty,
    /// Joined as a spare.
    Spare,
    /// Joined as the write journal.
    Journal,
    /// Left out: another device already holds this role with the same superblock.
    Duplicate(usize),
    /// Being rebuilt to replace the member of this role (md's --replace); resumes.
    Replacement(usize),
}

/// The superblocks of one array's devices as assembly reads them: a reshape recorded at its
/// end whose clearing a power cut interrupted, or one a member missed the finish of, reads
/// as the finished shape it stands for. Whatever rewrites them whole (a takeover) starts
/// from these, so that it writes the shape the array has.
pub(crate) fn fold_finished_reshapes(sbs: &mut [Superblock]) {
    for sb in sbs.iter_mut() {
        uraid_core::geometry::reshape::fold_finished(sb);
    }
    fold_lagging_reshapes(sbs);
}

/// A member one event behind that still records a reshape the newest superblock of its
/// array no longer has missed the rewrite that finished it (a power cut): its data is in
/// the new geometry at the moved offset, as on the others, so it is read as finished.
fn fold_lagging_reshapes(sbs: &mut [Superblock]) {
    for i in 0..sbs.len() {
        if sbs[i].feature_map & FEATURE_RESHAPE_ACTIVE == 0 {
            continue;
        }
        let finished_newer = sbs.iter().any(|o| {
            o.set_uuid == sbs[i].set_uuid
                && o.events == sbs[i].events + 1
                && o.feature_map & FEATURE_RESHAPE_ACTIVE == 0
        });
        if !finished_newer {
            continue;
        }
        if sbs[i].level == 10 {
            if let Ok(Some(st)) = uraid_core::geometry::Raid10Reshape::from_superblock(&sbs[i]) {
                uraid_core::geometry::reshape10::finish_superblock10(&mut sbs[i], &st.new);
            }
            continue;
        }
        if let Ok(Some(st)) = uraid_core::geometry::ReshapeState::from_superblock(&sbs[i]) {
            let new = st.new.clone();
            uraid_core::geometry::reshape::finish_superblock(
                &mut sbs[i],
                &new,
                st.dev_sectors(),
                st.new_offset_sectors,
            );
        }
    }
}

/// Member roles an array has: `raid_disks`, or during a reshape that removes members the
/// old, larger count (`raid_disks - delta_disks`).
fn roles_during_reshape(sb: &Superblock) -> usize {
    let n = sb.raid_disks as usize;
    if sb.feature_map & FEATURE_RESHAPE_ACTIVE != 0 && sb.delta_disks < 0 {
        n + sb.delta_disks.unsigned_abs() as usize
    } else {
        n
    }
}

fn array_fields(sb: &Superblock) -> (i32, u32, u32, u32, u64) {
    (sb.level, sb.layout, sb.chunksize, sb.raid_disks, sb.size)
}

/// Assemble the array that `devs` belong to.
pub fn assemble(
    devs: Vec<Arc<dyn Member>>,
    opts: &AssembleOptions,
) -> Result<(Array, AssembleReport), ArrayError> {
    if devs.is_empty() {
        return Err(ArrayError::Assemble("no member devices given".into()));
    }
    // By device, not by path: one file under two names would take two roles.
    let named: Vec<&dyn Member> = devs.iter().map(|d| d.as_ref()).collect();
    if let Some((i, j)) = crate::placement::first_duplicate(&named) {
        return Err(ArrayError::Assemble(if devs[i].name() == devs[j].name() {
            format!("{} is given twice", devs[i].name())
        } else {
            format!(
                "{} and {} are one device ({}): give it once",
                devs[i].name(),
                devs[j].name(),
                devs[i].device_id()
            )
        }));
    }
    let mut sbs = Vec::with_capacity(devs.len());
    // A 0.90 member's record beside its v1 model.
    let mut recs090 = Vec::with_capacity(devs.len());
    for d in &devs {
        let (sb, rec) = read_member_superblock(d.as_ref())?;
        sbs.push(sb);
        recs090.push(rec);
    }
    // A reshape recorded at its end whose clearing a power cut interrupted reads as the
    // finished shape it stands for (the restripe engine writes the end first).
    fold_finished_reshapes(&mut sbs);
    // A raid10 mid-reshape with an internal bitmap is served read-write as without one
    // (its bits count array sectors, which keep their data through the reshape; the
    // finish resizes it, as md's does) when the bitmap covers the array as it is while
    // the reshape runs. One that covers less is read, not written, until uraid grow
    // --continue finishes it: nothing reaches its members, assembly included, as with
    // --readonly.
    let raid10_bitmap = raid10_bitmap_short(&devs, &sbs);
    let readonly = opts.readonly || raid10_bitmap.is_some();
    let devs: Vec<Arc<dyn Member>> = if readonly {
        devs.into_iter()
            .map(|d| Arc::new(crate::member::ReadOnlyMember(d)) as Arc<dyn Member>)
            .collect()
    } else {
        devs
    };
    // Everything a superblock says must be something uraid honours, before anything is
    // written: a reshape in progress read with one geometry returns mixed data.
    for ((d, sb), rec) in devs.iter().zip(sbs.iter_mut()).zip(&recs090) {
        let unsupported = |what| ArrayError::Unsupported {
            array: format!("{} ({})", sb.set_name, uuid_string(&sb.set_uuid)),
            member: d.name(),
            what,
        };
        if let Some(rec) = rec {
            uraid_core::support::check090(rec).map_err(unsupported)?;
        }
        uraid_core::support::check(sb).map_err(unsupported)?;
        // md's bitmap-based recovery copies only dirty chunks above recovery_offset; uraid
        // copies all of them, which covers it, and so no longer claims the bitmap's help.
        sb.feature_map &= !FEATURE_RECOVERY_BITMAP;
    }
    // All members must belong to one array.
    let uuid0 = sbs[0].set_uuid;
    for (d, sb) in devs.iter().zip(&sbs).skip(1) {
        if sb.set_uuid != uuid0 {
            return Err(ArrayError::Assemble(format!(
                "members belong to different arrays: {} has UUID {} but {} has UUID {}",
                devs[0].name(),
                uuid_string(&uuid0),
                d.name(),
                uuid_string(&sb.set_uuid)
            )));
        }
    }
    let fresh = (0..sbs.len()).max_by_key(|&i| sbs[i].events).expect("one");
    let template = sbs[fresh].clone();
    // One array, one metadata version: a 0.90 record and a 1.x one with the same uuid are
    // two arrays (an old one left under a new one), not one.
    if let Some(i) = (0..sbs.len()).find(|&i| recs090[i].is_some() != recs090[fresh].is_some()) {
        let what = |i: usize| if recs090[i].is_some() { "0.90" } else { "1.x" };
        return Err(ArrayError::Assemble(format!(
            "{} has a {} superblock but {} a {} one: one array has one metadata version",
            devs[i].name(),
            what(i),
            devs[fresh].name(),
            what(fresh)
        )));
    }
    let level = Level::from_md(template.level).ok_or_else(|| {
        ArrayError::Assemble(format!(
            "unsupported raid level {} (uraid supports 0, 1, 4, 5, 6, 10)",
            template.level
        ))
    })?;
    // A reshape that removes members (md's shrink) keeps the leaving roles until it ends:
    // the slots cover the old count too.
    let raid_disks = roles_during_reshape(&template);
    let mut slots: Vec<Option<(usize, bool)>> = vec![None; raid_disks]; // (dev index, forced)
    let mut outcomes: Vec<MemberOutcome> = Vec::with_capacity(devs.len());
    let mut stale: Vec<(usize, usize)> = Vec::new(); // (dev, role)
    let mut replacements: Vec<(usize, usize)> = Vec::new(); // (dev, role)
    for (i, sb) in sbs.iter().enumerate() {
        if array_fields(sb) != array_fields(&template)
            && sb.events == template.events
            && !opts.force
        {
            return Err(ArrayError::Assemble(format!(
                "{} and {} have the same events count ({}) but disagree about the array \
                     (level/layout/chunk/disks/size {:?} vs {:?}); refusing without --force",
                devs[i].name(),
                devs[fresh].name(),
                sb.events,
                array_fields(sb),
                array_fields(&template)
            )));
        }
        let role = template
            .dev_roles
            .get(sb.dev_number as usize)
            .copied()
            .unwrap_or(ROLE_SPARE);
        // Two devices with one device number (an old spare whose number was reused):
        // md binds only one; the one with the newer superblock is the real one.
        let newer_twin = sbs.iter().enumerate().any(|(j, o)| {
            j != i
                && o.dev_number == sb.dev_number
                && (o.events > sb.events || (o.events == sb.events && j < i))
        });
        let outcome = if newer_twin {
            MemberOutcome::Duplicate(sb.dev_number as usize)
        } else {
            let own_role = sb
                .dev_roles
                .get(sb.dev_number as usize)
                .copied()
                .unwrap_or(ROLE_SPARE);
            match role {
                ROLE_FAULTY => MemberOutcome::Faulty,
                // A member that was away while the array ran degraded: the others recorded
                // it as removed and it missed writes. mdadm leaves such a device out (its
                // own superblock still names its role); --force may bring it back.
                ROLE_SPARE if usize::from(own_role) < raid_disks && sb.events < template.events => {
                    stale.push((i, usize::from(own_role)));
                    MemberOutcome::Stale
                }
                // A device that left a raid0 (mdadm's --level=0 fails and removes the
                // parity member of a raid4, and md then writes its role as removed): md's
                // raid0 keeps no spares and will not start with one, so it is left out, and
                // not even --force brings it back (it has no role in the raid0).
                ROLE_SPARE
                    if level == Level::Raid0
                        && own_role < ROLE_MAX
                        && sb.events < template.events =>
                {
                    MemberOutcome::Stale
                }
                ROLE_SPARE => MemberOutcome::Spare,
                ROLE_JOURNAL => MemberOutcome::Journal,
                r if (r as usize) < raid_disks => {
                    let r = r as usize;
                    // md accepts a member one event behind at assembly: a crash in the middle
                    // of a clean/dirty superblock update leaves such members, with good data.
                    if sb.events + 1 < template.events {
                        stale.push((i, r));
                        MemberOutcome::Stale
                    } else if sb.feature_map & FEATURE_REPLACEMENT != 0
                        && sb.events < template.events
                    {
                        // Every superblock update reaches a working replacement: one that
                        // is behind may have missed writes below its recovery_offset (not
                        // even --force brings it back).
                        MemberOutcome::Stale
                    } else if sb.feature_map & FEATURE_REPLACEMENT != 0 {
                        // md's replacement shares its role with the member it replaces.
                        if replacements.iter().any(|&(_, o)| o == r) {
                            return Err(ArrayError::Assemble(format!(
                                "two replacements claim role {r} ({} is one)",
                                devs[i].name()
                            )));
                        }
                        replacements.push((i, r));
                        MemberOutcome::Replacement(r)
                    } else if let Some((other, _)) = slots[r] {
                        return Err(ArrayError::Assemble(format!(
                            "{} and {} both claim role {r}",
                            devs[other].name(),
                            devs[i].name()
                        )));
                    } else {
                        slots[r] = Some((i, false));
                        MemberOutcome::Active(r)
                    }
                }
                _ => MemberOutcome::Spare,
            }
        };
        outcomes.push(outcome);
    }
    // A replacement whose member is gone takes the role and goes on as a recovery (md moves
    // it into the member's place); otherwise it is attached beside the member below.
    replacements.retain(|&(i, r)| {
        if slots[r].is_some() {
            return true;
        }
        slots[r] = Some((i, false));
        outcomes[i] = MemberOutcome::Active(r);
        sbs[i].feature_map &= !FEATURE_REPLACEMENT;
        false
    });
    // Stale members: md kicks them out; mdadm --force brings back the freshest ones when the
    // array could not start otherwise.
    stale.sort_by_key(|&(i, _)| std::cmp::Reverse(sbs[i].events));
    if level == Level::Raid0 && slots.iter().any(|s| s.is_none()) {
        let missing: Vec<String> = (0..raid_disks)
            .filter(|&r| slots[r].is_none())
            .map(|r| r.to_string())
            .collect();
        return Err(ArrayError::Assemble(format!(
            "raid0 {} cannot start: it has no redundancy and role(s) {} are missing",
            uuid_string(&uuid0),
            missing.join(", ")
        )));
    }
    let geometry = geometry_from(&template, level, &slots, &sbs)?;
    let personality = uraid_core::geometry::Personality::new(&geometry)?;
    let missing = |slots: &Vec<Option<(usize, bool)>>| {
        (0..raid_disks)
            .filter(|&r| slots[r].is_none())
            .map(uraid_core::MemberIdx)
            .collect::<Vec<_>>()
    };
    if opts.force {
        for &(i, r) in &stale {
            if personality.survives(&missing(&slots)) {
                break;
            }
            if slots[r].is_none() {
                slots[r] = Some((i, true));
                outcomes[i] = MemberOutcome::ForcedActive(r);
            }
        }
    }
    if !personality.survives(&missing(&slots)) {
        let hint = if !stale.is_empty() && !opts.force {
            format!(
                "; {} member(s) have older events ({}) and were left out: --force may start it",
                stale.len(),
                stale
                    .iter()
                    .map(|&(i, _)| format!("{} events {}", devs[i].name(), sbs[i].events))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            String::new()
        };
        return Err(ArrayError::Assemble(format!(
            "{level} {} cannot start: {} of {raid_disks} members usable, it tolerates {} missing{hint}",
            uuid_string(&uuid0),
            raid_disks - missing(&slots).len(),
            personality.max_degraded(),
        )));
    }
    // Every member must hold its data area.
    let placed = slots
        .iter()
        .enumerate()
        .filter_map(|(r, s)| s.map(|s| (r, s.0)));
    for (r, i) in placed.chain(replacements.iter().map(|&(i, r)| (r, i))) {
        {
            let i = &i;
            let sb = &sbs[*i];
            let need = (sb.data_offset + member_data_sectors(&geometry, r, sb)) * SECTOR_BYTES;
            if devs[*i].size_bytes() < need {
                return Err(ArrayError::Assemble(format!(
                    "{}: device is {} bytes but its superblock needs {need} (truncated member?)",
                    devs[*i].name(),
                    devs[*i].size_bytes()
                )));
            }
        }
    }
    let journal = template.feature_map & FEATURE_JOURNAL != 0;
    let (reshape, reshape10) = if level == Level::Raid10 {
        let rebuilding = recovering_or_replacing(&slots, &sbs, &replacements);
        let r = reshape10_of(&template, &slots, &sbs, &devs, rebuilding)?;
        (None, r)
    } else {
        let replacing = !replacements.is_empty();
        let r = reshape_of(&template, &slots, &sbs, &devs, replacing, journal)?;
        (r, None)
    };
    let mut members_sb: Vec<Option<Superblock>> = vec![None; raid_disks];
    let mut array_slots: Vec<Slot> = Vec::with_capacity(raid_disks);
    let mut recovering: Vec<(usize, u64)> = Vec::new(); // (role, recovery_offset)
    let mut template = template;
    for (r, s) in slots.iter().enumerate() {
        match s {
            Some((i, forced)) => {
                let mut sb = sbs[*i].clone();
                if *forced {
                    sb.events = template.events;
                }
                let slot = Slot::new(Some(devs[*i].clone()), sb.data_offset * SECTOR_BYTES);
                // md's rdev flags from devflags (super_1_validate); support::check refused
                // any bit but write-mostly and failfast.
                slot.set_member_flags(sb.member_flags());
                array_slots.push(slot);
                if sb.feature_map & FEATURE_RECOVERY_OFFSET != 0 && sb.recovery_offset != MAX_SECTOR
                {
                    recovering.push((r, sb.recovery_offset));
                }
                members_sb[r] = Some(sb);
            }
            None => array_slots.push(Slot::new(None, 0)),
        }
    }
    // A forced-in member takes back its role in the superblocks.
    for (r, s) in slots.iter().enumerate() {
        if let Some((i, true)) = s {
            let n = sbs[*i].dev_number as usize;
            if n < template.dev_roles.len() {
                template.dev_roles[n] = r as u16;
            }
        }
    }
    // md writes the role of a device that is not in the running array as 0xffff (removed):
    // once a degraded array writes its superblocks, the present members say `AA.`, not
    // `AAA`, and a returning stale member is no longer taken for the holder of its role.
    for (r, s) in slots.iter().enumerate() {
        if s.is_none() {
            for role in template
                .dev_roles
                .iter_mut()
                .filter(|x| usize::from(**x) == r)
            {
                *role = ROLE_SPARE;
            }
        }
    }
    let unclean = template.resync_offset != uraid_core::superblock::MAX_SECTOR;
    let report = AssembleReport {
        uuid: uuid_string(&uuid0),
        events: template.events,
        members: devs
            .iter()
            .zip(&sbs)
            .zip(outcomes)
            .map(|((d, sb), outcome)| MemberReport {
                name: d.name(),
                events: sb.events,
                outcome,
            })
            .collect(),
        unclean,
    };
    let mut meta = Meta::new(template, members_sb);
    meta.read_only = readonly;
    meta.v090 = recs090[fresh]
        .as_ref()
        .map(uraid_core::superblock090::Sb090Context::from_record);
    if let Some((i, _)) = slots.iter().flatten().next() {
        meta.bitmap = crate::bitmap::BitmapState::load(devs[*i].as_ref(), &sbs[*i])?;
    }
    for (i, o) in report.members.iter().enumerate() {
        if o.outcome == MemberOutcome::Spare {
            meta.spares.push((devs[i].clone(), sbs[i].clone()));
        }
    }
    // The raid5 journal: md will not start an array whose journal is missing unless forced
    // (its writes would have no write-hole protection).
    let journal_dev = report
        .members
        .iter()
        .position(|o| o.outcome == MemberOutcome::Journal)
        .filter(|&i| sbs[i].events + 1 >= meta.template.events);
    let wants_journal = meta.template.feature_map & FEATURE_JOURNAL != 0;
    if wants_journal && journal_dev.is_none() && !opts.force {
        return Err(ArrayError::Assemble(format!(
            "{} has a write journal but no journal device was given (or it is stale); \
             --force starts it without one",
            uuid_string(&uuid0)
        )));
    }
    // Read-only: a journal of a cleanly stopped array holds nothing the members lack, so
    // it is left closed; otherwise it must be replayed, which writes.
    let journal_dev = match journal_dev {
        Some(_) if readonly && unclean => {
            return Err(ArrayError::ReadOnly(format!(
                "{} was not stopped cleanly and its write journal must be replayed onto the \
                 members first, which writes: assemble it once without --readonly",
                uuid_string(&uuid0)
            )))
        }
        Some(_) if readonly => None,
        j => j,
    };
    if let Some(i) = journal_dev {
        meta.journal = Some((devs[i].clone(), sbs[i].clone()));
    }
    // md's "cannot start dirty degraded array": after an unclean stop, parity may not match
    // the data of the stripes written at the crash (the write hole); with a member missing
    // or being rebuilt, what is read or rebuilt through that parity would be wrong, and no
    // resync can tell. A journal replayed at start closes the hole.
    // md's dirty_parity_disks (raid5_run): a member the reshape rebuilds that holds only
    // parity where it is not yet valid (the old geometry, and the new one past its
    // recovery_offset) leaves every data chunk on a member in sync, which a crash cannot
    // make wrong (the `-6` layouts' Q of mdadm's raid5 -> raid6): it does not count.
    let parity_only = reshape.as_ref().map_or(0, |(st, _, rebuilt)| {
        rebuilt
            .iter()
            .filter(|b| st.old.only_parity(b.role) && (b.follows || st.new.only_parity(b.role)))
            .count()
    });
    let degraded_roles = missing(&slots).len() + recovering.len() - parity_only;
    // md starts a dirty degraded raid5 with PPL (it warns): the log rewrites the parity
    // of the stripes written at the crash.
    let ppl = meta.template.has_ppl();
    if level.has_parity()
        && unclean
        && degraded_roles > 0
        && journal_dev.is_none()
        && !ppl
        && !opts.force
        && !opts.start_dirty_degraded
    {
        return Err(ArrayError::Assemble(format!(
            "{level} {} cannot start dirty degraded: it was not stopped cleanly and {} of its \
             {raid_disks} members are missing or being rebuilt, so data in the stripes being \
             written at the crash may be wrong (parity may not match it). Give every member \
             to start it and resync; or --force to start it anyway, accepting that those \
             stripes may be wrong",
            uuid_string(&uuid0),
            degraded_roles
        )));
    }
    // A member that was being rebuilt resumes where its recovery_offset says.
    for &(r, _) in &recovering {
        array_slots[r].set_state(SlotState::Recovering);
    }
    let reshape_read_only = reshape10.is_some() && raid10_bitmap.is_some();
    let mut array = match (reshape, reshape10) {
        (Some((state, new_offsets, rebuilt)), _) => crate::levels::new_reshaping_array(
            geometry,
            state,
            new_offsets,
            rebuilt,
            array_slots.into(),
            meta,
            opts.clock.clone(),
        )?,
        (None, Some((state, new_offsets))) => crate::levels::new_reshaping10_array(
            geometry,
            state,
            new_offsets,
            raid10_bitmap,
            array_slots.into(),
            meta,
            opts.clock.clone(),
        )?,
        (None, None) => {
            crate::levels::new_array(geometry, array_slots.into(), meta, opts.clock.clone())?
        }
    };
    // The reason a raid10 reshape with a bitmap is read-only stays
    // (levels::new_reshaping10_array set it).
    if !reshape_read_only {
        array.set_read_only(readonly);
    }
    for (r, off) in recovering {
        let cursor = array.cursor_for_offset(off);
        array
            .slot(uraid_core::MemberIdx(r))
            .set_recovery_cursor(cursor);
    }
    // md's bad block logs of the members that have entries.
    for (r, s) in slots.iter().enumerate() {
        if let Some((i, _)) = s {
            let bb = load_bad_blocks(devs[*i].as_ref(), &sbs[*i])?;
            array.slot(uraid_core::MemberIdx(r)).set_bad_blocks(bb);
        }
    }
    for (i, r) in replacements {
        let mut sb = sbs[i].clone();
        if unclean {
            // Writes in flight at the crash may have reached the member and not its
            // replacement (or the other way round), and a resync only looks at the members:
            // copy again from the start.
            sb.recovery_offset = 0;
        }
        array.attach_replacement(uraid_core::MemberIdx(r), devs[i].clone(), sb);
    }
    if let Some(i) = journal_dev {
        open_journal(&mut array, devs[i].clone(), &sbs[i])?;
    }
    // Read-only writes nothing: the log is neither replayed nor reset (a later assembly
    // that may write does both).
    if ppl && !opts.readonly {
        array.start_ppl(unclean)?;
    }
    Ok((array, report))
}

/// A member's bad block log (empty unless its superblock has `FEATURE_BAD_BLOCKS`).
fn load_bad_blocks(
    dev: &dyn Member,
    sb: &Superblock,
) -> Result<crate::badblocks::BadBlocks, ArrayError> {
    use uraid_core::superblock::FEATURE_BAD_BLOCKS;
    if sb.feature_map & FEATURE_BAD_BLOCKS == 0 || sb.bblog_size == 0 || sb.bblog_offset == 0 {
        return Ok(Default::default());
    }
    let at = sb.super_offset as i64 + i64::from(sb.bblog_offset);
    let mut buf = crate::buf::AlignedBuf::new(usize::from(sb.bblog_size) * 512);
    if at <= 0 || (at as u64 + u64::from(sb.bblog_size)) * 512 > dev.size_bytes() {
        return Err(ArrayError::Assemble(format!(
            "{}: bad block log at sector {at} lies outside the device",
            dev.name()
        )));
    }
    dev.read_at(&mut buf, at as u64 * 512)?;
    crate::badblocks::BadBlocks::decode(&buf, sb.bblog_shift)
        .map_err(|e| ArrayError::Assemble(format!("{}: {e}", dev.name())))
}

/// Load the journal at its journal_tail and replay it: every complete stripe logged after
/// the tail is written to the members, so parity matches data again; then the array needs
/// no resync for the write hole (md skips it too when a journal was replayed).
fn open_journal(
    array: &mut Array,
    dev: Arc<dyn Member>,
    sb: &Superblock,
) -> Result<(), ArrayError> {
    use crate::journal::{Journal, JournalArea};
    let uraid_core::geometry::Personality::Parity(g) = array.personality().clone() else {
        return Err(ArrayError::Assemble(
            "a write journal needs raid4, raid5 or raid6".into(),
        ));
    };
    let area = JournalArea {
        data_offset_bytes: sb.data_offset * SECTOR_BYTES,
        size_sectors: sb.data_size,
    };
    let j = match Journal::load(dev.clone(), area, &sb.set_uuid, sb.recovery_offset) {
        Ok(j) => {
            let rep = j.replay(&g, &*array)?;
            tracing::info!(
                "journal replayed: {} stripes rewritten, new tail {}",
                rep.stripes,
                rep.tail_sectors
            );
            crate::journal::JournalHost::set_journal_tail(&*array, rep.tail_sectors)?;
            j
        }
        Err(crate::journal::JournalError::NoLog { .. }) => {
            // md's answer to no log at the tail: start a new one.
            let seed = u64::from_le_bytes(crate::create::random_uuid()[..8].try_into().unwrap());
            let j = Journal::format(dev, area, &sb.set_uuid, seed >> 1)?;
            crate::journal::JournalHost::set_journal_tail(&*array, 0)?;
            j
        }
        Err(e) => return Err(e.into()),
    };
    array.meta().set_resync_done();
    array.set_journal(j);
    // Write-back data the log held (rows with data but no parity): written out now, each
    // row logged again with its parity first, so a crash meanwhile still recovers (md
    // also writes such stripes out at the end of its recovery).
    let recovered = array.journal().and_then(|j| j.take_recovered());
    if let Some(r) = recovered {
        tracing::info!(
            "journal: writing out {} pages of write-back data",
            r.pages.len()
        );
        array.adopt_recovered(r)?;
    }
    Ok(())
}

fn member_data_sectors(g: &ArrayGeometry, role: usize, sb: &Superblock) -> u64 {
    if g.level == Level::Raid0 {
        g.member_sectors.get(role).copied().unwrap_or(sb.data_size)
    } else {
        g.dev_sectors
    }
}

/// The layout's inputs from the superblock. raid0 uses each member's own data size.
pub fn geometry_from(
    sb: &Superblock,
    level: Level,
    slots: &[Option<(usize, bool)>],
    sbs: &[Superblock],
) -> Result<ArrayGeometry, ArrayError> {
    let member_sectors = if level == Level::Raid0 {
        slots
            .iter()
            .map(|s| s.map(|(i, _)| sbs[i].data_size).unwrap_or(0))
            .collect()
    } else {
        Vec::new()
    };
    // md treats a raid0 layout as unset unless the superblock says it was set.
    let layout = if level == Level::Raid0 && sb.feature_map & FEATURE_RAID0_LAYOUT == 0 {
        0
    } else {
        sb.layout
    };
    Ok(ArrayGeometry {
        level,
        layout,
        chunk_sectors: u64::from(sb.chunksize),
        raid_disks: slots.len(),
        dev_sectors: sb.size,
        member_sectors,
    })
}

/// Whether any member is being rebuilt or replaced.
fn recovering_or_replacing(
    slots: &[Option<(usize, bool)>],
    sbs: &[Superblock],
    replacements: &[(usize, usize)],
) -> bool {
    !replacements.is_empty()
        || slots.iter().flatten().any(|&(i, _)| {
            sbs[i].feature_map & FEATURE_RECOVERY_OFFSET != 0
                && sbs[i].recovery_offset != MAX_SECTOR
        })
}

/// What [`reshape_of`] found: both geometries and the position, each role's new data
/// offset in bytes, and the members the reshape rebuilds.
type ReshapeFound = (
    uraid_core::geometry::ReshapeState,
    Vec<u64>,
    Vec<crate::reshape::Rebuilt>,
);

/// The reshape a mid-reshape array's superblocks record, with each role's new data offset
/// in bytes and the members it rebuilds; None when no reshape runs. What uraid does not
/// read mid-reshape is refused here, by what it is.
///
/// A member with a `recovery_offset` (md's device put into an empty role by
/// `raid5_start_reshape`, which the reshape writes whole new stripes to) is valid only in
/// the new geometry, below its `recovery_offset` (md's own test in `analyse_stripe`), and
/// missing in the old one: the old geometry must hold the data without it.
fn reshape_of(
    template: &Superblock,
    slots: &[Option<(usize, bool)>],
    sbs: &[Superblock],
    devs: &[Arc<dyn Member>],
    replacing: bool,
    journal: bool,
) -> Result<Option<ReshapeFound>, ArrayError> {
    use uraid_core::geometry::{ReshapeState, Side};
    let Some(state) = ReshapeState::from_superblock(template)? else {
        return Ok(None);
    };
    let refuse = |what: String| {
        Err(ArrayError::Assemble(format!(
            "{} is in the middle of a reshape and {what}; uraid does not read that yet: \
             assemble it with Linux md / mdadm to finish the reshape",
            uuid_string(&template.set_uuid)
        )))
    };
    if replacing {
        // md: "cannot handle concurrent replacement and reshape".
        return refuse(
            "a member is being replaced (md reshapes no array with a replacement)".into(),
        );
    }
    if journal {
        return refuse("it has a write journal".into());
    }
    let mut rebuilt = Vec::new();
    for (r, s) in slots.iter().enumerate() {
        let Some((i, _)) = *s else { continue };
        let sb = &sbs[i];
        if sb.feature_map & FEATURE_RECOVERY_OFFSET == 0 || sb.recovery_offset == MAX_SECTOR {
            continue;
        }
        // md advances a rebuilt member's recovery_offset only going forwards: one that a
        // backwards reshape rebuilds has no record of how far it got.
        let Some(at) = state.recovery_offset_at(state.position_sectors) else {
            return refuse(format!(
                "{} is being rebuilt by a reshape that runs backwards, which records no \
                 progress for it (recovery_offset {})",
                devs[i].name(),
                sb.recovery_offset
            ));
        };
        rebuilt.push(crate::reshape::Rebuilt {
            role: uraid_core::MemberIdx(r),
            // It holds every new stripe below the recorded position: it goes on with the
            // reshape, its recovery_offset moved with each checkpoint (md's
            // reshape_request). One behind missed rows (a power cut as its superblock
            // was written): it keeps its recovery_offset and recovers the rest after.
            follows: sb.recovery_offset >= at,
            generation: 0,
        });
    }
    // The old geometry reads none of them: the roles it misses must be within its parity
    // (and so within the new one's, which misses no more).
    let missing = slots.iter().filter(|s| s.is_none()).count();
    let most = state.old.parity_disks().min(state.new.parity_disks());
    if !rebuilt.is_empty() && missing + rebuilt.len() > most {
        return refuse(format!(
            "{} member(s) are being rebuilt by it and {missing} missing, more than the {} \
             the old geometry can read without",
            rebuilt.len(),
            most
        ));
    }
    let mut new_offsets = vec![0u64; slots.len()];
    for (r, s) in slots.iter().enumerate() {
        let Some((i, _)) = *s else { continue };
        let sb = &sbs[i];
        // A member one event behind missed the last superblock rewrite (a power cut while
        // the reshape started or recorded a checkpoint): its data is where the newest
        // superblock says, since the members were flushed before any superblock changed.
        let lagging = sb.events < template.events;
        if !lagging
            && (sb.feature_map & FEATURE_RESHAPE_ACTIVE == 0
                || sb.reshape_position != template.reshape_position)
        {
            return refuse(format!(
                "{} does not record the same reshape position ({} against {})",
                devs[i].name(),
                sb.reshape_position,
                template.reshape_position
            ));
        }
        let own = if lagging {
            state.clone()
        } else {
            ReshapeState::from_superblock(sb)?.expect("reshape active")
        };
        let at = own.data_offset_sectors(Side::New, sb.data_offset);
        // A lagging member's own size may be the one before a shrink made it smaller.
        let size = if lagging { template.size } else { sb.size };
        let need = (at + size) * SECTOR_BYTES;
        if devs[i].size_bytes() < need {
            return Err(ArrayError::Assemble(format!(
                "{}: device is {} bytes but the reshape's new data area needs {need} \
                 (new_offset {} sectors from data_offset {})",
                devs[i].name(),
                devs[i].size_bytes(),
                own.new_offset_sectors,
                sb.data_offset
            )));
        }
        new_offsets[r] = at * SECTOR_BYTES;
    }
    Ok(Some((state, new_offsets, rebuilt)))
}

/// The raid10 reshape a mid-reshape array's superblocks record, with each role's new data
/// offset in bytes and md's offset_diff lowered to the smallest of the members'; None when
/// no reshape runs.
fn reshape10_of(
    template: &Superblock,
    slots: &[Option<(usize, bool)>],
    sbs: &[Superblock],
    devs: &[Arc<dyn Member>],
    rebuilding: bool,
) -> Result<Option<(uraid_core::geometry::Raid10Reshape, Vec<u64>)>, ArrayError> {
    use uraid_core::geometry::Raid10Reshape;
    let Some(mut state) = Raid10Reshape::from_superblock(template)? else {
        return Ok(None);
    };
    let refuse = |what: String| {
        Err(ArrayError::Assemble(format!(
            "{} is in the middle of a raid10 reshape and {what}; uraid does not read that \
             yet: assemble it with Linux md / mdadm to finish the reshape",
            uuid_string(&template.set_uuid)
        )))
    };
    if rebuilding {
        return refuse("a member is being rebuilt or replaced".into());
    }
    let mut new_offsets = vec![0u64; slots.len()];
    for (r, s) in slots.iter().enumerate() {
        let Some((i, _)) = *s else { continue };
        let sb = &sbs[i];
        // A member one event behind missed the last superblock rewrite; its own new_offset
        // still says where its new data area is (md flushes the members first).
        let lagging = sb.events < template.events;
        if !lagging
            && (sb.feature_map & FEATURE_RESHAPE_ACTIVE == 0
                || sb.reshape_position != template.reshape_position)
        {
            return refuse(format!(
                "{} does not record the same reshape position ({} against {})",
                devs[i].name(),
                sb.reshape_position,
                template.reshape_position
            ));
        }
        let new_offset = if sb.feature_map & uraid_core::superblock::FEATURE_NEW_OFFSET != 0 {
            i64::from(sb.new_offset)
        } else {
            state.new_offset_sectors
        };
        // md's conf->offset_diff: the smallest move over the members.
        state.offset_diff_sectors = state
            .offset_diff_sectors
            .min(state.offset_diff_of(new_offset));
        let at = (sb.data_offset as i64 + new_offset).max(0) as u64;
        let need = (at + state.new.used_dev_sectors) * SECTOR_BYTES;
        if devs[i].size_bytes() < need {
            return Err(ArrayError::Assemble(format!(
                "{}: device is {} bytes but the reshape's new data area needs {need} \
                 (new_offset {new_offset} sectors from data_offset {})",
                devs[i].name(),
                devs[i].size_bytes(),
                sb.data_offset
            )));
        }
        new_offsets[r] = at * SECTOR_BYTES;
    }
    state.check()?;
    Ok(Some((state, new_offsets)))
}

/// For a raid10 mid-reshape with an internal bitmap that covers fewer array sectors than
/// the array has while it reshapes: (the bitmap's sectors, the array's). `None` otherwise.
fn raid10_bitmap_short(devs: &[Arc<dyn Member>], sbs: &[Superblock]) -> Option<(u64, u64)> {
    let (d, sb) = devs.iter().zip(sbs).find(|(_, sb)| {
        sb.level == 10
            && sb.feature_map & FEATURE_RESHAPE_ACTIVE != 0
            && sb.feature_map & uraid_core::superblock::FEATURE_BITMAP_OFFSET != 0
    })?;
    let size = uraid_core::geometry::Raid10Reshape::from_superblock(sb)
        .ok()
        .flatten()?
        .array_sectors();
    // A bitmap that cannot be read is assembly's to refuse, below.
    let bits = crate::bitmap::BitmapState::read_super(d.as_ref(), sb)
        .ok()??
        .sync_size;
    (bits < size).then_some((bits, size))
}
