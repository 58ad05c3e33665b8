//! The device of a role being replaced (md's --replace), as the role's member: the old
//! device with its replacement beside it. Reads go to the old device; writes reach both
//! below the copy cursor. The copy itself and its outcomes are `replace`'s; this is the
//! lower layer's part (a member wrapper the slots hold), so it imports no array or level.

use crate::badblocks::BadCheck;
use crate::member::Member;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use uraid_core::SECTOR_BYTES;

/// Bytes of member data copied per step (and held back from writers meanwhile).
pub(crate) const COPY_STEP_BYTES: usize = 1 << 20;

/// The old member of a role with its replacement being rebuilt beside it.
pub struct Replacing {
    old: Arc<dyn Member>,
    pub(crate) new: Arc<dyn Member>,
    /// The data area on the old member, in bytes. Writes outside it (superblock, bitmap)
    /// belong to the old member alone: the replacement has its own.
    data_start: u64,
    data_bytes: u64,
    /// Where the replacement's data area starts.
    pub(crate) new_data_start: u64,
    st: Mutex<CopyState>,
    cv: Condvar,
    failed: AtomicBool,
    /// The old device's bad blocks: the copy must not take data from them.
    bad: BadCheck,
}

struct CopyState {
    /// Data-area bytes already copied: the replacement is valid below it.
    cursor: u64,
    /// The range being copied now: writes overlapping it wait.
    window: Option<(u64, u64)>,
    /// Writes in flight (data-area byte ranges): the copier waits for those overlapping its
    /// window, so it never copies data a write is about to change behind its back.
    inflight: Vec<(u64, u64)>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// What one copy step did.
pub(crate) enum CopyStep {
    /// Copied up to this data-area byte.
    Copied(u64),
    /// Everything is copied.
    Done,
    /// The old member could not read [start, end) (data-area bytes).
    ReadError(u64, u64, io::Error),
    /// The replacement could not be written: it is failed.
    WriteError,
}

impl Replacing {
    pub(crate) fn new(
        old: Arc<dyn Member>,
        data_start: u64,
        data_bytes: u64,
        new: Arc<dyn Member>,
        new_data_start: u64,
        cursor_bytes: u64,
        bad: BadCheck,
    ) -> Replacing {
        Replacing {
            old,
            new,
            data_start,
            data_bytes,
            new_data_start,
            st: Mutex::new(CopyState {
                cursor: cursor_bytes.min(data_bytes),
                window: None,
                inflight: Vec::new(),
            }),
            cv: Condvar::new(),
            failed: AtomicBool::new(false),
            bad,
        }
    }

    pub(crate) fn old(&self) -> Arc<dyn Member> {
        self.old.clone()
    }

    pub fn new_name(&self) -> String {
        self.new.name()
    }

    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    pub(crate) fn fail_with(&self, e: &io::Error) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            tracing::warn!("replacement {} failed: {e}", self.new.name());
        }
    }

    /// The replacement's recovery_offset: member sectors already rebuilt.
    pub fn cursor_sectors(&self) -> u64 {
        self.st.lock().unwrap().cursor / SECTOR_BYTES
    }

    pub(crate) fn total_sectors(&self) -> u64 {
        self.data_bytes / SECTOR_BYTES
    }

    /// Copy the next range (at most `buf.len()` bytes) from the old member to the
    /// replacement and move the cursor past it once it is written.
    pub(crate) fn copy_step(&self, buf: &mut [u8]) -> CopyStep {
        if self.failed() {
            return CopyStep::WriteError;
        }
        let (start, end) = {
            let mut st = self.st.lock().unwrap();
            let start = st.cursor;
            if start >= self.data_bytes {
                return CopyStep::Done;
            }
            let end = (start + buf.len() as u64).min(self.data_bytes);
            st.window = Some((start, end));
            while st.inflight.iter().any(|&w| overlaps(w, (start, end))) {
                st = self.cv.wait(st).unwrap();
            }
            (start, end)
        };
        let n = (end - start) as usize;
        let first = (self.data_start + start) / SECTOR_BYTES;
        let r = if self.bad.overlaps(first, n as u64 / SECTOR_BYTES) {
            Err(io::Error::other("recorded in the bad block log"))
        } else {
            self.old.read_at(&mut buf[..n], self.data_start + start)
        };
        let r = r.map_err(|e| (true, e)).and_then(|()| {
            self.new
                .write_at(&buf[..n], self.new_data_start + start)
                .map_err(|e| (false, e))
        });
        let mut st = self.st.lock().unwrap();
        st.window = None;
        let out = match r {
            Ok(()) => {
                st.cursor = end;
                CopyStep::Copied(end)
            }
            Err((true, e)) => CopyStep::ReadError(start, end, e),
            Err((false, e)) => {
                self.fail_with(&e);
                CopyStep::WriteError
            }
        };
        drop(st);
        self.cv.notify_all();
        out
    }
}

impl Replacing {
    /// Run a change of the old member's [offset, offset+len) on it and, below the copy
    /// cursor, on the replacement: `op(device, device offset, bytes into the range, bytes)`.
    fn on_both(
        &self,
        offset: u64,
        len: u64,
        op: impl Fn(&dyn Member, u64, u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let end = offset + len;
        let data_end = self.data_start + self.data_bytes;
        if end <= self.data_start || offset >= data_end {
            return op(self.old.as_ref(), offset, 0, len);
        }
        let range = (
            offset.max(self.data_start) - self.data_start,
            end.min(data_end) - self.data_start,
        );
        let mirror = {
            let mut st = self.st.lock().unwrap();
            while st.window.is_some_and(|w| overlaps(w, range)) {
                st = self.cv.wait(st).unwrap();
            }
            st.inflight.push(range);
            // Above the cursor the copy will bring the data over later (it waits for this
            // write first); at or below it only this write can.
            !self.failed() && range.0 < st.cursor
        };
        let r = op(self.old.as_ref(), offset, 0, len);
        if mirror {
            // Also when the old member failed: the replacement then carries on alone as a
            // recovering member and must hold every write below its cursor.
            let skip = self.data_start + range.0 - offset;
            let at = self.new_data_start + range.0;
            if let Err(e) = op(self.new.as_ref(), at, skip, range.1 - range.0) {
                self.fail_with(&e);
            }
        }
        let mut st = self.st.lock().unwrap();
        if let Some(i) = st.inflight.iter().position(|&w| w == range) {
            st.inflight.swap_remove(i);
        }
        drop(st);
        self.cv.notify_all();
        r
    }
}

impl Member for Replacing {
    fn size_bytes(&self) -> u64 {
        self.old.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.old.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.on_both(offset, buf.len() as u64, |dev, at, skip, len| {
            dev.write_at(&buf[skip as usize..(skip + len) as usize], at)
        })
    }

    /// Reads go to the old device in the batch (on its ring if it has one); writes go to
    /// both devices through `write_at`.
    fn submit<'a>(
        &'a self,
        ops: &mut [crate::member::MemberOp<'a>],
        batch: &mut crate::member::Batch<'a>,
    ) {
        for op in ops.iter_mut().filter(|o| o.is_write() && !o.is_complete()) {
            op.run_sync(self);
        }
        self.old.submit(ops, batch);
    }

    fn flush(&self) -> io::Result<()> {
        if !self.failed() {
            if let Err(e) = self.new.flush() {
                self.fail_with(&e);
            }
        }
        self.old.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.discard_zeroes() {
            // Advisory: the replacement keeps whatever it holds.
            return self.old.discard(offset, len);
        }
        self.on_both(offset, len, |dev, at, _, len| dev.discard(at, len))
    }

    /// Only when both read back zeros: the copy below the cursor must stay equal.
    fn discard_zeroes(&self) -> bool {
        self.old.discard_zeroes() && self.new.discard_zeroes()
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: crate::member::ZeroHow) -> io::Result<()> {
        self.on_both(offset, len, |dev, at, _, len| {
            dev.write_zeroes(at, len, how)
        })
    }

    fn zeroes_fast(&self, unmap: bool) -> bool {
        self.old.zeroes_fast(unmap) && self.new.zeroes_fast(unmap)
    }

    fn name(&self) -> String {
        self.old.name()
    }

    fn device_id(&self) -> crate::identity::DeviceId {
        self.old.device_id()
    }

    fn io_engine(&self) -> Option<crate::io_engine::IoEngine> {
        self.old.io_engine()
    }
}
