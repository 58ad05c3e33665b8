//! TLS for NBD (`NBD_OPT_STARTTLS`), on both sides: X.509 with rustls, TLS-PSK (nbdkit's
//! `--tls-psk`, qemu's `tls-creds-psk`) with OpenSSL.
//!
//! After STARTTLS the handshake is done at once (so a refused certificate or key is an
//! error of the handshake, named), then a pump thread moves bytes between the TCP socket
//! (TLS records) and one end of a Unix socketpair (plain NBD); the other end becomes the
//! connection's `Stream`. So the server's leader/follower workers and the client's
//! reader thread, which read and write one stream from several threads, work unchanged
//! over TLS (a TLS session is one state machine that cannot be shared that way).
//! Either side closing ends the pump and closes the other.
//!
//! rustls has no external-PSK support, so a PSK session is OpenSSL's, run on an
//! in-memory transport (`MemIo`) so that it is driven as rustls's state machine is: one
//! handshake and one pump (`Session`) serve both.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslStream, SslVerifyMode,
    SslVersion,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::socket::Stream;
use crate::tls_psk::{PskFile, PskFileError};

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
    /// rustls or OpenSSL refused the combination (a key that does not match the
    /// certificate...).
    #[error("TLS: {0}")]
    Config(String),
}

impl From<PskFileError> for TlsError {
    fn from(e: PskFileError) -> TlsError {
        TlsError::File {
            what: "pre-shared key file",
            path: e.path,
            why: e.why,
        }
    }
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

/// The TLS 1.2 suites of a PSK session: PSK key exchange (with (EC)DHE first: forward
/// secrecy), AEAD ciphers, then CBC for old peers. TLS 1.3 keeps OpenSSL's default suites
/// (the PSK callbacks work there with the SHA-256 ones).
const PSK_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:\
    DHE-PSK-AES128-GCM-SHA256:DHE-PSK-CHACHA20-POLY1305:PSK-AES256-GCM-SHA384:\
    PSK-AES128-GCM-SHA256:PSK-CHACHA20-POLY1305:ECDHE-PSK-AES256-CBC-SHA384:\
    ECDHE-PSK-AES128-CBC-SHA256:PSK-AES256-CBC-SHA384:PSK-AES128-CBC-SHA256";

fn ossl(what: &str) -> impl Fn(openssl::error::ErrorStack) -> TlsError + '_ {
    move |e| TlsError::Config(format!("OpenSSL, {what}: {e}"))
}

/// An OpenSSL context for TLS-PSK: TLS 1.2 and 1.3, no certificates, no renegotiation, no
/// session tickets (every connection has the key anyway).
fn psk_context(method: SslMethod) -> Result<SslContextBuilder, TlsError> {
    let mut b = SslContext::builder(method).map_err(ossl("context"))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(ossl("TLS versions"))?;
    b.set_cipher_list(PSK_CIPHERS)
        .map_err(ossl("PSK cipher suites"))?;
    b.set_options(SslOptions::NO_RENEGOTIATION | SslOptions::NO_TICKET);
    b.set_num_tickets(0).map_err(ossl("session tickets"))?;
    b.set_verify(SslVerifyMode::NONE);
    Ok(b)
}

#[derive(Clone)]
enum ServerKind {
    X509(Arc<rustls::ServerConfig>),
    Psk { ctx: SslContext, file: Arc<PskFile> },
}

/// The server's side: its certificate chain and key (X.509) or its pre-shared keys, and
/// whether clients must use TLS.
#[derive(Clone)]
pub struct TlsServer {
    kind: ServerKind,
    /// Clients must STARTTLS before anything else (nbdkit's `--tls=require`); otherwise
    /// TLS is offered and plain NBD is served too.
    pub required: bool,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TlsServer");
        match &self.kind {
            ServerKind::X509(_) => d.field("kind", &"X.509"),
            ServerKind::Psk { file, .. } => d.field("psk", file),
        };
        d.field("required", &self.required).finish()
    }
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
            kind: ServerKind::X509(Arc::new(config)),
            required,
        })
    }

    /// From a pre-shared key file (`identity:hexkey` lines, as nbdkit's `--tls-psk` and
    /// psktool): a client must give one of its identities with that identity's key; an
    /// unknown identity or a wrong key fails the handshake. No certificate.
    pub fn from_psk_file(path: &Path, required: bool) -> Result<TlsServer, TlsError> {
        let file = Arc::new(PskFile::read(path)?);
        let mut b = psk_context(SslMethod::tls_server())?;
        let keys = file.clone();
        b.set_psk_server_callback(move |_ssl, identity, psk| {
            let Some(identity) = identity else {
                return Ok(0);
            };
            match keys.key(identity) {
                Some(key) if key.len() <= psk.len() => {
                    psk[..key.len()].copy_from_slice(key);
                    Ok(key.len())
                }
                _ => {
                    tracing::warn!(
                        "TLS-PSK: a client's identity {:?} is not in {}: refused",
                        String::from_utf8_lossy(identity),
                        keys.path
                    );
                    Ok(0) // unknown: the handshake fails
                }
            }
        });
        Ok(TlsServer {
            kind: ServerKind::Psk {
                ctx: b.build(),
                file,
            },
            required,
        })
    }

    /// TLS on an accepted connection whose client asked for STARTTLS (already answered).
    pub(crate) fn accept(&self, stream: &Stream, timeout: Duration) -> io::Result<Stream> {
        let tls: Box<dyn Session> = match &self.kind {
            ServerKind::X509(config) => Box::new(rustls::Connection::from(
                rustls::ServerConnection::new(config.clone()).map_err(io::Error::other)?,
            )),
            ServerKind::Psk { ctx, .. } => Box::new(OsslSession::new(ctx, true)?),
        };
        start(stream, tls, timeout)
    }
}

#[derive(Clone)]
enum ClientKind {
    X509(Arc<rustls::ClientConfig>),
    Psk {
        ctx: SslContext,
        file: Arc<PskFile>,
        identity: String,
    },
    /// A key file of several identities, none named yet: each URI names its own.
    PskUnchosen(Arc<PskFile>),
}

/// The client's side: the CA certificates that the server's certificate must chain to
/// (X.509), or the identity and pre-shared key it gives (PSK).
#[derive(Clone)]
pub struct TlsClient {
    kind: ClientKind,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TlsClient");
        match &self.kind {
            ClientKind::X509(_) => d.field("kind", &"X.509"),
            ClientKind::Psk { file, identity, .. } => {
                d.field("psk_file", &file.path).field("identity", identity)
            }
            ClientKind::PskUnchosen(file) => d.field("psk_file", &file.path),
        };
        d.finish()
    }
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
        TlsClient::x509(ca, identity, rustls::DEFAULT_VERSIONS)
    }

    /// [`TlsClient::from_ca_file`] offering TLS 1.2 alone (interoperability checks: a
    /// server must then negotiate a TLS 1.2 suite with a certificate).
    #[doc(hidden)]
    pub fn from_ca_file_tls12_only(ca: &Path) -> Result<TlsClient, TlsError> {
        TlsClient::x509(ca, None, &[&rustls::version::TLS12])
    }

    fn x509(
        ca: &Path,
        identity: Option<(&Path, &Path)>,
        versions: &[&'static rustls::SupportedProtocolVersion],
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
            .with_protocol_versions(versions)
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
            kind: ClientKind::X509(Arc::new(config)),
        })
    }

    /// TLS-PSK from a pre-shared key file (`identity:hexkey` lines; `?tls-psk-file=`,
    /// `--nbd-tls-psk`): the identity is `username` (`?tls-username=`, libnbd's name),
    /// else the file's only one. The server is verified by knowing the key.
    pub fn from_psk_file(path: &Path, username: Option<&str>) -> Result<TlsClient, TlsError> {
        TlsClient::psk(Arc::new(PskFile::read(path)?), username)
    }

    /// [`TlsClient::from_psk_file`] offering TLS 1.2 alone (interoperability checks: a
    /// server must then negotiate a TLS 1.2 PSK suite).
    #[doc(hidden)]
    pub fn from_psk_file_tls12_only(
        path: &Path,
        username: Option<&str>,
    ) -> Result<TlsClient, TlsError> {
        TlsClient::psk_upto(
            Arc::new(PskFile::read(path)?),
            username,
            Some(SslVersion::TLS1_2),
        )
    }

    fn psk(file: Arc<PskFile>, username: Option<&str>) -> Result<TlsClient, TlsError> {
        TlsClient::psk_upto(file, username, None)
    }

    /// [`TlsClient::psk`] offering TLS versions up to `max` (tests: TLS 1.2 alone).
    fn psk_upto(
        file: Arc<PskFile>,
        username: Option<&str>,
        max: Option<SslVersion>,
    ) -> Result<TlsClient, TlsError> {
        let (identity, key) = file.choose(username)?;
        let mut b = psk_context(SslMethod::tls_client())?;
        b.set_max_proto_version(max).map_err(ossl("TLS versions"))?;
        let id = identity.clone();
        b.set_psk_client_callback(move |_ssl, _hint, id_buf, psk_buf| {
            // The identity goes NUL-terminated into OpenSSL's buffer.
            if id.len() >= id_buf.len() || key.len() > psk_buf.len() {
                return Err(openssl::error::ErrorStack::get());
            }
            id_buf[..id.len()].copy_from_slice(id.as_bytes());
            id_buf[id.len()] = 0;
            psk_buf[..key.len()].copy_from_slice(&key);
            Ok(key.len())
        });
        Ok(TlsClient {
            kind: ClientKind::Psk {
                ctx: b.build(),
                file,
                identity,
            },
        })
    }

    /// For the members of a command (`--nbd-tls-psk`, `--nbd-tls-username`): as
    /// [`TlsClient::from_psk_file`], but a file of several identities without `username`
    /// is taken too; each URI then names its own identity
    /// ([`TlsClient::for_username`]).
    pub fn from_psk_file_for_members(
        path: &Path,
        username: Option<&str>,
    ) -> Result<TlsClient, TlsError> {
        let file = Arc::new(PskFile::read(path)?);
        if username.is_none() && file.identities().count() > 1 {
            return Ok(TlsClient {
                kind: ClientKind::PskUnchosen(file),
            });
        }
        TlsClient::psk(file, username)
    }

    /// This client for a URI that names `username` (or none): a PSK client with that
    /// identity from the same key file; `None` where this one serves as it is (X.509,
    /// or no username and an identity chosen already).
    pub fn for_username(&self, username: Option<&str>) -> Result<Option<TlsClient>, TlsError> {
        match (&self.kind, username) {
            (ClientKind::X509(_), _) | (ClientKind::Psk { .. }, None) => Ok(None),
            (ClientKind::Psk { file, .. } | ClientKind::PskUnchosen(file), user) => {
                TlsClient::psk(file.clone(), user).map(Some)
            }
        }
    }

    /// The identity a PSK client gives; `None` for X.509.
    pub fn psk_identity(&self) -> Option<&str> {
        match &self.kind {
            ClientKind::Psk { identity, .. } => Some(identity),
            ClientKind::X509(_) | ClientKind::PskUnchosen(_) => None,
        }
    }

    /// TLS on a connection whose server accepted STARTTLS; `host` is the name (or
    /// address) the server's certificate must carry (X.509; unused with PSK).
    pub(crate) fn connect(
        &self,
        stream: &Stream,
        host: &str,
        timeout: Duration,
    ) -> io::Result<Stream> {
        let tls: Box<dyn Session> = match &self.kind {
            ClientKind::X509(config) => {
                let name = ServerName::try_from(host.to_string()).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("server name {host:?}: {e}"),
                    )
                })?;
                Box::new(rustls::Connection::from(
                    rustls::ClientConnection::new(config.clone(), name)
                        .map_err(io::Error::other)?,
                ))
            }
            ClientKind::Psk { ctx, .. } => Box::new(OsslSession::new(ctx, false)?),
            ClientKind::PskUnchosen(file) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: no identity chosen", file.path),
                ))
            }
        };
        start(stream, tls, timeout)
    }
}

/// Whether the TLS handshake failed because the two sides share no TLS version (the server
/// offers only versions below 1.2, or answered with a protocol_version alert): rustls' and
/// OpenSSL's words for it.
pub(crate) fn version_mismatch(e: &io::Error) -> bool {
    if let Some(r) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        return match r {
            rustls::Error::AlertReceived(rustls::AlertDescription::ProtocolVersion) => true,
            rustls::Error::PeerIncompatible(p) => format!("{p:?}").contains("Tls12"),
            _ => false,
        };
    }
    let text = e.to_string().to_ascii_lowercase();
    [
        "protocol version",
        "unsupported protocol",
        "wrong version number",
        "no protocols available",
        "version too low",
    ]
    .iter()
    .any(|w| text.contains(w))
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

/// One TLS session as the handshake and the pump drive it: records in and out through
/// the caller's socket, plain bytes in and out through the session. rustls's connection
/// is one; OpenSSL's is made one by [`MemIo`].
trait Session: Send {
    /// The handshake is not done yet.
    fn is_handshaking(&self) -> bool;
    /// Records are waiting to be sent.
    fn wants_write(&self) -> bool;
    /// Sends waiting records to `io` (once; some may be left).
    fn write_tls(&mut self, io: &mut dyn Write) -> io::Result<usize>;
    /// Takes records from `io` (once); 0: the peer closed.
    fn read_tls(&mut self, io: &mut dyn Read) -> io::Result<usize>;
    /// Processes the records taken: handshake steps, alerts. An error means the session
    /// is over (an alert for the peer may be waiting to be sent).
    fn process_new_packets(&mut self) -> io::Result<()>;
    /// Plain bytes received: `WouldBlock` when none are ready, 0 once the peer closed.
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Plain bytes to send (as records, once [`Session::write_tls`] sends them).
    fn write_plain(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Queues the close_notify alert.
    fn send_close_notify(&mut self);
}

impl Session for rustls::Connection {
    fn is_handshaking(&self) -> bool {
        let common: &rustls::CommonState = self;
        common.is_handshaking()
    }
    fn wants_write(&self) -> bool {
        let common: &rustls::CommonState = self;
        common.wants_write()
    }
    fn write_tls(&mut self, mut io: &mut dyn Write) -> io::Result<usize> {
        rustls::Connection::write_tls(self, &mut io)
    }
    fn read_tls(&mut self, mut io: &mut dyn Read) -> io::Result<usize> {
        rustls::Connection::read_tls(self, &mut io)
    }
    fn process_new_packets(&mut self) -> io::Result<()> {
        // The rustls error kept inside: `certificate_problem` reads it.
        rustls::Connection::process_new_packets(self)
            .map(|_| ())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reader().read(buf)
    }
    fn write_plain(&mut self, buf: &[u8]) -> io::Result<()> {
        self.writer().write_all(buf)
    }
    fn send_close_notify(&mut self) {
        let common: &mut rustls::CommonState = self;
        common.send_close_notify()
    }
}

/// OpenSSL's transport for a session driven as rustls's: records from the peer are put
/// in `inbound` (its reads say `WouldBlock` when it is empty: OpenSSL wants more), and
/// what OpenSSL writes collects in `outbound` until it is sent.
#[derive(Default)]
struct MemIo {
    inbound: VecDeque<u8>,
    outbound: Vec<u8>,
}

impl Read for MemIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.inbound.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.inbound.read(buf)
    }
}

impl Write for MemIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outbound.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An OpenSSL (TLS-PSK) session on a [`MemIo`].
struct OsslSession {
    s: SslStream<MemIo>,
    handshaking: bool,
}

/// An OpenSSL failure as an `io::Error` that says why (which alert).
fn ossl_io(e: openssl::ssl::Error) -> io::Error {
    match e.code() {
        ErrorCode::SYSCALL if e.io_error().is_none() => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the connection without close_notify",
        ),
        _ => match e.into_io_error() {
            Ok(io) => io,
            Err(e) => {
                // OpenSSL's reasons ("sslv3 alert illegal parameter"), not its source lines.
                let reasons: Vec<&str> = e
                    .ssl_error()
                    .map(|s| s.errors().iter().filter_map(|e| e.reason()).collect())
                    .unwrap_or_default();
                if reasons.is_empty() {
                    io::Error::new(io::ErrorKind::InvalidData, e)
                } else {
                    io::Error::new(io::ErrorKind::InvalidData, reasons.join("; "))
                }
            }
        },
    }
}

impl OsslSession {
    fn new(ctx: &SslContext, server: bool) -> io::Result<OsslSession> {
        let mut ssl = Ssl::new(ctx).map_err(io::Error::other)?;
        if server {
            ssl.set_accept_state();
        } else {
            ssl.set_connect_state();
        }
        Ok(OsslSession {
            s: SslStream::new(ssl, MemIo::default()).map_err(io::Error::other)?,
            handshaking: true,
        })
    }
}

impl Session for OsslSession {
    fn is_handshaking(&self) -> bool {
        self.handshaking
    }
    fn wants_write(&self) -> bool {
        !self.s.get_ref().outbound.is_empty()
    }
    fn write_tls(&mut self, io: &mut dyn Write) -> io::Result<usize> {
        let out = &mut self.s.get_mut().outbound;
        let n = io.write(out)?;
        out.drain(..n);
        Ok(n)
    }
    fn read_tls(&mut self, io: &mut dyn Read) -> io::Result<usize> {
        let mut buf = [0u8; 32 << 10];
        let n = io.read(&mut buf)?;
        self.s.get_mut().inbound.extend(&buf[..n]);
        Ok(n)
    }
    fn process_new_packets(&mut self) -> io::Result<()> {
        if !self.handshaking {
            return Ok(()); // records after the handshake are read by read_plain
        }
        match self.s.do_handshake() {
            Ok(()) => {
                self.handshaking = false;
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::WANT_READ => Ok(()),
            Err(e) => Err(ossl_io(e)),
        }
    }
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.s.ssl_read(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => Ok(0),
            Err(e) if e.code() == ErrorCode::WANT_READ => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(ossl_io(e)),
        }
    }
    fn write_plain(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.s.ssl_write(buf).map_err(ossl_io)?;
            buf = &buf[n..];
        }
        Ok(())
    }
    fn send_close_notify(&mut self) {
        let _ = self.s.shutdown();
    }
}

/// The TLS handshake on `stream` (blocking, each step bounded by `timeout`), then the pump
/// thread; returns the plain end.
fn start(stream: &Stream, mut tls: Box<dyn Session>, timeout: Duration) -> io::Result<Stream> {
    let (owner, fd): (Box<dyn Send + AsRawFdShutdown>, RawFd) = match stream {
        Stream::Tcp(tcp) => {
            let tcp = tcp.try_clone()?;
            let fd = tcp.as_raw_fd();
            (Box::new(tcp), fd)
        }
        // TLS over a Unix socket works the same; the pump needs only the descriptor.
        Stream::Unix(u) => {
            let u = u.try_clone()?;
            let fd = u.as_raw_fd();
            (Box::new(u), fd)
        }
    };
    handshake(fd, stream, tls.as_mut(), timeout)?;
    spawn_pump(owner, fd, tls)
}

fn handshake(
    fd: RawFd,
    stream: &Stream,
    tls: &mut dyn Session,
    timeout: Duration,
) -> io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut io = Fd(fd);
    let (mut wrote, mut heard) = (false, false);
    let mut steps = || -> io::Result<()> {
        tls.process_new_packets()?; // a client's first flight
        loop {
            while tls.wants_write() {
                tls.write_tls(&mut io)?;
                wrote = true;
            }
            if !tls.is_handshaking() {
                return Ok(());
            }
            if tls.read_tls(&mut io)? == 0 {
                if wrote && !heard {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, Unanswered));
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                ));
            }
            heard = true;
            tls.process_new_packets()?;
        }
    };
    if let Err(e) = steps() {
        // The alert that says why, if one is queued.
        while tls.wants_write() {
            if tls.write_tls(&mut io).is_err() {
                break;
            }
        }
        return Err(e);
    }
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(())
}

/// The peer closed the connection after our first TLS flight without sending a byte back:
/// it found nothing in the hello it could take (no shared version or cipher suite, or an
/// identity it does not know).
#[derive(Debug)]
pub(crate) struct Unanswered;

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the peer closed the connection without answering the TLS hello")
    }
}

impl std::error::Error for Unanswered {}

/// Whether `e` is [`Unanswered`].
pub(crate) fn unanswered(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Unanswered>())
}

fn spawn_pump(
    owner: Box<dyn Send + AsRawFdShutdown>,
    fd: RawFd,
    tls: Box<dyn Session>,
) -> io::Result<Stream> {
    let (mine, theirs) = UnixStream::pair()?;
    set_nonblocking(fd)?;
    mine.set_nonblocking(true)?;
    let live = Live::enter(mine.as_raw_fd());
    std::thread::Builder::new()
        .name("nbd-tls".into())
        .spawn(move || {
            pump(fd, &mine, tls);
            owner.close();
            // Out of the registry before `mine` is closed: its descriptor number is not
            // shut down by [`close_all`] once another file may have it.
            drop(live);
        })?;
    Ok(Stream::Unix(theirs))
}

/// The plain ends (the pump's side of each socketpair) of the pumps running, for
/// [`close_all`].
static LIVE: (std::sync::Mutex<Vec<RawFd>>, std::sync::Condvar) =
    (std::sync::Mutex::new(Vec::new()), std::sync::Condvar::new());

/// One running pump, in [`LIVE`] until dropped.
struct Live(RawFd);

impl Live {
    fn enter(local: RawFd) -> Live {
        LIVE.0.lock().unwrap_or_else(|e| e.into_inner()).push(local);
        Live(local)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = LIVE.0.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|&fd| fd != self.0);
        LIVE.1.notify_all();
    }
}

/// Ends every TLS connection still open, as a process does before it exits: each pump
/// takes its plain side as closed, sends the peer its close_notify and ends; waits up to
/// `limit` for them. An exit would otherwise cut the pump threads short, and each peer
/// would see a TLS connection that was not properly closed (nbdkit logs it as an error).
/// True when every one ended.
pub fn close_all(limit: Duration) -> bool {
    let live = LIVE.0.lock().unwrap_or_else(|e| e.into_inner());
    for &fd in live.iter() {
        // SAFETY: `fd` is a pump's open socket: it leaves LIVE (under this lock) before
        // it is closed. Shutting its reading side makes the pump read an end of file.
        unsafe { libc::shutdown(fd, libc::SHUT_RD) };
    }
    let (live, _) = LIVE
        .1
        .wait_timeout_while(live, limit, |l| !l.is_empty())
        .unwrap_or_else(|e| e.into_inner());
    live.is_empty()
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
fn pump(net: RawFd, local: &UnixStream, mut tls: Box<dyn Session>) {
    let mut net_io = Fd(net);
    let mut local_io = Fd(local.as_raw_fd());
    let mut held: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // Records that came with the handshake's last flight (a TLS 1.3 client may send its
    // first options right behind its Finished) are already decrypted: no poll would
    // announce them.
    let mut peer_open = take_plain(tls.as_mut(), &mut held, &mut buf);
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
            peer_open &= take_plain(tls.as_mut(), &mut held, &mut buf);
        }
        if fds[1].revents & !libc::POLLOUT != 0 {
            match local_io.read(&mut buf) {
                Ok(0) => {
                    // The plain side closed: say so to the peer and end.
                    tls.send_close_notify();
                    let _ = flush_blocking(tls.as_mut(), net);
                    return;
                }
                Ok(n) => {
                    if tls.write_plain(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if would_block(&e) => {}
                Err(_) => return,
            }
        }
    }
}

/// Moves the plain bytes the session has decrypted to `held`; false once the peer has
/// closed.
fn take_plain(tls: &mut dyn Session, held: &mut Vec<u8>, buf: &mut [u8]) -> bool {
    loop {
        match tls.read_plain(buf) {
            Ok(0) => return false, // close_notify
            Ok(n) => held.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(_) => return false, // closed without close_notify
        }
    }
}

/// Sends what TLS holds, waiting up to a second for the socket (the last records before
/// a close).
fn flush_blocking(tls: &mut dyn Session, net: RawFd) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(s: Stream) -> UnixStream {
        match s {
            Stream::Unix(u) => u,
            Stream::Tcp(_) => panic!("the plain end is a socketpair"),
        }
    }

    /// A PSK client and server over a socketpair: their plain ends.
    fn connected(server: &TlsServer, client: &TlsClient) -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = UnixStream::pair()?;
        let srv = server.clone();
        let t = std::thread::spawn(move || srv.accept(&Stream::Unix(a), Duration::from_secs(10)));
        let c = client.connect(&Stream::Unix(b), "localhost", Duration::from_secs(10));
        let s = t.join().expect("server thread");
        Ok((plain(c?), plain(s?)))
    }

    fn exchange(c: &mut UnixStream, s: &mut UnixStream) {
        // More than a record each way, both ways.
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut back = vec![0u8; data.len()];
        let d = data.clone();
        let mut c2 = c.try_clone().unwrap();
        let w = std::thread::spawn(move || c2.write_all(&d).unwrap());
        s.read_exact(&mut back).unwrap();
        w.join().unwrap();
        assert!(back == data);
        s.write_all(&data[..5000]).unwrap();
        c.read_exact(&mut back[..5000]).unwrap();
        assert!(back[..5000] == data[..5000]);
    }

    #[test]
    fn psk_sessions_over_tls_1_3_and_tls_1_2_and_a_wrong_key_fails() {
        let file = |text: &str| Arc::new(PskFile::parse("/k.psk", text).unwrap());
        let keys = "alice:000102030405060708090a0b0c0d0e0f\nbob:ff";
        let dir = std::env::temp_dir().join(format!("uraid-psk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys.psk");
        std::fs::write(&path, keys).unwrap();
        let server = TlsServer::from_psk_file(&path, true).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        for max in [None, Some(SslVersion::TLS1_2)] {
            let client = TlsClient::psk_upto(file(keys), Some("alice"), max).unwrap();
            let (mut c, mut s) = connected(&server, &client).unwrap();
            exchange(&mut c, &mut s);
            // The client closing reaches the server as an end of file.
            drop(c);
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            assert!(rest.is_empty());
            let bob = TlsClient::psk_upto(file("bob:ff"), None, max).unwrap();
            let (mut c, mut s) = connected(&server, &bob).unwrap();
            exchange(&mut c, &mut s);
            let wrong = TlsClient::psk_upto(file("alice:0001"), None, max).unwrap();
            assert!(connected(&server, &wrong).is_err(), "{max:?}");
            let unknown = TlsClient::psk_upto(file("carol:0001"), None, max).unwrap();
            assert!(connected(&server, &unknown).is_err(), "{max:?}");
        }
    }
}
