//! A whole server connection driven by arbitrary client bytes, for fuzzing.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;

use crate::backend::{Backend, MemBackend};
use crate::conn::{self, BufferBudget, ConnConfig};
use crate::handshake::{self, ExportInfo};
use crate::proto::ExportLimits;
use crate::socket::Stream;

/// Export size used by [`fuzz_session`].
pub const FUZZ_EXPORT_BYTES: usize = 1 << 20;

/// Serves one connection whose client sends exactly `input` and then closes;
/// returns the bytes the server sent. Must never panic nor hang.
pub fn fuzz_session(input: &[u8]) -> Vec<u8> {
    let backend = MemBackend::new(FUZZ_EXPORT_BYTES);
    let (server_end, client_end) = UnixStream::pair().expect("socketpair");
    let stream = Stream::Unix(server_end);
    let export = ExportInfo {
        name: "fuzz".into(),
        description: String::new(),
        size_bytes: backend.size_bytes(),
        read_only: false,
        min_block_bytes: 1,
        preferred_block_bytes: 4096,
        max_payload_bytes: 1 << 20,
        fast_zero: true,
    };
    let budget = BufferBudget::new(8 << 20);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer_end = client_end.try_clone().expect("dup");
        s.spawn(move || {
            let mut w = writer_end;
            let _ = w.write_all(input);
            let _ = w.shutdown(Shutdown::Write);
        });
        let reader = s.spawn(move || {
            let mut out = Vec::new();
            let mut r = client_end;
            let _ = r.read_to_end(&mut out);
            out
        });
        if let Ok(negotiated) = handshake::negotiate(&stream, &export, &stop, None) {
            let limits = ExportLimits {
                size_bytes: export.size_bytes,
                read_only: false,
                max_payload_bytes: export.max_payload_bytes,
                min_block_bytes: 1,
                structured_replies: negotiated.structured_replies,
                fast_zero: true,
            };
            let config = ConnConfig {
                limits,
                max_workers: 2,
                io_timeout: None,
            };
            let _ = conn::serve(&stream, &backend, &budget, config);
        }
        stream.shutdown(Shutdown::Both);
        reader.join().expect("reader thread")
    })
}
