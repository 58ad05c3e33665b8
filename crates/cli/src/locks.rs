//! Member locks and finding a running server, for every command that opens members.
//!
//! - `uraid serve` takes an exclusive `flock` on every member, so no second uraid process
//!   opens them while the array runs; other commands that would assemble the array refuse
//!   and point to the control socket ([`guard`]).
//! - Each server writes `<run dir>/<uuid>.json` (its pid, control path and canonical
//!   member paths) beside its socket `<run dir>/<uuid>.sock` (a symlink when `--control`
//!   put it elsewhere); [`find_server`] reads them.
//!
//! Neither the control server nor its client: both use it, and it uses neither.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

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

/// Where servers keep what outlives them (what each array knows was never written, saved
/// at a clean stop): `$URAID_STATE_DIR`, else `/var/lib/uraid` for root, else
/// `$XDG_STATE_HOME/uraid`, `~/.local/state/uraid` or `/tmp/uraid-state-<uid>`.
pub fn state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("URAID_STATE_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from("/var/lib/uraid");
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("uraid");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/state/uraid"),
        None => PathBuf::from(format!("/tmp/uraid-state-{uid}")),
    }
}

/// Whether a member is named by an NBD URI (`nbd://...`, `nbd+unix://...`): a remote
/// member, with no local file to lock or canonicalise.
pub fn is_remote(p: &Path) -> bool {
    p.to_str().is_some_and(uraid_engine::is_nbd_uri)
}

/// Exclusive advisory locks on member files, held while an array is open.
pub struct MemberLocks(#[allow(dead_code)] Vec<File>);

impl MemberLocks {
    pub fn push(&mut self, f: File) {
        self.0.push(f);
    }
}

/// Locks one member; `Ok(None)` when another process holds it.
pub fn try_lock(path: &Path) -> Result<Option<File>> {
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
    for p in paths.iter().filter(|p| !is_remote(p)) {
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

pub fn in_use_message(p: &Path) -> String {
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

/// A running server, as its index file describes it.
#[derive(Clone, Debug)]
pub struct Found {
    pub pid: u32,
    pub control: PathBuf,
}

pub fn canonical(p: &Path) -> PathBuf {
    if is_remote(p) {
        return p.to_path_buf();
    }
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

pub fn pid_alive(pid: u32) -> bool {
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
