//! `uraid`: the command line. Subcommands follow mdadm's vocabulary.

mod bench;
mod commands;
mod open;
mod report;
mod timefmt;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "uraid",
    version,
    about = "Userspace software RAID, on-disk compatible with Linux md and mdadm",
    long_about = "uraid assembles, creates and serves md arrays (raid0/1/4/5/6/10, md v1.2 \
                  superblock) from files or block devices, without the md kernel driver."
)]
struct Cli {
    /// IO engine for file and block-device members.
    #[arg(long, global = true, value_enum, default_value_t = open::EngineArg::Uring)]
    io_engine: open::EngineArg,
    /// Never open members with O_DIRECT.
    #[arg(long, global = true)]
    no_direct: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a new array on the given members (use `missing` for an absent member).
    Create(commands::CreateArgs),
    /// Print the md superblock of a member.
    Examine(commands::ExamineArgs),
    /// Assemble an array from its members and report what was found.
    Assemble(commands::AssembleArgs),
    /// Assemble an array and print its state, like mdadm --detail.
    Detail(commands::DetailArgs),
    /// Read bytes of an array to stdout or a file (like dd from /dev/mdX).
    Read(commands::ReadArgs),
    /// Write bytes from stdin or a file into an array (like dd to /dev/mdX).
    Write(commands::WriteArgs),
    /// Recompute parity or mirror copies over the whole array (resync/repair).
    Resync(commands::ResyncArgs),
    /// Load generator: IOPS, latency and overhead of an array over memory or file members.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    open::configure(cli.io_engine, cli.no_direct);
    let r = match cli.cmd {
        Cmd::Create(a) => commands::create(a),
        Cmd::Examine(a) => commands::examine(a),
        Cmd::Assemble(a) => commands::assemble(a),
        Cmd::Detail(a) => commands::detail(a),
        Cmd::Read(a) => commands::read(a),
        Cmd::Write(a) => commands::write(a),
        Cmd::Resync(a) => commands::resync(a),
        Cmd::Bench(a) => bench::bench(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uraid: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Paths of member devices as given on the command line.
pub type Paths = Vec<PathBuf>;
