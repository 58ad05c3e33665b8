//! Skips that CI cannot miss.
//!
//! A test whose tool is missing returns early and passes, and libtest hides what it printed.
//! So: with `CI` set (CI runs `.ci/run`, which installs every tool) a missing tool is a
//! failure that names it; outside CI the test skips, prints a SKIP line, and appends
//! `test: reason` to the file named by `URAID_SKIP_LOG`, which `scripts/test.sh` reports.

use std::io::Write;
use std::path::Path;

/// Folders searched besides `PATH`: mdadm and losetup live in sbin, which a user's `PATH`
/// may lack.
const SBIN: [&str; 3] = ["/usr/local/sbin", "/usr/sbin", "/sbin"];

/// Whether `tool` is an executable file on `PATH` or in an sbin folder.
pub fn find_tool(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN.iter().map(|d| Path::new(d).to_path_buf()))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// True when `tool` is installed; otherwise [`skip`]s `test` (a failure in CI).
pub fn need_tool(tool: &str, test: &str) -> bool {
    if find_tool(tool).is_some() {
        return true;
    }
    skip(
        test,
        &format!("{tool} is not installed (.ci/run installs it)"),
    );
    false
}

/// Where `tool` is installed; when it is not, [`skip`]s `test` (a failure in CI) and gives
/// `None`. For tests that run the tool by its path (mdadm from an sbin folder).
pub fn tool_path(tool: &str, test: &str) -> Option<std::path::PathBuf> {
    if need_tool(tool, test) {
        find_tool(tool)
    } else {
        None
    }
}

/// True when every tool is installed; the first missing one is reported.
pub fn need_tools(tools: &[&str], test: &str) -> bool {
    tools.iter().all(|t| need_tool(t, test))
}

/// Whether this run is CI's (the `CI` variable set and not empty).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// `test` cannot run here because of `reason` (a missing tool, not root). In CI that is a
/// failure: panics with the reason. Elsewhere it prints a SKIP line and records it.
pub fn skip(test: &str, reason: &str) {
    if in_ci() {
        panic!("{test}: {reason}; CI must run this test (CI is set), so fix the machine");
    }
    record(test, reason);
}

/// `test` does not apply to this machine (e.g. it checks the message for a missing kernel
/// driver on a kernel that has it): recorded and reported like a skip, also in CI.
pub fn skip_not_applicable(test: &str, reason: &str) {
    record(test, reason);
}

fn record(test: &str, reason: &str) {
    eprintln!("SKIP {test}: {reason}");
    let Some(log) = std::env::var_os("URAID_SKIP_LOG") else {
        return;
    };
    // One short line per write with O_APPEND: lines of parallel tests do not interleave.
    let line = format!("{test}: {reason}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!(
            "cannot record a skip in URAID_SKIP_LOG={}: {e}",
            Path::new(&log).display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_is_recorded_outside_ci_and_fails_in_ci() {
        // One test, because it sets process-wide variables.
        let log = std::env::temp_dir().join(format!("uraid-skiplog-{}", std::process::id()));
        let _ = std::fs::remove_file(&log);
        std::env::set_var("URAID_SKIP_LOG", &log);
        std::env::remove_var("CI");
        assert!(!need_tool("uraid-no-such-tool", "demo_test"));
        assert!(need_tool("sh", "demo_test"));
        skip_not_applicable("other_test", "kernel has it");
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            text,
            "demo_test: uraid-no-such-tool is not installed (.ci/run installs it)\n\
             other_test: kernel has it\n"
        );

        std::env::set_var("CI", "true");
        let r = std::panic::catch_unwind(|| need_tool("uraid-no-such-tool", "demo_test"));
        let msg = r.expect_err("a missing tool must fail in CI");
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("demo_test: uraid-no-such-tool is not installed"),
            "{msg}"
        );
        // Not applicable stays a skip in CI.
        skip_not_applicable("other_test", "kernel has it");
        std::env::remove_var("CI");
        std::env::remove_var("URAID_SKIP_LOG");
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 3);
        let _ = std::fs::remove_file(&log);
    }
}
