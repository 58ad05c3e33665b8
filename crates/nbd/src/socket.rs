//! Unix and TCP sockets behind one type, and a wakeup pipe for the accept loop.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::NbdError;

/// A listening socket the server accepts NBD clients on.
#[derive(Debug)]
pub enum Listener {
    Unix {
        listener: UnixListener,
        path: PathBuf,
        /// The socket file is removed when the listener goes (false for one systemd
        /// passed: its socket unit owns the file and keeps it across restarts).
        remove: bool,
    },
    Tcp(TcpListener),
}

impl Listener {
    /// Listens on a Unix socket at `path`. A stale socket file left there by a
    /// dead server is replaced; one that a live server answers on is not.
    pub fn bind_unix(path: impl AsRef<Path>) -> Result<Listener, NbdError> {
        let path = path.as_ref().to_path_buf();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            use std::os::unix::fs::FileTypeExt;
            if meta.file_type().is_socket() {
                if UnixStream::connect(&path).is_ok() {
                    return Err(NbdError::BindUnix {
                        path,
                        source: io::ErrorKind::AddrInUse.into(),
                    });
                }
                let _ = std::fs::remove_file(&path);
            }
        }
        let listener = UnixListener::bind(&path).map_err(|source| NbdError::BindUnix {
            path: path.clone(),
            source,
        })?;
        Ok(Listener::Unix {
            listener,
            path,
            remove: true,
        })
    }

    /// A listening socket made by someone else (systemd's socket activation): used as it
    /// is, and a Unix socket's file is left in place when the listener goes, so that
    /// clients connecting while the server restarts wait in its backlog.
    pub fn adopt_unix(listener: UnixListener) -> Result<Listener, NbdError> {
        let path = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_path_buf))
            .ok_or_else(|| NbdError::BindUnix {
                path: PathBuf::from("(unnamed)"),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the socket passed has no path (an abstract or unnamed Unix socket)",
                ),
            })?;
        Ok(Listener::Unix {
            listener,
            path,
            remove: false,
        })
    }

    /// A listening TCP socket made by someone else (systemd's socket activation).
    pub fn adopt_tcp(listener: TcpListener) -> Listener {
        Listener::Tcp(listener)
    }

    /// Listens on TCP at exactly `addr` (the caller picks 127.0.0.1 or another address).
    pub fn bind_tcp(addr: SocketAddr) -> Result<Listener, NbdError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| NbdError::BindTcp { addr, source })?;
        Ok(Listener::Tcp(listener))
    }

    /// The TCP address actually bound (useful with port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix { .. } => None,
        }
    }

    pub(crate) fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix { listener, .. } => listener.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                // Replies are written whole; Nagle would only add latency.
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
        }
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            Listener::Unix { listener, .. } => listener.set_nonblocking(nonblocking),
            Listener::Tcp(l) => l.set_nonblocking(nonblocking),
        }
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Listener::Unix { listener, .. } => listener.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix {
            path, remove: true, ..
        } = self
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One client connection.
#[derive(Debug)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(nonblocking),
            Stream::Tcp(s) => s.set_nonblocking(nonblocking),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }

    /// One `sendmsg` of `bufs` with `MSG_NOSIGNAL`: a client that went away
    /// gives `EPIPE`, never a `SIGPIPE` that would kill the process. With `wait`
    /// false, `MSG_DONTWAIT`: a full socket gives `WouldBlock` at once.
    fn send_vectored(&self, bufs: &[&[u8]], wait: bool) -> io::Result<usize> {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        assert!(bufs.len() <= iov.len());
        for (v, b) in iov.iter_mut().zip(bufs) {
            v.iov_base = b.as_ptr() as *mut libc::c_void;
            v.iov_len = b.len();
        }
        // SAFETY: msghdr is plain data; all-zero is a valid empty value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = bufs.len() as _;
        // SAFETY: `msg` points at `bufs.len()` iovecs that describe live,
        // readable slices for the duration of the call.
        let flags = libc::MSG_NOSIGNAL | if wait { 0 } else { libc::MSG_DONTWAIT };
        let n = unsafe { libc::sendmsg(self.raw_fd(), &msg, flags) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Writes all of `bufs` (one `sendmsg` in the common case).
    pub(crate) fn write_all_vectored(&self, bufs: &[&[u8]]) -> io::Result<()> {
        self.write_all_vectored_or(bufs, || {})
    }

    /// [`Stream::write_all_vectored`], calling `before_blocking` once, first, if the
    /// socket cannot take all of `bufs` at once (the NBD client makes sure someone
    /// reads replies before it blocks: a server may stop reading until its replies go).
    pub(crate) fn write_all_vectored_or(
        &self,
        bufs: &[&[u8]],
        mut before_blocking: impl FnMut(),
    ) -> io::Result<()> {
        let mut wait = false;
        let mut left: [&[u8]; 4] = [&[]; 4];
        assert!(bufs.len() <= left.len());
        left[..bufs.len()].copy_from_slice(bufs);
        let mut first = 0;
        let n_bufs = bufs.len();
        while first < n_bufs {
            if left[first].is_empty() {
                first += 1;
                continue;
            }
            let mut written = match self.send_vectored(&left[first..n_bufs], wait) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !wait => 0,
                Err(e) => return Err(e),
            };
            if !wait && written < left[first..n_bufs].iter().map(|b| b.len()).sum::<usize>() {
                wait = true;
                before_blocking();
            }
            while written > 0 {
                let take = written.min(left[first].len());
                left[first] = &left[first][take..];
                written -= take;
                if left[first].is_empty() {
                    first += 1;
                }
            }
        }
        Ok(())
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => (&*s).read(buf),
            Stream::Tcp(s) => (&*s).read(buf),
        }
    }
}

/// A self-pipe that wakes a thread blocked in `poll` for shutdown, without touching any
/// path (the NBD accept loop; the control socket of `uraid serve`).
#[derive(Debug)]
pub struct WakePipe {
    read_end: OwnedFd,
    write_end: OwnedFd,
}

impl WakePipe {
    pub fn new() -> io::Result<WakePipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two new descriptors into `fds`, which we then own.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(WakePipe {
            read_end,
            write_end,
        })
    }

    pub fn wake(&self) {
        let byte = 1u8;
        // SAFETY: writes one byte from a valid buffer to a descriptor we own.
        // A full pipe (EAGAIN) already means a wakeup is pending.
        unsafe { libc::write(self.write_end.as_raw_fd(), (&byte as *const u8).cast(), 1) };
    }

    /// The end [`WakePipe::wait_readable`] polls, for callers with their own `poll`.
    pub(crate) fn read_fd(&self) -> RawFd {
        self.read_end.as_raw_fd()
    }

    /// Empties the pipe (after its wake-up was seen).
    pub(crate) fn drain(&self) {
        let mut b = [0u8; 64];
        // SAFETY: reads into a valid local buffer from a non-blocking descriptor we own.
        while unsafe { libc::read(self.read_end.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) } > 0 {
        }
    }

    /// Waits until `fd` is readable or the pipe is woken; true if woken.
    pub fn wait_readable(&self, fd: RawFd) -> io::Result<bool> {
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.read_end.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if rc >= 0 {
                return Ok(fds[1].revents != 0);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}
