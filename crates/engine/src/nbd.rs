//! An [`Array`] as an NBD export: the adapter between the engine and the `uraid-nbd`
//! server's [`Backend`] trait (feature `nbd`, on by default).
//!
//! It lives here rather than in `uraid-nbd`, which knows nothing of uraid's arrays and stays
//! a plain NBD server over any block backend, and rather than in the CLI, so that any
//! embedder serves an array the way `uraid serve` does.

use crate::{Array, ArrayError, ZeroHow};
use std::io;
use std::sync::Arc;
use uraid_nbd::{Backend, DirtyExtent, Extent, ZeroFlags};

/// Serves an [`Array`] to NBD clients: reads, writes (FUA as a flush after the write),
/// flushes, trims as discards, write-zeroes with md's zeroing, and the array's read-only
/// state. An array error reaches the client as its errno ([`ArrayError::errno`]).
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let array: uraid_engine::Array = unimplemented!();
/// use std::sync::Arc;
/// use uraid_engine::nbd::ArrayBackend;
/// use uraid_nbd::{Listener, Server, ServerConfig};
///
/// let backend = Arc::new(ArrayBackend::new(Arc::new(array)));
/// let server = Server::new(ServerConfig::default())?;
/// server.serve(Listener::bind_unix("/run/uraid.sock")?, backend)?;
/// # Ok(())
/// # }
/// ```
pub struct ArrayBackend {
    /// The array served.
    pub array: Arc<Array>,
}

impl ArrayBackend {
    /// An export of `array`.
    pub fn new(array: Arc<Array>) -> ArrayBackend {
        ArrayBackend { array }
    }
}

/// The name of the array's write-intent bitmap as an NBD meta context: the client asks
/// for `qemu:dirty-bitmap:uraid` (one bitmap per export, so the name is fixed).
pub const DIRTY_BITMAP_NAME: &str = "uraid";

/// The client sees the errno; the log keeps the message.
fn client_error(e: ArrayError, what: &str, offset: u64) -> io::Error {
    tracing::warn!("{what} at byte {offset} failed: {e}");
    io::Error::from_raw_os_error(e.errno())
}

impl Backend for ArrayBackend {
    fn size_bytes(&self) -> u64 {
        self.array.size_bytes()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.array
            .read(offset, buf)
            .map_err(|e| client_error(e, "read", offset))
    }

    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        self.array
            .write(offset, buf)
            .map_err(|e| client_error(e, "write", offset))?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.array.flush().map_err(|e| client_error(e, "flush", 0))
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.array
            .discard(offset, len)
            .map_err(|e| client_error(e, "trim", offset))
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroFlags) -> io::Result<()> {
        let zero = ZeroHow {
            unmap: !how.no_hole,
        };
        match self.array.write_zeroes_with(offset, len, zero, how.fast) {
            Ok(()) => {}
            // A client that asked for fast zeroing writes zeros itself when refused: no
            // warning for that.
            Err(e @ ArrayError::NotFast(_)) => {
                tracing::debug!("fast write_zeroes at byte {offset} refused: {e}");
                return Err(io::Error::from_raw_os_error(e.errno()));
            }
            Err(e) => return Err(client_error(e, "write_zeroes", offset)),
        }
        if how.fua {
            self.flush()?;
        }
        Ok(())
    }

    fn can_fast_zero(&self) -> bool {
        self.array.can_fast_zero(true)
    }

    /// `base:allocation` from the members' holes ([`Array::allocation`]).
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        Ok(self
            .array
            .allocation(offset, len)
            .into_iter()
            .map(|e| Extent {
                length: e.len_bytes,
                hole: e.hole,
                zero: e.hole,
            })
            .collect())
    }

    /// The write-intent bitmap as `qemu:dirty-bitmap:uraid` ([`DIRTY_BITMAP_NAME`]), when
    /// the array has one.
    fn dirty_bitmap(&self) -> Option<String> {
        self.array
            .has_bitmap()
            .then(|| DIRTY_BITMAP_NAME.to_string())
    }

    /// The bitmap's dirty chunks ([`Array::dirty_extents`]).
    fn dirty_status(&self, offset: u64, len: u64) -> io::Result<Vec<DirtyExtent>> {
        let extents = self.array.dirty_extents(offset, len).unwrap_or_else(|| {
            vec![crate::DirtyExtent {
                len_bytes: len,
                dirty: true,
            }]
        });
        Ok(extents
            .into_iter()
            .map(|e| DirtyExtent {
                length: e.len_bytes,
                dirty: e.dirty,
            })
            .collect())
    }

    fn block_size(&self) -> u32 {
        4096
    }

    fn read_only(&self) -> bool {
        self.array.is_read_only()
    }
}
