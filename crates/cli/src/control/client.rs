//! The control socket's client: one request, one reply, and the subcommands that talk to
//! a running array through it (fail, remove, add, replace, journal-mode, set, stop, wait).
//! `detail` is a command of its own ([`crate::commands::detail_any`]): through the socket
//! when a server holds the members, else by assembling them.

use crate::locks;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use uraid_engine::JournalMode;

/// The control socket to talk to: `--control`, else the server holding these members.
fn resolve(control: &Option<PathBuf>, members: &[PathBuf]) -> Result<PathBuf> {
    if let Some(c) = control {
        return Ok(c.clone());
    }
    if members.is_empty() {
        bail!("give --control PATH or a member path of the running array");
    }
    match locks::find_server(members) {
        Some(f) => Ok(f.control),
        None => bail!(
            "no running uraid serve holds {} (looked in {}): start it with uraid serve, or \
             give --control PATH",
            members
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            locks::run_dir().display()
        ),
    }
}

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
    /// Flag the device write-mostly (md's devflags, mdadm -W): raid1 reads go to the
    /// other members whenever one is in sync. A re-added member keeps its own flags too.
    #[arg(short = 'W', long)]
    pub write_mostly: bool,
    /// Flag the device failfast (md's devflags, mdadm --failfast): raid1/raid10 fail it on
    /// its first IO error instead of repairing, unless it holds the last copy.
    #[arg(long)]
    pub failfast: bool,
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
    /// Keep the ublk device for the next server (a restart or an upgrade in place): the
    /// array is stopped clean, /dev/ublkbN stays, and its requests wait until `uraid serve
    /// --ublk --ublk-id N --recover` takes it over.
    #[arg(long)]
    pub keep_ublk: bool,
    /// Member paths of the running array, as --array.
    #[arg(value_name = "MEMBER")]
    pub devices: Vec<PathBuf>,
}

fn member_target(a: &MemberCmdArgs) -> Result<(PathBuf, Value)> {
    let m = one_member(&a.member, &a.member_arg, "the member")?;
    let (control, member) = member_and_control(&a.target, &m, &[])?;
    Ok((control, Value::String(member)))
}

/// A member named by its role number or its path, and the control socket to ask about it:
/// a path names the array itself; a role number needs it named (`--array`, `--control`,
/// or the member paths in `also`). The member as the server takes it (a path canonical).
fn member_and_control(target: &ArrayArgs, m: &str, also: &[PathBuf]) -> Result<(PathBuf, String)> {
    let is_role = m.parse::<usize>().is_ok();
    if is_role && target.array.is_none() && target.control.is_none() && also.is_empty() {
        bail!(
            "with a role number, name the array: --array MEMBER or --control PATH (or name \
             the member by its path)"
        );
    }
    let mut paths = also.to_vec();
    if !is_role {
        paths.push(PathBuf::from(m));
    }
    let control = target.control_socket(&paths)?;
    let member = if is_role {
        m.to_string()
    } else {
        locks::canonical(Path::new(m)).display().to_string()
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
            Err(_) if Path::new(arg).exists() || locks::is_remote(Path::new(arg)) => {
                paths.push(PathBuf::from(arg))
            }
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
    let dev = locks::canonical(&device);
    if !dev.exists() && !locks::is_remote(&dev) {
        bail!("{}: no such file or device", device.display());
    }
    let mut req = json!({"cmd": "add", "device": dev.display().to_string()});
    if a.write_mostly {
        req["write_mostly"] = json!(true);
    }
    if a.failfast {
        req["failfast"] = json!(true);
    }
    let v = request(&control, &req)?;
    let how = match (v["added"]["state"].as_str(), v["added"]["role"].as_u64()) {
        (Some("recovering"), Some(role)) => format!("as member {role}, rebuilding"),
        (Some("spare"), _) => "as a spare".to_string(),
        _ => v["added"].to_string(),
    };
    print_result(&v, a.json, &format!("{} added {how}", dev.display()))
}

/// `uraid replace` (mdadm --replace [--with]).
pub fn replace(a: ReplaceArgs) -> Result<()> {
    let also: Vec<PathBuf> = a.array_arg.iter().cloned().collect();
    let (control, member) = member_and_control(&a.target, &a.member, &also)?;
    let mut req = json!({"cmd": "replace", "member": member});
    if let Some(w) = &a.with {
        let w = locks::canonical(w);
        if !w.exists() && !locks::is_remote(&w) {
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

/// `uraid set`: show or change a served array's knobs, by md's sysfs names, or a member's
/// flags (md's dev-N/state).
#[derive(clap::Args)]
pub struct SetArgs {
    #[command(flatten)]
    pub target: ArrayArgs,
    /// With writemostly= or failfast=: the member to change, a member path or (with
    /// --array or --control) a role number. Otherwise a member path naming the array (the
    /// old spelling of --array).
    #[arg(long = "member", value_name = "MEMBER")]
    pub devices: Vec<PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// NAME=VALUE pairs: the array's stripe_cache_size, group_thread_cnt, rmw_level,
    /// skip_copy, batching, join_wait_us, consistency_policy (ppl or resync, raid5), and
    /// sync_threads (raid1/4/5/6/10: threads a resync or rebuild runs on); with --member,
    /// the member's writemostly=1|0 and failfast=1|0.
    /// None: print the current values.
    pub values: Vec<String>,
}

/// The `set` names that are a member's flags, not the array's knobs.
const MEMBER_FLAG_NAMES: [&str; 2] = ["writemostly", "failfast"];

pub fn set(a: SetArgs) -> Result<()> {
    let mut vals = serde_json::Map::new();
    for kv in &a.values {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("{kv:?}: expected NAME=VALUE (e.g. stripe_cache_size=1024)");
        };
        vals.insert(k.trim().to_string(), Value::String(v.trim().to_string()));
    }
    if vals.keys().any(|k| MEMBER_FLAG_NAMES.contains(&k.as_str())) {
        return set_member(&a, vals);
    }
    let control = a.target.control_socket(&a.devices)?;
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

/// `uraid set --member M writemostly=1 failfast=0` (md's dev-N/state).
fn set_member(a: &SetArgs, vals: serde_json::Map<String, Value>) -> Result<()> {
    if let Some(k) = vals
        .keys()
        .find(|k| !MEMBER_FLAG_NAMES.contains(&k.as_str()))
    {
        bail!(
            "{k} is the array's, {} are a member's: set them in two commands",
            MEMBER_FLAG_NAMES.join(" and ")
        );
    }
    let [m] = &a.devices[..] else {
        bail!("writemostly and failfast are a member's flags: name one member with --member M");
    };
    let (control, member) = member_and_control(&a.target, &m.display().to_string(), &[])?;
    let v = request(
        &control,
        &json!({"cmd": "set", "member": member, "values": vals}),
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let f = &v["member"];
    println!(
        "member {} ({}): writemostly={} failfast={}",
        f["role"],
        f["device"].as_str().unwrap_or(""),
        u8::from(f["writemostly"] == true),
        u8::from(f["failfast"] == true)
    );
    Ok(())
}

pub fn stop(a: StopArgs) -> Result<()> {
    let control = a.target.control_socket(&a.devices)?;
    let req = crate::control::request::Request::Stop {
        keep_ublk: a.keep_ublk,
    };
    let v = request(&control, &req.to_json())?;
    // The reply comes once the array is clean; wait for the process to let go of the
    // members too, so the next command can open them (and, for a kept ublk device, so
    // that `serve --recover` finds it served by nobody).
    if let Some(pid) = v["pid"].as_u64() {
        for _ in 0..if a.keep_ublk { 1200 } else { 200 } {
            if !locks::pid_alive(pid as u32) {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    let kept = match v["kept_ublk"].as_str() {
        Some(dev) => format!(
            "; {dev} kept, its requests waiting for `uraid serve --ublk --ublk-id {} \
             --recover`",
            dev.trim_start_matches("/dev/ublkb")
        ),
        None => String::new(),
    };
    print_result(
        &v,
        a.json,
        &format!(
            "array {} stopped, superblocks marked {}{kept}",
            v["detail"]["uuid"].as_str().unwrap_or("?"),
            v["detail"]["state"].as_str().unwrap_or("?")
        ),
    )
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
        } else if let Some(f) = locks::find_server(&paths) {
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
