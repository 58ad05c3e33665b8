//! A whole server connection (handshake and transmission) fed arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let out = uraid_nbd::fuzzing::fuzz_session(data);
    assert_eq!(&out[..8], b"NBDMAGIC");
});
