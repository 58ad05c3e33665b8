//! `examine` of a metadata 0.90 member, in mdadm's own layout for 0.90 (which differs from
//! its 1.x one: a device table instead of roles, counts kept in the superblock).

use crate::report::{human_size, layout_name, level_name};
use crate::timefmt::ctime;
use serde_json::{json, Value};
use uraid_core::superblock090::{
    Disk090, Superblock090, DISK_ACTIVE, DISK_FAILFAST, DISK_FAULTY, DISK_REMOVED, DISK_SYNC,
    DISK_WRITEMOSTLY, MD_SB_MAGIC, SB090_STATE_BITMAP_PRESENT,
};
use uraid_core::Level;

/// Array size in KiB as mdadm computes it for 0.90 from the component size: data disks
/// per level, raid10 divided by its copies; None where mdadm prints none.
fn array_kib(rec: &Superblock090) -> Option<u64> {
    let size = u64::from(rec.size_kib);
    let n = u64::from(rec.raid_disks);
    let (disks, denom) = match rec.level {
        1 => (1, 1),
        4 | 5 => (n.checked_sub(1)?, 1),
        6 => (n.checked_sub(2)?, 1),
        10 => (
            n,
            u64::from(rec.layout & 0xff) * u64::from((rec.layout >> 8) & 0xff),
        ),
        _ => return None,
    };
    (disks > 0 && denom > 0).then(|| size * disks / denom)
}

/// A device's state in words, as mdadm lists them.
fn disk_state(d: &Disk090) -> String {
    let mut s = String::new();
    let rest = d.state & !(DISK_WRITEMOSTLY | DISK_FAILFAST);
    for (bit, word) in [
        (DISK_FAULTY, " faulty"),
        (DISK_ACTIVE, " active"),
        (DISK_SYNC, " sync"),
        (DISK_REMOVED, " removed"),
    ] {
        if rest & bit != 0 {
            s.push_str(word);
        }
    }
    if d.state & DISK_WRITEMOSTLY != 0 {
        s.push_str(" write-mostly");
    }
    if d.state & DISK_FAILFAST != 0 {
        s.push_str(" failfast");
    }
    if rest == 0 {
        s.push_str(" spare");
    }
    s
}

/// How many rows of the device table mdadm lists: the roles, the devices a shrink (0.91
/// with a negative delta) is taking out, then the spares. Text and JSON list the same.
fn listed_disks(rec: &Superblock090) -> usize {
    let reshaping = rec.minor_version > 90 && rec.reshape_position != u64::MAX;
    let leaving = if reshaping {
        rec.delta_disks.min(0).unsigned_abs()
    } else {
        0
    };
    rec.raid_disks
        .saturating_add(leaving)
        .saturating_add(rec.spare_disks) as usize
}

fn disk_row(o: &mut String, label: &str, d: &Disk090) {
    o.push_str(&format!(
        "{label:>4} {:5}   {:5}    {:5}    {:5}     {}\n",
        d.number,
        d.major,
        d.minor,
        d.raid_disk,
        disk_state(d)
    ));
}

/// `examine` of a 0.90 record, line for line as mdadm prints it; `computed_csum` is the
/// checksum its bytes have (a wrong one is shown as mdadm shows it).
pub fn examine_human(path: &str, rec: &Superblock090, computed_csum: u32) -> String {
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    line("Magic", format!("{MD_SB_MAGIC:08x}"));
    line(
        "Version",
        format!(
            "{}.{:02}.{:02}",
            rec.major_version, rec.minor_version, rec.patch_version
        ),
    );
    line("UUID", rec.uuid_string());
    line("Creation Time", ctime(u64::from(rec.ctime)));
    line("Raid Level", level_name(rec.level));
    if rec.level > 0 {
        let size = u64::from(rec.size_kib);
        line("Used Dev Size", format!("{size}{}", human_size(size << 10)));
        if let Some(kib) = array_kib(rec) {
            line("Array Size", format!("{kib}{}", human_size(kib << 10)));
        }
    }
    line("Raid Devices", rec.raid_disks.to_string());
    line("Total Devices", rec.nr_disks.to_string());
    line("Preferred Minor", rec.md_minor.to_string());
    o.push('\n');
    // A reshape (0.91), as mdadm prints it for 0.90: the new shape only where it differs.
    let reshaping = rec.minor_version > 90 && rec.reshape_position != u64::MAX;
    if reshaping {
        let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
        line(
            "Reshape pos'n",
            format!(
                "{}{}",
                rec.reshape_position / 2,
                human_size(rec.reshape_position << 9)
            ),
        );
        if rec.delta_disks != 0 {
            line(
                "Delta Devices",
                format!(
                    "{} ({}->{})",
                    rec.delta_disks,
                    i64::from(rec.raid_disks) - i64::from(rec.delta_disks),
                    rec.raid_disks
                ),
            );
        }
        if rec.new_level != rec.level {
            line("New Level", level_name(rec.new_level));
        }
        if rec.new_layout != rec.layout {
            match Level::from_md(rec.level) {
                Some(l @ (Level::Raid5 | Level::Raid6)) => {
                    line("New Layout", layout_name(l, rec.new_layout))
                }
                Some(Level::Raid10) => line(
                    "New Layout",
                    format!(
                        "near={}, {}={}",
                        rec.new_layout & 0xff,
                        if rec.new_layout & 0x10000 != 0 {
                            "offset"
                        } else {
                            "far"
                        },
                        (rec.new_layout >> 8) & 0xff
                    ),
                ),
                _ => {}
            }
        }
        if rec.new_chunk != rec.chunk_size {
            line("New Chunksize", rec.new_chunk.to_string());
        }
        o.push('\n');
    }
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    line("Update Time", ctime(u64::from(rec.utime)));
    line(
        "State",
        if rec.is_clean() { "clean" } else { "active" }.into(),
    );
    if rec.state & SB090_STATE_BITMAP_PRESENT != 0 {
        line("Internal Bitmap", "present".into());
    }
    line("Active Devices", rec.active_disks.to_string());
    line("Working Devices", rec.working_disks.to_string());
    line("Failed Devices", rec.failed_disks.to_string());
    line("Spare Devices", rec.spare_disks.to_string());
    if rec.sb_csum == computed_csum {
        line("Checksum", format!("{:x} - correct", rec.sb_csum));
    } else {
        line(
            "Checksum",
            format!("{:x} - expected {computed_csum:x}", rec.sb_csum),
        );
    }
    line("Events", rec.events.to_string());
    o.push('\n');
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:>15} : {v}\n"));
    let level = Level::from_md(rec.level);
    if let Some(l @ (Level::Raid5 | Level::Raid6 | Level::Raid10)) = level {
        line("Layout", layout_name(l, rec.layout));
    }
    if matches!(rec.level, 0 | 4 | 5 | 6 | 10) {
        line("Chunk Size", format!("{}K", rec.chunk_size / 1024));
    }
    o.push('\n');
    o.push_str("      Number   Major   Minor   RaidDevice State\n");
    disk_row(&mut o, "this", &rec.this_disk);
    o.push('\n');
    // A shrink lists the leaving devices too.
    for (i, d) in rec.disks.iter().enumerate().take(listed_disks(rec)) {
        disk_row(&mut o, &i.to_string(), d);
    }
    format!("{path}:\n{o}")
}

/// The same as JSON, with the device table.
pub fn examine_json(path: &str, rec: &Superblock090, computed_csum: u32) -> Value {
    let disk = |d: &Disk090| {
        json!({
            "number": d.number,
            "major": d.major,
            "minor": d.minor,
            "raid_disk": d.raid_disk,
            "state": disk_state(d).trim(),
        })
    };
    json!({
        "device": path,
        "magic": format!("{MD_SB_MAGIC:08x}"),
        "version": format!("{}.{:02}.{:02}", rec.major_version, rec.minor_version, rec.patch_version),
        "byte_order": format!("{:?}", rec.byte_order).to_lowercase(),
        "uuid": rec.uuid_string(),
        "creation_time": rec.ctime,
        "update_time": rec.utime,
        "level": level_name(rec.level),
        "layout_number": rec.layout,
        "chunk_bytes": rec.chunk_size,
        "used_dev_kib": rec.size_kib,
        "array_kib": array_kib(rec),
        "raid_disks": rec.raid_disks,
        "total_devices": rec.nr_disks,
        "preferred_minor": rec.md_minor,
        "clean": rec.is_clean(),
        "active_devices": rec.active_disks,
        "working_devices": rec.working_disks,
        "failed_devices": rec.failed_disks,
        "spare_devices": rec.spare_disks,
        "events": rec.events,
        "checksum": format!("{:x}", rec.sb_csum),
        "checksum_ok": rec.sb_csum == computed_csum,
        "reshape": (rec.minor_version > 90 && rec.reshape_position != u64::MAX).then(|| json!({
            "position_sectors": rec.reshape_position,
            "delta_disks": rec.delta_disks,
            "new_level": level_name(rec.new_level),
            "new_layout_number": rec.new_layout,
            "new_chunk_bytes": rec.new_chunk,
        })),
        "this_disk": disk(&rec.this_disk),
        "disks": rec.disks.iter().take(listed_disks(rec)).map(disk).collect::<Vec<_>>(),
    })
}
