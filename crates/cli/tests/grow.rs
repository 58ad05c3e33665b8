//! `uraid grow` (mdadm --grow): offline on members (raid1 more mirrors with --add, a
//! raid5 -> raid6 takeover with --add, refusals that write nothing) and on a served array
//! through its control socket (restripes routed to the reshape engine, refusals).

use std::path::PathBuf;
use uraid_testkit::prelude::*;

fn detail(members: &[PathBuf]) -> serde_json::Value {
    json(&ok(uraid().args(["detail", "--json"]).args(members)))
}

/// Write 1 MiB of a pattern at the start of the array; give it back.
fn fill(d: &TempDir, members: &[PathBuf]) -> Vec<u8> {
    let data = byte_pattern(1 << 20, 7);
    let input = d.path("fill.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(members));
    data
}

fn read_back(members: &[PathBuf], len: usize) -> Vec<u8> {
    let out = ok(uraid()
        .args(["read", "--length", &len.to_string()])
        .args(members));
    out.stdout
}

#[test]
fn raid1_grows_to_three_mirrors_with_add_offline() {
    let d = TempDir::new("grow-r1");
    let imgs = d.images(2, 8, "m");
    ok(uraid()
        .args(["create", "-l", "1", "--assume-clean"])
        .args(&imgs));
    let data = fill(&d, &imgs);
    let new = d.image("m2.img", 8);
    let out = ok(uraid()
        .args(["grow", "--raid-devices", "3", "--add"])
        .arg(&new)
        .arg("--")
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(err.contains("raid1 raid-devices 2 -> 3"), "{err}");
    let all = [imgs.clone(), vec![new.clone()]].concat();
    let det = detail(&all);
    assert_eq!(det["raid_disks"], 3);
    assert_eq!(det["degraded"], false, "{det}");
    assert_eq!(det["members"][2]["state"], "active", "{det}");
    assert_eq!(
        read_back(std::slice::from_ref(&new), data.len()),
        data,
        "the new mirror alone"
    );
    // Examine says what mdadm says: 3 raid devices, the new member's role 2.
    let ex = json(&ok(uraid().args(["examine", "--json"]).arg(&new)));
    assert_eq!(ex["raid_disks"], 3, "{ex}");
    assert_eq!(ex["role_number"], 2, "{ex}");
}

#[test]
fn raid5_takes_over_as_raid6_and_recovers_q_offline() {
    let d = TempDir::new("grow-r56");
    let imgs = d.images(3, 8, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "16K", "--assume-clean"])
        .args(&imgs));
    let data = fill(&d, &imgs);
    let q = d.image("q.img", 8);
    let out = ok(uraid()
        .args(["grow", "-l", "6", "-a"])
        .arg(&q)
        .arg("--")
        .args(&imgs));
    assert!(
        text(&out.stderr).contains("left-symmetric-6"),
        "{}",
        text(&out.stderr)
    );
    let all = [imgs.clone(), vec![q.clone()]].concat();
    let det = detail(&all);
    assert_eq!(det["level"], "raid6");
    assert_eq!(det["layout"], "left-symmetric-6");
    assert_eq!(det["raid_disks"], 4);
    assert_eq!(det["degraded"], false, "{det}");
    ok(uraid().arg("check").args(&all));
    // Q holds: two of the old members away, the data still reads.
    assert_eq!(read_back(&[imgs[0].clone(), q], data.len()), data);
}

#[test]
fn refusals_name_the_reason_and_write_nothing() {
    let d = TempDir::new("grow-refuse");
    let imgs = d.images(3, 8, "m");
    ok(uraid()
        .args(["create", "-l", "1", "--assume-clean"])
        .args(&imgs));
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "-n", "2"]).args(&imgs), &imgs);
    assert!(err.contains("3 active members"), "{err}");
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "--level", "5"]).args(&imgs), &imgs);
    assert!(err.contains("only with 2 devices"), "{err}");
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "--size", "lots"]).args(&imgs), &imgs);
    assert!(err.contains("--size \"lots\""), "{err}");
    assert_eq!(err.matches("lots").count(), 1, "said once: {err}");
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "--size", "1G"]).args(&imgs), &imgs);
    assert!(err.contains("beyond the members"), "{err}");
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.arg("grow").args(&imgs), &imgs);
    assert!(err.contains("nothing to change"), "{err}");
}

#[test]
fn a_served_array_routes_restripes_to_the_reshape_engine() {
    let d = TempDir::new("grow-served");
    let imgs = create_array(&d, "5", 3, 16, &[]);
    let srv = Served::start(&d, &imgs, &[]);
    // A restripe reaches start_reshape, which names the way to reshape it served.
    let out = run(srv
        .cmd()
        .args(["grow", "--raid-devices", "4", "--array"])
        .arg(&imgs[0]));
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("raid_disks: Some(4)") && err.contains("--stop-at 0"),
        "{err}"
    );
    // So does a layout change, named in the level's words.
    let out = run(srv
        .cmd()
        .args(["grow", "--layout", "right-asymmetric", "--control"])
        .arg(&srv.control));
    let err = text(&out.stderr);
    assert!(err.contains("layout: Some(1)"), "{err}");
    // A takeover on the running array is refused before anything is written.
    let out = run(srv.cmd().args(["grow", "-l", "6", "--array"]).arg(&imgs[0]));
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("on a served array"), "{err}");
    let det = srv.detail(&imgs[0]);
    assert_eq!(det["level"], "raid5");
    assert_eq!(det["raid_disks"], 3);
}
