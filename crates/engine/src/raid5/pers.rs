//! raid4/5/6 as a [`Personality`]: the level owns its [`Conf`] (md's r5conf: stripe
//! cache, workers, journal, write-back) and drives the stripe code in this module, the
//! write-back cache in `writeback` and the journal. The array reaches the conf only through
//! the `impl Array` accessors below (a downcast of its personality), so `array` names no
//! raid5 type.

use super::Conf;
use super::StripeCache;
use crate::array::{Array, Personality, SyncCtx, ZeroKind};
use crate::error::ArrayError;
use crate::journal::Journal;
use std::any::Any;
use std::io;
use std::sync::atomic::Ordering;
use uraid_core::geometry::ParityGeometry;
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// raid4/5/6's personality: its geometry and its conf.
pub(crate) struct Raid5Pers {
    map: ParityGeometry,
    conf: Conf,
}

impl Raid5Pers {
    pub(crate) fn new(map: ParityGeometry) -> Raid5Pers {
        Raid5Pers {
            map,
            conf: Conf::new(),
        }
    }
}

impl Personality for Raid5Pers {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        let (g, sector) = (&self.map, sector.0);
        // Write-back: cached pages are newer than the members. Taken before the member
        // read, so a write-out finishing meanwhile cannot hide them.
        let cached = match a.journal() {
            Some(_) => crate::raid5::writeback::cached_for_read(
                a,
                g,
                sector,
                buf.len() as u64 / SECTOR_BYTES,
            ),
            None => Vec::new(),
        };
        crate::raid5::read(a, g, sector, buf)?;
        crate::raid5::writeback::overlay(&cached, sector, buf);
        Ok(())
    }

    fn write(&self, a: &Array, sector: Sector, buf: &[u8]) -> Result<(), ArrayError> {
        let (g, sector) = (&self.map, sector.0);
        match a.journal() {
            None => crate::raid5::write(a, g, sector, buf),
            Some(j) => {
                if j.is_failed() {
                    return Err(a.journal_failed_error());
                }
                a.writeback_fallback()?;
                let wb = &a.r5().wb;
                let _gate = wb.gate.read().unwrap();
                if wb.is_on() {
                    crate::raid5::writeback::write(a, g, sector, buf)
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
        let t = &self.conf.tuning;
        vec![
            ("stripe_cache_size", a.stripe_cache().size().to_string()),
            ("stripe_cache_active", a.stripe_cache().active().to_string()),
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
            (
                "join_wait_us",
                t.join_wait_us.load(Ordering::Relaxed).to_string(),
            ),
            (
                "sync_threads",
                t.sync_threads.load(Ordering::Relaxed).to_string(),
            ),
            (
                "consistency_policy",
                if a.has_ppl() {
                    "ppl"
                } else if a.has_journal() {
                    "journal"
                } else if a.meta().bitmap.is_some() {
                    "bitmap"
                } else {
                    "resync"
                }
                .to_string(),
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
                    self.conf.tuning.rmw_level.store(n as u8, Ordering::Relaxed);
                    Ok(())
                }
                n => Err(ArrayError::Failed(format!("rmw_level is 0..=2, not {n}"))),
            },
            "skip_copy" => {
                self.conf.tuning.skip_copy.store(flag()?, Ordering::Relaxed);
                Ok(())
            }
            "batching" => {
                self.conf.tuning.batching.store(flag()?, Ordering::Relaxed);
                Ok(())
            }
            "join_wait_us" => match num()? as u64 {
                n @ 0..=super::MAX_JOIN_WAIT_US => {
                    self.conf.tuning.join_wait_us.store(n, Ordering::Relaxed);
                    Ok(())
                }
                n => Err(ArrayError::Failed(format!(
                    "join_wait_us is 0..={}, not {n}",
                    super::MAX_JOIN_WAIT_US
                ))),
            },
            "sync_threads" => {
                let n = crate::in_order::parse_sync_threads(value)?;
                self.conf.tuning.sync_threads.store(n, Ordering::Relaxed);
                Ok(())
            }
            "consistency_policy" => a.set_consistency_policy(value),
            _ => Err(ArrayError::Failed(format!(
                "unknown tunable {name} (known: stripe_cache_size, group_thread_cnt, \
                 rmw_level, skip_copy, batching, join_wait_us, sync_threads, \
                 consistency_policy)"
            ))),
        }
    }

    fn parity(&self) -> Option<&ParityGeometry> {
        Some(&self.map)
    }

    /// Write the write-back cache out, even with a failed journal (the cached data then
    /// goes straight to the members).
    fn stop(&self, a: &Array) -> Result<(), ArrayError> {
        if a.journal().is_some() {
            let _gate = a.r5().wb.gate.write().unwrap();
            crate::raid5::writeback::drain(a, &self.map)?;
        }
        Ok(())
    }

    /// The journal first: write-back acknowledges a write once it is in the journal.
    fn flush(&self, a: &Array) -> Result<(), ArrayError> {
        if let Some(j) = &self.conf.journal {
            let (wb, cached) = (&self.conf.wb, self.conf.cached_pages() > 0);
            if j.is_failed() && cached {
                // Cached writes were durable only in the journal, which failed.
                return Err(a.journal_failed_error());
            }
            if !j.is_failed() && (wb.is_on() || cached) {
                j.flush().map_err(|e| a.journal_error(e))?;
            }
        }
        Ok(())
    }

    fn force_flush(&self) -> Option<String> {
        let j = self.conf.journal.as_ref()?;
        if j.is_failed() {
            return None;
        }
        j.flush().err().map(|e| e.to_string())
    }

    fn has_cached_writes(&self) -> bool {
        self.conf.cached_pages() > 0
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl crate::journal::JournalHost for Array {
    fn flush_members(&self) -> io::Result<()> {
        Array::flush_members(self).map_err(io::Error::from)
    }

    /// journal_tail lives in the journal device's superblock (its recovery_offset field);
    /// md records it with a superblock update, and so do we.
    fn set_journal_tail(&self, tail_sectors: u64) -> io::Result<()> {
        let mut meta = self.meta();
        if let Some((_, sb)) = meta.journal.as_mut() {
            sb.recovery_offset = tail_sectors;
        }
        meta.write_all(self).map_err(io::Error::from)
    }
}

/// raid4/5/6's state and the journal, as the array's users and the level's code see them.
impl Array {
    fn r5_pers(&self) -> Option<&Raid5Pers> {
        self.pers().as_any().downcast_ref()
    }

    /// raid4/5/6's conf, if this is a parity array.
    pub(crate) fn r5_conf(&self) -> Option<&Conf> {
        self.r5_pers().map(|p| &p.conf)
    }

    /// raid4/5/6's conf; only their code asks, on a parity array.
    pub(crate) fn r5(&self) -> &Conf {
        self.r5_conf().expect("raid4/5/6 state on a parity array")
    }

    /// raid4/5/6's run-time knobs (rmw_level, skip_copy, batching, the sync pass size);
    /// None for the other levels, which have none. `set_tunable` checks what it stores.
    pub fn tuning(&self) -> Option<&super::Tuning> {
        self.r5_conf().map(|c| &c.tuning)
    }

    /// Counts of raid4/5/6's joined partial-stripe writes (`join_wait_us`); None for the
    /// other levels.
    pub fn join_stats(&self) -> Option<&super::JoinStats> {
        self.r5_conf().map(|c| &c.joins.stats)
    }

    /// Attach the write journal (create and assemble do, before the array is shared).
    pub fn set_journal(&mut self, j: Journal) {
        let p: &mut Raid5Pers = self
            .pers_mut()
            .as_any_mut()
            .downcast_mut()
            .expect("a write journal is for raid4/5/6 (create and assemble check)");
        p.conf.journal = Some(j);
    }

    /// md's partial parity log, if the array writes one (raid5 only).
    pub(crate) fn ppl(&self) -> Option<std::sync::Arc<super::ppl::Ppl>> {
        let c = self.r5_conf()?;
        c.ppl.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the array closes the raid5 write hole with md's partial parity log
    /// (consistency policy "ppl").
    pub fn has_ppl(&self) -> bool {
        self.ppl().is_some()
    }

    /// Start the partial parity log from the members' superblocks (create and assemble
    /// do, before the array is shared): after an unclean stop (`unclean`) replay each
    /// member's newest PPL (md's ppl_recover), then give every area an empty header. A
    /// recovery without mismatches leaves no resync owed, as in md.
    pub(crate) fn start_ppl(&self, unclean: bool) -> Result<super::ppl::PplRecovery, ArrayError> {
        let uraid_core::geometry::Personality::Parity(g) = self.personality().clone() else {
            return Err(ArrayError::Assemble(
                "a partial parity log needs raid5".into(),
            ));
        };
        let uuid = self.meta().template.set_uuid;
        let ppl = super::ppl::Ppl::new(&uuid, super::ppl::areas(self));
        let rep = ppl.start(self, &g, unclean)?;
        if unclean {
            tracing::info!(
                "PPL recovery: {} entries recovered, {} mismatches",
                rep.recovered_entries,
                rep.mismatches
            );
            if rep.mismatches == 0 {
                self.meta().set_resync_done();
            }
        }
        *self.r5().ppl.write().unwrap_or_else(|e| e.into_inner()) = Some(std::sync::Arc::new(ppl));
        Ok(rep)
    }

    /// md's consistency_policy in sysfs, for a running raid5: "ppl" starts the partial
    /// parity log (the superblocks get FEATURE_PPL and the area, the areas an empty
    /// header), "resync" stops it (the superblocks lose FEATURE_PPL). Requests in flight
    /// finish first and new ones wait (md quiesces too). Refused, before anything is
    /// written, where md refuses: not raid5, a journal or a bitmap, no room for the area.
    pub(crate) fn set_consistency_policy(&self, value: &str) -> Result<(), ArrayError> {
        use uraid_core::superblock::{FEATURE_MULTIPLE_PPLS, FEATURE_PPL};
        let want = match value.trim() {
            "ppl" => true,
            "resync" => false,
            other => {
                return Err(ArrayError::Failed(format!(
                    "consistency_policy is ppl or resync (what md switches a running raid5 \
                     between), not {other:?}"
                )))
            }
        };
        if want == self.has_ppl() {
            return Ok(());
        }
        let _quiet = self.quiesce();
        let mut meta = self.meta();
        if meta.read_only {
            return Err(ArrayError::ReadOnly(
                "consistency_policy: the array is read-only".into(),
            ));
        }
        if !want {
            *self.r5().ppl.write().unwrap_or_else(|e| e.into_inner()) = None;
            meta.template.feature_map &= !(FEATURE_PPL | FEATURE_MULTIPLE_PPLS);
            meta.template.bitmap_offset = 0;
            return meta.write_all(self);
        }
        let level = self.level();
        if level != uraid_core::Level::Raid5 {
            return Err(ArrayError::Failed(format!(
                "consistency_policy=ppl is for raid5 only (as in md), not {level}"
            )));
        }
        if self.has_journal() || meta.bitmap.is_some() {
            return Err(ArrayError::Failed(
                "consistency_policy=ppl: the array has a journal or a bitmap (md switches to \
                 ppl only from resync)"
                    .into(),
            ));
        }
        let chunk = self.r5_pers().map(|p| p.map.chunk_sectors).unwrap_or(0);
        let mut placement = None;
        for r in 0..self.raid_disks() {
            let Some(sb) = meta.member_sb(MemberIdx(r)) else {
                continue;
            };
            let mut sb = sb.clone();
            sb.bitmap_offset = meta.template.bitmap_offset;
            let p = super::ppl::update_placement(&sb, chunk)
                .map_err(|e| ArrayError::Failed(format!("consistency_policy=ppl: {e}")))?;
            if placement.is_some_and(|q| q != p) {
                return Err(ArrayError::Failed(
                    "consistency_policy=ppl: the members' layouts differ, so they would need \
                     different PPL areas"
                        .into(),
                ));
            }
            placement = Some(p);
        }
        let (raw, multiple) = placement.ok_or_else(|| {
            ArrayError::Failed("consistency_policy=ppl: no member to log on".into())
        })?;
        meta.template.bitmap_offset = raw;
        meta.template.feature_map |= FEATURE_PPL;
        if multiple {
            meta.template.feature_map |= FEATURE_MULTIPLE_PPLS;
        }
        drop(meta);
        // The areas get their empty headers before the superblocks name them.
        let uuid = self.meta().template.set_uuid;
        let ppl = super::ppl::Ppl::new(&uuid, super::ppl::areas(self));
        let g = self.r5_pers().map(|p| p.map.clone()).expect("raid5");
        ppl.start(self, &g, false)?;
        self.meta().write_all(self)?;
        *self.r5().ppl.write().unwrap_or_else(|e| e.into_inner()) = Some(std::sync::Arc::new(ppl));
        Ok(())
    }

    /// The write journal, if the array has one (raid4/5/6 only).
    pub(crate) fn journal(&self) -> Option<&Journal> {
        self.r5_conf().and_then(|c| c.journal.as_ref())
    }

    /// Whether the array has a write journal (raid4/5/6 with `--write-journal`).
    pub fn has_journal(&self) -> bool {
        self.journal().is_some()
    }

    /// Whether the write journal failed (writes are refused, reads go on).
    pub fn journal_failed(&self) -> bool {
        self.journal().is_some_and(|j| j.is_failed())
    }

    /// The journal device's name, with a journal.
    pub fn journal_device(&self) -> Option<String> {
        self.journal().map(|j| j.device_name())
    }

    /// A journal error on the write path: an IO error fails the journal, which the
    /// superblocks record (the journal's role faulty, as md does), so that assembly will
    /// not trust it again without --force.
    pub(crate) fn journal_error(&self, e: crate::journal::JournalError) -> ArrayError {
        if let Some(j) = self.journal() {
            if matches!(e, crate::journal::JournalError::Io { .. }) || j.is_failed() {
                j.set_failed();
                self.record_journal_failure();
            }
        }
        e.into()
    }

    fn record_journal_failure(&self) {
        let mut meta = self.meta();
        if meta.mark_journal_faulty() {
            tracing::error!("write journal failed: writes are refused from now on");
            if let Err(e) = meta.write_all(self) {
                tracing::error!("could not record the journal failure: {e}");
            }
        }
    }

    pub(crate) fn journal_failed_error(&self) -> ArrayError {
        ArrayError::JournalFailed(format!(
            "journal {} failed earlier",
            self.journal_device().unwrap_or_default()
        ))
    }

    /// Fail the journal on request (tests, `uraid fail` of the journal device).
    pub fn fail_journal(&self) -> Result<(), ArrayError> {
        let Some(j) = self.journal() else {
            return Err(ArrayError::Failed("the array has no write journal".into()));
        };
        j.set_failed();
        self.record_journal_failure();
        Ok(())
    }

    /// The stripe cache of a raid4/5/6 array (counters, size).
    /// Other levels have none: they get an empty one, unused.
    pub fn stripe_cache(&self) -> &StripeCache {
        static NONE: std::sync::OnceLock<StripeCache> = std::sync::OnceLock::new();
        match self.r5_conf() {
            Some(c) => &c.stripe_cache,
            None => NONE.get_or_init(|| {
                StripeCache::new(
                    crate::stripe_cache::DEFAULT_SIZE,
                    crate::stripe_cache::PARTITIONS,
                )
            }),
        }
    }

    /// Set md's stripe_cache_size (raid4/5/6; heads in the stripe cache).
    pub fn set_stripe_cache_size(&self, n: usize) -> Result<(), ArrayError> {
        use crate::stripe_cache::{MAX_SIZE, MIN_SIZE};
        let Some(c) = self.r5_conf() else {
            return Err(ArrayError::Failed(format!(
                "stripe_cache_size applies to raid4/5/6, not {}",
                self.level()
            )));
        };
        if !(MIN_SIZE..=MAX_SIZE).contains(&n) {
            return Err(ArrayError::Failed(format!(
                "stripe_cache_size must be {MIN_SIZE}..={MAX_SIZE}, not {n}"
            )));
        }
        c.stripe_cache.set_size(n);
        Ok(())
    }

    /// md's group_thread_cnt: stripe worker threads (0 = each submitter handles its stripes).
    pub fn group_thread_cnt(&self) -> usize {
        self.r5_conf().map_or(0, |c| c.group_thread_cnt())
    }

    /// Set group_thread_cnt: the old workers finish what they hold and stop.
    pub fn set_group_thread_cnt(&self, n: usize) -> Result<(), ArrayError> {
        const MAX_WORKERS: usize = 8192; // md's limit
        if n > MAX_WORKERS {
            return Err(ArrayError::Failed(format!(
                "group_thread_cnt must be at most {MAX_WORKERS}, not {n}"
            )));
        }
        if let Some(c) = self.r5_conf() {
            c.set_group_thread_cnt(n);
        }
        Ok(())
    }
}

/// Replay of the write journal writes through the array (see [`crate::journal`]).
impl crate::journal::ReplayTarget for Array {
    fn write_data_row(
        &self,
        g: &ParityGeometry,
        stripe_sector: u64,
        pages: &[(u64, &[u8])],
    ) -> io::Result<bool> {
        crate::raid5::writeback::write_row_direct(self, g, stripe_sector, pages)
    }

    fn write_block(&self, role: MemberIdx, member_sector: u64, page: &[u8]) -> io::Result<()> {
        match self.live(role) {
            Some(dev) => dev.write_at(page, self.member_byte(role, member_sector)),
            None => Ok(()),
        }
    }

    fn flush(&self) -> io::Result<()> {
        for r in 0..self.raid_disks() {
            if let Some(dev) = self.live(MemberIdx(r)) {
                dev.flush()?;
            }
        }
        Ok(())
    }
}
