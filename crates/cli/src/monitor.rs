//! `uraid monitor`: md's event vocabulary for an array, as mdadm --monitor reports it.
//!
//! Like mdadm, it polls. A served array is asked through its control socket for the events
//! numbered since the last poll, so that none is missed however quickly they follow one
//! another (a Fail, then a remove and an add within one interval); its state is diffed only
//! on the first poll, or when the server's event log has moved past us. Without a server,
//! changes between two polls of the members' superblocks become events. Events (Fail,
//! DegradedArray, SpareAdded, RebuildStarted, RebuildNN, RebuildFinished, SpareActive,
//! DeviceDisappeared, NewArray) are printed as lines or JSON, and optionally passed to a
//! program as `PROGRAM EVENT ARRAY [DEVICE]`. A raid0 has no degraded mode: no
//! DegradedArray for it, as md.
//!
//! Members on other hosts add events of their own (md has none), with the member's URI as
//! the device: RemoteReconnecting, RemoteLost and RemoteUp when its connection (detail's
//! `remote.connection`) changes between two polls, and on the first poll for one that is
//! not up. A connection is a state the server does not log, so these come from diffing
//! every poll: a blip shorter than the delay may go unseen.

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
    // The text is `--help`'s, as written: not Markdown.
    #[allow(rustdoc::broken_intra_doc_links)]
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
    /// md's level name, e.g. raid5.
    pub level: String,
    pub degraded: bool,
    /// role -> (state word, device, recovery percent)
    pub roles: BTreeMap<u64, (String, String, Option<f64>)>,
    pub spares: Vec<String>,
    /// role -> (URI, connection word) of the members on other hosts.
    pub remotes: BTreeMap<u64, (String, String)>,
}

impl State {
    /// From `detail --json` (served arrays).
    pub fn from_detail(v: &Value) -> State {
        let mut roles = BTreeMap::new();
        let mut remotes = BTreeMap::new();
        for m in v["members"].as_array().into_iter().flatten() {
            let r = &m["remote"];
            if let (Some(uri), Some(c)) = (r["uri"].as_str(), r["connection"].as_str()) {
                remotes.insert(
                    m["role"].as_u64().unwrap_or(0),
                    (uri.to_string(), c.to_string()),
                );
            }
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
            level: v["level"].as_str().unwrap_or("").to_string(),
            degraded: v["degraded"].as_bool().unwrap_or(false),
            roles,
            spares: v["spares"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect(),
            remotes,
        }
    }

    /// From the members' superblocks (no server): the freshest one says who holds each role.
    pub fn from_superblocks(paths: &[PathBuf]) -> Result<State> {
        let mut sbs = Vec::new();
        for p in paths {
            let Ok(dev) = crate::open::open_member(p) else {
                continue;
            };
            if let Ok(sb) = uraid_engine::read_superblock(dev.as_ref()) {
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
            level: uraid_core::Level::from_md(t.level)
                .map(|l| l.to_string())
                .unwrap_or_default(),
            degraded,
            roles,
            spares,
            remotes: BTreeMap::new(),
        })
    }
}

/// Events in mdadm's words, each with the member device it is about.
pub type Events = Vec<(String, Option<String>)>;

/// Events that turn `old` (None: the first poll) into `new`.
pub fn diff(old: Option<&State>, new: &State) -> Events {
    let mut ev = Vec::new();
    let can_degrade = new.level != "raid0";
    let Some(old) = old else {
        ev.push(("NewArray".to_string(), None));
        if new.degraded && can_degrade {
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
    if new.degraded && !old.degraded && can_degrade {
        ev.push(("DegradedArray".into(), None));
    }
    ev
}

/// Events of the remote members' connections that turn `old` (None: the first poll) into
/// `new`: one when a role's connection word changes (or its URI: another member), and for
/// one seen the first time, unless it is up.
pub fn remote_events(old: Option<&State>, new: &State) -> Events {
    let mut ev = Vec::new();
    for (role, (uri, conn)) in &new.remotes {
        let before = old.and_then(|o| o.remotes.get(role));
        let changed = match before {
            Some((ouri, oconn)) => ouri != uri || oconn != conn,
            None => conn != "up",
        };
        if !changed {
            continue;
        }
        let event = match conn.as_str() {
            "up" => "RemoteUp",
            "reconnecting" => "RemoteReconnecting",
            _ => "RemoteLost",
        };
        ev.push((event.to_string(), Some(uri.clone())));
    }
    ev
}

/// One poll: the state now and the events since the last poll. `cursor` is the number of
/// the next event the served array will report (None: not reading a server's events).
fn poll(
    a: &MonitorArgs,
    last: Option<&State>,
    cursor: &mut Option<u64>,
) -> Result<(State, Events)> {
    let control = match &a.control {
        Some(c) => Some(c.clone()),
        None => crate::locks::find_server(&a.devices).map(|f| f.control),
    };
    let Some(c) = control else {
        *cursor = None;
        let st = State::from_superblocks(&a.devices)?;
        let ev = diff(last, &st);
        return Ok((st, ev));
    };
    let v = control::request(&c, &json!({"cmd": "detail"}))?;
    let st = State::from_detail(&v["detail"]);
    let seq = v["event_seq"].as_u64();
    if let (Some(since), Some(_), Some(_)) = (*cursor, seq, last) {
        // A server without an event log, or one whose log moved past us: diff instead.
        if let Ok(r) = control::request(&c, &json!({"cmd": "events", "since": since})) {
            if r["lost"] != true {
                *cursor = r["next"].as_u64().or(seq);
                let mut ev: Events = r["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        (
                            e["event"].as_str().unwrap_or("").to_string(),
                            e["device"].as_str().map(str::to_string),
                        )
                    })
                    .collect();
                ev.extend(remote_events(last, &st));
                return Ok((st, ev));
            }
        }
    }
    *cursor = seq;
    let mut ev = diff(last, &st);
    ev.extend(remote_events(last, &st));
    Ok((st, ev))
}

pub fn monitor(a: MonitorArgs) -> Result<()> {
    if a.devices.is_empty() && a.control.is_none() {
        bail!("give the array's members or --control PATH");
    }
    let mut last: Option<State> = None;
    let mut cursor: Option<u64> = None;
    let mut polls = 0u64;
    loop {
        match poll(&a, last.as_ref(), &mut cursor) {
            Ok((st, events)) => {
                for (event, device) in events {
                    emit(&a, &st.uuid, &event, device.as_deref());
                }
                last = Some(st);
            }
            Err(e) => {
                cursor = None;
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
            level: "raid5".into(),
            degraded: roles.iter().any(|r| r.1 != "active"),
            roles: roles
                .iter()
                .map(|r| (r.0, (r.1.into(), r.2.into(), r.3)))
                .collect(),
            spares: spares.iter().map(|s| s.to_string()).collect(),
            remotes: BTreeMap::new(),
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

    #[test]
    fn a_remote_members_connection_changes_are_events() {
        let with = |conns: &[(u64, &str, &str)]| {
            let mut s = st(&[(0, "active", "a", None), (1, "active", "b", None)], &[]);
            s.remotes = conns
                .iter()
                .map(|c| (c.0, (c.1.to_string(), c.2.to_string())))
                .collect();
            s
        };
        let up = with(&[(0, "nbd://a/", "up"), (1, "nbd://b/", "up")]);
        assert!(remote_events(None, &up).is_empty());
        let lost = with(&[(0, "nbd://a/", "up"), (1, "nbd://b/", "lost")]);
        assert_eq!(
            remote_events(None, &lost),
            [("RemoteLost".to_string(), Some("nbd://b/".to_string()))]
        );
        assert!(remote_events(Some(&lost), &lost).is_empty());
        let retrying = with(&[(0, "nbd://a/", "reconnecting"), (1, "nbd://b/", "lost")]);
        assert_eq!(
            names(remote_events(Some(&lost), &retrying)),
            ["RemoteReconnecting"]
        );
        assert_eq!(
            names(remote_events(Some(&retrying), &up)),
            ["RemoteUp", "RemoteUp"]
        );
    }

    #[test]
    fn a_raid0_is_never_reported_degraded() {
        let mut a = st(&[(0, "active", "a", None), (1, "active", "b", None)], &[]);
        a.level = "raid0".into();
        let mut b = st(&[(0, "active", "a", None), (1, "faulty", "b", None)], &[]);
        b.level = "raid0".into();
        assert_eq!(names(diff(Some(&a), &b)), ["Fail"]);
        assert_eq!(names(diff(None, &b)), ["NewArray"]);
    }

    #[test]
    fn the_event_log_numbers_events_and_says_when_some_were_lost() {
        use crate::control::server::EventLog;
        use uraid_core::{Level, MemberIdx};
        use uraid_engine::Event;
        let mut log = EventLog::default();
        let fail = Event::Fail {
            role: MemberIdx(1),
            device: "/d/b".into(),
        };
        log.record(Level::Raid0, &fail);
        log.record(Level::Raid0, &Event::DegradedArray);
        log.record(Level::Raid5, &Event::DegradedArray);
        log.record(
            Level::Raid5,
            &Event::DeviceRemoved {
                device: "/d/b".into(),
            },
        );
        let all = log.since(0);
        let got: Vec<String> = all["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| format!("{} {}", e["seq"], e["event"].as_str().unwrap()))
            .collect();
        assert_eq!(got, ["0 Fail", "1 DegradedArray", "2 DeviceDisappeared"]);
        assert_eq!(all["next"], 3);
        assert_eq!(all["lost"], false);
        assert_eq!(log.since(2)["events"].as_array().unwrap().len(), 1);
        assert_eq!(log.since(3)["events"].as_array().unwrap().len(), 0);
        for _ in 0..2000 {
            log.record(Level::Raid5, &Event::DegradedArray);
        }
        assert_eq!(log.since(0)["lost"], true);
        assert_eq!(
            log.since(log.next_seq() - 5)["events"]
                .as_array()
                .unwrap()
                .len(),
            5
        );
    }
}
