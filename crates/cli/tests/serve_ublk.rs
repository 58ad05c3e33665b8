//! `serve --ublk` options that need no kernel: `--recover` and `--ublk-id` are refused
//! before anything is opened when their companions are missing. (The kernel side, a server
//! SIGKILLed under fio and taken over, and the read-only device: tests/vm/ublk.sh.)

use uraid_testkit::prelude::*;

/// `--recover` takes over one named device: without `--ublk-id` it is refused, by name,
/// and the members stay clean.
#[test]
fn recover_needs_a_ublk_id() {
    let dir = TempDir::new("recover-id");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let out = uraid()
        .env("URAID_RUN_DIR", dir.run_dir())
        .args(["serve", "--ublk", "--no-nbd", "--recover"])
        .args(&members)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("required arguments were not provided") && err.contains("--ublk-id"),
        "{err}"
    );
    assert!(member_states(&members).iter().all(|s| s == "clean"));
}

/// `--ublk-id` names a ublk device: without `--ublk` it is refused.
#[test]
fn ublk_id_needs_ublk() {
    let dir = TempDir::new("ublk-id");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let out = uraid()
        .env("URAID_RUN_DIR", dir.run_dir())
        .args(["serve", "--ublk-id", "3"])
        .args(&members)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("required arguments were not provided") && err.contains("--ublk"),
        "{err}"
    );
    assert!(member_states(&members).iter().all(|s| s == "clean"));
}
