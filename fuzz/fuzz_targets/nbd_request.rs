//! Arbitrary bytes into the NBD request and option parsers (`uraid_nbd::fuzzing::request`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_nbd::fuzzing::request(data));
