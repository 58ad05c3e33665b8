//! The pure core of uraid.
//!
//! Nothing in this crate does IO, spawns threads or reads a clock. It holds:
//! - [`geometry`]: md's data layouts for every RAID level (array sector -> member, offset),
//! - [`superblock`]: the md v1 superblock codec (metadata 1.0, 1.1, 1.2),
//! - [`superblock090`]: the md 0.90 superblock decoder (read only),
//! - [`support`]: which superblock features uraid honours, and refusals for the rest,
//! - [`bitmap`]: the md write-intent bitmap superblock codec,
//! - [`ppl`]: md's raid5 partial parity log (header codec, area scan, entry geometry),
//! - [`types`]: newtypes shared by all crates,
//! - [`fuzzing`]: fuzz target bodies for the parsers above (run in CI by `tests/fuzz.rs`).

pub mod bitmap;
pub mod fuzzing;
pub mod geometry;
pub mod journal;
pub mod ppl;
pub mod signature;
pub mod superblock;
pub mod superblock090;
pub mod support;
pub mod types;
pub mod written_map;

pub use types::*;
