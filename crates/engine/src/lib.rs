//! The uraid array engine: member devices at the edge, md-compatible arrays on top.
//!
//! - [`member`]: the one member-device trait; backends: [`member::MemMember`] (memory),
//!   [`file::FileMember`] (file or block device, O_DIRECT where possible).
//! - [`io`]: batched member IO: each member takes its ops through [`Member::submit`]
//!   (files queue them for io_uring, wrappers forward them), then the ring runs them.
//! - [`array`]: an assembled array: read, write, flush, degraded operation, resync.
//! - one module per level: [`raid0`], [`raid1`], [`raid10`], [`raid5`] (raid4/5/6);
//!   [`mirror`] holds what raid1 and raid10 share.
//! - [`create`] / [`assemble`]: making new arrays and putting existing members together;
//!   [`meta`] keeps the superblocks as md does, [`bitmap`] the write-intent bitmap.
//! - [`recovery`]: spares, recovery, resync, check/repair; [`replace`]: md's --replace.

pub mod array;
pub mod assemble;
pub mod badblocks;
pub(crate) mod barrier;
pub mod bitmap;
pub mod buf;
pub mod clock;
pub mod create;
pub mod daemon;
pub mod discard;
pub mod error;
pub mod events;
pub mod file;
/// Fuzz target bodies for the engine's parsers of on-disk bytes (run by `tests/fuzz.rs`).
pub mod fuzzing;
pub mod identity;
pub mod io;
pub mod journal;
pub(crate) mod levels;
pub mod member;
pub(crate) mod member_io;
pub mod meta;
pub mod mirror;
pub mod overlay;
pub(crate) mod placement;
pub mod plug;
pub mod quiesce;
pub mod raid0;
pub mod raid1;
pub mod raid10;
pub mod raid5;
pub(crate) mod read_balance;
pub mod recovery;
pub mod replace;
pub(crate) mod replacing;
pub mod shape;
pub mod slot;
pub(crate) mod slot_state;
pub mod stripe_cache;
pub mod stripe_plan;
pub mod stripe_workers;
pub mod writeback;

pub use array::{Array, ForcedStop};
pub use assemble::{assemble, AssembleOptions, AssembleReport, MemberOutcome};
pub use clock::{Clock, ClockSource, ManualClock, SystemClock};
pub use create::{create, CreateOptions};
pub use daemon::{activate_spares, DaemonNote, DaemonNotify, DaemonOptions, Daemons};
pub use error::ArrayError;
pub use events::Event;
pub use member::{Batch, MemMember, Member, MemberOp, ZeroHow};
pub use recovery::{AddOutcome, SyncKind, SyncLimits, SyncProgress, Throttle};
pub use slot::SlotState;
