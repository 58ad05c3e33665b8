//! `uraid serve` over NBD against real clients: nbdinfo, qemu-img, qemu-io, nbdcopy and fio,
//! on raid1, raid5 and raid6 arrays of sparse files, whole and degraded. After each run the
//! server is stopped and the array is read back with `uraid read`, so what the clients wrote
//! must be on the members, not just in the server. Each suite runs with `--io-engine uring`
//! or `--io-engine sync`, so both serve real clients (the default picks per member, which on
//! a tmpfs /tmp would be sync for both).

use std::process::Command;
use uraid_testkit::prelude::*;

/// Every client against one array; returns nothing, panics with the failing step.
fn suite(tag: &str, level: &str, n: usize, missing: &[usize], sync: bool) {
    if !need_tools(&["nbdinfo", "qemu-img", "qemu-io", "nbdcopy", "fio"], tag) {
        return;
    }
    let dir = TempDir::new(tag);
    let members = create_array(&dir, level, n, 12, missing);
    let engine: &[&str] = if sync {
        &SYNC
    } else {
        &["--io-engine", "uring"]
    };
    let mut srv = Served::start(&dir, &members, engine);
    let uri = srv.uri();

    // nbdinfo: size and name agree with the array.
    let detail = srv.detail(&members[0]);
    let size = detail["array_bytes"].as_u64().unwrap();
    assert_eq!(detail["degraded"], !missing.is_empty());
    let info = json(&ok(Command::new("nbdinfo").arg("--json").arg(&uri)));
    let export = &info["exports"][0];
    assert_eq!(export["export-size"].as_u64(), Some(size), "{info}");
    assert_eq!(export["export-name"], "md0");
    assert_eq!(export["is_read_only"], false);
    assert!(detail["serve"]["nbd"].as_str().unwrap().contains("socket="));

    // qemu-img info.
    let qi = json(&ok(Command::new("qemu-img")
        .args(["info", "--output=json", "-f", "raw"])
        .arg(&uri)));
    assert_eq!(qi["virtual-size"].as_u64(), Some(size));

    // qemu-img convert in and out: the whole array.
    let image = pattern(size as usize, 1);
    let src = dir.path("in.img");
    std::fs::write(&src, &image).unwrap();
    ok(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(&uri));
    let out = dir.path("out.img");
    ok(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&uri)
        .arg(&out));
    assert!(
        std::fs::read(&out).unwrap() == image,
        "qemu-img round trip differs"
    );

    // qemu-io patterns: unaligned, across chunk boundaries, verified by qemu-io itself.
    let text = qemu_io(
        &uri,
        &[
            "write -P 0xa5 65024 70144",
            "write -P 0x3c 1048576 262144",
            "read -P 0xa5 65024 70144",
            "read -P 0x3c 1048576 262144",
            "flush",
        ],
    );
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert_eq!(text.matches("read ").count(), 2, "{text}");

    // nbdcopy in and out.
    let image2 = pattern(size as usize, 2);
    let src2 = dir.path("in2.img");
    std::fs::write(&src2, &image2).unwrap();
    ok(Command::new("nbdcopy").arg(&src2).arg(&uri));
    let out2 = dir.path("out2.img");
    ok(Command::new("nbdcopy").arg(&uri).arg(&out2));
    assert!(
        std::fs::read(&out2).unwrap() == image2,
        "nbdcopy round trip differs"
    );

    // fio randrw with crc32c verify over the first 8 MiB.
    let fio = Command::new("fio")
        .args(fio_args(&uri, 8, 7))
        .output()
        .unwrap();
    fio_check(&fio);

    // What the clients see now must be what the members hold after a clean stop.
    let final_img = dir.path("final.img");
    ok(Command::new("nbdcopy").arg(&uri).arg(&final_img));
    check_engine(&srv.detail(&members[0]), sync, tag);
    ok(srv.cmd().arg("stop").arg("--control").arg(&srv.control));
    assert!(srv.wait().success(), "server exit: {}", srv.stderr());
    assert!(member_states(&members).iter().all(|s| s == "clean"));
    let back = dir.path("back.img");
    ok(uraid().arg("read").arg("-o").arg(&back).args(&members));
    assert!(
        std::fs::read(&back).unwrap() == std::fs::read(&final_img).unwrap(),
        "the members do not hold what NBD clients saw"
    );
    // fio's verify headers survive a restart.
    let mut srv = Served::start(&dir, &members, engine);
    let out = Command::new("fio")
        .args(fio_args(&srv.uri(), 8, 7))
        .arg("--verify_only=1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fio verify after restart: {}",
        stdout(&out)
    );
    // SIGTERM stops cleanly too.
    let st = srv.signal_and_wait(libc::SIGTERM);
    assert!(st.success(), "exit after SIGTERM: {st}: {}", srv.stderr());
    assert!(member_states(&members).iter().all(|s| s == "clean"));
}

#[test]
fn raid1_clients() {
    suite("raid1", "1", 2, &[], true);
}

#[test]
fn raid1_degraded_clients() {
    suite("raid1-deg", "1", 3, &[0, 2], false);
}

#[test]
fn raid5_clients() {
    suite("raid5", "5", 4, &[], false);
}

#[test]
fn raid5_degraded_clients() {
    suite("raid5-deg", "5", 4, &[1], true);
}

#[test]
fn raid6_clients() {
    suite("raid6", "6", 5, &[], false);
}

#[test]
fn raid6_degraded_clients() {
    suite("raid6-deg", "6", 5, &[0, 3], false);
}

/// The default TCP listener is on loopback; a port of 0 picks a free one and the banner
/// says which.
#[test]
fn tcp_listener_and_banner() {
    if !need_tool("nbdinfo", "tcp_listener_and_banner") {
        return;
    }
    let dir = TempDir::new("tcp");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let control = dir.path("ctl.sock");
    let args = vec![
        "serve".to_string(),
        "--nbd".into(),
        "tcp:127.0.0.1:0".into(),
        "--control".into(),
        control.display().to_string(),
    ];
    let mut srv = Served::spawn(&dir, args, &members, dir.path("unused"), control);
    let uri = loop {
        let line = srv
            .lines
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("no banner");
        if let Some(u) = line.strip_prefix("nbd: ") {
            break u.to_string();
        }
    };
    assert!(uri.starts_with("nbd://127.0.0.1:"), "{uri}");
    let size = nbd_size(&uri);
    assert_eq!(
        size,
        srv.detail(&members[0])["array_bytes"].as_u64().unwrap()
    );
    let st = srv.signal_and_wait(libc::SIGINT);
    assert!(st.success(), "{}", srv.stderr());
}

fn member_blocks(members: &[std::path::PathBuf]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    members
        .iter()
        .map(|m| std::fs::metadata(m).unwrap().blocks())
        .sum()
}

/// qemu-io's discard and write -z reach the members of a raid5 of sparse files: their blocks
/// go (or stay, for write -z without -u: NBD_CMD_FLAG_NO_HOLE), the array reads zeros, and
/// check finds no mismatch. nbdinfo sees fast zeroing advertised.
#[test]
fn trim_and_write_zeroes_reach_the_member_files() {
    if !need_tools(&["nbdinfo", "qemu-io", "qemu-img"], "trim_and_write_zeroes") {
        return;
    }
    let dir = TempDir::new("trim");
    let members = create_array(&dir, "5", 4, 12, &[]);
    let mut srv = Served::start(&dir, &members, &[]);
    let uri = srv.uri();
    let size = srv.detail(&members[0])["array_bytes"].as_u64().unwrap();
    let info = json(&ok(Command::new("nbdinfo").arg("--json").arg(&uri)));
    assert_eq!(info["exports"][0]["can_fast_zero"], true, "{info}");
    assert_eq!(info["exports"][0]["can_trim"], true, "{info}");

    let src = dir.path("in.img");
    std::fs::write(&src, pattern(size as usize, 3)).unwrap();
    ok(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(&uri));
    let qio = |cmds: &[String]| {
        let text = qemu_io(&uri, &cmds.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!text.contains("Pattern verification failed"), "{text}");
        assert!(!text.contains("failed"), "{cmds:?}: {text}");
    };
    qio(&["flush".into()]);
    let full = member_blocks(&members);
    let data_blocks = size / 512;
    assert!(
        full > data_blocks,
        "{full} blocks for {data_blocks} data sectors"
    );

    // Discard everything: the blocks go and the array reads zeros.
    qio(&[format!("discard 0 {size}"), "flush".into()]);
    let trimmed = member_blocks(&members);
    assert!(
        full - trimmed >= data_blocks,
        "discard freed {} of {full} blocks",
        full - trimmed
    );
    qio(&[format!("read -P 0 0 {size}")]);

    // write -z keeps the blocks (NO_HOLE); write -z -u frees them. A range that is not
    // whole stripes (64 KiB chunks x 3) keeps its data outside the range.
    let mib = 1u64 << 20;
    qio(&[format!("write -P 0x5a 0 {}", 4 * mib), "flush".into()]);
    let written = member_blocks(&members);
    qio(&[
        format!("write -z 4096 {}", 4 * mib - 8192),
        "flush".into(),
        "read -P 0x5a 0 4096".into(),
        format!("read -P 0 4096 {}", 4 * mib - 8192),
        format!("read -P 0x5a {} 4096", 4 * mib - 4096),
    ]);
    assert!(
        member_blocks(&members) + 64 >= written,
        "write -z without -u freed blocks"
    );
    qio(&[
        format!("write -z -u 0 {}", 4 * mib),
        "flush".into(),
        format!("read -P 0 0 {}", 4 * mib),
    ]);
    assert!(
        written - member_blocks(&members) >= 4 * mib / 512,
        "write -z -u freed too little"
    );

    ok(srv.cmd().arg("stop").arg("--control").arg(&srv.control));
    assert!(srv.wait().success(), "server exit: {}", srv.stderr());
    let out = ok(uraid().args(["check", "-q"]).args(&members));
    assert!(stdout(&out).contains("mismatch_cnt: 0"), "{}", stdout(&out));
}
