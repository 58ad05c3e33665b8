//! contrib/systemd/uraid@.service (issue 17): the unit passes `systemd-analyze verify`,
//! its ExecStart line, expanded as systemd expands it for an instance, serves the
//! array under a `Type=notify` protocol: READY=1 arrives once the NBD export answers, its
//! ExecReload line (the ublk hand-over) reaches the server and is refused there without a
//! ublk export, STOPPING=1 on SIGTERM, then a clean exit with every superblock clean.
//!
//! The service manager is played by the test: a Unix datagram socket in NOTIFY_SOCKET
//! (systemd cannot run as PID 1 here); the 60 s receive timeout is a hang bound.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use uraid_nbd::client::{Client, ClientConfig};
use uraid_nbd::TlsClient;
use uraid_testkit::pki::Pki;
use uraid_testkit::prelude::*;

const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../contrib/systemd/uraid@.service"
);
/// Where the unit has the binary; the test runs the one it built.
const UNIT_BIN: &str = "/usr/local/bin/uraid";

/// The `Key=value` lines of one section, in order.
fn section(text: &str, name: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{name}]");
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            let (k, v) = line.split_once('=').expect("Key=value");
            out.push((k.to_string(), v.to_string()));
        }
    }
    out
}

/// `K=V` assignments (Environment= and EnvironmentFile contents) into `env`.
fn assign(env: &mut HashMap<String, String>, line: &str) {
    if let Some((k, v)) = line.split_once('=') {
        env.insert(k.to_string(), v.trim_matches('"').to_string());
    }
}

/// ExecStart's words as systemd makes them: `%I` the instance, `${X}` one word, `$X` split
/// at whitespace (nothing when empty).
fn exec_start(unit: &str, instance: &str, env: &HashMap<String, String>) -> Vec<String> {
    exec_line(unit, "ExecStart", instance, env)
}

/// The words of the `[Service]` command line `key` (ExecStart, ExecReload), expanded as
/// [`exec_start`] says.
fn exec_line(unit: &str, key: &str, instance: &str, env: &HashMap<String, String>) -> Vec<String> {
    let service = section(unit, "Service");
    let line = &service
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{key}"))
        .1;
    let mut words = Vec::new();
    for w in line.split_whitespace() {
        let w = w.replace("%I", instance).replace("%i", instance);
        if let Some(var) = w.strip_prefix('$').filter(|v| !v.starts_with('{')) {
            let v = env.get(var).cloned().unwrap_or_default();
            words.extend(v.split_whitespace().map(String::from));
        } else {
            words.push(braced(&w, env));
        }
    }
    words
}

/// `${X}` anywhere in a word replaced by X's value (one word whatever it holds).
fn braced(word: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let end = rest[at..].find('}').expect("${ closed") + at;
        out.push_str(env.get(&rest[at + 2..end]).map_or("", String::as_str));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// An EnvironmentFile's assignments (comments and blank lines skipped) into `env`.
fn env_file(env: &mut HashMap<String, String>, text: &str) {
    for line in text.lines().map(str::trim) {
        if !line.is_empty() && !line.starts_with('#') {
            assign(env, line);
        }
    }
}

/// The `Environment=` lines of a `[Service]` section, specifiers expanded.
fn unit_env(service: &[(String, String)], instance: &str) -> HashMap<String, String> {
    let mut env = HashMap::new();
    for (k, v) in service {
        if k == "Environment" {
            assign(&mut env, &v.replace("%I", instance));
        }
    }
    env
}

/// Notify messages until one has `want` as a line; gives them all.
fn recv_until(sock: &UnixDatagram, want: &str) -> Vec<String> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) => panic!("no {want} from uraid serve ({e}); got {got:?}"),
        };
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        let done = msg.lines().any(|l| l == want);
        got.push(msg);
        if done {
            return got;
        }
    }
}

/// `systemd-analyze verify` of `unit` (its ExecStart binary `bin` pointed at `real`, as
/// verify checks that it exists) under the file name `as_name`: it passes and warns of
/// nothing in the unit.
fn verify(analyze: &Path, unit: &str, bin: &str, real: &Path, as_name: &str) {
    let dir = TempDir::new("sd-verify");
    let body = std::fs::read_to_string(unit).unwrap();
    assert!(body.contains(bin), "{unit}: ExecStart names {bin}");
    let path = dir.path(as_name);
    std::fs::write(&path, body.replace(bin, &real.display().to_string())).unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify {unit}: {err}");
    // Unknown keys and bad values are warnings with exit 0: none may name the unit.
    let stem = as_name.split('@').next().unwrap();
    assert!(
        !err.contains(&format!("{stem}@")),
        "systemd-analyze verify {unit} warns: {err}"
    );
}

#[test]
fn unit_verifies_with_systemd_analyze() {
    let Some(analyze) = tool_path("systemd-analyze", "unit_verifies_with_systemd_analyze") else {
        return;
    };
    verify(&analyze, UNIT, UNIT_BIN, &uraid_bin(), "uraid@md0.service");
    // The socket unit, beside the service it activates; its socket is the service's
    // default --nbd address.
    let dir = TempDir::new("sd-verify-socket");
    let service = std::fs::read_to_string(UNIT)
        .unwrap()
        .replace(UNIT_BIN, &uraid_bin().display().to_string());
    std::fs::write(dir.path("uraid@md0.service"), service).unwrap();
    let socket = std::fs::read_to_string(SOCKET_UNIT).unwrap();
    let listen = section(&socket, "Socket")
        .into_iter()
        .find(|(k, _)| k == "ListenStream")
        .map(|(_, v)| v)
        .unwrap();
    let unit = std::fs::read_to_string(UNIT).unwrap();
    assert!(
        unit.contains(&format!("Environment=URAID_NBD=unix:{listen}")),
        "the socket unit listens where the service's --nbd says: {listen}"
    );
    let path = dir.path("uraid@md0.socket");
    std::fs::write(&path, socket).unwrap();
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify {SOCKET_UNIT}: {err}"
    );
    assert!(
        !err.contains("uraid@"),
        "systemd-analyze verify {SOCKET_UNIT} warns: {err}"
    );
}

const SOCKET_UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../contrib/systemd/uraid@.socket"
);

/// The storage host's unit of docs/REMOTE.md.
const MEMBER_UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../contrib/systemd/remote/nbdkit-member@.service"
);
const NBDKIT_BIN: &str = "/usr/bin/nbdkit";

#[test]
fn remote_units_verify_with_systemd_analyze() {
    let Some(analyze) = tool_path(
        "systemd-analyze",
        "remote_units_verify_with_systemd_analyze",
    ) else {
        return;
    };
    // nbdkit where it is installed; else the uraid binary stands in for the path (the
    // unit is checked here, nbdkit by the test that runs it).
    let real = uraid_testkit::skip::find_tool("nbdkit").unwrap_or_else(uraid_bin);
    verify(
        &analyze,
        MEMBER_UNIT,
        NBDKIT_BIN,
        &real,
        "nbdkit-member@disk0.service",
    );
}

#[test]
fn exec_start_notifies_ready_and_stopping() {
    if !need_tool("nbdinfo", "exec_start_notifies_ready_and_stopping") {
        return;
    }
    let dir = TempDir::new("sd-notify");
    let members: Vec<PathBuf> = (0..2).map(|i| dir.image(&format!("m{i}.img"), 8)).collect();
    ok(uraid()
        .args(["create", "-l", "1", "-N", "md0", "--run", "--assume-clean"])
        .args(&members));
    let conf = dir.path("mdadm.conf");
    std::fs::write(&conf, format!("DEVICE {}/m*.img\n", dir.0.display())).unwrap();

    // The unit as this instance sees it: RuntimeDirectory /run/uraid is the test's run dir,
    // and the per-array EnvironmentFile names the test's mdadm.conf.
    let run_dir = dir.run_dir();
    std::fs::create_dir_all(&run_dir).unwrap();
    let unit = std::fs::read_to_string(UNIT)
        .unwrap()
        .replace("/run/uraid", &run_dir.display().to_string())
        .replace("/var/lib/uraid", &dir.path("state").display().to_string());
    let service = section(&unit, "Service");
    let get = |k: &str| {
        service
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("Type").as_deref(), Some("notify"));
    assert_eq!(get("KillSignal").as_deref(), Some("SIGTERM"));
    // systemd makes /var/lib/uraid, where a clean stop saves the never-written map.
    assert_eq!(get("StateDirectory").as_deref(), Some("uraid"));
    let mut env = HashMap::new();
    for (k, v) in &service {
        if k == "Environment" {
            // systemd expands specifiers in Environment= too.
            assign(&mut env, &v.replace("%I", "md0"));
        }
    }
    let env_file = get("EnvironmentFile").expect("EnvironmentFile");
    assert!(env_file.starts_with('-'), "an optional EnvironmentFile");
    assign(&mut env, &format!("URAID_OPTS=--config {}", conf.display()));
    let words = exec_start(&unit, "md0", &env);
    assert_eq!(words[0], UNIT_BIN);

    let notify_path = dir.path("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let stderr_path = dir.path("serve.stderr");
    let mut child = ChildGuard(Some(
        Command::new(uraid_bin())
            .args(&words[1..])
            .envs(&env)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap(),
    ));
    let stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();

    let ready = recv_until(&notify, "READY=1");
    let last = ready.last().unwrap();
    assert!(
        last.lines()
            .any(|l| l.starts_with("STATUS=serving raid1 array ")),
        "{ready:?}"
    );
    // READY means the export answers now, at the address the unit gives.
    let uri = format!(
        "nbd+unix:///md0?socket={}",
        run_dir.join("md0.nbd").display()
    );
    let size = nbd_size(&uri);
    assert!(size > 6 * MIB && size <= 8 * MIB, "export of {size} bytes");
    qemu_io_if_there(&uri);

    // `systemctl reload` (ExecReload) hands a ublk device over; this server has none, so
    // it is refused and the server goes on serving. The exit status it would leave with is
    // the one the unit restarts on.
    assert_eq!(get("RestartForceExitStatus").as_deref(), Some("75"));
    let reload = exec_line(&unit, "ExecReload", "md0", &env);
    assert_eq!(reload[0], UNIT_BIN);
    let out = run(Command::new(uraid_bin()).args(&reload[1..]).envs(&env));
    assert!(
        !out.status.success(),
        "reload without ublk: {}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("no ublk export to keep"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(nbd_size(&uri), size, "served after the refused reload");

    let pid = child.0.as_ref().unwrap().id();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    recv_until(&notify, "STOPPING=1");
    let status = child.0.take().unwrap().wait().unwrap();
    assert!(status.success(), "exit {status}: {}", stderr());
    assert_eq!(member_states(&members), ["clean", "clean"], "{}", stderr());
    assert!(stderr().contains("stopped cleanly"), "{}", stderr());
}

/// Data written through the export after READY reads back (qemu-io, where installed).
fn qemu_io_if_there(uri: &str) {
    if tool_path("qemu-io", "exec_start_notifies_ready_and_stopping").is_some() {
        let out = qemu_io(uri, &["write -P 0x3c 0 64k", "read -P 0x3c 0 64k"]);
        assert!(!out.contains("verification failed"), "{out}");
    }
}

/// contrib/systemd/remote/, as docs/REMOTE.md installs it.
const REMOTE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/systemd/remote");

fn remote_file(name: &str) -> String {
    std::fs::read_to_string(format!("{REMOTE}/{name}")).unwrap()
}

/// A free TCP port on loopback (bound, then let go, for a server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn tls_config(pki: &Pki) -> ClientConfig {
    ClientConfig {
        tls: Some(TlsClient::from_ca_file(&pki.ca()).unwrap()),
        ..ClientConfig::default()
    }
}

/// One storage host: nbdkit-member@INSTANCE.service's ExecStart, expanded with the unit's
/// Environment=, the example env file, and then this test's disk, address, port and PKI
/// (the folder of ca-cert.pem, server-cert.pem, server-key.pem); killed on drop.
struct StorageHost {
    _child: ChildGuard,
    uri: String,
}

impl StorageHost {
    fn start(nbdkit: &Path, pki: &Pki, disk: &Path, instance: &str) -> StorageHost {
        let unit = std::fs::read_to_string(MEMBER_UNIT).unwrap();
        let service = section(&unit, "Service");
        let get = |k: &str| service.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        assert_eq!(
            get("EnvironmentFile").map(String::as_str),
            Some("/etc/uraid/member-%I.env"),
            "the env file is required: it names the disk"
        );
        let mut env = unit_env(&service, instance);
        assert_eq!(env["NBD_PKI"], "/etc/uraid/pki");
        env_file(&mut env, &remote_file("member-disk0.env"));
        assert!(env["NBD_DISK"].starts_with("/dev/"), "{env:?}");
        let port = free_port();
        env.insert("NBD_DISK".into(), disk.display().to_string());
        env.insert("NBD_ADDR".into(), "127.0.0.1".into());
        env.insert("NBD_PORT".into(), port.to_string());
        env.insert("NBD_PKI".into(), pki.dir.display().to_string());
        let words = exec_start(&unit, instance, &env);
        assert_eq!(words[0], NBDKIT_BIN);
        assert!(words.contains(&"--tls=require".to_string()), "{words:?}");
        let mut child = Command::new(nbdkit)
            .args(&words[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn nbdkit");
        let uri = format!("nbds://127.0.0.1:{port}/{instance}");
        // Up once a TLS client gets through (60 s: a hang bound).
        let config = tls_config(pki);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while let Err(e) = Client::open(&uri, &config) {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("nbdkit {words:?} exited: {st}");
            }
            assert!(std::time::Instant::now() < deadline, "{uri}: {e}");
            std::thread::sleep(Duration::from_millis(20));
        }
        StorageHost {
            _child: ChildGuard(Some(child)),
            uri,
        }
    }
}

/// The value of `tag=` among a line's words.
fn tag<'a>(line: &'a str, tag: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{tag}=")))
        .unwrap_or_else(|| panic!("no {tag}= in {line}"))
}

/// docs/REMOTE.md end to end on one machine: two storage hosts run
/// nbdkit-member@disk0.service's ExecStart (TLS required, certificates of a test CA); a
/// raid1 is created on their nbds:// exports; `examine --scan` prints the ARRAY line of
/// contrib/systemd/remote/mdadm.conf (with devices=nbds://...); the array host runs
/// uraid@md0.service's ExecStart with contrib/systemd/remote/md0.env, which finds the
/// remote members through that line: READY=1, both members up, data through the export,
/// STOPPING=1 on SIGTERM and both remote superblocks clean.
#[test]
fn array_host_unit_serves_members_of_storage_host_units() {
    let test = "array_host_unit_serves_members_of_storage_host_units";
    let Some(nbdkit) = tool_path("nbdkit", test) else {
        return;
    };
    let dir = TempDir::new("sd-remote");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let ca = pki.ca().display().to_string();
    let disks: Vec<PathBuf> = (1..=2)
        .map(|i| dir.image(&format!("store{i}.img"), 32))
        .collect();
    let hosts: Vec<StorageHost> = disks
        .iter()
        .map(|d| StorageHost::start(&nbdkit, &pki, d, "disk0"))
        .collect();
    let uris: Vec<&str> = hosts.iter().map(|h| h.uri.as_str()).collect();
    ok(uraid()
        .args(["--nbd-tls-ca", &ca])
        .args([
            "create", "-l", "1", "-n", "2", "-N", "md0", "--bitmap", "internal",
        ])
        .args(["--assume-clean", "--run"])
        .args(&uris));

    // examine --scan prints the example's line, with this test's hosts, UUID and name.
    let scanned = stdout(&ok(uraid()
        .args(["--nbd-tls-ca", &ca, "examine", "--scan"])
        .args(&uris)));
    let scanned = scanned.trim();
    let example = remote_file("mdadm.conf");
    let line = example
        .lines()
        .find(|l| l.starts_with("ARRAY"))
        .expect("an ARRAY line");
    let mut want = line.to_string();
    for (i, uri) in uris.iter().enumerate() {
        let port = uri.rsplit_once(':').unwrap().1.split('/').next().unwrap();
        want = want.replace(
            &format!("store{}.example.net:10809", i + 1),
            &format!("127.0.0.1:{port}"),
        );
    }
    for t in ["UUID", "name"] {
        want = want.replace(tag(line, t), tag(scanned, t));
    }
    assert_eq!(scanned, want, "examine --scan, against {line}");
    assert!(tag(scanned, "name").ends_with(":md0"), "{scanned}");
    let conf = dir.path("mdadm.conf");
    std::fs::write(&conf, format!("{want}\n")).unwrap();

    // The array host: uraid@md0.service with the example env file, its paths the test's.
    let run_dir = dir.run_dir();
    std::fs::create_dir_all(&run_dir).unwrap();
    let unit = std::fs::read_to_string(UNIT)
        .unwrap()
        .replace("/run/uraid", &run_dir.display().to_string())
        .replace("/var/lib/uraid", &dir.path("state").display().to_string());
    let service = section(&unit, "Service");
    let mut env = unit_env(&service, "md0");
    let opts_file = remote_file("md0.env")
        .replace("/etc/uraid/pki/ca-cert.pem", &ca)
        .replace("/etc/uraid/mdadm.conf", &conf.display().to_string());
    env_file(&mut env, &opts_file);
    for o in ["--config", "--nbd-tls-ca", "--nbd-timeout", "--nbd-readd"] {
        assert!(env["URAID_OPTS"].contains(o), "md0.env sets {o}: {env:?}");
    }
    let words = exec_start(&unit, "md0", &env);
    assert_eq!(words[0], UNIT_BIN);

    let notify_path = dir.path("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let stderr_path = dir.path("serve.stderr");
    let mut child = ChildGuard(Some(
        Command::new(uraid_bin())
            .args(&words[1..])
            .envs(&env)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap(),
    ));
    let stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let ready = recv_until(&notify, "READY=1");
    assert!(
        ready
            .last()
            .unwrap()
            .lines()
            .any(|l| l.starts_with("STATUS=serving raid1 array ")),
        "{ready:?}"
    );
    assert!(
        stderr().contains(&format!("found {} {}", uris[0], uris[1])),
        "{}",
        stderr()
    );
    // Both remote members up, as `uraid status` shows them.
    let status = stdout(&ok(uraid().env("URAID_RUN_DIR", &run_dir).arg("status")));
    for (r, uri) in uris.iter().enumerate() {
        assert!(
            status.contains(&format!("remote {r}: {uri} up")),
            "{status}"
        );
    }
    assert!(status.contains("[2/2] [UU]"), "{status}");
    // Data through the export lands on both storage hosts' disks.
    let export = format!(
        "nbd+unix:///md0?socket={}",
        run_dir.join("md0.nbd").display()
    );
    let c = Client::open(&export, &ClientConfig::default()).unwrap();
    let data = pattern(256 << 10, 16);
    c.write(&data, 1 << 20, true).unwrap();
    drop(c);
    let v = json(&ok(uraid()
        .args(["--nbd-tls-ca", &ca, "examine", "--json"])
        .arg(uris[0])));
    let data_offset = v["data_offset_sectors"].as_u64().unwrap() * 512;
    for d in &disks {
        let bytes = std::fs::read(d).unwrap();
        let at = (data_offset + (1 << 20)) as usize;
        assert!(
            bytes[at..at + data.len()] == data[..],
            "{}: no copy",
            d.display()
        );
    }

    let pid = child.0.as_ref().unwrap().id();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    recv_until(&notify, "STOPPING=1");
    let st = child.0.take().unwrap().wait().unwrap();
    assert!(st.success(), "exit {st}: {}", stderr());
    for uri in &uris {
        let v = json(&ok(uraid()
            .args(["--nbd-tls-ca", &ca, "examine", "--json"])
            .arg(uri)));
        assert_eq!(v["state"], "clean", "{uri}: {}", stderr());
    }
}

/// A storage host that is down when the array host starts: `serve --scan` names its URI,
/// passes it over and serves the array degraded; once the host is back, `uraid add`
/// re-adds it, and the array is whole again.
#[test]
fn serve_scan_passes_over_a_storage_host_that_is_down() {
    let test = "serve_scan_passes_over_a_storage_host_that_is_down";
    if !need_tool("nbdkit", test) {
        return;
    }
    let dir = TempDir::new("sd-remote-down");
    let disks: Vec<PathBuf> = (0..2)
        .map(|i| dir.image(&format!("d{i}.img"), 32))
        .collect();
    let start = |i: usize| {
        // A killed nbdkit leaves its socket file behind, which a new one cannot bind.
        let _ = std::fs::remove_file(dir.path(&format!("h{i}.sock")));
        Nbdkit::start(
            &dir,
            &format!("h{i}"),
            &["file", disks[i].to_str().unwrap()],
        )
    };
    let mut hosts = [start(0), start(1)];
    let uris: Vec<String> = hosts.iter().map(Nbdkit::uri).collect();
    ok(uraid()
        .args([
            "create", "-l", "1", "-n", "2", "-N", "md0", "--bitmap", "internal",
        ])
        .args(["--assume-clean", "--run"])
        .args(&uris));
    let line = stdout(&ok(uraid().args(["examine", "--scan"]).args(&uris)));
    assert!(
        line.trim_end()
            .ends_with(&format!("devices={},{}", uris[0], uris[1])),
        "{line}"
    );
    let conf = dir.path("mdadm.conf");
    std::fs::write(&conf, &line).unwrap();

    hosts[1].kill();
    let control = dir.path("ctl.sock");
    let args: Vec<String> = [
        "serve",
        "--scan",
        "--config",
        conf.to_str().unwrap(),
        "--nbd",
        &format!("unix:{}", dir.path("md0.sock").display()),
        "--control",
        control.to_str().unwrap(),
        "md0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let srv = Served::spawn(&dir, args, &[], dir.path("md0.sock"), control);
    let err = srv.stderr();
    assert!(
        err.contains(&format!("passed over: cannot open member {}", uris[1])),
        "{err}"
    );
    assert!(err.contains(&format!("found {}\n", uris[0])), "{err}");
    let m0 = Path::new(&uris[0]);
    let d = srv.detail(m0);
    assert_eq!(d["members"][0]["state"], "active", "{d}");
    assert_eq!(d["members"][1]["state"], "missing", "{d}");
    assert_eq!(d["degraded"], true, "{d}");

    hosts[1] = start(1);
    srv.add(m0, &uris[1]);
    srv.wait_detail(m0, |d| {
        d["degraded"] == false
            && d["members"]
                .as_array()
                .is_some_and(|m| m.len() == 2 && m.iter().all(|m| m["state"] == "active"))
    });
    let d = srv.detail(m0);
    assert_eq!(d["members"][1]["device"], uris[1].as_str(), "{d}");
}

/// `uraid serve` under systemd's socket activation (issue 17, restart without refusing a
/// client): `systemd-socket-activate` (systemd's own implementation of the protocol)
/// holds the NBD socket and starts the server at the first connection, which nbdinfo
/// then completes; then the test holds the socket as a socket unit does across a restart:
/// a server started with it serves, stops and leaves the socket file; a client that
/// connects while no server runs is not refused but waits in the backlog, and the next
/// server started with the same socket greets it (NBDMAGIC) and serves nbdinfo.
#[test]
fn serve_takes_the_nbd_socket_systemd_passes_and_a_restart_refuses_no_client() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::os::unix::process::CommandExt;
    let test = "serve_takes_the_nbd_socket_systemd_passes_and_a_restart_refuses_no_client";
    let (Some(activate), Some(nbdinfo)) = (
        tool_path("systemd-socket-activate", test),
        tool_path("nbdinfo", test),
    ) else {
        return;
    };
    let dir = TempDir::new("sd-socket");
    let members: Vec<PathBuf> = (0..2).map(|i| dir.image(&format!("m{i}.img"), 8)).collect();
    ok(uraid()
        .args(["create", "-l", "1", "-N", "md0", "--run", "--assume-clean"])
        .args(&members));
    let size = json(&ok(uraid().args(["detail", "--json"]).args(&members)))["array_bytes"]
        .as_u64()
        .unwrap();
    let nbd_size = |sock: &Path| {
        let out = Command::new(&nbdinfo)
            .arg("--size")
            .arg(format!("nbd+unix:///md0?socket={}", sock.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "nbdinfo: {}", text(&out.stderr));
        text(&out.stdout).trim().parse::<u64>().unwrap()
    };
    let stop = |control: &Path| {
        ok(uraid().arg("stop").arg("--control").arg(control));
    };

    // 1. systemd-socket-activate: the server starts on the first connection.
    let sock = dir.path("act.sock");
    let control = dir.path("act.ctl");
    let mut act = ChildGuard(Some(
        Command::new(&activate)
            .arg("-l")
            .arg(&sock)
            .arg(uraid_bin())
            .args(["serve", "--name", "md0", "--nbd"])
            .arg(format!("unix:{}", sock.display()))
            .arg("--control")
            .arg(&control)
            .args(&members)
            .env("URAID_RUN_DIR", dir.run_dir())
            .stderr(std::fs::File::create(dir.path("act.stderr")).unwrap())
            .spawn()
            .unwrap(),
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !sock.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "systemd-socket-activate did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(nbd_size(&sock), size, "through the activated socket");
    stop(&control);
    let st = act.0.take().unwrap().wait().unwrap();
    assert!(
        st.success(),
        "{st}: {}",
        std::fs::read_to_string(dir.path("act.stderr")).unwrap_or_default()
    );

    // 2. The socket held across a restart, as a socket unit holds it.
    let sock = dir.path("held.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let fd = listener.as_raw_fd();
    let control = dir.path("held.ctl");
    let start = |tag: &str| {
        let mut c = Command::new(uraid_bin());
        c.args(["serve", "--name", "md0", "--nbd"])
            .arg(format!("unix:{}", sock.display()))
            .arg("--control")
            .arg(&control)
            .args(&members)
            .env("URAID_RUN_DIR", dir.run_dir())
            .env("LISTEN_FDS", "1")
            .stderr(std::fs::File::create(dir.path(&format!("{tag}.stderr"))).unwrap());
        // SAFETY: dup2 and fcntl are async-signal-safe; the child then execs.
        unsafe {
            c.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::fcntl(3, libc::F_SETFD, 0);
                Ok(())
            });
        }
        let child = ChildGuard(Some(c.spawn().unwrap()));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while UnixStream::connect(&control).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "{tag} did not come up: {}",
                std::fs::read_to_string(dir.path(&format!("{tag}.stderr"))).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    };
    let mut first = start("first");
    assert_eq!(nbd_size(&sock), size, "the first server");
    stop(&control);
    assert!(first.0.take().unwrap().wait().unwrap().success());
    assert!(
        sock.exists(),
        "the stopped server left the socket it was given"
    );
    // No server now: the connection is not refused, it waits in the backlog.
    let mut waiting = UnixStream::connect(&sock).expect("a client between two servers");
    waiting
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut second = start("second");
    let mut magic = [0u8; 8];
    waiting.read_exact(&mut magic).unwrap();
    assert_eq!(
        &magic, b"NBDMAGIC",
        "the next server greets the waiting client"
    );
    drop(waiting);
    assert_eq!(nbd_size(&sock), size, "the second server");
    stop(&control);
    assert!(second.0.take().unwrap().wait().unwrap().success());
    drop(listener);
}
