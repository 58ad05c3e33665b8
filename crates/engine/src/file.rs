//! File and block-device members: O_DIRECT where the file system allows it (with a buffered
//! descriptor beside it for unaligned IO), and io_uring for batched IO (see [`crate::io`]).

use crate::member::Member;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

/// Buffer, offset and length alignment we require before using the O_DIRECT descriptor.
pub const DIRECT_ALIGN: usize = 4096;

/// How to open a file member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectMode {
    /// O_DIRECT if the file system accepts it, else buffered.
    Auto,
    /// Buffered IO only (page cache).
    Off,
}

pub struct FileMember {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    size_bytes: u64,
    is_block: bool,
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

impl FileMember {
    pub fn open(path: &Path, mode: DirectMode) -> io::Result<FileMember> {
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let meta = buffered.metadata()?;
        let is_block = meta.file_type().is_block_device();
        let size_bytes = if is_block {
            let mut sz: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
            let rc = unsafe { libc::ioctl(buffered.as_raw_fd(), BLKGETSIZE64, &mut sz) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            sz
        } else if meta.file_type().is_file() {
            meta.len()
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file or block device", path.display()),
            ));
        };
        let direct = match mode {
            DirectMode::Off => None,
            DirectMode::Auto => OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
                .filter(|f| probe_direct(f, size_bytes)),
        };
        Ok(FileMember {
            path: path.to_path_buf(),
            buffered,
            direct,
            size_bytes,
            is_block,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn uses_direct(&self) -> bool {
        self.direct.is_some()
    }

    fn pick(&self, addr: usize, offset: u64, len: usize) -> &File {
        match &self.direct {
            Some(d) if is_aligned(addr, offset, len) => d,
            _ => &self.buffered,
        }
    }

    fn check_range(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: access {offset}+{len} beyond end of device ({} bytes)",
                    self.path.display(),
                    self.size_bytes
                ),
            )),
        }
    }

    /// The descriptor to use for an IO, for the io_uring path.
    pub(crate) fn fd_for(&self, addr: usize, offset: u64, len: usize) -> RawFd {
        self.pick(addr, offset, len).as_raw_fd()
    }

    /// Whether the whole file is a hole (a fresh sparse file reads as zeros).
    pub fn is_all_hole(&self) -> bool {
        if self.is_block {
            return false;
        }
        self.buffered
            .metadata()
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) == 0)
            .unwrap_or(false)
    }
}

pub(crate) fn is_aligned(addr: usize, offset: u64, len: usize) -> bool {
    addr.is_multiple_of(DIRECT_ALIGN)
        && offset.is_multiple_of(DIRECT_ALIGN as u64)
        && len.is_multiple_of(DIRECT_ALIGN)
        && len > 0
}

/// Some file systems accept O_DIRECT at open and refuse it at the first IO: try one read.
fn probe_direct(f: &File, size: u64) -> bool {
    if size < DIRECT_ALIGN as u64 {
        return false;
    }
    let mut buf = crate::buf::AlignedBuf::new(DIRECT_ALIGN);
    f.read_exact_at(buf.as_mut_slice(), 0).is_ok()
}

impl Member for FileMember {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        let f = self.pick(buf.as_ptr() as usize, offset, buf.len());
        f.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        let f = self.pick(buf.as_ptr() as usize, offset, buf.len());
        f.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.buffered.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len as usize)?;
        let fd = self.buffered.as_raw_fd();
        if self.is_block {
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 through the pointer.
            let rc = unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        } else {
            // SAFETY: plain syscall on an owned descriptor.
            let rc = unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            };
            if rc != 0 {
                let e = io::Error::last_os_error();
                // No hole punching here: discard is advisory, so fall back to writing zeros.
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    let zeros = vec![0u8; len.min(1 << 20) as usize];
                    let mut done = 0;
                    while done < len {
                        let n = (len - done).min(zeros.len() as u64) as usize;
                        self.buffered.write_all_at(&zeros[..n], offset + done)?;
                        done += n as u64;
                    }
                    return Ok(());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn as_file(&self) -> Option<&FileMember> {
        Some(self)
    }

    fn known_zero(&self) -> bool {
        self.is_all_hole()
    }

    /// From the open descriptor, so that any path to the file gives the same answer.
    fn device_id(&self) -> crate::identity::DeviceId {
        use std::os::unix::fs::MetadataExt;
        match self.buffered.metadata() {
            Ok(m) if self.is_block => crate::identity::DeviceId::Block { rdev: m.rdev() },
            Ok(m) => crate::identity::DeviceId::File {
                dev: m.dev(),
                ino: m.ino(),
            },
            Err(_) => crate::identity::DeviceId::Named(self.name()),
        }
    }
}
