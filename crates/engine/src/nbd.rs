//! An [`Array`] as an NBD export: the adapter between the engine and the `uraid-nbd`
//! server's [`Backend`] trait (feature `nbd`, on by default).
//!
//! It lives here rather than in `uraid-nbd`, which knows nothing of uraid's arrays and stays
//! a plain NBD server over any block backend, and rather than in the CLI, so that any
//! embedder serves an array the way `uraid serve` does.

use crate::{Array, ArrayCell, ArrayError, ZeroHow};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    /// The array served; replaced when its shape changes ([`ArrayCell`]).
    pub cell: Arc<ArrayCell>,
    observer: Option<Arc<dyn RequestObserver>>,
}

impl ArrayBackend {
    /// An export of `array`.
    pub fn new(array: Arc<Array>) -> ArrayBackend {
        ArrayBackend::of_cell(ArrayCell::new(array))
    }

    /// An export of the array in `cell`, which follows it when it is replaced (a grow
    /// while served).
    pub fn of_cell(cell: Arc<ArrayCell>) -> ArrayBackend {
        ArrayBackend {
            cell,
            observer: None,
        }
    }

    /// An export of the array in `cell` that tells `observer` about every data request it
    /// runs (metrics: `uraid serve --metrics`). Everything else the export does (block
    /// status, the dirty bitmap, sizes) is the same as [`ArrayBackend::of_cell`]'s.
    pub fn with_observer(cell: Arc<ArrayCell>, observer: Arc<dyn RequestObserver>) -> ArrayBackend {
        ArrayBackend {
            cell,
            observer: Some(observer),
        }
    }

    /// Runs `f` as one request of `op` moving `bytes`, told to the observer if there is one.
    fn observed(
        &self,
        op: RequestOp,
        bytes: u64,
        f: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let Some(obs) = &self.observer else {
            return f();
        };
        let start = obs.wants_timing(op).then(Instant::now);
        let r = f();
        obs.done(op, bytes, r.is_ok(), start.map(|s| s.elapsed()));
        r
    }

    fn flush_array(&self) -> io::Result<()> {
        self.cell
            .run(|a| a.flush())
            .map_err(|e| client_error(e, "flush", 0))
    }

    fn write_zeroes_array(&self, offset: u64, len: u64, how: ZeroFlags) -> io::Result<()> {
        let zero = ZeroHow {
            unmap: !how.no_hole,
        };
        match self
            .cell
            .run(|a| a.write_zeroes_with(offset, len, zero, how.fast))
        {
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
            self.flush_array()?;
        }
        Ok(())
    }
}

/// The data requests an export tells its [`RequestObserver`] about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestOp {
    /// NBD_CMD_READ.
    Read,
    /// NBD_CMD_WRITE (FUA included).
    Write,
    /// NBD_CMD_FLUSH.
    Flush,
    /// NBD_CMD_TRIM.
    Trim,
    /// NBD_CMD_WRITE_ZEROES.
    WriteZeroes,
}

/// Told about every data request an [`ArrayBackend`] runs, on the request path (so keep
/// it to a few atomic adds).
pub trait RequestObserver: Send + Sync {
    /// Whether to time this request (two clock reads); asked before it runs.
    fn wants_timing(&self, op: RequestOp) -> bool;
    /// After the request: the bytes it moved, whether it succeeded, and how long it took
    /// when [`RequestObserver::wants_timing`] said so.
    fn done(&self, op: RequestOp, bytes: u64, ok: bool, latency: Option<Duration>);
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
    /// Asked once per connection: a client that connects after a grow sees the new size.
    fn size_bytes(&self) -> u64 {
        self.cell.get().exported_bytes()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let n = buf.len() as u64;
        self.observed(RequestOp::Read, n, || {
            self.cell
                .run(|a| a.read(offset, buf))
                .map_err(|e| client_error(e, "read", offset))
        })
    }

    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        self.observed(RequestOp::Write, buf.len() as u64, || {
            self.cell
                .run(|a| a.write(offset, buf))
                .map_err(|e| client_error(e, "write", offset))?;
            if fua {
                self.flush_array()?;
            }
            Ok(())
        })
    }

    fn flush(&self) -> io::Result<()> {
        self.observed(RequestOp::Flush, 0, || self.flush_array())
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.observed(RequestOp::Trim, len, || {
            self.cell
                .run(|a| a.discard(offset, len))
                .map_err(|e| client_error(e, "trim", offset))
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroFlags) -> io::Result<()> {
        self.observed(RequestOp::WriteZeroes, len, || {
            self.write_zeroes_array(offset, len, how)
        })
    }

    fn can_fast_zero(&self) -> bool {
        self.cell.get().can_fast_zero(true)
    }

    /// `base:allocation` from the members' holes and what the array knows was never
    /// written ([`Array::allocation`]).
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        Ok(self
            .cell
            .get()
            .allocation(offset, len)
            .into_iter()
            .map(|e| Extent {
                length: e.len_bytes,
                hole: e.hole,
                zero: e.zero,
            })
            .collect())
    }

    /// The write-intent bitmap as `qemu:dirty-bitmap:uraid` ([`DIRTY_BITMAP_NAME`]), when
    /// the array has one.
    fn dirty_bitmap(&self) -> Option<String> {
        self.cell
            .get()
            .has_bitmap()
            .then(|| DIRTY_BITMAP_NAME.to_string())
    }

    /// The bitmap's dirty chunks ([`Array::dirty_extents`]).
    fn dirty_status(&self, offset: u64, len: u64) -> io::Result<Vec<DirtyExtent>> {
        let extents = self
            .cell
            .get()
            .dirty_extents(offset, len)
            .unwrap_or_else(|| {
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
        self.cell.get().is_read_only()
    }
}
