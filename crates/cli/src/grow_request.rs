//! The values of `uraid grow` (mdadm --grow's options, as text) made into the engine's
//! [`GrowRequest`], here and in the control server alike; and md's layout names by level.

use anyhow::{bail, Context, Result};
use uraid_core::geometry::{parse_chunk, parse_size_bytes, raid10, raid5};
use uraid_core::Level;
use uraid_engine::{BitmapChange, GrowRequest, GrowSize};

/// md's layout number for a layout name of `level` (mdadm's spellings).
pub fn parse_layout(level: Level, s: &str) -> Result<u32> {
    let v = match level {
        Level::Raid5 | Level::Raid6 | Level::Raid4 => raid5::parse_layout(s),
        Level::Raid10 => raid10::parse_layout(s),
        Level::Raid0 => match s {
            "original" | "o" | "1" => Some(1),
            "alternate" | "alt" | "2" => Some(2),
            _ => None,
        },
        Level::Raid1 => None,
    };
    v.with_context(|| format!("unknown layout {s:?} for {level}"))
}

/// A grow request from its text values (`values` as [`GrowArgs`](crate::grow::GrowArgs) names them), for an
/// array of level `current`. Every value is checked before anything is asked of the array.
pub fn request_of(values: &[(String, String)], current: Level) -> Result<GrowRequest> {
    let mut r = GrowRequest::default();
    for (k, v) in values {
        match k.as_str() {
            "raid_devices" => {
                r.raid_disks =
                    Some(v.parse().with_context(|| {
                        format!("--raid-devices {v:?}: give a number of devices")
                    })?)
            }
            "size" => {
                r.size = Some(if v == "max" {
                    GrowSize::Max
                } else {
                    let b = parse_size_bytes(v, 1024).with_context(|| {
                        format!("--size {v:?}: give max or a size such as 100M")
                    })?;
                    GrowSize::Sectors(b / 512)
                })
            }
            "array_size" => {
                r.array_sectors = Some(if v == "max" {
                    uraid_engine::ARRAY_SIZE_MAX
                } else {
                    let b = parse_size_bytes(v, 1024).with_context(|| {
                        format!(
                            "--array-size {v:?}: give max or a size such as 100M (K when no unit)"
                        )
                    })?;
                    b / 512
                });
            }
            "chunk" => {
                r.chunk_sectors = Some(
                    parse_chunk(v)
                        .with_context(|| format!("--chunk {v:?}: give a size such as 64K"))?,
                )
            }
            "level" => {
                r.level = Some(
                    Level::parse(v)
                        .with_context(|| format!("--level {v:?}: give 0, 1, 4, 5, 6 or 10"))?,
                )
            }
            "bitmap" => {
                r.bitmap = Some(match v.as_str() {
                    "internal" => BitmapChange::Internal,
                    "none" => BitmapChange::None,
                    other => bail!("--bitmap {other:?}: give internal or none"),
                })
            }
            "layout" => {}
            other => bail!("unknown grow option {other:?}"),
        }
    }
    // The layout is named in the words of the level it will have.
    if let Some((_, v)) = values.iter().find(|(k, _)| k == "layout") {
        let level = r.level.unwrap_or(current);
        r.layout = Some(parse_layout(level, v)?);
    }
    Ok(r)
}
