//! uraid's test disks and its deterministic simulator of whole arrays (TigerBeetle style):
//! seeded, virtual time, simulated member disks with faults, a workload checked against a
//! byte model. Tests depend on this crate; the production build does not contain it. It
//! uses only the engine's public API.
//!
//! - [`disk`]: [`SimDisk`] (a [`uraid_engine::Member`] with a fault schedule), [`SimWorld`]
//!   (virtual clock, power, fault counts, event trace);
//! - [`fault`]: [`FaultMember`], a pass-through wrapper over any member that fails IO on
//!   a switch;
//! - [`budget`]: faults only where the level must survive them, per unit and per member;
//! - [`model`]: the bytes every read must return (old-or-new after failed writes);
//! - [`layout`]: where data lives, asked of the level's geometry;
//! - [`config`]: a configuration and [`Mode`] for each seed;
//! - [`mod@run`]: the [`Simulator`] itself, with [`Lifecycle`] hooks for spares, rebuild and
//!   scrub; [`hooks`] maps them to the engine.
//!
//! Determinism: one thread drives the engine (the slow-superblock schedule uses threads,
//! one step at a time: each finishes or blocks before the next starts), disks keep no real
//! time, every collection iterated is ordered, and all randomness comes from [`SimRng`]
//! streams forked from the seed. `run_seed(s)` twice gives the same report.

pub mod budget;
pub mod config;
pub mod disk;
pub mod fault;
pub mod hooks;
pub mod layout;
pub mod model;
mod rng;
pub mod run;

pub use config::{Mode, SimConfig};
pub use disk::{
    Effect, FaultCounts, FaultKind, FaultRule, OpFilter, Power, SimClock, SimDisk, SimWorld,
};
pub use fault::{FaultMember, HookIo, Verdict};
pub use rng::SimRng;
pub use run::{
    replay_command, run, run_seed, Finding, Lifecycle, NoLifecycle, RunStats, SimFailure,
    SimOptions, SimReport, Simulator,
};
