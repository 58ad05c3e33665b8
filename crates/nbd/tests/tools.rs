//! Real NBD clients against the in-process server: nbdinfo, qemu-img,
//! qemu-io, nbdcopy, fio. A test whose tool is missing fails in CI and skips (recorded) elsewhere.

mod common;

use std::process::{Command, Output};
use std::sync::Arc;

use common::*;
use uraid_nbd::{Backend, Listener, MemBackend, Server, ServerConfig};
use uraid_testkit::data::pattern;
use uraid_testkit::need_tool;

const MIB: usize = 1 << 20;

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("cannot run tool");
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

#[test]
fn nbdinfo_reports_size_and_flags() {
    if !need_tool("nbdinfo", "nbdinfo_reports_size_and_flags") {
        return;
    }
    let srv = TestServer::start(64 * MIB);
    let out = run(Command::new("nbdinfo").args(["--json", &srv.uri()]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["protocol"], "newstyle-fixed");
    assert_eq!(v["structured"], true);
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 64 * MIB as u64);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(e[flag], true, "{flag}");
    }
    assert_eq!(e["is_read_only"], false);
    assert_eq!(e["block_size_minimum"], 1);
    assert_eq!(e["block_size_preferred"], 4096);
    assert_eq!(e["block_size_maximum"], 32 * MIB as u64);
}

#[test]
fn qemu_img_info_and_qemu_io_pattern() {
    if !need_tool("qemu-img", "qemu_img_info_and_qemu_io_pattern")
        || !need_tool("qemu-io", "qemu_img_info_and_qemu_io_pattern")
    {
        return;
    }
    let srv = TestServer::start(64 * MIB);
    let out = run(Command::new("qemu-img").args(["info", "--output=json", &srv.uri()]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["virtual-size"], 64 * MIB as u64);

    let out = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0xab 0 1M",
        "-c",
        "read -P 0xab 0 1M",
        "-c",
        "write -P 0xcd 3M 512",
        "-c",
        "read -P 0 1M 2M",
        &srv.uri(),
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("Pattern verification failed"), "{text}");
    let snap = srv.backend.snapshot();
    assert!(snap[..MIB].iter().all(|&b| b == 0xab));
    assert!(snap[3 * MIB..3 * MIB + 512].iter().all(|&b| b == 0xcd));
    assert!(snap[MIB..3 * MIB].iter().all(|&b| b == 0));
}

#[test]
fn nbdcopy_in_and_out() {
    if !need_tool("nbdcopy", "nbdcopy_in_and_out") {
        return;
    }
    let srv = TestServer::start(16 * MIB);
    let image = pattern(16 * MIB, 42);
    let src = srv.dir.path("in.img");
    let dst = srv.dir.path("out.img");
    std::fs::write(&src, &image).unwrap();
    run(Command::new("nbdcopy").args([src.to_str().unwrap(), &srv.uri()]));
    assert!(
        srv.backend.snapshot() == image,
        "image differs after nbdcopy in"
    );
    run(Command::new("nbdcopy").args([&srv.uri(), dst.to_str().unwrap()]));
    assert!(
        std::fs::read(&dst).unwrap() == image,
        "image differs after nbdcopy out"
    );
}

#[test]
fn qemu_img_convert_in_and_out() {
    if !need_tool("qemu-img", "qemu_img_convert_in_and_out") {
        return;
    }
    let srv = TestServer::start(16 * MIB);
    let mut image = pattern(16 * MIB, 7);
    // A zero region lets qemu-img use write-zeroes.
    image[4 * MIB..6 * MIB].fill(0);
    let src = srv.dir.path("in.img");
    let dst = srv.dir.path("out.img");
    std::fs::write(&src, &image).unwrap();
    run(Command::new("qemu-img").args([
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        src.to_str().unwrap(),
        &srv.uri(),
    ]));
    assert!(
        srv.backend.snapshot() == image,
        "image differs after convert in"
    );
    run(Command::new("qemu-img").args([
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        &srv.uri(),
        dst.to_str().unwrap(),
    ]));
    assert!(
        std::fs::read(&dst).unwrap() == image,
        "image differs after convert out"
    );
}

#[test]
fn fio_randrw_with_verify() {
    if !need_tool("fio", "fio_randrw_with_verify") {
        return;
    }
    let srv = TestServer::start(64 * MIB);
    let uri = format!("--uri={}", srv.uri());
    let args = [
        "--name=verify",
        "--ioengine=nbd",
        &uri,
        "--rw=randrw",
        "--rwmixread=50",
        "--bs=4k",
        "--iodepth=16",
        "--size=16m",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--output-format=json",
    ];
    let out = run(Command::new("fio").args(args));
    // fio prints "fio: connected to NBD server" before the JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = &text[text.find('{').expect("no JSON from fio")..];
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "fio reported an error");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() > 0);
    assert!(job["read"]["io_bytes"].as_u64().unwrap() > 0);
    // fio wrote its verify headers into the export: something non-zero landed.
    assert!(srv.backend.snapshot()[..16 * MIB].iter().any(|&b| b != 0));
    // Control: the same verification must fail once the data is gone.
    srv.backend
        .write_zeroes(0, 16 * MIB as u64, Default::default())
        .unwrap();
    let out = Command::new("fio")
        .args(args)
        .arg("--verify_only=1")
        .output()
        .unwrap();
    assert!(!out.status.success(), "fio verified an erased export");
}

#[test]
fn tcp_on_loopback() {
    if !need_tool("qemu-io", "tcp_on_loopback") {
        return;
    }
    let backend = Arc::new(MemBackend::new(8 * MIB));
    let listener = Listener::bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.tcp_addr().unwrap();
    let running = Server::new(ServerConfig::default())
        .unwrap()
        .spawn(listener, backend.clone() as Arc<dyn Backend>)
        .unwrap();
    let uri = format!("nbd://{}:{}", addr.ip(), addr.port());
    let out = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x3c 4096 64k",
        "-c",
        "read -P 0x3c 4096 64k",
        &uri,
    ]));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("verification failed"));
    running.shutdown().unwrap();
    let snap = backend.snapshot();
    assert!(snap[4096..4096 + 65536].iter().all(|&b| b == 0x3c));
    assert!(snap[..4096].iter().all(|&b| b == 0));
}

/// A 4 MiB export with data only at 1 MiB..1 MiB+64 KiB: the rest is a hole of zeros.
fn sparse_server() -> TestServer {
    let mut image = vec![0u8; 4 * MIB];
    image[MIB..MIB + 65536].fill(0xa5);
    TestServer::start_with(MemBackend::from_vec(image), ServerConfig::default())
}

/// The extents both tools must see: (offset, length, hole and zero).
const SPARSE_MAP: [(u64, u64, bool); 3] = [
    (0, MIB as u64, true),
    (MIB as u64, 65536, false),
    (MIB as u64 + 65536, 3 * MIB as u64 - 65536, true),
];

#[test]
fn nbdinfo_map_shows_base_allocation() {
    if !need_tool("nbdinfo", "nbdinfo_map_shows_base_allocation") {
        return;
    }
    let srv = sparse_server();
    let out = run(Command::new("nbdinfo").args(["--map", &srv.uri()]));
    let text = String::from_utf8_lossy(&out.stdout);
    let got: Vec<(u64, u64, bool)> = text
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let flags: u32 = w[2].parse().unwrap();
            // base:allocation says hole and zero together here, or neither.
            assert!(flags == 0 || flags == 3, "{l}");
            (w[0].parse().unwrap(), w[1].parse().unwrap(), flags == 3)
        })
        .collect();
    assert_eq!(got, SPARSE_MAP, "nbdinfo --map:\n{text}");
}

#[test]
fn qemu_img_map_sees_holes_and_data() {
    if !need_tool("qemu-img", "qemu_img_map_sees_holes_and_data") {
        return;
    }
    let srv = sparse_server();
    let out = run(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &srv.uri()]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<(u64, u64, bool)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let zero = e["zero"].as_bool().unwrap();
            assert_eq!(e["data"].as_bool().unwrap(), !zero, "{e}");
            (
                e["start"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                zero,
            )
        })
        .collect();
    assert_eq!(got, SPARSE_MAP, "qemu-img map: {v}");
}
