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

/// The request and option parsers on arbitrary bytes (the `nbd_request` target): what they
/// accept round-trips, and what validation accepts lies inside the export.
pub fn request(data: &[u8]) {
    use crate::proto::*;
    if let Ok(req) = parse_request(data) {
        assert_eq!(&encode_request(&req)[..], &data[..REQUEST_HEADER_BYTES]);
        // Limits derived from the input.
        let size_bytes = u64::from(data.len() as u32) << 12;
        let limits = ExportLimits {
            size_bytes,
            read_only: data.len().is_multiple_of(2),
            max_payload_bytes: 32 << 20,
            min_block_bytes: 1 << (data.len() % 13),
            structured_replies: data.len().is_multiple_of(3),
            fast_zero: data.len().is_multiple_of(5),
        };
        if req.validate(&limits).is_ok() {
            if let Command::Read | Command::Write | Command::Trim | Command::WriteZeroes =
                req.command
            {
                assert!(req.offset + u64::from(req.length) <= size_bytes);
            }
        }
    }
    let _ = parse_option_header(data);
    if let Ok(info) = parse_info_request(data) {
        assert_eq!(
            4 + info.name.len() + 2 + 2 * info.info_types.len(),
            data.len()
        );
    }
}

/// Requests to mutate: each command, in and at the edge of a 4 MiB export.
pub fn request_seeds() -> Vec<Vec<u8>> {
    use crate::proto::*;
    let mut out = Vec::new();
    for (i, command) in [
        Command::Read,
        Command::Write,
        Command::Disc,
        Command::Flush,
        Command::Trim,
        Command::WriteZeroes,
    ]
    .into_iter()
    .enumerate()
    {
        let req = Request {
            flags: 0,
            command,
            cookie: i as u64,
            offset: 4096 * i as u64,
            length: if i % 2 == 0 { 4096 } else { 512 },
        };
        out.push(encode_request(&req).to_vec());
    }
    // NBD_OPT_INFO for the export "md0" asking for two info types.
    out.push(vec![0, 0, 0, 3, b'm', b'd', b'0', 0, 2, 0, 0, 0, 3]);
    out
}

/// A whole session on arbitrary client bytes (the `nbd_session` target): the server always
/// opens with its greeting and never panics nor hangs.
pub fn session(data: &[u8]) {
    let out = fuzz_session(data);
    assert_eq!(&out[..8], b"NBDMAGIC");
}
