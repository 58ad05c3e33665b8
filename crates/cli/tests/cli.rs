//! The command line end to end on image files: create/examine/read/write for every level,
//! mdadm --examine agreement, and bad input that must fail cleanly without writing.

use std::path::PathBuf;
use std::process::Command;
use uraid_testkit::prelude::*;

fn mdadm(test: &str) -> Option<PathBuf> {
    tool_path("mdadm", test)
}

const LEVELS: &[(&str, Option<&str>, usize)] = &[
    ("0", None, 3),
    ("1", None, 2),
    ("4", None, 4),
    ("5", Some("left-symmetric"), 4),
    ("5", Some("right-asymmetric"), 3),
    ("5", Some("parity-first"), 4),
    ("6", Some("left-symmetric"), 5),
    ("6", Some("right-asymmetric"), 6),
    ("10", Some("n2"), 4),
    ("10", Some("f2"), 3),
    ("10", Some("o2"), 4),
];

#[test]
fn create_write_read_examine_every_level() {
    let md = mdadm("create_write_read_examine_every_level");
    for (i, &(level, layout, n)) in LEVELS.iter().enumerate() {
        let d = TempDir::new(&format!("lvl{i}"));
        let imgs = d.images(n, 24, "d");
        let mut c = uraid();
        c.args(["create", "--level", level, "--chunk", "64K", "--name", "t"]);
        if let Some(l) = layout {
            c.args(["--layout", l]);
        }
        c.args(&imgs);
        ok(&mut c);
        let det = json_exact(&ok(uraid().arg("detail").arg("--json").args(&imgs)));
        let size = det["array_bytes"].as_u64().unwrap();
        assert!(size > 0);
        // Write a pattern over most of the array and read it back through a new assembly.
        let data = byte_pattern((size as usize).min(5 << 20) - 4096 + 123, i as u64 + 7);
        let input = d.0.join("in.bin");
        std::fs::write(&input, &data).unwrap();
        ok(uraid()
            .args(["write", "--offset", "4096", "--input"])
            .arg(&input)
            .args(&imgs));
        let out = ok(uraid()
            .args(["read", "--offset", "4096", "--length"])
            .arg(data.len().to_string())
            .args(&imgs));
        assert!(
            out.stdout == data,
            "raid{level} {layout:?}: read back differs"
        );
        // uraid examine and mdadm --examine agree on every member.
        for (role, img) in imgs.iter().enumerate() {
            let ex = json_exact(&ok(uraid().args(["examine", "--json"]).arg(img)));
            assert_eq!(ex["uuid"], det["uuid"]);
            assert_eq!(ex["role_number"].as_u64(), Some(role as u64));
            assert_eq!(ex["state"], "clean", "raid{level}: not clean after write");
            let Some(md) = &md else { continue };
            let out = Command::new(md).arg("--examine").arg(img).output().unwrap();
            assert!(
                out.status.success(),
                "mdadm --examine failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let ctx = format!("raid{level} {layout:?} member {role}:\n{text}");
            assert_eq!(
                mdadm_field(&text, "Array UUID").as_deref(),
                ex["uuid"].as_str(),
                "{ctx}"
            );
            assert_eq!(
                mdadm_field(&text, "Raid Level").as_deref(),
                ex["level"].as_str(),
                "{ctx}"
            );
            assert_eq!(
                mdadm_field(&text, "Device Role"),
                Some(format!("Active device {role}")),
                "{ctx}"
            );
            assert_eq!(
                mdadm_field(&text, "State").as_deref(),
                Some("clean"),
                "{ctx}"
            );
            assert_eq!(
                mdadm_field(&text, "Events").and_then(|e| e.parse::<u64>().ok()),
                ex["events"].as_u64(),
                "{ctx}"
            );
            if level != "1" {
                assert_eq!(
                    mdadm_field(&text, "Chunk Size").as_deref(),
                    Some("64K"),
                    "{ctx}"
                );
            }
            if !matches!(level, "0" | "1" | "4") {
                assert_eq!(
                    mdadm_field(&text, "Layout").as_deref(),
                    ex["layout"].as_str(),
                    "{ctx}"
                );
            }
        }
    }
}

/// The command fails, says `needle` on stderr (in any case), and leaves every file as it was.
fn fails_cleanly(cmd: &mut Command, files: &[PathBuf], needle: &str) {
    let err = uraid_testkit::cli::fails_cleanly(cmd, files);
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "{cmd:?}: expected {needle:?} in: {err}"
    );
}

fn create5(d: &TempDir, prefix: &str) -> Vec<PathBuf> {
    let imgs = d.images(4, 8, prefix);
    ok(uraid().args(["create", "-l", "5", "-c", "16K"]).args(&imgs));
    let data = byte_pattern(1 << 20, 3);
    let input = d.0.join(format!("{prefix}.bin"));
    std::fs::write(&input, data).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(&imgs));
    imgs
}

#[test]
fn bad_checksum_or_magic_is_refused() {
    let d = TempDir::new("csum");
    let imgs = create5(&d, "a");
    write_at(&imgs[1], 4096 + 40, b"X"); // inside set_name
    fails_cleanly(uraid().arg("read").args(&imgs), &imgs, "checksum");
    fails_cleanly(uraid().arg("examine").arg(&imgs[1]), &imgs, "checksum");
    let imgs = create5(&d, "b");
    write_at(&imgs[2], 4096, &[0, 0, 0, 0]);
    fails_cleanly(uraid().arg("detail").args(&imgs), &imgs, "magic");
}

#[test]
fn truncated_member_is_refused() {
    let d = TempDir::new("trunc");
    let imgs = create5(&d, "a");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&imgs[3])
        .unwrap();
    f.set_len(4 << 20).unwrap();
    drop(f);
    fails_cleanly(uraid().arg("read").args(&imgs), &imgs, "truncated");
    let tiny = d.images(1, 0, "tiny");
    fails_cleanly(uraid().arg("examine").args(&tiny), &tiny, "too small");
}

#[test]
fn members_of_two_arrays_are_refused() {
    let d = TempDir::new("two");
    let a = create5(&d, "a");
    let b = create5(&d, "b");
    let mixed = vec![a[0].clone(), a[1].clone(), b[2].clone(), a[3].clone()];
    let all: Vec<PathBuf> = a.iter().chain(&b).cloned().collect();
    fails_cleanly(uraid().arg("read").args(&mixed), &all, "different arrays");
}

#[test]
fn member_too_small_for_create_writes_nothing() {
    let d = TempDir::new("small");
    let mut imgs = d.images(3, 8, "a");
    let small = d.0.join("small.img");
    std::fs::File::create(&small)
        .unwrap()
        .set_len(600 * 1024)
        .unwrap();
    imgs.push(small);
    fails_cleanly(
        uraid().args(["create", "-l", "5"]).args(&imgs),
        &imgs,
        "too small",
    );
}

#[test]
fn too_many_missing_members_are_refused() {
    let d = TempDir::new("missing");
    let imgs = d.images(2, 8, "a");
    let mut c = uraid();
    c.args(["create", "-l", "5"])
        .arg(&imgs[0])
        .arg("missing")
        .arg(&imgs[1])
        .arg("missing");
    fails_cleanly(&mut c, &imgs, "missing");
    let imgs = create5(&d, "b");
    fails_cleanly(uraid().arg("read").args(&imgs[..2]), &imgs, "cannot start");
    // One missing is fine: degraded read works and matches.
    let out = ok(uraid()
        .args(["read", "--length", "1048576"])
        .args(&imgs[1..]));
    assert!(
        out.stdout == byte_pattern(1 << 20, 3),
        "degraded read differs"
    );
}

#[test]
fn stale_member_is_left_out_and_force_brings_it_back() {
    let d = TempDir::new("stale");
    let imgs = create5(&d, "a");
    // Write with member 0 absent: it becomes stale (older events).
    let data = byte_pattern(1 << 20, 99);
    let input = d.0.join("new.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .args(["write", "--input"])
        .arg(&input)
        .args(&imgs[1..]));
    let rep = json_exact(&ok(uraid().args(["assemble", "--json"]).args(&imgs)));
    assert_eq!(
        rep["degraded"], true,
        "stale member was not left out: {rep}"
    );
    let out = ok(uraid().args(["read", "--length", "1048576"]).args(&imgs));
    assert!(
        out.stdout == data,
        "read with a stale member present returned old data"
    );
}

/// The text of `--flag`'s entry in clap's help, up to the next option.
fn help_entry<'a>(help: &'a str, flag: &str) -> &'a str {
    let at = help
        .find(&format!("{flag} "))
        .unwrap_or_else(|| panic!("no {flag} in:\n{help}"));
    let rest = &help[at + flag.len()..];
    let end = rest.find("\n  -").unwrap_or(rest.len());
    &rest[..end]
}

/// scripts/bench-ablation.sh states `uraid bench`'s defaults (skip_copy is on) and varies
/// every knob away from its default, never to it.
#[test]
fn bench_ablation_script_states_the_defaults() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/bench-ablation.sh"
    );
    let script = std::fs::read_to_string(path).unwrap();
    let defaults = script
        .lines()
        .find_map(|l| l.strip_prefix("DEFAULTS=\""))
        .expect("a DEFAULTS= line")
        .trim_end_matches('"');
    let help = String::from_utf8(ok(uraid().args(["bench", "--help"])).stdout).unwrap();
    for (knob, flag) in [
        ("group_thread_cnt", "--group-thread-cnt"),
        ("rmw_level", "--rmw-level"),
        ("skip_copy", "--skip-copy"),
        ("stripe_cache_size", "--stripe-cache-size"),
    ] {
        let entry = help_entry(&help, flag);
        let default = entry
            .split("[default: ")
            .nth(1)
            .and_then(|d| d.split(']').next())
            .unwrap_or_else(|| panic!("no default for {flag}: {entry}"));
        assert!(
            defaults.contains(&format!("{knob} {default}")),
            "the script says defaults {defaults:?}; uraid bench's {knob} is {default}"
        );
        let rows: Vec<&str> = script
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with(&format!("\"{knob} ")))
            .collect();
        assert!(!rows.is_empty(), "no row varies {knob}");
        for r in rows {
            let value = r.rsplit(' ').next().unwrap().trim_end_matches('"');
            assert_ne!(value, default, "row {r} sets {knob} to its default");
        }
    }
    assert!(defaults.contains("batching on") && script.contains("|--no-batching\""));
    assert!(
        defaults.contains("skip_copy on"),
        "uraid's skip_copy default is on"
    );
}

/// mdadm's `-x/--spare-devices`: the last devices given are spares. Their superblocks say
/// so (uraid's examine and mdadm's), the array is whole without them, and a member that
/// fails is rebuilt onto one (`recover`). A spare smaller than the members, or a count
/// that does not add up, is refused before anything is written.
#[test]
fn create_with_spare_devices() {
    let test = "create_with_spare_devices";
    let d = TempDir::new("spares");
    let imgs = d.images(4, 8, "m");
    ok(uraid()
        .args([
            "create", "-l", "5", "-n", "3", "-x", "1", "-c", "16K", "--run",
        ])
        .args(&imgs));
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(&imgs[3])));
    assert_eq!(v["role"], "spare", "{v}");
    assert_eq!(v["raid_disks"], 3, "{v}");
    let d0 = json(&ok(uraid().arg("detail").arg("--json").args(&imgs)));
    assert_eq!(d0["degraded"], false, "{d0}");
    assert_eq!(d0["spares"].as_array().map(|s| s.len()), Some(1), "{d0}");
    if let Some(md) = mdadm(test) {
        let out = stdout(&ok(Command::new(&md).arg("--examine").arg(&imgs[3])));
        assert_eq!(
            mdadm_field(&out, "Device Role").as_deref(),
            Some("spare"),
            "{out}"
        );
        let out = stdout(&ok(Command::new(&md).arg("--examine").arg(&imgs[0])));
        assert_eq!(
            mdadm_field(&out, "Raid Devices").as_deref(),
            Some("3"),
            "{out}"
        );
    }
    // Data written with the members whole; member 1 lost, the spare rebuilt in its role.
    let data = byte_pattern(1 << 20, 9);
    let input = d.0.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(&imgs));
    std::fs::File::create(&imgs[1])
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let left: Vec<PathBuf> = [0, 2, 3].iter().map(|&i| imgs[i].clone()).collect();
    ok(uraid().arg("recover").args(&left));
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(&imgs[3])));
    assert_eq!(v["role_number"], 1, "the spare did not take role 1: {v}");
    let out = d.0.join("out.bin");
    ok(uraid()
        .args(["read", "--length", &(1u64 << 20).to_string(), "--output"])
        .arg(&out)
        .args([&imgs[2], &imgs[3]]));
    assert!(
        std::fs::read(&out).unwrap() == data,
        "the rebuilt spare reads wrong"
    );

    let e = d.images(3, 8, "e");
    let small = d.image("small.img", 4);
    let mut all = e.clone();
    all.push(small);
    fails_cleanly(
        uraid()
            .args(["create", "-l", "5", "-n", "3", "-x", "1", "--run"])
            .args(&all),
        &all,
        "less than the smallest member",
    );
    fails_cleanly(
        uraid()
            .args(["create", "-l", "5", "-n", "3", "-x", "1", "--run"])
            .args(&e),
        &e,
        "need 4 devices, but 3 were given",
    );
}
