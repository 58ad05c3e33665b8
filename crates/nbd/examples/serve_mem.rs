//! Serves an in-memory export until killed (for benchmarks and manual tests).
//!
//! `serve_mem SOCKET_PATH [SIZE_MIB] [WORKERS_PER_CONNECTION]`

use std::sync::Arc;

use uraid_nbd::{Listener, MemBackend, Server, ServerConfig};

fn main() -> Result<(), uraid_nbd::NbdError> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/tmp/uraid-nbd.sock".into());
    let size_mib: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(256);
    let workers: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(16);
    let backend = Arc::new(MemBackend::new(size_mib << 20));
    let listener = Listener::bind_unix(&path)?;
    let server = Server::new(ServerConfig {
        workers_per_connection: workers,
        ..ServerConfig::default()
    })?;
    eprintln!("serving {size_mib} MiB on nbd+unix:///?socket={path}");
    server.serve(listener, backend)?;
    Ok(())
}
