//! NBD server: serves one [`Backend`] over a Unix socket or TCP.
//!
//! Speaks the fixed newstyle handshake (`NBD_OPT_EXPORT_NAME`, `GO`, `INFO`,
//! `LIST`, `ABORT`, `STRUCTURED_REPLY`) and the commands READ, WRITE, FLUSH,
//! TRIM, WRITE_ZEROES and DISC, with FUA passed to the backend. Each
//! connection answers several requests at once, out of order; many
//! connections may share the export (`NBD_FLAG_CAN_MULTI_CONN`).
//!
//! Layout: [`proto`] is the pure wire format (fuzzed), `handshake` the option
//! haggling, `conn` the transmission phase, `server` the accept loop.
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
mod conn;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
pub mod proto;
mod server;
mod socket;

pub use backend::{errno_of, Backend, MemBackend};
pub use error::NbdError;
pub use proto::{Errno, ProtocolError};
pub use server::{
    RunningServer, ServeStats, Server, ServerConfig, ShutdownHandle, DEFAULT_MAX_PAYLOAD_BYTES,
};
pub use socket::Listener;
