//! The load generator: memory members, what a job runs against, and the job loop.

use super::hist::Hist;
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;
use uraid_engine::AlignedBuf;
use uraid_engine::{Array, Member};

/// Page size of the brd-like member: one lock per page, as brd keeps its data in pages.
const PAGE: usize = 4096;

/// A ramdisk like Linux brd: memory in 4 KiB pages, each behind its own lock, so that
/// concurrent IO to different pages never contends. (`uraid_engine::MemMember` keeps one
/// lock for the whole member, which would measure that lock rather than the engine.)
///
/// The data is one allocation (so that dropping the member gives the memory back to the
/// system and the RSS of later runs is not inflated) reached through a raw pointer; each
/// page's bytes are only touched under that page's lock.
pub struct BrdMember {
    name: String,
    size: usize,
    data: *mut u8,
    locks: Vec<RwLock<()>>,
}

// SAFETY: `data` is owned by the member; every access to a page holds that page's lock
// (shared for reads, exclusive for writes), so there are no data races.
unsafe impl Send for BrdMember {}
unsafe impl Sync for BrdMember {}

impl BrdMember {
    /// All pages are touched here, so the member's memory is resident from the start and the
    /// process's own memory is its RSS minus the members.
    pub fn new(name: String, size: u64) -> BrdMember {
        let size = size as usize;
        let mut v = vec![0u8; size].into_boxed_slice();
        for p in (0..size).step_by(PAGE) {
            // SAFETY: p < size; a volatile store makes the page resident.
            unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(p), 0) };
        }
        let data = Box::into_raw(v) as *mut u8;
        let locks = (0..size.div_ceil(PAGE)).map(|_| RwLock::new(())).collect();
        BrdMember {
            name,
            size,
            data,
            locks,
        }
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<usize> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size as u64 => Ok(offset as usize),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: access {offset}+{len} beyond {} bytes",
                    self.name, self.size
                ),
            )),
        }
    }

    /// Call `f(page offset in data, position in the request, length)` for each page piece.
    fn pieces(&self, pos: usize, len: usize, mut f: impl FnMut(usize, usize, usize)) {
        let mut done = 0;
        while done < len {
            let at = pos + done;
            let n = (PAGE - at % PAGE).min(len - done);
            f(at, done, n);
            done += n;
        }
    }
}

impl Drop for BrdMember {
    fn drop(&mut self) {
        // SAFETY: data came from Box::into_raw of a boxed slice of `size` bytes.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.data, self.size,
            )))
        };
    }
}

impl Member for BrdMember {
    fn size_bytes(&self) -> u64 {
        self.size as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let pos = self.check(offset, buf.len())?;
        self.pieces(pos, buf.len(), |at, i, n| {
            let _g = self.locks[at / PAGE].read().unwrap();
            // SAFETY: at + n <= size (checked); the page lock excludes writers of these bytes.
            unsafe { std::ptr::copy_nonoverlapping(self.data.add(at), buf[i..].as_mut_ptr(), n) };
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let pos = self.check(offset, buf.len())?;
        self.pieces(pos, buf.len(), |at, i, n| {
            let _g = self.locks[at / PAGE].write().unwrap();
            // SAFETY: at + n <= size (checked); the page lock is held exclusively.
            unsafe { std::ptr::copy_nonoverlapping(buf[i..].as_ptr(), self.data.add(at), n) };
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// What the jobs run against.
#[derive(Clone)]
pub enum Target {
    Array(Arc<Array>),
    /// One bare member: the ceiling.
    Raw(Arc<dyn Member>),
}

impl Target {
    pub fn size_bytes(&self) -> u64 {
        match self {
            Target::Array(a) => a.size_bytes(),
            Target::Raw(m) => m.size_bytes(),
        }
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), String> {
        match self {
            Target::Array(a) => a.read(off, buf).map_err(|e| e.to_string()),
            Target::Raw(m) => m.read_at(buf, off).map_err(|e| e.to_string()),
        }
    }

    fn write(&self, off: u64, buf: &[u8]) -> Result<(), String> {
        match self {
            Target::Array(a) => a.write(off, buf).map_err(|e| e.to_string()),
            Target::Raw(m) => m.write_at(buf, off).map_err(|e| e.to_string()),
        }
    }

    /// Member reads and writes issued so far (a bare member: none counted; one per
    /// request).
    pub fn member_ios(&self) -> Option<(u64, u64)> {
        match self {
            Target::Array(a) => Some((
                a.stats.member_reads.load(Ordering::Relaxed),
                a.stats.member_writes.load(Ordering::Relaxed),
            )),
            Target::Raw(_) => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Randread,
    Randwrite,
    Randrw,
    Seqread,
    Seqwrite,
}

impl Workload {
    pub fn writes(self) -> bool {
        !matches!(self, Workload::Randread | Workload::Seqread)
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::Randread => "randread",
            Workload::Randwrite => "randwrite",
            Workload::Randrw => "randrw",
            Workload::Seqread => "seqread",
            Workload::Seqwrite => "seqwrite",
        }
    }
}

/// What every thread of a run does.
#[derive(Clone, Copy)]
pub struct Pattern {
    pub workload: Workload,
    /// Percent of reads for randrw.
    pub read_mix: u32,
    pub bs: u64,
    pub seed: u64,
}

/// Run phases, switched by the controller: ramp (not counted), measure, stop.
pub const RAMP: u8 = 0;
pub const MEASURE: u8 = 1;
pub const STOP: u8 = 2;

/// What one thread counted while measuring.
pub struct ThreadResult {
    pub reads: u64,
    pub writes: u64,
    pub hist: Hist,
    pub error: Option<String>,
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One thread: issue requests back to back until the phase says stop; count only requests
/// that start while measuring. Sequential patterns give each thread its own slice of the
/// target, walked in order and wrapped.
pub fn job(
    target: &Target,
    p: Pattern,
    thread: usize,
    threads: usize,
    phase: &AtomicU8,
) -> ThreadResult {
    let mut rng = p.seed ^ (thread as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let blocks = target.size_bytes() / p.bs;
    let mut buf = AlignedBuf::new(p.bs as usize);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8) ^ (thread as u8) ^ 0x5a;
    }
    let per = (blocks / threads as u64).max(1);
    let seq_base = (thread as u64 * per) % blocks.max(1);
    let mut seq_pos = 0;
    let mut r = ThreadResult {
        reads: 0,
        writes: 0,
        hist: Hist::new(),
        error: None,
    };
    loop {
        let ph = phase.load(Ordering::Relaxed);
        if ph == STOP {
            break;
        }
        let (block, write) = match p.workload {
            Workload::Seqread | Workload::Seqwrite => {
                let b = seq_base + seq_pos;
                seq_pos = (seq_pos + 1) % per;
                (b.min(blocks - 1), p.workload == Workload::Seqwrite)
            }
            w => {
                let x = splitmix(&mut rng);
                let write = match w {
                    Workload::Randwrite => true,
                    Workload::Randrw => (x >> 32) % 100 >= p.read_mix as u64,
                    _ => false,
                };
                (((x & 0xffff_ffff) * blocks) >> 32, write)
            }
        };
        let off = block * p.bs;
        let t0 = Instant::now();
        let res = if write {
            target.write(off, &buf)
        } else {
            target.read(off, &mut buf)
        };
        let ns = t0.elapsed().as_nanos() as u64;
        if let Err(e) = res {
            r.error = Some(format!(
                "{} at {off}: {e}",
                if write { "write" } else { "read" }
            ));
            break;
        }
        if ph == MEASURE {
            r.hist.record(ns);
            if write {
                r.writes += 1;
            } else {
                r.reads += 1;
            }
        }
    }
    r
}
