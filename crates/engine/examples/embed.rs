//! Embedding uraid in another Rust program: an md array over files or memory, used through
//! the engine's API and served over NBD with the `uraid-nbd` crate.
//!
//! cargo run -p uraid-engine --example embed -- [--dir DIR] [--level LEVEL] [--serve SOCKET]
//!
//! Without `--dir` the three members live in memory. With `--dir`, `DIR/member0.img` ...
//! are the members: made (sparse) and created as a new array the first time, assembled from
//! their md superblocks on every later run (mdadm --examine reads them too). Each run checks
//! the pattern a previous run left, writes it, flushes and reads it back. With `--serve` the
//! array is then exported on a unix socket (`nbd+unix:///embed?socket=SOCKET`, for
//! `nbdinfo`, `qemu-img`, `nbd-client`) until stdin closes (Ctrl-D); the array is then
//! stopped cleanly, as `mdadm --stop` leaves it.
//!
//! Its tests run under `cargo test -p uraid-engine` (`test = true` in Cargo.toml).

use std::error::Error;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uraid_engine::nbd::ArrayBackend;
use uraid_engine::{
    assemble, create, read_superblock, Array, AssembleOptions, CreateOptions, DirectMode,
    FileMember, Level, MemMember, Member,
};
use uraid_nbd::{Listener, RunningServer, Server, ServerConfig};

const MEMBERS: usize = 3;
const MEMBER_BYTES: u64 = 32 << 20;
/// Where the example's own data goes, and how much.
const PATTERN_OFFSET: u64 = 1 << 20;
const PATTERN_BYTES: usize = 256 << 10;
const EXPORT_NAME: &str = "embed";

type Res<T> = Result<T, Box<dyn Error>>;

/// The example's data: a block that says which run cannot have made it by chance.
fn pattern() -> Vec<u8> {
    (0..PATTERN_BYTES).map(|i| (i * 7 + 13) as u8).collect()
}

/// The members, and whether they are new (all zeros, no superblock).
fn open_members(dir: Option<&Path>) -> Res<(Vec<Arc<dyn Member>>, bool)> {
    let Some(dir) = dir else {
        let mems = (0..MEMBERS)
            .map(|i| Arc::new(MemMember::new(format!("mem{i}"), MEMBER_BYTES)) as Arc<dyn Member>)
            .collect();
        return Ok((mems, true));
    };
    std::fs::create_dir_all(dir)?;
    let mut fresh = true;
    let mut mems: Vec<Arc<dyn Member>> = Vec::new();
    for i in 0..MEMBERS {
        let path = dir.join(format!("member{i}.img"));
        if path.exists() {
            fresh = false;
        } else {
            std::fs::File::create(&path)?.set_len(MEMBER_BYTES)?;
        }
        // O_DIRECT through io_uring where the file system allows it, buffered otherwise.
        mems.push(Arc::new(FileMember::open(&path, DirectMode::Auto)?));
    }
    Ok((mems, fresh))
}

/// Assemble the members if they carry an array, else create one on them. Returns the array
/// and whether it was created.
fn open_array(members: Vec<Arc<dyn Member>>, fresh: bool, level: Level) -> Res<(Array, bool)> {
    if read_superblock(members[0].as_ref()).is_ok() {
        let (array, report) = assemble(members, &AssembleOptions::default())?;
        eprintln!(
            "assembled {} at events {} from {} members",
            report.uuid,
            report.events,
            report.members.len()
        );
        return Ok((array, false));
    }
    let mut opts = CreateOptions::new(level);
    opts.name = "embed".into();
    // Members we just made are all zeros, which every level's redundancy agrees with;
    // others get md's initial resync.
    opts.assume_clean = fresh;
    let array = create(members.into_iter().map(Some).collect(), &opts)?;
    if !fresh {
        array.resync()?;
    }
    eprintln!(
        "created a {} array of {} MiB",
        array.level(),
        array.size_bytes() >> 20
    );
    Ok((array, true))
}

/// Checks what an earlier run wrote (for an assembled array), then writes and reads back.
fn write_and_check(array: &Array, created: bool) -> Res<()> {
    let want = pattern();
    let mut got = vec![0u8; PATTERN_BYTES];
    if !created {
        array.read(PATTERN_OFFSET, &mut got)?;
        if got != want {
            return Err("the data an earlier run wrote is not there".into());
        }
    }
    array.write(PATTERN_OFFSET, &want)?;
    array.flush()?;
    got.fill(0);
    array.read(PATTERN_OFFSET, &mut got)?;
    if got != want {
        return Err("read back differs from what was written".into());
    }
    eprintln!("wrote and read back {PATTERN_BYTES} bytes at byte {PATTERN_OFFSET}");
    Ok(())
}

/// Serves `array` over NBD on a unix socket, on the server's own threads.
fn serve(array: Arc<Array>, socket: &Path) -> Res<RunningServer> {
    let _ = std::fs::remove_file(socket);
    let listener = Listener::bind_unix(socket)?;
    let server = Server::new(ServerConfig {
        export_name: EXPORT_NAME.into(),
        ..ServerConfig::default()
    })?;
    Ok(server.spawn(listener, Arc::new(ArrayBackend::new(array)))?)
}

struct Args {
    dir: Option<PathBuf>,
    level: Level,
    serve: Option<PathBuf>,
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        dir: None,
        level: Level::Raid5,
        serve: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => a.dir = Some(value()?.into()),
            "--level" => {
                let v = value()?;
                a.level = Level::parse(&v).ok_or(format!("unknown level {v}"))?;
            }
            "--serve" => a.serve = Some(value()?.into()),
            _ => return Err(format!("unknown argument {flag} (see the source's header)").into()),
        }
    }
    Ok(a)
}

fn main() -> Res<()> {
    let args = parse_args()?;
    let (members, fresh) = open_members(args.dir.as_deref())?;
    let (array, created) = open_array(members, fresh, args.level)?;
    write_and_check(&array, created)?;
    let array = Arc::new(array);
    if let Some(socket) = &args.serve {
        let running = serve(array.clone(), socket)?;
        eprintln!(
            "serving nbd+unix:///{EXPORT_NAME}?socket={}; close stdin to stop",
            socket.display()
        );
        std::io::stdin().read_to_end(&mut Vec::new())?;
        // Answers the requests in flight and flushes the array.
        running.shutdown()?;
    }
    array.stop()?;
    eprintln!("stopped cleanly");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("uraid-embed-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// The example's own path for file members: created on the first run, assembled with
    /// the data on the second.
    #[test]
    fn file_members_created_then_assembled_keep_the_data() {
        let dir = scratch("files");
        for (run, want_created) in [(1, true), (2, false)] {
            let (members, fresh) = open_members(Some(&dir)).unwrap();
            assert_eq!(fresh, want_created, "run {run}");
            let (array, created) = open_array(members, fresh, Level::Raid5).unwrap();
            assert_eq!(created, want_created, "run {run}");
            write_and_check(&array, created).unwrap();
            array.stop().unwrap();
        }
        // A third run that finds the data changed must say so.
        let (members, fresh) = open_members(Some(&dir)).unwrap();
        let (array, created) = open_array(members, fresh, Level::Raid5).unwrap();
        array.write(PATTERN_OFFSET, &[0u8; 4096]).unwrap();
        assert!(write_and_check(&array, created).is_err());
        array.stop().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The served array as NBD clients see it: its size, a client's write read through the
    /// API, and the API's write read by a client.
    #[test]
    fn a_served_array_is_read_and_written_by_nbd_clients() {
        let test = "embed::a_served_array_is_read_and_written_by_nbd_clients";
        if !uraid_testkit::need_tools(&["nbdinfo", "qemu-io"], test) {
            return;
        }
        let dir = scratch("serve");
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("nbd.sock");
        let (members, fresh) = open_members(None).unwrap();
        let (array, created) = open_array(members, fresh, Level::Raid5).unwrap();
        write_and_check(&array, created).unwrap();
        let array = Arc::new(array);
        let running = serve(array.clone(), &socket).unwrap();
        let uri = format!("nbd+unix:///{EXPORT_NAME}?socket={}", socket.display());

        let out = Command::new("nbdinfo")
            .args(["--size", &uri])
            .output()
            .unwrap();
        assert!(out.status.success(), "nbdinfo: {out:?}");
        let size: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_eq!(size, array.size_bytes());

        // qemu-io's status says whether the command (and a `-P` pattern check) passed.
        let qemu_io = |cmd: &str| {
            let out = Command::new("qemu-io")
                .args(["-f", "raw", "-c", cmd, &uri])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            (out.status.success(), text)
        };
        // A client's write, read through the API.
        let (ok, text) = qemu_io("write -P 0x5c 8M 64k");
        assert!(ok, "qemu-io write: {text}");
        let mut got = vec![0u8; 64 << 10];
        array.read(8 << 20, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0x5c), "the client's write");
        // The API's write, read by a client; a wrong pattern must fail the check.
        array.write(12 << 20, &vec![0x3a; 64 << 10]).unwrap();
        let (ok, text) = qemu_io("read -P 0x3a 12M 64k");
        assert!(ok, "qemu-io read: {text}");
        let (ok, text) = qemu_io("read -P 0x3b 12M 64k");
        assert!(!ok && text.contains("verification failed"), "{text}");

        running.shutdown().unwrap();
        array.stop().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
