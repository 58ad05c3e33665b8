//! The `uraid` command for the command line's tests, and the runners that check how it
//! ended.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Extra arguments for the sync IO engine (pread/pwrite instead of io_uring); a global flag,
/// so it may follow the subcommand.
pub const SYNC: [&str; 2] = ["--io-engine", "sync"];

/// The `uraid` binary of this build. Cargo builds a package's binaries before its
/// integration tests and puts them one folder above the test binaries (`target/<profile>/`
/// beside `deps/`), which is where this looks, so it serves the cli's tests from a library.
pub fn uraid_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut dir = exe
        .parent()
        .expect("the test binary's folder")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("uraid");
    assert!(
        bin.is_file(),
        "{} is missing: the uraid binary is built for the uraid package's tests \
         (cargo test -p uraid)",
        bin.display()
    );
    bin
}

/// `uraid` with the default IO engine (io_uring); a test that wants pread/pwrite passes
/// [`SYNC`].
pub fn uraid() -> Command {
    let mut c = Command::new(uraid_bin());
    // What servers save at a clean stop goes to this test process's own directory, not
    // the host's /var/lib/uraid (unless the test environment names one).
    if std::env::var_os("URAID_STATE_DIR").is_none() {
        c.env("URAID_STATE_DIR", test_state_dir());
    }
    c
}

/// The state directory [`uraid`] gives the commands of this test process.
pub fn test_state_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("uraid-state-{}", std::process::id()))
}

/// Runs the command to its end and gives its output, whatever its status.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Runs the command and fails the test, with its status and output, unless it succeeds.
pub fn ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the command, which must fail and leave every one of `files` byte for byte as it
/// was; gives its stderr, for the caller to check what it said.
pub fn fails_cleanly(cmd: &mut Command, files: &[PathBuf]) -> String {
    let before = crate::data::snapshot(files);
    let out = run(cmd);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "{cmd:?} succeeded but must fail:\n{err}"
    );
    assert!(
        before == crate::data::snapshot(files),
        "{cmd:?} wrote to a member despite failing"
    );
    err
}

/// Runs the command with stdin empty (so that nothing waits on a terminal); it must fail
/// and say `needle` on stderr, which it gives back for further checks.
pub fn fails_with(cmd: &mut Command, needle: &str) -> String {
    let out = run(cmd.stdin(std::process::Stdio::null()));
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{cmd:?} succeeded:\n{err}");
    assert!(err.contains(needle), "{cmd:?}: no {needle:?} in:\n{err}");
    err
}

/// Bytes as text (lossy).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A command's stdout as text.
pub fn stdout(out: &Output) -> String {
    text(&out.stdout)
}

/// A command's stdout as JSON, from its first `{` or `[` (a served array's commands may
/// print a line before it).
pub fn json(out: &Output) -> serde_json::Value {
    let text = stdout(out);
    let start = text.find(['{', '[']).unwrap_or(0);
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("bad JSON ({e}): {text}"))
}

/// A command's stdout, which must be JSON and nothing else.
pub fn json_exact(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("json output")
}

/// The value of `key` in `mdadm --examine`/`--detail` style text (`   Key : value` lines).
pub fn mdadm_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(" : ")?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// `mdadm --examine MEMBER` by the mdadm at `md`, which must succeed: its text.
pub fn examine(md: &std::path::Path, member: &std::path::Path) -> String {
    let out = run(Command::new(md).arg("--examine").arg(member));
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// [`examine`], asserting that each `(key, value)` of `want` is what mdadm prints: its text.
pub fn examine_says(
    md: &std::path::Path,
    member: &std::path::Path,
    want: &[(&str, &str)],
) -> String {
    let ex = examine(md, member);
    for (key, value) in want {
        assert_eq!(
            mdadm_field(&ex, key).as_deref(),
            Some(*value),
            "{key} of {}: {ex}",
            member.display()
        );
    }
    ex
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn fails_cleanly_gives_stderr_and_catches_success_and_writes() {
        let d = crate::TempDir::new("tk-cli");
        let files = d.images(1, 1, "f");
        let err = fails_cleanly(&mut sh("echo refused >&2; exit 1"), &files);
        assert_eq!(err, "refused\n");
        let f = files[0].display().to_string();
        for script in ["exit 0".to_string(), format!("echo x >> {f}; exit 1")] {
            let r = std::panic::catch_unwind(|| fails_cleanly(&mut sh(&script), &files));
            assert!(r.is_err(), "{script} passed fails_cleanly");
        }
    }

    #[test]
    fn fails_with_wants_a_failure_that_says_the_needle() {
        assert_eq!(
            fails_with(&mut sh("echo no such array >&2; exit 2"), "no such"),
            "no such array\n"
        );
        for script in ["echo no such array >&2", "echo other >&2; exit 1"] {
            let r = std::panic::catch_unwind(|| fails_with(&mut sh(script), "no such"));
            assert!(r.is_err(), "{script} passed fails_with");
        }
    }

    #[test]
    fn json_skips_a_leading_line_and_mdadm_field_finds_a_key() {
        let out = ok(&mut sh("echo note; echo '{\"a\": 1}'"));
        assert_eq!(json(&out)["a"], 1);
        let r = std::panic::catch_unwind(|| json_exact(&out));
        assert!(r.is_err(), "json_exact took a leading line");
        let text = "     Raid Level : raid5\n   Array Size : 10\n";
        assert_eq!(mdadm_field(text, "Raid Level").as_deref(), Some("raid5"));
        assert_eq!(mdadm_field(text, "State"), None);
    }
}
