//! Arrays found without naming their members (issue 17): `examine --scan` prints the
//! ARRAY lines mdadm prints (mdadm is the oracle), `assemble --scan` reads mdadm.conf
//! (ARRAY lines by UUID or name, DEVICE globs) and refuses another host's arrays unless
//! asked, `incremental` waits for members arriving one at a time and serves the array
//! once, and `status` shows served arrays in /proc/mdstat's form.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use uraid_testkit::prelude::*;

/// Makes `n` images `{prefix}{i}.img` of `mib` MiB in `dir` and an array on them.
fn make_array(
    dir: &Path,
    prefix: &str,
    level: &str,
    n: usize,
    mib: u64,
    name: &str,
) -> Vec<PathBuf> {
    make_array_with(dir, prefix, level, n, mib, name, &[])
}

fn make_array_with(
    dir: &Path,
    prefix: &str,
    level: &str,
    n: usize,
    mib: u64,
    name: &str,
    extra: &[&str],
) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..n)
        .map(|i| {
            let p = dir.join(format!("{prefix}{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(mib * MIB)
                .unwrap();
            p
        })
        .collect();
    ok(uraid()
        .args(["create", "-l", level, "--chunk", "64K", "-N", name, "--run"])
        .args(["--assume-clean"])
        .args(extra)
        .args(&paths));
    paths
}

fn uuid_of(member: &Path) -> String {
    json(&ok(uraid().arg("examine").arg("--json").arg(member)))["uuid"]
        .as_str()
        .unwrap()
        .to_string()
}

fn write_conf(dir: &TempDir, text: &str) -> PathBuf {
    let p = dir.path("mdadm.conf");
    std::fs::write(&p, text).unwrap();
    p
}

/// The words of an ARRAY line, white space runs as one.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn examine_scan_prints_mdadms_array_lines() {
    if !need_tool("mdadm", "examine_scan_prints_mdadms_array_lines") {
        return;
    }
    let dir = TempDir::new("scan-ex");
    let mut all = make_array(&dir.0, "a", "5", 3, 8, "alpha");
    all.extend(make_array(&dir.0, "b", "1", 2, 8, "beta"));
    let ours = stdout(&ok(uraid().args(["examine", "--scan"]).args(&all)));
    let theirs = stdout(&ok(Command::new("mdadm")
        .args(["--examine", "--scan"])
        .args(&all)));
    let ours: Vec<&str> = ours.lines().collect();
    let theirs: Vec<&str> = theirs.lines().filter(|l| l.starts_with("ARRAY")).collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert_eq!(theirs.len(), 2, "mdadm: {theirs:?}");
    // Line for line, word for word (mdadm pads with more spaces in places).
    for (o, t) in ours.iter().zip(&theirs) {
        assert_eq!(words(o), words(t), "\nours:  {o}\nmdadm: {t}");
    }
    // mdadm lists the array it found last first.
    assert!(ours[1].contains(&format!("UUID={}", uuid_of(&all[0]))));
    // With no devices, the config's DEVICE lines are scanned.
    let conf = write_conf(&dir, &format!("DEVICE {}/b*.img\n", dir.0.display()));
    let scanned = stdout(&ok(uraid()
        .args(["examine", "--scan", "--config"])
        .arg(&conf)));
    assert_eq!(scanned.lines().collect::<Vec<_>>(), [ours[0]]);
}

#[test]
fn assemble_scan_reads_array_and_device_lines() {
    let dir = TempDir::new("scan-as");
    let a = make_array(&dir.0, "a", "5", 3, 8, "alpha");
    let b = make_array(&dir.0, "b", "1", 2, 8, "beta");
    // examine --scan >> mdadm.conf, with a DEVICE glob over the images.
    let lines = stdout(&ok(uraid().args(["examine", "--scan"]).args(&a).args(&b)));
    let conf = write_conf(
        &dir,
        &format!("# test\nDEVICE {}/*.img\n{lines}", dir.0.display()),
    );
    let out = ok(uraid().args(["assemble", "--scan", "--config"]).arg(&conf));
    let err = text(&out.stderr);
    assert_eq!(err.matches(" assembled: ").count(), 2, "{err}");
    assert!(err.contains("raid5, 3 of 3 members"), "{err}");
    assert!(err.contains("raid1, 2 of 2 members"), "{err}");
    // One array by its name, the other by its UUID.
    let out = ok(uraid()
        .args(["assemble", "--scan", "--config"])
        .arg(&conf)
        .arg("beta"));
    let err = text(&out.stderr);
    assert_eq!(err.matches(" assembled: ").count(), 1, "{err}");
    assert!(err.contains("raid1, 2 of 2"), "{err}");
    let out = ok(uraid()
        .args(["assemble", "--scan", "--config"])
        .arg(&conf)
        .arg(uuid_of(&a[0])));
    assert!(text(&out.stderr).contains("raid5, 3 of 3"));
    // Only the arrays the ARRAY lines list: one line left, one array assembled.
    let only_a = write_conf(
        &dir,
        &format!(
            "DEVICE {}/*.img\nARRAY /dev/md/alpha UUID={}\n",
            dir.0.display(),
            uuid_of(&a[0])
        ),
    );
    let out = ok(uraid()
        .args(["assemble", "--scan", "--config"])
        .arg(&only_a));
    let err = text(&out.stderr);
    assert_eq!(err.matches(" assembled: ").count(), 1, "{err}");
    assert!(
        err.contains("no ARRAY line in the config names it"),
        "{err}"
    );
    // A bad config is named with its line.
    let bad = write_conf(&dir, "DEVICE /x\nARRAY /dev/md0 uuid=nope\n");
    let err = fails_with(
        uraid().args(["assemble", "--scan", "--config"]).arg(&bad),
        "mdadm.conf:2: uuid=\"nope\" is not a UUID",
    );
    assert!(!err.contains("assembled"), "{err}");
}

#[test]
fn another_hosts_array_starts_only_when_asked() {
    let dir = TempDir::new("scan-host");
    let g = make_array(&dir.0, "g", "1", 2, 8, "faraway:gamma");
    let conf = write_conf(&dir, &format!("DEVICE {}/*.img\n", dir.0.display()));
    let scan = || {
        let mut c = uraid();
        c.args(["assemble", "--scan", "--config"]).arg(&conf);
        c
    };
    let before = snapshot(&g);
    let err = fails_with(
        scan().args(["--homehost", "here"]),
        "belongs to host \"faraway\"",
    );
    assert!(!err.contains("assembled"), "{err}");
    assert!(before == snapshot(&g), "a refused array was written");
    // mdadm's ways to ask: --homehost, naming it, an ARRAY line.
    let out = ok(scan().args(["--homehost", "faraway"]));
    assert!(text(&out.stderr).contains(" assembled: raid1"));
    let out = ok(scan().args(["--homehost", "here", "gamma"]));
    assert!(text(&out.stderr).contains(" assembled: raid1"));
    let listed = write_conf(
        &dir,
        &format!(
            "DEVICE {}/*.img\nHOMEHOST here\nARRAY /dev/md/gamma name=faraway:gamma\n",
            dir.0.display()
        ),
    );
    let out = ok(uraid()
        .args(["assemble", "--scan", "--config"])
        .arg(&listed));
    assert!(text(&out.stderr).contains(" assembled: raid1"));
}

#[test]
fn serve_scan_serves_the_one_array_named() {
    let dir = TempDir::new("scan-srv");
    let a = make_array(&dir.0, "a", "5", 3, 8, "alpha");
    let b = make_array(&dir.0, "b", "1", 2, 8, "beta");
    let conf = write_conf(&dir, &format!("DEVICE {}/*.img\n", dir.0.display()));
    let mut all = a.clone();
    all.extend(b.iter().cloned());
    // Two arrays found: one server serves one, so it must be named.
    let err = fails_cleanly(
        uraid()
            .env("URAID_RUN_DIR", dir.run_dir())
            .args(["serve", "--scan", "--nbd"])
            .arg(format!("unix:{}", dir.path("x.sock").display()))
            .arg("--config")
            .arg(&conf),
        &all,
    );
    assert!(err.contains("2 arrays match"), "{err}");
    assert!(
        err.contains("vm:alpha") || err.contains(":alpha ("),
        "{err}"
    );
    let sock = dir.path("nbd.sock");
    let control = dir.path("ctl.sock");
    let args: Vec<String> = vec![
        "serve".into(),
        "--scan".into(),
        "--config".into(),
        conf.display().to_string(),
        "--nbd".into(),
        format!("unix:{}", sock.display()),
        "--control".into(),
        control.display().to_string(),
        "beta".into(),
    ];
    let srv = Served::spawn(&dir, args, &[], sock, control);
    let d = srv.detail(&b[0]);
    assert_eq!(d["level"], "raid1");
    assert_eq!(d["uuid"].as_str().unwrap(), uuid_of(&b[0]));
    assert!(srv.stderr().contains("found "), "{}", srv.stderr());
}

/// Kills the server of this UUID on drop, if the test left it running.
struct KillServed(PathBuf);

impl Drop for KillServed {
    fn drop(&mut self) {
        let pid = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["pid"].as_u64());
        if let Some(pid) = pid {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    }
}

/// `uraid stop` through the index of the server of this UUID.
fn stop_served(run_dir: &Path, uuid: &str) {
    ok(uraid()
        .env("URAID_RUN_DIR", run_dir)
        .arg("stop")
        .arg("--control")
        .arg(run_dir.join(format!("{uuid}.sock"))));
}

#[test]
fn incremental_waits_for_members_and_serves_once() {
    let dir = TempDir::new("scan-inc");
    let pool = dir.path("pool");
    let arrived = dir.path("arrived");
    std::fs::create_dir_all(&pool).unwrap();
    std::fs::create_dir_all(&arrived).unwrap();
    let m = make_array(&pool, "m", "5", 3, 8, "inc");
    let uuid = uuid_of(&m[0]);
    let conf = write_conf(&dir, &format!("DEVICE {}/*.img\n", arrived.display()));
    let run_dir = dir.run_dir();
    let _guard = KillServed(run_dir.join(format!("{uuid}.json")));
    let incremental = |dev: &Path| {
        let out = ok(uraid()
            .env("URAID_RUN_DIR", &run_dir)
            .args(["incremental", "--config"])
            .arg(&conf)
            .arg("--nbd")
            .arg(format!("unix:{}", dir.path("nbd.sock").display()))
            .arg(dev));
        stdout(&out)
    };
    let mut here = Vec::new();
    for (i, p) in m.iter().enumerate() {
        let to = arrived.join(p.file_name().unwrap());
        std::fs::rename(p, &to).unwrap();
        here.push(to.clone());
        let said = incremental(&to);
        assert_eq!(said.lines().count(), 1, "one line each time: {said}");
        if i < 2 {
            assert!(
                said.contains(&format!("{} of 3 members present, waiting", i + 1)),
                "{said}"
            );
            assert!(
                !run_dir.join(format!("{uuid}.json")).exists(),
                "started early"
            );
        } else {
            assert!(said.contains("completes array"), "{said}");
            assert!(said.contains("3 of 3 members; served by pid"), "{said}");
        }
    }
    // Served once: another arrival of a member says so and starts nothing.
    let again = incremental(&here[0]);
    assert!(again.contains("is served already"), "{again}");
    let st = stdout(&ok(uraid().env("URAID_RUN_DIR", &run_dir).arg("status")));
    assert_eq!(st.matches(" : active raid5 ").count(), 1, "{st}");
    stop_served(&run_dir, &uuid);
    assert_eq!(member_states(&here), ["clean", "clean", "clean"]);
    // A device without a superblock is no member.
    let blank = dir.image("blank.img", 4);
    fails_with(
        uraid()
            .env("URAID_RUN_DIR", &run_dir)
            .args(["incremental", "--config"])
            .arg(&conf)
            .arg(&blank),
        "no valid md superblock",
    );
}

/// The members of a NAS-style 0.90 raid5 (and a 1.0 raid1) arriving one by one: each
/// incremental call says where the array stands, the last one serves it, and it stops clean.
#[test]
fn incremental_serves_0_90_and_1_0_arrays() {
    for (meta, level, n) in [("0.90", "5", 3usize), ("1.0", "1", 2)] {
        let dir = TempDir::new("scan-inc-v");
        let pool = dir.path("pool");
        let arrived = dir.path("arrived");
        std::fs::create_dir_all(&pool).unwrap();
        std::fs::create_dir_all(&arrived).unwrap();
        let m = make_array_with(&pool, "v", level, n, 8, "nas", &["--metadata", meta]);
        let uuid = uuid_of(&m[0]);
        let conf = write_conf(&dir, &format!("DEVICE {}/*.img\n", arrived.display()));
        let run_dir = dir.run_dir();
        let _guard = KillServed(run_dir.join(format!("{uuid}.json")));
        let mut here = Vec::new();
        for (i, p) in m.iter().enumerate() {
            let to = arrived.join(p.file_name().unwrap());
            std::fs::rename(p, &to).unwrap();
            here.push(to.clone());
            let said = stdout(&ok(uraid()
                .env("URAID_RUN_DIR", &run_dir)
                .args(["incremental", "--config"])
                .arg(&conf)
                .arg("--nbd")
                .arg(format!("unix:{}", dir.path("nbd.sock").display()))
                .arg(&to)));
            if i + 1 < n {
                assert!(
                    said.contains(&format!("{} of {n} members present, waiting", i + 1)),
                    "{meta}: {said}"
                );
            } else {
                assert!(
                    said.contains(&format!("{n} of {n} members; served by pid")),
                    "{meta}: {said}"
                );
            }
        }
        let st = stdout(&ok(uraid().env("URAID_RUN_DIR", &run_dir).arg("status")));
        assert_eq!(
            st.matches(&format!(" : active raid{level} ")).count(),
            1,
            "{meta}: {st}"
        );
        stop_served(&run_dir, &uuid);
        // Stopped clean: 1.x says state clean, 0.90 its clean flag.
        for m in &here {
            let ex = json(&ok(uraid().arg("examine").arg("--json").arg(m)));
            assert!(
                ex["state"] == "clean" || ex["clean"] == true,
                "{meta}: {ex}"
            );
        }
    }
}

/// A line of `text` that starts with `prefix`.
fn line_with<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{text}"))
}

#[test]
fn status_shows_served_arrays_as_mdstat() {
    let dir = TempDir::new("scan-st");
    let r5 = make_array_with(&dir.0, "s", "5", 3, 8, "md3", &["-b", "internal"]);
    let r1 = {
        // The sync steps 32 MiB at a time (one progress report each, the throttle naps at
        // most a second a step): eight steps, so that the rebuild is seen under way.
        let p0 = dir.image("r0.img", 256);
        let p1 = dir.image("r1.img", 256);
        ok(uraid()
            .args(["create", "-l", "1", "-N", "mirror", "--run"])
            .arg(&p0)
            .arg("missing"));
        (p0, p1)
    };
    let a = Served::start(&dir, &r5, &[]);
    let b = Served::start(&dir, std::slice::from_ref(&r1.0), &["--speed-max", "100"]);
    ok(b.cmd()
        .arg("add")
        .arg("--control")
        .arg(&b.control)
        .arg(&r1.1));
    // Until the rebuild has a speed (a mark and progress since it).
    b.wait_detail(&r1.0, |d| d["sync"]["speed_kib_s"].as_u64().is_some());
    let d5 = a.detail(&r5[0]);
    let d1 = b.detail(&r1.0);

    let st = stdout(&ok(a.cmd().arg("status")));
    let lines: Vec<&str> = st.lines().collect();
    assert_eq!(
        lines[0], "Personalities : [raid1] [raid6] [raid5] [raid4] ",
        "{st}"
    );
    assert_eq!(lines.last(), Some(&"unused devices: <none>"), "{st}");
    // md3 is md3; the mirror gets md127.
    assert_eq!(
        line_with(&st, "md3 : "),
        "md3 : active raid5 s2.img[2] s1.img[1] s0.img[0]"
    );
    let i = lines.iter().position(|l| l.starts_with("md3 : ")).unwrap();
    assert_eq!(
        lines[i + 1],
        format!(
            "      {} blocks super 1.2 level 5, 64k chunk, algorithm 2 [3/3] [UUU]",
            d5["array_bytes"].as_u64().unwrap() / 1024
        )
    );
    assert!(
        lines[i + 2].starts_with("      bitmap: 0/1 pages [0KB], "),
        "{st}"
    );
    assert!(lines[i + 2].ends_with("KB chunk"), "{st}");
    let mirror = line_with(&st, "md127 : ");
    assert!(mirror.starts_with("md127 : active raid1 "), "{st}");
    assert!(
        mirror.contains(" r1.img[") && mirror.ends_with(" r0.img[0]"),
        "{st}"
    );
    let j = lines
        .iter()
        .position(|l| l.starts_with("md127 : "))
        .unwrap();
    assert_eq!(
        lines[j + 1],
        format!(
            "      {} blocks super 1.2 [2/1] [U_]",
            d1["array_bytes"].as_u64().unwrap() / 1024
        )
    );
    // [====>....]  recovery = 12.3% (done/total) finish=N.Nmin speed=NK/sec
    let rec = lines[j + 2];
    let total = d1["used_dev_sectors"].as_u64().unwrap() / 2;
    let (bar, rest) = rec.trim_start().split_once("]  recovery =").expect(rec);
    assert!(rec.starts_with("      ["), "{rec}");
    assert_eq!(bar.len(), 22, "{rec}");
    assert!(bar[1..].chars().all(|c| "=>.".contains(c)), "{rec}");
    let (pct, rest) = rest.split_once("% (").expect(rec);
    assert!(pct.trim().parse::<f64>().is_ok(), "{rec}");
    let (counts, rest) = rest.split_once(") finish=").expect(rec);
    assert!(counts.ends_with(&format!("/{total}")), "{rec}");
    let (finish, speed) = rest.split_once("min speed=").expect(rec);
    assert!(finish.parse::<f64>().is_ok(), "{rec}");
    let kib_s: u64 = speed.strip_suffix("K/sec").expect(rec).parse().expect(rec);
    assert!(kib_s > 0, "{rec}");

    let v = json(&ok(a.cmd().args(["status", "--json"])));
    let arrays = v["arrays"].as_array().unwrap();
    assert_eq!(arrays.len(), 2, "{v}");
    assert_eq!(arrays[0]["dev"], "md3");
    assert_eq!(arrays[0]["roles"], "[3/3] [UUU]");
    assert_eq!(arrays[1]["dev"], "md127");
    assert_eq!(arrays[1]["sync"]["kind"], "recovery");
    assert_eq!(arrays[1]["sync"]["total_kib"], total);
    assert_eq!(arrays[1]["uuid"], d1["uuid"]);
}

#[test]
fn status_watch_reprints() {
    let dir = TempDir::new("scan-watch");
    let mut child = uraid()
        .env("URAID_RUN_DIR", dir.run_dir())
        .args(["status", "--watch", "0.1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = [0u8; 256];
    while seen.matches("unused devices: <none>").count() < 2 && Instant::now() < deadline {
        use std::io::Read;
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.matches("Personalities : \n").count() >= 2, "{seen:?}");
    assert!(
        seen.matches("unused devices: <none>").count() >= 2,
        "{seen:?}"
    );
}
