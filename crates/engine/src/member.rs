//! Member devices: the one trait every backend implements.

use std::cell::UnsafeCell;
use std::io;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A member device: a byte-addressed store with a fixed size.
///
/// Offsets and lengths are in bytes. The engine always issues sector-aligned IO
/// (multiples of 512 bytes); backends that need more alignment (O_DIRECT) handle it.
pub trait Member: Send + Sync {
    /// Size in bytes.
    fn size_bytes(&self) -> u64;
    /// Fill `buf` from `offset`. A short read is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Make all completed writes durable.
    fn flush(&self) -> io::Result<()>;
    /// Tell the device the range is unused (best effort; the data may stay or read as zeros,
    /// see [`Member::discard_zeroes`]).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// Whether a range reads back as zeros after [`Member::discard`] (a punched hole). The
    /// levels with redundancy pass a discard down only when every member says so, so that
    /// copies and parity stay consistent (parity of zeros is zeros).
    fn discard_zeroes(&self) -> bool {
        false
    }
    /// Make the range read as zeros. The default writes zero buffers. A device that finds
    /// its fast way refused (EOPNOTSUPP) writes zeros too, and says so from then on in
    /// [`Member::zeroes_fast`].
    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroHow) -> io::Result<()> {
        let _ = how;
        write_zero_buffers(self, offset, len)
    }
    /// Whether [`Member::write_zeroes`] zeroes without writing data (punch, zero range,
    /// a device offload); `unmap` as in [`ZeroHow`].
    fn zeroes_fast(&self, unmap: bool) -> bool {
        let _ = unmap;
        false
    }
    /// Whether `len` bytes at `offset` are a hole: they read as zeros until written (a
    /// sparse file's hole as SEEK_DATA says, an NBD export's NBD_STATE_ZERO, a memory
    /// member's unwritten regions). `false` means "not known to be one" (the default, for
    /// devices that cannot tell): block status then reports data, which is always true.
    /// Callers keep writes out of the range while they rely on the answer.
    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        let _ = (offset, len);
        Ok(false)
    }
    /// Whether [`Member::is_hole`] can answer "hole" at all (a sparse file, a loop device
    /// over one, memory, an NBD export with block status); `false` (the default) for
    /// devices that cannot tell. An array all of whose members can needs no memory of its
    /// own of where it was never written ([`crate::Array::keep_written_in`]).
    fn tells_holes(&self) -> bool {
        false
    }
    /// A name for messages (a path, "mem0", ...).
    fn name(&self) -> String;

    /// A member on another host: its connection state and latency (`uraid detail`).
    /// Local members have none.
    fn remote(&self) -> Option<RemoteStatus> {
        None
    }
    /// The same device opened anew, for a member that failed because its connection was
    /// lost (a remote member: a new connection to the same export), so that it can be
    /// re-added when its host is back. `None` for devices that cannot be reopened this way
    /// (local ones: md re-adds those when they reappear, which is the user's call here).
    fn reopen(&self) -> Option<io::Result<Arc<dyn Member>>> {
        None
    }
    /// md's failfast, decided by the array: `true` while the array keeps its data without
    /// this member, so an error that a retry might cure (a lost connection) fails the
    /// request at once and the member with it; `false` while it holds the last copy of
    /// some data, so such an error is retried (with back-off, for a bounded time) before
    /// the request fails. Devices that have nothing to retry ignore it.
    fn set_failfast(&self, failfast: bool) {
        let _ = failfast;
    }
    /// Take a batch of ops (submit): complete each that is not complete yet, or queue it
    /// on `batch`; the engine runs the queued ones and waits for them before the batch
    /// returns (complete). The default does each op with [`Member::read_at`] or
    /// [`Member::write_at`]; the file backend queues its ops for io_uring. A wrapper
    /// completes the ops it decides itself (an injected error, a refused write), maps the
    /// offsets of the others if it must, and forwards the slice to its inner member's
    /// `submit`, so that a wrapper over a file keeps io_uring. For each op it must do what
    /// `read_at`/`write_at` would (a batch of one goes straight to them).
    fn submit<'a>(&'a self, ops: &mut [MemberOp<'a>], batch: &mut Batch<'a>) {
        let _ = batch;
        for op in ops.iter_mut().filter(|o| !o.is_complete()) {
            op.run_sync(self);
        }
    }
    /// Whether the whole device is known to read as zeros (a new sparse file), so that a new
    /// array needs no initial sync.
    fn known_zero(&self) -> bool {
        false
    }
    /// The device itself, for telling whether two members are one device whatever their
    /// names (see [`DeviceId`](crate::DeviceId)). Wrappers return their inner device's.
    fn device_id(&self) -> crate::identity::DeviceId {
        crate::identity::DeviceId::Named(self.name())
    }
    /// The engine this member's file IO runs on (see [`crate::IoEngine`]); `None` for
    /// members that are not files (memory, remote). Wrappers return their inner member's.
    fn io_engine(&self) -> Option<crate::io_engine::IoEngine> {
        None
    }
}

/// The buffer of one member IO: filled by a read, written by a write.
pub enum OpBuf<'a> {
    /// A read fills this buffer.
    Read(&'a mut [u8]),
    /// A write stores these bytes.
    Write(&'a [u8]),
}

/// One op of a batch as a member sees it in [`Member::submit`]: where on this member, the
/// buffer, and (once done) its result. A member completes an op or forwards it; it skips
/// ops that are complete already (completed by a wrapper above it).
pub struct MemberOp<'a> {
    /// Byte offset on the member it is submitted to; a wrapper that maps offsets changes it
    /// before it forwards the op.
    pub offset: u64,
    /// Private: the ring reads and writes it after `submit` returns, so nobody may swap it.
    pub(crate) buf: OpBuf<'a>,
    /// The member the op was issued to (for grouping; wrappers do not change it).
    pub(crate) issued_to: &'a dyn Member,
    pub(crate) index: usize,
    pub(crate) result: Option<io::Result<()>>,
}

impl<'a> MemberOp<'a> {
    /// The op's buffer (a read's to fill, a write's data).
    pub fn buf(&self) -> &OpBuf<'a> {
        &self.buf
    }

    /// Bytes the op reads or writes.
    pub fn len(&self) -> usize {
        match &self.buf {
            OpBuf::Read(b) => b.len(),
            OpBuf::Write(b) => b.len(),
        }
    }

    /// Whether the op moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the op is a write.
    pub fn is_write(&self) -> bool {
        matches!(self.buf, OpBuf::Write(_))
    }

    /// Address of the buffer (for the O_DIRECT alignment check).
    pub(crate) fn addr(&self) -> usize {
        match &self.buf {
            OpBuf::Read(b) => b.as_ptr() as usize,
            OpBuf::Write(b) => b.as_ptr() as usize,
        }
    }

    /// Whether a result is in already (nothing more to do for this op).
    pub fn is_complete(&self) -> bool {
        self.result.is_some()
    }

    /// Give the op its result (an injected error, a refusal, a synchronous IO's outcome).
    pub fn complete(&mut self, r: io::Result<()>) {
        debug_assert!(self.result.is_none(), "op completed twice");
        self.result = Some(r);
    }

    /// Do the op now with `m`'s synchronous methods and complete it.
    pub fn run_sync<M: Member + ?Sized>(&mut self, m: &M) {
        let r = match &mut self.buf {
            OpBuf::Read(b) => m.read_at(b, self.offset),
            OpBuf::Write(b) => m.write_at(b, self.offset),
        };
        self.complete(r);
    }
}

/// File IOs queued by [`Member::submit`] for one ring submission, and ops that complete
/// later. Only the engine's file backend queues files here; a member whose IO runs
/// elsewhere (a server) may start its ops at submit and complete them later
/// ([`Batch::complete_later`]); other members complete their ops or forward them.
pub struct Batch<'a> {
    pub(crate) files: Vec<FileIo<'a>>,
    /// Ops started at submit, each with what completes it once every member had its submit.
    pub(crate) later: Vec<(usize, Finish<'a>)>,
    /// Whether file ops may be queued for io_uring (else they run at submit).
    uring: bool,
}

/// One queued file IO: op `index` of the batch, on `dev` at `offset` (the file's offset,
/// after any mapping by wrappers), through descriptor `fd`; `dev` runs it synchronously if
/// the ring cannot.
pub(crate) struct FileIo<'a> {
    pub(crate) dev: &'a dyn Member,
    pub(crate) index: usize,
    pub(crate) fd: RawFd,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) write: bool,
}

/// What completes an op started at submit (see [`Batch::complete_later`]).
pub(crate) type Finish<'a> = Box<dyn FnOnce(&mut MemberOp<'a>) + 'a>;

impl<'a> Batch<'a> {
    pub(crate) fn new(uring: bool) -> Batch<'a> {
        Batch {
            files: Vec::new(),
            later: Vec::new(),
            uring,
        }
    }

    /// `op` has been started (sent to a server) and `finish` completes it: waits for its
    /// result, fills a read's buffer and calls [`MemberOp::complete`]. The engine calls it
    /// after every member of the batch has had its submit, so that ops on several members
    /// are in flight together. `finish` must complete the op.
    pub fn complete_later(
        &mut self,
        op: &MemberOp<'a>,
        finish: impl FnOnce(&mut MemberOp<'a>) + 'a,
    ) {
        self.later.push((op.index, Box::new(finish)));
    }

    /// Queue `op` on `dev`'s descriptor `fd` for the ring, or run it now where no ring is
    /// used (a single op, `--io-engine sync`, an empty or out-of-range op whose error the
    /// synchronous path reports).
    pub(crate) fn queue_fd(&mut self, dev: &'a dyn Member, fd: RawFd, op: &mut MemberOp<'_>) {
        let len = op.len();
        let in_range = op
            .offset
            .checked_add(len as u64)
            .is_some_and(|e| e <= dev.size_bytes());
        if !self.uring || len == 0 || !in_range {
            op.run_sync(dev);
            return;
        }
        self.files.push(FileIo {
            dev,
            index: op.index,
            fd,
            offset: op.offset,
            len,
            write: op.is_write(),
        });
    }
}

/// How [`Member::write_zeroes`] may zero a range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroHow {
    /// The range may be deallocated (a hole), as NBD allows without NBD_CMD_FLAG_NO_HOLE.
    pub unmap: bool,
}

/// Zero a range by writing zero buffers (the fallback of every zeroing).
pub fn write_zero_buffers<M: Member + ?Sized>(m: &M, offset: u64, len: u64) -> io::Result<()> {
    const STEP: u64 = 1 << 20;
    let zeros = crate::buf::AlignedBuf::new(len.min(STEP) as usize);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(STEP) as usize;
        m.write_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// A memory member (a ramdisk), for tests and benchmarks.
///
/// Its bytes are behind one lock per 64 KiB region (as brd has one per page), not
/// one for the whole member: IOs to different regions run at once on different threads, as
/// on a block device. An IO takes the locks of every region it touches, in ascending order,
/// before it copies, so overlapping IOs still happen one after the other, each whole.
///
/// It knows which regions were never written (or were wholly discarded since): those read
/// as zeros, and [`Member::is_hole`] says so, as SEEK_DATA does for a sparse file.
pub struct MemMember {
    name: String,
    data: Box<[UnsafeCell<u8>]>,
    regions: Box<[RwLock<()>]>,
    /// Per region: written since it was last wholly zeroed (changed under the region's
    /// exclusive lock, read under its shared lock).
    written: Box<[AtomicBool]>,
}

/// The bytes behind one lock of a [`MemMember`].
const MEM_REGION_BYTES: usize = 64 << 10;

// SAFETY: the bytes in `data` are only read under the shared lock, and only written under
// the exclusive lock, of every region they lie in (`MemMember::read_locked`, `write_locked`).
unsafe impl Sync for MemMember {}

/// The region locks an IO holds while it copies: most IOs lie in one region, and those
/// take no allocation.
#[allow(dead_code)] // held for their Drop only
enum Held<G> {
    One(G),
    Many(Vec<G>),
}

fn hold<'a, G>(locks: &'a [RwLock<()>], take: impl Fn(&'a RwLock<()>) -> G) -> Held<G> {
    match locks {
        [one] => Held::One(take(one)),
        _ => Held::Many(locks.iter().map(take).collect()),
    }
}

impl MemMember {
    /// A zeroed member of `size_bytes`, called `name`.
    pub fn new(name: impl Into<String>, size_bytes: u64) -> MemMember {
        let zeroed: Box<[u8]> = vec![0u8; size_bytes as usize].into_boxed_slice();
        // SAFETY: `UnsafeCell<u8>` has the layout of `u8` (repr(transparent)), so the
        // allocation is the same slice type for the allocator.
        let data = unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [UnsafeCell<u8>]) };
        let count = (size_bytes as usize).div_ceil(MEM_REGION_BYTES);
        MemMember {
            name: name.into(),
            data,
            regions: (0..count).map(|_| RwLock::new(())).collect(),
            written: (0..count).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// A copy of the whole contents (tests).
    pub fn snapshot(&self) -> Vec<u8> {
        let len = self.data.len();
        let mut out = vec![0u8; len];
        let _held = self.read_locked(&(0..len));
        // SAFETY: every region is held shared; `out` is `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.base(), out.as_mut_ptr(), len) };
        out
    }

    fn base(&self) -> *mut u8 {
        UnsafeCell::raw_get(self.data.as_ptr())
    }

    /// The locks of the regions of `r`, in ascending order (the order every IO takes them).
    fn regions_of(&self, r: &std::ops::Range<usize>) -> &[RwLock<()>] {
        match r.is_empty() {
            true => &self.regions[..0],
            false => &self.regions[r.start / MEM_REGION_BYTES..=(r.end - 1) / MEM_REGION_BYTES],
        }
    }

    fn read_locked(&self, r: &std::ops::Range<usize>) -> Held<RwLockReadGuard<'_, ()>> {
        hold(self.regions_of(r), |l| {
            l.read().unwrap_or_else(PoisonError::into_inner)
        })
    }

    fn write_locked(&self, r: &std::ops::Range<usize>) -> Held<RwLockWriteGuard<'_, ()>> {
        hold(self.regions_of(r), |l| {
            l.write().unwrap_or_else(PoisonError::into_inner)
        })
    }

    /// The written flags of the regions of `r` (as [`MemMember::regions_of`]).
    fn written_of(&self, r: &std::ops::Range<usize>) -> &[AtomicBool] {
        match r.is_empty() {
            true => &self.written[..0],
            false => &self.written[r.start / MEM_REGION_BYTES..=(r.end - 1) / MEM_REGION_BYTES],
        }
    }

    fn range(&self, offset: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        let size = self.size_bytes();
        let end = offset.checked_add(len as u64).filter(|&e| e <= size);
        match end {
            Some(end) => Ok(offset as usize..end as usize),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: access {}+{} beyond end of device ({} bytes)",
                    self.name, offset, len, size
                ),
            )),
        }
    }
}

impl Member for MemMember {
    fn size_bytes(&self) -> u64 {
        self.data.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let r = self.range(offset, buf.len())?;
        let _held = self.read_locked(&r);
        // SAFETY: `r` is inside `data` (checked by `range`) and its regions are held
        // shared, so nobody writes them; `buf` is another allocation, `r.len()` long.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base().add(r.start), buf.as_mut_ptr(), r.len())
        };
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let r = self.range(offset, buf.len())?;
        let _held = self.write_locked(&r);
        // SAFETY: `r` is inside `data` and its regions are held exclusively; `buf` is
        // another allocation (a caller cannot hold a reference into `data`).
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), self.base().add(r.start), r.len()) };
        for w in self.written_of(&r) {
            if !w.load(Ordering::Relaxed) {
                w.store(true, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let r = self.range(offset, len as usize)?;
        let _held = self.write_locked(&r);
        // SAFETY: as in `write_at`.
        unsafe { std::ptr::write_bytes(self.base().add(r.start), 0, r.len()) };
        // Regions zeroed whole read as zeros again; a region zeroed in part keeps its flag.
        let first = r.start.div_ceil(MEM_REGION_BYTES);
        let end = if r.end == self.data.len() {
            self.regions.len()
        } else {
            r.end / MEM_REGION_BYTES
        };
        for w in self.written.get(first..end).unwrap_or(&[]) {
            w.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether every region the range touches is unwritten (zeros), looked at under the
    /// regions' shared locks (after any write to them in progress).
    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        let r = self.range(offset, len as usize)?;
        let _held = self.read_locked(&r);
        Ok(self
            .written_of(&r)
            .iter()
            .all(|w| !w.load(Ordering::Relaxed)))
    }

    fn discard_zeroes(&self) -> bool {
        true
    }

    fn tells_holes(&self) -> bool {
        true
    }

    fn write_zeroes(&self, offset: u64, len: u64, _how: ZeroHow) -> io::Result<()> {
        self.discard(offset, len)
    }

    fn zeroes_fast(&self, _unmap: bool) -> bool {
        true
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// A member opened read-only (`--readonly`): reads pass through; writes and discards fail
/// with EROFS before reaching the device, so nothing, not even the dirty flag, is written.
/// In a batch it refuses the writes itself and forwards only the reads to the device.
pub struct ReadOnlyMember(pub std::sync::Arc<dyn Member>);

impl ReadOnlyMember {
    fn refuse(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::ReadOnlyFilesystem,
            format!("{}: opened read-only (--readonly)", self.0.name()),
        )
    }
}

impl Member for ReadOnlyMember {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        self.0.is_hole(offset, len)
    }

    fn tells_holes(&self) -> bool {
        self.0.tells_holes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(self.refuse())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(self.refuse())
    }

    fn submit<'a>(&'a self, ops: &mut [MemberOp<'a>], batch: &mut Batch<'a>) {
        for op in ops.iter_mut().filter(|o| o.is_write() && !o.is_complete()) {
            op.complete(Err(self.refuse()));
        }
        self.0.submit(ops, batch);
    }

    fn io_engine(&self) -> Option<crate::io_engine::IoEngine> {
        self.0.io_engine()
    }

    fn name(&self) -> String {
        self.0.name()
    }
}

/// The connection of a member on another host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteConnection {
    /// Every connection is open.
    Up,
    /// A connection was lost and a request is reconnecting, with back-off (the member
    /// holds the last copy of some data, so it is not failfast).
    Reconnecting,
    /// A connection was lost and nothing is reconnecting it (a failed member: it is
    /// re-added, not reconnected; or a retry that ran out).
    Lost,
}

impl RemoteConnection {
    /// The word `detail`, `status`, the monitor and the metrics use.
    pub fn name(self) -> &'static str {
        match self {
            RemoteConnection::Up => "up",
            RemoteConnection::Reconnecting => "reconnecting",
            RemoteConnection::Lost => "lost",
        }
    }
}

/// How a member on another host stands ([`Member::remote`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteStatus {
    /// Its URI.
    pub uri: String,
    /// Up, reconnecting or lost.
    pub connection: RemoteConnection,
    /// Why a connection closed, once one has.
    pub error: Option<String>,
    /// Moving average of reply latency in microseconds (none before the first reply).
    pub latency_us: Option<u64>,
    /// Every reply's latency since the connection opened: per bucket its upper bound in
    /// microseconds (none: the last bucket, without bound) and the replies in it (not
    /// cumulative).
    pub latency_buckets: Vec<(Option<u64>, u64)>,
    /// Sum of those latencies, in microseconds.
    pub latency_sum_us: u64,
    /// Connections opened.
    pub connections: usize,
    /// Over TLS.
    pub tls: bool,
    /// Attempts to reconnect since the member failed ([`Member::reopen`]; the re-add
    /// daemon's, with `--nbd-readd`).
    pub reconnect_attempts: u64,
    /// Why the last attempt failed.
    pub reconnect_error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IOs across region boundaries, and a member whose size is not a whole number of
    /// regions, read back what was written; out-of-range IOs fail and change nothing.
    #[test]
    fn mem_member_io_across_regions() {
        let size = 3 * MEM_REGION_BYTES as u64 + 4096 + 512;
        let m = MemMember::new("m", size);
        let mut expect = vec![0u8; size as usize];
        let mut seed = 7u32;
        for (off, len) in [
            (0usize, 512usize),
            (MEM_REGION_BYTES - 512, 1024),
            (MEM_REGION_BYTES / 2, 2 * MEM_REGION_BYTES),
            (size as usize - 4096, 4096),
            (0, size as usize),
            (MEM_REGION_BYTES, MEM_REGION_BYTES),
        ] {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (seed >> 16) as u8
                })
                .collect();
            m.write_at(&data, off as u64).unwrap();
            expect[off..off + len].copy_from_slice(&data);
            let mut back = vec![0u8; len];
            m.read_at(&mut back, off as u64).unwrap();
            assert_eq!(back, data, "{off}+{len}");
        }
        assert!(m.write_at(&[1; 1024], size - 512).is_err());
        assert!(m.read_at(&mut [0; 1024], size - 512).is_err());
        m.discard(MEM_REGION_BYTES as u64 - 100, 200).unwrap();
        expect[MEM_REGION_BYTES - 100..MEM_REGION_BYTES + 100].fill(0);
        assert_eq!(m.snapshot(), expect);
        assert_eq!(m.size_bytes(), size);
        m.read_at(&mut [], size).unwrap();
    }

    /// A memory member says a range is a hole only where no region it touches was written
    /// since it was last zeroed whole: a new member everywhere; after a write, none of the
    /// regions it touched; a discard of part of a region keeps it data, a discard of whole
    /// regions (the short last one included) makes them holes again.
    #[test]
    fn mem_member_holes_are_the_regions_never_written() {
        let r = MEM_REGION_BYTES as u64;
        let size = 4 * r + 4096;
        let m = MemMember::new("m", size);
        assert!(m.is_hole(0, size).unwrap());
        m.write_at(&[0; 512], r + r / 2).unwrap();
        assert!(m.is_hole(0, r).unwrap());
        assert!(!m.is_hole(r, 1).unwrap());
        assert!(!m.is_hole(0, 2 * r).unwrap());
        assert!(m.is_hole(2 * r, size - 2 * r).unwrap());
        m.write_at(&[7; 1024], 2 * r - 512).unwrap(); // across regions 1 and 2
        assert!(!m.is_hole(2 * r, 1).unwrap());
        m.discard(r + 4096, r).unwrap(); // the end of region 1 and the start of 2
        assert!(!m.is_hole(r, 1).unwrap() && !m.is_hole(2 * r, 1).unwrap());
        m.discard(r, 2 * r).unwrap(); // regions 1 and 2 whole
        assert!(m.is_hole(0, 4 * r).unwrap());
        m.write_at(&[9; 4096], 4 * r).unwrap(); // the short last region
        assert!(!m.is_hole(4 * r, 1).unwrap());
        m.discard(4 * r, 4096).unwrap();
        assert!(m.is_hole(0, size).unwrap());
        assert!(m.is_hole(size - 512, 1024).is_err());
    }

    /// An IO over several regions is whole to every other IO over them: readers of a range
    /// that writers keep rewriting, each write with one byte value, never see two values
    /// mixed. One writer starts in a later region than the readers, so that holding only
    /// the first region's lock would not keep it out.
    #[test]
    fn mem_member_ios_over_several_regions_are_not_torn() {
        let r = MEM_REGION_BYTES;
        let len = 4 * r;
        let m = MemMember::new("m", (len + r) as u64);
        let off = r / 2;
        // (where the writer starts within the range, its first value)
        let writers = [(0usize, 0u8), (r + r / 2, 1u8)];
        std::thread::scope(|s| {
            for (skip, first) in writers {
                let m = &m;
                s.spawn(move || {
                    for i in 0..300u32 {
                        let v = (i as u8).wrapping_mul(2).wrapping_add(first);
                        m.write_at(&vec![v; len - skip], (off + skip) as u64)
                            .unwrap();
                    }
                });
            }
            for _ in 0..2 {
                let m = &m;
                s.spawn(move || {
                    let mut buf = vec![0u8; len];
                    for _ in 0..300 {
                        m.read_at(&mut buf, off as u64).unwrap();
                        // Both writers cover the tail.
                        let tail = &buf[r + r / 2..];
                        assert!(tail.iter().all(|&b| b == tail[0]), "a torn read");
                    }
                });
            }
        });
    }
}
