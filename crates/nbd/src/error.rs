//! Errors of the NBD server.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::proto::ProtocolError;

/// Why the server or one connection stopped.
#[derive(Debug, Error)]
pub enum NbdError {
    #[error("cannot listen on unix socket {path}: {source}")]
    BindUnix { path: PathBuf, source: io::Error },
    #[error("cannot listen on {addr}: {source}")]
    BindTcp {
        addr: std::net::SocketAddr,
        source: io::Error,
    },
    #[error("accepting connections: {0}")]
    Accept(io::Error),
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    #[error("client sent a malformed message: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("client closed the connection")]
    Disconnected,
    #[error("client did not finish the handshake in time")]
    HandshakeTimeout,
    #[error("client sent unknown flags {flags:#x} in the handshake")]
    ClientFlags { flags: u32 },
    #[error("client sent option {option} with {len} bytes of data (limit {limit})")]
    OptionTooLong { option: u32, len: u32, limit: u32 },
    #[error("client asked for unknown export {name:?}")]
    UnknownExport { name: String },
    #[error("client aborted the handshake")]
    Aborted,
    #[error("client sent a {len}-byte write (limit {limit}); its payload cannot be skipped")]
    PayloadTooLarge { len: u32, limit: u32 },
    #[error("backend flush at shutdown failed: {0}")]
    FinalFlush(io::Error),
    #[error("TLS handshake with the client failed: {0}")]
    Tls(io::Error),
    #[error("client asked for an export without TLS on a TLS-only server")]
    TlsRequired,
    #[error("cannot start a thread: {0}")]
    Spawn(io::Error),
}
