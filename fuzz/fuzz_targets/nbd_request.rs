//! Arbitrary bytes into the NBD request and option parsers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uraid_nbd::proto::*;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = parse_request(data) {
        assert_eq!(&encode_request(&req)[..], &data[..REQUEST_HEADER_BYTES]);
        // Validation against an export derived from the input must not panic,
        // and what it accepts lies inside the export.
        let size_bytes = u64::from(data.len() as u32) << 12;
        let limits = ExportLimits {
            size_bytes,
            read_only: data.len() % 2 == 0,
            max_payload_bytes: 32 << 20,
            min_block_bytes: 1 << (data.len() % 13),
            structured_replies: data.len() % 3 == 0,
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
        assert_eq!(4 + info.name.len() + 2 + 2 * info.info_types.len(), data.len());
    }
});
