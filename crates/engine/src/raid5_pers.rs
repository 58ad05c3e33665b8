//! raid4/5/6 as a [`Personality`]: a thin adapter over the stripe code in `raid5`, the
//! write-back cache in `writeback` and the journal. The stripe cache, workers, journal and
//! write-back still hang off `Array` until they move into raid5's own conf (md's r5conf,
//! the stripe engineer's part of issue 14); then this adapter owns that conf.

use crate::array::{Array, Personality, SyncCtx, ZeroKind};
use crate::error::ArrayError;
use std::sync::atomic::Ordering;
use uraid_core::geometry::ParityGeometry;
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// raid4/5/6's conf (md's r5conf), for now only its geometry.
pub(crate) struct Raid5Conf {
    map: ParityGeometry,
}

impl Raid5Conf {
    pub(crate) fn new(map: ParityGeometry) -> Raid5Conf {
        Raid5Conf { map }
    }
}

impl Personality for Raid5Conf {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        let (g, sector) = (&self.map, sector.0);
        // Write-back: cached pages are newer than the members. Taken before the member
        // read, so a write-out finishing meanwhile cannot hide them.
        let cached = match &a.journal {
            Some(_) => {
                crate::writeback::cached_for_read(a, g, sector, buf.len() as u64 / SECTOR_BYTES)
            }
            None => Vec::new(),
        };
        crate::raid5::read(a, g, sector, buf)?;
        crate::writeback::overlay(&cached, sector, buf);
        Ok(())
    }

    fn write(&self, a: &Array, sector: Sector, buf: &[u8]) -> Result<(), ArrayError> {
        let (g, sector) = (&self.map, sector.0);
        match &a.journal {
            None => crate::raid5::write(a, g, sector, buf),
            Some(j) => {
                if j.is_failed() {
                    return Err(a.journal_failed_error());
                }
                a.writeback_fallback()?;
                let _gate = a.wb.gate.read().unwrap();
                if a.wb.is_on() {
                    crate::writeback::write(a, g, sector, buf)
                } else {
                    crate::raid5::write(a, g, sector, buf)
                }
            }
        }
    }

    /// Whole stripes only (md's make_discard_request).
    fn zero(
        &self,
        a: &Array,
        sector: Sector,
        sectors: u64,
        kind: ZeroKind,
    ) -> Result<(), ArrayError> {
        let d = self.map.stripe_data_sectors();
        crate::raid5::zero(a, &self.map, sector.0 / d, sectors / d, kind)
    }

    fn zero_unit(&self) -> (u64, &'static str) {
        (self.map.stripe_data_sectors(), "stripes")
    }

    fn sync_range(
        &self,
        a: &Array,
        start: u64,
        max: u64,
        ctx: &SyncCtx,
    ) -> Result<(u64, u64), ArrayError> {
        crate::raid5::sync_range(a, &self.map, start, max, ctx)
    }

    /// The recovery unit is the stripe.
    fn total_units(&self) -> u64 {
        self.map.stripes()
    }

    fn unit_bytes(&self) -> u64 {
        self.map.stripe_data_sectors() * SECTOR_BYTES
    }

    fn recovery_offset_sectors(&self, cursor: u64) -> u64 {
        cursor * self.map.chunk_sectors
    }

    fn cursor_for_offset(&self, offset_sectors: u64) -> u64 {
        offset_sectors / self.map.chunk_sectors
    }

    fn member_units(&self, s: u64, e: u64) -> Option<(u64, u64)> {
        let c = self.map.chunk_sectors;
        Some((s / c, e.div_ceil(c)))
    }

    /// Whole chunk rows of member sectors: a write changes parity across its rows.
    fn bitmap_range(&self, sector: Sector, sectors: u64) -> (u64, u64) {
        let g = &self.map;
        let a = g.locate(sector.0).stripe;
        let b = g.locate(sector.0 + sectors - 1).stripe;
        (a * g.chunk_sectors, (b - a + 1) * g.chunk_sectors)
    }

    fn locate(&self, sector: Sector) -> Vec<(MemberIdx, Sector)> {
        let g = &self.map;
        let loc = g.locate(sector.0);
        let member = g.stripe_map(loc.stripe).data[loc.data_index];
        vec![(
            member,
            Sector(g.member_sector(loc.stripe, loc.offset_sectors)),
        )]
    }

    fn survives(&self, missing: &[MemberIdx]) -> bool {
        missing.len() <= self.map.parity_disks()
    }

    fn max_degraded(&self) -> usize {
        self.map.parity_disks()
    }

    fn tunables(&self, a: &Array) -> Vec<(&'static str, String)> {
        let t = &a.tuning;
        vec![
            ("stripe_cache_size", a.stripe_cache.size().to_string()),
            ("stripe_cache_active", a.stripe_cache.active().to_string()),
            ("group_thread_cnt", a.group_thread_cnt().to_string()),
            ("rmw_level", t.rmw_level.load(Ordering::Relaxed).to_string()),
            (
                "skip_copy",
                u8::from(t.skip_copy.load(Ordering::Relaxed)).to_string(),
            ),
            (
                "batching",
                u8::from(t.batching.load(Ordering::Relaxed)).to_string(),
            ),
        ]
    }

    fn set_tunable(&self, a: &Array, name: &str, value: &str) -> Result<(), ArrayError> {
        let num = || {
            value
                .trim()
                .parse::<usize>()
                .map_err(|_| ArrayError::Failed(format!("{name}: {value:?} is not a number")))
        };
        let flag = || match num()? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(ArrayError::Failed(format!("{name} is 0 or 1, not {n}"))),
        };
        match name {
            "stripe_cache_size" => a.set_stripe_cache_size(num()?),
            "group_thread_cnt" => a.set_group_thread_cnt(num()?),
            "rmw_level" => match num()? {
                n @ 0..=2 => {
                    a.tuning.rmw_level.store(n as u8, Ordering::Relaxed);
                    Ok(())
                }
                n => Err(ArrayError::Failed(format!("rmw_level is 0..=2, not {n}"))),
            },
            "skip_copy" => {
                a.tuning.skip_copy.store(flag()?, Ordering::Relaxed);
                Ok(())
            }
            "batching" => {
                a.tuning.batching.store(flag()?, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(ArrayError::Failed(format!(
                "unknown tunable {name} (known: stripe_cache_size, group_thread_cnt, \
                 rmw_level, skip_copy, batching)"
            ))),
        }
    }

    fn has_stripe_cache(&self) -> bool {
        true
    }

    fn parity(&self) -> Option<&ParityGeometry> {
        Some(&self.map)
    }

    /// Write the write-back cache out, even with a failed journal (the cached data then
    /// goes straight to the members).
    fn stop(&self, a: &Array) -> Result<(), ArrayError> {
        if a.journal.is_some() {
            let _gate = a.wb.gate.write().unwrap();
            crate::writeback::drain(a, &self.map)?;
        }
        Ok(())
    }
}
