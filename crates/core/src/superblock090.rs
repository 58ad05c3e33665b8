//! md metadata 0.90 superblock decoder (read support only; see docs/FORMAT.md).
//!
//! A 4 KiB record of 1024 u32 words in the byte order of the host that wrote it, in the last
//! 64 KiB-aligned 64 KiB of the device. It describes at most 27 devices. Pure: no IO.

use thiserror::Error;

/// `md_magic`, the first word, in the writer's byte order.
pub const MD_SB_MAGIC: u32 = 0xa92b_4efc;
/// Bytes of the record (md's MD_SB_BYTES).
pub const SB090_BYTES: usize = 4096;
/// Devices a 0.90 superblock can describe (md's MD_SB_DISKS).
pub const SB090_DISKS: usize = 27;
/// The reserved area at the end of the device that holds the superblock (MD_RESERVED_SECTORS).
pub const SB090_RESERVED_SECTORS: u64 = 128;

/// Word indexes (md_p.h's `mdp_super_t`).
mod w {
    pub const MAGIC: usize = 0;
    pub const MAJOR: usize = 1;
    pub const MINOR: usize = 2;
    pub const PATCH: usize = 3;
    pub const UUID0: usize = 5;
    pub const CTIME: usize = 6;
    pub const LEVEL: usize = 7;
    pub const SIZE: usize = 8;
    pub const NR_DISKS: usize = 9;
    pub const RAID_DISKS: usize = 10;
    pub const MD_MINOR: usize = 11;
    pub const NOT_PERSISTENT: usize = 12;
    pub const UUID1: usize = 13;
    pub const UTIME: usize = 32;
    pub const STATE: usize = 33;
    pub const ACTIVE: usize = 34;
    pub const WORKING: usize = 35;
    pub const FAILED: usize = 36;
    pub const SPARE: usize = 37;
    pub const CSUM: usize = 38;
    /// events and cp_events: (lo, hi) on a little-endian writer, (hi, lo) on a big-endian one.
    pub const EVENTS: usize = 39;
    pub const CP_EVENTS: usize = 41;
    pub const RECOVERY_CP: usize = 43;
    pub const RESHAPE_POSITION: usize = 44;
    pub const NEW_LEVEL: usize = 46;
    pub const DELTA_DISKS: usize = 47;
    pub const NEW_LAYOUT: usize = 48;
    pub const NEW_CHUNK: usize = 49;
    pub const LAYOUT: usize = 64;
    pub const CHUNK: usize = 65;
    pub const DISKS: usize = 128;
    pub const DESCRIPTOR_WORDS: usize = 32;
    pub const THIS_DISK: usize = DISKS + super::SB090_DISKS * DESCRIPTOR_WORDS;
}

/// `state` bits of the superblock.
pub const SB090_STATE_CLEAN: u32 = 1 << 0;
pub const SB090_STATE_ERRORS: u32 = 1 << 1;
pub const SB090_STATE_BITMAP_PRESENT: u32 = 1 << 8;
/// Device descriptor `state` bits.
pub const DISK_FAULTY: u32 = 1 << 0;
pub const DISK_ACTIVE: u32 = 1 << 1;
pub const DISK_SYNC: u32 = 1 << 2;
pub const DISK_REMOVED: u32 = 1 << 3;
pub const DISK_WRITEMOSTLY: u32 = 1 << 9;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteOrder {
    Little,
    Big,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Sb090Error {
    #[error("0.90 superblock is truncated: {0} bytes, need 4096")]
    Truncated(usize),
    #[error("no md 0.90 superblock (magic {0:#010x} in neither byte order)")]
    BadMagic(u32),
    #[error("not a 0.90 superblock: version {major}.{minor} (uraid reads 0.90 and 0.91)")]
    BadVersion { major: u32, minor: u32 },
    #[error("0.90 superblock checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("0.90 superblock field {field} is invalid: {why}")]
    Invalid { field: &'static str, why: String },
}

/// One of the 27 device descriptors (`mdp_disk_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Disk090 {
    pub number: u32,
    pub major: u32,
    pub minor: u32,
    pub raid_disk: u32,
    pub state: u32,
}

/// The fields of md's `mdp_super_t` uraid reads, decoded. Names follow md.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock090 {
    pub byte_order: ByteOrder,
    pub major_version: u32,
    pub minor_version: u32,
    pub patch_version: u32,
    /// `set_uuid0..3` as md and mdadm print them (`%08x:%08x:%08x:%08x`).
    pub set_uuid: [u32; 4],
    pub ctime: u32,
    pub level: i32,
    /// Component size in KiB.
    pub size_kib: u32,
    pub nr_disks: u32,
    pub raid_disks: u32,
    pub md_minor: u32,
    pub not_persistent: u32,
    pub utime: u32,
    pub state: u32,
    pub active_disks: u32,
    pub working_disks: u32,
    pub failed_disks: u32,
    pub spare_disks: u32,
    pub sb_csum: u32,
    pub events: u64,
    pub cp_events: u64,
    pub recovery_cp: u32,
    /// Valid for minor version 91 (a reshape).
    pub reshape_position: u64,
    pub new_level: i32,
    pub delta_disks: i32,
    pub new_layout: u32,
    pub new_chunk: u32,
    pub layout: u32,
    /// Chunk in bytes.
    pub chunk_size: u32,
    pub disks: [Disk090; SB090_DISKS],
    pub this_disk: Disk090,
}

/// Sector of the 0.90 superblock on a device of `device_sectors` (md's MD_NEW_SIZE_SECTORS:
/// the last 64 KiB-aligned 64 KiB), or `None` when the device is smaller than that.
pub fn sb090_offset_sectors(device_sectors: u64) -> Option<u64> {
    (device_sectors & !(SB090_RESERVED_SECTORS - 1)).checked_sub(SB090_RESERVED_SECTORS)
}

/// md's `calc_sb_csum`: the 1024 words in the record's byte order, `sb_csum` taken as 0,
/// summed into a u64 and folded once (low + high, wrapping in 32 bits).
pub fn checksum090(buf: &[u8], order: ByteOrder) -> u32 {
    let sum: u64 = (0..SB090_BYTES / 4)
        .filter(|&i| i != w::CSUM)
        .map(|i| u64::from(word(buf, i, order)))
        .sum();
    (sum as u32).wrapping_add((sum >> 32) as u32)
}

fn word(buf: &[u8], i: usize, order: ByteOrder) -> u32 {
    let b = [buf[4 * i], buf[4 * i + 1], buf[4 * i + 2], buf[4 * i + 3]];
    match order {
        ByteOrder::Little => u32::from_le_bytes(b),
        ByteOrder::Big => u32::from_be_bytes(b),
    }
}

impl Superblock090 {
    /// Decodes the 4 KiB at the superblock's sector. The byte order is the one in which the
    /// magic reads right; checks version (0.90/0.91), checksum and the device counts.
    pub fn decode(buf: &[u8]) -> Result<Superblock090, Sb090Error> {
        if buf.len() < SB090_BYTES {
            return Err(Sb090Error::Truncated(buf.len()));
        }
        let order = if word(buf, w::MAGIC, ByteOrder::Little) == MD_SB_MAGIC {
            ByteOrder::Little
        } else if word(buf, w::MAGIC, ByteOrder::Big) == MD_SB_MAGIC {
            ByteOrder::Big
        } else {
            return Err(Sb090Error::BadMagic(word(buf, w::MAGIC, ByteOrder::Little)));
        };
        let at = |i: usize| word(buf, i, order);
        let (major, minor) = (at(w::MAJOR), at(w::MINOR));
        if major != 0 || !(90..=91).contains(&minor) {
            return Err(Sb090Error::BadVersion { major, minor });
        }
        let stored = at(w::CSUM);
        let computed = checksum090(buf, order);
        if stored != computed {
            return Err(Sb090Error::BadChecksum { stored, computed });
        }
        // The writer's u64 counters: low word first on little-endian hosts.
        let pair = |i: usize| -> u64 {
            let (lo, hi) = match order {
                ByteOrder::Little => (at(i), at(i + 1)),
                ByteOrder::Big => (at(i + 1), at(i)),
            };
            (u64::from(hi) << 32) | u64::from(lo)
        };
        let disk = |base: usize| Disk090 {
            number: at(base),
            major: at(base + 1),
            minor: at(base + 2),
            raid_disk: at(base + 3),
            state: at(base + 4),
        };
        let sb = Superblock090 {
            byte_order: order,
            major_version: major,
            minor_version: minor,
            patch_version: at(w::PATCH),
            set_uuid: [
                at(w::UUID0),
                at(w::UUID1),
                at(w::UUID1 + 1),
                at(w::UUID1 + 2),
            ],
            ctime: at(w::CTIME),
            level: at(w::LEVEL) as i32,
            size_kib: at(w::SIZE),
            nr_disks: at(w::NR_DISKS),
            raid_disks: at(w::RAID_DISKS),
            md_minor: at(w::MD_MINOR),
            not_persistent: at(w::NOT_PERSISTENT),
            utime: at(w::UTIME),
            state: at(w::STATE),
            active_disks: at(w::ACTIVE),
            working_disks: at(w::WORKING),
            failed_disks: at(w::FAILED),
            spare_disks: at(w::SPARE),
            sb_csum: stored,
            events: pair(w::EVENTS),
            cp_events: pair(w::CP_EVENTS),
            recovery_cp: at(w::RECOVERY_CP),
            reshape_position: pair(w::RESHAPE_POSITION),
            new_level: at(w::NEW_LEVEL) as i32,
            delta_disks: at(w::DELTA_DISKS) as i32,
            new_layout: at(w::NEW_LAYOUT),
            new_chunk: at(w::NEW_CHUNK),
            layout: at(w::LAYOUT),
            chunk_size: at(w::CHUNK),
            disks: std::array::from_fn(|i| disk(w::DISKS + i * w::DESCRIPTOR_WORDS)),
            this_disk: disk(w::THIS_DISK),
        };
        let invalid = |field, why: String| Err(Sb090Error::Invalid { field, why });
        if sb.raid_disks as usize > SB090_DISKS || sb.nr_disks as usize > SB090_DISKS {
            return invalid(
                "raid_disks",
                format!(
                    "raid_disks {} / nr_disks {} exceed the {SB090_DISKS} devices 0.90 describes",
                    sb.raid_disks, sb.nr_disks
                ),
            );
        }
        if sb.this_disk.number as usize >= SB090_DISKS {
            return invalid(
                "this_disk",
                format!(
                    "device number {} is not below {SB090_DISKS}",
                    sb.this_disk.number
                ),
            );
        }
        Ok(sb)
    }

    /// Clean: md sets MD_SB_CLEAN on a clean stop.
    pub fn is_clean(&self) -> bool {
        self.state & SB090_STATE_CLEAN != 0
    }

    /// The UUID as mdadm prints it.
    pub fn uuid_string(&self) -> String {
        let [a, b, c, d] = self.set_uuid;
        format!("{a:08x}:{b:08x}:{c:08x}:{d:08x}")
    }

    /// Component size in sectors.
    pub fn size_sectors(&self) -> u64 {
        u64::from(self.size_kib) * 2
    }
}
