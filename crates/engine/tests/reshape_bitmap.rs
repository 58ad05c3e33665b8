//! A raid5 reshape with an internal write-intent bitmap, as md runs one: started, stopped
//! mid-way and continued with the bitmap kept in step (never stale, never overwritten by
//! the moving data offset), written mid-reshape with its bits set in both geometries, and
//! a crash mid-reshape resynced from those bits once the reshape has ended.

use rand::Rng;
use std::sync::Arc;
use uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC;
use uraid_core::superblock::{FEATURE_BITMAP_OFFSET, FEATURE_RESHAPE_ACTIVE};
use uraid_core::Level;
use uraid_engine::{
    assemble, continue_reshape, create, read_superblock, reshape_members, Array, AssembleOptions,
    CreateOptions, MemMember, Member, ReshapeOptions, ReshapeRequest,
};
use uraid_testkit::engine::{rng, same};

const MB: u64 = 1 << 20;
const CHUNK: u64 = 64 * 1024;
/// One bit per 64 KiB of member sectors: one chunk row of the raid5 each.
const BM_CHUNK: u32 = 64 * 1024;

fn members(n: usize, tag: &str) -> Vec<Arc<dyn Member>> {
    (0..n)
        .map(|i| Arc::new(MemMember::new(format!("{tag}{i}"), 8 * MB)) as Arc<dyn Member>)
        .collect()
}

/// A 3-member raid5 (64 KiB chunks) with an internal bitmap where mdadm puts it, filled
/// with seeded bytes and stopped clean: the bytes.
fn made(devs: &[Arc<dyn Member>], seed: u64) -> Vec<u8> {
    let mut o = CreateOptions::new(Level::Raid5);
    o.layout = Some(ALGORITHM_LEFT_SYMMETRIC);
    o.chunk_sectors = Some(CHUNK / 512);
    o.assume_clean = true;
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(BM_CHUNK);
    let a = create(devs.iter().cloned().map(Some).collect(), &o).unwrap();
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    data
}

fn open(devs: &[Arc<dyn Member>]) -> (Array, bool) {
    let (a, rep) = assemble(devs.to_vec(), &AssembleOptions::default()).unwrap();
    (a, rep.unclean)
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut v = vec![0u8; a.size_bytes() as usize];
    a.read(0, &mut v).unwrap();
    v
}

fn grow_to_4() -> ReshapeRequest {
    ReshapeRequest {
        raid_disks: Some(4),
        ..Default::default()
    }
}

/// The bitmap as assembly finds it: present, and not stale (a stale bitmap, behind the
/// superblock's events, is loaded with every bit set).
fn bitmap_dirty(a: &Array) -> (u64, u64) {
    assert!(a.has_bitmap(), "the bitmap is gone");
    a.bitmap_dirty_chunks().unwrap()
}

#[test]
fn a_raid5_with_a_bitmap_grows_stops_and_continues_with_its_bitmap_in_step() {
    let devs = members(3, "bg");
    let data = made(&devs, 21);
    let offset_before = read_superblock(devs[0].as_ref()).unwrap().data_offset;
    let mut all = devs.clone();
    all.extend(members(1, "bg-add"));
    let mid = data.len() as u64 / 512 / 2;
    let r = reshape_members(
        devs.clone(),
        &grow_to_4(),
        ReshapeOptions {
            add: all[3..].to_vec(),
            stop_at: Some(mid),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.finished, "{r:?}");
    for d in &all {
        let sb = read_superblock(d.as_ref()).unwrap();
        assert!(sb.feature_map & FEATURE_RESHAPE_ACTIVE != 0, "{}", d.name());
        assert!(sb.feature_map & FEATURE_BITMAP_OFFSET != 0, "{}", d.name());
    }
    // Mid-way: read-write, the bitmap in step with the superblocks (nothing dirty after a
    // clean stop), the bytes the same.
    let (a, unclean) = open(&all);
    assert!(!unclean);
    assert!(
        !a.is_read_only(),
        "a reshape with a bitmap is served read-only"
    );
    assert_eq!(
        bitmap_dirty(&a).0,
        0,
        "the bitmap went stale at a checkpoint"
    );
    same(&read_all(&a)[..data.len()], &data, "mid-reshape");
    // Writes below, across and above the position: bits set, data kept.
    let mut model = data.clone();
    let mut r = rng(22);
    let pos = mid * 512;
    for at in [pos / 4, pos - 8192, pos + 3 * CHUNK] {
        let at = at as usize;
        r.fill(&mut model[at..at + 16384]);
        a.write(at as u64, &model[at..at + 16384]).unwrap();
    }
    assert!(bitmap_dirty(&a).0 > 0, "writes mid-reshape set no bits");
    same(
        &read_all(&a)[..model.len()],
        &model,
        "after writes mid-reshape",
    );
    a.stop().unwrap();
    drop(a);
    // Continued to the end: the new shape, the bitmap kept (and clean), parity right.
    let r = continue_reshape(all.clone(), ReshapeOptions::default()).unwrap();
    assert!(r.finished, "{r:?}");
    let sb = read_superblock(all[0].as_ref()).unwrap();
    assert_eq!(sb.raid_disks, 4);
    assert!(sb.feature_map & FEATURE_RESHAPE_ACTIVE == 0);
    assert!(
        sb.data_offset < offset_before,
        "the data offset did not move"
    );
    let (a, unclean) = open(&all);
    assert!(!unclean);
    assert_eq!(bitmap_dirty(&a).0, 0, "the bitmap went stale at the finish");
    same(&read_all(&a)[..model.len()], &model, "finished");
    assert_eq!(a.check().unwrap(), 0, "parity after the reshape");
}

/// A write mid-reshape, then a power cut: its rows are dirty in the bitmap of the new
/// geometry (member sectors, not array sectors), so once the reshape has ended the resync
/// repairs the parity there, and only there.
#[test]
fn a_crash_mid_reshape_is_resynced_from_the_bits_of_the_new_geometry() {
    let devs = members(3, "bc");
    let data = made(&devs, 23);
    let mut all = devs.clone();
    all.extend(members(1, "bc-add"));
    let mid = data.len() as u64 / 512 / 2;
    reshape_members(
        devs.clone(),
        &grow_to_4(),
        ReshapeOptions {
            add: all[3..].to_vec(),
            stop_at: Some(mid),
            ..Default::default()
        },
    )
    .unwrap();
    // Stripe 2 of the new geometry (3 data chunks a stripe), its first data chunk: array
    // bytes past the first two stripes. Its bit is member sectors 256.. (bitmap chunk 2),
    // not array sectors 768.. (chunk 6).
    let stripe_bytes = 3 * CHUNK;
    let at = 2 * stripe_bytes + 8192;
    assert!(at / 512 + 8 < mid);
    let mut model = data.clone();
    let (a, _) = open(&all);
    rng(24).fill(&mut model[at as usize..at as usize + 4096]);
    a.write(at, &model[at as usize..at as usize + 4096])
        .unwrap();
    std::mem::forget(a); // the power goes: no clean stop
    let r = continue_reshape(all.clone(), ReshapeOptions::default()).unwrap();
    assert!(r.finished, "{r:?}");
    // A torn write in that row: its parity (left-symmetric, 4 members: stripe 2's parity
    // is on member 1) never written. And the same damage in a row nobody wrote (stripe 5,
    // parity on member 2), which the bitmap-driven resync must leave alone.
    let off = |m: usize| read_superblock(all[m].as_ref()).unwrap().data_offset * 512;
    all[1]
        .write_at(&[0xEE; 4096], off(1) + 2 * CHUNK + 8192)
        .unwrap();
    all[2]
        .write_at(&[0xEE; 4096], off(2) + 5 * CHUNK + 8192)
        .unwrap();
    let (b, unclean) = open(&all);
    assert!(unclean, "the power cut was not recorded");
    let (dirty, chunks) = bitmap_dirty(&b);
    assert!(
        dirty > 0 && dirty < chunks,
        "{dirty} of {chunks} bits dirty"
    );
    let both = b.check().unwrap();
    b.resync().unwrap();
    // Only the untouched row's damage is left: half of what there was.
    let left = b.check().unwrap();
    assert!(
        left > 0 && left * 2 == both,
        "mismatches {both} before the resync, {left} after: want the written row repaired \
         and the unwritten one left"
    );
    b.repair().unwrap();
    assert_eq!(b.check().unwrap(), 0);
    same(&read_all(&b)[..model.len()], &model, "after the resync");
}
