//! Discard and write-zeroes, passed down to the members as md passes discards:
//! - raid0, raid1, raid10: per piece, on every copy of it;
//! - raid4/5/6: whole stripes only, on every member at once while the stripes' heads are
//!   held (md's make_discard_request); a partial stripe keeps its data on a discard and
//!   gets a normal write of zeros on a write-zeroes, so parity stays right.
//!
//! Where a level has redundancy a discard goes down only if every member's discard reads
//! back zeros ([`Member::discard_zeroes`]; md asks the same of raid4/5/6 members with
//! devices_handle_discard_safely): the copies stay equal, and the parity of zero data is
//! zero (P and Q alike), so a check finds no mismatch afterwards. A member whose discard
//! fails gets zeros written instead; if that fails too it is failed, as for a failed write.
//!
//! Both count as writes: the array is marked dirty and the bitmap bits are on disk before
//! any member changes, so a crash in the middle resyncs the range. With a write journal a
//! discard is not passed down: the journal logs no discards and a journal array does not
//! resync after a crash, so a half-done discard would stay inconsistent. Write-zeroes then
//! writes zeros through the journal.

pub(crate) use crate::array::ZeroKind as Kind;
use crate::array::{Array, InFlight};
use crate::error::ArrayError;
use crate::member::{Member, ZeroHow};
use crate::slot::SlotState;
use std::sync::atomic::Ordering;
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// The devices of every role that holds data now (in sync or recovering, with any
/// replacement behind it).
fn active_devices(a: &Array) -> Vec<std::sync::Arc<dyn Member>> {
    a.slots
        .values()
        .filter(|s| matches!(s.state(), SlotState::InSync | SlotState::Recovering))
        .filter_map(|s| s.device())
        .collect()
}

impl Array {
    /// Make a range read as zeros (NBD WRITE_ZEROES, ublk WRITE_ZEROES) with the members'
    /// zeroing where parity allows (raid4/5/6: whole stripes; a partial stripe gets a
    /// write of zeros; with a journal, zeros through the journal). `how.unmap` lets the members
    /// deallocate it; `fast` refuses with [`ArrayError::NotFast`], before changing anything,
    /// when some member would have to write zeros.
    pub fn write_zeroes_with(
        &self,
        offset: u64,
        len: u64,
        how: crate::member::ZeroHow,
        fast: bool,
    ) -> Result<(), ArrayError> {
        self.check_writable("write-zeroes")?;
        write_zeroes(self, offset, len, how, fast)?;
        // Zeroing skips failed members like a write: acknowledged only once recorded.
        self.complete_write()
    }

    /// Make a range read as zeros; the members may deallocate it.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.write_zeroes_with(offset, len, crate::member::ZeroHow { unmap: true }, false)
    }

    /// Discard is advisory: the range then reads as zeros or keeps its data. It reaches the
    /// members only where every copy and parity stays consistent (see
    /// [`Array::discard_passes_down`]); raid4/5/6 discard whole stripes only.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), ArrayError> {
        self.check_writable("discard")?;
        discard(self, offset, len)?;
        self.complete_write()
    }

    /// Whether [`Array::write_zeroes_with`] with `fast` can succeed: no journal, and every
    /// member zeroes without writing data (for NBD's NBD_FLAG_SEND_FAST_ZERO).
    pub fn can_fast_zero(&self, unmap: bool) -> bool {
        self.journal().is_none() && active_devices(self).iter().all(|d| d.zeroes_fast(unmap))
    }

    /// Whether a discard reaches the members: never with a write journal (it logs no
    /// discards), and on a level with redundancy only if every member's discard reads back
    /// zeros ([`Member::discard_zeroes`]), so copies and parity stay equal.
    pub fn discard_passes_down(&self) -> bool {
        self.journal().is_none()
            && (self.pers().max_degraded() == 0
                || active_devices(self).iter().all(|d| d.discard_zeroes()))
    }
}

/// Array sectors [start, end) of the byte range that the members can change as a whole:
/// whole sectors, and whole stripes on raid4/5/6.
fn inner_sectors(a: &Array, offset: u64, len: u64) -> (u64, u64) {
    let start = offset.div_ceil(SECTOR_BYTES);
    let end = (offset + len) / SECTOR_BYTES;
    let (d, _) = a.pers().zero_unit();
    (start.div_ceil(d) * d, end / d * d)
}

pub(crate) fn discard(a: &Array, offset: u64, len: u64) -> Result<(), ArrayError> {
    let _active = a.enter()?;
    a.check_range(offset, len)?;
    a.stats.requests.fetch_add(1, Ordering::Relaxed);
    let (start, end) = inner_sectors(a, offset, len);
    if end <= start || !a.discard_passes_down() {
        return Ok(());
    }
    change(a, start, end - start, Kind::Discard)
}

pub(crate) fn write_zeroes(
    a: &Array,
    offset: u64,
    len: u64,
    how: ZeroHow,
    fast: bool,
) -> Result<(), ArrayError> {
    a.check_range(offset, len)?;
    if len == 0 {
        return Ok(());
    }
    let (start, end) = if a.journal().is_some() {
        (0, 0)
    } else {
        inner_sectors(a, offset, len)
    };
    let (start, end) = (start * SECTOR_BYTES, end * SECTOR_BYTES);
    if fast {
        // Everything by member zeroing, or nothing.
        let why = if a.journal().is_some() {
            Some("the write journal logs zeros as data".to_string())
        } else if start != offset || end != offset + len {
            Some(format!(
                "{offset}+{len} is not made of whole {}",
                a.pers().zero_unit().1
            ))
        } else if !a.can_fast_zero(how.unmap) {
            Some("a member would have to write zeros".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(ArrayError::NotFast(why));
        }
    }
    if end <= start {
        return write_zero_data(a, offset, len);
    }
    // The edges (partial sectors, partial stripes) are normal writes, outside this
    // request's own quiesce reference (each write takes one).
    write_zero_data(a, offset, start - offset)?;
    {
        let _active = a.enter()?;
        a.check_range(start, end - start)?;
        a.stats.requests.fetch_add(1, Ordering::Relaxed);
        change(
            a,
            start / SECTOR_BYTES,
            (end - start) / SECTOR_BYTES,
            Kind::Zero(how),
        )?;
    }
    write_zero_data(a, end, offset + len - end)
}

/// Zeros written as data, through the normal write path.
fn write_zero_data(a: &Array, offset: u64, len: u64) -> Result<(), ArrayError> {
    const STEP: u64 = 1 << 20;
    if len == 0 {
        return Ok(());
    }
    let zeros = crate::buf::AlignedBuf::new(len.min(STEP) as usize);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(STEP);
        a.write(offset + done, &zeros[..n as usize])?;
        done += n;
    }
    Ok(())
}

/// Whether a change of this kind leaves zeros on every member: a zeroing always (a member
/// that cannot zero is failed), a discard only where it reaches the members on a level
/// with redundancy (each member's discard reads back zeros, or falls back to zeroing).
fn leaves_zeros(a: &Array, kind: Kind) -> bool {
    match kind {
        Kind::Zero(_) => true,
        Kind::Discard => a.pers().max_degraded() > 0 && a.discard_passes_down(),
    }
}

/// A change of array sectors [sector, sector+sectors) on the members, counted as a write.
/// A change that leaves zeros everywhere makes the whole regions it covers never written
/// ([`crate::written`]): it claims them, waits for the writes already under way (so none
/// lands after its zeros), changes the members, and clears them unless a write came in
/// meanwhile.
fn change(a: &Array, sector: u64, sectors: u64, kind: Kind) -> Result<(), ArrayError> {
    let claim = if leaves_zeros(a, kind) {
        a.written.claim(sector, sectors)
    } else {
        None
    };
    if claim.is_some() {
        a.writes_in_flight.wait_for_earlier();
    }
    let r = change_members(a, sector, sectors, kind);
    if let Some(c) = claim {
        // Members may have changed meanwhile: a discard must still have been a zeroing.
        if r.is_ok() && leaves_zeros(a, kind) {
            a.written.settle(c);
        } else {
            a.written.drop_claim(c);
        }
    }
    r
}

fn change_members(a: &Array, sector: u64, sectors: u64, kind: Kind) -> Result<(), ArrayError> {
    let _in_flight = InFlight::new(a);
    a.check_metadata()?;
    a.ensure_dirty()?;
    a.bitmap_write(sector, sectors, || {
        a.pers().zero(a, Sector(sector), sectors, kind)
    })?;
    a.check_metadata()
}

/// A recovery target's `len` bytes at `offset` that must read as zeros (rebuilt from
/// members that are holes there): left alone where the target is a hole already (a fresh
/// sparse file) with no bad block recorded there, else zeroed as a write would be
/// ([`member_zero`]: counted, its bad blocks cleared, the member failed if it cannot).
pub(crate) fn zero_target(a: &Array, role: MemberIdx, offset: u64, len: u64) {
    let slot = a.slot(role);
    let Some(dev) = slot.device() else {
        return;
    };
    let recorded_bad = slot.is_bad(offset / SECTOR_BYTES, len.div_ceil(SECTOR_BYTES));
    if !recorded_bad && dev.is_hole(offset, len).unwrap_or(false) {
        return;
    }
    let how = ZeroHow { unmap: true };
    member_zero(a, role, dev.as_ref(), offset, len, Kind::Zero(how), true);
}

/// Discard or zero `len` bytes at `offset` of a member. `redundant`: the range must read
/// zeros afterwards (copies or parity depend on it), so a failed discard falls back to
/// zeroing, and a failed zeroing fails the member. Returns whether the member took it.
pub(crate) fn member_zero(
    a: &Array,
    role: MemberIdx,
    dev: &dyn Member,
    offset: u64,
    len: u64,
    kind: Kind,
    redundant: bool,
) -> bool {
    a.stats.member_writes.fetch_add(1, Ordering::Relaxed);
    let r = match kind {
        Kind::Discard => dev.discard(offset, len),
        Kind::Zero(how) => dev.write_zeroes(offset, len, how),
    };
    let r = match (r, kind) {
        (Err(e), Kind::Discard) if redundant => {
            tracing::debug!("member {role}: discard failed ({e}); writing zeros instead");
            dev.write_zeroes(offset, len, ZeroHow { unmap: false })
        }
        (Err(e), Kind::Discard) => {
            tracing::debug!("member {role}: discard failed ({e}); the range keeps its data");
            return true;
        }
        (r, _) => r,
    };
    match r {
        Ok(()) => {
            if matches!(kind, Kind::Zero(_)) || dev.discard_zeroes() {
                // Like a write: the range holds known data again.
                a.slot(role)
                    .clear_bad(offset / SECTOR_BYTES, len / SECTOR_BYTES);
            }
            true
        }
        Err(e) => {
            a.member_error(role, &e);
            false
        }
    }
}
