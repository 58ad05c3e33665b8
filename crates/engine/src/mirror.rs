//! Shared IO for the mirrored levels (raid1, raid10): read one valid copy, write every
//! valid copy. The level modules say where the copies of a piece are and which recovery
//! unit the piece belongs to (see [`crate::slot`]).
//!
//! md's member flags act here. Write-mostly (raid1 only, as md: its raid10 ignores the
//! flag): a read goes to a write-mostly copy only when no other copy is valid for it.
//! Failfast (both levels, as md): a copy flagged failfast that fails a read is failed at
//! once instead of being repaired, if another copy can answer and the array keeps its data
//! without it; otherwise the error takes the ordinary path (answer from another copy and
//! rewrite, or fail when none is left).

use crate::array::ZeroKind;
use crate::array::{no_redundancy, Array};
pub(crate) use crate::array::{SyncCtx, SyncMode};
use crate::barrier::Barriers;
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::member::Member;
use crate::member_io::OpList;
use crate::read_balance;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use uraid_core::{MemberIdx, MemberMap, Sector, SECTOR_BYTES};

/// Number of write-lock buckets that serialise writes to the same region.
const LOCK_BUCKETS: usize = 1024;

/// What raid1 and raid10 keep for themselves (part of md's r1conf/r10conf): the resync
/// barriers, the per-region write locks and the read heads.
pub(crate) struct MirrorConf {
    /// Resync barriers (normal IO against sync, per region bucket).
    pub(crate) barriers: Barriers,
    /// Writes to one region (raid1) or chunk (raid10) serialise here (see ARCHITECTURE.md).
    locks: Vec<Mutex<()>>,
    /// Per-role read state for read balancing.
    heads: MemberMap<read_balance::Head>,
    /// Reads avoid write-mostly members (raid1; md's raid10 does not look at the flag).
    honour_write_mostly: bool,
    /// Threads that sync pieces side by side (uraid's own tunable, as raid4/5/6's; see
    /// `in_order`): one piece's write runs while the next one's read does.
    pub(crate) sync_threads: AtomicUsize,
}

impl MirrorConf {
    pub(crate) fn new(raid_disks: usize, honour_write_mostly: bool) -> MirrorConf {
        MirrorConf {
            barriers: Barriers::default(),
            locks: (0..LOCK_BUCKETS).map(|_| Mutex::new(())).collect(),
            heads: MemberMap::from_fn(raid_disks, |_| Default::default()),
            honour_write_mostly,
            sync_threads: AtomicUsize::new(crate::in_order::default_sync_threads()),
        }
    }

    /// The mirrors' run-time knobs (`Personality::tunables`).
    pub(crate) fn tunables(&self) -> Vec<(&'static str, String)> {
        vec![(
            "sync_threads",
            self.sync_threads.load(Ordering::Relaxed).to_string(),
        )]
    }

    /// Set one of the mirrors' knobs (`Personality::set_tunable`).
    pub(crate) fn set_tunable(&self, a: &Array, name: &str, value: &str) -> Result<(), ArrayError> {
        match name {
            "sync_threads" => {
                let n = crate::in_order::parse_sync_threads(value)?;
                self.sync_threads.store(n, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(ArrayError::Failed(format!(
                "{} has no tunable {name} (known: sync_threads)",
                a.level()
            ))),
        }
    }

    /// Whether reads should go to `role` only when no other copy is valid.
    fn avoid(&self, a: &Array, role: MemberIdx) -> bool {
        self.honour_write_mostly && a.slot(role).member_flags().write_mostly
    }

    fn bucket_of(key: u64) -> usize {
        // Fibonacci hashing spreads neighbouring regions over buckets.
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) as usize % LOCK_BUCKETS
    }

    /// The write lock of region (or chunk) `key`.
    pub(crate) fn lock_bucket(&self, key: u64) -> MutexGuard<'_, ()> {
        self.locks[Self::bucket_of(key)].lock().unwrap()
    }

    /// The write locks of regions `first..=last`, each bucket once, taken in bucket order:
    /// two writers whose spans share buckets take them in the same order, so neither waits
    /// for the other while holding what it needs (one-bucket takers hold one lock only).
    pub(crate) fn lock_buckets(&self, first: u64, last: u64) -> RegionLocks<'_> {
        if first == last {
            return RegionLocks::One(self.lock_bucket(first));
        }
        let mut buckets: Vec<usize> = (first..=last).map(Self::bucket_of).collect();
        buckets.sort_unstable();
        buckets.dedup();
        RegionLocks::Many(
            buckets
                .into_iter()
                .map(|b| self.locks[b].lock().unwrap())
                .collect(),
        )
    }
}

/// Held write locks of one or more regions ([`MirrorConf::lock_buckets`]).
pub(crate) enum RegionLocks<'a> {
    One(#[allow(dead_code)] MutexGuard<'a, ()>),
    Many(#[allow(dead_code)] Vec<MutexGuard<'a, ()>>),
}

/// Copies of one contiguous piece: (role, member sector) for each copy.
pub(crate) type Copies = [(MemberIdx, u64)];

/// Read `buf` (one piece, contiguous on every copy) from a valid copy, trying the others on
/// error; a copy that failed to read gets the good data written back. The first copy tried
/// is the read balancer's choice (see [`crate::read_balance`]).
pub(crate) fn read_piece(
    a: &Array,
    conf: &MirrorConf,
    copies: &Copies,
    unit: u64,
    buf: &mut [u8],
) -> Result<(), ArrayError> {
    let sectors = buf.len() as u64 / SECTOR_BYTES;
    // Choose without building lists or touching the devices' locks: this runs per read.
    // md's read_balance: write-mostly copies only when no other copy is valid.
    let cands = move |write_mostly: bool| {
        copies
            .iter()
            .enumerate()
            .filter(move |(_, (role, _))| {
                a.slot(*role).is_usable(unit) && conf.avoid(a, *role) == write_mostly
            })
            .map(move |(i, &(role, msec))| {
                let (head, pending) = conf.heads[role].snapshot();
                let c = read_balance::Candidate {
                    member_sector: msec,
                    head,
                    pending,
                };
                (i, c)
            })
    };
    let first = read_balance::choose(cands(false))
        .or_else(|| read_balance::choose(cands(true)))
        .unwrap_or(0);
    let n = copies.len();
    let mut bad: Vec<(MemberIdx, u64)> = Vec::new();
    let mut failed_fast = false;
    // On an error the other copies are tried from the balancer's choice on, the
    // write-mostly ones last (pass 1).
    for pass in [false, true] {
        for attempt in 0..n {
            let (role, msec) = copies[(first + attempt) % n];
            if conf.avoid(a, role) != pass {
                continue;
            }
            let Some(dev) = a.usable(role, unit) else {
                continue;
            };
            let mut ops = OpList::new();
            ops.read(a, dev, role, Sector(msec), buf);
            let reading = conf.heads[role].start(msec, sectors);
            let failed = ops.run(a);
            drop(reading);
            if failed.is_empty() {
                if !bad.is_empty() || failed_fast {
                    a.stats.degraded_reads.fetch_add(1, Ordering::Relaxed);
                    for (r, m) in bad {
                        a.repair_read(r, m, buf);
                    }
                }
                return Ok(());
            }
            let other_copy = copies
                .iter()
                .any(|&(r, _)| r != role && a.slot(r).is_usable(unit));
            if other_copy && a.failfast_error(role, &failfast_read_error()) {
                // Failed at once: no repair, the next copy answers.
                failed_fast = true;
                continue;
            }
            bad.push((role, msec));
        }
    }
    // Every copy failed somewhere in the piece; the bad sectors may lie in different places
    // on each copy, so go sector by sector, as md's fix_read_error does, before giving up.
    if bad.len() > 1 && buf.len() > SECTOR_BYTES as usize && read_by_sectors(a, &bad, unit, buf) {
        a.stats.degraded_reads.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    // No copy could be read: the copies that erred are not trustworthy any more.
    for (r, _) in bad {
        a.member_error(
            r,
            &std::io::Error::other("read error with no copy left to repair from"),
        );
    }
    Err(no_redundancy(a, "read"))
}

fn failfast_read_error() -> std::io::Error {
    std::io::Error::other("read error on a failfast member")
}

/// Fill `buf` one sector at a time from whichever copy can read it, writing good sectors
/// back to the copies that could not. False if some sector is unreadable on every copy.
fn read_by_sectors(a: &Array, copies: &[(MemberIdx, u64)], unit: u64, buf: &mut [u8]) -> bool {
    let sec = SECTOR_BYTES as usize;
    let mut tmp = AlignedBuf::scratch(sec);
    for (k, out) in buf.chunks_mut(sec).enumerate() {
        let mut failed: Vec<(MemberIdx, u64)> = Vec::new();
        let mut got = false;
        for &(role, msec) in copies {
            let Some(dev) = a.usable(role, unit) else {
                continue;
            };
            let at = msec + k as u64;
            let mut ops = OpList::new();
            ops.read(a, dev, role, Sector(at), &mut tmp[..out.len()]);
            if ops.run(a).is_empty() {
                out.copy_from_slice(&tmp[..out.len()]);
                got = true;
                break;
            }
            failed.push((role, at));
        }
        if !got {
            return false;
        }
        for (role, at) in failed {
            a.repair_read(role, at, out);
        }
    }
    true
}

/// Write one piece, recovery units `first..=last`, to every valid copy. Succeeds while at
/// least one copy took the data.
///
/// A piece of several units (raid1's, whose unit is the sector) may start below a
/// recovering member's cursor and end above it: the member gets the part below, where it
/// is valid already; the recovery copies the rest later, since the cursor cannot move
/// through the piece while its barrier is held. (raid10's pieces are one chunk, one unit.)
pub(crate) fn write_piece(
    a: &Array,
    copies: &Copies,
    (first, last): (u64, u64),
    buf: &[u8],
) -> Result<(), ArrayError> {
    let mut ops = OpList::new();
    let mut live = 0;
    for &(role, msec) in copies {
        if let Some(dev) = a.usable(role, last) {
            ops.write(a, dev, role, Sector(msec), buf);
            live += 1;
        } else if let Some(dev) = a.usable(role, first).filter(|_| first < last) {
            let below = a.slot(role).recovery_cursor().saturating_sub(first);
            let bytes = ((below * SECTOR_BYTES) as usize).min(buf.len());
            if bytes > 0 {
                ops.write(a, dev, role, Sector(msec), &buf[..bytes]);
                live += 1;
            }
        }
    }
    if live == 0 {
        return Err(no_redundancy(a, "write"));
    }
    let failed = ops.run(a);
    if failed.writes.len() == live {
        return Err(no_redundancy(a, "write"));
    }
    Ok(())
}

/// Discard or zero `sectors` of one piece on every valid copy (the others are rebuilt from
/// them later). A discard goes down only if every copy reads it back as zeros, so that the
/// copies stay equal. Succeeds while at least one copy took it.
pub(crate) fn zero_piece(
    a: &Array,
    copies: &Copies,
    unit: u64,
    sectors: u64,
    kind: ZeroKind,
) -> Result<(), ArrayError> {
    let devs: Vec<(MemberIdx, u64, std::sync::Arc<dyn crate::member::Member>)> = copies
        .iter()
        .filter_map(|&(role, msec)| a.usable(role, unit).map(|d| (role, msec, d)))
        .collect();
    if devs.is_empty() {
        return Err(no_redundancy(a, "write-zeroes"));
    }
    if kind == ZeroKind::Discard && !devs.iter().all(|d| d.2.discard_zeroes()) {
        return Ok(());
    }
    let len = sectors * SECTOR_BYTES;
    let took = devs
        .iter()
        .filter(|(role, msec, dev)| {
            let off = a.member_byte(*role, *msec);
            crate::discard::member_zero(a, *role, dev.as_ref(), off, len, kind, true)
        })
        .count();
    if took == 0 {
        return Err(no_redundancy(a, "write-zeroes"));
    }
    Ok(())
}

/// md counts a mirror's mismatches per resync block (its RESYNC_PAGES, 64 KiB): a piece
/// whose copies differ anywhere in such a block counts the block's sectors.
pub(crate) const MISMATCH_BLOCK_BYTES: usize = 64 << 10;

/// Whether `len` bytes from each copy valid for `unit` are a hole there (and there is one),
/// or the array knows its `len` bytes from array sector `at` were never written (then
/// every copy reads zeros, whatever its member can say).
pub(crate) fn holes_on_valid_copies(
    a: &Array,
    at: u64,
    copies: &Copies,
    unit: u64,
    len: usize,
) -> bool {
    let known = a.never_written(at, len as u64 / SECTOR_BYTES);
    let mut any = false;
    for &(role, msec) in copies {
        let Some(dev) = a.usable(role, unit) else {
            continue;
        };
        any = true;
        if !known
            && !dev
                .is_hole(a.member_byte(role, msec), len as u64)
                .unwrap_or(false)
        {
            return false;
        }
    }
    any
}

/// Whether every copy of a piece valid for `unit` is a hole (SEEK_DATA: nothing allocated;
/// devices that cannot tell say data): then the copies agree (zeros), and the targets'
/// copies are zeroed, not read and rewritten (md cannot tell), and the piece counts as
/// skipped. The caller holds the piece's barriers, so no write lands in it meanwhile.
pub(crate) fn zero_if_holes(
    a: &Array,
    at: u64,
    copies: &Copies,
    unit: u64,
    len: usize,
    targets: &[MemberIdx],
) -> bool {
    if !holes_on_valid_copies(a, at, copies, unit, len) {
        return false;
    }
    a.stats
        .sync_zero_bytes
        .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
    for &(role, msec) in copies.iter().filter(|(r, _)| targets.contains(r)) {
        crate::discard::zero_target(a, role, a.member_byte(role, msec), len as u64);
    }
    true
}

/// Compare (and in repair mode rewrite) the valid copies of a piece; also writes the piece to
/// `targets` (recovering members). Returns the sectors that mismatched, counted as md
/// counts them: every [`MISMATCH_BLOCK_BYTES`] block of the piece (from its start) in which
/// some copy differs.
pub(crate) fn sync_piece(
    a: &Array,
    at: u64,
    copies: &Copies,
    unit: u64,
    len: usize,
    mode: SyncMode,
    targets: &[MemberIdx],
) -> Result<u64, ArrayError> {
    if zero_if_holes(a, at, copies, unit, len, targets) {
        return Ok(0);
    }
    // Each valid copy with its device, looked up once (a second lookup could find the
    // device gone and had to be trusted not to); a copy whose member failed during the hole
    // checks (IO) is left out, as md skips a Faulty rdev.
    let valid: Vec<(MemberIdx, u64, Arc<dyn Member>)> = copies
        .iter()
        .filter_map(|&(r, msec)| a.usable(r, unit).map(|dev| (r, msec, dev)))
        .collect();
    // Recycled buffers: every byte is read into, and a copy whose read failed is not used.
    let mut bufs: Vec<AlignedBuf> = valid.iter().map(|_| AlignedBuf::scratch(len)).collect();
    let mut ops = OpList::new();
    for ((role, msec, dev), b) in valid.iter().zip(bufs.iter_mut()) {
        ops.read(a, dev.clone(), *role, Sector(*msec), b);
    }
    let failed = ops.run(a);
    let good: Vec<usize> = (0..valid.len())
        .filter(|&i| !failed.reads.contains(&valid[i].0))
        .collect();
    let Some(&src) = good.first() else {
        return Err(no_redundancy(a, "sync"));
    };
    // Unreadable copies get the good data back (read-error repair), or are failed at once
    // if failfast (md's sync reads use failfast too and go on with the other copies).
    for (role, msec, _) in valid.iter().filter(|(r, _, _)| failed.reads.contains(r)) {
        if !a.failfast_error(*role, &failfast_read_error()) {
            a.repair_read(*role, *msec, &bufs[src]);
        }
    }
    // `src` is `good[0]`: the others are compared with it (none in a recovery from one copy).
    let differ = good[1..].iter().any(|&i| bufs[i][..] != bufs[src][..]);
    let mismatched: u64 = match differ {
        false => 0,
        true => (0..len)
            .step_by(MISMATCH_BLOCK_BYTES)
            .map(|b| b..(b + MISMATCH_BLOCK_BYTES).min(len))
            .filter(|r| {
                good[1..]
                    .iter()
                    .any(|&i| bufs[i][r.clone()] != bufs[src][r.clone()])
            })
            .map(|r| (r.len() as u64).div_ceil(SECTOR_BYTES))
            .sum(),
    };
    let mut ops = OpList::new();
    if differ && mode == SyncMode::Repair {
        for &i in &good[1..] {
            if bufs[i][..] != bufs[src][..] {
                let (role, msec, ref dev) = valid[i];
                ops.write(a, dev.clone(), role, Sector(msec), &bufs[src]);
            }
        }
    }
    for &(role, msec) in copies.iter().filter(|(r, _)| targets.contains(r)) {
        if let Some(dev) = a.slot(role).device() {
            ops.write(a, dev, role, Sector(msec), &bufs[src]);
        }
    }
    ops.run(a);
    Ok(mismatched)
}

/// Sectors per resync step.
pub(crate) const RESYNC_STEP_SECTORS: u64 = 2048;

pub(crate) fn bytes(sectors: u64) -> usize {
    (sectors * SECTOR_BYTES) as usize
}
