//! Batched member IO: one request's member reads or writes go out together.
//!
//! File members are driven through a per-thread io_uring, so the IOs of one stripe run in
//! parallel on the members; other members (memory, fault injectors) run their synchronous
//! methods. Where io_uring is unavailable (old kernel, seccomp) everything falls back to
//! pread/pwrite, once and for all.

use crate::member::Member;
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicU8, Ordering};

/// One member IO.
pub struct Op<'a> {
    pub member: &'a dyn Member,
    pub offset: u64,
    pub buf: OpBuf<'a>,
}

pub enum OpBuf<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

impl<'a> Op<'a> {
    pub fn read(member: &'a dyn Member, offset: u64, buf: &'a mut [u8]) -> Op<'a> {
        Op {
            member,
            offset,
            buf: OpBuf::Read(buf),
        }
    }

    pub fn write(member: &'a dyn Member, offset: u64, buf: &'a [u8]) -> Op<'a> {
        Op {
            member,
            offset,
            buf: OpBuf::Write(buf),
        }
    }

    fn run_sync(&mut self) -> io::Result<()> {
        match &mut self.buf {
            OpBuf::Read(b) => self.member.read_at(b, self.offset),
            OpBuf::Write(b) => self.member.write_at(b, self.offset),
        }
    }
}

/// Which engine runs file IO; chosen once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEngine {
    /// io_uring, batched per request.
    Uring,
    /// Synchronous pread/pwrite.
    Sync,
}

static ENGINE: AtomicU8 = AtomicU8::new(0); // 0 = undecided, 1 = uring, 2 = sync

/// Force an IO engine (e.g. `--io-engine sync` on tmpfs, where pread is faster).
pub fn set_io_engine(e: IoEngine) {
    ENGINE.store(
        match e {
            IoEngine::Uring => 1,
            IoEngine::Sync => 2,
        },
        Ordering::Relaxed,
    );
}

/// The engine in use for file IO.
pub fn io_engine() -> IoEngine {
    match ENGINE.load(Ordering::Relaxed) {
        2 => IoEngine::Sync,
        _ => IoEngine::Uring,
    }
}

const RING_ENTRIES: u32 = 256;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Run all ops; returns one result per op, in order.
pub fn execute(ops: &mut [Op<'_>]) -> Vec<io::Result<()>> {
    let mut results: Vec<Option<io::Result<()>>> = (0..ops.len()).map(|_| None).collect();
    let use_uring = ops.len() > 1
        && io_engine() == IoEngine::Uring
        && ops.iter().filter(|o| o.member.as_file().is_some()).count() > 1;
    if use_uring {
        if let Err(e) = run_uring(ops, &mut results) {
            // The ring could not be set up: never try again in this process.
            tracing::debug!("io_uring unavailable ({e}); using pread/pwrite");
            set_io_engine(IoEngine::Sync);
        }
    }
    for (op, r) in ops.iter_mut().zip(results.iter_mut()) {
        if r.is_none() {
            *r = Some(op.run_sync());
        }
    }
    results.into_iter().map(|r| r.expect("result")).collect()
}

/// Largest merged IO, and most pieces in one merged IO.
const MERGE_MAX_BYTES: usize = 8 << 20;
const MERGE_MAX_IOVECS: usize = 256;

/// One submission: ops `first..` of `order` merged into one (vectored) IO.
struct Group {
    ops: Vec<usize>,
    fd: RawFd,
    offset: u64,
    len: usize,
    write: bool,
}

fn op_parts(op: &mut Op<'_>) -> (*mut u8, usize, bool) {
    match &mut op.buf {
        OpBuf::Read(b) => (b.as_mut_ptr(), b.len(), false),
        OpBuf::Write(b) => (b.as_ptr() as *mut u8, b.len(), true),
    }
}

/// Merge ops on the same descriptor whose ranges touch into one readv/writev, so that a
/// request's pieces on one member (consecutive chunks, batched stripes) become one large IO.
fn plan_groups(ops: &mut [Op<'_>]) -> Vec<Group> {
    let mut cand: Vec<(RawFd, bool, u64, usize, usize)> = Vec::new(); // fd, write, off, len, idx
    for (i, op) in ops.iter_mut().enumerate() {
        let Some(file) = op.member.as_file() else {
            continue;
        };
        let size = file.size_bytes();
        let offset = op.offset;
        let (ptr, len, write) = op_parts(op);
        if len == 0 || offset.checked_add(len as u64).is_none_or(|e| e > size) {
            continue; // the synchronous path reports the range error
        }
        cand.push((
            file.fd_for(ptr as usize, offset, len),
            write,
            offset,
            len,
            i,
        ));
    }
    cand.sort_by_key(|c| (c.0, c.1, c.2));
    let mut groups: Vec<Group> = Vec::new();
    for (fd, write, offset, len, i) in cand {
        if let Some(g) = groups.last_mut() {
            if g.fd == fd
                && g.write == write
                && g.offset + g.len as u64 == offset
                && g.len + len <= MERGE_MAX_BYTES
                && g.ops.len() < MERGE_MAX_IOVECS
            {
                g.ops.push(i);
                g.len += len;
                continue;
            }
        }
        groups.push(Group {
            ops: vec![i],
            fd,
            offset,
            len,
            write,
        });
    }
    groups
}

fn run_uring(ops: &mut [Op<'_>], results: &mut [Option<io::Result<()>>]) -> io::Result<()> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(RING_ENTRIES)?);
        }
        let ring = slot.as_mut().expect("ring");
        let groups = plan_groups(ops);
        // iovec arrays must stay put until their IO completes.
        let iovecs: Vec<Vec<libc::iovec>> = groups
            .iter()
            .map(|g| {
                if g.ops.len() < 2 {
                    return Vec::new();
                }
                g.ops
                    .iter()
                    .map(|&i| {
                        let (ptr, len, _) = op_parts(&mut ops[i]);
                        libc::iovec {
                            iov_base: ptr as *mut libc::c_void,
                            iov_len: len,
                        }
                    })
                    .collect()
            })
            .collect();
        let all: Vec<usize> = (0..groups.len()).collect();
        for chunk in all.chunks(RING_ENTRIES as usize) {
            for &gi in chunk {
                let g = &groups[gi];
                let fd = types::Fd(g.fd);
                let entry = if g.ops.len() == 1 {
                    let (ptr, len, _) = op_parts(&mut ops[g.ops[0]]);
                    if g.write {
                        opcode::Write::new(fd, ptr, len as u32)
                            .offset(g.offset)
                            .build()
                    } else {
                        opcode::Read::new(fd, ptr, len as u32)
                            .offset(g.offset)
                            .build()
                    }
                } else {
                    let iov = &iovecs[gi];
                    if g.write {
                        opcode::Writev::new(fd, iov.as_ptr(), iov.len() as u32)
                            .offset(g.offset)
                            .build()
                    } else {
                        opcode::Readv::new(fd, iov.as_ptr(), iov.len() as u32)
                            .offset(g.offset)
                            .build()
                    }
                }
                .user_data(gi as u64);
                // SAFETY: buffers and iovecs outlive the submission: we wait for every
                // completion below before returning, and the ring is never shared.
                unsafe {
                    ring.submission()
                        .push(&entry)
                        .map_err(|_| io::Error::other("submission queue full"))?;
                }
            }
            let submitted = chunk.len();
            let mut done = 0;
            while done < submitted {
                match ring.submit_and_wait(submitted - done) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => {
                        // Buffers are still in flight: unwinding would free memory the
                        // kernel may write into. This cannot happen with our ring sizes.
                        eprintln!("uraid: io_uring wait failed with IO in flight: {e}");
                        std::process::abort();
                    }
                }
                for cqe in ring.completion() {
                    let g = &groups[cqe.user_data() as usize];
                    let res = cqe.result();
                    for &i in &g.ops {
                        results[i] = if res < 0 && g.ops.len() == 1 {
                            Some(Err(io::Error::from_raw_os_error(-res)))
                        } else if res < 0 || (res as usize) < g.len {
                            // A merged IO failed, or a transfer came up short: redo each
                            // piece on its own so every error lands on its own piece.
                            None
                        } else {
                            Some(Ok(()))
                        };
                    }
                    done += 1;
                }
            }
        }
        Ok(())
    })
}
