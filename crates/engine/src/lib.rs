#![warn(missing_docs, unnameable_types)]
//! The uraid array engine: Linux md's RAID levels (raid0/1/4/5/6/10) in a library, over
//! member devices of any kind, with md's on-disk format (superblocks v1.0/1.1/1.2, the
//! write-intent bitmap, the raid5 journal).
//!
//! # The surface
//!
//! Everything an embedder needs is at the crate root:
//!
//! - **Members**: the [`Member`] trait (read, write, flush, discard, write-zeroes at byte
//!   offsets) and its backends, [`MemMember`] (memory) and [`FileMember`] (a file or block
//!   device, O_DIRECT where possible; io_uring or pread/pwrite chosen per member, see
//!   [`DirectMode`], [`IoEngine`], [`set_io_engine`]). [`AlignedBuf`] is a page-aligned buffer for member IO. With the
//!   `nbd` feature, [`NbdMember`] is a member on an NBD export on another host
//!   (`nbd://host/export`, `nbd+unix:///export?socket=PATH`; see [`NbdClientConfig`]).
//! - **Arrays**: [`create()`] (+ [`CreateOptions`], [`create_confirmed`] to ask before the
//!   first write, [`existing_signatures`] to see what would be overwritten) and [`assemble()`]
//!   (+ [`AssembleOptions`], [`AssembleReport`]) give an [`Array`] (md's mddev).
//! - **Requests** on [`Array`]: `read`, `write`, `flush`, `discard`, `write_zeroes`, at byte
//!   offsets, from any number of threads; `stop` marks the superblocks clean
//!   ([`Array::force_stop`] is the quickest safe exit).
//! - **Members of a running array**: `add_member` ([`AddOutcome`]; `add_member_with` md's
//!   [`MemberFlags`], write-mostly and failfast, also `set_member_flags`), `fail_member`,
//!   `remove_member`, `replace`, their [`SlotState`]s and [`Slot`]s, and finding a device's
//!   role again ([`Place`], [`DeviceId`]).
//! - **Events**: [`Array::subscribe`] delivers [`Event`]s in mdadm --monitor's vocabulary.
//! - **Sync**: `run_sync` with a [`SyncKind`] (resync, recovery, check, repair), reporting
//!   [`SyncProgress`], paced by a [`Throttle`] with md's [`SyncLimits`].
//! - **Journal and tunables**: [`JournalMode`] (write-through, write-back), md's sysfs knobs
//!   through `tunables` and `set_tunable` (stripe_cache_size, group_thread_cnt, ...).
//! - **Metadata**: [`read_superblock`] and [`BitmapState`] for examine-like tools; the formats
//!   themselves are in `uraid_core`.
//! - **Errors**: [`ArrayError`] (with an `errno()` for block exports), [`errno_of`].
//! - **Background work**: [`Daemons`] (md's threads and md_check_recovery: safe mode, the
//!   bitmap daemon, journal reclaim, spare activation, resync/recovery/replace), started
//!   with [`Array::start_daemons`]; time comes from one [`Clock`] given at create or
//!   assemble ([`SystemClock`] by default, [`ManualClock`] for tests and simulators).
//! - **Rescue mode**: [`overlay`] keeps every write in copy-on-write files beside
//!   read-only members.
//!
//! # Embedding
//!
//! ```
//! use std::sync::Arc;
//! use uraid_engine::{assemble, create, AssembleOptions, CreateOptions, Level, MemMember, Member};
//!
//! // Three members; `FileMember::open(path, DirectMode::Auto)` for files and block devices.
//! let members: Vec<Arc<dyn Member>> = (0..3)
//!     .map(|i| Arc::new(MemMember::new(format!("m{i}"), 16 << 20)) as Arc<dyn Member>)
//!     .collect();
//! let mut opts = CreateOptions::new(Level::Raid5);
//! opts.assume_clean = true; // fresh zeroed members: no initial resync needed
//! let array = create(members.iter().cloned().map(Some).collect(), &opts)?;
//! let data = vec![0x5a; 64 << 10];
//! array.write(1 << 20, &data)?;
//! array.flush()?;
//! array.stop()?;
//! drop(array);
//!
//! // Later, or in another process: the same members, put together from their superblocks.
//! let (array, report) = assemble(members, &AssembleOptions::default())?;
//! assert_eq!(report.members.len(), 3);
//! let mut back = vec![0; data.len()];
//! array.read(1 << 20, &mut back)?;
//! assert_eq!(back, data);
//! array.stop()?;
//! # Ok::<(), uraid_engine::ArrayError>(())
//! ```
//!
//! `examples/embed.rs` serves such an array over NBD with the `uraid-nbd` crate.
//!
//! # Inside
//!
//! One module per level (raid0, raid1, raid10, raid5 for raid4/5/6; mirror for what raid1 and
//! raid10 share); create/assemble make arrays; meta keeps the superblocks as md does, bitmap
//! the write-intent bitmap; recovery runs spares, recovery, resync and check/repair, replace
//! md's --replace. These modules are the engine's own; `docs/ARCHITECTURE.md` maps them.

// The engine's own modules; the surface is what is re-exported below.
mod allocation;
mod array;
mod assemble;
mod badblocks;
mod barrier;
mod bitmap;
mod buf;
mod cell;
mod clock;
mod counter;
mod create;
mod daemon;
mod dirty;
mod discard;
mod error;
mod events;
mod file;
mod grow;
mod identity;
mod in_order;
mod io_engine;
mod keep_written;
mod levels;
mod member;
mod member_io;
mod meta;
mod mirror;
#[cfg(feature = "nbd")]
mod nbd_member;
mod placement;
mod plug;
mod quiesce;
mod raid0;
mod raid1;
mod raid10;
mod raid5;
mod read_balance;
mod readd;
mod recovery;
mod replace;
mod replacing;
mod reshape;
mod reshape10;
mod restripe;
mod shape;
mod slot;
mod slot_state;
mod stripe_cache;
mod stripe_plan;
mod stripe_workers;
mod written;

/// Fuzz target bodies for the engine's parsers of on-disk bytes (run by `tests/fuzz.rs`).
pub mod fuzzing;
#[cfg(test)]
mod internal_tests;
// The raid4/5/6 write journal (md's raid5-cache) as a component: the log writer and its
// replay. Public so that crash tests can drive the log over their own members and hosts;
// an embedder chooses a journal with [`CreateOptions::journal`] and [`JournalMode`].
pub mod io;
pub mod journal;
#[cfg(feature = "nbd")]
pub mod nbd;
pub mod overlay;

// Arrays: make, put together, run.
pub use allocation::AllocExtent;
pub use array::{Array, ForcedStop, Stats, WallSecs, MAX_CORRECTED_READ_ERRORS};
pub use assemble::{assemble, AssembleOptions, AssembleReport, MemberOutcome, MemberReport};
pub use cell::ArrayCell;
pub use counter::Counter;
pub use create::{
    create, create_confirmed, existing_signatures, CreateOptions, Metadata, DEFAULT_CHUNK_SECTORS,
};
pub use dirty::DirtyExtent;
pub use error::{errno_of, ArrayError, ErrnoMsg};
pub use events::Event;
// Shape changes (mdadm --grow): md's takeovers and resizes here, restripes in reshape.
pub use grow::{
    grow_members, grow_members_with, BitmapChange, GrowReport, GrowRequest, GrowSize,
    ARRAY_SIZE_MAX,
};
pub use keep_written::KeptWritten;
pub use meta::Meta;
pub use plug::Plug;
pub use quiesce::QuiesceGuard;
pub use restripe::{
    continue_reshape, reshape_members, ReshapeOptions, ReshapeReport, ReshapeRequest,
    MAX_OFFSET_MOVE_SECTORS,
};
pub use shape::Shape;

// md's threads, and the one clock they and every time-dependent policy read.
pub use clock::{Clock, ClockSource, ManualClock, SystemClock};
pub use daemon::{activate_spares, DaemonNote, DaemonNotify, DaemonOptions, Daemons, SyncMark};

// Members of an array and how they are found again.
pub use identity::{DeviceId, Identity, Place};
pub use slot::{Slot, SlotState};

// Resync, recovery, check/repair and their limits.
pub use recovery::{AddOutcome, SyncKind, SyncLimits, SyncProgress, Throttle};

// raid4/5/6: the journal, the stripe cache and the level's knobs.
pub use raid5::writeback::{JournalMode, WriteBackStats, PERIODIC_AGE};
pub use raid5::{JoinStats, Tuning};
pub use stripe_cache::{CacheStats, StripeCache, DEFAULT_SIZE as DEFAULT_STRIPE_CACHE_SIZE};

// On-disk metadata, for examine and for tools that inspect members.
pub use badblocks::BadBlocks;
pub use bitmap::{BitmapPages, BitmapState};
pub use meta::{
    read_superblock, read_superblock090, read_superblock_any_checksum, read_superblock_with_090,
    write_superblock,
};

// Member backends and member IO.
pub use buf::AlignedBuf;
pub use file::{set_devices_handle_discard_safely, DirectMode, FileMember, DIRECT_ALIGN};
pub use io::{io_engine, io_engine_forced, set_io_engine, set_io_engine_per_member, IoEngine};
pub use member::{
    write_zero_buffers, Batch, MemMember, Member, MemberOp, OpBuf, RemoteConnection, RemoteStatus,
    ZeroHow,
};
/// A member on an NBD export (feature `nbd`): a remote disk through `uraid-nbd`'s client.
#[cfg(feature = "nbd")]
pub use nbd_member::{NbdMember, DEFAULT_RETRY as NBD_DEFAULT_RETRY};
/// Whether a member's name is an NBD URI (`nbd://`, `nbd+unix://`, and the TLS forms,
/// which are refused when connecting) rather than a path.
#[cfg(feature = "nbd")]
pub use uraid_nbd::client::is_nbd_uri;
/// How an [`NbdMember`] connects: the per-request timeout (a lost host is a failed member,
/// never a hang), connections with multi-conn, structured replies.
#[cfg(feature = "nbd")]
pub use uraid_nbd::client::ClientConfig as NbdClientConfig;
/// The CA an `nbds://` member's server must be signed by ([`NbdClientConfig::tls`]).
pub use uraid_nbd::TlsClient as NbdTlsClient;

// The core types the surface speaks in.
pub use uraid_core::superblock::MemberFlags;
pub use uraid_core::{Level, MemberIdx};
