//! Engine test fixtures: array configurations of every level and layout on memory
//! members, a byte model's random writes, and arrays with a write journal.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uraid_core::geometry::raid5::*;
use uraid_core::Level;
use uraid_engine::{
    assemble, Array, AssembleOptions, CreateOptions, DaemonOptions, Daemons, MemMember, Member,
    SyncLimits,
};

/// One array to create: level, layout, members and chunk.
#[derive(Clone, Debug)]
pub struct Config {
    /// The RAID level.
    pub level: Level,
    /// md's layout number; `None` for the level's default.
    pub layout: Option<u32>,
    /// How many members (raid devices).
    pub disks: usize,
    /// The chunk in sectors; 0 for the mirrors, which have none.
    pub chunk_sectors: u64,
    /// Member sizes in bytes (equal, except for multi-zone raid0).
    pub member_bytes: Vec<u64>,
}

impl Config {
    /// `disks` members of 2 MiB and a 16-sector (8 KiB) chunk: the small array most tests use.
    pub fn new(level: Level, layout: Option<u32>, disks: usize) -> Config {
        Config {
            level,
            layout,
            disks,
            chunk_sectors: 16,
            member_bytes: vec![2 << 20; disks],
        }
    }
}

/// Every level and layout, with small members so that tests stay fast.
pub fn all_configs() -> Vec<Config> {
    let mut v = Vec::new();
    let mb = 1u64 << 20;
    let eq = |n: usize, size: u64| vec![size; n];
    for disks in [2, 3, 4] {
        v.push(Config {
            level: Level::Raid0,
            layout: None,
            disks,
            chunk_sectors: 8,
            member_bytes: eq(disks, 2 * mb),
        });
    }
    for lay in [1, 2] {
        v.push(Config {
            level: Level::Raid0,
            layout: Some(lay),
            disks: 3,
            chunk_sectors: 16,
            member_bytes: vec![2 * mb, 2 * mb + 256 * 1024, 3 * mb],
        });
    }
    for disks in [1, 2, 3] {
        v.push(Config {
            level: Level::Raid1,
            layout: None,
            disks,
            chunk_sectors: 0,
            member_bytes: eq(disks, 2 * mb),
        });
    }
    for (layout, disks) in [
        (0x102, 2),
        (0x102, 3),
        (0x102, 4),
        (0x102, 5),
        (0x103, 3),
        (0x103, 4),
        (0x201, 2),
        (0x201, 3),
        (0x201, 4),
        (0x201, 5),
        (0x301, 3),
        (0x10201, 2),
        (0x10201, 3),
        (0x10201, 4),
        (0x10301, 4),
        (0x202, 4),
    ] {
        v.push(Config {
            level: Level::Raid10,
            layout: Some(layout),
            disks,
            chunk_sectors: 8,
            member_bytes: eq(disks, 2 * mb),
        });
    }
    for disks in [3, 4] {
        v.push(Config {
            level: Level::Raid4,
            layout: None,
            disks,
            chunk_sectors: 8,
            member_bytes: eq(disks, 2 * mb),
        });
    }
    for &layout in RAID5_LAYOUTS {
        for disks in [2, 3, 5] {
            v.push(Config {
                level: Level::Raid5,
                layout: Some(layout),
                disks,
                chunk_sectors: 8,
                member_bytes: eq(disks, 2 * mb),
            });
        }
    }
    for &layout in RAID6_LAYOUTS {
        for disks in [4, 6] {
            v.push(Config {
                level: Level::Raid6,
                layout: Some(layout),
                disks,
                chunk_sectors: 8,
                member_bytes: eq(disks, 2 * mb),
            });
        }
    }
    // Larger chunks on the parity levels.
    v.push(Config {
        level: Level::Raid5,
        layout: None,
        disks: 4,
        chunk_sectors: 128,
        member_bytes: eq(4, 3 * mb),
    });
    v.push(Config {
        level: Level::Raid6,
        layout: None,
        disks: 5,
        chunk_sectors: 64,
        member_bytes: eq(5, 3 * mb),
    });
    v
}

/// Whether `URAID_FULL` is set (`scripts/test.sh --full`): tests that sample a matrix in
/// quick mode (CI) run all of it.
pub fn full_mode() -> bool {
    std::env::var_os("URAID_FULL").is_some_and(|v| v != "0")
}

/// [`all_configs`] under `URAID_FULL=1`; in quick mode (CI) a sample of it that still has
/// every level and every kind of layout: raid0 striped and multi-zone, raid1, raid10 near
/// (odd disks), far, offset and near+far, raid4, raid5 with 2, 3 and 5 disks and a second
/// layout, raid6 with 4 and 6 disks and a second layout, and both larger-chunk arrays.
/// For tests whose code path does not branch on the layout (the layout's mapping is
/// checked on every config by `levels_model`).
pub fn sampled_configs() -> Vec<Config> {
    let all = all_configs();
    if full_mode() {
        return all;
    }
    let (r5a, r5b) = (RAID5_LAYOUTS[0], RAID5_LAYOUTS[RAID5_LAYOUTS.len() - 1]);
    let (r6a, r6b) = (RAID6_LAYOUTS[0], RAID6_LAYOUTS[RAID6_LAYOUTS.len() - 1]);
    all.into_iter()
        .filter(|c| match (c.level, c.layout, c.disks) {
            (Level::Raid0, None, 3) | (Level::Raid0, Some(2), _) => true,
            (Level::Raid1, _, 3) => true,
            (Level::Raid10, Some(0x102), 3) | (Level::Raid10, Some(0x202), _) => true,
            (Level::Raid10, Some(0x201), 3) | (Level::Raid10, Some(0x10201), 3) => true,
            (Level::Raid4, _, 3) => true,
            (Level::Raid5, None, _) | (Level::Raid6, None, _) => true,
            (Level::Raid5, Some(l), _) if l == r5a => true,
            (Level::Raid5, Some(l), 3) if l == r5b => true,
            (Level::Raid6, Some(l), _) if l == r6a => true,
            (Level::Raid6, Some(l), 6) if l == r6b => true,
            _ => false,
        })
        .collect()
}

/// Zeroed memory members of the config's sizes, named `{tag}-mem{i}`.
pub fn mem_members(cfg: &Config, tag: &str) -> Vec<Arc<MemMember>> {
    cfg.member_bytes
        .iter()
        .enumerate()
        .map(|(i, &b)| Arc::new(MemMember::new(format!("{tag}-mem{i}"), b)))
        .collect()
}

/// Create options for the config: clean from the start (memory members are zeroed, so
/// consistent) and data at sector 64.
pub fn create_opts(cfg: &Config) -> CreateOptions {
    let mut o = CreateOptions::new(cfg.level);
    o.layout = cfg.layout;
    if cfg.chunk_sectors > 0 {
        o.chunk_sectors = Some(cfg.chunk_sectors);
    }
    o.assume_clean = true; // memory members start zeroed: consistent
    o.data_offset_sectors = Some(64);
    o
}

/// The members as `create`/`assemble` take them, every role filled.
pub fn as_members<M: Member + 'static>(m: &[Arc<M>]) -> Vec<Option<Arc<dyn Member>>> {
    m.iter()
        .map(|m| Some(m.clone() as Arc<dyn Member>))
        .collect()
}

/// A random write: (offset, data). Mostly sector aligned, sometimes not.
pub fn random_write(rng: &mut StdRng, size: u64, max_len: u64) -> (u64, Vec<u8>) {
    let aligned = rng.gen_bool(0.85);
    let len = if aligned {
        rng.gen_range(1..=max_len / 512).max(1) * 512
    } else {
        rng.gen_range(1..=max_len)
    }
    .min(size);
    let mut off = rng.gen_range(0..=size - len);
    if aligned {
        off = off / 512 * 512;
    }
    let mut data = vec![0u8; len as usize];
    rng.fill(&mut data[..]);
    (off, data)
}

/// A seeded random generator, so that a failure reproduces from its seed.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// An array created over [`Config::new`]`(level, None, disks)` memory members (named
/// `{tag}-mem{i}`) with a write journal on a memory member of `journal_bytes`: the members,
/// the journal and the running array.
pub fn journaled_array(
    level: Level,
    disks: usize,
    journal_bytes: u64,
    tag: &str,
) -> (Vec<Arc<MemMember>>, Arc<MemMember>, Array) {
    let c = Config::new(level, None, disks);
    let mems = mem_members(&c, tag);
    let journal = Arc::new(MemMember::new("journal", journal_bytes));
    let mut o = create_opts(&c);
    o.journal = Some(journal.clone());
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    (mems, journal, a)
}

/// The members then the journal, as `assemble` takes a journaled array's devices.
pub fn with_journal(m: &[Arc<MemMember>], j: &Arc<MemMember>) -> Vec<Arc<dyn Member>> {
    let mut v: Vec<Arc<dyn Member>> = m.iter().map(|x| x.clone() as Arc<dyn Member>).collect();
    v.push(j.clone());
    v
}

/// Assembles `members`, which must be refused with an error that says `needle` (a journal
/// missing or faulty); then assembles them again with `--force` and gives that array.
pub fn assemble_needs_force(members: Vec<Arc<dyn Member>>, needle: &str) -> Array {
    let e = assemble(members.clone(), &AssembleOptions::default())
        .err()
        .expect("refused");
    assert!(e.to_string().contains(needle), "{e}");
    let (a, _) = assemble(
        members,
        &AssembleOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    a
}

/// Writers for an array being reshaped or rebuilt under IO: 4 threads, each on its own
/// 64 KiB blocks (one in four), writing seeded pieces of 1 to 32 sectors and reading each
/// back at once (a difference panics with its byte), until `until` says stop; `model` keeps
/// what the array must hold. Returns the writes done.
pub fn model_writers(
    a: &Arc<Array>,
    model: &Arc<Mutex<Vec<u8>>>,
    seed: u64,
    until: &(dyn Fn() -> bool + Sync),
) -> u64 {
    const BLOCK: u64 = 64 * 1024;
    const WRITERS: u64 = 4;
    let blocks = model.lock().unwrap().len() as u64 / BLOCK;
    let writes = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..WRITERS {
            let (a, model, writes) = (a.clone(), model.clone(), &writes);
            s.spawn(move || {
                let mut r = rng(seed * 100 + t);
                while !until() {
                    let b = (r.gen_range(0..blocks / WRITERS) * WRITERS + t).min(blocks - 1);
                    if b % WRITERS != t {
                        continue;
                    }
                    let sectors = r.gen_range(1..=32u64);
                    let first = r.gen_range(0..=(BLOCK / 512 - sectors));
                    let off = b * BLOCK + first * 512;
                    let mut buf = vec![0u8; (sectors * 512) as usize];
                    r.fill(&mut buf[..]);
                    a.write(off, &buf).unwrap();
                    model.lock().unwrap()[off as usize..off as usize + buf.len()]
                        .copy_from_slice(&buf);
                    let mut back = vec![0u8; buf.len()];
                    a.read(off, &mut back).unwrap();
                    if let Some(i) = back.iter().zip(&buf).position(|(x, y)| x != y) {
                        panic!("read back at byte {off}: first difference at byte {i}");
                    }
                    writes.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    writes.into_inner()
}

/// The array's first `len` bytes (panics on a read error).
pub fn read_all(a: &Array, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    a.read(0, &mut v)
        .unwrap_or_else(|e| panic!("read of {len} bytes: {e}"));
    v
}

/// Panics, naming `what`, the first differing byte and its sector, unless `got` is `want`.
pub fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i} (sector {})", i / 512);
    }
}

/// A served array's writes while a reshape runs and the power may go: seeded pieces of 1 to
/// 24 sectors anywhere in `model`, each flushed, for as long as `power_on()` and the array
/// reshapes. `model` takes a write only when it and its flush returned with the power still
/// on. Returns the write the cut fell in, whose bytes may be old or new, if there is one.
pub fn writes_until_cut(
    a: &Array,
    model: &mut [u8],
    r: &mut StdRng,
    power_on: &dyn Fn() -> bool,
) -> Option<(usize, usize)> {
    while power_on() && a.is_reshaping() {
        let sectors = r.gen_range(1..=24u64);
        let off = r.gen_range(0..model.len() as u64 / 512 - sectors) * 512;
        let mut buf = vec![0u8; (sectors * 512) as usize];
        r.fill(&mut buf[..]);
        let (s, e) = (off as usize, off as usize + buf.len());
        if a.write(off, &buf).and_then(|_| a.flush()).is_ok() && power_on() {
            model[s..e].copy_from_slice(&buf);
        } else {
            return Some((s, e));
        }
    }
    None
}

/// [`same`] for the array's first `model.len()` bytes, except the range a cut left unsure
/// (see [`writes_until_cut`]), which may hold either.
pub fn same_but_unsure(a: &Array, model: &[u8], unsure: Option<(usize, usize)>, what: &str) {
    let mut got = read_all(a, model.len());
    if let Some((s, e)) = unsure {
        got[s..e].copy_from_slice(&model[s..e]);
    }
    same(&got, model, what);
}

/// Starts the daemons of an array assembled in the middle of a reshape (which it asserts,
/// and that it is writable), the reshape at `max_kib_s` (0: no limit).
pub fn serve_reshape(a: &Arc<Array>, max_kib_s: u64) -> Daemons {
    assert!(
        a.is_reshaping() && !a.is_read_only(),
        "not a writable array mid-reshape: {:?}",
        a.read_only_reason()
    );
    a.start_daemons(DaemonOptions {
        sync_limits: SyncLimits {
            min_kib_s: 0,
            max_kib_s,
        },
        ..Default::default()
    })
    .unwrap()
}

/// Waits up to `limit` for the array's reshape to end: false if it has not.
pub fn wait_reshaped(a: &Array, limit: Duration) -> bool {
    let t = Instant::now();
    while a.is_reshaping() {
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A member wrapper for recovery tests and benches: counts the bytes read from and written
/// to it (what a recovery moves); can hide where it was never written (as a disk does),
/// give "hole" answers that a write made stale, and slow its writes.
pub struct Counting {
    /// The wrapped member.
    pub inner: Arc<dyn Member>,
    /// Bytes read through `read_at`.
    pub read: AtomicU64,
    /// Bytes written through `write_at`.
    pub written: AtomicU64,
    /// Answers of "hole" still to give for ranges over 1 MiB whatever they hold: an answer
    /// that a write made stale right after it was given.
    pub stale_holes: AtomicU64,
    /// Says nothing about holes (`is_hole` false, `tells_holes` false), as a disk.
    pub hide_holes: bool,
    /// Each write takes a millisecond more (a write long in flight).
    pub slow: std::sync::atomic::AtomicBool,
}

impl Counting {
    /// Counts `inner`'s IO; its holes show through.
    pub fn new(inner: Arc<dyn Member>) -> Arc<Counting> {
        Arc::new(Counting::plain(inner, false))
    }

    /// Counts `inner`'s IO and hides its holes.
    pub fn hiding_holes(inner: Arc<dyn Member>) -> Arc<Counting> {
        Arc::new(Counting::plain(inner, true))
    }

    fn plain(inner: Arc<dyn Member>, hide_holes: bool) -> Counting {
        Counting {
            inner,
            read: 0.into(),
            written: 0.into(),
            stale_holes: 0.into(),
            hide_holes,
            slow: false.into(),
        }
    }

    /// Zeroes the counts.
    pub fn reset(&self) {
        self.read.store(0, Ordering::SeqCst);
        self.written.store(0, Ordering::SeqCst);
    }
}

impl Member for Counting {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.read.fetch_add(buf.len() as u64, Ordering::SeqCst);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.written.fetch_add(buf.len() as u64, Ordering::SeqCst);
        if self.slow.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn discard_zeroes(&self) -> bool {
        self.inner.discard_zeroes()
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        how: uraid_engine::ZeroHow,
    ) -> std::io::Result<()> {
        self.inner.write_zeroes(offset, len, how)
    }
    fn zeroes_fast(&self, unmap: bool) -> bool {
        self.inner.zeroes_fast(unmap)
    }
    fn tells_holes(&self) -> bool {
        !self.hide_holes && self.inner.tells_holes()
    }
    fn is_hole(&self, offset: u64, len: u64) -> std::io::Result<bool> {
        if self.hide_holes {
            return Ok(false);
        }
        let stale = len > crate::tmp::MIB
            && self
                .stale_holes
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if stale {
            return Ok(true);
        }
        self.inner.is_hole(offset, len)
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

/// Fails and removes member 1, puts `new` in its role and runs the recovery; returns the
/// bytes the recovery passed over as zeros everywhere (its progress's `zero_bytes`).
pub fn recover_role_1(a: &Array, new: Arc<dyn Member>) -> u64 {
    a.fail_member(uraid_core::MemberIdx(1)).unwrap();
    a.remove_member(uraid_core::MemberIdx(1)).unwrap();
    a.add_member(new).unwrap();
    let mut zero_bytes = 0;
    a.run_sync(uraid_engine::SyncKind::Recovery, |p| {
        zero_bytes = p.zero_bytes
    })
    .unwrap();
    assert_eq!(
        a.slot_state(uraid_core::MemberIdx(1)),
        uraid_engine::SlotState::InSync
    );
    zero_bytes
}

/// After a recovery onto role 1: the array reads `model`, its copies or parity agree, and
/// with member 0 failed the rebuilt member still gives `model`.
pub fn recovered_holds(a: &Array, model: &[u8], what: &str) {
    same(
        &read_all(a, model.len()),
        model,
        &format!("{what}: after recovery"),
    );
    assert_eq!(a.check().unwrap(), 0, "{what}: check after recovery");
    a.fail_member(uraid_core::MemberIdx(0)).unwrap();
    same(
        &read_all(a, model.len()),
        model,
        &format!("{what}: the rebuilt member carrying data"),
    );
}
