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

fn sectors_human(s: u64) -> String {
    let bytes = s as f64 * 512.0;
    format!(
        "{} sectors ({:.2} GiB {:.2} GB)",
        s,
        bytes / (1u64 << 30) as f64,
        bytes / 1e9
    )
}

fn role_string(r: u16) -> String {
    match r {
        sbm::ROLE_SPARE => "spare".into(),
        sbm::ROLE_FAULTY => "faulty".into(),
        sbm::ROLE_JOURNAL => "journal".into(),
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

pub fn examine_human(path: &str, sb: &Superblock) -> String {
    let level = Level::from_md(sb.level);
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    line("Magic", format!("{:x}", sbm::MD_SB_MAGIC));
    line("Version", sb.version().name().into());
    line("Feature Map", format!("{:#x}", sb.feature_map));
    line("Array UUID", uuid_string(&sb.set_uuid));
    line("Name", sb.set_name.clone());
    line("Creation Time", ctime(sb.ctime_secs()));
    line("Raid Level", level_name(sb.level));
    line("Raid Devices", sb.raid_disks.to_string());
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    line("Avail Dev Size", sectors_human(sb.data_size));
    if let Some(bytes) = array_bytes(sb) {
        line(
            "Array Size",
            format!(
                "{} KiB ({:.2} GiB {:.2} GB)",
                bytes / 1024,
                bytes as f64 / (1u64 << 30) as f64,
                bytes as f64 / 1e9
            ),
        );
    }
    if sb.size > 0 {
        line("Used Dev Size", sectors_human(sb.size));
    }
    line("Data Offset", format!("{} sectors", sb.data_offset));
    line("Super Offset", format!("{} sectors", sb.super_offset));
    line(
        "State",
        if sb.is_clean() { "clean" } else { "active" }.into(),
    );
    line("Device UUID", uuid_string(&sb.device_uuid));
    if let Some(b) = sb.bitmap_sector() {
        line(
            "Internal Bitmap",
            format!(
                "{} sectors from superblock",
                b as i64 - sb.super_offset as i64
            ),
        );
    }
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    line("Update Time", ctime(sb.utime_secs()));
    line("Checksum", format!("{:x} - correct", sb.sb_csum));
    line("Events", sb.events.to_string());
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    if let Some(l) = level {
        if l != Level::Raid1 {
            line("Layout", layout_name(l, sb.layout));
            line("Chunk Size", format!("{}K", sb.chunksize / 2));
        }
    }
    o.push('\n');
    let role = sb.role_of_this_device().unwrap_or(sbm::ROLE_SPARE);
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>14} : {v}\n"));
    // mdadm: a replacement shares its role's slot ("Replacement device N") and shows how far
    // its rebuild got.
    let replacement =
        sb.feature_map & sbm::FEATURE_REPLACEMENT != 0 && u32::from(role) < sb.raid_disks;
    if replacement {
        line("Device Role", format!("Replacement device {role}"));
    } else {
        line("Device Role", role_string(role));
    }
    if sb.feature_map & sbm::FEATURE_RECOVERY_OFFSET != 0 && sb.recovery_offset != sbm::MAX_SECTOR {
        line("Recovery Offset", format!("{} sectors", sb.recovery_offset));
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

pub fn examine_json(path: &str, sb: &Superblock) -> Value {
    let level = Level::from_md(sb.level);
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
    line("Version", sb.version().name().into());
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
        "version": sb.version().name(),
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
