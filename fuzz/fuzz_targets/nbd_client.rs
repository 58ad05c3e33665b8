//! uraid's NBD client (handshake and one request of each kind) against a server that sends
//! arbitrary bytes (`uraid_nbd::fuzzing::client_session`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_nbd::fuzzing::client_session(data));
