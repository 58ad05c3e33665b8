//! The scanner finds members of every metadata version (issue 12): `examine --scan` prints
//! for 0.90, 1.0 and 1.1 members the ARRAY lines mdadm prints (0.90: `/dev/mdN UUID=`, no
//! name, no metadata=), and `assemble --scan` starts them from those lines.

use std::path::{Path, PathBuf};
use std::process::Command;
use uraid_testkit::prelude::*;

fn make(dir: &Path, prefix: &str, level: &str, n: usize, meta: &str) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..n)
        .map(|i| {
            let p = dir.join(format!("{prefix}{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(8 * MIB).unwrap();
            p
        })
        .collect();
    ok(uraid()
        .args(["create", "-l", level, "--chunk", "64K", "-e", meta])
        .args(["--run", "--assume-clean"])
        .args(&paths));
    paths
}

fn uuid_of(member: &Path) -> String {
    json(&ok(uraid().arg("examine").arg("--json").arg(member)))["uuid"]
        .as_str()
        .unwrap()
        .to_string()
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn examine_and_assemble_scan_find_0_90_1_0_and_1_1_members() {
    let dir = TempDir::new("scan-vers");
    let old = make(&dir.0, "o", "1", 2, "0.90");
    let end = make(&dir.0, "e", "1", 2, "1.0");
    let start = make(&dir.0, "s", "5", 3, "1.1");
    let all: Vec<PathBuf> = [&old, &end, &start]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let ours = stdout(&ok(uraid().args(["examine", "--scan"]).args(&all)));
    let lines: Vec<&str> = ours.lines().collect();
    assert_eq!(lines.len(), 3, "{ours}");
    let u090 = uuid_of(&old[0]);
    assert!(
        lines.contains(&format!("ARRAY /dev/md0 UUID={u090}").as_str()),
        "{ours}"
    );
    for (m, v) in [(&end, "1.0"), (&start, "1.1")] {
        let want = format!("metadata={v} UUID={}", uuid_of(&m[0]));
        assert!(lines.iter().any(|l| l.contains(&want)), "{want}: {ours}");
    }
    if let Some(md) = tool_path(
        "mdadm",
        "examine_and_assemble_scan_find_0_90_1_0_and_1_1_members",
    ) {
        let theirs = stdout(&ok(Command::new(md)
            .args(["--examine", "--scan"])
            .args(&all)));
        let mut theirs: Vec<Vec<String>> = theirs
            .lines()
            .filter(|l| l.starts_with("ARRAY"))
            .map(words)
            .collect();
        let mut mine: Vec<Vec<String>> = lines.iter().map(|l| words(l)).collect();
        theirs.sort();
        mine.sort();
        assert_eq!(mine, theirs, "\nours:\n{ours}");
    }
    let conf = dir.path("mdadm.conf");
    std::fs::write(&conf, format!("DEVICE {}/*.img\n{ours}", dir.0.display())).unwrap();
    let out = ok(uraid().args(["assemble", "--scan", "--config"]).arg(&conf));
    let err = text(&out.stderr);
    assert_eq!(err.matches(" assembled: ").count(), 3, "{err}");
    assert_eq!(err.matches("raid1, 2 of 2 members").count(), 2, "{err}");
    assert!(err.contains("raid5, 3 of 3 members"), "{err}");
    // The 0.90 array by its UUID alone.
    let out = ok(uraid()
        .args(["assemble", "--scan", "--config"])
        .arg(&conf)
        .arg(&u090));
    let err = text(&out.stderr);
    assert_eq!(err.matches(" assembled: ").count(), 1, "{err}");
    assert!(err.contains(&u090), "{err}");
    // An ARRAY line that says metadata=1.2 for the 0.90 array disagrees with it, by name.
    std::fs::write(
        &conf,
        format!(
            "DEVICE {}/o*.img\nARRAY /dev/md0 metadata=1.2 UUID={u090}\n",
            dir.0.display()
        ),
    )
    .unwrap();
    let out = run(uraid().args(["assemble", "--scan", "--config"]).arg(&conf));
    let err = text(&out.stderr);
    assert!(
        err.contains("metadata=1.2, the superblock is 0.90"),
        "{err}"
    );
    assert!(!err.contains(" assembled: "), "{err}");
}
