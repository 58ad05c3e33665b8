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

/// `uraid create --write-zeroes` (mdadm's option) over used disks (NBD exports of files
/// full of random bytes, without block status): no initial sync, the array reads zeros
/// everywhere, its parity agrees (`check` compares every stripe), and the server starts
/// knowing the whole array was never written (the map create kept), which its block
/// status says. The same disks created with `--assume-clean` alone check with mismatches:
/// what makes them agree is the zeroing.
#[test]
fn create_write_zeroes_needs_no_sync_and_knows_the_array_was_never_written() {
    let name = "create_write_zeroes_needs_no_sync_and_knows_the_array_was_never_written";
    if !need_tools(&["nbdkit", "qemu-io", "nbdinfo"], name) {
        return;
    }
    let dir = TempDir::new("write-zeroes");
    let used_disks = |set: &str| -> Vec<Nbdkit> {
        (0..3)
            .map(|i| {
                let img = dir.path(&format!("{set}{i}.img"));
                let mut junk = vec![0u8; 16 << 20];
                rand::Rng::fill(
                    &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(i),
                    &mut junk[..],
                );
                std::fs::write(&img, &junk).unwrap();
                Nbdkit::start(
                    &dir,
                    &format!("{set}{i}"),
                    &["--no-sr", "file", img.to_str().unwrap()],
                )
            })
            .collect()
    };
    // `check` exits 1 on mismatches: its count either way.
    let check = |uris: &[String]| -> String {
        let out = uraid().args(["check", "-q"]).args(uris).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };

    // The control: used disks, no zeroing.
    let hosts = used_disks("c");
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    ok(uraid()
        .args(["create", "-l", "5", "-n", "3", "--assume-clean", "--run"])
        .args(&uris));
    assert_ne!(check(&uris), "mismatch_cnt: 0", "garbage parity must show");
    drop(hosts);

    let hosts = used_disks("z");
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    let paths: Vec<PathBuf> = uris.iter().map(PathBuf::from).collect();
    let out = ok(uraid()
        .args(["create", "-l", "5", "-n", "3", "--write-zeroes", "--run"])
        .args(&uris));
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        said.contains("zeroing the data area of 3 members"),
        "{said}"
    );
    let mut srv = Served::start(&dir, &paths, &[]);
    assert!(
        srv.stderr()
            .contains("known never written since the last clean stop"),
        "create keeps its map for the server: {}",
        srv.stderr()
    );
    let d = srv.detail(Path::new(&uris[0]));
    let size = d["array_bytes"].as_u64().unwrap();
    assert!(d["sync"].is_null(), "no initial sync: {d}");
    assert_eq!(d["never_written_bytes"].as_u64(), Some(size), "{d}");
    qemu_io(&srv.uri(), &[&format!("read -P 0 0 {size}")]);
    let map = zero_runs(&srv.uri());
    assert_eq!(map, vec![(0, size, true)], "block status");
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    assert_eq!(check(&uris), "mismatch_cnt: 0");
}
