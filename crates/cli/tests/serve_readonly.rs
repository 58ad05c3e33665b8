//! `--readonly` (mdadm's -o): nothing is written to any member, not by a client that tries
//! to write over NBD, not by assemble/read/detail/check, not even the dirty flag.

use std::path::PathBuf;
use std::process::Command;
use uraid_testkit::prelude::*;

fn need(tools: &[&str], test: &str) -> bool {
    let found = need_tools(tools, test);
    assert!(
        found || std::env::var_os("CI").is_none(),
        "{test}: {tools:?} must be installed in CI"
    );
    found
}

fn array_with_data(dir: &TempDir) -> (Vec<PathBuf>, Vec<u8>) {
    let members = create_array(dir, "5", 4, 8, &[]);
    let data = pattern(2 << 20, 9);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .args(["write", "--input"])
        .arg(&input)
        .args(&members));
    (members, data)
}

#[test]
fn readonly_serve_refuses_client_writes_and_writes_nothing() {
    if !need(&["nbdinfo", "qemu-io", "nbdcopy"], "readonly_serve") {
        return;
    }
    let dir = TempDir::new("ro-serve");
    let (members, data) = array_with_data(&dir);
    let before = checksums(&members);
    let mut srv = Served::start(&dir, &members, &["--readonly"]);
    let uri = srv.uri();
    let info = json(&ok(Command::new("nbdinfo").arg("--json").arg(&uri)));
    assert_eq!(info["exports"][0]["is_read_only"], true, "{info}");
    // A client that tries to write: qemu-io (told the export is writable) and nbdcopy.
    let w = Command::new("qemu-io")
        .args(["-f", "raw"])
        .arg(&uri)
        .args(["-c", "write -P 0x5a 0 65536"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&w.stdout),
        String::from_utf8_lossy(&w.stderr)
    );
    assert!(
        !w.status.success()
            || text.to_lowercase().contains("denied")
            || text.contains("read-only")
            || text.contains("failed"),
        "qemu-io write went through: {text}"
    );
    let src = dir.path("junk.bin");
    std::fs::write(&src, pattern(1 << 20, 77)).unwrap();
    let c = Command::new("nbdcopy")
        .arg(&src)
        .arg(&uri)
        .output()
        .unwrap();
    assert!(!c.status.success(), "nbdcopy wrote to a read-only export");
    // Reads still serve the array's data.
    let out = dir.path("out.bin");
    ok(Command::new("nbdcopy").arg(&uri).arg(&out));
    let got = std::fs::read(&out).unwrap();
    assert!(
        got[..data.len()] == data[..],
        "read-only export returns other data"
    );
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "serve: {}", srv.stderr());
    assert_eq!(
        before,
        checksums(&members),
        "a read-only serve wrote to a member"
    );
}

#[test]
fn readonly_commands_write_nothing_not_even_the_dirty_flag() {
    let dir = TempDir::new("ro-cmds");
    let (members, data) = array_with_data(&dir);
    // Leave it dirty, as a crash would: a read-write assembly would write it clean.
    let input = dir.path("more.bin");
    std::fs::write(&input, &data[..65536]).unwrap();
    ok(uraid()
        .args(["write", "--crash-after", "--input"])
        .arg(&input)
        .args(&members));
    let dirty = member_states(&members);
    assert!(dirty.iter().all(|s| s == "active"), "{dirty:?}");
    let before = checksums(&members);
    ok(uraid().args(["assemble", "--readonly"]).args(&members));
    ok(uraid().args(["detail", "-o"]).args(&members));
    let out = ok(uraid()
        .args(["read", "--readonly", "--length"])
        .arg(data.len().to_string())
        .args(&members));
    assert!(out.stdout == data, "read-only read differs");
    let chk = ok(uraid().args(["check", "-o", "-q"]).args(&members));
    assert!(stdout(&chk).contains("mismatch_cnt"), "{}", stdout(&chk));
    for refused in [
        vec!["write", "-o", "--input"],
        vec!["resync", "-o"],
        vec!["repair", "-o", "-q"],
        vec!["assemble", "-o", "--resync"],
    ] {
        let mut c = uraid();
        c.args(&refused);
        if refused[0] == "write" {
            c.arg(&input);
        }
        let o = c.args(&members).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "{refused:?} succeeded on a read-only array"
        );
        assert!(err.contains("--readonly"), "{refused:?}: {err}");
    }
    assert_eq!(
        before,
        checksums(&members),
        "a --readonly command wrote to a member"
    );
    assert_eq!(member_states(&members), dirty, "the dirty flag changed");
}
