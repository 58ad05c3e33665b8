//! TLS for remote members and for `uraid serve` (issue 16): an nbds:// member on nbdkit
//! --tls=require checked against `--nbd-tls-ca`, a certificate from another CA refused
//! with a clear error and nothing written, `serve --tls-cert/--tls-key` requiring TLS of
//! its clients (nbdinfo over TLS reads it), TLS required by default off loopback, and
//! `--tls-psk` refused by name. Across network namespaces: raid1 over two TLS-only hosts
//! (nbdkit and qemu-nbd) losing one mid-write and re-adding it over TLS, a host with a
//! certificate from another CA or for another address refused by name with nothing
//! written, and a plain `nbd://` URI to a TLS-only host refused.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uraid_nbd::client::{Client, ClientConfig, ClientError};
use uraid_nbd::TlsClient;
use uraid_testkit::netns::{need_netns, Host, ServerKind};
use uraid_testkit::pki::Pki;
use uraid_testkit::prelude::*;

/// nbdkit on a TCP loopback port with TLS required, killed on drop.
struct TlsNbdkit {
    child: Child,
    uri: String,
}

impl TlsNbdkit {
    fn start(pki: &Pki, size: &str) -> TlsNbdkit {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("nbdkit")
            .args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .arg("--tls=require")
            .arg(format!("--tls-certificates={}", pki.dir.display()))
            .args(["memory", size])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn nbdkit");
        let k = TlsNbdkit {
            child,
            uri: format!("nbds://127.0.0.1:{port}/"),
        };
        let config = tls_config(pki);
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = Client::open(&k.uri, &config) {
            assert!(
                matches!(e, ClientError::Connect { .. }) && Instant::now() < deadline,
                "{}: {e}",
                k.uri
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        k
    }
}

impl Drop for TlsNbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_config(pki: &Pki) -> ClientConfig {
    ClientConfig {
        tls: Some(TlsClient::from_ca_file(&pki.ca()).unwrap()),
        ..ClientConfig::default()
    }
}

#[test]
fn raid1_with_a_tls_only_member_and_a_wrong_ca_refused() {
    if !need_tool(
        "nbdkit",
        "raid1_with_a_tls_only_member_and_a_wrong_ca_refused",
    ) {
        return;
    }
    let dir = TempDir::new("remote-tls-member");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let other = Pki::new(&dir.path("other"), "some other CA");
    let host = TlsNbdkit::start(&pki, "32M");
    let local = dir.image("m0.img", 32);
    let ca = pki.ca();

    // Another CA: refused, the certificate named, nothing written to the local member.
    let err = fails_cleanly(
        uraid()
            .arg("--nbd-tls-ca")
            .arg(other.ca())
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&host.uri),
        std::slice::from_ref(&local),
    );
    assert!(
        err.contains(&host.uri) && err.contains("certificate"),
        "{err}"
    );
    assert_eq!(err.matches("certificate").count(), 1, "said once: {err}");

    let members = vec![local.clone(), PathBuf::from(&host.uri)];
    ok(uraid()
        .arg("--nbd-tls-ca")
        .arg(&ca)
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&members));
    let v = json(&ok(uraid().arg("--nbd-tls-ca").arg(&ca).args([
        "examine",
        "--json",
        host.uri.as_str(),
    ])));
    assert_eq!(v["role"], "Active device 1", "{v}");

    let data = pattern(256 << 10, 21);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid()
        .arg("--nbd-tls-ca")
        .arg(&ca)
        .args(["write", "--offset", "1M", "--input"])
        .arg(&input)
        .args(&members));
    // The remote copy, read over TLS beside uraid, at the member's data offset.
    let data_offset = v["data_offset_sectors"].as_u64().unwrap() * 512;
    let c = Client::open(&host.uri, &tls_config(&pki)).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(&mut back, data_offset + (1 << 20)).unwrap();
    assert!(back == data, "the TLS member holds no copy");
}

#[test]
fn nbds_without_a_ca_is_refused_by_name() {
    let dir = TempDir::new("remote-tls-noca");
    let img = dir.image("m0.img", 8);
    let err = fails_with(
        uraid()
            .args(["create", "-l", "1", "-n", "2", "--run"])
            .arg(&img)
            .arg("nbds://127.0.0.1:1/disk"),
        "--nbd-tls-ca",
    );
    assert!(err.contains("nbds://127.0.0.1:1/disk"), "{err}");
    assert_eq!(std::fs::read(&img).unwrap(), vec![0u8; 8 << 20]);
}

#[test]
fn serve_with_a_certificate_requires_tls() {
    let dir = TempDir::new("serve-tls");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let control = dir.path("ctl.sock");
    let args: Vec<String> = vec![
        "serve".into(),
        "--nbd".into(),
        "tcp:127.0.0.1:0".into(),
        "--control".into(),
        control.display().to_string(),
        "--name".into(),
        "md0".into(),
        "--tls-cert".into(),
        pki.cert().display().to_string(),
        "--tls-key".into(),
        pki.key().display().to_string(),
    ];
    let srv = Served::spawn(&dir, args, &members, dir.path("unused"), control);
    let uri = loop {
        let line = srv
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("no banner");
        if let Some(u) = line.strip_prefix("nbd: ") {
            break u.to_string();
        }
    };
    assert!(uri.starts_with("nbds://127.0.0.1:"), "{uri}");
    let plain = uri.replacen("nbds", "nbd", 1);
    let e = Client::open(&plain, &ClientConfig::default()).unwrap_err();
    assert!(matches!(e, ClientError::TlsRequired { .. }), "{e}");

    let c = Client::open(&uri, &tls_config(&pki)).unwrap();
    let data = pattern(128 << 10, 5);
    c.write(&data, 1 << 20, true).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(&mut back, 1 << 20).unwrap();
    assert!(back == data, "served over TLS");
    drop(c);

    if need_tool("nbdinfo", "serve_with_a_certificate_requires_tls") {
        let out = Command::new("nbdinfo")
            .arg("--size")
            .arg(format!("{uri}?tls-certificates={}", pki.dir.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "nbdinfo: {out:?}");
        let size: u64 = text(&out.stdout).trim().parse().unwrap();
        assert!(size > 0 && size <= 8 * MIB, "{size}");
    }
}

#[test]
fn serve_off_loopback_requires_a_certificate_and_psk_is_refused() {
    let dir = TempDir::new("serve-tls-refuse");
    let members = create_array(&dir, "1", 2, 8, &[]);
    let err = fails_cleanly(
        uraid()
            .args(["serve", "--nbd", "tcp:0.0.0.0:0"])
            .args(&members),
        &members,
    );
    assert!(
        err.contains("TLS is required") && err.contains("--tls off"),
        "{err}"
    );
    let err = fails_cleanly(
        uraid()
            .args([
                "serve",
                "--nbd",
                "tcp:127.0.0.1:0",
                "--tls-psk",
                "/etc/keys.psk",
            ])
            .args(&members),
        &members,
    );
    assert!(
        err.contains("--tls-psk") && err.contains("pre-shared key is not supported"),
        "{err}"
    );
    assert_eq!(err.matches("pre-shared").count(), 1, "said once: {err}");
}

// TLS-only hosts in network namespaces (`uraid_testkit::netns`): each host's certificate
// carries its own 10.231.x.y address, signed by the test's CA.

const BLOCK: usize = 64 << 10;

/// Block `b` under `seed`.
fn block(seed: u64, b: u64) -> Vec<u8> {
    pattern(BLOCK, seed * 1_000_003 + b)
}

fn member_state(d: &serde_json::Value, role: usize) -> String {
    d["members"][role]["state"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

fn read_file_at(path: &std::path::Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; len];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, offset)
        .unwrap();
    b
}

/// Byte offset of the data area of the member whose file is `disk` (read from the file,
/// not over the network).
fn data_offset(disk: &std::path::Path) -> u64 {
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(disk)));
    v["data_offset_sectors"].as_u64().unwrap() * 512
}

/// raid1 over two TLS-only hosts (nbdkit `--tls=require`, qemu-nbd `--tls-creds`), served
/// by `uraid serve --nbd-tls-ca`: the qemu-nbd host is cut off between two writes of one
/// client; the writer sees no error, the member is faulty and its connection lost, and
/// everything reads back. The host restored is re-added over TLS and recovered: the array
/// is not degraded, and both hosts' disks hold every block.
#[test]
fn raid1_over_two_tls_only_hosts_loses_one_mid_write_and_readds_it_over_tls() {
    let test = "raid1_over_two_tls_only_hosts_loses_one_mid_write_and_readds_it_over_tls";
    if !need_netns(test) || !need_tools(&["qemu-nbd"], test) {
        return;
    }
    let dir = TempDir::new("tls-hosts-raid1");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let ca = pki.ca().display().to_string();
    let hosts = [
        Host::start_tls(&dir, "kit", 48, ServerKind::Nbdkit, &pki),
        Host::start_tls(&dir, "qemu", 48, ServerKind::QemuNbd, &pki),
    ];
    let uris: Vec<String> = hosts.iter().map(|h| h.uri()).collect();
    for u in &uris {
        assert!(u.starts_with("nbds://10.231."), "{u}");
    }
    let members: Vec<PathBuf> = uris.iter().map(PathBuf::from).collect();
    ok(uraid()
        .args(["--nbd-tls-ca", &ca])
        .args(["create", "-l", "1", "-n", "2", "--bitmap", "internal"])
        .args(["--bitmap-chunk", "4M", "--assume-clean", "--run"])
        .args(&members));
    let mut srv = Served::start(&dir, &members, &["--nbd-tls-ca", &ca, "--nbd-timeout", "2"]);
    let a0 = members[0].as_path();

    let c = Client::open(&srv.uri(), &ClientConfig::default()).unwrap();
    for b in 0..16 {
        c.write(&block(3, b), b * BLOCK as u64, false).unwrap();
    }
    hosts[1].cut();
    for b in 16..64 {
        c.write(&block(3, b), b * BLOCK as u64, false)
            .unwrap_or_else(|e| panic!("block {b} failed with a host cut: {e}"));
    }
    c.flush().expect("flush failed with a host cut");
    srv.wait_detail(a0, |d| member_state(d, 1) == "faulty");
    let d = srv.detail(a0);
    assert_eq!(d["degraded"], true, "{d}");
    assert_eq!(member_state(&d, 0), "active", "{d}");
    assert_eq!(d["members"][1]["remote"]["connection"], "lost", "{d}");
    let mut back = vec![0u8; BLOCK];
    for b in 0..64 {
        c.read(&mut back, b * BLOCK as u64).unwrap();
        assert!(back == block(3, b), "block {b} differs");
    }

    hosts[1].restore();
    ok(srv.cmd().args(["--nbd-tls-ca", &ca, "remove", &uris[1]]));
    ok(srv
        .cmd()
        .args(["--nbd-tls-ca", &ca, "add", "--array", &uris[0], &uris[1]]));
    srv.wait_detail(a0, |d| d["degraded"] == false);
    let d = srv.detail(a0);
    assert_eq!(member_state(&d, 1), "active", "{d}");
    assert_eq!(d["members"][1]["remote"]["connection"], "up", "{d}");
    drop(c);
    ok(srv.cmd().arg("stop").arg(&uris[0]));
    assert!(srv.wait().success(), "{}", srv.stderr());

    // What went over TLS is on both hosts' disks, the blocks the cut host missed included.
    for h in &hosts {
        let off = data_offset(h.disk());
        for b in 0..64 {
            assert!(
                read_file_at(h.disk(), off + b * BLOCK as u64, BLOCK) == block(3, b),
                "{}: block {b} missing",
                h.uri()
            );
        }
    }
}

/// A host whose certificate the member's CA did not sign (another CA), or that names
/// another address: create, assemble and serve with it are refused, the error naming the
/// member's URI, saying once that its certificate is the problem and what to give instead;
/// and nothing is written to any member (the good host's superblock is as it was).
#[test]
fn a_tls_host_with_a_wrong_certificate_is_refused_by_name_and_nothing_is_written() {
    let test = "a_tls_host_with_a_wrong_certificate_is_refused_by_name_and_nothing_is_written";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("tls-hosts-wrong");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let other = Pki::new(&dir.path("other"), "some other CA");
    let ca = pki.ca().display().to_string();
    let good = Host::start_tls(&dir, "good", 16, ServerKind::Nbdkit, &pki);
    let mut swapped = Host::start_tls(&dir, "swapped", 16, ServerKind::Nbdkit, &pki);
    let stranger = Host::start_tls(&dir, "stranger", 16, ServerKind::Nbdkit, &other);
    let elsewhere_dir = dir.path("elsewhere-tls");
    let elsewhere = Host::start_certified(&dir, "elsewhere", 16, ServerKind::Nbdkit, |_| {
        pki.issue(&elsewhere_dir, &["192.0.2.7"]).dir
    });
    let disks = [
        good.disk(),
        swapped.disk(),
        stranger.disk(),
        elsewhere.disk(),
    ]
    .map(|d| d.to_path_buf())
    .to_vec();

    let refused = |cmd: &mut Command, uri: &str| {
        let err = fails_cleanly(cmd, &disks);
        assert!(err.contains(uri), "{uri} not named: {err}");
        assert_eq!(err.matches("certificate").count(), 1, "said once: {err}");
        assert!(err.contains("--nbd-tls-ca"), "no remedy given: {err}");
        err
    };
    for (bad, why) in [
        (&stranger, "not signed"),
        (&elsewhere, "it names 192.0.2.7"),
    ] {
        let err = refused(
            uraid()
                .args(["--nbd-tls-ca", &ca])
                .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
                .arg(good.uri())
                .arg(bad.uri()),
            &bad.uri(),
        );
        assert!(err.contains(why), "{err}");
    }

    // An array made while its certificate was good; then the host gets one from another CA.
    let members = [PathBuf::from(good.uri()), PathBuf::from(swapped.uri())];
    ok(uraid()
        .args(["--nbd-tls-ca", &ca])
        .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
        .args(&members));
    let folder = swapped.tls.clone().unwrap();
    other.issue(&folder, &[&swapped.addr.to_string()]);
    swapped.restart(false);
    let uri = swapped.uri();
    refused(
        uraid()
            .args(["--nbd-tls-ca", &ca, "assemble"])
            .args(&members),
        &uri,
    );
    refused(
        uraid()
            .env("URAID_RUN_DIR", dir.run_dir())
            .args(["serve", "--nbd"])
            .arg(format!("unix:{}", dir.path("never.sock").display()))
            .args(["--nbd-tls-ca", &ca])
            .args(&members),
        &uri,
    );
}

/// A plain `nbd://` URI to a TLS-only host is refused by name: the server requires TLS, and
/// the error says to use nbds:// with the CA; nothing is written.
#[test]
fn a_plain_uri_to_a_tls_only_host_is_refused_by_name() {
    let test = "a_plain_uri_to_a_tls_only_host_is_refused_by_name";
    if !need_netns(test) {
        return;
    }
    let dir = TempDir::new("tls-hosts-plain");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let host = Host::start_tls(&dir, "kit", 16, ServerKind::Nbdkit, &pki);
    let plain = host.uri().replacen("nbds://", "nbd://", 1);
    let local = dir.image("m0.img", 16);
    let err = fails_cleanly(
        uraid()
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&plain),
        &[local.clone(), host.disk().to_path_buf()],
    );
    assert!(
        err.contains(&plain) && err.contains("requires TLS") && err.contains("nbds://"),
        "{err}"
    );
    assert_eq!(err.matches("requires TLS").count(), 1, "said once: {err}");
}

/// nbd-server as a TLS-only host (`force_tls`, its certificate for its address): a plain
/// URI is refused by name as with nbdkit. Over nbds:// nbd-server 3.24 demands a client
/// certificate: without one it drops the connection once TLS is up, and uraid says that
/// with the member's URI and the options that give one, instead of an end of file;
/// nothing is written. With `--nbd-tls-cert/--nbd-tls-key` (signed by the CA nbd-server
/// trusts) the array is made on it, and its data lands on the host's disk.
#[test]
fn an_nbd_server_tls_only_host_wants_a_client_certificate_and_takes_one() {
    let test = "an_nbd_server_tls_only_host_wants_a_client_certificate_and_takes_one";
    if !need_netns(test) || !need_tools(&[ServerKind::NbdServer.program()], test) {
        return;
    }
    let dir = TempDir::new("tls-hosts-nbd-server");
    let pki = Pki::new(&dir.path("pki"), "uraid test CA");
    let ca = pki.ca().display().to_string();
    let host = Host::start_tls(&dir, "nbd-server", 32, ServerKind::NbdServer, &pki);
    let uri = host.uri();
    assert!(
        uri.starts_with("nbds://") && uri.ends_with("/disk"),
        "{uri}"
    );
    let local = dir.image("m0.img", 32);
    let files = [local.clone(), host.disk().to_path_buf()];
    let plain = uri.replacen("nbds://", "nbd://", 1);
    let err = fails_cleanly(
        uraid()
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&plain),
        &files,
    );
    assert!(
        err.contains(&plain) && err.contains("requires TLS") && err.contains("nbds://"),
        "{err}"
    );

    let err = fails_cleanly(
        uraid()
            .args(["--nbd-tls-ca", &ca])
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&uri),
        &files,
    );
    assert!(
        err.contains(&uri) && err.contains("client certificate") && err.contains("--nbd-tls-cert"),
        "{err}"
    );
    assert_eq!(
        err.matches("closed the connection").count(),
        1,
        "said once: {err}"
    );

    // A key without its certificate: refused before anything is opened.
    let (cert, key) = pki.issue_client(&dir.path("client"), "uraid-array-host");
    let err = fails_cleanly(
        uraid()
            .args(["--nbd-tls-ca", &ca])
            .arg("--nbd-tls-key")
            .arg(&key)
            .args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&uri),
        &files,
    );
    assert!(err.contains("go together"), "{err}");
    let with_cert = |c: &mut std::process::Command| {
        c.args(["--nbd-tls-ca", &ca])
            .arg("--nbd-tls-cert")
            .arg(&cert)
            .arg("--nbd-tls-key")
            .arg(&key);
    };
    let mut c = uraid();
    with_cert(&mut c);
    ok(
        c.args(["create", "-l", "1", "-n", "2", "--assume-clean", "--run"])
            .arg(&local)
            .arg(&uri),
    );
    let data = pattern(1 << 20, 41);
    let input = dir.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    let mut c = uraid();
    with_cert(&mut c);
    ok(c.args(["write", "--input"])
        .arg(&input)
        .arg(&local)
        .arg(&uri));
    // On the host's disk, behind nbd-server: the superblock and the mirror's data.
    let v = json(&ok(uraid().arg("examine").arg("--json").arg(host.disk())));
    let off = v["data_offset_sectors"].as_u64().unwrap() * 512;
    let on_host = std::fs::read(host.disk()).unwrap();
    assert!(
        on_host[off as usize..off as usize + data.len()] == data[..],
        "the data did not reach nbd-server's disk"
    );
}
