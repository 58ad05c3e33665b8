//! Helpers for uraid's tests (a dev-dependency only).
//!
//! - [`skip`]: a test that needs a host tool (or root) either runs, fails in CI, or skips
//!   with a line that `scripts/test.sh` counts.
//! - [`fuzz`]: the parsers' fuzz targets driven on stable Rust, for a bounded time, from a
//!   printed seed, after a replay of the checked-in corpus and crashes under `fuzz/`.

pub mod fuzz;
pub mod skip;

pub use skip::{need_tool, need_tools, skip, skip_not_applicable};
