//! Simulated member disks and the virtual world they live in.
//!
//! A [`SimDisk`] keeps its contents in memory and follows a schedule of [`FaultRule`]s that
//! fire at chosen IO numbers and byte ranges: read or write errors (transient or
//! persistent), stalls that advance the virtual clock, disappearance (every IO fails until
//! [`SimDisk::come_back`]), lost and misdirected writes (success reported, bytes dropped or
//! stored elsewhere). Silent corruption and stale images are applied directly by the
//! simulator; writes can be held open ([`SimDisk::hold_writes`]) for a slow write. All
//! disks of one run share a [`SimWorld`]: the clock, a global IO sequence (for power cuts)
//! and the counts of faults that actually fired.
//!
//! A disk keeps a live image (what reads see) and a durable one (what survives a power
//! cut): only a flush advances the durable image. [`SimDisk::crash`] gives the image after
//! a cut: durable, plus each write since the last flush kept, dropped or torn per sector,
//! in random order (writes below [`SimDisk::atomic_below`], superblocks that md writes
//! with FUA, are never torn). The crash tests run with a [`Power`] budget, after which
//! writes and flushes vanish silently (the host died with the power); the simulator's own
//! power cut ([`SimWorld::arm_power_cut`]) fails every IO instead.
//!
//! Nothing here reads real time or depends on thread scheduling: the engine drives the
//! disks synchronously from one thread, so the same workload gives the same IO sequence.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use uraid_engine::Member;

/// Virtual time in nanoseconds: advanced by IO costs and stalls, never by the real clock.
#[derive(Debug, Default)]
pub struct SimClock {
    now_ns: AtomicU64,
}

/// The wall time the simulated world starts at (2024-01-01T00:00:00Z), so that superblock
/// times and read-error decay read plausible, reproducible seconds.
const SIM_EPOCH_SECS: u64 = 1_704_067_200;

/// The engine reads the simulator's virtual time: safe mode, write-back ages, sync
/// throttling and superblock times move with simulated IO, never with the real clock, so a
/// seed replays the same run.
impl uraid_engine::ClockSource for SimClock {
    fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    fn wall_secs(&self) -> u64 {
        SIM_EPOCH_SECS + self.now_ns() / 1_000_000_000
    }

    fn sleep(&self, d: std::time::Duration) {
        self.advance(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    }
}

impl SimClock {
    pub fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed)
    }

    pub fn advance(&self, ns: u64) {
        self.now_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Cost model of one member IO: a fixed latency plus transfer at a fixed bandwidth.
const IO_LATENCY_NS: u64 = 20_000;
const NS_PER_KIB: u64 = 1_000; // ~1 GB/s

/// Every kind of fault the simulator injects, for the counts in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    ReadError,
    WriteError,
    FlushError,
    Stall,
    Disappear,
    ComeBack,
    StaleImage,
    SilentCorruption,
    PowerCut,
    MissingAtAssemble,
    LostWrite,
    LatentReadError,
    /// A write that lands at another offset than asked, and reports success.
    MisdirectedWrite,
    /// A superblock write held open (slow) while the simulator goes on.
    SlowSuperblockWrite,
}

impl FaultKind {
    pub const ALL: [FaultKind; 14] = [
        FaultKind::ReadError,
        FaultKind::WriteError,
        FaultKind::FlushError,
        FaultKind::Stall,
        FaultKind::Disappear,
        FaultKind::ComeBack,
        FaultKind::StaleImage,
        FaultKind::SilentCorruption,
        FaultKind::PowerCut,
        FaultKind::MissingAtAssemble,
        FaultKind::LostWrite,
        FaultKind::LatentReadError,
        FaultKind::MisdirectedWrite,
        FaultKind::SlowSuperblockWrite,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ReadError => "read-error",
            FaultKind::WriteError => "write-error",
            FaultKind::FlushError => "flush-error",
            FaultKind::Stall => "stall",
            FaultKind::Disappear => "disappear",
            FaultKind::ComeBack => "come-back",
            FaultKind::StaleImage => "stale-image",
            FaultKind::SilentCorruption => "silent-corruption",
            FaultKind::PowerCut => "power-cut",
            FaultKind::MissingAtAssemble => "missing-at-assemble",
            FaultKind::LostWrite => "lost-write",
            FaultKind::LatentReadError => "latent-read-error",
            FaultKind::MisdirectedWrite => "misdirected-write",
            FaultKind::SlowSuperblockWrite => "slow-superblock-write",
        }
    }

    fn index(self) -> usize {
        FaultKind::ALL
            .iter()
            .position(|&k| k == self)
            .expect("listed")
    }
}

/// How many faults of each kind fired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts([u64; FaultKind::ALL.len()]);

impl FaultCounts {
    pub fn add(&mut self, kind: FaultKind, n: u64) {
        self.0[kind.index()] += n;
    }

    pub fn get(&self, kind: FaultKind) -> u64 {
        self.0[kind.index()]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub fn merge(&mut self, other: &FaultCounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
}

impl fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for k in FaultKind::ALL {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{} {}", k.name(), self.get(k))?;
        }
        Ok(())
    }
}

/// Shared state of one simulated run: clock, power, global IO sequence, fault counts and
/// a short trace of fault events for failure reports.
#[derive(Debug)]
pub struct SimWorld {
    pub clock: Arc<SimClock>,
    io_seq: AtomicU64,
    powered: AtomicBool,
    /// Power goes out when the global IO sequence reaches this number.
    power_cut_at: AtomicU64,
    counts: Mutex<FaultCounts>,
    trace: Mutex<Vec<String>>,
}

/// Trace lines kept for a failure report (the most recent ones).
const TRACE_KEEP: usize = 400;

impl Default for SimWorld {
    fn default() -> SimWorld {
        SimWorld {
            clock: Arc::new(SimClock::default()),
            io_seq: AtomicU64::new(0),
            powered: AtomicBool::new(true),
            power_cut_at: AtomicU64::new(u64::MAX),
            counts: Mutex::new(FaultCounts::default()),
            trace: Mutex::new(Vec::new()),
        }
    }
}

impl SimWorld {
    /// The engine's clock over this world's virtual time (give it at create and assemble).
    pub fn engine_clock(&self) -> uraid_engine::Clock {
        uraid_engine::Clock::from_source(self.clock.clone())
    }
}

impl SimWorld {
    pub fn new() -> Arc<SimWorld> {
        Arc::new(SimWorld::default())
    }

    /// Member IOs issued so far, over all disks.
    pub fn io_seq(&self) -> u64 {
        self.io_seq.load(Ordering::Relaxed)
    }

    /// Cut the power when the global IO sequence reaches `seq`: that IO and every later
    /// one fails on every disk until [`SimWorld::power_on`].
    pub fn arm_power_cut(&self, seq: u64) {
        self.power_cut_at.store(seq, Ordering::Relaxed);
    }

    /// Cut the power now (between two IOs) if it is still on.
    pub fn cut_power(&self) {
        if self.powered.swap(false, Ordering::Relaxed) {
            self.count(FaultKind::PowerCut);
            self.note("power cut".into());
        }
        self.power_cut_at.store(u64::MAX, Ordering::Relaxed);
    }

    pub fn power_on(&self) {
        self.powered.store(true, Ordering::Relaxed);
        self.power_cut_at.store(u64::MAX, Ordering::Relaxed);
        self.note("power on".into());
    }

    pub fn is_powered(&self) -> bool {
        self.powered.load(Ordering::Relaxed)
    }

    pub fn count(&self, kind: FaultKind) {
        self.counts.lock().unwrap().add(kind, 1);
    }

    pub fn counts(&self) -> FaultCounts {
        self.counts.lock().unwrap().clone()
    }

    /// Record an event with the virtual time and global IO number.
    pub fn note(&self, what: String) {
        let line = format!(
            "t={}us io#{} {what}",
            self.clock.now_ns() / 1000,
            self.io_seq()
        );
        let mut t = self.trace.lock().unwrap();
        if t.len() == TRACE_KEEP {
            t.remove(0);
        }
        t.push(line);
    }

    pub fn trace(&self) -> Vec<String> {
        self.trace.lock().unwrap().clone()
    }

    /// Take the next global IO number; the power goes out here if a cut is armed.
    fn next_io(&self) -> bool {
        let seq = self.io_seq.fetch_add(1, Ordering::Relaxed);
        if seq >= self.power_cut_at.load(Ordering::Relaxed) {
            self.cut_power();
        }
        self.is_powered()
    }
}

/// Kind of one member IO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Flush,
}

/// Which IOs a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpFilter {
    Read,
    Write,
    Any,
}

impl OpFilter {
    fn matches(self, k: IoKind) -> bool {
        matches!(
            (self, k),
            (OpFilter::Any, _) | (OpFilter::Read, IoKind::Read) | (OpFilter::Write, IoKind::Write)
        )
    }
}

/// What a rule does when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// The IO fails with EIO (nothing is transferred).
    Error,
    /// The IO completes after `ns` of extra virtual time.
    Stall { ns: u64 },
    /// The disk vanishes: this and every later IO fails until it comes back.
    Disappear,
    /// The write reports success but nothing is stored: a lying disk. No array can
    /// survive this; it exists to show that the simulator's checks catch wrong data.
    LoseWrite,
    /// A latent sector error: reads of the range fail until a write over it succeeds
    /// (the drive remaps the sector), as md's read-error repair expects.
    LatentRead,
    /// The write reports success but lands `delta_bytes` away from where it was sent (a
    /// misdirected write); the intended place keeps its old bytes. Off the disk, dropped.
    Misdirect { delta_bytes: i64 },
}

impl Effect {
    /// Whether the engine may fail the whole member for it (errors, disappearance), as
    /// opposed to stalls, latent sector errors (repaired from redundancy) and lies.
    pub fn fails_member(self) -> bool {
        matches!(self, Effect::Error | Effect::Disappear)
    }
}

/// One scheduled fault of one disk.
#[derive(Clone, Debug)]
pub struct FaultRule {
    pub effect: Effect,
    pub ops: OpFilter,
    /// The rule is armed from this disk IO number on (reads, writes and flushes count).
    pub from_io: u64,
    /// Only IO overlapping this byte range `[start, end)` fires it; flushes have no range
    /// and fire only range-less rules.
    pub range: Option<(u64, u64)>,
    /// How many more times it fires; None: persistent (a bad spot that stays bad).
    pub times: Option<u32>,
}

impl FaultRule {
    fn hits(&self, io_no: u64, kind: IoKind, offset: u64, len: u64) -> bool {
        if io_no < self.from_io || !self.ops.matches(kind) || self.times == Some(0) {
            return false;
        }
        match (self.range, kind) {
            (None, _) => true,
            (Some(_), IoKind::Flush) => false,
            (Some((s, e)), _) => offset < e && offset + len > s,
        }
    }
}

/// Power for every disk of a crash test: writes and flushes stop once `ops_left` runs out,
/// silently (a write after the cut reports success and is lost, as the host that issued
/// it died with the power). Reads do not spend it.
pub struct Power {
    pub ops_left: AtomicI64,
}

impl Power {
    /// Power for `ops` more writes and flushes.
    pub fn new(ops: i64) -> Arc<Power> {
        Arc::new(Power {
            ops_left: AtomicI64::new(ops),
        })
    }

    /// Spend one IO; false once the power is off.
    pub fn tick(&self) -> bool {
        self.ops_left.fetch_sub(1, Ordering::SeqCst) > 0
    }

    pub fn on(&self) -> bool {
        self.ops_left.load(Ordering::SeqCst) > 0
    }
}

struct DiskState {
    /// The live image: what reads see.
    data: Vec<u8>,
    /// What survives a power cut: the live image as of the last flush.
    durable: Vec<u8>,
    /// Writes since the last flush, in order, where they landed: the durable image plus
    /// these is the live one.
    pending: Vec<(u64, Vec<u8>)>,
    /// IOs seen by this disk (the clock of its fault schedule).
    ios: u64,
    gone: bool,
    rules: Vec<FaultRule>,
}

/// Writes held open at a disk (a slow write the simulator releases when it chooses).
#[derive(Default)]
struct Hold {
    range: Option<(u64, u64)>,
    held: u32,
}

/// A simulated member disk.
pub struct SimDisk {
    name: String,
    world: Arc<SimWorld>,
    /// A crash test's power budget (None: always on, as for the simulator).
    power: Option<Arc<Power>>,
    /// Writes that start below this offset are never torn by [`SimDisk::crash`].
    atomic_below: u64,
    st: Mutex<DiskState>,
    hold: Mutex<Hold>,
    hold_cv: Condvar,
}

impl SimDisk {
    pub fn new(name: impl Into<String>, size_bytes: u64, world: Arc<SimWorld>) -> SimDisk {
        SimDisk::from_image(name, vec![0; size_bytes as usize], world)
    }

    /// A disk holding `image`, live and durable.
    pub fn from_image(name: impl Into<String>, image: Vec<u8>, world: Arc<SimWorld>) -> SimDisk {
        SimDisk {
            name: name.into(),
            world,
            power: None,
            atomic_below: 0,
            st: Mutex::new(DiskState {
                durable: image.clone(),
                data: image,
                pending: Vec::new(),
                ios: 0,
                gone: false,
                rules: Vec::new(),
            }),
            hold: Mutex::new(Hold::default()),
            hold_cv: Condvar::new(),
        }
    }

    /// A crash test's disk: `image` live and durable, writes and flushes spending `power`,
    /// writes below `atomic_below` never torn; its own world (no faults scheduled).
    pub fn crash_disk(name: &str, power: Arc<Power>, image: Vec<u8>, atomic_below: u64) -> SimDisk {
        SimDisk::from_image(name, image, SimWorld::new())
            .with_power(power)
            .atomic_below(atomic_below)
    }

    /// A crash test's members, `prefix0`, `prefix1`, ...: one [`SimDisk::crash_disk`] per
    /// image, all on `power`, writes below 4 KiB never torn.
    pub fn crash_set(prefix: &str, power: &Arc<Power>, images: &[Vec<u8>]) -> Vec<Arc<SimDisk>> {
        images
            .iter()
            .enumerate()
            .map(|(i, img)| {
                Arc::new(SimDisk::crash_disk(
                    &format!("{prefix}{i}"),
                    power.clone(),
                    img.clone(),
                    4096,
                ))
            })
            .collect()
    }

    /// What survives the cut of a [`SimDisk::crash_set`]: each disk's durable image as a
    /// fresh disk of the same name, powered.
    pub fn after_cut(disks: &[Arc<SimDisk>]) -> Vec<Arc<dyn Member>> {
        disks
            .iter()
            .map(|d| {
                Arc::new(SimDisk::from_image(
                    d.name.clone(),
                    d.durable_image(),
                    SimWorld::new(),
                )) as Arc<dyn Member>
            })
            .collect()
    }

    /// Writes and flushes spend `power`; once it is out they are lost silently.
    pub fn with_power(mut self, power: Arc<Power>) -> SimDisk {
        self.power = Some(power);
        self
    }

    /// Writes starting below `bytes` are atomic at a crash (md writes superblocks with FUA).
    pub fn atomic_below(mut self, bytes: u64) -> SimDisk {
        self.atomic_below = bytes;
        self
    }

    /// Writes since the last flush: what a crash now may keep, drop or tear.
    pub fn unflushed_writes(&self) -> usize {
        self.st.lock().unwrap().pending.len()
    }

    /// The durable image: what the disk held at its last flush.
    pub fn durable_image(&self) -> Vec<u8> {
        self.st.lock().unwrap().durable.clone()
    }

    /// The image after a power cut now: the durable one, plus each write since the last
    /// flush kept, dropped or torn (each sector kept or not), in an order drawn from `rng`.
    pub fn crash<R: rand::Rng>(&self, rng: &mut R) -> Vec<u8> {
        use rand::seq::SliceRandom;
        let st = self.st.lock().unwrap();
        let mut img = st.durable.clone();
        let mut pending = st.pending.clone();
        drop(st);
        pending.shuffle(rng);
        for (off, buf) in pending {
            let o = off as usize;
            match rng.gen_range(0..3) {
                0 => {}
                1 => img[o..o + buf.len()].copy_from_slice(&buf),
                _ if off < self.atomic_below => {}
                _ => {
                    for s in (0..buf.len()).step_by(512) {
                        let e = (s + 512).min(buf.len());
                        if rng.gen_bool(0.5) {
                            img[o + s..o + e].copy_from_slice(&buf[s..e]);
                        }
                    }
                }
            }
        }
        img
    }

    /// Spend one write or flush of the crash power; false: lost with the power.
    fn powered(&self) -> bool {
        self.power.as_ref().is_none_or(|p| p.tick())
    }

    /// Hold every write overlapping `range` open (before it is counted or lands) until
    /// [`SimDisk::release_writes`]: a slow write. Only for runs that drive the engine from
    /// more than one thread, one step at a time.
    pub fn hold_writes(&self, range: (u64, u64)) {
        self.hold.lock().unwrap().range = Some(range);
    }

    /// Writes being held right now.
    pub fn held_writes(&self) -> u32 {
        self.hold.lock().unwrap().held
    }

    pub fn release_writes(&self) {
        self.hold.lock().unwrap().range = None;
        self.hold_cv.notify_all();
    }

    fn wait_if_held(&self, offset: u64, len: u64) {
        let mut h = self.hold.lock().unwrap();
        if !h.range.is_some_and(|(s, e)| offset < e && offset + len > s) {
            return;
        }
        h.held += 1;
        self.world.count(FaultKind::SlowSuperblockWrite);
        self.world
            .note(format!("{}: write at {offset}+{len} held open", self.name));
        while h.range.is_some() {
            h = self.hold_cv.wait(h).unwrap();
        }
        h.held -= 1;
    }

    pub fn add_rule(&self, rule: FaultRule) {
        self.world.note(format!("{}: armed {rule:?}", self.name));
        self.st.lock().unwrap().rules.push(rule);
    }

    /// Drop every scheduled rule (the disk was replaced or repaired).
    pub fn clear_rules(&self) {
        self.st.lock().unwrap().rules.clear();
    }

    /// Rules that have not fired their last time yet.
    pub fn pending_rules(&self) -> usize {
        let st = self.st.lock().unwrap();
        st.rules.iter().filter(|r| r.times != Some(0)).count()
    }

    /// Error or disappearance rules that can still fire (stalls are no faults).
    pub fn pending_faults(&self) -> usize {
        let st = self.st.lock().unwrap();
        st.rules
            .iter()
            .filter(|r| r.times != Some(0) && r.effect.fails_member())
            .count()
    }

    /// Whether a latent read error over exactly `range` is still there.
    pub fn latent_pending(&self, range: (u64, u64)) -> bool {
        let st = self.st.lock().unwrap();
        st.rules
            .iter()
            .any(|r| r.effect == Effect::LatentRead && r.range == Some(range) && r.times != Some(0))
    }

    /// Forget every latent read error (over-budget runs pull whole members instead).
    pub fn clear_latent(&self) {
        let mut st = self.st.lock().unwrap();
        st.rules.retain(|r| r.effect != Effect::LatentRead);
    }

    /// Drop the rules with `effect` that have not fired (a one-off the engine's IO did
    /// not meet).
    pub fn disarm(&self, effect: Effect) {
        self.st.lock().unwrap().rules.retain(|r| r.effect != effect);
    }

    /// Whether any error or disappearance rule was ever scheduled on this disk.
    pub fn ever_faulted(&self) -> bool {
        let st = self.st.lock().unwrap();
        st.rules.iter().any(|r| r.effect.fails_member())
    }

    /// IOs this disk has seen.
    pub fn ios(&self) -> u64 {
        self.st.lock().unwrap().ios
    }

    pub fn is_gone(&self) -> bool {
        self.st.lock().unwrap().gone
    }

    /// Pull the disk now.
    pub fn disappear(&self) {
        let mut st = self.st.lock().unwrap();
        if !st.gone {
            st.gone = true;
            self.world.count(FaultKind::Disappear);
            self.world.note(format!("{}: disappears", self.name));
        }
    }

    /// Plug the disk back in, with whatever it held when it went away.
    pub fn come_back(&self) {
        let mut st = self.st.lock().unwrap();
        if st.gone {
            st.gone = false;
            self.world.count(FaultKind::ComeBack);
            self.world.note(format!("{}: comes back", self.name));
        }
    }

    /// Flip bytes in `[offset, offset + len)` without any error: bit rot.
    pub fn corrupt(&self, offset: u64, len: u64, rng: &mut super::SimRng) {
        let mut st = self.st.lock().unwrap();
        let s = offset as usize;
        let e = (offset + len) as usize;
        assert!(
            e <= st.data.len(),
            "corruption beyond the end of {}",
            self.name
        );
        // At least one byte really changes: flip a chosen byte with a non-zero mask, and
        // some others at random.
        let first = s + rng.index(e - s);
        st.data[first] ^= rng.range(1, 256) as u8;
        for _ in 0..rng.range(0, 8) {
            let i = s + rng.index(e - s);
            st.data[i] ^= rng.range(1, 256) as u8;
        }
        // Bit rot is on the medium: durable at once, and in any pending write over it.
        let st = &mut *st;
        st.durable[s..e].copy_from_slice(&st.data[s..e]);
        for (off, buf) in st.pending.iter_mut() {
            let (ws, we) = (*off as usize, *off as usize + buf.len());
            let (a, b) = (ws.max(s), we.min(e));
            if a < b {
                buf[a - ws..b - ws].copy_from_slice(&st.data[a..b]);
            }
        }
        self.world.count(FaultKind::SilentCorruption);
        self.world.note(format!(
            "{}: silent corruption in {offset}+{len}",
            self.name
        ));
    }

    /// A copy of the live image (what reads see).
    pub fn image(&self) -> Vec<u8> {
        self.st.lock().unwrap().data.clone()
    }

    /// Replace the contents with an older image (a disk from the drawer).
    pub fn restore_image(&self, image: &[u8]) {
        let mut st = self.st.lock().unwrap();
        assert_eq!(image.len(), st.data.len(), "image of another size");
        st.data.copy_from_slice(image);
        st.durable.copy_from_slice(image);
        st.pending.clear();
        self.world.count(FaultKind::StaleImage);
        self.world
            .note(format!("{}: replaced by a stale image", self.name));
    }

    /// Direct access for tests and the simulator's checks, bypassing faults.
    pub fn peek(&self, offset: u64, buf: &mut [u8]) {
        let st = self.st.lock().unwrap();
        buf.copy_from_slice(&st.data[offset as usize..offset as usize + buf.len()]);
    }

    /// Account one IO against the clock and the fault schedule; Err if it fails, else
    /// where a write lands (None: dropped silently).
    fn io(
        &self,
        st: &mut DiskState,
        kind: IoKind,
        offset: u64,
        len: u64,
    ) -> io::Result<Option<u64>> {
        let io_no = st.ios;
        st.ios += 1;
        self.world
            .clock
            .advance(IO_LATENCY_NS + len.div_ceil(1024) * NS_PER_KIB);
        if !self.world.next_io() {
            return Err(self.eio(kind, offset, "no power"));
        }
        if st.gone {
            return Err(self.eio(kind, offset, "device is gone"));
        }
        let mut fail = None;
        let mut lose = false;
        let mut land = offset;
        let mut remapped = false;
        for rule in st.rules.iter_mut() {
            if !rule.hits(io_no, kind, offset, len) {
                continue;
            }
            if let Some(t) = rule.times.as_mut() {
                *t -= 1;
            }
            match rule.effect {
                Effect::Stall { ns } => {
                    self.world.clock.advance(ns);
                    self.world.count(FaultKind::Stall);
                    self.world.note(format!(
                        "{}: {kind:?} at {offset}+{len} stalls {}us",
                        self.name,
                        ns / 1000
                    ));
                }
                Effect::Error => {
                    fail.get_or_insert("injected error");
                }
                Effect::Disappear => {
                    st.gone = true;
                    self.world.count(FaultKind::Disappear);
                    fail = Some("device disappeared");
                }
                Effect::LoseWrite => {
                    if kind == IoKind::Write {
                        lose = true;
                    }
                }
                Effect::Misdirect { delta_bytes } => {
                    if kind == IoKind::Write {
                        land = offset.wrapping_add_signed(delta_bytes);
                    }
                }
                Effect::LatentRead => match kind {
                    IoKind::Read => {
                        self.world.count(FaultKind::LatentReadError);
                        fail.get_or_insert("latent sector error");
                    }
                    _ => {
                        // Rewritten: remapped. Cleared below if the write goes through.
                        remapped = true;
                    }
                },
            }
        }
        if remapped && fail.is_none() {
            for rule in st.rules.iter_mut() {
                if rule.effect == Effect::LatentRead && rule.hits(io_no, kind, offset, len) {
                    rule.times = Some(0);
                    self.world.note(format!(
                        "{}: latent error at {offset}+{len} rewritten",
                        self.name
                    ));
                }
            }
        }
        if lose && fail.is_none() {
            self.world.count(FaultKind::LostWrite);
            self.world.note(format!(
                "{}: write at {offset}+{len} silently lost",
                self.name
            ));
        }
        if land != offset && fail.is_none() && !lose {
            self.world.count(FaultKind::MisdirectedWrite);
            self.world.note(format!(
                "{}: write at {offset}+{len} misdirected to {land}",
                self.name
            ));
            if land
                .checked_add(len)
                .is_none_or(|e| e > st.data.len() as u64)
            {
                lose = true;
            }
        }
        match fail {
            None => Ok((!lose).then_some(land)),
            Some(why) => {
                if why == "injected error" {
                    self.world.count(match kind {
                        IoKind::Read => FaultKind::ReadError,
                        IoKind::Write => FaultKind::WriteError,
                        IoKind::Flush => FaultKind::FlushError,
                    });
                }
                Err(self.eio(kind, offset, why))
            }
        }
    }

    fn eio(&self, kind: IoKind, offset: u64, why: &str) -> io::Error {
        self.world
            .note(format!("{}: {kind:?} at {offset} fails: {why}", self.name));
        io::Error::from_raw_os_error(libc::EIO)
    }

    fn check_range(&self, st: &DiskState, offset: u64, len: usize) -> io::Result<usize> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= st.data.len() as u64 => Ok(offset as usize),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: access {offset}+{len} beyond the end", self.name),
            )),
        }
    }
}

impl Member for SimDisk {
    fn size_bytes(&self) -> u64 {
        self.st.lock().unwrap().data.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        let s = self.check_range(&st, offset, buf.len())?;
        self.io(&mut st, IoKind::Read, offset, buf.len() as u64)?;
        buf.copy_from_slice(&st.data[s..s + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.wait_if_held(offset, buf.len() as u64);
        let mut st = self.st.lock().unwrap();
        self.check_range(&st, offset, buf.len())?;
        let landed = self.io(&mut st, IoKind::Write, offset, buf.len() as u64)?;
        if !self.powered() {
            return Ok(()); // lost with the power; the caller cannot tell
        }
        if let Some(at) = landed {
            let a = at as usize;
            st.data[a..a + buf.len()].copy_from_slice(buf);
            st.pending.push((at, buf.to_vec()));
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        self.io(&mut st, IoKind::Flush, 0, 0)?;
        if !self.powered() {
            return Ok(());
        }
        let st = &mut *st;
        for (off, buf) in st.pending.drain(..) {
            let o = off as usize;
            st.durable[o..o + buf.len()].copy_from_slice(&buf);
        }
        Ok(())
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimRng;

    fn disk() -> (Arc<SimWorld>, SimDisk) {
        let w = SimWorld::new();
        let d = SimDisk::new("d0", 64 * 1024, w.clone());
        (w, d)
    }

    #[test]
    fn transient_error_fires_once_at_its_io_then_data_flows() {
        let (w, d) = disk();
        d.write_at(&[7u8; 512], 4096).unwrap();
        d.add_rule(FaultRule {
            effect: Effect::Error,
            ops: OpFilter::Read,
            from_io: 2,
            range: None,
            times: Some(1),
        });
        let mut b = [0u8; 512];
        d.read_at(&mut b, 4096).unwrap(); // io 1
        assert!(d.read_at(&mut b, 4096).is_err()); // io 2
        b.fill(0);
        d.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [7u8; 512]);
        assert_eq!(w.counts().get(FaultKind::ReadError), 1);
    }

    #[test]
    fn persistent_bad_range_fails_only_overlapping_io_and_keeps_old_bytes() {
        let (_w, d) = disk();
        d.add_rule(FaultRule {
            effect: Effect::Error,
            ops: OpFilter::Write,
            from_io: 0,
            range: Some((8192, 8704)),
            times: None,
        });
        for _ in 0..3 {
            assert!(d.write_at(&[1u8; 1024], 7680).is_err());
        }
        d.write_at(&[2u8; 512], 8704).unwrap();
        let mut b = [9u8; 1024];
        d.read_at(&mut b, 7680).unwrap();
        assert_eq!(b, [0u8; 1024], "a failed write must not land");
    }

    #[test]
    fn disappear_fails_everything_until_come_back_with_old_contents() {
        let (w, d) = disk();
        d.write_at(&[3u8; 512], 0).unwrap();
        d.add_rule(FaultRule {
            effect: Effect::Disappear,
            ops: OpFilter::Any,
            from_io: 1,
            range: None,
            times: Some(1),
        });
        assert!(d.write_at(&[4u8; 512], 0).is_err());
        assert!(d.flush().is_err());
        let mut b = [0u8; 512];
        assert!(d.read_at(&mut b, 0).is_err());
        d.come_back();
        d.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [3u8; 512]);
        assert_eq!(w.counts().get(FaultKind::Disappear), 1);
        assert_eq!(w.counts().get(FaultKind::ComeBack), 1);
    }

    #[test]
    fn a_misdirected_write_lands_elsewhere_and_leaves_the_target_old() {
        let (w, d) = disk();
        d.write_at(&[1u8; 512], 4096).unwrap();
        d.add_rule(FaultRule {
            effect: Effect::Misdirect { delta_bytes: 8192 },
            ops: OpFilter::Write,
            from_io: 0,
            range: Some((4096, 4608)),
            times: Some(1),
        });
        d.write_at(&[2u8; 512], 4096).unwrap();
        let mut b = [0u8; 512];
        d.peek(4096, &mut b);
        assert_eq!(b, [1u8; 512], "the intended sector keeps its old bytes");
        d.peek(12288, &mut b);
        assert_eq!(b, [2u8; 512], "the write landed 8 KiB further");
        assert_eq!(w.counts().get(FaultKind::MisdirectedWrite), 1);
    }

    #[test]
    fn stall_advances_virtual_time_only() {
        let (w, d) = disk();
        d.add_rule(FaultRule {
            effect: Effect::Stall { ns: 5_000_000_000 },
            ops: OpFilter::Any,
            from_io: 0,
            range: None,
            times: Some(1),
        });
        let before = w.clock.now_ns();
        d.write_at(&[1u8; 512], 0).unwrap();
        assert!(w.clock.now_ns() - before >= 5_000_000_000);
    }

    #[test]
    fn corruption_changes_bytes_silently_and_power_cut_stops_all_io() {
        let (w, d) = disk();
        let mut rng = SimRng::new(3);
        d.corrupt(1024, 512, &mut rng);
        let mut b = [0u8; 512];
        d.read_at(&mut b, 1024).unwrap();
        assert_ne!(b, [0u8; 512]);
        w.arm_power_cut(w.io_seq() + 1);
        d.read_at(&mut b, 0).unwrap();
        assert!(d.read_at(&mut b, 0).is_err());
        assert!(d.write_at(&b, 0).is_err());
        w.power_on();
        d.read_at(&mut b, 0).unwrap();
        assert_eq!(w.counts().get(FaultKind::PowerCut), 1);
    }

    #[test]
    fn only_flush_advances_the_durable_image_and_a_crash_keeps_drops_or_tears() {
        use rand::SeedableRng;
        let w = SimWorld::new();
        let d = SimDisk::from_image("c0", vec![0u8; 16 * 1024], w).atomic_below(4096);
        d.write_at(&[1u8; 1024], 0).unwrap();
        d.flush().unwrap();
        d.write_at(&[2u8; 1024], 0).unwrap(); // a superblock write: atomic
        d.write_at(&[3u8; 4096], 8192).unwrap();
        assert_eq!(d.unflushed_writes(), 2);
        assert_eq!(&d.durable_image()[..1024], &[1u8; 1024][..]);
        assert_eq!(
            &d.image()[..1024],
            &[2u8; 1024][..],
            "reads see the live image"
        );
        let (mut torn, mut kept, mut dropped) = (0, 0, 0);
        for seed in 0..64 {
            let img = d.crash(&mut rand::rngs::StdRng::seed_from_u64(seed));
            let sb = &img[..1024];
            assert!(
                sb == [1u8; 1024] || sb == [2u8; 1024],
                "seed {seed}: torn superblock"
            );
            let sectors: Vec<u8> = img[8192..12288].chunks(512).map(|c| c[0]).collect();
            for (c, &first) in img[8192..12288].chunks(512).zip(&sectors) {
                assert!(c.iter().all(|&b| b == first), "seed {seed}: a torn sector");
            }
            match (
                sectors.iter().all(|&b| b == 3),
                sectors.iter().all(|&b| b == 0),
            ) {
                (true, _) => kept += 1,
                (_, true) => dropped += 1,
                _ => torn += 1,
            }
        }
        assert!(
            torn > 0 && kept > 0 && dropped > 0,
            "{torn} {kept} {dropped}"
        );
        d.flush().unwrap();
        assert_eq!(d.unflushed_writes(), 0);
        assert_eq!(d.durable_image(), d.image());
    }

    #[test]
    fn after_the_power_budget_writes_and_flushes_vanish_silently() {
        let power = Power::new(2);
        let d = SimDisk::new("p0", 8192, SimWorld::new()).with_power(power.clone());
        d.write_at(&[1u8; 512], 0).unwrap();
        d.flush().unwrap();
        assert!(!power.on());
        d.write_at(&[2u8; 512], 0).unwrap();
        d.flush().unwrap();
        let mut b = [0u8; 512];
        d.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [1u8; 512], "the write after the cut was lost");
        assert_eq!(d.unflushed_writes(), 0);
    }
}
