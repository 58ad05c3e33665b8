//! Remote "hosts" for the tests of members on other machines: each host is a network
//! namespace joined to the test's namespace by a veth pair, with an NBD server (nbdkit's
//! file plugin, qemu-nbd or nbd-server: [`ServerKind`], over a sparse file in the test's
//! folder) listening on its own address. A host can be cut off (its end of the link set
//! down: packets vanish, the server sees nothing, the client's requests go unanswered, as
//! when a machine or its switch dies), brought back, and restarted with its disk kept or
//! emptied.
//!
//! A host may serve TLS only ([`Host::start_tls`]): its certificate, made once its
//! namespace exists (the address is picked then), carries its address and is signed by the
//! test's CA ([`crate::pki::Pki::issue`]), or by whatever [`Host::start_certified`] is
//! given (another CA, another name: the certificate a client must refuse). Its
//! [`Host::uri`] is then `nbds://`; plain clients are refused (nbdkit `--tls=require`,
//! qemu-nbd `--tls-creds` with `verify-peer=off`, nbd-server `force_tls`). nbd-server 3.24
//! with TLS also demands a client certificate signed by its `cacertfile` (the same CA
//! here) and drops a client without one right after the handshake ("Error in the
//! certificate." on its stderr), whether `cacertfile` is set or not: uraid's client
//! presents none, so it cannot use such a host (a test checks that it says so).
//!
//! nbdkit and qemu-nbd run in the foreground, children of the test. nbd-server always
//! daemonizes to serve several clients (its `-d` keeps it in the foreground but serves
//! one client, without forking), so it runs as a daemon from a config file of the host's,
//! writing its pid to a file (`-p`): the daemon leads a session of its own, and its
//! per-client children share its process group, so [`Host::kill_server`] kills that group
//! (checked first to be this host's nbd-server). Its export is named
//! ([`NBD_SERVER_EXPORT`]; nbd-server has no default export), and [`Host::uri`] names it.
//! nbd-server 3.24 opens the export's file only when a client asks to use it
//! (`NBD_OPT_GO`): before that, `NBD_OPT_INFO` gets size 0, which is why a bare `nbdinfo
//! URI` (it asks for INFO first) shows `export-size: 0` while `nbdinfo --size`, qemu and
//! uraid (GO) see the file's size.
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

use crate::pki::Pki;
use crate::tmp::{TempDir, MIB};

/// The NBD port each host's server listens on (IANA's).
pub const PORT: u16 = 10809;
/// Subnets available: 10.231.0.0/16 in /30s.
const SUBNETS: u32 = 1 << 14;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The export name nbd-server hosts serve (in their [`Host::uri`]).
pub const NBD_SERVER_EXPORT: &str = "disk";

/// The NBD server a [`Host`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// `nbdkit file DISK`.
    Nbdkit,
    /// `qemu-nbd -f raw DISK` (persistent, several clients).
    QemuNbd,
    /// nbd-server (the NBD project's reference server), a daemon from a config file that
    /// exports DISK as [`NBD_SERVER_EXPORT`] with FLUSH and FUA.
    NbdServer,
}

impl ServerKind {
    /// The program (for [`crate::skip::need_tools`]).
    pub fn program(self) -> &'static str {
        match self {
            ServerKind::Nbdkit => "nbdkit",
            ServerKind::QemuNbd => "qemu-nbd",
            ServerKind::NbdServer => "nbd-server",
        }
    }
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
    /// The server's TLS folder (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`) when
    /// it serves TLS only.
    pub tls: Option<PathBuf>,
    server: Option<Server>,
}

/// A running server: a child of the test, or nbd-server's daemon (its pid, from its pid
/// file; it leads its own process group).
enum Server {
    Child(Child),
    Daemon(i32),
}

impl Host {
    /// A host named `name` with a sparse disk of `mib` MiB in `dir`, serving it. Panics with
    /// the failing `ip` command when the namespace cannot be made (call [`need_netns`]
    /// first).
    pub fn start(dir: &TempDir, name: &str, mib: u64) -> Host {
        Host::start_with(dir, name, mib, ServerKind::Nbdkit)
    }

    /// [`Host::start`] with the server `kind` (for qemu-nbd and nbd-server, check for
    /// them first: [`crate::skip::need_tools`] with [`ServerKind::program`]).
    pub fn start_with(dir: &TempDir, name: &str, mib: u64, kind: ServerKind) -> Host {
        Host::start_inner(dir, name, mib, kind, None::<fn(Ipv4Addr) -> PathBuf>)
    }

    /// [`Host::start_with`], serving TLS only, with a certificate for the host's address
    /// signed by `ca`'s CA (in `dir`'s `NAME-tls`): a client trusts it with `ca.ca()`.
    pub fn start_tls(dir: &TempDir, name: &str, mib: u64, kind: ServerKind, ca: &Pki) -> Host {
        let folder = dir.path(&format!("{name}-tls"));
        Host::start_certified(dir, name, mib, kind, |addr| {
            ca.issue(&folder, &[&addr.to_string()]).dir
        })
    }

    /// [`Host::start_with`], serving TLS only with the certificate folder that `certify`
    /// makes for the host's address (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`;
    /// called once the namespace, and so the address, exists).
    pub fn start_certified(
        dir: &TempDir,
        name: &str,
        mib: u64,
        kind: ServerKind,
        certify: impl FnOnce(Ipv4Addr) -> PathBuf,
    ) -> Host {
        Host::start_inner(dir, name, mib, kind, Some(certify))
    }

    fn start_inner(
        dir: &TempDir,
        name: &str,
        mib: u64,
        kind: ServerKind,
        certify: Option<impl FnOnce(Ipv4Addr) -> PathBuf>,
    ) -> Host {
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
                    h.tls = certify.map(|c| c(h.addr));
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
            tls: None,
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

    /// The export's URI, reached over the host's link: `nbds://` when the host serves TLS
    /// only, and the export's name for nbd-server.
    pub fn uri(&self) -> String {
        let scheme = if self.tls.is_some() { "nbds" } else { "nbd" };
        let export = match self.kind {
            ServerKind::NbdServer => NBD_SERVER_EXPORT,
            ServerKind::Nbdkit | ServerKind::QemuNbd => "",
        };
        format!("{scheme}://{}:{PORT}/{export}", self.addr)
    }

    /// nbd-server's config file and pid file, beside the disk.
    fn nbd_server_files(&self) -> (PathBuf, PathBuf) {
        let d = self.disk.display();
        (
            PathBuf::from(format!("{d}.nbd-server.conf")),
            PathBuf::from(format!("{d}.nbd-server.pid")),
        )
    }

    fn serve(&mut self) {
        let mut c = match self.kind {
            ServerKind::Nbdkit => {
                let mut c = self.command("nbdkit");
                c.args(["-f", "--exit-with-parent", "-i"])
                    .arg(self.addr.to_string())
                    .args(["-p", &PORT.to_string()]);
                if let Some(tls) = &self.tls {
                    c.arg("--tls=require")
                        .arg(format!("--tls-certificates={}", tls.display()));
                }
                c.arg("file").arg(&self.disk);
                c
            }
            ServerKind::QemuNbd => {
                let mut c = self.command("qemu-nbd");
                // --persistent: it serves on after a client leaves; --shared: the member's
                // connection and the tests' own.
                c.args(["-f", "raw", "--persistent", "--shared=16", "-b"])
                    .arg(self.addr.to_string())
                    .args(["-p", &PORT.to_string()]);
                if let Some(tls) = &self.tls {
                    // verify-peer off: clients are not asked for certificates of their own.
                    c.arg("--object")
                        .arg(format!(
                            "tls-creds-x509,id=tls0,dir={},endpoint=server,verify-peer=off",
                            tls.display()
                        ))
                        .args(["--tls-creds", "tls0"]);
                }
                c.arg(&self.disk);
                c
            }
            ServerKind::NbdServer => return self.serve_nbd_server(),
        };
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the NBD server in the host's namespace");
        self.server = Some(Server::Child(child));
        self.wait_reachable();
    }

    /// nbd-server as a daemon in the namespace, from a config file of this host's.
    fn serve_nbd_server(&mut self) {
        let (conf, pidfile) = self.nbd_server_files();
        let mut generic = format!(
            "[generic]\n    port = {PORT}\n    listenaddr = {}\n",
            self.addr
        );
        if let Some(tls) = &self.tls {
            generic += &format!(
                "    certfile = {}\n    keyfile = {}\n    cacertfile = {}\n    force_tls = true\n",
                tls.join("server-cert.pem").display(),
                tls.join("server-key.pem").display(),
                tls.join("ca-cert.pem").display()
            );
        }
        let export = format!(
            "[{NBD_SERVER_EXPORT}]\n    exportname = {}\n    flush = true\n    fua = true\n",
            self.disk.display()
        );
        std::fs::write(&conf, generic + &export).expect("write nbd-server's config");
        let _ = std::fs::remove_file(&pidfile);
        let out = self
            .command("nbd-server")
            .arg("-C")
            .arg(&conf)
            .arg("-p")
            .arg(&pidfile)
            .stdin(Stdio::null())
            .output()
            .expect("run nbd-server in the host's namespace");
        assert!(
            out.status.success(),
            "nbd-server on host {} failed: {out:?}",
            self.ns
        );
        // The daemon writes its pid once it has forked off.
        let deadline = Instant::now() + Duration::from_secs(60);
        let pid = loop {
            let text = std::fs::read_to_string(&pidfile).unwrap_or_default();
            if let Ok(pid) = text.trim().parse::<i32>() {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "nbd-server on host {} wrote no pid to {}: {out:?}",
                self.ns,
                pidfile.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.server = Some(Server::Daemon(pid));
        self.wait_reachable();
    }

    /// Whether the server started runs (its process, not a zombie).
    fn server_alive(&mut self) -> bool {
        match &mut self.server {
            None => false,
            Some(Server::Child(c)) => matches!(c.try_wait(), Ok(None)),
            Some(Server::Daemon(pid)) => {
                let pid = *pid;
                self.is_my_nbd_server(pid)
            }
        }
    }

    /// Whether `pid` is this host's nbd-server (its command line names the host's config)
    /// and not a zombie: nothing else is ever signalled.
    fn is_my_nbd_server(&self, pid: i32) -> bool {
        let (conf, _) = self.nbd_server_files();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let mine = cmdline
            .split(|&b| b == 0)
            .any(|a| a == conf.as_os_str().as_encoded_bytes());
        mine && !matches!(proc_state(pid), Some('Z') | None)
    }

    fn wait_reachable(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.reachable() {
            if !self.server_alive() {
                panic!("{:?} on host {} exited", self.kind, self.ns);
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
    /// see their connections reset. nbd-server's whole process group goes (the daemon and
    /// its per-client children); returns once none of it runs.
    pub fn kill_server(&mut self) {
        match self.server.take() {
            None => {}
            Some(Server::Child(mut c)) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            Some(Server::Daemon(pid)) => {
                if !self.is_my_nbd_server(pid) {
                    return;
                }
                // SAFETY: kill has no memory preconditions; the group is the daemon's own
                // (it leads its session), checked above to be this host's nbd-server.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                let deadline = Instant::now() + Duration::from_secs(60);
                while group_alive(pid) {
                    assert!(
                        Instant::now() < deadline,
                        "nbd-server {pid} on host {} outlived SIGKILL",
                        self.ns
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
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

/// The state letter of `/proc/PID/stat` (`None`: no such process).
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so from the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether a process of group `pgid` runs (a zombie does not: its sockets are closed).
fn group_alive(pgid: i32) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|e| {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        // After COMM: state, ppid, pgrp.
        let f: Vec<&str> = rest.split_whitespace().take(3).collect();
        f.len() == 3 && f[2].parse() == Ok(pgid) && f[0] != "Z"
    })
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

    /// nbd-server as a host: its daemon serves the named export over the link (the URI
    /// names it), cut off it answers nothing and restored it serves; killed, its daemon and
    /// the child serving an open connection are gone (that connection reset) and nothing
    /// answers; restarted it serves again; dropped, no process of it is left.
    #[test]
    fn an_nbd_server_host_is_killed_whole_and_restarted() {
        let test = "an_nbd_server_host_is_killed_whole_and_restarted";
        if !need_netns(test) || !crate::skip::need_tools(&["nbd-server"], test) {
            return;
        }
        use std::io::Read;
        let dir = TempDir::new("netns-nbd-server");
        let mut h = Host::start_with(&dir, "n", 4, ServerKind::NbdServer);
        assert_eq!(
            h.uri(),
            format!("nbd://{}:{PORT}/{NBD_SERVER_EXPORT}", h.addr)
        );
        let hello = |s: &mut TcpStream| {
            let mut b = [0u8; 18];
            s.read_exact(&mut b).unwrap();
            assert_eq!(&b[..16], b"NBDMAGICIHAVEOPT");
        };
        let mut s = TcpStream::connect((h.addr, PORT)).unwrap();
        hello(&mut s);
        h.cut();
        assert!(!h.reachable(), "a cut-off host accepted a connection");
        h.restore();

        let Some(Server::Daemon(pid)) = h.server else {
            panic!("nbd-server is not a daemon here");
        };
        assert!(h.is_my_nbd_server(pid));
        // The connection above has a child of the daemon's serving it.
        assert!(group_alive(pid));
        h.kill_server();
        assert!(!group_alive(pid), "nbd-server's group outlived kill_server");
        assert!(!h.reachable(), "a killed nbd-server accepted a connection");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut more = [0u8; 1];
        assert!(
            matches!(s.read(&mut more), Ok(0) | Err(_)),
            "a connection to a killed nbd-server still answers"
        );

        h.restart(true);
        let mut s = TcpStream::connect((h.addr, PORT)).unwrap();
        hello(&mut s);
        let Some(Server::Daemon(pid)) = h.server else {
            panic!("nbd-server is not a daemon here");
        };
        drop(s);
        drop(h);
        assert!(!group_alive(pid), "nbd-server left running after drop");
    }
}
