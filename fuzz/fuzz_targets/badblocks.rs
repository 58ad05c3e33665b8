//! Arbitrary bytes into md's bad block log parser (`uraid_engine::fuzzing::badblocks`): the
//! first byte is the superblock's bblog_shift, the rest the log area.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| uraid_engine::fuzzing::badblocks(data));
