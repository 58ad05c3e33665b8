//! `uraid serve`: one assembled array exported as a block device over NBD (and ublk), managed
//! while it runs through a control socket (see [`crate::control`]).
//!
//! Lifecycle: lock every member (flock, so no second uraid process writes them), assemble,
//! start the exports and the control socket, then wait for SIGTERM/SIGINT or `uraid stop`.
//! Stopping: no new clients, in-flight requests answered, exports torn down, then
//! `Array::stop` flushes and marks every superblock clean, as md does at `mdadm --stop`.
//! A stop never depends on a path still existing (the control thread is woken through a
//! pipe), and a second SIGTERM or SIGINT during it forces the quickest safe exit
//! ([`uraid_engine::Array::force_stop`]), non-zero.

use crate::control::{ControlServer, Event, ServeInfo};
use crate::locks::{self, MemberLocks};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use uraid_core::superblock::uuid_string;
use uraid_engine::nbd::ArrayBackend;
use uraid_engine::{Array, ArrayCell, ForcedStop};
use uraid_nbd::{Backend, Listener, Server, ServerConfig};

/// NBD's registered port.
pub const NBD_DEFAULT_PORT: u16 = 10809;

/// Where the server is in its life, for the signal thread.
const RUNNING: u8 = 0;
/// A stop began: another signal forces the exit.
const STOPPING: u8 = 1;
/// The array is stopped cleanly: a late signal changes nothing.
const STOPPED: u8 = 2;

/// How long a forced exit waits for the members to answer their flush: a hung device must
/// not hold the process either.
const FORCE_STOP_FLUSH_BOUND: Duration = Duration::from_secs(10);

#[derive(Args)]
pub struct ServeArgs {
    /// Where NBD clients connect: `unix:PATH` (or a path with a slash), `tcp:HOST:PORT` or `tcp:PORT`
    /// (default tcp:127.0.0.1:10809; other hosts only when given here).
    #[arg(long, value_name = "ADDR")]
    pub nbd: Option<String>,
    /// Export only through ublk (no NBD listener).
    #[arg(long, requires = "ublk")]
    pub no_nbd: bool,
    /// Requests an NBD connection may have in flight at once (a worker thread each,
    /// started as the client's queue fills). Past it the client's requests wait in the
    /// socket. Remote members want it near the clients' queue depth: a request waits for
    /// its member's reply while others run.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_NBD_QUEUE_DEPTH,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub nbd_queue_depth: u32,
    #[command(flatten)]
    pub tls: crate::serve_tls::TlsArgs,
    /// Also export the array as /dev/ublkbN (Linux 6.0+ with the ublk driver).
    #[arg(long)]
    pub ublk: bool,
    /// The ublk device id to use (/dev/ublkbN); the kernel picks one if not given.
    #[arg(long, value_name = "N", requires = "ublk")]
    pub ublk_id: Option<u32>,
    /// Take over ublk device --ublk-id N left by a server that was killed, crashed or
    /// handed it over (uraid stop --keep-ublk): its waiting requests are served by this
    /// one. `--recover=auto`: take it over if it is there, else add it (the systemd
    /// unit's way: one command for a first start and for a restart).
    #[arg(
        long,
        value_enum,
        value_name = "auto",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "yes",
        requires = "ublk_id"
    )]
    pub recover: Option<RecoverMode>,
    /// NBD export name (default: the array's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Control socket path (default /run/uraid/<array-uuid>.sock).
    // The text is `--help`'s, as written: not Markdown.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Start even with stale members, disagreeing superblocks, or dirty and degraded
    /// (raid4/5/6 not stopped cleanly with a member missing: stripes written at the crash
    /// may be wrong).
    #[arg(short, long)]
    pub force: bool,
    /// Serve read-only (mdadm's -o): the NBD export says NBD_FLAG_READ_ONLY, writes fail
    /// with EPERM, and nothing is written to any member, not even the dirty flag.
    #[arg(short = 'o', long)]
    pub readonly: bool,
    /// md's sync_speed_min in KiB/s for resync and recovery while served: the pace kept
    /// while the array is busy.
    #[arg(long, value_name = "KIB", default_value_t = 1000)]
    pub speed_min: u64,
    /// md's sync_speed_max in KiB/s.
    #[arg(long, value_name = "KIB", default_value_t = 200_000)]
    pub speed_max: u64,
    /// Re-add a remote member lost with its host once the host answers again, trying
    /// every SECS seconds: it must still hold this array's member in its role, and the
    /// bitmap makes its recovery partial (mdadm's incremental re-add). 0: never (the
    /// default; `uraid add` re-adds it).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub nbd_readd: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT or PORT; loopback only
    /// unless --metrics-allow-remote; port 0 picks a free one, printed at start).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Let --metrics listen on an address other hosts can reach.
    #[arg(long, requires = "metrics")]
    pub metrics_allow_remote: bool,
    /// Find the members as `assemble --scan` does; exactly one array must be chosen, so
    /// name it (its name or UUID) where several are found.
    #[arg(short, long)]
    pub scan: bool,
    #[command(flatten)]
    pub scan_args: crate::scan::ScanArgs,
    /// Member devices or files; with --scan, the array's name or UUID.
    #[arg(required_unless_present = "scan")]
    pub devices: Vec<PathBuf>,
}

/// Where the NBD listener goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl NbdAddr {
    pub fn parse(s: &str) -> Result<NbdAddr> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                bail!("--nbd unix: needs a path");
            }
            return Ok(NbdAddr::Unix(PathBuf::from(p)));
        }
        // A path (it has a slash, which no HOST:PORT has) is a Unix socket.
        if s.starts_with('/') || s.starts_with("./") || s.starts_with("../") {
            return Ok(NbdAddr::Unix(PathBuf::from(s)));
        }
        let rest = s.strip_prefix("tcp:").unwrap_or(s);
        if let Ok(port) = rest.parse::<u16>() {
            return Ok(NbdAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], port))));
        }
        let addr = rest
            .to_socket_addrs()
            .with_context(|| format!("bad NBD address {s:?} (unix:PATH or tcp:HOST:PORT)"))?
            .next()
            .with_context(|| format!("{s:?} resolves to no address"))?;
        Ok(NbdAddr::Tcp(addr))
    }

    pub fn default_tcp() -> NbdAddr {
        NbdAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], NBD_DEFAULT_PORT)))
    }
}

impl std::fmt::Display for NbdAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NbdAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            NbdAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// `serve --nbd-queue-depth`'s default: the Linux NBD client's queue depth per
/// connection is 128, fio's and qemu's are what the user sets.
pub const DEFAULT_NBD_QUEUE_DEPTH: u32 = 128;

/// How to serve, for `serve` and `demo`.
pub struct ServeOptions {
    pub nbd: Option<NbdAddr>,
    /// Requests in flight per NBD connection (`--nbd-queue-depth`).
    pub nbd_queue_depth: usize,
    /// With the default TCP address taken, pick a free port instead of failing (demo).
    pub nbd_any_port: bool,
    pub ublk: bool,
    /// The ublk device's id, read-only flag and recovery.
    pub ublk_opts: crate::ublk::UblkOptions,
    pub export_name: String,
    pub control: Option<PathBuf>,
    /// md's sync_speed_min/max for the daemons' syncs.
    pub sync_limits: uraid_engine::SyncLimits,
    /// TLS offered or required on the NBD listener.
    pub tls: Option<uraid_nbd::TlsServer>,
    /// Where Prometheus metrics are served (`--metrics`).
    pub metrics: Option<SocketAddr>,
    /// `--nbd-readd`: how often lost remote members are tried again (`None`: never).
    pub readd_interval: Option<std::time::Duration>,
}

/// `serve --scan`: the members of the one array the scan chooses.
fn scan_members(a: &ServeArgs) -> Result<Vec<PathBuf>> {
    let wanted: Vec<String> = a.devices.iter().map(|p| p.display().to_string()).collect();
    let mut plans = crate::scan::plans(&a.scan_args, &wanted)?;
    if plans.len() > 1 {
        let names: Vec<String> = plans.iter().map(|p| p.found.describe()).collect();
        bail!(
            "{} arrays match, and one server serves one array: name it (uraid serve --scan \
             NAME|UUID): {}",
            plans.len(),
            names.join(", ")
        );
    }
    let p = plans.pop().expect("plans gives one at least");
    eprintln!(
        "uraid: array {}: found {}",
        p.found.describe(),
        p.found
            .paths()
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(p.found.paths())
}

/// `--recover`'s modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RecoverMode {
    /// The device must be there to take over.
    Yes,
    /// Take the device over if it is there, else add it.
    Auto,
}

/// The exit status of a server that handed its ublk device over (`uraid stop --keep-ublk`):
/// EX_TEMPFAIL, "come back", which the systemd unit restarts on (RestartForceExitStatus).
pub const HANDED_OVER_EXIT: i32 = 75;

pub fn serve(mut a: ServeArgs) -> Result<()> {
    init_logging();
    // Checked before anything is opened: a refusal touches nothing.
    let metrics = a
        .metrics
        .as_deref()
        .map(|m| crate::metrics::parse_addr(m, a.metrics_allow_remote))
        .transpose()?;
    if a.scan {
        a.devices = scan_members(&a)?;
    }
    // Before the array is opened: a wrong TLS setup writes nothing.
    let nbd = if a.no_nbd {
        None
    } else {
        Some(match &a.nbd {
            Some(s) => NbdAddr::parse(s)?,
            None => NbdAddr::default_tcp(),
        })
    };
    let listen = match &nbd {
        None => crate::serve_tls::Listen::None,
        Some(NbdAddr::Unix(_)) => crate::serve_tls::Listen::Unix,
        Some(NbdAddr::Tcp(sa)) => crate::serve_tls::Listen::Tcp(*sa),
    };
    let tls = crate::serve_tls::setup(&a.tls, listen)?;
    let locks = locks::lock_members(&a.devices)?;
    let (array, _) = crate::commands::open_array(&a.devices, a.force, a.readonly)?;
    if !a.readonly {
        // What the array knew at its last clean stop was never written (recoveries skip
        // it), saved again at this server's clean stop.
        let dir = locks::state_dir();
        match array.keep_written_in(&dir) {
            // Nothing saved, or an array that keeps no map by design (raid0, 0.90, a
            // journal): nothing worth a line at every start.
            Ok(uraid_engine::KeptWritten::Nothing | uraid_engine::KeptWritten::Off(_)) => {}
            Ok(k) => eprintln!("uraid: never-written map ({}): {k}", dir.display()),
            Err(e) => eprintln!(
                "uraid: never-written map ({}): {e}; every region counts as written",
                dir.display()
            ),
        }
    }
    // md names are "host:name"; clients want the name.
    let export_name = a.name.clone().unwrap_or_else(|| {
        let full = array.meta().template().set_name.clone();
        full.rsplit(':').next().unwrap_or("").to_string()
    });
    let kept = run(
        array,
        &a.devices,
        locks,
        ServeOptions {
            nbd,
            nbd_queue_depth: a.nbd_queue_depth as usize,
            nbd_any_port: false,
            ublk: a.ublk,
            ublk_opts: crate::ublk::UblkOptions {
                readonly: a.readonly,
                id: a.ublk_id,
                recover: a.recover == Some(RecoverMode::Yes),
                recover_if_kept: a.recover == Some(RecoverMode::Auto),
            },
            export_name,
            control: a.control.clone(),
            // --speed-max alone caps the pace: the minimum follows it down.
            sync_limits: uraid_engine::SyncLimits {
                min_kib_s: a.speed_min.min(a.speed_max),
                max_kib_s: a.speed_max,
            },
            tls,
            metrics,
            readd_interval: readd_interval(a.nbd_readd)?,
        },
    )?;
    if kept.is_some() {
        // Not 0: a supervisor that restarts on this status (the systemd unit) starts the
        // next server, which takes the device over (--recover=auto).
        uraid_nbd::tls::close_all(std::time::Duration::from_secs(1));
        std::process::exit(HANDED_OVER_EXIT);
    }
    Ok(())
}

/// `--nbd-readd SECS`: 0 is never.
fn readd_interval(secs: f64) -> Result<Option<std::time::Duration>> {
    if !(secs.is_finite() && secs >= 0.0) {
        anyhow::bail!("--nbd-readd must be a number of seconds (0: never), not {secs}");
    }
    Ok((secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs)))
}

/// Serves `array` until a signal or `uraid stop`, then stops it cleanly; the id of the ublk
/// device it kept for the next server, if it handed it over.
pub fn run(
    array: Array,
    paths: &[PathBuf],
    locks: MemberLocks,
    opts: ServeOptions,
) -> Result<Option<u32>> {
    // Everything below reaches the array through its cell: a grow replaces it.
    let cell = ArrayCell::new(Arc::new(array));
    let array = cell.current();
    let uuid = uuid_string(&array.meta().template().set_uuid);
    let (tx, rx) = mpsc::channel::<Event>();
    let phase = Arc::new(AtomicU8::new(RUNNING));
    let signals = watch_signals(tx.clone(), cell.clone(), phase.clone())?;

    // Metrics, before the exports so that their first request is counted.
    let metrics = opts
        .metrics
        .map(|_| Arc::new(crate::metrics::Metrics::new(cell.clone())));
    let mut metrics_server = None;
    if let (Some(addr), Some(m)) = (opts.metrics, &metrics) {
        match crate::metrics::MetricsServer::start(addr, m.clone()) {
            Ok(s) => metrics_server = Some(s),
            Err(e) => {
                array.stop().ok();
                return Err(e);
            }
        }
    }

    // NBD.
    let mut nbd_running = None;
    let mut info = ServeInfo {
        pid: std::process::id(),
        sync_limits: opts.sync_limits,
        readd_interval: opts.readd_interval,
        ..ServeInfo::default()
    };
    if let Some(addr) = &opts.nbd {
        let listener = bind(addr, opts.nbd_any_port)?;
        let mut uri = nbd_uri(&listener, &opts.export_name);
        if opts.tls.is_some() {
            uri = uri.replacen("nbd", "nbds", 1); // nbds:// and nbds+unix://
        }
        let server = Server::new(ServerConfig {
            tls: opts.tls.clone(),
            export_name: opts.export_name.clone(),
            description: format!("uraid {} array {uuid}", array.level()),
            workers_per_connection: opts.nbd_queue_depth.max(1),
            ..ServerConfig::default()
        })?;
        let backend: Arc<dyn Backend> = Arc::new(match &metrics {
            Some(m) => ArrayBackend::with_observer(cell.clone(), m.observer()),
            None => ArrayBackend::of_cell(cell.clone()),
        });
        nbd_running = Some(server.spawn(listener, backend)?);
        info.nbd_uri = Some(uri);
    }

    // ublk.
    let mut ublk = None;
    if opts.ublk {
        match crate::ublk::UblkExport::start(
            cell.clone(),
            opts.ublk_opts.clone(),
            metrics.as_ref().map(|m| m.ublk_observer()),
        ) {
            Ok(u) => {
                info.ublk_dev = Some(u.bdev_path());
                ublk = Some(u);
            }
            Err(e) => {
                if let Some(n) = nbd_running.take() {
                    let _ = n.shutdown();
                }
                array.stop().ok();
                return Err(e);
            }
        }
    }

    // Control socket.
    info.members = paths.iter().map(|p| locks::canonical(p)).collect();
    let control_path = opts
        .control
        .clone()
        .unwrap_or_else(|| locks::run_dir().join(format!("{uuid}.sock")));
    info.control = control_path.clone();
    let ctl =
        match ControlServer::start(&uuid, control_path, cell.clone(), info.clone(), tx.clone()) {
            Ok(c) => c,
            Err(e) => {
                if let Some(n) = nbd_running.take() {
                    let _ = n.shutdown();
                }
                if let Some(u) = ublk.take() {
                    let _ = u.stop();
                }
                array.stop().ok();
                return Err(e);
            }
        };

    if let Some(m) = &metrics {
        m.set_sync_source(ctl.sync_source());
    }
    print_banner(&array, &info, &opts.export_name);
    if let Some(s) = &metrics_server {
        // As the banner: a closed stdout must not stop the server.
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "metrics: http://{}/metrics", s.addr);
    }
    // Every export listens and the control socket answers: a unit ordered after this one
    // can use the array.
    crate::systemd::ready(&ready_status(&array, &info));
    // Not held while serving: a grow replaces the array, and the old one goes.
    drop(array);

    // Wait.
    let event = rx.recv();
    // From here on a signal forces the exit: the stop below may wait on a hung client or
    // member, and a service manager's second SIGTERM must not be ignored.
    phase.store(STOPPING, Ordering::SeqCst);
    crate::systemd::stopping(&format!("stopping array {uuid}"));
    let (stop_reply, keep_ublk) = match event {
        Ok(Event::Signal(sig)) => {
            eprintln!("uraid: signal {sig}: stopping");
            (None, false)
        }
        Ok(Event::Stop {
            keep_ublk,
            reply,
            written,
        }) => {
            eprintln!(
                "uraid: stop requested through the control socket{}",
                if keep_ublk {
                    ", the ublk device kept for the next server"
                } else {
                    ""
                }
            );
            (Some((reply, written)), keep_ublk)
        }
        Err(_) => (None, false),
    };

    // Tear down: clients first, so every acknowledged write is in the array before it is
    // marked clean.
    let mut errors = Vec::new();
    if let Some(n) = nbd_running.take() {
        if let Err(e) = n.shutdown() {
            errors.push(format!("nbd: {e}"));
        }
    }
    let mut kept_ublk = None;
    if let Some(u) = ublk.take() {
        if keep_ublk {
            // Nothing runs on the array from here; what the kernel sends now waits for the
            // next server, and the array below is stopped clean under it.
            kept_ublk = Some(u.hand_over());
        } else if let Err(e) = u.stop() {
            errors.push(format!("ublk: {e:#}"));
        }
    }
    // md stops its sync thread before the array: a rebuild is interrupted at its next
    // step, and the stop below records where it got to.
    // The daemons, then the array served now (a grow may have replaced the one we started
    // with), after any replacement under way.
    let (array, stopped) = cell.stop();
    match &stopped {
        Ok(()) => phase.store(STOPPED, Ordering::SeqCst),
        Err(e) => errors.push(format!("stopping the array: {e}")),
    }
    let detail = crate::report::detail_json(&array);
    if let Some((reply, written)) = stop_reply {
        let r = if errors.is_empty() {
            Ok(detail)
        } else {
            Err(errors.join("; "))
        };
        if reply.send(r).is_ok() {
            let _ = written.recv_timeout(std::time::Duration::from_secs(5));
        }
    }
    ctl.shutdown();
    drop(metrics_server);
    drop(signals);
    drop(locks);
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    eprintln!("uraid: array {uuid} stopped cleanly");
    if let Some(id) = kept_ublk {
        eprintln!(
            "uraid: /dev/ublkb{id} kept: its requests wait for `uraid serve --ublk --ublk-id \
             {id} --recover` on this array's members"
        );
    }
    Ok(kept_ublk)
}

/// The one line `systemctl status` shows while the array is served.
fn ready_status(array: &Array, info: &ServeInfo) -> String {
    let mut s = format!(
        "serving {} array {}{}",
        array.level(),
        uuid_string(&array.meta().template().set_uuid),
        if array.is_degraded() {
            " (degraded)"
        } else {
            ""
        }
    );
    if let Some(uri) = &info.nbd_uri {
        s.push_str(&format!(" at {uri}"));
    }
    if let Some(dev) = &info.ublk_dev {
        s.push_str(&format!(" as {dev}"));
    }
    s
}

/// The sockets systemd passed (socket activation: LISTEN_FDS, LISTEN_PID), read once at
/// start, before any thread runs (reading them clears those environment variables).
static ACTIVATED: std::sync::Mutex<Option<listenfd::ListenFd>> = std::sync::Mutex::new(None);

/// Take the sockets systemd passed, if any; `main` calls it first thing.
pub fn take_activated_sockets() {
    let fds = listenfd::ListenFd::from_env();
    if fds.len() > 0 {
        *ACTIVATED.lock().unwrap_or_else(|e| e.into_inner()) = Some(fds);
    }
}

/// The listener systemd passed for `--nbd` (the first socket), checked against the kind of
/// address `--nbd` names; None when no socket was passed.
fn activated(addr: &NbdAddr) -> Result<Option<Listener>> {
    let mut g = ACTIVATED.lock().unwrap_or_else(|e| e.into_inner());
    let Some(fds) = g.as_mut() else {
        return Ok(None);
    };
    let mismatch = |want: &str| {
        format!(
            "the socket systemd passed (LISTEN_FDS) is not a listening {want} socket, and \
             --nbd {addr} asks for one: make the socket unit's ListenStream= the --nbd address"
        )
    };
    let l = match addr {
        NbdAddr::Unix(_) => fds
            .take_unix_listener(0)
            .with_context(|| mismatch("Unix"))?
            .map(Listener::adopt_unix)
            .transpose()?,
        NbdAddr::Tcp(_) => fds
            .take_tcp_listener(0)
            .with_context(|| mismatch("TCP"))?
            .map(Listener::adopt_tcp),
    };
    if l.is_some() {
        tracing::info!("NBD: serving on the socket systemd passed (--nbd {addr})");
    }
    Ok(l)
}

fn bind(addr: &NbdAddr, any_port: bool) -> Result<Listener> {
    if let Some(l) = activated(addr)? {
        return Ok(l);
    }
    match addr {
        NbdAddr::Unix(p) => Ok(Listener::bind_unix(p)?),
        NbdAddr::Tcp(a) => match Listener::bind_tcp(*a) {
            Ok(l) => Ok(l),
            Err(e) if any_port => {
                let mut other = *a;
                other.set_port(0);
                let l = Listener::bind_tcp(other)?;
                eprintln!(
                    "uraid: {a} is taken ({e}); using port {} instead",
                    l.tcp_addr().map(|x| x.port()).unwrap_or(0)
                );
                Ok(l)
            }
            Err(e) => Err(e.into()),
        },
    }
}

fn nbd_uri(l: &Listener, name: &str) -> String {
    match l {
        Listener::Unix { path, .. } => format!("nbd+unix:///{name}?socket={}", path.display()),
        Listener::Tcp(_) => {
            let a = l.tcp_addr().expect("tcp listener has an address");
            let host = match a {
                SocketAddr::V6(v) => format!("[{}]", v.ip()),
                SocketAddr::V4(v) => v.ip().to_string(),
            };
            if a.port() == NBD_DEFAULT_PORT {
                format!("nbd://{host}/{name}")
            } else {
                format!("nbd://{host}:{}/{name}", a.port())
            }
        }
    }
}

fn print_banner(array: &Array, info: &ServeInfo, name: &str) {
    let uuid = uuid_string(&array.meta().template().set_uuid);
    let mut o = String::new();
    o.push_str(&format!(
        "uraid: serving {} array {uuid}: {} bytes, {} of {} members{}\n",
        array.level(),
        array.size_bytes(),
        array.raid_disks() - array.missing_roles().len(),
        array.raid_disks(),
        if array.is_degraded() {
            " (degraded)"
        } else {
            ""
        }
    ));
    if let Some(why) = array.read_only_reason() {
        o.push_str(&format!("uraid: served read-only: {why}\n"));
    }
    if let Some(uri) = &info.nbd_uri {
        o.push_str(&format!("nbd: {uri}\n"));
        o.push_str("  connect with:\n");
        o.push_str(&format!("    nbdinfo '{uri}'\n"));
        o.push_str(&format!("    qemu-io -f raw '{uri}' -c 'read -v 0 512'\n"));
        o.push_str(&format!("    qemu-img convert -O raw '{uri}' copy.img\n"));
        if let Some(rest) = uri.strip_prefix("nbd://") {
            let hostport = rest.split('/').next().unwrap_or("");
            let (host, port) = match hostport.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => {
                    (h.to_string(), p.to_string())
                }
                _ => (hostport.to_string(), NBD_DEFAULT_PORT.to_string()),
            };
            o.push_str(&format!(
                "    nbd-client {host} {port} /dev/nbd0 -N {name}   (kernel NBD client)\n"
            ));
        } else if let Some(sock) = uri.split("socket=").nth(1) {
            o.push_str(&format!(
                "    nbd-client -unix {sock} /dev/nbd0 -N {name}   (kernel NBD client)\n"
            ));
        }
    }
    if let Some(dev) = &info.ublk_dev {
        o.push_str(&format!("ublk: {dev}\n"));
    }
    o.push_str(&format!("control: {}\n", info.control.display()));
    o.push_str(&format!(
        "  manage with: uraid detail|fail|remove|add|stop --control {}\n",
        info.control.display()
    ));
    o.push_str("  stop with Ctrl-C, SIGTERM or `uraid stop`\n");
    // Not print!: a closed stdout (`uraid serve ... | head -1`) must not stop the server;
    // the array goes on being served and the rest of what it says goes to stderr.
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(o.as_bytes()).and_then(|()| out.flush());
}

/// The first SIGTERM or SIGINT becomes [`Event::Signal`]; one that comes while the array
/// is stopping (after a signal or `uraid stop`) forces the exit; one after the array
/// stopped cleanly is ignored (the process is about to exit 0).
fn watch_signals(
    tx: mpsc::Sender<Event>,
    cell: Arc<ArrayCell>,
    phase: Arc<AtomicU8>,
) -> Result<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .context("installing signal handlers")?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                match phase.compare_exchange(RUNNING, STOPPING, Ordering::SeqCst, Ordering::SeqCst)
                {
                    Ok(_) => {}
                    Err(STOPPED) => continue,
                    Err(_) => force_exit(&cell.current(), sig),
                }
                // The main thread has gone; nothing is left to stop.
                if tx.send(Event::Signal(sig)).is_err() {
                    break;
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(handle)
}

/// A second signal during the stop: flush what can be flushed, record the members that
/// could not be, say what was left, and exit non-zero without waiting for the clean stop.
fn force_exit(array: &Arc<Array>, sig: i32) -> ! {
    eprintln!("uraid: signal {sig} while stopping: forcing the quickest safe exit");
    let (tx, rx) = mpsc::channel();
    let a = array.clone();
    let spawned = std::thread::Builder::new()
        .name("force-stop".into())
        .spawn(move || {
            let _ = tx.send(a.force_stop());
        });
    let msg = match spawned
        .ok()
        .and_then(|_| rx.recv_timeout(FORCE_STOP_FLUSH_BOUND).ok())
    {
        Some(r) => forced_message(&r),
        None => format!(
            "uraid: forced exit: the members did not answer a flush within {} s; the array \
             was not marked clean and resyncs at its next start",
            FORCE_STOP_FLUSH_BOUND.as_secs()
        ),
    };
    eprintln!("{msg}");
    std::process::exit(2)
}

/// One line on what a forced stop did and what the next start will do.
pub fn forced_message(r: &ForcedStop) -> String {
    let mut parts = vec![format!("flushed {} member(s)", r.flushed.len())];
    if !r.marked_faulty.is_empty() {
        parts.push(format!(
            "{} could not be flushed and are marked faulty",
            r.marked_faulty.join(", ")
        ));
    }
    if !r.unrecorded.is_empty() {
        parts.push(format!(
            "{} could not be flushed and that could not be recorded: leave them out of the \
             next assembly (or re-add them so they are rebuilt)",
            r.unrecorded.join(", ")
        ));
    }
    if let Some(e) = &r.journal_error {
        parts.push(format!("the journal could not be flushed ({e})"));
    }
    parts.push(if r.dirty {
        "the array was not marked clean and resyncs at its next start".to_string()
    } else {
        "the superblocks were already clean".to_string()
    });
    format!("uraid: forced exit: {}", parts.join("; "))
}

/// Warnings from the engine (a member failed) and the servers go to stderr.
pub fn init_logging() {
    let level = match std::env::var("URAID_LOG").as_deref() {
        Ok("debug") => tracing::Level::DEBUG,
        Ok("trace") => tracing::Level::TRACE,
        Ok("warn") => tracing::Level::WARN,
        Ok("error") => tracing::Level::ERROR,
        _ => tracing::Level::INFO,
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_addresses() {
        assert_eq!(
            NbdAddr::parse("unix:/tmp/x.sock").unwrap(),
            NbdAddr::Unix("/tmp/x.sock".into())
        );
        assert_eq!(
            NbdAddr::parse("tcp:127.0.0.1:1234").unwrap(),
            NbdAddr::Tcp("127.0.0.1:1234".parse().unwrap())
        );
        assert_eq!(
            NbdAddr::parse("tcp:4321").unwrap(),
            NbdAddr::Tcp("127.0.0.1:4321".parse().unwrap())
        );
        assert_eq!(
            NbdAddr::parse("0.0.0.0:10809").unwrap(),
            NbdAddr::Tcp("0.0.0.0:10809".parse().unwrap())
        );
        assert_eq!(
            NbdAddr::parse("/run/uraid/md0.sock").unwrap(),
            NbdAddr::Unix("/run/uraid/md0.sock".into())
        );
        assert!(NbdAddr::parse("unix:").is_err());
        assert!(NbdAddr::parse("tcp:nohost").is_err());
        assert_eq!(
            NbdAddr::default_tcp(),
            NbdAddr::Tcp("127.0.0.1:10809".parse().unwrap())
        );
    }
}
