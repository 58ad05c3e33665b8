//! Live management of a served array: member locks, the control socket and its commands.
//!
//! - `uraid serve` takes an exclusive `flock` on every member, so no second uraid process
//!   opens them while the array runs; other commands that would assemble the array refuse
//!   and point to the control socket ([`guard`]).
//! - The control socket speaks one JSON object per line each way:
//!   `{"cmd":"detail"}`, `{"cmd":"fail","member":"2"}` (a role or a member path),
//!   `{"cmd":"remove","member":...}`, `{"cmd":"add","device":"/abs/path"}`,
//!   `{"cmd":"replace","member":...,"with":"/abs/path"}` (with is optional),
//!   `{"cmd":"journal-mode","mode":...}`, `{"cmd":"set","values":{...}}`, `{"cmd":"stop"}`,
//!   `{"cmd":"events","since":N}` (the array's events numbered from N on; see [`EventLog`]).
//!   Replies are `{"ok":true,...}` or `{"ok":false,"error":"..."}`; a `detail` reply carries
//!   `event_seq`, the number the next event will get. A line is parsed
//!   ([`request::parse`], fuzzed) before anything touches the array.
//! - Finding a running array from its member paths: each server writes
//!   `<run dir>/<uuid>.json` (its pid, control path and canonical member paths) beside its
//!   socket `<run dir>/<uuid>.sock` (a symlink when `--control` put it elsewhere).

mod request;

use crate::serve::{Event, ServeInfo};
use anyhow::{bail, Context, Result};
use clap::Args;
use request::{fail_reply, Request};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use uraid_core::MemberIdx;
use uraid_engine::JournalMode;
use uraid_engine::Place;
use uraid_engine::{AddOutcome, Array, SlotState, SyncKind, SyncProgress};
use uraid_nbd::WakePipe;

/// Longest request line accepted on the control socket.
const MAX_REQUEST_BYTES: u64 = 64 * 1024;
/// Control connections handled at once.
const MAX_CONTROL_CONNECTIONS: usize = 16;
/// Events kept for `uraid monitor`; a monitor that falls further behind is told so.
const EVENT_LOG_LEN: usize = 1024;

/// The array's events, numbered, so that a monitor polling every few seconds gets each one
/// (a Fail, then a remove and an add within one interval) instead of a state diff.
#[derive(Default)]
pub struct EventLog {
    next_seq: u64,
    entries: std::collections::VecDeque<Value>,
}

impl EventLog {
    /// Records one event in mdadm's words. A raid0 has no degraded mode (md never says
    /// DegradedArray for one): a failed member there is a Fail and a dead array.
    pub fn record(&mut self, level: uraid_core::Level, e: &uraid_engine::Event) {
        if level == uraid_core::Level::Raid0 && *e == uraid_engine::Event::DegradedArray {
            return;
        }
        if self.entries.len() == EVENT_LOG_LEN {
            self.entries.pop_front();
        }
        self.entries
            .push_back(json!({"seq": self.next_seq, "event": e.name(), "device": e.device()}));
        self.next_seq += 1;
    }

    /// The number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Events numbered `since` and later; `lost` when some of those were dropped already.
    pub fn since(&self, since: u64) -> Value {
        let first_kept = self.next_seq - self.entries.len() as u64;
        let skip = since.saturating_sub(first_kept) as usize;
        let events: Vec<&Value> = self.entries.iter().skip(skip).collect();
        json!({
            "ok": true,
            "events": events,
            "next": self.next_seq,
            "lost": since < first_kept,
        })
    }
}

/// Where servers keep their sockets and index files: `$URAID_RUN_DIR`, else `/run/uraid`
/// for root, else `$XDG_RUNTIME_DIR/uraid` or `/tmp/uraid-<uid>`.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("URAID_RUN_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from("/run/uraid");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("uraid"),
        None => PathBuf::from(format!("/tmp/uraid-{uid}")),
    }
}

// ---------------------------------------------------------------------------------------
// Member locks

/// Exclusive advisory locks on member files, held while an array is open.
pub struct MemberLocks(#[allow(dead_code)] Vec<File>);

impl MemberLocks {
    pub fn push(&mut self, f: File) {
        self.0.push(f);
    }
}

/// Locks one member; `Ok(None)` when another process holds it.
fn try_lock(path: &Path) -> Result<Option<File>> {
    let f = File::open(path).with_context(|| format!("cannot open member {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(f));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(None);
    }
    Err(e).with_context(|| format!("cannot lock member {}", path.display()))
}

/// Locks every member, or says which one a running server holds.
pub fn lock_members(paths: &[PathBuf]) -> Result<MemberLocks> {
    use std::os::unix::fs::MetadataExt;
    let mut locks = MemberLocks(Vec::new());
    let mut seen: Vec<(u64, u64)> = Vec::new();
    for p in paths {
        // One file named twice (a link, ./x and x) would collide with our own lock and
        // read as "in use": lock it once, and let the engine say it is one device.
        if let Ok(m) = std::fs::metadata(p) {
            if seen.contains(&(m.dev(), m.ino())) {
                continue;
            }
            seen.push((m.dev(), m.ino()));
        }
        match try_lock(p)? {
            Some(f) => locks.push(f),
            None => bail!("{}", in_use_message(p)),
        }
    }
    Ok(locks)
}

fn in_use_message(p: &Path) -> String {
    match find_server(std::slice::from_ref(&p.to_path_buf())) {
        Some(s) => format!(
            "{} is a member of an array served by uraid (pid {}); manage it through its \
             control socket: uraid detail|fail|remove|add|stop --control {}",
            p.display(),
            s.pid,
            s.control.display()
        ),
        None => format!(
            "{} is locked by another process (a running `uraid serve`?); stop it first or \
             use its control socket (uraid ... --control PATH)",
            p.display()
        ),
    }
}

/// For commands that assemble an array themselves: lock its members for the duration, or
/// refuse when a server holds them.
pub fn guard(paths: &[PathBuf]) -> Result<MemberLocks> {
    lock_members(paths)
}

/// `uraid create` must not overwrite the members of a served array; `missing` is no path,
/// and a path that does not exist yet is left for create to report.
pub fn guard_create(devices: &[String]) -> Result<MemberLocks> {
    let paths: Vec<PathBuf> = devices
        .iter()
        .filter(|d| d.as_str() != "missing")
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
    lock_members(&paths)
}

// ---------------------------------------------------------------------------------------
// Finding a running server

/// A running server, as its index file describes it.
#[derive(Clone, Debug)]
pub struct Found {
    pub pid: u32,
    pub control: PathBuf,
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && (unsafe { libc::kill(pid as libc::pid_t, 0) } == 0 || errno() == libc::EPERM)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The running server one of whose members is among `paths`.
pub fn find_server(paths: &[PathBuf]) -> Option<Found> {
    let wanted: Vec<PathBuf> = paths.iter().map(|p| canonical(p)).collect();
    let dir = std::fs::read_dir(run_dir()).ok()?;
    for e in dir.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let pid = v["pid"].as_u64().unwrap_or(0) as u32;
        let members: Vec<PathBuf> = v["members"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m.as_str().map(PathBuf::from))
                    .collect()
            })
            .unwrap_or_default();
        if !members.iter().any(|m| wanted.contains(m)) {
            continue;
        }
        if !pid_alive(pid) {
            continue;
        }
        if let Some(c) = v["control"].as_str() {
            return Some(Found {
                pid,
                control: PathBuf::from(c),
            });
        }
    }
    None
}

/// The control socket to talk to: `--control`, else the server holding these members.
fn resolve(control: &Option<PathBuf>, members: &[PathBuf]) -> Result<PathBuf> {
    if let Some(c) = control {
        return Ok(c.clone());
    }
    if members.is_empty() {
        bail!("give --control PATH or a member path of the running array");
    }
    match find_server(members) {
        Some(f) => Ok(f.control),
        None => bail!(
            "no running uraid serve holds {} (looked in {}): start it with uraid serve, or \
             give --control PATH",
            members
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            run_dir().display()
        ),
    }
}

// ---------------------------------------------------------------------------------------
// The server side

/// The control socket of a running array.
pub struct ControlServer {
    path: PathBuf,
    index: PathBuf,
    link: Option<PathBuf>,
    stop: Arc<AtomicBool>,
    /// Wakes the accept loop without connecting to `path`, which an operator or a tmpfiles
    /// cleaner may have removed by the time we stop.
    wake: Arc<WakePipe>,
    thread: Option<JoinHandle<()>>,
}

struct Ctx {
    array: Arc<Array>,
    info: Mutex<ServeInfo>,
    events: Mutex<mpsc::Sender<Event>>,
    active: AtomicUsize,
    /// Locks on devices added while serving.
    extra_locks: Mutex<Vec<File>>,
    recovery_running: Arc<AtomicBool>,
    progress: Arc<Mutex<Option<SyncProgress>>>,
    events_log: Mutex<EventLog>,
}

impl ControlServer {
    pub fn start(
        uuid: &str,
        path: PathBuf,
        array: Arc<Array>,
        info: ServeInfo,
        events: mpsc::Sender<Event>,
    ) -> Result<ControlServer> {
        let dir = run_dir();
        std::fs::create_dir_all(&dir).with_context(|| {
            format!(
                "cannot create {} (set URAID_RUN_DIR or run as root)",
                dir.display()
            )
        })?;
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("cannot create {}", parent.display()))?;
            }
        }
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                bail!(
                    "{} is in use by another running server; pick another --control path",
                    path.display()
                );
            }
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        // Failing members is for the owner only.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;

        let default_path = dir.join(format!("{uuid}.sock"));
        let mut link = None;
        if canonical(&path) != canonical(&default_path) {
            let _ = std::fs::remove_file(&default_path);
            match std::os::unix::fs::symlink(canonical(&path), &default_path) {
                Ok(()) => link = Some(default_path),
                Err(e) => tracing::warn!("cannot link {}: {e}", default_path.display()),
            }
        }
        let index = dir.join(format!("{uuid}.json"));
        let tmp = dir.join(format!(".{uuid}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&info.to_json())?)?;
        std::fs::rename(&tmp, &index)?;

        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Arc::new(Ctx {
            array,
            info: Mutex::new(info),
            events: Mutex::new(events),
            active: AtomicUsize::new(0),
            extra_locks: Mutex::new(Vec::new()),
            recovery_running: Arc::new(AtomicBool::new(false)),
            progress: Arc::new(Mutex::new(None)),
            events_log: Mutex::new(EventLog::default()),
        });
        watch_failures(&ctx)?;
        housekeeping(&ctx, stop.clone())?;
        // As md does when it starts a degraded array that has spares: each spare takes a
        // missing role and is rebuilt.
        activate_spares(&ctx.array);
        // As md does when it starts an array: finish an interrupted recovery, else resync
        // after an unclean stop (needs every member; degraded, the data is all there is).
        if !ctx.array.recovering_roles().is_empty() || !ctx.array.replacing_roles().is_empty() {
            start_recovery(&ctx);
        } else if ctx.array.meta().needs_resync() && !ctx.array.is_degraded() {
            start_resync(&ctx);
        }
        let stop2 = stop.clone();
        let wake = Arc::new(WakePipe::new().context("creating the control wake pipe")?);
        let wake2 = wake.clone();
        listener.set_nonblocking(true)?;
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, ctx, stop2, &wake2))?;
        Ok(ControlServer {
            path,
            index,
            link,
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// Stops accepting and removes the socket, its link and the index file. Never depends
    /// on the socket's path still existing.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.index);
        if let Some(l) = &self.link {
            let _ = std::fs::remove_file(l);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// md's periodic work while an array runs: safe mode (an array idle for 200 ms is marked
/// clean, so a crash while idle needs no resync) and the bitmap daemon (every daemon_sleep
/// seconds, bits of chunks idle for a whole pass are cleared).
fn housekeeping(ctx: &Arc<Ctx>, stop: Arc<AtomicBool>) -> Result<()> {
    if ctx.array.has_journal() {
        // md's r5c reclaim thread: writes the write-back cache out under log or cache
        // pressure and when it gets old, and leaves write-back if a member failed.
        let (ctx, stop) = (ctx.clone(), stop.clone());
        std::thread::Builder::new()
            .name("r5c-reclaim".into())
            .spawn(move || ctx.array.writeback_daemon(&stop))?;
    }
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .name("md-daemon".into())
        .spawn(move || {
            let tick = Duration::from_millis(100);
            let mut since_bitmap = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(tick);
                if let Err(e) = ctx.array.safemode(Duration::from_millis(200)) {
                    eprintln!("uraid: safe mode: {e}");
                }
                since_bitmap += tick;
                let every = ctx.array.bitmap_daemon_sleep_secs().unwrap_or(5);
                if since_bitmap >= Duration::from_secs(u64::from(every)) {
                    since_bitmap = Duration::ZERO;
                    if let Err(e) = ctx.array.bitmap_daemon() {
                        eprintln!("uraid: bitmap daemon: {e}");
                    }
                }
            }
        })?;
    Ok(())
}

/// Gives missing roles to waiting spares, as many as both allow; says which.
pub fn activate_spares(array: &Array) {
    while array.is_degraded() && !array.spares().is_empty() {
        match array.activate_spare() {
            Ok(Some(r)) => eprintln!(
                "uraid: the array is degraded: a spare takes role {r} ({}) and is rebuilt",
                device_name(array, r)
            ),
            Ok(None) => break,
            Err(e) => {
                eprintln!("uraid: could not activate a spare: {e}");
                break;
            }
        }
    }
}

/// md puts a waiting spare to work as soon as a member fails, whether by request or by an
/// IO error; so do we.
fn watch_failures(ctx: &Arc<Ctx>) -> Result<()> {
    let events = ctx.array.subscribe();
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .name("md-events".into())
        .spawn(move || {
            for e in events {
                ctx.events_log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .record(ctx.array.level(), &e);
                if !matches!(e, uraid_engine::Event::Fail { .. }) {
                    continue;
                }
                match ctx.array.activate_spare() {
                    Ok(Some(r)) => eprintln!("uraid: a spare takes role {r}; recovery started"),
                    Ok(None) => {}
                    Err(e) => eprintln!("uraid: could not activate a spare: {e}"),
                }
                // The engine may already have given the role to a spare itself.
                if !ctx.array.recovering_roles().is_empty() {
                    start_recovery(&ctx);
                }
            }
        })?;
    Ok(())
}

/// Accepts control connections until [`ControlServer::shutdown`] wakes it. The listener is
/// non-blocking: a client that went away between `poll` and `accept` must not leave the
/// loop blocked where the wake pipe cannot reach it.
fn accept_loop(listener: UnixListener, ctx: Arc<Ctx>, stop: Arc<AtomicBool>, wake: &WakePipe) {
    loop {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        match wake.wait_readable(listener.as_raw_fd()) {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                tracing::error!("control socket: poll failed: {e}; no more control requests");
                break;
            }
        }
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and the like: poll says readable at once, so do not spin.
                tracing::warn!("control socket: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        // Accepted sockets do not inherit O_NONBLOCK on Linux; be explicit anyway.
        if conn.set_nonblocking(false).is_err() {
            continue;
        }
        if ctx.active.load(Ordering::SeqCst) >= MAX_CONTROL_CONNECTIONS {
            let mut c = conn;
            let _ = writeln!(
                c,
                "{}",
                json!({"ok": false, "error": "too many control connections"})
            );
            continue;
        }
        ctx.active.fetch_add(1, Ordering::SeqCst);
        let ctx2 = ctx.clone();
        let spawned = std::thread::Builder::new()
            .name("control-conn".into())
            .spawn(move || {
                handle_conn(conn, &ctx2);
                ctx2.active.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            ctx.active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn handle_conn(conn: UnixStream, ctx: &Ctx) {
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    let Ok(wconn) = conn.try_clone() else { return };
    let mut w = wconn;
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        match r.by_ref().take(MAX_REQUEST_BYTES).read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(_) => return,
        }
        if !line.ends_with('\n') && line.len() as u64 >= MAX_REQUEST_BYTES {
            let _ = writeln!(w, "{}", json!({"ok": false, "error": "request too long"}));
            return;
        }
        let (reply, written) = match request::parse(&line) {
            Ok(req) => handle_request(&req, ctx),
            Err(e) => (fail_reply(e), None),
        };
        let ok = writeln!(w, "{reply}").is_ok();
        if let Some(done) = written {
            let _ = done.send(());
            return;
        }
        if !ok {
            return;
        }
    }
}

/// One request; for `stop`, also the channel that tells the main thread the reply is out.
fn handle_request(req: &Request, ctx: &Ctx) -> (Value, Option<mpsc::Sender<()>>) {
    let a = &ctx.array;
    let detail = || {
        let info = ctx.info.lock().unwrap_or_else(|e| e.into_inner());
        let mut d = crate::report::detail_json(a);
        d["serve"] = info.to_json();
        if let Some(p) = *ctx.progress.lock().unwrap_or_else(|e| e.into_inner()) {
            d["sync"] = json!({
                "kind": p.kind.name(),
                "done_units": p.done_units,
                "total_units": p.total_units,
                "percent": p.percent(),
            });
        }
        d
    };
    match req {
        Request::Ping => (json!({"ok": true}), None),
        Request::Detail => {
            // Numbered before the state is read: an event in between is reported twice by
            // a monitor rather than not at all.
            let seq = ctx
                .events_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .next_seq();
            let sync = *ctx.progress.lock().unwrap_or_else(|e| e.into_inner());
            let human = crate::report::detail_human(a, sync.as_ref());
            (
                json!({"ok": true, "detail": detail(), "human": human, "event_seq": seq}),
                None,
            )
        }
        Request::Events { since } => (
            ctx.events_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .since(*since),
            None,
        ),
        Request::Fail { member } => match member_role(a, member) {
            // Named before the failure: a waiting spare may take the role at once.
            Ok(role) => match (device_name(a, role), a.fail_member(role)) {
                (name, Ok(())) => {
                    // A waiting spare takes over through the event watcher.
                    eprintln!("uraid: member {role} ({name}) marked faulty by request");
                    (
                        json!({"ok": true, "role": role.0, "device": name, "detail": detail()}),
                        None,
                    )
                }
                (_, Err(e)) => (fail_reply(e), None),
            },
            Err(e) => (fail_reply(e), None),
        },
        Request::Remove { member } => match member_role(a, member) {
            Ok(role) => match engine_remove(ctx, role) {
                Ok(()) => (
                    json!({"ok": true, "role": role.0, "detail": detail()}),
                    None,
                ),
                Err(e) => (fail_reply(e), None),
            },
            // mdadm --remove also takes a faulty device that lost its role, or a spare.
            Err(e) => match remove_roleless(a, member) {
                Some(Ok(device)) => (
                    json!({"ok": true, "device": device, "detail": detail()}),
                    None,
                ),
                Some(Err(e)) => (fail_reply(e), None),
                None => (fail_reply(e), None),
            },
        },
        Request::Replace { member, with } => match member_role(a, member) {
            Ok(role) => match engine_replace(ctx, role, with.as_deref()) {
                Ok(v) => (json!({"ok": true, "replace": v, "detail": detail()}), None),
                Err(e) => (fail_reply(e), None),
            },
            Err(e) => (fail_reply(e), None),
        },
        Request::Add { device } => match engine_add(ctx, Path::new(device)) {
            Ok(v) => (json!({"ok": true, "added": v, "detail": detail()}), None),
            Err(e) => (fail_reply(e), None),
        },
        Request::JournalMode { mode } => match mode.as_deref().map(str::parse::<JournalMode>) {
            Some(Ok(mode)) => match a.set_journal_mode(mode) {
                Ok(()) => {
                    eprintln!("uraid: journal mode set to {mode}");
                    (
                        json!({"ok": true, "mode": mode.name(), "detail": detail()}),
                        None,
                    )
                }
                Err(e) => (fail_reply(e), None),
            },
            Some(Err(e)) => (fail_reply(e), None),
            None => match a.journal_mode() {
                Some(mode) => (
                    json!({"ok": true, "mode": mode.name(), "detail": detail()}),
                    None,
                ),
                None => (fail_reply("the array has no write journal"), None),
            },
        },
        Request::Set { values } => {
            // md's sysfs knobs (stripe_cache_size, group_thread_cnt, rmw_level, skip_copy...):
            // {"cmd":"set","values":{"stripe_cache_size":"1024"}}; no values lists them.
            for (k, v) in values {
                if let Err(e) = a.set_tunable(k, v) {
                    return (fail_reply(e), None);
                }
            }
            let t: serde_json::Map<String, Value> = a
                .tunables()
                .into_iter()
                .map(|(k, v)| (k.to_string(), Value::String(v)))
                .collect();
            (json!({"ok": true, "tunables": t}), None)
        }
        Request::Stop => {
            let (rtx, rrx) = mpsc::channel();
            let (wtx, wrx) = mpsc::channel();
            let sent = ctx
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(Event::Stop {
                    reply: rtx,
                    written: wrx,
                });
            if sent.is_err() {
                return (fail_reply("the server is already stopping"), None);
            }
            match rrx.recv() {
                Ok(Ok(d)) => (
                    json!({"ok": true, "pid": std::process::id(), "detail": d}),
                    Some(wtx),
                ),
                Ok(Err(e)) => (fail_reply(e), Some(wtx)),
                Err(_) => (fail_reply("the server is already stopping"), None),
            }
        }
    }
}

fn device_name(a: &Array, role: MemberIdx) -> String {
    a.slot(role).device_name().unwrap_or_default()
}

/// A role number or the path of a member device.
fn member_role(a: &Array, s: &str) -> Result<MemberIdx> {
    if let Ok(r) = s.parse::<usize>() {
        if r >= a.raid_disks() {
            bail!(
                "role {r} does not exist: the array has {} roles",
                a.raid_disks()
            );
        }
        return Ok(MemberIdx(r));
    }
    let want = canonical(Path::new(&s));
    for r in 0..a.raid_disks() {
        let role = MemberIdx(r);
        if a.slot_state(role) == SlotState::Missing {
            continue;
        }
        let name = device_name(a, role);
        if name == s || canonical(Path::new(&name)) == want {
            return Ok(role);
        }
    }
    // Not by its spelling: by what it is (a hard link or another node of a member).
    if let Some(Place::Member(role, state)) = a.locate_path(Path::new(s)) {
        if state != SlotState::Missing {
            return Ok(role);
        }
    }
    bail!("{s} is not a member of this array")
}

/// `mdadm --remove` of a device without a role: a faulty one (it lost its role to a spare or
/// a replacement) or a spare. `None` when the name is neither.
fn remove_roleless(a: &Array, s: &str) -> Option<Result<String>> {
    let want = canonical(Path::new(s));
    let same = |n: &String| n == s || canonical(Path::new(n)) == want;
    if let Some(n) = a.faulty_devices().into_iter().map(|(n, _)| n).find(same) {
        eprintln!("uraid: faulty {n} removed");
        return Some(a.remove_faulty(&n).map(|()| n).map_err(Into::into));
    }
    if let Some(n) = a.spares().into_iter().find(same) {
        eprintln!("uraid: spare {n} removed");
        return Some(a.remove_spare(&n).map(|()| n).map_err(Into::into));
    }
    None
}

/// `mdadm --remove`: take a faulty member out of its role.
fn engine_remove(ctx: &Ctx, role: MemberIdx) -> Result<()> {
    let name = device_name(&ctx.array, role);
    ctx.array.remove_member(role)?;
    eprintln!("uraid: member {role} ({name}) removed");
    Ok(())
}

/// `mdadm --add`: the device takes a missing or faulty role and is rebuilt in the
/// background, or waits as a spare.
fn engine_add(ctx: &Ctx, path: &Path) -> Result<Value> {
    // What the device is, before its lock (a member under another name collides with our
    // own lock on it): the engine checks again under its reconfig lock.
    let dev = crate::open::open_member(path)?;
    match ctx.array.locate_device(dev.as_ref()) {
        Some(place @ Place::Member(_, SlotState::Faulty)) => bail!(
            "{} is still in the array as {place}: remove it first",
            path.display()
        ),
        Some(place) => bail!(
            "{} is already in the array as {place}; nothing was changed",
            path.display()
        ),
        None => {}
    }
    // A member this server was started with (failed, removed, now re-added) is locked
    // already, by us.
    let ours = ctx
        .info
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .members
        .contains(&canonical(path));
    let lock = if ours {
        None
    } else {
        Some(try_lock(path)?.ok_or_else(|| anyhow::anyhow!("{}", in_use_message(path)))?)
    };
    let outcome = ctx.array.add_member(dev)?;
    if let Some(lock) = lock {
        ctx.extra_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lock);
    }
    Ok(match outcome {
        AddOutcome::Recovering(role) => {
            eprintln!(
                "uraid: {} added as member {role}; recovery started",
                path.display()
            );
            start_recovery(ctx);
            json!({"role": role.0, "state": "recovering"})
        }
        AddOutcome::Spare => {
            eprintln!("uraid: {} added as a spare", path.display());
            json!({"state": "spare"})
        }
    })
}

/// `mdadm --replace`: a spare (the one named, added first if it is not one yet, or any)
/// is rebuilt beside the member, which stays active until the replacement takes over.
fn engine_replace(ctx: &Ctx, role: MemberIdx, with: Option<&str>) -> Result<Value> {
    let a = &ctx.array;
    let spare = match with {
        None => None,
        Some(w) => {
            // What the device is, not its path: another active member named differently
            // must not become this one's replacement (the array would keep one copy).
            let dev = crate::open::open_member(Path::new(w))?;
            let find = || match a.locate_device(dev.as_ref()) {
                Some(Place::Spare(name)) => Ok(Some(name)),
                Some(place) => bail!(
                    "{w} is already in the array as {place}: a replacement must be a spare \
                     or a new device; nothing was changed"
                ),
                None => Ok(None),
            };
            match find()? {
                Some(s) => Some(s),
                None => {
                    if a.is_degraded() {
                        bail!(
                            "{w} is not a spare, and added now it would rebuild a missing \
                             role instead: add it first, then replace"
                        );
                    }
                    engine_add(ctx, Path::new(w))?;
                    Some(find()?.ok_or_else(|| anyhow::anyhow!("{w} did not become a spare"))?)
                }
            }
        }
    };
    let old = device_name(a, role);
    let new = a.replace(role, spare.as_deref())?;
    eprintln!("uraid: member {role} ({old}) is being replaced by {new}");
    start_recovery(ctx);
    Ok(json!({"role": role.0, "old": old, "replacement": new}))
}

/// md's resync after an unclean stop, on a background thread while the array is served.
fn start_resync(ctx: &Ctx) {
    start_sync(ctx, SyncKind::Resync);
}

/// Rebuilds recovering members on a background thread, recording progress for `detail`.
fn start_recovery(ctx: &Ctx) {
    start_sync(ctx, SyncKind::Recovery);
}

/// One background sync at a time, paced by md's sync_speed_min/max (it backs off while
/// clients are busy).
fn start_sync(ctx: &Ctx, kind: SyncKind) {
    if ctx.recovery_running.swap(true, Ordering::SeqCst) {
        return;
    }
    let array = ctx.array.clone();
    let progress = ctx.progress.clone();
    let running = ctx.recovery_running.clone();
    let spawned = std::thread::Builder::new()
        .name(kind.name().into())
        .spawn(move || {
            let mut kind = kind;
            if kind == SyncKind::Resync {
                eprintln!("uraid: the array was not stopped cleanly: resync started");
            }
            loop {
                let before = array.recovering_roles();
                let mut throttle = uraid_engine::Throttle::new(uraid_engine::SyncLimits::default());
                let r = array.run_sync(kind, |p| {
                    *progress.lock().unwrap_or_else(|e| e.into_inner()) = Some(*p);
                    throttle.pace(&array, p);
                });
                *progress.lock().unwrap_or_else(|e| e.into_inner()) = None;
                let failed = match r {
                    Ok(_) if kind == SyncKind::Recovery => {
                        eprintln!("uraid: recovery finished");
                        false
                    }
                    Ok(n) => {
                        eprintln!(
                            "uraid: {} finished, {n} mismatched sectors rewritten",
                            kind.name()
                        );
                        false
                    }
                    Err(e) => {
                        eprintln!("uraid: {} stopped: {e}", kind.name());
                        true
                    }
                };
                // A recovery goes on while roles are left to rebuild (a spare may have taken
                // over from a failed target, a replace may have been asked for meanwhile), but
                // not round and round on the same error.
                let left = array.recovering_roles();
                let replacing = !array.replacing_roles().is_empty();
                if kind != SyncKind::Recovery && (replacing || !left.is_empty()) && !failed {
                    kind = SyncKind::Recovery;
                    continue;
                }
                if kind != SyncKind::Recovery
                    || (left.is_empty() && !replacing)
                    || (failed && left == before)
                {
                    break;
                }
            }
            running.store(false, Ordering::SeqCst);
        });
    if spawned.is_err() {
        ctx.recovery_running.store(false, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------
// The client side

/// One request, one reply.
pub fn request(control: &Path, req: &Value) -> Result<Value> {
    let s = UnixStream::connect(control).with_context(|| {
        format!(
            "cannot reach the control socket {} (is `uraid serve` running?)",
            control.display()
        )
    })?;
    send_nosignal(&s, format!("{req}\n").as_bytes())
        .with_context(|| format!("sending to the control socket {}", control.display()))?;
    let mut line = String::new();
    BufReader::new(&s)
        .take(64 << 20)
        .read_line(&mut line)
        .context("reading the control reply")?;
    if line.is_empty() {
        bail!("the server closed the control connection without a reply");
    }
    let v: Value = serde_json::from_str(line.trim()).context("bad control reply")?;
    if v["ok"].as_bool() != Some(true) {
        bail!("{}", v["error"].as_str().unwrap_or("request failed"));
    }
    Ok(v)
}

/// Writes all of `buf` with MSG_NOSIGNAL: client commands run with SIGPIPE at its default (so
/// that `uraid detail | head` ends quietly), and a server that went away must be an error
/// here, not a silent death.
fn send_nosignal(s: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: send on a connected socket we own, from a live buffer of that length.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// How every command that talks to a running array names it: `--array` (any member path of
/// the array), `--control` (its control socket), or else a member path given to the command.
#[derive(Args, Clone, Default)]
pub struct ArrayArgs {
    /// Any member path of the running array.
    #[arg(long, value_name = "MEMBER")]
    pub array: Option<PathBuf>,
    /// Control socket of the running array (instead of --array).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

impl ArrayArgs {
    /// The control socket: `--control`, else the server of `--array` or of `paths`.
    fn control_socket(&self, paths: &[PathBuf]) -> Result<PathBuf> {
        let mut members: Vec<PathBuf> = self.array.iter().cloned().collect();
        members.extend(paths.iter().cloned());
        if self.control.is_none() && members.is_empty() {
            bail!("name the array: --array MEMBER (a member path), or --control PATH");
        }
        resolve(&self.control, &members)
    }
}

/// The member acted on, given as `--member M` or as the command's argument (not both).
fn one_member(flag: &Option<String>, positional: &Option<String>, what: &str) -> Result<String> {
    match (flag, positional) {
        (Some(m), None) | (None, Some(m)) => Ok(m.clone()),
        (Some(a), Some(b)) if a == b => Ok(a.clone()),
        (Some(a), Some(b)) => bail!("two members given ({a} and {b}): give {what} once"),
        (None, None) => bail!("give {what}: --member ROLE|PATH"),
    }
}

#[derive(Args)]
pub struct MemberCmdArgs {
    #[command(flatten)]
    pub target: ArrayArgs,
    /// Print the array's state afterwards as JSON.
    #[arg(long)]
    pub json: bool,
    /// The member: a role number or a member device path.
    #[arg(long, value_name = "ROLE|PATH")]
    pub member: Option<String>,
    /// The member, as --member.
    #[arg(value_name = "MEMBER")]
    pub member_arg: Option<String>,
}

#[derive(Args)]
pub struct AddArgs {
    #[command(flatten)]
    pub target: ArrayArgs,
    #[arg(long)]
    pub json: bool,
    /// Device or file to add.
    #[arg(long, value_name = "DEVICE")]
    pub member: Option<PathBuf>,
    /// Device or file to add, as --member.
    #[arg(value_name = "DEVICE")]
    pub device: Option<PathBuf>,
}

#[derive(Args)]
pub struct ReplaceArgs {
    #[command(flatten)]
    pub target: ArrayArgs,
    #[arg(long)]
    pub json: bool,
    /// Any member path of the running array, as --array.
    #[arg(value_name = "ARRAY_MEMBER")]
    pub array_arg: Option<PathBuf>,
    /// The member to replace: a role number or a member path.
    #[arg(long, value_name = "ROLE|PATH")]
    pub member: String,
    /// The spare to rebuild as its replacement (added as a spare first if it is not one);
    /// default: any spare.
    #[arg(long = "with", value_name = "DEVICE")]
    pub with: Option<PathBuf>,
}

#[derive(Args)]
pub struct StopArgs {
    #[command(flatten)]
    pub target: ArrayArgs,
    #[arg(long)]
    pub json: bool,
    /// Member paths of the running array, as --array.
    #[arg(value_name = "MEMBER")]
    pub devices: Vec<PathBuf>,
}

fn member_target(a: &MemberCmdArgs) -> Result<(PathBuf, Value)> {
    let m = one_member(&a.member, &a.member_arg, "the member")?;
    let is_role = m.parse::<usize>().is_ok();
    if is_role && a.target.array.is_none() && a.target.control.is_none() {
        bail!(
            "with a role number, name the array: --array MEMBER or --control PATH (or name \
             the member by its path)"
        );
    }
    let paths: Vec<PathBuf> = if is_role {
        Vec::new()
    } else {
        vec![PathBuf::from(&m)]
    };
    let control = a.target.control_socket(&paths)?;
    let member = if is_role {
        Value::String(m)
    } else {
        Value::String(canonical(Path::new(&m)).display().to_string())
    };
    Ok((control, member))
}

fn print_result(v: &Value, json_out: bool, what: &str) -> Result<()> {
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v["detail"])?);
    } else {
        eprintln!("uraid: {what}");
    }
    Ok(())
}

pub fn fail(a: MemberCmdArgs) -> Result<()> {
    let (control, member) = member_target(&a)?;
    let v = request(&control, &json!({"cmd": "fail", "member": member}))?;
    print_result(
        &v,
        a.json,
        &format!(
            "member {} ({}) marked faulty",
            v["role"],
            v["device"].as_str().unwrap_or("")
        ),
    )
}

#[derive(Args)]
pub struct JournalModeArgs {
    #[command(flatten)]
    pub target: ArrayArgs,
    #[arg(long)]
    pub json: bool,
    /// The mode to set: write-through or write-back (md's journal_mode).
    #[arg(long, value_name = "MODE")]
    pub mode: Option<String>,
    /// A mode (as --mode) or a member path of the array (as --array); without a mode, the
    /// current one is printed.
    #[arg(value_name = "MODE|MEMBER")]
    pub args: Vec<String>,
}

/// Sorts `journal-mode`'s arguments: a journal mode name, or a path naming the array.
fn journal_mode_args(a: &JournalModeArgs) -> Result<(Option<JournalMode>, Vec<PathBuf>)> {
    let mut mode = match &a.mode {
        Some(m) => Some(m.parse::<JournalMode>().map_err(|e| anyhow::anyhow!(e))?),
        None => None,
    };
    let mut paths = Vec::new();
    for arg in &a.args {
        match arg.parse::<JournalMode>() {
            Ok(m) if mode.is_none() => mode = Some(m),
            Ok(m) if mode == Some(m) => {}
            Ok(m) => bail!("two journal modes given ({} and {m})", mode.expect("set")),
            Err(_) if Path::new(arg).exists() => paths.push(PathBuf::from(arg)),
            Err(_) => bail!(
                "{arg:?} is neither a journal mode (write-through, write-back) nor a member \
                 path of the array"
            ),
        }
    }
    Ok((mode, paths))
}

/// `uraid journal-mode`: md's `journal_mode` of a served array with a write journal.
pub fn journal_mode(a: JournalModeArgs) -> Result<()> {
    let (mode, paths) = journal_mode_args(&a)?;
    let control = a.target.control_socket(&paths)?;
    let mut req = json!({"cmd": "journal-mode"});
    if let Some(m) = mode {
        req["mode"] = json!(m.name());
    }
    let v = request(&control, &req)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v["detail"])?);
    } else if mode.is_some() {
        eprintln!(
            "uraid: journal mode is now {}",
            v["mode"].as_str().unwrap_or("?")
        );
    } else {
        println!("{}", v["mode"].as_str().unwrap_or("?"));
    }
    Ok(())
}

pub fn remove(a: MemberCmdArgs) -> Result<()> {
    let (control, member) = member_target(&a)?;
    let v = request(&control, &json!({"cmd": "remove", "member": member}))?;
    let what = match v["device"].as_str() {
        Some(d) => format!("{d} removed"),
        None => format!("member {} removed", v["role"]),
    };
    print_result(&v, a.json, &what)
}

pub fn add(a: AddArgs) -> Result<()> {
    let device = match (&a.member, &a.device) {
        (Some(m), None) | (None, Some(m)) => m.clone(),
        (Some(x), Some(y)) if x == y => x.clone(),
        (Some(x), Some(y)) => bail!(
            "two devices given ({} and {}): give the device to add once",
            x.display(),
            y.display()
        ),
        (None, None) => bail!("give the device to add: --member DEVICE"),
    };
    let control = a.target.control_socket(&[])?;
    let dev = canonical(&device);
    if !dev.exists() {
        bail!("{}: no such file or device", device.display());
    }
    let v = request(
        &control,
        &json!({"cmd": "add", "device": dev.display().to_string()}),
    )?;
    let how = match (v["added"]["state"].as_str(), v["added"]["role"].as_u64()) {
        (Some("recovering"), Some(role)) => format!("as member {role}, rebuilding"),
        (Some("spare"), _) => "as a spare".to_string(),
        _ => v["added"].to_string(),
    };
    print_result(&v, a.json, &format!("{} added {how}", dev.display()))
}

/// `uraid replace` (mdadm --replace [--with]).
pub fn replace(a: ReplaceArgs) -> Result<()> {
    let is_role = a.member.parse::<usize>().is_ok();
    let mut paths: Vec<PathBuf> = a.array_arg.iter().cloned().collect();
    if !is_role {
        paths.push(PathBuf::from(&a.member));
    }
    let control = a.target.control_socket(&paths)?;
    let member = if is_role {
        Value::String(a.member.clone())
    } else {
        Value::String(canonical(Path::new(&a.member)).display().to_string())
    };
    let mut req = json!({"cmd": "replace", "member": member});
    if let Some(w) = &a.with {
        let w = canonical(w);
        if !w.exists() {
            bail!("{}: no such file or device", w.display());
        }
        req["with"] = Value::String(w.display().to_string());
    }
    let v = request(&control, &req)?;
    print_result(
        &v,
        a.json,
        &format!(
            "member {} ({}) is being replaced by {}",
            v["replace"]["role"],
            v["replace"]["old"].as_str().unwrap_or(""),
            v["replace"]["replacement"].as_str().unwrap_or("")
        ),
    )
}

/// `uraid set`: show or change a served raid4/5/6 array's knobs, by md's sysfs names.
#[derive(clap::Args)]
pub struct SetArgs {
    #[command(flatten)]
    pub target: ArrayArgs,
    /// Old spelling of --array for this command.
    #[arg(long = "member", value_name = "MEMBER", hide = true)]
    pub devices: Vec<PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// NAME=VALUE pairs: stripe_cache_size, group_thread_cnt, rmw_level, skip_copy,
    /// batching. None: print the current values.
    pub values: Vec<String>,
}

pub fn set(a: SetArgs) -> Result<()> {
    let control = a.target.control_socket(&a.devices)?;
    let mut vals = serde_json::Map::new();
    for kv in &a.values {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("{kv:?}: expected NAME=VALUE (e.g. stripe_cache_size=1024)");
        };
        vals.insert(k.trim().to_string(), Value::String(v.trim().to_string()));
    }
    let v = request(&control, &json!({"cmd": "set", "values": vals}))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if let Some(t) = v["tunables"].as_object() {
        for (k, val) in t {
            println!("{k} = {}", val.as_str().unwrap_or_default());
        }
    }
    Ok(())
}

pub fn stop(a: StopArgs) -> Result<()> {
    let control = a.target.control_socket(&a.devices)?;
    let v = request(&control, &json!({"cmd": "stop"}))?;
    // The reply comes once the array is clean; wait for the process to let go of the
    // members too, so the next command can open them.
    if let Some(pid) = v["pid"].as_u64() {
        for _ in 0..200 {
            if !pid_alive(pid as u32) {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    print_result(
        &v,
        a.json,
        &format!(
            "array {} stopped, superblocks marked {}",
            v["detail"]["uuid"].as_str().unwrap_or("?"),
            v["detail"]["state"].as_str().unwrap_or("?")
        ),
    )
}

/// `uraid detail`: through the control socket when a server holds the members, else by
/// assembling them here (under the member locks).
pub fn detail(mut a: crate::commands::DetailArgs) -> Result<()> {
    a.devices.extend(a.target.array.take());
    let found = match &a.target.control {
        Some(c) => Some(Found {
            pid: 0,
            control: c.clone(),
        }),
        None => find_server(&a.devices),
    };
    if a.devices.is_empty() && found.is_none() {
        bail!("name the array: its member paths, --array MEMBER, or --control PATH");
    }
    if let Some(found) = found {
        let v = request(&found.control, &Request::Detail.to_json())?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&v["detail"])?);
        } else {
            print!("{}", v["human"].as_str().unwrap_or(""));
            let pid = v["detail"]["serve"]["pid"]
                .as_u64()
                .unwrap_or(found.pid.into());
            println!(
                "\n  Served by pid {pid} (control {})",
                found.control.display()
            );
        }
        return Ok(());
    }
    let _locks = guard(&a.devices)?;
    crate::commands::detail(a)
}

#[derive(Args)]
pub struct WaitArgs {
    #[command(flatten)]
    pub target: ArrayArgs,
    /// Member paths of the served array, as --array.
    #[arg(value_name = "MEMBER")]
    pub devices: Vec<PathBuf>,
}

/// How long `uraid wait` looks for the server of an array that was just started in the
/// background before it says there is none.
const SERVER_START_WAIT: Duration = Duration::from_secs(30);

/// Whether a served array has a resync, recovery or replace running or about to run.
fn sync_busy(d: &Value) -> bool {
    let rebuilding = d["members"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["state"] == "rebuilding" || !m["replacement"].is_null());
    let resync_owed = d["resync_pending"] == true && d["degraded"] == false;
    !d["sync"].is_null() || rebuilding || resync_owed
}

/// `uraid wait` (mdadm --wait): returns once the array is served (it may just have been
/// started in the background) and no resync, recovery or replace is running on it.
pub fn wait(a: WaitArgs) -> Result<()> {
    let mut paths: Vec<PathBuf> = a.target.array.iter().cloned().collect();
    paths.extend(a.devices.iter().cloned());
    if a.target.control.is_none() && paths.is_empty() {
        bail!("name the array: --array MEMBER (a member path), or --control PATH");
    }
    let started = std::time::Instant::now();
    let control = loop {
        if let Some(c) = &a.target.control {
            if UnixStream::connect(c).is_ok() {
                break c.clone();
            }
        } else if let Some(f) = find_server(&paths) {
            break f.control;
        }
        if started.elapsed() > SERVER_START_WAIT {
            // Says which socket or members, and what to do.
            a.target.control_socket(&paths)?;
            bail!("the array is not served: start it with uraid serve");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    loop {
        let v = request(&control, &json!({"cmd": "detail"}))?;
        if !sync_busy(&v["detail"]) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
