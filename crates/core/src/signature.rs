//! What a device already holds: md superblocks of every version, file systems and
//! partition tables, found by their magic numbers (mdadm warns about each before create).
//!
//! Pure: the caller reads the regions named by [`HEAD_BYTES`] and [`md_locations`] (each
//! [`MD_TAIL_BYTES`] long) and hands them over.

use crate::superblock::{uuid_string, MD_SB_MAGIC};

/// Bytes read from the start of the device: ext2/3/4 (at 1 KiB), xfs (at 0), btrfs (at
/// 64 KiB), MBR (sector 0), GPT (sector 1), md 1.1 (at 0) and 1.2 (at 4 KiB) all fit.
pub const HEAD_BYTES: u64 = 68 * 1024;
/// Bytes read at each md superblock location near the end (0.90 and 1.0).
pub const MD_TAIL_BYTES: u64 = 4096;

/// md metadata versions, by where their superblock lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MdVersion {
    V090,
    V10,
    V11,
    V12,
}

impl MdVersion {
    pub fn name(self) -> &'static str {
        match self {
            MdVersion::V090 => "0.90",
            MdVersion::V10 => "1.0",
            MdVersion::V11 => "1.1",
            MdVersion::V12 => "1.2",
        }
    }
}

/// Byte offset of each version's superblock on a device of `size_bytes` (md's rules:
/// 0.90 in the last 64 KiB-aligned 64 KiB; 1.0 at least 8 KiB from the end, 4 KiB
/// aligned; 1.1 at the start; 1.2 4 KiB from the start). Versions that do not fit are left
/// out.
pub fn md_locations(size_bytes: u64) -> Vec<(MdVersion, u64)> {
    let mut v = Vec::new();
    if size_bytes >= 128 * 1024 {
        v.push((MdVersion::V090, (size_bytes & !(64 * 1024 - 1)) - 64 * 1024));
    }
    let sectors = size_bytes / 512;
    if sectors >= 16 + 8 {
        v.push((MdVersion::V10, ((sectors - 16) & !7) * 512));
    }
    if size_bytes >= 4096 {
        v.push((MdVersion::V11, 0));
    }
    if size_bytes >= 8192 {
        v.push((MdVersion::V12, 4096));
    }
    v
}

/// Something found on a device that a new array would destroy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signature {
    /// An md superblock (its checksum is not checked: a damaged one still means data).
    Md {
        version: MdVersion,
        level: i32,
        raid_disks: u32,
        uuid: String,
        ctime_secs: u64,
    },
    FileSystem(&'static str),
    PartitionTable(&'static str),
}

impl Signature {
    /// mdadm's wording: "appears to be part of a raid array", "appears to contain ...".
    pub fn describe(&self) -> String {
        match self {
            Signature::Md {
                version,
                level,
                raid_disks,
                uuid,
                ..
            } => format!(
                "appears to be part of a raid array: metadata={} level={} devices={raid_disks} uuid={uuid}",
                version.name(),
                level_name(*level),
            ),
            Signature::FileSystem(fs) => format!("appears to contain an {fs} file system"),
            Signature::PartitionTable(t) => format!("appears to contain a {t} partition table"),
        }
    }
}

fn level_name(level: i32) -> String {
    match level {
        -1 => "linear".into(),
        -4 => "multipath".into(),
        -5 => "faulty".into(),
        l if l >= 0 => format!("raid{l}"),
        l => format!("{l}"),
    }
}

fn u32_le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// An md superblock of `version` at the start of `buf`, if its magic is there.
pub fn md_at(version: MdVersion, buf: &[u8]) -> Option<Signature> {
    if u32_le(buf, 0)? != MD_SB_MAGIC {
        return None;
    }
    match version {
        // mdp_superblock_s: 32-bit words, set_uuid0 at word 5 and uuid1..3 at words 13..15.
        MdVersion::V090 => {
            if u32_le(buf, 4)? != 0 {
                return None;
            }
            let mut uuid = [0u8; 16];
            for (i, w) in [20usize, 52, 56, 60].iter().enumerate() {
                uuid[i * 4..i * 4 + 4].copy_from_slice(buf.get(*w..*w + 4)?);
            }
            Some(Signature::Md {
                version,
                level: u32_le(buf, 28)? as i32,
                raid_disks: u32_le(buf, 40)?,
                uuid: uuid_string(&uuid),
                ctime_secs: u64::from(u32_le(buf, 24)?),
            })
        }
        _ => {
            if u32_le(buf, 4)? != 1 {
                return None;
            }
            let uuid: [u8; 16] = buf.get(16..32)?.try_into().ok()?;
            Some(Signature::Md {
                version,
                level: u32_le(buf, 72)? as i32,
                raid_disks: u32_le(buf, 92)?,
                uuid: uuid_string(&uuid),
                ctime_secs: u64_le(buf, 64)? & ((1 << 40) - 1),
            })
        }
    }
}

/// File systems and partition tables in the first [`HEAD_BYTES`] of a device.
pub fn in_head(head: &[u8]) -> Vec<Signature> {
    let mut v = Vec::new();
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    if at(1024 + 56, &[0x53, 0xef]) {
        v.push(Signature::FileSystem("ext2/ext3/ext4"));
    }
    if at(0, b"XFSB") {
        v.push(Signature::FileSystem("xfs"));
    }
    if at(64 * 1024 + 0x40, b"_BHRfS_M") {
        v.push(Signature::FileSystem("btrfs"));
    }
    if at(512, b"EFI PART") {
        v.push(Signature::PartitionTable("gpt"));
    } else if at(510, &[0x55, 0xaa]) {
        v.push(Signature::PartitionTable("dos (MBR)"));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md_locations_follow_md() {
        let l = md_locations(100 * 1024 * 1024 + 12345);
        let get = |ver| l.iter().find(|(v, _)| *v == ver).map(|(_, o)| *o);
        assert_eq!(get(MdVersion::V090), Some(100 * 1024 * 1024 - 64 * 1024));
        // 1.0: (sectors - 16) rounded down to 8 sectors.
        let sectors = (100u64 * 1024 * 1024 + 12345) / 512;
        assert_eq!(get(MdVersion::V10), Some(((sectors - 16) & !7) * 512));
        assert_eq!(get(MdVersion::V11), Some(0));
        assert_eq!(get(MdVersion::V12), Some(4096));
        assert!(md_locations(1024).is_empty());
    }

    #[test]
    fn finds_v1_and_v090_superblocks() {
        let mut b = vec![0u8; 4096];
        b[0..4].copy_from_slice(&MD_SB_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[16..32].copy_from_slice(&[0xab; 16]);
        b[64..72].copy_from_slice(&1_700_000_000u64.to_le_bytes());
        b[72..76].copy_from_slice(&5i32.to_le_bytes());
        b[92..96].copy_from_slice(&4u32.to_le_bytes());
        let s = md_at(MdVersion::V10, &b).unwrap();
        assert_eq!(
            s,
            Signature::Md {
                version: MdVersion::V10,
                level: 5,
                raid_disks: 4,
                uuid: uuid_string(&[0xab; 16]),
                ctime_secs: 1_700_000_000
            }
        );
        assert!(
            s.describe().contains("level=raid5 devices=4"),
            "{}",
            s.describe()
        );
        // A v1 superblock is not a 0.90 one.
        assert_eq!(md_at(MdVersion::V090, &b), None);
        let mut o = vec![0u8; 4096];
        o[0..4].copy_from_slice(&MD_SB_MAGIC.to_le_bytes());
        o[28..32].copy_from_slice(&1u32.to_le_bytes());
        o[40..44].copy_from_slice(&2u32.to_le_bytes());
        let s = md_at(MdVersion::V090, &o).unwrap();
        assert!(s.describe().contains("metadata=0.90 level=raid1 devices=2"));
        o[0] ^= 1;
        assert_eq!(md_at(MdVersion::V090, &o), None);
    }

    #[test]
    fn finds_file_systems_and_partition_tables() {
        let blank = vec![0u8; HEAD_BYTES as usize];
        assert!(in_head(&blank).is_empty());
        let mut ext = blank.clone();
        ext[1080..1082].copy_from_slice(&[0x53, 0xef]);
        assert_eq!(in_head(&ext), vec![Signature::FileSystem("ext2/ext3/ext4")]);
        let mut xfs = blank.clone();
        xfs[..4].copy_from_slice(b"XFSB");
        assert_eq!(in_head(&xfs), vec![Signature::FileSystem("xfs")]);
        let mut btrfs = blank.clone();
        btrfs[65536 + 64..65536 + 72].copy_from_slice(b"_BHRfS_M");
        assert_eq!(in_head(&btrfs), vec![Signature::FileSystem("btrfs")]);
        let mut mbr = blank.clone();
        mbr[510..512].copy_from_slice(&[0x55, 0xaa]);
        assert_eq!(in_head(&mbr), vec![Signature::PartitionTable("dos (MBR)")]);
        let mut gpt = mbr.clone();
        gpt[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(in_head(&gpt), vec![Signature::PartitionTable("gpt")]);
    }
}
