//! Array configurations for the simulator, derived from the seed alone so that one number
//! replays a run.

use super::SimRng;
use uraid_core::geometry::raid5::*;
use uraid_core::Level;
use uraid_engine::CreateOptions;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    pub level: Level,
    /// md layout number; None takes mdadm's default.
    pub layout: Option<u32>,
    pub disks: usize,
    /// 0 for raid1.
    pub chunk_sectors: u64,
    /// Size of every member in bytes (data offset included).
    pub member_bytes: u64,
    pub data_offset_sectors: u64,
    pub bitmap: bool,
    /// false: create runs the initial resync over the (zeroed) members.
    pub assume_clean: bool,
}

/// What a run tries to do with the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Faults within the budget: every operation must succeed with the model's bytes.
    WithinBudget,
    /// Within budget, then one member failure too many: errors for the affected ranges,
    /// never wrong data, correct data elsewhere.
    OverBudget,
    /// Within budget with a power cut in the middle of a write on a whole array.
    Crash,
}

/// One catalogue entry: level, layout and the disk counts to draw from.
struct Entry {
    level: Level,
    layout: Option<u32>,
    disks: &'static [usize],
}

fn catalogue() -> Vec<Entry> {
    let mut v = Vec::new();
    let e = |level, layout, disks| Entry {
        level,
        layout,
        disks,
    };
    v.push(e(Level::Raid0, None, &[2, 3, 4]));
    v.push(e(Level::Raid0, Some(2), &[2, 3]));
    v.push(e(Level::Raid1, None, &[1, 2, 3, 4]));
    for (layout, disks) in [
        (0x102, &[2usize, 3, 4, 5][..]),
        (0x103, &[3, 4][..]),
        (0x201, &[2, 3, 4][..]),
        (0x301, &[3, 4][..]),
        (0x10201, &[2, 3, 4][..]),
        (0x202, &[4][..]),
    ] {
        v.push(e(Level::Raid10, Some(layout), disks));
    }
    v.push(e(Level::Raid4, None, &[3, 4]));
    for &layout in RAID5_LAYOUTS {
        v.push(e(Level::Raid5, Some(layout), &[2, 3, 4, 5]));
    }
    for &layout in RAID6_LAYOUTS {
        v.push(e(Level::Raid6, Some(layout), &[4, 5, 6]));
    }
    v
}

/// Number of catalogue entries: consecutive seeds walk through all of them.
pub fn catalogue_len() -> usize {
    catalogue().len()
}

impl SimConfig {
    /// The configuration and mode of a seed: the catalogue entry is `seed % len` (so that
    /// any run of consecutive seeds covers every level and layout), the rest is drawn.
    pub fn for_seed(seed: u64) -> (SimConfig, Mode) {
        let cat = catalogue();
        let entry = &cat[(seed % cat.len() as u64) as usize];
        let mut rng = SimRng::new(seed ^ 0xc0f1_9000);
        let disks = *rng.pick(entry.disks);
        let chunk_sectors = if entry.level == Level::Raid1 {
            0
        } else {
            *rng.pick(&[8u64, 8, 16, 32, 128])
        };
        // Small members keep a run fast: 8 to 48 chunks (or 64 KiB regions for raid1),
        // at most ~384 KiB of data per member.
        let unit_bytes = if chunk_sectors == 0 {
            64 * 1024
        } else {
            chunk_sectors * 512
        };
        let max_units = (384 * 1024 / unit_bytes).max(8);
        let units = rng.range_incl(8.min(max_units), max_units.min(48));
        let data_offset_sectors = 128;
        let member_bytes = data_offset_sectors * 512 + units * unit_bytes;
        let bitmap = entry.level != Level::Raid0 && rng.chance(30);
        let assume_clean = !rng.chance(10);
        let mode = match rng.range(0, 100) {
            0..=14 => Mode::OverBudget,
            15..=29 => Mode::Crash,
            _ => Mode::WithinBudget,
        };
        (
            SimConfig {
                level: entry.level,
                layout: entry.layout,
                disks,
                chunk_sectors,
                member_bytes,
                data_offset_sectors,
                bitmap,
                assume_clean,
            },
            mode,
        )
    }

    /// Options to create the array with, on the simulated world's `clock`.
    pub fn create_options(&self, uuid: [u8; 16], clock: uraid_engine::Clock) -> CreateOptions {
        let mut o = CreateOptions::new(self.level);
        o.clock = clock;
        o.layout = self.layout;
        if self.chunk_sectors > 0 {
            o.chunk_sectors = Some(self.chunk_sectors);
        }
        o.name = "sim:sim".into();
        o.bitmap = self.bitmap;
        o.assume_clean = self.assume_clean;
        o.uuid = Some(uuid);
        o.data_offset_sectors = Some(self.data_offset_sectors);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_cover_the_catalogue_and_replay() {
        let n = catalogue_len() as u64;
        let mut levels = std::collections::BTreeSet::new();
        for s in 0..n {
            let (c, m) = SimConfig::for_seed(s);
            assert_eq!((c.clone(), m), SimConfig::for_seed(s));
            levels.insert(c.level.md_level());
        }
        assert_eq!(levels.len(), 6, "every level in one lap: {levels:?}");
    }
}
