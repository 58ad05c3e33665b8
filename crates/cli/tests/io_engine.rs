//! `detail` shows the IO engine each member runs on: chosen per member by default (sync on
//! tmpfs, io_uring for O_DIRECT files), forced for all by `--io-engine`.

use std::path::{Path, PathBuf};
use uraid_testkit::prelude::*;

const TEST: &str = "detail_shows_each_members_io_engine";

/// A sparse 8 MiB file.
fn image(p: PathBuf) -> PathBuf {
    std::fs::File::create(&p).unwrap().set_len(8 << 20).unwrap();
    p
}

fn engines(imgs: &[PathBuf], args: &[&str]) -> (String, Vec<String>) {
    let human = stdout(&ok(uraid().args(args).arg("detail").args(imgs)));
    let j = json(&ok(uraid()
        .args(args)
        .args(["detail", "--json"])
        .args(imgs)));
    let per_member = j["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["io_engine"].as_str().unwrap_or("-").to_string())
        .collect();
    let line = mdadm_field(&human, "IO Engine").unwrap_or_default();
    (line, per_member)
}

#[test]
fn detail_shows_each_members_io_engine() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        skip(TEST, "no /dev/shm (tmpfs) here");
        return;
    }
    let shm_dir = shm.join(format!("uraid-io-engine-{}", std::process::id()));
    std::fs::create_dir_all(&shm_dir).unwrap();
    let d = TempDir::new("io-engine");
    let on_tmpfs = image(shm_dir.join("t0.img"));
    let on_disk = image(d.path("d1.img"));
    let imgs = vec![on_tmpfs.clone(), on_disk.clone()];
    ok(uraid().args(["create", "-l", "1"]).args(&imgs));

    let (line, per_member) = engines(&imgs, &[]);
    assert_eq!(per_member[0], "sync", "a tmpfs member: {line}");
    if per_member[1] == "io_uring" {
        let want = format!(
            "sync ({}), io_uring ({})",
            on_tmpfs.display(),
            on_disk.display()
        );
        assert_eq!(line, want);
    } else {
        // /tmp on tmpfs, or a file system without O_DIRECT: both are sync.
        assert_eq!(per_member[1], "sync");
        assert_eq!(line, "sync");
        uraid_testkit::skip_not_applicable(
            TEST,
            "the temp dir refuses O_DIRECT: no io_uring member",
        );
    }
    for (arg, name) in [("uring", "io_uring"), ("sync", "sync")] {
        let (line, per_member) = engines(&imgs, &["--io-engine", arg]);
        assert_eq!(line, name, "--io-engine {arg}");
        assert_eq!(per_member, [name, name], "--io-engine {arg}");
    }
    std::fs::remove_dir_all(&shm_dir).unwrap();
}
