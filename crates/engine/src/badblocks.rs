//! md's bad block log: member sectors known to be unreadable.
//!
//! A read error whose rewrite from redundancy also fails is recorded here instead of failing
//! the member at once (md's rdev_set_badblocks); reads of a recorded range are answered from
//! redundancy; a write that succeeds over a range clears it. The list is kept in absolute
//! device sectors, as md keeps it, and stored in the log area the superblock points to
//! (`bblog_offset`, `bblog_size`, `bblog_shift`): 8-byte little-endian entries
//! `start << 10 | length`, both in units of 2^bblog_shift sectors, the rest all ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// md's longest entry (BB_MAX_LEN), in units.
const MAX_ENTRY_UNITS: u64 = 512;

/// A superblock's `bblog_shift` names units of 2^shift sectors; from 64 on no sector fits.
fn shift_usable(shift: u8) -> bool {
    shift < 64
}

/// Sorted, non-overlapping, non-adjacent ranges of absolute device sectors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BadBlocks {
    ranges: Vec<(u64, u64)>, // [start, end)
}

impl BadBlocks {
    /// Whether no range is recorded.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges, as (first sector, sectors).
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.ranges.iter().map(|&(s, e)| (s, e - s)).collect()
    }

    /// Whether any sector of [start, start + sectors) is recorded.
    pub fn overlaps(&self, start: u64, sectors: u64) -> bool {
        let end = start + sectors;
        self.ranges.iter().any(|&(s, e)| s < end && start < e)
    }

    /// Record [start, start + sectors), merging with neighbours.
    pub fn add(&mut self, start: u64, sectors: u64) {
        if sectors == 0 {
            return;
        }
        let (mut s, mut e) = (start, start + sectors);
        self.ranges.retain(|&(rs, re)| {
            if rs <= e && s <= re {
                s = s.min(rs);
                e = e.max(re);
                false
            } else {
                true
            }
        });
        let at = self.ranges.partition_point(|&(rs, _)| rs < s);
        self.ranges.insert(at, (s, e));
    }

    /// Forget [start, start + sectors) (it was written successfully); true if that changed
    /// the list.
    pub fn clear(&mut self, start: u64, sectors: u64) -> bool {
        let end = start + sectors;
        if !self.overlaps(start, sectors) {
            return false;
        }
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for &(s, e) in &self.ranges {
            if e <= start || end <= s {
                out.push((s, e));
                continue;
            }
            if s < start {
                out.push((s, start));
            }
            if end < e {
                out.push((end, e));
            }
        }
        self.ranges = out;
        true
    }

    /// Entries the list needs with `shift` (ranges rounded out to whole units, split at
    /// md's 512-unit limit).
    /// None where a start does not fit an entry's 54 bits (a range that a log entry
    /// near the top named, split here at 512 units).
    fn entries(&self, shift: u8) -> Option<Vec<u64>> {
        let mut v = Vec::new();
        for &(s, e) in &self.ranges {
            let mut u = s >> shift;
            let end = e.div_ceil(1 << shift);
            while u < end {
                if u >= 1 << 54 {
                    return None;
                }
                let n = (end - u).min(MAX_ENTRY_UNITS);
                v.push((u << 10) | n);
                u += n;
            }
        }
        Some(v)
    }

    /// Whether the list fits a log of `size_sectors` (never with an unusable shift).
    pub fn fits(&self, shift: u8, size_sectors: u16) -> bool {
        shift_usable(shift)
            && self
                .entries(shift)
                .is_some_and(|v| v.len() * 8 <= usize::from(size_sectors) * 512)
    }

    /// The log area's bytes; None if the list does not fit or the shift is unusable.
    pub fn encode(&self, shift: u8, size_sectors: u16) -> Option<Vec<u8>> {
        if !shift_usable(shift) {
            return None;
        }
        let mut buf = vec![0xffu8; usize::from(size_sectors) * 512];
        let entries = self.entries(shift)?;
        if entries.len() * 8 > buf.len() {
            return None;
        }
        for (i, e) in entries.iter().enumerate() {
            buf[i * 8..i * 8 + 8].copy_from_slice(&e.to_le_bytes());
        }
        Some(buf)
    }

    /// Read a log area. Entries stop at the first all-ones one; an entry of length 0 is
    /// refused (md refuses the member too).
    pub fn decode(buf: &[u8], shift: u8) -> Result<BadBlocks, String> {
        if !shift_usable(shift) {
            return Err(format!(
                "bad block log shift {shift} is out of range (sectors are 64-bit)"
            ));
        }
        let mut bb = BadBlocks::default();
        for (i, c) in buf.chunks_exact(8).enumerate() {
            let e = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            if e == u64::MAX {
                break;
            }
            let len = e & 0x3ff;
            if len == 0 {
                return Err(format!("bad block log entry {i} has length 0 ({e:#018x})"));
            }
            // Units to sectors without losing high bits, and an end that fits.
            let sectors = |units: u64| (units <= u64::MAX >> shift).then(|| units << shift);
            let range = sectors(e >> 10)
                .zip(sectors(len))
                .filter(|&(start, n)| start.checked_add(n).is_some());
            let Some((start, n)) = range else {
                return Err(format!(
                    "bad block log entry {i} ({e:#018x}, shift {shift}) lies beyond the \
                     largest sector"
                ));
            };
            bb.add(start, n);
        }
        Ok(bb)
    }
}

/// A slot's bad block list, shared (the replace copy reads the old device directly).
#[derive(Clone)]
pub(crate) struct BadCheck {
    bad: Arc<Mutex<BadBlocks>>,
    has_bad: Arc<AtomicBool>,
}

impl BadCheck {
    pub(crate) fn new(bad: Arc<Mutex<BadBlocks>>, has_bad: Arc<AtomicBool>) -> BadCheck {
        BadCheck { bad, has_bad }
    }

    pub(crate) fn overlaps(&self, start: u64, sectors: u64) -> bool {
        self.has_bad.load(Ordering::Acquire) && self.bad.lock().unwrap().overlaps(start, sectors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_merges_and_clear_splits() {
        let mut b = BadBlocks::default();
        b.add(100, 8);
        b.add(10, 2);
        b.add(108, 4); // adjacent: merges
        assert_eq!(b.ranges(), vec![(10, 2), (100, 12)]);
        assert!(b.overlaps(111, 1));
        assert!(!b.overlaps(112, 100));
        assert!(b.clear(104, 2));
        assert_eq!(b.ranges(), vec![(10, 2), (100, 4), (106, 6)]);
        assert!(!b.clear(0, 10));
        assert!(b.clear(0, 1000));
        assert!(b.is_empty());
    }

    #[test]
    fn golden_bytes_and_round_trip() {
        let mut b = BadBlocks::default();
        b.add(0x1234, 8);
        let buf = b.encode(0, 1).unwrap();
        // 0x1234 << 10 | 8 = 0x48d008, little-endian, then all ones.
        assert_eq!(&buf[..8], &[0x08, 0xd0, 0x48, 0, 0, 0, 0, 0]);
        assert!(buf[8..].iter().all(|&x| x == 0xff));
        assert_eq!(BadBlocks::decode(&buf, 0).unwrap(), b);
        // A long range is split at md's 512-unit limit.
        let mut long = BadBlocks::default();
        long.add(0, 1000);
        let buf = long.encode(0, 1).unwrap();
        let e0 = u64::from_le_bytes(buf[..8].try_into().unwrap());
        let e1 = u64::from_le_bytes(buf[8..16].try_into().unwrap());
        assert_eq!((e0 >> 10, e0 & 0x3ff), (0, 512));
        assert_eq!((e1 >> 10, e1 & 0x3ff), (512, 488));
        assert_eq!(BadBlocks::decode(&buf, 0).unwrap(), long);
        // With a shift, units of 2^shift sectors, rounded out.
        let mut s = BadBlocks::default();
        s.add(9, 2);
        let buf = s.encode(3, 1).unwrap();
        let e = u64::from_le_bytes(buf[..8].try_into().unwrap());
        assert_eq!((e >> 10, e & 0x3ff), (1, 1));
        assert_eq!(BadBlocks::decode(&buf, 3).unwrap().ranges(), vec![(8, 8)]);
    }

    #[test]
    fn a_full_log_is_refused() {
        let mut b = BadBlocks::default();
        for i in 0..65 {
            b.add(i * 10, 1);
        }
        assert!(!b.fits(0, 1));
        assert!(b.encode(0, 1).is_none());
        assert!(b.fits(0, 2));
    }

    #[test]
    fn zero_length_entries_are_refused() {
        let mut buf = vec![0xffu8; 512];
        buf[..8].copy_from_slice(&(5u64 << 10).to_le_bytes());
        assert!(BadBlocks::decode(&buf, 0).is_err());
    }
}
