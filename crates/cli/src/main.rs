//! `uraid`: the command line. Subcommands follow mdadm's vocabulary.

mod bench;
mod commands;
mod control;
mod demo;
mod grow;
mod grow_request;
mod locks;
mod mdadm_conf;
mod metrics;
mod monitor;
mod open;
mod overlay;
mod progress;
mod report;
mod report090;
mod scan;
mod serve;
mod serve_tls;
mod status;
mod systemd;
mod timefmt;
mod ublk;

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
    #[arg(long, global = true, value_enum, default_value_t = open::EngineArg::Auto)]
    io_engine: open::EngineArg,
    /// Never open members with O_DIRECT.
    #[arg(long, global = true)]
    no_direct: bool,
    /// Trust that a discard on every block-device member reads back zeros (md's raid456
    /// devices_handle_discard_safely), so that raid4/5/6 and mirrors pass discards down to
    /// devices that cannot report it. Wrong on a device that keeps data: check then finds
    /// mismatches and degraded reads of discarded stripes return garbage.
    #[arg(long, global = true)]
    devices_handle_discard_safely: bool,
    /// Rescue mode: open every member read-only and keep every write uraid makes (data,
    /// parity, superblocks, bitmap, journal) in copy-on-write files in DIR, so that a
    /// forced assembly or a guessed member order costs nothing. See `uraid overlay`.
    #[arg(long, global = true, value_name = "DIR")]
    overlay: Option<PathBuf>,
    /// Seconds an NBD member (nbd://host/export, nbd+unix:///export?socket=PATH) may take
    /// to answer a request; after it the connection is closed and the member fails (a lost
    /// host is a failed member, never a hang).
    #[arg(long, global = true, value_name = "SECS", default_value_t = 30.0)]
    nbd_timeout: f64,
    /// Seconds an NBD member that holds the array's last copy of some data keeps
    /// reconnecting, with back-off, when its connection is lost, before its request fails
    /// (EIO). A member the array can do without fails at once instead (md's failfast). 0:
    /// never retry.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 30.0)]
    nbd_retry: f64,
    /// Connections per NBD member, where its server advertises multi-conn.
    #[arg(long, global = true, value_name = "N", default_value_t = 1)]
    nbd_connections: usize,
    /// The CA certificates (PEM) that nbds:// members' servers must be signed by.
    #[arg(long, global = true, value_name = "FILE")]
    nbd_tls_ca: Option<PathBuf>,
    /// A client certificate (PEM chain) that uraid presents to nbds:// members' servers
    /// that ask for one (nbd-server with TLS, nbdkit --tls-verify-peer), with
    /// --nbd-tls-key.
    #[arg(long, global = true, value_name = "FILE")]
    nbd_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --nbd-tls-cert.
    #[arg(long, global = true, value_name = "FILE")]
    nbd_tls_key: Option<PathBuf>,
    /// TLS-PSK for nbds:// members: a pre-shared key file (identity:hexkey lines, as
    /// nbdkit's --tls-psk), in place of --nbd-tls-ca. A member URI's own
    /// ?tls-psk-file=FILE takes the place of it.
    #[arg(long, global = true, value_name = "FILE")]
    nbd_tls_psk: Option<PathBuf>,
    /// The identity in --nbd-tls-psk's file that uraid gives (needed when it holds more
    /// than one; a member URI's ?tls-username=NAME or NAME@host takes the place of it).
    #[arg(long, global = true, value_name = "NAME")]
    nbd_tls_username: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a new array on the given members (use `missing` for an absent member).
    Create(commands::CreateArgs),
    /// Print the md superblock of a member.
    Examine(commands::ExamineArgs),
    /// Assemble an array from its members and report what was found (--scan: find them).
    Assemble(commands::AssembleArgs),
    /// Every array served on this host, as /proc/mdstat shows md's (--watch: reprint).
    Status(status::StatusArgs),
    /// Incremental assembly (mdadm -I, for udev rules): one device arrived; once its
    /// array's members are all there (or enough with --run), serve the array.
    Incremental(scan::IncrementalArgs),
    /// Assemble an array and print its state, like mdadm --detail.
    Detail(commands::DetailArgs),
    /// Read bytes of an array to stdout or a file (like dd from /dev/mdX).
    Read(commands::ReadArgs),
    /// Write bytes from stdin or a file into an array (like dd to /dev/mdX).
    Write(commands::WriteArgs),
    /// Recompute parity or mirror copies over the whole array (resync/repair).
    Resync(commands::ResyncArgs),
    /// Count parity or mirror mismatches without changing anything (md's check); exits
    /// non-zero when it counted some.
    Check(commands::SyncArgs),
    /// Count and fix mismatches (md's repair): raid4/5 parity is made consistent with the
    /// data; raid6 also locates and rewrites a bad data block.
    Repair(commands::SyncArgs),
    /// Finish the recovery of a member being rebuilt (after add, or an interrupted rebuild).
    Recover(commands::SyncArgs),
    /// Report md events (Fail, DegradedArray, RebuildNN, SpareActive, ...) as they happen.
    Monitor(monitor::MonitorArgs),
    /// Serve an array over NBD (and ublk) until stopped; manage it with fail/remove/add/stop.
    Serve(serve::ServeArgs),
    /// Mark a member of a served array faulty (mdadm --fail).
    Fail(control::MemberCmdArgs),
    /// Take a faulty member out of a served array (mdadm --remove).
    Remove(control::MemberCmdArgs),
    /// Add a spare or re-add a member to a served array (mdadm --add).
    Add(control::AddArgs),
    /// Rebuild a spare as a member's replacement while the member stays active, then
    /// swap them (mdadm --replace [--with]).
    Replace(control::ReplaceArgs),
    /// Stop a served array: flush, mark clean, exit (mdadm --stop).
    Stop(control::StopArgs),
    /// Wait until an array started with `uraid serve ... &` is up and no resync, recovery
    /// or replace runs on it (mdadm --wait).
    Wait(control::WaitArgs),
    /// Show or set the write journal's mode of a served array: write-through or write-back
    /// (md's journal_mode; write-back is refused while degraded).
    JournalMode(control::JournalModeArgs),
    /// Show or set a served raid4/5/6 array's knobs by md's sysfs names
    /// (stripe_cache_size=1024 group_thread_cnt=2 rmw_level=1 skip_copy=0 batching=1
    /// join_wait_us=500, and uraid's own sync_threads=2),
    /// or a member's flags (--member M writemostly=1 failfast=0).
    Set(control::SetArgs),
    /// Change an array's shape (mdadm --grow): --raid-devices, --size, --level takeovers,
    /// --bitmap; on a served array through its control socket, or on the members of one
    /// that is not running.
    Grow(grow::GrowArgs),
    /// Create (or reuse) a demo array on sparse files and serve it over NBD.
    Demo(demo::DemoArgs),
    /// Load generator: IOPS, latency and overhead of an array over memory or file members.
    Bench(bench::BenchArgs),
    /// The rescue mode's overlays (made with --overlay DIR): status, discard, commit.
    Overlay(overlay::OverlayArgs),
}

/// Why a command does not take `--overlay`, or `None` if it does: every command that
/// opens members itself takes it; create would write them directly, and the others act
/// on a running server (give --overlay to `serve`) or need no members.
fn overlay_refusal(cmd: &Cmd) -> Option<&'static str> {
    match cmd {
        Cmd::Create(_) => Some("create writes the members directly"),
        Cmd::Demo(_) | Cmd::Bench(_) => Some("it makes its own members"),
        Cmd::Overlay(_) => Some("the overlay is the argument: uraid overlay status DIR"),
        Cmd::Status(_) => Some("it asks the running servers"),
        Cmd::Incremental(_) => Some("it starts a server: give --overlay to `uraid serve`"),
        Cmd::Monitor(_)
        | Cmd::Fail(_)
        | Cmd::Remove(_)
        | Cmd::Add(_)
        | Cmd::Replace(_)
        | Cmd::Stop(_)
        | Cmd::Wait(_)
        | Cmd::JournalMode(_)
        | Cmd::Set(_) => Some("it acts on a running server: give --overlay to `uraid serve`"),
        _ => None,
    }
}

fn main() -> ExitCode {
    // Before any thread: reading systemd's LISTEN_FDS clears it from the environment.
    serve::take_activated_sockets();
    let cli = Cli::parse();
    // A command whose output goes to a pipe that closes (`uraid detail ... | head -1`) ends
    // quietly, as cat and mdadm do, instead of panicking in println!. The server keeps
    // SIGPIPE ignored: a client that goes away must not take the array down with it.
    if !matches!(cli.cmd, Cmd::Serve(_) | Cmd::Demo(_) | Cmd::Bench(_)) {
        default_sigpipe();
    }
    open::configure(cli.io_engine, cli.no_direct);
    if let Err(e) = open::configure_nbd(
        cli.nbd_timeout,
        cli.nbd_connections,
        cli.nbd_tls_ca.as_deref(),
        (cli.nbd_tls_cert.as_deref(), cli.nbd_tls_key.as_deref()),
        (cli.nbd_tls_psk.as_deref(), cli.nbd_tls_username.as_deref()),
    )
    .and_then(|()| open::configure_nbd_retry(cli.nbd_retry))
    {
        eprintln!("uraid: {}", error_text(&e));
        return ExitCode::FAILURE;
    }
    uraid_engine::set_devices_handle_discard_safely(cli.devices_handle_discard_safely);
    if let Some(dir) = &cli.overlay {
        let r = match overlay_refusal(&cli.cmd) {
            Some(why) => Err(anyhow::anyhow!("--overlay is refused here: {why}")),
            None => {
                let command: Vec<String> = std::env::args().collect();
                open::use_overlay(dir, &command.join(" ")).map(|_| {
                    eprintln!(
                        "uraid: rescue mode: members opened read-only, every write kept in \
                         overlay {}",
                        dir.display()
                    )
                })
            }
        };
        if let Err(e) = r {
            eprintln!("uraid: {}", error_text(&e));
            return ExitCode::FAILURE;
        }
    }
    let r = match cli.cmd {
        Cmd::Create(a) => {
            // The journal device too: it is overwritten like the members.
            let mut devices = a.devices.clone();
            devices.extend(a.write_journal.iter().map(|j| j.display().to_string()));
            locks::guard_create(&devices).and_then(|_l| commands::create(a))
        }
        Cmd::Examine(a) => commands::examine(a),
        // A served array's members are locked: these commands refuse and point to the
        // control socket; detail asks the server.
        Cmd::Assemble(a) if a.scan => commands::assemble_scan(a),
        Cmd::Assemble(a) => locks::guard(&a.devices).and_then(|_l| commands::assemble(a)),
        Cmd::Status(a) => status::status(a),
        Cmd::Incremental(a) => scan::incremental(a),
        // Through an overlay, detail assembles here (a server would show its own view).
        Cmd::Detail(mut a) if cli.overlay.is_some() => {
            a.devices.extend(a.target.array.take());
            if a.target.control.is_some() {
                Err(anyhow::anyhow!(
                    "--overlay assembles the members here: name them, not a control socket"
                ))
            } else {
                locks::guard(&a.devices).and_then(|_l| commands::detail(a))
            }
        }
        Cmd::Detail(a) => commands::detail_any(a),
        Cmd::Read(a) => locks::guard(&a.devices).and_then(|_l| commands::read(a)),
        Cmd::Write(a) => locks::guard(&a.devices).and_then(|_l| commands::write(a)),
        Cmd::Resync(a) => locks::guard(&a.devices).and_then(|_l| commands::resync(a)),
        Cmd::Check(a) => locks::guard(&a.devices).and_then(|_l| commands::check(a)),
        Cmd::Repair(a) => locks::guard(&a.devices).and_then(|_l| commands::repair(a)),
        Cmd::Recover(a) => locks::guard(&a.devices).and_then(|_l| commands::recover(a)),
        Cmd::Monitor(a) => monitor::monitor(a),
        Cmd::Serve(a) => serve::serve(a),
        Cmd::Fail(a) => control::fail(a),
        Cmd::Remove(a) => control::remove(a),
        Cmd::Add(a) => control::add(a),
        Cmd::Replace(a) => control::replace(a),
        Cmd::Stop(a) => control::stop(a),
        Cmd::Wait(a) => control::wait(a),
        Cmd::JournalMode(a) => control::journal_mode(a),
        Cmd::Set(a) => control::set(a),
        Cmd::Grow(a) => grow::grow(a),
        Cmd::Demo(a) => demo::demo(a),
        Cmd::Bench(a) => bench::bench(a),
        Cmd::Overlay(a) => overlay::overlay(a),
    };
    // Every TLS connection left open sends its close_notify before the process goes.
    uraid_nbd::tls::close_all(std::time::Duration::from_secs(1));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uraid: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

fn default_sigpipe() {
    // SAFETY: restoring a signal's default disposition at start-up, before any thread runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The error and its causes, each said once: a cause whose text the message already holds
/// (an error type that prints its source and also returns it from `source()`) is not
/// repeated, so the user reads "cannot open d9.img: No such file", not the same twice.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if c.is_empty() || text.contains(&c) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&c);
    }
    text
}

/// Paths of member devices as given on the command line.
pub type Paths = Vec<PathBuf>;

#[cfg(test)]
mod tests {
    use super::error_text;

    #[derive(Debug)]
    struct Inner;
    impl std::fmt::Display for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("No such file or directory")
        }
    }
    impl std::error::Error for Inner {}

    /// Prints its source in its message and returns it from source(), as thiserror's
    /// `#[error("{member}: {source}")]` does.
    #[derive(Debug)]
    struct Outer(Inner);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "d9.img: {}", self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// `--recover` alone must not take the first member path for its value.
    #[test]
    fn recover_takes_a_value_only_with_an_equals_sign() {
        use super::{serve::RecoverMode, Cli, Cmd};
        use clap::Parser;
        let serve = |args: &[&str]| {
            let cli = Cli::try_parse_from(
                ["uraid", "serve", "--ublk", "--ublk-id", "0"]
                    .iter()
                    .chain(args),
            )
            .unwrap();
            match cli.cmd {
                Cmd::Serve(a) => (a.recover, a.devices),
                _ => unreachable!(),
            }
        };
        let (r, devs) = serve(&["--recover", "m0.img"]);
        assert_eq!((r, devs.len()), (Some(RecoverMode::Yes), 1));
        let (r, devs) = serve(&["--recover=auto", "m0.img"]);
        assert_eq!((r, devs.len()), (Some(RecoverMode::Auto), 1));
        let (r, _) = serve(&["m0.img"]);
        assert_eq!(r, None);
    }

    #[test]
    fn every_cause_is_said_once() {
        let e = anyhow::Error::new(Outer(Inner)).context("cannot read the superblock");
        assert_eq!(
            error_text(&e),
            "cannot read the superblock: d9.img: No such file or directory"
        );
        let plain = anyhow::Error::new(Inner).context("reading input");
        assert_eq!(
            error_text(&plain),
            "reading input: No such file or directory"
        );
    }
}
