//! The sample md 0.90/0.91 superblocks the core's 0.90 tests start from, written word by
//! word from md_p.h's `mdp_super_t` (not through the encoder under test), in one place:
//! superblock090_golden.rs, superblock090_encode.rs and superblock091.rs each take a
//! [`Record090`] and change only what their test is about.

// Each test binary uses part of this module.
#![allow(dead_code)]

use uraid_core::superblock090::{
    checksum090, ByteOrder, DISK_ACTIVE, DISK_SYNC, SB090_STATE_CLEAN,
};

/// Device sectors whose 0.90 place (sector 130_944) leaves 65_472 KiB below it.
pub const DEVICE_SECTORS: u64 = 131_072;

/// Word 38, the checksum.
pub const WORD_SB_CSUM: usize = 38;
/// The first word of the device table (27 descriptors of 32 words), then `this_disk`.
pub const WORD_DISKS: usize = 128;
pub const WORD_THIS_DISK: usize = WORD_DISKS + 27 * 32;

/// Word `word` of a record in `order`.
pub fn put(b: &mut [u8], word: usize, v: u32, order: ByteOrder) {
    let bytes = match order {
        ByteOrder::Little => v.to_le_bytes(),
        ByteOrder::Big => v.to_be_bytes(),
    };
    b[4 * word..4 * word + 4].copy_from_slice(&bytes);
}

/// Stores the checksum of the record's bytes.
pub fn seal(b: &mut [u8], order: ByteOrder) {
    let c = checksum090(b, order);
    put(b, WORD_SB_CSUM, c, order);
}

/// md 0.91's reshape words (44-49).
#[derive(Clone, Copy, Debug)]
pub struct Reshape091 {
    /// Array sector, in words 44 (low) and 45 (high).
    pub position: u64,
    pub new_level: u32,
    pub delta_disks: i32,
    pub new_layout: u32,
    /// Bytes.
    pub new_chunk: u32,
}

/// A clean raid5 (left-symmetric, 64 KiB chunks) of `raid_disks` devices, all active and
/// in sync (device `i` is 8:16i in role `i`), seen from member 1.
#[derive(Clone, Debug)]
pub struct Record090 {
    pub order: ByteOrder,
    /// 90, or 91 for a record mid-reshape.
    pub minor_version: u32,
    pub size_kib: u32,
    pub raid_disks: u32,
    pub md_minor: u32,
    /// Both halves placed as the writer's byte order puts them (low word first on a
    /// little-endian writer, high word first on a big-endian one); cp_events the same.
    pub events: u64,
    /// md writes MaxSector cut to 32 bits for a clean array.
    pub recovery_cp: u32,
    /// Written only when set.
    pub reshape: Option<Reshape091>,
}

impl Record090 {
    /// 3 devices, events 0x1_0000_0002, preferred minor 7, 65_472 KiB each (all the
    /// space below the superblock on [`DEVICE_SECTORS`]), recovery_cp MaxSector.
    pub fn raid5(order: ByteOrder) -> Record090 {
        Record090 {
            order,
            minor_version: 90,
            size_kib: 65_472,
            raid_disks: 3,
            md_minor: 7,
            events: 0x1_0000_0002,
            recovery_cp: 0xffff_ffff,
            reshape: None,
        }
    }

    /// The record's 4096 bytes, checksum sealed.
    pub fn bytes(&self) -> Vec<u8> {
        let order = self.order;
        let mut b = vec![0u8; 4096];
        let mut p = |w: usize, v: u32| put(&mut b, w, v, order);
        p(0, 0xa92b_4efc);
        p(1, 0);
        p(2, self.minor_version);
        p(3, 0);
        p(5, 0x1111_2222);
        p(6, 1_700_000_000);
        p(7, 5);
        p(8, self.size_kib);
        p(9, self.raid_disks);
        p(10, self.raid_disks);
        p(11, self.md_minor);
        p(13, 0x3333_4444);
        p(14, 0x5555_6666);
        p(15, 0x7777_8888);
        p(32, 1_700_000_100);
        p(33, SB090_STATE_CLEAN);
        p(34, self.raid_disks);
        p(35, self.raid_disks);
        let (lo, hi) = (self.events as u32, (self.events >> 32) as u32);
        let (e0, e1) = match order {
            ByteOrder::Little => (lo, hi),
            ByteOrder::Big => (hi, lo),
        };
        p(39, e0);
        p(40, e1);
        p(41, e0);
        p(42, e1);
        p(43, self.recovery_cp);
        if let Some(r) = self.reshape {
            p(44, r.position as u32);
            p(45, (r.position >> 32) as u32);
            p(46, r.new_level);
            p(47, r.delta_disks as u32);
            p(48, r.new_layout);
            p(49, r.new_chunk);
        }
        p(64, 2);
        p(65, 65_536);
        for i in 0..self.raid_disks {
            let base = WORD_DISKS + 32 * i as usize;
            p(base, i);
            p(base + 1, 8);
            p(base + 2, 16 * i);
            p(base + 3, i);
            p(base + 4, DISK_ACTIVE | DISK_SYNC);
        }
        p(WORD_THIS_DISK, 1);
        p(WORD_THIS_DISK + 1, 8);
        p(WORD_THIS_DISK + 2, 16);
        p(WORD_THIS_DISK + 3, 1);
        p(WORD_THIS_DISK + 4, DISK_ACTIVE | DISK_SYNC);
        seal(&mut b, order);
        b
    }
}
