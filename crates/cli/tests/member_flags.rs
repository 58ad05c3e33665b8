//! md's member flags through the binary: `create --write-mostly/--failfast`, `add
//! --write-mostly --failfast`, `set --member M writemostly=1|0 failfast=1|0` on a served
//! array, and how `examine` and `detail` show them (mdadm's words, and mdadm --examine
//! reading the same "Flags" from a uraid-made member).

use std::path::{Path, PathBuf};
use uraid_testkit::prelude::*;

fn examine(m: &Path) -> String {
    stdout(&ok(uraid().arg("examine").arg(m)))
}

fn examine_json(m: &Path) -> serde_json::Value {
    json(&ok(uraid().args(["examine", "--json"]).arg(m)))
}

/// Detail's device row of `dev` (the line that ends with its file name).
fn detail_row(detail: &str, dev: &Path) -> String {
    let d = format!("/{}", dev.file_name().unwrap().to_string_lossy());
    detail
        .lines()
        .find(|l| l.ends_with(&d))
        .unwrap_or_else(|| panic!("no row for {d} in:\n{detail}"))
        .to_string()
}

fn create(dir: &TempDir, n: usize, flags: &[&str]) -> Vec<PathBuf> {
    let members = dir.images(n, 16, "m");
    ok(uraid()
        .args(["create", "-l", "1", "-n", &n.to_string()])
        .args(&members)
        .args(flags));
    members
}

#[test]
fn create_flags_show_in_examine_and_detail_as_mdadm_shows_them() {
    let dir = TempDir::new("flags-create");
    let p = |i: usize| dir.path(&format!("m{i}.img")).display().to_string();
    let m = create(
        &dir,
        3,
        &[
            "--write-mostly",
            &p(1),
            "--failfast",
            &p(1),
            "--failfast",
            &p(2),
        ],
    );
    assert_eq!(
        mdadm_field(&examine(&m[1]), "Flags").as_deref(),
        Some("write-mostly failfast")
    );
    assert_eq!(
        mdadm_field(&examine(&m[2]), "Flags").as_deref(),
        Some("failfast")
    );
    assert_eq!(mdadm_field(&examine(&m[0]), "Flags"), None);
    let j = examine_json(&m[1]);
    assert_eq!(j["write_mostly"], true);
    assert_eq!(j["failfast"], true);
    assert_eq!(examine_json(&m[0])["write_mostly"], false);

    // detail (assembled from the members): the flags in the state column, as mdadm.
    let t = stdout(&ok(uraid().arg("detail").args(&m)));
    let row = detail_row(&t, &m[1]);
    assert!(row.contains("active sync writemostly failfast"), "{row}");
    assert!(
        detail_row(&t, &m[2]).contains("active sync failfast"),
        "{t}"
    );
    assert!(!detail_row(&t, &m[0]).contains("writemostly"), "{t}");
    let d = json(&ok(uraid().args(["detail", "--json"]).args(&m)));
    assert_eq!(d["members"][1]["write_mostly"], true);
    assert_eq!(d["members"][1]["failfast"], true);
    assert_eq!(d["members"][0]["write_mostly"], false);
    assert_eq!(d["members"][2]["failfast"], true);

    // mdadm reads the same flags from the member uraid made.
    if let Some(mdadm) = tool_path("mdadm", "create_flags_show_in_examine_and_detail") {
        let out = ok(std::process::Command::new(mdadm)
            .arg("--examine")
            .arg(&m[1]));
        assert_eq!(
            mdadm_field(&stdout(&out), "Flags").as_deref(),
            Some("write-mostly failfast"),
            "{}",
            stdout(&out)
        );
    }
}

#[test]
fn create_refuses_a_flag_for_a_device_it_is_not_given() {
    let dir = TempDir::new("flags-refuse");
    let m = dir.images(2, 16, "m");
    let other = dir.image("other.img", 16);
    let mut all = m.clone();
    all.push(other.clone());
    let err = fails_cleanly(
        uraid()
            .args(["create", "-l", "1", "-n", "2"])
            .args(&m)
            .arg("--write-mostly")
            .arg(&other),
        &all,
    );
    assert!(err.contains("not one of the member devices"), "{err}");
}

#[test]
fn add_and_set_change_the_flags_of_a_served_array() {
    let dir = TempDir::new("flags-serve");
    let m = create(&dir, 2, &[]);
    let spare = dir.image("spare.img", 16);
    let srv = Served::start(&dir, &m, &[]);
    let arr = &m[0];
    ok(srv
        .cmd()
        .args(["add", "--array"])
        .arg(arr)
        .args(["--write-mostly", "--failfast"])
        .arg(&spare));
    // A spare keeps its flags in its superblock (mdadm shows them there too).
    assert_eq!(
        mdadm_field(&examine(&spare), "Flags").as_deref(),
        Some("write-mostly failfast")
    );
    let t = stdout(&ok(srv.cmd().arg("detail").arg(arr)));
    assert!(
        detail_row(&t, &spare).contains("writemostly failfast spare"),
        "{t}"
    );
    // It takes a failed member's role with them.
    ok(srv.cmd().args(["fail", "--array"]).arg(arr).arg("0"));
    let d = srv.detail(arr);
    assert!(
        d["members"][0]["device"]
            .as_str()
            .is_some_and(|s| s.ends_with("spare.img")),
        "{d}"
    );
    assert_eq!(d["members"][0]["write_mostly"], true);
    assert_eq!(d["members"][0]["failfast"], true);

    // set --member by path, then by role number with --control.
    let out = ok(srv
        .cmd()
        .args(["set", "--member"])
        .arg(&m[1])
        .arg("writemostly=1"));
    assert!(
        stdout(&out).contains("writemostly=1 failfast=0"),
        "{}",
        stdout(&out)
    );
    assert_eq!(srv.detail(arr)["members"][1]["write_mostly"], true);
    assert_eq!(
        mdadm_field(&examine(&m[1]), "Flags").as_deref(),
        Some("write-mostly")
    );
    ok(srv
        .cmd()
        .args(["set", "--control"])
        .arg(&srv.control)
        .args(["--member", "1", "failfast=1", "writemostly=0"]));
    let d = srv.detail(arr);
    assert_eq!(d["members"][1]["write_mostly"], false);
    assert_eq!(d["members"][1]["failfast"], true);
    let t = stdout(&ok(srv.cmd().arg("detail").arg(arr)));
    assert!(
        detail_row(&t, &m[1]).contains("active sync failfast"),
        "{t}"
    );

    // What is refused, and says why.
    let said = |c: &mut std::process::Command| text(&run(c).stderr);
    let e = said(
        srv.cmd()
            .args(["set", "--array"])
            .arg(arr)
            .arg("writemostly=1"),
    );
    assert!(e.contains("--member"), "{e}");
    let e = said(
        srv.cmd()
            .args(["set", "--member"])
            .arg(&m[1])
            .args(["writemostly=1", "stripe_cache_size=512"]),
    );
    assert!(e.contains("two commands"), "{e}");
    let e = said(
        srv.cmd()
            .args(["set", "--member"])
            .arg(&m[1])
            .arg("failfast=yes"),
    );
    assert!(e.contains("give 1 or 0"), "{e}");

    ok(srv.cmd().args(["stop", "--array"]).arg(arr));
    drop(srv);
    // On disk after the stop, and back after an assembly.
    assert_eq!(
        mdadm_field(&examine(&m[1]), "Flags").as_deref(),
        Some("failfast")
    );
    let d = json(&ok(uraid()
        .args(["detail", "--json"])
        .arg(&m[1])
        .arg(&spare)));
    assert_eq!(d["members"][1]["failfast"], true);
    assert_eq!(d["members"][0]["write_mostly"], true);
}
