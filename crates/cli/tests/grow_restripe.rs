//! `uraid grow` restriping a raid5 offline (md's reshape with the data offset moving):
//! 3 -> 4 devices with --add, and a chunk change stopped mid-way (`--stop-at`), examined by
//! mdadm as a reshape in progress, then finished with `uraid grow --continue`. The bytes
//! read back, the grown part reads zeros, and md's check finds no mismatch.

use std::path::{Path, PathBuf};
use uraid_testkit::prelude::*;

fn fill(d: &TempDir, members: &[PathBuf], len: usize) -> Vec<u8> {
    let data = byte_pattern(len, 11);
    let input = d.path("fill.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(members));
    data
}

fn read_all(members: &[PathBuf]) -> Vec<u8> {
    ok(uraid().arg("read").args(members)).stdout
}

fn check_clean(members: &[PathBuf]) {
    let out = ok(uraid().args(["check", "-q"]).args(members));
    assert!(
        text(&out.stdout).contains("mismatch_cnt: 0"),
        "{}",
        text(&out.stdout)
    );
}

fn examine(md: &Path, member: &Path) -> String {
    let out = run(std::process::Command::new(md)
        .args(["--examine"])
        .arg(member));
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn raid5_grows_from_three_to_four_devices_offline() {
    let d = TempDir::new("rs-grow");
    let imgs = d.images(3, 12, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "64K", "--assume-clean"])
        .args(&imgs));
    let size_before = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)))["array_bytes"]
        .as_u64()
        .unwrap();
    let data = fill(&d, &imgs, size_before as usize);
    let new = d.image("m3.img", 12);
    let out = ok(uraid()
        .args(["grow", "-q", "--raid-devices", "4", "--add"])
        .arg(&new)
        .arg("--")
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(
        err.contains("3 -> 4 devices") && err.contains("finished"),
        "{err}"
    );
    let all = [imgs.clone(), vec![new.clone()]].concat();
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&all)));
    assert_eq!(det["raid_disks"], 4, "{det}");
    assert_eq!(det["degraded"], false, "{det}");
    let size_after = det["array_bytes"].as_u64().unwrap();
    assert_eq!(size_after, size_before / 2 * 3, "{det}");
    let got = read_all(&all);
    assert_eq!(got.len() as u64, size_after);
    assert!(got[..data.len()] == data[..], "the old bytes moved");
    assert!(
        got[data.len()..].iter().all(|&b| b == 0),
        "the grown part reads zeros"
    );
    check_clean(&all);
}

#[test]
fn a_chunk_change_stopped_mid_way_is_a_reshape_mdadm_sees_and_continues() {
    let d = TempDir::new("rs-chunk");
    let imgs = d.images(4, 12, "m");
    ok(uraid()
        .args(["create", "-l", "5", "-c", "64K", "--assume-clean"])
        .args(&imgs));
    let data = fill(&d, &imgs, 16 << 20);
    let out = ok(uraid()
        .args(["grow", "-q", "--chunk", "32K", "--stop-at", "8192"])
        .args(&imgs));
    let err = text(&out.stderr);
    assert!(err.contains("stopped at array sector"), "{err}");
    assert!(err.contains("grow --continue"), "{err}");
    // mdadm reads it as md's own reshape in progress.
    if let Some(md) = tool_path(
        "mdadm",
        "a_chunk_change_stopped_mid_way_is_a_reshape_mdadm_sees_and_continues",
    ) {
        let ex = examine(&md, &imgs[0]);
        let pos = mdadm_field(&ex, "Reshape pos'n").unwrap_or_else(|| panic!("{ex}"));
        // mdadm prints the position in KiB.
        let kib: u64 = pos.split_whitespace().next().unwrap().parse().unwrap();
        assert!(kib * 2 >= 8192, "{ex}");
        assert_eq!(
            mdadm_field(&ex, "New Chunksize").as_deref(),
            Some("32K"),
            "{ex}"
        );
        assert!(ex.contains("New Offset"), "{ex}");
    }
    // Mid-way, the same bytes; a write lands, and the reshape carries it along.
    let mid = read_all(&imgs);
    assert!(mid[..data.len()] == data[..]);
    let input = d.path("x.bin");
    std::fs::write(&input, [1u8; 4096]).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(&imgs));
    let mut data = data;
    data[..4096].fill(1);
    let out = ok(uraid().args(["grow", "-q", "--continue"]).args(&imgs));
    assert!(
        text(&out.stderr).contains("finished"),
        "{}",
        text(&out.stderr)
    );
    let det = json(&ok(uraid().args(["detail", "--json"]).args(&imgs)));
    assert_eq!(det["chunk_bytes"], 32 * 1024, "{det}");
    assert!(read_all(&imgs)[..data.len()] == data[..]);
    check_clean(&imgs);
    if let Some(md) = tool_path(
        "mdadm",
        "a_chunk_change_stopped_mid_way_is_a_reshape_mdadm_sees_and_continues",
    ) {
        let ex = examine(&md, &imgs[0]);
        assert!(mdadm_field(&ex, "Reshape pos'n").is_none(), "{ex}");
        assert_eq!(
            mdadm_field(&ex, "Chunk Size").as_deref(),
            Some("32K"),
            "{ex}"
        );
    }
}

#[test]
fn continue_on_an_array_not_mid_reshape_says_so() {
    let d = TempDir::new("rs-none");
    let imgs = d.images(3, 8, "m");
    ok(uraid()
        .args(["create", "-l", "5", "--assume-clean"])
        .args(&imgs));
    let mut cmd = uraid();
    let err = fails_cleanly(cmd.args(["grow", "--continue"]).args(&imgs), &imgs);
    assert!(err.contains("not in the middle of a reshape"), "{err}");
}
