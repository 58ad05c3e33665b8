//! Rescue mode through the binary: `--overlay DIR` on assemble, read, write, detail and
//! serve leaves the members byte for byte as they were; `uraid overlay status|discard|
//! commit` say what an overlay holds, throw it away, or write it to the members.

use std::path::{Path, PathBuf};
use uraid_testkit::prelude::*;

fn fails(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        !out.status.success(),
        "{cmd:?} should have failed: {}",
        stdout(&out)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read_array(members: &[PathBuf], extra: &[&str], out: &Path) -> Vec<u8> {
    ok(uraid()
        .arg("read")
        .args(extra)
        .arg("-o")
        .arg(out)
        .args(members));
    std::fs::read(out).unwrap()
}

/// Writes, a served array with a member failed and a spare rebuilt, all through one
/// overlay: the members do not change; status and detail show what the overlay holds;
/// commit refuses without its flag, then gives the array the overlay showed.
#[test]
fn write_serve_rebuild_through_an_overlay_then_commit() {
    let dir = TempDir::new("overlay-commit");
    let members = create_array(&dir, "5", 3, 8, &[]);
    let spare = dir.path("m3.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(8 * MIB)
        .unwrap();
    let data = pattern(4 << 20, 1);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .args(["write", "--input"])
        .arg(&input)
        .args(&members));
    let all: Vec<PathBuf> = members.iter().cloned().chain([spare.clone()]).collect();
    let before = checksums(&all);
    let ov = dir.path("ov");
    let ovs = ov.to_str().unwrap();

    // A write through the overlay: read back through it, absent from the members.
    let more = pattern(1 << 20, 2);
    std::fs::write(&input, &more).unwrap();
    ok(uraid()
        .args(["write", "--overlay", ovs, "--offset", "1M", "--input"])
        .arg(&input)
        .args(&members));
    let mut want = data.clone();
    want[1 << 20..2 << 20].copy_from_slice(&more);
    let seen = read_array(&members, &["--overlay", ovs], &dir.path("o1"));
    assert!(
        seen[..want.len()] == want[..],
        "the overlay does not show the write"
    );
    let plain = read_array(&members, &["--readonly"], &dir.path("o2"));
    assert!(
        plain[..data.len()] == data[..],
        "the write reached the members"
    );
    assert_eq!(
        checksums(&all),
        before,
        "members changed by write --overlay"
    );

    // Served through the overlay: a member failed, a spare rebuilt.
    let mut srv = Served::start(&dir, &members, &["--overlay", ovs]);
    let st = stdout(&ok(uraid().args(["overlay", "status", ovs])));
    assert!(st.contains("In use : yes"), "{st}");
    let e = fails(uraid().args(["overlay", "discard", ovs]));
    assert!(e.contains("in use"), "{e}");
    let e = fails(uraid().args(["overlay", "commit", "--yes-write-members", ovs]));
    assert!(e.contains("in use"), "{e}");
    // The member locks still keep a second server off the members.
    let e = fails(
        uraid()
            .args(["serve", "--nbd"])
            .arg(format!("unix:{}", dir.path("other.sock").display()))
            .args(&members)
            .env("URAID_RUN_DIR", dir.run_dir()),
    );
    assert!(e.contains("locked") || e.contains("served by uraid"), "{e}");
    ok(srv.cmd().arg("fail").arg(&members[1]));
    ok(srv
        .cmd()
        .arg("remove")
        .arg("--array")
        .arg(&members[0])
        .arg(&members[1]));
    srv.add(&members[0], &spare);
    ok(srv.cmd().arg("wait").arg(&members[0]));
    let d = srv.detail(&members[0]);
    assert_eq!(d["degraded"], false, "{d}");
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    assert_eq!(
        checksums(&all),
        before,
        "members changed by serve --overlay"
    );

    let set = [members[0].clone(), members[2].clone(), spare.clone()];
    let d = json(&ok(uraid()
        .args(["detail", "--json", "--overlay", ovs])
        .args(&set)));
    assert_eq!(d["degraded"], false, "{d}");
    let shown = read_array(&set, &["--overlay", ovs], &dir.path("o3"));
    assert!(shown[..want.len()] == want[..], "data after the rebuild");
    assert_eq!(
        checksums(&all),
        before,
        "members changed by detail/read --overlay"
    );

    let st = json(&ok(uraid().args(["overlay", "status", "--json", ovs])));
    assert_eq!(st["state"], "active", "{st}");
    assert_eq!(st["in_use"], false, "{st}");
    assert_eq!(st["members"].as_array().unwrap().len(), 4, "{st}");
    assert!(st["command"].as_str().unwrap().contains("write"), "{st}");
    let held = |i: usize| st["members"][i]["held_bytes"].as_u64().unwrap();
    assert!((0..4).all(|i| held(i) > 0), "{st}");

    // Commit: refused without the flag, then done.
    let e = fails(uraid().args(["overlay", "commit", ovs]));
    assert!(
        e.contains("would write") && e.contains("--yes-write-members"),
        "{e}"
    );
    assert_eq!(checksums(&all), before, "commit without its flag wrote");
    ok(uraid().args(["overlay", "commit", "--yes-write-members", ovs]));
    assert!(!ov.exists(), "the overlay is left after commit");
    let committed = read_array(&set, &["--readonly"], &dir.path("o4"));
    assert!(
        committed == shown,
        "the committed members give another array"
    );
    assert!(member_states(&set).iter().all(|s| s == "clean"));
}

/// A forced assembly of members whose events disagree, through an overlay, costs nothing;
/// discard throws it away; commands that would write the members directly refuse it.
#[test]
fn forced_assembly_through_an_overlay_then_discard() {
    let dir = TempDir::new("overlay-force");
    let members = create_array(&dir, "5", 3, 8, &[]);
    let input = dir.path("in.bin");
    std::fs::write(&input, pattern(1 << 20, 3)).unwrap();
    // Member 0 missing while the array is written: its events fall behind.
    ok(uraid()
        .args(["write", "--input"])
        .arg(&input)
        .args(&members[1..]));
    let stale_set = [members[0].clone(), members[2].clone()];
    let e = fails(uraid().arg("assemble").args(&stale_set));
    assert!(e.contains("--force"), "{e}");
    let before = checksums(&members);
    let ov = dir.path("ov");
    let ovs = ov.to_str().unwrap();
    let out = ok(uraid()
        .args(["assemble", "--force", "--json", "--overlay", ovs])
        .args(&stale_set));
    let v = json(&out);
    assert!(v["assembly"].to_string().contains("ForcedActive"), "{v}");
    assert_eq!(
        checksums(&members),
        before,
        "assemble --force --overlay wrote"
    );
    // A write with the forced-in member (its events catch up, as a forced assembly that
    // only starts and stops does not do in uraid): in the overlay's view it is active now,
    // and only there.
    ok(uraid()
        .args(["write", "--force", "--overlay", ovs, "--input"])
        .arg(&input)
        .args(&stale_set));
    assert_eq!(checksums(&members), before, "write --force --overlay wrote");
    let d = json(&ok(uraid()
        .args(["detail", "--json", "--overlay", ovs])
        .args(&stale_set)));
    assert_eq!(d["degraded"], true, "{d}");
    assert!(fails(uraid().arg("assemble").args(&stale_set)).contains("--force"));

    // Another set of members is refused; so is an overlay on create.
    let other_dir = TempDir::new("overlay-other");
    let other = create_array(&other_dir, "1", 2, 4, &[]);
    let e = fails(uraid().args(["assemble", "--overlay", ovs]).args(&other));
    assert!(e.contains("other members"), "{e}");
    let e = fails(
        uraid()
            .args(["create", "-l", "1", "-n", "2", "--run", "--overlay", ovs])
            .args(&other),
    );
    assert!(e.contains("--overlay is refused"), "{e}");

    ok(uraid().args(["overlay", "discard", ovs]));
    assert!(!ov.exists());
    assert_eq!(checksums(&members), before, "discard wrote");
    let e = fails(uraid().args(["overlay", "status", ovs]));
    assert!(e.contains("no overlay"), "{e}");
}
