//! Arbitrary bytes into the md v1.x superblock decoder (`uraid_core::fuzzing::superblock`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_core::fuzzing::superblock(data));
