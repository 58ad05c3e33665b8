//! `uraid detail` of a served array as mdadm prints it while members fail, spares take
//! over, a replace completes and faulty members are removed.

use std::path::Path;
use uraid_testkit::prelude::*;

fn human(srv: &Served, member: &Path) -> String {
    stdout(&ok(srv.cmd().arg("detail").arg(member)))
}

fn field(text: &str, key: &str) -> String {
    mdadm_field(text, key).unwrap_or_else(|| panic!("no {key} in:\n{text}"))
}

/// The rows after the blank line that ends the role rows: mdadm's faulty list.
fn faulty_rows(text: &str) -> Vec<String> {
    let rows = text
        .split("    Number   RaidDevice State\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no device table in:\n{text}"));
    match rows.split_once("\n\n") {
        Some((_, tail)) => tail
            .lines()
            .filter(|l| l.contains(" faulty "))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect(),
        None => Vec::new(),
    }
}

#[test]
fn detail_names_spares_and_faulty_members_until_removed() {
    let dir = TempDir::new("out-faulty");
    let members = create_array(&dir, "5", 3, 10, &[]);
    let spare = dir.image("spare.img", 10);
    let srv = Served::start(&dir, &members, &[]);
    srv.add(&members[0], &spare);
    let t = human(&srv, &members[0]);
    assert_eq!(field(&t, "Spare Devices"), "1", "{t}");
    assert_eq!(field(&t, "Total Devices"), "4", "{t}");

    // The spare takes the failed member's role; the failed one stays, faulty, until removed.
    let out = ok(srv.cmd().arg("fail").arg(&members[1]));
    // It names the member that failed, not the spare that took its role at once.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("({}) marked faulty", members[1].display())),
        "{said}"
    );
    let spare_name = spare.display().to_string();
    srv.wait_detail(&members[0], |d| {
        d["degraded"] == false && d["members"][1]["device"].as_str() == Some(&spare_name)
    });
    let t = human(&srv, &members[0]);
    let failed = members[1].display().to_string();
    assert_eq!(faulty_rows(&t), vec![format!("1 - faulty {failed}")], "{t}");
    assert_eq!(field(&t, "Failed Devices"), "1", "{t}");
    assert_eq!(field(&t, "Total Devices"), "4", "{t}");
    ok(srv
        .cmd()
        .arg("remove")
        .arg("--control")
        .arg(&srv.control)
        .arg(&members[1]));
    let t = human(&srv, &members[0]);
    assert!(faulty_rows(&t).is_empty(), "{t}");
    assert_eq!(field(&t, "Failed Devices"), "0", "{t}");
    assert_eq!(field(&t, "Total Devices"), "3", "{t}");

    // No spare left: the role shows "removed" and the member is listed as faulty.
    ok(srv.cmd().arg("fail").arg(&members[2]));
    let t = human(&srv, &members[0]);
    assert!(field(&t, "State").contains("degraded"), "{t}");
    assert!(t.contains("\n         -            2 removed\n"), "{t}");
    let failed = members[2].display().to_string();
    assert_eq!(faulty_rows(&t), vec![format!("2 - faulty {failed}")], "{t}");
    ok(srv.cmd().arg("stop").arg(&members[0]));
}

/// After a replace the old member is shown faulty until it is removed (md marks it faulty
/// when the replacement takes over).
#[test]
fn the_old_member_after_a_replace_is_faulty_until_removed() {
    let dir = TempDir::new("out-replace");
    let members = create_array(&dir, "5", 3, 10, &[]);
    let new = dir.image("new.img", 10);
    let srv = Served::start(&dir, &members, &[]);
    ok(srv
        .cmd()
        .args(["replace", "--member"])
        .arg(&members[2])
        .arg("--with")
        .arg(&new));
    let new_name = new.display().to_string();
    srv.wait_detail(&members[0], |d| {
        d["members"][2]["device"].as_str() == Some(&new_name)
            && d["members"][2]["replacement"].is_null()
    });
    let t = human(&srv, &members[0]);
    let old = members[2].display().to_string();
    assert_eq!(faulty_rows(&t), vec![format!("2 - faulty {old}")], "{t}");
    ok(srv
        .cmd()
        .arg("remove")
        .arg("--control")
        .arg(&srv.control)
        .arg(&members[2]));
    let t = human(&srv, &members[0]);
    assert!(faulty_rows(&t).is_empty(), "{t}");
    ok(srv.cmd().arg("stop").arg(&members[0]));
}

/// One spelling across the commands that act on a running array: the array is `--array`
/// (any member path), `--control`, or a member path; the member acted on is `--member`.
/// The old spellings still work.
#[test]
fn the_array_and_the_member_are_named_the_same_way_everywhere() {
    let dir = TempDir::new("out-flags");
    let members = create_array(&dir, "5", 3, 10, &[]);
    let extra: Vec<_> = ["a.img", "b.img"]
        .iter()
        .map(|n| dir.image(n, 10))
        .collect();
    let srv = Served::start(&dir, &members, &[]);
    let arr = &members[0];
    let with_array = |sub: &str| {
        let mut c = srv.cmd();
        c.arg(sub).arg("--array").arg(arr);
        c
    };
    let d = json(&ok(with_array("detail").arg("--json")));
    assert_eq!(d["raid_disks"], 3);
    let out = ok(with_array("add").arg("--member").arg(&extra[0]));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.ends_with("a.img added as a spare\n"), "{said}");
    assert_eq!(srv.detail(arr)["spares"].as_array().unwrap().len(), 1);
    ok(with_array("fail").args(["--member", "1"]));
    ok(with_array("remove").arg("--member").arg(&members[1]));
    assert!(srv.detail(arr)["faulty"].as_array().unwrap().is_empty());
    ok(with_array("add").arg(&extra[1]));
    let t = stdout(&ok(&mut with_array("set")));
    assert!(t.contains("stripe_cache_size = "), "{t}");
    let t = stdout(&ok(srv.cmd().args(["set", "--member"]).arg(arr)));
    assert!(t.contains("stripe_cache_size = "), "{t}");
    ok(with_array("replace").args(["--member", "2"]));
    // A role number without the array is refused with what to give.
    let out = srv.cmd().args(["fail", "--member", "0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--array MEMBER"));
    ok(&mut with_array("stop"));
}

/// `journal-mode e0.img` names the array (and prints its mode); a mode is a mode, given
/// as the argument or as --mode; anything else is refused with what was expected.
#[test]
fn journal_mode_takes_a_member_path_and_a_mode() {
    let dir = TempDir::new("out-jmode");
    let mut paths = Vec::new();
    for n in ["e0", "e1", "e2", "e3", "j"] {
        paths.push(dir.image(&format!("{n}.img"), 32));
    }
    ok(uraid()
        .args(["create", "-l", "5", "--write-journal"])
        .arg(&paths[4])
        .args(&paths[..4]));
    let srv = Served::start(&dir, &paths, &[]);
    let e0 = &paths[0];
    let mode = |out: std::process::Output| stdout(&out).trim().to_string();
    assert_eq!(
        mode(ok(srv.cmd().arg("journal-mode").arg(e0))),
        "write-through"
    );
    ok(srv.cmd().arg("journal-mode").arg(e0).arg("write-back"));
    assert_eq!(
        mode(ok(srv.cmd().args(["journal-mode", "--array"]).arg(e0))),
        "write-back"
    );
    ok(srv
        .cmd()
        .args(["journal-mode", "--mode", "write-through", "--array"])
        .arg(e0));
    assert_eq!(
        mode(ok(srv.cmd().arg("journal-mode").arg(e0))),
        "write-through"
    );
    let out = srv
        .cmd()
        .args(["journal-mode", "--array"])
        .arg(e0)
        .arg("write-sideways")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("neither a journal mode"), "{err}");
    ok(srv.cmd().arg("stop").arg(e0));
}
