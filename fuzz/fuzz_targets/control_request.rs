//! Arbitrary bytes as control socket lines (the parser of `uraid serve`'s JSON requests).
//! The uraid crate is a binary, so its self-contained request module is included as is.
#![no_main]

#[path = "../../crates/cli/src/control/request.rs"]
#[allow(dead_code)]
mod request;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| request::fuzz(data));
