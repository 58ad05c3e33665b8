//! The NBD parsers fuzzed on stable Rust for a bounded time (see `uraid_testkit::fuzz`):
//! requests and options, and whole sessions (handshake and transmission) from the
//! checked-in client transcripts in `fuzz/seeds/nbd_session`.

use uraid_nbd::fuzzing;
use uraid_testkit::fuzz::{run, Target};

#[test]
fn fuzz_nbd_request() {
    run(&Target {
        name: "nbd_request",
        seeds: fuzzing::request_seeds(),
        max_len: 64,
        body: &fuzzing::request,
    });
}

#[test]
fn fuzz_nbd_session() {
    run(&Target {
        name: "nbd_session",
        seeds: Vec::new(),
        max_len: 2048,
        body: &fuzzing::session,
    });
}
