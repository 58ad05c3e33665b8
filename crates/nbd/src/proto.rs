//! NBD wire format: constants, pure parsers and reply encoders.
//!
//! Nothing here does IO, so every parser can be fed arbitrary bytes (see the
//! `nbd_request` fuzz target and the proptests). Numbers are big-endian on the
//! wire, as the NBD protocol document (`doc/proto.md` of NetworkBlockDevice/nbd)
//! specifies.

use thiserror::Error;

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, sent by the server after `NBDMAGIC` and by the client before every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server, 16 bits).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags (32 bits).
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags (16 bits).
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;

/// `NBD_REP_INFO` types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// NBD_CMD_BLOCK_STATUS: one extent is enough.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply chunk flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;

/// The one meta context served: holes and zeros (`base:allocation`).
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Its context id (the server's choice; 0 is avoided so a missing one stands out).
pub const BASE_ALLOCATION_ID: u32 = 1;
/// The namespace of a write-intent (dirty) bitmap's context: `qemu:dirty-bitmap:<name>`
/// (qemu's docs/interop/nbd.txt).
pub const DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";
/// Its context id.
pub const DIRTY_BITMAP_ID: u32 = 2;
/// qemu:dirty-bitmap: the range changed since the bitmap was cleared.
pub const STATE_DIRTY: u32 = 1 << 0;
/// base:allocation: the range is not allocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// base:allocation: the range reads as zeros.
pub const STATE_ZERO: u32 = 1 << 1;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

/// Bytes of a request header on the wire.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Bytes of an option header (`IHAVEOPT`, option, length).
pub const OPTION_HEADER_BYTES: usize = 16;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Bytes of a structured reply chunk header.
pub const STRUCTURED_HEADER_BYTES: usize = 20;
/// Bytes of a structured `OFFSET_DATA` header including its offset field.
pub const OFFSET_DATA_HEADER_BYTES: usize = STRUCTURED_HEADER_BYTES + 8;
/// Largest string (export name, message) the protocol allows.
pub const MAX_STRING_BYTES: usize = 4096;

/// NBD error values (the protocol fixes these numbers; they match Linux errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Errno {
    Perm = 1,
    Io = 5,
    NoMem = 12,
    Inval = 22,
    NoSpc = 28,
    Overflow = 75,
    NotSup = 95,
    Shutdown = 108,
}

impl Errno {
    /// The value sent in a reply's error field.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Errno::Perm => "EPERM",
            Errno::Io => "EIO",
            Errno::NoMem => "ENOMEM",
            Errno::Inval => "EINVAL",
            Errno::NoSpc => "ENOSPC",
            Errno::Overflow => "EOVERFLOW",
            Errno::NotSup => "ENOTSUP",
            Errno::Shutdown => "ESHUTDOWN",
        }
    }
}

/// A malformed message from the client. The connection cannot continue after one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    #[error("message truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("bad request magic {found:#010x}")]
    BadRequestMagic { found: u32 },
    #[error("bad option magic {found:#018x}")]
    BadOptionMagic { found: u64 },
    #[error("option data length {len} inconsistent with its contents")]
    OptionLength { len: usize },
    #[error("export name of {len} bytes is longer than {MAX_STRING_BYTES}")]
    NameTooLong { len: usize },
    #[error("bad reply magic {found:#x}")]
    BadReplyMagic { found: u64 },
    #[error("reply of type {kind} with {len} bytes is malformed")]
    BadReply { kind: u16, len: usize },
}

/// Transmission command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    WriteZeroes,
    /// NBD_CMD_BLOCK_STATUS (after a meta context was set).
    BlockStatus,
    /// A type this server does not implement (answered with `EINVAL`).
    Unknown(u16),
}

impl Command {
    pub fn from_wire(kind: u16) -> Command {
        match kind {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disc,
            3 => Command::Flush,
            4 => Command::Trim,
            6 => Command::WriteZeroes,
            7 => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    pub fn to_wire(self) -> u16 {
        match self {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disc => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::WriteZeroes => 6,
            Command::BlockStatus => 7,
            Command::Unknown(other) => other,
        }
    }
}

/// A parsed request header (the payload of a write follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// The flags of NBD_CMD_WRITE_ZEROES.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// Durable when the reply is sent (NBD_CMD_FLAG_FUA).
    pub fua: bool,
    /// The range stays allocated (NBD_CMD_FLAG_NO_HOLE).
    pub no_hole: bool,
    /// Fail at once with `ENOTSUP` rather than be slower than a write of zeros
    /// (NBD_CMD_FLAG_FAST_ZERO).
    pub fast: bool,
}

/// What the export allows, for [`Request::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportLimits {
    pub size_bytes: u64,
    pub read_only: bool,
    /// Largest READ or WRITE payload accepted.
    pub max_payload_bytes: u32,
    /// Requests must be aligned to this (a power of two; 1 = any byte).
    pub min_block_bytes: u32,
    /// Structured replies were negotiated (enables `NBD_CMD_FLAG_DF` on reads).
    pub structured_replies: bool,
    /// NBD_FLAG_SEND_FAST_ZERO was advertised (enables `NBD_CMD_FLAG_FAST_ZERO`).
    pub fast_zero: bool,
    /// A meta context was set (enables `NBD_CMD_BLOCK_STATUS`).
    pub block_status: bool,
}

impl Request {
    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
            self.length
        } else {
            0
        }
    }

    pub fn fua(&self) -> bool {
        self.flags & CMD_FLAG_FUA != 0
    }

    /// How a write-zeroes request wants its zeros.
    pub fn zero_flags(&self) -> ZeroFlags {
        ZeroFlags {
            fua: self.fua(),
            no_hole: self.flags & CMD_FLAG_NO_HOLE != 0,
            fast: self.flags & CMD_FLAG_FAST_ZERO != 0,
        }
    }

    /// Checks a request against the export; `Err` is the error to reply with,
    /// without touching the backend.
    pub fn validate(&self, limits: &ExportLimits) -> Result<(), Errno> {
        let allowed_flags = match self.command {
            Command::Read if limits.structured_replies => CMD_FLAG_FUA | CMD_FLAG_DF,
            Command::WriteZeroes if limits.fast_zero => {
                CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO
            }
            Command::WriteZeroes => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
            // The spec: no meta context negotiated, no block status.
            Command::BlockStatus if !limits.block_status => return Err(Errno::Inval),
            Command::BlockStatus => CMD_FLAG_REQ_ONE,
            Command::Unknown(_) => return Err(Errno::Inval),
            _ => CMD_FLAG_FUA,
        };
        if self.flags & !allowed_flags != 0 {
            return Err(Errno::Inval);
        }
        let writes = matches!(
            self.command,
            Command::Write | Command::Trim | Command::WriteZeroes
        );
        if writes && limits.read_only {
            return Err(Errno::Perm);
        }
        match self.command {
            Command::Disc | Command::Flush => return Ok(()),
            Command::Read | Command::Write if self.length > limits.max_payload_bytes => {
                return Err(Errno::Inval)
            }
            Command::BlockStatus if self.length == 0 => return Err(Errno::Inval),
            _ => {}
        }
        let end = self
            .offset
            .checked_add(u64::from(self.length))
            .ok_or(Errno::Overflow)?;
        if end > limits.size_bytes {
            // The spec asks for ENOSPC on writes past the end.
            let stores = matches!(self.command, Command::Write | Command::WriteZeroes);
            return Err(if stores { Errno::NoSpc } else { Errno::Inval });
        }
        let align = u64::from(limits.min_block_bytes.max(1));
        // `align` is a power of two.
        if (self.offset | u64::from(self.length)) & (align - 1) != 0 {
            return Err(Errno::Inval);
        }
        Ok(())
    }
}

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Parses a request header from the first [`REQUEST_HEADER_BYTES`] of `bytes`.
pub fn parse_request(bytes: &[u8]) -> Result<Request, ProtocolError> {
    if bytes.len() < REQUEST_HEADER_BYTES {
        return Err(ProtocolError::Truncated {
            need: REQUEST_HEADER_BYTES,
            have: bytes.len(),
        });
    }
    let magic = be_u32(bytes, 0);
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::BadRequestMagic { found: magic });
    }
    Ok(Request {
        flags: be_u16(bytes, 4),
        command: Command::from_wire(be_u16(bytes, 6)),
        cookie: be_u64(bytes, 8),
        offset: be_u64(bytes, 16),
        length: be_u32(bytes, 24),
    })
}

/// Encodes a request header (used by tests and tools).
pub fn encode_request(req: &Request) -> [u8; REQUEST_HEADER_BYTES] {
    let mut b = [0u8; REQUEST_HEADER_BYTES];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&req.flags.to_be_bytes());
    b[6..8].copy_from_slice(&req.command.to_wire().to_be_bytes());
    b[8..16].copy_from_slice(&req.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&req.offset.to_be_bytes());
    b[24..28].copy_from_slice(&req.length.to_be_bytes());
    b
}

/// An option header sent by the client during the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

/// Parses an option header from the first [`OPTION_HEADER_BYTES`] of `bytes`.
pub fn parse_option_header(bytes: &[u8]) -> Result<OptionHeader, ProtocolError> {
    if bytes.len() < OPTION_HEADER_BYTES {
        return Err(ProtocolError::Truncated {
            need: OPTION_HEADER_BYTES,
            have: bytes.len(),
        });
    }
    let magic = be_u64(bytes, 0);
    if magic != IHAVEOPT {
        return Err(ProtocolError::BadOptionMagic { found: magic });
    }
    Ok(OptionHeader {
        option: be_u32(bytes, 8),
        length: be_u32(bytes, 12),
    })
}

/// The data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    pub name: &'a [u8],
    pub info_types: Vec<u16>,
}

/// Parses the data of `NBD_OPT_INFO` / `NBD_OPT_GO`: u32 name length, name,
/// u16 count, count × u16 information types. The whole of `data` must be used.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest<'_>, ProtocolError> {
    let bad = ProtocolError::OptionLength { len: data.len() };
    if data.len() < 6 {
        return Err(bad);
    }
    let name_len = be_u32(data, 0) as usize;
    if name_len > MAX_STRING_BYTES {
        return Err(ProtocolError::NameTooLong { len: name_len });
    }
    let rest = &data[4..];
    if rest.len() < name_len + 2 {
        return Err(bad);
    }
    let (name, rest) = rest.split_at(name_len);
    let count = be_u16(rest, 0) as usize;
    let rest = &rest[2..];
    if rest.len() != count * 2 {
        return Err(bad);
    }
    let info_types = rest.chunks_exact(2).map(|c| be_u16(c, 0)).collect();
    Ok(InfoRequest { name, info_types })
}

/// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT's data: the export name and the
/// queries (context names, or for LIST namespace prefixes such as `base:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest<'a> {
    pub name: &'a [u8],
    pub queries: Vec<&'a [u8]>,
}

/// Parses a meta context option's data; every length is checked against what is there.
pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest<'_>, ProtocolError> {
    let bad = ProtocolError::OptionLength { len: data.len() };
    let take = |rest: &mut &[u8]| -> Result<u32, ProtocolError> {
        if rest.len() < 4 {
            return Err(bad.clone());
        }
        let v = be_u32(rest, 0);
        *rest = &rest[4..];
        Ok(v)
    };
    let mut rest = data;
    let name_len = take(&mut rest)? as usize;
    if name_len > MAX_STRING_BYTES {
        return Err(ProtocolError::NameTooLong { len: name_len });
    }
    if rest.len() < name_len {
        return Err(bad);
    }
    let (name, mut rest) = rest.split_at(name_len);
    let count = take(&mut rest)? as usize;
    let mut queries = Vec::new();
    for _ in 0..count {
        let len = take(&mut rest)? as usize;
        if len > MAX_STRING_BYTES {
            return Err(ProtocolError::NameTooLong { len });
        }
        if rest.len() < len {
            return Err(bad);
        }
        let (q, r) = rest.split_at(len);
        queries.push(q);
        rest = r;
    }
    if !rest.is_empty() {
        return Err(bad);
    }
    Ok(MetaContextRequest { name, queries })
}

/// Encodes an option reply header; `length` bytes of data follow it.
pub fn encode_option_reply(option: u32, reply: u32, length: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&reply.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// Encodes a simple reply header.
pub fn encode_simple_reply(cookie: u64, error: u32) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut b = [0u8; SIMPLE_REPLY_BYTES];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// Encodes a structured chunk header; `length` bytes of payload follow it.
pub fn encode_structured_header(
    cookie: u64,
    flags: u16,
    kind: u16,
    length: u32,
) -> [u8; STRUCTURED_HEADER_BYTES] {
    let mut b = [0u8; STRUCTURED_HEADER_BYTES];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// Header of a final `OFFSET_DATA` chunk carrying `data_len` bytes read at `offset`.
pub fn encode_offset_data_header(
    cookie: u64,
    offset: u64,
    data_len: u32,
) -> [u8; OFFSET_DATA_HEADER_BYTES] {
    assert!(data_len > 0 && data_len <= u32::MAX - 8);
    let mut b = [0u8; OFFSET_DATA_HEADER_BYTES];
    b[..STRUCTURED_HEADER_BYTES].copy_from_slice(&encode_structured_header(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        data_len + 8,
    ));
    b[STRUCTURED_HEADER_BYTES..].copy_from_slice(&offset.to_be_bytes());
    b
}

/// Longest message put in an error chunk.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 200;

/// Appends a final `NBD_REPLY_TYPE_ERROR` chunk to `out`.
pub fn encode_error_chunk(out: &mut Vec<u8>, cookie: u64, errno: Errno, message: &str) {
    let mut end = message.len().min(MAX_ERROR_MESSAGE_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let msg = &message.as_bytes()[..end];
    out.extend_from_slice(&encode_structured_header(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        6 + msg.len() as u32,
    ));
    out.extend_from_slice(&errno.code().to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

// The client's side of the wire (uraid's NBD client, `crate::client`): what the server
// sends is parsed here, as purely as the server's side of it.

/// Encodes an option header (`IHAVEOPT`, option, length); `length` bytes of data follow.
pub fn encode_option_header(option: u32, length: u32) -> [u8; OPTION_HEADER_BYTES] {
    let mut b = [0u8; OPTION_HEADER_BYTES];
    b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&length.to_be_bytes());
    b
}

/// Encodes the data of `NBD_OPT_GO` / `NBD_OPT_INFO`: the export's name and the
/// information types asked for.
pub fn encode_info_request(name: &[u8], info_types: &[u16]) -> Vec<u8> {
    let mut d = Vec::with_capacity(6 + name.len() + 2 * info_types.len());
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name);
    d.extend_from_slice(&(info_types.len() as u16).to_be_bytes());
    for t in info_types {
        d.extend_from_slice(&t.to_be_bytes());
    }
    d
}

/// Encodes the data of `NBD_OPT_SET_META_CONTEXT` / `LIST_META_CONTEXT`: the export's
/// name and the queries (context names).
pub fn encode_meta_context_request(name: &[u8], queries: &[&str]) -> Vec<u8> {
    let mut d =
        Vec::with_capacity(8 + name.len() + queries.iter().map(|q| 4 + q.len()).sum::<usize>());
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name);
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// Parses the data of an `NBD_REP_META_CONTEXT` reply: the context's id and its name.
pub fn parse_meta_context_reply(data: &[u8]) -> Result<(u32, String), ProtocolError> {
    if data.len() < 4 || data.len() > 4 + MAX_STRING_BYTES {
        return Err(ProtocolError::OptionLength { len: data.len() });
    }
    Ok((
        be_u32(data, 0),
        String::from_utf8_lossy(&data[4..]).into_owned(),
    ))
}

/// Parses the payload of an `NBD_REPLY_TYPE_BLOCK_STATUS` chunk: the context's id and its
/// descriptors, `(length, flags)` each; at least one, and no zero length.
pub fn parse_block_status_chunk(payload: &[u8]) -> Result<(u32, Vec<(u32, u32)>), ProtocolError> {
    let bad = ProtocolError::BadReply {
        kind: REPLY_TYPE_BLOCK_STATUS,
        len: payload.len(),
    };
    if payload.len() < 12 || !(payload.len() - 4).is_multiple_of(8) {
        return Err(bad);
    }
    let descriptors: Vec<(u32, u32)> = payload[4..]
        .chunks_exact(8)
        .map(|d| (be_u32(d, 0), be_u32(d, 4)))
        .collect();
    if descriptors.iter().any(|&(len, _)| len == 0) {
        return Err(bad);
    }
    Ok((be_u32(payload, 0), descriptors))
}

/// Bytes of an option reply header.
pub const OPTION_REPLY_BYTES: usize = 20;

/// An option reply header from the server; `length` bytes of data follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply: u32,
    pub length: u32,
}

impl OptionReply {
    /// Whether the reply is an error (`NBD_REP_ERR_*`: the high bit is set).
    pub fn is_error(&self) -> bool {
        self.reply & (1 << 31) != 0
    }
}

/// Parses an option reply header from the first [`OPTION_REPLY_BYTES`] of `bytes`.
pub fn parse_option_reply(bytes: &[u8]) -> Result<OptionReply, ProtocolError> {
    if bytes.len() < OPTION_REPLY_BYTES {
        return Err(ProtocolError::Truncated {
            need: OPTION_REPLY_BYTES,
            have: bytes.len(),
        });
    }
    let magic = be_u64(bytes, 0);
    if magic != OPTION_REPLY_MAGIC {
        return Err(ProtocolError::BadReplyMagic { found: magic });
    }
    Ok(OptionReply {
        option: be_u32(bytes, 8),
        reply: be_u32(bytes, 12),
        length: be_u32(bytes, 16),
    })
}

/// One `NBD_REP_INFO` item of `NBD_OPT_GO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Info {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    Export { size_bytes: u64, flags: u16 },
    /// `NBD_INFO_BLOCK_SIZE`: minimum, preferred and maximum block sizes.
    BlockSize {
        min_bytes: u32,
        preferred_bytes: u32,
        max_bytes: u32,
    },
    /// Another information type (name, description, ...), ignored.
    Other(u16),
}

/// Parses the data of an `NBD_REP_INFO` reply.
pub fn parse_info_reply(data: &[u8]) -> Result<Info, ProtocolError> {
    let bad = ProtocolError::OptionLength { len: data.len() };
    if data.len() < 2 {
        return Err(bad);
    }
    match be_u16(data, 0) {
        INFO_EXPORT if data.len() == 12 => Ok(Info::Export {
            size_bytes: be_u64(data, 2),
            flags: be_u16(data, 10),
        }),
        INFO_BLOCK_SIZE if data.len() == 14 => Ok(Info::BlockSize {
            min_bytes: be_u32(data, 2),
            preferred_bytes: be_u32(data, 6),
            max_bytes: be_u32(data, 10),
        }),
        INFO_EXPORT | INFO_BLOCK_SIZE => Err(bad),
        other => Ok(Info::Other(other)),
    }
}

/// The first part of a reply: a whole simple reply, or the header of a structured chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    /// A simple reply (a read's data, if it succeeded, follows).
    Simple { error: u32, cookie: u64 },
    /// A structured reply chunk; `length` bytes of payload follow.
    Structured {
        flags: u16,
        kind: u16,
        cookie: u64,
        length: u32,
    },
}

/// Parses a reply header: the first [`SIMPLE_REPLY_BYTES`] are enough for a simple reply;
/// a structured chunk needs [`STRUCTURED_HEADER_BYTES`] (`Truncated` says how many).
pub fn parse_reply_header(bytes: &[u8]) -> Result<ReplyHeader, ProtocolError> {
    if bytes.len() < 4 {
        return Err(ProtocolError::Truncated {
            need: SIMPLE_REPLY_BYTES,
            have: bytes.len(),
        });
    }
    let (magic, need) = match be_u32(bytes, 0) {
        SIMPLE_REPLY_MAGIC => (SIMPLE_REPLY_MAGIC, SIMPLE_REPLY_BYTES),
        STRUCTURED_REPLY_MAGIC => (STRUCTURED_REPLY_MAGIC, STRUCTURED_HEADER_BYTES),
        found => {
            return Err(ProtocolError::BadReplyMagic {
                found: u64::from(found),
            })
        }
    };
    if bytes.len() < need {
        return Err(ProtocolError::Truncated {
            need,
            have: bytes.len(),
        });
    }
    Ok(if magic == SIMPLE_REPLY_MAGIC {
        ReplyHeader::Simple {
            error: be_u32(bytes, 4),
            cookie: be_u64(bytes, 8),
        }
    } else {
        ReplyHeader::Structured {
            flags: be_u16(bytes, 4),
            kind: be_u16(bytes, 6),
            cookie: be_u64(bytes, 8),
            length: be_u32(bytes, 16),
        }
    })
}

/// Parses the payload of an error chunk (`NBD_REPLY_TYPE_ERROR`, `ERROR_OFFSET` or any
/// other type with the error bit): the error value and the server's message.
pub fn parse_error_chunk(kind: u16, payload: &[u8]) -> Result<(u32, String), ProtocolError> {
    let bad = ProtocolError::BadReply {
        kind,
        len: payload.len(),
    };
    if payload.len() < 6 {
        return Err(bad);
    }
    let error = be_u32(payload, 0);
    let msg_len = be_u16(payload, 4) as usize;
    let Some(msg) = payload.get(6..6 + msg_len) else {
        return Err(bad);
    };
    // ERROR_OFFSET carries the offset after the message; other error types may add data.
    if kind == REPLY_TYPE_ERROR_OFFSET && payload.len() != 6 + msg_len + 8 {
        return Err(bad);
    }
    Ok((error, String::from_utf8_lossy(msg).into_owned()))
}

/// Parses the offset (and, for a hole, the length) that starts an `OFFSET_DATA` or
/// `OFFSET_HOLE` chunk: `(offset, bytes covered)`.
pub fn parse_offset_chunk(kind: u16, payload: &[u8]) -> Result<(u64, u64), ProtocolError> {
    let bad = ProtocolError::BadReply {
        kind,
        len: payload.len(),
    };
    match kind {
        REPLY_TYPE_OFFSET_DATA if payload.len() > 8 => {
            Ok((be_u64(payload, 0), payload.len() as u64 - 8))
        }
        REPLY_TYPE_OFFSET_HOLE if payload.len() == 12 => {
            Ok((be_u64(payload, 0), u64::from(be_u32(payload, 8))))
        }
        _ => Err(bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_context_requests_round_trip_through_the_servers_parser() {
        let d = encode_meta_context_request(b"disk0", &[BASE_ALLOCATION, "qemu:dirty-bitmap:b"]);
        let m = parse_meta_context_request(&d).unwrap();
        assert_eq!(m.name, b"disk0");
        assert_eq!(
            m.queries,
            vec![BASE_ALLOCATION.as_bytes(), b"qemu:dirty-bitmap:b"]
        );
    }

    #[test]
    fn meta_context_replies_and_block_status_chunks_parse() {
        let mut r = 7u32.to_be_bytes().to_vec();
        r.extend_from_slice(BASE_ALLOCATION.as_bytes());
        assert_eq!(
            parse_meta_context_reply(&r).unwrap(),
            (7, BASE_ALLOCATION.to_string())
        );
        assert!(parse_meta_context_reply(&[0, 0, 1]).is_err());

        let mut c = 7u32.to_be_bytes().to_vec();
        for (len, flags) in [(4096u32, 3u32), (8192, 0)] {
            c.extend_from_slice(&len.to_be_bytes());
            c.extend_from_slice(&flags.to_be_bytes());
        }
        assert_eq!(
            parse_block_status_chunk(&c).unwrap(),
            (7, vec![(4096, 3), (8192, 0)])
        );
        // No descriptor, a torn one, a zero length: malformed.
        assert!(parse_block_status_chunk(&c[..4]).is_err());
        assert!(parse_block_status_chunk(&c[..15]).is_err());
        let mut z = c.clone();
        z[4..8].copy_from_slice(&0u32.to_be_bytes());
        assert!(parse_block_status_chunk(&z).is_err());
    }

    fn limits() -> ExportLimits {
        ExportLimits {
            block_status: false,
            size_bytes: 1 << 20,
            read_only: false,
            max_payload_bytes: 32 << 20,
            min_block_bytes: 1,
            structured_replies: true,
            fast_zero: false,
        }
    }

    fn req(command: Command, offset: u64, length: u32) -> Request {
        Request {
            flags: 0,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn request_roundtrip_and_golden_bytes() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            command: Command::Write,
            cookie: 0x0102_0304_0506_0708,
            offset: 0x1000,
            length: 512,
        };
        let b = encode_request(&r);
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&b[4..8], &[0, 1, 0, 1]);
        assert_eq!(&b[24..28], &[0, 0, 2, 0]);
        assert_eq!(parse_request(&b).unwrap(), r);
        assert_eq!(r.payload_len(), 512);
        assert!(r.fua());
    }

    #[test]
    fn bad_magic_and_truncation() {
        let mut b = encode_request(&req(Command::Read, 0, 1));
        assert!(matches!(
            parse_request(&b[..27]),
            Err(ProtocolError::Truncated { need: 28, have: 27 })
        ));
        b[0] ^= 1;
        assert!(matches!(
            parse_request(&b),
            Err(ProtocolError::BadRequestMagic { .. })
        ));
    }

    #[test]
    fn validate_bounds() {
        let l = limits();
        assert_eq!(req(Command::Read, 0, 4096).validate(&l), Ok(()));
        assert_eq!(req(Command::Read, (1 << 20) - 1, 1).validate(&l), Ok(()));
        assert_eq!(
            req(Command::Read, 1 << 20, 1).validate(&l),
            Err(Errno::Inval)
        );
        assert_eq!(
            req(Command::Write, 1 << 20, 1).validate(&l),
            Err(Errno::NoSpc)
        );
        assert_eq!(
            req(Command::Read, u64::MAX, 2).validate(&l),
            Err(Errno::Overflow)
        );
        assert_eq!(
            req(Command::Read, 0, (32 << 20) + 1).validate(&l),
            Err(Errno::Inval)
        );
        // Trim and write-zeroes may exceed the payload limit.
        let big = ExportLimits {
            size_bytes: 1 << 40,
            ..l
        };
        assert_eq!(req(Command::Trim, 0, u32::MAX).validate(&big), Ok(()));
        assert_eq!(
            req(Command::Unknown(99), 0, 0).validate(&l),
            Err(Errno::Inval)
        );
        assert_eq!(req(Command::Flush, 5, 5).validate(&l), Ok(()));
    }

    #[test]
    fn validate_flags_and_read_only() {
        let l = limits();
        let mut r = req(Command::WriteZeroes, 0, 512);
        r.flags = CMD_FLAG_NO_HOLE | CMD_FLAG_FUA;
        assert_eq!(r.validate(&l), Ok(()));
        r.command = Command::Write;
        assert_eq!(r.validate(&l), Err(Errno::Inval));
        // FAST_ZERO only where it was advertised.
        let mut r = req(Command::WriteZeroes, 0, 512);
        r.flags = CMD_FLAG_FAST_ZERO;
        assert_eq!(r.validate(&l), Err(Errno::Inval));
        let fz = ExportLimits {
            fast_zero: true,
            ..l
        };
        assert_eq!(r.validate(&fz), Ok(()));
        assert!(r.zero_flags().fast && !r.zero_flags().no_hole);
        let mut r = req(Command::Read, 0, 512);
        r.flags = CMD_FLAG_DF;
        assert_eq!(r.validate(&l), Ok(()));
        let simple = ExportLimits {
            structured_replies: false,
            ..l
        };
        assert_eq!(r.validate(&simple), Err(Errno::Inval));
        let ro = ExportLimits {
            read_only: true,
            ..l
        };
        assert_eq!(req(Command::Trim, 0, 512).validate(&ro), Err(Errno::Perm));
        assert_eq!(req(Command::Read, 0, 512).validate(&ro), Ok(()));
        let aligned = ExportLimits {
            min_block_bytes: 512,
            ..l
        };
        assert_eq!(
            req(Command::Read, 1, 512).validate(&aligned),
            Err(Errno::Inval)
        );
        assert_eq!(req(Command::Read, 512, 512).validate(&aligned), Ok(()));
    }

    #[test]
    fn info_request_parsing() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"abc");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        let r = parse_info_request(&d).unwrap();
        assert_eq!(r.name, b"abc");
        assert_eq!(r.info_types, vec![INFO_BLOCK_SIZE, INFO_NAME]);
        assert!(parse_info_request(&d[..d.len() - 1]).is_err());
        let mut longer = d.clone();
        longer.push(0);
        assert!(parse_info_request(&longer).is_err());
        let mut huge = d.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            parse_info_request(&huge),
            Err(ProtocolError::NameTooLong { .. })
        ));
    }

    #[test]
    fn reply_encodings() {
        let h = encode_offset_data_header(9, 4096, 512);
        assert_eq!(&h[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&h[4..6], &[0, 1]); // DONE
        assert_eq!(&h[6..8], &[0, 1]); // OFFSET_DATA
        assert_eq!(&h[16..20], &520u32.to_be_bytes());
        assert_eq!(&h[20..28], &4096u64.to_be_bytes());
        let mut v = Vec::new();
        encode_error_chunk(&mut v, 9, Errno::Io, &"é".repeat(200));
        let msg_len = u16::from_be_bytes([v[24], v[25]]) as usize;
        assert!(msg_len <= MAX_ERROR_MESSAGE_BYTES);
        assert_eq!(v.len(), 26 + msg_len);
        assert_eq!(
            u32::from_be_bytes([v[16], v[17], v[18], v[19]]) as usize,
            6 + msg_len
        );
        assert!(std::str::from_utf8(&v[26..]).is_ok());
        let o = encode_option_reply(OPT_GO, REP_ERR_UNKNOWN, 0);
        assert_eq!(&o[0..8], &[0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9]);
    }

    #[test]
    fn client_side_codecs() {
        // What our server encodes, the client's parsers read back.
        let o = encode_option_reply(OPT_GO, REP_INFO, 12);
        let r = parse_option_reply(&o).unwrap();
        assert_eq!((r.option, r.reply, r.length), (OPT_GO, REP_INFO, 12));
        assert!(!r.is_error());
        let e = parse_option_reply(&encode_option_reply(OPT_GO, REP_ERR_UNKNOWN, 0)).unwrap();
        assert!(e.is_error());
        assert!(matches!(
            parse_option_reply(&o[..19]),
            Err(ProtocolError::Truncated { need: 20, .. })
        ));
        let h = encode_option_header(OPT_GO, 9);
        assert_eq!(
            parse_option_header(&h).unwrap(),
            OptionHeader {
                option: OPT_GO,
                length: 9
            }
        );
        let d = encode_info_request(b"md0", &[INFO_BLOCK_SIZE]);
        let i = parse_info_request(&d).unwrap();
        assert_eq!((i.name, i.info_types), (&b"md0"[..], vec![INFO_BLOCK_SIZE]));

        let mut export = INFO_EXPORT.to_be_bytes().to_vec();
        export.extend_from_slice(&(1u64 << 30).to_be_bytes());
        export.extend_from_slice(&(FLAG_HAS_FLAGS | FLAG_SEND_FLUSH).to_be_bytes());
        assert_eq!(
            parse_info_reply(&export).unwrap(),
            Info::Export {
                size_bytes: 1 << 30,
                flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH
            }
        );
        assert!(parse_info_reply(&export[..11]).is_err());
        let mut bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [512u32, 4096, 1 << 25] {
            bs.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(
            parse_info_reply(&bs).unwrap(),
            Info::BlockSize {
                min_bytes: 512,
                preferred_bytes: 4096,
                max_bytes: 1 << 25
            }
        );
        assert_eq!(
            parse_info_reply(&INFO_NAME.to_be_bytes()).unwrap(),
            Info::Other(INFO_NAME)
        );

        assert_eq!(
            parse_reply_header(&encode_simple_reply(7, 5)).unwrap(),
            ReplyHeader::Simple {
                error: 5,
                cookie: 7
            }
        );
        let sh = encode_offset_data_header(9, 4096, 512);
        assert_eq!(
            parse_reply_header(&sh).unwrap(),
            ReplyHeader::Structured {
                flags: REPLY_FLAG_DONE,
                kind: REPLY_TYPE_OFFSET_DATA,
                cookie: 9,
                length: 520
            }
        );
        assert!(matches!(
            parse_reply_header(&sh[..16]),
            Err(ProtocolError::Truncated { need: 20, .. })
        ));
        assert!(matches!(
            parse_reply_header(&[0, 0, 0, 0]),
            Err(ProtocolError::BadReplyMagic { found: 0 })
        ));
        assert_eq!(
            parse_offset_chunk(REPLY_TYPE_OFFSET_DATA, &sh[20..]).unwrap_err(),
            ProtocolError::BadReply {
                kind: REPLY_TYPE_OFFSET_DATA,
                len: 8
            }
        );
        let mut data = 4096u64.to_be_bytes().to_vec();
        data.extend_from_slice(&[1; 512]);
        assert_eq!(
            parse_offset_chunk(REPLY_TYPE_OFFSET_DATA, &data).unwrap(),
            (4096, 512)
        );
        let mut hole = 8192u64.to_be_bytes().to_vec();
        hole.extend_from_slice(&1024u32.to_be_bytes());
        assert_eq!(
            parse_offset_chunk(REPLY_TYPE_OFFSET_HOLE, &hole).unwrap(),
            (8192, 1024)
        );

        let mut chunk = Vec::new();
        encode_error_chunk(&mut chunk, 3, Errno::NoSpc, "full");
        assert_eq!(
            parse_error_chunk(REPLY_TYPE_ERROR, &chunk[20..]).unwrap(),
            (28, "full".to_string())
        );
        assert!(parse_error_chunk(REPLY_TYPE_ERROR, &chunk[20..24]).is_err());
        assert!(parse_error_chunk(REPLY_TYPE_ERROR_OFFSET, &chunk[20..]).is_err());
    }
}
