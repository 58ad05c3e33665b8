//! Arbitrary bytes into md's partial parity log: the header decoder, the area walk and
//! the entry geometry (the body is `uraid_core::fuzzing::ppl`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_core::fuzzing::ppl(data));
