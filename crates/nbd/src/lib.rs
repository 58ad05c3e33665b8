//! NBD server: serves one [`Backend`] over a Unix socket or TCP.
//!
//! Speaks the fixed newstyle handshake (`NBD_OPT_EXPORT_NAME`, `GO`, `INFO`,
//! `LIST`, `ABORT`, `STRUCTURED_REPLY`) and the commands READ, WRITE, FLUSH,
//! TRIM, WRITE_ZEROES and DISC, with FUA passed to the backend. Each
//! connection answers several requests at once, out of order; many
//! connections may share the export (`NBD_FLAG_CAN_MULTI_CONN`).
//!
//! Layout: [`proto`] is the pure wire format (fuzzed), `handshake` the option
//! haggling, `conn` the transmission phase, `server` the accept loop. [`client`] is
//! the other side on the same wire code: an export on another host as a block
//! device (uraid's remote members). [`tls`] is STARTTLS for both (X.509 with rustls,
//! TLS-PSK with OpenSSL).
//!
//! # Design
//!
//! - A thread per connection, plus up to `workers_per_connection` worker
//!   threads started on demand. Workers take turns reading the socket
//!   (leader/followers): the one holding the input lock parses one request and
//!   its payload from a 64 KiB buffer, releases the lock, calls the backend and
//!   writes the reply with one `sendmsg`. No hand-off queue, no per-request
//!   allocation; replies go out in completion order.
//! - Every request is checked ([`proto::Request::validate`]) before the
//!   backend sees it: in range, aligned to [`Backend::min_block_size`], payload
//!   at most `max_payload_bytes` (32 MiB), flags valid for the command.
//! - Backend errors map to NBD errors with [`errno_of`]; a backend panic is
//!   answered with `EIO`.
//! - With structured replies, reads answer with one `OFFSET_DATA` chunk and
//!   errors with an `ERROR` chunk carrying a message.
//!
//! # Limits (see [`ServerConfig`])
//!
//! Connections, requests in flight per connection (= workers), payload size,
//! buffer memory (a budget shared by all connections for payloads above
//! 256 KiB), option data (16 KiB) and options per handshake (256). A client
//! that breaks the protocol (bad magic, unknown client flags, oversized option
//! or write payload) is disconnected; an invalid request gets an error reply.
//! A handshake that stalls, a client that does not read its replies, or one
//! that stalls inside a large write payload is dropped after a timeout; an
//! idle client in the transmission phase is not.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use uraid_nbd::{Listener, MemBackend, Server, ServerConfig};
//!
//! # fn main() -> Result<(), uraid_nbd::NbdError> {
//! let backend = Arc::new(MemBackend::new(64 << 20));
//! let listener = Listener::bind_unix("/tmp/uraid.sock")?;
//! let server = Server::new(ServerConfig {
//!     export_name: "md0".into(),
//!     ..ServerConfig::default()
//! })?;
//! let running = server.spawn(listener, backend)?;
//! // Clients connect to nbd+unix:///md0?socket=/tmp/uraid.sock
//! // Later: stop accepting, answer in-flight requests, flush the backend.
//! let stats = running.shutdown()?;
//! println!("served {} connections", stats.connections_accepted);
//! # Ok(())
//! # }
//! ```

mod backend;
pub mod client;
mod conn;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
pub mod latency;
pub mod proto;
mod server;
mod socket;
pub mod tls;
mod tls_psk;

pub use backend::{errno_of, Backend, DirtyExtent, Extent, MemBackend};
pub use error::NbdError;
pub use proto::{Errno, ProtocolError, ZeroFlags};
pub use server::{
    RunningServer, ServeStats, Server, ServerConfig, ShutdownHandle, DEFAULT_MAX_PAYLOAD_BYTES,
};
pub use socket::{Listener, WakePipe};
pub use tls::{TlsClient, TlsError, TlsServer};
