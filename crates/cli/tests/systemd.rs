//! contrib/systemd/uraid@.service (issue 17): the unit passes `systemd-analyze verify`,
//! and its ExecStart line, expanded as systemd expands it for an instance, serves the
//! array under a `Type=notify` protocol: READY=1 arrives once the NBD export answers,
//! STOPPING=1 on SIGTERM, then a clean exit with every superblock clean.
//!
//! The service manager is played by the test: a Unix datagram socket in NOTIFY_SOCKET
//! (systemd cannot run as PID 1 here); the 60 s receive timeout is a hang bound.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;
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
    let service = section(unit, "Service");
    let line = &service
        .iter()
        .find(|(k, _)| k == "ExecStart")
        .expect("ExecStart")
        .1;
    let mut words = Vec::new();
    for w in line.split_whitespace() {
        let w = w.replace("%I", instance).replace("%i", instance);
        if let Some(var) = w.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
            words.push(env.get(var).cloned().unwrap_or_default());
        } else if let Some(var) = w.strip_prefix('$') {
            let v = env.get(var).cloned().unwrap_or_default();
            words.extend(v.split_whitespace().map(String::from));
        } else {
            words.push(w);
        }
    }
    words
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

#[test]
fn unit_verifies_with_systemd_analyze() {
    let Some(analyze) = tool_path("systemd-analyze", "unit_verifies_with_systemd_analyze") else {
        return;
    };
    let dir = TempDir::new("sd-verify");
    let unit = std::fs::read_to_string(UNIT).unwrap();
    assert!(unit.contains(UNIT_BIN), "ExecStart names {UNIT_BIN}");
    // verify checks that ExecStart's binary exists: point it at the one built.
    let path = dir.path("uraid@md0.service");
    std::fs::write(
        &path,
        unit.replace(UNIT_BIN, &uraid_bin().display().to_string()),
    )
    .unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {err}");
    // Unknown keys and bad values are warnings with exit 0: none may name the unit.
    assert!(
        !err.contains("uraid@"),
        "systemd-analyze verify warns: {err}"
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
        .replace("/run/uraid", &run_dir.display().to_string());
    let service = section(&unit, "Service");
    let get = |k: &str| {
        service
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("Type").as_deref(), Some("notify"));
    assert_eq!(get("KillSignal").as_deref(), Some("SIGTERM"));
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
