//! `uraid status`: every array served on this host, in /proc/mdstat's form (md's
//! md_seq_show and the personalities' status lines), or as JSON; `--watch` reprints it.
//!
//! The servers are found through their index files in the run dir ([`crate::locks`]); each
//! is asked for its detail over its control socket. A server that does not answer (it is
//! just stopping) is left out. The rendering is pure: [`mdstat`] over the details.

use crate::locks;
use anyhow::Result;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;

#[derive(Args)]
pub struct StatusArgs {
    /// Print JSON: the same as objects.
    #[arg(long)]
    pub json: bool,
    /// Reprint every SECS seconds (default 2) until interrupted.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
    pub watch: Option<f64>,
}

/// Details of the live servers in the run dir, ordered by array name then UUID.
pub fn served_details() -> Vec<Value> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(locks::run_dir()) else {
        return out;
    };
    for e in dir.flatten() {
        let p = e.path();
        let hidden = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden || p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let Some(v) = std::fs::read_to_string(&p)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        else {
            continue;
        };
        let pid = v["pid"].as_u64().unwrap_or(0) as u32;
        let Some(control) = v["control"].as_str() else {
            continue;
        };
        if !locks::pid_alive(pid) {
            continue;
        }
        let req = json!({"cmd": "detail"});
        if let Ok(r) = crate::control::request(std::path::Path::new(control), &req) {
            out.push(r["detail"].clone());
        }
    }
    out.sort_by_key(|d| {
        (
            d["name"].as_str().unwrap_or("").to_string(),
            d["uuid"].as_str().unwrap_or("").to_string(),
        )
    });
    out
}

/// md device names: an array named `N` or `mdN` is mdN; the others get md127, md126, ...
/// in order, as mdadm numbers arrays that have only a name.
pub fn md_names(details: &[Value]) -> Vec<String> {
    let short = |d: &Value| {
        let n = d["name"].as_str().unwrap_or("");
        n.rsplit_once(':').map_or(n, |(_, s)| s).to_string()
    };
    let numbered = |s: &str| -> Option<u32> { s.strip_prefix("md").unwrap_or(s).parse().ok() };
    let mut taken: Vec<u32> = details.iter().filter_map(|d| numbered(&short(d))).collect();
    let mut next = 127u32;
    details
        .iter()
        .map(|d| match numbered(&short(d)) {
            Some(n) => format!("md{n}"),
            None => {
                while taken.contains(&next) && next > 0 {
                    next -= 1;
                }
                taken.push(next);
                format!("md{next}")
            }
        })
        .collect()
}

/// md's personality names, in the order its modules register them.
const PERSONALITIES: [&str; 6] = ["raid0", "raid1", "raid10", "raid6", "raid5", "raid4"];

fn file_name(dev: &str) -> String {
    std::path::Path::new(dev)
        .file_name()
        .map_or(dev.to_string(), |n| n.to_string_lossy().into_owned())
}

/// One device of the array line: its name, md's desc_nr and flags.
struct Dev {
    name: String,
    number: u64,
    flags: &'static str,
}

fn devices(d: &Value) -> Vec<Dev> {
    let mut out = Vec::new();
    let empty = Vec::new();
    let members = d["members"].as_array().unwrap_or(&empty);
    let mut next = members
        .iter()
        .filter_map(|m| m["dev_number"].as_u64())
        .max()
        .map_or(members.len() as u64, |n| n + 1)
        .max(members.len() as u64);
    let mut number = |given: Option<u64>| {
        given.unwrap_or_else(|| {
            next += 1;
            next - 1
        })
    };
    for m in members {
        let Some(dev) = m["device"].as_str() else {
            continue;
        };
        let flags = if m["state"] == "faulty" { "(F)" } else { "" };
        out.push(Dev {
            name: file_name(dev),
            number: number(m["dev_number"].as_u64()),
            flags,
        });
        if let Some(r) = m["replacement"]["device"].as_str() {
            out.push(Dev {
                name: file_name(r),
                number: number(None),
                flags: "(R)",
            });
        }
    }
    for (key, flags) in [("spares", "(S)"), ("faulty", "(F)")] {
        for s in d[key].as_array().unwrap_or(&empty) {
            if let Some(s) = s.as_str() {
                out.push(Dev {
                    name: file_name(s),
                    number: number(None),
                    flags,
                });
            }
        }
    }
    if let Some(j) = d["journal"]["device"].as_str() {
        let flags = if d["journal"]["state"] == "faulty" {
            "(J)(F)"
        } else {
            "(J)"
        };
        out.push(Dev {
            name: file_name(j),
            number: number(None),
            flags,
        });
    }
    // md lists the devices last bound first.
    out.sort_by_key(|d| std::cmp::Reverse(d.number));
    out
}

/// `[n/m] [UU_U]`: roles, roles in sync, one letter per role.
fn roles(d: &Value) -> String {
    let empty = Vec::new();
    let members = d["members"].as_array().unwrap_or(&empty);
    let map: String = members
        .iter()
        .map(|m| if m["state"] == "active" { 'U' } else { '_' })
        .collect();
    let up = map.chars().filter(|&c| c == 'U').count();
    format!("[{}/{up}] [{map}]", d["raid_disks"].as_u64().unwrap_or(0))
}

/// The personality's part of the blocks line (md's raid*_status).
fn personality_status(d: &Value) -> String {
    let chunk_k = d["chunk_bytes"].as_u64().unwrap_or(0) / 1024;
    let layout = d["layout_number"].as_u64().unwrap_or(0);
    let disks = d["raid_disks"].as_u64().unwrap_or(0);
    match d["level"].as_str().unwrap_or("") {
        "raid0" => format!(" {chunk_k}k chunks"),
        "raid1" => format!(" {}", roles(d)),
        "raid10" => {
            let (near, far, offset) = (layout & 0xff, (layout >> 8) & 0xff, layout & 0x10000 != 0);
            let mut s = String::new();
            if near < disks {
                s.push_str(&format!(" {chunk_k}K chunks"));
            }
            if near > 1 {
                s.push_str(&format!(" {near} near-copies"));
            }
            if far > 1 {
                let kind = if offset { "offset" } else { "far" };
                s.push_str(&format!(" {far} {kind}-copies"));
            }
            format!("{s} {}", roles(d))
        }
        level => format!(
            " level {}, {chunk_k}k chunk, algorithm {layout} {}",
            level.trim_start_matches("raid"),
            roles(d)
        ),
    }
}

/// md's progress line: `[=>....]  recovery =  8.5% (done/total) finish=0.3min
/// speed=44736K/sec`, counted in KiB of one member as md does.
fn sync_line(s: &Value) -> Option<String> {
    let total = s["total_kib"].as_u64()?;
    let done = s["done_kib"].as_u64()?.min(total);
    let per_mille = (u128::from(done) * 1000)
        .checked_div(u128::from(total))
        .unwrap_or(1000) as u64;
    let x = (per_mille / 50) as usize;
    let bar = format!("[{}>{}]", "=".repeat(x), ".".repeat(20 - x.min(20)));
    // md calls a repair a resync here.
    let action = match s["kind"].as_str().unwrap_or("") {
        "repair" => "resync",
        k => k,
    };
    let mut l = format!(
        "      {bar}  {action} ={:>3}.{}% ({done}/{total})",
        per_mille / 10,
        per_mille % 10
    );
    if let (Some(left), Some(speed)) = (s["finish_secs"].as_u64(), s["speed_kib_s"].as_u64()) {
        l.push_str(&format!(
            " finish={}.{}min speed={speed}K/sec",
            left / 60,
            (left % 60) / 6
        ));
    }
    Some(l)
}

/// /proc/mdstat's text for these details; `names` are their md device names.
pub fn mdstat(details: &[Value], names: &[String]) -> String {
    let mut o = String::from("Personalities : ");
    for p in PERSONALITIES {
        // raid4/5/6 are one module in md: all three are there or none.
        let parity = |l: &str| ["raid4", "raid5", "raid6"].contains(&l);
        let used = details.iter().any(|d| {
            let l = d["level"].as_str().unwrap_or("");
            l == p || (parity(l) && parity(p))
        });
        if used {
            o.push_str(&format!("[{p}] "));
        }
    }
    o.push('\n');
    for (d, name) in details.iter().zip(names) {
        let ro = if d["read_only"] == true {
            " (read-only)"
        } else {
            ""
        };
        o.push_str(&format!(
            "{name} : active{ro} {}",
            d["level"].as_str().unwrap_or("?")
        ));
        for dev in devices(d) {
            o.push_str(&format!(" {}[{}]{}", dev.name, dev.number, dev.flags));
        }
        o.push('\n');
        o.push_str(&format!(
            "      {} blocks super {}{}\n",
            d["array_bytes"].as_u64().unwrap_or(0) / 1024,
            d["version"].as_str().unwrap_or("1.2"),
            personality_status(d)
        ));
        if let Some(l) = sync_line(&d["sync"]) {
            o.push_str(&l);
            o.push('\n');
        }
        let b = &d["bitmap_pages"];
        if let (Some(used), Some(pages)) = (b["used"].as_u64(), b["total"].as_u64()) {
            o.push_str(&format!(
                "      bitmap: {used}/{pages} pages [{}KB], {}KB chunk\n",
                used * 4,
                b["chunk_kib"].as_u64().unwrap_or(0)
            ));
        }
        // Not in md's format (md has no remote members): one line per member on another
        // host, after md's lines.
        for (role, r) in remotes(d) {
            o.push_str(&format!(
                "      remote {role}: {}\n",
                crate::report::remote_summary(r)
            ));
        }
        o.push('\n');
    }
    o.push_str("unused devices: <none>\n");
    o
}

/// The members on other hosts: role and the `remote` object of `detail --json`.
fn remotes(d: &Value) -> Vec<(u64, &Value)> {
    d["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["remote"].is_object())
        .map(|m| (m["role"].as_u64().unwrap_or(0), &m["remote"]))
        .collect()
}

/// The same as JSON objects: per array its md name and the server's detail.
pub fn status_json(details: &[Value], names: &[String]) -> Value {
    let arrays: Vec<Value> = details
        .iter()
        .zip(names)
        .map(|(d, name)| {
            json!({
                "dev": name,
                "name": d["name"],
                "uuid": d["uuid"],
                "level": d["level"],
                "state": if d["read_only"] == true { "active (read-only)" } else { "active" },
                "version": d["version"],
                "blocks": d["array_bytes"].as_u64().unwrap_or(0) / 1024,
                "raid_disks": d["raid_disks"],
                "roles": roles(d),
                "devices": devices(d).iter().map(|x| json!({
                    "name": x.name, "number": x.number, "flags": x.flags,
                })).collect::<Vec<_>>(),
                "sync": d["sync"],
                "bitmap": d["bitmap_pages"],
                "remote": remotes(d).into_iter().map(|(role, r)| json!({
                    "role": role,
                    "uri": r["uri"],
                    "connection": r["connection"],
                    "error": r["error"],
                    "latency_us": r["latency_us"],
                    "replies": r["replies"],
                    "reconnect_attempts": r["reconnect_attempts"],
                })).collect::<Vec<_>>(),
                "control": d["serve"]["control"],
                "pid": d["serve"]["pid"],
            })
        })
        .collect();
    json!({"arrays": arrays, "unused_devices": []})
}

pub fn status(a: StatusArgs) -> Result<()> {
    loop {
        let details = served_details();
        let names = md_names(&details);
        let text = if a.json {
            let v = status_json(&details, &names);
            if a.watch.is_some() {
                format!("{v}\n")
            } else {
                format!("{}\n", serde_json::to_string_pretty(&v)?)
            }
        } else if a.watch.is_some() {
            // Home and clear, as watch(1) does.
            format!("\x1b[H\x1b[2J{}", mdstat(&details, &names))
        } else {
            mdstat(&details, &names)
        };
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
        drop(out);
        match a.watch {
            Some(secs) => std::thread::sleep(std::time::Duration::from_secs_f64(secs.max(0.1))),
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raid5_rebuilding() -> Value {
        json!({
            "name": "box:0", "uuid": "u1", "level": "raid5", "version": "1.2",
            "array_bytes": 2_095_104u64 * 1024, "raid_disks": 4, "layout_number": 2,
            "chunk_bytes": 512 * 1024,
            "members": [
                {"role": 0, "state": "active", "device": "/dev/sda1", "dev_number": 0},
                {"role": 1, "state": "active", "device": "/dev/sdb1", "dev_number": 1},
                {"role": 2, "state": "rebuilding", "device": "/dev/sdc1", "dev_number": 2},
                {"role": 3, "state": "active", "device": "/dev/sdd1", "dev_number": 3},
            ],
            "spares": [], "faulty": [],
            "sync": {"kind": "recovery", "done_kib": 89472, "total_kib": 1047552,
                     "speed_kib_s": 44736, "finish_secs": 18},
            "bitmap_pages": {"used": 0, "total": 8, "chunk_kib": 65536},
        })
    }

    /// md's own example, line for line.
    #[test]
    fn mdstat_is_mds_format() {
        let d = vec![raid5_rebuilding()];
        let names = md_names(&d);
        assert_eq!(names, ["md0"]);
        assert_eq!(
            mdstat(&d, &names),
            "Personalities : [raid6] [raid5] [raid4] \n\
             md0 : active raid5 sdd1[3] sdc1[2] sdb1[1] sda1[0]\n      \
             2095104 blocks super 1.2 level 5, 512k chunk, algorithm 2 [4/3] [UU_U]\n      \
             [=>...................]  recovery =  8.5% (89472/1047552) finish=0.3min \
             speed=44736K/sec\n      \
             bitmap: 0/8 pages [0KB], 65536KB chunk\n\
             \n\
             unused devices: <none>\n"
        );
    }

    #[test]
    fn other_levels_names_and_flags() {
        let r1 = json!({
            "name": "box:home", "level": "raid1", "version": "1.2", "array_bytes": 1024 * 1024,
            "raid_disks": 2, "chunk_bytes": 0, "read_only": true,
            "members": [
                {"role": 0, "state": "active", "device": "/img/a.img", "dev_number": 0},
                {"role": 1, "state": "faulty", "device": "/img/b.img", "dev_number": 1},
            ],
            "spares": ["/img/s.img"], "faulty": [],
        });
        let r10 = json!({
            "name": "data", "level": "raid10", "version": "1.0", "array_bytes": 4096 * 1024,
            "raid_disks": 4, "chunk_bytes": 65536, "layout_number": 0x102,
            "members": (0..4).map(|i| json!({"role": i, "state": "active",
                "device": format!("/d{i}"), "dev_number": i})).collect::<Vec<_>>(),
            "spares": [], "faulty": [],
        });
        let r0 = json!({"name": "md5", "level": "raid0", "version": "1.2",
            "array_bytes": 8192 * 1024, "raid_disks": 2, "chunk_bytes": 524288,
            "members": [{"role": 0, "state": "active", "device": "/x0", "dev_number": 0},
                        {"role": 1, "state": "active", "device": "/x1", "dev_number": 1}],
            "spares": [], "faulty": []});
        let d = vec![r1, r10, r0];
        let names = md_names(&d);
        assert_eq!(names, ["md127", "md126", "md5"]);
        let t = mdstat(&d, &names);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "Personalities : [raid0] [raid1] [raid10] ");
        assert_eq!(
            lines[1],
            "md127 : active (read-only) raid1 s.img[2](S) b.img[1](F) a.img[0]"
        );
        assert_eq!(lines[2], "      1024 blocks super 1.2 [2/1] [U_]");
        assert_eq!(lines[4], "md126 : active raid10 d3[3] d2[2] d1[1] d0[0]");
        assert_eq!(
            lines[5],
            "      4096 blocks super 1.0 64K chunks 2 near-copies [4/4] [UUUU]"
        );
        assert_eq!(lines[8], "      8192 blocks super 1.2 512k chunks");
        let j = status_json(&d, &names);
        assert_eq!(j["arrays"][0]["dev"], "md127");
        assert_eq!(j["arrays"][0]["roles"], "[2/1] [U_]");
        assert_eq!(j["arrays"][0]["devices"][0]["flags"], "(S)");
        assert_eq!(j["arrays"][2]["blocks"], 8192);
    }

    /// A member on another host gets a line after md's, and an entry in the JSON.
    #[test]
    fn remote_members_have_their_own_lines() {
        let mut d = raid5_rebuilding();
        d["members"][1]["device"] = json!("nbd://h1/e");
        d["members"][1]["remote"] = json!({"uri": "nbd://h1/e", "connection": "up",
            "latency_us": 180, "replies": 9, "reconnect_attempts": 0});
        d["members"][3]["device"] = json!("nbd://h3/e");
        d["members"][3]["state"] = json!("faulty");
        d["members"][3]["remote"] = json!({"uri": "nbd://h3/e", "connection": "lost",
            "error": "no reply", "latency_us": 200, "reconnect_attempts": 2,
            "reconnect_error": "timed out"});
        let d = vec![d];
        let t = mdstat(&d, &md_names(&d));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[5], "      remote 1: nbd://h1/e up, latency 180 us");
        assert_eq!(
            lines[6],
            "      remote 3: nbd://h3/e lost (no reply), reconnect attempts 2 (last: timed out)"
        );
        let j = status_json(&d, &md_names(&d));
        let r = &j["arrays"][0]["remote"];
        assert_eq!(r.as_array().unwrap().len(), 2, "{j}");
        assert_eq!(r[1]["role"], 3);
        assert_eq!(r[1]["connection"], "lost");
        assert_eq!(r[0]["latency_us"], 180);
    }

    #[test]
    fn the_progress_bar_at_its_ends() {
        let l = |done: u64| {
            sync_line(&json!({"kind": "check", "done_kib": done, "total_kib": 1000})).unwrap()
        };
        assert_eq!(
            l(0),
            "      [>....................]  check =  0.0% (0/1000)"
        );
        assert_eq!(
            l(1000),
            "      [====================>]  check =100.0% (1000/1000)"
        );
        assert_eq!(
            sync_line(&json!({"kind": "repair", "done_kib": 999, "total_kib": 1000})).unwrap(),
            "      [===================>.]  resync = 99.9% (999/1000)"
        );
    }
}
