//! An assembled array: the members by role, the layout, and the superblock state.
//!
//! IO entry points ([`Array::read`], [`Array::write`], ...) split requests at the layout's
//! boundaries and hand them to the level's module (`raid0`, `raid1`, `raid10`, `raid5`).
//! A member IO error is an event: the member is marked faulty, the superblocks of the others
//! record it, and the request is retried degraded; the caller sees EIO only when no
//! redundancy is left for the range.

use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::io::{execute, Op};
use crate::member::Member;
use crate::meta::Meta;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use uraid_core::geometry::{ArrayGeometry, Personality};
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};

/// Number of lock buckets that serialise writes to the same stripe (parity levels) or
/// region (mirrors).
const LOCK_BUCKETS: usize = 1024;
/// Mirror write-lock region size in sectors (64 KiB).
const MIRROR_REGION_SECTORS: u64 = 128;

/// One role of the array.
pub struct Slot {
    /// The device filling this role, if any.
    pub dev: Option<Arc<dyn Member>>,
    /// Byte offset of the data area on the device (md's data_offset).
    pub data_offset_bytes: u64,
    failed: AtomicBool,
}

impl Slot {
    pub fn new(dev: Option<Arc<dyn Member>>, data_offset_bytes: u64) -> Slot {
        Slot {
            dev,
            data_offset_bytes,
            failed: AtomicBool::new(false),
        }
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// Counters, for `detail` and tests.
#[derive(Default)]
pub struct Stats {
    pub member_reads: AtomicU64,
    pub member_writes: AtomicU64,
    pub degraded_reads: AtomicU64,
}

pub struct Array {
    pub(crate) geometry: ArrayGeometry,
    pub(crate) personality: Personality,
    pub(crate) slots: Vec<Slot>,
    pub(crate) meta: Mutex<Meta>,
    dirty: AtomicBool,
    locks: Vec<Mutex<()>>,
    unaligned: Mutex<()>,
    array_bytes: u64,
    pub stats: Stats,
}

/// State of a role, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Active,
    Faulty,
    Missing,
}

impl Array {
    /// Put an array together from its geometry, its role slots and its superblock state.
    pub(crate) fn new(
        geometry: ArrayGeometry,
        slots: Vec<Slot>,
        meta: Meta,
    ) -> Result<Array, ArrayError> {
        let personality = Personality::new(&geometry)?;
        assert_eq!(slots.len(), geometry.raid_disks, "one slot per role");
        let array_bytes = personality.array_sectors() * SECTOR_BYTES;
        let a = Array {
            geometry,
            personality,
            slots,
            meta: Mutex::new(meta),
            dirty: AtomicBool::new(false),
            locks: (0..LOCK_BUCKETS).map(|_| Mutex::new(())).collect(),
            unaligned: Mutex::new(()),
            array_bytes,
            stats: Stats::default(),
        };
        let missing = a.missing_roles();
        if !a.personality.survives(&missing) {
            return Err(ArrayError::Assemble(format!(
                "{} with {} of {} members present cannot run: members {} are missing and {} tolerates {}",
                a.geometry.level,
                a.geometry.raid_disks - missing.len(),
                a.geometry.raid_disks,
                missing.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", "),
                a.geometry.level,
                a.personality.max_degraded()
            )));
        }
        Ok(a)
    }

    pub fn level(&self) -> Level {
        self.geometry.level
    }

    pub fn geometry(&self) -> &ArrayGeometry {
        &self.geometry
    }

    pub fn personality(&self) -> &Personality {
        &self.personality
    }

    pub fn size_bytes(&self) -> u64 {
        self.array_bytes
    }

    pub fn raid_disks(&self) -> usize {
        self.slots.len()
    }

    pub fn slot(&self, role: MemberIdx) -> &Slot {
        &self.slots[role.0]
    }

    pub fn slot_state(&self, role: MemberIdx) -> SlotState {
        let s = &self.slots[role.0];
        match (&s.dev, s.is_failed()) {
            (None, _) => SlotState::Missing,
            (Some(_), true) => SlotState::Faulty,
            (Some(_), false) => SlotState::Active,
        }
    }

    /// The device of a role if it is present and not failed.
    pub(crate) fn live(&self, role: MemberIdx) -> Option<&dyn Member> {
        let s = &self.slots[role.0];
        match &s.dev {
            Some(d) if !s.is_failed() => Some(d.as_ref()),
            _ => None,
        }
    }

    /// Roles without a working device.
    pub fn missing_roles(&self) -> Vec<MemberIdx> {
        (0..self.slots.len())
            .map(MemberIdx)
            .filter(|&r| self.live(r).is_none())
            .collect()
    }

    pub fn is_degraded(&self) -> bool {
        !self.missing_roles().is_empty()
    }

    /// Whether the array still holds all its data.
    pub fn is_running(&self) -> bool {
        self.personality.survives(&self.missing_roles())
    }

    pub fn meta(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().unwrap()
    }

    pub(crate) fn lock_bucket(&self, key: u64) -> MutexGuard<'_, ()> {
        // Fibonacci hashing spreads neighbouring stripes over buckets.
        let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54;
        self.locks[h as usize % LOCK_BUCKETS].lock().unwrap()
    }

    pub(crate) fn lock_mirror_region(&self, sector: u64) -> MutexGuard<'_, ()> {
        self.lock_bucket(sector / MIRROR_REGION_SECTORS)
    }

    /// Byte offset on a member of a member sector (relative to the data area).
    pub(crate) fn member_byte(&self, role: MemberIdx, member_sector: u64) -> u64 {
        self.slots[role.0].data_offset_bytes + member_sector * SECTOR_BYTES
    }

    /// Run member IOs; failures are reported per role.
    pub(crate) fn run_ops(&self, ops: &mut [Op<'_>], roles: &[MemberIdx]) -> Vec<MemberIdx> {
        debug_assert_eq!(ops.len(), roles.len());
        let results = execute(ops);
        let mut failed = Vec::new();
        for ((op, r), role) in ops.iter().zip(results).zip(roles) {
            match &op.buf {
                crate::io::OpBuf::Read(_) => {
                    self.stats.member_reads.fetch_add(1, Ordering::Relaxed)
                }
                crate::io::OpBuf::Write(_) => {
                    self.stats.member_writes.fetch_add(1, Ordering::Relaxed)
                }
            };
            if let Err(e) = r {
                self.member_error(*role, &e);
                if !failed.contains(role) {
                    failed.push(*role);
                }
            }
        }
        failed
    }

    /// A member IO failed: mark it faulty and record that in the other members' superblocks
    /// before any request that saw the failure completes.
    pub(crate) fn member_error(&self, role: MemberIdx, err: &io::Error) {
        let slot = &self.slots[role.0];
        if slot.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        let name = slot.dev.as_ref().map(|d| d.name()).unwrap_or_default();
        tracing::warn!("member {role} ({name}) failed: {err}; marking it faulty");
        let mut meta = self.meta();
        meta.mark_faulty(role);
        if let Err(e) = meta.write_all(self) {
            tracing::error!("could not record the failure of member {role}: {e}");
        }
    }

    /// Mark a member faulty on request (`uraid fail`).
    pub fn fail_member(&self, role: MemberIdx) -> Result<(), ArrayError> {
        if self.live(role).is_none() {
            return Err(ArrayError::Failed(format!("member {role} is not active")));
        }
        let mut missing = self.missing_roles();
        missing.push(role);
        if !self.personality.survives(&missing) {
            return Err(ArrayError::Failed(format!(
                "failing member {role} would leave {} without its data",
                self.geometry.level
            )));
        }
        self.member_error(role, &io::Error::other("failed by request"));
        Ok(())
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.array_bytes => Ok(()),
            _ => Err(ArrayError::OutOfRange {
                offset,
                len,
                size: self.array_bytes,
            }),
        }
    }

    fn ensure_dirty(&self) -> Result<(), ArrayError> {
        if self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut meta = self.meta();
        if !self.dirty.load(Ordering::Acquire) {
            // md marks the array active before the first write reaches a member, so an
            // unclean stop is always detected.
            meta.set_dirty(true);
            meta.write_all(self)?;
            self.dirty.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if !offset.is_multiple_of(SECTOR_BYTES) || !(buf.len() as u64).is_multiple_of(SECTOR_BYTES)
        {
            let (start, mut tmp) = self.covering(offset, buf.len());
            self.read_sectors(start / SECTOR_BYTES, &mut tmp)?;
            let skip = (offset - start) as usize;
            buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
            return Ok(());
        }
        self.read_sectors(offset / SECTOR_BYTES, buf)
    }

    /// Write `buf` at `offset`.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), ArrayError> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.ensure_dirty()?;
        if !offset.is_multiple_of(SECTOR_BYTES) || !(buf.len() as u64).is_multiple_of(SECTOR_BYTES)
        {
            // Sub-sector writes are read-modify-write of whole sectors; rare, so one lock.
            let _g = self.unaligned.lock().unwrap();
            let (start, mut tmp) = self.covering(offset, buf.len());
            self.read_sectors(start / SECTOR_BYTES, &mut tmp)?;
            let skip = (offset - start) as usize;
            tmp[skip..skip + buf.len()].copy_from_slice(buf);
            return self.write_sectors(start / SECTOR_BYTES, &tmp);
        }
        self.write_sectors(offset / SECTOR_BYTES, buf)
    }

    fn covering(&self, offset: u64, len: usize) -> (u64, AlignedBuf) {
        let start = offset / SECTOR_BYTES * SECTOR_BYTES;
        let end = (offset + len as u64).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
        (start, AlignedBuf::new((end - start) as usize))
    }

    fn read_sectors(&self, sector: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
        match &self.personality {
            Personality::Raid0(g) => crate::raid0::read(self, g, sector, buf),
            Personality::Raid1(_) => crate::raid1::read(self, sector, buf),
            Personality::Raid10(g) => crate::raid10::read(self, g, sector, buf),
            Personality::Parity(g) => crate::raid5::read(self, g, sector, buf),
        }
    }

    fn write_sectors(&self, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
        match &self.personality {
            Personality::Raid0(g) => crate::raid0::write(self, g, sector, buf),
            Personality::Raid1(_) => crate::raid1::write(self, sector, buf),
            Personality::Raid10(g) => crate::raid10::write(self, g, sector, buf),
            Personality::Parity(g) => crate::raid5::write(self, g, sector, buf),
        }
    }

    /// Write zeros over a range (NBD WRITE_ZEROES); the range then reads as zeros.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.check_range(offset, len)?;
        const STEP: u64 = 1 << 20;
        let zeros = AlignedBuf::new(STEP as usize);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(STEP);
            self.write(offset + done, &zeros[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    /// Discard is advisory: the range may keep its data. We pass it down only where every
    /// copy and parity stays consistent, which md's personalities also ensure.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.check_range(offset, len)?;
        Ok(())
    }

    /// Make every completed write durable on every live member.
    pub fn flush(&self) -> Result<(), ArrayError> {
        let mut first_err = None;
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(d) = self.live(MemberIdx(i)) {
                if let Err(e) = d.flush() {
                    self.member_error(MemberIdx(i), &e);
                    first_err.get_or_insert(e);
                }
            }
            let _ = s;
        }
        if !self.is_running() {
            return Err(ArrayError::Failed(format!(
                "flush failed: {}",
                first_err.map(|e| e.to_string()).unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// Flush and mark the array clean (md's clean shutdown): every superblock gets
    /// resync_offset = MaxSector unless a resync is still owed.
    pub fn stop(&self) -> Result<(), ArrayError> {
        self.flush()?;
        let mut meta = self.meta();
        if self.dirty.load(Ordering::Acquire) || meta.is_dirty() {
            meta.set_dirty(false);
            meta.write_all(self)?;
            self.dirty.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Whether a write has marked the array dirty since it was assembled or last stopped.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    /// Recompute redundancy (parity, or copies from the first live mirror) over the whole
    /// array: md's resync after an unclean shutdown. Returns the number of stripes or
    /// regions found inconsistent.
    pub fn resync(&self) -> Result<u64, ArrayError> {
        if self.is_degraded() {
            return Err(ArrayError::Failed(
                "cannot resync a degraded array: there is no redundancy to restore".into(),
            ));
        }
        let mismatches = match &self.personality {
            Personality::Raid0(_) => 0,
            Personality::Raid1(_) => crate::raid1::resync(self)?,
            Personality::Raid10(g) => crate::raid10::resync(self, g)?,
            Personality::Parity(g) => crate::raid5::resync(self, g)?,
        };
        self.meta().set_resync_done();
        Ok(mismatches)
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if self.dirty.load(Ordering::Acquire) {
            if let Err(e) = self.stop() {
                tracing::error!("could not stop the array cleanly: {e}");
            }
        }
    }
}

/// Helper for level modules: one op per (role, member sector, buffer).
pub(crate) struct OpList<'a> {
    pub ops: Vec<Op<'a>>,
    pub roles: Vec<MemberIdx>,
}

impl<'a> OpList<'a> {
    pub fn new() -> OpList<'a> {
        OpList {
            ops: Vec::new(),
            roles: Vec::new(),
        }
    }

    pub fn read(&mut self, a: &'a Array, role: MemberIdx, member_sector: u64, buf: &'a mut [u8]) {
        let dev = a.live(role).expect("read from a live member");
        self.ops
            .push(Op::read(dev, a.member_byte(role, member_sector), buf));
        self.roles.push(role);
    }

    pub fn write(&mut self, a: &'a Array, role: MemberIdx, member_sector: u64, buf: &'a [u8]) {
        let dev = a.live(role).expect("write to a live member");
        self.ops
            .push(Op::write(dev, a.member_byte(role, member_sector), buf));
        self.roles.push(role);
    }

    /// Run all; returns the roles that failed (already marked faulty).
    pub fn run(mut self, a: &Array) -> Vec<MemberIdx> {
        if self.ops.is_empty() {
            return Vec::new();
        }
        a.run_ops(&mut self.ops, &self.roles)
    }
}

/// Error for a range that lost all its redundancy.
pub(crate) fn no_redundancy(a: &Array, what: &str) -> ArrayError {
    ArrayError::Failed(format!(
        "{what}: {} has lost members {} and cannot rebuild this range",
        a.geometry.level,
        a.missing_roles()
            .iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
