//! The array's shape as the fast path reads it (level, raid_disks, chunk, layout, size),
//! guarded by a sequence counter (md's raid10 reads its geometry under a seqlock so that
//! requests need no lock and reshape can change it).
//!
//! `ArrayGeometry` and `Personality` are not `Copy` (raid0 zones, per-member sizes), so they
//! cannot be read word by word under a seqlock. The seqlock guards a small `Copy` [`Shape`]
//! instead, whose `epoch` names the personality version that maps addresses. Today there is
//! one version (epoch 0, `Array::personality`); reshape will add the new one beside the old
//! (versions are kept for the array's life, so a reader holding an epoch can always find
//! its personality) and switch the shape, under quiesce, with [`Array::set_shape`](crate::Array::set_shape).
//!
//! The seqlock follows Boehm's recipe for the C++/Rust memory model: the data are atomics
//! (so a racing read is not undefined behaviour, only discarded), the reader loads the
//! sequence with Acquire, the data Relaxed, then an Acquire fence and the sequence again;
//! the writer makes the sequence odd, a Release fence, the data, then the sequence even
//! with Release. A reader that saw an odd or changed sequence retries.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Mutex;
use uraid_core::Level;

/// What the request path needs to know about the array's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The RAID level.
    pub level: Level,
    /// Member roles.
    pub raid_disks: usize,
    /// Chunk size in sectors.
    pub chunk_sectors: u64,
    /// md layout number.
    pub layout: u32,
    /// Array size in sectors.
    pub array_sectors: u64,
    /// Which personality version maps addresses (bumped by reshape).
    pub epoch: u64,
}

const WORDS: usize = 5;

const LEVELS: [Level; 6] = [
    Level::Raid0,
    Level::Raid1,
    Level::Raid4,
    Level::Raid5,
    Level::Raid6,
    Level::Raid10,
];

impl Shape {
    fn encode(&self) -> [u64; WORDS] {
        let level = LEVELS
            .iter()
            .position(|l| *l == self.level)
            .expect("a known level") as u64;
        [
            level << 32 | u64::from(self.layout),
            self.raid_disks as u64,
            self.chunk_sectors,
            self.array_sectors,
            self.epoch,
        ]
    }

    fn decode(w: [u64; WORDS]) -> Shape {
        Shape {
            level: LEVELS[(w[0] >> 32) as usize],
            layout: w[0] as u32,
            raid_disks: w[1] as usize,
            chunk_sectors: w[2],
            array_sectors: w[3],
            epoch: w[4],
        }
    }
}

/// A [`Shape`] under a sequence counter: lock-free reads, writers serialised.
pub(crate) struct ShapeLock {
    seq: AtomicU64,
    words: [AtomicU64; WORDS],
    writer: Mutex<()>,
}

impl ShapeLock {
    pub(crate) fn new(s: Shape) -> ShapeLock {
        ShapeLock {
            seq: AtomicU64::new(0),
            words: s.encode().map(AtomicU64::new),
            writer: Mutex::new(()),
        }
    }

    /// The current shape; retries while a writer is changing it.
    pub(crate) fn read(&self) -> Shape {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let w = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return Shape::decode(w);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Replace the shape (the caller has quiesced the array).
    pub(crate) fn write(&self, s: Shape) {
        let _w = self.writer.lock().unwrap();
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (a, v) in self.words.iter().zip(s.encode()) {
            a.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq + 2, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A shape whose fields all derive from `k`, so a torn read shows as a mismatch.
    fn shape_of(k: u64) -> Shape {
        Shape {
            level: LEVELS[(k % 6) as usize],
            raid_disks: (k % 1000) as usize + 2,
            chunk_sectors: k.wrapping_mul(8),
            layout: (k as u32).wrapping_mul(3),
            array_sectors: k ^ 0xdead_beef_0000,
            epoch: k,
        }
    }

    #[test]
    fn shapes_round_trip() {
        for k in [0, 1, 5, 77, u32::MAX as u64 + 9] {
            assert_eq!(Shape::decode(shape_of(k).encode()), shape_of(k));
        }
    }

    /// Readers never see a torn shape while writers change it as fast as they can.
    /// `URAID_FULL=1` runs longer.
    #[test]
    fn readers_never_see_a_torn_shape() {
        let writes = if std::env::var("URAID_FULL").is_ok() {
            2_000_000
        } else {
            100_000
        };
        let l = ShapeLock::new(shape_of(0));
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let mut last = 0;
                    let mut reads = 0u64;
                    while reads == 0 || !done.load(Ordering::Acquire) {
                        let got = l.read();
                        assert_eq!(got, shape_of(got.epoch), "torn shape");
                        assert!(got.epoch >= last, "shape went back in time");
                        last = got.epoch;
                        reads += 1;
                    }
                });
            }
            s.spawn(|| {
                for k in 1..=writes {
                    l.write(shape_of(k));
                }
                done.store(true, Ordering::Release);
            });
        });
    }
}
