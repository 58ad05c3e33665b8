//! Human (mdadm-like) and JSON reports.

use crate::timefmt::ctime;
use serde_json::{json, Value};
use uraid_core::geometry::{raid10, raid5, ReshapeWalk};
use uraid_core::superblock::{self as sbm, uuid_string, Superblock};
use uraid_core::{Level, MemberIdx};
use uraid_engine::JournalMode;
use uraid_engine::{Array, SlotState, SyncKind, SyncMark, SyncProgress};

pub fn layout_name(level: Level, layout: u32) -> String {
    match level {
        Level::Raid4 => "parity-last".into(),
        Level::Raid5 | Level::Raid6 => raid5::layout_name(layout)
            .map(str::to_string)
            .unwrap_or_else(|| format!("unknown ({layout})")),
        Level::Raid10 => raid10::layout_name(layout),
        Level::Raid0 => match layout {
            1 => "original".into(),
            2 => "alternate".into(),
            _ => "-unknown-".into(),
        },
        Level::Raid1 => "-".into(),
    }
}

pub fn level_name(level: i32) -> String {
    match Level::from_md(level) {
        Some(l) => l.to_string(),
        None => format!("level {level}"),
    }
}

/// mdadm's size in words: nothing under 5000 KiB, then MiB/MB under 2 GiB, GiB/GB under
/// 2 TiB, TiB/TB above; two decimals, rounded half up.
pub fn human_size(bytes: u64) -> String {
    let b = u128::from(bytes);
    let (bin, dec, unit) = if bytes < 5000 * 1024 {
        return String::new();
    } else if bytes < 2 << 30 {
        (1u128 << 20, 1_000_000u128, "M")
    } else if bytes < 2 << 40 {
        (1 << 30, 1_000_000_000, "G")
    } else {
        (1 << 40, 1_000_000_000_000, "T")
    };
    let hundredths = |unit: u128| (b * 200 / unit).div_ceil(2);
    let (i, d) = (hundredths(bin), hundredths(dec));
    format!(
        " ({}.{:02} {unit}iB {}.{:02} {unit}B)",
        i / 100,
        i % 100,
        d / 100,
        d % 100
    )
}

fn sectors_human(s: u64) -> String {
    format!("{s} sectors{}", human_size(s.saturating_mul(512)))
}

fn kib_human(bytes: u64) -> String {
    format!("{} KiB{}", bytes / 1024, human_size(bytes))
}

/// What examine knows besides the superblock itself.
pub struct ExamineContext {
    /// The checksum the superblock's bytes have (the stored one is `sb_csum`).
    pub computed_csum: u32,
    /// Size of the member device.
    pub device_sectors: u64,
    /// Sectors the internal bitmap takes, when it could be read.
    pub bitmap_sectors: Option<u64>,
    /// This machine's name, for mdadm's "(local to host ...)".
    pub homehost: Option<String>,
}

/// mdadm's "Unused Space": sectors free before the data (after the superblock's 4 KiB
/// block, the bitmap and the bad block log) and after it (past the used size). `None` when
/// both are zero (mdadm then prints nothing).
pub fn unused_space(sb: &Superblock, cx: &ExamineContext) -> Option<(u64, u64)> {
    if sb.data_offset < sb.super_offset {
        // v1.0 layout (superblock at the end): uraid writes v1.2 only.
        return None;
    }
    // The kernel keeps the superblock's 4 KiB and 32 KiB after it for the bitmap.
    let mut earliest = sb.super_offset + 72;
    if let (Some(_), Some(bm)) = (sb.bitmap_sector(), cx.bitmap_sectors) {
        // mdadm counts the bitmap from sector bitmap_offset, not from the superblock.
        earliest = earliest.max((i64::from(sb.bitmap_offset) as u64).wrapping_add(bm));
    }
    if sb.bblog_offset != 0 && sb.bblog_size != 0 {
        let end =
            (sb.super_offset as i64 + i64::from(sb.bblog_offset)) as u64 + u64::from(sb.bblog_size);
        earliest = earliest.max(end);
    }
    let before = sb.data_offset.saturating_sub(earliest);
    let used = if sb.level <= 0 { sb.data_size } else { sb.size };
    let after = cx
        .device_sectors
        .saturating_sub(sb.data_offset)
        .saturating_sub(used);
    (before != 0 || after != 0).then_some((before, after))
}

/// The name, with mdadm's "(local to host H)" when its "H:" prefix is this machine.
fn name_with_host(name: &str, homehost: Option<&str>) -> String {
    match (name.split_once(':'), homehost) {
        (Some((h, _)), Some(me)) if !h.is_empty() && h == me => {
            format!("{name}  (local to host {h})")
        }
        _ => name.to_string(),
    }
}

/// This machine's host name, as md's homehost.
pub fn hostname() -> Option<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let h = h.trim();
    (!h.is_empty()).then(|| h.to_string())
}

fn role_string(r: u16) -> String {
    match r {
        sbm::ROLE_SPARE => "spare".into(),
        sbm::ROLE_FAULTY => "faulty".into(),
        sbm::ROLE_JOURNAL => "Journal".into(),
        n => format!("Active device {n}"),
    }
}

/// mdadm's "Array State": per role, 'A' when one device holds it, 'R' when two do (a member
/// and its replacement), '.' when none does.
fn array_state(sb: &Superblock) -> String {
    (0..sb.raid_disks)
        .map(|role| {
            match sb
                .dev_roles
                .iter()
                .filter(|&&r| u32::from(r) == role)
                .count()
            {
                0 => '.',
                1 => 'A',
                2 => 'R',
                _ => '?',
            }
        })
        .collect()
}

/// The array size one member's superblock implies (raid0 needs every member: unknown).
fn array_bytes(sb: &Superblock) -> Option<u64> {
    let level = Level::from_md(sb.level)?;
    if level == Level::Raid0 {
        return None;
    }
    let g = uraid_core::geometry::ArrayGeometry {
        level,
        layout: sb.layout,
        chunk_sectors: u64::from(sb.chunksize),
        raid_disks: sb.raid_disks as usize,
        dev_sectors: sb.size,
        member_sectors: Vec::new(),
    };
    uraid_core::geometry::Personality::new(&g)
        .ok()
        .map(|p| p.array_sectors() * 512)
}

/// A reshape's "New Level/Layout/Chunksize" lines, each only where it changes (as mdadm),
/// keys right-aligned to `width`.
fn reshape_changes(sb: &Superblock, width: usize) -> String {
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>width$} : {v}\n"));
    if sb.new_level != sb.level {
        line("New Level", level_name(sb.new_level));
    }
    if sb.new_layout != sb.layout {
        if let Some(l) = Level::from_md(sb.new_level) {
            line("New Layout", layout_name(l, sb.new_layout));
        }
    }
    if sb.new_chunk != sb.chunksize {
        line("New Chunksize", format!("{}K", sb.new_chunk / 2));
    }
    o
}

/// examine's reshape block (mdadm's super1 examine): the position in KiB, the device
/// change and the new shape; None when no reshape is recorded.
fn reshape_examine(sb: &Superblock) -> Option<String> {
    if sb.feature_map & sbm::FEATURE_RESHAPE_ACTIVE == 0 {
        return None;
    }
    let pos = sb.reshape_position;
    let mut o = format!(
        "{:>15} : {}{}\n",
        "Reshape pos'n",
        pos / 2,
        human_size(pos.saturating_mul(512))
    );
    if sb.delta_disks != 0 {
        let old = i64::from(sb.raid_disks) - i64::from(sb.delta_disks);
        o.push_str(&format!(
            "{:>15} : {} ({old}->{})\n",
            "Delta Devices", sb.delta_disks, sb.raid_disks
        ));
    }
    o.push_str(&reshape_changes(sb, 15));
    Some(o)
}

/// detail's reshape block (mdadm's Detail): how far it got, the device change and the new
/// shape; None when no reshape is recorded.
fn reshape_detail(sb: &Superblock) -> Option<String> {
    if sb.feature_map & sbm::FEATURE_RESHAPE_ACTIVE == 0 {
        return None;
    }
    let mut o = String::new();
    // md counts a reshape's progress in array sectors of the new shape, from where it began.
    let progress = if sb.level == 10 {
        uraid_core::geometry::Raid10Reshape::from_superblock(sb)
            .ok()
            .flatten()
            .map(|r| (r.done_sectors(), r.new_array_sectors()))
    } else {
        uraid_core::geometry::ReshapeState::from_superblock(sb)
            .ok()
            .flatten()
            .map(|r| (r.done_sectors(), r.new_array_sectors()))
    };
    if let Some((done, total)) = progress {
        let total = total.max(1);
        o.push_str(&format!(
            "{:>18} : {}% complete\n",
            "Reshape Status",
            done.min(total) * 100 / total
        ));
    }
    if sb.delta_disks != 0 {
        let old = i64::from(sb.raid_disks) - i64::from(sb.delta_disks);
        o.push_str(&format!(
            "{:>18} : {}, ({old}->{})\n",
            "Delta Devices", sb.delta_disks, sb.raid_disks
        ));
    }
    o.push_str(&reshape_changes(sb, 18));
    Some(o)
}

/// `examine` as mdadm prints it, line for line; a superblock whose checksum is wrong is
/// printed as found, with the checksum its bytes should have.
pub fn examine_human(path: &str, sb: &Superblock, cx: &ExamineContext) -> String {
    let level = Level::from_md(sb.level);
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    line("Magic", format!("{:x}", sbm::MD_SB_MAGIC));
    line("Version", sb.version().name().into());
    line("Feature Map", format!("{:#x}", sb.feature_map));
    line("Array UUID", uuid_string(&sb.set_uuid));
    line("Name", name_with_host(&sb.set_name, cx.homehost.as_deref()));
    line("Creation Time", ctime(sb.ctime_secs()));
    line("Raid Level", level_name(sb.level));
    line("Raid Devices", sb.raid_disks.to_string());
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    line("Avail Dev Size", sectors_human(sb.data_size));
    if let Some(bytes) = array_bytes(sb) {
        line("Array Size", kib_human(bytes));
    }
    if sb.size != 0 && sb.size != sb.data_size {
        line("Used Dev Size", sectors_human(sb.size));
    }
    line("Data Offset", format!("{} sectors", sb.data_offset));
    if sb.feature_map & sbm::FEATURE_NEW_OFFSET != 0 {
        let at = sb.data_offset as i64 + i64::from(sb.new_offset);
        line("New Offset", format!("{at} sectors"));
    }
    line("Super Offset", format!("{} sectors", sb.super_offset));
    if sb.feature_map & sbm::FEATURE_RECOVERY_OFFSET != 0 {
        line("Recovery Offset", format!("{} sectors", sb.recovery_offset));
    }
    if let Some((before, after)) = unused_space(sb, cx) {
        line(
            "Unused Space",
            format!("before={before} sectors, after={after} sectors"),
        );
    }
    line(
        "State",
        if sb.is_clean() { "clean" } else { "active" }.into(),
    );
    line("Device UUID", uuid_string(&sb.device_uuid));
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    if sb.bitmap_sector().is_some() {
        line(
            "Internal Bitmap",
            format!("{} sectors from superblock", sb.bitmap_offset),
        );
    }
    if let Some(block) = reshape_examine(sb) {
        o.push_str(&block);
        o.push('\n');
    }
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    if sb.has_ppl() {
        let (offset, size) = sb.ppl();
        line(
            "PPL",
            format!("{size} sectors at offset {offset} sectors from superblock"),
        );
    }
    // mdadm prints the device flags it knows, and the line only when devflags is set.
    if sb.devflags != 0 {
        line("Flags", sb.member_flags().examine_words());
    }
    line("Update Time", ctime(sb.utime_secs()));
    if sb.bblog_offset != 0 && sb.bblog_size != 0 {
        line(
            "Bad Block Log",
            format!(
                "{} entries available at offset {} sectors{}",
                u32::from(sb.bblog_size) * 512 / 8,
                sb.bblog_offset,
                if sb.feature_map & sbm::FEATURE_BAD_BLOCKS != 0 {
                    " - bad blocks present."
                } else {
                    ""
                }
            ),
        );
    }
    if sb.sb_csum == cx.computed_csum {
        line("Checksum", format!("{:x} - correct", sb.sb_csum));
    } else {
        line(
            "Checksum",
            format!("{:x} - expected {:x}", sb.sb_csum, cx.computed_csum),
        );
    }
    line("Events", sb.events.to_string());
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    match level {
        Some(Level::Raid1) | None => {}
        // mdadm names a raid0 layout only when the superblock records one.
        Some(Level::Raid0) => {
            if sb.feature_map & sbm::FEATURE_RAID0_LAYOUT != 0 {
                line("Layout", layout_name(Level::Raid0, sb.layout));
            }
            line("Chunk Size", format!("{}K", sb.chunksize / 2));
        }
        // raid4 has one layout; mdadm names none.
        Some(Level::Raid4) => line("Chunk Size", format!("{}K", sb.chunksize / 2)),
        Some(l) => {
            line("Layout", layout_name(l, sb.layout));
            line("Chunk Size", format!("{}K", sb.chunksize / 2));
        }
    }
    o.push('\n');
    let role = sb.role_of_this_device().unwrap_or(sbm::ROLE_SPARE);
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>14} : {v}\n"));
    // mdadm: a replacement shares its role's slot ("Replacement device N").
    let replacement =
        sb.feature_map & sbm::FEATURE_REPLACEMENT != 0 && u32::from(role) < sb.raid_disks;
    if replacement {
        line("Device Role", format!("Replacement device {role}"));
    } else if role == sbm::ROLE_FAULTY {
        // mdadm shows a device whose own entry says faulty as a spare.
        line("Device Role", "spare".into());
    } else {
        line("Device Role", role_string(role));
    }
    line(
        "Array State",
        format!(
            "{} ('A' == active, '.' == missing, 'R' == replacing)",
            array_state(sb)
        ),
    );
    format!("{path}:\n{o}")
}

pub fn examine_json(path: &str, sb: &Superblock, cx: &ExamineContext) -> Value {
    let level = Level::from_md(sb.level);
    let unused = unused_space(sb, cx);
    json!({
        "device": path,
        "magic": format!("{:x}", sbm::MD_SB_MAGIC),
        "version": sb.version().name(),
        "feature_map": sb.feature_map,
        "uuid": uuid_string(&sb.set_uuid),
        "name": sb.set_name,
        "creation_time": sb.ctime_secs(),
        "array_bytes": array_bytes(sb),
        "level": level_name(sb.level),
        "raid_disks": sb.raid_disks,
        "layout": level.map(|l| layout_name(l, sb.layout)),
        "layout_number": sb.layout,
        "chunk_bytes": u64::from(sb.chunksize) * 512,
        "avail_dev_sectors": sb.data_size,
        "used_dev_sectors": sb.size,
        "data_offset_sectors": sb.data_offset,
        "super_offset_sectors": sb.super_offset,
        "state": if sb.is_clean() { "clean" } else { "active" },
        "device_uuid": uuid_string(&sb.device_uuid),
        "update_time": sb.utime_secs(),
        "checksum": format!("{:08x}", sb.sb_csum),
        "checksum_expected": format!("{:08x}", cx.computed_csum),
        "checksum_correct": sb.sb_csum == cx.computed_csum,
        "unused_before_sectors": unused.map(|u| u.0),
        "unused_after_sectors": unused.map(|u| u.1),
        "bad_block_log_entries": (sb.bblog_offset != 0 && sb.bblog_size != 0)
            .then(|| u32::from(sb.bblog_size) * 512 / 8),
        "events": sb.events,
        "dev_number": sb.dev_number,
        "role": sb.role_of_this_device().map(role_string),
        "replacement": sb.feature_map & sbm::FEATURE_REPLACEMENT != 0,
        "recovery_offset_sectors": (sb.feature_map & sbm::FEATURE_RECOVERY_OFFSET != 0)
            .then_some(sb.recovery_offset),
        "role_number": sb.role_of_this_device().filter(|&r| u32::from(r) < sb.raid_disks),
        "array_state": array_state(sb),
        "bitmap_offset_sectors": sb.bitmap_sector().map(|_| sb.bitmap_offset),
        "write_mostly": sb.member_flags().write_mostly,
        "failfast": sb.member_flags().failfast,
    })
}

/// mdadm's State: clean or active, then degraded, and the sync that is running (or owed).
fn state_words(a: &Array, sync: Option<&SyncProgress>) -> String {
    let meta = a.meta();
    let mut w = vec![if meta.is_dirty() { "active" } else { "clean" }];
    let needs_resync = meta.needs_resync();
    drop(meta);
    if a.is_degraded() {
        w.push("degraded");
    }
    match sync.map(|p| p.kind) {
        Some(SyncKind::Resync) => w.push("resyncing"),
        Some(SyncKind::Check) => w.push("checking"),
        Some(SyncKind::Repair) => w.push("repairing"),
        // md rebuilds a recovering member or a replacement as soon as the array runs.
        Some(SyncKind::Recovery) => w.push("recovering"),
        None if !a.recovering_roles().is_empty() || !a.replacing_roles().is_empty() => {
            w.push("recovering")
        }
        None if needs_resync => w.push("resyncing (PENDING)"),
        None => {}
    }
    w.join(", ")
}

/// md's consistency policy: how the array keeps parity or copies in step after a crash.
fn consistency_policy(a: &Array, sb: &Superblock) -> &'static str {
    if a.has_journal() {
        "journal"
    } else if a.has_ppl() || sb.has_ppl() {
        "ppl"
    } else if sb.bitmap_sector().is_some() {
        "bitmap"
    } else if a.level() == Level::Raid0 {
        "none"
    } else {
        "resync"
    }
}

/// A device's state words with its md flags where mdadm --detail puts them: after "active
/// sync" or "faulty", before "spare" ("active sync writemostly", "writemostly spare
/// rebuilding").
fn with_flag_words(words: &str, flags: uraid_engine::MemberFlags) -> String {
    let f = flags.detail_words();
    if f.is_empty() {
        words.to_string()
    } else if words.starts_with("spare") {
        format!("{f} {words}")
    } else {
        format!("{words} {f}")
    }
}

/// One device row of mdadm --detail.
/// The IO engine of each file member (not an mdadm line): one word when they all agree
/// ("sync"), else each engine with its members ("io_uring (/dev/sdb), sync (a.img)").
fn io_engine_words(a: &Array) -> Option<String> {
    let mut by_engine: Vec<(&str, Vec<String>)> = Vec::new();
    for r in 0..a.raid_disks() {
        let slot = a.slot(MemberIdx(r));
        let Some(e) = slot.io_engine() else { continue };
        let name = slot.device_name().unwrap_or_default();
        match by_engine.iter_mut().find(|(n, _)| *n == e.name()) {
            Some((_, names)) => names.push(name),
            None => by_engine.push((e.name(), vec![name])),
        }
    }
    match by_engine.len() {
        0 => None,
        1 => Some(by_engine[0].0.to_string()),
        _ => Some(
            by_engine
                .iter()
                .map(|(e, names)| format!("{e} ({})", names.join(", ")))
                .collect::<Vec<_>>()
                .join(", "),
        ),
    }
}

fn device_row(o: &mut String, number: &str, raid_device: &str, state: &str, name: &str) {
    o.push_str(&format!(
        "    {number:>6}   {raid_device:>10} {state:<16} {name}"
    ));
    // No trailing blanks on a row without a device.
    while o.ends_with(' ') {
        o.pop();
    }
    o.push('\n');
}

/// A running sync for a server's detail: kind and percent, and as /proc/mdstat counts it,
/// KiB of one member done and in all, and from md's resync mark the speed (KiB/s of one
/// member) and the seconds left (md: over whole seconds, at least one).
pub fn sync_json(p: &SyncProgress, mark: Option<SyncMark>, dev_sectors: u64) -> Value {
    let total_kib = dev_sectors / 2;
    let of_member = |units: u64| -> u64 {
        (u128::from(units) * u128::from(total_kib))
            .checked_div(u128::from(p.total_units))
            .unwrap_or(0) as u64
    };
    let done_kib = of_member(p.done_units.min(p.total_units));
    let rate = mark.and_then(|m| {
        let secs = (m.elapsed_ms / 1000).max(1);
        let kib = of_member(m.units);
        (kib > 0).then(|| {
            let left = u128::from(total_kib - done_kib) * u128::from(secs) / u128::from(kib);
            (kib / secs, left as u64)
        })
    });
    json!({
        "kind": p.kind.name(),
        "done_units": p.done_units,
        "total_units": p.total_units,
        "percent": p.percent(),
        "done_kib": done_kib,
        "total_kib": total_kib,
        "speed_kib_s": rate.map(|r| r.0),
        "finish_secs": rate.map(|r| r.1),
        "zero_bytes": p.zero_bytes,
    })
}

/// A served reshape for a server's detail, in the form of [`sync_json`]: array sectors of
/// the new shape done and in all, shown as KiB of one member as /proc/mdstat counts them.
pub fn reshape_json(done: u64, total: u64, dev_sectors: u64) -> Value {
    let total_kib = dev_sectors / 2;
    let done_kib = (u128::from(done.min(total)) * u128::from(total_kib))
        .checked_div(u128::from(total))
        .unwrap_or(0) as u64;
    json!({
        "kind": "reshape",
        "done_units": done,
        "total_units": total,
        "percent": (done.min(total) * 100).checked_div(total).unwrap_or(100),
        "done_kib": done_kib,
        "total_kib": total_kib,
        "speed_kib_s": null,
        "finish_secs": null,
    })
}

/// `detail` as mdadm prints it; `sync` is the sync running in a server, if any.
pub fn detail_human(a: &Array, sync: Option<&SyncProgress>) -> String {
    let meta = a.meta();
    let sb = meta.template().clone();
    let version = meta.metadata_name();
    let dev_numbers: Vec<Option<u32>> = (0..a.raid_disks())
        .map(|r| meta.member_sb(MemberIdx(r)).map(|m| m.dev_number))
        .collect();
    drop(meta);
    let g = a.geometry();
    let roles = || (0..g.raid_disks).map(MemberIdx);
    let count = |st: SlotState| roles().filter(|&r| a.slot_state(r) == st).count();
    let in_sync = count(SlotState::InSync);
    let recovering = count(SlotState::Recovering);
    let faulty_in_role = count(SlotState::Faulty);
    let replacements = a.replacing_roles().len();
    let spares = a.spares();
    let faulty = a.faulty_devices();
    let journal = a.journal_device().map(|d| (d, a.journal_failed()));
    let journal_ok = usize::from(matches!(journal, Some((_, false))));
    let journal_bad = usize::from(matches!(journal, Some((_, true))));
    let spare_devices = recovering + replacements + spares.len();
    let failed = faulty_in_role + faulty.len() + journal_bad;

    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>18} : {v}\n"));
    line("Version", version.into());
    line("Creation Time", ctime(sb.ctime_secs()));
    line("Raid Level", g.level.to_string());
    // mdadm prints both sizes in KiB, without the unit.
    line(
        "Array Size",
        format!(
            "{}{}",
            a.exported_bytes() / 1024,
            human_size(a.exported_bytes())
        ),
    );
    if g.level != Level::Raid0 {
        let dev_bytes = g.dev_sectors * 512;
        line(
            "Used Dev Size",
            format!("{}{}", dev_bytes / 1024, human_size(dev_bytes)),
        );
    }
    line("Raid Devices", g.raid_disks.to_string());
    line(
        "Total Devices",
        (in_sync + faulty_in_role + spare_devices + faulty.len() + journal_ok + journal_bad)
            .to_string(),
    );
    line("Persistence", "Superblock is persistent".into());
    o.push('\n');
    if sb.bitmap_sector().is_some() {
        o.push_str(&format!("{:>18} : Internal\n\n", "Intent Bitmap"));
    }
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>18} : {v}\n"));
    if let Some(mode) = a.journal_mode() {
        let state = if a.journal_failed() {
            "faulty"
        } else {
            "active"
        };
        line(
            "Journal",
            format!(
                "{} ({state}, {mode})",
                a.journal_device().unwrap_or_default()
            ),
        );
        if let Some(st) = a
            .writeback_stats()
            .filter(|_| mode == JournalMode::WriteBack)
        {
            line(
                "Write-back Cache",
                format!(
                    "{} stripes, {} KiB cached",
                    st.cached_stripes,
                    st.cached_pages * 4
                ),
            );
        }
    }
    line("Update Time", ctime(sb.utime_secs()));
    line("State", state_words(a, sync));
    line("Active Devices", in_sync.to_string());
    line(
        "Working Devices",
        (in_sync + spare_devices + journal_ok).to_string(),
    );
    line("Failed Devices", failed.to_string());
    line("Spare Devices", spare_devices.to_string());
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>18} : {v}\n"));
    match g.level {
        Level::Raid1 => {}
        Level::Raid0 if sb.feature_map & sbm::FEATURE_RAID0_LAYOUT == 0 => {
            line("Chunk Size", format!("{}K", g.chunk_sectors / 2));
        }
        _ => {
            line("Layout", layout_name(g.level, g.layout));
            line("Chunk Size", format!("{}K", g.chunk_sectors / 2));
        }
    }
    if g.level != Level::Raid1 {
        o.push('\n');
    }
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>18} : {v}\n"));
    line("Consistency Policy", consistency_policy(a, &sb).into());
    if let Some(e) = io_engine_words(a) {
        line("IO Engine", e);
    }
    let never = a.never_written_bytes();
    if never > 0 {
        // uraid's own (md cannot know): regions a recovery zeroes instead of rebuilding.
        line("Never Written", format!("{} MiB", never >> 20));
    }
    if let Some(j) = a.join_stats() {
        // uraid's partial-stripe joining (not md's): writes that led a pending stripe or
        // joined one, and whether those stripes went out whole or as pieces.
        let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        line(
            "Stripe Joins",
            format!(
                "{} led, {} joined; {} stripes whole, {} in pieces",
                n(&j.led),
                n(&j.joined),
                n(&j.full),
                n(&j.partial)
            ),
        );
    }
    if let Some(p) = sync {
        let what = match p.kind {
            SyncKind::Recovery => "Rebuild Status",
            SyncKind::Resync => "Resync Status",
            SyncKind::Check | SyncKind::Repair => "Check Status",
        };
        o.push('\n');
        o.push_str(&format!(
            "{what:>18} : {}% complete\n",
            p.percent().floor() as u64
        ));
        if p.zero_bytes > 0 {
            o.push_str(&format!(
                "{:>18} : {} MiB (zeros on every member: not read nor rebuilt)\n",
                "Zeros Skipped",
                p.zero_bytes >> 20
            ));
        }
    }
    if let Some(block) = reshape_detail(&sb) {
        o.push('\n');
        o.push_str(&block);
    }
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>18} : {v}\n"));
    line("Name", name_with_host(&sb.set_name, hostname().as_deref()));
    line("UUID", uuid_string(&sb.set_uuid));
    line("Events", sb.events.to_string());
    o.push_str("\n    Number   RaidDevice State\n");
    let number = |r: usize| dev_numbers[r].map_or("-".to_string(), |n| n.to_string());
    let mut faulty_rows = Vec::new();
    for r in 0..g.raid_disks {
        let st = a.slot_state(MemberIdx(r));
        let name = a
            .slot(MemberIdx(r))
            .device_name()
            .unwrap_or_else(|| "-".into());
        let repl = a.slot(MemberIdx(r)).replacement_name();
        let role = r.to_string();
        let flags = a.slot(MemberIdx(r)).member_flags();
        let with_flags = |words: &str| with_flag_words(words, flags);
        match (&repl, st) {
            // mdadm: a failed member leaves its role "removed" and is listed as faulty
            // below, until it is removed.
            (_, SlotState::Faulty) => {
                device_row(&mut o, "-", &role, "removed", "");
                faulty_rows.push((number(r), with_flags("faulty"), name));
            }
            (_, SlotState::Missing) => device_row(&mut o, "-", &role, "removed", ""),
            // The member being replaced and its replacement share the role.
            (Some(_), SlotState::InSync) => device_row(
                &mut o,
                &number(r),
                &role,
                &with_flags("active sync replacing"),
                &name,
            ),
            _ => device_row(&mut o, &number(r), &role, &with_flags(st.describe()), &name),
        }
        if let Some(n) = repl {
            device_row(&mut o, "-", &role, "spare rebuilding replacement", &n);
        }
    }
    if let Some((j, bad)) = &journal {
        device_row(
            &mut o,
            "-",
            "-",
            if *bad { "faulty journal" } else { "journal" },
            j,
        );
    }
    for (s, flags) in a.spares_with_flags() {
        device_row(&mut o, "-", "-", &with_flag_words("spare", flags), &s);
    }
    faulty_rows.extend(faulty.into_iter().map(|(name, n)| {
        let n = if n == u32::MAX {
            "-".to_string()
        } else {
            n.to_string()
        };
        (n, "faulty".to_string(), name)
    }));
    if !faulty_rows.is_empty() {
        o.push('\n');
        for (n, state, name) in faulty_rows {
            device_row(&mut o, &n, "-", &state, &name);
        }
    }
    remote_rows(&mut o, a);
    o
}

/// Members on other hosts, after mdadm's table: connection, latency and, while lost,
/// the re-add daemon's attempts (`--nbd-readd`).
fn remote_rows(o: &mut String, a: &Array) {
    let rows: Vec<(usize, Value)> = (0..a.raid_disks())
        .filter_map(|r| Some((r, remote_json(&a.slot(MemberIdx(r)).device()?.remote()?))))
        .collect();
    if rows.is_empty() {
        return;
    }
    o.push('\n');
    for (r, m) in rows {
        o.push_str(&format!(
            "{:>18} : {}\n",
            format!("Remote {r}"),
            remote_summary(&m)
        ));
    }
}

/// A remote member's `remote` object of `detail --json`, which `status` and the monitor
/// read as well.
fn remote_json(m: &uraid_engine::RemoteStatus) -> Value {
    json!({
        "uri": m.uri,
        "connection": m.connection.name(),
        "error": m.error,
        "latency_us": m.latency_us,
        "replies": m.latency_buckets.iter().map(|b| b.1).sum::<u64>(),
        "connections": m.connections,
        "tls": m.tls,
        // While lost: the re-add daemon's tries (--nbd-readd).
        "reconnect_attempts": m.reconnect_attempts,
        "reconnect_error": m.reconnect_error,
    })
}

/// One line for a remote member (its `remote` object): URI, connection, latency, and
/// while it is not up why, and the reconnect attempts.
pub fn remote_summary(m: &Value) -> String {
    let uri = m["uri"].as_str().unwrap_or("?");
    let connection = m["connection"].as_str().unwrap_or("?");
    let mut v = format!("{uri} {connection}");
    if connection == "up" {
        if let Some(us) = m["latency_us"].as_u64() {
            v.push_str(&format!(", latency {us} us"));
        }
    } else {
        v.push_str(&format!(" ({})", m["error"].as_str().unwrap_or("")));
    }
    let attempts = m["reconnect_attempts"].as_u64().unwrap_or(0);
    if attempts > 0 {
        v.push_str(&format!(", reconnect attempts {attempts}"));
        if let Some(e) = m["reconnect_error"].as_str() {
            v.push_str(&format!(" (last: {e})"));
        }
    }
    v
}

pub fn detail_json(a: &Array) -> Value {
    let meta = a.meta();
    let sb = meta.template().clone();
    let needs_resync = meta.needs_resync();
    let dirty = meta.is_dirty();
    let version = meta.metadata_name();
    let dev_numbers: Vec<Option<u32>> = (0..a.raid_disks())
        .map(|r| meta.member_sb(MemberIdx(r)).map(|m| m.dev_number))
        .collect();
    drop(meta);
    let g = a.geometry();
    let members: Vec<Value> = (0..g.raid_disks)
        .map(|r| {
            let st = a.slot_state(MemberIdx(r));
            json!({
                "role": r,
                "state": match st {
                    SlotState::InSync => "active",
                    SlotState::Recovering => "rebuilding",
                    SlotState::Faulty => "faulty",
                    SlotState::Missing => "missing",
                },
                "device": a.slot(MemberIdx(r)).device_name(),
                "io_engine": a.slot(MemberIdx(r)).io_engine().map(|e| e.name()),
                // A member on another host: its connection and reply latency.
                "remote": a.slot(MemberIdx(r)).device().and_then(|d| d.remote()).map(|m| remote_json(&m)),
                "write_mostly": a.slot(MemberIdx(r)).member_flags().write_mostly,
                "failfast": a.slot(MemberIdx(r)).member_flags().failfast,
                // md's desc_nr, which /proc/mdstat prints as sda1[N].
                "dev_number": dev_numbers[r],
                // Mid-reshape a member the reshape rebuilds counts member sectors of the
                // new geometry (md's recovery_offset), not the level's recovery units.
                "recovery_percent": (st == SlotState::Recovering).then(|| {
                    let total = if a.is_reshaping() { g.dev_sectors } else { a.total_units() };
                    a.slot(MemberIdx(r)).recovery_cursor() as f64 * 100.0 / total.max(1) as f64
                }),
                "replacement": a.slot(MemberIdx(r)).replacement_name().map(|n| {
                    let done = a.slot(MemberIdx(r)).replacement_cursor_sectors().unwrap_or(0);
                    json!({
                        "device": n,
                        "state": "replacement",
                        "recovery_sectors": done,
                        "recovery_percent": done as f64 * 100.0 / g.dev_sectors.max(1) as f64,
                    })
                }),
            })
        })
        .collect();
    json!({
        "version": version,
        "uuid": uuid_string(&sb.set_uuid),
        "name": sb.set_name,
        "level": g.level.to_string(),
        "layout": layout_name(g.level, g.layout),
        "layout_number": g.layout,
        "chunk_bytes": if g.level == Level::Raid1 { 0 } else { g.chunk_sectors * 512 },
        "raid_disks": g.raid_disks,
        "array_bytes": a.exported_bytes(),
        "used_dev_sectors": g.dev_sectors,
        "events": sb.events,
        "state": if dirty { "active" } else { "clean" },
        "degraded": a.is_degraded(),
        "replacing": a.replacing_roles().iter().map(|r| r.0).collect::<Vec<_>>(),
        "resync_pending": needs_resync,
        "bitmap": sb.bitmap_sector().is_some(),
        "bitmap_pages": a.bitmap_pages().map(|p| json!({
            "used": p.used,
            "total": p.total,
            "chunk_kib": p.chunk_sectors / 2,
        })),
        "read_only": a.is_read_only(),
        // Bytes in regions the array knows were never written (a recovery zeroes them).
        "never_written_bytes": a.never_written_bytes(),
        "journal": a.journal_mode().map(|mode| {
            let st = a.writeback_stats().unwrap_or_default();
            json!({
                "device": a.journal_device(),
                "state": if a.journal_failed() { "faulty" } else { "active" },
                "mode": mode.name(),
                "cached_stripes": st.cached_stripes,
                "cached_bytes": st.cached_pages as u64 * 4096,
                "written_out_stripes": st.written_out_stripes,
            })
        }),
        "members": members,
        "spares": a.spares(),
        "faulty": a.faulty_devices().into_iter().map(|(d, _)| d).collect::<Vec<_>>(),
        "consistency_policy": consistency_policy(a, &sb),
        // raid4/5/6: partial-stripe writes that led or joined a pending stripe, and how
        // those stripes went out (whole, without reads, or as pieces); since the start.
        "stripe_joins": a.join_stats().map(|j| {
            let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            json!({
                "led": n(&j.led),
                "joined": n(&j.joined),
                "full": n(&j.full),
                "partial": n(&j.partial),
            })
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use uraid_engine::{CreateOptions, MemMember, Member};

    /// `detail` while a member is being replaced: mdadm's words in text, both devices in JSON.
    #[test]
    fn detail_shows_a_replace_in_progress() {
        let mems: Vec<Option<Arc<dyn Member>>> = (0..3)
            .map(|i| Some(Arc::new(MemMember::new(format!("m{i}"), 4 << 20)) as Arc<dyn Member>))
            .collect();
        let mut o = CreateOptions::new(Level::Raid5);
        o.assume_clean = true;
        let a = uraid_engine::create(mems, &o).unwrap();
        a.add_member(Arc::new(MemMember::new("new", 4 << 20)))
            .unwrap();
        a.replace(MemberIdx(2), Some("new")).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        a.replace_step(MemberIdx(2), &mut buf).unwrap();
        let text = detail_human(&a, None);
        assert!(text.contains("active sync replacing"), "{text}");
        assert!(text.contains("spare rebuilding replacement"), "{text}");
        assert!(text.contains("replacing"), "{text}");
        let j = detail_json(&a);
        assert_eq!(j["replacing"], serde_json::json!([2]));
        assert_eq!(j["members"][2]["device"], "m2");
        assert_eq!(j["members"][2]["replacement"]["device"], "new");
        assert_eq!(j["members"][2]["replacement"]["recovery_sectors"], 128);
        assert_eq!(j["degraded"], false);
    }
}

#[cfg(test)]
mod detail_tests {
    use super::*;

    /// mdadm's Array State: two devices in one role (a member and its replacement) read 'R'.
    #[test]
    fn array_state_marks_a_replacement() {
        let a = raid5(4);
        let mut sb = a.meta().template().clone();
        assert_eq!(array_state(&sb), "AAAA");
        sb.dev_roles[3] = sbm::ROLE_FAULTY;
        assert_eq!(array_state(&sb), "AAA.");
        sb.dev_roles[4] = 1;
        assert_eq!(array_state(&sb), "ARA.");
    }

    /// mdstat's counts: KiB of one member, speed and time left from the resync mark.
    #[test]
    fn sync_progress_in_mdstat_units() {
        let p = SyncProgress {
            kind: SyncKind::Recovery,
            done_units: 25,
            total_units: 100,
            unit_bytes: 4096,
            mismatch_sectors: 0,
            zero_bytes: 3 << 20,
        };
        // 2000 sectors of member: 1000 KiB, 250 done; 100 KiB in the last 10 s.
        let mark = SyncMark {
            elapsed_ms: 10_500,
            units: 10,
        };
        let j = sync_json(&p, Some(mark), 2000);
        assert_eq!(j["kind"], "recovery");
        assert_eq!(j["done_kib"], 250);
        assert_eq!(j["total_kib"], 1000);
        assert_eq!(j["speed_kib_s"], 10);
        assert_eq!(j["finish_secs"], 75);
        assert_eq!(j["zero_bytes"], 3 << 20);
        // No mark yet, or nothing done since it: no speed, no guess.
        assert!(sync_json(&p, None, 2000)["speed_kib_s"].is_null());
        let still = SyncMark {
            elapsed_ms: 10,
            units: 0,
        };
        assert!(sync_json(&p, Some(still), 2000)["finish_secs"].is_null());
    }

    /// mdadm's sizes in words at the unit boundaries, rounded half up to hundredths.
    #[test]
    fn human_sizes_as_mdadm() {
        assert_eq!(human_size(5000 * 1024 - 1), "");
        assert_eq!(human_size(5000 * 1024), " (4.88 MiB 5.12 MB)");
        assert_eq!(human_size(66_060_288), " (63.00 MiB 66.06 MB)");
        assert_eq!(human_size((2 << 30) - 1), " (2048.00 MiB 2147.48 MB)");
        assert_eq!(human_size(2 << 30), " (2.00 GiB 2.15 GB)");
        assert_eq!(human_size(3_298_351_939_584), " (3.00 TiB 3.30 TB)");
    }
    use std::sync::Arc;
    use uraid_engine::{CreateOptions, MemMember, Member};

    fn raid5(n: usize) -> Array {
        let mems: Vec<Option<Arc<dyn Member>>> = (0..n)
            .map(|i| Some(Arc::new(MemMember::new(format!("m{i}"), 8 << 20)) as Arc<dyn Member>))
            .collect();
        let mut o = CreateOptions::new(Level::Raid5);
        o.assume_clean = true;
        uraid_engine::create(mems, &o).unwrap()
    }

    fn field(text: &str, key: &str) -> String {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(" : ")?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
    }

    /// mdadm's State, counts and rows: a failed member leaves its role "removed" and is
    /// listed as faulty; a member being rebuilt makes the array "recovering"; a running
    /// resync shows "resyncing" and its status line.
    #[test]
    fn detail_counts_and_states_as_mdadm() {
        let a = raid5(4);
        let t = detail_human(&a, None);
        assert_eq!(field(&t, "State"), "clean");
        assert_eq!(field(&t, "Spare Devices"), "0");
        assert_eq!(field(&t, "Consistency Policy"), "resync");
        // mdadm: KiB, then the size in words.
        let kib = a.geometry().dev_sectors / 2;
        let used = field(&t, "Used Dev Size");
        assert!(
            used.starts_with(&format!("{kib} ("))
                && used.ends_with(" MB)")
                && used.contains(" MiB "),
            "{used}"
        );
        a.fail_member(MemberIdx(1)).unwrap();
        let t = detail_human(&a, None);
        assert_eq!(field(&t, "State"), "clean, degraded");
        assert_eq!(field(&t, "Failed Devices"), "1");
        assert_eq!(field(&t, "Active Devices"), "3");
        assert!(
            t.contains("\n         -            1 removed\n"),
            "role 1 not shown removed:\n{t}"
        );
        assert!(
            t.contains("\n\n         1            - faulty           m1\n"),
            "no faulty line:\n{t}"
        );
        a.remove_member(MemberIdx(1)).unwrap();
        a.add_member(Arc::new(MemMember::new("new", 8 << 20)))
            .unwrap();
        let t = detail_human(&a, None);
        assert_eq!(field(&t, "State"), "clean, degraded, recovering");
        assert_eq!(field(&t, "Spare Devices"), "1");
        assert_eq!(field(&t, "Working Devices"), "4");
        assert_eq!(field(&t, "Failed Devices"), "0");
        assert!(t.contains(" spare rebuilding new\n"), "{t}");
        let p = SyncProgress {
            kind: SyncKind::Resync,
            done_units: 1,
            total_units: 4,
            unit_bytes: 4096,
            mismatch_sectors: 0,
            zero_bytes: 0,
        };
        let t = detail_human(&raid5(3), Some(&p));
        assert_eq!(field(&t, "State"), "clean, resyncing");
        assert_eq!(field(&t, "Resync Status"), "25% complete");
        assert!(!t.contains("Zeros Skipped"), "{t}");
        let p = SyncProgress {
            zero_bytes: 5 << 20,
            ..p
        };
        let t = detail_human(&raid5(3), Some(&p));
        assert_eq!(
            field(&t, "Zeros Skipped"),
            "5 MiB (zeros on every member: not read nor rebuilt)"
        );
    }
}
