//! `uraid serve` as a test fixture: arrays on sparse member files, a served array as a
//! child process that is always killed, its control socket and output, and the host tools
//! that talk to it (fio's nbd engine, nbdinfo).

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cli::{json, ok, stdout, uraid};
use crate::tmp::{TempDir, MIB};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Checks that a served array ran with the engine its test asked for (`detail["serve"]`),
/// once traffic went through it. Where io_uring is unavailable the default engine falls back
/// to sync: a failure in CI, a recorded skip elsewhere.
pub fn check_engine(detail: &serde_json::Value, sync: bool, test: &str) {
    let got = detail["serve"]["io_engine"].as_str().unwrap_or("?");
    if sync {
        assert_eq!(got, "sync", "{test}: served with {got}, asked for sync");
    } else if got != "io_uring" {
        assert_eq!(got, "sync", "{test}: unknown engine {got}");
        crate::skip(
            test,
            "io_uring is unavailable here; served with sync instead",
        );
    }
}

/// Creates an array on `n` sparse files of `mib` MiB; roles in `missing` are left empty.
pub fn create_array(
    dir: &TempDir,
    level: &str,
    n: usize,
    mib: u64,
    missing: &[usize],
) -> Vec<PathBuf> {
    let mut args: Vec<String> = Vec::new();
    let mut paths = Vec::new();
    for i in 0..n {
        let p = dir.path(&format!("m{i}.img"));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(mib * MIB).unwrap();
        if missing.contains(&i) {
            args.push("missing".into());
        } else {
            args.push(p.display().to_string());
            paths.push(p);
        }
    }
    ok(uraid()
        .args([
            "create",
            "-l",
            level,
            "-n",
            &n.to_string(),
            "--chunk",
            "64K",
        ])
        .args(&args));
    paths
}

/// `uraid examine --json` states of the members.
pub fn member_states(members: &[PathBuf]) -> Vec<String> {
    members
        .iter()
        .map(|m| {
            let v = json(&ok(uraid().arg("examine").arg("--json").arg(m)));
            v["state"].as_str().unwrap_or("?").to_string()
        })
        .collect()
}

/// A running `uraid serve`, killed on drop if still running.
pub struct Served {
    /// The `uraid serve` process; `None` once a test has waited for it.
    pub child: Option<Child>,
    /// Its NBD Unix socket.
    pub sock: PathBuf,
    /// Its control socket.
    pub control: PathBuf,
    /// `URAID_RUN_DIR` of the server and of [`Served::cmd`].
    pub run_dir: PathBuf,
    /// The export's name (`md0`).
    pub name: String,
    /// Lines the server printed on stdout.
    pub lines: mpsc::Receiver<String>,
    /// The file that collects its stderr.
    pub stderr_path: PathBuf,
}

impl Served {
    /// `uraid serve` on a Unix socket in `dir`, with its control socket beside it.
    pub fn start(dir: &TempDir, members: &[PathBuf], extra: &[&str]) -> Served {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let sock = dir.path(&format!("nbd{n}.sock"));
        let control = dir.path(&format!("ctl{n}.sock"));
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--nbd".into(),
            format!("unix:{}", sock.display()),
            "--control".into(),
            control.display().to_string(),
            "--name".into(),
            "md0".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Served::spawn(dir, args, members, sock, control)
    }

    /// `uraid` with `args` then `members`, its stdout read line by line into
    /// [`Served::lines`]; returns once `control` accepts a connection (60 s at the most).
    pub fn spawn(
        dir: &TempDir,
        args: Vec<String>,
        members: &[PathBuf],
        sock: PathBuf,
        control: PathBuf,
    ) -> Served {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let stderr_path = dir.path(&format!("serve{n}.stderr"));
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut child = uraid()
            .args(&args)
            .args(members)
            .env("URAID_RUN_DIR", dir.run_dir())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn uraid serve");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let s = Served {
            child: Some(child),
            sock,
            control,
            run_dir: dir.run_dir(),
            name: "md0".into(),
            lines: rx,
            stderr_path,
        };
        s.wait_ready();
        s
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if UnixStream::connect(&self.control).is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!("uraid serve did not come up: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the server has printed on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The export's NBD URI (`nbd+unix:///md0?socket=...`).
    pub fn uri(&self) -> String {
        format!("nbd+unix:///{}?socket={}", self.name, self.sock.display())
    }

    /// The server's process id (0 once it was waited for).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// A `uraid` command that finds this server's run dir.
    pub fn cmd(&self) -> Command {
        let mut c = uraid();
        c.env("URAID_RUN_DIR", &self.run_dir);
        c
    }

    /// `uraid add --array ARRAY MEMBER` through the control socket (the array found from
    /// one of its member paths or URIs); fails the test if it fails.
    pub fn add(
        &self,
        array: impl AsRef<std::ffi::OsStr>,
        member: impl AsRef<std::ffi::OsStr>,
    ) -> Output {
        ok(self.cmd().arg("add").arg("--array").arg(array).arg(member))
    }

    /// `uraid detail --json` through the control socket (found from a member path).
    pub fn detail(&self, member: &Path) -> serde_json::Value {
        json(&ok(self.cmd().args(["detail", "--json"]).arg(member)))
    }

    /// Waits until `f` holds on [`Served::detail`], failing the test with the last detail
    /// after 120 s (a safety net for a hung server, no assertion about speed).
    pub fn wait_detail(&self, member: &Path, f: impl Fn(&serde_json::Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let d = self.detail(member);
            if f(&d) {
                return;
            }
            assert!(Instant::now() < deadline, "gave up waiting; detail: {d}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a signal and waits for the exit status.
    pub fn signal_and_wait(&mut self, sig: i32) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
        child.wait().unwrap()
    }

    /// Waits for the process to exit on its own (after `uraid stop`).
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.take().expect("running").wait().unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A child process (a client tool) killed on drop.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    /// Waits for the child and collects its output.
    pub fn wait_output(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }

    /// Whether the child has not exited yet.
    pub fn still_running(&mut self) -> bool {
        matches!(self.0.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// fio's nbd engine, randrw with crc32c verify.
pub fn fio_args(uri: &str, size_mib: u64, seed: u64) -> Vec<String> {
    vec![
        "--name=verify".into(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randrw".into(),
        "--rwmixread=50".into(),
        "--bs=4k".into(),
        "--iodepth=16".into(),
        format!("--size={size_mib}m"),
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
        "--verify_fatal=1".into(),
        format!("--randseed={seed}"),
        // No verify-state files left in the working directory.
        "--verify_state_save=0".into(),
        "--output-format=json".into(),
    ]
}

/// Runs fio and checks that it reported no error and moved data both ways.
pub fn fio_check(out: &Output) {
    let text = stdout(out);
    assert!(
        out.status.success(),
        "fio failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(out);
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "fio reported an error: {text}");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() > 0);
    assert!(job["read"]["io_bytes"].as_u64().unwrap() > 0);
}

/// Runs `qemu-io -f raw URI -c CMD...` (each of `cmds` in turn), which must succeed; gives
/// its stdout (where a failed `read -P` says "verification failed").
pub fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]).arg(uri);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    stdout(&ok(&mut c))
}

/// Size of the export as nbdinfo sees it.
pub fn nbd_size(uri: &str) -> u64 {
    let out = ok(Command::new("nbdinfo").arg("--size").arg(uri));
    stdout(&out).trim().parse().unwrap()
}

/// `nbdkit` serving one export on a Unix socket (a remote member for the tests), killed on
/// drop. Its URI is `nbd+unix:///?socket=...`.
pub struct Nbdkit {
    child: Option<Child>,
    /// Its Unix socket.
    pub sock: PathBuf,
}

impl Nbdkit {
    /// `nbdkit PLUGIN-ARGS` (e.g. `["memory", "32M"]`) on socket `name` in `dir`; returns
    /// once the socket accepts a connection (60 s at the most).
    pub fn start(dir: &TempDir, name: &str, args: &[&str]) -> Nbdkit {
        let sock = dir.path(&format!("{name}.sock"));
        let child = Command::new("nbdkit")
            .args(["-f", "--exit-with-parent", "-U"])
            .arg(&sock)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn nbdkit");
        let mut k = Nbdkit {
            child: Some(child),
            sock,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while UnixStream::connect(&k.sock).is_err() {
            if let Some(Ok(Some(st))) = k.child.as_mut().map(|c| c.try_wait()) {
                panic!("nbdkit {args:?} exited: {st}");
            }
            assert!(Instant::now() < deadline, "nbdkit {args:?} did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        k
    }

    /// The export's NBD URI.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    /// Kills the server (SIGKILL: a host that is lost, not one that shuts down) and waits
    /// until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        self.kill();
    }
}
