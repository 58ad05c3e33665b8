//! md metadata 0.90 superblock codec (see docs/FORMAT.md).
//!
//! A 4 KiB record of 1024 u32 words in the byte order of the host that wrote it, in the last
//! 64 KiB-aligned 64 KiB of the device. It describes at most 27 devices. Pure: no IO.
//!
//! The engine keeps every superblock in the v1 model ([`Superblock`]); a 0.90 member is
//! converted at the edge: [`Superblock090::to_v1`] when read, [`Superblock090::from_v1`]
//! (with what the v1 model does not hold, [`Sb090Context`]) before it is written. What the
//! v1 model can say and 0.90 cannot (a bad block log, a journal, a reshape that moves the
//! data offset, a recovery offset...) is refused by name in `from_v1`, never dropped. A
//! reshape in place (md's 0.91: minor_version 91 with reshape_position, new_level,
//! delta_disks, new_layout and new_chunk) is carried both ways.

use crate::superblock::{
    Superblock, DEVFLAG_FAILFAST, DEVFLAG_WRITE_MOSTLY, FEATURE_BITMAP_OFFSET, FEATURE_NEW_OFFSET,
    FEATURE_RAID0_LAYOUT, FEATURE_RECOVERY_OFFSET, FEATURE_REPLACEMENT, FEATURE_RESHAPE_ACTIVE,
    FEATURE_RESHAPE_BACKWARDS, MAX_SECTOR, ROLE_FAULTY, ROLE_MAX, ROLE_SPARE,
};
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
pub const DISK_FAILFAST: u32 = 1 << 10;
/// Sectors from the superblock to its internal bitmap (md's default_offset: MD_SB_BYTES).
pub const SB090_BITMAP_OFFSET_SECTORS: i32 = 8;
/// Sectors the internal bitmap may fill after its offset: the rest of the 64 KiB reserved
/// area (mdadm's 60 KiB limit, the bitmap superblock included).
pub const SB090_BITMAP_ROOM_SECTORS: u64 =
    SB090_RESERVED_SECTORS - SB090_BITMAP_OFFSET_SECTORS as u64;
/// The most a 0.90 member of a redundant level may use: mdadm refuses more than 2 TiB
/// (kernels before 3.1 misread larger sizes), in sectors.
pub const SB090_MAX_MEMBER_SECTORS: u64 = 2 << 31;

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
        Superblock090::decode_checked(buf, true).map(|(sb, _)| sb)
    }

    /// [`Superblock090::decode`] without the checksum test, for `examine` (as mdadm shows a
    /// superblock whose checksum is wrong): the record and the checksum its bytes have.
    pub fn decode_any_checksum(buf: &[u8]) -> Result<(Superblock090, u32), Sb090Error> {
        Superblock090::decode_checked(buf, false)
    }

    fn decode_checked(buf: &[u8], check: bool) -> Result<(Superblock090, u32), Sb090Error> {
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
        if check && stored != computed {
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
        sb.validate()?;
        Ok((sb, computed))
    }

    /// The checks [`Superblock090::decode`] makes after the checksum, and
    /// [`Superblock090::encode`] before it writes.
    pub fn validate(&self) -> Result<(), Sb090Error> {
        let sb = self;
        let invalid = |field, why: String| Err(Sb090Error::Invalid { field, why });
        if sb.major_version != 0 || !(90..=91).contains(&sb.minor_version) {
            return Err(Sb090Error::BadVersion {
                major: sb.major_version,
                minor: sb.minor_version,
            });
        }
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
        Ok(())
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

fn put_word(buf: &mut [u8], i: usize, v: u32, order: ByteOrder) {
    let b = match order {
        ByteOrder::Little => v.to_le_bytes(),
        ByteOrder::Big => v.to_be_bytes(),
    };
    buf[4 * i..4 * i + 4].copy_from_slice(&b);
}

impl Superblock090 {
    /// Encodes the record into [`SB090_BYTES`] bytes in its `byte_order`, words md does not
    /// define (and the `gvalid_words`, which md ignores) zero, with md's checksum
    /// (`self.sb_csum` is ignored): the inverse of [`Superblock090::decode`].
    ///
    /// # Panics
    /// If the record is invalid ([`Superblock090::validate`]): writing it would corrupt the
    /// member's metadata, a programmer error.
    pub fn encode(&self) -> Vec<u8> {
        if let Err(e) = self.validate() {
            panic!("refusing to encode an invalid md 0.90 superblock: {e}");
        }
        let order = self.byte_order;
        let mut b = vec![0u8; SB090_BYTES];
        let mut p = |i: usize, v: u32| put_word(&mut b, i, v, order);
        // The writer's u64 counters: low word first on little-endian hosts (md's
        // events_lo/events_hi are declared in that order per byte order).
        let pair = |v: u64| -> [u32; 2] {
            let (lo, hi) = (v as u32, (v >> 32) as u32);
            match order {
                ByteOrder::Little => [lo, hi],
                ByteOrder::Big => [hi, lo],
            }
        };
        p(w::MAGIC, MD_SB_MAGIC);
        p(w::MAJOR, self.major_version);
        p(w::MINOR, self.minor_version);
        p(w::PATCH, self.patch_version);
        p(w::UUID0, self.set_uuid[0]);
        p(w::CTIME, self.ctime);
        p(w::LEVEL, self.level as u32);
        p(w::SIZE, self.size_kib);
        p(w::NR_DISKS, self.nr_disks);
        p(w::RAID_DISKS, self.raid_disks);
        p(w::MD_MINOR, self.md_minor);
        p(w::NOT_PERSISTENT, self.not_persistent);
        for k in 0..3 {
            p(w::UUID1 + k, self.set_uuid[k + 1]);
        }
        p(w::UTIME, self.utime);
        p(w::STATE, self.state);
        p(w::ACTIVE, self.active_disks);
        p(w::WORKING, self.working_disks);
        p(w::FAILED, self.failed_disks);
        p(w::SPARE, self.spare_disks);
        for (at, v) in [
            (w::EVENTS, self.events),
            (w::CP_EVENTS, self.cp_events),
            (w::RESHAPE_POSITION, self.reshape_position),
        ] {
            let [a, c] = pair(v);
            p(at, a);
            p(at + 1, c);
        }
        p(w::RECOVERY_CP, self.recovery_cp);
        p(w::NEW_LEVEL, self.new_level as u32);
        p(w::DELTA_DISKS, self.delta_disks as u32);
        p(w::NEW_LAYOUT, self.new_layout);
        p(w::NEW_CHUNK, self.new_chunk);
        p(w::LAYOUT, self.layout);
        p(w::CHUNK, self.chunk_size);
        let disks = self.disks.iter().enumerate();
        let all = disks.map(|(i, d)| (w::DISKS + i * w::DESCRIPTOR_WORDS, d));
        for (base, d) in all.chain(std::iter::once((w::THIS_DISK, &self.this_disk))) {
            p(base, d.number);
            p(base + 1, d.major);
            p(base + 2, d.minor);
            p(base + 3, d.raid_disk);
            p(base + 4, d.state);
        }
        let csum = checksum090(&b, order);
        put_word(&mut b, w::CSUM, csum, order);
        b
    }

    /// The v1 model of this member's superblock on a device of `device_sectors`, for the
    /// engine, which keeps every version in that model:
    /// - the uuid words as 16 bytes, each word big-endian, so that the v1 uuid prints as
    ///   mdadm prints the 0.90 one; no name;
    /// - data from sector 0 up to the superblock (md's rdev->sectors = sb_start for 0.90);
    /// - `dev_number` is `this_disk.number`, `dev_roles` (27) from the device table as md
    ///   reads it: faulty, in sync with a role below raid_disks, else spare;
    /// - no device uuid in 0.90: [`device_uuid_for`] folds the number into the set uuid;
    /// - clean (MD_SB_CLEAN) is resync_offset MaxSector; a dirty record whose cp_events
    ///   match events keeps recovery_cp, otherwise resync from 0 (md's super_90_validate);
    /// - a bitmap (MD_SB_BITMAP_PRESENT) at 8 sectors after the superblock;
    /// - minor 91 (a reshape) is FEATURE_RESHAPE_ACTIVE with reshape_position, new_level,
    ///   delta_disks, new_layout and new_chunk (bytes in 0.90, sectors in the model), and
    ///   no new_offset (0.90 cannot move its data); a reshape that removes devices runs
    ///   backwards (md's super_90_validate: delta_disks < 0), FEATURE_RESHAPE_BACKWARDS;
    ///   minor 90 leaves the reshape fields 0 (md zeroes them);
    /// - raid0's layout counts as set (md reads it from 0.90 unconditionally).
    pub fn to_v1(&self, device_sectors: u64) -> Result<Superblock, Sb090Error> {
        let invalid = |field, why: String| Sb090Error::Invalid { field, why };
        let super_offset = sb090_offset_sectors(device_sectors).ok_or_else(|| {
            invalid(
                "size",
                format!("a device of {device_sectors} sectors holds no 0.90 superblock"),
            )
        })?;
        let mut set_uuid = [0u8; 16];
        for (k, word) in self.set_uuid.iter().enumerate() {
            set_uuid[4 * k..4 * k + 4].copy_from_slice(&word.to_be_bytes());
        }
        let dev_roles = self
            .disks
            .iter()
            .map(|d| {
                if d.state & DISK_FAULTY != 0 {
                    ROLE_FAULTY
                } else if d.state & DISK_SYNC != 0 && d.raid_disk < self.raid_disks {
                    d.raid_disk as u16
                } else {
                    ROLE_SPARE
                }
            })
            .collect();
        let mut feature_map = 0;
        if self.state & SB090_STATE_BITMAP_PRESENT != 0 {
            feature_map |= FEATURE_BITMAP_OFFSET;
        }
        // md's and mdadm's test: minor 91 with a position (MaxSector stands for none).
        let reshaping = self.minor_version >= 91 && self.reshape_position != u64::MAX;
        if reshaping {
            feature_map |= FEATURE_RESHAPE_ACTIVE;
            if self.delta_disks < 0 {
                feature_map |= FEATURE_RESHAPE_BACKWARDS;
            }
        }
        // md reads the reshape fields of a 0.91 record only.
        let when = |v| if reshaping { v } else { 0 };
        if self.level == 0 && self.layout != 0 {
            feature_map |= FEATURE_RAID0_LAYOUT;
        }
        let resync_offset = if self.is_clean() {
            MAX_SECTOR
        } else if self.cp_events == self.events {
            u64::from(self.recovery_cp)
        } else {
            0
        };
        let own = self.disks[self.this_disk.number as usize];
        let mut devflags = 0;
        if own.state & DISK_WRITEMOSTLY != 0 {
            devflags |= DEVFLAG_WRITE_MOSTLY;
        }
        if own.state & DISK_FAILFAST != 0 {
            devflags |= DEVFLAG_FAILFAST;
        }
        let sb = Superblock {
            feature_map,
            set_uuid,
            set_name: String::new(),
            ctime: u64::from(self.ctime),
            level: self.level,
            layout: self.layout,
            size: self.size_sectors(),
            chunksize: self.chunk_size / 512,
            raid_disks: self.raid_disks,
            bitmap_offset: if feature_map & FEATURE_BITMAP_OFFSET != 0 {
                SB090_BITMAP_OFFSET_SECTORS
            } else {
                0
            },
            new_level: if reshaping { self.new_level } else { 0 },
            reshape_position: if reshaping { self.reshape_position } else { 0 },
            delta_disks: if reshaping { self.delta_disks } else { 0 },
            new_layout: when(self.new_layout),
            new_chunk: when(self.new_chunk / 512),
            new_offset: 0,
            data_offset: 0,
            data_size: super_offset,
            super_offset,
            recovery_offset: 0,
            dev_number: self.this_disk.number,
            cnt_corrected_read: 0,
            device_uuid: device_uuid_for(&set_uuid, self.this_disk.number),
            devflags,
            bblog_shift: 0,
            bblog_size: 0,
            bblog_offset: 0,
            utime: u64::from(self.utime),
            events: self.events,
            resync_offset,
            sb_csum: self.sb_csum,
            dev_roles,
            logical_block_size: 0,
        };
        sb.validate()
            .map_err(|e| invalid("size", format!("as a v1 model: {e}")))?;
        Ok(sb)
    }

    /// The 0.90 record md would write for the v1 model `sb` (the inverse of
    /// [`Superblock090::to_v1`], in little-endian order), with what the v1 model does not
    /// hold from `cx`. The device table follows md's super_90_sync, renumbered at every
    /// write as md does: an in-sync member is `active sync` in the entry of its role; every
    /// other device present takes the next entry from raid_disks on (in device-number
    /// order): a member being rebuilt (0.90 has no recovery_offset) or a spare is a spare
    /// (state 0, raid_disk = its entry), a faulty one `faulty`; a role no device holds is
    /// `removed faulty` in its own entry. Counts as md computes them.
    ///
    /// A reshape (FEATURE_RESHAPE_ACTIVE) is minor 91 with its fields (new_chunk in bytes),
    /// as md's super_90_sync writes it; without one, minor 90 with those fields 0.
    ///
    /// Refused, by name: anything 0.90 cannot record (a bad block log, a journal, a
    /// reshape that moves the data offset (FEATURE_NEW_OFFSET) or runs backwards without
    /// removing devices, more than 27 devices, a size above 4 TiB or a time past 2106).
    pub fn from_v1(sb: &Superblock, cx: &Sb090Context) -> Result<Superblock090, Sb090Error> {
        let invalid = |field, why: String| Sb090Error::Invalid { field, why };
        let representable = FEATURE_BITMAP_OFFSET
            | FEATURE_RECOVERY_OFFSET
            | FEATURE_REPLACEMENT
            | FEATURE_RAID0_LAYOUT
            | FEATURE_RESHAPE_ACTIVE
            | FEATURE_RESHAPE_BACKWARDS;
        let other = sb.feature_map & !representable;
        if other & FEATURE_NEW_OFFSET != 0 {
            return Err(invalid(
                "new_offset",
                format!(
                    "a reshape that moves the data by new_offset {} sectors has no place in a \
                     0.90 superblock (0.90 data always starts at sector 0)",
                    sb.new_offset
                ),
            ));
        }
        if other != 0 {
            return Err(invalid(
                "feature_map",
                format!(
                    "feature bit(s) {other:#x} (bad block log, journal, ...) have no place in a 0.90 superblock"
                ),
            ));
        }
        let reshaping = sb.feature_map & FEATURE_RESHAPE_ACTIVE != 0;
        // md derives a 0.90 reshape's direction from delta_disks (super_90_validate).
        let backwards = sb.feature_map & FEATURE_RESHAPE_BACKWARDS != 0;
        if backwards != (reshaping && sb.delta_disks < 0) {
            return Err(invalid(
                "feature_map",
                format!(
                    "a reshape {} with delta_disks {}: 0.90 runs a reshape backwards exactly \
                     when it removes devices",
                    if backwards { "backwards" } else { "forwards" },
                    sb.delta_disks
                ),
            ));
        }
        let new_chunk = sb
            .new_chunk
            .checked_mul(512)
            .ok_or_else(|| invalid("new_chunk", format!("{} sectors", sb.new_chunk)))?;
        if sb.feature_map & FEATURE_BITMAP_OFFSET != 0
            && sb.bitmap_offset != SB090_BITMAP_OFFSET_SECTORS
        {
            return Err(invalid(
                "bitmap_offset",
                format!(
                    "a 0.90 bitmap is {SB090_BITMAP_OFFSET_SECTORS} sectors after the superblock, not {}",
                    sb.bitmap_offset
                ),
            ));
        }
        if sb.raid_disks as usize > SB090_DISKS || sb.dev_number as usize >= SB090_DISKS {
            return Err(invalid(
                "raid_disks",
                format!(
                    "{} roles / device number {}: 0.90 describes at most {SB090_DISKS} devices",
                    sb.raid_disks, sb.dev_number
                ),
            ));
        }
        if sb.data_offset != 0 {
            return Err(invalid(
                "data_offset",
                format!("0.90 data starts at sector 0, not {}", sb.data_offset),
            ));
        }
        if let Some((n, _)) = sb
            .dev_roles
            .iter()
            .enumerate()
            .skip(SB090_DISKS)
            .find(|&(n, &r)| r < ROLE_MAX || cx.present.contains(&(n as u32)))
        {
            return Err(invalid(
                "dev_roles",
                format!("device number {n} is beyond the {SB090_DISKS} 0.90 describes"),
            ));
        }
        let size_kib = u32::try_from(sb.size / 2).map_err(|_| {
            invalid(
                "size",
                format!(
                    "component size {} sectors is more than 0.90 records (4 TiB)",
                    sb.size
                ),
            )
        })?;
        let secs = |field, t: u64| {
            u32::try_from(t & ((1 << 40) - 1))
                .map_err(|_| invalid(field, format!("{t} is past 0.90's 32-bit seconds")))
        };
        let chunk_size = sb
            .chunksize
            .checked_mul(512)
            .ok_or_else(|| invalid("chunksize", format!("{} sectors", sb.chunksize)))?;
        let mut disks = [Disk090::default(); SB090_DISKS];
        let (mut nr, mut active, mut working, mut failed, mut spare) = (0, 0, 0, 0, 0);
        let own = sb.dev_number;
        // md renumbers the table at every write (super_90_sync): a device in sync takes
        // the entry of its role; every other device present (a spare, one being rebuilt,
        // a faulty one) the next entry from raid_disks on, here in device-number order.
        let mut next_spare = sb.raid_disks;
        let mut own_entry = None;
        for n in 0..sb.dev_roles.len().max(SB090_DISKS) {
            let n32 = n as u32;
            let role = sb.dev_roles.get(n).copied().unwrap_or(ROLE_SPARE);
            let present = n32 == own || cx.present.contains(&n32);
            let rebuilding = cx.rebuilding.contains(&n32)
                || (n32 == own
                    && sb.feature_map & (FEATURE_RECOVERY_OFFSET | FEATURE_REPLACEMENT) != 0);
            let in_sync = u32::from(role) < sb.raid_disks && role < ROLE_MAX && !rebuilding;
            if !in_sync && !present {
                continue;
            }
            let desc = if in_sync {
                u32::from(role)
            } else {
                next_spare += 1;
                next_spare - 1
            };
            if desc as usize >= SB090_DISKS {
                return Err(invalid(
                    "dev_roles",
                    format!(
                        "{} roles and the devices besides them need more than the \
                         {SB090_DISKS} entries 0.90 describes",
                        sb.raid_disks
                    ),
                ));
            }
            let (major, minor) = if present {
                cx.dev_ids.get(n).copied().unwrap_or((0, 0))
            } else {
                (0, 0)
            };
            let entry = |raid_disk, state| Disk090 {
                number: desc,
                major,
                minor,
                raid_disk,
                state,
            };
            let d = &mut disks[desc as usize];
            if in_sync {
                *d = entry(desc, DISK_ACTIVE | DISK_SYNC);
                active += 1;
                working += 1;
            } else if role == ROLE_FAULTY {
                *d = entry(desc, DISK_FAULTY);
            } else {
                *d = entry(desc, 0);
                spare += 1;
                working += 1;
            }
            if n32 == own {
                own_entry = Some(desc as usize);
            }
            nr += 1;
        }
        let own_entry = own_entry.expect("the member written is always in its table");
        // Roles no device holds in sync: md's "removed" entries, failed in the counts.
        for r in 0..sb.raid_disks {
            let held = disks
                .iter()
                .any(|d| d.state & DISK_SYNC != 0 && d.raid_disk == r);
            if held {
                continue;
            }
            failed += 1;
            disks[r as usize] = Disk090 {
                number: r,
                major: 0,
                minor: 0,
                raid_disk: r,
                state: DISK_REMOVED | DISK_FAULTY,
            };
        }
        let own_disk = &mut disks[own_entry];
        if sb.devflags & DEVFLAG_WRITE_MOSTLY != 0 {
            own_disk.state |= DISK_WRITEMOSTLY;
        }
        if sb.devflags & DEVFLAG_FAILFAST != 0 {
            own_disk.state |= DISK_FAILFAST;
        }
        let this_disk = *own_disk;
        // md: a clean record carries recovery_cp (MaxSector, cut to 32 bits) and cp_events;
        // a dirty one neither (a resync from 0); a resync stopped part way its position.
        let (mut state, recovery_cp, cp_events) = match sb.resync_offset {
            MAX_SECTOR => (SB090_STATE_CLEAN, u32::MAX, sb.events),
            0 => (0, 0, 0),
            at => match u32::try_from(at) {
                Ok(at) if at != u32::MAX => (0, at, sb.events),
                _ => (0, 0, 0),
            },
        };
        if sb.feature_map & FEATURE_BITMAP_OFFSET != 0 {
            state |= SB090_STATE_BITMAP_PRESENT;
        }
        let mut uuid = [0u32; 4];
        for (k, word) in uuid.iter_mut().enumerate() {
            *word = u32::from_be_bytes(sb.set_uuid[4 * k..4 * k + 4].try_into().expect("4"));
        }
        let rec = Superblock090 {
            byte_order: ByteOrder::Little,
            major_version: 0,
            minor_version: if reshaping { 91 } else { 90 },
            patch_version: 0,
            set_uuid: uuid,
            ctime: secs("ctime", sb.ctime)?,
            level: sb.level,
            size_kib,
            nr_disks: nr,
            raid_disks: sb.raid_disks,
            md_minor: cx.md_minor,
            not_persistent: 0,
            utime: secs("utime", sb.utime)?,
            state,
            active_disks: active,
            working_disks: working,
            failed_disks: failed,
            spare_disks: spare,
            sb_csum: 0,
            events: sb.events,
            cp_events,
            recovery_cp,
            reshape_position: if reshaping { sb.reshape_position } else { 0 },
            new_level: if reshaping { sb.new_level } else { 0 },
            delta_disks: if reshaping { sb.delta_disks } else { 0 },
            new_layout: if reshaping { sb.new_layout } else { 0 },
            new_chunk: if reshaping { new_chunk } else { 0 },
            layout: sb.layout,
            chunk_size,
            disks,
            this_disk,
        };
        rec.validate()?;
        Ok(rec)
    }
}

/// What a 0.90 record holds that the v1 model does not, for [`Superblock090::from_v1`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sb090Context {
    /// Device numbers that have a device (a spare is listed in the table only then; the
    /// member written is always present).
    pub present: Vec<u32>,
    /// Device numbers being rebuilt (recovering, or replacing another): 0.90 records them
    /// as spares, and md rebuilds them from the start.
    pub rebuilding: Vec<u32>,
    /// md's preferred minor (`md_minor`: /dev/mdN).
    pub md_minor: u32,
    /// Per device number, the major and minor md recorded (informational: md writes its
    /// own at its next update); (0, 0) where unknown.
    pub dev_ids: Vec<(u32, u32)>,
}

impl Sb090Context {
    /// What `rec`, read from a member, says beyond the v1 model: its md_minor and the
    /// device numbers of its table; `present` and `rebuilding` are the writer's.
    pub fn from_record(rec: &Superblock090) -> Sb090Context {
        Sb090Context {
            md_minor: rec.md_minor,
            dev_ids: rec.disks.iter().map(|d| (d.major, d.minor)).collect(),
            ..Sb090Context::default()
        }
    }
}

/// The device uuid the v1 model gives 0.90 member `number` of the array `set_uuid` (0.90
/// has none): the set uuid with the number folded into its last word, so that the
/// members of one array differ, and the same number always gives the same uuid.
pub fn device_uuid_for(set_uuid: &[u8; 16], number: u32) -> [u8; 16] {
    let mut u = *set_uuid;
    let last = u32::from_be_bytes(u[12..16].try_into().expect("4")) ^ (number.wrapping_add(1));
    u[12..16].copy_from_slice(&last.to_be_bytes());
    // Never the set uuid itself (number + 1 is never 0 below 27).
    u[0] ^= 0x90;
    u
}

/// The v1 model of member `dev_number` of a new 0.90 array on a device of
/// `device_sectors` (what [`Superblock090::to_v1`] gives for the record mdadm's
/// `--create -e 0.90` writes): the superblock at its place, data from sector 0 up to it,
/// active members numbered by their role and spares after them, missing roles faulty,
/// events 0. `spec`'s name, data offset, bad block log and version are not used (0.90
/// has none of them); an internal bitmap must be at its 0.90 place (8 sectors after the
/// superblock, at most [`SB090_BITMAP_ROOM_SECTORS`]).
pub fn new_v1_for_create(
    spec: &crate::superblock::CreateSpec,
    dev_number: u32,
    device_sectors: u64,
) -> Result<Superblock, Sb090Error> {
    let invalid = |field, why: String| Sb090Error::Invalid { field, why };
    let devices = spec.raid_disks.saturating_add(spec.spares);
    if devices as usize > SB090_DISKS {
        return Err(invalid(
            "raid_disks",
            format!("{devices} devices: 0.90 describes at most {SB090_DISKS}"),
        ));
    }
    if dev_number >= devices {
        return Err(invalid(
            "dev_number",
            format!("{dev_number} >= {devices} devices"),
        ));
    }
    match spec.internal_bitmap {
        None => {}
        Some((SB090_BITMAP_OFFSET_SECTORS, space)) if space <= SB090_BITMAP_ROOM_SECTORS => {}
        Some((offset, space)) => {
            return Err(invalid(
                "bitmap",
                format!(
                    "a 0.90 internal bitmap is {SB090_BITMAP_OFFSET_SECTORS} sectors after the \
                     superblock and at most {SB090_BITMAP_ROOM_SECTORS} sectors, not {space} at {offset}"
                ),
            ))
        }
    }
    let super_offset = sb090_offset_sectors(device_sectors).ok_or_else(|| {
        invalid(
            "size",
            format!("a device of {device_sectors} sectors cannot hold a 0.90 superblock"),
        )
    })?;
    let mut dev_roles = vec![ROLE_SPARE; SB090_DISKS];
    for (slot, role) in dev_roles
        .iter_mut()
        .take(spec.raid_disks as usize)
        .enumerate()
    {
        *role = slot as u16;
    }
    for &m in &spec.missing {
        if m >= spec.raid_disks {
            return Err(invalid("missing", format!("slot {m} >= raid_disks")));
        }
        dev_roles[m as usize] = ROLE_FAULTY;
    }
    let ctime = u64::from(u32::try_from(spec.ctime_secs).map_err(|_| {
        invalid(
            "ctime",
            format!("{} is past 0.90's 32-bit seconds", spec.ctime_secs),
        )
    })?);
    let sb = Superblock {
        feature_map: if spec.level == 0 && spec.layout != 0 {
            FEATURE_RAID0_LAYOUT
        } else {
            0
        } | if spec.internal_bitmap.is_some() {
            FEATURE_BITMAP_OFFSET
        } else {
            0
        },
        set_uuid: spec.set_uuid,
        set_name: String::new(),
        ctime,
        level: spec.level,
        layout: spec.layout,
        size: spec.size_sectors,
        chunksize: spec.chunk_sectors,
        raid_disks: spec.raid_disks,
        bitmap_offset: if spec.internal_bitmap.is_some() {
            SB090_BITMAP_OFFSET_SECTORS
        } else {
            0
        },
        new_level: 0,
        reshape_position: 0,
        delta_disks: 0,
        new_layout: 0,
        new_chunk: 0,
        new_offset: 0,
        data_offset: 0,
        data_size: super_offset,
        super_offset,
        recovery_offset: 0,
        dev_number,
        cnt_corrected_read: 0,
        device_uuid: device_uuid_for(&spec.set_uuid, dev_number),
        devflags: 0,
        bblog_shift: 0,
        bblog_size: 0,
        bblog_offset: 0,
        utime: ctime,
        events: 0,
        resync_offset: if spec.clean { MAX_SECTOR } else { 0 },
        sb_csum: 0,
        dev_roles,
        logical_block_size: 0,
    };
    sb.validate().map_err(|e| invalid("size", format!("{e}")))?;
    Ok(sb)
}

/// Whether a v1-model superblock at `super_offset` on a device of `device_sectors` stands
/// for a 0.90 record: 0.90's place (64 KiB below the last 64 KiB boundary) is never the
/// place of a 1.x superblock (1.0's is within the last 12 KiB, 1.1's and 1.2's at the start).
pub fn is_090_place(super_offset: u64, device_sectors: u64) -> bool {
    sb090_offset_sectors(device_sectors) == Some(super_offset) && super_offset >= 8
}

/// The uuid a 0.90 array's internal bitmap superblock carries, from the v1 model's
/// `set_uuid`: md copies the four set_uuid words as they lie in memory (mdadm's
/// uuid_from_super0), so each word is in the writer's (little-endian) byte order, where
/// the v1 model holds each word big-endian so that it prints as mdadm prints it.
pub fn bitmap_uuid090(set_uuid: &[u8; 16]) -> [u8; 16] {
    let mut u = [0u8; 16];
    for k in 0..4 {
        let word = u32::from_be_bytes(set_uuid[4 * k..4 * k + 4].try_into().expect("4"));
        u[4 * k..4 * k + 4].copy_from_slice(&word.to_le_bytes());
    }
    u
}
