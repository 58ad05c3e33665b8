//! `uraid serve --metrics` (issue 17): Prometheus' text format at GET /metrics, read by an
//! HTTP client (curl where installed, else a plain socket) and parsed by a Prometheus
//! parser: the request counters move by the IO done through NBD, the member counters and
//! gauges follow the engine (degraded and faulty after `uraid fail`), and a non-loopback
//! address is refused unless asked for.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;
use uraid_testkit::prelude::*;

/// The body of GET http://ADDR/metrics.
fn scrape_text(addr: &str) -> String {
    if tool_path("curl", "metrics (curl, else a plain socket)").is_some() {
        let out = ok(Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "60"])
            .arg(format!("http://{addr}/metrics")));
        return stdout(&out);
    }
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    body.to_string()
}

struct Scraped {
    text: String,
    scrape: prometheus_parse::Scrape,
}

impl Scraped {
    fn get(addr: &str) -> Scraped {
        let text = scrape_text(addr);
        let scrape =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
        Scraped { text, scrape }
    }

    /// The value of `name` with the labels `labels` (and any others).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let s = self
            .scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{}", self.text));
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{name} is {other:?}"),
        }
    }
}

fn metrics_addr(srv: &Served) -> String {
    loop {
        let line = srv
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("serve printed no metrics: line");
        if let Some(rest) = line.strip_prefix("metrics: http://") {
            return rest
                .strip_suffix("/metrics")
                .expect("…/metrics")
                .to_string();
        }
    }
}

#[test]
fn metrics_follow_io_and_member_state() {
    if !need_tool("qemu-io", "metrics_follow_io_and_member_state") {
        return;
    }
    let dir = TempDir::new("metrics");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let srv = Served::start(&dir, &members, &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&srv);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");

    let before = Scraped::get(&addr);
    let uuid = json(&ok(uraid().args(["examine", "--json"]).arg(&members[0])))["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let op = |o: &'static str| [("op", o), ("array", uuid.as_str())];
    assert_eq!(before.value("uraid_nbd_bytes_total", &op("write")), 0.0);
    assert_eq!(before.value("uraid_degraded", &[]), 0.0);
    assert_eq!(before.value("uraid_raid_disks", &[]), 2.0);
    assert_eq!(before.value("uraid_members", &[("state", "in_sync")]), 2.0);
    let member_writes = before.value("uraid_member_writes_total", &[]);

    qemu_io(
        &srv.uri(),
        &["write -P 0x5a 0 1M", "read -P 0x5a 0 512k", "flush"],
    );
    let after = Scraped::get(&addr);
    assert_eq!(
        after.value("uraid_nbd_bytes_total", &op("write")),
        1048576.0
    );
    assert_eq!(after.value("uraid_nbd_bytes_total", &op("read")), 524288.0);
    assert!(after.value("uraid_nbd_requests_total", &op("write")) >= 1.0);
    assert!(after.value("uraid_nbd_requests_total", &op("flush")) >= 1.0);
    assert_eq!(after.value("uraid_nbd_errors_total", &op("write")), 0.0);
    // raid1: every write reaches both members.
    assert!(
        after.value("uraid_member_writes_total", &[]) >= member_writes + 2.0,
        "{}",
        after.text
    );
    for o in ["read", "write", "flush"] {
        assert!(
            after.text.lines().any(
                |l| l.starts_with("uraid_nbd_request_latency_seconds_count{")
                    && l.contains(&format!("op=\"{o}\""))
            ),
            "no latency histogram for {o}:\n{}",
            after.text
        );
    }
    assert_eq!(after.value("uraid_sync_action", &[("action", "idle")]), 1.0);

    ok(srv.cmd().arg("fail").arg(&members[1]));
    let failed = Scraped::get(&addr);
    assert_eq!(failed.value("uraid_degraded", &[]), 1.0);
    assert_eq!(failed.value("uraid_members", &[("state", "faulty")]), 1.0);
    assert_eq!(failed.value("uraid_members", &[("state", "in_sync")]), 1.0);

    // A new sparse member: the recovery zeroes what was never written (the 7 MiB past
    // the data) instead of rebuilding it, and counts it.
    assert_eq!(failed.value("uraid_sync_zero_bytes_total", &[]), 0.0);
    ok(srv.cmd().arg("remove").arg(&members[1]));
    let spare = dir.image("spare.img", 8);
    srv.add(&members[0], &spare);
    ok(srv.cmd().arg("wait").arg(&members[0]));
    let rebuilt = Scraped::get(&addr);
    let zero = rebuilt.value("uraid_sync_zero_bytes_total", &[]);
    assert!(
        zero >= (4 << 20) as f64 && zero <= (7 << 20) as f64,
        "{zero} bytes skipped:\n{}",
        rebuilt.text
    );
}

#[test]
fn metrics_refuse_a_remote_address_unless_asked() {
    let dir = TempDir::new("metrics-remote");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let mut cmd = uraid();
    cmd.args(["serve", "--nbd"])
        .arg(format!("unix:{}", dir.path("n.sock").display()))
        .args(["--metrics", "0.0.0.0:0"])
        .env("URAID_RUN_DIR", dir.run_dir())
        .args(&members);
    let err = fails_cleanly(&mut cmd, &members);
    assert!(err.contains("--metrics-allow-remote"), "{err}");
    assert_eq!(err.matches("--metrics-allow-remote").count(), 1, "{err}");
}

/// A raid5's joined partial-stripe writes (`join_wait_us`) are counted in
/// `uraid_stripe_joins_total`: qemu-io's sequential chunk-sized writes from the array's start
/// lead a pending stripe (a sequential stream leads), and every stripe led ends written
/// whole or in pieces (full + partial = led), with the data read back.
#[test]
fn metrics_count_joined_partial_stripe_writes() {
    if !need_tool("qemu-io", "metrics_count_joined_partial_stripe_writes") {
        return;
    }
    let dir = TempDir::new("metrics-join");
    let members = create_array(&dir, "5", 4, 8, &[]);
    let srv = Served::start(&dir, &members, &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&srv);
    let chunk = 64 << 10; // create_array's chunk
    let writes: Vec<String> = (0..3)
        .map(|i| format!("aio_write -P 0x3c {} {chunk}", i * chunk))
        .chain(["aio_flush".to_string()])
        .collect();
    let cmds: Vec<&str> = writes.iter().map(String::as_str).collect();
    qemu_io(&srv.uri(), &cmds);
    qemu_io(&srv.uri(), &[&format!("read -P 0x3c 0 {}", 3 * chunk)]);
    let m = Scraped::get(&addr);
    let n = |what: &str| m.value("uraid_stripe_joins_total", &[("what", what)]);
    assert!(n("led") >= 1.0, "{}", m.text);
    assert_eq!(n("full") + n("partial"), n("led"), "{}", m.text);
    // The same counts in `detail`, as JSON and as text.
    let d = srv.detail(&members[0]);
    let j = &d["stripe_joins"];
    for what in ["led", "joined", "full", "partial"] {
        assert_eq!(j[what].as_f64(), Some(n(what)), "{what}: {d}");
    }
    let out = ok(srv.cmd().arg("detail").arg("--array").arg(&members[0]));
    let t = text(&out.stdout);
    assert!(
        t.contains(&format!("Stripe Joins : {} led", n("led") as u64)),
        "{t}"
    );
}
