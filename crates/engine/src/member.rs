//! Member devices: the one trait every backend implements.

use std::io;
use std::sync::RwLock;

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
    /// A name for messages (a path, "mem0", ...).
    fn name(&self) -> String;
    /// The file backend behind this member, for the io_uring path.
    fn as_file(&self) -> Option<&crate::file::FileMember> {
        None
    }
    /// Whether the whole device is known to read as zeros (a new sparse file), so that a new
    /// array needs no initial sync.
    fn known_zero(&self) -> bool {
        false
    }
    /// The device itself, for telling whether two members are one device whatever their
    /// names (see [`crate::identity`]). Wrappers return their inner device's.
    fn device_id(&self) -> crate::identity::DeviceId {
        crate::identity::DeviceId::Named(self.name())
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
pub struct MemMember {
    name: String,
    data: RwLock<Vec<u8>>,
}

impl MemMember {
    /// A zeroed member of `size_bytes`, called `name`.
    pub fn new(name: impl Into<String>, size_bytes: u64) -> MemMember {
        MemMember {
            name: name.into(),
            data: RwLock::new(vec![0u8; size_bytes as usize]),
        }
    }

    /// A copy of the whole contents (tests).
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().unwrap().clone()
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
        self.data.read().unwrap().len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let r = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.data.read().unwrap()[r]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let r = self.range(offset, buf.len())?;
        self.data.write().unwrap()[r].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let r = self.range(offset, len as usize)?;
        self.data.write().unwrap()[r].fill(0);
        Ok(())
    }

    fn discard_zeroes(&self) -> bool {
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
/// It hides the file backend (`as_file`) so that no fast path can write around it.
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

    fn name(&self) -> String {
        self.0.name()
    }
}
