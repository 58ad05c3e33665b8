//! Arbitrary bytes into the md bitmap superblock decoder (`uraid_core::fuzzing::bitmap_super`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_core::fuzzing::bitmap_super(data));
