//! PPL recovery at assembly against PPLs laid out as md writes them, built here from the
//! format (md_p.h's ppl_header at the area start, partial parity after it) rather than by
//! uraid's writer: an unclean raid5 gets the parity of every logged rectangle rewritten; an
//! entry whose partial parity fails its checksum is skipped as md skips it, and a header
//! that fails its checksum is not used; either mismatch leaves the resync owed.

use std::sync::Arc;
use uraid_core::geometry::ParityGeometry;
use uraid_core::ppl::{pp_checksum, signature, PplEntry, PplHeader};
use uraid_core::{Level, MemberIdx};
use uraid_engine::{
    assemble, create, read_superblock, write_superblock, AssembleOptions, CreateOptions, MemMember,
    Member,
};
use uraid_testkit::engine::as_members;

const CHUNK: u64 = 16;

struct Setup {
    mems: Vec<Arc<MemMember>>,
    g: ParityGeometry,
    /// Stripe 0's data chunks as written, per logical index.
    data: Vec<Vec<u8>>,
}

/// A clean PPL raid5 with a pattern in stripe 0, stopped.
fn setup() -> Setup {
    let mems: Vec<Arc<MemMember>> = (0..4)
        .map(|i| {
            Arc::new(MemMember::new(
                format!("m{i}"),
                (64 + 8 * CHUNK) * 512 + 65536,
            ))
        })
        .collect();
    let mut opts = CreateOptions::new(Level::Raid5);
    opts.chunk_sectors = Some(CHUNK);
    opts.assume_clean = true;
    opts.data_offset_sectors = Some(64);
    opts.ppl = true;
    let a = create(as_members(&mems), &opts).unwrap();
    let g = match a.personality() {
        uraid_core::geometry::Personality::Parity(g) => g.clone(),
        _ => unreachable!(),
    };
    let cb = (CHUNK * 512) as usize;
    let data: Vec<Vec<u8>> = (0..3)
        .map(|i| (0..cb).map(|k| (k * 7 + i * 131) as u8).collect())
        .collect();
    a.write(0, &data.concat()).unwrap();
    a.stop().unwrap();
    Setup { mems, g, data }
}

fn member_off(m: &MemMember, g: &ParityGeometry, sector_in_chunk: u64) -> u64 {
    (read_superblock(m).unwrap().data_offset + g.member_sector(0, sector_in_chunk)) * 512
}

/// The crash md's PPL protects against: chunk 0's first page got new data, its parity did
/// not. Returns the new page.
fn torn_rmw(s: &Setup) -> Vec<u8> {
    let map = s.g.stripe_map(0);
    let new: Vec<u8> = (0..4096).map(|k| (k * 13 + 5) as u8).collect();
    let m = &s.mems[map.data[0].0];
    m.write_at(&new, member_off(m, &s.g, 0)).unwrap();
    // Dirty, as md leaves it while writes are in flight.
    for m in &s.mems {
        let mut sb = read_superblock(m.as_ref()).unwrap();
        sb.resync_offset = 0;
        write_superblock(m.as_ref(), &sb).unwrap();
    }
    new
}

/// md's PPL for that write, on the stripe's parity member: one entry (data_sector 0,
/// 4 KiB of data on one chunk, 4 KiB of partial parity = chunks 1 ^ 2), generation 1.
fn md_ppl(s: &Setup, corrupt_pp: bool, corrupt_header: bool) {
    let mut pp = vec![0u8; 4096];
    for d in s.data.iter().skip(1) {
        for (k, b) in pp.iter_mut().enumerate() {
            *b ^= d[k];
        }
    }
    write_ppl(s, pp, corrupt_pp, corrupt_header);
}

fn write_ppl(s: &Setup, mut pp: Vec<u8>, corrupt_pp: bool, corrupt_header: bool) {
    let map = s.g.stripe_map(0);
    let pm = &s.mems[map.p.0];
    let sb = read_superblock(pm.as_ref()).unwrap();
    let h = PplHeader {
        signature: signature(&sb.set_uuid),
        generation: 1,
        entries: vec![PplEntry {
            data_sector: 0,
            pp_size: 4096,
            data_size: 4096,
            parity_disk: map.p.0 as u32,
            checksum: pp_checksum(&pp),
        }],
    };
    let mut hb = h.encode().to_vec();
    if corrupt_header {
        hb[600] ^= 1;
    }
    if corrupt_pp {
        pp[17] ^= 0x40;
    }
    let at = (sb.super_offset + sb.ppl().0 as u64) * 512;
    pm.write_at(&hb, at).unwrap();
    pm.write_at(&pp, at + 4096).unwrap();
}

fn parity_matches(s: &Setup) -> bool {
    let map = s.g.stripe_map(0);
    let page = |r: MemberIdx| {
        let m = &s.mems[r.0];
        let mut b = vec![0u8; 4096];
        m.read_at(&mut b, member_off(m, &s.g, 0)).unwrap();
        b
    };
    let mut x = page(map.p);
    for r in &map.data {
        for (a, b) in x.iter_mut().zip(page(*r)) {
            *a ^= b;
        }
    }
    x.iter().all(|&b| b == 0)
}

fn assemble_all(s: &Setup) -> uraid_engine::Array {
    assemble(
        s.mems
            .iter()
            .map(|m| m.clone() as Arc<dyn Member>)
            .collect(),
        &AssembleOptions::default(),
    )
    .unwrap()
    .0
}

#[test]
fn an_md_ppl_entry_rewrites_the_parity_and_no_resync_is_owed() {
    let s = setup();
    torn_rmw(&s);
    md_ppl(&s, false, false);
    assert!(!parity_matches(&s), "the crash left parity stale");
    let a = assemble_all(&s);
    assert!(a.has_ppl());
    assert!(parity_matches(&s), "PPL recovery rewrote the parity");
    assert!(!a.meta().needs_resync());
    // The log was reset: an empty header at the area start.
    let map = s.g.stripe_map(0);
    let pm = &s.mems[map.p.0];
    let sb = read_superblock(pm.as_ref()).unwrap();
    let mut hb = vec![0u8; 4096];
    pm.read_at(&mut hb, (sb.super_offset + 8) * 512).unwrap();
    let h = PplHeader::decode_for(&hb, signature(&sb.set_uuid)).unwrap();
    assert!(h.entries.is_empty());
}

#[test]
fn an_entry_with_a_bad_checksum_is_skipped_and_a_resync_is_owed() {
    let s = setup();
    torn_rmw(&s);
    md_ppl(&s, true, false);
    let a = assemble_all(&s);
    assert!(
        !parity_matches(&s),
        "a bad partial parity must not be applied"
    );
    assert!(a.meta().needs_resync());
}

#[test]
fn a_header_with_a_bad_checksum_is_not_used_and_a_resync_is_owed() {
    let s = setup();
    torn_rmw(&s);
    md_ppl(&s, false, true);
    let a = assemble_all(&s);
    assert!(!parity_matches(&s));
    assert!(a.meta().needs_resync());
}

#[test]
fn a_clean_array_replays_nothing() {
    let s = setup();
    // A valid PPL whose partial parity is not the other chunks' XOR: replayed, it would
    // make the parity wrong. The array is clean, so md does not replay it; neither may we.
    write_ppl(&s, vec![0u8; 4096], false, false);
    let a = assemble_all(&s);
    assert!(parity_matches(&s));
    assert!(!a.meta().needs_resync());
}
