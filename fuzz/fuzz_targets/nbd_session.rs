//! A whole server connection (handshake and transmission) fed arbitrary bytes
//! (`uraid_nbd::fuzzing::session`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_nbd::fuzzing::session(data));
