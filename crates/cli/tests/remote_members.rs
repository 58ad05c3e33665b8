//! Members on NBD exports (issue 16): `nbd+unix://` URIs wherever a member path goes
//! (create, examine, write, read, serve, detail), nbdkit as the remote hosts; a host killed
//! while the array is being written is a failed member, IO goes on, the data reads back,
//! nothing hangs, and the bitmap of the members left keeps what the lost one missed.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use uraid_engine::{BitmapState, Member, NbdClientConfig, NbdMember};
use uraid_nbd::client::{Client, ClientConfig};
use uraid_testkit::prelude::*;

/// A member's bytes at `offset` of its data area, read over NBD (not through uraid's array).
fn member_data(uri: &str, offset: u64, len: usize) -> Vec<u8> {
    let v = json(&ok(uraid().args(["examine", "--json", uri])));
    let data_offset = v["data_offset_sectors"].as_u64().unwrap() * 512;
    let c = Client::open(uri, &ClientConfig::default()).unwrap();
    let mut b = vec![0u8; len];
    c.read(&mut b, data_offset + offset).unwrap();
    b
}

fn paths(uris: &[String]) -> Vec<PathBuf> {
    uris.iter().map(PathBuf::from).collect()
}

#[test]
fn raid1_on_two_nbd_exports_create_examine_write_read_serve() {
    if !need_tool(
        "nbdkit",
        "raid1_on_two_nbd_exports_create_examine_write_read_serve",
    ) {
        return;
    }
    let dir = TempDir::new("remote-raid1");
    let hosts: Vec<Nbdkit> = ["a", "b"]
        .iter()
        .map(|n| Nbdkit::start(&dir, n, &["memory", "32M"]))
        .collect();
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&uris));

    for (role, uri) in uris.iter().enumerate() {
        let v = json(&ok(uraid().args(["examine", "--json", uri.as_str()])));
        assert_eq!(v["device"], uri.as_str());
        assert_eq!(v["level"], "raid1");
        assert_eq!(v["raid_disks"], 2);
        assert_eq!(v["state"], "clean");
        assert_eq!(v["role"], format!("Active device {role}"));
    }

    let data = pattern(256 << 10, 11);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .args(["write", "--offset", "1M", "--input"])
        .arg(&input)
        .args(&uris));
    let out = dir.path("out.bin");
    ok(uraid()
        .args(["read", "--offset", "1M", "--length", "256K", "--output"])
        .arg(&out)
        .args(&uris));
    assert!(std::fs::read(&out).unwrap() == data, "read back differs");
    // Each host holds its copy.
    for uri in &uris {
        assert!(
            member_data(uri, 1 << 20, data.len()) == data,
            "{uri}: no copy"
        );
    }

    let mut srv = Served::start(&dir, &paths(&uris), &[]);
    let c = Client::open(&srv.uri(), &ClientConfig::default()).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(&mut back, 1 << 20).unwrap();
    assert!(back == data, "served read differs");
    let more = pattern(1 << 20, 12);
    c.write(&more, 8 << 20, true).unwrap();
    drop(c);
    let d = srv.detail(Path::new(&uris[0]));
    for (r, uri) in uris.iter().enumerate() {
        assert_eq!(d["members"][r]["device"], uri.as_str(), "{d}");
        assert_eq!(d["members"][r]["state"], "active", "{d}");
    }
    ok(srv.cmd().arg("stop").arg(&uris[1]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    for uri in &uris {
        assert!(member_data(uri, 8 << 20, more.len()) == more, "{uri}");
        let v = json(&ok(uraid().args(["examine", "--json", uri.as_str()])));
        assert_eq!(v["state"], "clean", "{uri}: stopped clean");
    }
}

/// A raid5 member's bitmap, read over NBD: (chunk of member bytes, dirty chunk numbers).
fn bitmap_of(uri: &str) -> (u64, Vec<u64>) {
    let m = NbdMember::connect(uri, &NbdClientConfig::default()).unwrap();
    let sb = uraid_engine::read_superblock(&m).unwrap();
    let bm = BitmapState::load(&m, &sb)
        .unwrap()
        .expect("an internal bitmap");
    let chunk_sectors = bm.chunk_sectors();
    let dirty = (0..bm.chunks())
        .filter(|&c| bm.is_dirty(c * chunk_sectors, chunk_sectors))
        .collect();
    assert!(m.size_bytes() > 0);
    (chunk_sectors * 512, dirty)
}

#[test]
fn raid5_loses_a_host_mid_write_and_goes_on() {
    if !need_tool("nbdkit", "raid5_loses_a_host_mid_write_and_goes_on") {
        return;
    }
    let dir = TempDir::new("remote-raid5");
    // 160 MiB members: three 64 MiB bitmap chunks, of which the test writes only the first.
    let mut hosts: Vec<Nbdkit> = ["h0", "h1", "h2"]
        .iter()
        .map(|n| Nbdkit::start(&dir, n, &["memory", "160M"]))
        .collect();
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    ok(uraid()
        .args(["create", "-l", "5", "-n", "3", "--chunk", "64K"])
        .args(["--bitmap", "internal", "--assume-clean", "--run"])
        .args(&uris));
    let (chunk_bytes, dirty) = bitmap_of(&uris[0]);
    assert_eq!(chunk_bytes, 64 << 20);
    assert!(dirty.is_empty(), "a clean new array: {dirty:?}");

    let mut srv = Served::start(&dir, &paths(&uris), &["--nbd-timeout", "10"]);
    let export = srv.uri();
    const BLOCK: usize = 64 << 10;
    const BLOCKS: u64 = 128;
    let (progress_tx, progress) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    let writer = {
        let export = export.clone();
        std::thread::spawn(move || {
            let c = Client::open(&export, &ClientConfig::default()).unwrap();
            for b in 0..BLOCKS {
                let r = c.write(&pattern(BLOCK, b), b * BLOCK as u64, false);
                if let Err(e) = r {
                    let _ = done_tx.send(Err(format!("block {b}: {e}")));
                    return;
                }
                let _ = progress_tx.send(b);
            }
            let _ = done_tx.send(c.flush().map_err(|e| e.to_string()));
        })
    };
    // Kill host 1 while the writer is a quarter through.
    loop {
        let b = progress
            .recv_timeout(Duration::from_secs(120))
            .expect("the writer made no progress");
        if b == BLOCKS / 4 {
            break;
        }
    }
    hosts[1].kill();
    let finished = done
        .recv_timeout(Duration::from_secs(120))
        .expect("writes hung after the host was lost");
    writer.join().unwrap();
    finished.expect("every write succeeds with a member lost");

    srv.wait_detail(Path::new(&uris[0]), |d| {
        d["members"][1]["state"] == "faulty"
    });
    let d = srv.detail(Path::new(&uris[0]));
    assert_eq!(d["members"][0]["state"], "active", "{d}");
    assert_eq!(d["members"][2]["state"], "active", "{d}");

    // Reads rebuild what was on the lost host from the other two.
    let c = Client::open(&export, &ClientConfig::default()).unwrap();
    let mut back = vec![0u8; BLOCK * BLOCKS as usize];
    c.read(&mut back, 0).unwrap();
    for b in 0..BLOCKS as usize {
        assert!(
            back[b * BLOCK..(b + 1) * BLOCK] == pattern(BLOCK, b as u64)[..],
            "block {b} differs after the host was lost"
        );
    }
    drop(c);

    // The survivors' bitmaps hold what host 1 missed (the first 64 MiB chunk of each
    // member, where the 8 MiB written went), and nothing else; stopping a degraded array
    // keeps it, so a re-added member is rebuilt from it.
    for uri in [&uris[0], &uris[2]] {
        assert_eq!(bitmap_of(uri).1, vec![0], "{uri} while serving");
    }
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());
    for uri in [&uris[0], &uris[2]] {
        assert_eq!(bitmap_of(uri).1, vec![0], "{uri} after stop");
    }
}

#[test]
fn detail_shows_a_remote_members_connection_and_latency() {
    if !need_tool(
        "nbdkit",
        "detail_shows_a_remote_members_connection_and_latency",
    ) {
        return;
    }
    let dir = TempDir::new("remote-detail");
    let mut hosts: Vec<Nbdkit> = ["a", "b"]
        .iter()
        .map(|n| Nbdkit::start(&dir, n, &["memory", "32M"]))
        .collect();
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&uris));
    let srv = Served::start(&dir, &paths(&uris), &["--nbd-timeout", "10"]);
    let c = Client::open(&srv.uri(), &ClientConfig::default()).unwrap();
    c.write(&pattern(256 << 10, 3), 0, true).unwrap();
    let d = srv.detail(Path::new(&uris[0]));
    for (r, uri) in uris.iter().enumerate() {
        let m = &d["members"][r]["remote"];
        assert_eq!(m["uri"], uri.as_str(), "{d}");
        assert_eq!(m["connection"], "up", "{d}");
        assert!(m["latency_us"].as_u64().unwrap_or(0) > 0, "{d}");
        assert_eq!(m["tls"], false, "{d}");
    }
    // Host b is lost: the next write fails it, and detail says the connection is lost.
    hosts[1].kill();
    c.write(&pattern(64 << 10, 4), 1 << 20, true).unwrap();
    srv.wait_detail(Path::new(&uris[0]), |d| {
        d["members"][1]["state"] == "faulty" && d["members"][1]["remote"]["connection"] == "lost"
    });
    let d = srv.detail(Path::new(&uris[0]));
    assert!(d["members"][1]["remote"]["error"].is_string(), "{d}");
    assert_eq!(d["members"][0]["remote"]["connection"], "up", "{d}");
}

/// Where the server serves its metrics (its `metrics: http://ADDR/metrics` line).
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

/// GET http://ADDR/metrics, by a plain socket.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.contains(" 200 "), "{head}");
    body.to_string()
}

/// The value of the sample `name{...}` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{text}"))
}

/// Host b of a raid1 dies: `uraid status` (text and JSON) shows member 1's connection
/// lost and member 0's up with its latency; a monitor running since before prints
/// RemoteLost for b's URI; the metrics carry each member's connection state and a latency
/// histogram of the replies.
#[test]
fn status_monitor_and_metrics_show_a_remote_member_lost() {
    let test = "status_monitor_and_metrics_show_a_remote_member_lost";
    if !need_tool("nbdkit", test) {
        return;
    }
    let dir = TempDir::new("remote-status");
    let mut hosts: Vec<Nbdkit> = ["a", "b"]
        .iter()
        .map(|n| Nbdkit::start(&dir, n, &["memory", "32M"]))
        .collect();
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&uris));
    let args = ["--nbd-timeout", "10", "--metrics", "127.0.0.1:0"];
    let srv = Served::start(&dir, &paths(&uris), &args);
    let c = Client::open(&srv.uri(), &ClientConfig::default()).unwrap();
    c.write(&pattern(256 << 10, 5), 0, true).unwrap();

    let addr = metrics_addr(&srv);
    let up = scrape(&addr);
    for (r, uri) in uris.iter().enumerate() {
        let role = r.to_string();
        let l = [("role", role.as_str()), ("uri", uri.as_str())];
        let with = |state| [l[0], l[1], ("state", state)];
        assert_eq!(sample(&up, "uraid_remote_connection", &with("up")), 1.0);
        assert_eq!(sample(&up, "uraid_remote_connection", &with("lost")), 0.0);
        let replies = sample(&up, "uraid_remote_reply_latency_seconds_count", &l);
        assert!(replies > 0.0, "{up}");
        let all = [l[0], l[1], ("le", "+Inf")];
        let inf = sample(&up, "uraid_remote_reply_latency_seconds_bucket", &all);
        assert_eq!(inf, replies, "{up}");
        assert!(sample(&up, "uraid_remote_latency_average_seconds", &l) > 0.0);
    }

    // A monitor that watches from before the loss.
    let mut mon = srv
        .cmd()
        .args(["monitor", "--json", "--delay", "0.1", "--control"])
        .arg(&srv.control)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (line_tx, lines) = mpsc::channel();
    let out = mon.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = line_tx.send(l);
        }
    });
    let next_event = || {
        let l = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the monitor printed nothing");
        serde_json::from_str::<serde_json::Value>(&l).unwrap()
    };
    assert_eq!(next_event()["event"], "NewArray");

    hosts[1].kill();
    c.write(&pattern(64 << 10, 6), 1 << 20, true).unwrap();
    srv.wait_detail(Path::new(&uris[0]), |d| {
        d["members"][1]["remote"]["connection"] == "lost"
    });
    let mut seen = Vec::new();
    let lost = loop {
        let e = next_event();
        if e["event"] == "RemoteLost" {
            break e;
        }
        seen.push(e);
    };
    let _ = mon.kill();
    let _ = mon.wait();
    assert_eq!(lost["device"], uris[1].as_str(), "{lost}");
    assert!(
        seen.iter().all(|e| e["device"] != uris[0].as_str()),
        "{seen:?}"
    );

    let t = stdout(&ok(srv.cmd().arg("status")));
    let row = |r: usize| {
        t.lines()
            .find(|l| l.trim_start().starts_with(&format!("remote {r}:")))
            .unwrap_or_else(|| panic!("no remote {r} line:\n{t}"))
            .to_string()
    };
    assert!(row(1).contains(&format!("{} lost (", uris[1])), "{t}");
    assert!(row(0).contains(&format!("{} up, latency ", uris[0])), "{t}");
    let j = json(&ok(srv.cmd().args(["status", "--json"])));
    let r = &j["arrays"][0]["remote"];
    assert_eq!(r[1]["role"], 1, "{j}");
    assert_eq!(r[1]["uri"], uris[1].as_str(), "{j}");
    assert_eq!(r[1]["connection"], "lost", "{j}");
    assert!(r[1]["error"].is_string(), "{j}");
    assert_eq!(r[0]["connection"], "up", "{j}");
    assert!(r[0]["latency_us"].as_u64().unwrap_or(0) > 0, "{j}");

    let after = scrape(&addr);
    let l1 = [("role", "1"), ("uri", uris[1].as_str())];
    assert_eq!(
        sample(
            &after,
            "uraid_remote_connection",
            &[l1[0], l1[1], ("state", "lost")]
        ),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            "uraid_remote_connection",
            &[l1[0], l1[1], ("state", "up")]
        ),
        0.0
    );
}

/// `?timeout=` that is not a number of seconds above zero is refused by name, before any
/// connection is tried; a good one opens the member as without it.
#[test]
fn a_members_own_timeout_is_checked() {
    let test = "a_members_own_timeout_is_checked";
    if !need_tool("nbdkit", test) {
        return;
    }
    let dir = TempDir::new("remote-timeout");
    let host = Nbdkit::start(&dir, "a", &["memory", "32M"]);
    let other = Nbdkit::start(&dir, "b", &["memory", "32M"]);
    for bad in ["0", "soon", "-3"] {
        let uri = format!("{}&timeout={bad}", host.uri());
        let out = uraid().args(["examine", uri.as_str()]).output().unwrap();
        assert!(!out.status.success(), "{uri} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "?timeout={bad}: the request timeout must be a number of seconds above zero"
            )),
            "{uri}: {err}"
        );
    }
    let uri = format!("{}&timeout=2.5", host.uri());
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .arg(&uri)
        .arg(other.uri()));
    let v = json(&ok(uraid().args(["examine", "--json", uri.as_str()])));
    assert_eq!(v["device"], uri.as_str());
    assert_eq!(v["level"], "raid1");
}

/// Reads of a [`MemBackend`] counted while they run; once armed, each read waits until
/// `target` reads have run at once (or 20 s pass: a liveness bound, not a measurement),
/// then the gate stays open. The most in flight at once is then what the server upstream
/// lets through: `target` when it lets that many through, fewer or more when not.
struct Gate {
    st: std::sync::Mutex<GateState>,
    cv: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    armed: bool,
    target: usize,
    now: usize,
    most: usize,
}

struct GatedMember {
    mem: uraid_nbd::MemBackend,
    gate: std::sync::Arc<Gate>,
}

impl uraid_nbd::Backend for GatedMember {
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let g = &self.gate;
        let mut st = g.st.lock().unwrap();
        if st.armed {
            st.now += 1;
            st.most = st.most.max(st.now);
            g.cv.notify_all();
            let until = std::time::Instant::now() + Duration::from_secs(20);
            while st.most < st.target && std::time::Instant::now() < until {
                st = g.cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
            }
            st.now -= 1;
        }
        drop(st);
        self.mem.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> std::io::Result<()> {
        self.mem.write(offset, buf, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.mem.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.mem.trim(offset, len)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        how: uraid_nbd::ZeroFlags,
    ) -> std::io::Result<()> {
        self.mem.write_zeroes(offset, len, how)
    }
}

/// `serve --nbd-queue-depth N` runs N requests of one NBD connection at once, and no more:
/// with remote members each read waits for its host while the others run, so the depth,
/// not the hosts, would otherwise bound a client's reads (issue 16's benchmark). Two
/// in-process NBD servers are the hosts; their reads wait until the depth's worth run at
/// once, and the most seen at once must be the depth, for a client with more in flight.
#[test]
fn nbd_queue_depth_is_the_requests_a_connection_runs_at_once() {
    let dir = TempDir::new("remote-depth");
    let gate = std::sync::Arc::new(Gate {
        st: std::sync::Mutex::new(GateState::default()),
        cv: std::sync::Condvar::new(),
    });
    let mut running = Vec::new();
    let mut uris = Vec::new();
    for n in 0..2 {
        let sock = dir.path(&format!("host{n}.sock"));
        let server = uraid_nbd::Server::new(uraid_nbd::ServerConfig {
            export_name: "disk".into(),
            workers_per_connection: 128,
            ..uraid_nbd::ServerConfig::default()
        })
        .unwrap();
        let backend = std::sync::Arc::new(GatedMember {
            mem: uraid_nbd::MemBackend::new(32 << 20),
            gate: gate.clone(),
        });
        let listener = uraid_nbd::Listener::bind_unix(&sock).unwrap();
        running.push(server.spawn(listener, backend).unwrap());
        uris.push(format!("nbd+unix:///disk?socket={}", sock.display()));
    }
    ok(uraid()
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&uris));
    for depth in [24usize, 40] {
        let mut srv = Served::start(
            &dir,
            &paths(&uris),
            &["--nbd-queue-depth", &depth.to_string()],
        );
        {
            let mut st = gate.st.lock().unwrap();
            *st = GateState {
                armed: true,
                target: depth,
                ..GateState::default()
            };
        }
        let c = Client::open(&srv.uri(), &ClientConfig::default()).unwrap();
        let tickets: Vec<_> = (0..96u64).map(|i| c.start_read(i * 65536, 4096)).collect();
        for t in tickets {
            t.wait().expect("a read through the array");
        }
        let most = {
            let mut st = gate.st.lock().unwrap();
            st.armed = false;
            st.most
        };
        assert_eq!(
            most, depth,
            "--nbd-queue-depth {depth}: {most} reads reached the hosts at once"
        );
        drop(c);
        assert!(
            srv.signal_and_wait(libc::SIGTERM).success(),
            "{}",
            srv.stderr()
        );
    }
    for r in running {
        r.shutdown().unwrap();
    }
}
