//! A fault-injecting member wrapper, for tests and the simulator: reads or writes fail
//! (EIO) while a switch is on, optionally only inside a byte range; flushes can fail too.

use crate::member::{Member, ZeroHow};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A member that wraps another and fails chosen IO with EIO (for tests of failure
/// handling).
pub struct FaultMember {
    inner: Arc<dyn Member>,
    /// Reads fail (within the range).
    pub fail_reads: AtomicBool,
    /// Writes, discards and write-zeroes fail (within the range).
    pub fail_writes: AtomicBool,
    /// Flushes fail (a device that vanished), whatever the range.
    pub fail_flushes: AtomicBool,
    /// Faults apply only to IO overlapping [range_start, range_end).
    range_start: AtomicU64,
    range_end: AtomicU64,
    /// Reads seen, failed or not.
    pub reads: AtomicU64,
    /// Writes, discards and write-zeroes seen, failed or not.
    pub writes: AtomicU64,
}

impl FaultMember {
    /// A wrapper of `inner` that fails nothing until told to.
    pub fn new(inner: Arc<dyn Member>) -> FaultMember {
        FaultMember {
            inner,
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            fail_flushes: AtomicBool::new(false),
            range_start: AtomicU64::new(0),
            range_end: AtomicU64::new(u64::MAX),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    /// Faults apply only to IO overlapping the bytes `[start, end)`.
    pub fn set_range(&self, start: u64, end: u64) {
        self.range_start.store(start, Ordering::SeqCst);
        self.range_end.store(end, Ordering::SeqCst);
    }

    fn hits(&self, offset: u64, len: usize) -> bool {
        offset < self.range_end.load(Ordering::SeqCst)
            && offset + len as u64 > self.range_start.load(Ordering::SeqCst)
    }

    fn eio(&self, what: &str, offset: u64) -> io::Error {
        io::Error::other(format!(
            "{}: injected {what} error at {offset}",
            self.inner.name()
        ))
    }
}

impl Member for FaultMember {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.fail_reads.load(Ordering::SeqCst) && self.hits(offset, buf.len()) {
            return Err(self.eio("read", offset));
        }
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if self.fail_writes.load(Ordering::SeqCst) && self.hits(offset, buf.len()) {
            return Err(self.eio("write", offset));
        }
        self.inner.write_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        if self.fail_flushes.load(Ordering::SeqCst) {
            return Err(self.eio("flush", 0));
        }
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if self.fail_writes.load(Ordering::SeqCst) && self.hits(offset, len as usize) {
            return Err(self.eio("discard", offset));
        }
        self.inner.discard(offset, len)
    }

    fn discard_zeroes(&self) -> bool {
        self.inner.discard_zeroes()
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroHow) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if self.fail_writes.load(Ordering::SeqCst) && self.hits(offset, len as usize) {
            return Err(self.eio("write-zeroes", offset));
        }
        self.inner.write_zeroes(offset, len, how)
    }

    fn zeroes_fast(&self, unmap: bool) -> bool {
        self.inner.zeroes_fast(unmap)
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn device_id(&self) -> crate::identity::DeviceId {
        self.inner.device_id()
    }
}
