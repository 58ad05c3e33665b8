//! The block device the server exports, and an in-memory one for tests.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::proto::{Errno, ZeroFlags};

/// A byte-addressed block device served over NBD.
///
/// The server checks every request against [`Backend::size_bytes`] and
/// [`Backend::min_block_size`] before calling in, so implementations see only
/// in-range, aligned requests. Calls come from several threads at once.
pub trait Backend: Send + Sync + 'static {
    /// Size of the export, read when a client connects; a client keeps the size it was
    /// told for its connection.
    fn size_bytes(&self) -> u64;
    /// Fills `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` at `offset`; with `fua`, the data is durable when this returns.
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> io::Result<()>;
    /// Makes every write completed so far durable.
    fn flush(&self) -> io::Result<()>;
    /// Hint that the range is no longer needed; its contents become undefined.
    fn trim(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Makes the range read as zeroes; with `how.no_hole` it stays allocated. With
    /// `how.fast`, fails with `ENOTSUP`, changing nothing, unless it is faster than
    /// writing zeros.
    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroFlags) -> io::Result<()>;
    /// Whether some write-zeroes with `fast` can succeed: the server advertises
    /// NBD_FLAG_SEND_FAST_ZERO only then.
    fn can_fast_zero(&self) -> bool {
        false
    }
    /// Reject writes, trims and write-zeroes with `EPERM`.
    fn read_only(&self) -> bool {
        false
    }
    /// Preferred IO size advertised to clients (`NBD_INFO_BLOCK_SIZE`).
    fn block_size(&self) -> u32 {
        4096
    }
    /// `base:allocation` for `len` bytes at `offset` (in range, `len` > 0): extents in
    /// order from `offset`, covering at least the first byte and at most `len` bytes. The
    /// default says "allocated data" for the whole range, which is always true.
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let _ = offset;
        Ok(vec![Extent {
            length: len,
            hole: false,
            zero: false,
        }])
    }
    /// The name of the write-intent bitmap served as the `qemu:dirty-bitmap:<name>` meta
    /// context; `None` (the default) offers no such context.
    fn dirty_bitmap(&self) -> Option<String> {
        None
    }
    /// The dirty bitmap's status for `len` bytes at `offset` (in range, `len` > 0), as
    /// [`Backend::block_status`] gives its extents. Called only when
    /// [`Backend::dirty_bitmap`] names one; the default says "dirty", always safe.
    fn dirty_status(&self, offset: u64, len: u64) -> io::Result<Vec<DirtyExtent>> {
        let _ = offset;
        Ok(vec![DirtyExtent {
            length: len,
            dirty: true,
        }])
    }
    /// Alignment every request must have (a power of two, at most 65536).
    /// 1 (the default) means the backend accepts any byte range.
    fn min_block_size(&self) -> u32 {
        1
    }
}

/// One run of `base:allocation` status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes it covers.
    pub length: u64,
    /// Not allocated (NBD_STATE_HOLE).
    pub hole: bool,
    /// Reads as zeros (NBD_STATE_ZERO).
    pub zero: bool,
}

/// One run of dirty bitmap status (`qemu:dirty-bitmap:<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyExtent {
    /// Bytes it covers.
    pub length: u64,
    /// Changed since the bitmap was last cleared (qemu's flag 1).
    pub dirty: bool,
}

/// Maps a backend error to the NBD error sent to the client.
pub fn errno_of(err: &io::Error) -> Errno {
    if let Some(code) = err.raw_os_error() {
        return match code {
            libc::EPERM | libc::EACCES | libc::EROFS => Errno::Perm,
            libc::ENOMEM => Errno::NoMem,
            libc::EINVAL => Errno::Inval,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => Errno::NoSpc,
            libc::EOVERFLOW => Errno::Overflow,
            libc::ENOTSUP => Errno::NotSup,
            libc::ESHUTDOWN => Errno::Shutdown,
            _ => Errno::Io,
        };
    }
    match err.kind() {
        io::ErrorKind::PermissionDenied => Errno::Perm,
        io::ErrorKind::InvalidInput => Errno::Inval,
        io::ErrorKind::OutOfMemory => Errno::NoMem,
        io::ErrorKind::Unsupported => Errno::NotSup,
        _ => Errno::Io,
    }
}

/// An in-memory backend (for tests and benchmarks).
///
/// One reader-writer lock over the whole image: reads run in parallel,
/// writes are exclusive. Counts flushes and FUA writes so tests can see them.
#[derive(Debug)]
pub struct MemBackend {
    data: RwLock<Vec<u8>>,
    read_only: bool,
    block_size: u32,
    flushes: AtomicU64,
    fua_writes: AtomicU64,
    trims: AtomicU64,
    writes: AtomicU64,
    fast_zero: bool,
    zeroes: RwLock<Vec<ZeroFlags>>,
}

impl MemBackend {
    /// A zero-filled image of `size_bytes`.
    pub fn new(size_bytes: usize) -> Self {
        Self::from_vec(vec![0; size_bytes])
    }

    /// An image with the given contents.
    pub fn from_vec(data: Vec<u8>) -> Self {
        MemBackend {
            data: RwLock::new(data),
            read_only: false,
            block_size: 4096,
            flushes: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            trims: AtomicU64::new(0),
            fast_zero: false,
            zeroes: RwLock::new(Vec::new()),
        }
    }

    /// Makes the export read-only.
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Zeroes "fast" (it is memory): fast write-zeroes succeed instead of failing.
    pub fn with_fast_zero(mut self, fast_zero: bool) -> Self {
        self.fast_zero = fast_zero;
        self
    }

    /// The flags of every write-zeroes that reached the backend, in order.
    pub fn zero_flags(&self) -> Vec<ZeroFlags> {
        self.zeroes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sets the preferred block size advertised.
    pub fn with_block_size(mut self, block_size: u32) -> Self {
        self.block_size = block_size;
        self
    }

    /// A copy of the whole image.
    pub fn snapshot(&self) -> Vec<u8> {
        self.lock_read().clone()
    }

    /// Number of `flush` calls so far.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Number of writes and write-zeroes with FUA so far.
    pub fn fua_count(&self) -> u64 {
        self.fua_writes.load(Ordering::Relaxed)
    }

    /// Number of `write` calls so far.
    pub fn write_count(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Number of `trim` calls so far.
    pub fn trim_count(&self) -> u64 {
        self.trims.load(Ordering::Relaxed)
    }

    fn lock_read(&self) -> std::sync::RwLockReadGuard<'_, Vec<u8>> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<u8>> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }

    fn range(&self, len_total: usize, offset: u64, len: u64) -> io::Result<std::ops::Range<usize>> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= len_total as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(offset as usize..end as usize)
    }
}

impl Backend for MemBackend {
    fn size_bytes(&self) -> u64 {
        self.lock_read().len() as u64
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let data = self.lock_read();
        let r = self.range(data.len(), offset, buf.len() as u64)?;
        buf.copy_from_slice(&data[r]);
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        let mut data = self.lock_write();
        let r = self.range(data.len(), offset, buf.len() as u64)?;
        data[r].copy_from_slice(buf);
        self.writes.fetch_add(1, Ordering::Relaxed);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        // Contents are undefined after a trim; zeroing is one legal choice.
        let mut data = self.lock_write();
        let r = self.range(data.len(), offset, len)?;
        data[r].fill(0);
        self.trims.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroFlags) -> io::Result<()> {
        self.zeroes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(how);
        if how.fast && !self.fast_zero {
            return Err(io::Error::from_raw_os_error(libc::ENOTSUP));
        }
        let mut data = self.lock_write();
        let r = self.range(data.len(), offset, len)?;
        data[r].fill(0);
        if how.fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    /// Memory that is all zeros in 4 KiB blocks is reported as a hole that reads as
    /// zeros, as a sparse file's unwritten blocks are.
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        const BLOCK: u64 = 4096;
        let data = self.lock_read();
        let r = self.range(data.len(), offset, len)?;
        let mut out: Vec<Extent> = Vec::new();
        let mut at = r.start as u64;
        while at < r.end as u64 {
            let end = ((at / BLOCK + 1) * BLOCK).min(r.end as u64);
            let zero = data[at as usize..end as usize].iter().all(|&b| b == 0);
            match out.last_mut() {
                Some(e) if e.zero == zero => e.length += end - at,
                _ => out.push(Extent {
                    length: end - at,
                    hole: zero,
                    zero,
                }),
            }
            at = end;
        }
        Ok(out)
    }

    fn can_fast_zero(&self) -> bool {
        self.fast_zero
    }

    fn block_size(&self) -> u32 {
        self.block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        let e = |c| errno_of(&io::Error::from_raw_os_error(c));
        assert_eq!(e(libc::EIO), Errno::Io);
        assert_eq!(e(libc::ENOSPC), Errno::NoSpc);
        assert_eq!(e(libc::EDQUOT), Errno::NoSpc);
        assert_eq!(e(libc::EROFS), Errno::Perm);
        assert_eq!(e(libc::EINVAL), Errno::Inval);
        assert_eq!(e(libc::ENXIO), Errno::Io);
        let k = |k| errno_of(&io::Error::new(k, "x"));
        assert_eq!(k(io::ErrorKind::PermissionDenied), Errno::Perm);
        assert_eq!(k(io::ErrorKind::InvalidInput), Errno::Inval);
        assert_eq!(k(io::ErrorKind::Other), Errno::Io);
    }

    #[test]
    fn mem_backend_roundtrip() {
        let m = MemBackend::new(4096);
        m.write(100, b"hello", true).unwrap();
        let mut b = [0u8; 7];
        m.read(99, &mut b).unwrap();
        assert_eq!(&b, b"\0hello\0");
        m.write_zeroes(101, 2, ZeroFlags::default()).unwrap();
        m.read(99, &mut b).unwrap();
        assert_eq!(&b, b"\0h\0\0lo\0");
        assert_eq!(m.fua_count(), 1);
        assert!(m.read(4090, &mut b).is_err());
        assert!(m.trim(u64::MAX, 2).is_err());
    }
}
