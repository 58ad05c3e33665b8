//! `uraid monitor`: md's event vocabulary for an array, as mdadm --monitor reports it.
//!
//! Like mdadm, it polls: the state of a served array through its control socket, or the
//! superblocks of the members when no server runs. Changes between two polls become events
//! (Fail, DegradedArray, SpareAdded, RebuildStarted, RebuildNN, RebuildFinished,
//! SpareActive, DeviceDisappeared, NewArray), printed as lines or JSON, and optionally
//! passed to a program as `PROGRAM EVENT ARRAY [DEVICE]`.

use crate::control;
use anyhow::{bail, Result};
use clap::Args;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use uraid_core::superblock::{uuid_string, FEATURE_RECOVERY_OFFSET, MAX_SECTOR, ROLE_SPARE};

#[derive(Args)]
pub struct MonitorArgs {
    /// Control socket of a served array (default: found from the members).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Seconds between polls (mdadm's --delay).
    #[arg(short, long, default_value_t = 2.0)]
    pub delay: f64,
    /// Run PROGRAM EVENT ARRAY [DEVICE] for every event (mdadm's --program).
    #[arg(long)]
    pub program: Option<String>,
    /// Poll once, print the events of the current state, and exit (mdadm's --oneshot).
    #[arg(short = '1', long)]
    pub oneshot: bool,
    /// Stop after this many polls (0: forever).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// One JSON object per event.
    #[arg(long)]
    pub json: bool,
    /// Member devices or files of the array.
    pub devices: Vec<PathBuf>,
}

/// What the monitor compares between polls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub uuid: String,
    pub degraded: bool,
    /// role -> (state word, device, recovery percent)
    pub roles: BTreeMap<u64, (String, String, Option<f64>)>,
    pub spares: Vec<String>,
}

impl State {
    /// From `detail --json` (served arrays).
    pub fn from_detail(v: &Value) -> State {
        let mut roles = BTreeMap::new();
        for m in v["members"].as_array().into_iter().flatten() {
            roles.insert(
                m["role"].as_u64().unwrap_or(0),
                (
                    m["state"].as_str().unwrap_or("missing").to_string(),
                    m["device"].as_str().unwrap_or("").to_string(),
                    m["recovery_percent"].as_f64(),
                ),
            );
        }
        State {
            uuid: v["uuid"].as_str().unwrap_or("").to_string(),
            degraded: v["degraded"].as_bool().unwrap_or(false),
            roles,
            spares: v["spares"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect(),
        }
    }

    /// From the members' superblocks (no server): the freshest one says who holds each role.
    pub fn from_superblocks(paths: &[PathBuf]) -> Result<State> {
        let mut sbs = Vec::new();
        for p in paths {
            let Ok(dev) = crate::open::open_member(p) else {
                continue;
            };
            if let Ok(sb) = uraid_engine::meta::read_superblock(dev.as_ref()) {
                sbs.push((p.display().to_string(), sb));
            }
        }
        let Some(fresh) = sbs.iter().map(|(_, s)| s.events).max() else {
            bail!("no member with a readable superblock");
        };
        let t = sbs
            .iter()
            .find(|(_, s)| s.events == fresh)
            .expect("fresh")
            .1
            .clone();
        let mut roles = BTreeMap::new();
        for r in 0..u64::from(t.raid_disks) {
            roles.insert(r, ("missing".to_string(), String::new(), None));
        }
        let mut spares = Vec::new();
        for (name, sb) in &sbs {
            let role = t
                .dev_roles
                .get(sb.dev_number as usize)
                .copied()
                .unwrap_or(ROLE_SPARE);
            if u32::from(role) < t.raid_disks && sb.events == fresh {
                let rebuilding = sb.feature_map & FEATURE_RECOVERY_OFFSET != 0
                    && sb.recovery_offset != MAX_SECTOR;
                let pct =
                    rebuilding.then(|| sb.recovery_offset as f64 * 100.0 / t.size.max(1) as f64);
                let word = if rebuilding { "rebuilding" } else { "active" };
                roles.insert(u64::from(role), (word.to_string(), name.clone(), pct));
            } else if role == ROLE_SPARE && sb.events == fresh {
                spares.push(name.clone());
            }
        }
        let degraded = roles.values().any(|(w, _, _)| w != "active");
        Ok(State {
            uuid: uuid_string(&t.set_uuid),
            degraded,
            roles,
            spares,
        })
    }
}

/// Events that turn `old` (None: the first poll) into `new`, in mdadm's words.
pub fn diff(old: Option<&State>, new: &State) -> Vec<(String, Option<String>)> {
    let mut ev = Vec::new();
    let Some(old) = old else {
        ev.push(("NewArray".to_string(), None));
        if new.degraded {
            ev.push(("DegradedArray".to_string(), None));
        }
        for (w, d, _) in new.roles.values() {
            if w == "rebuilding" {
                ev.push(("RebuildStarted".to_string(), Some(d.clone())));
            }
        }
        return ev;
    };
    for (role, (w, d, pct)) in &new.roles {
        let (ow, od, opct) = old.roles.get(role).cloned().unwrap_or_default();
        if w == &ow && d == &od {
            if let (Some(p), Some(op)) = (pct, opct) {
                for step in [20.0, 40.0, 60.0, 80.0] {
                    if op < step && *p >= step {
                        ev.push((format!("Rebuild{}", step as u32), Some(d.clone())));
                    }
                }
            }
            continue;
        }
        match (ow.as_str(), w.as_str()) {
            ("active" | "rebuilding", "faulty") => ev.push(("Fail".into(), Some(od.clone()))),
            ("active" | "rebuilding", "missing") => {
                ev.push(("DeviceDisappeared".into(), Some(od.clone())))
            }
            (_, "rebuilding") => ev.push(("RebuildStarted".into(), Some(d.clone()))),
            ("rebuilding", "active") => {
                ev.push(("RebuildFinished".into(), Some(d.clone())));
                ev.push(("SpareActive".into(), Some(d.clone())));
            }
            ("faulty", "missing") => ev.push(("DeviceDisappeared".into(), Some(od.clone()))),
            _ => {}
        }
    }
    for s in &new.spares {
        if !old.spares.contains(s) {
            ev.push(("SpareAdded".into(), Some(s.clone())));
        }
    }
    if new.degraded && !old.degraded {
        ev.push(("DegradedArray".into(), None));
    }
    ev
}

fn poll(a: &MonitorArgs) -> Result<State> {
    let control = match &a.control {
        Some(c) => Some(c.clone()),
        None => control::find_server(&a.devices).map(|f| f.control),
    };
    match control {
        Some(c) => {
            let v = control::request(&c, &json!({"cmd": "detail"}))?;
            let d = if v.get("detail").is_some() {
                &v["detail"]
            } else {
                &v
            };
            Ok(State::from_detail(d))
        }
        None => State::from_superblocks(&a.devices),
    }
}

pub fn monitor(a: MonitorArgs) -> Result<()> {
    if a.devices.is_empty() && a.control.is_none() {
        bail!("give the array's members or --control PATH");
    }
    let mut last: Option<State> = None;
    let mut polls = 0u64;
    loop {
        match poll(&a) {
            Ok(st) => {
                for (event, device) in diff(last.as_ref(), &st) {
                    emit(&a, &st.uuid, &event, device.as_deref());
                }
                last = Some(st);
            }
            Err(e) => {
                if last.take().is_some() {
                    emit(&a, "", "DeviceDisappeared", None);
                }
                if a.oneshot {
                    return Err(e);
                }
            }
        }
        polls += 1;
        if a.oneshot || (a.count > 0 && polls >= a.count) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(a.delay.max(0.05)));
    }
}

fn emit(a: &MonitorArgs, array: &str, event: &str, device: Option<&str>) {
    if a.json {
        println!(
            "{}",
            json!({"event": event, "array": array, "device": device})
        );
    } else {
        println!(
            "{event} {array}{}",
            device.map(|d| format!(" {d}")).unwrap_or_default()
        );
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    if let Some(p) = &a.program {
        let mut c = std::process::Command::new(p);
        c.arg(event).arg(array);
        if let Some(d) = device {
            c.arg(d);
        }
        if let Err(e) = c.status() {
            eprintln!("uraid: monitor: cannot run {p}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(roles: &[(u64, &str, &str, Option<f64>)], spares: &[&str]) -> State {
        State {
            uuid: "u".into(),
            degraded: roles.iter().any(|r| r.1 != "active"),
            roles: roles
                .iter()
                .map(|r| (r.0, (r.1.into(), r.2.into(), r.3)))
                .collect(),
            spares: spares.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn names(v: Vec<(String, Option<String>)>) -> Vec<String> {
        v.into_iter().map(|e| e.0).collect()
    }

    #[test]
    fn events_follow_a_failure_and_a_rebuild() {
        let a = st(
            &[(0, "active", "a", None), (1, "active", "b", None)],
            &["s"],
        );
        assert_eq!(names(diff(None, &a)), ["NewArray"]);
        let b = st(
            &[(0, "active", "a", None), (1, "faulty", "b", None)],
            &["s"],
        );
        assert_eq!(names(diff(Some(&a), &b)), ["Fail", "DegradedArray"]);
        let c = st(
            &[(0, "active", "a", None), (1, "rebuilding", "s", Some(10.0))],
            &[],
        );
        assert_eq!(names(diff(Some(&b), &c)), ["RebuildStarted"]);
        let d = st(
            &[(0, "active", "a", None), (1, "rebuilding", "s", Some(45.0))],
            &[],
        );
        assert_eq!(names(diff(Some(&c), &d)), ["Rebuild20", "Rebuild40"]);
        let e = st(
            &[(0, "active", "a", None), (1, "active", "s", None)],
            &["t"],
        );
        assert_eq!(
            names(diff(Some(&d), &e)),
            ["RebuildFinished", "SpareActive", "SpareAdded"]
        );
    }
}
