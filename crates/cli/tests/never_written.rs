//! `uraid serve` keeps what an array knows was never written across a clean restart
//! (issue 18: a recovery skips what was never written when the array knows it): members
//! that cannot say where they were never written (NBD exports without structured
//! replies, hence without block status, as disks), a WRITE_ZEROES of the whole array, a
//! clean stop that saves the map in the state directory, and a restart that takes it back;
//! the export's block status says zeros where the map says never written.

use std::path::{Path, PathBuf};

use uraid_testkit::prelude::*;

#[test]
fn a_served_array_keeps_its_never_written_map_across_a_clean_restart() {
    let name = "a_served_array_keeps_its_never_written_map_across_a_clean_restart";
    if !need_tools(&["nbdkit", "qemu-io", "nbdinfo"], name) {
        return;
    }
    let dir = TempDir::new("never-written-serve");
    let hosts: Vec<Nbdkit> = ["a", "b"]
        .iter()
        .map(|n| Nbdkit::start(&dir, n, &["--no-sr", "memory", "32M"]))
        .collect();
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    let paths: Vec<PathBuf> = uris.iter().map(PathBuf::from).collect();
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&uris));

    let mut srv = Served::start(&dir, &paths, &[]);
    let d = srv.detail(Path::new(&uris[0]));
    assert_eq!(d["never_written_bytes"], 0, "members that cannot tell: {d}");
    let size = d["array_bytes"].as_u64().unwrap();
    qemu_io(
        &srv.uri(),
        &[&format!("write -z 0 {size}"), "write -P 0x5a 1M 64k"],
    );
    let known = srv.detail(Path::new(&uris[0]))["never_written_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        known >= size - 4 * MIB && known < size,
        "{known} of {size} bytes known never written after zeroing it all and writing 64 KiB"
    );
    let uuid = d["uuid"].as_str().unwrap().replace(':', "");
    let file = test_state_dir().join(format!("{uuid}.written"));
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    assert!(
        file.exists(),
        "a clean stop saves the map as {}",
        file.display()
    );

    let mut srv = Served::start(&dir, &paths, &[]);
    assert!(
        srv.stderr()
            .contains("known never written since the last clean stop"),
        "{}",
        srv.stderr()
    );
    assert!(!file.exists(), "the map is taken once");
    let d = srv.detail(Path::new(&uris[0]));
    assert_eq!(d["never_written_bytes"].as_u64(), Some(known), "{d}");
    let text = stdout(&ok(srv.cmd().arg("detail").arg(&uris[0])));
    assert!(text.contains("Never Written : "), "{text}");
    qemu_io(&srv.uri(), &["read -P 0x5a 1M 64k", "read -P 0 2M 1M"]);
    // The export's block status says zeros where the array knows it never wrote (and no
    // hole: the members cannot say what is allocated), data where it wrote.
    let map = zero_runs(&srv.uri());
    let zero: u64 = map.iter().filter(|r| r.2).map(|r| r.1).sum();
    assert!(
        zero >= size - 4 * MIB,
        "{zero} of {size} bytes zero: {map:?}"
    );
    assert!(
        map.iter()
            .all(|&(at, len, z)| !z || at + len <= MIB || at >= MIB + (64 << 10)),
        "the written 64 KiB said zeros: {map:?}"
    );
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
}

/// (offset, length, zero) runs of `nbdinfo --map`; no run is a hole.
fn zero_runs(uri: &str) -> Vec<(u64, u64, bool)> {
    let out = stdout(&ok(
        std::process::Command::new("nbdinfo").args(["--map", uri])
    ));
    out.lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let flags: u32 = w[2].parse().unwrap();
            assert_eq!(flags & 1, 0, "a hole on members that cannot say: {l}");
            (w[0].parse().unwrap(), w[1].parse().unwrap(), flags & 2 != 0)
        })
        .collect()
}
