//! What the command line prints and how it exits, as mdadm does: closed pipes, errors said
//! once, check's exit status, repair's summary, examine and detail lines.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use uraid_testkit::prelude::*;

/// A raid5 of four 8 MiB members with 1 MiB of data written.
fn raid5(d: &TempDir, prefix: &str) -> Vec<PathBuf> {
    let imgs = d.images(4, 8, prefix);
    ok(uraid().args(["create", "-l", "5", "-c", "16K"]).args(&imgs));
    let input = d.0.join(format!("{prefix}.bin"));
    std::fs::write(&input, byte_pattern(1 << 20, 5)).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(&imgs));
    imgs
}

/// Runs the command with its stdout a pipe whose reading end is closed at once.
fn into_closed_pipe(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run uraid");
    drop(child.stdout.take());
    child.wait_with_output().expect("wait for uraid")
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let d = TempDir::new("pipe");
    let imgs = raid5(&d, "a");
    let cmds: Vec<Vec<std::ffi::OsString>> = vec![
        std::iter::once("detail".into())
            .chain(imgs.iter().map(|p| p.into()))
            .collect(),
        vec!["examine".into(), imgs[0].clone().into()],
        std::iter::once("read".into())
            .chain(imgs.iter().map(|p| p.into()))
            .collect(),
    ];
    for args in cmds {
        let out = into_closed_pipe(uraid().args(&args));
        let err = text(&out.stderr);
        // Quiet: no panic (exit 101), no error message; ended by SIGPIPE as cat would be,
        // or done before it noticed.
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?}, stderr: {err}",
            out.status
        );
        assert!(err.is_empty(), "{args:?} printed on stderr: {err}");
    }
}

/// `uraid serve ... | head -1`: the server's stdout closes under it; it goes on serving
/// (its banner is lost, nothing panics) and still stops cleanly on request.
#[test]
fn a_server_whose_stdout_closes_keeps_serving() {
    let d = TempDir::new("servepipe");
    let imgs = raid5(&d, "s");
    let control = d.0.join("ctl.sock");
    let sock = d.0.join("nbd.sock");
    let mut child = uraid()
        .arg("serve")
        .arg("--nbd")
        .arg(format!("unix:{}", sock.display()))
        .arg("--control")
        .arg(&control)
        .args(&imgs)
        .env("URAID_RUN_DIR", d.0.join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader went away before the banner was written
    let start = std::time::Instant::now();
    while !control.exists() {
        // A hang bound, not a timing assertion.
        assert!(
            start.elapsed().as_secs() < 60,
            "serve never made its control socket"
        );
        if let Some(st) = child.try_wait().unwrap() {
            panic!("serve exited early: {st:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = ok(uraid()
        .args(["detail", "--json", "--control"])
        .arg(&control));
    assert!(
        text(&out.stdout).contains("\"level\""),
        "{}",
        text(&out.stdout)
    );
    ok(uraid().args(["stop", "--control"]).arg(&control));
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn errors_are_said_once() {
    let d = TempDir::new("once");
    let missing = d.0.join("nope.img");
    let out = uraid().arg("examine").arg(&missing).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr),
        format!(
            "uraid: cannot open member {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
    // A file with no superblock: said once, not again as a summary.
    let blank = d.images(1, 8, "blank");
    let out = uraid().arg("examine").args(&blank).output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no md superblock"), "{err}");
    // A corrupt superblock: the member, then the reason, once.
    let imgs = raid5(&d, "a");
    write_at(&imgs[1], 4096 + 40, b"X");
    let out = uraid().arg("read").args(&imgs).output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.matches("checksum mismatch").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn check_fails_on_mismatches_and_repair_says_what_it_did() {
    let d = TempDir::new("check");
    let imgs = raid5(&d, "a");
    let out = ok(uraid().args(["check", "-q"]).args(&imgs));
    assert_eq!(text(&out.stdout), "mismatch_cnt: 0\n");
    // One data block changed behind the array's back (data starts at 1 MiB).
    write_at(&imgs[1], (1 << 20) + 512, &[0x5a; 512]);
    let out = uraid().args(["check", "-q"]).args(&imgs).output().unwrap();
    assert!(!out.status.success(), "check with a mismatch exited 0");
    let stdout = text(&out.stdout);
    let n: u64 = stdout
        .trim()
        .strip_prefix("mismatch_cnt: ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no mismatch_cnt in {stdout:?}"));
    assert!(n > 0, "{stdout}");
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{n} mismatched sectors")), "{err}");
    let out = ok(uraid().args(["repair", "-q"]).args(&imgs));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{n} mismatched sectors fixed"))
            && err.contains("parity was rewritten to be consistent with the data"),
        "{err}"
    );
    let out = ok(uraid().args(["check", "-q"]).args(&imgs));
    assert_eq!(text(&out.stdout), "mismatch_cnt: 0\n");
    let out = ok(uraid().args(["repair", "-q"]).args(&imgs));
    assert!(text(&out.stderr).contains("nothing to fix"));
}

fn mdadm() -> Option<PathBuf> {
    tool_path("mdadm", "output: mdadm comparison")
}

/// Every line of `uraid examine` is the line `mdadm --examine` prints for the same member:
/// sizes in MiB/GiB/TiB or none, Unused Space, Bad Block Log, "(local to host ...)",
/// raid0 without a layout, a journal's role, a bitmap.
#[test]
fn examine_prints_what_mdadm_prints() {
    let Some(md) = mdadm() else { return };
    let d = TempDir::new("examine");
    let mut members = Vec::new();
    let small = d.images(3, 4, "s");
    ok(uraid().args(["create", "-l", "0"]).args(&small));
    members.push(small[0].clone());
    let r4 = d.images(3, 16, "p");
    ok(uraid().args(["create", "-l", "4"]).args(&r4));
    members.push(r4[2].clone());
    let mirror = d.images(2, 3 << 10, "g");
    ok(uraid()
        .args(["create", "-l", "1", "--bitmap", "internal"])
        .args(&mirror));
    members.push(mirror[1].clone());
    let big = d.images(2, 3 << 20, "t");
    ok(uraid()
        .args(["create", "-l", "10", "--assume-clean"])
        .args(&big));
    members.push(big[0].clone());
    let e = d.images(5, 64, "e");
    ok(uraid()
        .args(["create", "-l", "5", "--write-journal"])
        .arg(&e[4])
        .args(&e[..4]));
    members.extend([e[0].clone(), e[4].clone()]);
    for m in &members {
        let mine = ok(uraid().arg("examine").arg(m));
        let theirs = ok(Command::new(&md).arg("--examine").arg(m));
        assert_eq!(
            text(&mine.stdout),
            text(&theirs.stdout),
            "uraid examine and mdadm --examine differ on {}",
            m.display()
        );
    }
}

/// A superblock whose checksum is wrong is printed, as mdadm prints it (with the stored and
/// the expected checksum), marked as not trusted, and examine exits non-zero.
#[test]
fn examine_prints_a_bad_checksum_superblock_and_fails() {
    let d = TempDir::new("badsum");
    let imgs = raid5(&d, "a");
    write_at(&imgs[1], 4096 + 40, b"X");
    let out = uraid().arg("examine").arg(&imgs[1]).output().unwrap();
    assert!(
        !out.status.success(),
        "examine of a bad superblock exited 0"
    );
    let shown = text(&out.stdout);
    let err = text(&out.stderr);
    assert!(
        err.contains("checksum mismatch") && err.contains("not to be trusted"),
        "{err}"
    );
    let csum = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("Checksum : "))
        .unwrap_or_else(|| panic!("no Checksum line in {shown}"));
    assert!(csum.contains(" - expected "), "{csum}");
    assert!(shown.contains("Raid Level : raid5"), "{shown}");
    assert!(shown.contains("Device Role : Active device 1"), "{shown}");
    let json_out = uraid()
        .args(["examine", "--json"])
        .arg(&imgs[1])
        .output()
        .unwrap();
    assert!(!json_out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert_eq!(v["checksum_correct"], false);
    assert_ne!(v["checksum"], v["checksum_expected"]);
    if let Some(md) = mdadm() {
        let theirs = Command::new(md)
            .arg("--examine")
            .arg(&imgs[1])
            .output()
            .unwrap();
        assert_eq!(shown, text(&theirs.stdout));
    }
}

/// detail counts the journal in Total Devices and lists it, names the consistency policy,
/// gives Used Dev Size in words, and Spare Devices.
#[test]
fn detail_counts_the_journal_and_names_the_policy() {
    let d = TempDir::new("detail");
    let e = d.images(5, 64, "e");
    ok(uraid()
        .args(["create", "-l", "5", "--write-journal"])
        .arg(&e[4])
        .args(&e[..4]));
    let t = text(&ok(uraid().arg("detail").args(&e)).stdout);
    let field = |key: &str| {
        t.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(" : ")?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {key} in:\n{t}"))
    };
    assert_eq!(field("Total Devices"), "5");
    assert_eq!(field("Working Devices"), "5");
    assert_eq!(field("Spare Devices"), "0");
    assert_eq!(field("Consistency Policy"), "journal");
    assert_eq!(field("Used Dev Size"), "63488 (62.00 MiB 65.01 MB)");
    assert_eq!(field("Array Size"), "190464 (186.00 MiB 195.04 MB)");
    let journal = e[4].display().to_string();
    assert!(
        t.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w == ["-", "-", "journal", journal.as_str()]
        }),
        "no journal row:\n{t}"
    );
}
