//! The control server: the socket of a running array and its requests.
//!
//! One JSON object per line each way: `{"cmd":"detail"}`, `{"cmd":"fail","member":"2"}`
//! (a role or a member path), `{"cmd":"remove","member":...}`,
//! `{"cmd":"add","device":"/abs/path"}` (optionally `"write_mostly":true`,
//! `"failfast":true`), `{"cmd":"replace","member":...,"with":"/abs/path"}`
//! (with is optional), `{"cmd":"journal-mode","mode":...}`, `{"cmd":"set","values":{...}}`
//! (with `"member":...`, that member's flags: `{"writemostly":"1","failfast":"0"}`),
//! `{"cmd":"stop"}`, `{"cmd":"events","since":N}` (the array's events numbered from N on;
//! see [`EventLog`]). Replies are `{"ok":true,...}` or `{"ok":false,"error":"..."}`; a
//! `detail` reply carries `event_seq`, the number the next event will get. A line is
//! parsed ([`request::parse`], fuzzed) before anything touches the array.
//!
//! md's background work (safe mode, the bitmap daemon, reclaim, spares, resync and
//! recovery) is the engine's [`uraid_engine::Daemons`]: the server starts it with the
//! socket and forwards add and replace to it.

use super::request::{self, fail_reply, Request};
use crate::locks;
use anyhow::{bail, Context, Result};
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
use uraid_engine::{
    AddOutcome, Array, ArrayCell, DaemonNote, DaemonOptions, GrowReport, Member, MemberFlags,
    SlotState,
};
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

/// Why the main thread wakes up.
pub enum Event {
    /// SIGTERM or SIGINT.
    Signal(i32),
    /// `uraid stop`: the reply goes back once the array is clean; `written` says the
    /// requester has it, so the process does not exit under it.
    Stop {
        /// `uraid stop --keep-ublk`: the ublk device is handed over, not deleted.
        keep_ublk: bool,
        reply: mpsc::Sender<std::result::Result<serde_json::Value, String>>,
        written: mpsc::Receiver<()>,
    },
}

/// What a running server tells `uraid detail`.
#[derive(Clone, Debug, Default)]
pub struct ServeInfo {
    pub pid: u32,
    pub nbd_uri: Option<String>,
    pub ublk_dev: Option<String>,
    pub control: PathBuf,
    pub members: Vec<PathBuf>,
    /// md's sync_speed_min/max for the daemons' resync and recovery.
    pub sync_limits: uraid_engine::SyncLimits,
    /// `--nbd-readd`: how often lost remote members are tried again.
    pub readd_interval: Option<std::time::Duration>,
}

impl ServeInfo {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "pid": self.pid,
            "nbd": self.nbd_uri,
            "ublk": self.ublk_dev,
            "control": self.control,
            "members": self.members,
            "sync_speed_min": self.sync_limits.min_kib_s,
            "sync_speed_max": self.sync_limits.max_kib_s,
            "nbd_readd_secs": self.readd_interval.map(|d| d.as_secs_f64()),
            // Forced on every member (after a fallback, no io_uring here: sync), else
            // "auto": each member's own, in `detail`.
            "io_engine": uraid_engine::io::io_engine_forced().map_or("auto", |e| e.name()),
        })
    }
}

/// The control socket of a running array.
pub struct ControlServer {
    ctx: Arc<Ctx>,
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
    /// The array served, replaced when a grow changes its shape; md's daemons for it
    /// (the engine's) run in the cell, and requests forward to them.
    cell: Arc<ArrayCell>,
    info: Mutex<ServeInfo>,
    events: Mutex<mpsc::Sender<Event>>,
    active: AtomicUsize,
    /// Locks on devices added while serving.
    extra_locks: Mutex<Vec<File>>,
    events_log: Mutex<EventLog>,
}

impl ControlServer {
    pub fn start(
        uuid: &str,
        path: PathBuf,
        cell: Arc<ArrayCell>,
        info: ServeInfo,
        events: mpsc::Sender<Event>,
    ) -> Result<ControlServer> {
        let dir = locks::run_dir();
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
        if locks::canonical(&path) != locks::canonical(&default_path) {
            let _ = std::fs::remove_file(&default_path);
            match std::os::unix::fs::symlink(locks::canonical(&path), &default_path) {
                Ok(()) => link = Some(default_path),
                Err(e) => tracing::warn!("cannot link {}: {e}", default_path.display()),
            }
        }
        let index = dir.join(format!("{uuid}.json"));
        let tmp = dir.join(format!(".{uuid}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&info.to_json())?)?;
        std::fs::rename(&tmp, &index)?;

        let stop = Arc::new(AtomicBool::new(false));
        // Subscribed before the daemons start, so that the log has what they do at once
        // (a spare taking a missing role).
        let log_events = cell.get().subscribe();
        let notify: uraid_engine::DaemonNotify = Arc::new(|n: &DaemonNote| eprintln!("uraid: {n}"));
        cell.start_daemons(DaemonOptions {
            notify: Some(notify),
            sync_limits: info.sync_limits,
            readd_interval: info.readd_interval,
            ..DaemonOptions::default()
        })?;
        let ctx = Arc::new(Ctx {
            cell,
            info: Mutex::new(info),
            events: Mutex::new(events),
            active: AtomicUsize::new(0),
            extra_locks: Mutex::new(Vec::new()),
            events_log: Mutex::new(EventLog::default()),
        });
        record_events(&ctx, log_events)?;
        let stop2 = stop.clone();
        let wake = Arc::new(WakePipe::new().context("creating the control wake pipe")?);
        let wake2 = wake.clone();
        let ctx2 = ctx.clone();
        listener.set_nonblocking(true)?;
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, ctx2, stop2, &wake2))?;
        Ok(ControlServer {
            ctx,
            path,
            index,
            link,
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// The running sync pass, as the daemons see it, for readers on other threads
    /// (`--metrics`).
    pub fn sync_source(&self) -> crate::metrics::SyncSource {
        let ctx = self.ctx.clone();
        Box::new(move || ctx.cell.with_daemons(|d| d.sync_progress()).flatten())
    }

    /// Stops the daemons and accepting, and removes the socket, its link and the index
    /// file. Never depends on the socket's path still existing.
    pub fn shutdown(mut self) {
        self.ctx.cell.stop_daemons();
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

/// Keeps the array's events numbered for `uraid monitor` (see [`EventLog`]).
fn record_events(ctx: &Arc<Ctx>, events: mpsc::Receiver<uraid_engine::Event>) -> Result<()> {
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .name("control-events".into())
        .spawn(move || {
            for e in events {
                ctx.events_log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .record(ctx.cell.get().level(), &e);
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
    let a = &ctx.cell.current();
    let detail = || {
        let info = ctx.info.lock().unwrap_or_else(|e| e.into_inner());
        let mut d = crate::report::detail_json(a);
        d["serve"] = info.to_json();
        if let Some(p) = ctx.cell.with_daemons(|d| d.sync_progress()).flatten() {
            let mark = ctx.cell.with_daemons(|d| d.sync_mark()).flatten();
            d["sync"] = crate::report::sync_json(&p, mark, a.geometry().dev_sectors);
        } else if let Some((done, total)) = a.reshape_progress() {
            d["sync"] = crate::report::reshape_json(done, total, a.geometry().dev_sectors);
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
            let sync = ctx.cell.with_daemons(|d| d.sync_progress()).flatten();
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
        Request::Add {
            device,
            write_mostly,
            failfast,
        } => match engine_add(
            ctx,
            Path::new(device),
            MemberFlags {
                write_mostly: *write_mostly,
                failfast: *failfast,
            },
        ) {
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
        Request::Set {
            member: Some(member),
            values,
        } => match member_role(a, member).and_then(|role| set_member_flags(a, role, values)) {
            Ok(v) => (json!({"ok": true, "member": v, "detail": detail()}), None),
            Err(e) => (fail_reply(format!("{e:#}")), None),
        },
        Request::Set {
            member: None,
            values,
        } => {
            if let Some((k, _)) = values
                .iter()
                .find(|(k, _)| MEMBER_FLAGS.contains(&k.as_str()))
            {
                return (
                    fail_reply(format!(
                        "{k} is a member's flag: name the member (uraid set --member M {k}=1)"
                    )),
                    None,
                );
            }
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
        Request::Grow { values, add } => {
            match engine_grow(ctx, values, add) {
                Ok(r) => {
                    eprintln!("uraid: grow: {}", r.summary);
                    // The detail of the array now served (the grown one).
                    let a = &ctx.cell.current();
                    let detail = || {
                        let mut d = crate::report::detail_json(a);
                        d["serve"] = ctx.info.lock().unwrap_or_else(|e| e.into_inner()).to_json();
                        d
                    };
                    (
                        json!({"ok": true, "grow": {"summary": r.summary, "events": r.events,
                            "restripe": r.restripe}, "detail": detail()}),
                        None,
                    )
                }
                Err(e) => (fail_reply(format!("{e:#}")), None),
            }
        }
        &Request::Stop { keep_ublk } => {
            let ublk = ctx
                .info
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .ublk_dev
                .clone();
            if keep_ublk && ublk.is_none() {
                return (
                    fail_reply(
                        "--keep-ublk: this server has no ublk export to keep (it serves NBD \
                         only); stop it without --keep-ublk. Nothing was stopped",
                    ),
                    None,
                );
            }
            let (rtx, rrx) = mpsc::channel();
            let (wtx, wrx) = mpsc::channel();
            let sent = ctx
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(Event::Stop {
                    keep_ublk,
                    reply: rtx,
                    written: wrx,
                });
            if sent.is_err() {
                return (fail_reply("the server is already stopping"), None);
            }
            match rrx.recv() {
                Ok(Ok(d)) => (
                    json!({"ok": true, "pid": std::process::id(), "detail": d,
                        "kept_ublk": if keep_ublk { ublk } else { None }}),
                    Some(wtx),
                ),
                Ok(Err(e)) => (fail_reply(e), Some(wtx)),
                Err(_) => (fail_reply("the server is already stopping"), None),
            }
        }
    }
}

/// The member flags `set --member` takes, by md's sysfs words (dev-N/state).
const MEMBER_FLAGS: [&str; 2] = ["writemostly", "failfast"];

/// `set --member M writemostly=1 failfast=0`: md's `echo writemostly > dev-N/state`.
fn set_member_flags(a: &Array, role: MemberIdx, values: &[(String, String)]) -> Result<Value> {
    let mut f = a.slot(role).member_flags();
    for (k, v) in values {
        let on = match v.as_str() {
            "1" => true,
            "0" => false,
            _ => bail!("{k}={v}: give 1 or 0"),
        };
        match k.as_str() {
            "writemostly" => f.write_mostly = on,
            "failfast" => f.failfast = on,
            _ => bail!(
                "{k} is not a member flag (a member takes {}); array knobs are set without --member",
                MEMBER_FLAGS.join(", ")
            ),
        }
    }
    a.set_member_flags(role, f)?;
    let name = device_name(a, role);
    eprintln!(
        "uraid: member {role} ({name}) flags: writemostly={} failfast={}",
        u8::from(f.write_mostly),
        u8::from(f.failfast)
    );
    Ok(
        json!({"role": role.0, "device": name, "writemostly": f.write_mostly, "failfast": f.failfast}),
    )
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
    let want = locks::canonical(Path::new(&s));
    for r in 0..a.raid_disks() {
        let role = MemberIdx(r);
        if a.slot_state(role) == SlotState::Missing {
            continue;
        }
        let name = device_name(a, role);
        if name == s || locks::canonical(Path::new(&name)) == want {
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
    let want = locks::canonical(Path::new(s));
    let same = |n: &String| n == s || locks::canonical(Path::new(n)) == want;
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
    let a = ctx.cell.current();
    let name = device_name(&a, role);
    a.remove_member(role)?;
    eprintln!("uraid: member {role} ({name}) removed");
    Ok(())
}

/// A device to add, opened and locked: refused when it is in the array already.
fn open_for_add(ctx: &Ctx, path: &Path) -> Result<(Arc<dyn Member>, Option<File>)> {
    // What the device is, before its lock (a member under another name collides with our
    // own lock on it): the engine checks again under its reconfig lock.
    let dev = crate::open::open_member(path)?;
    let a = ctx.cell.current();
    match a.locate_device(dev.as_ref()) {
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
        .contains(&locks::canonical(path));
    // A remote member (an NBD URI) has no file to lock: its server is its guard.
    let lock = if ours || locks::is_remote(path) {
        None
    } else {
        Some(
            locks::try_lock(path)?
                .ok_or_else(|| anyhow::anyhow!("{}", locks::in_use_message(path)))?,
        )
    };
    Ok((dev, lock))
}

/// `mdadm --grow` on the served array, with the devices of `--add` (the engine adds them
/// where mdadm would: first, or, for a raid0, after its takeover to raid4).
fn engine_grow(ctx: &Ctx, values: &[(String, String)], add: &[String]) -> Result<GrowReport> {
    let r = crate::grow_request::request_of(values, ctx.cell.current().level())?;
    let opened = add
        .iter()
        .map(|p| open_for_add(ctx, Path::new(p)))
        .collect::<Result<Vec<_>>>()?;
    let devs: Vec<Arc<dyn Member>> = opened.iter().map(|(d, _)| d.clone()).collect();
    let grown = ctx.cell.grow_adding(&r, devs);
    // The locks of the devices that joined the array stay with the server.
    let a = ctx.cell.current();
    for ((dev, lock), path) in opened.into_iter().zip(add) {
        if a.locate_device(dev.as_ref()).is_some() {
            eprintln!("uraid: {path} added");
            if let Some(lock) = lock {
                ctx.extra_locks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(lock);
            }
        }
    }
    Ok(grown?)
}

/// `mdadm --add`: the device takes a missing or faulty role and is rebuilt in the
/// background, or waits as a spare.
fn engine_add(ctx: &Ctx, path: &Path, flags: MemberFlags) -> Result<Value> {
    let (dev, lock) = open_for_add(ctx, path)?;
    let a = ctx.cell.current();
    let outcome = a.add_member_with(dev, flags)?;
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
            ctx.cell.with_daemons(|d| d.start_recovery());
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
    let a = &ctx.cell.current();
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
                    engine_add(ctx, Path::new(w), MemberFlags::default())?;
                    Some(find()?.ok_or_else(|| anyhow::anyhow!("{w} did not become a spare"))?)
                }
            }
        }
    };
    let old = device_name(a, role);
    let new = a.replace(role, spare.as_deref())?;
    eprintln!("uraid: member {role} ({old}) is being replaced by {new}");
    ctx.cell.with_daemons(|d| d.start_recovery());
    Ok(json!({"role": role.0, "old": old, "replacement": new}))
}
