//! Member IO for the levels (the lower layer): a batch of member reads and writes by role
//! ([`OpList`]), run through `io`'s batched submission, with md's rules applied to the
//! results: a recorded bad block reads as an error and a write over it clears it, and a
//! failed write fails its member at once. The array above provides the slots and the
//! failure handling through [`MemberHost`]; nothing here names the array or a level.
//!
//! Member addresses at this boundary are [`Sector`]s relative to the member's data area;
//! bytes only appear where `io` takes them.

pub(crate) use crate::io::INLINE_OPS;
use crate::io::{execute_inline, Op, OpBuf};
use crate::member::Member;
use crate::slot::Slot;
use smallvec::SmallVec;
use std::io;
use std::sync::Arc;
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// What member IO needs from the array (`Array` implements it).
pub(crate) trait MemberHost {
    /// The slot of `role`.
    fn slot(&self, role: MemberIdx) -> &Slot;
    /// Count member reads and writes, for `detail` and tests: once per batch, so that a
    /// request pays one call and at most two shared counter updates, not one per member IO.
    fn note_member_ios(&self, reads: u64, writes: u64);
    /// A member IO failed for good: fail the member (md's md_error).
    fn member_error(&self, role: MemberIdx, err: &io::Error);
}

/// Byte offset on a member of a member sector (relative to its data area).
pub(crate) fn member_byte(slot: &Slot, member_sector: Sector) -> u64 {
    slot.data_offset_bytes() + member_sector.bytes()
}

/// Member IOs that failed in one batch.
#[derive(Default, Debug)]
pub(crate) struct Failures {
    pub reads: Vec<MemberIdx>,
    /// Indices (in submission order) of the reads that failed.
    pub read_ops: Vec<usize>,
    /// Already failed (marked faulty) by the time the caller sees them.
    pub writes: Vec<MemberIdx>,
}

impl Failures {
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }
}

/// Run member IOs. A failed write fails its member at once (md does the same: the
/// member no longer holds what the array says it holds). Failed reads are returned so
/// the caller can answer from redundancy and repair the block.
pub(crate) fn run_ops(a: &dyn MemberHost, ops: &mut [Op<'_>], roles: &[MemberIdx]) -> Failures {
    debug_assert_eq!(ops.len(), roles.len());
    let results = execute_inline(ops);
    let mut f = Failures::default();
    let (mut reads, mut writes) = (0u64, 0u64);
    for (i, ((op, mut r), role)) in ops.iter().zip(results).zip(roles).enumerate() {
        let is_read = matches!(op.buf, OpBuf::Read(_));
        // md's bad block log: a recorded range reads as an error (answered from
        // redundancy, whatever the device returned); a write over it clears it.
        let len = match &op.buf {
            OpBuf::Read(b) => b.len(),
            OpBuf::Write(b) => b.len(),
        } as u64;
        let (first, sectors) = (op.offset / SECTOR_BYTES, len.div_ceil(SECTOR_BYTES));
        let slot = a.slot(*role);
        if r.is_ok() {
            if is_read && slot.is_bad(first, sectors) {
                r = Err(io::Error::other("recorded in the bad block log"));
            } else if !is_read {
                slot.clear_bad(first, sectors);
            }
        }
        if is_read {
            reads += 1;
        } else {
            writes += 1;
        }
        if let Err(e) = r {
            if is_read {
                tracing::debug!("member {role}: read error at {}: {e}", op.offset);
                f.read_ops.push(i);
                if !f.reads.contains(role) {
                    f.reads.push(*role);
                }
            } else {
                a.member_error(*role, &e);
                if !f.writes.contains(role) {
                    f.writes.push(*role);
                }
            }
        }
    }
    a.note_member_ios(reads, writes);
    f
}

/// A request's few member roles (written, failed), inline like its ops.
pub(crate) type Roles = SmallVec<[MemberIdx; INLINE_OPS]>;

/// Helper for level modules: one op per (role, member sector, buffer).
pub(crate) struct OpList<'a> {
    devs: SmallVec<[Arc<dyn Member>; INLINE_OPS]>,
    pending: SmallVec<[(u64, OpBuf<'a>); INLINE_OPS]>,
    roles: SmallVec<[MemberIdx; INLINE_OPS]>,
}

impl<'a> OpList<'a> {
    pub fn new() -> OpList<'a> {
        OpList {
            devs: SmallVec::new(),
            pending: SmallVec::new(),
            roles: SmallVec::new(),
        }
    }

    pub fn read(
        &mut self,
        a: &dyn MemberHost,
        dev: Arc<dyn Member>,
        role: MemberIdx,
        member_sector: Sector,
        buf: &'a mut [u8],
    ) {
        self.devs.push(dev);
        self.pending
            .push((member_byte(a.slot(role), member_sector), OpBuf::Read(buf)));
        self.roles.push(role);
    }

    pub fn write(
        &mut self,
        a: &dyn MemberHost,
        dev: Arc<dyn Member>,
        role: MemberIdx,
        member_sector: Sector,
        buf: &'a [u8],
    ) {
        self.devs.push(dev);
        self.pending
            .push((member_byte(a.slot(role), member_sector), OpBuf::Write(buf)));
        self.roles.push(role);
    }

    /// Run all; write failures have failed their members, read failures are returned.
    pub fn run(self, a: &dyn MemberHost) -> Failures {
        if self.pending.is_empty() {
            return Failures::default();
        }
        let mut ops: SmallVec<[Op<'_>; INLINE_OPS]> = self
            .pending
            .into_iter()
            .zip(&self.devs)
            .map(|((offset, buf), dev)| Op {
                member: dev.as_ref(),
                offset,
                buf,
            })
            .collect();
        run_ops(a, &mut ops, &self.roles)
    }
}
