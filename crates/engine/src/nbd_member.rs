//! A member on an NBD export (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`),
//! through `uraid-nbd`'s client (feature `nbd`).
//!
//! The lower layer's view of a remote disk: reads, writes, flushes, TRIM as discard and
//! WRITE_ZEROES where the server offers them. Each request waits at most the client's
//! timeout; a timeout or a dropped connection closes the connection. What then depends on
//! md's failfast, which the array sets ([`Member::set_failfast`]):
//! - **failfast** (the array keeps its data without this member): the request fails at
//!   once, and the array fails the member; the bitmap records what it misses.
//! - **not failfast** (it holds the last copy of some data): the request reconnects with
//!   back-off (100 ms doubling to 5 s) and is sent again, for at most
//!   [`NbdMember::with_retry`]'s time, before it fails; once a retry ran out, later requests
//!   fail at once (each would wait as long again for a host that is gone). A block request
//!   is the same sent twice.
//!
//! A failed member is not reconnected in place (the array has moved on without it);
//! [`Member::reopen`] opens a new member on the same export, which the re-add daemon
//! re-adds once the host answers.

use crate::member::{
    write_zero_buffers, Batch, Member, MemberOp, OpBuf, RemoteConnection, RemoteStatus, ZeroHow,
};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use uraid_nbd::client::{Client, ClientConfig};

/// A member on an NBD export. Its name and its device identity are the URI, so that the
/// same export given twice is one device.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use uraid_engine::{Member, NbdClientConfig, NbdMember};
/// let m = NbdMember::connect("nbd://storage1/disk0", &NbdClientConfig::default())?;
/// println!("{} bytes", m.size_bytes());
/// # Ok(())
/// # }
/// ```
pub struct NbdMember {
    /// The connection(s) now; replaced when a last copy reconnects.
    client: RwLock<Arc<Client>>,
    /// How it was opened, for [`Member::reopen`] and reconnects.
    config: ClientConfig,
    /// Attempts to connect anew finished (reopen or reconnect), and the last one's error.
    reconnects: Mutex<(u64, Option<String>)>,
    /// md's failfast, as the array sets it ([`Member::set_failfast`]): a lost connection
    /// fails requests at once. Off (the array's last copy of some data): retry.
    failfast: AtomicBool,
    /// How long requests of a member that is not failfast keep reconnecting.
    retry_for: Duration,
    /// A retry ran out: later requests fail at once (each would wait `retry_for` again
    /// for a host that is gone).
    gave_up: AtomicBool,
    /// Requests waiting to reconnect now (the `reconnecting` state of [`Member::remote`]).
    retrying: AtomicUsize,
    /// Writes started and in flight, so that block status answers are trusted only
    /// while no write came since.
    writes: Writes,
    /// What the last block status answers said ([`Member::is_hole`]).
    status: StatusCache,
}

/// The writes sent to the export: how many were started (a generation) and how many are
/// in flight.
#[derive(Default)]
struct Writes {
    started: std::sync::atomic::AtomicU64,
    in_flight: AtomicUsize,
}

impl Writes {
    /// Counts a write from now until the guard drops (after its reply).
    fn begin(&self) -> WriteGuard<'_> {
        // In flight first: whoever sees the new generation's predecessor then sees it
        // in flight.
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        WriteGuard(self)
    }
    fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }
    /// The generation now, and whether no write is in flight.
    fn snapshot(&self) -> (u64, bool) {
        let generation = self.started();
        (generation, self.in_flight.load(Ordering::SeqCst) == 0)
    }
}

/// One write in flight ([`Writes::begin`]).
struct WriteGuard<'a>(&'a Writes);

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The last runs block status gave. Data is kept whatever happens later: calling zeros
/// data is always a true answer (the range is read and rebuilt as any other). Zeros are
/// kept only with the write generation they were seen at, and believed only while no
/// write has started since: a write may have put data there, and calling data zeros would
/// have a recovery zero it.
#[derive(Default)]
struct StatusCache(Mutex<Runs>);

#[derive(Default)]
struct Runs {
    data: std::ops::Range<u64>,
    zero: std::ops::Range<u64>,
    zero_generation: u64,
}

impl StatusCache {
    fn runs(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Some of `start..end` is known data.
    fn known(&self, start: u64, end: u64) -> bool {
        let r = self.runs();
        r.data.start < end && start < r.data.end
    }
    /// All of `start..end` is known zeros, and no write started since (`generation` now).
    fn zero(&self, start: u64, end: u64, generation: u64) -> bool {
        let r = self.runs();
        r.zero_generation == generation && r.zero.start <= start && end <= r.zero.end
    }
    /// An answer: `zero` reads as zeros (kept if seen at `generation` with no write
    /// overlapping the question), `data` (if some) is data.
    fn learn(
        &self,
        zero: std::ops::Range<u64>,
        data: Option<std::ops::Range<u64>>,
        generation: Option<u64>,
    ) {
        let mut r = self.runs();
        if let Some(d) = data {
            r.data = d;
        }
        if let Some(g) = generation {
            if !zero.is_empty() {
                r.zero = zero;
                r.zero_generation = g;
            }
        }
    }
}

/// Bytes asked about per NBD_CMD_BLOCK_STATUS at least: one answer then serves a recovery's
/// next stripes (a server gives long runs of data in one descriptor).
const STATUS_WINDOW_BYTES: u64 = 64 << 20;
/// The same while writes are in flight, when the answer's zeros cannot be kept: a server
/// works out its extents for all it is asked about (a recovery asking nbdkit's memory
/// plugin for 64 MiB per stripe ran at half the speed of one that reads everything), and
/// only data, the first run, would be remembered.
const BUSY_STATUS_WINDOW_BYTES: u64 = 1 << 20;

/// Counts a request among those reconnecting while it lives.
struct Retrying<'a>(&'a AtomicUsize);

impl<'a> Retrying<'a> {
    fn new(n: &'a AtomicUsize) -> Retrying<'a> {
        n.fetch_add(1, Ordering::Relaxed);
        Retrying(n)
    }
}

impl Drop for Retrying<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The default of [`NbdMember::with_retry`].
pub const DEFAULT_RETRY: Duration = Duration::from_secs(30);
/// First pause between reconnects of a last copy; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl NbdMember {
    /// Connects to the export `uri` names (`nbds://` with the config's TLS CA).
    pub fn connect(uri: &str, config: &ClientConfig) -> io::Result<NbdMember> {
        let client = Client::open(uri, config).map_err(|e| e.into_io())?;
        Ok(NbdMember {
            client: RwLock::new(Arc::new(client)),
            config: config.clone(),
            reconnects: Mutex::new((0, None)),
            failfast: AtomicBool::new(true),
            retry_for: DEFAULT_RETRY,
            gave_up: AtomicBool::new(false),
            retrying: AtomicUsize::new(0),
            writes: Writes::default(),
            status: StatusCache::default(),
        })
    }

    /// How long a request keeps reconnecting, with back-off, when the connection is lost
    /// while the member is not failfast (the array would lose data without it), before it
    /// fails (default [`DEFAULT_RETRY`]; zero: never retry).
    pub fn with_retry(mut self, retry_for: Duration) -> NbdMember {
        self.retry_for = retry_for;
        self
    }

    /// The client underneath now (what the server offered, connections).
    pub fn client(&self) -> Arc<Client> {
        self.client
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn note_attempt<T>(&self, r: &io::Result<T>) {
        let mut n = self.reconnects.lock().unwrap_or_else(|e| e.into_inner());
        *n = (n.0 + 1, r.as_ref().err().map(|e| e.to_string()));
    }

    /// A connected client in place of `lost` (unless another request has put one there
    /// already).
    fn reconnect(&self, lost: &Arc<Client>) -> io::Result<Arc<Client>> {
        let now = self.client();
        if !Arc::ptr_eq(&now, lost) && now.status().connected {
            return Ok(now);
        }
        let r = Client::open(lost.name(), &self.config).map_err(|e| e.into_io());
        self.note_attempt(&r);
        let c = Arc::new(r?);
        if c.info().size_bytes != lost.info().size_bytes {
            return Err(io::Error::other(format!(
                "{}: the export came back with another size ({} bytes, was {})",
                lost.name(),
                c.info().size_bytes,
                lost.info().size_bytes
            )));
        }
        *self.client.write().unwrap_or_else(|e| e.into_inner()) = c.clone();
        self.gave_up.store(false, Ordering::Relaxed);
        tracing::info!("{}: reconnected", lost.name());
        Ok(c)
    }

    /// Runs `f` on the client; when it fails because the connection is lost and the
    /// member is not failfast, reconnects with back-off and runs it again, for at most
    /// `retry_for` (a block request is the same when sent twice).
    fn with_client<T>(&self, mut f: impl FnMut(&Client) -> io::Result<T>) -> io::Result<T> {
        let mut c = self.client();
        let mut err = match f(&c) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let deadline = Instant::now() + self.retry_for;
        let mut pause = FIRST_BACKOFF;
        let mut _retrying = None;
        loop {
            // A server's error reply leaves the connection up: that is the answer.
            if c.status().connected
                || self.failfast.load(Ordering::Relaxed)
                || self.gave_up.load(Ordering::Relaxed)
            {
                return Err(err);
            }
            if Instant::now() >= deadline {
                self.gave_up.store(true, Ordering::Relaxed);
                return Err(io::Error::new(
                    err.kind(),
                    format!("{err}; no reconnect within {:?}", self.retry_for),
                ));
            }
            _retrying.get_or_insert_with(|| Retrying::new(&self.retrying));
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(MAX_BACKOFF);
            if let Ok(new) = self.reconnect(&c) {
                c = new;
                match f(&c) {
                    Ok(v) => return Ok(v),
                    Err(e) => err = e,
                }
            }
        }
    }
}

impl Member for NbdMember {
    fn size_bytes(&self) -> u64 {
        self.client().info().size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with_client(|c| c.read(&mut buf[..], offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let _w = self.writes.begin();
        self.with_client(|c| c.write(buf, offset, false))
    }

    fn flush(&self) -> io::Result<()> {
        self.with_client(|c| c.flush())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _w = self.writes.begin();
        self.with_client(|c| c.trim(offset, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroHow) -> io::Result<()> {
        if !self.client().info().can_write_zeroes() {
            return write_zero_buffers(self, offset, len);
        }
        let _w = self.writes.begin();
        self.with_client(|c| c.write_zeroes(offset, len, !how.unmap, false))
    }

    fn zeroes_fast(&self, _unmap: bool) -> bool {
        self.client().info().can_write_zeroes()
    }

    /// From the server's `base:allocation` (NBD_STATE_ZERO: reads as zeros), so that a
    /// recovery or resync over remote members skips what was never written, as it does
    /// over sparse files. A server without the context, or an error, says data.
    fn tells_holes(&self) -> bool {
        self.client().info().block_status
    }

    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        let client = self.client();
        if !client.info().block_status {
            return Ok(false);
        }
        let end = offset.saturating_add(len);
        if self.status.known(offset, end) {
            return Ok(false);
        }
        if self.status.zero(offset, end, self.writes.started()) {
            return Ok(true);
        }
        let size = client.info().size_bytes;
        let mut at = offset;
        while at < end {
            // No write in flight when asked, and none started until answered: the
            // answer's zeros hold until the next write. With writes in flight they will
            // not be kept, so the server is not asked about more than the next stripes.
            let (generation, quiet) = self.writes.snapshot();
            let window = match quiet {
                true => STATUS_WINDOW_BYTES,
                false => BUSY_STATUS_WINDOW_BYTES,
            };
            let ask = (end - at).max(window).min(size.saturating_sub(at));
            let extents = client.block_status(at, ask)?;
            let unchanged = quiet && self.writes.started() == generation;
            let mut from = at;
            let mut data = None;
            for e in extents {
                if !e.zero {
                    data = Some(from..from + e.length);
                    break;
                }
                from += e.length;
            }
            self.status
                .learn(at..from, data.clone(), unchanged.then_some(generation));
            if from <= at {
                return Ok(false); // data at `at`, or no progress (a server off protocol)
            }
            if data.is_some_and(|d| d.start < end) {
                return Ok(false);
            }
            at = from;
        }
        Ok(true)
    }

    fn name(&self) -> String {
        self.client().name().to_string()
    }

    fn remote(&self) -> Option<RemoteStatus> {
        let client = self.client();
        let st = client.status();
        let reconnects = self
            .reconnects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let connection = if st.connected {
            RemoteConnection::Up
        } else if self.retrying.load(Ordering::Relaxed) > 0 {
            RemoteConnection::Reconnecting
        } else {
            RemoteConnection::Lost
        };
        let bounds = (0..st.latency.counts.len()).map(|i| {
            (i < uraid_nbd::latency::BUCKETS).then(|| uraid_nbd::latency::bucket_upper_us(i))
        });
        Some(RemoteStatus {
            uri: client.name().to_string(),
            connection,
            error: st.error,
            latency_us: st.latency_us,
            latency_buckets: bounds.zip(st.latency.counts.iter().copied()).collect(),
            latency_sum_us: st.latency.sum_us,
            connections: st.connections,
            tls: st.tls,
            reconnect_attempts: reconnects.0,
            reconnect_error: reconnects.1,
        })
    }

    /// A new connection to the same export, counted (and its error kept) on this member,
    /// whose `remote` status `uraid detail` shows while it is faulty.
    fn reopen(&self) -> Option<io::Result<Arc<dyn Member>>> {
        let r = NbdMember::connect(self.client().name(), &self.config)
            .map(|m| m.with_retry(self.retry_for));
        self.note_attempt(&r);
        Some(r.map(|m| Arc::new(m) as Arc<dyn Member>))
    }

    fn set_failfast(&self, failfast: bool) {
        self.failfast.store(failfast, Ordering::Relaxed);
    }

    /// Every op is sent at submit and completed after the batch's other members had theirs
    /// ([`Batch::complete_later`]), so a batch's ops on all its members are in flight
    /// together. IO the client must split or align runs at once.
    /// A request that fails on a lost connection while the member is not failfast is run
    /// again synchronously, through the retrying path.
    fn submit<'a>(&'a self, ops: &mut [MemberOp<'a>], batch: &mut Batch<'a>) {
        let client = self.client();
        for op in ops.iter_mut().filter(|o| !o.is_complete()) {
            if !client.fits_one_request(op.offset, op.len()) {
                op.run_sync(self);
                continue;
            }
            let (ticket, write) = match op.buf() {
                OpBuf::Read(b) => (client.start_read(op.offset, b.len() as u32), None),
                OpBuf::Write(b) => {
                    let w = self.writes.begin();
                    (client.start_write(b, op.offset, false), Some(w))
                }
            };
            let sent_on = client.clone();
            batch.complete_later(op, move |op: &mut MemberOp<'a>| {
                let r = ticket.wait().map(|data| {
                    if let OpBuf::Read(b) = &mut op.buf {
                        b.copy_from_slice(&data);
                    }
                });
                drop(write); // answered (a retry below counts itself)
                let retry = r.is_err()
                    && !sent_on.status().connected
                    && !self.failfast.load(Ordering::Relaxed)
                    && !self.gave_up.load(Ordering::Relaxed);
                if retry {
                    op.run_sync(self);
                } else {
                    op.complete(r);
                }
            });
        }
    }
}
