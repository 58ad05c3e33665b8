//! File and block-device members: O_DIRECT where the file system allows it (with a buffered
//! descriptor beside it for unaligned IO), and io_uring for batched IO (see [`crate::io`]).

use crate::io_engine::{io_engine_forced, on_tmpfs, IoEngine};
use crate::member::{write_zero_buffers, Batch, Member, MemberOp, ZeroHow};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// md's devices_handle_discard_safely (a raid456 module parameter): the administrator
/// asserts that a discard on any block-device member reads back zeros, which the device
/// cannot report itself (a SCSI disk without LBPRZ that still unmaps). Block devices then
/// discard with BLKDISCARD and count as zeroing discards for the levels with redundancy.
static DEVICES_HANDLE_DISCARD_SAFELY: AtomicBool = AtomicBool::new(false);

/// Set md's devices_handle_discard_safely for every block-device member of this process.
pub fn set_devices_handle_discard_safely(on: bool) {
    DEVICES_HANDLE_DISCARD_SAFELY.store(on, Ordering::Relaxed);
}

fn discard_safely() -> bool {
    DEVICES_HANDLE_DISCARD_SAFELY.load(Ordering::Relaxed)
}

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

/// A member on a regular file or a block device: O_DIRECT through io_uring where the
/// file system allows it (see [`DirectMode`]), buffered otherwise.
pub struct FileMember {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    size_bytes: u64,
    is_block: bool,
    /// A block device that reports discarded blocks to read back as zeros.
    discard_zeroes: bool,
    /// A block device with a write-zeroes offload (it zeroes, and may unmap, without
    /// transferring zeros).
    zeroes_offload: bool,
    /// fallocate modes not refused (EOPNOTSUPP) so far: a refusal is remembered, so that
    /// fast zeroing is only claimed where it works.
    punch_ok: AtomicBool,
    zero_range_ok: AtomicBool,
    /// The engine chosen at open (see [`IoEngine::for_member`]); a forced one wins.
    engine: IoEngine,
    /// A loop device's backing file, which says where it was never written (SEEK_DATA);
    /// `None` for files and for every other block device.
    backing: Option<LoopBacking>,
    /// Writes through the buffered descriptor of a loop device may sit in the device's
    /// page cache, where the backing file cannot see them: set after each such write
    /// completes (and at open, for what others left there), taken by [`Member::is_hole`],
    /// which writes them back before it asks the backing file.
    buffered_dirty: AtomicBool,
}

/// Where a loop device keeps its bytes: the backing file (checked to be the one the loop
/// device holds, by device and inode) and the byte of it where this member starts.
struct LoopBacking {
    file: File,
    offset: u64,
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;
const BLKDISCARDZEROES: libc::c_ulong = 0x127c;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4c05;

/// The loop driver's `struct loop_info64` (linux/loop.h), as LOOP_GET_STATUS64 fills it.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// The sysfs directory of the block device `meta` describes.
fn sysfs_block_dir(meta: &std::fs::Metadata) -> PathBuf {
    let rdev = std::os::unix::fs::MetadataExt::rdev(meta);
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}"))
}

/// The backing file of a loop device or of a partition of one, opened read-only for
/// SEEK_DATA; `None` for any other block device, or where the file the loop device names
/// cannot be opened or is not the one it holds (deleted, replaced, another mount
/// namespace): such a member then says nothing about holes, which is always safe.
fn loop_backing(dev: &File, meta: &std::fs::Metadata) -> Option<LoopBacking> {
    use std::os::unix::fs::MetadataExt;
    let mut dir = sysfs_block_dir(meta);
    let mut start = 0u64;
    if let Ok(s) = std::fs::read_to_string(dir.join("start")) {
        // A partition: its start in 512-byte sectors, and its disk one directory up.
        start = s.trim().parse::<u64>().ok()?.checked_mul(512)?;
        dir = dir.join("..");
    }
    let name = std::fs::read_to_string(dir.join("loop/backing_file")).ok()?;
    let name = name.trim_end_matches('\n');
    if name.ends_with(" (deleted)") {
        return None;
    }
    // SAFETY: all-zero is a valid LoopInfo64 (integers and byte arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: LOOP_GET_STATUS64 writes one struct loop_info64 through the pointer.
    if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64, &mut info) } != 0 {
        return None;
    }
    let file = File::open(name).ok()?;
    let m = file.metadata().ok()?;
    (m.dev() == info.device && m.ino() == info.inode).then_some(())?;
    Some(LoopBacking {
        file,
        offset: info.offset.checked_add(start)?,
    })
}

/// SEEK_DATA on `file` from `offset`: whether the next data starts at or after the range's
/// end (ENXIO: none after `offset`); a file system without SEEK_DATA says no.
fn seek_data_says_hole(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    let Ok(off) = libc::off_t::try_from(offset) else {
        return Ok(false);
    };
    // SAFETY: lseek on a descriptor the caller owns; it moves only that descriptor's file
    // offset, which no IO here uses (every read and write is positioned).
    let next = unsafe { libc::lseek(file.as_raw_fd(), off, libc::SEEK_DATA) };
    if next < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(true),
            // A file system without SEEK_DATA: unknown.
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(next as u64 >= offset.saturating_add(len))
}

/// The size of an open regular file, or of a block device (BLKGETSIZE64); anything else
/// is refused, naming `path`. For every member opened from a path ([`FileMember`] and the
/// overlay's read-only file).
pub(crate) fn file_or_device_bytes(
    file: &File,
    meta: &std::fs::Metadata,
    path: &Path,
) -> io::Result<u64> {
    if meta.file_type().is_block_device() {
        let mut sz: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut sz) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sz)
    } else if meta.file_type().is_file() {
        Ok(meta.len())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a regular file or block device", path.display()),
        ))
    }
}

impl FileMember {
    /// Opens `path` for reading and writing.
    pub fn open(path: &Path, mode: DirectMode) -> io::Result<FileMember> {
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let meta = buffered.metadata()?;
        let is_block = meta.file_type().is_block_device();
        let size_bytes = file_or_device_bytes(&buffered, &meta, path)?;
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
        let discard_zeroes = is_block && {
            let mut z: libc::c_uint = 0;
            // SAFETY: BLKDISCARDZEROES writes one unsigned int through the pointer.
            let rc = unsafe { libc::ioctl(buffered.as_raw_fd(), BLKDISCARDZEROES, &mut z) };
            rc == 0 && z == 1
        };
        let zeroes_offload = is_block && write_zeroes_offload(&meta);
        let engine = IoEngine::for_member(is_block, direct.is_some(), on_tmpfs(&buffered));
        let backing = if is_block {
            loop_backing(&buffered, &meta)
        } else {
            None
        };
        Ok(FileMember {
            buffered_dirty: AtomicBool::new(backing.is_some()),
            backing,
            path: path.to_path_buf(),
            buffered,
            direct,
            size_bytes,
            is_block,
            discard_zeroes,
            zeroes_offload,
            punch_ok: AtomicBool::new(true),
            zero_range_ok: AtomicBool::new(true),
            engine,
        })
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: plain syscall on an owned descriptor.
        let rc = unsafe {
            libc::fallocate(
                self.buffered.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether IO goes through O_DIRECT.
    pub fn uses_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The engine its batched IO runs on: the one forced on the process, else the one
    /// chosen at open (sync on tmpfs and without O_DIRECT, io_uring otherwise).
    pub fn engine(&self) -> IoEngine {
        io_engine_forced().unwrap_or(self.engine)
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

    /// Whether the whole file is a hole (a fresh sparse file reads as zeros), or the whole
    /// of a loop device is a hole in its backing file.
    pub fn is_all_hole(&self) -> bool {
        if self.is_block {
            return self.backing.is_some() && self.is_hole(0, self.size_bytes).unwrap_or(false);
        }
        self.buffered
            .metadata()
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) == 0)
            .unwrap_or(false)
    }
}

/// Whether a block device offloads write-zeroes: sysfs `queue/write_zeroes_max_bytes` above
/// zero (a partition asks its disk).
fn write_zeroes_offload(meta: &std::fs::Metadata) -> bool {
    let dev = sysfs_block_dir(meta);
    let dev = dev.display();
    [
        format!("{dev}/queue/write_zeroes_max_bytes"),
        format!("{dev}/../queue/write_zeroes_max_bytes"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| s.trim().parse::<u64>().ok())
    .is_some_and(|n| n > 0)
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

    /// Files, and loop devices whose backing file was found; not other block devices.
    fn tells_holes(&self) -> bool {
        !self.is_block || self.backing.is_some()
    }

    /// SEEK_DATA from `offset`: a hole when the next data starts at or after the range's
    /// end. A loop device asks its backing file, after writing back what it wrote through
    /// its page cache; other block devices do not say (false).
    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        if len == 0 {
            return Ok(false);
        }
        if !self.is_block {
            return seek_data_says_hole(&self.buffered, offset, len);
        }
        let Some(b) = &self.backing else {
            return Ok(false);
        };
        if self.buffered_dirty.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.buffered.sync_data() {
                self.buffered_dirty.store(true, Ordering::Release);
                return Err(e);
            }
        }
        match b.offset.checked_add(offset) {
            Some(at) => seek_data_says_hole(&b.file, at, len),
            None => Ok(false),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        let f = self.pick(buf.as_ptr() as usize, offset, buf.len());
        f.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        let f = self.pick(buf.as_ptr() as usize, offset, buf.len());
        let r = f.write_all_at(buf, offset);
        if self.backing.is_some() && std::ptr::eq(f, &self.buffered) {
            // After the write, never before: see `buffered_dirty`.
            self.buffered_dirty.store(true, Ordering::Release);
        }
        r
    }

    fn flush(&self) -> io::Result<()> {
        self.buffered.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len as usize)?;
        if self.is_block && self.zeroes_offload && !self.discard_zeroes && !discard_safely() {
            // fallocate PUNCH_HOLE on a block device is the write-zeroes offload with unmap
            // allowed, and never falls back to writing zeros: fast, and reads back zeros.
            return self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            );
        }
        if self.is_block {
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 through the pointer.
            let rc = unsafe { libc::ioctl(self.buffered.as_raw_fd(), BLKDISCARD, range.as_ptr()) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            return Ok(());
        }
        // A file reads a punched hole as zeros; without hole punching, write them, so that
        // discard_zeroes holds either way.
        self.write_zeroes(offset, len, ZeroHow { unmap: true })
    }

    fn discard_zeroes(&self) -> bool {
        !self.is_block || self.discard_zeroes || self.zeroes_offload || discard_safely()
    }

    /// Files and block devices alike: fallocate PUNCH_HOLE (may unmap) or ZERO_RANGE (keeps
    /// the blocks allocated, NBD's NO_HOLE); on a block device the kernel turns these into
    /// a zeroing offload. Refused: BLKZEROOUT on a block device (the kernel writes zeros if
    /// the device has no offload), zero buffers on a file.
    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroHow) -> io::Result<()> {
        self.check_range(offset, len as usize)?;
        if len == 0 {
            return Ok(());
        }
        let (flag, mode) = if how.unmap {
            (
                &self.punch_ok,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            )
        } else {
            (
                &self.zero_range_ok,
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            )
        };
        if flag.load(Ordering::Relaxed) {
            match self.fallocate(mode, offset, len) {
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    flag.store(false, Ordering::Relaxed)
                }
                r => return r,
            }
        }
        if self.is_block {
            let range = [offset, len];
            // SAFETY: BLKZEROOUT reads two u64 through the pointer.
            let rc = unsafe { libc::ioctl(self.buffered.as_raw_fd(), BLKZEROOUT, range.as_ptr()) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            return Ok(());
        }
        write_zero_buffers(self, offset, len)
    }

    /// A file whose file system has not refused the fallocate mode; a block device with a
    /// write-zeroes offload.
    fn zeroes_fast(&self, unmap: bool) -> bool {
        if self.is_block {
            return self.zeroes_offload;
        }
        if unmap {
            self.punch_ok.load(Ordering::Relaxed)
        } else {
            self.zero_range_ok.load(Ordering::Relaxed)
        }
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    /// Queues every op for the batch's io_uring submission (see [`crate::io`]), or runs it
    /// with pread/pwrite here when this member's engine is sync.
    fn submit<'a>(&'a self, ops: &mut [MemberOp<'a>], batch: &mut Batch<'a>) {
        let sync = self.engine() == IoEngine::Sync;
        for op in ops.iter_mut().filter(|o| !o.is_complete()) {
            let fd = self.fd_for(op.addr(), op.offset, op.len());
            // A loop device's buffered write runs here, so that `write_at` marks the page
            // cache dirty once it is done (the ring completes it out of this member's sight).
            let buffered_loop_write =
                self.backing.is_some() && op.is_write() && fd == self.buffered.as_raw_fd();
            if sync || buffered_loop_write {
                op.run_sync(self);
                continue;
            }
            batch.queue_fd(self, fd, op);
        }
    }

    fn known_zero(&self) -> bool {
        self.is_all_hole()
    }

    fn io_engine(&self) -> Option<IoEngine> {
        Some(self.engine())
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

#[cfg(test)]
mod tests {
    use super::file_or_device_bytes;
    use std::path::PathBuf;

    #[test]
    fn sizes_a_file_and_refuses_what_is_neither_file_nor_block_device() {
        let dir = std::env::temp_dir().join(format!("uraid-file-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.img");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(3 << 20).unwrap();
        let bytes = file_or_device_bytes(&f, &f.metadata().unwrap(), &p).unwrap();
        assert_eq!(bytes, 3 << 20);
        for odd in [dir.clone(), PathBuf::from("/dev/null")] {
            let f = std::fs::File::open(&odd).unwrap();
            let e = file_or_device_bytes(&f, &f.metadata().unwrap(), &odd).unwrap_err();
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::InvalidInput,
                "{}",
                odd.display()
            );
            assert!(e.to_string().contains(&odd.display().to_string()), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
