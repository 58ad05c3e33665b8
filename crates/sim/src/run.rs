//! The simulator: one seed, one array on [`SimDisk`]s, a workload checked against a
//! [`Model`], and faults under a [`FaultBudget`].
//!
//! A run is a sequence of steps drawn from the seed: writes and reads (aligned and not,
//! across chunk and stripe boundaries), fault scheduling, quiet points (flush, whole-array
//! check, resync that must find nothing, silent corruption that resync must find and
//! repair, or a lost or misdirected write that check must find), stop and re-assembly from
//! the disks in a shuffled order (with failed members coming back stale, members left out
//! or replaced by an old image), a power cut in the middle of a write (or during a member
//! failure's slow superblock update), and, in over-budget runs, one member failure too many.

use super::budget::FaultBudget;
use super::config::{Mode, SimConfig};
use super::disk::{Effect, FaultCounts, FaultKind, FaultRule, OpFilter, SimDisk, SimWorld};
use super::layout;
use super::model::Model;
use super::SimRng;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use uraid_core::geometry::Personality;
use uraid_core::superblock::Superblock;
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};
use uraid_engine::Array;
use uraid_engine::ArrayError;
use uraid_engine::Member;
use uraid_engine::SlotState;
use uraid_engine::{AssembleOptions, AssembleReport};

/// The engine's assemble, with the array's sync passes on one thread (below).
fn assemble(
    devs: Vec<Arc<dyn Member>>,
    opts: &AssembleOptions,
) -> Result<(Array, AssembleReport), ArrayError> {
    let (a, rep) = uraid_engine::assemble(devs, opts)?;
    replayable_knobs(&a);
    Ok((a, rep))
}

/// Sync passes and pieces run on two threads by default (`sync_threads`): the order of
/// their member IO would differ between two runs of a seed, and with it which IO a
/// scheduled fault hits. The simulator runs them on one; `tests/sync_threads.rs` tests
/// the threads. For the same reason it turns off raid4/5/6's joins of partial stripes
/// (`join_wait_us` 0): whether a write in flight joins another's stripe depends on how
/// long the leader waits in real time; `tests/join.rs` and `tests/concurrency.rs` test
/// the joins.
fn replayable_knobs(a: &Array) {
    if let Some(t) = a.tuning() {
        // raid4/5/6, also while a reshape's personality answers `set_tunable`.
        t.sync_threads
            .store(1, std::sync::atomic::Ordering::Relaxed);
        t.join_wait_us
            .store(0, std::sync::atomic::Ordering::Relaxed);
    } else {
        // raid1 and raid10 take it; raid0 (no sync) and a reshaping raid10 refuse it.
        let _ = a.set_tunable("sync_threads", "1");
    }
}

mod lost_write;
mod restart;

/// Hooks for member lifecycle features (spares, add/remove, recovery, scrub). The
/// simulator calls them at quiet points; `None` means "not supported" and the simulator
/// goes on without. [`super::hooks::EngineLifecycle`] maps them to the engine.
pub trait Lifecycle {
    /// md's check (`repair` false: count mismatched sectors, change nothing) or repair.
    fn scrub(&self, array: &Array, repair: bool) -> Option<Result<u64, ArrayError>> {
        let _ = (array, repair);
        None
    }

    /// md's check over the recovery units that cover array sectors
    /// `[start, start + sectors)` only: mismatched sectors counted, nothing changed.
    fn check_range(
        &self,
        array: &Array,
        start: u64,
        sectors: u64,
    ) -> Option<Result<u64, ArrayError>> {
        let _ = (array, start, sectors);
        None
    }

    /// Add a device: Some(role) if it took a missing role (recovery must run), None if it
    /// waits as a spare.
    fn add_member(
        &self,
        array: &Array,
        disk: Arc<dyn Member>,
    ) -> Option<Result<Option<MemberIdx>, ArrayError>> {
        let _ = (array, disk);
        None
    }

    /// Remove a faulty member.
    fn remove_member(&self, array: &Array, role: MemberIdx) -> Option<Result<(), ArrayError>> {
        let _ = (array, role);
        None
    }

    /// Rebuild every recovering member to the end.
    fn recover(&self, array: &Array) -> Option<Result<(), ArrayError>> {
        let _ = array;
        None
    }

    /// Names of the spare devices.
    fn spares(&self, array: &Array) -> Vec<String> {
        let _ = array;
        Vec::new()
    }

    /// md's --replace of an in-sync member by a spare (rebuilt by `recover`); the
    /// replacement's name.
    fn replace(&self, array: &Array, role: MemberIdx) -> Option<Result<String, ArrayError>> {
        let _ = (array, role);
        None
    }
}

/// An engine without lifecycle features: only `resync`.
pub struct NoLifecycle;

impl Lifecycle for NoLifecycle {}

/// Knobs of a run that are not drawn from the seed.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Workload steps per run.
    pub steps: usize,
    /// Fail on deviations from md (see [`Finding`]), the default; off, they are recorded
    /// in the report and the run goes on as md would.
    pub strict: bool,
    /// Make disk 0 lie (drop writes, report success) from a quarter of the run on. No
    /// array survives that; a run must then fail with wrong data, which shows that the
    /// checks can fail.
    pub lying_disk: bool,
    /// Also replace in-sync members by spares (md's --replace) at quiet points. Off by
    /// default so that the seeds of earlier runs (and their regressions) stay as they were.
    pub replace: bool,
    /// In power-cut runs, cut the power while a member failure's superblock update is
    /// held open and writes that skip the member are in flight (md's
    /// MD_SB_CHANGE_PENDING), instead of in the middle of one write. Off by default so
    /// that the seeds of earlier runs stay as they were.
    pub slow_superblock: bool,
}

impl Default for SimOptions {
    fn default() -> SimOptions {
        SimOptions {
            steps: 160,
            strict: true,
            lying_disk: false,
            replace: false,
            slow_superblock: false,
        }
    }
}

/// Counters of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    pub steps: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_written: u64,
    pub quiet_points: u64,
    pub resyncs: u64,
    pub scrub_repairs: u64,
    pub reassemblies: u64,
    pub crashes: u64,
    pub over_budget: u64,
    /// Reads or writes that failed, correctly, on data that was gone.
    pub expected_errors: u64,
    pub member_failures_seen: u64,
    pub rebuilds: u64,
    /// Latent sector errors the engine rewrote from redundancy.
    pub latent_repaired: u64,
    /// Members replaced by a spare (md's --replace) that completed.
    pub replaces: u64,
}

/// A deviation from md that md would not show: fatal with [`SimOptions::strict`] (the
/// default), else recorded and the run goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub step: u64,
    /// A short name for the kind of deviation, for counting.
    pub kind: &'static str,
    pub what: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimReport {
    pub seed: u64,
    pub config: SimConfig,
    pub mode: Mode,
    pub stats: RunStats,
    pub faults: FaultCounts,
    pub virtual_ns: u64,
    pub member_ios: u64,
    pub findings: Vec<Finding>,
}

#[derive(Debug)]
pub struct SimFailure {
    pub seed: u64,
    pub config: SimConfig,
    pub mode: Mode,
    pub step: u64,
    pub message: String,
    pub trace: Vec<String>,
}

/// How to replay one seed.
pub fn replay_command(seed: u64) -> String {
    format!("URAID_SIM_SEED={seed} cargo test -p uraid-engine --test sim_ci -- --nocapture")
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "uraid sim: seed {} FAILED at step {} ({:?}, {:?})",
            self.seed, self.step, self.mode, self.config
        )?;
        writeln!(f, "  {}", self.message)?;
        writeln!(f, "  replay: {}", replay_command(self.seed))?;
        writeln!(f, "  last events:")?;
        let skip = self.trace.len().saturating_sub(40);
        for l in &self.trace[skip..] {
            writeln!(f, "    {l}")?;
        }
        Ok(())
    }
}

type Res = Result<(), String>;

/// Run one seed with the engine as it is.
pub fn run_seed(seed: u64, opts: &SimOptions) -> Result<SimReport, SimFailure> {
    let (cfg, mode) = SimConfig::for_seed(seed);
    run(seed, &cfg, mode, opts, &super::hooks::EngineLifecycle)
}

/// Run one seed with a given configuration, mode and lifecycle hooks.
pub fn run(
    seed: u64,
    cfg: &SimConfig,
    mode: Mode,
    opts: &SimOptions,
    hooks: &dyn Lifecycle,
) -> Result<SimReport, SimFailure> {
    let mut sim = match Simulator::new(seed, cfg, mode, opts, hooks) {
        Ok(s) => s,
        Err((world, message)) => {
            return Err(SimFailure {
                seed,
                config: cfg.clone(),
                mode,
                step: 0,
                message,
                trace: world.trace(),
            })
        }
    };
    match sim.run_all() {
        Ok(()) => Ok(sim.report()),
        Err(message) => Err(SimFailure {
            seed,
            config: cfg.clone(),
            mode,
            step: sim.stats.steps,
            message,
            trace: sim.world.trace(),
        }),
    }
}

pub struct Simulator<'h> {
    seed: u64,
    cfg: SimConfig,
    mode: Mode,
    opts: SimOptions,
    hooks: &'h dyn Lifecycle,
    world: Arc<SimWorld>,
    /// Every disk ever made; `role_disk[r]` is the one that holds role r.
    disks: Vec<Arc<SimDisk>>,
    role_disk: Vec<usize>,
    /// Disks waiting as spares.
    spares: Vec<usize>,
    /// A finding left the array in a state md would not reach: the run ends there.
    ended: bool,
    array: Option<Array>,
    personality: Personality,
    data_offset_bytes: u64,
    model: Model,
    budget: FaultBudget,
    /// Workload and fault decisions come from separate streams.
    wl: SimRng,
    fr: SimRng,
    /// Replace decisions, a stream of their own so that runs without them are unchanged.
    rr: SimRng,
    /// Lost and misdirected writes, a stream of their own too.
    lw: SimRng,
    /// One member failure too many has been injected.
    over: bool,
    crashed: bool,
    /// Latent sector errors still counted in the budget: (disk, byte range, unit, role).
    latent: Vec<(usize, (u64, u64), u64, usize)>,
    latent_armed: Vec<u32>,
    /// Over budget by a latent error: (unit, role).
    over_unit: Option<(u64, usize)>,
    /// Images of disks taken at earlier stops, to come back as stale disks.
    saved_images: Vec<Option<Vec<u8>>>,
    stats: RunStats,
    findings: Vec<Finding>,
}

impl<'h> Simulator<'h> {
    pub fn new(
        seed: u64,
        cfg: &SimConfig,
        mode: Mode,
        opts: &SimOptions,
        hooks: &'h dyn Lifecycle,
    ) -> Result<Simulator<'h>, (Arc<SimWorld>, String)> {
        let world = SimWorld::new();
        let mut root = SimRng::new(seed);
        let wl = root.fork(1);
        let fr = root.fork(2);
        let mut uuid = [0u8; 16];
        root.fill(&mut uuid);
        let rr = root.fork(3);
        let lw = root.fork(4);
        let disks: Vec<Arc<SimDisk>> = (0..cfg.disks)
            .map(|i| {
                Arc::new(SimDisk::new(
                    format!("sim{i}"),
                    cfg.member_bytes,
                    world.clone(),
                ))
            })
            .collect();
        let devs = disks
            .iter()
            .map(|d| Some(d.clone() as Arc<dyn Member>))
            .collect();
        let array = uraid_engine::create(devs, &cfg.create_options(uuid, world.engine_clock()))
            .map_err(|e| (world.clone(), format!("create failed: {e}")))?;
        replayable_knobs(&array);
        let personality = array.personality().clone();
        let data_offset_bytes = array.slot(MemberIdx(0)).data_offset_bytes();
        let model = Model::new(array.size_bytes());
        world.note(format!(
            "created {:?}: {} bytes, mode {mode:?}",
            cfg,
            array.size_bytes()
        ));
        Ok(Simulator {
            seed,
            cfg: cfg.clone(),
            mode,
            opts: opts.clone(),
            hooks,
            world,
            role_disk: (0..cfg.disks).collect(),
            spares: Vec::new(),
            ended: false,
            saved_images: vec![None; cfg.disks],
            latent: Vec::new(),
            latent_armed: vec![0; cfg.disks],
            over_unit: None,
            disks,
            array: Some(array),
            budget: FaultBudget::new(personality.clone()),
            personality,
            data_offset_bytes,
            model,
            wl,
            fr,
            rr,
            lw,
            over: false,
            crashed: false,
            stats: RunStats::default(),
            findings: Vec::new(),
        })
    }

    pub fn report(&self) -> SimReport {
        SimReport {
            seed: self.seed,
            config: self.cfg.clone(),
            mode: self.mode,
            stats: self.stats.clone(),
            faults: self.world.counts(),
            virtual_ns: self.world.clock.now_ns(),
            member_ios: self.world.io_seq(),
            findings: self.findings.clone(),
        }
    }

    fn array(&self) -> &Array {
        self.array.as_ref().expect("array is assembled")
    }

    fn disk(&self, role: usize) -> &Arc<SimDisk> {
        &self.disks[self.role_disk[role]]
    }

    fn finding(&mut self, kind: &'static str, what: String) -> Res {
        self.world.note(format!("FINDING ({kind}): {what}"));
        if self.opts.strict {
            return Err(format!("{kind}: {what}"));
        }
        self.findings.push(Finding {
            step: self.stats.steps,
            kind,
            what,
        });
        Ok(())
    }

    pub fn run_all(&mut self) -> Res {
        let steps = self.opts.steps as u64;
        // Member faults start after a healthy first quarter, which is where silent
        // corruption and its repair are tried (they need every member).
        let faults_from = steps / 4;
        let crash_at = self.fr.range(steps / 8, steps / 2);
        let over_at = self.fr.range(steps / 2, steps * 3 / 4);
        while self.stats.steps < steps {
            let step = self.stats.steps;
            if self.mode == Mode::Crash && !self.crashed && step >= crash_at {
                if self.opts.slow_superblock {
                    self.crash_during_failure_update()?;
                } else {
                    self.crash()?;
                }
            }
            if self.mode == Mode::OverBudget && !self.over && step >= over_at {
                self.go_over_budget()?;
            }
            if self.opts.lying_disk && step == faults_from {
                self.disk(0).add_rule(FaultRule {
                    effect: Effect::LoseWrite,
                    ops: OpFilter::Write,
                    from_io: 0,
                    range: Some((self.data_offset_bytes, self.cfg.member_bytes)),
                    times: None,
                });
            }
            let faults_ok = step >= faults_from && (self.mode != Mode::Crash || self.crashed);
            let roll = self.wl.range(0, 1000);
            match roll {
                0..=469 => self.op_write()?,
                470..=799 => self.op_read()?,
                800..=879 if faults_ok && !self.over => self.arm_fault()?,
                800..=879 => self.arm_stall(),
                880..=959 => self.quiet_point()?,
                _ => self.reassemble()?,
            }
            if self.array.is_none() || self.ended {
                // Over budget the array could not be put together again, or a finding
                // left it where md would not be. Done.
                return Ok(());
            }
            self.sync_roles();
            self.release_latent();
            self.check_invariants()?;
            self.stats.steps += 1;
        }
        self.finish()
    }

    /// The end of a run: a last full check, a clean stop and a last assembly.
    fn finish(&mut self) -> Res {
        self.quiet_point()?;
        self.reassemble()?;
        if self.array.is_some() {
            self.verify_all("final check")?;
        }
        Ok(())
    }

    // ----- workload -------------------------------------------------------------------

    /// Bytes of one budget unit (a stripe's data, a chunk, a mirror region).
    fn unit_bytes(&self) -> u64 {
        layout::bytes(layout::unit_span(&self.personality, 0).1)
    }

    /// A random range: aligned or not, small or spanning units, often across a boundary.
    fn random_range(&mut self) -> (u64, u64) {
        let size = self.model.size_bytes();
        let unit = self.unit_bytes();
        let max = (unit * 3).min(size);
        let rng = &mut self.wl;
        let (off, len) = match rng.range(0, 10) {
            // Sector-aligned, up to three units.
            0..=3 => {
                let len = rng.range_incl(1, max / SECTOR_BYTES) * SECTOR_BYTES;
                let off = rng.range_incl(0, (size - len) / SECTOR_BYTES) * SECTOR_BYTES;
                (off, len)
            }
            // Straddling a unit boundary (chunk or stripe).
            4..=5 => {
                let units = size / unit;
                let b = rng.range_incl(1, units.max(2) - 1).min(units) * unit;
                let before = rng.range_incl(1, unit.min(b));
                let after = rng.range_incl(0, unit.min(size - b));
                (b - before, before + after)
            }
            // Whole units (full-stripe writes on parity levels).
            6 => {
                let units = size / unit;
                let n = rng.range_incl(1, 2.min(units));
                let first = rng.range_incl(0, units - n);
                (first * unit, n * unit)
            }
            // Unaligned bytes.
            7..=8 => {
                let len = rng.range_incl(1, max);
                (rng.range_incl(0, size - len), len)
            }
            // Tiny.
            _ => {
                let len = rng.range_incl(1, 16);
                (rng.range_incl(0, size - len), len)
            }
        };
        debug_assert!(off + len <= size && len > 0);
        (off, len)
    }

    fn op_write(&mut self) -> Res {
        let (off, len) = self.random_range();
        let mut data = vec![0u8; len as usize];
        self.wl.fill(&mut data);
        self.stats.writes += 1;
        self.stats.bytes_written += len;
        match self.array().write(off, &data) {
            Ok(()) => {
                self.model.write_ok(off, &data);
                Ok(())
            }
            Err(e) if self.over => {
                self.expect_eio(&e, "write")?;
                self.stats.expected_errors += 1;
                self.model.write_uncertain(off, &data);
                Ok(())
            }
            Err(e) => Err(format!(
                "write at {off}+{len} failed within the fault budget (faulted members {:?}): {e}",
                self.budget.faulted_members()
            )),
        }
    }

    fn op_read(&mut self) -> Res {
        let (off, len) = self.random_range();
        self.stats.reads += 1;
        self.read_check(off, len, "read")
    }

    fn expect_eio(&self, e: &ArrayError, what: &str) -> Res {
        if e.errno() != libc::EIO {
            return Err(format!(
                "{what} failed with errno {} instead of EIO: {e}",
                e.errno()
            ));
        }
        Ok(())
    }

    /// Read a range and check it: within budget it must succeed with the model's bytes;
    /// over budget it may fail with EIO, but only where the data is really gone.
    fn read_check(&mut self, off: u64, len: u64, what: &str) -> Res {
        let mut buf = vec![0u8; len as usize];
        match self.array().read(off, &mut buf) {
            Ok(()) => self
                .model
                .check(off, &buf)
                .map_err(|e| format!("{what} at {off}+{len}: {e}")),
            Err(e) if self.over => {
                self.expect_eio(&e, what)?;
                let gone = self.unusable_for(off, len);
                let first = off / SECTOR_BYTES;
                let count = (off + len).div_ceil(SECTOR_BYTES) - first;
                if layout::readable(&self.personality, &gone, first, count) {
                    return Err(format!(
                        "{what} at {off}+{len} failed although its data is on working members \
                         (gone: {gone:?}): {e}"
                    ));
                }
                self.stats.expected_errors += 1;
                Ok(())
            }
            Err(e) => Err(format!(
                "{what} at {off}+{len} failed within the fault budget (faulted members {:?}): {e}",
                self.budget.faulted_members()
            )),
        }
    }

    /// Read the whole array piece by piece against the model.
    fn verify_all(&mut self, what: &str) -> Res {
        let size = self.model.size_bytes();
        let mut off = 0;
        while off < size {
            let len = (self.wl.range_incl(1, 4) * 64 * 1024).min(size - off);
            self.read_check(off, len, what)?;
            off += len;
        }
        Ok(())
    }

    /// After every step: the engine failed only members we scheduled faults for, and it
    /// still runs while within budget.
    fn check_invariants(&mut self) -> Res {
        let missing = self.array().missing_roles();
        let mut faulted = self.budget.faulted_members();
        // Over budget by a latent error, the engine may give up that member (md does for
        // raid4/5/6).
        faulted.extend(self.over_unit.map(|(_, r)| r));
        for r in &missing {
            if !faulted.contains(&r.0) {
                return Err(format!(
                    "the engine failed member {r} although no fault was injected there \
                     (faulted: {faulted:?}, missing: {missing:?})"
                ));
            }
        }
        if !self.over && !self.array().is_running() {
            return Err(format!(
                "array stopped running within budget: missing {missing:?}"
            ));
        }
        Ok(())
    }

    // ----- faults ---------------------------------------------------------------------

    fn arm_stall(&mut self) {
        let role = self.fr.index(self.cfg.disks);
        let disk = self.disk(role).clone();
        let ns = self.fr.range(1_000_000, 30_000_000_000);
        let from_io = disk.ios() + self.fr.range(0, 64);
        let times = Some(self.fr.range_incl(1, 3) as u32);
        disk.add_rule(FaultRule {
            effect: Effect::Stall { ns },
            ops: OpFilter::Any,
            from_io,
            range: None,
            times,
        });
    }

    /// A random byte range on a member: mostly in the data area, sometimes in the
    /// metadata (superblock, bitmap) before it.
    fn member_range(&mut self) -> (u64, u64) {
        let size = self.cfg.member_bytes;
        if self.fr.chance(15) {
            let s = 4096;
            return (s, self.data_offset_bytes.max(s + 512));
        }
        let len = self.fr.range_incl(1, 64) * SECTOR_BYTES;
        let data = size - self.data_offset_bytes;
        let start = self.data_offset_bytes
            + self.fr.range_incl(0, (data - len.min(data)) / SECTOR_BYTES) * SECTOR_BYTES;
        (start, (start + len).min(size))
    }

    /// Latent errors that a write has cleared leave the budget.
    fn release_latent(&mut self) {
        let mut keep = Vec::new();
        for (d, range, unit, role) in std::mem::take(&mut self.latent) {
            if self.disks[d].latent_pending(range) {
                keep.push((d, range, unit, role));
            } else {
                self.budget.unit_cleared(unit, role);
                self.stats.latent_repaired += 1;
            }
        }
        self.latent = keep;
    }

    /// A latent sector error in one unit's block of one member: reads of it fail until
    /// it is rewritten, which the engine must do from redundancy (md's read-error repair)
    /// without failing the member. It counts against that unit only.
    fn arm_latent(&mut self) {
        if self.cfg.level == Level::Raid0 {
            return self.arm_stall();
        }
        let units = layout::units(&self.personality);
        let unit = self.fr.range(0, units);
        let mut roles = layout::unit_members(&self.personality, unit);
        self.fr.shuffle(&mut roles);
        let Some(role) = roles.into_iter().find(|r| {
            self.budget.can_fault_unit(unit, r.0)
                && self.array().slot_state(*r) == SlotState::InSync
                && self.latent.iter().filter(|l| l.3 == r.0).count() < 4
                && self.latent_armed[r.0] < 8
        }) else {
            return self.arm_stall();
        };
        let Some((msec, sectors)) = layout::member_block(&self.personality, unit, role) else {
            return self.arm_stall();
        };
        let first = self.fr.range(0, sectors);
        let n = self.fr.range_incl(1, (sectors - first).min(8));
        let start = self.data_offset_bytes + (msec + first) * SECTOR_BYTES;
        let range = (start, start + n * SECTOR_BYTES);
        self.budget.fault_unit(unit, role.0);
        let d = self.role_disk[role.0];
        self.disks[d].add_rule(FaultRule {
            effect: Effect::LatentRead,
            ops: OpFilter::Any,
            from_io: 0,
            range: Some(range),
            times: None,
        });
        self.latent.push((d, range, unit, role.0));
        // md fails a member after 20 corrected read errors; stay well below.
        self.latent_armed[role.0] += 1;
    }

    /// Schedule a member fault on a member the budget allows.
    fn arm_fault(&mut self) -> Res {
        if self.fr.chance(30) {
            self.arm_stall();
            return Ok(());
        }
        if self.fr.chance(30) {
            self.arm_latent();
            return Ok(());
        }
        let present: Vec<usize> = (0..self.cfg.disks)
            .filter(|&r| self.array().slot(MemberIdx(r)).device().is_some())
            .filter(|&r| self.budget.can_fault_member(r))
            .collect();
        if present.is_empty() {
            self.arm_stall();
            return Ok(());
        }
        let role = *self.fr.pick(&present);
        self.budget.fault_member(role);
        let disk = self.disk(role).clone();
        let from_io = disk.ios() + self.fr.range(0, 150);
        let transient = Some(self.fr.range_incl(1, 3) as u32);
        let rule = match self.fr.range(0, 7) {
            0 => FaultRule {
                effect: Effect::Error,
                ops: OpFilter::Read,
                from_io,
                range: None,
                times: transient,
            },
            1 => FaultRule {
                effect: Effect::Error,
                ops: OpFilter::Write,
                from_io,
                range: None,
                times: transient,
            },
            2 => FaultRule {
                effect: Effect::Error,
                ops: OpFilter::Read,
                from_io,
                range: Some(self.member_range()),
                times: None,
            },
            3 => FaultRule {
                effect: Effect::Error,
                ops: OpFilter::Write,
                from_io,
                range: Some(self.member_range()),
                times: None,
            },
            4 => FaultRule {
                effect: Effect::Error,
                ops: OpFilter::Any,
                from_io,
                range: None,
                times: None,
            },
            5 => FaultRule {
                effect: Effect::Disappear,
                ops: OpFilter::Any,
                from_io,
                range: None,
                times: Some(1),
            },
            _ => {
                disk.disappear();
                return Ok(());
            }
        };
        disk.add_rule(rule);
        Ok(())
    }

    /// Fail every member the budget allows, for real, then one more.
    fn go_over_budget(&mut self) -> Res {
        self.world.note("going over budget".into());
        for (d, _, unit, role) in std::mem::take(&mut self.latent) {
            self.disks[d].clear_latent();
            self.budget.unit_cleared(unit, role);
        }
        loop {
            let next = (0..self.cfg.disks)
                .find(|&r| !self.disk(r).is_gone() && self.budget.can_fault_member(r));
            match next {
                Some(r) => {
                    self.budget.fault_member(r);
                    self.disk(r).disappear();
                }
                None => break,
            }
        }
        for r in self.budget.faulted_members() {
            self.disk(r).disappear();
        }
        let healthy: Vec<usize> = (0..self.cfg.disks)
            .filter(|&r| !self.budget.faulted_members().contains(&r))
            .collect();
        if healthy.is_empty() {
            return Ok(());
        }
        if self.cfg.level != Level::Raid0 && self.fr.chance(40) {
            // md's classic: a degraded array meets a latent sector error on a member it
            // needs. That unit may fail; nothing may come back wrong.
            self.over_latent(&healthy);
        } else {
            let r = *self.fr.pick(&healthy);
            self.budget.fault_member_over_budget(r);
            self.disk(r).disappear();
            assert!(!self.budget.within(), "one too many");
        }
        self.over = true;
        self.stats.over_budget += 1;
        // Every unit, one by one: readable ones must read correctly, the others fail.
        let unit = self.unit_bytes();
        let size = self.model.size_bytes();
        let mut off = 0;
        while off < size {
            let len = unit.min(size - off);
            self.read_check(off, len, "over-budget unit read")?;
            off += len;
        }
        Ok(())
    }

    /// One fault too many in one unit: a latent error on a surviving member's block.
    fn over_latent(&mut self, healthy: &[usize]) {
        let units = layout::units(&self.personality);
        let unit = self.fr.range(0, units);
        let members = layout::unit_members(&self.personality, unit);
        let Some(&role) = healthy.iter().find(|r| members.contains(&MemberIdx(**r))) else {
            return;
        };
        let Some((msec, sectors)) = layout::member_block(&self.personality, unit, MemberIdx(role))
        else {
            return;
        };
        let start = self.data_offset_bytes + msec * SECTOR_BYTES;
        let range = (start, start + sectors * SECTOR_BYTES);
        self.disk(role).add_rule(FaultRule {
            effect: Effect::LatentRead,
            ops: OpFilter::Any,
            from_io: 0,
            range: Some(range),
            times: None,
        });
        self.over_unit = Some((unit, role));
        self.world.note(format!(
            "over budget: latent error on member {role} in unit {unit}"
        ));
    }

    /// Members a read over budget may not count on: those pulled, those the engine gave
    /// up on, and the member with the latent error when the read touches its unit.
    fn unusable_for(&self, off: u64, len: u64) -> Vec<MemberIdx> {
        let mut gone: BTreeSet<usize> = self.budget.faulted_members().into_iter().collect();
        gone.extend(self.array().missing_roles().iter().map(|r| r.0));
        if let Some((unit, role)) = self.over_unit {
            let (s, n) = layout::unit_span(&self.personality, unit);
            let (us, ue) = (s * SECTOR_BYTES, (s + n) * SECTOR_BYTES);
            if off < ue && off + len > us {
                gone.insert(role);
            }
        }
        gone.into_iter().map(MemberIdx).collect()
    }

    // ----- quiet points ---------------------------------------------------------------

    fn quiet_point(&mut self) -> Res {
        self.stats.quiet_points += 1;
        if let Err(e) = self.array().flush() {
            if !self.over {
                return Err(format!("flush failed within budget: {e}"));
            }
        }
        self.verify_all("quiet-point check")?;
        self.lifecycle_step()?;
        if self.cfg.level == Level::Raid0 || self.over || self.array().is_degraded() {
            return Ok(());
        }
        if self.budget.is_clear() && self.fr.chance(50) {
            if !self.opts.lying_disk && self.lw.chance(40) {
                return self.lost_or_misdirected_write();
            }
            return self.corrupt_and_repair();
        }
        let missing_before = self.array().missing_roles();
        self.stats.resyncs += 1;
        // A full check where the engine has one (a bitmap-guided resync of a clean array
        // reads nothing), else resync.
        let full = self.fr.chance(70);
        let pass = match self.hooks.scrub(self.array(), false) {
            Some(r) if full => r,
            _ => self.array().resync(),
        };
        match pass {
            Ok(0) => {}
            Ok(n) => {
                return Err(format!(
                    "a consistency pass found {n} mismatches although no corruption was \
                     injected"
                ))
            }
            Err(e) => {
                // A member failing during resync aborts it, as in md; anything else is a bug.
                if self.array().missing_roles() == missing_before {
                    return Err(format!("resync failed with every member working: {e}"));
                }
                self.world
                    .note(format!("resync aborted by a member failure: {e}"));
            }
        }
        self.verify_all("check after resync")
    }

    /// Flip bytes in redundancy blocks of a few units (within budget per unit), then a
    /// check must count them without changing anything, repair (or resync) must count the
    /// same and fix them, and a second pass must find nothing.
    fn corrupt_and_repair(&mut self) -> Res {
        let units = layout::units(&self.personality);
        let mut hit = BTreeSet::new();
        // Upper bound on mismatched sectors.
        let mut bound = 0;
        for _ in 0..self.fr.range_incl(1, 4) {
            let unit = self.fr.range(0, units);
            let mut blocks = layout::redundant_blocks(&self.personality, unit);
            if blocks.is_empty() {
                return Ok(());
            }
            self.fr.shuffle(&mut blocks);
            let k = self.fr.range_incl(1, blocks.len() as u64) as usize;
            for &(role, msec, sectors) in &blocks[..k] {
                if !self.budget.can_fault_unit(unit, role.0) {
                    continue;
                }
                self.budget.fault_unit(unit, role.0);
                let first = self.fr.range(0, sectors);
                let n = self.fr.range_incl(1, sectors - first);
                let off = self.data_offset_bytes + (msec + first) * SECTOR_BYTES;
                let disk = self.disk(role.0).clone();
                disk.corrupt(off, n * SECTOR_BYTES, &mut self.fr);
                hit.insert(unit);
                // The engine may count in larger units (md counts raid1 mismatches per
                // resync window): allow 256 KiB windows around each block.
                bound += n + 1024;
            }
        }
        if hit.is_empty() {
            return Ok(());
        }
        let counted = |what: &str, n: u64| -> Res {
            if n == 0 || n > bound {
                return Err(format!(
                    "{what} counted {n} mismatched sectors for silent corruption in units \
                     {hit:?} (at most {bound} possible)"
                ));
            }
            Ok(())
        };
        let checked = match self.hooks.scrub(self.array(), false) {
            Some(r) => {
                let n = r.map_err(|e| format!("check failed: {e}"))?;
                counted("check", n)?;
                Some(n)
            }
            None => None,
        };
        self.stats.resyncs += 1;
        let repaired = match self.hooks.scrub(self.array(), true) {
            Some(r) => r.map_err(|e| format!("repair failed: {e}"))?,
            None => self
                .array()
                .resync()
                .map_err(|e| format!("resync after corruption failed: {e}"))?,
        };
        counted("repair", repaired)?;
        if let Some(c) = checked {
            if c != repaired {
                return Err(format!(
                    "check counted {c} mismatched sectors but repair then counted {repaired}: \
                     check changed something or they count differently"
                ));
            }
        }
        self.stats.scrub_repairs += repaired;
        self.budget.units_repaired();
        self.verify_all("check after repair")?;
        self.stats.resyncs += 1;
        let again = match self.hooks.scrub(self.array(), false) {
            Some(r) => r,
            None => self.array().resync(),
        };
        match again {
            Ok(0) => Ok(()),
            Ok(n) => Err(format!("a second pass after repair still found {n}")),
            Err(e) => Err(format!("a second pass after repair failed: {e}")),
        }
    }

    fn new_disk(&mut self) -> Arc<SimDisk> {
        let d = Arc::new(SimDisk::new(
            format!("sim{}", self.disks.len()),
            self.cfg.member_bytes,
            self.world.clone(),
        ));
        self.disks.push(d.clone());
        d
    }

    /// Our disks are named `sim<index>`.
    fn disk_index(name: &str) -> Option<usize> {
        name.strip_prefix("sim")?.parse().ok()
    }

    /// Follow the engine: which disk fills each role (a spare may have taken one over),
    /// which disks are spares.
    fn sync_roles(&mut self) {
        let Some(a) = self.array.as_ref() else { return };
        for r in 0..self.cfg.disks {
            if let Some(i) = a
                .slot(MemberIdx(r))
                .device_name()
                .and_then(|n| Self::disk_index(&n))
            {
                self.role_disk[r] = i;
            }
        }
        self.spares = self
            .hooks
            .spares(a)
            .iter()
            .filter_map(|n| Self::disk_index(n))
            .collect();
    }

    /// Member lifecycle at a quiet point (where the engine has it): finish a recovery,
    /// replace or re-add a failed member and rebuild it, or add a hot spare.
    fn lifecycle_step(&mut self) -> Res {
        if self.over {
            return Ok(());
        }
        if !self.array().recovering_roles().is_empty() {
            return self.recover();
        }
        let missing = self.array().missing_roles();
        if let Some(&role) = missing.first() {
            if !self.fr.chance(60) {
                return Ok(());
            }
            if self.array().slot_state(role) == SlotState::Faulty {
                self.world.note(format!("removing faulty member {role}"));
                match self.hooks.remove_member(self.array(), role) {
                    None => return Ok(()),
                    Some(Err(e)) => return Err(format!("removing faulty member {role}: {e}")),
                    Some(Ok(())) => {}
                }
            }
            let old = self.disks[self.role_disk[role.0]].clone();
            // An empty role still names its last disk, which may have moved on.
            let idx = self.role_disk[role.0];
            let old_in_use = self.spares.contains(&idx)
                || (0..self.cfg.disks).any(|r| r != role.0 && self.role_disk[r] == idx);
            let disk = if !old.is_gone() && !old_in_use && self.fr.chance(50) {
                // The old disk, repaired, comes back (md's re-add).
                old.clear_rules();
                old
            } else {
                self.new_disk()
            };
            self.world
                .note(format!("adding {} for member {role}", disk.name()));
            match self.hooks.add_member(self.array(), disk.clone()) {
                None => Ok(()),
                Some(Err(e)) => Err(format!(
                    "adding {} for missing member {role} failed: {e}",
                    disk.name()
                )),
                Some(Ok(None)) => Err(format!(
                    "{} became a spare although member {role} is missing",
                    disk.name()
                )),
                Some(Ok(Some(_))) => {
                    self.sync_roles();
                    self.recover()
                }
            }
        } else if self.opts.replace && !self.spares.is_empty() && self.rr.chance(40) {
            self.replace_member()
        } else if self.cfg.level != Level::Raid0 && self.spares.is_empty() && self.fr.chance(30) {
            let disk = self.new_disk();
            self.world
                .note(format!("adding {} as a spare", disk.name()));
            match self.hooks.add_member(self.array(), disk.clone()) {
                None => Ok(()),
                Some(Err(e)) => Err(format!("adding spare {} failed: {e}", disk.name())),
                Some(Ok(Some(r))) => Err(format!(
                    "{} took role {r} although no member was missing",
                    disk.name()
                )),
                Some(Ok(None)) => {
                    self.sync_roles();
                    Ok(())
                }
            }
        } else {
            Ok(())
        }
    }

    /// md's --replace of a random in-sync member by the spare, rebuilt at once (faults
    /// armed on the disks may hit the old member or the replacement meanwhile).
    fn replace_member(&mut self) -> Res {
        // After a power cut the engine's spares may have changed under us.
        self.sync_roles();
        if self.spares.is_empty() {
            return Ok(());
        }
        let live: Vec<MemberIdx> = (0..self.cfg.disks)
            .map(MemberIdx)
            .filter(|&r| self.array().slot_state(r) == SlotState::InSync)
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        let role = *self.rr.pick(&live);
        let old_disk = self.role_disk[role.0];
        self.world.note(format!("replacing member {role}"));
        let faulty_before = self.faulty_roles();
        let name = match self.hooks.replace(self.array(), role) {
            None => return Ok(()),
            Some(Err(e)) => return Err(format!("replace of member {role} refused: {e}")),
            Some(Ok(n)) => n,
        };
        // Only a member failing (a fault armed on a disk may fire on the superblock
        // writes) may degrade the array, leaving a role faulty or, if it was the member
        // being replaced, recovering onto the replacement; the replace itself never does.
        if self.array().is_degraded()
            && self.faulty_roles() == faulty_before
            && self.array().recovering_roles().is_empty()
        {
            return Err(format!(
                "replacing member {role} by {name} degraded the array"
            ));
        }
        match self.hooks.recover(self.array()) {
            None => return Ok(()),
            Some(Ok(())) => {}
            Some(Err(e)) => {
                if self.faulty_roles() == faulty_before {
                    return Err(format!(
                        "replace of {role} failed with no member failing: {e}"
                    ));
                }
                self.world
                    .note(format!("replace ended by a member failure: {e}"));
                self.sync_roles();
                return Ok(());
            }
        }
        if !self.array().replacing_roles().is_empty() {
            return Err(format!("replace of {role} did not finish"));
        }
        self.sync_roles();
        self.world.note(format!(
            "replace done; roles on disks {:?}, spares {:?}",
            self.role_disk, self.spares
        ));
        let now = self.role_disk[role.0];
        if now != old_disk && self.array().slot_state(role) == SlotState::InSync {
            self.stats.replaces += 1;
            let disk = self.disk(role.0).clone();
            if disk.pending_faults() == 0 && !disk.is_gone() {
                // The old disk and its faults left the array.
                self.budget.member_replaced(role.0);
            }
        }
        self.verify_all("check after replace")?;
        self.full_check_clean("replace")
    }

    /// Rebuild recovering members to the end; a rebuilt role with a clean disk leaves the
    /// budget.
    fn recover(&mut self) -> Res {
        let before = self.array().recovering_roles();
        let faulty_before = self.faulty_roles();
        self.world.note(format!("recovering {before:?}"));
        match self.hooks.recover(self.array()) {
            None => return Ok(()),
            Some(Ok(())) => {}
            Some(Err(e)) => {
                // A member failing during recovery ends it, as in md; anything else is a bug.
                if self.faulty_roles() == faulty_before {
                    return Err(format!(
                        "recovery of {before:?} failed with no member failing: {e}"
                    ));
                }
                self.world
                    .note(format!("recovery ended by a member failure: {e}"));
                return Ok(());
            }
        }
        self.sync_roles();
        self.world.note(format!(
            "recovery done; roles on disks {:?}, spares {:?}",
            self.role_disk, self.spares
        ));
        for r in before {
            if self.array().slot_state(r) != SlotState::InSync {
                continue;
            }
            self.stats.rebuilds += 1;
            let disk = self.disk(r.0).clone();
            if disk.pending_faults() == 0 && !disk.is_gone() {
                self.budget.member_replaced(r.0);
            }
        }
        self.verify_all("check after recovery")?;
        // Recovery (bitmap-guided for a re-added member) must leave every stripe or copy
        // consistent, parity included, which reads alone do not show.
        self.full_check_clean("recovery")
    }

    /// A full check (where the engine has one) on a whole array must find nothing.
    pub(super) fn full_check_clean(&mut self, after: &str) -> Res {
        if self.cfg.level == Level::Raid0 || self.array().is_degraded() {
            return Ok(());
        }
        let faulty_before = self.faulty_roles();
        match self.hooks.scrub(self.array(), false) {
            None | Some(Ok(0)) => Ok(()),
            Some(Ok(n)) => Err(format!(
                "a full check after {after} found {n} mismatched sectors: {after} left \
                 redundancy inconsistent"
            )),
            Some(Err(e)) if self.faulty_roles() == faulty_before => {
                Err(format!("a full check after {after} failed: {e}"))
            }
            Some(Err(_)) => Ok(()),
        }
    }

    fn faulty_roles(&self) -> Vec<MemberIdx> {
        (0..self.cfg.disks)
            .map(MemberIdx)
            .filter(|&r| self.array().slot_state(r) == SlotState::Faulty)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finding_fails_the_run_by_default() {
        let (cfg, mode) = SimConfig::for_seed(7);
        let opts = SimOptions::default();
        let mut sim = Simulator::new(7, &cfg, mode, &opts, &NoLifecycle)
            .unwrap_or_else(|(_, e)| panic!("{e}"));
        let r = sim.finding("acked-write-lost-in-power-cut", "a lost write".into());
        assert!(r.is_err(), "a deviation from md was only noted");
        let lenient = SimOptions {
            strict: false,
            ..SimOptions::default()
        };
        let mut sim = Simulator::new(7, &cfg, mode, &lenient, &NoLifecycle)
            .unwrap_or_else(|(_, e)| panic!("{e}"));
        sim.finding("events-off-by-one-refused", "noted".into())
            .unwrap();
        assert_eq!(sim.report().findings.len(), 1);
    }
}
