//! Transmission phase of one connection.
//!
//! Workers take turns as the reader (leader/followers, as nbdkit does): a
//! worker locks the input, parses one request and its payload, unlocks, runs
//! the request against the backend and writes the reply with one `writev`
//! (small replies that finish together go out in one write: `send`). So
//! requests run in parallel and replies leave in completion order, with no
//! hand-off between a reader thread and a pool.
//! Workers are started lazily, when a request arrives and no worker is
//! waiting for the input, up to `max_workers`: that is the bound on requests
//! in flight per connection.
//!
//! Plugging: a worker that has read a plain write also takes the writes that
//! follow it back to back, if they are already in the input buffer (no
//! waiting for the socket), and runs them as one backend write, then answers
//! each. NBD gives no order between requests in flight, so this changes
//! nothing a client may rely on; it turns a burst of small sequential writes
//! into one large one (full stripes for a RAID backend).

use std::io::{self, Read};
use std::net::Shutdown;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::backend::{errno_of, Backend};
use crate::error::NbdError;
use crate::proto::*;
use crate::socket::Stream;

/// Bytes of socket input buffered per connection; many request headers fit,
/// so one `read` usually serves several requests.
const INPUT_BUFFER_BYTES: usize = 64 * 1024;
/// Largest write made by merging buffered adjacent writes (a worker's
/// retained buffer, so merging never waits for the budget).
const MERGED_WRITE_MAX_BYTES: usize = RETAINED_BUFFER_BYTES;
/// A worker within its connection's share keeps a data buffer of this size
/// between requests; larger ones go back to the budget after each request.
const RETAINED_BUFFER_BYTES: usize = 256 * 1024;
/// What all workers of one connection keep in such buffers, at most (16 of
/// them): past it a worker keeps only a small one (SMALL_BUFFER_BYTES), so the
/// memory a connection keeps grows by that alone with its queue depth.
const RETAINED_PER_CONNECTION_BYTES: usize = 16 * RETAINED_BUFFER_BYTES;
/// Any worker keeps a buffer up to this size uncharged (one small request's
/// payload): so a connection keeps at most RETAINED_PER_CONNECTION_BYTES plus
/// this per worker, and small requests never wait on the budget's lock.
const SMALL_BUFFER_BYTES: usize = 16 * 1024;
/// Write payload buffers larger than a kept one that the budget keeps for the next large
/// write, in all (a queue of 1 MiB writes at depth 16), so that such a write reuses
/// memory instead of zeroing a fresh buffer. A quarter of the budget at most.
const SPARE_BYTES: usize = 16 << 20;

/// Memory for request payloads shared by all connections.
#[derive(Debug)]
pub(crate) struct BufferBudget {
    available: Mutex<usize>,
    freed: Condvar,
    total: usize,
    /// Large write payload buffers given back, kept for the next ones
    /// ([`BufferBudget::take_spare`]); they hold no budget, and their bytes stay
    /// within `spare_limit`.
    spare: Mutex<Vec<Vec<u8>>>,
    spare_limit: usize,
}

impl BufferBudget {
    pub(crate) fn new(total: usize) -> Self {
        BufferBudget {
            available: Mutex::new(total),
            freed: Condvar::new(),
            total,
            spare: Mutex::new(Vec::new()),
            spare_limit: SPARE_BYTES.min(total / 4),
        }
    }

    /// Charges `bytes` if they are available now, without waiting.
    fn try_acquire(&self, bytes: usize) -> bool {
        let mut avail = lock(&self.available);
        let ok = *avail >= bytes;
        if ok {
            *avail -= bytes;
        }
        ok
    }

    /// A kept buffer for a payload of `len` bytes, the smallest of those that hold it
    /// with at most a quarter to spare. Its bytes are a former payload's: only for
    /// one that overwrites them all before anything reads them.
    fn take_spare(&self, len: usize) -> Option<Vec<u8>> {
        let mut spare = lock(&self.spare);
        let fit = spare
            .iter()
            .enumerate()
            .filter(|(_, v)| v.len() >= len && v.len() - len <= len / 4)
            .min_by_key(|(_, v)| v.len())
            .map(|(i, _)| i)?;
        Some(spare.swap_remove(fit))
    }

    /// Keeps a large payload buffer for the next large write, if the spares have room
    /// (else frees it).
    fn put_spare(&self, v: Vec<u8>) {
        let mut spare = lock(&self.spare);
        let held: usize = spare.iter().map(Vec::len).sum();
        if held + v.len() <= self.spare_limit {
            spare.push(v);
        }
    }

    #[cfg(test)]
    fn spare_bytes(&self) -> usize {
        lock(&self.spare).iter().map(Vec::len).sum()
    }

    fn acquire(&self, bytes: usize) {
        assert!(
            bytes <= self.total,
            "buffer budget smaller than one payload"
        );
        let mut avail = lock(&self.available);
        while *avail < bytes {
            avail = self.freed.wait(avail).unwrap_or_else(|e| e.into_inner());
        }
        *avail -= bytes;
    }

    fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut avail = lock(&self.available);
        *avail += bytes;
        assert!(*avail <= self.total, "buffer budget over-released");
        self.freed.notify_all();
    }

    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        *lock(&self.available)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A worker's data buffer. The first workers of a connection keep a buffer of
/// [`RETAINED_BUFFER_BYTES`] between requests, uncharged, while the
/// connection's kept buffers stay within [`RETAINED_PER_CONNECTION_BYTES`]
/// (`retained` counts them); the others keep one of at most
/// [`SMALL_BUFFER_BYTES`]. Any other buffer (larger than that, or of a worker
/// past the connection's share) is charged to the budget for one request only,
/// so a worker never holds budget while it waits for anything but its own
/// request, the budget cannot deadlock, and the memory a client's requests in
/// flight hold is bounded by the budget plus the kept buffers, whatever the
/// queue depth. A charged buffer of a write payload goes back to the budget's spares
/// for the next large write ([`SPARE_BYTES`] in all, uncharged), so that
/// sequential large writes do not zero a fresh buffer each.
struct WorkBuf<'a> {
    data: Vec<u8>,
    charged: usize,
    budget: &'a BufferBudget,
    /// Bytes of `data`'s capacity counted in `retained` (0 or RETAINED_BUFFER_BYTES).
    kept: usize,
    retained: &'a AtomicUsize,
}

impl<'a> WorkBuf<'a> {
    fn new(budget: &'a BufferBudget, retained: &'a AtomicUsize) -> Self {
        WorkBuf {
            data: Vec::new(),
            charged: 0,
            budget,
            kept: 0,
            retained,
        }
    }

    /// Stops counting this buffer as kept.
    fn forget_kept(&mut self) {
        self.retained.fetch_sub(self.kept, Ordering::Relaxed);
        self.kept = 0;
    }

    /// Counts a buffer of RETAINED_BUFFER_BYTES in the connection's share, if
    /// it has room.
    fn try_keep(&mut self) -> bool {
        let counted = self
            .retained
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                (r + RETAINED_BUFFER_BYTES <= RETAINED_PER_CONNECTION_BYTES)
                    .then_some(r + RETAINED_BUFFER_BYTES)
            });
        if counted.is_ok() {
            self.kept = RETAINED_BUFFER_BYTES;
        }
        counted.is_ok()
    }

    fn get(&mut self, len: usize) -> &mut [u8] {
        if len > self.data.len() {
            if self.kept == 0
                && self.charged == 0
                && len <= RETAINED_BUFFER_BYTES
                && self.try_keep()
            {
                self.data = Vec::with_capacity(RETAINED_BUFFER_BYTES);
            }
            // Uncharged: the kept buffer, or a small one of any worker.
            let free = self.kept.max(SMALL_BUFFER_BYTES);
            if len > free.max(self.charged) {
                self.budget.acquire(len - self.charged);
                self.charged = len;
            }
            self.data.reserve_exact(len - self.data.len());
            self.data.resize(len, 0);
        }
        &mut self.data[..len]
    }

    /// A buffer for a write payload of `len` bytes, which the caller overwrites whole
    /// before anything reads it: as [`WorkBuf::get`], but a charged one may be a spare
    /// of the budget's (a former payload's bytes, not zeroed again).
    fn get_for_payload(&mut self, len: usize) -> &mut [u8] {
        if len > RETAINED_BUFFER_BYTES && len > self.data.len() && self.charged == 0 {
            if let Some(v) = self.budget.take_spare(len) {
                if self.budget.try_acquire(v.len()) {
                    // Charged whole, so the budget still bounds the memory in use.
                    self.charged = v.len();
                    self.data = v;
                    self.forget_kept();
                } else {
                    self.budget.put_spare(v);
                }
            }
        }
        self.get(len)
    }

    /// Ends a request: gives a charged buffer back (and with it the kept one it
    /// replaced, counted again when next needed); the buffer becomes a spare of the
    /// budget's if it has room.
    fn shrink(&mut self) {
        if self.charged > 0 {
            self.budget.release(self.charged);
            self.charged = 0;
            self.budget.put_spare(std::mem::take(&mut self.data));
            self.forget_kept();
        }
    }
}

impl Drop for WorkBuf<'_> {
    fn drop(&mut self) {
        self.budget.release(self.charged);
        self.forget_kept();
    }
}

struct Input {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    closed: bool,
}

impl Input {
    /// Next request header, or `None` at a clean end of stream.
    fn read_header(&mut self, stream: &Stream) -> Result<Option<Request>, NbdError> {
        while self.end - self.start < REQUEST_HEADER_BYTES {
            if self.buf.len() - self.start < REQUEST_HEADER_BYTES {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let n = match (&*stream).read(&mut self.buf[self.end..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(NbdError::Io(e)),
            };
            if n == 0 {
                return if self.end == self.start {
                    Ok(None)
                } else {
                    Err(NbdError::Disconnected)
                };
            }
            self.end += n;
        }
        let req = parse_request(&self.buf[self.start..self.end])?;
        self.start += REQUEST_HEADER_BYTES;
        Ok(Some(req))
    }

    /// The next request, if it is a plain write of `offset` whose header and
    /// whole payload are already buffered, valid, and fit `room` bytes; it is
    /// then consumed and its payload appended to `out`.
    fn take_adjacent_write(
        &mut self,
        offset: u64,
        room: usize,
        limits: &ExportLimits,
        out: &mut Vec<u8>,
    ) -> Option<Request> {
        let avail = &self.buf[self.start..self.end];
        if avail.len() < REQUEST_HEADER_BYTES {
            return None;
        }
        let r = parse_request(avail).ok()?;
        let len = r.length as usize;
        if r.command != Command::Write
            || r.flags != 0
            || r.offset != offset
            || len > room
            || avail.len() < REQUEST_HEADER_BYTES + len
            || r.validate(limits).is_err()
        {
            return None;
        }
        out.extend_from_slice(&avail[REQUEST_HEADER_BYTES..REQUEST_HEADER_BYTES + len]);
        self.start += REQUEST_HEADER_BYTES + len;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Some(r)
    }

    fn read_payload(&mut self, stream: &Stream, out: &mut [u8]) -> Result<(), NbdError> {
        let buffered = (self.end - self.start).min(out.len());
        out[..buffered].copy_from_slice(&self.buf[self.start..self.start + buffered]);
        self.start += buffered;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        (&*stream)
            .read_exact(&mut out[buffered..])
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => NbdError::Disconnected,
                _ => NbdError::Io(e),
            })
    }
}

/// Per-connection settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnConfig {
    pub limits: ExportLimits,
    pub max_workers: usize,
    /// Contexts the client set: which block status chunks a request gets.
    pub base_allocation: bool,
    pub dirty_bitmap: bool,
    /// Limit on a stalled large write payload (replies use the socket's send timeout).
    pub io_timeout: Option<std::time::Duration>,
}

struct Shared<'a> {
    stream: &'a Stream,
    backend: &'a dyn Backend,
    budget: &'a BufferBudget,
    config: ConnConfig,
    input: Mutex<Input>,
    /// Small replies waiting for the worker that sends them ([`send`]).
    output: Mutex<Output>,
    /// Held while bytes go out, so that two replies never interleave.
    wire: Mutex<()>,
    waiting_for_input: AtomicUsize,
    workers: AtomicUsize,
    /// Bytes the workers keep in their buffers between requests ([`WorkBuf`]).
    retained: AtomicUsize,
    first_error: Mutex<Option<NbdError>>,
}

/// Serves requests until the client disconnects, sends `NBD_CMD_DISC`, breaks
/// the protocol, or the socket's read side is shut down (server shutdown).
/// Every request read is answered before this returns, if the socket allows.
pub(crate) fn serve(
    stream: &Stream,
    backend: &dyn Backend,
    budget: &BufferBudget,
    config: ConnConfig,
) -> Result<(), NbdError> {
    let shared = Shared {
        stream,
        backend,
        budget,
        config,
        input: Mutex::new(Input {
            buf: vec![0; INPUT_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            closed: false,
        }),
        output: Mutex::new(Output::default()),
        wire: Mutex::new(()),
        waiting_for_input: AtomicUsize::new(0),
        workers: AtomicUsize::new(1),
        retained: AtomicUsize::new(0),
        first_error: Mutex::new(None),
    };
    std::thread::scope(|scope| worker(&shared, scope));
    match shared
        .first_error
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What a worker took from the input.
enum Next {
    /// A request, and for a merged write the cookies of the writes merged
    /// into it (their payloads follow the first's in the buffer).
    Run(Request, Vec<u64>),
    Stop,
}

/// One worker of a connection. A panic in it (a bug here: the backend's own panics are
/// answered with EIO by [`guarded`]) ends this connection, logged: the socket is shut so
/// the other workers stop waiting for input and the client sees a close, not a hang.
/// Other connections have their own threads and go on.
fn worker<'scope, 'env>(sh: &'scope Shared<'env>, scope: &'scope std::thread::Scope<'scope, 'env>) {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker_loop(sh, scope)));
    if let Err(panic) = run {
        let msg = panic_message(&*panic);
        tracing::error!("nbd: a connection thread panicked ({msg}); closing the connection");
        let err = io::Error::other(format!("connection thread panicked: {msg}"));
        fail(sh, NbdError::Io(err), Shutdown::Both);
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "no message".into())
}

fn worker_loop<'scope, 'env>(
    sh: &'scope Shared<'env>,
    scope: &'scope std::thread::Scope<'scope, 'env>,
) {
    let mut buf = WorkBuf::new(sh.budget, &sh.retained);
    let mut scratch = Vec::with_capacity(64);
    loop {
        let (req, merged) = match next_request(sh, &mut buf) {
            Next::Run(req, merged) => (req, merged),
            Next::Stop => return,
        };
        maybe_add_worker(sh, scope);
        let result = execute(sh, &req, &merged, &mut buf, &mut scratch);
        buf.shrink();
        if let Err(e) = result {
            fail(sh, e, Shutdown::Both);
            return;
        }
    }
}

fn maybe_add_worker<'scope, 'env>(
    sh: &'scope Shared<'env>,
    scope: &'scope std::thread::Scope<'scope, 'env>,
) {
    if sh.waiting_for_input.load(Ordering::Relaxed) != 0
        || sh.workers.load(Ordering::Relaxed) >= sh.config.max_workers
    {
        return;
    }
    if sh.workers.fetch_add(1, Ordering::Relaxed) >= sh.config.max_workers {
        sh.workers.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("nbd-worker".into())
        .spawn_scoped(scope, move || worker(sh, scope));
    if let Err(e) = spawned {
        sh.workers.fetch_sub(1, Ordering::Relaxed);
        tracing::warn!("cannot start another NBD worker: {e}");
    }
}

/// Records the first fatal error and stops the connection's input.
fn fail(sh: &Shared<'_>, err: NbdError, how: Shutdown) {
    tracing::debug!("nbd connection: {err}");
    let mut first = lock(&sh.first_error);
    if first.is_none() {
        *first = Some(err);
    }
    drop(first);
    sh.stream.shutdown(how);
}

fn next_request(sh: &Shared<'_>, buf: &mut WorkBuf<'_>) -> Next {
    sh.waiting_for_input.fetch_add(1, Ordering::Relaxed);
    let mut input = lock(&sh.input);
    sh.waiting_for_input.fetch_sub(1, Ordering::Relaxed);
    if input.closed {
        return Next::Stop;
    }
    let req = match input.read_header(sh.stream) {
        Ok(Some(req)) => req,
        Ok(None) => {
            input.closed = true;
            return Next::Stop;
        }
        Err(e) => {
            input.closed = true;
            // In-flight requests may still answer; only the input stops.
            fail(sh, e, Shutdown::Read);
            return Next::Stop;
        }
    };
    if req.command == Command::Disc {
        input.closed = true;
        return Next::Stop;
    }
    let payload = req.payload_len();
    if payload > sh.config.limits.max_payload_bytes {
        input.closed = true;
        fail(
            sh,
            NbdError::PayloadTooLarge {
                len: payload,
                limit: sh.config.limits.max_payload_bytes,
            },
            Shutdown::Read,
        );
        return Next::Stop;
    }
    if payload > 0 {
        // A large payload holds budget while it arrives: bound how long a
        // stalled client may keep it. (Small ones are not worth two syscalls.)
        let large = payload as usize > RETAINED_BUFFER_BYTES && sh.config.io_timeout.is_some();
        if large {
            let _ = sh.stream.set_read_timeout(sh.config.io_timeout);
        }
        let data = buf.get_for_payload(payload as usize);
        let result = input.read_payload(sh.stream, data);
        if large {
            let _ = sh.stream.set_read_timeout(None);
        }
        if let Err(e) = result {
            input.closed = true;
            fail(sh, e, Shutdown::Read);
            return Next::Stop;
        }
    }
    let mut req = req;
    let mut merged = Vec::new();
    if req.command == Command::Write
        && req.flags == 0
        && (payload as usize) <= MERGED_WRITE_MAX_BYTES
        && req.validate(&sh.config.limits).is_ok()
    {
        let mut total = payload as usize;
        let data = &mut buf.data;
        data.truncate(total);
        while let Some(r) = input.take_adjacent_write(
            req.offset + total as u64,
            // Merging never grows the buffer: only what it holds without being charged.
            (MERGED_WRITE_MAX_BYTES - total).min(data.capacity().saturating_sub(total)),
            &sh.config.limits,
            data,
        ) {
            total += r.length as usize;
            merged.push(r.cookie);
        }
        req.length = total as u32;
    }
    Next::Run(req, merged)
}

/// Runs one request and sends its reply; `Err` only for socket errors.
fn execute(
    sh: &Shared<'_>,
    req: &Request,
    merged: &[u64],
    buf: &mut WorkBuf<'_>,
    scratch: &mut Vec<u8>,
) -> Result<(), NbdError> {
    let limits = &sh.config.limits;
    if let Err(errno) = req.validate(limits) {
        let msg = match errno {
            Errno::Perm => "export is read-only",
            Errno::NoSpc => "write beyond the end of the export",
            _ => "invalid request",
        };
        return send_error(sh, req, errno, msg, scratch);
    }
    let backend = sh.backend;
    let len = req.length as usize;
    let result = match req.command {
        Command::Read => {
            let data = buf.get(len);
            match guarded(|| backend.read(req.offset, data)) {
                Ok(()) => return send_read(sh, req, data),
                Err(e) => Err(e),
            }
        }
        Command::Write => {
            let data = &buf.get(len)[..];
            guarded(|| backend.write(req.offset, data, req.fua()))
        }
        Command::Flush => guarded(|| backend.flush()),
        Command::Trim => guarded(|| {
            backend.trim(req.offset, len as u64)?;
            if req.fua() {
                backend.flush()?;
            }
            Ok(())
        }),
        Command::WriteZeroes => {
            guarded(|| backend.write_zeroes(req.offset, len as u64, req.zero_flags()))
        }
        Command::BlockStatus => {
            let mut base = Vec::new();
            let mut dirty = Vec::new();
            match guarded(|| {
                if sh.config.base_allocation {
                    base = backend.block_status(req.offset, len as u64)?;
                }
                if sh.config.dirty_bitmap {
                    dirty = backend.dirty_status(req.offset, len as u64)?;
                }
                Ok(())
            }) {
                Ok(()) => return send_block_status(sh, req, &base, &dirty, scratch),
                Err(e) => Err(e),
            }
        }
        Command::Disc | Command::Unknown(_) => unreachable!("filtered by next_request/validate"),
    };
    match result {
        Ok(()) if merged.is_empty() => send(sh, &[&encode_simple_reply(req.cookie, 0)]),
        Ok(()) => {
            // One reply per merged write, in one write.
            let replies: Vec<u8> = std::iter::once(req.cookie)
                .chain(merged.iter().copied())
                .flat_map(|c| encode_simple_reply(c, 0))
                .collect();
            send(sh, &[&replies])
        }
        Err(e) => {
            let errno = errno_of(&e);
            let msg = e.to_string();
            // A failed merged write fails every write in it.
            for cookie in std::iter::once(req.cookie).chain(merged.iter().copied()) {
                let one = Request { cookie, ..*req };
                send_error(sh, &one, errno, &msg, scratch)?;
            }
            Ok(())
        }
    }
}

/// Runs a backend call; a panic in the backend becomes `EIO` for this
/// request instead of taking the connection (or the server) down.
fn guarded(call: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(result) => result,
        Err(_) => {
            tracing::error!("nbd: backend panicked; answering EIO");
            Err(io::Error::from_raw_os_error(libc::EIO))
        }
    }
}

/// Replies of at most this many bytes are combined ([`send`]); a larger one goes out
/// from its worker's buffer as it is (copying it would cost more than a system call).
const COMBINE_MAX_BYTES: usize = 16 << 10;

/// Small replies queued for one write.
#[derive(Default)]
struct Output {
    pending: Vec<u8>,
    /// A worker is writing queued replies and will take these too.
    flushing: bool,
    /// The last batch's buffer, kept for its capacity.
    spare: Vec<u8>,
}

/// Sends one reply. Small ones are combined: a reply queued while another worker is
/// writing goes out with that worker's next write, so replies that finish together cost
/// one system call (the flushing worker loops until the queue is empty; whether it is
/// empty and whether someone flushes are decided under one lock, so no reply is left
/// behind). Replies never interleave: bytes go out under `wire`.
fn send(sh: &Shared<'_>, bufs: &[&[u8]]) -> Result<(), NbdError> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    if total > COMBINE_MAX_BYTES {
        let _wire = lock(&sh.wire);
        return sh.stream.write_all_vectored(bufs).map_err(NbdError::Io);
    }
    let mut out = lock(&sh.output);
    for b in bufs {
        out.pending.extend_from_slice(b);
    }
    if out.flushing {
        return Ok(());
    }
    out.flushing = true;
    loop {
        let mut batch = std::mem::take(&mut out.spare);
        std::mem::swap(&mut batch, &mut out.pending);
        drop(out);
        let sent = {
            let _wire = lock(&sh.wire);
            sh.stream.write_all_vectored(&[&batch])
        };
        batch.clear();
        out = lock(&sh.output);
        out.spare = batch;
        if let Err(e) = sent {
            // The connection is lost: replies queued meanwhile cannot go either.
            out.flushing = false;
            out.pending.clear();
            return Err(NbdError::Io(e));
        }
        if out.pending.is_empty() {
            out.flushing = false;
            return Ok(());
        }
    }
}

fn send_read(sh: &Shared<'_>, req: &Request, data: &[u8]) -> Result<(), NbdError> {
    if !sh.config.limits.structured_replies {
        return send(sh, &[&encode_simple_reply(req.cookie, 0), data]);
    }
    if data.is_empty() {
        let done = encode_structured_header(req.cookie, REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0);
        return send(sh, &[&done]);
    }
    let header = encode_offset_data_header(req.cookie, req.offset, data.len() as u32);
    send(sh, &[&header, data])
}

/// One NBD_REPLY_TYPE_BLOCK_STATUS chunk per context the client set (`base:allocation`,
/// then the dirty bitmap; the last carries DONE): the backend's extents, cut to the request
/// (each at most u32::MAX bytes; with REQ_ONE only the first), merged where the status
/// repeats. A backend that covers nothing gets EIO, not an empty reply.
fn send_block_status(
    sh: &Shared<'_>,
    req: &Request,
    base: &[crate::Extent],
    dirty: &[crate::DirtyExtent],
    scratch: &mut Vec<u8>,
) -> Result<(), NbdError> {
    let mut chunks: Vec<(u32, Vec<(u32, u32)>)> = Vec::new();
    if sh.config.base_allocation {
        let runs = base.iter().map(|e| {
            let flags = if e.hole { STATE_HOLE } else { 0 } | if e.zero { STATE_ZERO } else { 0 };
            (e.length, flags)
        });
        chunks.push((BASE_ALLOCATION_ID, descriptors(req, runs)));
    }
    if sh.config.dirty_bitmap {
        let runs = dirty
            .iter()
            .map(|e| (e.length, if e.dirty { STATE_DIRTY } else { 0 }));
        chunks.push((DIRTY_BITMAP_ID, descriptors(req, runs)));
    }
    if chunks.is_empty() || chunks.iter().any(|(_, d)| d.is_empty()) {
        return send_error(sh, req, Errno::Io, "block status covered nothing", scratch);
    }
    let mut out = Vec::new();
    let last = chunks.len() - 1;
    for (i, (id, descriptors)) in chunks.iter().enumerate() {
        let mut body = Vec::with_capacity(4 + 8 * descriptors.len());
        body.extend_from_slice(&id.to_be_bytes());
        for (len, flags) in descriptors {
            body.extend_from_slice(&len.to_be_bytes());
            body.extend_from_slice(&flags.to_be_bytes());
        }
        let done = if i == last { REPLY_FLAG_DONE } else { 0 };
        let header =
            encode_structured_header(req.cookie, done, REPLY_TYPE_BLOCK_STATUS, body.len() as u32);
        out.extend_from_slice(&header);
        out.extend_from_slice(&body);
    }
    // All chunks in one write, so no other reply lands between them.
    send(sh, &[&out])
}

/// Block status descriptors (length, flags) for one context from its runs.
fn descriptors(req: &Request, runs: impl Iterator<Item = (u64, u32)>) -> Vec<(u32, u32)> {
    // The largest descriptor length that stays 4 KiB aligned.
    const MAX_DESCRIPTOR: u64 = (u32::MAX as u64) & !4095;
    let mut left = u64::from(req.length);
    let mut descriptors: Vec<(u32, u32)> = Vec::new();
    for (length, flags) in runs {
        if left == 0 {
            break;
        }
        let mut len = length.min(left);
        left -= len;
        while len > 0 {
            let piece = len.min(MAX_DESCRIPTOR) as u32;
            match descriptors.last_mut() {
                Some((l, f))
                    if *f == flags && u64::from(*l) + u64::from(piece) <= MAX_DESCRIPTOR =>
                {
                    *l += piece
                }
                _ => descriptors.push((piece, flags)),
            }
            len -= u64::from(piece);
        }
    }
    if req.flags & CMD_FLAG_REQ_ONE != 0 {
        descriptors.truncate(1);
    }
    descriptors
}

fn send_error(
    sh: &Shared<'_>,
    req: &Request,
    errno: Errno,
    msg: &str,
    scratch: &mut Vec<u8>,
) -> Result<(), NbdError> {
    if sh.config.limits.structured_replies {
        scratch.clear();
        encode_error_chunk(scratch, req.cookie, errno, msg);
        send(sh, &[scratch])
    } else {
        // A failed simple read reply carries no data.
        send(sh, &[&encode_simple_reply(req.cookie, errno.code())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_accounting() {
        let budget = BufferBudget::new(1 << 20);
        let retained = AtomicUsize::new(0);
        {
            let mut a = WorkBuf::new(&budget, &retained);
            a.get(100);
            a.get(50);
            assert_eq!(budget.available(), 1 << 20);
            a.get(RETAINED_BUFFER_BYTES + 1);
            assert_eq!(budget.available(), (1 << 20) - RETAINED_BUFFER_BYTES - 1);
            a.get(RETAINED_BUFFER_BYTES + 100);
            assert_eq!(budget.available(), (1 << 20) - RETAINED_BUFFER_BYTES - 100);
            a.shrink();
            assert_eq!(budget.available(), 1 << 20);
            a.get(RETAINED_BUFFER_BYTES * 2);
        }
        assert_eq!(budget.available(), 1 << 20);
        assert_eq!(retained.load(Ordering::Relaxed), 0);
    }

    /// A large write payload's buffer is kept for the next large write (charged whole
    /// while in use, uncharged and bounded while spare), reads never get one, and
    /// the spares stay within their limit.
    #[test]
    fn large_payload_buffers_are_reused_within_bounds() {
        let total = 64 << 20;
        let budget = BufferBudget::new(total);
        let retained = AtomicUsize::new(0);
        let big = 1 << 20;
        let mut a = WorkBuf::new(&budget, &retained);
        a.get_for_payload(big).fill(9);
        let first = a.data.as_ptr();
        assert_eq!(budget.available(), total - big);
        a.shrink();
        assert_eq!(budget.available(), total);
        assert_eq!(budget.spare_bytes(), big);
        // The next payload of a size it holds (within a quarter) reuses it, not zeroed.
        let d = a.get_for_payload(big - 4096);
        assert_eq!(d.len(), big - 4096);
        assert!(d.iter().all(|&b| b == 9));
        assert_eq!(a.data.as_ptr(), first);
        assert_eq!(budget.available(), total - big, "charged whole");
        assert_eq!(budget.spare_bytes(), 0);
        a.shrink();
        // One much smaller, or a read's buffer, is a fresh zeroed one.
        assert!(a.get_for_payload(big / 2).iter().all(|&b| b == 0));
        a.shrink();
        a.get_for_payload(big).fill(9);
        a.shrink();
        let spare = budget.spare_bytes();
        assert!(spare >= big);
        assert!(
            a.get(big).iter().all(|&b| b == 0),
            "a read's buffer is never a spare"
        );
        assert_eq!(budget.spare_bytes(), spare);
        a.shrink();
        // The spares stay within their limit however many workers give buffers back.
        let mut workers: Vec<WorkBuf<'_>> =
            (0..40).map(|_| WorkBuf::new(&budget, &retained)).collect();
        for w in workers.iter_mut() {
            w.get_for_payload(big);
        }
        for w in workers.iter_mut() {
            w.shrink();
        }
        assert!(budget.spare_bytes() <= SPARE_BYTES);
        assert!(budget.spare_bytes() >= SPARE_BYTES - big);
        assert_eq!(budget.available(), total);
        // A small budget keeps at most a quarter of itself spare.
        let small = BufferBudget::new(2 << 20);
        let mut w = WorkBuf::new(&small, &retained);
        w.get_for_payload(big);
        w.shrink();
        assert_eq!(small.spare_bytes(), 0);
    }

    /// The buffers a connection's workers keep between requests stay within
    /// RETAINED_PER_CONNECTION_BYTES (plus a small one each) whatever the
    /// number of workers (the queue depth), the other workers' larger buffers
    /// are charged to the budget, and all are given back when the workers end.
    #[test]
    fn kept_buffers_are_bounded_per_connection() {
        let budget = BufferBudget::new(1 << 20);
        let retained = AtomicUsize::new(0);
        let mut workers: Vec<WorkBuf<'_>> =
            (0..128).map(|_| WorkBuf::new(&budget, &retained)).collect();
        for w in workers.iter_mut() {
            w.get(RETAINED_BUFFER_BYTES).fill(7);
            w.shrink();
        }
        let kept: usize = workers.iter().map(|w| w.data.capacity()).sum();
        assert_eq!(kept, retained.load(Ordering::Relaxed));
        assert!(
            kept <= RETAINED_PER_CONNECTION_BYTES,
            "128 workers keep {kept} bytes"
        );
        assert!(kept >= RETAINED_PER_CONNECTION_BYTES - RETAINED_BUFFER_BYTES);
        // A worker that kept its buffer goes on reusing it.
        let first = workers[0].data.as_ptr();
        workers[0].get(4096);
        workers[0].shrink();
        assert_eq!(workers[0].data.as_ptr(), first);
        // One that did not still serves requests: a small one from a buffer it
        // keeps uncharged, a larger one from a buffer charged to the budget for
        // the request, so what requests in flight hold stays bounded too.
        let last = workers.last_mut().unwrap();
        assert_eq!(last.data.capacity(), 0);
        assert_eq!(last.get(4096).len(), 4096);
        assert_eq!(budget.available(), 1 << 20);
        last.shrink();
        assert_eq!(last.data.capacity(), 4096);
        assert_eq!(
            last.get(SMALL_BUFFER_BYTES + 1).len(),
            SMALL_BUFFER_BYTES + 1
        );
        assert_eq!(budget.available(), (1 << 20) - SMALL_BUFFER_BYTES - 1);
        last.shrink();
        assert_eq!(budget.available(), 1 << 20);
        assert_eq!(last.data.capacity(), 0, "a charged buffer is not kept");
        let kept: usize = workers.iter().map(|w| w.data.capacity()).sum();
        assert_eq!(kept, retained.load(Ordering::Relaxed));
        assert!(kept <= RETAINED_PER_CONNECTION_BYTES);
        drop(workers);
        assert_eq!(retained.load(Ordering::Relaxed), 0);
        assert_eq!(budget.available(), 1 << 20);
    }
}
