//! The pure parsers take any bytes without panicking, and what they accept
//! round-trips. (The same parsers are the `nbd_request` cargo-fuzz target.)

use proptest::prelude::*;
use uraid_nbd::proto::*;

fn limits() -> impl Strategy<Value = ExportLimits> {
    (
        any::<u64>(),
        any::<bool>(),
        1u32..=(64 << 20),
        0u32..=16,
        any::<bool>(),
    )
        .prop_map(
            |(size_bytes, read_only, max_payload_bytes, shift, structured_replies)| ExportLimits {
                size_bytes,
                read_only,
                max_payload_bytes,
                min_block_bytes: 1 << shift,
                structured_replies,
                fast_zero: false,
                block_status: false,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn request_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        match parse_request(&bytes) {
            Ok(req) => {
                prop_assert!(bytes.len() >= REQUEST_HEADER_BYTES);
                prop_assert_eq!(&encode_request(&req)[..], &bytes[..REQUEST_HEADER_BYTES]);
            }
            Err(ProtocolError::Truncated { have, .. }) => {
                prop_assert_eq!(have, bytes.len());
                prop_assert!(bytes.len() < REQUEST_HEADER_BYTES);
            }
            Err(ProtocolError::BadRequestMagic { found }) => prop_assert_ne!(found, REQUEST_MAGIC),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn validate_accepts_only_in_range_requests(
        flags in any::<u16>(),
        kind in 0u16..10,
        offset in prop_oneof![any::<u64>(), 0u64..(1 << 30)],
        length in any::<u32>(),
        limits in limits(),
    ) {
        let req = Request { flags, command: Command::from_wire(kind), cookie: 1, offset, length };
        let bytes = encode_request(&req);
        let parsed = parse_request(&bytes).unwrap();
        prop_assert_eq!(parsed, req);
        if req.validate(&limits).is_ok() {
            match req.command {
                Command::Read | Command::Write | Command::Trim | Command::WriteZeroes => {
                    let end = offset.checked_add(u64::from(length));
                    prop_assert!(end.is_some_and(|e| e <= limits.size_bytes));
                    prop_assert_eq!(offset % u64::from(limits.min_block_bytes), 0);
                    if matches!(req.command, Command::Read | Command::Write) {
                        prop_assert!(length <= limits.max_payload_bytes);
                    }
                    if req.command != Command::Read {
                        prop_assert!(!limits.read_only);
                    }
                }
                Command::Flush | Command::Disc => {}
                Command::Unknown(_) => prop_assert!(false, "unknown command accepted"),
                Command::BlockStatus => prop_assert!(false, "block status without a context"),
            }
        }
    }

    #[test]
    fn option_parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Ok(h) = parse_option_header(&bytes) {
            prop_assert_eq!(&bytes[..8], &IHAVEOPT.to_be_bytes());
            prop_assert_eq!(h.length.to_be_bytes(), [bytes[12], bytes[13], bytes[14], bytes[15]]);
        }
        if let Ok(r) = parse_info_request(&bytes) {
            // What was accepted covers the input exactly.
            let mut again = Vec::new();
            again.extend_from_slice(&(r.name.len() as u32).to_be_bytes());
            again.extend_from_slice(r.name);
            again.extend_from_slice(&(r.info_types.len() as u16).to_be_bytes());
            for t in &r.info_types {
                again.extend_from_slice(&t.to_be_bytes());
            }
            prop_assert_eq!(again, bytes);
        }
    }

    #[test]
    fn well_formed_info_requests_parse(
        name in proptest::collection::vec(any::<u8>(), 0..300),
        infos in proptest::collection::vec(any::<u16>(), 0..20),
    ) {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(&name);
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in &infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        let r = parse_info_request(&d).unwrap();
        prop_assert_eq!(r.name, &name[..]);
        prop_assert_eq!(r.info_types, infos);
    }
}

/// A valid fixed-newstyle prefix (flags, STRUCTURED_REPLY, GO "") so random
/// bytes after it reach the transmission phase.
fn handshake_prefix(structured: bool) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    let mut opt = |option: u32, data: &[u8]| {
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&option.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
    };
    if structured {
        opt(OPT_STRUCTURED_REPLY, &[]);
    }
    opt(OPT_GO, &[0, 0, 0, 0, 0, 0]);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn whole_sessions_survive_random_bytes(
        structured in any::<bool>(),
        prefixed in any::<bool>(),
        tail in proptest::collection::vec(any::<u8>(), 0..600),
        requests in proptest::collection::vec(
            (0u16..8, any::<u16>(), 0u64..(2 << 20), 0u32..70_000), 0..6),
    ) {
        let mut input = if prefixed { handshake_prefix(structured) } else { Vec::new() };
        for (kind, flags, offset, length) in requests {
            input.extend_from_slice(&encode_request(&Request {
                flags: flags & 0x7,
                command: Command::from_wire(kind),
                cookie: 3,
                offset,
                length,
            }));
        }
        input.extend_from_slice(&tail);
        let out = uraid_nbd::fuzzing::fuzz_session(&input);
        // The server always greets first.
        prop_assert_eq!(&out[..8], b"NBDMAGIC");
    }
}
