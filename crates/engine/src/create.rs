//! Making a new array, as mdadm --create with metadata 0.90, 1.0, 1.1 or 1.2.

use crate::array::{Array, Slot};
use crate::bitmap::BitmapState;
use crate::error::ArrayError;
use crate::member::Member;
use crate::meta::{write_superblock, write_superblock_090, Meta};
use std::sync::Arc;
use uraid_core::bitmap::{self as bm, BitmapSuper};
use uraid_core::geometry::{ArrayGeometry, Personality};
use uraid_core::superblock::{
    default_bitmap_space_sectors, default_data_offset_sectors, v10_avail_sectors,
    v10_bitmap_offset, CreateSpec, MemberFlags, MetadataVersion, Superblock, FEATURE_JOURNAL,
    FEATURE_RAID0_LAYOUT, ROLE_JOURNAL,
};
use uraid_core::superblock090::{
    bitmap_uuid090, sb090_offset_sectors, Sb090Context, SB090_BITMAP_OFFSET_SECTORS,
    SB090_BITMAP_ROOM_SECTORS, SB090_DISKS, SB090_MAX_MEMBER_SECTORS,
};
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};

/// mdadm's default chunk: 512 KiB.
pub const DEFAULT_CHUNK_SECTORS: u64 = 1024;

/// The superblock format [`create`] writes (mdadm's `-e`/`--metadata`): 0.90, which has a
/// codec of its own, or one of the 1.x placements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metadata {
    /// 0.90: the superblock at the last 64 KiB-aligned 64 KiB of each member, data from
    /// sector 0 up to it. At most 27 devices, 2 TiB per member for levels other than
    /// raid0, a bitmap only in the 64 KiB after the superblock, no journal or PPL.
    V0_90,
    /// 1.0, 1.1 or 1.2: a version 1 superblock where its version puts it.
    V1(MetadataVersion),
}

impl Default for Metadata {
    /// mdadm's default, 1.2.
    fn default() -> Metadata {
        Metadata::V1(MetadataVersion::V1_2)
    }
}

impl From<MetadataVersion> for Metadata {
    fn from(v: MetadataVersion) -> Metadata {
        Metadata::V1(v)
    }
}

impl Metadata {
    /// mdadm's spellings: "0.90" (and "0.9", "0") for 0.90, the 1.x ones as
    /// [`MetadataVersion::parse`] reads them ("1" and "default" mean 1.2).
    pub fn parse(s: &str) -> Option<Metadata> {
        match s.trim() {
            "0.90" | "0.9" | "0" => Some(Metadata::V0_90),
            other => MetadataVersion::parse(other).map(Metadata::V1),
        }
    }

    /// As mdadm names it ("0.90", "1.2").
    pub fn name(self) -> &'static str {
        match self {
            Metadata::V0_90 => "0.90",
            Metadata::V1(v) => v.name(),
        }
    }

    /// The 1.x placement; None for 0.90.
    pub fn v1(self) -> Option<MetadataVersion> {
        match self {
            Metadata::V0_90 => None,
            Metadata::V1(v) => Some(v),
        }
    }
}

/// What [`create`] makes (mdadm --create's options).
#[derive(Clone)]
pub struct CreateOptions {
    /// The RAID level.
    pub level: Level,
    /// md layout number; None picks mdadm's default for the level.
    pub layout: Option<u32>,
    /// Chunk size in sectors; None picks mdadm's default ([`DEFAULT_CHUNK_SECTORS`]).
    pub chunk_sectors: Option<u64>,
    /// Component size in sectors; None uses the largest that fits every member.
    pub size_sectors: Option<u64>,
    /// Array name ("host:name" is mdadm's convention; a name without ':' gets the host).
    pub name: String,
    /// Add an internal write-intent bitmap (mdadm's --bitmap=internal).
    pub bitmap: bool,
    /// Bitmap chunk in bytes (mdadm's --bitmap-chunk); None picks mdadm's default.
    pub bitmap_chunk_bytes: Option<u32>,
    /// Seconds between bitmap daemon passes (mdadm's --delay); None: mdadm's 5.
    pub bitmap_daemon_sleep_secs: Option<u32>,
    /// Skip the initial sync: the caller promises the members are consistent.
    pub assume_clean: bool,
    /// The array UUID; None makes a random one.
    pub uuid: Option<[u8; 16]>,
    /// Where data starts on each member, in sectors; None picks mdadm's default.
    pub data_offset_sectors: Option<u64>,
    /// A write journal device (md's --write-journal): raid4/5/6 only.
    pub journal: Option<Arc<dyn Member>>,
    /// Superblock format (mdadm's -e): where the superblock, bitmap and data go.
    pub metadata: Metadata,
    /// The array's clock (see [`Clock`](crate::Clock)); the system's by default.
    pub clock: crate::clock::Clock,
    /// md's flags of each member (mdadm --write-mostly, --failfast), in the order of the
    /// devices given to [`create`]; members past its end have none.
    pub member_flags: Vec<MemberFlags>,
    /// mdadm's `--consistency-policy=ppl`: close the raid5 write hole with md's partial
    /// parity log on each member (raid5 only; not with a bitmap or a journal).
    pub ppl: bool,
    /// mdadm's `--write-zeroes`: zero every member's data area (the device's zeroing
    /// offload where it has one, all members at once) before the superblocks are written,
    /// so that no initial sync is needed and the array knows it was never written (see
    /// [`crate::Array::never_written_bytes`]): a recovery passes over what is still
    /// unwritten, on any device.
    pub write_zeroes: bool,
}

impl CreateOptions {
    /// Options for `level` with every other choice left to mdadm's defaults.
    pub fn new(level: Level) -> CreateOptions {
        CreateOptions {
            level,
            layout: None,
            chunk_sectors: None,
            size_sectors: None,
            name: "uraid".into(),
            bitmap: false,
            bitmap_chunk_bytes: None,
            bitmap_daemon_sleep_secs: None,
            assume_clean: false,
            uuid: None,
            data_offset_sectors: None,
            journal: None,
            metadata: Metadata::default(),
            clock: Default::default(),
            member_flags: Vec::new(),
            ppl: false,
            write_zeroes: false,
        }
    }
}

/// `--write-zeroes`: on each member the sectors it gives the array (`used` of them from
/// md's data_offset) made zeros, every member on a thread of its own (a device's offload,
/// or zero buffers where it has none, can take minutes on a large disk), and made
/// durable. Nothing else is written yet: a failure leaves no superblock.
fn zero_data_areas(
    devs: &[Option<Arc<dyn Member>>],
    sbs: &[Option<Superblock>],
    used: &(dyn Fn(&Superblock) -> u64 + Sync),
) -> Result<(), ArrayError> {
    let how = crate::member::ZeroHow { unmap: true };
    let failed: Vec<String> = std::thread::scope(|s| {
        let jobs: Vec<_> = devs
            .iter()
            .zip(sbs)
            .filter_map(|(d, sb)| Some((d.as_ref()?, sb.as_ref()?)))
            .map(|(d, sb)| {
                s.spawn(move || {
                    let (off, len) = (sb.data_offset * SECTOR_BYTES, used(sb) * SECTOR_BYTES);
                    d.write_zeroes(off, len, how)
                        .and_then(|()| d.flush())
                        .map_err(|e| format!("{}: {e}", d.name()))
                })
            })
            .collect();
        jobs.into_iter()
            .filter_map(|j| j.join().expect("a zeroing thread panicked").err())
            .collect()
    });
    if failed.is_empty() {
        return Ok(());
    }
    Err(ArrayError::Create(format!(
        "--write-zeroes could not zero the data area of {}; no superblock was written: \
         create without --write-zeroes (the initial sync then makes the members \
         consistent)",
        failed.join("; ")
    )))
}

/// mdadm's default layout for a level.
pub fn default_layout(level: Level) -> u32 {
    match level {
        Level::Raid5 | Level::Raid6 => uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC,
        Level::Raid4 => uraid_core::geometry::raid5::ALGORITHM_PARITY_N,
        Level::Raid10 => 0x102,
        _ => 0,
    }
}

pub fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Ok(f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = (&f).read_exact(&mut u);
    }
    if u == [0; 16] {
        // No /dev/urandom: time and address entropy is still unique enough for a UUID.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let addr = &t as *const u128 as usize as u128;
        u.copy_from_slice(&(t ^ (addr << 64)).to_le_bytes());
    }
    u
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The PPL area of a new member, where mdadm puts it (super1.c's "ppl" update): before
/// the data, 8 sectors after the superblock up to the bad block log (or the data); after
/// the data (1.0), from the data's end up to the bad block log before the superblock.
/// 1 MiB (several PPLs) when there is room, else a header and max(chunk, 128 KiB).
/// Sets FEATURE_PPL, and FEATURE_MULTIPLE_PPLS when md will write several PPLs.
pub(crate) fn place_ppl(sb: &mut Superblock, chunk_sectors: u64) -> Result<(), String> {
    use uraid_core::superblock::{FEATURE_MULTIPLE_PPLS, FEATURE_PPL};
    let bb = i64::from(sb.bblog_offset);
    let bb_size = if sb.bblog_size > 0 {
        i64::from(sb.bblog_size)
    } else {
        0
    };
    let before_data = sb.super_offset < sb.data_offset;
    let (offset, mut space): (i64, i64) = if before_data {
        // The bad block log moves after the PPL (mdadm keeps it behind the PPL too).
        (8, (sb.data_offset - sb.super_offset) as i64 - 8 - bb_size)
    } else {
        let off = (-((sb.super_offset - sb.data_offset - sb.data_size) as i64)).max(-32768);
        let end = if bb < 0 { bb } else { 0 };
        (off, end - off)
    };
    if space < 16 {
        return Err(format!(
            "no room for a partial parity log ({space} sectors between the superblock and \
             the data): give a larger --data-offset"
        ));
    }
    if space >= 2048 {
        space = 2048;
    } else {
        space = space.min(8 + (chunk_sectors as i64).max(256));
    }
    let space = uraid_core::ppl::PplArea::new(space as u64)
        .ok_or_else(|| "no room for a partial parity log".to_string())?
        .size_sectors as i64;
    sb.bitmap_offset = ((offset as i16 as u16 as u32) | ((space as u32) << 16)) as i32;
    if before_data && bb_size > 0 {
        sb.bblog_offset = (8 + space) as i32;
    }
    sb.feature_map |= FEATURE_PPL;
    if (space as u64) * SECTOR_BYTES >= uraid_core::ppl::MULTIPLE_PPL_MIN_BYTES {
        sb.feature_map |= FEATURE_MULTIPLE_PPLS;
    }
    Ok(())
}

/// What `dev` already holds that a new array would overwrite: md superblocks of every
/// version (uraid opens only 1.2, but mdadm warns about all), file systems and partition
/// tables. Reads only.
pub fn existing_signatures(
    dev: &dyn Member,
) -> Result<Vec<uraid_core::signature::Signature>, ArrayError> {
    use uraid_core::signature::{self as sig, MdVersion};
    let size = dev.size_bytes();
    let head_len = (size.min(sig::HEAD_BYTES) / SECTOR_BYTES * SECTOR_BYTES) as usize;
    let mut head = crate::buf::AlignedBuf::new(head_len);
    if head_len > 0 {
        dev.read_at(&mut head, 0)?;
    }
    let mut found = Vec::new();
    for (version, at) in sig::md_locations(size) {
        let md = match version {
            MdVersion::V11 | MdVersion::V12 => sig::md_at(version, &head[at as usize..]),
            _ => {
                let mut buf = crate::buf::AlignedBuf::new(sig::MD_TAIL_BYTES as usize);
                dev.read_at(&mut buf, at)?;
                sig::md_at(version, &buf)
            }
        };
        found.extend(md);
    }
    found.extend(sig::in_head(&head));
    Ok(found)
}

/// Create an array on `devs` (one per role; None = "missing") and return it running.
pub fn create(
    devs: Vec<Option<Arc<dyn Member>>>,
    opts: &CreateOptions,
) -> Result<Array, ArrayError> {
    create_confirmed(devs, opts, &mut || Ok(()))
}

/// [`create`], calling `confirm` once everything is validated and before the first byte is
/// written (mdadm asks "Continue creating array?" there); its error aborts the create.
pub fn create_confirmed(
    devs: Vec<Option<Arc<dyn Member>>>,
    opts: &CreateOptions,
    confirm: &mut dyn FnMut() -> Result<(), ArrayError>,
) -> Result<Array, ArrayError> {
    let err = |m: String| ArrayError::Create(m);
    let level = opts.level;
    let raid_disks = devs.len();
    if opts.member_flags.len() > raid_disks {
        return Err(err(format!(
            "member flags given for {} members, but the array has {raid_disks}",
            opts.member_flags.len()
        )));
    }
    let min = match level {
        Level::Raid0 | Level::Raid1 => 1,
        Level::Raid4 | Level::Raid5 | Level::Raid10 => 2,
        Level::Raid6 => 4,
    };
    if raid_disks < min {
        return Err(err(format!(
            "{level} needs at least {min} devices, got {raid_disks}"
        )));
    }
    let layout = opts.layout.unwrap_or_else(|| default_layout(level));
    let chunk_sectors = if level == Level::Raid1 {
        0
    } else {
        opts.chunk_sectors.unwrap_or(DEFAULT_CHUNK_SECTORS)
    };
    if level != Level::Raid1 && (chunk_sectors < 8 || !chunk_sectors.is_power_of_two()) {
        return Err(err(format!(
            "chunk size {} KiB is not a power of two of at least 4 KiB",
            chunk_sectors / 2
        )));
    }
    let present: Vec<&Arc<dyn Member>> = devs.iter().flatten().collect();
    if present.is_empty() {
        return Err(err("no devices given (all missing)".into()));
    }
    // One device under two names (a symlink, a hard link, ./x and x) would hold two roles.
    let mut named: Vec<&dyn Member> = present.iter().map(|d| d.as_ref()).collect();
    named.extend(opts.journal.as_deref());
    if let Some((i, j)) = crate::placement::first_duplicate(&named) {
        let what = if j == present.len() {
            "is both a member and the journal".to_string()
        } else {
            "is given twice".to_string()
        };
        return Err(err(if named[i].name() == named[j].name() {
            format!("{} {what}", named[i].name())
        } else {
            format!(
                "{} and {} are one device ({}): it {what}",
                named[i].name(),
                named[j].name(),
                named[i].device_id()
            )
        }));
    }
    let min_dev_sectors = present
        .iter()
        .map(|d| d.size_bytes() / SECTOR_BYTES)
        .min()
        .expect("one");
    let v090 = opts.metadata == Metadata::V0_90;
    // 0.90: the bitmap fills at most the rest of the 64 KiB after the superblock.
    let bitmap_space = if v090 {
        SB090_BITMAP_ROOM_SECTORS
    } else {
        default_bitmap_space_sectors(min_dev_sectors)
    };
    // 0.90's superblock is after the data, as 1.0's is.
    let at_end = match opts.metadata {
        Metadata::V0_90 => true,
        Metadata::V1(v) => v.at_end(),
    };
    if v090 {
        // Refused before anything is written: what 0.90 cannot hold.
        let devices = raid_disks + usize::from(opts.journal.is_some());
        if devices > SB090_DISKS {
            return Err(err(format!(
                "metadata 0.90 describes at most {SB090_DISKS} devices, not {devices}: use 1.2"
            )));
        }
        if opts.journal.is_some() {
            return Err(err(
                "a write journal needs metadata 1.x (0.90 has no journal role)".into(),
            ));
        }
        if opts.data_offset_sectors.is_some_and(|o| o != 0) {
            return Err(err(
                "metadata 0.90 keeps its data from sector 0: no data offset".into(),
            ));
        }
    }
    // 1.0 and 0.90 keep their data from sector 0; 1.1 and 1.2 after the superblock and
    // its reserves.
    let data_offset = opts.data_offset_sectors.unwrap_or_else(|| {
        if at_end {
            0
        } else {
            default_data_offset_sectors(min_dev_sectors, chunk_sectors as u32, bitmap_space)
        }
    });
    let round = if level == Level::Raid1 {
        128
    } else {
        chunk_sectors
    };
    let avail = |d: &Arc<dyn Member>| -> Result<u64, ArrayError> {
        let s = d.size_bytes() / SECTOR_BYTES;
        // 1.0: the superblock, bad block log and bitmap reserve sit at the end; 0.90:
        // everything below its superblock is data (mdadm's MD_NEW_SIZE_SECTORS).
        let end = if v090 {
            sb090_offset_sectors(s).unwrap_or(0)
        } else if at_end {
            v10_avail_sectors(s)
        } else {
            s
        };
        let usable = end.saturating_sub(data_offset) / round * round;
        if usable == 0 {
            return Err(err(format!(
                "{}: device of {} bytes is too small (needs more than {} KiB for metadata and one chunk)",
                d.name(),
                d.size_bytes(),
                (data_offset + round) / 2
            )));
        }
        Ok(usable)
    };
    let mut min_avail = u64::MAX;
    for d in &present {
        min_avail = min_avail.min(avail(d)?);
    }
    let size = match opts.size_sectors {
        Some(s) => {
            let s = s / round.max(8) * round.max(8);
            if s == 0 || s > min_avail {
                return Err(err(format!(
                    "requested size {} KiB does not fit: the smallest member has {} KiB after metadata",
                    s / 2,
                    min_avail / 2
                )));
            }
            s
        }
        None => min_avail,
    };
    // md records a 0.90 component's size in 32 bits of KiB; mdadm allows 2 TiB (older
    // kernels misread more). raid0 does not use the recorded size.
    if v090 && level != Level::Raid0 && size > SB090_MAX_MEMBER_SECTORS {
        return Err(err(format!(
            "metadata 0.90 allows at most 2 TiB per member for {level}, and the component \
             would be {} KiB: use 1.2, or --size of at most {} KiB. Nothing was written",
            size / 2,
            SB090_MAX_MEMBER_SECTORS / 2
        )));
    }
    let member_sectors: Vec<u64> = if level == Level::Raid0 {
        let mut v = Vec::new();
        for d in devs.iter() {
            match d {
                Some(d) => v.push(avail(d)?),
                None => {
                    return Err(err(
                        "raid0 has no redundancy: no member can be missing".into()
                    ))
                }
            }
        }
        v
    } else {
        Vec::new()
    };
    let multizone = level == Level::Raid0 && member_sectors.iter().any(|&s| s != member_sectors[0]);
    // Multi-zone raid0 needs an explicit layout for Linux to start it; md's alternate
    // layout is the one recommended for new arrays.
    let layout = if multizone && opts.layout.is_none() {
        2
    } else {
        layout
    };
    let geometry = ArrayGeometry {
        level,
        layout,
        chunk_sectors,
        raid_disks,
        dev_sectors: if level == Level::Raid0 { 0 } else { size },
        member_sectors: member_sectors.clone(),
    };
    let personality = Personality::new(&geometry)?;
    let missing: Vec<MemberIdx> = devs
        .iter()
        .enumerate()
        .filter(|(_, d)| d.is_none())
        .map(|(i, _)| MemberIdx(i))
        .collect();
    if !personality.survives(&missing) {
        return Err(err(format!(
            "{level} with {} missing member(s) cannot hold data (it tolerates {})",
            missing.len(),
            personality.max_degraded()
        )));
    }
    let uuid = opts.uuid.unwrap_or_else(random_uuid);
    let name = if opts.name.contains(':') {
        opts.name.clone()
    } else {
        format!("{}:{}", hostname(), opts.name)
    };
    let mut name = name;
    name.truncate(32);
    // md's bitmap covers member sectors, except for raid10 where it covers the array.
    let sync_size = match level {
        Level::Raid0 => 0,
        Level::Raid10 => personality.array_sectors(),
        _ => size,
    };
    let bitmap = if opts.bitmap {
        if level == Level::Raid0 {
            return Err(err(
                "raid0 has no redundancy, so it cannot have a bitmap".into()
            ));
        }
        let chunk = match opts.bitmap_chunk_bytes {
            Some(c) if c < 512 || !c.is_power_of_two() => {
                return Err(err(format!(
                    "bitmap chunk {c} is not a power of two of at least 512 bytes"
                )))
            }
            Some(c) => c,
            None => bm::default_chunk_bytes(sync_size, bitmap_space)
                .ok_or_else(|| err("no room for an internal bitmap".into()))?,
        };
        // 0.90's bitmap carries the uuid words in this host's (little-endian) order.
        let bitmap_uuid = if v090 { bitmap_uuid090(&uuid) } else { uuid };
        let bms = BitmapSuper::new(
            bitmap_uuid,
            sync_size,
            chunk,
            opts.bitmap_daemon_sleep_secs
                .unwrap_or(bm::DEFAULT_DAEMON_SLEEP_SECS),
        )
        .map_err(|e| err(format!("bitmap: {e}")))?;
        if v090 && bms.space_bytes() / SECTOR_BYTES > SB090_BITMAP_ROOM_SECTORS {
            return Err(err(format!(
                "a 0.90 internal bitmap holds at most {} KiB: bitmap chunk {chunk} bytes needs \
                 {} KiB; give a larger --bitmap-chunk (or none), or use 1.2",
                SB090_BITMAP_ROOM_SECTORS / 2,
                bms.space_bytes() / 1024
            )));
        }
        if !at_end && 8 + bms.space_bytes() / SECTOR_BYTES > data_offset {
            return Err(err("the bitmap does not fit before the data offset".into()));
        }
        Some(bms)
    } else {
        None
    };
    let redundant = level != Level::Raid0;
    let all_zero = opts.write_zeroes || present.iter().all(|d| d.known_zero());
    let needs_sync = redundant && !opts.assume_clean && !all_zero;
    let spec = CreateSpec {
        set_uuid: uuid,
        set_name: name,
        ctime_secs: opts.clock.wall_secs(),
        level: level.md_level(),
        layout,
        chunk_sectors: chunk_sectors as u32,
        raid_disks: raid_disks as u32,
        spares: 0,
        missing: missing.iter().map(|m| m.0 as u32).collect(),
        size_sectors: if level == Level::Raid0 { 0 } else { size },
        data_offset_sectors: data_offset,
        internal_bitmap: match &bitmap {
            // 0.90: right after the superblock, in its 64 KiB reserved area.
            Some(b) if v090 => Some((SB090_BITMAP_OFFSET_SECTORS, b.space_bytes() / SECTOR_BYTES)),
            // 1.0: the bitmap ends where the bad block log below the superblock begins.
            Some(b) if at_end => {
                let space = b.space_bytes() / SECTOR_BYTES;
                let offset = v10_bitmap_offset(space)
                    .ok_or_else(|| err("the bitmap is too large".into()))?;
                Some((offset, space))
            }
            Some(b) => Some((8, b.space_bytes() / SECTOR_BYTES)),
            None => None,
        },
        bad_block_log: true,
        clean: true,
        // 0.90's records are made from this spec by their own codec, which has no
        // version 1 placement and reads none.
        version: opts.metadata.v1().unwrap_or(MetadataVersion::V1_2),
    };
    if let Some(j) = &opts.journal {
        if !level.has_parity() {
            return Err(err(format!(
                "a write journal is for raid4/5/6, not {level}"
            )));
        }
        if opts.bitmap {
            return Err(err(
                "a write journal and a bitmap do not go together (as in mdadm)".into(),
            ));
        }
        if j.size_bytes() / SECTOR_BYTES < data_offset + 64 * 8 {
            return Err(err(format!("journal {} is too small", j.name())));
        }
    }
    if opts.ppl {
        if level != Level::Raid5 {
            return Err(err(format!(
                "--consistency-policy=ppl is for raid5 only (as in md), not {level}"
            )));
        }
        if opts.bitmap || opts.journal.is_some() || v090 {
            return Err(err(
                "--consistency-policy=ppl goes with neither a bitmap, a write journal nor \
                 metadata 0.90 (as in mdadm)"
                    .into(),
            ));
        }
    }
    let mut spec = spec;
    if opts.journal.is_some() {
        spec.spares = 1;
    }
    let mut sbs: Vec<Option<Superblock>> = Vec::with_capacity(raid_disks);
    for (i, d) in devs.iter().enumerate() {
        match d {
            Some(d) if v090 => {
                let sb = uraid_core::superblock090::new_v1_for_create(
                    &spec,
                    i as u32,
                    d.size_bytes() / SECTOR_BYTES,
                )
                .map_err(|e| err(format!("{}: {e}", d.name())))?;
                if sb.data_size < size {
                    return Err(err(format!(
                        "{}: {} sectors of data space, the component needs {size}",
                        d.name(),
                        sb.data_size
                    )));
                }
                sbs.push(Some(sb));
            }
            Some(d) => {
                let mut sb = Superblock::new_for_create(
                    &spec,
                    i as u32,
                    random_uuid(),
                    d.size_bytes() / SECTOR_BYTES,
                )
                .map_err(|e| err(format!("{}: {e}", d.name())))?;
                if sb.data_size < size {
                    return Err(err(format!(
                        "{}: {} sectors of data space, the component needs {size}",
                        d.name(),
                        sb.data_size
                    )));
                }
                if multizone {
                    sb.feature_map |= FEATURE_RAID0_LAYOUT;
                }
                if level == Level::Raid0 {
                    // md reads each raid0 member's size from data_size.
                    sb.data_size = member_sectors[i];
                }
                if opts.ppl {
                    place_ppl(&mut sb, chunk_sectors)
                        .map_err(|e| err(format!("{}: {e}", d.name())))?;
                }
                sb.devflags = opts
                    .member_flags
                    .get(i)
                    .copied()
                    .unwrap_or_default()
                    .devflags();
                sbs.push(Some(sb));
            }
            None => sbs.push(None),
        }
    }
    // The journal device: the next device number, role "journal" in every superblock,
    // journal_tail (its recovery_offset) 0.
    let journal_sb = match &opts.journal {
        Some(j) => {
            let mut jsb = Superblock::new_for_create(
                &spec,
                raid_disks as u32,
                random_uuid(),
                j.size_bytes() / SECTOR_BYTES,
            )
            .map_err(|e| err(format!("{}: {e}", j.name())))?;
            for sb in sbs.iter_mut().flatten().chain(std::iter::once(&mut jsb)) {
                sb.feature_map |= FEATURE_JOURNAL;
                sb.dev_roles[raid_disks] = ROLE_JOURNAL;
            }
            jsb.recovery_offset = 0;
            Some(jsb)
        }
        None => None,
    };
    // 0.90's device table lists the devices present.
    let cx090 = v090.then(|| Sb090Context {
        present: sbs.iter().flatten().map(|sb| sb.dev_number).collect(),
        ..Sb090Context::default()
    });
    confirm()?;
    if opts.write_zeroes {
        // The component each member gives the array (raid0: its own size).
        let used = |sb: &Superblock| {
            if level == Level::Raid0 {
                sb.data_size
            } else {
                size
            }
        };
        zero_data_areas(&devs, &sbs, &used)?;
    }
    // Write the superblocks (and bitmaps) before any data, so a failed create leaves
    // members that say what they are.
    for (d, sb) in devs.iter().zip(&sbs) {
        if let (Some(d), Some(sb)) = (d, sb) {
            match &cx090 {
                Some(cx) => write_superblock_090(d.as_ref(), sb, cx)?,
                None => write_superblock(d.as_ref(), sb)?,
            }
            if let Some(bms) = &bitmap {
                let mut area = bm::initial_area(bms);
                // Freshly created and in sync: no chunk is dirty.
                area[bm::BITMAP_SUPER_BYTES..].fill(0);
                let off = sb.bitmap_sector().expect("a bitmap superblock") * SECTOR_BYTES;
                let mut buf = crate::buf::AlignedBuf::new(area.len());
                buf.copy_from_slice(&area);
                d.write_at(&buf, off)?;
                d.flush()?;
            }
        }
    }
    let template = sbs.iter().flatten().next().expect("one member").clone();
    let slots: Vec<Slot> = devs
        .iter()
        .zip(&sbs)
        .map(|(d, sb)| {
            let slot = Slot::new(
                d.clone(),
                sb.as_ref()
                    .map(|s| s.data_offset * SECTOR_BYTES)
                    .unwrap_or(0),
            );
            if let Some(sb) = sb {
                slot.set_member_flags(sb.member_flags());
            }
            slot
        })
        .collect();
    let mut meta = Meta::new(template, sbs);
    meta.v090 = v090.then(Sb090Context::default);
    if let Some(bms) = bitmap {
        let offset = i64::from(meta.template.bitmap_offset);
        meta.bitmap = Some(BitmapState::new(bms, offset));
    }
    let journal = match (&opts.journal, journal_sb) {
        (Some(dev), Some(jsb)) => {
            write_superblock(dev.as_ref(), &jsb)?;
            let area = crate::journal::JournalArea {
                data_offset_bytes: jsb.data_offset * SECTOR_BYTES,
                size_sectors: jsb.data_size,
            };
            let seq = u64::from_le_bytes(random_uuid()[..8].try_into().expect("8 bytes")) >> 1;
            let j = crate::journal::Journal::format(dev.clone(), area, &uuid, seq)?;
            meta.journal = Some((dev.clone(), jsb));
            Some(j)
        }
        _ => None,
    };
    let mut array = crate::levels::new_array(geometry, slots.into(), meta, opts.clock.clone())?;
    if let Some(j) = journal {
        array.set_journal(j);
    }
    if opts.ppl {
        array.start_ppl(false)?;
    }
    if all_zero {
        // Zeros on every member (as they came, or zeroed above): nothing was written
        // anywhere yet.
        array.written.forget_all();
    }
    if needs_sync {
        if missing.is_empty() {
            array.resync()?;
        } else {
            // Degraded from the start: nothing to resync against, as md.
            array.meta().set_resync_done();
        }
    }
    {
        let mut meta = array.meta();
        meta.write_all(&array)?;
    }
    Ok(array)
}
