//! Which engine runs a file member's IO: io_uring or pread/pwrite, chosen per member when it
//! is opened, unless the process forces one for all ([`set_io_engine`], `--io-engine`).
//!
//! Per member, because the fast choice depends on where the member lives: a block device or
//! an O_DIRECT file waits on the device, and io_uring keeps several such IOs in flight; a
//! file on tmpfs or in the page cache (no O_DIRECT) is a memory copy, which pread does in the
//! calling thread, while the ring adds a submission and a completion around the same copy
//! (measured on tmpfs files, the whole stack with io_uring against sync: raid1 0.82x against
//! 1.16x of nbdkit's memory plugin, raid5 0.56x against 1.07x).

use std::sync::atomic::{AtomicU8, Ordering};

/// An IO engine for file and block-device members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEngine {
    /// io_uring, batched per request.
    Uring,
    /// Synchronous pread/pwrite.
    Sync,
}

impl IoEngine {
    /// The name `detail` prints: `io_uring` or `sync`.
    pub fn name(self) -> &'static str {
        match self {
            IoEngine::Uring => "io_uring",
            IoEngine::Sync => "sync",
        }
    }

    /// The engine a member opened this way runs on when nothing is forced: pread/pwrite on
    /// tmpfs and for buffered (page cache) files, io_uring for block devices and O_DIRECT.
    pub fn for_member(is_block: bool, direct: bool, on_tmpfs: bool) -> IoEngine {
        if !on_tmpfs && (is_block || direct) {
            IoEngine::Uring
        } else {
            IoEngine::Sync
        }
    }
}

impl std::fmt::Display for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// 0: each member's own choice; 1: io_uring forced; 2: sync forced (or io_uring failed).
static FORCED: AtomicU8 = AtomicU8::new(0);

/// Force an IO engine on every file member of this process (`--io-engine`).
pub fn set_io_engine(e: IoEngine) {
    let v = match e {
        IoEngine::Uring => 1,
        IoEngine::Sync => 2,
    };
    FORCED.store(v, Ordering::Relaxed);
}

/// Let each file member run on its own choice again (the default; `--io-engine auto`).
pub fn set_io_engine_per_member() {
    FORCED.store(0, Ordering::Relaxed);
}

/// The engine forced on every member, if any: by [`set_io_engine`], or sync after io_uring
/// could not be set up in this process.
pub fn io_engine_forced() -> Option<IoEngine> {
    match FORCED.load(Ordering::Relaxed) {
        1 => Some(IoEngine::Uring),
        2 => Some(IoEngine::Sync),
        _ => None,
    }
}

/// Whether file IO may use io_uring at all: io_uring unless sync is forced. Each member
/// then runs on [`io_engine_forced`] or its own choice.
pub fn io_engine() -> IoEngine {
    io_engine_forced().unwrap_or(IoEngine::Uring)
}

/// Whether the file system of `f` is tmpfs (statfs f_type TMPFS_MAGIC).
pub(crate) fn on_tmpfs(f: &std::fs::File) -> bool {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fstatfs fills the struct it is given; zeroed is a valid statfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out pointer.
    let rc = unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) };
    rc == 0 && st.f_type == libc::TMPFS_MAGIC
}
