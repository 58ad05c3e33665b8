//! A pass-through member with faults and hooks, for tests over any member (memory, files):
//! reads or writes fail (EIO) while a switch is on, optionally only inside a byte range;
//! flushes can fail too; a [`Hook`] sees every read and write and may pass it, fail it or
//! lose it (a write that reports success and stores nothing). In a batch it decides each
//! op itself and forwards the others to the inner member's batch path, so that a
//! FaultMember over a file still runs on io_uring.
//!
//! [`crate::SimDisk`] is the simulated disk itself (its own images, scheduled faults,
//! crashes); this wraps a disk the test already has.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use uraid_engine::write_zero_buffers;
use uraid_engine::{Batch, Member, MemberOp, ZeroHow};

/// One read or write as a [`Hook`] sees it (offsets on the member, in bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookIo {
    pub write: bool,
    pub offset: u64,
    pub len: u64,
}

/// What a [`Hook`] does with an IO.
#[derive(Debug)]
pub enum Verdict {
    /// On to the inner member.
    Pass,
    /// Fail with this error; nothing reaches the inner member.
    Fail(io::Error),
    /// Report success and store nothing (a lost write); for reads the same as `Pass`.
    Lose,
}

/// Called for every read and write, after the switches, before the inner member.
pub type Hook = Box<dyn Fn(HookIo) -> Verdict + Send + Sync>;

pub struct FaultMember {
    inner: Arc<dyn Member>,
    pub fail_reads: AtomicBool,
    pub fail_writes: AtomicBool,
    /// Flushes fail (a device that vanished), whatever the range.
    pub fail_flushes: AtomicBool,
    /// Faults apply only to IO overlapping [range_start, range_end).
    range_start: AtomicU64,
    range_end: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    hook: Option<Hook>,
    /// Zero only by writing zeros, discard as a no-op (a device without either offload).
    zeroes_by_writing: bool,
}

impl FaultMember {
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
            hook: None,
            zeroes_by_writing: false,
        }
    }

    /// Run `hook` on every read and write.
    pub fn with_hook(
        mut self,
        hook: impl Fn(HookIo) -> Verdict + Send + Sync + 'static,
    ) -> FaultMember {
        self.hook = Some(Box::new(hook));
        self
    }

    /// Hide the inner member's zeroing: write_zeroes writes zero buffers, discard does
    /// nothing and reads back nothing in particular (as a device without offloads).
    pub fn zeroes_by_writing(mut self) -> FaultMember {
        self.zeroes_by_writing = true;
        self
    }

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

    /// Count a read or write and decide it: switches first, then the hook.
    fn decide(&self, write: bool, offset: u64, len: usize) -> Verdict {
        let (counter, switch, what) = if write {
            (&self.writes, &self.fail_writes, "write")
        } else {
            (&self.reads, &self.fail_reads, "read")
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if switch.load(Ordering::SeqCst) && self.hits(offset, len) {
            return Verdict::Fail(self.eio(what, offset));
        }
        match &self.hook {
            Some(h) => h(HookIo {
                write,
                offset,
                len: len as u64,
            }),
            None => Verdict::Pass,
        }
    }
}

impl Member for FaultMember {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self.decide(false, offset, buf.len()) {
            Verdict::Fail(e) => Err(e),
            Verdict::Pass | Verdict::Lose => self.inner.read_at(buf, offset),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.decide(true, offset, buf.len()) {
            Verdict::Fail(e) => Err(e),
            Verdict::Lose => Ok(()),
            Verdict::Pass => self.inner.write_at(buf, offset),
        }
    }

    fn submit<'a>(&'a self, ops: &mut [MemberOp<'a>], batch: &mut Batch<'a>) {
        for op in ops.iter_mut().filter(|o| !o.is_complete()) {
            match self.decide(op.is_write(), op.offset, op.len()) {
                Verdict::Fail(e) => op.complete(Err(e)),
                Verdict::Lose if op.is_write() => op.complete(Ok(())),
                Verdict::Pass | Verdict::Lose => {}
            }
        }
        self.inner.submit(ops, batch);
    }

    fn flush(&self) -> io::Result<()> {
        if self.fail_flushes.load(Ordering::SeqCst) {
            return Err(self.eio("flush", 0));
        }
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.zeroes_by_writing {
            return Ok(());
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        if self.fail_writes.load(Ordering::SeqCst) && self.hits(offset, len as usize) {
            return Err(self.eio("discard", offset));
        }
        self.inner.discard(offset, len)
    }

    fn discard_zeroes(&self) -> bool {
        !self.zeroes_by_writing && self.inner.discard_zeroes()
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroHow) -> io::Result<()> {
        if self.zeroes_by_writing {
            return write_zero_buffers(self, offset, len);
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        if self.fail_writes.load(Ordering::SeqCst) && self.hits(offset, len as usize) {
            return Err(self.eio("write-zeroes", offset));
        }
        self.inner.write_zeroes(offset, len, how)
    }

    fn zeroes_fast(&self, unmap: bool) -> bool {
        !self.zeroes_by_writing && self.inner.zeroes_fast(unmap)
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn device_id(&self) -> uraid_engine::DeviceId {
        self.inner.device_id()
    }

    fn io_engine(&self) -> Option<uraid_engine::IoEngine> {
        self.inner.io_engine()
    }
}
