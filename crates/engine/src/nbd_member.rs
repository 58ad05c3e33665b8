//! A member on an NBD export (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`),
//! through `uraid-nbd`'s client (feature `nbd`).
//!
//! The lower layer's view of a remote disk: reads, writes, flushes, TRIM as discard and
//! WRITE_ZEROES where the server offers them. A lost host is an IO error of this member
//! (each request waits at most the client's timeout, a dropped connection fails every
//! request at once), which the array turns into a failed member as md does. A failed member
//! is never reconnected in place (the array has moved on without it: what it missed is in
//! the bitmap); [`Member::reopen`] opens a new member on the same export, which the re-add
//! daemon re-adds once the host answers.

use crate::member::{write_zero_buffers, Batch, Member, MemberOp, OpBuf, RemoteStatus, ZeroHow};
use std::io;
use std::sync::{Arc, Mutex};
use uraid_nbd::client::{Client, ClientConfig};

/// A member on an NBD export. Its name and its device identity are the URI, so that the
/// same export given twice is one device.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use uraid_engine::{Member, NbdClientConfig, NbdMember};
/// let m = NbdMember::connect("nbd://storage1/disk0", &NbdClientConfig::default())?;
/// println!("{} bytes", m.size_bytes());
/// # Ok(())
/// # }
/// ```
pub struct NbdMember {
    client: Client,
    /// How it was opened, for [`Member::reopen`].
    config: ClientConfig,
    /// Attempts of [`Member::reopen`] finished, and the last one's error.
    reconnects: Mutex<(u64, Option<String>)>,
}

impl NbdMember {
    /// Connects to the export `uri` names (`nbds://` with the config's TLS CA).
    pub fn connect(uri: &str, config: &ClientConfig) -> io::Result<NbdMember> {
        let client = Client::open(uri, config).map_err(|e| e.into_io())?;
        Ok(NbdMember {
            client,
            config: config.clone(),
            reconnects: Mutex::new((0, None)),
        })
    }

    /// The client underneath (what the server offered, connections).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Member for NbdMember {
    fn size_bytes(&self) -> u64 {
        self.client.info().size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.client.read(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.client.write(buf, offset, false)
    }

    fn flush(&self) -> io::Result<()> {
        self.client.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.client.trim(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: ZeroHow) -> io::Result<()> {
        if !self.client.info().can_write_zeroes() {
            return write_zero_buffers(self, offset, len);
        }
        self.client.write_zeroes(offset, len, !how.unmap, false)
    }

    fn zeroes_fast(&self, _unmap: bool) -> bool {
        self.client.info().can_write_zeroes()
    }

    fn name(&self) -> String {
        self.client.name().to_string()
    }

    fn remote(&self) -> Option<RemoteStatus> {
        let st = self.client.status();
        let reconnects = self
            .reconnects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Some(RemoteStatus {
            uri: self.client.name().to_string(),
            connected: st.connected,
            error: st.error,
            latency_us: st.latency_us,
            connections: st.connections,
            tls: st.tls,
            reconnect_attempts: reconnects.0,
            reconnect_error: reconnects.1,
        })
    }

    /// A new connection to the same export, counted (and its error kept) on this member,
    /// whose `remote` status `uraid detail` shows while it is faulty.
    fn reopen(&self) -> Option<io::Result<Arc<dyn Member>>> {
        let r = NbdMember::connect(self.client.name(), &self.config);
        let mut n = self.reconnects.lock().unwrap_or_else(|e| e.into_inner());
        *n = (n.0 + 1, r.as_ref().err().map(|e| e.to_string()));
        drop(n);
        Some(r.map(|m| Arc::new(m) as Arc<dyn Member>))
    }

    /// Every op is sent at submit and completed after the batch's other members had theirs
    /// ([`Batch::complete_later`]), so a batch's ops on all its members are in flight
    /// together. IO the client must split or align runs at once.
    fn submit<'a>(&'a self, ops: &mut [MemberOp<'a>], batch: &mut Batch<'a>) {
        for op in ops.iter_mut().filter(|o| !o.is_complete()) {
            if !self.client.fits_one_request(op.offset, op.len()) {
                op.run_sync(self);
                continue;
            }
            let ticket = match op.buf() {
                OpBuf::Read(b) => self.client.start_read(op.offset, b.len() as u32),
                OpBuf::Write(b) => self.client.start_write(b, op.offset, false),
            };
            batch.complete_later(op, move |op: &mut MemberOp<'a>| {
                let r = ticket.wait().map(|data| {
                    if let OpBuf::Read(b) = &mut op.buf {
                        b.copy_from_slice(&data);
                    }
                });
                op.complete(r);
            });
        }
    }
}
