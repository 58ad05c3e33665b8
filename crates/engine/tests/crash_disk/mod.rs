//! A crash disk for the journal crash tests: a live image that reads see and a durable
//! image that survives a power cut; writes since the last flush are kept, dropped or torn
//! per sector at the cut ([`CrashMember::crash`]).

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use uraid_engine::Member;

/// Power for every device of one run: IO stops once `ops_left` runs out.
pub struct Power {
    pub ops_left: AtomicI64,
}

impl Power {
    /// Spend one IO; false once the power is off.
    pub fn tick(&self) -> bool {
        self.ops_left.fetch_sub(1, Ordering::SeqCst) > 0
    }
    pub fn on(&self) -> bool {
        self.ops_left.load(Ordering::SeqCst) > 0
    }
}

pub struct CrashMember {
    name: String,
    power: Arc<Power>,
    live: Mutex<Vec<u8>>,
    durable: Mutex<Vec<u8>>,
    /// Writes since the last flush, in order.
    pending: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Writes below this offset (superblocks) are atomic: md writes them with FUA.
    tear_from: u64,
}

impl CrashMember {
    pub fn new(name: &str, power: Arc<Power>, image: Vec<u8>, tear_from: u64) -> CrashMember {
        CrashMember {
            name: name.into(),
            power,
            live: Mutex::new(image.clone()),
            durable: Mutex::new(image),
            pending: Mutex::new(Vec::new()),
            tear_from,
        }
    }

    /// Writes since the last flush: what a crash now may keep, drop or tear.
    #[allow(dead_code)] // the journal crash tests count, failure_durability does not
    pub fn unflushed_writes(&self) -> usize {
        self.pending.lock().unwrap().len()
    }

    /// The image after a power cut: durable, plus each pending write kept, dropped or torn.
    pub fn crash(&self, rng: &mut StdRng) -> Vec<u8> {
        let mut img = self.durable.lock().unwrap().clone();
        let mut pending = self.pending.lock().unwrap().clone();
        pending.shuffle(rng);
        for (off, buf) in pending {
            let o = off as usize;
            match rng.gen_range(0..3) {
                0 => {}
                1 => img[o..o + buf.len()].copy_from_slice(&buf),
                _ if off < self.tear_from => {}
                _ => {
                    for s in (0..buf.len()).step_by(512) {
                        if rng.gen_bool(0.5) {
                            img[o + s..o + s + 512].copy_from_slice(&buf[s..s + 512]);
                        }
                    }
                }
            }
        }
        img
    }
}

impl Member for CrashMember {
    fn size_bytes(&self) -> u64 {
        self.live.lock().unwrap().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let live = self.live.lock().unwrap();
        let o = offset as usize;
        buf.copy_from_slice(&live[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.power.tick() {
            return Ok(()); // lost with the power; the caller cannot tell
        }
        let o = offset as usize;
        self.live.lock().unwrap()[o..o + buf.len()].copy_from_slice(buf);
        self.pending.lock().unwrap().push((offset, buf.to_vec()));
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        if !self.power.tick() {
            return Ok(());
        }
        *self.durable.lock().unwrap() = self.live.lock().unwrap().clone();
        self.pending.lock().unwrap().clear();
        Ok(())
    }
    fn name(&self) -> String {
        self.name.clone()
    }
}
