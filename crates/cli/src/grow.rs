//! `uraid grow` (mdadm --grow): on a served array through its control socket, or on the
//! members of an array that is not running (assembled here, changed, superblocks written).
//!
//! The options keep mdadm's names and units: `--size` and `--chunk` are KiB unless they
//! carry a suffix, `--size max` takes all the members give. The values travel to the
//! server as text (`{"cmd":"grow","values":{"raid_devices":"3"}}`) and are read there by
//! [`crate::grow_request::request_of`] against the array's own level, as they are here offline.

use crate::grow_request::request_of;
use crate::locks;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::Member;

#[derive(Args)]
pub struct GrowArgs {
    /// A served array: any of its member paths (--array) or its control socket.
    #[command(flatten)]
    pub target: crate::control::ArrayArgs,
    /// The number of member roles (mdadm -n): raid1 adds or drops mirrors; raid4/5/6
    /// restripe (fewer: a shrink, with --array-size); raid0 grows (with --add) or shrinks
    /// (with --array-size) through raid4, as mdadm.
    #[arg(short = 'n', long, value_name = "N")]
    pub raid_devices: Option<usize>,
    /// Space used on each member: `max`, or a size (KiB unless K/M/G/T follow).
    #[arg(short = 'z', long, value_name = "max|SIZE")]
    pub size: Option<String>,
    /// md's in-memory array size (KiB unless K/M/G/T follow; max: all of it). Alone, on a
    /// served array: the size it is exported at until changed or restarted, which a later
    /// --raid-devices fewer takes as its confirmation; with the --raid-devices of a
    /// raid0/4/5/6/10 shrink: the confirmation that the data past it goes.
    #[arg(short = 'Z', long, value_name = "max|SIZE")]
    pub array_size: Option<String>,
    /// New chunk size (KiB unless K/M follow): a restripe.
    #[arg(short = 'c', long, value_name = "SIZE")]
    pub chunk: Option<String>,
    /// New layout (left-symmetric, left-symmetric-6, parity-last, n2, ...).
    #[arg(short = 'p', long, value_name = "LAYOUT")]
    pub layout: Option<String>,
    /// New level (0, 1, 4, 5, 6, 10, raid5, ...): md's takeovers, or a restripe.
    #[arg(short = 'l', long, value_name = "LEVEL")]
    pub level: Option<String>,
    /// `internal` or `none`: add or drop the write-intent bitmap.
    #[arg(short = 'b', long, value_name = "internal|none")]
    pub bitmap: Option<String>,
    /// Devices to add after the change, as mdadm sequences `--add` with `--grow`: they
    /// fill the new roles (and are recovered) or wait as spares.
    #[arg(short = 'a', long, value_name = "DEVICE", num_args = 1..)]
    pub add: Vec<PathBuf>,
    /// mdadm's backup file for a restripe of the critical section; uraid's restripe
    /// engine keeps its own, so it is accepted and not used.
    #[arg(long, value_name = "FILE")]
    pub backup_file: Option<PathBuf>,
    /// Print the reply (served) as JSON.
    #[arg(long)]
    pub json: bool,
    /// Go on with the reshape the members record (mdadm --grow --continue): one uraid or
    /// Linux md left mid-way (stopped, killed, a power cut), to the end.
    #[arg(long = "continue")]
    pub continue_reshape: bool,
    /// A restripe copies at most this many KiB/s (md's sync_speed_max).
    #[arg(long, value_name = "KIB")]
    pub speed_max: Option<u64>,
    /// Leave a restripe once its recorded position reaches this array sector (it is
    /// recorded in the superblocks; `uraid grow --continue` or Linux md goes on from it).
    #[arg(long, value_name = "SECTOR")]
    pub stop_at: Option<u64>,
    /// mdadm's --force: a restripe with fewer devices than new roles, the rest left
    /// missing (the array ends degraded), where md allows it.
    #[arg(short, long)]
    pub force: bool,
    /// No progress output.
    #[arg(short, long)]
    pub quiet: bool,
    /// Member devices of an array that is not running (all of them), or of a served one.
    pub devices: Vec<PathBuf>,
}

impl GrowArgs {
    /// The changes as the control request carries them (text, by mdadm's option names).
    fn values(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                m.insert(k.into(), Value::String(v));
            }
        };
        put("raid_devices", self.raid_devices.map(|n| n.to_string()));
        put("size", self.size.clone());
        put("array_size", self.array_size.clone());
        put("chunk", self.chunk.clone());
        put("layout", self.layout.clone());
        put("level", self.level.clone());
        put("bitmap", self.bitmap.clone());
        m
    }
}

/// `uraid grow`.
pub fn grow(a: GrowArgs) -> Result<()> {
    let mut paths = a.devices.clone();
    paths.extend(a.target.array.iter().cloned());
    let found = match &a.target.control {
        Some(c) => Some(c.clone()),
        None => locks::find_server(&paths).map(|f| f.control),
    };
    if paths.is_empty() && found.is_none() {
        bail!("name the array: its member paths, --array MEMBER, or --control PATH");
    }
    if let Some(b) = &a.backup_file {
        eprintln!(
            "uraid: --backup-file {} is not needed: uraid moves the data offset (md's new_offset) instead",
            b.display()
        );
    }
    if a.continue_reshape {
        if found.is_some() {
            bail!("the array is served, and a served array goes on with its reshape by itself (uraid detail and uraid status show where it is); a raid10 mid-reshape with an internal bitmap is served read-only: stop the server, then run uraid grow --continue on its members");
        }
        let _locks = locks::guard(&paths)?;
        let devs = crate::open::open_all(&paths)?;
        let r = uraid_engine::continue_reshape(devs, reshape_options(&a, Vec::new()))?;
        eprintln!("uraid: {} (events {})", r.summary, r.events);
        return Ok(());
    }
    let values = a.values();
    if values.is_empty() {
        bail!("nothing to change: give --raid-devices, --size, --level, --layout, --chunk or --bitmap");
    }
    match found {
        Some(_) if a.force => bail!(
            "--force (a restripe that leaves new roles missing) runs on the members of a \
             stopped array in this build: stop the server, then uraid grow --force MEMBERS; \
             nothing was changed"
        ),
        Some(control) => served(&a, &control, values),
        None => {
            let mut all = paths.clone();
            all.extend(a.add.iter().cloned());
            let _locks = locks::guard(&all)?;
            offline(&a, &paths, &values)
        }
    }
}

/// Through the control socket: each `--add` first (as mdadm does: the new devices wait as
/// spares, and the grow gives them their roles; a raid0's go with the grow), then the grow, which the server applies
/// while it serves (the array is built again in its new shape; a restripe then runs in
/// the background).
fn served(a: &GrowArgs, control: &std::path::Path, values: Map<String, Value>) -> Result<()> {
    if a.stop_at.is_some() {
        bail!(
            "--stop-at is for an array that is not served (the served array's reshape runs \
             to its end; uraid stop leaves it at the recorded position): nothing was changed"
        );
    }
    let adds: Vec<String> = a
        .add
        .iter()
        .map(|d| locks::canonical(d).display().to_string())
        .collect();
    // A raid0 has no room for a spare: its new devices go with the grow, which adds them
    // after md's takeover to raid4.
    let raid0 = !adds.is_empty() && {
        let v = crate::control::request(control, &json!({"cmd": "detail"}))?;
        v["detail"]["level"] == "raid0"
    };
    let mut grow = json!({"cmd": "grow", "values": values});
    if raid0 {
        grow["add"] = json!(adds);
    } else {
        for dev in &adds {
            let v = crate::control::request(control, &json!({"cmd": "add", "device": dev}))?;
            eprintln!("uraid: {dev} added: {}", v["added"]);
        }
    }
    let v = crate::control::request(control, &grow)?;
    eprintln!(
        "uraid: {}",
        v["grow"]["summary"].as_str().unwrap_or("grown")
    );
    if a.json {
        let v = crate::control::request(control, &json!({"cmd": "detail"}))?;
        println!("{}", serde_json::to_string_pretty(&v["detail"])?);
    }
    Ok(())
}

/// On the members: assemble, change, write the superblocks; then add and recover.
fn offline(a: &GrowArgs, paths: &[PathBuf], values: &Map<String, Value>) -> Result<()> {
    let devs = crate::open::open_all(paths)?;
    let sb = uraid_engine::read_superblock(devs[0].as_ref())?;
    let current = Level::from_md(sb.level)
        .with_context(|| format!("{}: unsupported level {}", paths[0].display(), sb.level))?;
    let kv: Vec<(String, String)> = values
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    let req = request_of(&kv, current)?;
    // The devices to add must open before anything is written.
    let mut adds: Vec<Arc<dyn Member>> = crate::open::open_all(&a.add)?;
    let mut devs = devs;
    // A restripe takes the devices it needs for new roles from the array's spares, then
    // from --add; the rest are added as spares after.
    let r = uraid_engine::grow_members_with(devs.clone(), &req, reshape_options(a, adds.clone()))?;
    eprintln!("uraid: {} (events {})", r.summary, r.events);
    if let Some(done) = &r.reshape {
        let used: Vec<Arc<dyn Member>> = adds.drain(..done.added).collect();
        devs.extend(used);
        if !done.finished {
            eprintln!(
                "uraid: the reshape is recorded at array sector {}: uraid grow --continue (or Linux md) goes on from there",
                done.position_sectors
            );
            return Ok(());
        }
    }
    if !r.missing_roles.is_empty() {
        let roles: Vec<String> = r.missing_roles.iter().map(|r| r.to_string()).collect();
        eprintln!(
            "uraid: role(s) {} have no member yet: add a device (uraid grow --add, or uraid add \
             on the served array) to recover them",
            roles.join(", ")
        );
    }
    if adds.is_empty() {
        return Ok(());
    }
    let first_unused = a.add.len() - adds.len();
    let (array, _) = uraid_engine::assemble(devs, &uraid_engine::AssembleOptions::default())?;
    for (dev, p) in adds.into_iter().zip(&a.add[first_unused..]) {
        let o = array.add_member(dev)?;
        eprintln!("uraid: {} added: {o:?}", p.display());
    }
    if !array.recovering_roles().is_empty() {
        array.run_sync(uraid_engine::SyncKind::Recovery, |_| {})?;
        eprintln!("uraid: recovery done");
    }
    array.stop()?;
    Ok(())
}

/// How a restripe runs from the command line: its devices, speed limit, stopping point
/// and a progress bar.
fn reshape_options(a: &GrowArgs, add: Vec<Arc<dyn Member>>) -> uraid_engine::ReshapeOptions {
    let mut bar = crate::progress::Bar::new("reshape", a.quiet);
    let started = std::time::Instant::now();
    uraid_engine::ReshapeOptions {
        add,
        force: a.force,
        stop_at: a.stop_at,
        start_only: false,
        max_bytes_per_sec: a.speed_max.map(|k| k * 1024),
        progress: Some(Box::new(move |done, total| {
            let p = uraid_engine::SyncProgress {
                kind: uraid_engine::SyncKind::Resync,
                done_units: done,
                total_units: total,
                unit_bytes: 512,
                mismatch_sectors: 0,
                zero_bytes: 0,
            };
            let secs = started.elapsed().as_secs_f64();
            let speed = if secs > 0.0 {
                done as f64 * 512.0 / secs
            } else {
                0.0
            };
            bar.update(&p, speed);
        })),
    }
}
