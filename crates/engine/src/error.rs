//! Engine errors. Every variant maps to an errno for block exports.

use std::io;
use thiserror::Error;
use uraid_core::geometry::GeometryError;
use uraid_core::superblock::SuperblockError;

/// Why an array operation failed.
#[derive(Debug, Error)]
pub enum ArrayError {
    /// A member or file IO error, kept whole.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The array has no redundancy left to serve the request.
    #[error("array cannot serve this request: {0}")]
    Failed(String),
    /// The request reaches past the end of the array.
    #[error(
        "request at byte {offset} of {len} bytes is beyond the end of the array ({size} bytes)"
    )]
    OutOfRange {
        /// Where the request starts, in bytes.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// The array's size in bytes.
        size: u64,
    },
    /// The geometry is impossible (level, member count, chunk, layout).
    #[error("{0}")]
    Geometry(#[from] GeometryError),
    /// A member's superblock could not be read or is invalid.
    #[error("{member}: {source}")]
    Superblock {
        /// The member's name.
        member: String,
        /// What is wrong with it.
        source: SuperblockError,
    },
    /// The devices do not make an array that can be started.
    #[error("{0}")]
    Assemble(String),
    /// A superblock says something uraid cannot honour (a reshape in progress, PPL, ...):
    /// nothing was written.
    #[error("array {array}: member {member}: uraid will not open it: {what}")]
    Unsupported {
        /// "name (uuid)".
        array: String,
        /// The member whose superblock says it.
        member: String,
        /// What uraid does not support.
        what: uraid_core::support::Unsupported,
    },
    /// The array cannot be created as asked.
    #[error("{0}")]
    Create(String),
    /// A write to an array that is read-only.
    #[error("array is read-only: {0}")]
    ReadOnly(String),
    /// The write journal failed: writes stop (they would have no write-hole protection,
    /// and write-back data could not be logged); reads go on.
    #[error("write journal failed, writes are refused (reads still work): {0}")]
    JournalFailed(String),
    /// A fast zeroing (NBD_CMD_FLAG_FAST_ZERO) that could only be done by writing zeros.
    #[error("cannot zero quickly: {0}; zero without the fast flag")]
    NotFast(String),
    /// A change of the array's shape (`uraid grow`) that md refuses, or that this build
    /// cannot do, with md's reason: nothing was written.
    #[error("{0}")]
    Refused(String),
    /// The array was replaced by one in a new shape while the request waited
    /// ([`ArrayCell`](crate::ArrayCell)); [`ArrayCell::run`](crate::ArrayCell::run) runs
    /// it again on the new one, so a user of the cell never sees this.
    #[error("the array was replaced by its new shape; run the request again on it")]
    Replaced,
}

impl ArrayError {
    /// The errno a block export should report.
    pub fn errno(&self) -> i32 {
        match self {
            ArrayError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            ArrayError::OutOfRange { .. } | ArrayError::Refused(_) => libc::EINVAL,
            ArrayError::ReadOnly(_) | ArrayError::JournalFailed(_) => libc::EROFS,
            ArrayError::NotFast(_) => libc::EOPNOTSUPP,
            ArrayError::Replaced => libc::EAGAIN,
            _ => libc::EIO,
        }
    }
}

impl From<ArrayError> for io::Error {
    fn from(e: ArrayError) -> io::Error {
        match e {
            ArrayError::Io(e) => e,
            other => {
                // Keep the errno for exports and the message for people.
                let errno = other.errno();
                let kind = io::Error::from_raw_os_error(errno).kind();
                io::Error::new(
                    kind,
                    ErrnoMsg {
                        errno,
                        msg: other.to_string(),
                    },
                )
            }
        }
    }
}

/// An io::Error payload that carries an errno alongside the message.
#[derive(Debug)]
pub struct ErrnoMsg {
    /// The errno to report.
    pub errno: i32,
    /// The message.
    pub msg: String,
}

impl std::fmt::Display for ErrnoMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for ErrnoMsg {}

/// The errno of any io::Error, including ones made from an [`ArrayError`].
pub fn errno_of(e: &io::Error) -> i32 {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    if let Some(m) = e.get_ref().and_then(|r| r.downcast_ref::<ErrnoMsg>()) {
        return m.errno;
    }
    match e.kind() {
        io::ErrorKind::InvalidInput => libc::EINVAL,
        io::ErrorKind::PermissionDenied => libc::EPERM,
        io::ErrorKind::StorageFull => libc::ENOSPC,
        _ => libc::EIO,
    }
}
