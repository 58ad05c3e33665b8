//! The uraid array engine: member devices at the edge, md-compatible arrays on top.
//!
//! - [`member`]: the one member-device trait and its backends (memory, file or block device).
//! - [`array`]: an assembled array: read, write, flush, discard, degraded operation.
//! - [`create`] / [`assemble`]: making new arrays and putting existing members together.

pub mod member;
