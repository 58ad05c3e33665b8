//! raid4/5/6 reads: straight to the data members when they can serve; a piece on a lost
//! member, or whose read failed, rebuilt from the rest of its stripe (and written back).

use super::stripe::Rows;
use super::{chunk_bytes, retrying, sectors, Outcome};
use crate::array::Array;
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::member_io::OpList;
use crate::stripe_cache::Get;
use std::sync::atomic::Ordering;
use uraid_core::geometry::{ParityGeometry, StripeMap};
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

pub(crate) fn read(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    buf: &mut [u8],
) -> Result<(), ArrayError> {
    let cb = chunk_bytes(g);
    // (sector, buf offset, len, (role, op index) when read directly)
    type Piece = (u64, usize, usize, Option<(MemberIdx, usize)>);
    let mut pieces: smallvec::SmallVec<[Piece; 4]> = smallvec::SmallVec::new();
    let mut nops = 0usize;
    let failed = {
        let mut ops = OpList::new();
        let mut rest = &mut buf[..];
        let mut s = sector;
        let mut off = 0usize;
        while !rest.is_empty() {
            let loc = g.locate(s);
            let in_chunk = (loc.offset_sectors * SECTOR_BYTES) as usize;
            let n = (cb - in_chunk).min(rest.len());
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
            let role = g.stripe_map(loc.stripe).data[loc.data_index];
            // A healthy read goes around the stripe cache even when a write holds the
            // stripe's head (md's chunk-aligned read bypass does not look at the cache
            // either): a write changes only the blocks it writes, and a read overlapping
            // a write in flight may see either, per sector, as with any block device.
            // Write-back's cached pages are laid over by the caller.
            match a.usable(role, loc.stripe) {
                Some(dev) => {
                    ops.read(
                        a,
                        dev,
                        role,
                        Sector(g.member_sector(loc.stripe, loc.offset_sectors)),
                        head,
                    );
                    pieces.push((s, off, n, Some((role, nops))));
                    nops += 1;
                }
                None => pieces.push((s, off, n, None)),
            }
            rest = tail;
            off += n;
            s += sectors(n);
        }
        ops.run(a)
    };
    for (s, off, n, direct) in pieces {
        let needs = match direct {
            None => true,
            Some((_, i)) => failed.read_ops.contains(&i),
        };
        if !needs {
            continue;
        }
        a.stats.degraded_reads.fetch_add(1, Ordering::Relaxed);
        let loc = g.locate(s);
        let map = g.stripe_map(loc.stripe);
        let piece = &mut buf[off..off + n];
        let _head = a.r5().stripe_cache.get(loc.stripe, Get::Wait);
        let first_exclude: Vec<MemberIdx> = direct.map(|(r, _)| r).into_iter().collect();
        retrying(a, &map, loc.stripe, g, |exclude| {
            let mut ex = exclude.to_vec();
            ex.extend(
                first_exclude
                    .iter()
                    .copied()
                    .filter(|r| !exclude.contains(r)),
            );
            read_degraded(a, g, &map, s, piece, &ex)
        })?;
    }
    Ok(())
}

/// Rebuild one piece from the rest of its stripe rows, and write it back to its member if
/// the member is there but its read failed (`exclude`).
fn read_degraded(
    a: &Array,
    g: &ParityGeometry,
    map: &StripeMap,
    sector: u64,
    out: &mut [u8],
    exclude: &[MemberIdx],
) -> Result<Outcome, ArrayError> {
    let loc = g.locate(sector);
    let lo = (loc.offset_sectors * SECTOR_BYTES) as usize;
    let hi = lo + out.len();
    let role = map.data[loc.data_index];
    let mut rows = match Rows::load(
        a,
        g,
        map,
        loc.stripe,
        lo,
        hi,
        exclude,
        |_| true,
        &mut AlignedBuf::scratch,
    ) {
        Ok(r) => r,
        Err(failed) => return Ok(Outcome::Retry(failed)),
    };
    rows.reconstruct(a, g, map)?;
    out.copy_from_slice(rows.get(role));
    for r in exclude {
        if a.usable(*r, loc.stripe).is_some() {
            a.repair_read(
                *r,
                g.member_sector(loc.stripe, loc.offset_sectors),
                rows.get(*r),
            );
        }
    }
    Ok(Outcome::Done)
}
