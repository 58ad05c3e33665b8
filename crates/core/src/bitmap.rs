//! md write-intent bitmap superblock codec (see docs/FORMAT.md).
//!
//! An internal bitmap sits `bitmap_offset` sectors from the v1.2 superblock: a 256-byte
//! `bitmap_super_t`, then one bit per bitmap chunk of the sync range (1 = dirty: a write may
//! be in flight, the chunk must be resynced), bit `i` in byte `i / 8`, bit `i % 8`
//! (little-endian bit order, bitmap version 4). The area is rounded up to 4 KiB.
//!
//! This module only encodes, decodes and does arithmetic; it does no IO.

use crate::superblock::le;
use thiserror::Error;

/// "bitm" read as a little-endian u32.
pub const BITMAP_MAGIC: u32 = 0x6d74_6962;
/// Version 3: bits in host order (little-endian on the hosts uraid runs on).
pub const BITMAP_MAJOR_HOSTENDIAN: u32 = 3;
/// Version 4: bits in little-endian order. What mdadm and uraid write.
pub const BITMAP_MAJOR_HI: u32 = 4;
/// Version 5: clustered md, one bitmap per node. Not supported.
pub const BITMAP_MAJOR_CLUSTERED: u32 = 5;
/// Size of `bitmap_super_t`; the bits follow it.
pub const BITMAP_SUPER_BYTES: usize = 256;
/// The bitmap area is written in whole 4 KiB blocks.
pub const BITMAP_ALIGN_BYTES: u64 = 4096;
/// md's smallest bitmap chunk (it must hold at least one sector).
pub const MIN_CHUNK_BYTES: u32 = 512;
/// mdadm's smallest chunk when it chooses one (sub-page chunks "don't work yet").
pub const MIN_DEFAULT_CHUNK_BYTES: u64 = 4096;
/// mdadm's default internal bitmap chunk floor: 64 MiB.
pub const DEFAULT_CHUNK_FLOOR_BYTES: u64 = 64 * 1024 * 1024;
/// mdadm's default `daemon_sleep` (seconds between bitmap flushes).
pub const DEFAULT_DAEMON_SLEEP_SECS: u32 = 5;
/// Largest `write_behind` md accepts (its COUNTER_MAX).
pub const MAX_WRITE_BEHIND: u32 = 16383;
/// Bitmap room mdadm uses when it chooses the chunk and the reserve is larger: 128 KiB.
pub const DEFAULT_ROOM_CAP_SECTORS: u64 = 128 * 2;

/// `state` bits (md's `enum bitmap_state`, as bit masks).
pub const BITMAP_STATE_STALE: u32 = 1 << 1;
pub const BITMAP_STATE_WRITE_ERROR: u32 = 1 << 2;
pub const BITMAP_STATE_HOSTENDIAN: u32 = 1 << 15;

/// Byte offsets of `bitmap_super_t` (md-bitmap.h).
pub(crate) mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const UUID: usize = 8;
    pub const EVENTS: usize = 24;
    pub const EVENTS_CLEARED: usize = 32;
    pub const SYNC_SIZE: usize = 40;
    pub const STATE: usize = 48;
    pub const CHUNKSIZE: usize = 52;
    pub const DAEMON_SLEEP: usize = 56;
    pub const WRITE_BEHIND: usize = 60;
    pub const SECTORS_RESERVED: usize = 64;
    pub const NODES: usize = 68;
    pub const CLUSTER_NAME: usize = 72;
    pub const PAD: usize = 136;
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BitmapError {
    #[error("no md bitmap (magic {found:#010x}, expected {BITMAP_MAGIC:#010x})")]
    BadMagic { found: u32 },
    #[error("unsupported bitmap version {0} (uraid reads 3 and 4)")]
    BadVersion(u32),
    #[error("bitmap superblock is truncated: {got} bytes, need {need}")]
    Truncated { got: usize, need: usize },
    #[error("bitmap field {field} is invalid: {why}")]
    Invalid { field: &'static str, why: String },
}

/// md's `bitmap_super_t`, decoded. Names follow md.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapSuper {
    pub version: u32,
    /// Must equal the array's `set_uuid` (for 0.90, its words in the writer's byte order).
    pub uuid: [u8; 16],
    /// Array events when the bitmap was last written; older than the superblock's means
    /// the bitmap is stale.
    pub events: u64,
    /// Events when bits were last cleared.
    pub events_cleared: u64,
    /// Sectors covered (the component size; for raid10 the array size).
    pub sync_size: u64,
    pub state: u32,
    /// Bytes of array covered by one bit; a power of two, at least 512.
    pub chunksize: u32,
    /// Seconds between flushes of clean bits.
    pub daemon_sleep: u32,
    pub write_behind: u32,
    /// Sectors reserved for the bitmap; 0 means "unknown" (mdadm writes 0, md fills it in).
    pub sectors_reserved: u32,
    pub nodes: u32,
    /// NUL padded; kept as raw bytes so that a record decodes and encodes unchanged.
    pub cluster_name: [u8; 64],
}

impl BitmapSuper {
    /// A version-4 bitmap superblock as mdadm makes one at create: events 0, state 0,
    /// no write-behind, no nodes.
    pub fn new(
        uuid: [u8; 16],
        sync_size_sectors: u64,
        chunk_bytes: u32,
        daemon_sleep_secs: u32,
    ) -> Result<BitmapSuper, BitmapError> {
        let bms = BitmapSuper {
            version: BITMAP_MAJOR_HI,
            uuid,
            events: 0,
            events_cleared: 0,
            sync_size: sync_size_sectors,
            state: 0,
            chunksize: chunk_bytes,
            daemon_sleep: daemon_sleep_secs,
            write_behind: 0,
            sectors_reserved: 0,
            nodes: 0,
            cluster_name: [0; 64],
        };
        bms.validate()?;
        Ok(bms)
    }

    /// Decodes the bitmap superblock at the start of `buf`; never panics.
    pub fn decode(buf: &[u8]) -> Result<BitmapSuper, BitmapError> {
        if buf.len() < BITMAP_SUPER_BYTES {
            return Err(BitmapError::Truncated {
                got: buf.len(),
                need: BITMAP_SUPER_BYTES,
            });
        }
        let b = &buf[..BITMAP_SUPER_BYTES];
        let magic = le::u32_at(b, off::MAGIC);
        if magic != BITMAP_MAGIC {
            return Err(BitmapError::BadMagic { found: magic });
        }
        let mut cluster_name = [0u8; 64];
        cluster_name.copy_from_slice(&b[off::CLUSTER_NAME..off::CLUSTER_NAME + 64]);
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[off::UUID..off::UUID + 16]);
        let bms = BitmapSuper {
            version: le::u32_at(b, off::VERSION),
            uuid,
            events: le::u64_at(b, off::EVENTS),
            events_cleared: le::u64_at(b, off::EVENTS_CLEARED),
            sync_size: le::u64_at(b, off::SYNC_SIZE),
            state: le::u32_at(b, off::STATE),
            chunksize: le::u32_at(b, off::CHUNKSIZE),
            daemon_sleep: le::u32_at(b, off::DAEMON_SLEEP),
            write_behind: le::u32_at(b, off::WRITE_BEHIND),
            sectors_reserved: le::u32_at(b, off::SECTORS_RESERVED),
            nodes: le::u32_at(b, off::NODES),
            cluster_name,
        };
        bms.validate()?;
        Ok(bms)
    }

    /// Encodes the 256-byte record (the pad is zero).
    ///
    /// # Panics
    /// If the record is invalid ([`BitmapSuper::validate`]).
    pub fn encode(&self) -> [u8; BITMAP_SUPER_BYTES] {
        if let Err(e) = self.validate() {
            panic!("refusing to encode an invalid md bitmap superblock: {e}");
        }
        let mut b = [0u8; BITMAP_SUPER_BYTES];
        le::put(&mut b, off::MAGIC, &BITMAP_MAGIC.to_le_bytes());
        le::put(&mut b, off::VERSION, &self.version.to_le_bytes());
        le::put(&mut b, off::UUID, &self.uuid);
        le::put(&mut b, off::EVENTS, &self.events.to_le_bytes());
        le::put(
            &mut b,
            off::EVENTS_CLEARED,
            &self.events_cleared.to_le_bytes(),
        );
        le::put(&mut b, off::SYNC_SIZE, &self.sync_size.to_le_bytes());
        le::put(&mut b, off::STATE, &self.state.to_le_bytes());
        le::put(&mut b, off::CHUNKSIZE, &self.chunksize.to_le_bytes());
        le::put(&mut b, off::DAEMON_SLEEP, &self.daemon_sleep.to_le_bytes());
        le::put(&mut b, off::WRITE_BEHIND, &self.write_behind.to_le_bytes());
        le::put(
            &mut b,
            off::SECTORS_RESERVED,
            &self.sectors_reserved.to_le_bytes(),
        );
        le::put(&mut b, off::NODES, &self.nodes.to_le_bytes());
        le::put(&mut b, off::CLUSTER_NAME, &self.cluster_name);
        debug_assert!(b[off::PAD..].iter().all(|&x| x == 0));
        b
    }

    /// The checks md makes when it loads a bitmap (md_bitmap_read_sb), plus a sync range
    /// whose byte size fits in a u64.
    pub fn validate(&self) -> Result<(), BitmapError> {
        let invalid = |field, why: String| Err(BitmapError::Invalid { field, why });
        if self.version != BITMAP_MAJOR_HI && self.version != BITMAP_MAJOR_HOSTENDIAN {
            return Err(BitmapError::BadVersion(self.version));
        }
        if self.chunksize < MIN_CHUNK_BYTES || !self.chunksize.is_power_of_two() {
            return invalid(
                "chunksize",
                format!(
                    "{} bytes is below 512 or not a power of two",
                    self.chunksize
                ),
            );
        }
        if self.daemon_sleep == 0 {
            return invalid("daemon_sleep", "0 seconds".into());
        }
        if self.write_behind > MAX_WRITE_BEHIND {
            return invalid(
                "write_behind",
                format!("{} > {MAX_WRITE_BEHIND}", self.write_behind),
            );
        }
        if self.sync_size > u64::MAX / 512 {
            return invalid("sync_size", format!("{} sectors overflows", self.sync_size));
        }
        if self.nodes != 0 {
            return invalid(
                "nodes",
                format!("{} (clustered md is not supported)", self.nodes),
            );
        }
        Ok(())
    }

    /// Number of bits (bitmap chunks) covering `sync_size`.
    pub fn chunks(&self) -> u64 {
        chunks_for(self.sync_size, self.chunksize)
    }

    /// Bytes of bits after the superblock.
    pub fn bits_bytes(&self) -> u64 {
        bits_bytes(self.chunks())
    }

    /// Bytes of the whole bitmap area (superblock + bits, rounded up to 4 KiB): what mdadm
    /// reserves and writes.
    pub fn space_bytes(&self) -> u64 {
        space_bytes(self.sync_size, self.chunksize)
    }

    /// Sectors per bitmap chunk.
    pub fn chunk_sectors(&self) -> u64 {
        u64::from(self.chunksize) / 512
    }

    /// The bitmap chunk (bit index) holding sync-range `sector`.
    pub fn chunk_of_sector(&self, sector: u64) -> u64 {
        sector / self.chunk_sectors()
    }

    /// `cluster_name` up to its first NUL, lossily as text.
    pub fn cluster_name_str(&self) -> String {
        let end = self.cluster_name.iter().position(|&c| c == 0).unwrap_or(64);
        String::from_utf8_lossy(&self.cluster_name[..end]).into_owned()
    }
}

/// Bits needed for `sync_size_sectors` at `chunk_bytes` per bit (mdadm's `bitmap_bits`):
/// the last, partial chunk counts. `chunk_bytes` must not be 0.
pub fn chunks_for(sync_size_sectors: u64, chunk_bytes: u32) -> u64 {
    assert!(chunk_bytes != 0, "bitmap chunk of 0 bytes");
    (u128::from(sync_size_sectors) * 512).div_ceil(u128::from(chunk_bytes)) as u64
}

/// Bytes holding `chunks` bits.
pub fn bits_bytes(chunks: u64) -> u64 {
    chunks.div_ceil(8)
}

/// Bytes of a bitmap area for this sync range and chunk: superblock + bits, rounded up to
/// 4 KiB (mdadm's `calc_bitmap_size(bms, 4096)`).
pub fn space_bytes(sync_size_sectors: u64, chunk_bytes: u32) -> u64 {
    let bytes = BITMAP_SUPER_BYTES as u64 + bits_bytes(chunks_for(sync_size_sectors, chunk_bytes));
    bytes.div_ceil(BITMAP_ALIGN_BYTES) * BITMAP_ALIGN_BYTES
}

/// mdadm's default chunk for an internal bitmap (`add_internal_bitmap1` without --bitmap-chunk):
/// the smallest power of two from 4 KiB whose bits fit `room_sectors` (capped at 128 KiB),
/// but at least 64 MiB. `None` when there is no room at all.
///
/// At v1.2 create the room is [`crate::superblock::default_bitmap_space_sectors`] of the
/// component size (the bad block log's 8 sectors are added to the room and taken off again).
pub fn default_chunk_bytes(sync_size_sectors: u64, room_sectors: u64) -> Option<u32> {
    let room = room_sectors.min(DEFAULT_ROOM_CAP_SECTORS);
    if room <= 1 {
        return None;
    }
    let max_bits = (room * 512 - BITMAP_SUPER_BYTES as u64) * 8;
    let mut chunk = MIN_DEFAULT_CHUNK_BYTES;
    // mdadm counts one spare bit and halves with rounding up; kept so the choice matches.
    let mut bits = u128::from(sync_size_sectors) * 512 / u128::from(chunk) + 1;
    while bits > u128::from(max_bits) {
        chunk *= 2;
        bits = bits.div_ceil(2);
    }
    u32::try_from(chunk.max(DEFAULT_CHUNK_FLOOR_BYTES)).ok()
}

/// Whether bitmap chunk `chunk` is dirty in `bits` (the bytes after the superblock).
/// Bits past the end read as dirty: md would resync what it cannot track.
pub fn is_dirty(bits: &[u8], chunk: u64) -> bool {
    match usize::try_from(chunk / 8).ok().and_then(|i| bits.get(i)) {
        Some(&byte) => byte & (1 << (chunk % 8)) != 0,
        None => true,
    }
}

/// Marks bitmap chunk `chunk` dirty or clean in `bits`.
///
/// # Panics
/// If `chunk` is beyond `bits`.
pub fn set_dirty(bits: &mut [u8], chunk: u64, dirty: bool) {
    let i = usize::try_from(chunk / 8).expect("bitmap chunk index overflows usize");
    let mask = 1u8 << (chunk % 8);
    if dirty {
        bits[i] |= mask;
    } else {
        bits[i] &= !mask;
    }
}

/// Number of dirty chunks among the first `chunks` bits.
pub fn count_dirty(bits: &[u8], chunks: u64) -> u64 {
    (0..chunks).filter(|&c| is_dirty(bits, c)).count() as u64
}

/// The bitmap area mdadm writes at create: superblock, then every byte 0xff (all chunks
/// dirty, so the first assembly resyncs everything) up to [`BitmapSuper::space_bytes`].
pub fn initial_area(bms: &BitmapSuper) -> Vec<u8> {
    let len = usize::try_from(bms.space_bytes()).expect("bitmap area overflows usize");
    let mut area = vec![0xffu8; len];
    area[..BITMAP_SUPER_BYTES].copy_from_slice(&bms.encode());
    area
}

/// The room mdadm finds for an internal bitmap added to an existing 1.0 member (`mdadm
/// --grow --bitmap=internal`, `add_internal_bitmap1` on a running array): `(room, log)`,
/// the sectors between the data's end (`data_offset + data_size`) and the superblock less
/// the bad block log below the superblock, and that log's sectors (at least 8, more when
/// `bblog_offset` reaches further down). `None` when under 6 sectors lie there: mdadm
/// then puts the bitmap in the 3 KiB after the superblock instead.
pub fn v10_grow_bitmap_room(sb: &crate::superblock::Superblock) -> Option<(u64, u64)> {
    let raw = sb
        .super_offset
        .checked_sub(sb.data_offset.checked_add(sb.data_size)?)?;
    if raw < 6 {
        return None;
    }
    let mut log = u64::from(sb.bblog_size).max(u64::from(crate::superblock::BBLOG_SECTORS));
    if sb.bblog_offset < 0 {
        log = log.max(u64::from(sb.bblog_offset.unsigned_abs()));
    }
    Some((raw.saturating_sub(log), log))
}

/// `bitmap_offset` mdadm gives a bitmap added to a 1.0 member ([`v10_grow_bitmap_room`]):
/// the area ends where the log below the superblock begins. The area is mdadm's count,
/// `sync_size * 512 / chunk + 1` bits after the 256-byte bitmap superblock, in whole 4 KiB
/// blocks (one spare bit, so it can be a block more than [`space_bytes`]'s exact size).
pub fn v10_grow_bitmap_offset(sync_size_sectors: u64, chunk_bytes: u32, log: u64) -> Option<i32> {
    let bits = u128::from(sync_size_sectors) * 512 / u128::from(chunk_bytes.max(1)) + 1;
    let bytes = bits.div_ceil(8) + BITMAP_SUPER_BYTES as u128;
    let area = u64::try_from(bytes.div_ceil(4096) * 8).ok()?;
    i32::try_from(area.checked_add(log)?).ok().map(|b| -b)
}
