//! The ublk export: `/dev/ublkbN` backed by the array, through the `libublk` crate.
//!
//! The kernel hands each queue's requests to one thread of ours over io_uring; we run them
//! on the array synchronously (the array already spreads one request over its members) and
//! complete them with the byte count or `-errno`. Teardown: `kill_dev` from another
//! handle stops the queues; `run_target` returns and deleting the control handle removes
//! the device.
//!
//! Built only with the `ublk` cargo feature (libublk generates its kernel bindings with
//! bindgen, which needs libclang at build time); without it `--ublk` says so.

use anyhow::Result;
use std::sync::Arc;
use uraid_engine::Array;

/// What to tell the user when the kernel has no ublk.
pub const NO_UBLK_DRIVER: &str =
    "this kernel has no ublk driver (CONFIG_BLK_DEV_UBLK; try `modprobe ublk_drv`): \
     /dev/ublk-control is missing; use --nbd";

#[cfg(feature = "ublk")]
mod imp {
    use super::*;
    use anyhow::{anyhow, bail, Context};
    use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
    use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
    use libublk::{sys, BufDesc, BufDescList, UblkFlags, UblkIORes};
    use std::sync::mpsc;
    use std::thread::JoinHandle;
    use std::time::Duration;
    use uraid_engine::ZeroHow;

    /// Queues (one thread each) and requests in flight per queue.
    const NR_QUEUES: u16 = 2;
    const QUEUE_DEPTH: u16 = 64;
    /// Largest read or write the kernel sends us.
    const IO_BUF_BYTES: u32 = 512 * 1024;
    /// Largest discard or write-zeroes range.
    const MAX_RANGE_SECTORS: u32 = 1 << 20;

    pub struct UblkExport {
        dev_id: u32,
        thread: Option<JoinHandle<()>>,
    }

    impl UblkExport {
        pub fn start(array: Arc<Array>) -> Result<UblkExport> {
            if !std::path::Path::new("/dev/ublk-control").exists() {
                bail!("{NO_UBLK_DRIVER}");
            }
            let (tx, rx) = mpsc::channel::<Result<u32, String>>();
            let tx_started = tx.clone();
            let thread = std::thread::Builder::new()
                .name("ublk".into())
                .spawn(move || {
                    if let Err(e) = run(array, tx_started) {
                        let _ = tx.send(Err(format!("{e:#}")));
                    }
                })
                .context("starting the ublk thread")?;
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(Ok(dev_id)) => Ok(UblkExport {
                    dev_id,
                    thread: Some(thread),
                }),
                Ok(Err(e)) => {
                    let _ = thread.join();
                    bail!("ublk: {e}")
                }
                Err(_) => bail!("ublk: the device did not start within 60 s"),
            }
        }

        pub fn bdev_path(&self) -> String {
            format!("/dev/ublkb{}", self.dev_id)
        }

        /// Stops the queues (in-flight requests complete first) and deletes the device.
        pub fn stop(mut self) -> Result<()> {
            let ctrl = UblkCtrl::new_simple(self.dev_id as i32)
                .map_err(|e| anyhow!("opening ublk device {}: {e}", self.dev_id))?;
            ctrl.kill_dev()
                .map_err(|e| anyhow!("stopping ublk device {}: {e}", self.dev_id))?;
            if let Some(t) = self.thread.take() {
                t.join().map_err(|_| anyhow!("the ublk thread panicked"))?;
            }
            Ok(())
        }
    }

    fn run(array: Arc<Array>, started: mpsc::Sender<Result<u32, String>>) -> Result<()> {
        let ctrl = UblkCtrlBuilder::default()
            .name("uraid")
            .nr_queues(NR_QUEUES)
            .depth(QUEUE_DEPTH)
            .io_buf_bytes(IO_BUF_BYTES)
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build()
            .map_err(|e| anyhow!("adding a ublk device: {e} (is ublk_drv loaded?)"))?;
        let size = array.size_bytes();
        let tgt_init = move |dev: &mut UblkDev| {
            dev.set_default_params(size);
            let p = &mut dev.tgt.params;
            p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
            p.discard = sys::ublk_param_discard {
                discard_alignment: 0,
                discard_granularity: 4096,
                // 512 MiB per request keeps every byte count within the i32 result.
                max_discard_sectors: MAX_RANGE_SECTORS,
                max_write_zeroes_sectors: MAX_RANGE_SECTORS,
                max_discard_segments: 1,
                ..Default::default()
            };
            Ok(())
        };
        let q_array = array.clone();
        let q_fn = move |qid: u16, dev: &UblkDev| queue_loop(qid, dev, &q_array);
        ctrl.run_target(tgt_init, q_fn, move |ctrl: &UblkCtrl| {
            let _ = started.send(Ok(ctrl.dev_info().dev_id));
        })
        .map_err(|e| anyhow!("running the ublk device: {e}"))?;
        Ok(())
    }

    fn queue_loop(qid: u16, dev: &UblkDev, array: &Array) {
        let mut bufs = dev.alloc_queue_io_bufs();
        let q = match UblkQueue::new(qid, dev)
            .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
        {
            Ok(q) => q,
            Err(e) => {
                tracing::error!("ublk queue {qid}: {e}");
                return;
            }
        };
        q.wait_and_handle_io(move |q: &UblkQueue, tag: u16, _io: &UblkIOCtx| {
            let buf = &mut bufs[tag as usize];
            let res = handle(q, tag, buf.as_mut_slice(), array);
            if let Err(e) = q.complete_io_cmd_unified(
                tag,
                BufDesc::Slice(buf.as_slice()),
                Ok(UblkIORes::Result(res)),
            ) {
                tracing::error!("ublk: completing tag {tag}: {e}");
            }
        });
    }

    /// Runs one request; the byte count or `-errno`.
    fn handle(q: &UblkQueue, tag: u16, buf: &mut [u8], array: &Array) -> i32 {
        let iod = q.get_iod(tag);
        let offset = iod.start_sector << 9;
        let len = (iod.nr_sectors as usize) << 9;
        let op = iod.op_flags & 0xff;
        let fua = iod.op_flags & sys::UBLK_IO_F_FUA != 0;
        if len > buf.len() && (op == sys::UBLK_IO_OP_READ || op == sys::UBLK_IO_OP_WRITE) {
            return -libc::EINVAL;
        }
        let r = match op {
            sys::UBLK_IO_OP_READ => array.read(offset, &mut buf[..len]),
            sys::UBLK_IO_OP_WRITE => array.write(offset, &buf[..len]),
            sys::UBLK_IO_OP_FLUSH => array.flush(),
            sys::UBLK_IO_OP_DISCARD => array.discard(offset, len as u64),
            sys::UBLK_IO_OP_WRITE_ZEROES => {
                // REQ_NOUNMAP: the blocks stay allocated.
                let unmap = iod.op_flags & sys::UBLK_IO_F_NOUNMAP == 0;
                array.write_zeroes_with(offset, len as u64, ZeroHow { unmap }, false)
            }
            _ => return -libc::EOPNOTSUPP,
        };
        let r = r.and_then(|()| {
            if fua && op != sys::UBLK_IO_OP_FLUSH && op != sys::UBLK_IO_OP_READ {
                array.flush()
            } else {
                Ok(())
            }
        });
        match r {
            // Reads and writes report their byte count; the kernel ignores it for the rest.
            Ok(()) if op == sys::UBLK_IO_OP_READ || op == sys::UBLK_IO_OP_WRITE => len as i32,
            Ok(()) => 0,
            Err(e) => {
                tracing::warn!("ublk: op {op} at byte {offset} failed: {e}");
                -e.errno()
            }
        }
    }
}

#[cfg(not(feature = "ublk"))]
mod imp {
    use super::*;

    pub struct UblkExport;

    impl UblkExport {
        pub fn start(_array: Arc<Array>) -> Result<UblkExport> {
            if !std::path::Path::new("/dev/ublk-control").exists() {
                anyhow::bail!("{NO_UBLK_DRIVER}");
            }
            anyhow::bail!(
                "this uraid was built without ublk support (cargo feature `ublk`, which needs \
                 libclang to build); use --nbd"
            )
        }

        pub fn bdev_path(&self) -> String {
            String::new()
        }

        pub fn stop(self) -> Result<()> {
            Ok(())
        }
    }
}

pub use imp::UblkExport;
