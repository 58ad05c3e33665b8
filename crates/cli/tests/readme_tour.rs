//! README.md's "A short tour" runs as written, top to bottom, in a scratch folder, so that
//! the README cannot drift from the command line.
//!
//! The block is taken from the README and run by bash with `set -euo pipefail`. Three
//! things differ from a person's shell, none of them in the block: `uraid` on PATH is this
//! build (the block's `cargo build` and `alias` are for people), `cargo` there does nothing,
//! and the NBD port is a free one (tests run side by side) instead of 10809.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The first ```sh block after the "## A short tour" heading.
fn tour(readme: &str) -> String {
    let at = readme
        .find("## A short tour")
        .expect("README.md has no \"## A short tour\"");
    let rest = &readme[at..];
    let start = rest.find("```sh\n").expect("no ```sh block in the tour") + 6;
    let len = rest[start..].find("```").expect("unterminated tour block");
    rest[start..start + len].to_string()
}

/// Whether `name` is on PATH or in /usr/sbin or /sbin (mdadm, for a user without them on
/// PATH); in CI a missing tool fails the test.
fn tool(name: &str) -> bool {
    uraid_testkit::need_tool(name, "the_readme_tour_runs_as_written")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn write_exe(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn the_readme_tour_runs_as_written() {
    if !["bash", "mdadm", "nbdinfo", "sha256sum", "truncate"]
        .iter()
        .all(|t| tool(t))
    {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let block = tour(&readme);
    let scratch = uraid_testkit::TempDir::new("readme-tour");
    let bin = scratch.0.join("bin");
    let tmp = scratch.0.join("tmp");
    let run = scratch.0.join("run");
    for d in [&bin, &tmp, &run] {
        std::fs::create_dir_all(d).unwrap();
    }
    let port = free_port();
    let uraid = env!("CARGO_BIN_EXE_uraid");
    write_exe(
        &bin.join("uraid"),
        &format!(
            "#!/bin/sh\nif [ \"$1\" = serve ]; then shift; exec {uraid} serve --nbd tcp:127.0.0.1:{port} \"$@\"; fi\nexec {uraid} \"$@\"\n"
        ),
    );
    write_exe(&bin.join("cargo"), "#!/bin/sh\nexit 0\n");
    let nbdinfo = uraid_testkit::skip::find_tool("nbdinfo").expect("nbdinfo");
    write_exe(
        &bin.join("nbdinfo"),
        &format!(
            "#!/bin/sh\nexec {} $(printf '%s\\n' \"$@\" | sed 's/:10809/:{port}/')\n",
            nbdinfo.display()
        ),
    );
    let script = scratch.0.join("tour.sh");
    std::fs::write(&script, format!("set -euo pipefail\n{block}")).unwrap();
    let path = format!(
        "{}:/usr/sbin:/sbin:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = scratch.0.join("tour.log");
    let mut child = Command::new("bash")
        .arg("-x")
        .arg(&script)
        .current_dir(&repo)
        .env("PATH", path)
        .env("TMPDIR", &tmp)
        .env("URAID_RUN_DIR", &run)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(scratch.0.join("tour.err")).unwrap())
        // Its own process group, so that whatever it left running is ended below.
        .process_group(0)
        .spawn()
        .expect("run bash");
    let pgid = child.id() as i32;
    // A safety net for a hung step (it is no assertion about speed).
    let deadline = Instant::now() + Duration::from_secs(900);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: signalling the process group this test created.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
    let err = std::fs::read_to_string(scratch.0.join("tour.err")).unwrap_or_default();
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let tail = |s: &str| {
        s.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    };
    let status = status.unwrap_or_else(|| panic!("the tour hung; trace:\n{}", tail(&err)));
    assert!(
        status.success(),
        "the README tour failed ({status}); stdout:\n{}\ntrace and stderr:\n{}",
        tail(&out),
        tail(&err)
    );
    // It did what it says: the scrub found the array consistent on the members it names,
    // and the two reads (whole and degraded) gave the same bytes.
    assert!(out.contains("mismatch_cnt: 0"), "{out}");
    let sums: Vec<&str> = out.lines().filter(|l| l.ends_with("  -")).collect();
    assert_eq!(sums.len(), 2, "{out}");
    assert_eq!(sums[0], sums[1], "the degraded read differs: {out}");
}
