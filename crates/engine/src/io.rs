//! Batched member IO, as the engine runs it: one request's member reads or writes go out
//! together. Public for embedders that write their own [`Member`] wrappers and want to see
//! a batch go through them.
//!
//! [`execute`] hands each member its ops through [`Member::submit`] (submit), then runs
//! what file members queued on a per-thread io_uring and waits for it (complete), so the
//! IOs of one stripe run in parallel on the members. A wrapping member (fault injection,
//! read-only, a simulated or remote disk) sees every op at submit, may complete some itself
//! (an injected error, a refused write) and forwards the rest to its inner member, so a
//! wrapper over a file keeps io_uring. Members without a batch path (memory) run their
//! synchronous methods at submit. Where io_uring is unavailable (old kernel, seccomp)
//! everything falls back to pread/pwrite, once and for all.

pub use crate::member::OpBuf;
use crate::member::{Batch, FileIo, Member, MemberOp};
use io_uring::{opcode, types, IoUring};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::io;
use std::os::unix::io::RawFd;

/// One member IO.
pub struct Op<'a> {
    /// The member it goes to.
    pub member: &'a dyn Member,
    /// Byte offset on the member.
    pub offset: u64,
    /// What to read into or write.
    pub buf: OpBuf<'a>,
}

impl<'a> Op<'a> {
    /// Read `buf.len()` bytes at `offset` of `member`.
    pub fn read(member: &'a dyn Member, offset: u64, buf: &'a mut [u8]) -> Op<'a> {
        Op {
            member,
            offset,
            buf: OpBuf::Read(buf),
        }
    }

    /// Write `buf` at `offset` of `member`.
    pub fn write(member: &'a dyn Member, offset: u64, buf: &'a [u8]) -> Op<'a> {
        Op {
            member,
            offset,
            buf: OpBuf::Write(buf),
        }
    }
}

thread_local! {
    /// File IOs this thread completed through io_uring (see [`uring_ios_on_this_thread`]).
    static URING_IOS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many member IOs this thread has run through io_uring: tells a test that a wrapping
/// member's ops reached the ring. A thread-local count, so it costs no shared cache line.
pub fn uring_ios_on_this_thread() -> u64 {
    URING_IOS.with(|c| c.get())
}

pub use crate::io_engine::{
    io_engine, io_engine_forced, set_io_engine, set_io_engine_per_member, IoEngine,
};

const RING_ENTRIES: u32 = 256;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Run all ops; returns one result per op, in order.
pub fn execute(ops: &mut [Op<'_>]) -> Vec<io::Result<()>> {
    execute_inline(ops).into_vec()
}

/// Member IOs of one request kept inline: a stripe's worth (raid6 on 6 members reads or
/// writes at most 6 blocks a row) needs no heap allocation.
pub(crate) const INLINE_OPS: usize = 8;

/// Results of a request's member IOs, inline up to a stripe's worth.
pub(crate) type Results = SmallVec<[io::Result<()>; INLINE_OPS]>;

/// [`execute`] without a heap allocation for a request's few ops: the engine's own path.
pub(crate) fn execute_inline(ops: &mut [Op<'_>]) -> Results {
    if let [op] = ops {
        // One op never uses the ring, and a member's submit does for one op what read_at
        // or write_at does: skip building a batch.
        let mut one = Results::new();
        one.push(match &mut op.buf {
            OpBuf::Read(b) => op.member.read_at(b, op.offset),
            OpBuf::Write(b) => op.member.write_at(b, op.offset),
        });
        return one;
    }
    let mut batch = Batch::new(ops.len() > 1 && io_engine() == IoEngine::Uring);
    let mut mops: SmallVec<[MemberOp<'_>; INLINE_OPS]> = SmallVec::with_capacity(ops.len());
    for (index, op) in ops.iter_mut().enumerate() {
        let buf = match &mut op.buf {
            OpBuf::Read(b) => OpBuf::Read(b),
            OpBuf::Write(b) => OpBuf::Write(b),
        };
        mops.push(MemberOp {
            offset: op.offset,
            buf,
            issued_to: op.member,
            index,
            result: None,
        });
    }
    // Submit: each run of ops on one member goes to it as one slice.
    let mut start = 0;
    while start < mops.len() {
        let member = mops[start].issued_to;
        let mut end = start + 1;
        while end < mops.len() && std::ptr::addr_eq(mops[end].issued_to, member) {
            end += 1;
        }
        member.submit(&mut mops[start..end], &mut batch);
        start = end;
    }
    // Complete: one queued file IO runs as pread/pwrite, more go through the ring.
    if batch.files.len() > 1 {
        if let Err(e) = run_uring(&mut mops, &mut batch.files) {
            // The ring could not be set up: never try again in this process.
            tracing::debug!("io_uring unavailable ({e}); using pread/pwrite");
            set_io_engine(IoEngine::Sync);
        }
    }
    for f in &batch.files {
        let op = &mut mops[f.index];
        if op.result.is_none() {
            let saved = op.offset;
            op.offset = f.offset;
            op.run_sync(f.dev);
            op.offset = saved;
        }
    }
    // Ops started at submit on remote members: their replies, now that all are sent.
    for (index, finish) in batch.later.drain(..) {
        finish(&mut mops[index]);
    }
    mops.into_iter()
        .map(|m| {
            m.result
                .expect("every op completed at submit or by the ring")
        })
        .collect()
}

/// Largest merged IO, and most pieces in one merged IO.
const MERGE_MAX_BYTES: usize = 8 << 20;
const MERGE_MAX_IOVECS: usize = 256;

/// One submission: queued file IOs `first..first + count` (after sorting) merged into one
/// (vectored) IO; its iovecs, if more than one piece, start at `iov`.
struct Group {
    first: usize,
    count: usize,
    iov: usize,
    fd: RawFd,
    offset: u64,
    len: usize,
    write: bool,
}

fn buf_ptr(op: &mut MemberOp<'_>) -> *mut u8 {
    match &mut op.buf {
        OpBuf::Read(b) => b.as_mut_ptr(),
        OpBuf::Write(b) => b.as_ptr() as *mut u8,
    }
}

/// Merge queued IOs on the same descriptor whose ranges touch into one readv/writev, so
/// that a request's pieces on one member (consecutive chunks, batched stripes) become one
/// large IO. Sorts `files`.
fn plan_groups(files: &mut [FileIo<'_>]) -> Vec<Group> {
    files.sort_by_key(|f| (f.fd, f.write, f.offset));
    let mut groups: Vec<Group> = Vec::new();
    let mut iov = 0;
    for (i, f) in files.iter().enumerate() {
        if let Some(g) = groups.last_mut() {
            if g.fd == f.fd
                && g.write == f.write
                && g.offset + g.len as u64 == f.offset
                && g.len + f.len <= MERGE_MAX_BYTES
                && g.count < MERGE_MAX_IOVECS
            {
                if g.count == 1 {
                    g.iov = iov;
                    iov += 1;
                }
                g.count += 1;
                g.len += f.len;
                iov += 1;
                continue;
            }
        }
        groups.push(Group {
            first: i,
            count: 1,
            iov: 0,
            fd: f.fd,
            offset: f.offset,
            len: f.len,
            write: f.write,
        });
    }
    groups
}

fn run_uring(mops: &mut [MemberOp<'_>], files: &mut [FileIo<'_>]) -> io::Result<()> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(RING_ENTRIES)?);
        }
        let ring = slot.as_mut().expect("ring");
        let groups = plan_groups(files);
        // iovecs of the merged groups, one array for all: filled before any pointer into
        // it is taken, and it stays put until every IO completes.
        let mut iovecs: Vec<libc::iovec> = Vec::new();
        for g in groups.iter().filter(|g| g.count > 1) {
            debug_assert_eq!(iovecs.len(), g.iov);
            for f in &files[g.first..g.first + g.count] {
                iovecs.push(libc::iovec {
                    iov_base: buf_ptr(&mut mops[f.index]) as *mut libc::c_void,
                    iov_len: f.len,
                });
            }
        }
        let mut ran = 0u64;
        for (chunk_no, chunk) in groups.chunks(RING_ENTRIES as usize).enumerate() {
            let base = chunk_no * RING_ENTRIES as usize;
            for (k, g) in chunk.iter().enumerate() {
                let fd = types::Fd(g.fd);
                let entry = if g.count == 1 {
                    let ptr = buf_ptr(&mut mops[files[g.first].index]);
                    if g.write {
                        opcode::Write::new(fd, ptr, g.len as u32)
                            .offset(g.offset)
                            .build()
                    } else {
                        opcode::Read::new(fd, ptr, g.len as u32)
                            .offset(g.offset)
                            .build()
                    }
                } else {
                    let iov = &iovecs[g.iov..g.iov + g.count];
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
                .user_data((base + k) as u64);
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
                    for f in &files[g.first..g.first + g.count] {
                        mops[f.index].result = if res < 0 && g.count == 1 {
                            Some(Err(io::Error::from_raw_os_error(-res)))
                        } else if res < 0 || (res as usize) < g.len {
                            // A merged IO failed, or a transfer came up short: redo each
                            // piece on its own so every error lands on its own piece.
                            None
                        } else {
                            Some(Ok(()))
                        };
                    }
                    ran += g.count as u64;
                    done += 1;
                }
            }
        }
        URING_IOS.with(|c| c.set(c.get() + ran));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::AlignedBuf;
    use crate::file::{DirectMode, FileMember};
    use crate::member::{MemMember, ReadOnlyMember};
    use std::sync::Arc;

    /// A pass-through wrapper that forwards batches (as every wrapper should).
    struct Forwards(Arc<dyn Member>);
    /// A pass-through wrapper without a batch path: its ops run synchronously.
    struct Plain(Arc<dyn Member>);

    impl Member for Forwards {
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            self.0.flush()
        }
        fn submit<'a>(&'a self, ops: &mut [MemberOp<'a>], batch: &mut Batch<'a>) {
            self.0.submit(ops, batch)
        }
        fn name(&self) -> String {
            self.0.name()
        }
    }

    impl Member for Plain {
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            self.0.flush()
        }
        fn name(&self) -> String {
            self.0.name()
        }
    }

    fn files(tag: &str, n: usize) -> Vec<Arc<dyn Member>> {
        let dir = std::env::temp_dir().join(format!("uraid-io-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        (0..n)
            .map(|i| {
                let p = dir.join(format!("m{i}"));
                std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
                Arc::new(FileMember::open(&p, DirectMode::Off).unwrap()) as Arc<dyn Member>
            })
            .collect()
    }

    fn pattern(seed: u8) -> AlignedBuf {
        let mut b = AlignedBuf::new(8192);
        for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
            *x = seed.wrapping_add(i as u8);
        }
        b
    }

    /// Write a pattern through `wrap` onto two files and read it back, in two batches;
    /// returns how many of those IOs ran on the ring.
    fn round_trip(wrap: impl Fn(Arc<dyn Member>) -> Arc<dyn Member>, tag: &str) -> u64 {
        set_io_engine(IoEngine::Uring);
        let f = files(tag, 2);
        let w: Vec<Arc<dyn Member>> = f.iter().cloned().map(wrap).collect();
        let (a, b) = (pattern(1), pattern(2));
        let before = uring_ios_on_this_thread();
        let mut ops = vec![
            Op::write(w[0].as_ref(), 4096, &a),
            Op::write(w[1].as_ref(), 0, &b),
            // Two ops touching on one member: merged into one writev.
            Op::write(w[1].as_ref(), 8192, &a),
        ];
        assert!(execute(&mut ops).iter().all(|r| r.is_ok()));
        let (mut ra, mut rb, mut rc) = (
            AlignedBuf::new(8192),
            AlignedBuf::new(8192),
            AlignedBuf::new(8192),
        );
        let mut ops = vec![
            Op::read(w[0].as_ref(), 4096, ra.as_mut_slice()),
            Op::read(w[1].as_ref(), 0, rb.as_mut_slice()),
            Op::read(w[1].as_ref(), 8192, rc.as_mut_slice()),
        ];
        assert!(execute(&mut ops).iter().all(|r| r.is_ok()));
        assert_eq!(&ra[..], &a[..]);
        assert_eq!(&rb[..], &b[..]);
        assert_eq!(&rc[..], &a[..]);
        // What landed on the files themselves.
        let mut raw = vec![0u8; 8192];
        f[1].read_at(&mut raw, 8192).unwrap();
        assert_eq!(&raw[..], &a[..]);
        uring_ios_on_this_thread() - before
    }

    #[test]
    fn a_wrapper_that_forwards_batches_reaches_io_uring() {
        let direct = round_trip(|m| m, "direct");
        if io_engine() != IoEngine::Uring {
            // The ring could not be set up here (seccomp, old kernel): nothing to compare.
            uraid_testkit::skip("a_wrapper_that_forwards_batches", "io_uring unavailable");
            return;
        }
        assert_eq!(direct, 6, "bare files: every op on the ring");
        assert_eq!(round_trip(|m| Arc::new(Forwards(m)), "forwards"), 6);
        assert_eq!(
            round_trip(|m| Arc::new(Forwards(Arc::new(Forwards(m)))), "nested"),
            6,
            "wrappers stacked two deep"
        );
        assert_eq!(
            round_trip(|m| Arc::new(Plain(m)), "plain"),
            0,
            "a wrapper without submit runs its ops synchronously"
        );
    }

    #[test]
    fn read_only_wrapper_refuses_writes_per_op_and_reads_on_the_ring() {
        set_io_engine(IoEngine::Uring);
        let f = files("ro", 2);
        let a = pattern(7);
        f[0].write_at(&a, 0).unwrap();
        f[1].write_at(&a, 0).unwrap();
        let ro: Vec<Arc<dyn Member>> = f
            .iter()
            .map(|m| Arc::new(ReadOnlyMember(m.clone())) as Arc<dyn Member>)
            .collect();
        let before = uring_ios_on_this_thread();
        let (mut r0, mut r1) = (AlignedBuf::new(8192), AlignedBuf::new(8192));
        let junk = pattern(9);
        let mut ops = vec![
            Op::read(ro[0].as_ref(), 0, r0.as_mut_slice()),
            Op::write(ro[0].as_ref(), 8192, &junk),
            Op::read(ro[1].as_ref(), 0, r1.as_mut_slice()),
            Op::write(ro[1].as_ref(), 0, &junk),
        ];
        let res = execute(&mut ops);
        assert!(res[0].is_ok() && res[2].is_ok());
        for r in [&res[1], &res[3]] {
            let e = r.as_ref().expect_err("a write through a read-only member");
            assert_eq!(e.kind(), io::ErrorKind::ReadOnlyFilesystem);
        }
        assert_eq!(&r0[..], &a[..]);
        assert_eq!(&r1[..], &a[..]);
        let mut raw = AlignedBuf::new(8192);
        f[1].read_at(raw.as_mut_slice(), 0).unwrap();
        assert_eq!(&raw[..], &a[..], "the refused write did not reach the file");
        if io_engine() == IoEngine::Uring {
            assert_eq!(
                uring_ios_on_this_thread() - before,
                2,
                "the reads ran on the ring"
            );
        } else {
            uraid_testkit::skip("read_only_wrapper_on_the_ring", "io_uring unavailable");
        }
    }

    /// A member whose IO "runs elsewhere": it starts each op at submit and completes it
    /// later, logging both, over a memory member.
    struct Remote {
        inner: MemMember,
        log: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Member for Remote {
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.inner.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn submit<'a>(&'a self, ops: &mut [MemberOp<'a>], batch: &mut Batch<'a>) {
            for op in ops.iter_mut() {
                self.log
                    .lock()
                    .unwrap()
                    .push(format!("send {}", self.name()));
                batch.complete_later(op, move |op: &mut MemberOp<'a>| {
                    self.log
                        .lock()
                        .unwrap()
                        .push(format!("reply {}", self.name()));
                    op.run_sync(&self.inner);
                });
            }
        }
        fn name(&self) -> String {
            self.inner.name()
        }
    }

    #[test]
    fn ops_completed_later_are_all_sent_before_any_reply_is_awaited() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let m: Vec<Remote> = ["a", "b"]
            .iter()
            .map(|n| Remote {
                inner: MemMember::new(*n, 1 << 20),
                log: log.clone(),
            })
            .collect();
        let (x, y) = (pattern(3), pattern(4));
        let mut ops = vec![Op::write(&m[0], 0, &x), Op::write(&m[1], 4096, &y)];
        assert!(execute(&mut ops).iter().all(|r| r.is_ok()));
        let mut back = AlignedBuf::new(8192);
        let mut ops = vec![
            Op::read(&m[0], 0, back.as_mut_slice()),
            Op::write(&m[1], 16384, &x),
        ];
        assert!(execute(&mut ops).iter().all(|r| r.is_ok()));
        assert_eq!(&back[..], &x[..], "a read completed later fills its buffer");
        let mut raw = vec![0u8; 8192];
        m[1].inner.read_at(&mut raw, 4096).unwrap();
        assert_eq!(&raw[..], &y[..]);
        let log = log.lock().unwrap().clone();
        assert_eq!(
            log,
            ["send a", "send b", "reply a", "reply b"].repeat(2),
            "every member's submit before the first completion"
        );
    }
}
