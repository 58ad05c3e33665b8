//! Helpers for uraid's tests (a dev-dependency only), so that each test file keeps its
//! checks and no copy of the plumbing.
//!
//! - [`skip`](mod@skip): a test that needs a host tool (or root) either runs, fails in CI, or skips
//!   with a line that `scripts/test.sh` counts.
//! - [`fuzz`]: the parsers' fuzz targets driven on stable Rust, for a bounded time, from a
//!   printed seed, after a replay of the checked-in corpus and crashes under `fuzz/`.
//! - [`tmp`]: temporary folders removed on drop, and sparse member images in them.
//! - [`data`]: deterministic test data and whole-file snapshots.
//! - [`cli`]: the `uraid` command (found beside the test binary) and its runners.
//! - [`served`]: `uraid serve` as a child process over member files, always killed, with its
//!   control socket, output and the host tools that talk to it (fio, nbdinfo).
//! - [`loopdev`]: loop devices over image files, detached on drop.
//! - [`netns`]: remote hosts in network namespaces, each with an NBD server (nbdkit,
//!   qemu-nbd or nbd-server, TLS-only if asked), that a test cuts off and brings back.
//! - [`proxy`]: a slow, lossy link (a delaying TCP proxy), where `tc netem` is missing.
//! - [`pki`]: a test CA and server certificates for TLS, for any names or addresses (the
//!   file names nbdkit, qemu and libnbd look for).
//! - [`prelude`]: all of the above that a command-line test uses, in one glob import.
//! - `engine` (feature `engine`): array configurations of every level on memory members,
//!   a byte model's random writes, and arrays with a write journal.

#![warn(missing_docs)]

pub mod cli;
pub mod data;
#[cfg(feature = "engine")]
pub mod engine;
pub mod fuzz;
pub mod loopdev;
pub mod netns;
pub mod pki;
pub mod prelude;
pub mod proxy;
pub mod served;
pub mod skip;
pub mod tmp;

pub use skip::{need_tool, need_tools, skip, skip_not_applicable, tool_path};
pub use tmp::TempDir;
