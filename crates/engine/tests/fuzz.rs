//! The bad block log parser fuzzed on stable Rust for a bounded time (see
//! `uraid_testkit::fuzz`): corpus and crashes under `fuzz/` replayed, then seeded mutations.

use uraid_engine::fuzzing;
use uraid_testkit::fuzz::{run, Target};

#[test]
fn fuzz_badblocks() {
    run(&Target {
        name: "badblocks",
        seeds: fuzzing::badblocks_seeds(),
        max_len: 1 + 1024,
        body: &fuzzing::badblocks,
    });
}
