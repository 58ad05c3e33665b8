//! Human (mdadm-like) and JSON reports.

use crate::timefmt::ctime;
use serde_json::{json, Value};
use uraid_core::geometry::{raid10, raid5};
use uraid_core::superblock::{self as sbm, uuid_string, Superblock};
use uraid_core::{Level, MemberIdx};
use uraid_engine::writeback::JournalMode;
use uraid_engine::{Array, SlotState};

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

fn level_name(level: i32) -> String {
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
    let hundredths = |unit: u128| (b * 200 / unit + 1) / 2;
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

/// 'A' per active role, '.' per missing, as mdadm's "Array State".
fn array_state(sb: &Superblock) -> String {
    let mut s = vec!['.'; sb.raid_disks as usize];
    for &r in &sb.dev_roles {
        if (r as usize) < s.len() {
            s[r as usize] = 'A';
        }
    }
    s.into_iter().collect()
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

/// `examine` as mdadm prints it, line for line; a superblock whose checksum is wrong is
/// printed as found, with the checksum its bytes should have.
pub fn examine_human(path: &str, sb: &Superblock, cx: &ExamineContext) -> String {
    let level = Level::from_md(sb.level);
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    line("Magic", format!("{:x}", sbm::MD_SB_MAGIC));
    line("Version", "1.2".into());
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
        "version": "1.2",
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
    })
}

fn state_words(a: &Array) -> String {
    let meta = a.meta();
    let mut w = vec![if meta.is_dirty() { "active" } else { "clean" }];
    if a.is_degraded() {
        w.push("degraded");
    }
    if !a.replacing_roles().is_empty() {
        w.push("replacing");
    }
    if meta.needs_resync() {
        w.push("resync pending");
    }
    w.join(", ")
}

pub fn detail_human(a: &Array) -> String {
    let meta = a.meta();
    let sb = meta.template().clone();
    drop(meta);
    let g = a.geometry();
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>18} : {v}\n"));
    line("Version", "1.2".into());
    line("Creation Time", ctime(sb.ctime_secs()));
    line("Raid Level", g.level.to_string());
    line(
        "Array Size",
        format!(
            "{} KiB ({:.2} GiB {:.2} GB)",
            a.size_bytes() / 1024,
            a.size_bytes() as f64 / (1u64 << 30) as f64,
            a.size_bytes() as f64 / 1e9
        ),
    );
    if g.level != Level::Raid0 {
        line("Used Dev Size", format!("{} KiB", g.dev_sectors / 2));
    }
    line("Raid Devices", g.raid_disks.to_string());
    line(
        "Total Devices",
        ((0..g.raid_disks)
            .filter(|&r| a.slot_state(MemberIdx(r)) != SlotState::Missing)
            .count()
            + a.spares().len())
        .to_string(),
    );
    line("Persistence", "Superblock is persistent".into());
    if sb.bitmap_sector().is_some() {
        line("Intent Bitmap", "Internal".into());
    }
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
    line("State", state_words(a));
    let missing = a.missing_roles().len();
    line("Active Devices", (g.raid_disks - missing).to_string());
    line(
        "Working Devices",
        (g.raid_disks - missing + a.recovering_roles().len() + a.spares().len()).to_string(),
    );
    line(
        "Failed Devices",
        (0..g.raid_disks)
            .filter(|&r| a.slot_state(MemberIdx(r)) == SlotState::Faulty)
            .count()
            .to_string(),
    );
    if g.level != Level::Raid1 {
        line("Layout", layout_name(g.level, g.layout));
        line("Chunk Size", format!("{}K", g.chunk_sectors / 2));
    }
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>18} : {v}\n"));
    line("Name", sb.set_name.clone());
    line("UUID", uuid_string(&sb.set_uuid));
    line("Events", sb.events.to_string());
    o.push_str("\n    Number   RaidDevice State\n");
    for r in 0..g.raid_disks {
        let st = a.slot_state(MemberIdx(r));
        let name = a
            .slot(MemberIdx(r))
            .device_name()
            .unwrap_or_else(|| "-".into());
        let repl = a.slot(MemberIdx(r)).replacement_name();
        // mdadm --detail: the member being replaced and its replacement share the role.
        let words = match (&repl, st) {
            (Some(_), SlotState::InSync) => "active sync replacing".to_string(),
            _ => st.describe().to_string(),
        };
        o.push_str(&format!(
            "    {:>6}   {:>10} {:<16} {}\n",
            r,
            r,
            words,
            if st == SlotState::Missing { "" } else { &name }
        ));
        if let Some(n) = repl {
            o.push_str(&format!(
                "    {:>6}   {:>10} {:<16} {}\n",
                "-", r, "spare rebuilding replacement", n
            ));
        }
    }
    for s in a.spares() {
        o.push_str(&format!(
            "    {:>6}   {:>10} {:<16} {}\n",
            "-", "-", "spare", s
        ));
    }
    o
}

pub fn detail_json(a: &Array) -> Value {
    let meta = a.meta();
    let sb = meta.template().clone();
    let needs_resync = meta.needs_resync();
    let dirty = meta.is_dirty();
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
                "recovery_percent": (st == SlotState::Recovering).then(|| {
                    a.slot(MemberIdx(r)).recovery_cursor() as f64 * 100.0 / a.total_units().max(1) as f64
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
        "version": "1.2",
        "uuid": uuid_string(&sb.set_uuid),
        "name": sb.set_name,
        "level": g.level.to_string(),
        "layout": layout_name(g.level, g.layout),
        "layout_number": g.layout,
        "chunk_bytes": if g.level == Level::Raid1 { 0 } else { g.chunk_sectors * 512 },
        "raid_disks": g.raid_disks,
        "array_bytes": a.size_bytes(),
        "used_dev_sectors": g.dev_sectors,
        "events": sb.events,
        "state": if dirty { "active" } else { "clean" },
        "degraded": a.is_degraded(),
        "replacing": a.replacing_roles().iter().map(|r| r.0).collect::<Vec<_>>(),
        "resync_pending": needs_resync,
        "bitmap": sb.bitmap_sector().is_some(),
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
        let text = detail_human(&a);
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
