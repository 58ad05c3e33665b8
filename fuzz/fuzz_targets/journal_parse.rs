//! Arbitrary bytes into the raid5-cache journal: the meta block parser, and the replay
//! scanner over a ring made of the input (the body is `uraid_core::fuzzing::journal`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_core::fuzzing::journal(data));
