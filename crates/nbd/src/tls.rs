//! TLS for NBD (`NBD_OPT_STARTTLS`), with rustls, on both sides.
//!
//! After STARTTLS the handshake is done at once (so a refused certificate is an error of
//! the handshake, named), then a pump thread moves bytes between the TCP socket (TLS
//! records) and one end of a Unix socketpair (plain NBD); the other end becomes the
//! connection's `Stream`. So the server's leader/follower workers and the client's
//! reader thread, which read and write one stream from several threads, work unchanged
//! over TLS (a rustls connection is one state machine that cannot be shared that way).
//! Either side closing ends the pump and closes the other.
//!
//! X.509 only: rustls has no external-PSK (TLS-PSK) support, so nbdkit's `--tls-psk` is
//! refused by name where it is asked for.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::socket::Stream;

/// A TLS setup that could not be built from its files.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("TLS: {what} {path}: {why}")]
    File {
        /// What the file should hold ("certificate", "private key", "CA").
        what: &'static str,
        /// The file.
        path: String,
        /// Why it is unusable.
        why: String,
    },
    /// rustls refused the combination (a key that does not match the certificate...).
    #[error("TLS: {0}")]
    Config(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |why: String| TlsError::File {
        what,
        path: path.display().to_string(),
        why,
    };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM CERTIFICATE in it".into()));
    }
    Ok(certs)
}

/// The server's side: its certificate chain and key, and whether clients must use TLS.
#[derive(Debug, Clone)]
pub struct TlsServer {
    config: Arc<rustls::ServerConfig>,
    /// Clients must STARTTLS before anything else (nbdkit's `--tls=require`); otherwise
    /// TLS is offered and plain NBD is served too.
    pub required: bool,
}

impl TlsServer {
    /// From a PEM certificate chain (the server's certificate first) and its PEM private
    /// key (PKCS#8, PKCS#1 or SEC1), as `uraid serve --tls-cert/--tls-key` give them.
    pub fn from_pem_files(cert: &Path, key: &Path, required: bool) -> Result<TlsServer, TlsError> {
        let chain = certs("certificate", cert)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
            what: "private key",
            path: key.display().to_string(),
            why: e.to_string(),
        })?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(format!("certificate and key: {e}")))?;
        Ok(TlsServer {
            config: Arc::new(config),
            required,
        })
    }

    /// TLS on an accepted connection whose client asked for STARTTLS (already answered).
    pub(crate) fn accept(&self, stream: &Stream, timeout: Duration) -> io::Result<Stream> {
        let tls = rustls::ServerConnection::new(self.config.clone()).map_err(io::Error::other)?;
        start(stream, tls.into(), timeout)
    }
}

/// The client's side: the CA certificates that the server's certificate must chain to.
#[derive(Debug, Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
}

impl TlsClient {
    /// From a PEM file of CA certificates (`--nbd-tls-ca`, qemu's `ca-cert.pem`).
    pub fn from_ca_file(ca: &Path) -> Result<TlsClient, TlsError> {
        TlsClient::with_identity(ca, None)
    }

    /// [`TlsClient::from_ca_file`], and with `identity` (a PEM certificate chain and its
    /// PEM private key: `--nbd-tls-cert`, `--nbd-tls-key`) the certificate uraid presents
    /// to servers that ask for one (nbd-server with TLS, nbdkit `--tls-verify-peer`,
    /// qemu-nbd's `verify-peer=on`).
    pub fn with_identity(
        ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> Result<TlsClient, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs("CA", ca)? {
            roots.add(c).map_err(|e| TlsError::File {
                what: "CA",
                path: ca.display().to_string(),
                why: e.to_string(),
            })?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots);
        let config = match identity {
            None => config.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certs("client certificate", cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
                    what: "client private key",
                    path: key.display().to_string(),
                    why: e.to_string(),
                })?;
                config
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| TlsError::Config(format!("client certificate and key: {e}")))?
            }
        };
        Ok(TlsClient {
            config: Arc::new(config),
        })
    }

    /// TLS on a connection whose server accepted STARTTLS; `host` is the name (or
    /// address) the server's certificate must carry.
    pub(crate) fn connect(
        &self,
        stream: &Stream,
        host: &str,
        timeout: Duration,
    ) -> io::Result<Stream> {
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("server name {host:?}: {e}"),
            )
        })?;
        let tls =
            rustls::ClientConnection::new(self.config.clone(), name).map_err(io::Error::other)?;
        start(stream, tls.into(), timeout)
    }
}

/// When the TLS handshake failed because the server's certificate was refused: what is
/// wrong with it and what to do, in words (`host`: the name or address it had to carry).
/// `None` for any other failure (a lost connection, an alert from the server).
pub(crate) fn certificate_problem(e: &io::Error, host: &str) -> Option<String> {
    use rustls::CertificateError as C;
    let e = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    let rustls::Error::InvalidCertificate(c) = e else {
        return None;
    };
    Some(match c {
        C::UnknownIssuer | C::BadSignature => "the server's certificate is not signed by the \
             CA in --nbd-tls-ca: give --nbd-tls-ca the CA that signed it, or the server one \
             that this CA signed"
            .to_string(),
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            let carried = match c {
                C::NotValidForNameContext { presented, .. } if !presented.is_empty() => {
                    // webpki's names come as `IpAddress(..)`, `DnsName("..")`: bare here.
                    let bare: Vec<&str> = presented
                        .iter()
                        .map(|p| {
                            p.split_once('(')
                                .and_then(|(_, rest)| rest.strip_suffix(')'))
                                .map_or(p.as_str(), |n| n.trim_matches('"'))
                        })
                        .collect();
                    format!(" (it names {})", bare.join(", "))
                }
                _ => String::new(),
            };
            format!(
                "the server's certificate is not made out for {host}{carried}: connect by a \
                 name it carries, or give that name as ?tls-hostname=NAME, or give the server \
                 one for {host} (signed by the CA in --nbd-tls-ca)"
            )
        }
        C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => {
            "the server's certificate has expired or is not valid yet: renew it on the server \
             (or check both clocks)"
                .to_string()
        }
        other => format!(
            "the server's certificate is refused ({other:?}): give the server one that the \
             CA in --nbd-tls-ca signed for {host}"
        ),
    })
}

/// A socket read and written with `recv`/`send(MSG_NOSIGNAL)`: a peer gone gives `EPIPE`,
/// never a `SIGPIPE`.
struct Fd(RawFd);

impl Read for Fd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length; the descriptor outlives `self`.
        let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl Write for Fd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for reads of its length; the descriptor outlives `self`.
        let n = unsafe { libc::send(self.0, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The TLS handshake on `stream` (blocking, each step bounded by `timeout`), then the pump
/// thread; returns the plain end.
fn start(stream: &Stream, mut tls: rustls::Connection, timeout: Duration) -> io::Result<Stream> {
    let Stream::Tcp(tcp) = stream else {
        // TLS over a Unix socket works the same; the pump needs only the descriptor.
        return start_fd(stream, tls, timeout);
    };
    let tcp = tcp.try_clone()?;
    let fd = tcp.as_raw_fd();
    handshake(fd, stream, &mut tls, timeout)?;
    spawn_pump(Box::new(tcp), fd, tls)
}

fn start_fd(stream: &Stream, mut tls: rustls::Connection, timeout: Duration) -> io::Result<Stream> {
    let Stream::Unix(u) = stream else {
        unreachable!("a stream is TCP or Unix")
    };
    let u = u.try_clone()?;
    let fd = u.as_raw_fd();
    handshake(fd, stream, &mut tls, timeout)?;
    spawn_pump(Box::new(u), fd, tls)
}

fn handshake(
    fd: RawFd,
    stream: &Stream,
    tls: &mut rustls::Connection,
    timeout: Duration,
) -> io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut io = Fd(fd);
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut io) {
            // The alert that says why, if rustls has one queued.
            let _ = tls.write_tls(&mut io);
            return Err(e);
        }
    }
    while tls.wants_write() {
        tls.write_tls(&mut io)?;
    }
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(())
}

fn spawn_pump(
    owner: Box<dyn Send + AsRawFdShutdown>,
    fd: RawFd,
    tls: rustls::Connection,
) -> io::Result<Stream> {
    let (mine, theirs) = UnixStream::pair()?;
    set_nonblocking(fd)?;
    mine.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("nbd-tls".into())
        .spawn(move || {
            pump(fd, &mine, tls);
            owner.close();
        })?;
    Ok(Stream::Unix(theirs))
}

/// The socket under TLS, kept open by the pump and shut down when it ends.
trait AsRawFdShutdown {
    fn close(&self);
}

impl AsRawFdShutdown for TcpStream {
    fn close(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

impl AsRawFdShutdown for UnixStream {
    fn close(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we hold open; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Plain bytes from the peer held for the local side at most (then the peer is not read).
const HELD_BYTES: usize = 1 << 20;

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Moves bytes until either side closes or fails. `net` is the TLS socket, `local` the
/// plain end.
fn pump(net: RawFd, local: &UnixStream, mut tls: rustls::Connection) {
    let mut net_io = Fd(net);
    let mut local_io = Fd(local.as_raw_fd());
    let mut held: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // Records that came with the handshake's last flight (a TLS 1.3 client may send its
    // first options right behind its Finished) are already decrypted: no poll would
    // announce them.
    let mut peer_open = take_plain(&mut tls, &mut held, &mut buf);
    loop {
        // Send what is ready on each side.
        while tls.wants_write() {
            match tls.write_tls(&mut net_io) {
                Ok(_) => {}
                Err(e) if would_block(&e) => break,
                Err(_) => return,
            }
        }
        while !held.is_empty() {
            match local_io.write(&held) {
                Ok(n) => {
                    held.drain(..n);
                }
                Err(e) if would_block(&e) => break,
                Err(_) => return,
            }
        }
        if !peer_open && held.is_empty() {
            return; // the peer closed and the local side has everything
        }
        let net_events = if peer_open && held.len() < HELD_BYTES {
            libc::POLLIN
        } else {
            0
        } | if tls.wants_write() { libc::POLLOUT } else { 0 };
        // Read the local side only once TLS has sent what it had: bounded memory.
        let local_events = if !tls.wants_write() && peer_open {
            libc::POLLIN
        } else {
            0
        } | if held.is_empty() { 0 } else { libc::POLLOUT };
        let mut fds = [
            libc::pollfd {
                fd: if net_events == 0 { -1 } else { net },
                events: net_events,
                revents: 0,
            },
            libc::pollfd {
                fd: if local_events == 0 {
                    -1
                } else {
                    local.as_raw_fd()
                },
                events: local_events,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[0].revents & !libc::POLLOUT != 0 && peer_open {
            match tls.read_tls(&mut net_io) {
                Ok(0) => peer_open = false,
                Ok(_) => {}
                Err(e) if would_block(&e) => {}
                Err(_) => return,
            }
            if tls.process_new_packets().is_err() {
                let _ = tls.write_tls(&mut net_io); // the alert
                return;
            }
            peer_open &= take_plain(&mut tls, &mut held, &mut buf);
        }
        if fds[1].revents & !libc::POLLOUT != 0 {
            match local_io.read(&mut buf) {
                Ok(0) => {
                    // The plain side closed: say so to the peer and end.
                    tls.send_close_notify();
                    let _ = flush_blocking(&mut tls, net);
                    return;
                }
                Ok(n) => {
                    if tls.writer().write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if would_block(&e) => {}
                Err(_) => return,
            }
        }
    }
}

/// Moves the plain bytes rustls has decrypted to `held`; false once the peer has closed.
fn take_plain(tls: &mut rustls::Connection, held: &mut Vec<u8>, buf: &mut [u8]) -> bool {
    loop {
        match tls.reader().read(buf) {
            Ok(0) => return false, // close_notify
            Ok(n) => held.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(_) => return false, // closed without close_notify
        }
    }
}

/// Sends what TLS holds, waiting up to a second for the socket (the last records before
/// a close).
fn flush_blocking(tls: &mut rustls::Connection, net: RawFd) -> io::Result<()> {
    let mut io = Fd(net);
    while tls.wants_write() {
        match tls.write_tls(&mut io) {
            Ok(_) => {}
            Err(e) if would_block(&e) => {
                let mut fd = libc::pollfd {
                    fd: net,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                if unsafe { libc::poll(&mut fd, 1, 1000) } <= 0 {
                    return Err(io::ErrorKind::TimedOut.into());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
