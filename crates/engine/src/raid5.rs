//! raid4/5/6 IO over chunk-high stripes.
//!
//! Per stripe, under the stripe's lock:
//! - reads go straight to the data members; a piece on a missing member is rebuilt from the
//!   rest of its rows (XOR for one loss, P and Q for two);
//! - writes are full-stripe (no reads), read-modify-write (old data and parity) or
//!   reconstruct-write (the untouched data), whichever reads fewer member blocks, as md
//!   counts them; a degraded stripe always reconstructs, rebuilding missing blocks first.
//!
//! Row ranges `[lo, hi)` are byte offsets inside the chunk.

use crate::array::{no_redundancy, Array, OpList};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use std::sync::atomic::Ordering;
use uraid_core::geometry::{ParityGeometry, StripeMap};
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};

enum Outcome {
    Done,
    /// A member failed while reading; the stripe must be redone with the new missing set.
    Retry,
}

fn chunk_bytes(g: &ParityGeometry) -> usize {
    (g.chunk_sectors * SECTOR_BYTES) as usize
}

fn sectors(bytes: usize) -> u64 {
    bytes as u64 / SECTOR_BYTES
}

fn stripe_roles(map: &StripeMap) -> Vec<MemberIdx> {
    let mut v = map.data.clone();
    v.push(map.p);
    v.extend(map.q);
    v
}

/// Up to `raid_disks` retries: each one follows a newly failed member.
fn retrying(
    a: &Array,
    mut f: impl FnMut() -> Result<Outcome, ArrayError>,
) -> Result<(), ArrayError> {
    for _ in 0..=a.raid_disks() {
        match f()? {
            Outcome::Done => return Ok(()),
            Outcome::Retry => continue,
        }
    }
    Err(no_redundancy(a, "stripe"))
}

pub(crate) fn read(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    buf: &mut [u8],
) -> Result<(), ArrayError> {
    let cb = chunk_bytes(g);
    let mut degraded: Vec<(u64, usize, usize)> = Vec::new(); // (sector, buf offset, len)
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
        if a.live(role).is_some() {
            ops.read(
                a,
                role,
                g.member_sector(loc.stripe, loc.offset_sectors),
                head,
            );
        } else {
            degraded.push((s, off, n));
        }
        rest = tail;
        off += n;
        s += sectors(n);
    }
    if !ops.run(a).is_empty() {
        // Some member failed under us: do it again, degraded where needed.
        return read(a, g, sector, buf);
    }
    for (s, off, n) in degraded {
        a.stats.degraded_reads.fetch_add(1, Ordering::Relaxed);
        let loc = g.locate(s);
        let piece = &mut buf[off..off + n];
        let _lock = a.lock_bucket(loc.stripe);
        retrying(a, || read_degraded(a, g, s, piece))?;
    }
    Ok(())
}

fn read_degraded(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    out: &mut [u8],
) -> Result<Outcome, ArrayError> {
    let loc = g.locate(sector);
    let map = g.stripe_map(loc.stripe);
    let lo = (loc.offset_sectors * SECTOR_BYTES) as usize;
    let hi = lo + out.len();
    let role = map.data[loc.data_index];
    if let Some(_dev) = a.live(role) {
        // It came back to life? No: members never do. But a retry may find it live if it was
        // only missing from the fast path's view; read it directly.
        let mut ops = OpList::new();
        ops.read(
            a,
            role,
            g.member_sector(loc.stripe, loc.offset_sectors),
            out,
        );
        return Ok(if ops.run(a).is_empty() {
            Outcome::Done
        } else {
            Outcome::Retry
        });
    }
    let mut rows = match Rows::load(a, g, &map, loc.stripe, lo, hi, |_| true)? {
        Some(r) => r,
        None => return Ok(Outcome::Retry),
    };
    rows.reconstruct(a, g, &map)?;
    out.copy_from_slice(rows.get(role));
    Ok(Outcome::Done)
}

/// Blocks of one stripe over rows [lo, hi), indexed by role.
struct Rows {
    bufs: Vec<Option<AlignedBuf>>,
    len: usize,
}

impl Rows {
    /// Read rows [lo, hi) of every live role in the stripe for which `want` says yes.
    /// Returns None when a member failed during the read.
    fn load(
        a: &Array,
        g: &ParityGeometry,
        map: &StripeMap,
        stripe: u64,
        lo: usize,
        hi: usize,
        want: impl Fn(MemberIdx) -> bool,
    ) -> Result<Option<Rows>, ArrayError> {
        let len = hi - lo;
        let mut bufs: Vec<Option<AlignedBuf>> = (0..a.raid_disks()).map(|_| None).collect();
        for role in stripe_roles(map) {
            if a.live(role).is_some() && want(role) {
                bufs[role.0] = Some(AlignedBuf::new(len));
            }
        }
        let msec = g.member_sector(stripe, sectors(lo));
        let mut ops = OpList::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            if let Some(b) = b {
                ops.read(a, MemberIdx(i), msec, b);
            }
        }
        if !ops.run(a).is_empty() {
            return Ok(None);
        }
        Ok(Some(Rows { bufs, len }))
    }

    fn get(&self, role: MemberIdx) -> &[u8] {
        self.bufs[role.0].as_ref().expect("block loaded")
    }

    fn get_mut(&mut self, role: MemberIdx) -> &mut [u8] {
        self.bufs[role.0].as_mut().expect("block loaded")
    }

    /// Rebuild every block of the stripe's roles that is not loaded (missing members).
    fn reconstruct(
        &mut self,
        a: &Array,
        g: &ParityGeometry,
        map: &StripeMap,
    ) -> Result<(), ArrayError> {
        let roles = stripe_roles(map);
        let lost: Vec<MemberIdx> = roles
            .iter()
            .copied()
            .filter(|r| self.bufs[r.0].is_none())
            .collect();
        if lost.is_empty() {
            return Ok(());
        }
        if lost.len() > g.parity_disks() {
            return Err(no_redundancy(a, "reconstruct"));
        }
        for r in &lost {
            self.bufs[r.0] = Some(AlignedBuf::new(self.len));
        }
        if g.level != Level::Raid6 {
            let target = lost[0];
            let mut acc = AlignedBuf::new(self.len);
            let srcs: Vec<&[u8]> = roles
                .iter()
                .filter(|&&r| r != target)
                .map(|r| self.get(*r))
                .collect();
            uraid_parity::xor_gen(&mut acc, &srcs);
            self.get_mut(target).copy_from_slice(&acc);
            return Ok(());
        }
        // raid6: blocks in syndrome order, then P, then Q.
        let ndata = map.data.len();
        let order: Vec<MemberIdx> = map
            .syndrome_order
            .iter()
            .map(|&i| map.data[i])
            .chain([map.p, map.q.expect("raid6 has Q")])
            .collect();
        let lost_idx: Vec<usize> = lost
            .iter()
            .map(|r| order.iter().position(|x| x == r).expect("role in stripe"))
            .collect();
        let mut refs: Vec<Option<&mut [u8]>> = self
            .bufs
            .iter_mut()
            .map(|b| b.as_mut().map(|b| &mut b[..]))
            .collect();
        let mut blocks: Vec<&mut [u8]> = order
            .iter()
            .map(|r| refs[r.0].take().expect("block present"))
            .collect();
        debug_assert_eq!(blocks.len(), ndata + 2);
        uraid_parity::recover(&mut blocks, &lost_idx);
        Ok(())
    }
}

/// Compute P (and Q) of `data` (logical order) into `p`/`q`.
fn gen_parity(
    g: &ParityGeometry,
    map: &StripeMap,
    data: &[&[u8]],
    p: &mut [u8],
    q: Option<&mut [u8]>,
) {
    match q {
        None => uraid_parity::xor_gen(p, data),
        Some(q) => {
            let ordered: Vec<&[u8]> = map.syndrome_order.iter().map(|&i| data[i]).collect();
            uraid_parity::gen_pq(&ordered, p, q);
        }
    }
    let _ = g;
}

pub(crate) fn write(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    buf: &[u8],
) -> Result<(), ArrayError> {
    let mut s = sector;
    let mut off = 0usize;
    while off < buf.len() {
        let loc = g.locate(s);
        let next_stripe = g.array_sector(loc.stripe + 1, 0);
        let n = (((next_stripe - s) * SECTOR_BYTES) as usize).min(buf.len() - off);
        let data = &buf[off..off + n];
        {
            let _lock = a.lock_bucket(loc.stripe);
            retrying(a, || write_stripe(a, g, loc.stripe, s, data))?;
        }
        off += n;
        s += sectors(n);
    }
    Ok(())
}

/// What one request writes into one data chunk: byte range in the chunk and the new bytes.
struct Piece<'a> {
    start: usize,
    data: &'a [u8],
}

impl Piece<'_> {
    fn end(&self) -> usize {
        self.start + self.data.len()
    }
}

fn write_stripe(
    a: &Array,
    g: &ParityGeometry,
    stripe: u64,
    sector: u64,
    data: &[u8],
) -> Result<Outcome, ArrayError> {
    let map = g.stripe_map(stripe);
    let cb = chunk_bytes(g);
    let dd = g.data_disks();
    let first = g.locate(sector);
    let mut pieces: Vec<Option<Piece>> = (0..dd).map(|_| None).collect();
    let mut pos = 0usize;
    let mut idx = first.data_index;
    let mut start = (first.offset_sectors * SECTOR_BYTES) as usize;
    while pos < data.len() {
        let n = (cb - start).min(data.len() - pos);
        pieces[idx] = Some(Piece {
            start,
            data: &data[pos..pos + n],
        });
        pos += n;
        idx += 1;
        start = 0;
    }
    let lo = pieces
        .iter()
        .flatten()
        .map(|p| p.start)
        .min()
        .expect("a piece");
    let hi = pieces
        .iter()
        .flatten()
        .map(|p| p.end())
        .max()
        .expect("a piece");
    let covers = |i: usize| {
        pieces[i]
            .as_ref()
            .is_some_and(|p| p.start == lo && p.end() == hi)
    };
    let roles = stripe_roles(&map);
    let missing: Vec<MemberIdx> = roles
        .iter()
        .copied()
        .filter(|r| a.live(*r).is_none())
        .collect();
    if missing.len() > g.parity_disks() {
        return Err(no_redundancy(a, "write"));
    }
    let raid6 = g.level == Level::Raid6;
    let mut p = AlignedBuf::new(hi - lo);
    let mut q = raid6.then(|| AlignedBuf::new(hi - lo));

    let full = (0..dd).all(covers);
    let touched = pieces.iter().flatten().count();
    let rcw_reads = (0..dd).filter(|&i| !covers(i)).count();
    let rmw_reads = touched + g.parity_disks();
    if full {
        let srcs: Vec<&[u8]> = pieces
            .iter()
            .map(|p| p.as_ref().expect("full").data)
            .collect();
        gen_parity(g, &map, &srcs, &mut p, q.as_deref_mut());
    } else if missing.is_empty() && rmw_reads < rcw_reads {
        // Read-modify-write: fold old ^ new of each touched chunk into the old parity.
        let mut old: Vec<Option<AlignedBuf>> = pieces
            .iter()
            .map(|pc| pc.as_ref().map(|pc| AlignedBuf::new(pc.data.len())))
            .collect();
        let msec_lo = g.member_sector(stripe, sectors(lo));
        let mut ops = OpList::new();
        for (i, b) in old.iter_mut().enumerate() {
            if let (Some(b), Some(pc)) = (b, &pieces[i]) {
                ops.read(
                    a,
                    map.data[i],
                    g.member_sector(stripe, sectors(pc.start)),
                    b,
                );
            }
        }
        ops.read(a, map.p, msec_lo, &mut p);
        if let Some(q) = q.as_deref_mut() {
            ops.read(a, map.q.expect("Q"), msec_lo, q);
        }
        if !ops.run(a).is_empty() {
            return Ok(Outcome::Retry);
        }
        for (i, b) in old.iter_mut().enumerate() {
            if let (Some(b), Some(pc)) = (b, &pieces[i]) {
                uraid_parity::xor_acc(b, &[pc.data]);
                let range = pc.start - lo..pc.end() - lo;
                match q.as_deref_mut() {
                    None => uraid_parity::xor_acc(&mut p[range], &[&b[..]]),
                    Some(q) => {
                        let slot = map
                            .syndrome_order
                            .iter()
                            .position(|&x| x == i)
                            .expect("slot");
                        uraid_parity::update_pq(slot, b, &mut p[range.clone()], &mut q[range]);
                    }
                }
            }
        }
    } else {
        // Reconstruct-write: read what the write does not cover (and, when degraded,
        // whatever is needed to rebuild missing blocks), then compute parity afresh.
        let lost_uncovered = map
            .data
            .iter()
            .enumerate()
            .any(|(i, r)| a.live(*r).is_none() && !covers(i));
        let want = |r: MemberIdx| {
            if lost_uncovered {
                true
            } else {
                match map.data.iter().position(|&d| d == r) {
                    Some(i) => !covers(i),
                    None => false,
                }
            }
        };
        let mut rows = match Rows::load(a, g, &map, stripe, lo, hi, want)? {
            Some(r) => r,
            None => return Ok(Outcome::Retry),
        };
        if lost_uncovered {
            rows.reconstruct(a, g, &map)?;
        }
        // Overlay the new data on the old rows.
        let mut cols: Vec<AlignedBuf> = Vec::with_capacity(dd);
        for (i, r) in map.data.iter().enumerate() {
            let mut b = AlignedBuf::new(hi - lo);
            if !covers(i) {
                b.copy_from_slice(rows.get(*r));
            }
            if let Some(pc) = &pieces[i] {
                b[pc.start - lo..pc.end() - lo].copy_from_slice(pc.data);
            }
            cols.push(b);
        }
        let srcs: Vec<&[u8]> = cols.iter().map(|b| &b[..]).collect();
        gen_parity(g, &map, &srcs, &mut p, q.as_deref_mut());
    }

    let msec_lo = g.member_sector(stripe, sectors(lo));
    let mut ops = OpList::new();
    for (i, pc) in pieces.iter().enumerate() {
        if let Some(pc) = pc {
            if a.live(map.data[i]).is_some() {
                ops.write(
                    a,
                    map.data[i],
                    g.member_sector(stripe, sectors(pc.start)),
                    pc.data,
                );
            }
        }
    }
    if a.live(map.p).is_some() {
        ops.write(a, map.p, msec_lo, &p);
    }
    if let (Some(qr), Some(q)) = (map.q, q.as_deref()) {
        if a.live(qr).is_some() {
            ops.write(a, qr, msec_lo, q);
        }
    }
    ops.run(a);
    // A failed write leaves the stripe consistent on the survivors; it only matters if
    // the array lost more than it tolerates.
    let now_missing = roles.iter().filter(|r| a.live(**r).is_none()).count();
    if now_missing > g.parity_disks() {
        return Err(no_redundancy(a, "write"));
    }
    Ok(Outcome::Done)
}

/// Rows per resync step inside a chunk.
const RESYNC_ROWS_BYTES: usize = 64 * 1024;

/// Recompute parity for every stripe; returns how many row groups had wrong parity.
pub(crate) fn resync(a: &Array, g: &ParityGeometry) -> Result<u64, ArrayError> {
    let cb = chunk_bytes(g);
    let mut mismatches = 0;
    for stripe in 0..g.stripes() {
        let map = g.stripe_map(stripe);
        let _lock = a.lock_bucket(stripe);
        let mut lo = 0;
        while lo < cb {
            let hi = (lo + RESYNC_ROWS_BYTES).min(cb);
            let rows = Rows::load(a, g, &map, stripe, lo, hi, |_| true)?
                .ok_or_else(|| ArrayError::Failed("read error during resync".into()))?;
            let srcs: Vec<&[u8]> = map.data.iter().map(|r| rows.get(*r)).collect();
            let mut p = AlignedBuf::new(hi - lo);
            let mut q = map.q.map(|_| AlignedBuf::new(hi - lo));
            gen_parity(g, &map, &srcs, &mut p, q.as_deref_mut());
            let mut ops = OpList::new();
            let mut bad = false;
            if rows.get(map.p) != &p[..] {
                ops.write(a, map.p, g.member_sector(stripe, sectors(lo)), &p);
                bad = true;
            }
            if let (Some(qr), Some(q)) = (map.q, q.as_deref()) {
                if rows.get(qr) != q {
                    ops.write(a, qr, g.member_sector(stripe, sectors(lo)), q);
                    bad = true;
                }
            }
            ops.run(a);
            mismatches += bad as u64;
            lo = hi;
        }
    }
    Ok(mismatches)
}
