//! NBD client: an export as a block device, for arrays whose members live on other hosts.
//!
//! - **Handshake**: fixed newstyle only (oldstyle servers are long gone), then
//!   `NBD_OPT_STRUCTURED_REPLY` (taken where offered), `NBD_OPT_SET_META_CONTEXT` for
//!   `base:allocation` (with structured replies; [`Client::block_status`]) and `NBD_OPT_GO`
//!   asking for `NBD_INFO_BLOCK_SIZE`; a server without `GO` gets `NBD_OPT_EXPORT_NAME`.
//! - **Transmission**: any number of threads send requests on one connection (a mutex
//!   around the socket's write side, one `sendmsg` per request), so several requests are
//!   in flight at once. Replies, simple or structured chunks in any order, are matched to
//!   their cookies by whoever is waiting for one (leader/followers, as the server's
//!   workers take turns at its input): one waiter at a time reads the socket through one
//!   64 KiB buffer, hands other requests' replies to their waiters and, once its own has
//!   come, nudges the oldest sleeping waiter to read next. A reply read by its own waiter
//!   costs no thread wake-up; with a dedicated reader thread every reply cost two (the
//!   reader woken by the socket, the waiter by the reader). A watcher thread per
//!   connection reads only when no waiter does and a send is about to block (a server
//!   may stop taking requests until its replies have gone), and sees the server's
//!   hang-up while the connection is idle, so a dead connection shows in
//!   [`Client::status`] without a request.
//! - **Block sizes** from `NBD_INFO_BLOCK_SIZE` are honoured: requests are split at the
//!   maximum, and IO not aligned to the minimum is widened (reads) or read-modify-written
//!   (writes, serialised among themselves).
//! - **Never a hang**: every request waits at most [`ClientConfig::timeout`] for its reply.
//!   A request that times out, a socket error or a reply that breaks the protocol closes
//!   the connection, and every request on it, then and later, fails with an IO error (a
//!   member on a lost host is a failed member; there is no reconnect).
//! - **multi-conn**: with [`ClientConfig::connections`] > 1 and a server that advertises
//!   `NBD_FLAG_CAN_MULTI_CONN`, requests are spread over that many connections; a flush on
//!   one covers writes completed on all of them, as the flag promises.
//! - TLS (`nbds://`, `nbds+unix://`): STARTTLS, the server verified against the CA file
//!   given (`--nbd-tls-ca`, X.509 with rustls), or by knowing a pre-shared key
//!   (`?tls-psk-file=FILE[&tls-username=NAME]`, or `--nbd-tls-psk`: TLS-PSK with OpenSSL).

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

pub use crate::latency::{Latency, LatencyHistogram};
use crate::proto::*;
use crate::socket::{Stream, WakePipe};

/// The port of `nbd://host/...` without one (IANA's NBD port).
pub const DEFAULT_PORT: u16 = 10809;
/// The default of [`ClientConfig::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request payload sent, whatever the server allows (the protocol's usual 32 MiB).
const MAX_REQUEST_BYTES: u32 = 32 << 20;
/// Largest TRIM or WRITE_ZEROES length per request (their length is a u32).
const MAX_ZERO_REQUEST_BYTES: u64 = 1 << 30;
/// Largest structured chunk accepted from a server.
const MAX_CHUNK_BYTES: u32 = MAX_REQUEST_BYTES + 4096;

/// Why an NBD export could not be opened.
#[derive(Debug, Error)]
pub enum ClientError {
    #[error("{uri}: not an NBD URI: {why}")]
    BadUri { uri: String, why: String },
    #[error(
        "{uri}: an nbds:// member needs the CA that signed its server's certificate \
         (--nbd-tls-ca FILE) or a pre-shared key (?tls-psk-file=FILE or --nbd-tls-psk FILE)"
    )]
    TlsNoCa { uri: String },
    #[error(
        "{uri}: the server requires TLS: use nbds:// (with --nbd-tls-ca FILE, or \
         ?tls-psk-file=FILE)"
    )]
    TlsRequired { uri: String },
    /// The pre-shared key file is unusable, or has not the identity asked for.
    #[error("{uri}: {source}")]
    TlsPsk {
        uri: String,
        source: crate::tls::TlsError,
    },
    /// The TLS-PSK handshake failed: the server does not know the identity, or has another
    /// key for it.
    #[error(
        "{uri}: the server refused the pre-shared key for identity {identity:?} ({why}): \
         check that its --tls-psk file has {identity:?} with this key (and that it serves \
         TLS-PSK)"
    )]
    PskRefused {
        uri: String,
        identity: String,
        why: String,
    },
    #[error("{uri}: TLS: {source}")]
    Tls { uri: String, source: io::Error },
    /// The server closed the connection without answering uraid's TLS hello.
    #[error(
        "{uri}: the server closed the connection without answering uraid's TLS hello: {}it \
         shares no TLS version (uraid speaks TLS 1.2 and 1.3) or cipher suite with uraid \
         (check its TLS version and priority settings)",
        identity.as_ref().map_or(String::new(), |i| format!(
            "it does not take the pre-shared key for identity {i:?} (check that its PSK file \
             has {i:?} with this key), or "
        ))
    )]
    TlsUnanswered {
        uri: String,
        identity: Option<String>,
    },
    /// The server speaks no TLS version uraid does.
    #[error(
        "{uri}: the server offers no TLS version uraid speaks (uraid speaks TLS 1.2 and 1.3) \
         ({why}): allow TLS 1.2 or 1.3 on the server (its TLS priority or protocol settings)"
    )]
    TlsVersion { uri: String, why: String },
    #[error(
        "{uri}: the server closed the connection once TLS was up: it may want a client \
         certificate (nbd-server does with TLS) or refuse the one given: give uraid one \
         signed by a CA the server trusts, with --nbd-tls-cert FILE --nbd-tls-key FILE"
    )]
    TlsClosed { uri: String },
    /// The server's certificate was refused: `why` says what is wrong and what to do.
    #[error("{uri}: {why}")]
    Certificate { uri: String, why: String },
    #[error("{uri}: cannot connect to {addr}: {source}")]
    Connect {
        uri: String,
        addr: String,
        source: io::Error,
    },
    #[error("{uri}: handshake: {source}")]
    Io { uri: String, source: io::Error },
    #[error("{uri}: handshake: the server broke the protocol: {source}")]
    Protocol { uri: String, source: ProtocolError },
    #[error("{uri}: handshake: {why}")]
    Handshake { uri: String, why: String },
    #[error("{uri}: the server refused export {export:?} (reply {reply:#x}){message}")]
    Refused {
        uri: String,
        export: String,
        reply: u32,
        message: String,
    },
}

impl ClientError {
    /// The error as an `io::Error` (its message kept), for callers that speak io.
    pub fn into_io(self) -> io::Error {
        let kind = match &self {
            ClientError::BadUri { .. }
            | ClientError::TlsPsk { .. }
            | ClientError::TlsNoCa { .. }
            | ClientError::TlsRequired { .. } => io::ErrorKind::InvalidInput,
            ClientError::Connect { source, .. } | ClientError::Io { source, .. } => source.kind(),
            ClientError::Refused { .. } => io::ErrorKind::NotFound,
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, self.to_string())
    }
}

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `nbd+unix:///export?socket=PATH`
    Unix(PathBuf),
    /// `nbd://host[:port]/export`
    Tcp { host: String, port: u16 },
}

/// A parsed NBD URI (the NBD project's URI format: `nbd://host[:port]/export`,
/// `nbd+unix:///export?socket=PATH`; `nbds` and `nbds+unix` are its TLS forms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    /// The URI as given (a member's name).
    pub text: String,
    /// The server.
    pub address: Address,
    /// The export's name ("" is the server's default export).
    pub export: String,
    /// `nbds`, `nbds+unix`: STARTTLS before anything else.
    pub tls: bool,
    /// The name the server's certificate must carry (`?tls-hostname=`; else the host, or
    /// `localhost` on a Unix socket).
    pub tls_hostname: Option<String>,
    /// TLS-PSK with the keys of this file (`?tls-psk-file=`, as libnbd).
    pub tls_psk_file: Option<PathBuf>,
    /// The PSK identity (`?tls-username=`, or the URI's user: `nbds://NAME@host/`).
    pub tls_username: Option<String>,
    /// This export's request timeout (`?timeout=SECS`), in place of
    /// [`ClientConfig::timeout`].
    pub timeout: Option<Duration>,
}

/// Whether `s` is spelt as an NBD URI (of any scheme, TLS included), rather than a path.
pub fn is_nbd_uri(s: &str) -> bool {
    ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
        .iter()
        .any(|p| s.starts_with(p))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl NbdUri {
    /// Parses `s`.
    pub fn parse(s: &str) -> Result<NbdUri, ClientError> {
        let bad = |why: &str| ClientError::BadUri {
            uri: s.to_string(),
            why: why.to_string(),
        };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (unix, tls) = match scheme {
            "nbd" => (false, false),
            "nbd+unix" => (true, false),
            "nbds" => (false, true),
            "nbds+unix" => (true, true),
            _ => return Err(bad("the scheme must be nbd, nbd+unix, nbds or nbds+unix")),
        };
        let mut tls_hostname = None;
        let mut tls_psk_file = None;
        let mut tls_username = None;
        let mut timeout = None;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        // `user@host`: the user is the PSK identity (libnbd's reading).
        let authority = match authority.rsplit_once('@') {
            Some((user, host)) => {
                if !tls {
                    return Err(bad("a user (NAME@) is the TLS-PSK identity: nbds:// only"));
                }
                let user = percent_decode(user).ok_or_else(|| bad("bad %-escape in the user"))?;
                if user.is_empty() {
                    return Err(bad("an empty user before '@'"));
                }
                tls_username = Some(user);
                host
            }
            None => authority,
        };
        let export = percent_decode(path).ok_or_else(|| bad("bad %-escape in the export"))?;
        let mut socket = None;
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            match param.split_once('=') {
                Some(("socket", v)) if unix => {
                    socket = Some(percent_decode(v).ok_or_else(|| bad("bad %-escape"))?);
                }
                Some(("tls-hostname", v)) if tls => {
                    tls_hostname = Some(percent_decode(v).ok_or_else(|| bad("bad %-escape"))?);
                }
                Some(("timeout", v)) => timeout = Some(parse_timeout(v).map_err(|w| bad(&w))?),
                Some(("tls-psk-file", v)) if tls => {
                    let v = percent_decode(v).ok_or_else(|| bad("bad %-escape"))?;
                    if v.is_empty() {
                        return Err(bad("?tls-psk-file= needs a file"));
                    }
                    tls_psk_file = Some(PathBuf::from(v));
                }
                Some(("tls-username", v)) if tls => {
                    let v = percent_decode(v).ok_or_else(|| bad("bad %-escape"))?;
                    if v.is_empty() {
                        return Err(bad("?tls-username= needs a name"));
                    }
                    tls_username = Some(v);
                }
                Some(("tls-psk-file" | "tls-username" | "tls-hostname", _)) => {
                    return Err(bad(&format!(
                        "{param:?} is for TLS: use nbds:// or nbds+unix://"
                    )))
                }
                _ => return Err(bad(&format!("unknown query parameter {param:?}"))),
            }
        }
        let address = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    "nbd+unix:// takes no host (nbd+unix:///export?socket=PATH)",
                ));
            }
            Address::Unix(PathBuf::from(
                socket.ok_or_else(|| bad("nbd+unix:// needs ?socket=PATH"))?,
            ))
        } else {
            if authority.is_empty() {
                return Err(bad("nbd:// needs a host"));
            }
            let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
                let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
                (h, after.strip_prefix(':'))
            } else {
                match authority.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (authority, None),
                }
            };
            let port = match port {
                Some(p) => p.parse().map_err(|_| bad("bad port"))?,
                None => DEFAULT_PORT,
            };
            Address::Tcp {
                host: host.to_string(),
                port,
            }
        };
        Ok(NbdUri {
            text: s.to_string(),
            address,
            export,
            tls,
            tls_hostname,
            tls_psk_file,
            tls_username,
            timeout,
        })
    }
}

/// `?timeout=SECS`: seconds, a fraction allowed, more than zero.
fn parse_timeout(v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| {
            format!(
                "?timeout={v}: the request timeout must be a number of seconds above zero \
                 (as ?timeout=5 or ?timeout=0.5)"
            )
        })
}

/// How the client connects and waits.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Longest wait for a reply (and for each step of the handshake, and for a request to be
    /// taken by the socket); after it the connection is closed and its requests fail.
    pub timeout: Duration,
    /// Connections to open when the server advertises multi-conn (1 = one connection).
    pub connections: usize,
    /// Ask for structured replies (the server may still refuse).
    pub structured_replies: bool,
    /// How `nbds://` servers are verified: the CA their certificate must chain to
    /// (`--nbd-tls-ca`), or a pre-shared key (`--nbd-tls-psk`). A URI's own
    /// `?tls-psk-file=` takes the place of either.
    pub tls: Option<crate::tls::TlsClient>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timeout: DEFAULT_TIMEOUT,
            connections: 1,
            structured_replies: true,
            tls: None,
        }
    }
}

/// What the server said about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    /// Size in bytes.
    pub size_bytes: u64,
    /// Transmission flags (`NBD_FLAG_*`).
    pub flags: u16,
    /// Requests are aligned to this (1 when the server gave no block sizes).
    pub min_block_bytes: u32,
    /// The server's preferred block size.
    pub preferred_block_bytes: u32,
    /// Largest READ or WRITE payload sent (the server's maximum, at most 32 MiB).
    pub max_payload_bytes: u32,
    /// Structured replies were negotiated.
    pub structured_replies: bool,
    /// The server set `base:allocation` (NBD_OPT_SET_META_CONTEXT), so
    /// [`Client::block_status`] can ask where the export is allocated and reads as zeros.
    pub block_status: bool,
}

impl ExportInfo {
    fn has(&self, flag: u16) -> bool {
        self.flags & FLAG_HAS_FLAGS != 0 && self.flags & flag != 0
    }
    /// The export refuses writes.
    pub fn read_only(&self) -> bool {
        self.has(FLAG_READ_ONLY)
    }
    /// The server has a write cache to flush (NBD_FLAG_SEND_FLUSH).
    pub fn can_flush(&self) -> bool {
        self.has(FLAG_SEND_FLUSH)
    }
    /// NBD_CMD_FLAG_FUA is accepted.
    pub fn can_fua(&self) -> bool {
        self.has(FLAG_SEND_FUA)
    }
    /// NBD_CMD_TRIM is accepted.
    pub fn can_trim(&self) -> bool {
        self.has(FLAG_SEND_TRIM)
    }
    /// NBD_CMD_WRITE_ZEROES is accepted.
    pub fn can_write_zeroes(&self) -> bool {
        self.has(FLAG_SEND_WRITE_ZEROES)
    }
    /// Several connections see one another's completed writes (NBD_FLAG_CAN_MULTI_CONN).
    pub fn can_multi_conn(&self) -> bool {
        self.has(FLAG_CAN_MULTI_CONN)
    }
}

/// What a request's answer carries, as parsed off the socket.
enum Payload {
    /// A read's data (empty for writes, flushes, trims and zeroing).
    Bytes(Vec<u8>),
    /// A block status's descriptors for `base:allocation`, `(length, flags)` each, in the
    /// order the server sent them.
    Status(Vec<(u32, u32)>),
}

impl Payload {
    /// A read's data; nothing for a block status.
    fn into_bytes(self) -> Vec<u8> {
        match self {
            Payload::Bytes(b) => b,
            Payload::Status(_) => Vec::new(),
        }
    }
}

/// A request's reply: its payload, or the error.
type Reply = io::Result<Payload>;

/// Where a request's reply lands and its waiter sleeps. A nudge wakes the waiter to take
/// its turn reading the socket ([`Conn::wait_for`]).
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    woken: Condvar,
}

#[derive(Default)]
struct SlotState {
    reply: Option<Reply>,
    nudged: bool,
}

impl Slot {
    fn deliver(&self, reply: Reply) {
        lock(&self.state).reply = Some(reply);
        self.woken.notify_one();
    }

    fn nudge(&self) {
        lock(&self.state).nudged = true;
        self.woken.notify_one();
    }

    fn take(&self) -> Option<Reply> {
        lock(&self.state).reply.take()
    }

    /// Whether a nudge came (and forgets it).
    fn take_nudge(&self) -> bool {
        std::mem::take(&mut lock(&self.state).nudged)
    }

    /// Sleeps until the reply or a nudge comes; false if `deadline` came first.
    fn sleep(&self, deadline: Instant) -> bool {
        let mut st = lock(&self.state);
        while st.reply.is_none() && !st.nudged {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .woken
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

struct Pending {
    command: Command,
    offset: u64,
    length: u32,
    /// A read's data as chunks arrive (empty until the first).
    data: Vec<u8>,
    /// A block status's descriptors for `base:allocation` as chunks arrive.
    status: Vec<(u32, u32)>,
    /// The first error chunk.
    error: Option<io::Error>,
    slot: Arc<Slot>,
}

struct State {
    pending: HashMap<u64, Pending>,
    next_cookie: u64,
    /// Why the connection is closed, once it is.
    dead: Option<String>,
    /// Someone is reading replies off the socket now (a waiter or the watcher).
    reading: bool,
    /// Waiters asleep while someone else reads, oldest first: the one to nudge when the
    /// reader leaves.
    sleepers: VecDeque<Arc<Slot>>,
}

/// Replies buffered off the socket; only whoever is reading touches it.
struct Input {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// A structured chunk that does not go straight into its read's buffer.
    scratch: Vec<u8>,
}

/// Bytes of replies read off the socket at once: many small replies per `read`.
const INPUT_BUFFER_BYTES: usize = 64 * 1024;

impl Input {
    /// Fills `out` from the buffer, then the socket (large rests straight into `out`).
    fn read_exact(&mut self, stream: &Stream, out: &mut [u8]) -> Result<(), String> {
        let n = (self.end - self.start).min(out.len());
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        let mut done = n;
        while done < out.len() {
            let rest = out.len() - done;
            if rest >= self.buf.len() / 2 {
                return read_exact(stream, &mut out[done..]);
            }
            self.start = 0;
            self.end = read_some(stream, &mut self.buf)?;
            let n = self.end.min(rest);
            out[done..done + n].copy_from_slice(&self.buf[..n]);
            self.start = n;
            done += n;
        }
        Ok(())
    }
}

/// One connection: the write side under a mutex; replies read by whoever waits for one
/// (leader and followers), or by the watcher thread when nobody does.
struct Conn {
    writer: Mutex<()>,
    stream: Stream,
    state: Mutex<State>,
    input: Mutex<Input>,
    /// Wakes the watcher to read replies: a send is about to block with nobody reading.
    watch: WakePipe,
    name: Arc<str>,
    /// The client's timeout: the longest wait for a reply.
    timeout: Duration,
    watcher: Mutex<Option<JoinHandle<()>>>,
    /// Reply latency: moving average and histogram.
    latency: Latency,
    /// The id the server gave `base:allocation` on this connection, if it set it.
    alloc_context: Option<u32>,
}

/// How a client's connections stand ([`Client::status`]), for `uraid detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnStatus {
    /// Every connection is open.
    pub connected: bool,
    /// Why a connection closed (the first one found), once one has.
    pub error: Option<String>,
    /// Moving average of reply latency over the connections, in microseconds (none
    /// before the first reply).
    pub latency_us: Option<u64>,
    /// Every reply's latency, over the connections.
    pub latency: LatencyHistogram,
    /// Connections opened.
    pub connections: usize,
    /// The connections are TLS (`nbds://`).
    pub tls: bool,
}

fn lost(name: &str, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        format!("{name}: connection closed: {why}"),
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A request sent and not yet answered; [`Ticket::wait`] gives its reply.
#[must_use = "a request's reply must be waited for"]
pub struct Ticket {
    slot: Arc<Slot>,
    conn: Arc<Conn>,
    command: Command,
    timeout: Duration,
    sent: Instant,
}

impl Ticket {
    /// Waits for the reply: a read's data (empty for other commands) or the error. At most
    /// the client's timeout; after it the connection is closed and this fails `TimedOut`.
    pub fn wait(self) -> io::Result<Vec<u8>> {
        self.wait_payload().map(Payload::into_bytes)
    }

    /// [`Ticket::wait`] for a block status: its `base:allocation` descriptors, as parsed
    /// when they arrived (none where the server sent none).
    fn wait_status(self) -> io::Result<Vec<(u32, u32)>> {
        Ok(match self.wait_payload()? {
            Payload::Status(d) => d,
            Payload::Bytes(_) => Vec::new(),
        })
    }

    fn wait_payload(self) -> Reply {
        let deadline = self.sent + self.timeout;
        match self.conn.wait_for(&self.slot, deadline) {
            Some(r) => {
                self.conn.latency.record(self.sent.elapsed());
                r
            }
            None => {
                let why = format!(
                    "no reply to {:?} within {:?} (the server is gone or stalled)",
                    self.command, self.timeout
                );
                self.conn.kill(&why);
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{}: {why}", self.conn.name),
                ))
            }
        }
    }
}

/// What the reader found.
enum Got {
    /// A reply, or a chunk of one, was read.
    Reply,
    /// Nothing came within the timeout.
    Idle,
}

impl Conn {
    /// Closes the connection: every pending request fails with `why`, later ones too.
    fn kill(&self, why: &str) {
        let drained: Vec<Pending> = {
            let mut st = lock(&self.state);
            if st.dead.is_none() {
                st.dead = Some(why.to_string());
            }
            st.pending.drain().map(|(_, p)| p).collect()
        };
        self.stream.shutdown(Shutdown::Both);
        self.watch.wake();
        for p in drained {
            p.slot.deliver(Err(lost(&self.name, why)));
        }
    }

    fn send(
        self: &Arc<Self>,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        timeout: Duration,
    ) -> Ticket {
        let slot = Arc::new(Slot::default());
        let ticket = Ticket {
            slot: slot.clone(),
            conn: self.clone(),
            command,
            timeout,
            sent: Instant::now(),
        };
        let cookie = {
            let mut st = lock(&self.state);
            if let Some(why) = &st.dead {
                slot.deliver(Err(lost(&self.name, why)));
                return ticket;
            }
            let cookie = st.next_cookie;
            st.next_cookie += 1;
            st.pending.insert(
                cookie,
                Pending {
                    command,
                    offset,
                    length,
                    data: Vec::new(),
                    status: Vec::new(),
                    error: None,
                    slot,
                },
            );
            cookie
        };
        let header = encode_request(&Request {
            flags,
            command,
            cookie,
            offset,
            length,
        });
        let sent = {
            let _w = lock(&self.writer);
            // A server may stop taking requests until its replies are read: before this
            // send blocks, make sure someone reads them.
            self.stream
                .write_all_vectored_or(&[&header, payload], || self.watch.wake())
        };
        if let Err(e) = sent {
            // A request half sent cannot be taken back: the stream is out of step.
            self.kill(&format!("sending {command:?}: {e}"));
        }
        ticket
    }

    /// The reply `slot` waits for, or `None` at `deadline`. While nobody reads the
    /// socket, this waiter does (the leader), handing others' replies to their slots,
    /// until its own comes; then it nudges the oldest sleeper to read next. Otherwise it
    /// sleeps until its reply or a nudge. So a reply read by its own waiter costs no
    /// wake-up, and one thread reads at a time, from one buffer.
    fn wait_for(&self, slot: &Arc<Slot>, deadline: Instant) -> Option<Reply> {
        loop {
            if let Some(r) = slot.take() {
                if slot.take_nudge() {
                    // Nudged to read, but the reply came anyway: pass the turn on.
                    self.pass_turn();
                }
                return Some(r);
            }
            // A nudge (if one came) is acted on now: by reading, or by sleeping while
            // someone else already does.
            slot.take_nudge();
            let lead = {
                let mut st = lock(&self.state);
                if st.reading {
                    st.sleepers.push_back(slot.clone());
                    false
                } else {
                    st.reading = true;
                    true
                }
            };
            if lead {
                let r = self.lead(slot, deadline);
                self.pass_turn_after_reading();
                r?;
                continue;
            }
            let in_time = slot.sleep(deadline);
            lock(&self.state).sleepers.retain(|s| !Arc::ptr_eq(s, slot));
            if !in_time {
                // The reply may have come at the last moment.
                let r = slot.take();
                if slot.take_nudge() {
                    self.pass_turn();
                }
                return r;
            }
        }
    }

    /// Reads replies until `slot` has its own; `None` if `deadline` passes first.
    fn lead(&self, slot: &Slot, deadline: Instant) -> Option<()> {
        let mut input = lock(&self.input);
        loop {
            if lock(&slot.state).reply.is_some() {
                return Some(());
            }
            match self.read_one(&mut input) {
                Ok(Got::Reply) => {}
                Ok(Got::Idle) => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                }
                Err(why) => {
                    self.kill(&why);
                    // Every pending request, this one too, has its error now.
                }
            }
        }
    }

    /// The reader leaves: the oldest sleeper, if any, reads next.
    fn pass_turn_after_reading(&self) {
        let next = {
            let mut st = lock(&self.state);
            st.reading = false;
            st.sleepers.pop_front()
        };
        if let Some(s) = next {
            s.nudge();
        }
    }

    /// A nudged waiter that will not read: the next sleeper does, if nobody reads yet.
    fn pass_turn(&self) {
        let next = {
            let mut st = lock(&self.state);
            if st.reading {
                None
            } else {
                st.sleepers.pop_front()
            }
        };
        if let Some(s) = next {
            s.nudge();
        }
    }

    /// One reply or chunk off the socket, given to its request.
    fn read_one(&self, input: &mut Input) -> Result<Got, String> {
        if input.start == input.end {
            input.start = 0;
            input.end = 0;
            match read_some(&self.stream, &mut input.buf) {
                Ok(n) => input.end = n,
                Err(_) if lock(&self.state).dead.is_some() => {
                    return Err(lock(&self.state).dead.clone().unwrap_or_default())
                }
                Err(e) if e.starts_with(IDLE) => return Ok(Got::Idle),
                Err(e) => return Err(e),
            }
        }
        read_reply(self, input).map(|()| Got::Reply)
    }
}

/// Why [`read_some`] returned without data: the socket's read timeout.
const IDLE: &str = "idle";

/// The watcher: reads replies while requests are pending and nobody waits to read them
/// (a sender about to block wakes it: the server may be waiting for its replies to go),
/// and reads a close by the server at once, so that a dead connection shows in
/// [`Client::status`] while idle. It polls for the peer's hang-up, not for input, so
/// replies that a waiter reads do not wake it.
fn watcher_loop(conn: &Conn) {
    loop {
        let (woken, hangup) = match poll_watch(conn) {
            Ok(v) => v,
            Err(e) => {
                conn.kill(&format!("watching the connection: {e}"));
                return;
            }
        };
        if woken {
            conn.watch.drain();
        }
        if lock(&conn.state).dead.is_some() {
            return;
        }
        // Read while something is pending and nobody else reads (after a hang-up: until
        // the end, so that the replies before it are delivered and then the close seen).
        loop {
            {
                let mut st = lock(&conn.state);
                if st.dead.is_some() {
                    return;
                }
                if st.reading || (st.pending.is_empty() && !hangup) {
                    break;
                }
                st.reading = true;
            }
            let r = {
                let mut input = lock(&conn.input);
                conn.read_one(&mut input)
            };
            let sleeper = {
                let mut st = lock(&conn.state);
                st.reading = false;
                st.sleepers.pop_front()
            };
            match r {
                Ok(Got::Reply) => {}
                Ok(Got::Idle) => {
                    if !lock(&conn.state).pending.is_empty() {
                        conn.kill(&format!(
                            "no reply within {:?} (the server is gone or stalled)",
                            conn.timeout
                        ));
                    }
                }
                Err(why) => conn.kill(&why),
            }
            if let Some(s) = sleeper {
                // A waiter can read its own replies: hand over.
                s.nudge();
                break;
            }
        }
        if hangup && lock(&conn.state).dead.is_none() {
            // Someone else reads to the end; look again shortly.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Waits for the wake pipe or the peer's hang-up: (woken, hung up).
fn poll_watch(conn: &Conn) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: conn.stream.raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        },
        libc::pollfd {
            fd: conn.watch.read_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc >= 0 {
            let hangup = fds[0].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0;
            return Ok((fds[1].revents != 0, hangup));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Some bytes off the socket (at most `buf`); `Err(IDLE...)` after the read timeout.
fn read_some(stream: &Stream, buf: &mut [u8]) -> Result<usize, String> {
    let mut s = stream;
    loop {
        return match s.read(buf) {
            Ok(0) => Err("the server closed the connection".to_string()),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(IDLE.to_string())
            }
            Err(e) => Err(format!("reading a reply: {e}")),
        };
    }
}

fn read_exact(stream: &Stream, buf: &mut [u8]) -> Result<(), String> {
    let mut s = stream;
    s.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => "the server closed the connection".to_string(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            "a reply stalled part-way (the server is gone or stalled)".to_string()
        }
        _ => format!("reading a reply: {e}"),
    })
}

fn errno_error(name: &str, command: Command, errno: u32, message: &str) -> io::Error {
    let os = io::Error::from_raw_os_error(errno as i32);
    let msg = if message.is_empty() {
        String::new()
    } else {
        format!(" ({message})")
    };
    io::Error::new(
        os.kind(),
        format!("{name}: the server failed {command:?}: {os}{msg}"),
    )
}

/// One reply (a simple reply, or one structured chunk), from `input` and the socket.
fn read_reply(conn: &Conn, input: &mut Input) -> Result<(), String> {
    let stream = &conn.stream;
    let mut head = [0u8; STRUCTURED_HEADER_BYTES];
    input.read_exact(stream, &mut head[..SIMPLE_REPLY_BYTES])?;
    let header = match parse_reply_header(&head[..SIMPLE_REPLY_BYTES]) {
        Err(ProtocolError::Truncated { need, .. }) => {
            input.read_exact(stream, &mut head[SIMPLE_REPLY_BYTES..need])?;
            parse_reply_header(&head[..need])
        }
        other => other,
    }
    .map_err(|e| format!("the server broke the protocol: {e}"))?;
    match header {
        ReplyHeader::Simple { error, cookie } => {
            let (command, length, slot) = {
                let mut st = lock(&conn.state);
                let p = st
                    .pending
                    .remove(&cookie)
                    .ok_or_else(|| format!("reply to unknown cookie {cookie}"))?;
                (p.command, p.length, p.slot)
            };
            let reply = if error != 0 {
                Err(errno_error(&conn.name, command, error, ""))
            } else if command == Command::Read {
                let mut data = vec![0u8; length as usize];
                if let Err(why) = input.read_exact(stream, &mut data) {
                    // Out of the table already: the connection's end will not reach it.
                    slot.deliver(Err(lost(&conn.name, &why)));
                    return Err(why);
                }
                Ok(Payload::Bytes(data))
            } else {
                Ok(Payload::Bytes(Vec::new()))
            };
            slot.deliver(reply);
        }
        ReplyHeader::Structured {
            flags,
            kind,
            cookie,
            length,
        } => {
            if length > MAX_CHUNK_BYTES {
                return Err(format!("a reply chunk of {length} bytes"));
            }
            let (command, req_offset, req_len) = {
                let st = lock(&conn.state);
                let p = st
                    .pending
                    .get(&cookie)
                    .ok_or_else(|| format!("reply to unknown cookie {cookie}"))?;
                (p.command, p.offset, u64::from(p.length))
            };
            // A read's data chunk that covers the whole request goes straight into its
            // own buffer; anything else through the scratch buffer.
            let mut whole: Option<Vec<u8>> = None;
            let mut scratch = Vec::new();
            if kind == REPLY_TYPE_OFFSET_DATA && u64::from(length) == req_len + 8 {
                let mut off = [0u8; 8];
                input.read_exact(stream, &mut off)?;
                if u64::from_be_bytes(off) != req_offset || command != Command::Read {
                    return Err("a data chunk outside its read".into());
                }
                let mut data = vec![0u8; req_len as usize];
                input.read_exact(stream, &mut data)?;
                whole = Some(data);
            } else {
                scratch = std::mem::take(&mut input.scratch);
                scratch.resize(length as usize, 0);
                let r = input.read_exact(stream, &mut scratch);
                if r.is_err() {
                    input.scratch = scratch;
                    return r;
                }
            }
            let r = structured_chunk(conn, cookie, flags, kind, whole, &scratch);
            input.scratch = scratch;
            r?;
        }
    }
    Ok(())
}

/// A structured chunk read whole: into its request, which completes with the DONE flag.
fn structured_chunk(
    conn: &Conn,
    cookie: u64,
    flags: u16,
    kind: u16,
    whole: Option<Vec<u8>>,
    scratch: &[u8],
) -> Result<(), String> {
    let bad = |e: ProtocolError| format!("the server broke the protocol: {e}");
    let mut st = lock(&conn.state);
    let Some(p) = st.pending.get_mut(&cookie) else {
        return Ok(()); // closed meanwhile (a timeout); the reader ends soon
    };
    let (command, req_offset, req_len) = (p.command, p.offset, u64::from(p.length));
    if let Some(data) = whole {
        p.data = data;
    } else if kind == REPLY_TYPE_NONE {
        if !scratch.is_empty() || flags & REPLY_FLAG_DONE == 0 {
            return Err("a NONE chunk with data or not final".into());
        }
    } else if kind & (1 << 15) != 0 {
        let (errno, message) = parse_error_chunk(kind, scratch).map_err(bad)?;
        if p.error.is_none() {
            p.error = Some(errno_error(&conn.name, command, errno, &message));
        }
    } else if kind == REPLY_TYPE_OFFSET_DATA || kind == REPLY_TYPE_OFFSET_HOLE {
        let (at, n) = parse_offset_chunk(kind, scratch).map_err(bad)?;
        let inside = command == Command::Read
            && at >= req_offset
            && at.checked_add(n).is_some_and(|e| e <= req_offset + req_len);
        if !inside {
            return Err("a data chunk outside its read".into());
        }
        if p.data.is_empty() {
            p.data = vec![0u8; req_len as usize];
        }
        let from = (at - req_offset) as usize;
        let to = from + n as usize;
        if kind == REPLY_TYPE_OFFSET_DATA {
            p.data[from..to].copy_from_slice(&scratch[8..]);
        } else {
            p.data[from..to].fill(0);
        }
    } else if kind == REPLY_TYPE_BLOCK_STATUS {
        if command != Command::BlockStatus {
            return Err("a block status chunk outside a block status request".into());
        }
        let (id, descriptors) = parse_block_status_chunk(scratch).map_err(bad)?;
        // Only the context asked for is kept.
        if Some(id) == conn.alloc_context {
            p.status.extend(descriptors);
        }
    } else {
        return Err(format!("a reply chunk of unknown type {kind}"));
    }
    if flags & REPLY_FLAG_DONE != 0 {
        let mut p = st.pending.remove(&cookie).expect("looked up above");
        drop(st);
        let reply = match p.error.take() {
            Some(e) => Err(e),
            None if p.command == Command::Read && p.data.is_empty() => {
                Ok(Payload::Bytes(vec![0u8; req_len as usize]))
            }
            None if p.command == Command::BlockStatus => {
                Ok(Payload::Status(std::mem::take(&mut p.status)))
            }
            None => Ok(Payload::Bytes(std::mem::take(&mut p.data))),
        };
        p.slot.deliver(reply);
    }
    Ok(())
}

/// An NBD export, open: reads, writes, flushes, trims and zeroes from any thread.
pub struct Client {
    conns: Vec<Arc<Conn>>,
    next: AtomicUsize,
    info: ExportInfo,
    timeout: Duration,
    name: String,
    /// Serialises read-modify-writes of blocks below the server's minimum size.
    rmw: Mutex<()>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.name)
            .field("info", &self.info)
            .field("connections", &self.conns.len())
            .finish()
    }
}

impl Client {
    /// Connects and negotiates (see the module's notes).
    pub fn connect(uri: &NbdUri, config: &ClientConfig) -> Result<Client, ClientError> {
        let with_timeout;
        let config = match uri.timeout {
            Some(timeout) => {
                with_timeout = ClientConfig {
                    timeout,
                    ..config.clone()
                };
                &with_timeout
            }
            None => config,
        };
        let with_psk;
        let config = match psk_config(uri, config)? {
            Some(c) => {
                with_psk = c;
                &with_psk
            }
            None => config,
        };
        if uri.tls && config.tls.is_none() {
            // Before connecting: the missing option is the error, not an unreachable host.
            return Err(ClientError::TlsNoCa {
                uri: uri.text.clone(),
            });
        }
        let (first, info) = open_conn(uri, config)?;
        let mut conns = vec![first];
        if info.can_multi_conn() {
            for _ in 1..config.connections.max(1) {
                let (c, more) = open_conn(uri, config)?;
                if more.size_bytes != info.size_bytes {
                    return Err(ClientError::Handshake {
                        uri: uri.text.clone(),
                        why: "the export changed size between connections".into(),
                    });
                }
                conns.push(c);
            }
        }
        Ok(Client {
            conns,
            next: AtomicUsize::new(0),
            info,
            timeout: config.timeout,
            name: uri.text.clone(),
            rmw: Mutex::new(()),
        })
    }

    /// Parses `uri` and connects.
    pub fn open(uri: &str, config: &ClientConfig) -> Result<Client, ClientError> {
        Client::connect(&NbdUri::parse(uri)?, config)
    }

    /// What the server said about the export.
    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// The URI it was opened with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connections open (more than one only with multi-conn).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Whether the connections are open, why one closed, and the reply latency.
    pub fn status(&self) -> ConnStatus {
        let error = self.conns.iter().find_map(|c| lock(&c.state).dead.clone());
        let seen: Vec<u64> = self
            .conns
            .iter()
            .filter_map(|c| c.latency.average_us())
            .collect();
        let mut latency = LatencyHistogram::default();
        for c in &self.conns {
            latency.add(&c.latency.histogram());
        }
        ConnStatus {
            connected: error.is_none(),
            error,
            latency_us: (!seen.is_empty()).then(|| seen.iter().sum::<u64>() / seen.len() as u64),
            latency,
            connections: self.conns.len(),
            tls: self.name.starts_with("nbds"),
        }
    }

    fn conn(&self) -> &Arc<Conn> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        &self.conns[i]
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size_bytes => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: access {offset}+{len} beyond the end of the export ({} bytes)",
                    self.name, self.info.size_bytes
                ),
            )),
        }
    }

    fn aligned(&self, offset: u64, len: u64) -> bool {
        let a = u64::from(self.info.min_block_bytes.max(1));
        offset.is_multiple_of(a) && len.is_multiple_of(a)
    }

    /// Largest payload per request, a multiple of the minimum block size.
    fn piece_bytes(&self) -> usize {
        let min = self.info.min_block_bytes.max(1);
        (self.info.max_payload_bytes / min * min).max(min) as usize
    }

    /// Sends one READ of `len` bytes, aligned and within the payload limit; the ticket
    /// gives the data. For callers that keep several reads in flight themselves.
    pub fn start_read(&self, offset: u64, len: u32) -> Ticket {
        self.conn()
            .send(Command::Read, 0, offset, len, &[], self.timeout)
    }

    /// Sends one WRITE of `buf`, aligned and within the payload limit.
    pub fn start_write(&self, buf: &[u8], offset: u64, fua: bool) -> Ticket {
        let flags = if fua && self.info.can_fua() {
            CMD_FLAG_FUA
        } else {
            0
        };
        self.conn().send(
            Command::Write,
            flags,
            offset,
            buf.len() as u32,
            buf,
            self.timeout,
        )
    }

    /// Whether `start_read`/`start_write` take this IO as one request.
    pub fn fits_one_request(&self, offset: u64, len: usize) -> bool {
        len > 0
            && len <= self.piece_bytes()
            && self.aligned(offset, len as u64)
            && self.check_range(offset, len as u64).is_ok()
    }

    /// Fills `buf` from `offset` (requests split at the maximum payload, several in flight).
    pub fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if !self.aligned(offset, buf.len() as u64) {
            let (start, end) = self.widen(offset, buf.len() as u64);
            let mut tmp = vec![0u8; (end - start) as usize];
            self.read(&mut tmp, start)?;
            let at = (offset - start) as usize;
            buf.copy_from_slice(&tmp[at..at + buf.len()]);
            return Ok(());
        }
        let piece = self.piece_bytes();
        let tickets: Vec<(usize, Ticket)> = (0..buf.len())
            .step_by(piece)
            .map(|at| {
                let n = piece.min(buf.len() - at);
                (at, self.start_read(offset + at as u64, n as u32))
            })
            .collect();
        let mut first_err = None;
        for (at, t) in tickets {
            match t.wait() {
                Ok(data) => buf[at..at + data.len()].copy_from_slice(&data),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The range widened to whole blocks of the minimum size (the export's size is a
    /// multiple of it, as the protocol asks; where not, the last piece is out of range).
    fn widen(&self, offset: u64, len: u64) -> (u64, u64) {
        let a = u64::from(self.info.min_block_bytes.max(1));
        (offset / a * a, (offset + len).div_ceil(a) * a)
    }

    /// Writes all of `buf` at `offset`; with `fua`, durable when it returns (a flush after
    /// it where the server has no FUA).
    pub fn write(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if !self.aligned(offset, buf.len() as u64) {
            // Read-modify-write of the blocks around it, one at a time: two of these on
            // one block must not interleave.
            let _g = lock(&self.rmw);
            let (start, end) = self.widen(offset, buf.len() as u64);
            let mut tmp = vec![0u8; (end - start) as usize];
            self.read(&mut tmp, start)?;
            let at = (offset - start) as usize;
            tmp[at..at + buf.len()].copy_from_slice(buf);
            return self.write(&tmp, start, fua);
        }
        let piece = self.piece_bytes();
        let tickets: Vec<Ticket> = (0..buf.len())
            .step_by(piece)
            .map(|at| {
                let n = piece.min(buf.len() - at);
                self.start_write(&buf[at..at + n], offset + at as u64, fua)
            })
            .collect();
        let mut first_err = None;
        for t in tickets {
            if let Err(e) = t.wait() {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if fua && !self.info.can_fua() {
            return self.flush();
        }
        Ok(())
    }

    /// Makes completed writes durable (NBD_CMD_FLUSH; nothing to do where the server has no
    /// write cache to flush).
    pub fn flush(&self) -> io::Result<()> {
        if !self.info.can_flush() {
            return Ok(());
        }
        self.conn()
            .send(Command::Flush, 0, 0, 0, &[], self.timeout)
            .wait()
            .map(|_| ())
    }

    fn ranged(&self, command: Command, flags: u16, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len)?;
        let min = u64::from(self.info.min_block_bytes.max(1));
        let step = MAX_ZERO_REQUEST_BYTES / min * min;
        let tickets: Vec<Ticket> = (0..len)
            .step_by(step as usize)
            .map(|at| {
                let n = step.min(len - at);
                self.conn()
                    .send(command, flags, offset + at, n as u32, &[], self.timeout)
            })
            .collect();
        let mut first_err = None;
        for t in tickets {
            if let Err(e) = t.wait() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// NBD_CMD_TRIM of the whole blocks inside the range (advisory: what it reads back as
    /// afterwards is the server's choice). Nothing is sent where the server takes no TRIM.
    pub fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len)?;
        if !self.info.can_trim() || self.info.read_only() {
            return Ok(());
        }
        let a = u64::from(self.info.min_block_bytes.max(1));
        let start = offset.div_ceil(a) * a;
        let end = (offset + len) / a * a;
        if end <= start {
            return Ok(());
        }
        self.ranged(Command::Trim, 0, start, end - start)
    }

    /// Makes the range read as zeros: NBD_CMD_WRITE_ZEROES where offered (`no_hole` keeps
    /// it allocated), else writes of zeros.
    pub fn write_zeroes(&self, offset: u64, len: u64, no_hole: bool, fua: bool) -> io::Result<()> {
        self.check_range(offset, len)?;
        if !self.info.can_write_zeroes() || !self.aligned(offset, len) {
            let step = self.piece_bytes().min(1 << 20) as u64;
            let zeros = vec![0u8; step.min(len) as usize];
            let mut done = 0;
            while done < len {
                let n = step.min(len - done);
                self.write(&zeros[..n as usize], offset + done, fua)?;
                done += n;
            }
            return Ok(());
        }
        let mut flags = if no_hole { CMD_FLAG_NO_HOLE } else { 0 };
        if fua && self.info.can_fua() {
            flags |= CMD_FLAG_FUA;
        }
        self.ranged(Command::WriteZeroes, flags, offset, len)?;
        if fua && !self.info.can_fua() {
            return self.flush();
        }
        Ok(())
    }

    /// `base:allocation` from `offset` (NBD_CMD_BLOCK_STATUS): runs in order, the first
    /// starting at `offset`, covering at most `len` bytes and at least one (the server may
    /// say less than asked; ask again from where it stopped). Fails `Unsupported` where
    /// the server did not set the context ([`ExportInfo::block_status`]).
    pub fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<crate::Extent>> {
        self.check_range(offset, len)?;
        let Some(conn) = self.conns.iter().find(|c| c.alloc_context.is_some()) else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: the server gives no base:allocation", self.name),
            ));
        };
        if len == 0 {
            return Ok(Vec::new());
        }
        // Whole blocks of the server's minimum size, at most what a u32 length holds.
        let a = u64::from(self.info.min_block_bytes.max(1));
        let start = offset / a * a;
        let end = (offset + len)
            .div_ceil(a)
            .saturating_mul(a)
            .min(self.info.size_bytes)
            .min(start + (u64::from(u32::MAX) / a * a));
        let descriptors = conn
            .send(
                Command::BlockStatus,
                0,
                start,
                (end - start) as u32,
                &[],
                self.timeout,
            )
            .wait_status()?;
        let mut out: Vec<crate::Extent> = Vec::new();
        let mut at = start;
        for (length, flags) in descriptors {
            let length = u64::from(length);
            // Only the part inside [offset, offset + len): the widening and anything the
            // server said past the request are cut off.
            let from = at.max(offset);
            let to = (at + length).min(offset + len);
            at += length;
            if to <= from {
                if at >= offset + len {
                    break;
                }
                continue;
            }
            out.push(crate::Extent {
                length: to - from,
                hole: flags & STATE_HOLE != 0,
                zero: flags & STATE_ZERO != 0,
            });
        }
        if out.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: block status at {offset} covered nothing", self.name),
            ));
        }
        Ok(out)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        for c in &self.conns {
            let alive = lock(&c.state).dead.is_none();
            if alive {
                // NBD_CMD_DISC: the server finishes what it has and closes.
                let header = encode_request(&Request {
                    flags: 0,
                    command: Command::Disc,
                    cookie: u64::MAX,
                    offset: 0,
                    length: 0,
                });
                let _w = lock(&c.writer);
                let _ = c.stream.write_all_vectored(&[&header]);
            }
            c.kill("the client closed it");
            if let Some(h) = lock(&c.watcher).take() {
                let _ = h.join();
            }
        }
    }
}

// ---- the handshake ----

struct Handshake<'a> {
    uri: &'a NbdUri,
    stream: &'a Stream,
}

impl Handshake<'_> {
    fn io(&self, source: io::Error) -> ClientError {
        ClientError::Io {
            uri: self.uri.text.clone(),
            source,
        }
    }
    fn protocol(&self, source: ProtocolError) -> ClientError {
        ClientError::Protocol {
            uri: self.uri.text.clone(),
            source,
        }
    }
    fn fail(&self, why: impl Into<String>) -> ClientError {
        ClientError::Handshake {
            uri: self.uri.text.clone(),
            why: why.into(),
        }
    }

    fn read(&self, buf: &mut [u8]) -> Result<(), ClientError> {
        let mut s = self.stream;
        s.read_exact(buf).map_err(|e| self.io(e))
    }

    fn send(&self, bufs: &[&[u8]]) -> Result<(), ClientError> {
        self.stream.write_all_vectored(bufs).map_err(|e| self.io(e))
    }

    fn option(&self, option: u32, data: &[u8]) -> Result<(), ClientError> {
        self.send(&[&encode_option_header(option, data.len() as u32), data])
    }

    /// One option reply for `option`, with its data (bounded).
    fn reply(&self, option: u32) -> Result<(OptionReply, Vec<u8>), ClientError> {
        let mut h = [0u8; OPTION_REPLY_BYTES];
        self.read(&mut h)?;
        let r = parse_option_reply(&h).map_err(|e| self.protocol(e))?;
        if r.option != option {
            return Err(self.fail(format!(
                "reply to option {} while option {option} was asked",
                r.option
            )));
        }
        if r.length > 64 << 10 {
            return Err(self.fail(format!("an option reply of {} bytes", r.length)));
        }
        let mut data = vec![0u8; r.length as usize];
        self.read(&mut data)?;
        Ok((r, data))
    }

    fn refused(&self, r: &OptionReply, data: &[u8]) -> ClientError {
        let text = String::from_utf8_lossy(data);
        ClientError::Refused {
            uri: self.uri.text.clone(),
            export: self.uri.export.clone(),
            reply: r.reply,
            message: if text.is_empty() {
                String::new()
            } else {
                format!(": {text}")
            },
        }
    }
}

fn connect_stream(uri: &NbdUri, timeout: Duration) -> Result<Stream, ClientError> {
    let fail = |addr: String, source: io::Error| ClientError::Connect {
        uri: uri.text.clone(),
        addr,
        source,
    };
    match &uri.address {
        Address::Unix(path) => UnixStream::connect(path)
            .map(Stream::Unix)
            .map_err(|e| fail(path.display().to_string(), e)),
        Address::Tcp { host, port } => {
            let shown = format!("{host}:{port}");
            let addrs = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| fail(shown.clone(), e))?;
            let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
            for a in addrs {
                match TcpStream::connect_timeout(&a, timeout) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(fail(shown, last))
        }
    }
}

/// `config` with the TLS-PSK client of `uri` (its own `?tls-psk-file=`, or its username
/// with `config`'s key file); `None` when `config` serves as it is.
fn psk_config(uri: &NbdUri, config: &ClientConfig) -> Result<Option<ClientConfig>, ClientError> {
    if !uri.tls {
        return Ok(None);
    }
    let user = uri.tls_username.as_deref();
    let tls = match (&uri.tls_psk_file, &config.tls) {
        (Some(file), _) => crate::tls::TlsClient::from_psk_file(file, user),
        (None, Some(t)) => match t.for_username(user) {
            Ok(Some(t)) => Ok(t),
            Ok(None) => return Ok(None),
            Err(e) => Err(e),
        },
        (None, None) => return Ok(None),
    }
    .map_err(|source| ClientError::TlsPsk {
        uri: uri.text.clone(),
        source,
    })?;
    Ok(Some(ClientConfig {
        tls: Some(tls),
        ..config.clone()
    }))
}

/// STARTTLS and the TLS handshake, the server's certificate checked against the CA of
/// `config` (or the pre-shared key proved); returns the stream the rest goes over.
fn starttls(hs: &Handshake<'_>, config: &ClientConfig) -> Result<Stream, ClientError> {
    let uri = hs.uri;
    let tls = config.tls.as_ref().ok_or_else(|| ClientError::TlsNoCa {
        uri: uri.text.clone(),
    })?;
    hs.option(OPT_STARTTLS, &[])?;
    let (r, data) = hs.reply(OPT_STARTTLS)?;
    if r.reply != REP_ACK {
        let text = String::from_utf8_lossy(&data);
        return Err(hs.fail(format!(
            "the server refused STARTTLS (reply {:#x}) {text}",
            r.reply
        )));
    }
    let host = match (&uri.tls_hostname, &uri.address) {
        (Some(h), _) => h.as_str(),
        (None, Address::Tcp { host, .. }) => host.as_str(),
        (None, Address::Unix(_)) => "localhost",
    };
    tls.connect(hs.stream, host, config.timeout)
        .map_err(|source| {
            // No shared version is said as that, whatever the credentials.
            if crate::tls::version_mismatch(&source) {
                return ClientError::TlsVersion {
                    uri: uri.text.clone(),
                    why: source.to_string(),
                };
            }
            if crate::tls::unanswered(&source) {
                return ClientError::TlsUnanswered {
                    uri: uri.text.clone(),
                    identity: tls.psk_identity().map(str::to_string),
                };
            }
            if let Some(identity) = tls.psk_identity() {
                // With PSK the key is the only credential: a handshake the server breaks
                // off (an alert, or a close) is the key refused. A timeout is not.
                if !matches!(
                    source.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                ) {
                    return ClientError::PskRefused {
                        uri: uri.text.clone(),
                        identity: identity.to_string(),
                        why: source.to_string(),
                    };
                }
            }
            match crate::tls::certificate_problem(&source, host) {
                Some(why) => ClientError::Certificate {
                    uri: uri.text.clone(),
                    why,
                },
                None => ClientError::Tls {
                    uri: uri.text.clone(),
                    source,
                },
            }
        })
}

/// `r`, or [`ClientError::TlsClosed`] where it failed because the server closed the
/// connection (the first exchange after TLS).
fn closed_once_tls_up<T>(r: Result<T, ClientError>, uri: &NbdUri) -> Result<T, ClientError> {
    match r {
        Err(ClientError::Io { source, .. })
            if matches!(
                source.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
            ) =>
        {
            Err(ClientError::TlsClosed {
                uri: uri.text.clone(),
            })
        }
        r => r,
    }
}

/// Connects, negotiates and starts the reader thread of one connection.
fn open_conn(uri: &NbdUri, config: &ClientConfig) -> Result<(Arc<Conn>, ExportInfo), ClientError> {
    negotiate(connect_stream(uri, config.timeout)?, uri, config)
}

/// The handshake on a connected stream, then the reader thread.
fn negotiate(
    stream: Stream,
    uri: &NbdUri,
    config: &ClientConfig,
) -> Result<(Arc<Conn>, ExportInfo), ClientError> {
    let hs = Handshake {
        uri,
        stream: &stream,
    };
    stream
        .set_read_timeout(Some(config.timeout))
        .and_then(|_| stream.set_write_timeout(Some(config.timeout)))
        .map_err(|e| hs.io(e))?;

    let mut greeting = [0u8; 18];
    hs.read(&mut greeting)?;
    let magic = u64::from_be_bytes(greeting[0..8].try_into().expect("8 bytes"));
    let opt_magic = u64::from_be_bytes(greeting[8..16].try_into().expect("8 bytes"));
    if magic != NBD_MAGIC {
        return Err(hs.fail("not an NBD server (no NBDMAGIC)"));
    }
    if opt_magic != IHAVEOPT {
        return Err(hs.fail("an oldstyle server; uraid speaks fixed newstyle only"));
    }
    let server_flags = u16::from_be_bytes([greeting[16], greeting[17]]);
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(hs.fail("the server does not speak fixed newstyle"));
    }
    let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
    let mut client_flags = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        client_flags |= FLAG_C_NO_ZEROES;
    }
    hs.send(&[&client_flags.to_be_bytes()])?;
    let stream = if uri.tls {
        starttls(&hs, config)?
    } else {
        stream
    };
    let hs = Handshake {
        uri,
        stream: &stream,
    };

    // A server that closes the connection as soon as TLS is up (nbd-server 3.24 with TLS
    // does, to a client without a certificate of its own) is named for it, not left as
    // an end of file; the first send may already find it closed (the pump gone): a
    // broken pipe, named the same way.
    let mut first_after_tls = uri.tls;
    let mut reply = |option: u32| {
        let r = hs.reply(option);
        if std::mem::take(&mut first_after_tls) {
            return closed_once_tls_up(r, uri);
        }
        r
    };
    let send = |option: u32, data: &[u8], first: bool| {
        let r = hs.option(option, data);
        if first && uri.tls {
            return closed_once_tls_up(r, uri);
        }
        r
    };
    let mut structured = false;
    if config.structured_replies {
        send(OPT_STRUCTURED_REPLY, &[], true)?;
        let (r, _) = reply(OPT_STRUCTURED_REPLY)?;
        structured = r.reply == REP_ACK;
    }

    let name = uri.export.as_bytes();
    // `base:allocation`, for where the export reads as zeros (a recovery over this member
    // then skips what was never written); a server without it answers an error or sets
    // nothing, and the export is all data.
    let mut alloc_context = None;
    if structured {
        let query = encode_meta_context_request(name, &[BASE_ALLOCATION]);
        send(OPT_SET_META_CONTEXT, &query, false)?;
        loop {
            let (r, data) = reply(OPT_SET_META_CONTEXT)?;
            match r.reply {
                REP_ACK => break,
                REP_META_CONTEXT => {
                    let (id, context) =
                        parse_meta_context_reply(&data).map_err(|e| hs.protocol(e))?;
                    if context == BASE_ALLOCATION {
                        alloc_context = Some(id);
                    }
                }
                _ if r.is_error() => {
                    alloc_context = None;
                    break;
                }
                _ => {}
            }
        }
    }
    send(
        OPT_GO,
        &encode_info_request(name, &[INFO_BLOCK_SIZE]),
        !config.structured_replies,
    )?;
    let mut export: Option<(u64, u16)> = None;
    let mut blocks: Option<(u32, u32, u32)> = None;
    loop {
        let (r, data) = reply(OPT_GO)?;
        match r.reply {
            REP_ACK => break,
            REP_INFO => match parse_info_reply(&data).map_err(|e| hs.protocol(e))? {
                Info::Export { size_bytes, flags } => export = Some((size_bytes, flags)),
                Info::BlockSize {
                    min_bytes,
                    preferred_bytes,
                    max_bytes,
                } => blocks = Some((min_bytes, preferred_bytes, max_bytes)),
                Info::Other(_) => {}
            },
            REP_ERR_UNSUP => {
                // A server from before NBD_OPT_GO: the old way, which cannot fail politely.
                hs.option(OPT_EXPORT_NAME, name)?;
                let mut b = [0u8; 10 + 124];
                let n = if no_zeroes { 10 } else { b.len() };
                hs.read(&mut b[..n])?;
                export = Some((
                    u64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
                    u16::from_be_bytes([b[8], b[9]]),
                ));
                break;
            }
            REP_ERR_TLS_REQD => {
                return Err(ClientError::TlsRequired {
                    uri: uri.text.clone(),
                })
            }
            _ if r.is_error() => return Err(hs.refused(&r, &data)),
            _ => {} // another reply type (a description): ignored
        }
    }
    let (size_bytes, flags) = export.ok_or_else(|| hs.fail("GO ended without NBD_INFO_EXPORT"))?;
    let (min_bytes, preferred_bytes, max_bytes) = blocks.unwrap_or((1, 4096, MAX_REQUEST_BYTES));
    if !min_bytes.is_power_of_two() || min_bytes > 64 << 10 || max_bytes < min_bytes {
        return Err(hs.fail(format!(
            "impossible block sizes: minimum {min_bytes}, maximum {max_bytes}"
        )));
    }
    let info = ExportInfo {
        size_bytes,
        flags,
        min_block_bytes: min_bytes,
        preferred_block_bytes: preferred_bytes,
        max_payload_bytes: max_bytes.min(MAX_REQUEST_BYTES),
        structured_replies: structured,
        block_status: alloc_context.is_some(),
    };
    // Transmission: a read waits at most `timeout` (a reader that sees nothing for that
    // long while requests are pending closes the connection), and so may a send.
    stream
        .set_read_timeout(Some(config.timeout))
        .map_err(|e| hs.io(e))?;
    let watch = WakePipe::new().map_err(|e| hs.io(e))?;
    let conn = Arc::new(Conn {
        writer: Mutex::new(()),
        stream,
        state: Mutex::new(State {
            pending: HashMap::new(),
            next_cookie: 1,
            dead: None,
            reading: false,
            sleepers: VecDeque::new(),
        }),
        input: Mutex::new(Input {
            buf: vec![0; INPUT_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            scratch: Vec::new(),
        }),
        watch,
        name: uri.text.as_str().into(),
        timeout: config.timeout,
        watcher: Mutex::new(None),
        latency: Latency::default(),
        alloc_context,
    });
    let c = conn.clone();
    let handle = std::thread::Builder::new()
        .name("nbd-client".into())
        .spawn(move || watcher_loop(&c))
        .map_err(|source| ClientError::Io {
            uri: uri.text.clone(),
            source,
        })?;
    *lock(&conn.watcher) = Some(handle);
    Ok((conn, info))
}

/// The client against a server that is `stream` (the fuzz target's socketpair): the
/// handshake, then one of each request, whatever the server answers.
pub(crate) fn exercise(stream: Stream) {
    let uri = NbdUri {
        text: "fuzz".into(),
        address: Address::Unix(PathBuf::new()),
        export: "fuzz".into(),
        tls: false,
        tls_hostname: None,
        tls_psk_file: None,
        tls_username: None,
        timeout: None,
    };
    let config = ClientConfig {
        timeout: Duration::from_secs(10),
        ..ClientConfig::default()
    };
    let Ok((conn, info)) = negotiate(stream, &uri, &config) else {
        return;
    };
    let c = Client {
        conns: vec![conn],
        next: AtomicUsize::new(0),
        info,
        timeout: config.timeout,
        name: uri.text.clone(),
        rmw: Mutex::new(()),
    };
    let mut b = vec![0u8; info.size_bytes.min(4096) as usize];
    if c.read(&mut b, 0).is_ok() {
        let _ = c.write(&b, 0, true);
    }
    let _ = c.flush();
    let _ = c.trim(0, b.len() as u64);
    let _ = c.write_zeroes(0, b.len() as u64, true, false);
    let _ = c.block_status(0, b.len() as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        let u = NbdUri::parse("nbd://example.org:1234/disk%201").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "example.org".into(),
                port: 1234
            }
        );
        assert_eq!(u.export, "disk 1");
        let u = NbdUri::parse("nbd://10.0.0.1").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "10.0.0.1".into(),
                port: DEFAULT_PORT
            }
        );
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://[::1]:10810/e").unwrap();
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "::1".into(),
                port: 10810
            }
        );
        let u = NbdUri::parse("nbd+unix:///md0?socket=/run/x.sock").unwrap();
        assert_eq!(u.address, Address::Unix("/run/x.sock".into()));
        assert_eq!(u.export, "md0");
        let u = NbdUri::parse("nbds://h/e").unwrap();
        assert!(u.tls && u.tls_hostname.is_none() && !u.export.is_empty());
        let u = NbdUri::parse("nbds+unix:///e?socket=/s&tls-hostname=srv").unwrap();
        assert!(u.tls);
        assert_eq!(u.tls_hostname.as_deref(), Some("srv"));
        let u = NbdUri::parse("nbds://h:1/e?tls-psk-file=/k%20s&tls-username=al").unwrap();
        assert_eq!(
            u.tls_psk_file.as_deref(),
            Some(std::path::Path::new("/k s"))
        );
        assert_eq!(u.tls_username.as_deref(), Some("al"));
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "h".into(),
                port: 1
            }
        );
        // libnbd's other spelling of the username: the URI's user.
        let u = NbdUri::parse("nbds://alice@[::1]:2/e?tls-psk-file=/k").unwrap();
        assert_eq!(u.tls_username.as_deref(), Some("alice"));
        assert_eq!(
            u.address,
            Address::Tcp {
                host: "::1".into(),
                port: 2
            }
        );
        let u = NbdUri::parse("nbds+unix:///e?socket=/s&tls-psk-file=/k").unwrap();
        assert_eq!(u.tls_psk_file.as_deref(), Some(std::path::Path::new("/k")));
        assert!(u.tls_username.is_none());
        for plain in [
            "nbd://h/e?tls-psk-file=/k",
            "nbd://al@h/e",
            "nbd://h/e?tls-username=a",
        ] {
            let e = NbdUri::parse(plain).unwrap_err().to_string();
            assert!(e.contains("nbds://"), "{plain}: {e}");
        }
        assert!(!NbdUri::parse("nbd://h/e").unwrap().tls);
        for bad in [
            "nbd+unix:///e",
            "nbd+unix://host/e?socket=/s",
            "nbd:///e",
            "nbd://h:port/e",
            "http://h/e",
            "nbd://h/e?x=1",
        ] {
            assert!(
                matches!(NbdUri::parse(bad), Err(ClientError::BadUri { .. })),
                "{bad}"
            );
        }
        assert!(is_nbd_uri("nbds://h/e") && is_nbd_uri("nbd+unix:///e?socket=/s"));
    }

    #[test]
    fn a_uri_may_give_its_own_timeout_and_a_bad_one_is_named() {
        assert_eq!(NbdUri::parse("nbd://h/e").unwrap().timeout, None);
        let u = NbdUri::parse("nbd+unix:///e?socket=/s&timeout=2.5").unwrap();
        assert_eq!(u.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(u.address, Address::Unix("/s".into()));
        let u = NbdUri::parse("nbd://h:1/e?timeout=7").unwrap();
        assert_eq!(u.timeout, Some(Duration::from_secs(7)));
        for bad in ["0", "-1", "abc", "", "inf", "NaN", "1e30"] {
            let uri = format!("nbd://h/e?timeout={bad}");
            let e = NbdUri::parse(&uri).unwrap_err().to_string();
            assert!(
                e.contains(&format!("?timeout={bad}:")) && e.contains("seconds above zero"),
                "{uri}: {e}"
            );
        }
        assert!(!is_nbd_uri("/dev/sda") && !is_nbd_uri("nbd.img"));
    }
}
