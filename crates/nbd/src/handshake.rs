//! Fixed newstyle handshake: option haggling up to the transmission phase.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::NbdError;
use crate::proto::*;
use crate::socket::Stream;
use crate::tls::TlsServer;

/// The TLS handshake's limit when the server sets no handshake timeout.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// What a client that skips STARTTLS on a TLS-only server is told.
const TLS_REQUIRED_MESSAGE: &[u8] = b"this server requires TLS: STARTTLS first (an nbds:// URI)";

/// Largest option payload accepted; anything longer is hostile and drops the connection.
pub(crate) const MAX_OPTION_DATA_BYTES: u32 = 16 * 1024;
/// Options per handshake; a client looping forever is dropped.
pub(crate) const MAX_OPTIONS: usize = 256;

/// The export as the handshake describes it.
#[derive(Debug, Clone)]
pub(crate) struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub read_only: bool,
    pub min_block_bytes: u32,
    pub preferred_block_bytes: u32,
    pub max_payload_bytes: u32,
    /// The backend can zero fast (see [`crate::Backend::can_fast_zero`]).
    pub fast_zero: bool,
    /// The backend's dirty bitmap name ([`crate::Backend::dirty_bitmap`]).
    pub dirty_bitmap: Option<String>,
}

impl ExportInfo {
    fn accepts_name(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }

    pub(crate) fn transmission_flags(&self, structured_replies: bool) -> u16 {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_CAN_MULTI_CONN;
        if self.read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES;
            if self.fast_zero {
                flags |= FLAG_SEND_FAST_ZERO;
            }
        }
        if structured_replies {
            // Reads always come back as one chunk, so "don't fragment" is free.
            flags |= FLAG_SEND_DF;
        }
        flags
    }
}

/// What the client negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Negotiated {
    pub structured_replies: bool,
    /// `base:allocation` was set (NBD_OPT_SET_META_CONTEXT).
    pub base_allocation: bool,
    /// `qemu:dirty-bitmap:<name>` was set.
    pub dirty_bitmap: bool,
}

fn send_reply(stream: &Stream, option: u32, reply: u32, data: &[&[u8]]) -> Result<(), NbdError> {
    let len: usize = data.iter().map(|d| d.len()).sum();
    let header = encode_option_reply(option, reply, len as u32);
    let mut msg = Vec::with_capacity(header.len() + len);
    msg.extend_from_slice(&header);
    for d in data {
        msg.extend_from_slice(d);
    }
    stream.write_all_vectored(&[&msg])?;
    Ok(())
}

/// Reads client bytes before an overall deadline, so a client trickling
/// bytes cannot hold a connection slot in the handshake for long.
struct Reader<'a> {
    stream: &'a Stream,
    deadline: Option<Instant>,
}

impl Reader<'_> {
    fn read_exact(&self, mut buf: &mut [u8]) -> Result<(), NbdError> {
        while !buf.is_empty() {
            if let Some(deadline) = self.deadline {
                let left = deadline
                    .checked_duration_since(Instant::now())
                    .filter(|d| !d.is_zero())
                    .ok_or(NbdError::HandshakeTimeout)?;
                self.stream.set_read_timeout(Some(left))?;
            }
            match (&*self.stream).read(buf) {
                Ok(0) => return Err(NbdError::Disconnected),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(NbdError::HandshakeTimeout)
                }
                Err(e) => return Err(NbdError::Io(e)),
            }
        }
        Ok(())
    }
}

/// Runs the handshake; `Ok` means the transmission phase starts now.
pub(crate) fn negotiate(
    stream: &Stream,
    export: &ExportInfo,
    shutting_down: &AtomicBool,
    timeout: Option<Duration>,
) -> Result<Negotiated, NbdError> {
    negotiate_tls(stream, export, shutting_down, timeout, None).map(|(n, _)| n)
}

/// [`negotiate`] with TLS offered (or required) by `tls`: after STARTTLS the rest of the
/// handshake and the transmission phase go over the stream returned with it.
pub(crate) fn negotiate_tls(
    stream: &Stream,
    export: &ExportInfo,
    shutting_down: &AtomicBool,
    timeout: Option<Duration>,
    tls: Option<&TlsServer>,
) -> Result<(Negotiated, Option<Stream>), NbdError> {
    let reader = Reader {
        stream,
        deadline: timeout.map(|t| Instant::now() + t),
    };
    let no_zeroes = greet(stream, &reader)?;
    let tls = match tls {
        Some(t) => Tls::Offered(t),
        None => Tls::Off,
    };
    let (negotiated, tls_stream) = haggle(stream, &reader, export, shutting_down, no_zeroes, tls)?;
    if timeout.is_some() {
        tls_stream
            .as_ref()
            .unwrap_or(stream)
            .set_read_timeout(None)?;
    }
    Ok((negotiated, tls_stream))
}

/// Where TLS stands in a handshake.
#[derive(Clone, Copy)]
enum Tls<'a> {
    /// Not configured: STARTTLS is unsupported.
    Off,
    /// Configured, not started yet.
    Offered(&'a TlsServer),
    /// Started: this stream is the plain end of the TLS pump.
    Active,
}

/// The greeting and the client's flags; returns whether the client asked for no zeroes.
fn greet(stream: &Stream, reader: &Reader<'_>) -> Result<bool, NbdError> {
    let mut greeting = [0u8; 18];
    greeting[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    greeting[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    greeting[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    stream.write_all_vectored(&[&greeting])?;

    let mut client_flags = [0u8; 4];
    reader.read_exact(&mut client_flags)?;
    let client_flags = u32::from_be_bytes(client_flags);
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(NbdError::ClientFlags {
            flags: client_flags,
        });
    }
    Ok(client_flags & FLAG_C_NO_ZEROES != 0)
}

fn haggle(
    stream: &Stream,
    reader: &Reader<'_>,
    export: &ExportInfo,
    shutting_down: &AtomicBool,
    no_zeroes: bool,
    tls: Tls<'_>,
) -> Result<(Negotiated, Option<Stream>), NbdError> {
    let mut negotiated = Negotiated {
        structured_replies: false,
        base_allocation: false,
        dirty_bitmap: false,
    };
    let mut data = Vec::new();
    for _ in 0..MAX_OPTIONS {
        let mut header = [0u8; OPTION_HEADER_BYTES];
        reader.read_exact(&mut header)?;
        let OptionHeader { option, length } = parse_option_header(&header)?;
        if length > MAX_OPTION_DATA_BYTES {
            return Err(NbdError::OptionTooLong {
                option,
                len: length,
                limit: MAX_OPTION_DATA_BYTES,
            });
        }
        data.resize(length as usize, 0);
        reader.read_exact(&mut data)?;

        if option == OPT_ABORT {
            // The client may already have gone; the ACK is a courtesy.
            let _ = send_reply(stream, option, REP_ACK, &[]);
            return Err(NbdError::Aborted);
        }
        if shutting_down.load(Ordering::Relaxed) {
            if option == OPT_EXPORT_NAME {
                return Err(NbdError::Disconnected);
            }
            send_reply(stream, option, REP_ERR_SHUTDOWN, &[b"server shutting down"])?;
            continue;
        }
        if option == OPT_STARTTLS {
            match tls {
                Tls::Off => send_reply(stream, option, REP_ERR_UNSUP, &[b"no TLS here"])?,
                Tls::Active => send_reply(stream, option, REP_ERR_INVALID, &[b"TLS is on"])?,
                Tls::Offered(_) if !data.is_empty() => {
                    send_reply(stream, option, REP_ERR_INVALID, &[b"takes no data"])?
                }
                Tls::Offered(t) => {
                    // The spec: options before STARTTLS are forgotten.
                    send_reply(stream, option, REP_ACK, &[])?;
                    let left = reader
                        .deadline
                        .map(|d| d.saturating_duration_since(Instant::now()));
                    let plain = t
                        .accept(stream, left.unwrap_or(TLS_HANDSHAKE_TIMEOUT))
                        .map_err(NbdError::Tls)?;
                    let r = Reader {
                        stream: &plain,
                        deadline: reader.deadline,
                    };
                    let (n, _) = haggle(&plain, &r, export, shutting_down, no_zeroes, Tls::Active)?;
                    return Ok((n, Some(plain)));
                }
            }
            continue;
        }
        if matches!(tls, Tls::Offered(t) if t.required) {
            if option == OPT_EXPORT_NAME {
                return Err(NbdError::TlsRequired);
            }
            send_reply(stream, option, REP_ERR_TLS_REQD, &[TLS_REQUIRED_MESSAGE])?;
            continue;
        }
        match option {
            OPT_EXPORT_NAME => {
                if !export.accepts_name(&data) {
                    // This option cannot carry an error: the spec says hang up.
                    return Err(NbdError::UnknownExport {
                        name: String::from_utf8_lossy(&data).into_owned(),
                    });
                }
                let mut reply = Vec::with_capacity(10 + 124);
                reply.extend_from_slice(&export.size_bytes.to_be_bytes());
                reply.extend_from_slice(
                    &export
                        .transmission_flags(negotiated.structured_replies)
                        .to_be_bytes(),
                );
                if !no_zeroes {
                    reply.resize(10 + 124, 0);
                }
                stream.write_all_vectored(&[&reply])?;
                return Ok((negotiated, None));
            }
            OPT_LIST => {
                if !data.is_empty() {
                    send_reply(stream, option, REP_ERR_INVALID, &[b"LIST takes no data"])?;
                    continue;
                }
                let name = export.name.as_bytes();
                let name_len = (name.len() as u32).to_be_bytes();
                send_reply(stream, option, REP_SERVER, &[&name_len, name])?;
                send_reply(stream, option, REP_ACK, &[])?;
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    send_reply(stream, option, REP_ERR_INVALID, &[b"takes no data"])?;
                    continue;
                }
                negotiated.structured_replies = true;
                send_reply(stream, option, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                let request = match parse_info_request(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        let msg = e.to_string();
                        send_reply(stream, option, REP_ERR_INVALID, &[msg.as_bytes()])?;
                        continue;
                    }
                };
                if !export.accepts_name(request.name) {
                    send_reply(stream, option, REP_ERR_UNKNOWN, &[b"no such export"])?;
                    continue;
                }
                send_info(stream, option, export, negotiated, &request.info_types)?;
                send_reply(stream, option, REP_ACK, &[])?;
                if option == OPT_GO {
                    return Ok((negotiated, None));
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                meta_context(stream, option, export, &data, &mut negotiated)?;
            }
            _ => {
                send_reply(stream, option, REP_ERR_UNSUP, &[])?;
            }
        }
    }
    Err(NbdError::OptionTooLong {
        option: 0,
        len: MAX_OPTIONS as u32,
        limit: MAX_OPTIONS as u32,
    })
}

/// LIST or SET of meta contexts: `base:allocation`, and `qemu:dirty-bitmap:<name>` when
/// the backend has a dirty bitmap. SET replaces what an
/// earlier SET chose, and needs structured replies (block status answers are chunks).
fn meta_context(
    stream: &Stream,
    option: u32,
    export: &ExportInfo,
    data: &[u8],
    negotiated: &mut Negotiated,
) -> Result<(), NbdError> {
    let set = option == OPT_SET_META_CONTEXT;
    if set && !negotiated.structured_replies {
        let msg: &[u8] = b"meta contexts need structured replies first";
        return send_reply(stream, option, REP_ERR_INVALID, &[msg]);
    }
    let request = match parse_meta_context_request(data) {
        Ok(r) => r,
        Err(e) => {
            let msg = e.to_string();
            return send_reply(stream, option, REP_ERR_INVALID, &[msg.as_bytes()]);
        }
    };
    if !export.accepts_name(request.name) {
        return send_reply(stream, option, REP_ERR_UNKNOWN, &[b"no such export"]);
    }
    let base = BASE_ALLOCATION.as_bytes();
    let dirty = export
        .dirty_bitmap
        .as_ref()
        .map(|n| format!("{DIRTY_BITMAP_PREFIX}{n}").into_bytes());
    let q = &request.queries;
    let (want_base, want_dirty) = if set {
        let d = dirty.as_deref().is_some_and(|d| q.contains(&d));
        (q.contains(&base), d)
    } else {
        // LIST: no query lists all; "base:" / "qemu:" / "qemu:dirty-bitmap:" list their
        // namespace.
        let d = dirty.as_deref().is_some_and(|d| {
            q.is_empty()
                || q.iter()
                    .any(|x| *x == d || *x == b"qemu:" || *x == DIRTY_BITMAP_PREFIX.as_bytes())
        });
        let b = q.is_empty() || q.iter().any(|x| *x == base || *x == b"base:");
        (b, d)
    };
    if set {
        negotiated.base_allocation = want_base;
        negotiated.dirty_bitmap = want_dirty;
    }
    // LIST's ids mean nothing; SET's are the ones block status replies carry.
    if want_base {
        let id = if set { BASE_ALLOCATION_ID } else { 0 };
        send_reply(stream, option, REP_META_CONTEXT, &[&id.to_be_bytes(), base])?;
    }
    if let (true, Some(d)) = (want_dirty, dirty.as_deref()) {
        let id = if set { DIRTY_BITMAP_ID } else { 0 };
        send_reply(stream, option, REP_META_CONTEXT, &[&id.to_be_bytes(), d])?;
    }
    send_reply(stream, option, REP_ACK, &[])
}

fn send_info(
    stream: &Stream,
    option: u32,
    export: &ExportInfo,
    negotiated: Negotiated,
    requested: &[u16],
) -> Result<(), NbdError> {
    let mut info = [0u8; 12];
    info[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    info[2..10].copy_from_slice(&export.size_bytes.to_be_bytes());
    info[10..12].copy_from_slice(
        &export
            .transmission_flags(negotiated.structured_replies)
            .to_be_bytes(),
    );
    send_reply(stream, option, REP_INFO, &[&info])?;

    // Sent unasked too: the spec lets clients ignore information they did not request.
    let mut block = [0u8; 14];
    block[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    block[2..6].copy_from_slice(&export.min_block_bytes.to_be_bytes());
    block[6..10].copy_from_slice(&export.preferred_block_bytes.to_be_bytes());
    block[10..14].copy_from_slice(&export.max_payload_bytes.to_be_bytes());
    send_reply(stream, option, REP_INFO, &[&block])?;

    if requested.contains(&INFO_NAME) {
        send_reply(
            stream,
            option,
            REP_INFO,
            &[&INFO_NAME.to_be_bytes(), export.name.as_bytes()],
        )?;
    }
    if requested.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
        send_reply(
            stream,
            option,
            REP_INFO,
            &[
                &INFO_DESCRIPTION.to_be_bytes(),
                export.description.as_bytes(),
            ],
        )?;
    }
    Ok(())
}
