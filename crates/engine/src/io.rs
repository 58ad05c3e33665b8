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
    Uring,
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

fn run_uring(ops: &mut [Op<'_>], results: &mut [Option<io::Result<()>>]) -> io::Result<()> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(RING_ENTRIES)?);
        }
        let ring = slot.as_mut().expect("ring");
        let idx: Vec<usize> = (0..ops.len())
            .filter(|&i| ops[i].member.as_file().is_some())
            .collect();
        for chunk in idx.chunks(RING_ENTRIES as usize) {
            for &i in chunk {
                let op = &mut ops[i];
                let file = op.member.as_file().expect("file member");
                let (ptr, len, write) = match &mut op.buf {
                    OpBuf::Read(b) => (b.as_mut_ptr(), b.len(), false),
                    OpBuf::Write(b) => (b.as_ptr() as *mut u8, b.len(), true),
                };
                if op
                    .offset
                    .checked_add(len as u64)
                    .is_none_or(|e| e > file.size_bytes())
                {
                    // Let the synchronous path produce the range error.
                    continue;
                }
                let fd = types::Fd(file.fd_for(ptr as usize, op.offset, len));
                let entry = if write {
                    opcode::Write::new(fd, ptr, len as u32)
                        .offset(op.offset)
                        .build()
                } else {
                    opcode::Read::new(fd, ptr, len as u32)
                        .offset(op.offset)
                        .build()
                }
                .user_data(i as u64);
                // SAFETY: the buffer outlives the submission: we wait for every completion
                // below before returning, and the ring is never shared across threads.
                unsafe {
                    ring.submission()
                        .push(&entry)
                        .map_err(|_| io::Error::other("submission queue full"))?;
                }
                results[i] = Some(Ok(())); // placeholder until completion
            }
            let submitted = chunk.iter().filter(|&&i| results[i].is_some()).count();
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
                    let i = cqe.user_data() as usize;
                    let res = cqe.result();
                    let want = match &ops[i].buf {
                        OpBuf::Read(b) => b.len(),
                        OpBuf::Write(b) => b.len(),
                    };
                    results[i] = if res < 0 {
                        Some(Err(io::Error::from_raw_os_error(-res)))
                    } else if (res as usize) < want {
                        // Short transfer: finish it synchronously.
                        None
                    } else {
                        Some(Ok(()))
                    };
                    done += 1;
                }
            }
        }
        Ok(())
    })
}
