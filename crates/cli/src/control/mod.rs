//! Live management of a served array through its control socket: the server
//! ([`server`]: the socket, its requests, the event log) and its client ([`client`]: the
//! subcommands). The member locks and finding a server are [`crate::locks`]; neither side
//! imports the other.

pub mod client;
pub mod request;
pub mod server;

pub use client::{
    add, fail, journal_mode, remove, replace, request, set, stop, wait, AddArgs, ArrayArgs,
    JournalModeArgs, MemberCmdArgs, ReplaceArgs, SetArgs, StopArgs, WaitArgs,
};
pub use server::{ControlServer, Event, ServeInfo};
