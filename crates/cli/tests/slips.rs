//! Data-destroying slips the command line must catch, and commands that must not write
//! (issue 19): one file named two ways is one member; create asks before overwriting what
//! a device holds; a dirty degraded raid4/5/6 does not start without --force; reporting
//! commands leave every member byte as it was.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use uraid_testkit::prelude::*;

fn assert_unchanged(before: &[Vec<u8>], files: &[PathBuf], what: &str) {
    for (b, f) in before.iter().zip(files) {
        assert!(
            *b == std::fs::read(f).unwrap(),
            "{what} changed {}",
            f.display()
        );
    }
}

/// A raid5 of four 8 MiB members with `data` written and then left dirty, as after a
/// kill -9 of a writer (the superblocks say active, resync owed).
fn dirty_raid5(dir: &TempDir, data: &[u8]) -> Vec<PathBuf> {
    let members = create_array(dir, "5", 4, 8, &[]);
    let input = dir.path("in.bin");
    std::fs::write(&input, data).unwrap();
    ok(uraid()
        .args(["write", "--crash-after", "--input"])
        .arg(&input)
        .args(&members));
    assert!(member_states(&members).iter().all(|s| s == "active"));
    members
}

/// A raid1 with an internal bitmap, written and left dirty as [`dirty_raid5`].
fn dirty_raid1_bitmap(dir: &TempDir, data: &[u8]) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = (0..2).map(|i| dir.image(&format!("b{i}.img"), 8)).collect();
    ok(uraid()
        .args(["create", "-l", "1", "--bitmap", "internal"])
        .args(&members));
    let input = dir.path("in1.bin");
    std::fs::write(&input, data).unwrap();
    ok(uraid()
        .args(["write", "--crash-after", "--input"])
        .arg(&input)
        .args(&members));
    assert!(member_states(&members).iter().all(|s| s == "active"));
    members
}

#[test]
fn reporting_commands_write_nothing_on_a_dirty_array() {
    let dir = TempDir::new("nowrite");
    let data = pattern(1 << 20, 11);
    reporting_commands_write_nothing(&dirty_raid5(&dir, &data), &data);
    reporting_commands_write_nothing(&dirty_raid1_bitmap(&dir, &data), &data);
}

fn reporting_commands_write_nothing(members: &[PathBuf], data: &[u8]) {
    let before = snapshot(members);
    let runs: Vec<Vec<&str>> = vec![
        vec!["assemble"],
        vec!["assemble", "--json"],
        vec!["check", "--quiet"],
        vec!["check", "--json", "--quiet"],
        vec!["detail"],
        vec!["detail", "--json"],
        vec!["read", "--length", "1048576"],
        vec!["examine"],
    ];
    for args in runs {
        let out = ok(uraid().args(&args).args(members));
        if args[0] == "read" {
            assert!(out.stdout == data, "read returned other bytes");
        }
        assert_unchanged(&before, members, &args.join(" "));
    }
    // Still dirty: the resync it owes is still owed.
    assert!(member_states(members).iter().all(|s| s == "active"));
    // Commands that change data do write (and resync clears the debt).
    ok(uraid().arg("resync").args(members));
    assert!(member_states(members).iter().all(|s| s == "clean"));
}

/// Waits for a child to exit (it should refuse at once); kills it and fails if it serves.
fn exits(mut child: std::process::Child, what: &str) -> Output {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn dirty_degraded_raid5_does_not_start_without_force() {
    let dir = TempDir::new("dirtydeg");
    let data = pattern(1 << 20, 12);
    let members = dirty_raid5(&dir, &data);
    let three = &members[1..];
    let before = snapshot(&members);
    for sub in ["read", "assemble", "write", "check"] {
        let err = fails_with(uraid().arg(sub).args(three), "cannot start dirty degraded");
        assert!(err.contains("--force"), "{sub}: {err}");
        assert_eq!(
            err.matches("dirty degraded").count(),
            1,
            "said twice: {err}"
        );
    }
    let sock = dir.path("x.sock");
    let child = uraid()
        .args(["serve", "--nbd"])
        .arg(format!("unix:{}", sock.display()))
        .arg("--control")
        .arg(dir.path("ctl.sock"))
        .args(three)
        .env("URAID_RUN_DIR", dir.run_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = exits(child, "serve of a dirty degraded raid5");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot start dirty degraded"));
    assert_unchanged(&before, &members, "refused starts");
    // Reporting still works: detail describes it.
    let d = json(&ok(uraid().args(["detail", "--json"]).args(three)));
    assert_eq!(d["degraded"], true, "{d}");
    assert_unchanged(&before, &members, "detail");
    // --force starts it (the write was flushed before the crash, so it reads back).
    let out = ok(uraid()
        .args(["read", "--force", "--length", "1048576"])
        .args(three));
    assert!(out.stdout == data);
    // All four members: not degraded, it starts (and owes a resync).
    let out = ok(uraid().args(["read", "--length", "1048576"]).args(&members));
    assert!(out.stdout == data);
    // A dirty degraded mirror has no parity to disagree with: it starts.
    let dir1 = TempDir::new("dirtydeg1");
    let m = create_array(&dir1, "1", 2, 8, &[]);
    let input = dir1.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .args(["write", "--crash-after", "--input"])
        .arg(&input)
        .args(&m));
    let out = ok(uraid().args(["read", "--length", "1048576"]).arg(&m[1]));
    assert!(out.stdout == data);
}

#[test]
fn create_over_data_warns_and_refuses_without_a_terminal() {
    let dir = TempDir::new("createask");
    let data = pattern(1 << 20, 13);
    let members = create_array(&dir, "5", 4, 8, &[]);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .arg("write")
        .arg("--input")
        .arg(&input)
        .args(&members));
    let uuid = json(&ok(uraid().args(["examine", "--json"]).arg(&members[0])))["uuid"].clone();
    let before = snapshot(&members);
    let err = fails_with(
        uraid().args(["create", "-l", "1"]).args(&members[..2]),
        "appears to be part of a raid array",
    );
    assert!(err.contains("metadata=1.2 level=raid5 devices=4"), "{err}");
    assert!(err.contains("ctime="), "{err}");
    assert!(err.contains("--run"), "{err}");
    assert_unchanged(&before, &members, "refused create");

    // Other metadata versions, file systems and partition tables: one device each.
    let size = 8 * MIB;
    let magic = 0xa92b_4efcu32.to_le_bytes();
    let v090 = dir.image("v090.img", 8);
    write_at(&v090, (size & !0xffff) - 0x10000, &magic);
    let v10 = dir.image("v10.img", 8);
    write_at(&v10, ((size / 512 - 16) & !7) * 512, &magic);
    write_at(
        &v10,
        ((size / 512 - 16) & !7) * 512 + 4,
        &1u32.to_le_bytes(),
    );
    let v11 = dir.image("v11.img", 8);
    write_at(&v11, 0, &magic);
    write_at(&v11, 4, &1u32.to_le_bytes());
    let ext = dir.image("ext.img", 8);
    write_at(&ext, 1080, &[0x53, 0xef]);
    let xfs = dir.image("xfs.img", 8);
    write_at(&xfs, 0, b"XFSB");
    let btrfs = dir.image("btrfs.img", 8);
    write_at(&btrfs, 65536 + 64, b"_BHRfS_M");
    let mbr = dir.image("mbr.img", 8);
    write_at(&mbr, 510, &[0x55, 0xaa]);
    let gpt = dir.image("gpt.img", 8);
    write_at(&gpt, 510, &[0x55, 0xaa]);
    write_at(&gpt, 512, b"EFI PART");
    let blank = dir.image("blank.img", 8);
    for (dev, said) in [
        (&v090, "metadata=0.90"),
        (&v10, "metadata=1.0"),
        (&v11, "metadata=1.1"),
        (&ext, "ext2/ext3/ext4 file system"),
        (&xfs, "xfs file system"),
        (&btrfs, "btrfs file system"),
        (&mbr, "dos (MBR) partition table"),
        (&gpt, "gpt partition table"),
    ] {
        let files = vec![dev.clone(), blank.clone()];
        let was = snapshot(&files);
        fails_with(
            uraid().args(["create", "-l", "1"]).arg(dev).arg(&blank),
            said,
        );
        assert_unchanged(&was, &files, said);
    }
    // Members of different sizes (mdadm warns and asks too); raid0 uses them whole.
    let big = dir.image("big.img", 16);
    let blank2 = dir.image("blank2.img", 8);
    fails_with(
        uraid().args(["create", "-l", "1"]).arg(&blank).arg(&big),
        "differ in size",
    );
    ok(uraid()
        .args(["create", "-l", "0"])
        .arg(&blank2)
        .arg(&big)
        .stdin(Stdio::null()));
    // A journal device is looked at too.
    let a = dir.image("ja.img", 8);
    let b = dir.image("jb.img", 8);
    let c = dir.image("jc.img", 8);
    fails_with(
        uraid()
            .args(["create", "-l", "5", "--write-journal"])
            .arg(&ext)
            .args([&a, &b, &c]),
        "ext2/ext3/ext4",
    );
    // --run and --force create anyway.
    ok(uraid()
        .args(["create", "-l", "5", "--run"])
        .args(&members)
        .stdin(Stdio::null()));
    let new_uuid = json(&ok(uraid().args(["examine", "--json"]).arg(&members[0])))["uuid"].clone();
    assert_ne!(new_uuid, uuid);
    ok(uraid()
        .args(["create", "-l", "1", "-f"])
        .arg(&ext)
        .arg(&blank)
        .stdin(Stdio::null()));
}

/// On a terminal create asks; "n" (or nothing) writes nothing, "y" creates.
#[test]
fn create_over_data_asks_on_a_terminal() {
    if !need_tool("script", "create_over_data_asks_on_a_terminal") {
        // CI installs util-linux: there a missing tool is a failure, not a skip.
        assert!(std::env::var_os("CI").is_none(), "script is missing in CI");
        return;
    }
    let dir = TempDir::new("createtty");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let before = snapshot(&members);
    let cmdline = |extra: &str| {
        format!(
            "{} --io-engine sync create -l 1 {} {} {extra}",
            env!("CARGO_BIN_EXE_uraid"),
            members[0].display(),
            members[1].display()
        )
    };
    let ask = |answer: &str| -> Output {
        use std::io::Write;
        let mut child = Command::new("script")
            .args(["-q", "-e", "-c", &cmdline(""), "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = ask("n\n");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("Continue creating array?"), "{text}");
    assert!(text.contains("aborted"), "{text}");
    assert_unchanged(&before, &members, "create answered no");
    let out = ask("y\n");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("created"), "{text}");
    assert_ne!(
        snapshot(&members),
        before,
        "create answered yes wrote nothing"
    );
}

/// `uraid serve` started in `dir` on relative member paths, as the README does.
fn serve_relative(dir: &TempDir, members: &[&str]) -> Served {
    let sock = dir.path("nbd.sock");
    let control = dir.path("ctl.sock");
    let stderr_path = dir.path("serve.stderr");
    let child = uraid()
        .args(["serve", "--nbd"])
        .arg(format!("unix:{}", sock.display()))
        .arg("--control")
        .arg(&control)
        .args(members)
        .current_dir(&dir.0)
        .env("URAID_RUN_DIR", dir.run_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let (_tx, lines) = std::sync::mpsc::channel();
    let srv = Served {
        child: Some(child),
        sock,
        control,
        run_dir: dir.run_dir(),
        name: "md0".into(),
        lines,
        stderr_path,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::os::unix::net::UnixStream::connect(&srv.control).is_err() {
        assert!(Instant::now() < deadline, "serve: {}", srv.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    srv
}

#[test]
fn served_array_knows_its_members_whatever_their_names() {
    let dir = TempDir::new("identity");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let data = pattern(1 << 20, 14);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .arg("write")
        .arg("--input")
        .arg(&input)
        .args(&members));
    std::os::unix::fs::symlink(&members[1], dir.path("link.img")).unwrap();
    std::fs::hard_link(&members[1], dir.path("hard.img")).unwrap();
    let mut srv = serve_relative(&dir, &["m0.img", "m1.img"]);
    let before = snapshot(&members);
    let in_dir = |args: &[&str]| {
        let mut c = srv.cmd();
        c.args(args).current_dir(&dir.0);
        c
    };
    for other in ["m1.img", "./m1.img", "link.img", "hard.img"] {
        let err = fails_with(
            &mut in_dir(&["add", "--array", "m0.img", other]),
            "already in the array as member 1",
        );
        assert!(err.contains("nothing was changed"), "{err}");
        fails_with(
            &mut in_dir(&["replace", "--member", "m0.img", "--with", other]),
            "already in the array as member 1",
        );
    }
    // A served member is not taken as the journal of a new array either.
    let (a, b, c) = (
        dir.image("a.img", 8),
        dir.image("b.img", 8),
        dir.image("c.img", 8),
    );
    fails_with(
        in_dir(&["create", "-l", "5", "--run", "--write-journal", "m1.img"]).args([&a, &b, &c]),
        "control",
    );
    assert_unchanged(&before, &members, "refused add/replace/create");
    let d = srv.detail(&members[0]);
    assert_eq!(d["spares"].as_array().map(|s| s.len()), Some(0), "{d}");
    // A real new device is still taken, and then cannot be added a second time.
    let spare = dir.image("spare.img", 8);
    std::os::unix::fs::symlink(&spare, dir.path("spare-link.img")).unwrap();
    ok(&mut in_dir(&["add", "--array", "m0.img", "spare.img"]));
    fails_with(
        &mut in_dir(&["add", "--array", "m0.img", "spare-link.img"]),
        "already in the array as a spare",
    );
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    // Each member alone still holds every byte.
    for m in &members {
        let out = ok(uraid().args(["read", "--length", "1048576"]).arg(m));
        assert!(out.stdout == data, "{} lost its data", m.display());
    }
}

/// fail and remove find the member a path names by what it is: a hard link (or any other
/// name of the same file) acts on that member and no other.
#[test]
fn fail_and_remove_find_a_member_under_another_name() {
    let dir = TempDir::new("failhard");
    let members = create_array(&dir, "1", 3, 8, &[]);
    std::fs::hard_link(&members[1], dir.path("hard.img")).unwrap();
    let mut srv = serve_relative(&dir, &["m0.img", "m1.img", "m2.img"]);
    let in_dir = |args: &[&str]| {
        let mut c = srv.cmd();
        c.args(args).current_dir(&dir.0);
        c
    };
    ok(&mut in_dir(&[
        "fail", "--array", "m0.img", "--member", "hard.img",
    ]));
    let d = srv.detail(&members[0]);
    let states: Vec<&str> = d["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["state"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(states, ["active", "faulty", "active"], "{d}");
    ok(&mut in_dir(&[
        "remove", "--array", "m0.img", "--member", "hard.img",
    ]));
    let d = srv.detail(&members[0]);
    assert_eq!(d["members"][1]["state"], "missing", "{d}");
    assert_eq!(d["members"][0]["state"], "active", "{d}");
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
}

#[test]
fn one_file_under_two_names_is_refused_by_create_and_assemble() {
    let dir = TempDir::new("twice");
    let a = dir.image("a.img", 8);
    let b = dir.image("b.img", 8);
    std::os::unix::fs::symlink(&a, dir.path("a-link.img")).unwrap();
    let files = vec![a.clone(), b.clone()];
    let was = snapshot(&files);
    fails_with(
        uraid()
            .args(["create", "-l", "1"])
            .arg(&a)
            .arg(dir.path("a-link.img")),
        "are one device",
    );
    fails_with(
        uraid()
            .args(["create", "-l", "5", "--write-journal"])
            .arg(dir.path("a-link.img"))
            .arg(&a)
            .arg(&b)
            .arg("missing"),
        "both a member and the journal",
    );
    assert_unchanged(&was, &files, "refused create");
    ok(uraid().args(["create", "-l", "1"]).arg(&a).arg(&b));
    fails_with(
        uraid().arg("assemble").arg(&a).arg(dir.path("a-link.img")),
        "are one device",
    );
}

/// A block device is known by its major:minor, whatever node or link names it.
#[test]
fn one_block_device_under_two_names_is_refused() {
    if !need_tool("losetup", "one_block_device_under_two_names_is_refused") {
        assert!(std::env::var_os("CI").is_none(), "losetup is missing in CI");
        return;
    }
    let dir = TempDir::new("blockid");
    let file = dir.image("lo.img", 8);
    let other = dir.image("other.img", 8);
    let Some(lo) = Loop::attach_or_skip(&file, "one_block_device_under_two_names_is_refused")
    else {
        return;
    };
    let link = dir.path("lo-link");
    std::os::unix::fs::symlink(&lo.0, &link).unwrap();
    let files = vec![file.clone(), other.clone()];
    let was = snapshot(&files);
    let err = fails_with(
        uraid()
            .args(["create", "-l", "5", "--run"])
            .arg(&lo.0)
            .arg(&other)
            .arg(&link),
        "are one device",
    );
    assert!(err.contains("block device 7:"), "{err}");
    assert_unchanged(&was, &files, "refused create");
}
