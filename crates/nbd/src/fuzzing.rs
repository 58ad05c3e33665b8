//! A whole server connection driven by arbitrary client bytes, and the client driven by
//! arbitrary server bytes, for fuzzing.

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
        dirty_bitmap: Some("fuzz".into()),
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
                block_status: negotiated.base_allocation || negotiated.dirty_bitmap,
            };
            let config = ConnConfig {
                limits,
                max_workers: 2,
                base_allocation: negotiated.base_allocation,
                dirty_bitmap: negotiated.dirty_bitmap,
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
            block_status: data.len().is_multiple_of(7),
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
    if let Ok(m) = parse_meta_context_request(data) {
        let strings: usize = m.queries.iter().map(|q| 4 + q.len()).sum();
        assert_eq!(4 + m.name.len() + 4 + strings, data.len());
    }
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
        Command::BlockStatus,
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
    // NBD_OPT_SET_META_CONTEXT's data: the default export, one query.
    let mut meta = vec![0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, BASE_ALLOCATION.len() as u8];
    meta.extend_from_slice(BASE_ALLOCATION.as_bytes());
    out.push(meta);
    // ...and both contexts at once, the dirty bitmap by its qemu name.
    let dirty = format!("{DIRTY_BITMAP_PREFIX}fuzz");
    let mut both = vec![0, 0, 0, 0, 0, 0, 0, 2];
    for q in [BASE_ALLOCATION, dirty.as_str()] {
        both.extend_from_slice(&(q.len() as u32).to_be_bytes());
        both.extend_from_slice(q.as_bytes());
    }
    out.push(both);
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

/// The client against a server that sends exactly `data` and then closes (the `nbd_client`
/// target): the handshake and one request of each kind must never panic nor hang.
pub fn client_session(data: &[u8]) {
    let (client_end, server_end) = UnixStream::pair().expect("socketpair");
    let feeder = server_end.try_clone().expect("dup");
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut w = feeder;
            let _ = w.write_all(data);
            let _ = w.shutdown(Shutdown::Write);
        });
        // What the client sends is read and dropped, so that it never blocks on a full
        // socket; this ends when the client closes its end.
        s.spawn(move || {
            let mut r = server_end;
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        crate::client::exercise(Stream::Unix(client_end));
    });
}

/// A well-behaved server's side of a client session, to mutate: the handshake with
/// structured replies and block sizes, then a reply to each of the client's requests.
pub fn client_seeds() -> Vec<Vec<u8>> {
    use crate::proto::*;
    let mut s = Vec::new();
    s.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    s.extend_from_slice(&IHAVEOPT.to_be_bytes());
    s.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.extend_from_slice(&encode_option_reply(OPT_STRUCTURED_REPLY, REP_ACK, 0));
    let mut context = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
    context.extend_from_slice(BASE_ALLOCATION.as_bytes());
    s.extend_from_slice(&encode_option_reply(
        OPT_SET_META_CONTEXT,
        REP_META_CONTEXT,
        context.len() as u32,
    ));
    s.extend_from_slice(&context);
    s.extend_from_slice(&encode_option_reply(OPT_SET_META_CONTEXT, REP_ACK, 0));
    let mut export = INFO_EXPORT.to_be_bytes().to_vec();
    export.extend_from_slice(&(1u64 << 20).to_be_bytes());
    let flags =
        FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES;
    export.extend_from_slice(&flags.to_be_bytes());
    s.extend_from_slice(&encode_option_reply(OPT_GO, REP_INFO, export.len() as u32));
    s.extend_from_slice(&export);
    let mut sizes = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [512u32, 4096, 1 << 20] {
        sizes.extend_from_slice(&v.to_be_bytes());
    }
    s.extend_from_slice(&encode_option_reply(OPT_GO, REP_INFO, sizes.len() as u32));
    s.extend_from_slice(&sizes);
    s.extend_from_slice(&encode_option_reply(OPT_GO, REP_ACK, 0));
    // Cookies 1.. in the client's order: read, write, flush, trim, write-zeroes, block
    // status.
    s.extend_from_slice(&encode_offset_data_header(1, 0, 4096));
    s.extend_from_slice(&[0x5a; 4096]);
    s.extend_from_slice(&encode_structured_header(
        2,
        REPLY_FLAG_DONE,
        REPLY_TYPE_NONE,
        0,
    ));
    s.extend_from_slice(&encode_simple_reply(3, 0));
    encode_error_chunk(&mut s, 4, Errno::Io, "trim failed");
    s.extend_from_slice(&encode_structured_header(
        5,
        REPLY_FLAG_DONE,
        REPLY_TYPE_NONE,
        0,
    ));
    let mut status = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
    for (len, flags) in [(1024u32, 0u32), (3072, STATE_HOLE | STATE_ZERO)] {
        status.extend_from_slice(&len.to_be_bytes());
        status.extend_from_slice(&flags.to_be_bytes());
    }
    s.extend_from_slice(&encode_structured_header(
        6,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        status.len() as u32,
    ));
    s.extend_from_slice(&status);
    vec![s]
}
