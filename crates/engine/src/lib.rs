//! The uraid array engine: member devices at the edge, md-compatible arrays on top.
//!
//! - [`member`]: the one member-device trait; backends: [`member::MemMember`] (memory),
//!   [`file::FileMember`] (file or block device, O_DIRECT where possible).
//! - [`io`]: batched member IO (io_uring for files, synchronous otherwise).
//! - [`array`]: an assembled array: read, write, flush, degraded operation, resync.
//! - one module per level: [`raid0`], [`raid1`], [`raid10`], [`raid5`] (raid4/5/6);
//!   [`mirror`] holds what raid1 and raid10 share.
//! - [`create`] / [`assemble`]: making new arrays and putting existing members together;
//!   [`meta`] keeps the superblocks as md does, [`bitmap`] the write-intent bitmap.

pub mod array;
pub mod assemble;
pub mod bitmap;
pub mod buf;
pub mod create;
pub mod error;
pub mod events;
pub mod fault;
pub mod file;
pub mod io;
pub mod journal;
pub mod member;
pub mod meta;
pub mod mirror;
pub mod raid0;
pub mod raid1;
pub mod raid10;
pub mod raid5;
pub mod recovery;
pub mod sim;
pub mod slot;
pub mod stripe_cache;
pub mod stripe_plan;
pub mod stripe_workers;

pub use array::Array;
pub use assemble::{assemble, AssembleOptions, AssembleReport, MemberOutcome};
pub use create::{create, CreateOptions};
pub use error::ArrayError;
pub use events::Event;
pub use member::{MemMember, Member};
pub use recovery::{AddOutcome, SyncKind, SyncLimits, SyncProgress, Throttle};
pub use slot::SlotState;
