//! The NBD parsers fuzzed on stable Rust for a bounded time (see `uraid_testkit::fuzz`):
//! requests and options, and whole sessions (handshake and transmission) from the
//! checked-in client transcripts in `fuzz/seeds/nbd_session`; and the client against
//! arbitrary server bytes, from a well-behaved server's transcript.

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

#[test]
fn fuzz_nbd_client() {
    run(&Target {
        name: "nbd_client",
        seeds: fuzzing::client_seeds(),
        max_len: 8192,
        body: &fuzzing::client_session,
    });
}
