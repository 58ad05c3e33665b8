//! Submission plugging (the block layer's blk_plug, which md relies on to see large
//! requests): writes from one submitter are collected, and on unplug adjacent ones are
//! merged into one request before they reach the level, so that many small sequential
//! writes become full-stripe writes (raid4/5/6) or one large IO per mirror.
//!
//! Rules:
//! - A plugged write is complete when [`Plug::unplug`] (or [`Plug::finish`]) returns Ok,
//!   not when [`Plug::write`] returns; errors show up there.
//! - Writes whose ranges overlap keep their submission order (the later one wins); only
//!   when no two queued writes overlap are they sorted by offset, which cannot change the
//!   result.
//! - The queue is bounded ([`PLUG_MAX_BYTES`]): reaching it unplugs.
//! - A plug may be shared by threads; a write that finds the queue's lock taken does not
//!   wait for it, it goes out on its own, unmerged (md skips a batch merge rather than wait
//!   on a contended stripe lock).

use crate::array::Array;
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use std::sync::{Mutex, TryLockError};

/// Queued bytes at which a plug unplugs by itself.
pub const PLUG_MAX_BYTES: usize = 4 << 20;

/// Writes collected for one submitter; see the module comment.
pub struct Plug<'a> {
    a: &'a Array,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    writes: Vec<(u64, Vec<u8>)>,
    bytes: usize,
}

impl Array {
    /// Start collecting writes; see [`Plug`].
    pub fn plug(&self) -> Plug<'_> {
        Plug {
            a: self,
            queue: Mutex::new(Queue::default()),
        }
    }
}

impl Plug<'_> {
    /// Queue a write of `buf` at `offset` (checked now, performed at unplug).
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), ArrayError> {
        let size = self.a.size_bytes();
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > size)
        {
            return Err(ArrayError::OutOfRange {
                offset,
                len: buf.len() as u64,
                size,
            });
        }
        let full = match self.queue.try_lock() {
            Ok(mut q) => {
                q.writes.push((offset, buf.to_vec()));
                q.bytes += buf.len();
                q.bytes >= PLUG_MAX_BYTES
            }
            // Contended: do not wait to merge, send it now.
            Err(TryLockError::WouldBlock) => return self.a.write(offset, buf),
            Err(TryLockError::Poisoned(_)) => {
                return Err(ArrayError::Failed("a plug's queue is poisoned".into()))
            }
        };
        if full {
            self.unplug()?;
        }
        Ok(())
    }

    /// Send every queued write, adjacent ones merged; Ok when all have completed.
    pub fn unplug(&self) -> Result<(), ArrayError> {
        let writes = {
            let mut q = self.queue.lock().unwrap();
            q.bytes = 0;
            std::mem::take(&mut q.writes)
        };
        let mut first_err = None;
        for (offset, data) in merge(writes) {
            if let Err(e) = self.a.write(offset, &data) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Unplug and end the plug.
    pub fn finish(self) -> Result<(), ArrayError> {
        self.unplug()
    }
}

impl Drop for Plug<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.unplug() {
            tracing::error!("writes of a dropped plug failed: {e}");
        }
    }
}

/// Merge queued writes: sorted by offset when none overlap, else in submission order; each
/// write that starts where the previous one ended joins it.
fn merge(mut writes: Vec<(u64, Vec<u8>)>) -> Vec<(u64, AlignedBuf)> {
    let mut sorted = writes.clone();
    sorted.sort_by_key(|w| w.0);
    let overlap = sorted
        .windows(2)
        .any(|p| p[0].0 + p[0].1.len() as u64 > p[1].0);
    if !overlap {
        writes = sorted;
    }
    // Runs of back-to-back writes: (offset, indices).
    let mut runs: Vec<(u64, u64, Vec<usize>)> = Vec::new();
    for (i, (off, data)) in writes.iter().enumerate() {
        match runs.last_mut() {
            Some((_, end, idx)) if *end == *off => {
                *end += data.len() as u64;
                idx.push(i);
            }
            _ => runs.push((*off, off + data.len() as u64, vec![i])),
        }
    }
    runs.into_iter()
        .map(|(off, end, idx)| {
            let mut buf = AlignedBuf::new((end - off) as usize);
            let mut at = 0;
            for i in idx {
                let d = &writes[i].1;
                buf[at..at + d.len()].copy_from_slice(d);
                at += d.len();
            }
            (off, buf)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(off: u64, len: usize, v: u8) -> (u64, Vec<u8>) {
        (off, vec![v; len])
    }

    #[test]
    fn adjacent_writes_merge_in_any_order() {
        let m = merge(vec![w(8, 4, 2), w(0, 4, 0), w(4, 4, 1), w(20, 4, 3)]);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0, 0);
        assert_eq!(&m[0].1[..], &[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!((m[1].0, &m[1].1[..]), (20, &[3u8, 3, 3, 3][..]));
    }

    #[test]
    fn overlapping_writes_keep_their_order() {
        // The second write of [0, 4) must land after the first, so nothing is reordered.
        let m = merge(vec![w(0, 4, 1), w(4, 4, 2), w(0, 4, 3)]);
        let got: Vec<(u64, Vec<u8>)> = m.into_iter().map(|(o, b)| (o, b.to_vec())).collect();
        assert_eq!(got, vec![(0, vec![1, 1, 1, 1, 2, 2, 2, 2]), w(0, 4, 3)]);
    }
}
