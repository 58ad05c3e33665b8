//! Members on other hosts (issue 16): each member is an NBD export (nbdkit's file plugin;
//! qemu-nbd and nbd-server where named) on a host of its own, a network namespace that the
//! test cuts off the network without a word to either side (`uraid_testkit::netns`).
//! While a writer runs through `uraid serve`, a lost host is a failed member after one
//! request timeout (`--nbd-timeout`): the writer sees no error, and everything reads back.
//! A second host lost on raid5 gives EIO, never wrong data. A host that comes back is
//! re-added and the bitmap makes its recovery copy only what it missed; a host back with an
//! empty disk is rebuilt whole. Nothing here times anything: waits are for states, with a
//! generous safety net.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use uraid_nbd::client::{Client, ClientConfig};
use uraid_testkit::netns::{need_netns, Host, ServerKind, PORT};
use uraid_testkit::prelude::*;

/// Bytes per write of the writers here.
const BLOCK: usize = 64 << 10;
/// Each request waits at most this for a lost host: then the member fails.
const SERVE: &[&str] = &["--nbd-timeout", "2"];

fn start_hosts(dir: &TempDir, n: usize, mib: u64) -> Vec<Host> {
    (0..n)
        .map(|i| Host::start(dir, &format!("h{i}"), mib))
        .collect()
}

fn uris_of(hosts: &[Host]) -> Vec<String> {
    hosts.iter().map(|h| h.uri()).collect()
}

fn paths(uris: &[String]) -> Vec<PathBuf> {
    uris.iter().map(PathBuf::from).collect()
}

/// Block `b`'s contents under `seed`.
fn block(seed: u64, b: u64) -> Vec<u8> {
    pattern(BLOCK, seed * 1_000_003 + b)
}

/// Writes blocks `blocks` (of [`BLOCK`] bytes, [`block`]`(seed, b)`) through `export` from a
/// thread; once `at` of them are acknowledged the writer waits while `mid` runs here (cut a
/// host off), so that the rest are written after it; gives the writer's outcome, its flush
/// included.
fn write_while(
    export: &str,
    blocks: std::ops::Range<u64>,
    seed: u64,
    at: u64,
    mid: impl FnOnce(),
) -> Result<(), String> {
    let (paused_tx, paused) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let (done_tx, done) = mpsc::channel();
    let writer = {
        let export = export.to_string();
        std::thread::spawn(move || {
            let c = Client::open(&export, &ClientConfig::default()).unwrap();
            for (i, b) in blocks.enumerate() {
                if i as u64 == at {
                    let _ = paused_tx.send(());
                    let _ = go.recv();
                }
                if let Err(e) = c.write(&block(seed, b), b * BLOCK as u64, false) {
                    let _ = done_tx.send(Err(format!("block {b}: {e}")));
                    return;
                }
            }
            let _ = done_tx.send(c.flush().map_err(|e| format!("flush: {e}")));
        })
    };
    paused
        .recv_timeout(Duration::from_secs(120))
        .expect("the writer did not get to the pause");
    mid();
    go_tx.send(()).unwrap();
    let r = done
        .recv_timeout(Duration::from_secs(300))
        .expect("writes hung after the host was lost");
    writer.join().unwrap();
    r
}

/// Reads blocks `blocks` back through `export`: every one must be [`block`]`(seed, b)`.
fn verify(export: &str, blocks: std::ops::Range<u64>, seed: u64) {
    let c = Client::open(export, &ClientConfig::default()).unwrap();
    let mut back = vec![0u8; BLOCK];
    for b in blocks {
        c.read(&mut back, b * BLOCK as u64)
            .unwrap_or_else(|e| panic!("block {b}: {e}"));
        assert!(back == block(seed, b), "block {b} differs");
    }
}

/// Byte offset of the data area in a member's image (its superblock read from the file
/// behind the export, not over the network).
fn data_offset(disk: &Path) -> u64 {
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(disk)));
    v["data_offset_sectors"].as_u64().unwrap() * 512
}

fn read_file_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; len];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, offset)
        .unwrap();
    b
}

fn member_state(d: &serde_json::Value, role: usize) -> String {
    d["members"][role]["state"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

/// raid1 over two hosts: host 1 is cut off a quarter into a write; the writer sees no
/// error, the member is faulty with its connection lost, and every block reads back. The
/// host comes back and is re-added (by `uraid add`, or with `auto` by the re-add daemon of
/// `--nbd-readd`): its recovery copies the bitmap's dirty chunk (the blocks it missed are
/// on its disk after) and nothing else (a marker left on its disk in a chunk nobody wrote
/// survives the recovery, which a full rebuild would have overwritten).
fn raid1_lost_host_comes_back(test: &str, auto: bool) {
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("hosts-raid1");
    let hosts = start_hosts(&dir, 2, 48);
    let uris = uris_of(&hosts);
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--bitmap", "internal"])
        .args(["--bitmap-chunk", "4M", "--assume-clean", "--run"])
        .args(&uris));
    let mut args = SERVE.to_vec();
    if auto {
        args.extend(["--nbd-readd", "0.2"]);
    }
    let mut srv = Served::start(&dir, &paths(&uris), &args);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);

    // 64 blocks: the first 4 MiB, bitmap chunk 0.
    write_while(&export, 0..64, 1, 16, || hosts[1].cut()).expect("no write fails");
    srv.wait_detail(a0, |d| member_state(d, 1) == "faulty");
    let d = srv.detail(a0);
    assert_eq!(d["degraded"], true, "{d}");
    assert_eq!(member_state(&d, 0), "active", "{d}");
    assert_eq!(d["members"][1]["remote"]["connection"], "lost", "{d}");
    verify(&export, 0..64, 1);
    if auto {
        // The daemon tries the lost host, and detail says so, in JSON and in text.
        srv.wait_detail(a0, |d| {
            d["members"][1]["remote"]["reconnect_attempts"]
                .as_u64()
                .unwrap_or(0)
                >= 1
        });
        let d = srv.detail(a0);
        assert!(
            d["members"][1]["remote"]["reconnect_error"].is_string(),
            "{d}"
        );
        assert_eq!(member_state(&d, 1), "faulty", "re-added while cut off: {d}");
        let t = stdout(&ok(srv.cmd().arg("detail").arg(&uris[0])));
        let row = t
            .lines()
            .find(|l| l.trim_start().starts_with("Remote 1 :"))
            .unwrap_or_else(|| panic!("no remote row for member 1:\n{t}"));
        assert!(
            row.contains(" lost (") && row.contains("reconnect attempts"),
            "{row}"
        );
    }

    // Host 1 missed the last blocks; a marker goes into a chunk nobody wrote (chunk 5).
    let off1 = data_offset(hosts[1].disk());
    let on_host1 = |b: u64| read_file_at(hosts[1].disk(), off1 + b * BLOCK as u64, BLOCK);
    assert!(
        on_host1(15) == block(1, 15),
        "host 1 lacks a block written before the cut"
    );
    for b in [16, 63] {
        assert!(
            on_host1(b) != block(1, b),
            "host 1 got block {b} although cut off"
        );
    }
    let marker = pattern(BLOCK, 99);
    let clean_at = off1 + (20 << 20);
    write_at(hosts[1].disk(), clean_at, &marker);

    hosts[1].restore();
    if !auto {
        ok(srv.cmd().arg("remove").arg(&uris[1]));
        srv.add(&uris[0], &uris[1]);
    }
    srv.wait_detail(a0, |d| d["degraded"] == false);
    let d = srv.detail(a0);
    assert_eq!(member_state(&d, 1), "active", "{d}");
    assert_eq!(d["members"][1]["remote"]["connection"], "up", "{d}");
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    if auto {
        let err = srv.stderr();
        assert!(
            err.contains("member 1 (") && err.contains("re-added, recovery started"),
            "{err}"
        );
    }

    for b in 0..64 {
        assert!(
            on_host1(b) == block(1, b),
            "host 1's block {b} was not recovered"
        );
    }
    assert!(
        read_file_at(hosts[1].disk(), clean_at, BLOCK) == marker,
        "the recovery copied a chunk the bitmap had clean: a full rebuild, not a re-add"
    );
}

#[test]
fn raid1_over_two_hosts_loses_one_mid_write_and_readds_it_partially() {
    raid1_lost_host_comes_back(
        "raid1_over_two_hosts_loses_one_mid_write_and_readds_it_partially",
        false,
    );
}

/// `--nbd-readd`: the host that comes back is re-added by the server itself.
#[test]
fn raid1_host_back_is_readded_by_itself_and_recovers_partially() {
    raid1_lost_host_comes_back(
        "raid1_host_back_is_readded_by_itself_and_recovers_partially",
        true,
    );
}

/// raid1 over two hosts, degraded (host 1 lost): host 0 now holds the only copy, so when
/// it drops off the network its requests are not failed at the first timeout (as host 1's
/// were: failfast) but retried, reconnecting with back-off (`--nbd-retry`). Host 0 comes
/// back while a write waits: the write succeeds, member 0 stays active, and the data reads
/// back; detail counts the reconnect.
#[test]
fn raid1_last_copy_reconnects_instead_of_eio() {
    let test = "raid1_last_copy_reconnects_instead_of_eio";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("hosts-retry");
    let hosts = start_hosts(&dir, 2, 48);
    let uris = uris_of(&hosts);
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--bitmap", "internal"])
        .args(["--bitmap-chunk", "4M", "--assume-clean", "--run"])
        .args(&uris));
    let mut args = SERVE.to_vec();
    // Long enough never to run out here: the test waits for states, not for time.
    args.extend(["--nbd-retry", "600"]);
    let mut srv = Served::start(&dir, &paths(&uris), &args);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);
    write_while(&export, 0..16, 5, 8, || hosts[1].cut()).expect("no write fails");
    srv.wait_detail(a0, |d| member_state(d, 1) == "faulty");

    // Host 0 drops off before the writer goes on; once the member's client gave up on
    // its connection and dials the host again, the host comes back.
    let written = std::thread::scope(|s| {
        let (cut_tx, cut) = mpsc::channel();
        let host0 = &hosts[0];
        let mut detail = srv.cmd();
        detail.args(["detail", "--json"]).arg(a0);
        s.spawn(move || {
            cut.recv().unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while !host0.being_dialled() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no reconnect to host 0"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            // While it dials, detail (and so status, the monitor, the metrics) says so.
            let d = json(&ok(&mut detail));
            host0.restore();
            assert_eq!(
                d["members"][0]["remote"]["connection"], "reconnecting",
                "{d}"
            );
        });
        write_while(&export, 16..32, 5, 0, || {
            host0.cut();
            cut_tx.send(()).unwrap();
        })
    });
    written.expect("the last copy's writes fail although its host came back");
    verify(&export, 0..32, 5);
    let d = srv.detail(a0);
    assert_eq!(member_state(&d, 0), "active", "{d}");
    let r = &d["members"][0]["remote"];
    assert_eq!(r["connection"], "up", "{d}");
    assert!(r["reconnect_attempts"].as_u64().unwrap_or(0) >= 1, "{d}");
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
}

/// A member's own `?timeout=1` stands in for the server's `--nbd-timeout` (an hour here):
/// its host cut off mid-write, the member fails after one second, the writer goes on (it
/// would wait out the hour, and the test's safety net fail, without it), and the member's
/// error names the 1 s wait. The other member keeps the hour.
#[test]
fn a_members_own_timeout_fails_it_without_waiting_for_the_servers() {
    let test = "a_members_own_timeout_fails_it_without_waiting_for_the_servers";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("hosts-timeout");
    let hosts = start_hosts(&dir, 2, 48);
    let uris = vec![hosts[0].uri(), format!("{}?timeout=1", hosts[1].uri())];
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--bitmap", "internal"])
        .args(["--bitmap-chunk", "4M", "--assume-clean", "--run"])
        .args(&uris));
    let mut srv = Served::start(&dir, &paths(&uris), &["--nbd-timeout", "3600"]);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);
    write_while(&export, 0..32, 7, 8, || hosts[1].cut()).expect("no write fails");
    srv.wait_detail(a0, |d| member_state(d, 1) == "faulty");
    let d = srv.detail(a0);
    let r = &d["members"][1]["remote"];
    assert_eq!(r["uri"], uris[1].as_str(), "{d}");
    assert_eq!(r["connection"], "lost", "{d}");
    assert!(
        r["error"].as_str().unwrap_or("").contains("within 1s"),
        "{d}"
    );
    assert_eq!(member_state(&d, 0), "active", "{d}");
    verify(&export, 0..32, 7);
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
}

/// raid5 over four hosts: one cut off mid-write is a failed member and the writer goes on
/// without an error; all reads back. A second host cut off leaves the array without its
/// data: reads and writes get EIO (a clear error), and no read returns wrong data.
#[test]
fn raid5_over_four_hosts_survives_one_lost_and_gives_eio_for_two() {
    let test = "raid5_over_four_hosts_survives_one_lost_and_gives_eio_for_two";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("hosts-raid5");
    let hosts = start_hosts(&dir, 4, 48);
    let uris = uris_of(&hosts);
    ok(uraid()
        .args(["create", "-l", "5", "-n", "4", "--chunk", "64K"])
        .args(["--bitmap", "internal", "--bitmap-chunk", "4M"])
        .args(["--assume-clean", "--run"])
        .args(&uris));
    // Degraded, the others hold the last copies: they retry a lost connection, for 1 s.
    let mut args = SERVE.to_vec();
    args.extend(["--nbd-retry", "1"]);
    let srv = Served::start(&dir, &paths(&uris), &args);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);

    write_while(&export, 0..96, 2, 24, || hosts[1].cut()).expect("no write fails");
    srv.wait_detail(a0, |d| member_state(d, 1) == "faulty");
    assert_eq!(srv.detail(a0)["degraded"], true);
    verify(&export, 0..96, 2);

    hosts[2].cut();
    let c = Client::open(&export, &ClientConfig::default()).unwrap();
    let mut back = vec![0u8; BLOCK];
    let mut failed = 0;
    for b in 0..96 {
        match c.read(&mut back, b * BLOCK as u64) {
            Ok(()) => assert!(back == block(2, b), "block {b}: wrong data, not an error"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("Input/output error"), "block {b}: {msg}");
                failed += 1;
            }
        }
    }
    // Every 4-block stripe has data on host 1 or 2.
    assert!(failed >= 48, "only {failed} of 96 blocks failed");
    let w = c.write(&block(3, 0), 0, true);
    assert!(w.is_err(), "a write to raid5 without two members succeeded");
    let d = srv.detail(a0);
    assert_eq!(member_state(&d, 0), "active", "{d}");
    assert_eq!(member_state(&d, 3), "active", "{d}");
}

/// `level` over `n` hosts: the hosts in `cut` are cut off one after the other while a
/// writer runs (each at its own point of the write); no write fails, each lost member is
/// faulty, the rest active, and every block reads back.
fn hosts_lost_mid_write(test: &str, level: &str, n: usize, cut: &[usize]) {
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new(&format!("hosts-raid{level}"));
    let hosts = start_hosts(&dir, n, 48);
    let uris = uris_of(&hosts);
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
        .args(["--bitmap", "internal", "--bitmap-chunk", "4M"])
        .args(["--assume-clean", "--run"])
        .args(&uris));
    let srv = Served::start(&dir, &paths(&uris), SERVE);
    let export = srv.uri();
    let kept = (0..n).find(|r| !cut.contains(r)).unwrap();
    let a0 = Path::new(&uris[kept]);
    let per = 32u64;
    for (i, &h) in cut.iter().enumerate() {
        let first = i as u64 * per;
        write_while(&export, first..first + per, 6, per / 4, || hosts[h].cut())
            .unwrap_or_else(|e| panic!("a write failed with host {h} lost: {e}"));
        srv.wait_detail(a0, |d| member_state(d, h) == "faulty");
    }
    let d = srv.detail(a0);
    for r in 0..n {
        let want = if cut.contains(&r) { "faulty" } else { "active" };
        assert_eq!(member_state(&d, r), want, "member {r}: {d}");
    }
    verify(&export, 0..cut.len() as u64 * per, 6);
}

/// raid6 over six hosts loses two, one after the other, mid-write.
#[test]
fn raid6_over_six_hosts_loses_two_mid_write_and_goes_on() {
    hosts_lost_mid_write(
        "raid6_over_six_hosts_loses_two_mid_write_and_goes_on",
        "6",
        6,
        &[1, 4],
    );
}

/// raid10 (near 2) over four hosts loses one of each mirror pair mid-write.
#[test]
fn raid10_over_four_hosts_loses_one_per_pair_mid_write_and_goes_on() {
    hosts_lost_mid_write(
        "raid10_over_four_hosts_loses_one_per_pair_mid_write_and_goes_on",
        "10",
        4,
        &[0, 3],
    );
}

/// raid5 over three hosts: one restarts with an empty disk (its server killed, the disk
/// swapped). Its member fails on the next write; the re-add daemon leaves it alone (no
/// superblock: not this array's member), and added by hand it is rebuilt whole: a region written before the loss (clean in the
/// bitmap) is on it too, read back with another member left out.
#[test]
fn raid5_host_back_with_an_empty_disk_is_rebuilt_fully() {
    let test = "raid5_host_back_with_an_empty_disk_is_rebuilt_fully";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("hosts-rebuild");
    let mut hosts = start_hosts(&dir, 3, 48);
    let uris = uris_of(&hosts);
    ok(uraid()
        .args(["create", "-l", "5", "-n", "3", "--chunk", "64K"])
        .args(["--bitmap", "internal", "--bitmap-chunk", "4M"])
        .args(["--assume-clean", "--run"])
        .args(&uris));
    // With the re-add daemon on: an empty disk is not its member any more, so it is left
    // alone (a re-add would take it for the old member and copy only the dirty chunks).
    let mut args = SERVE.to_vec();
    args.extend(["--nbd-readd", "0.2"]);
    let mut srv = Served::start(&dir, &paths(&uris), &args);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);
    // Array blocks 0..32 (member chunk 0) and 640..672 (40 MiB: member chunk 5).
    write_while(&export, 0..32, 4, 0, || {}).unwrap();
    write_while(&export, 640..672, 4, 0, || {}).unwrap();

    hosts[2].restart(true);
    // The next writes find host 2's connection reset: it fails, they succeed.
    write_while(&export, 32..64, 4, 0, || {}).expect("no write fails");
    srv.wait_detail(a0, |d| member_state(d, 2) == "faulty");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !srv
        .stderr()
        .contains("is not re-added: it has no superblock")
    {
        assert!(std::time::Instant::now() < deadline, "{}", srv.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(member_state(&srv.detail(a0), 2), "faulty");

    ok(srv.cmd().arg("remove").arg(&uris[2]));
    srv.add(&uris[0], &uris[2]);
    srv.wait_detail(a0, |d| d["degraded"] == false);
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());

    // Host 0 left out: its share comes from hosts 1 and 2, the rebuilt one.
    for (first, count) in [(0u64, 64u64), (640, 32)] {
        read_back_without_host0(&dir, &uris, first..first + count, 4);
    }
}

/// Reads blocks `range` of the array from every member but host 0's (`uraid read` offline)
/// and checks each holds `block(seed, b)`.
fn read_back_without_host0(dir: &TempDir, uris: &[String], range: Range<u64>, seed: u64) {
    let out = dir.path(&format!("back{}.bin", range.start));
    ok(uraid()
        .args([
            "read",
            "--offset",
            &(range.start * BLOCK as u64).to_string(),
        ])
        .args([
            "--length",
            &((range.end - range.start) * BLOCK as u64).to_string(),
        ])
        .arg("--output")
        .arg(&out)
        .args(&uris[1..]));
    let got = std::fs::read(&out).unwrap();
    for b in range.clone() {
        let at = ((b - range.start) as usize) * BLOCK;
        assert!(
            got[at..at + BLOCK] == block(seed, b)[..],
            "block {b} differs without host 0"
        );
    }
}

/// raid5 over three hosts, one of them running nbd-server (the NBD project's server, a
/// named export, simple replies, a daemon forking per client): the nbd-server host is cut
/// off mid-write, the writer sees no error, its member is faulty and everything reads
/// back. Restored, it is re-added and recovered; then its server is killed (the daemon and
/// the child serving the member) and restarted with its disk kept: the next writes fail
/// the member on its reset connection, not the writer, and it is re-added again. At the
/// end the blocks read back with host 0 left out, so from the nbd-server host's disk too.
#[test]
fn raid5_over_three_hosts_with_an_nbd_server_one_cut_and_restarted_mid_write() {
    let test = "raid5_over_three_hosts_with_an_nbd_server_one_cut_and_restarted_mid_write";
    if !need_netns(test) || !need_tools(&[ServerKind::NbdServer.program()], test) {
        return;
    }
    let dir = TempDir::new("hosts-nbd-server");
    let mut hosts = vec![
        Host::start(&dir, "h0", 48),
        Host::start(&dir, "h1", 48),
        Host::start_with(&dir, "nbd-server", 48, ServerKind::NbdServer),
    ];
    let uris = uris_of(&hosts);
    assert!(uris[2].ends_with("/disk"), "{}", uris[2]);
    ok(uraid()
        .args(["create", "-l", "5", "-n", "3", "--chunk", "64K"])
        .args(["--bitmap", "internal", "--bitmap-chunk", "4M"])
        .args(["--assume-clean", "--run"])
        .args(&uris));
    // The superblock went over NBD to the file behind nbd-server's export.
    let v = json(&ok(uraid()
        .arg("examine")
        .arg("--json")
        .arg(hosts[2].disk())));
    assert_eq!(v["role"], "Active device 2", "{v}");
    let mut srv = Served::start(&dir, &paths(&uris), SERVE);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);
    let readd = |srv: &Served| {
        ok(srv.cmd().arg("remove").arg(&uris[2]));
        srv.add(&uris[0], &uris[2]);
        srv.wait_detail(a0, |d| d["degraded"] == false);
        let d = srv.detail(a0);
        assert_eq!(member_state(&d, 2), "active", "{d}");
        assert_eq!(d["members"][2]["remote"]["connection"], "up", "{d}");
    };

    write_while(&export, 0..96, 8, 24, || hosts[2].cut()).expect("no write fails");
    srv.wait_detail(a0, |d| member_state(d, 2) == "faulty");
    let d = srv.detail(a0);
    assert_eq!(d["degraded"], true, "{d}");
    assert_eq!(d["members"][2]["remote"]["connection"], "lost", "{d}");
    assert_eq!(d["members"][2]["remote"]["uri"], uris[2].as_str(), "{d}");
    verify(&export, 0..96, 8);
    hosts[2].restore();
    readd(&srv);

    // The server dies and comes back, the disk kept: the member's connection is reset.
    write_while(&export, 96..192, 8, 24, || hosts[2].restart(false)).expect("no write fails");
    srv.wait_detail(a0, |d| member_state(d, 2) == "faulty");
    verify(&export, 0..192, 8);
    readd(&srv);
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());

    read_back_without_host0(&dir, &uris, 0..192, 8);
}

/// fio's own verify through `uraid serve`: raid1 over a host running nbdkit and one running
/// qemu-nbd. fio (nbd engine) writes crc32c-verified blocks; once it is under way the
/// qemu-nbd host is cut off, and fio goes on without an error (the member fails after its
/// timeout; that it failed shows the writes went on after the cut). A second fio then
/// verifies every block it wrote, read from the host that stayed.
#[test]
fn fio_verify_through_raid1_over_nbdkit_and_qemu_nbd_with_a_host_cut_mid_write() {
    let test = "fio_verify_through_raid1_over_nbdkit_and_qemu_nbd_with_a_host_cut_mid_write";
    if !need_netns(test) || !need_tools(&["fio", "qemu-nbd"], test) {
        return;
    }
    let dir = TempDir::new("hosts-fio");
    let hosts = [
        Host::start_with(&dir, "kit", 96, ServerKind::Nbdkit),
        Host::start_with(&dir, "qemu", 96, ServerKind::QemuNbd),
    ];
    let uris = uris_of(&hosts);
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--bitmap", "internal"])
        .args(["--bitmap-chunk", "4M", "--assume-clean", "--run"])
        .args(&uris));
    let mut srv = Served::start(&dir, &paths(&uris), SERVE);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);
    // Under way: 8 MiB landed on the nbdkit host's disk.
    fio_write_with_a_cut(
        fio_job(&dir, &export, 64, false),
        hosts[0].disk(),
        8 << 20,
        || hosts[1].cut(),
    );
    srv.wait_detail(a0, |d| member_state(d, 1) == "faulty");
    assert_eq!(member_state(&srv.detail(a0), 0), "active");
    fio_verified(&dir, &export, 64);
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
}

/// fio (nbd engine) through `export`: 4 KiB random writes of crc32c-verified blocks over the
/// first `mib` MiB (seed 16), or with `verify_only` the verify pass of the same job.
fn fio_job(dir: &TempDir, export: &str, mib: u64, verify_only: bool) -> std::process::Command {
    let mut c = std::process::Command::new("fio");
    c.args([
        "--name=remote",
        "--ioengine=nbd",
        &format!("--uri={export}"),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        &format!("--size={mib}m"),
        "--verify=crc32c",
        "--verify_fatal=1",
        "--randseed=16",
        "--verify_state_save=0",
        "--output-format=json",
    ]);
    c.arg(if verify_only {
        "--verify_only=1"
    } else {
        "--do_verify=0"
    });
    c.current_dir(dir.path("."));
    c
}

/// Runs `job` to the end: fio exits 0 and reports no error; gives its JSON.
fn fio_passes(mut job: std::process::Command, what: &str) -> serde_json::Value {
    let out = job.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio {what} failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["jobs"][0]["error"], 0, "fio {what}: {text}");
    v
}

/// Runs the fio `writer` job; once `grow` more bytes are allocated in `watch` (a host's
/// sparse disk file, which fills as written: fio is under way), `cut` runs; fio must end
/// without an error.
fn fio_write_with_a_cut(
    mut writer: std::process::Command,
    watch: &Path,
    grow: u64,
    cut: impl FnOnce(),
) {
    use std::os::unix::fs::MetadataExt;
    let child = writer
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let allocated = || std::fs::metadata(watch).unwrap().blocks() * 512;
    let start = allocated();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while allocated() < start + grow {
        assert!(std::time::Instant::now() < deadline, "fio wrote nothing");
        std::thread::sleep(Duration::from_millis(10));
    }
    cut();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed with a host cut: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["jobs"][0]["error"], 0, "{text}");
}

/// fio's verify pass of [`fio_job`]'s `mib` MiB passes and reads them all.
fn fio_verified(dir: &TempDir, export: &str, mib: u64) {
    let v = fio_passes(fio_job(dir, export, mib, true), "verify");
    assert!(
        v["jobs"][0]["read"]["io_bytes"].as_u64().unwrap_or(0) >= mib << 20,
        "the verify pass read less than was written: {v}"
    );
}

/// The chunks of the internal bitmap on a member's disk (read from the file behind its
/// export): how many it has, and which are dirty.
fn dirty_chunks(disk: &Path) -> (u64, Vec<u64>) {
    use uraid_core::bitmap::{is_dirty, BitmapSuper, BITMAP_SUPER_BYTES};
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(disk)));
    let at = (v["super_offset_sectors"].as_u64().unwrap() as i64
        + v["bitmap_offset_sectors"].as_i64().expect("no bitmap"))
        * 512;
    let head = read_file_at(disk, at as u64, BITMAP_SUPER_BYTES);
    let bms = BitmapSuper::decode(&head).unwrap();
    let chunks = bms.chunks();
    let bits = read_file_at(
        disk,
        at as u64 + BITMAP_SUPER_BYTES as u64,
        chunks.div_ceil(8) as usize,
    );
    (
        chunks,
        (0..chunks).filter(|&c| is_dirty(&bits, c)).collect(),
    )
}

/// Bitmap chunk of the tests here (`--bitmap-chunk 4M`), in MiB.
const BITMAP_CHUNK_MIB: u64 = 4;

/// fio verify through `level` over `n` hosts (host `n - 1` runs qemu-nbd, the others
/// nbdkit), writing only the first [`FIO_REGION_MIB`] of the array: host `cut` is cut off
/// once fio is under way, and fio finishes without an error; a verify pass reads it all
/// back. The bitmap on a host that stayed has dirty chunks only where fio wrote (counted).
/// Before the host comes back, a marker goes into each of its bitmap-clean chunks; it
/// comes back (restarted, its disk kept) and is re-added, and its recovery leaves every marker in place (it copied
/// only dirty chunks). Then host `then_cut` is cut off, so that what host `cut` missed is
/// read from it (or rebuilt from it), and fio's verify passes again.
fn fio_host_cut_and_readded(test: &str, level: &str, n: usize, cut: usize, then_cut: usize) {
    if !need_netns(test) || !need_tools(&["fio", "qemu-nbd"], test) {
        return;
    }
    const FIO_REGION_MIB: u64 = 24;
    let dir = TempDir::new(&format!("hosts-fio{level}"));
    let mut hosts: Vec<Host> = (0..n)
        .map(|i| {
            let kind = if i == n - 1 {
                ServerKind::QemuNbd
            } else {
                ServerKind::Nbdkit
            };
            Host::start_with(&dir, &format!("h{i}"), 48, kind)
        })
        .collect();
    let uris = uris_of(&hosts);
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
        .args(["--bitmap", "internal", "--bitmap-chunk", "4M"])
        .args(["--assume-clean", "--run"])
        .args(&uris));
    let mut srv = Served::start(&dir, &paths(&uris), SERVE);
    let export = srv.uri();
    let kept = (0..n).find(|&r| r != cut && r != then_cut).unwrap();
    let a0 = Path::new(&uris[kept]);
    let dev_bytes = srv.detail(a0)["used_dev_sectors"].as_u64().unwrap() * 512;

    fio_write_with_a_cut(
        fio_job(&dir, &export, FIO_REGION_MIB, false),
        hosts[kept].disk(),
        2 << 20,
        || hosts[cut].cut(),
    );
    srv.wait_detail(a0, |d| member_state(d, cut) == "faulty");
    fio_verified(&dir, &export, FIO_REGION_MIB);

    // How far fio's region reaches on each member, and so in the bitmap: raid5/6 track
    // member sectors, raid10 array sectors.
    let data_disks = match level {
        "5" => n as u64 - 1,
        "6" => n as u64 - 2,
        "10" => n as u64 / 2,
        _ => unreachable!(),
    };
    let member_mib = FIO_REGION_MIB.div_ceil(data_disks);
    let region_chunks = if level == "10" {
        FIO_REGION_MIB
    } else {
        member_mib
    }
    .div_ceil(BITMAP_CHUNK_MIB);
    let (chunks, dirty) = dirty_chunks(hosts[kept].disk());
    eprintln!(
        "raid{level}: {} of {chunks} bitmap chunks dirty after the cut: {dirty:?}",
        dirty.len()
    );
    assert!(
        !dirty.is_empty(),
        "nothing dirty although fio wrote after the cut"
    );
    assert!(
        dirty.iter().all(|&c| c < region_chunks),
        "a chunk fio never wrote is dirty: {dirty:?} (fio's reach: {region_chunks} chunks)"
    );

    // Markers on host `cut`, 1 MiB into each 4 MiB of its data past fio's reach (with a
    // chunk of margin): in bitmap chunks nobody wrote.
    let off = data_offset(hosts[cut].disk());
    let first = member_mib.div_ceil(BITMAP_CHUNK_MIB) + 1;
    let markers: Vec<u64> = (first..)
        .map(|c| (c * BITMAP_CHUNK_MIB + 1) << 20)
        .take_while(|&m| m + BLOCK as u64 <= dev_bytes)
        .collect();
    assert!(markers.len() >= 3, "{dev_bytes} bytes per member");
    for (i, &m) in markers.iter().enumerate() {
        write_at(hosts[cut].disk(), off + m, &pattern(BLOCK, 500 + i as u64));
    }

    // The host comes back as after a reboot, its disk kept. (Restored with its server
    // still running, nbdkit 1.32 can die on an assertion when the connections it had
    // before the cut are reset: `raw_send_socket: Assertion 'sock >= 0' failed`.)
    hosts[cut].restart(false);
    ok(srv.cmd().arg("remove").arg(&uris[cut]));
    srv.add(&uris[kept], &uris[cut]);
    srv.wait_detail(a0, |d| d["degraded"] == false);
    let kept_markers = markers
        .iter()
        .enumerate()
        .filter(|&(i, &m)| {
            read_file_at(hosts[cut].disk(), off + m, BLOCK) == pattern(BLOCK, 500 + i as u64)
        })
        .count();
    assert_eq!(
        kept_markers,
        markers.len(),
        "the recovery wrote over clean chunks: a full rebuild, not a re-add of {} dirty chunks",
        dirty.len()
    );

    // What host `cut` missed must now be on it: with host `then_cut` gone too, fio's
    // verify reads it from there (or rebuilds from it).
    hosts[then_cut].cut();
    // A read is enough to find the lost host: the verify pass fails it on its way.
    fio_verified(&dir, &export, FIO_REGION_MIB);
    srv.wait_detail(a0, |d| member_state(d, then_cut) == "faulty");
    assert_eq!(member_state(&srv.detail(a0), cut), "active");
    ok(srv.cmd().arg("stop").arg(&uris[kept]));
    assert!(srv.wait().success(), "{}", srv.stderr());
}

/// raid5 over four hosts under fio verify: one cut off mid-write, re-added (dirty chunks
/// only), then another lost: its data is rebuilt from the re-added one.
#[test]
fn fio_verify_raid5_over_four_hosts_cut_readded_then_another_lost() {
    fio_host_cut_and_readded(
        "fio_verify_raid5_over_four_hosts_cut_readded_then_another_lost",
        "5",
        4,
        1,
        2,
    );
}

/// raid6 over six hosts, as raid5 (a qemu-nbd host among nbdkit ones).
#[test]
fn fio_verify_raid6_over_six_hosts_cut_readded_then_another_lost() {
    fio_host_cut_and_readded(
        "fio_verify_raid6_over_six_hosts_cut_readded_then_another_lost",
        "6",
        6,
        2,
        5,
    );
}

/// raid10 (near 2) over four hosts: host 1 cut off and re-added, then its mirror (host 0)
/// lost, so the blocks host 1 missed can only come from its recovery.
#[test]
fn fio_verify_raid10_over_four_hosts_cut_readded_then_its_mirror_lost() {
    fio_host_cut_and_readded(
        "fio_verify_raid10_over_four_hosts_cut_readded_then_its_mirror_lost",
        "10",
        4,
        1,
        0,
    );
}

/// raid5 over three hosts with a spare on a fourth (added while served): a host cut off mid-write fails, and
/// the spare host takes its role (rebuilt whole, as a local spare would be) while the
/// writer goes on. After the stop the array reads back right without host 0, that is from
/// host 2 and the spare that took role 1.
#[test]
fn a_spare_on_another_host_takes_over_a_lost_hosts_role() {
    let test = "a_spare_on_another_host_takes_over_a_lost_hosts_role";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("hosts-spare");
    let hosts = start_hosts(&dir, 4, 48);
    let uris = uris_of(&hosts);
    ok(uraid()
        .args(["create", "-l", "5", "-n", "3", "--chunk", "64K"])
        .args(["--bitmap", "internal", "--bitmap-chunk", "4M"])
        .args(["--assume-clean", "--run"])
        .args(&uris[..3]));
    let mut srv = Served::start(&dir, &paths(&uris[..3]), SERVE);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);
    // Added to a whole array, the fourth host is a spare.
    srv.add(a0, &uris[3]);
    assert_eq!(
        srv.detail(a0)["spares"].as_array().map(|s| s.len()),
        Some(1),
        "{}",
        srv.detail(a0)
    );
    write_while(&export, 0..96, 8, 24, || hosts[1].cut()).expect("no write fails");
    srv.wait_detail(a0, |d| {
        d["degraded"] == false && d["members"][1]["device"] == uris[3].as_str()
    });
    let d = srv.detail(a0);
    assert_eq!(d["members"][1]["remote"]["uri"], uris[3].as_str(), "{d}");
    assert_eq!(d["members"][1]["remote"]["connection"], "up", "{d}");
    verify(&export, 0..96, 8);
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    assert!(
        srv.stderr().contains("spare"),
        "no word of the spare: {}",
        srv.stderr()
    );

    let out = dir.path("back.bin");
    ok(uraid()
        .args([
            "read",
            "--length",
            &(96 * BLOCK as u64).to_string(),
            "--output",
        ])
        .arg(&out)
        .args([&uris[2], &uris[3]]));
    let got = std::fs::read(&out).unwrap();
    for b in 0..96u64 {
        let at = b as usize * BLOCK;
        assert!(
            got[at..at + BLOCK] == block(8, b)[..],
            "block {b} differs without host 0"
        );
    }
}

/// Hosts behind a slow, lossy link (`uraid_testkit::proxy`: 15 ms each way, 1 in 20
/// chunks held up 300 ms as by a retransmission) stay members: raid1 over a near host and
/// a far one, fio's verify passes, nothing fails (the stalls are well inside the 2 s
/// timeout), and detail reports the far member's latency at least the link's round trip.
#[test]
fn a_slow_lossy_link_within_the_timeout_fails_nothing() {
    let test = "a_slow_lossy_link_within_the_timeout_fails_nothing";
    if !need_netns(test) || !need_tools(&["fio"], test) {
        return;
    }
    use uraid_testkit::proxy::{DelayProxy, Link};
    let dir = TempDir::new("hosts-slow");
    let hosts = start_hosts(&dir, 2, 48);
    let link = Link {
        delay: Duration::from_millis(15),
        loss: 0.05,
        stall: Duration::from_millis(300),
        seed: 16,
    };
    let proxy = DelayProxy::start(std::net::SocketAddr::from((hosts[1].addr, PORT)), link);
    let uris = vec![hosts[0].uri(), format!("nbd://{}/", proxy.addr())];
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--bitmap", "internal"])
        .args(["--bitmap-chunk", "4M", "--assume-clean", "--run"])
        .args(&uris));
    let mut srv = Served::start(&dir, &paths(&uris), SERVE);
    let export = srv.uri();
    let a0 = Path::new(&uris[0]);
    fio_passes(fio_job(&dir, &export, 8, false), "write");
    fio_passes(fio_job(&dir, &export, 8, true), "verify");
    let d = srv.detail(a0);
    assert_eq!(d["degraded"], false, "{d}");
    assert_eq!(member_state(&d, 1), "active", "{d}");
    let far = &d["members"][1]["remote"];
    assert_eq!(far["connection"], "up", "{d}");
    let us = far["latency_us"]
        .as_u64()
        .expect("no latency for the far member");
    assert!(us >= 30_000, "latency {us} us over a 30 ms round trip: {d}");
    assert!(proxy.stalls() > 0, "the link never stalled: no loss tried");
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
}
