//! The internal write-intent bitmap, kept conservatively: while the array is dirty every
//! chunk is marked dirty, and a clean stop clears them all. This is always safe (an unclean
//! stop makes Linux md or uraid resync the whole array, never too little); per-chunk
//! tracking that resyncs only written regions builds on this.

use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::member::Member;
use uraid_core::bitmap::{self as bm, BitmapSuper};
use uraid_core::superblock::Superblock;
use uraid_core::SECTOR_BYTES;

pub struct BitmapState {
    pub sb: BitmapSuper,
    /// Sectors from the superblock to the bitmap (md's bitmap_offset).
    pub offset_sectors: i64,
    /// Whether the bits on disk are all set.
    bits_dirty: Option<bool>,
}

impl BitmapState {
    pub fn new(sb: BitmapSuper, offset_sectors: i64) -> BitmapState {
        BitmapState {
            sb,
            offset_sectors,
            bits_dirty: None,
        }
    }

    fn area_offset(&self, member_sb: &Superblock) -> u64 {
        ((member_sb.super_offset as i64 + self.offset_sectors) as u64) * SECTOR_BYTES
    }

    /// Read the bitmap of a member whose superblock has FEATURE_BITMAP_OFFSET.
    pub fn load(dev: &dyn Member, sb: &Superblock) -> Result<Option<BitmapState>, ArrayError> {
        let Some(sector) = sb.bitmap_sector() else {
            return Ok(None);
        };
        let mut buf = AlignedBuf::new(4096);
        dev.read_at(&mut buf, sector * SECTOR_BYTES)?;
        let bms = BitmapSuper::decode(&buf)
            .map_err(|e| ArrayError::Assemble(format!("{}: internal bitmap: {e}", dev.name())))?;
        if bms.uuid != sb.set_uuid {
            return Err(ArrayError::Assemble(format!(
                "{}: the internal bitmap belongs to another array",
                dev.name()
            )));
        }
        Ok(Some(BitmapState::new(bms, i64::from(sb.bitmap_offset))))
    }

    /// Write the bitmap superblock (events in step with the array) and, when the dirty
    /// state changed, the bits.
    pub fn write(
        &mut self,
        dev: &dyn Member,
        member_sb: &Superblock,
        events: u64,
        dirty: bool,
    ) -> Result<(), ArrayError> {
        self.sb.events = events;
        if !dirty {
            self.sb.events_cleared = events;
        }
        let with_bits = self.bits_dirty != Some(dirty);
        let len = if with_bits {
            self.sb.space_bytes() as usize
        } else {
            4096
        };
        let mut buf = AlignedBuf::new(len);
        if with_bits {
            let fill = if dirty { 0xff } else { 0 };
            buf[bm::BITMAP_SUPER_BYTES..].fill(fill);
        } else {
            // Keep the bits that share the first block with the superblock.
            dev.read_at(&mut buf, self.area_offset(member_sb))?;
        }
        buf[..bm::BITMAP_SUPER_BYTES].copy_from_slice(&self.sb.encode());
        dev.write_at(&buf, self.area_offset(member_sb))?;
        Ok(())
    }

    /// Called after all members were written.
    pub fn written(&mut self, dirty: bool) {
        self.bits_dirty = Some(dirty);
    }
}
