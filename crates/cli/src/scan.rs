//! Finding arrays without being told their members, as `mdadm --scan` does: the devices
//! of mdadm.conf's DEVICE lines (globs, /proc/partitions) are read for superblocks (every
//! version uraid reads: 1.0, 1.1, 1.2), grouped by array UUID, and matched to ARRAY lines
//! and the homehost rule. Used by `examine --scan`, `assemble --scan`, `serve --scan` and
//! `incremental`.
//!
//! Devices are opened read-only for the look: a scan never writes, and a device this user
//! cannot read is passed over in silence (as mdadm's scan of /proc/partitions does).
//!
//! NBD URIs (DEVICE lines, ARRAY lines' `devices=`) are remote members: each is connected
//! to (with the global `--nbd-*` options: TLS CA, timeout) and its superblock read over
//! NBD. One that does not answer is said on stderr, by its URI, and passed over, as a
//! device that is not there is: the array may start without it (degraded).

use crate::mdadm_conf::{self, ArrayLine, Config, DeviceSpec, HostRule};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use uraid_core::superblock::{uuid_string, Superblock};

/// Where mdadm keeps its configuration (Debian's place; mdadm also reads /etc/mdadm.conf).
pub const DEFAULT_CONFIG: &str = "/etc/mdadm/mdadm.conf";
const FALLBACK_CONFIG: &str = "/etc/mdadm.conf";

/// The options every scanning command takes.
#[derive(Args, Clone, Debug, Default)]
pub struct ScanArgs {
    /// mdadm.conf to read (default /etc/mdadm/mdadm.conf, else /etc/mdadm.conf; none is an
    /// empty one: scan /proc/partitions).
    #[arg(short = 'c', long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The host whose arrays start without being listed (mdadm's --homehost; `<ignore>`
    /// takes every host's). Default: the config's HOMEHOST, else this machine's name.
    #[arg(long, value_name = "NAME")]
    pub homehost: Option<String>,
}

impl ScanArgs {
    /// The configuration: the file given (which must exist), else the default if there.
    pub fn config(&self) -> Result<Config> {
        let (path, must) = match &self.config {
            Some(p) => (p.clone(), true),
            None if Path::new(DEFAULT_CONFIG).exists() => (PathBuf::from(DEFAULT_CONFIG), true),
            None => (PathBuf::from(FALLBACK_CONFIG), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !must && e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let c = mdadm_conf::parse(&path.display().to_string(), &text)?;
        for w in &c.warnings {
            eprintln!("uraid: {w}");
        }
        Ok(c)
    }

    /// Whose arrays are this host's.
    pub fn host_rule(&self, c: &Config) -> HostRule {
        c.homehost(
            self.homehost.as_deref(),
            crate::report::hostname().as_deref(),
        )
    }
}

/// One device with a valid md superblock.
#[derive(Clone, Debug)]
pub struct Probed {
    pub path: PathBuf,
    pub sb: Superblock,
    /// For a 0.90 member (its superblock read into the v1 model), the record's preferred
    /// minor (`md_minor`, /dev/mdN); None for 1.x.
    pub md_minor090: Option<u32>,
}

impl Probed {
    /// The metadata version as mdadm names it ("0.90", "1.0", "1.1", "1.2").
    pub fn metadata(&self) -> &'static str {
        match self.md_minor090 {
            Some(_) => "0.90",
            None => self.sb.version().name(),
        }
    }
}

/// The devices found of one array.
#[derive(Clone, Debug)]
pub struct Found {
    pub uuid: [u8; 16],
    /// In the order they were found.
    pub members: Vec<Probed>,
}

impl Found {
    /// The freshest superblock (highest events), which assembly takes as the template.
    pub fn template(&self) -> &Superblock {
        &self.freshest().sb
    }

    fn freshest(&self) -> &Probed {
        self.members
            .iter()
            .max_by_key(|m| m.sb.events)
            .expect("an array is found through a member")
    }

    /// The freshest member's metadata version as mdadm names it.
    pub fn metadata(&self) -> &'static str {
        self.freshest().metadata()
    }

    pub fn paths(&self) -> Vec<PathBuf> {
        self.members.iter().map(|m| m.path.clone()).collect()
    }

    /// "name (uuid)" for messages.
    pub fn describe(&self) -> String {
        let sb = self.template();
        format!("{} ({})", sb.set_name, uuid_string(&self.uuid))
    }

    /// Members that can serve their role now: active in the freshest superblock's view,
    /// not stale (their events are the freshest), one per role.
    pub fn present_roles(&self) -> usize {
        let newest = self.template().events;
        let mut roles: Vec<u16> = self
            .members
            .iter()
            .filter(|m| m.sb.events == newest)
            .filter_map(|m| m.sb.active_slot())
            .collect();
        roles.sort_unstable();
        roles.dedup();
        roles.len()
    }
}

/// The devices the DEVICE specs name, each once (by canonical path), in order.
pub fn candidates(specs: &[DeviceSpec]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        let c = crate::locks::canonical(&p);
        if !seen.contains(&c) {
            seen.push(c);
            out.push(p);
        }
    };
    for s in specs {
        match s {
            DeviceSpec::Glob(g) => {
                let Ok(paths) = glob::glob(g) else {
                    eprintln!("uraid: DEVICE {g:?} is not a valid glob; passed over");
                    continue;
                };
                for p in paths.flatten() {
                    if is_device_or_file(&p) {
                        push(p);
                    }
                }
            }
            DeviceSpec::Partitions => {
                let text = std::fs::read_to_string("/proc/partitions").unwrap_or_default();
                for p in partitions(&text) {
                    if is_device_or_file(&p) {
                        push(p);
                    }
                }
            }
            // External metadata containers: uraid reads none.
            DeviceSpec::Containers => {}
            DeviceSpec::Nbd(uri) => push(PathBuf::from(uri)),
        }
    }
    out
}

fn is_device_or_file(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() || m.file_type().is_block_device())
}

/// /dev paths of the devices /proc/partitions lists (`major minor #blocks name`).
pub fn partitions(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [major, _, _, name] if major.parse::<u32>().is_ok() => {
                    Some(PathBuf::from("/dev").join(name))
                }
                _ => None,
            }
        })
        .collect()
}

/// The device's superblock, if it has a valid one (read-only; errors mean "none"). A
/// remote member that cannot be reached is said on stderr, by name.
pub fn probe(path: &Path) -> Option<Probed> {
    let dev: std::sync::Arc<dyn uraid_engine::Member> = if crate::locks::is_remote(path) {
        match crate::open::open_member(path) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("uraid: passed over: {e:#}");
                return None;
            }
        }
    } else {
        std::sync::Arc::new(uraid_engine::overlay::ReadOnlyFile::open(path).ok()?)
    };
    let (sb, computed, rec) = uraid_engine::read_superblock_with_090(dev.as_ref()).ok()?;
    (sb.sb_csum == computed).then_some(())?;
    Some(Probed {
        path: path.to_path_buf(),
        sb,
        md_minor090: rec.map(|r| r.md_minor),
    })
}

/// Probes every path and groups what it found by array UUID, in the order found.
pub fn find(paths: &[PathBuf]) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for p in paths {
        let Some(m) = probe(p) else { continue };
        match out.iter_mut().find(|f| f.uuid == m.sb.set_uuid) {
            Some(f) => f.members.push(m),
            None => out.push(Found {
                uuid: m.sb.set_uuid,
                members: vec![m],
            }),
        }
    }
    out
}

/// mdadm's `--examine --scan` line for an array: `ARRAY /dev/md/NAME  metadata=1.2
/// UUID=... name=HOST:NAME`, with `spares=N` when some members are spares.
pub fn array_line(f: &Found) -> String {
    let sb = f.template();
    let mut s = String::from("ARRAY ");
    if let Some(minor) = f.freshest().md_minor090 {
        // 0.90 has no name and mdadm gives no metadata= for it: the preferred minor.
        s.push_str(&format!("/dev/md{minor} UUID={}", uuid_string(&f.uuid)));
    } else {
        if !sb.set_name.is_empty() {
            // Two spaces, as mdadm prints it.
            s.push_str(&format!("/dev/md/{}  ", sb.name()));
        }
        s.push_str(&format!(
            "metadata={} UUID={}",
            sb.version().name(),
            uuid_string(&f.uuid)
        ));
    }
    if !sb.set_name.is_empty() {
        s.push_str(&format!(" name={}", sb.set_name));
    }
    let spares = f
        .members
        .iter()
        .filter(|m| m.sb.role_of_this_device() == Some(uraid_core::superblock::ROLE_SPARE))
        .count();
    if spares > 0 {
        s.push_str(&format!("   spares={spares}"));
    }
    // Remote members are on no list a scan reads but this line's: name every member (the
    // local ones too, as devices= admits only those it names).
    if f.members.iter().any(|m| crate::locks::is_remote(&m.path)) {
        let all: Vec<String> = f
            .members
            .iter()
            .map(|m| m.path.display().to_string())
            .collect();
        s.push_str(&format!(" devices={}", all.join(",")));
    }
    s
}

/// An array to assemble: what was found of it, the ARRAY line that names it (if any).
#[derive(Debug)]
pub struct Plan {
    pub found: Found,
    pub line: Option<ArrayLine>,
}

/// Whether `id` (a UUID, a name, `host:name`, `/dev/md/NAME` or an ARRAY line's device)
/// names this array.
fn named_by(id: &str, f: &Found, line: Option<&ArrayLine>) -> bool {
    let sb = f.template();
    if uraid_core::superblock::parse_uuid(id).is_some_and(|u| u == f.uuid) {
        return true;
    }
    let short = id.strip_prefix("/dev/md/").unwrap_or(id);
    short == sb.set_name
        || short == sb.name()
        || line.is_some_and(|l| l.device.as_deref() == Some(id))
}

fn glob_matches(globs: &[String], p: &Path) -> bool {
    if crate::locks::is_remote(p) {
        // A URI is matched as written: its `?` and `[` are no glob's.
        return globs.iter().any(|g| Some(g.as_str()) == p.to_str());
    }
    let canon = crate::locks::canonical(p);
    globs.iter().any(|g| {
        glob::Pattern::new(g).is_ok_and(|pat| pat.matches_path(p) || pat.matches_path(&canon))
            || crate::locks::canonical(Path::new(g)) == canon
    })
}

/// Chooses the arrays to assemble, mdadm's way: with ARRAY lines in the config, those
/// arrays (`<ignore>` ones never); without, every array found that is this host's (see
/// [`HostRule`]) and that AUTO allows. `wanted` (names or UUIDs) narrows the choice and
/// asks for those arrays whatever their host. Gives the plans and, for each array left
/// out, why, in one line.
pub fn select(
    c: &Config,
    found: Vec<Found>,
    host: &HostRule,
    wanted: &[String],
) -> Result<(Vec<Plan>, Vec<String>)> {
    let listed = c.arrays.iter().any(|l| !l.ignored());
    let mut plans = Vec::new();
    let mut refused = Vec::new();
    let mut named = vec![false; wanted.len()];
    for mut f in found {
        let sb = f.template().clone();
        let plan_metadata = f.metadata();
        let line = c
            .arrays
            .iter()
            .find(|l| l.matches(&f.uuid, &sb.set_name))
            .cloned();
        let asked: Vec<usize> = (0..wanted.len())
            .filter(|&i| named_by(&wanted[i], &f, line.as_ref()))
            .collect();
        if !wanted.is_empty() && asked.is_empty() {
            continue;
        }
        for &i in &asked {
            named[i] = true;
        }
        let what = f.describe();
        if let Some(l) = &line {
            if l.ignored() {
                refused.push(format!(
                    "array {what}: not started: ARRAY <ignore> (line {}) names it",
                    l.line
                ));
                continue;
            }
            if let Some(why) = line_disagrees(l, &sb, plan_metadata) {
                refused.push(format!(
                    "array {what}: not started: its ARRAY line (line {}) says {why}",
                    l.line
                ));
                continue;
            }
            if !l.devices.is_empty() {
                f.members.retain(|m| glob_matches(&l.devices, &m.path));
            }
        } else if asked.is_empty() {
            if listed {
                refused.push(format!(
                    "array {what}: not started: no ARRAY line in the config names it"
                ));
                continue;
            }
            let local = host.local(&sb.set_name);
            if let Err(h) = &local {
                refused.push(format!(
                    "array {what}: not started: it belongs to host {h:?}, not this one; \
                     give --homehost {h} (or <ignore>) or list it in an ARRAY line"
                ));
                continue;
            }
            if !c.auto_allows(plan_metadata, local.is_ok()) {
                refused.push(format!(
                    "array {what}: not started: the config's AUTO line refuses it"
                ));
                continue;
            }
        }
        plans.push(Plan { found: f, line });
    }
    if let Some(i) = named.iter().position(|n| !n) {
        bail!(
            "no array found for {:?} among the scanned devices (DEVICE lines of the config, \
             else /proc/partitions; NBD URIs of its ARRAY lines)",
            wanted[i]
        );
    }
    Ok((plans, refused))
}

/// What an ARRAY line's level=, num-devices= or metadata= says that the superblock does
/// not.
fn line_disagrees(l: &ArrayLine, sb: &Superblock, v: &str) -> Option<String> {
    if let Some(m) = &l.metadata {
        if !(m == v || (matches!(m.as_str(), "1" | "1.x") && v.starts_with("1."))) {
            return Some(format!("metadata={m}, the superblock is {v}"));
        }
    }
    if let Some(n) = l.num_devices {
        if n != sb.raid_disks {
            return Some(format!("num-devices={n}, the array has {}", sb.raid_disks));
        }
    }
    if let Some(lv) = &l.level {
        let want = uraid_core::Level::parse(lv);
        let have = uraid_core::Level::from_md(sb.level);
        if want.is_none() || want != have {
            return Some(format!(
                "level={lv}, the array is level {}",
                have.map_or(sb.level.to_string(), |l| l.to_string())
            ));
        }
    }
    None
}

/// The devices to scan: those given, else the config's DEVICE lines.
pub fn devices_to_scan(c: &Config, given: &[PathBuf]) -> Vec<PathBuf> {
    if given.is_empty() {
        candidates(&c.device_specs())
    } else {
        given.to_vec()
    }
}

/// `examine --scan`: one ARRAY line per array found on `given` (or the scanned devices),
/// in mdadm's order: the array found last first.
pub fn examine_scan(scan: &ScanArgs, given: &[PathBuf]) -> Result<()> {
    let c = scan.config()?;
    for f in find(&devices_to_scan(&c, given)).iter().rev() {
        println!("{}", array_line(f));
    }
    Ok(())
}

/// The arrays `assemble --scan` / `serve --scan` act on, with what was refused said on
/// stderr.
pub fn plans(scan: &ScanArgs, wanted: &[String]) -> Result<Vec<Plan>> {
    let c = scan.config()?;
    let found = find(&candidates(&c.device_specs()));
    let (plans, refused) = select(&c, found, &scan.host_rule(&c), wanted)?;
    for r in &refused {
        eprintln!("uraid: {r}");
    }
    if plans.is_empty() {
        bail!(
            "no array to start{}",
            if refused.is_empty() {
                ": no md superblock on the scanned devices (DEVICE lines of the config, \
                 else /proc/partitions; NBD URIs of its ARRAY lines)"
            } else {
                " (see above)"
            }
        );
    }
    Ok(plans)
}

/// `uraid incremental DEV` (mdadm -I).
#[derive(Args)]
pub struct IncrementalArgs {
    #[command(flatten)]
    pub scan_args: ScanArgs,
    /// Start the array even if members are still missing (degraded, as mdadm -I --run).
    #[arg(short = 'R', long)]
    pub run: bool,
    /// Where the server's NBD clients connect (see `uraid serve --nbd`).
    #[arg(long, value_name = "ADDR")]
    pub nbd: Option<String>,
    /// The device that arrived.
    pub device: PathBuf,
}

/// mdadm -I: `device` arrived. Its array's other members are looked for on the scanned
/// devices (the config's DEVICE lines, else /proc/partitions); once every role has a
/// current member (or with --run), the array is served by a `uraid serve` in the
/// background; else it waits, and a later call for another member starts it. It prints
/// one line: what it did, or how many members it waits for. Calls are serialised by a
/// lock in the run dir, so two members arriving at once start the array once.
pub fn incremental(a: IncrementalArgs) -> Result<()> {
    let dev = &a.device;
    let Some(this) = probe(dev) else {
        bail!(
            "{}: no valid md superblock (version 1.0, 1.1 or 1.2): not part of an array",
            dev.display()
        );
    };
    let c = a.scan_args.config()?;
    let host = a.scan_args.host_rule(&c);
    let mut paths = devices_to_scan(&c, &[]);
    if !paths
        .iter()
        .any(|p| crate::locks::canonical(p) == crate::locks::canonical(dev))
    {
        paths.insert(0, dev.clone());
    }
    let found: Vec<Found> = find(&paths)
        .into_iter()
        .filter(|f| f.uuid == this.sb.set_uuid)
        .collect();
    let (mut plans, refused) = select(&c, found, &host, &[])?;
    let Some(plan) = plans.pop() else {
        bail!(
            "{}: {}",
            dev.display(),
            refused.join("; ").trim_start_matches("array ")
        );
    };
    let run_dir = crate::locks::run_dir();
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("cannot create {}", run_dir.display()))?;
    let _serial = lock_file(&run_dir.join("incremental.lock"))?;
    let f = &plan.found;
    let what = f.describe();
    let uuid = uuid_string(&f.uuid);
    if let Some(s) = served(&run_dir, &uuid) {
        println!(
            "uraid: {}: array {what} is served already (pid {}, control {})",
            dev.display(),
            s.pid,
            s.control.display()
        );
        return Ok(());
    }
    let need = f.template().raid_disks as usize;
    let have = f.present_roles();
    if have < need && !a.run {
        println!(
            "uraid: {} attached to array {what}: {have} of {need} members present, waiting \
             for the others",
            dev.display()
        );
        return Ok(());
    }
    let pid = spawn_server(&run_dir, &uuid, &f.paths(), a.nbd.as_deref())?;
    let s = served(&run_dir, &uuid).expect("spawn_server waits for the index");
    println!(
        "uraid: {} completes array {what}: {have} of {need} members; served by pid {pid} \
         (control {})",
        dev.display(),
        s.control.display()
    );
    Ok(())
}

/// An exclusive flock on `path`, held while the file stays open.
fn lock_file(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot lock {}", path.display()));
    }
    Ok(f)
}

/// The live server of the array with this UUID, from its index file.
fn served(run_dir: &Path, uuid: &str) -> Option<crate::locks::Found> {
    let text = std::fs::read_to_string(run_dir.join(format!("{uuid}.json"))).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let pid = v["pid"].as_u64()? as u32;
    let control = PathBuf::from(v["control"].as_str()?);
    (crate::locks::pid_alive(pid) && std::os::unix::net::UnixStream::connect(&control).is_ok())
        .then_some(crate::locks::Found { pid, control })
}

/// Starts `uraid serve` on the members in its own session (it outlives this command, as
/// udev wants), its output in `<run dir>/<uuid>.log`, and waits until it serves or fails.
fn spawn_server(run_dir: &Path, uuid: &str, members: &[PathBuf], nbd: Option<&str>) -> Result<u32> {
    use std::os::unix::process::CommandExt;
    let log_path = run_dir.join(format!("{uuid}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding the uraid binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve");
    if let Some(n) = nbd {
        cmd.args(["--nbd", n]);
    }
    cmd.args(members)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of this process.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting uraid serve")?;
    let pid = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if served(run_dir, uuid).is_some_and(|s| s.pid == pid) {
            return Ok(pid);
        }
        if let Some(st) = child.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "uraid serve exited ({st}) before serving the array: {}",
                log.trim().replace('\n', "; ")
            );
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "uraid serve (pid {pid}) did not come up within 60 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uraid_core::superblock::ROLE_SPARE;

    fn sb(name: &str, uuid: u8, role: u16, events: u64) -> Superblock {
        let mut o = uraid_engine::CreateOptions::new(uraid_core::Level::Raid1);
        o.name = name.to_string();
        let mems: Vec<Option<std::sync::Arc<dyn uraid_engine::Member>>> = (0..2)
            .map(|i| {
                Some(
                    std::sync::Arc::new(uraid_engine::MemMember::new(format!("m{i}"), 4 << 20))
                        as std::sync::Arc<dyn uraid_engine::Member>,
                )
            })
            .collect();
        o.assume_clean = true;
        let a = uraid_engine::create(mems, &o).unwrap();
        let mut s = a.meta().template().clone();
        s.set_uuid = [uuid; 16];
        s.set_name = name.to_string();
        s.events = events;
        if role == ROLE_SPARE {
            s.dev_number = s.dev_roles.len() as u32;
            s.dev_roles.push(ROLE_SPARE);
        } else {
            let dev = s.dev_roles.iter().position(|&r| r == role).unwrap();
            s.dev_number = dev as u32;
        }
        s
    }

    fn found(name: &str, uuid: u8, roles: &[u16]) -> Found {
        Found {
            uuid: [uuid; 16],
            members: roles
                .iter()
                .enumerate()
                .map(|(i, &r)| Probed {
                    path: PathBuf::from(format!("/img/{name}{i}")),
                    sb: sb(name, uuid, r, 5),
                    md_minor090: None,
                })
                .collect(),
        }
    }

    #[test]
    fn the_array_line_is_mdadms() {
        let f = found("box:home", 0x11, &[0, 1]);
        assert_eq!(
            array_line(&f),
            "ARRAY /dev/md/home  metadata=1.2 UUID=11111111:11111111:11111111:11111111 \
             name=box:home"
        );
        assert_eq!(f.present_roles(), 2);
    }

    #[test]
    fn remote_members_are_named_on_the_line_and_matched_as_written() {
        // Two members and a spare: two of the three remote.
        let mut f = found("box:far", 0x22, &[0, 1, ROLE_SPARE]);
        f.members[1].path = "nbds://store1:10809/disk?0".into();
        f.members[2].path = "nbd+unix:///e?socket=/run/s.sock".into();
        let line = array_line(&f);
        assert!(
            line.ends_with(
                " name=box:far   spares=1 devices=/img/box:far0,nbds://store1:10809/disk?0,\
                 nbd+unix:///e?socket=/run/s.sock"
            ),
            "{line}"
        );
        // The line, read back as a config, names the array and admits all three members.
        let c = mdadm_conf::parse("c", &line).unwrap();
        let (p, r) = select(&c, vec![f.clone()], &HostRule::Any, &[]).unwrap();
        assert!(r.is_empty(), "{r:?}");
        assert_eq!(p[0].found.paths(), f.paths());
        assert_eq!(
            c.device_specs()[2..],
            [
                DeviceSpec::Nbd("nbds://store1:10809/disk?0".into()),
                DeviceSpec::Nbd("nbd+unix:///e?socket=/run/s.sock".into())
            ]
        );
        // `?` is no wildcard in a URI: another export is not admitted.
        let mut other = f.clone();
        other.members[1].path = "nbds://store1:10809/diskX0".into();
        let (p, _) = select(&c, vec![other], &HostRule::Any, &[]).unwrap();
        assert_eq!(p[0].found.members.len(), 2);
        // Local members only: no devices= (mdadm's line).
        assert!(!array_line(&found("box:near", 3, &[0, 1])).contains("devices="));
    }

    #[test]
    fn selection_follows_array_lines_and_the_homehost() {
        let me = HostRule::Host(Some("me".into()));
        let all = || {
            vec![
                found("me:a", 1, &[0, 1]),
                found("you:b", 2, &[0, 1]),
                found("c", 3, &[0]),
            ]
        };
        let names = |p: &[Plan]| -> Vec<String> {
            p.iter()
                .map(|p| p.found.template().set_name.clone())
                .collect()
        };
        // No ARRAY lines: this host's and host-less arrays; the other host's refused.
        let empty = mdadm_conf::parse("c", "").unwrap();
        let (p, r) = select(&empty, all(), &me, &[]).unwrap();
        assert_eq!(names(&p), ["me:a", "c"]);
        assert_eq!(r.len(), 1);
        assert!(r[0].contains("belongs to host \"you\""), "{r:?}");
        // --homehost you, or <ignore>, takes it.
        let (p, _) = select(&empty, all(), &HostRule::Any, &[]).unwrap();
        assert_eq!(p.len(), 3);
        // Asked for by name: started whatever its host.
        let (p, r) = select(&empty, all(), &me, &["b".into()]).unwrap();
        assert_eq!(names(&p), ["you:b"]);
        assert!(r.is_empty());
        assert!(select(&empty, all(), &me, &["zz".into()]).is_err());
        // ARRAY lines: only those, whatever the host.
        let listed = mdadm_conf::parse(
            "c",
            "ARRAY /dev/md/b UUID=02020202:02020202:02020202:02020202\n",
        )
        .unwrap();
        let (p, r) = select(&listed, all(), &me, &[]).unwrap();
        assert_eq!(names(&p), ["you:b"]);
        assert_eq!(r.len(), 2, "{r:?}");
        let (p, _) = select(&listed, all(), &me, &["/dev/md/b".into()]).unwrap();
        assert_eq!(names(&p), ["you:b"]);
        // <ignore> and a disagreeing line refuse.
        let ign = mdadm_conf::parse(
            "c",
            "ARRAY <ignore> name=me:a\nARRAY /dev/md/c name=c num-devices=3\n",
        )
        .unwrap();
        let (p, r) = select(&ign, all(), &me, &[]).unwrap();
        assert!(p.is_empty());
        assert_eq!(r.len(), 3, "{r:?}");
        assert!(r[0].contains("<ignore>"), "{r:?}");
        assert!(r[2].contains("num-devices=3"), "{r:?}");
        // AUTO -all refuses what no line lists.
        let auto = mdadm_conf::parse("c", "AUTO -all\n").unwrap();
        let (p, _) = select(&auto, all(), &me, &[]).unwrap();
        assert!(p.is_empty());
    }

    #[test]
    fn devices_lines_restrict_members_and_partitions_parse() {
        let c = mdadm_conf::parse("c", "ARRAY /dev/md/a name=me:a devices=/img/me:a0\n").unwrap();
        let (p, _) = select(&c, vec![found("me:a", 1, &[0, 1])], &HostRule::Any, &[]).unwrap();
        assert_eq!(p[0].found.paths(), [PathBuf::from("/img/me:a0")]);
        let text = "major minor  #blocks  name\n\n   8        0  976762584 sda\n   8        1     524288 sda1\n";
        assert_eq!(
            partitions(text),
            [PathBuf::from("/dev/sda"), PathBuf::from("/dev/sda1")]
        );
    }

    #[test]
    fn spares_are_counted_on_the_line() {
        let mut f = found("me:s", 4, &[0, 1]);
        f.members.push(Probed {
            path: "/img/spare".into(),
            sb: sb("me:s", 4, ROLE_SPARE, 5),
            md_minor090: None,
        });
        assert!(
            array_line(&f).ends_with("name=me:s   spares=1"),
            "{}",
            array_line(&f)
        );
        assert_eq!(f.present_roles(), 2);
    }
}
