//! Remote "hosts" for the tests of members on other machines: each host is a network
//! namespace joined to the test's namespace by a veth pair, with an NBD server (nbdkit's
//! file plugin, or qemu-nbd: [`ServerKind`], over a sparse file in the test's folder)
//! listening on its own address. A host
//! can be cut off (its end of the link set down: packets vanish, the server sees nothing, the client's
//! requests go unanswered, as when a machine or its switch dies), brought back, and
//! restarted with its disk kept or emptied.
//!
//! Addresses are /30 subnets of 10.231.0.0/16, a range that exists only inside these
//! namespaces and the veth links to them. Creating a namespace needs root and `ip`
//! (iproute2): [`need_netns`] fails in CI without them and skips elsewhere. Everything is
//! removed on drop (deleting the namespace deletes both ends of its veth pair).

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::tmp::{TempDir, MIB};

/// The NBD port each host's server listens on (IANA's).
pub const PORT: u16 = 10809;
/// Subnets available: 10.231.0.0/16 in /30s.
const SUBNETS: u32 = 1 << 14;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The NBD server a [`Host`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// `nbdkit file DISK`.
    Nbdkit,
    /// `qemu-nbd -f raw DISK` (persistent, several clients).
    QemuNbd,
}

/// True when this machine can create hosts (root, `ip` and `ss`, `nbdkit`); otherwise skips `test`
/// (a failure in CI).
pub fn need_netns(test: &str) -> bool {
    if !crate::skip::need_tools(&["ip", "ss", "nbdkit"], test) {
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        crate::skip(test, "network namespaces need root");
        return false;
    }
    true
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// One remote host: a namespace, its link, its disk and the NBD server on it. Dropping it
/// kills the server and deletes the namespace.
pub struct Host {
    /// The namespace's name (`uraid-h<N>`).
    pub ns: String,
    /// The test's end of the veth pair.
    pub link: String,
    /// The host's end of the veth pair, in its namespace (what [`Host::cut`] downs).
    pub peer: String,
    /// The host's address (inside its namespace).
    pub addr: Ipv4Addr,
    /// The file behind the host's export.
    pub disk: PathBuf,
    /// The server it runs.
    pub kind: ServerKind,
    server: Option<Child>,
}

impl Host {
    /// A host named `name` with a sparse disk of `mib` MiB in `dir`, serving it. Panics with
    /// the failing `ip` command when the namespace cannot be made (call [`need_netns`]
    /// first).
    pub fn start(dir: &TempDir, name: &str, mib: u64) -> Host {
        Host::start_with(dir, name, mib, ServerKind::Nbdkit)
    }

    /// [`Host::start`] with the server `kind` (for qemu-nbd, check for it first:
    /// [`crate::skip::need_tools`]).
    pub fn start_with(dir: &TempDir, name: &str, mib: u64, kind: ServerKind) -> Host {
        let disk = dir.path(&format!("{name}.disk"));
        std::fs::File::create(&disk)
            .and_then(|f| f.set_len(mib * MIB))
            .expect("create the host's disk");
        let base = std::process::id().wrapping_mul(97);
        let mut last = String::new();
        for _ in 0..64 {
            let n = base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % SUBNETS;
            match Host::make(n, disk.clone(), kind) {
                Ok(mut h) => {
                    h.serve();
                    return h;
                }
                // Another test (or process) holds that number: take the next.
                Err(e) => last = e,
            }
        }
        panic!("cannot create a network namespace for host {name}: {last}");
    }

    fn make(n: u32, disk: PathBuf, kind: ServerKind) -> Result<Host, String> {
        let ns = format!("uraid-h{n}");
        ip(&["netns", "add", &ns])?;
        // From here on, drop deletes what was made.
        let h = Host {
            ns: ns.clone(),
            link: format!("urh{n}"),
            peer: format!("urn{n}"),
            addr: Ipv4Addr::new(10, 231, (n >> 6) as u8, ((n & 63) << 2) as u8 + 2),
            disk,
            kind,
            server: None,
        };
        let peer = h.peer.clone();
        let mine = Ipv4Addr::new(10, 231, (n >> 6) as u8, ((n & 63) << 2) as u8 + 1);
        ip(&[
            "link", "add", &h.link, "type", "veth", "peer", "name", &peer, "netns", &ns,
        ])?;
        ip(&["addr", "add", &format!("{mine}/30"), "dev", &h.link])?;
        ip(&["link", "set", &h.link, "up"])?;
        let inner = format!("{}/30", h.addr);
        ip(&["-n", &ns, "addr", "add", &inner, "dev", &peer])?;
        ip(&["-n", &ns, "link", "set", &peer, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(h)
    }

    /// `program` run inside the host's namespace (`ip netns exec`, which execs it, so the
    /// child is the program itself).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }

    /// The export's URI, reached over the host's link.
    pub fn uri(&self) -> String {
        format!("nbd://{}:{PORT}/", self.addr)
    }

    fn serve(&mut self) {
        let mut c = match self.kind {
            ServerKind::Nbdkit => {
                let mut c = self.command("nbdkit");
                c.args(["-f", "--exit-with-parent", "-i"])
                    .arg(self.addr.to_string())
                    .args(["-p", &PORT.to_string(), "file"])
                    .arg(&self.disk);
                c
            }
            ServerKind::QemuNbd => {
                let mut c = self.command("qemu-nbd");
                // --persistent: it serves on after a client leaves; --shared: the member's
                // connection and the tests' own.
                c.args(["-f", "raw", "--persistent", "--shared=16", "-b"])
                    .arg(self.addr.to_string())
                    .args(["-p", &PORT.to_string()])
                    .arg(&self.disk);
                c
            }
        };
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the NBD server in the host's namespace");
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.reachable() {
            if let Some(Ok(Some(st))) = self.server.as_mut().map(|c| c.try_wait()) {
                panic!("{:?} on host {} exited: {st}", self.kind, self.ns);
            }
            assert!(
                Instant::now() < deadline,
                "{:?} on host {} did not come up",
                self.kind,
                self.ns
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server accepts a TCP connection from the test's namespace now.
    pub fn reachable(&self) -> bool {
        let a = SocketAddr::from((self.addr, PORT));
        TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok()
    }

    /// Whether a connection to the host's server is being attempted from the test's
    /// namespace now (a SYN unanswered: `ss` lists it SYN-SENT), as a client that lost the
    /// host and tries again does while the host is cut off.
    pub fn being_dialled(&self) -> bool {
        let out = Command::new("ss")
            .args(["-Htn", "state", "syn-sent", "dst"])
            .arg(format!("{}:{PORT}", self.addr))
            .output()
            .expect("run ss (iproute2)");
        assert!(out.status.success(), "ss failed: {out:?}");
        !String::from_utf8_lossy(&out.stdout).trim().is_empty()
    }

    /// The host is lost: its end of the link goes down, so packets to it vanish (no reset,
    /// no ICMP: the test's end keeps its route, without carrier); the server keeps running
    /// and its connections stay open on its side. (Downing the test's end instead would
    /// drop the route, and packets would take the default route to whatever lies there.)
    pub fn cut(&self) {
        ip(&["-n", &self.ns, "link", "set", &self.peer, "down"]).unwrap();
    }

    /// The host comes back on the network (its server and disk as they were); returns once
    /// the server is reachable again (60 s at the most).
    pub fn restore(&self) {
        ip(&["-n", &self.ns, "link", "set", &self.peer, "up"]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.reachable() {
            assert!(
                Instant::now() < deadline,
                "host {} unreachable after restore",
                self.ns
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server dies (SIGKILL), as on a host that crashed; the link stays up, so clients
    /// see their connections reset.
    pub fn kill_server(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The host restarts with its disk as it was (`empty`: a new, zeroed disk of the same
    /// size, as after a disk swap), its link up.
    pub fn restart(&mut self, empty: bool) {
        self.kill_server();
        if empty {
            let len = std::fs::metadata(&self.disk).unwrap().len();
            let f = std::fs::File::create(&self.disk).unwrap();
            f.set_len(len).unwrap();
        }
        ip(&["-n", &self.ns, "link", "set", &self.peer, "up"]).unwrap();
        self.serve();
    }

    /// The host's disk file (to inspect or alter what the host stores, bypassing NBD).
    pub fn disk(&self) -> &Path {
        &self.disk
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill_server();
        // The namespace takes its end of the veth pair, and the pair's other end with it.
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.link]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host serves over its link; cut off it answers nothing, and a connection opened
    /// before gets no reply; restored it serves again; dropped, its namespace is gone.
    #[test]
    fn a_host_serves_is_cut_off_and_comes_back() {
        let test = "a_host_serves_is_cut_off_and_comes_back";
        if !need_netns(test) {
            return;
        }
        use std::io::Read;
        let dir = TempDir::new("netns");
        let h = Host::start(&dir, "a", 4);
        // nbdkit's greeting, over the link.
        let mut s = TcpStream::connect((h.addr, PORT)).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..16], b"NBDMAGICIHAVEOPT");

        h.cut();
        assert!(!h.reachable(), "a cut-off host accepted a connection");
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        // Fixed newstyle, then NBD_OPT_LIST: a reachable server answers at once.
        let mut ask = vec![0, 0, 0, 3];
        ask.extend_from_slice(b"IHAVEOPT");
        ask.extend_from_slice(&[0, 0, 0, 3, 0, 0, 0, 0]);
        std::io::Write::write_all(&mut s, &ask).unwrap();
        let mut more = [0u8; 8];
        let r = s.read(&mut more);
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut),
            "a cut-off host answered: {r:?}"
        );

        h.restore();
        let mut s = TcpStream::connect((h.addr, PORT)).unwrap();
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..16], b"NBDMAGICIHAVEOPT");

        let ns = h.ns.clone();
        drop(h);
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let list = String::from_utf8_lossy(&list.stdout);
        assert!(
            !list.split_whitespace().any(|w| w == ns),
            "{ns} left behind: {list}"
        );
    }
}
