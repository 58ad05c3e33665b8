//! Which parts of an array the write-intent bitmap holds dirty: NBD's
//! `qemu:dirty-bitmap:uraid` context for the export ([`crate::nbd::ArrayBackend`]), so that a
//! backup tool copies only what changed since the bits were last cleared.
//!
//! The bitmap counts what writes mark ([`Array::bitmap_write`]): array sectors for the
//! mirrors (raid1, raid10), whole chunk rows of member sectors for raid4/5/6. A range of
//! the array is dirty exactly when a bit its writes would set is set, in memory (bits not
//! yet on disk included).

use crate::array::Array;
use uraid_core::geometry::Personality;
use uraid_core::SECTOR_BYTES;

/// Units looked at per call at most: a client asking about a whole large array gets the
/// first part and asks again from there, as the NBD spec allows.
const MAX_UNITS: u64 = 65536;

/// One run of the array's dirty bitmap status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyExtent {
    /// Bytes it covers.
    pub len_bytes: u64,
    /// A write may have changed it since its bitmap bit was last cleared.
    pub dirty: bool,
}

impl Array {
    /// The write-intent bitmap's view of `len` bytes at `offset` (in range): runs in order
    /// from `offset`, covering at least its first byte and at most `len` bytes, dirty where
    /// the bitmap (in memory) has a bit set that a write to the run would set. The unit is
    /// one bitmap chunk of array sectors for raid1/raid10, and for raid4/5/6 the chunk rows
    /// one bitmap chunk of member sectors covers (times the data disks). `None` when the
    /// array has no bitmap.
    pub fn dirty_extents(&self, offset: u64, len: u64) -> Option<Vec<DirtyExtent>> {
        let end = offset.saturating_add(len).min(self.size_bytes());
        let meta = self.meta();
        let bitmap = meta.bitmap.as_ref()?;
        let bitmap_chunk = bitmap.chunk_sectors().max(1);
        let unit_sectors = match &self.personality {
            Personality::Parity(g) => {
                bitmap_chunk.max(self.geometry.chunk_sectors.max(1)) * g.data_disks() as u64
            }
            _ => bitmap_chunk,
        };
        let unit = unit_sectors * SECTOR_BYTES;
        let mut out: Vec<DirtyExtent> = Vec::new();
        let mut at = offset;
        let mut units = 0;
        while at < end && units < MAX_UNITS {
            let u = at / unit;
            let next = ((u + 1) * unit).min(end);
            let first = at / SECTOR_BYTES;
            let last = (next - 1) / SECTOR_BYTES;
            let dirty = self.bitmap_dirty_for(bitmap, first, last - first + 1);
            match out.last_mut() {
                Some(e) if e.dirty == dirty => e.len_bytes += next - at,
                _ => out.push(DirtyExtent {
                    len_bytes: next - at,
                    dirty,
                }),
            }
            at = next;
            units += 1;
        }
        Some(out)
    }
}
