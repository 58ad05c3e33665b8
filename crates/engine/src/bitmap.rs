//! The internal write-intent bitmap, kept the way md keeps it.
//!
//! One bit per bitmap chunk of the sync range (member sectors for raid1/4/5/6, array sectors
//! for raid10). Before a write reaches any member, the bits of its chunks are set and the
//! bitmap is written and flushed on every member; a count of writes in flight per chunk
//! goes down when they complete. The daemon (every `daemon_sleep` seconds, and at a clean
//! stop) flushes the members and clears bits whose chunks saw no writes for a whole pass.
//! Bits are never cleared while the array is degraded, so a member that comes back can be
//! brought up to date from the bits alone (md's re-add), as long as its events are not older
//! than `events_cleared`.
//!
//! After an unclean stop only chunks whose bit is set need a resync. A bitmap whose events
//! are behind the superblock's is stale: every bit is taken as set.

use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::member::Member;
use uraid_core::bitmap::{self as bm, BitmapSuper};
use uraid_core::superblock::Superblock;
use uraid_core::SECTOR_BYTES;

/// md's in-memory bitmap counters per page (4 KiB of 16-bit counters).
const COUNTERS_PER_PAGE: u64 = 2048;

/// The bitmap as /proc/mdstat counts it ([`BitmapState::pages`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitmapPages {
    /// Pages with a dirty chunk.
    pub used: u64,
    /// Pages for all the chunks.
    pub total: u64,
    /// Sectors of array data one chunk covers.
    pub chunk_sectors: u64,
}

/// A write-intent bitmap as md keeps it: the bitmap superblock, the on-disk bits and the
/// in-memory counters of writes in flight per chunk.
pub struct BitmapState {
    /// The bitmap superblock.
    pub sb: BitmapSuper,
    /// Sectors from the superblock to the bitmap (md's bitmap_offset).
    pub offset_sectors: i64,
    /// In-memory bits (the on-disk layout: bit i of byte i/8).
    bits: Vec<u8>,
    /// Writes in flight per chunk.
    counts: Vec<u32>,
    /// Chunks found idle by the previous daemon pass.
    idle: Vec<bool>,
    /// The bits changed since they were last written.
    changed: bool,
}

impl BitmapState {
    pub(crate) fn new(sb: BitmapSuper, offset_sectors: i64) -> BitmapState {
        let chunks = sb.chunks() as usize;
        BitmapState {
            bits: vec![0u8; sb.bits_bytes() as usize],
            counts: vec![0; chunks],
            idle: vec![false; chunks],
            sb,
            offset_sectors,
            changed: true,
        }
    }

    fn area_offset(&self, member_sb: &Superblock) -> u64 {
        ((member_sb.super_offset as i64 + self.offset_sectors) as u64) * SECTOR_BYTES
    }

    /// The bitmap superblock of a member whose superblock has FEATURE_BITMAP_OFFSET (its
    /// first 4 KiB only), checked to belong to the member's array; `None` without a bitmap.
    pub(crate) fn read_super(
        dev: &dyn Member,
        sb: &Superblock,
    ) -> Result<Option<BitmapSuper>, ArrayError> {
        let Some(sector) = sb.bitmap_sector() else {
            return Ok(None);
        };
        let mut head = AlignedBuf::new(4096);
        dev.read_at(&mut head, sector * SECTOR_BYTES)?;
        let bms = BitmapSuper::decode(&head)
            .map_err(|e| ArrayError::Assemble(format!("{}: internal bitmap: {e}", dev.name())))?;
        // A 0.90 array's bitmap carries the uuid words in the writer's byte order.
        let expected = if uraid_core::superblock090::is_090_place(
            sb.super_offset,
            dev.size_bytes() / SECTOR_BYTES,
        ) {
            uraid_core::superblock090::bitmap_uuid090(&sb.set_uuid)
        } else {
            sb.set_uuid
        };
        if bms.uuid != expected {
            return Err(ArrayError::Assemble(format!(
                "{}: the internal bitmap belongs to another array",
                dev.name()
            )));
        }
        Ok(Some(bms))
    }

    /// Read the bitmap of a member whose superblock has FEATURE_BITMAP_OFFSET. A bitmap
    /// older than the superblock is stale: all its bits are set.
    pub fn load(dev: &dyn Member, sb: &Superblock) -> Result<Option<BitmapState>, ArrayError> {
        let Some(bms) = BitmapState::read_super(dev, sb)? else {
            return Ok(None);
        };
        let sector = sb.bitmap_sector().unwrap_or_default();
        let mut st = BitmapState::new(bms, i64::from(sb.bitmap_offset));
        let mut area = AlignedBuf::new(st.sb.space_bytes() as usize);
        dev.read_at(&mut area, sector * SECTOR_BYTES)?;
        let n = st.bits.len();
        st.bits
            .copy_from_slice(&area[bm::BITMAP_SUPER_BYTES..bm::BITMAP_SUPER_BYTES + n]);
        if st.sb.events < sb.events {
            tracing::warn!(
                "bitmap events {} < superblock events {}: bitmap is stale, full resync",
                st.sb.events,
                sb.events
            );
            st.set_all();
        }
        st.changed = false;
        Ok(Some(st))
    }

    /// The bitmap resized for a new sync size (`sync_size` sectors) and chunk (`chunk`
    /// bytes, a power-of-two multiple of the old one), as md's md_bitmap_resize: a new bit
    /// is dirty when a bit it covers was, and, with `grown_dirty`, when it covers sectors
    /// past the old size; writes in flight are counted in the chunks that now hold them.
    pub(crate) fn resize(
        &mut self,
        sync_size: u64,
        chunk: u32,
        grown_dirty: bool,
    ) -> Result<(), ArrayError> {
        let old_chunk = self.sb.chunksize;
        if chunk < old_chunk || !chunk.is_power_of_two() {
            return Err(ArrayError::Failed(format!(
                "internal bitmap: a chunk of {chunk} bytes cannot take the bits of {old_chunk}"
            )));
        }
        let merge = u64::from(chunk / old_chunk);
        let (old_chunks, old_size) = (self.chunks(), self.sb.sync_size);
        let mut sb = self.sb.clone();
        sb.sync_size = sync_size;
        sb.chunksize = chunk;
        let mut next = BitmapState::new(sb, self.offset_sectors);
        let chunk_sectors = u64::from(chunk) / SECTOR_BYTES;
        for c in 0..next.chunks() {
            let covered = (c * merge)..((c + 1) * merge).min(old_chunks);
            let dirty = covered.clone().any(|o| bm::is_dirty(&self.bits, o))
                || (grown_dirty && (c + 1) * chunk_sectors > old_size);
            bm::set_dirty(&mut next.bits, c, dirty);
            next.counts[c as usize] = covered.map(|o| self.counts[o as usize]).sum();
        }
        *self = next;
        Ok(())
    }

    /// Sectors of array data one bit covers.
    pub fn chunk_sectors(&self) -> u64 {
        self.sb.chunk_sectors()
    }

    /// Number of bits (bitmap chunks).
    pub fn chunks(&self) -> u64 {
        self.counts.len() as u64
    }

    fn chunk_range(&self, start_sector: u64, sectors: u64) -> std::ops::Range<u64> {
        let cs = self.chunk_sectors();
        let first = start_sector / cs;
        let last = (start_sector + sectors.max(1) - 1) / cs;
        first.min(self.chunks())..(last + 1).min(self.chunks())
    }

    pub(crate) fn set_all(&mut self) {
        for c in 0..self.chunks() {
            bm::set_dirty(&mut self.bits, c, true);
        }
        self.changed = true;
    }

    /// Whether any chunk touching [start, start+sectors) is dirty.
    pub fn is_dirty(&self, start_sector: u64, sectors: u64) -> bool {
        self.chunk_range(start_sector, sectors)
            .any(|c| bm::is_dirty(&self.bits, c))
    }

    /// Bits set: chunks that may differ between members.
    pub fn dirty_chunks(&self) -> u64 {
        bm::count_dirty(&self.bits, self.chunks())
    }

    /// md's count of the bitmap's in-memory pages (/proc/mdstat's "bitmap: used/total
    /// pages"): md keeps a 16-bit counter per chunk, 2048 to a 4 KiB page, and a page is
    /// in use while a chunk on it is; here, while a chunk on it is dirty.
    pub fn pages(&self) -> BitmapPages {
        let chunks = self.chunks();
        let total = chunks.div_ceil(COUNTERS_PER_PAGE);
        let used = (0..total)
            .filter(|p| {
                let first = p * COUNTERS_PER_PAGE;
                (first..(first + COUNTERS_PER_PAGE).min(chunks))
                    .any(|c| bm::is_dirty(&self.bits, c))
            })
            .count() as u64;
        BitmapPages {
            used,
            total,
            chunk_sectors: self.chunk_sectors(),
        }
    }

    /// A write to [start, start+sectors) is about to start. Returns whether bits were newly
    /// set (then the bitmap must reach the members before the data does).
    pub fn start_write(&mut self, start_sector: u64, sectors: u64) -> bool {
        let mut newly = false;
        for c in self.chunk_range(start_sector, sectors) {
            self.counts[c as usize] += 1;
            self.idle[c as usize] = false;
            if !bm::is_dirty(&self.bits, c) {
                bm::set_dirty(&mut self.bits, c, true);
                newly = true;
            }
        }
        self.changed |= newly;
        newly
    }

    pub(crate) fn end_write(&mut self, start_sector: u64, sectors: u64) {
        for c in self.chunk_range(start_sector, sectors) {
            let n = &mut self.counts[c as usize];
            debug_assert!(*n > 0, "bitmap end_write without start_write");
            *n = n.saturating_sub(1);
        }
    }

    /// One daemon pass (the members must have been flushed first): clear bits of chunks that
    /// were idle for the whole previous pass; never with `keep` (degraded, or a resync
    /// owed). Returns whether any bit was cleared.
    pub fn daemon_pass(&mut self, keep: bool, events: u64) -> bool {
        if keep {
            return false;
        }
        let mut cleared = false;
        for c in 0..self.chunks() {
            let i = c as usize;
            if !bm::is_dirty(&self.bits, c) || self.counts[i] > 0 {
                self.idle[i] = false;
                continue;
            }
            if self.idle[i] {
                bm::set_dirty(&mut self.bits, c, false);
                self.idle[i] = false;
                cleared = true;
            } else {
                self.idle[i] = true;
            }
        }
        if cleared {
            self.sb.events_cleared = events;
            self.changed = true;
        }
        cleared
    }

    /// Clear every idle bit now (clean stop, finished resync); never while degraded.
    pub fn clear_idle(&mut self, degraded: bool, events: u64) {
        if degraded {
            return;
        }
        for c in 0..self.chunks() {
            if self.counts[c as usize] == 0 && bm::is_dirty(&self.bits, c) {
                bm::set_dirty(&mut self.bits, c, false);
                self.changed = true;
            }
        }
        self.sb.events_cleared = events;
    }

    /// Write the bitmap superblock (events in step with the array) and the bits.
    pub fn write(
        &self,
        dev: &dyn Member,
        member_sb: &Superblock,
        events: u64,
    ) -> Result<(), ArrayError> {
        let mut sb = self.sb.clone();
        sb.events = events;
        let mut buf = AlignedBuf::new(self.sb.space_bytes() as usize);
        buf[..bm::BITMAP_SUPER_BYTES].copy_from_slice(&sb.encode());
        buf[bm::BITMAP_SUPER_BYTES..bm::BITMAP_SUPER_BYTES + self.bits.len()]
            .copy_from_slice(&self.bits);
        dev.write_at(&buf, self.area_offset(member_sb))?;
        Ok(())
    }

    /// Called after the bitmap was written on every member.
    pub fn written(&mut self, events: u64) {
        self.sb.events = events;
        self.changed = false;
    }
}

/// The coarsest bitmap chunk md gives a resized bitmap (md_bitmap_resize doubles the chunk
/// while its shift from sectors stays below 31 bits).
pub(crate) const MAX_BITMAP_CHUNK_BYTES: u32 = 1 << 30;

/// The sectors an existing internal bitmap's area may take: from its start to the nearest
/// of what lies above it on the member (the bad block log, the data, the superblock, and
/// for 0.90 the end of the superblock's 64 KiB block).
pub(crate) fn bitmap_space_sectors(sb: &Superblock, is_090: bool) -> u64 {
    let Some(start) = sb.bitmap_sector() else {
        return 0;
    };
    let bblog = sb.bblog_sector().map(|(at, _)| at);
    [
        bblog,
        Some(sb.data_offset),
        Some(sb.super_offset),
        is_090.then_some(sb.super_offset + 128),
    ]
    .into_iter()
    .flatten()
    .filter(|&end| end > start)
    .min()
    .map_or(0, |end| end - start)
}

/// The bitmap chunk (bytes) for `sync_size` sectors of bits within `room_sectors`: `chunk`
/// where they fit, doubled until they do otherwise (md's md_bitmap_resize); `None` when
/// even the largest chunk does not fit.
pub(crate) fn bitmap_chunk_for(sync_size: u64, chunk: u32, room_sectors: u64) -> Option<u32> {
    let mut c = chunk;
    while bm::space_bytes(sync_size, c) / 512 > room_sectors && c < MAX_BITMAP_CHUNK_BYTES {
        c *= 2;
    }
    (bm::space_bytes(sync_size, c) / 512 <= room_sectors).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bitmap resized to a coarser chunk (md's md_bitmap_resize when the bits do not fit):
    /// each new bit is dirty when an old bit it covers was, or, asked for, when it reaches
    /// past the old size; the others are clean, writes in flight are counted where they now
    /// fall, and the superblock says the new chunk and size.
    #[test]
    fn a_coarser_bitmap_keeps_every_dirty_bit_and_sets_the_grown_range() {
        let chunk = 4096u32;
        let old_size = 64 * 8; // 64 chunks of 8 sectors
        let sb = BitmapSuper::new([7; 16], old_size, chunk, 5).unwrap();
        let dirty_after = |grown_dirty: bool| {
            let mut b = BitmapState::new(sb.clone(), 8);
            for c in [0u64, 5, 6, 33, 63] {
                bm::set_dirty(&mut b.bits, c, true);
            }
            assert!(b.start_write(6 * 8, 16)); // old chunks 6 and 7
                                               // 4 old chunks per new one, the size doubled.
            b.resize(old_size * 2, chunk * 4, grown_dirty).unwrap();
            assert_eq!((b.sb.chunksize, b.sb.sync_size), (chunk * 4, old_size * 2));
            assert_eq!(b.counts[1], 2, "the write in flight over old 6 and 7");
            let dirty: Vec<u64> = (0..b.chunks())
                .filter(|&c| bm::is_dirty(&b.bits, c))
                .collect();
            dirty
        };
        // Old 0 -> 0, 5 and 6 -> 1, 33 -> 8, 63 -> 15; the grown range is new 16..32.
        let mut want = vec![0, 1, 8, 15];
        assert_eq!(dirty_after(false), want);
        want.extend(16..32);
        assert_eq!(dirty_after(true), want);
        let mut b = BitmapState::new(sb, 8);
        assert!(b.resize(old_size, chunk / 2, true).is_err());
    }
}
