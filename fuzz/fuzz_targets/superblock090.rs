//! Arbitrary bytes into the md 0.90 superblock decoder (`uraid_core::fuzzing::superblock090`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_core::fuzzing::superblock090(data));
