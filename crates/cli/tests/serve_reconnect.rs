//! An NBD client that reconnects (qemu's `reconnect-delay`, as `nbd-client -persist` does)
//! finds the export again when `uraid serve` is restarted on the same address (issue 17):
//! after a crash (SIGKILL, which leaves the Unix socket file behind) and after a clean stop
//! (SIGTERM). A write issued while no server runs completes once the next one is up, and
//! everything written reads back.
//!
//! One qemu-io process stays connected throughout; the test feeds it one command at a
//! time and waits for its answer (60 s hang bound each), so the order of the steps does not
//! depend on timing.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use uraid_testkit::prelude::*;

struct QemuIo {
    guard: ChildGuard,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl QemuIo {
    fn start(sock: &std::path::Path) -> QemuIo {
        let opts = format!(
            "driver=nbd,server.type=unix,server.path={},export=md0,reconnect-delay=60",
            sock.display()
        );
        let mut child = Command::new("qemu-io")
            .args(["--image-opts", &opts])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn qemu-io");
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        QemuIo {
            guard: ChildGuard(Some(child)),
            stdin,
            lines: rx,
            seen: Vec::new(),
        }
    }

    fn send(&mut self, cmd: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for a line containing `want`; a failed verify or IO error fails the test.
    fn expect(&mut self, want: &str) {
        loop {
            let line = match self.lines.recv_timeout(Duration::from_secs(60)) {
                Ok(l) => l,
                Err(e) => panic!("qemu-io: no {want:?} ({e}); said {:?}", self.seen),
            };
            self.seen.push(line.clone());
            assert!(
                !line.contains("verification failed") && !line.contains("failed:"),
                "qemu-io: {line}; said {:?}",
                self.seen
            );
            if line.contains(want) {
                return;
            }
        }
    }
}

fn serve(dir: &TempDir, members: &[PathBuf], sock: &std::path::Path, n: u32) -> Served {
    let control = dir.path(&format!("ctl{n}.sock"));
    let args = vec![
        "serve".to_string(),
        "--nbd".into(),
        format!("unix:{}", sock.display()),
        "--control".into(),
        control.display().to_string(),
        "--name".into(),
        "md0".into(),
    ];
    Served::spawn(dir, args, members, sock.to_path_buf(), control)
}

#[test]
fn qemu_reconnects_after_restart_on_same_address() {
    if !need_tool("qemu-io", "qemu_reconnects_after_restart_on_same_address") {
        return;
    }
    let dir = TempDir::new("reconnect");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let sock = dir.path("md0.nbd");
    let mut srv = serve(&dir, &members, &sock, 0);
    let mut q = QemuIo::start(&sock);
    q.send("write -P 0x11 0 64k");
    q.expect("wrote 65536/65536 bytes at offset 0");

    // A crash: the socket file stays; the next server must take the address anyway.
    srv.signal_and_wait(libc::SIGKILL);
    assert!(sock.exists(), "a killed server leaves its socket file");
    q.send("write -P 0x22 64k 64k");
    let mut srv = serve(&dir, &members, &sock, 1);
    q.expect("wrote 65536/65536 bytes at offset 65536");

    // A clean stop and start (systemctl restart).
    assert!(
        srv.signal_and_wait(libc::SIGTERM).success(),
        "{}",
        srv.stderr()
    );
    q.send("write -P 0x33 128k 64k");
    let mut srv = serve(&dir, &members, &sock, 2);
    q.expect("wrote 65536/65536 bytes at offset 131072");

    for (pattern, offset) in [("0x11", 0), ("0x22", 65536), ("0x33", 131072)] {
        q.send(&format!("read -P {pattern} {offset} 64k"));
        q.expect(&format!("read 65536/65536 bytes at offset {offset}"));
    }
    q.send("quit");
    drop(q.stdin.take());
    let out = q.guard.wait_output();
    assert!(out.status.success(), "qemu-io: {:?}", q.seen);
    ok(srv.cmd().arg("stop").arg(&members[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    assert_eq!(member_states(&members), ["clean", "clean"]);
}
