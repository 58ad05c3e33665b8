//! Accept loop, connection threads and shutdown.

use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backend::Backend;
use crate::conn::{self, BufferBudget, ConnConfig};
use crate::error::NbdError;
use crate::handshake::{self, ExportInfo};
use crate::proto::ExportLimits;
use crate::socket::{Listener, Stream, WakePipe};

/// Largest READ/WRITE payload the protocol lets a server demand support for.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u32 = 32 * 1024 * 1024;

/// How the server runs. `Default` gives sensible limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Name of the export; the empty (default) name is accepted too.
    pub export_name: String,
    /// Human-readable description (`NBD_INFO_DESCRIPTION`).
    pub description: String,
    /// Connections served at once; more are closed right after accept.
    pub max_connections: usize,
    /// Requests in flight per connection (worker threads per connection).
    pub workers_per_connection: usize,
    /// Largest READ/WRITE payload; a longer write drops the connection.
    pub max_payload_bytes: u32,
    /// Memory for payloads above 256 KiB (above 16 KiB for the workers of a
    /// connection past its sixteenth), shared by all connections; smaller
    /// buffers are kept per worker, so the server's buffer memory is at most
    /// this plus `max_connections` x (64 KiB + 4 MiB + `workers_per_connection` x 16 KiB):
    /// the workers of one connection keep at most 4 MiB of 256 KiB buffers between
    /// requests, and 16 KiB each besides.
    pub buffer_budget_bytes: usize,
    /// Time a client has to complete the handshake (none in the transmission phase).
    pub handshake_timeout: Option<Duration>,
    /// A client that does not take a reply, or stalls in the middle of a
    /// large write payload, for this long is dropped: it cannot hold workers,
    /// buffer memory or shutdown forever. (Idle clients are never dropped.)
    pub io_timeout: Option<Duration>,
    /// TLS offered to clients (`NBD_OPT_STARTTLS`), or required of them.
    pub tls: Option<crate::tls::TlsServer>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            export_name: "uraid".to_string(),
            description: String::new(),
            max_connections: 64,
            workers_per_connection: 16,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            buffer_budget_bytes: 512 * 1024 * 1024,
            handshake_timeout: Some(Duration::from_secs(30)),
            io_timeout: Some(Duration::from_secs(60)),
            tls: None,
        }
    }
}

/// Counters of a finished [`Server::serve`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeStats {
    pub connections_accepted: u64,
    pub connections_refused: u64,
}

#[derive(Debug)]
struct StopSignal {
    stop: AtomicBool,
    pipe: WakePipe,
}

/// Stops a running [`Server::serve`]; cheap to clone and send to other threads.
#[derive(Debug, Clone)]
pub struct ShutdownHandle(Arc<StopSignal>);

impl ShutdownHandle {
    /// Asks the server to stop: no new connections, in-flight requests are
    /// answered, the backend is flushed, then `serve` returns.
    pub fn shutdown(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        self.0.pipe.wake();
    }
}

/// An NBD server for one export.
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    signal: Arc<StopSignal>,
}

/// A server running on its own thread (see [`Server::spawn`]).
#[derive(Debug)]
pub struct RunningServer {
    handle: ShutdownHandle,
    thread: JoinHandle<Result<ServeStats, NbdError>>,
}

impl RunningServer {
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Stops the server and waits for it.
    pub fn shutdown(self) -> Result<ServeStats, NbdError> {
        self.handle.shutdown();
        match self.thread.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

struct Live {
    streams: HashMap<u64, Arc<Stream>>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    pub fn new(config: ServerConfig) -> Result<Server, NbdError> {
        assert!(config.workers_per_connection >= 1);
        assert!(config.buffer_budget_bytes >= config.max_payload_bytes as usize);
        Ok(Server {
            config,
            signal: Arc::new(StopSignal {
                stop: AtomicBool::new(false),
                pipe: WakePipe::new()?,
            }),
        })
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.signal.clone())
    }

    /// Serves on another thread.
    pub fn spawn(
        self,
        listener: Listener,
        backend: Arc<dyn Backend>,
    ) -> Result<RunningServer, NbdError> {
        let handle = self.shutdown_handle();
        let thread = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || self.serve(listener, backend))
            .map_err(NbdError::Spawn)?;
        Ok(RunningServer { handle, thread })
    }

    fn export_info(&self, backend: &dyn Backend) -> ExportInfo {
        let min_block_bytes = backend.min_block_size().max(1);
        assert!(min_block_bytes.is_power_of_two() && min_block_bytes <= 65536);
        let preferred = backend
            .block_size()
            .max(min_block_bytes)
            .max(512)
            .next_power_of_two();
        ExportInfo {
            name: self.config.export_name.clone(),
            description: self.config.description.clone(),
            size_bytes: backend.size_bytes(),
            read_only: backend.read_only(),
            min_block_bytes,
            preferred_block_bytes: preferred,
            max_payload_bytes: self.config.max_payload_bytes / min_block_bytes * min_block_bytes,
            fast_zero: !backend.read_only() && backend.can_fast_zero(),
            dirty_bitmap: backend.dirty_bitmap(),
        }
    }

    /// Accepts and serves clients until [`ShutdownHandle::shutdown`]; then
    /// waits for every connection to finish its requests and flushes the backend.
    pub fn serve(
        &self,
        listener: Listener,
        backend: Arc<dyn Backend>,
    ) -> Result<ServeStats, NbdError> {
        let export = self.export_info(&*backend);
        let budget = Arc::new(BufferBudget::new(self.config.buffer_budget_bytes));
        let live = Arc::new(Mutex::new(Live {
            streams: HashMap::new(),
            threads: Vec::new(),
        }));
        let next_id = AtomicU64::new(0);
        let mut stats = ServeStats::default();
        listener.set_nonblocking(true)?;
        tracing::info!(
            "nbd: serving export {:?} ({} bytes)",
            export.name,
            export.size_bytes
        );

        let accept_result = loop {
            if self.signal.stop.load(Ordering::SeqCst) {
                break Ok(());
            }
            match self
                .signal
                .pipe
                .wait_readable(std::os::fd::AsRawFd::as_raw_fd(&listener))
            {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => break Err(NbdError::Accept(e)),
            }
            let stream = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if is_transient_accept_error(&e) => {
                    tracing::warn!("nbd: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => break Err(NbdError::Accept(e)),
            };
            let mut live_guard = live.lock().unwrap_or_else(|e| e.into_inner());
            live_guard.threads.retain(|t| !t.is_finished());
            if live_guard.streams.len() >= self.config.max_connections {
                stats.connections_refused += 1;
                tracing::warn!(
                    "nbd: refusing a connection: {} already open",
                    self.config.max_connections
                );
                continue;
            }
            if stream.set_nonblocking(false).is_err() {
                continue;
            }
            let stream = Arc::new(stream);
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            live_guard.streams.insert(id, stream.clone());
            let ctx = ConnCtx {
                id,
                stream,
                backend: backend.clone(),
                // Read per connection: a backend whose size or state changed while served
                // (an array grown) is seen as it is now by a client that connects now.
                export: Arc::new(self.export_info(&*backend)),
                budget: budget.clone(),
                live: live.clone(),
                signal: self.signal.clone(),
                config: self.config.clone(),
            };
            match std::thread::Builder::new()
                .name("nbd-conn".into())
                .spawn(move || ctx.run())
            {
                Ok(t) => {
                    live_guard.threads.push(t);
                    stats.connections_accepted += 1;
                }
                Err(e) => {
                    live_guard.streams.remove(&id);
                    tracing::warn!("nbd: cannot start a connection thread: {e}");
                }
            }
        };

        // Stop reading from every client; requests already read still get answers.
        let threads = {
            let mut g = live.lock().unwrap_or_else(|e| e.into_inner());
            for s in g.streams.values() {
                s.shutdown(Shutdown::Read);
            }
            std::mem::take(&mut g.threads)
        };
        drop(listener);
        for t in threads {
            let _ = t.join();
        }
        backend.flush().map_err(NbdError::FinalFlush)?;
        accept_result.map(|()| stats)
    }
}

fn is_transient_accept_error(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::ECONNABORTED)
    )
}

struct ConnCtx {
    id: u64,
    stream: Arc<Stream>,
    backend: Arc<dyn Backend>,
    export: Arc<ExportInfo>,
    budget: Arc<BufferBudget>,
    live: Arc<Mutex<Live>>,
    signal: Arc<StopSignal>,
    config: ServerConfig,
}

impl ConnCtx {
    fn run(self) {
        // Leaves the registry and closes even if something below panics.
        struct Release<'a>(&'a ConnCtx);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                // Leave the registry before the client sees the close, so a
                // client that reconnects at once finds the slot free.
                self.0
                    .live
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .streams
                    .remove(&self.0.id);
                self.0.stream.shutdown(Shutdown::Both);
            }
        }
        let _release = Release(&self);
        let served =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handshake_and_serve()));
        match served {
            Ok(Ok(())) => tracing::debug!("nbd: connection {} closed", self.id),
            Ok(Err(e)) => tracing::debug!("nbd: connection {} ended: {e}", self.id),
            // Release closes the socket; the server and its other connections go on.
            Err(p) => tracing::error!(
                "nbd: connection {} panicked ({}); closed",
                self.id,
                crate::conn::panic_message(&*p)
            ),
        }
    }

    fn handshake_and_serve(&self) -> Result<(), NbdError> {
        self.stream.set_write_timeout(self.config.io_timeout)?;
        let (negotiated, tls_stream) = handshake::negotiate_tls(
            &self.stream,
            &self.export,
            &self.signal.stop,
            self.config.handshake_timeout,
            self.config.tls.as_ref(),
        )?;
        // Over TLS the connection goes on on the pump's plain end; shutting the TCP socket
        // (at server shutdown) ends the pump and so this stream too.
        let stream = tls_stream.as_ref().unwrap_or(&self.stream);
        if tls_stream.is_some() {
            stream.set_write_timeout(self.config.io_timeout)?;
        }
        let limits = ExportLimits {
            size_bytes: self.export.size_bytes,
            read_only: self.export.read_only,
            max_payload_bytes: self.export.max_payload_bytes,
            min_block_bytes: self.export.min_block_bytes,
            structured_replies: negotiated.structured_replies,
            fast_zero: self.export.fast_zero,
            block_status: negotiated.base_allocation || negotiated.dirty_bitmap,
        };
        conn::serve(
            stream,
            &*self.backend,
            &self.budget,
            ConnConfig {
                limits,
                max_workers: self.config.workers_per_connection,
                base_allocation: negotiated.base_allocation,
                dirty_bitmap: negotiated.dirty_bitmap,
                io_timeout: self.config.io_timeout,
            },
        )
    }
}
