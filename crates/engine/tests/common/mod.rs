//! The engine tests' configs and byte model now live in `uraid_testkit::engine`; this
//! re-export keeps `mod common; use common::*;` working in the test files that have not
//! switched to it yet (those that also use the fault and crash disks).

#![allow(unused_imports)]

pub use uraid_testkit::engine::*;
