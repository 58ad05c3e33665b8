//! md v1 superblock codec (see docs/FORMAT.md for every byte).
//!
//! The v1 superblock is 256 bytes of fixed fields followed by `max_dev` little-endian u16
//! role entries. Its minor version is only where it lives ([`MetadataVersion`]): 1.2 places
//! it 4 KiB (8 sectors) from the start of the member, 1.1 at sector 0, 1.0 near the end.
//!
//! This module only encodes and decodes; it does no IO.

use thiserror::Error;

pub const MD_SB_MAGIC: u32 = 0xa92b_4efc;
/// Byte offset of a v1.2 superblock on its member.
pub const SB_V12_OFFSET_BYTES: u64 = 4096;
/// Superblock sector of a v1.2 superblock (`super_offset`).
pub const SB_V12_OFFSET_SECTORS: u64 = 8;
/// Where a v1 superblock lives on its member: the minor version of md's "1.x" metadata.
///
/// The bytes are the same for all three; only the place differs, and with it where the data,
/// bitmap and bad block log go (1.0 puts them all before the superblock, at the end of the
/// device; 1.1 and 1.2 after it). md finds the superblock only where its version says, and
/// refuses one whose `super_offset` is not that place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetadataVersion {
    /// At the end: sector `(device_sectors - 16) & !7`, 8 to 12 KiB before the end.
    V1_0,
    /// At sector 0.
    V1_1,
    /// At sector 8 (4 KiB), mdadm's default.
    V1_2,
}

impl MetadataVersion {
    /// The order mdadm tries them in when the version is not given.
    pub const ALL: [MetadataVersion; 3] = [
        MetadataVersion::V1_0,
        MetadataVersion::V1_1,
        MetadataVersion::V1_2,
    ];

    /// mdadm's spelling (`-e 1.0`); "1" and "default" mean 1.2, as in mdadm.
    pub fn parse(s: &str) -> Option<MetadataVersion> {
        match s.trim() {
            "1.0" | "1.00" => Some(MetadataVersion::V1_0),
            "1.1" | "1.01" => Some(MetadataVersion::V1_1),
            "1.2" | "1.02" | "1" | "default" => Some(MetadataVersion::V1_2),
            _ => None,
        }
    }

    /// As `mdadm --examine` prints it ("1.2").
    pub fn name(self) -> &'static str {
        match self {
            MetadataVersion::V1_0 => "1.0",
            MetadataVersion::V1_1 => "1.1",
            MetadataVersion::V1_2 => "1.2",
        }
    }

    /// The superblock's sector on a device of `device_sectors` (md's `sb_start`), or `None`
    /// when the device cannot hold a superblock block there.
    pub fn super_offset_sectors(self, device_sectors: u64) -> Option<u64> {
        let at = match self {
            MetadataVersion::V1_0 => device_sectors.checked_sub(16)? & !7,
            MetadataVersion::V1_1 => 0,
            MetadataVersion::V1_2 => SB_V12_OFFSET_SECTORS,
        };
        (at + SB_IO_SECTORS <= device_sectors).then_some(at)
    }

    /// The version whose place `super_offset` is on a device of `device_sectors`; `None`
    /// when it is none of them (a 1.0 superblock of a device that has grown, or a copy).
    pub fn of_super_offset(super_offset: u64, device_sectors: u64) -> Option<MetadataVersion> {
        MetadataVersion::ALL
            .into_iter()
            .find(|v| v.super_offset_sectors(device_sectors) == Some(super_offset))
    }

    /// The superblock is after the data (1.0): data_offset 0, bitmap and bad block log at
    /// negative offsets from the superblock.
    pub fn at_end(self) -> bool {
        self == MetadataVersion::V1_0
    }
}

impl std::fmt::Display for MetadataVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Sectors of the superblock block uraid reads and writes ([`SB_IO_BYTES`]).
pub const SB_IO_SECTORS: u64 = (SB_IO_BYTES / 512) as u64;
/// Size of the fixed part.
pub const SB_FIXED_BYTES: usize = 256;
/// Bytes we read and write for a superblock: md writes the superblock rounded up to the
/// logical block size; 4 KiB covers 256 + 2*max_dev for max_dev up to 1920.
pub const SB_IO_BYTES: usize = 4096;

/// dev_roles special values.
pub const ROLE_SPARE: u16 = 0xffff;
pub const ROLE_FAULTY: u16 = 0xfffe;
pub const ROLE_JOURNAL: u16 = 0xfffd;

/// feature_map bits.
pub const FEATURE_BITMAP_OFFSET: u32 = 1;
pub const FEATURE_RECOVERY_OFFSET: u32 = 2;
pub const FEATURE_RESHAPE_ACTIVE: u32 = 4;
pub const FEATURE_BAD_BLOCKS: u32 = 8;
pub const FEATURE_REPLACEMENT: u32 = 16;
pub const FEATURE_RESHAPE_BACKWARDS: u32 = 32;
pub const FEATURE_NEW_OFFSET: u32 = 64;
pub const FEATURE_RECOVERY_BITMAP: u32 = 128;
pub const FEATURE_CLUSTERED: u32 = 256;
pub const FEATURE_JOURNAL: u32 = 512;
pub const FEATURE_PPL: u32 = 1024;
pub const FEATURE_MULTIPLE_PPLS: u32 = 2048;
pub const FEATURE_RAID0_LAYOUT: u32 = 4096;

/// resync_offset value meaning "fully in sync" (md's MaxSector).
pub const MAX_SECTOR: u64 = u64::MAX;

/// devflags bits (md_p.h's WriteMostly1 and FailFast1).
pub const DEVFLAG_WRITE_MOSTLY: u8 = 1;
pub const DEVFLAG_FAILFAST: u8 = 2;

/// A member's md flags, as its superblock's `devflags` keeps them (md's rdev flags
/// WriteMostly and FailFast).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemberFlags {
    /// md's write-mostly: raid1 reads go to the other copies whenever one is valid.
    pub write_mostly: bool,
    /// md's failfast: raid1/raid10 fail the member on its first IO error instead of
    /// repairing and retrying, unless that would leave the array without its data.
    pub failfast: bool,
}

impl MemberFlags {
    /// The two flags md defines, from a `devflags` byte (other bits are not flags of
    /// this type; `support::check` refuses them at assembly).
    pub fn from_devflags(devflags: u8) -> MemberFlags {
        MemberFlags {
            write_mostly: devflags & DEVFLAG_WRITE_MOSTLY != 0,
            failfast: devflags & DEVFLAG_FAILFAST != 0,
        }
    }

    /// The `devflags` byte.
    pub fn devflags(self) -> u8 {
        let mut b = 0;
        if self.write_mostly {
            b |= DEVFLAG_WRITE_MOSTLY;
        }
        if self.failfast {
            b |= DEVFLAG_FAILFAST;
        }
        b
    }

    /// Both flags that either has.
    pub fn union(self, other: MemberFlags) -> MemberFlags {
        MemberFlags {
            write_mostly: self.write_mostly || other.write_mostly,
            failfast: self.failfast || other.failfast,
        }
    }

    /// mdadm --examine's words ("write-mostly failfast"); empty when neither is set.
    pub fn examine_words(self) -> String {
        let mut w = Vec::new();
        if self.write_mostly {
            w.push("write-mostly");
        }
        if self.failfast {
            w.push("failfast");
        }
        w.join(" ")
    }

    /// md's words in sysfs and mdadm --detail's state column ("writemostly failfast").
    pub fn detail_words(self) -> String {
        let mut w = Vec::new();
        if self.write_mostly {
            w.push("writemostly");
        }
        if self.failfast {
            w.push("failfast");
        }
        w.join(" ")
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SuperblockError {
    #[error("no md superblock (magic {found:#010x}, expected {MD_SB_MAGIC:#010x})")]
    BadMagic { found: u32 },
    #[error("unsupported superblock major version {0} (uraid reads version 1)")]
    BadVersion(u32),
    #[error("superblock checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("superblock max_dev {0} is out of range")]
    BadMaxDev(u32),
    #[error("superblock is truncated: {got} bytes, need {need}")]
    Truncated { got: usize, need: usize },
    #[error("superblock field {field} is invalid: {why}")]
    Invalid { field: &'static str, why: String },
}

/// Every field of md's `mdp_superblock_1`, decoded. Names follow md.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub feature_map: u32,
    pub set_uuid: [u8; 16],
    /// Up to 32 bytes, NUL padded on disk ("host:name" for mdadm-made arrays).
    pub set_name: String,
    /// Creation time: low 40 bits seconds since the epoch, high 24 bits microseconds.
    pub ctime: u64,
    pub level: i32,
    pub layout: u32,
    /// Used sectors of each component ("component size"; md's `size`).
    pub size: u64,
    pub chunksize: u32,
    pub raid_disks: u32,
    /// Signed sector offset of the bitmap from the superblock (valid with FEATURE_BITMAP_OFFSET).
    /// Shares its bytes with the PPL offset/size.
    pub bitmap_offset: i32,
    pub new_level: i32,
    pub reshape_position: u64,
    pub delta_disks: i32,
    pub new_layout: u32,
    pub new_chunk: u32,
    pub new_offset: i32,
    pub data_offset: u64,
    pub data_size: u64,
    pub super_offset: u64,
    /// recovery_offset, or journal_tail on a journal device (same bytes).
    pub recovery_offset: u64,
    pub dev_number: u32,
    pub cnt_corrected_read: u32,
    pub device_uuid: [u8; 16],
    pub devflags: u8,
    pub bblog_shift: u8,
    pub bblog_size: u16,
    pub bblog_offset: i32,
    pub utime: u64,
    pub events: u64,
    pub resync_offset: u64,
    /// As read (decode) — encode recomputes it.
    pub sb_csum: u32,
    /// `dev_roles[i]` is the role of the device whose dev_number is i; len = max_dev.
    pub dev_roles: Vec<u16>,
    /// The array's logical block size in bytes (md since Linux 6.18 keeps it in the first
    /// four bytes of `pad3`, at byte 224); 0 when not recorded.
    pub logical_block_size: u32,
}

/// Largest `max_dev` md accepts: the roles must fit in the 4 KiB superblock block.
pub const MAX_DEV_LIMIT: u32 = ((SB_IO_BYTES - SB_FIXED_BYTES) / 2) as u32;
/// Roles below this value are active slots (md's MD_DISK_ROLE_MAX).
pub const ROLE_MAX: u16 = 0xff00;
/// Bytes of `set_name` on disk.
pub const SET_NAME_BYTES: usize = 32;
/// Sectors of the bad block log mdadm reserves (4 KiB: 512 entries of 8 bytes).
pub const BBLOG_SECTORS: u16 = 8;
/// md refuses a member whose `data_size` is below this many sectors.
pub const MIN_DATA_SIZE_SECTORS: u64 = 10;

/// Byte offsets of the fields of `mdp_superblock_1` (md_p.h).
pub(crate) mod off {
    pub const MAGIC: usize = 0;
    pub const MAJOR_VERSION: usize = 4;
    pub const FEATURE_MAP: usize = 8;
    pub const PAD0: usize = 12;
    pub const SET_UUID: usize = 16;
    pub const SET_NAME: usize = 32;
    pub const CTIME: usize = 64;
    pub const LEVEL: usize = 72;
    pub const LAYOUT: usize = 76;
    pub const SIZE: usize = 80;
    pub const CHUNKSIZE: usize = 88;
    pub const RAID_DISKS: usize = 92;
    pub const BITMAP_OFFSET: usize = 96;
    pub const NEW_LEVEL: usize = 100;
    pub const RESHAPE_POSITION: usize = 104;
    pub const DELTA_DISKS: usize = 112;
    pub const NEW_LAYOUT: usize = 116;
    pub const NEW_CHUNK: usize = 120;
    pub const NEW_OFFSET: usize = 124;
    pub const DATA_OFFSET: usize = 128;
    pub const DATA_SIZE: usize = 136;
    pub const SUPER_OFFSET: usize = 144;
    pub const RECOVERY_OFFSET: usize = 152;
    pub const DEV_NUMBER: usize = 160;
    pub const CNT_CORRECTED_READ: usize = 164;
    pub const DEVICE_UUID: usize = 168;
    pub const DEVFLAGS: usize = 184;
    pub const BBLOG_SHIFT: usize = 185;
    pub const BBLOG_SIZE: usize = 186;
    pub const BBLOG_OFFSET: usize = 188;
    pub const UTIME: usize = 192;
    pub const EVENTS: usize = 200;
    pub const RESYNC_OFFSET: usize = 208;
    pub const SB_CSUM: usize = 216;
    pub const MAX_DEV: usize = 220;
    pub const LOGICAL_BLOCK_SIZE: usize = 224;
    pub const PAD3: usize = 228;
    pub const DEV_ROLES: usize = 256;
}

/// Little-endian field access on a byte slice whose length the caller has checked.
pub(crate) mod le {
    pub fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }
    pub fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    pub fn u64_at(b: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    }
    pub fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
        b[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

/// md's `calc_sb_1_csum` over `bytes` (the fixed part and the roles: `256 + 2*max_dev` bytes).
///
/// Little-endian u32 words are summed into a u64 with the `sb_csum` word taken as zero; a
/// trailing u16 (an odd `max_dev`) is added as a u16 (a lone trailing byte is ignored). The
/// high and low halves are then folded once, wrapping in 32 bits, as md does.
pub fn checksum(bytes: &[u8]) -> u32 {
    let mut sum: u64 = 0;
    let mut words = bytes.chunks_exact(4);
    for (i, w) in words.by_ref().enumerate() {
        if i * 4 != off::SB_CSUM {
            sum += u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        }
    }
    let rest = words.remainder();
    if rest.len() >= 2 {
        sum += u64::from(u16::from_le_bytes([rest[0], rest[1]]));
    }
    (sum as u32).wrapping_add((sum >> 32) as u32)
}

/// Formats a UUID as `mdadm --examine` prints it: `xxxxxxxx:xxxxxxxx:xxxxxxxx:xxxxxxxx`,
/// the 16 bytes in on-disk order.
pub fn uuid_string(uuid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(35);
    for (i, b) in uuid.iter().enumerate() {
        if i > 0 && i % 4 == 0 {
            s.push(':');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Parses a UUID written as mdadm prints it (`8:8:8:8` hex digits), in the dashed form
/// (`8-4-4-4-12`) or as 32 bare hex digits. Bytes come out in on-disk order.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let s = s.trim();
    let colon = s.split(':').map(str::len).eq([8, 8, 8, 8]);
    let dashed = s.split('-').map(str::len).eq([8, 4, 4, 4, 12]);
    let bare = s.len() == 32;
    if !(colon || dashed || bare) {
        return None;
    }
    let digits: Vec<u8> = s.bytes().filter(|&c| c != b':' && c != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// Packs an md timestamp: low 40 bits seconds since the epoch, high 24 bits microseconds.
pub fn pack_time(secs: u64, micros: u32) -> u64 {
    assert!(micros < 1_000_000, "microseconds out of range: {micros}");
    (secs & TIME_SECS_MASK) | (u64::from(micros) << 40)
}

const TIME_SECS_MASK: u64 = (1 << 40) - 1;

/// `max_dev` mdadm chooses at create for `devices` members (active + spare): the roles are
/// sized so that the superblock fills whole 512-byte sectors, so 128 for up to 128 devices.
pub fn max_dev_for(devices: u32) -> u32 {
    let bytes = SB_FIXED_BYTES as u64 + 2 * u64::from(devices);
    let rounded = bytes.div_ceil(512) * 512;
    ((rounded - SB_FIXED_BYTES as u64) / 2) as u32
}

/// Space mdadm leaves for a bitmap by default (its `choose_bm_space`), in sectors, for a
/// device or component of `sectors`: 4 KiB, 64 KiB above 8 GiB, 128 KiB above 200 GiB.
/// Always a multiple of 4 KiB so 4K-sector devices stay aligned.
pub fn default_bitmap_space_sectors(sectors: u64) -> u64 {
    if sectors < 64 * 2 {
        0
    } else if sectors - 64 * 2 >= 200 * 1024 * 1024 * 2 {
        128 * 2
    } else if sectors - 4 * 2 > 8 * 1024 * 1024 * 2 {
        64 * 2
    } else {
        4 * 2
    }
}

/// mdadm's default `data_offset` for a v1.2 member of `device_sectors` (its
/// `validate_geometry1`): superblock area (12 KiB) + bitmap space + reshape headroom, rounded
/// up to 1 MiB. Headroom aims at ~0.1% of the device, at most 128 MiB, and is halved no
/// further than two chunks (`chunk_sectors` 0: no chunk floor). `bitmap_space_sectors` is
/// normally [`default_bitmap_space_sectors`]`(device_sectors)`.
pub fn default_data_offset_sectors(
    device_sectors: u64,
    chunk_sectors: u32,
    bitmap_space_sectors: u64,
) -> u64 {
    let two_chunks = u64::from(chunk_sectors) * 2;
    let mut headroom: u64 = 128 * 1024 * 2;
    while (headroom << 10) > device_sectors && (chunk_sectors == 0 || headroom / 2 >= two_chunks) {
        headroom >>= 1;
    }
    let data_offset = 12 * 2 + bitmap_space_sectors + headroom;
    data_offset.div_ceil(2048) * 2048
}

/// Where mdadm places the bad block log of a v1.2 member at create (`write_init_super1`),
/// as (`bblog_offset` from the superblock, `bblog_size`) in sectors; `None` when there is no
/// room. `bitmap_offset`/`bitmap_space` describe the bitmap area (offset 8 sectors after the
/// superblock; the space is the bitmap's size with a bitmap, else the default reserve).
pub fn default_bblog_placement(
    data_offset_sectors: u64,
    bitmap_offset_sectors: u64,
    bitmap_space_sectors: u64,
) -> Option<(i32, u16)> {
    bblog_placement_after_super(
        SB_V12_OFFSET_SECTORS,
        data_offset_sectors,
        bitmap_offset_sectors,
        bitmap_space_sectors,
    )
}

/// [`default_bblog_placement`] for a superblock at `super_offset` before the data (1.1: 0,
/// 1.2: 8): after the bitmap area if it fits before the data, else just below the data.
pub fn bblog_placement_after_super(
    super_offset_sectors: u64,
    data_offset_sectors: u64,
    bitmap_offset_sectors: u64,
    bitmap_space_sectors: u64,
) -> Option<(i32, u16)> {
    let sb = super_offset_sectors;
    let size = u64::from(BBLOG_SECTORS);
    let after_bitmap = bitmap_offset_sectors + bitmap_space_sectors;
    if data_offset_sectors >= sb + after_bitmap + size {
        Some((i32::try_from(after_bitmap).ok()?, BBLOG_SECTORS))
    } else if data_offset_sectors >= sb + 16 {
        // Just below the data, as an offset from the superblock.
        Some((
            i32::try_from(data_offset_sectors - size - sb).ok()?,
            BBLOG_SECTORS,
        ))
    } else {
        None
    }
}

/// mdadm's layout of a 1.0 member at create (`write_init_super1`, minor 0): the superblock
/// at the end, then going down the bad block log (8 sectors just below it), the bitmap
/// area (`bitmap_space_sectors`: the bitmap's 4 KiB-rounded size, or the default reserve
/// without one) and the data, which starts at sector 0 and ends where that space begins.
/// When the component (`size_sectors`) leaves less room than that, md shrinks the reserve
/// (and drops the log when under 8 sectors remain).
pub fn v10_placement(
    device_sectors: u64,
    size_sectors: u64,
    bitmap_space_sectors: u64,
) -> Option<V10Placement> {
    let super_offset = MetadataVersion::V1_0.super_offset_sectors(device_sectors)?;
    let mut reserve = bitmap_space_sectors + u64::from(BBLOG_SECTORS);
    if super_offset < size_sectors + reserve {
        reserve = super_offset.checked_sub(size_sectors)?;
    }
    let bblog = (reserve >= u64::from(BBLOG_SECTORS)).then_some((-8, BBLOG_SECTORS));
    Some(V10Placement {
        super_offset,
        data_size: super_offset - reserve,
        bblog,
    })
}

/// Where [`v10_placement`] puts a 1.0 member's metadata, in sectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V10Placement {
    pub super_offset: u64,
    /// Counted from sector 0: where the reserve below the superblock begins.
    pub data_size: u64,
    /// (`bblog_offset`, `bblog_size`), if there is room for the log.
    pub bblog: Option<(i32, u16)>,
}

/// Sectors a 1.0 member of `device_sectors` leaves for the component at create (mdadm's
/// `validate_geometry1`): the device rounded down to 4 KiB, less the superblock's 8 KiB,
/// the bad block log and the default bitmap reserve for the device's size.
pub fn v10_avail_sectors(device_sectors: u64) -> u64 {
    (device_sectors & !7).saturating_sub(
        16 + u64::from(BBLOG_SECTORS) + default_bitmap_space_sectors(device_sectors),
    )
}

/// `bitmap_offset` of a 1.0 member's internal bitmap at create (mdadm's movable offset):
/// the bitmap area (`bitmap_space_sectors`, whole 4 KiB blocks) ends where the 8-sector
/// bad block log below the superblock begins.
pub fn v10_bitmap_offset(bitmap_space_sectors: u64) -> Option<i32> {
    let back = bitmap_space_sectors.checked_add(u64::from(BBLOG_SECTORS))?;
    i32::try_from(back).ok().map(|b| -b)
}

/// What [`Superblock::new_for_create`] needs to know about the array; per-member values are
/// its other arguments. Nothing here is read from a clock or a random source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateSpec {
    pub set_uuid: [u8; 16],
    /// Written as given ("host:name" is mdadm's convention), at most 32 bytes.
    pub set_name: String,
    /// Seconds since the epoch; also the first `utime`.
    pub ctime_secs: u64,
    pub level: i32,
    pub layout: u32,
    /// Chunk in sectors; 0 for raid1.
    pub chunk_sectors: u32,
    pub raid_disks: u32,
    /// Spare members beyond `raid_disks` (they get ROLE_SPARE).
    pub spares: u32,
    /// Slots created "missing" (they get ROLE_FAULTY, as mdadm writes).
    pub missing: Vec<u32>,
    /// Component size in sectors (`size`): the sectors used on every member.
    pub size_sectors: u64,
    /// Usually [`default_data_offset_sectors`].
    pub data_offset_sectors: u64,
    /// `Some((bitmap_offset, bitmap_space))` in sectors for an internal bitmap (mdadm: offset 8,
    /// space = [`crate::bitmap::BitmapSuper::space_bytes`] / 512); `None` without a bitmap.
    pub internal_bitmap: Option<(i32, u64)>,
    /// Reserve a bad block log where mdadm would (it does unless told not to).
    pub bad_block_log: bool,
    /// true: resync_offset = MAX_SECTOR ("clean", e.g. --assume-clean or raid0); false: 0,
    /// a full resync is needed.
    pub clean: bool,
    /// Where the superblock goes (mdadm's `-e`); 1.2 unless asked.
    pub version: MetadataVersion,
}

impl Superblock {
    /// Whether the reshape this superblock records runs from the end towards the start, by
    /// md's rule (super_1_load, super_90_validate): always when it removes devices
    /// (`delta_disks < 0`, where md does not write FEATURE_RESHAPE_BACKWARDS), and by that
    /// bit when the device count stays (an offset moving up).
    pub fn reshape_backwards(&self) -> bool {
        self.delta_disks < 0
            || (self.delta_disks == 0 && self.feature_map & FEATURE_RESHAPE_BACKWARDS != 0)
    }

    /// The superblock mdadm would write on member `dev_number` (its slot in `dev_roles`) of a
    /// new v1.x array (`spec.version`), on a device of `device_sectors` with the given
    /// device UUID.
    ///
    /// Follows mdadm's `init_super1` + `write_init_super1`: super_offset where the version
    /// puts it, data_size = rest of the device (1.1/1.2) or up to the reserve below the
    /// superblock (1.0, [`v10_placement`]), events 0 (md counts up from there on the first update), a bad block log
    /// after the bitmap area, FEATURE_BITMAP_OFFSET with a bitmap. FEATURE_BAD_BLOCKS is not
    /// set: md sets it only once the log holds entries. mdadm sets FEATURE_RAID0_LAYOUT only
    /// for raid0 members of different sizes; the caller sets it in `feature_map` if so.
    pub fn new_for_create(
        spec: &CreateSpec,
        dev_number: u32,
        device_uuid: [u8; 16],
        device_sectors: u64,
    ) -> Result<Superblock, SuperblockError> {
        let invalid = |field, why: String| SuperblockError::Invalid { field, why };
        let devices = spec.raid_disks.saturating_add(spec.spares);
        if devices > MAX_DEV_LIMIT {
            return Err(invalid(
                "raid_disks",
                format!("{devices} devices exceed {MAX_DEV_LIMIT}"),
            ));
        }
        if dev_number >= devices {
            return Err(invalid(
                "dev_number",
                format!("{dev_number} >= {devices} devices"),
            ));
        }
        let super_offset = spec
            .version
            .super_offset_sectors(device_sectors)
            .ok_or_else(|| {
                invalid(
                    "super_offset",
                    format!(
                        "a device of {device_sectors} sectors cannot hold a {} superblock",
                        spec.version
                    ),
                )
            })?;
        let max_dev = max_dev_for(devices);
        let mut dev_roles = vec![ROLE_SPARE; max_dev as usize];
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
        let (feature_map, bitmap_offset, bm_space) = match spec.internal_bitmap {
            Some((offset, space)) => (FEATURE_BITMAP_OFFSET, offset, space),
            None => (0, 0, default_bitmap_space_sectors(spec.size_sectors)),
        };
        let too_small = || {
            invalid(
                "data_offset",
                format!(
                    "{} beyond device of {device_sectors} sectors",
                    spec.data_offset_sectors
                ),
            )
        };
        let (data_size, log) = if spec.version.at_end() {
            // 1.0: data from data_offset (0) up to the bitmap area below the superblock.
            let p =
                v10_placement(device_sectors, spec.size_sectors, bm_space).ok_or_else(too_small)?;
            // The reserve below the superblock shrinks for a large component only where it
            // holds no bitmap: an internal bitmap keeps its whole area.
            if spec.internal_bitmap.is_some()
                && p.data_size + bm_space + u64::from(BBLOG_SECTORS) > p.super_offset
            {
                return Err(invalid(
                    "internal_bitmap",
                    format!(
                        "a component of {} sectors leaves no room for the {bm_space}-sector \
                         bitmap and the bad block log below the 1.0 superblock at sector {} \
                         (give a smaller --size or a larger bitmap chunk)",
                        spec.size_sectors, p.super_offset
                    ),
                ));
            }
            let size = p
                .data_size
                .checked_sub(spec.data_offset_sectors)
                .ok_or_else(too_small)?;
            (size, p.bblog)
        } else {
            let size = device_sectors
                .checked_sub(spec.data_offset_sectors)
                .ok_or_else(too_small)?;
            // Without a bitmap mdadm reserves its space 8 sectors after the superblock.
            let bm_offset = u64::try_from(if spec.internal_bitmap.is_some() {
                bitmap_offset
            } else {
                8
            });
            let log = bm_offset.ok().and_then(|bm_offset| {
                bblog_placement_after_super(
                    super_offset,
                    spec.data_offset_sectors,
                    bm_offset,
                    bm_space,
                )
            });
            (size, log)
        };
        let (bblog_offset, bblog_size) = match log {
            Some(l) if spec.bad_block_log => l,
            _ => (0, 0),
        };
        let ctime = spec.ctime_secs & TIME_SECS_MASK;
        let sb = Superblock {
            feature_map,
            set_uuid: spec.set_uuid,
            set_name: spec.set_name.clone(),
            ctime,
            level: spec.level,
            layout: spec.layout,
            size: spec.size_sectors,
            chunksize: spec.chunk_sectors,
            raid_disks: spec.raid_disks,
            bitmap_offset,
            new_level: 0,
            reshape_position: 0,
            delta_disks: 0,
            new_layout: 0,
            new_chunk: 0,
            new_offset: 0,
            data_offset: spec.data_offset_sectors,
            data_size,
            super_offset,
            recovery_offset: 0,
            dev_number,
            cnt_corrected_read: 0,
            device_uuid,
            devflags: 0,
            bblog_shift: 0,
            bblog_size,
            bblog_offset,
            utime: ctime,
            events: 0,
            resync_offset: if spec.clean { MAX_SECTOR } else { 0 },
            sb_csum: 0,
            dev_roles,
            logical_block_size: 0,
        };
        sb.validate()?;
        Ok(sb)
    }

    /// Decodes the superblock at the start of `buf` (the bytes at `super_offset`; callers read
    /// [`SB_IO_BYTES`]). Checks magic, version, `max_dev`, checksum, reserved bytes and field
    /// sanity; never panics.
    pub fn decode(buf: &[u8]) -> Result<Superblock, SuperblockError> {
        Superblock::decode_checked(buf, true).map(|(sb, _)| sb)
    }

    /// [`Superblock::decode`] without the checksum test, for `examine`: someone recovering an
    /// array needs to see a superblock whose checksum is wrong (as mdadm shows it), marked as
    /// not trusted. Returns the record (with the stored `sb_csum`) and the checksum computed
    /// over its bytes; every other check still applies. Never use the result to assemble.
    pub fn decode_any_checksum(buf: &[u8]) -> Result<(Superblock, u32), SuperblockError> {
        Superblock::decode_checked(buf, false)
    }

    /// The checksum is tested (when `checksum` is set) before any field is: a field that
    /// makes no sense in a block whose checksum is wrong is corruption, not a bad value.
    fn decode_checked(buf: &[u8], checksum: bool) -> Result<(Superblock, u32), SuperblockError> {
        if buf.len() < SB_FIXED_BYTES {
            return Err(SuperblockError::Truncated {
                got: buf.len(),
                need: SB_FIXED_BYTES,
            });
        }
        let magic = le::u32_at(buf, off::MAGIC);
        if magic != MD_SB_MAGIC {
            return Err(SuperblockError::BadMagic { found: magic });
        }
        let major = le::u32_at(buf, off::MAJOR_VERSION);
        if major != 1 {
            return Err(SuperblockError::BadVersion(major));
        }
        let max_dev = le::u32_at(buf, off::MAX_DEV);
        if max_dev > MAX_DEV_LIMIT {
            return Err(SuperblockError::BadMaxDev(max_dev));
        }
        let need = SB_FIXED_BYTES + 2 * max_dev as usize;
        if buf.len() < need {
            return Err(SuperblockError::Truncated {
                got: buf.len(),
                need,
            });
        }
        let b = &buf[..need];
        let stored = le::u32_at(b, off::SB_CSUM);
        let computed = self::checksum(b);
        if checksum && stored != computed {
            return Err(SuperblockError::BadChecksum { stored, computed });
        }
        // md refuses non-zero padding: it may hold a feature this code does not know.
        if le::u32_at(b, off::PAD0) != 0 || b[off::PAD3..off::DEV_ROLES].iter().any(|&x| x != 0) {
            return Err(SuperblockError::Invalid {
                field: "padding",
                why: "reserved bytes are not zero (unknown feature?)".into(),
            });
        }
        let sb = Superblock {
            feature_map: le::u32_at(b, off::FEATURE_MAP),
            set_uuid: uuid_at(b, off::SET_UUID),
            set_name: decode_name(&b[off::SET_NAME..off::SET_NAME + SET_NAME_BYTES])?,
            ctime: le::u64_at(b, off::CTIME),
            level: le::u32_at(b, off::LEVEL) as i32,
            layout: le::u32_at(b, off::LAYOUT),
            size: le::u64_at(b, off::SIZE),
            chunksize: le::u32_at(b, off::CHUNKSIZE),
            raid_disks: le::u32_at(b, off::RAID_DISKS),
            bitmap_offset: le::u32_at(b, off::BITMAP_OFFSET) as i32,
            new_level: le::u32_at(b, off::NEW_LEVEL) as i32,
            reshape_position: le::u64_at(b, off::RESHAPE_POSITION),
            delta_disks: le::u32_at(b, off::DELTA_DISKS) as i32,
            new_layout: le::u32_at(b, off::NEW_LAYOUT),
            new_chunk: le::u32_at(b, off::NEW_CHUNK),
            new_offset: le::u32_at(b, off::NEW_OFFSET) as i32,
            data_offset: le::u64_at(b, off::DATA_OFFSET),
            data_size: le::u64_at(b, off::DATA_SIZE),
            super_offset: le::u64_at(b, off::SUPER_OFFSET),
            recovery_offset: le::u64_at(b, off::RECOVERY_OFFSET),
            dev_number: le::u32_at(b, off::DEV_NUMBER),
            cnt_corrected_read: le::u32_at(b, off::CNT_CORRECTED_READ),
            device_uuid: uuid_at(b, off::DEVICE_UUID),
            devflags: b[off::DEVFLAGS],
            bblog_shift: b[off::BBLOG_SHIFT],
            bblog_size: le::u16_at(b, off::BBLOG_SIZE),
            bblog_offset: le::u32_at(b, off::BBLOG_OFFSET) as i32,
            utime: le::u64_at(b, off::UTIME),
            events: le::u64_at(b, off::EVENTS),
            resync_offset: le::u64_at(b, off::RESYNC_OFFSET),
            sb_csum: stored,
            dev_roles: b[off::DEV_ROLES..]
                .chunks_exact(2)
                .map(|r| le::u16_at(r, 0))
                .collect(),
            logical_block_size: le::u32_at(b, off::LOGICAL_BLOCK_SIZE),
        };
        sb.validate()?;
        Ok((sb, computed))
    }

    /// Encodes into [`SB_IO_BYTES`] bytes (zero padded) with `max_dev = dev_roles.len()` and
    /// the checksum computed (`self.sb_csum` is ignored).
    ///
    /// # Panics
    /// If the record is invalid ([`Superblock::validate`]): writing it would corrupt the
    /// member's metadata, so this is a programmer error.
    pub fn encode(&self) -> Vec<u8> {
        if let Err(e) = self.validate() {
            panic!("refusing to encode an invalid md superblock: {e}");
        }
        let mut b = vec![0u8; SB_IO_BYTES];
        le::put(&mut b, off::MAGIC, &MD_SB_MAGIC.to_le_bytes());
        le::put(&mut b, off::MAJOR_VERSION, &1u32.to_le_bytes());
        le::put(&mut b, off::FEATURE_MAP, &self.feature_map.to_le_bytes());
        le::put(&mut b, off::SET_UUID, &self.set_uuid);
        le::put(&mut b, off::SET_NAME, self.set_name.as_bytes());
        le::put(&mut b, off::CTIME, &self.ctime.to_le_bytes());
        le::put(&mut b, off::LEVEL, &self.level.to_le_bytes());
        le::put(&mut b, off::LAYOUT, &self.layout.to_le_bytes());
        le::put(&mut b, off::SIZE, &self.size.to_le_bytes());
        le::put(&mut b, off::CHUNKSIZE, &self.chunksize.to_le_bytes());
        le::put(&mut b, off::RAID_DISKS, &self.raid_disks.to_le_bytes());
        le::put(
            &mut b,
            off::BITMAP_OFFSET,
            &self.bitmap_offset.to_le_bytes(),
        );
        le::put(&mut b, off::NEW_LEVEL, &self.new_level.to_le_bytes());
        le::put(
            &mut b,
            off::RESHAPE_POSITION,
            &self.reshape_position.to_le_bytes(),
        );
        le::put(&mut b, off::DELTA_DISKS, &self.delta_disks.to_le_bytes());
        le::put(&mut b, off::NEW_LAYOUT, &self.new_layout.to_le_bytes());
        le::put(&mut b, off::NEW_CHUNK, &self.new_chunk.to_le_bytes());
        le::put(&mut b, off::NEW_OFFSET, &self.new_offset.to_le_bytes());
        le::put(&mut b, off::DATA_OFFSET, &self.data_offset.to_le_bytes());
        le::put(&mut b, off::DATA_SIZE, &self.data_size.to_le_bytes());
        le::put(&mut b, off::SUPER_OFFSET, &self.super_offset.to_le_bytes());
        le::put(
            &mut b,
            off::RECOVERY_OFFSET,
            &self.recovery_offset.to_le_bytes(),
        );
        le::put(&mut b, off::DEV_NUMBER, &self.dev_number.to_le_bytes());
        le::put(
            &mut b,
            off::CNT_CORRECTED_READ,
            &self.cnt_corrected_read.to_le_bytes(),
        );
        le::put(&mut b, off::DEVICE_UUID, &self.device_uuid);
        b[off::DEVFLAGS] = self.devflags;
        b[off::BBLOG_SHIFT] = self.bblog_shift;
        le::put(&mut b, off::BBLOG_SIZE, &self.bblog_size.to_le_bytes());
        le::put(&mut b, off::BBLOG_OFFSET, &self.bblog_offset.to_le_bytes());
        le::put(&mut b, off::UTIME, &self.utime.to_le_bytes());
        le::put(&mut b, off::EVENTS, &self.events.to_le_bytes());
        le::put(
            &mut b,
            off::RESYNC_OFFSET,
            &self.resync_offset.to_le_bytes(),
        );
        le::put(
            &mut b,
            off::LOGICAL_BLOCK_SIZE,
            &self.logical_block_size.to_le_bytes(),
        );
        le::put(
            &mut b,
            off::MAX_DEV,
            &(self.dev_roles.len() as u32).to_le_bytes(),
        );
        for (i, role) in self.dev_roles.iter().enumerate() {
            le::put(&mut b, off::DEV_ROLES + 2 * i, &role.to_le_bytes());
        }
        let csum = checksum(&b[..self.sb_bytes()]);
        le::put(&mut b, off::SB_CSUM, &csum.to_le_bytes());
        b
    }

    /// Checks the record as [`Superblock::decode`] does after the checksum, and as
    /// [`Superblock::encode`] does before writing.
    pub fn validate(&self) -> Result<(), SuperblockError> {
        let invalid = |field, why: String| Err(SuperblockError::Invalid { field, why });
        let max_dev = self.dev_roles.len();
        if max_dev > MAX_DEV_LIMIT as usize {
            return Err(SuperblockError::BadMaxDev(
                max_dev.try_into().unwrap_or(u32::MAX),
            ));
        }
        let name = self.set_name.as_bytes();
        if name.len() > SET_NAME_BYTES || name.contains(&0) {
            return invalid(
                "set_name",
                format!("{:?} is over 32 bytes or holds NUL", self.set_name),
            );
        }
        if self.chunksize != 0 && !self.chunksize.is_power_of_two() {
            return invalid(
                "chunksize",
                format!("{} sectors is not a power of two", self.chunksize),
            );
        }
        if self.raid_disks == 0 || self.raid_disks as usize > max_dev {
            return invalid(
                "raid_disks",
                format!("{} is 0 or above max_dev {max_dev}", self.raid_disks),
            );
        }
        // Byte offsets of the data area must fit in a u64.
        let data_end = self.data_offset.checked_add(self.data_size);
        if !matches!(data_end, Some(end) if end <= u64::MAX / 512) {
            return invalid(
                "data_size",
                format!(
                    "data_offset {} + data_size {} overflows",
                    self.data_offset, self.data_size
                ),
            );
        }
        if self.size > self.data_size {
            return invalid(
                "size",
                format!(
                    "component size {} exceeds data_size {}",
                    self.size, self.data_size
                ),
            );
        }
        Ok(())
    }

    /// Bytes covered by the checksum: the fixed part and `max_dev` roles.
    pub fn sb_bytes(&self) -> usize {
        SB_FIXED_BYTES + 2 * self.dev_roles.len()
    }

    /// Fully in sync: md writes `resync_offset = MaxSector` on a clean shutdown.
    pub fn is_clean(&self) -> bool {
        self.resync_offset == MAX_SECTOR
    }

    /// Records a superblock update as md does: `events` + 1 and `utime` = now (seconds,
    /// passed in). Call once per write of the superblock to all members.
    ///
    /// # Panics
    /// If `events` would wrap: md would then take every member for stale.
    pub fn bump_events(&mut self, utime_secs: u64) {
        self.events = self
            .events
            .checked_add(1)
            .expect("md superblock events counter wrapped");
        self.utime = utime_secs & TIME_SECS_MASK;
    }

    /// Clean (`resync_offset = MAX_SECTOR`) or active/dirty (`resync_offset = 0`: a full
    /// resync after a crash).
    pub fn set_clean(&mut self, clean: bool) {
        self.resync_offset = if clean { MAX_SECTOR } else { 0 };
    }

    /// Creation time, seconds since the epoch (the low 40 bits of `ctime`).
    pub fn ctime_secs(&self) -> u64 {
        self.ctime & TIME_SECS_MASK
    }

    /// Last update time, seconds since the epoch (the low 40 bits of `utime`).
    pub fn utime_secs(&self) -> u64 {
        self.utime & TIME_SECS_MASK
    }

    /// This member's entry in `dev_roles` (an active slot, ROLE_SPARE, ROLE_FAULTY or
    /// ROLE_JOURNAL); `None` when `dev_number` is past `max_dev` (md then treats it as spare).
    pub fn role_of_this_device(&self) -> Option<u16> {
        self.dev_roles.get(self.dev_number as usize).copied()
    }

    /// This member's write-mostly and failfast flags (`devflags`).
    pub fn member_flags(&self) -> MemberFlags {
        MemberFlags::from_devflags(self.devflags)
    }

    /// The active slot of this member, if it has one.
    pub fn active_slot(&self) -> Option<u16> {
        self.role_of_this_device().filter(|&r| r < ROLE_MAX)
    }

    /// `max_dev` as written on disk.
    pub fn max_dev(&self) -> u32 {
        self.dev_roles.len() as u32
    }

    /// The array name without mdadm's "host:" prefix.
    pub fn name(&self) -> &str {
        self.set_name
            .rsplit_once(':')
            .map_or(&self.set_name, |(_, n)| n)
    }

    /// The "host" of mdadm's "host:name", if present.
    pub fn homehost(&self) -> Option<&str> {
        self.set_name.rsplit_once(':').map(|(h, _)| h)
    }

    /// The metadata version this superblock's own `super_offset` names: 0 is 1.1, 8 is 1.2,
    /// anything else can only be a 1.0 superblock near the end of its device.
    pub fn version(&self) -> MetadataVersion {
        match self.super_offset {
            0 => MetadataVersion::V1_1,
            SB_V12_OFFSET_SECTORS => MetadataVersion::V1_2,
            _ => MetadataVersion::V1_0,
        }
    }

    pub fn has_feature(&self, bit: u32) -> bool {
        self.feature_map & bit != 0
    }

    /// Internal bitmap location in sectors from the start of the member, if any.
    pub fn bitmap_sector(&self) -> Option<u64> {
        if !self.has_feature(FEATURE_BITMAP_OFFSET) {
            return None;
        }
        self.super_offset
            .checked_add_signed(i64::from(self.bitmap_offset))
    }

    /// Bad block log location (sector from the start of the member) and size in sectors.
    pub fn bblog_sector(&self) -> Option<(u64, u16)> {
        if self.bblog_size == 0 || self.bblog_offset == 0 {
            return None;
        }
        let at = self
            .super_offset
            .checked_add_signed(i64::from(self.bblog_offset))?;
        Some((at, self.bblog_size))
    }

    /// Whether the array keeps a partial parity log: FEATURE_PPL or FEATURE_MULTIPLE_PPLS.
    /// md writes FEATURE_MULTIPLE_PPLS alone (feature map 0x800) for an array with several
    /// PPLs per area, as Linux 6.12 does on every superblock update.
    pub fn has_ppl(&self) -> bool {
        self.feature_map & (FEATURE_PPL | FEATURE_MULTIPLE_PPLS) != 0
    }

    /// PPL offset (sectors from the superblock) and size: they share `bitmap_offset`'s bytes.
    pub fn ppl(&self) -> (i16, u16) {
        let raw = self.bitmap_offset as u32;
        ((raw & 0xffff) as u16 as i16, (raw >> 16) as u16)
    }

    /// Number of members holding each active slot `0..raid_disks` (md's "Array State").
    pub fn slot_counts(&self) -> Vec<u32> {
        let mut counts = vec![0u32; self.raid_disks as usize];
        for &r in &self.dev_roles {
            if let Some(c) = counts.get_mut(r as usize) {
                *c += 1;
            }
        }
        counts
    }
}

fn uuid_at(b: &[u8], at: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    u.copy_from_slice(&b[at..at + 16]);
    u
}

/// `set_name` is NUL padded; bytes after the first NUL are ignored, as md and mdadm do.
fn decode_name(raw: &[u8]) -> Result<String, SuperblockError> {
    let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
    std::str::from_utf8(&raw[..end])
        .map(str::to_owned)
        .map_err(|_| SuperblockError::Invalid {
            field: "set_name",
            why: "not UTF-8 (uraid would not write it back unchanged)".into(),
        })
}
