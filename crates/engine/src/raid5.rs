//! raid4/5/6 IO over chunk-high stripes. The recovery unit is the stripe.
//!
//! Per stripe, holding the stripe's head in the stripe cache ([`crate::stripe_cache`]):
//! - reads go straight to the data members (waiting first for a write in progress on the
//!   stripe, without holding the head); a piece on a missing member is rebuilt from the
//!   rest of its rows (XOR for one loss, P and Q for two); a piece whose read fails is
//!   rebuilt the same way and written back to the member (read-error repair);
//! - writes are full-stripe (no reads), read-modify-write (old data and parity) or
//!   reconstruct-write (the untouched data), whichever reads fewer member blocks, as md
//!   counts them; a degraded stripe always reconstructs, rebuilding missing blocks first.
//!   Each stripe write is analyse -> plan ([`crate::stripe_plan`], pure) -> execute.
//!
//! Row ranges `[lo, hi)` are byte offsets inside the chunk.

use crate::array::{no_redundancy, Array, OpList};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::mirror::{SyncCtx, SyncMode};
use crate::stripe_cache::{Get, HeadBufs, StripeHead};
use crate::stripe_plan::{self, Cover, Plan, Summary};
use std::sync::atomic::Ordering;
use uraid_core::geometry::{ParityGeometry, StripeMap};
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};

enum Outcome {
    Done,
    /// Reads failed on these members: redo the stripe treating them as missing.
    Retry(Vec<MemberIdx>),
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

/// Roles of the stripe that cannot be read for it: missing, faulty, recovering above their
/// cursor, or excluded after a read error.
fn lost_roles(a: &Array, map: &StripeMap, stripe: u64, exclude: &[MemberIdx]) -> Vec<MemberIdx> {
    stripe_roles(map)
        .into_iter()
        .filter(|r| exclude.contains(r) || !a.slot(*r).is_usable(stripe))
        .collect()
}

/// Run a stripe operation, retrying with members whose reads failed treated as missing;
/// afterwards the blocks of those members are repaired by the operation itself (`f` gets the
/// exclude list). If too many members fail, the failed ones are failed for good.
fn retrying(
    a: &Array,
    map: &StripeMap,
    stripe: u64,
    g: &ParityGeometry,
    mut f: impl FnMut(&[MemberIdx]) -> Result<Outcome, ArrayError>,
) -> Result<(), ArrayError> {
    let mut exclude: Vec<MemberIdx> = Vec::new();
    // Each retry follows a member that failed meanwhile, so a few are enough; the bound
    // only guards against a bug turning into a hang.
    for _ in 0..4 * a.raid_disks() + 4 {
        match f(&exclude)? {
            Outcome::Done => return Ok(()),
            Outcome::Retry(more) => {
                for r in more {
                    if !exclude.contains(&r) {
                        exclude.push(r);
                    }
                }
                if lost_roles(a, map, stripe, &exclude).len() > g.parity_disks() {
                    for r in &exclude {
                        a.member_error(*r, &std::io::Error::other("unrecoverable read error"));
                    }
                    return Err(no_redundancy(a, "read"));
                }
            }
        }
    }
    Err(ArrayError::Failed(format!(
        "stripe {stripe}: members kept changing state; giving up"
    )))
}

pub(crate) fn read(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    buf: &mut [u8],
) -> Result<(), ArrayError> {
    let cb = chunk_bytes(g);
    // (sector, buf offset, len, (role, op index) when read directly)
    type Piece = (u64, usize, usize, Option<(MemberIdx, usize)>);
    let mut pieces: Vec<Piece> = Vec::new();
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
                        g.member_sector(loc.stripe, loc.offset_sectors),
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
        let _head = a.stripe_cache.get(loc.stripe, Get::Wait);
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
    let mut rows = match Rows::load(a, g, map, loc.stripe, lo, hi, exclude, |_| true) {
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

/// Blocks of one stripe over rows [lo, hi), indexed by role.
struct Rows {
    bufs: Vec<Option<AlignedBuf>>,
    len: usize,
}

impl Rows {
    /// Read rows [lo, hi) of every usable, non-excluded role for which `want` says yes.
    /// Err holds the roles whose reads failed.
    #[allow(clippy::too_many_arguments)]
    fn load(
        a: &Array,
        g: &ParityGeometry,
        map: &StripeMap,
        stripe: u64,
        lo: usize,
        hi: usize,
        exclude: &[MemberIdx],
        want: impl Fn(MemberIdx) -> bool,
    ) -> Result<Rows, Vec<MemberIdx>> {
        Rows::load_into(
            a,
            g,
            map,
            stripe,
            lo,
            hi,
            exclude,
            want,
            &mut AlignedBuf::scratch,
        )
    }

    /// [`Rows::load`] with the buffers from `take` (a stripe head's).
    #[allow(clippy::too_many_arguments)]
    fn load_into(
        a: &Array,
        g: &ParityGeometry,
        map: &StripeMap,
        stripe: u64,
        lo: usize,
        hi: usize,
        exclude: &[MemberIdx],
        want: impl Fn(MemberIdx) -> bool,
        take: &mut dyn FnMut(usize) -> AlignedBuf,
    ) -> Result<Rows, Vec<MemberIdx>> {
        let len = hi - lo;
        let mut bufs: Vec<Option<AlignedBuf>> = (0..a.raid_disks()).map(|_| None).collect();
        let mut devs: Vec<Option<std::sync::Arc<dyn crate::member::Member>>> =
            (0..a.raid_disks()).map(|_| None).collect();
        for role in stripe_roles(map) {
            if exclude.contains(&role) || !want(role) {
                continue;
            }
            if let Some(dev) = a.usable(role, stripe) {
                bufs[role.0] = Some(take(len));
                devs[role.0] = Some(dev);
            }
        }
        let msec = g.member_sector(stripe, sectors(lo));
        let mut ops = OpList::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            if let (Some(b), Some(dev)) = (b, devs[i].take()) {
                ops.read(a, dev, MemberIdx(i), msec, b);
            }
        }
        let failed = ops.run(a);
        if !failed.reads.is_empty() {
            return Err(failed.reads);
        }
        Ok(Rows { bufs, len })
    }

    fn get(&self, role: MemberIdx) -> &[u8] {
        self.bufs[role.0].as_ref().expect("block loaded")
    }

    fn get_mut(&mut self, role: MemberIdx) -> &mut [u8] {
        self.bufs[role.0].as_mut().expect("block loaded")
    }

    /// Rebuild every block of the stripe's roles that is not loaded.
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
        if g.level != Level::Raid6 {
            let target = lost[0];
            let mut acc = AlignedBuf::scratch(self.len);
            let srcs: Vec<&[u8]> = roles
                .iter()
                .filter(|&&r| r != target)
                .map(|r| self.get(*r))
                .collect();
            uraid_parity::xor_gen(&mut acc, &srcs);
            self.bufs[target.0] = Some(acc);
            return Ok(());
        }
        for r in &lost {
            self.bufs[r.0] = Some(AlignedBuf::scratch(self.len));
        }
        // raid6: blocks by syndrome slot (zero blocks in the DDF layouts' holes), then P, Q.
        let width = map.syndrome_width();
        let mut slot_role: Vec<Option<MemberIdx>> = vec![None; width];
        for (k, &i) in map.syndrome_order.iter().enumerate() {
            slot_role[map.syndrome_slots[k]] = Some(map.data[i]);
        }
        let (pr, qr) = (map.p, map.q.expect("raid6 has Q"));
        let index_of = |r: MemberIdx| -> usize {
            if r == pr {
                width
            } else if r == qr {
                width + 1
            } else {
                slot_role
                    .iter()
                    .position(|x| *x == Some(r))
                    .expect("role in stripe")
            }
        };
        let lost_idx: Vec<usize> = lost.iter().map(|r| index_of(*r)).collect();
        let mut holes: Vec<AlignedBuf> = slot_role
            .iter()
            .filter(|x| x.is_none())
            .map(|_| AlignedBuf::new(self.len))
            .collect();
        let mut hole_refs = holes.iter_mut();
        let mut refs: Vec<Option<&mut [u8]>> = self
            .bufs
            .iter_mut()
            .map(|b| b.as_mut().map(|b| &mut b[..]))
            .collect();
        let mut blocks: Vec<&mut [u8]> = Vec::with_capacity(width + 2);
        for r in &slot_role {
            match r {
                Some(r) => blocks.push(refs[r.0].take().expect("block present")),
                None => blocks.push(&mut hole_refs.next().expect("hole")[..]),
            }
        }
        blocks.push(refs[pr.0].take().expect("P present"));
        blocks.push(refs[qr.0].take().expect("Q present"));
        uraid_parity::recover(&mut blocks, &lost_idx);
        Ok(())
    }
}

/// Compute P (and Q) of `data` (logical order) into `p`/`q`.
pub(crate) fn gen_parity(map: &StripeMap, data: &[&[u8]], p: &mut [u8], q: Option<&mut [u8]>) {
    match q {
        None => uraid_parity::xor_gen(p, data),
        Some(q) => {
            // Data by coefficient slot; the DDF layouts' holes (P and Q) are zero blocks.
            let zero;
            let mut ordered: Vec<&[u8]> = Vec::with_capacity(map.syndrome_width());
            if map.syndrome_width() == map.syndrome_order.len() {
                ordered.extend(map.syndrome_order.iter().map(|&i| data[i]));
            } else {
                zero = vec![0u8; p.len()];
                ordered.resize(map.syndrome_width(), &zero[..]);
                for (k, &i) in map.syndrome_order.iter().enumerate() {
                    ordered[map.syndrome_slots[k]] = data[i];
                }
            }
            uraid_parity::gen_pq(&ordered, p, q);
        }
    }
}

pub(crate) fn write(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    buf: &[u8],
) -> Result<(), ArrayError> {
    let mut s = sector;
    let mut off = 0usize;
    let stripe_bytes = (g.stripe_data_sectors() * SECTOR_BYTES) as usize;
    let skip_copy = a.tuning.skip_copy.load(Ordering::Relaxed);
    while off < buf.len() {
        let loc = g.locate(s);
        // A run of whole stripes goes out in one pass (md's full-stripe batching).
        let whole = (buf.len() - off) / stripe_bytes;
        if whole >= 2
            && loc.data_index == 0
            && loc.offset_sectors == 0
            && a.tuning.batching.load(Ordering::Relaxed)
            && a.journal.is_none()
        {
            let mut n = whole.min(MAX_BATCH_STRIPES);
            if !skip_copy {
                // The copy of the new data is per batch: bound it.
                n = n.min((COPY_BATCH_BYTES / stripe_bytes).max(1));
            }
            let heads = take_run(a, loc.stripe, n, Get::Wait).expect("waited");
            let n = heads.len();
            let data = &buf[off..off + n * stripe_bytes];
            let done = a.run_stripe(|| write_full_stripes(a, g, loc.stripe, n, data, skip_copy))?;
            drop(heads);
            if done {
                off += n * stripe_bytes;
                s += sectors(n * stripe_bytes);
                continue;
            }
        }
        let next_stripe = g.array_sector(loc.stripe + 1, 0);
        let n = (((next_stripe - s) * SECTOR_BYTES) as usize).min(buf.len() - off);
        let data = &buf[off..off + n];
        {
            let map = g.stripe_map(loc.stripe);
            let mut head = a.stripe_cache.get(loc.stripe, Get::Wait).expect("waited");
            let bufs = head.bufs();
            a.run_stripe(|| {
                retrying(a, &map, loc.stripe, g, |exclude| {
                    write_stripe(a, g, &map, loc.stripe, s, data, exclude, bufs, skip_copy)
                })
            })?;
        }
        off += n;
        s += sectors(n);
    }
    Ok(())
}

/// Most stripes written in one batch.
const MAX_BATCH_STRIPES: usize = 64;
/// Most new data copied per batch when skip_copy is off.
const COPY_BATCH_BYTES: usize = 4 << 20;

/// The heads of up to `n` stripes from `first`: the first as `first_how` says (None if
/// `Get::Try` finds it taken), the others only while they are at hand, so that a thread
/// never waits while it holds a head (no deadlock between batches, whatever the cache size).
fn take_run(a: &Array, first: u64, n: usize, first_how: Get) -> Option<Vec<StripeHead<'_>>> {
    let mut heads = vec![a.stripe_cache.get(first, first_how)?];
    for s in first + 1..first + n as u64 {
        match a.stripe_cache.get(s, Get::Try) {
            Some(h) => heads.push(h),
            None => break,
        }
    }
    Some(heads)
}

/// Write `n` whole stripes from `first` in one pass (the caller holds their heads): parity
/// from the new data, every member write submitted together (the IO layer merges each
/// member's adjacent pieces into one). Without skip_copy the new data is copied first and
/// parity and member writes both come from the copy. Returns false, having done nothing,
/// when a stripe has lost members: those go one by one.
fn write_full_stripes(
    a: &Array,
    g: &ParityGeometry,
    first: u64,
    n: usize,
    data: &[u8],
    skip_copy: bool,
) -> Result<bool, ArrayError> {
    let maps: Vec<StripeMap> = (first..first + n as u64).map(|s| g.stripe_map(s)).collect();
    if maps
        .iter()
        .zip(first..)
        .any(|(m, s)| !lost_roles(a, m, s, &[]).is_empty())
    {
        return Ok(false);
    }
    let copy;
    let data = if skip_copy {
        data
    } else {
        let mut b = AlignedBuf::scratch(data.len());
        b.copy_from_slice(data);
        copy = b;
        &copy[..]
    };
    let cb = chunk_bytes(g);
    let stripe_bytes = cb * g.data_disks();
    let mut parity: Vec<(AlignedBuf, Option<AlignedBuf>)> = Vec::with_capacity(n);
    for (k, map) in maps.iter().enumerate() {
        let sd = &data[k * stripe_bytes..(k + 1) * stripe_bytes];
        let srcs: Vec<&[u8]> = sd.chunks(cb).collect();
        let mut p = AlignedBuf::scratch(cb);
        let mut q = map.q.map(|_| AlignedBuf::scratch(cb));
        gen_parity(map, &srcs, &mut p, q.as_deref_mut());
        parity.push((p, q));
    }
    let mut ops = OpList::new();
    for (k, (map, (p, q))) in maps.iter().zip(&parity).enumerate() {
        let stripe = first + k as u64;
        let msec = g.member_sector(stripe, 0);
        let sd = &data[k * stripe_bytes..(k + 1) * stripe_bytes];
        for (i, chunk) in sd.chunks(cb).enumerate() {
            let r = map.data[i];
            match a.usable(r, stripe) {
                Some(dev) => ops.write(a, dev, r, msec, chunk),
                None => return Ok(false),
            }
        }
        match a.usable(map.p, stripe) {
            Some(dev) => ops.write(a, dev, map.p, msec, p),
            None => return Ok(false),
        }
        if let (Some(qr), Some(q)) = (map.q, q) {
            match a.usable(qr, stripe) {
                Some(dev) => ops.write(a, dev, qr, msec, q),
                None => return Ok(false),
            }
        }
    }
    ops.run(a);
    // Failed writes failed their members; the stripes stay consistent on the survivors.
    if maps
        .iter()
        .zip(first..)
        .any(|(m, s)| lost_roles(a, m, s, &[]).len() > g.parity_disks())
    {
        return Err(no_redundancy(a, "write"));
    }
    Ok(true)
}

/// Discard or zero `n` whole stripes from `first`, holding their heads (a batch at a time):
/// every member that holds data for them gets the same member range, so data and parity
/// are all zeros afterwards. A discard goes down only if every such member reads it back
/// as zeros; otherwise the stripes keep their data.
pub(crate) fn zero(
    a: &Array,
    g: &ParityGeometry,
    first: u64,
    n: u64,
    kind: crate::discard::Kind,
) -> Result<(), ArrayError> {
    let end = first + n;
    let mut s = first;
    while s < end {
        let batch = (end - s).min(MAX_BATCH_STRIPES as u64) as usize;
        let heads = take_run(a, s, batch, Get::Wait).expect("waited");
        let k = heads.len() as u64;
        a.run_stripe(|| zero_stripes(a, g, s, k, kind))?;
        drop(heads);
        s += k;
    }
    Ok(())
}

fn zero_stripes(
    a: &Array,
    g: &ParityGeometry,
    first: u64,
    k: u64,
    kind: crate::discard::Kind,
) -> Result<(), ArrayError> {
    // Recovering members too: below their cursor they must read zeros like the rest,
    // above it recovery rewrites them (it takes these heads, so not meanwhile).
    let devs: Vec<(MemberIdx, std::sync::Arc<dyn crate::member::Member>)> = (0..a.raid_disks())
        .map(MemberIdx)
        .filter(|&r| {
            matches!(
                a.slot_state(r),
                crate::slot::SlotState::InSync | crate::slot::SlotState::Recovering
            )
        })
        .filter_map(|r| a.slot(r).device().map(|d| (r, d)))
        .collect();
    if kind == crate::discard::Kind::Discard && !devs.iter().all(|d| d.1.discard_zeroes()) {
        return Ok(());
    }
    let off_sectors = g.member_sector(first, 0);
    let len = k * chunk_bytes(g) as u64;
    for (role, dev) in &devs {
        let off = a.member_byte(*role, off_sectors);
        crate::discard::member_zero(a, *role, dev.as_ref(), off, len, kind, true);
    }
    // A member that failed was failed; the stripes stay consistent on the survivors.
    if (first..first + k).any(|s| lost_roles(a, &g.stripe_map(s), s, &[]).len() > g.parity_disks())
    {
        return Err(no_redundancy(a, "write-zeroes"));
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

/// Analyse: split the write into per-chunk pieces, the rows [lo, hi) they span, and what the
/// stripe's members can give (a [`Summary`] for the plan step).
struct Analysis<'d> {
    pieces: Vec<Option<Piece<'d>>>,
    lo: usize,
    hi: usize,
    summary: Summary,
}

#[allow(clippy::too_many_arguments)]
fn analyse<'d>(
    a: &Array,
    g: &ParityGeometry,
    map: &StripeMap,
    stripe: u64,
    sector: u64,
    data: &'d [u8],
    exclude: &[MemberIdx],
) -> Analysis<'d> {
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
    analyse_pieces(a, g, map, stripe, pieces, exclude)
}

/// What a stripe write logs to the journal (if there is one) before its member writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Log {
    /// Data and parity (write-through).
    Stripe,
    /// Parity only: the data is in the log already (write-back's write-out).
    ParityOnly,
    /// Nothing: the journal failed and cached data must still reach the members.
    Skip,
}

/// Write-back's hook: write `pieces` (per logical data chunk: start in the chunk, new
/// bytes, whole pages) into the stripe whose head the caller holds, logging as `log` says.
pub(crate) fn write_pieces_locked(
    a: &Array,
    g: &ParityGeometry,
    head: &mut StripeHead<'_>,
    pieces: &[Option<(usize, &[u8])>],
    log: Log,
) -> Result<(), ArrayError> {
    let stripe = head.stripe();
    let map = g.stripe_map(stripe);
    let bufs = head.bufs();
    retrying(a, &map, stripe, g, |exclude| {
        let pieces: Vec<Option<Piece>> = pieces
            .iter()
            .map(|p| p.map(|(start, data)| Piece { start, data }))
            .collect();
        let an = analyse_pieces(a, g, &map, stripe, pieces, exclude);
        let plan = stripe_plan::plan(&an.summary);
        execute(a, g, &map, stripe, &an, &plan, exclude, bufs, log)
    })
}

/// Analyse the per-chunk pieces of one stripe write (see [`analyse`]).
fn analyse_pieces<'d>(
    a: &Array,
    g: &ParityGeometry,
    map: &StripeMap,
    stripe: u64,
    pieces: Vec<Option<Piece<'d>>>,
    exclude: &[MemberIdx],
) -> Analysis<'d> {
    let dd = g.data_disks();
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
    // The journal logs whole pages: widen to pages; a sub-page piece then reconstructs.
    let (lo, hi) = match a.journal {
        Some(_) => (lo / 4096 * 4096, hi.div_ceil(4096) * 4096),
        None => (lo, hi),
    };
    let cover = pieces
        .iter()
        .map(|p| match p {
            None => Cover::None,
            Some(p) if p.start == lo && p.end() == hi => Cover::Full,
            Some(_) => Cover::Partial,
        })
        .collect();
    let lost = lost_roles(a, map, stripe, exclude);
    let lost_data = (0..dd).filter(|&i| lost.contains(&map.data[i])).collect();
    let lost_parity = lost.iter().filter(|r| !map.data.contains(r)).count();
    let sub_page_journal = a.journal.is_some()
        && pieces
            .iter()
            .flatten()
            .any(|pc| pc.start % 4096 != 0 || pc.end() % 4096 != 0);
    Analysis {
        pieces,
        lo,
        hi,
        summary: Summary {
            cover,
            lost_data,
            lost_parity,
            parity_disks: g.parity_disks(),
            sub_page_journal,
            rmw_level: a.tuning.rmw_level.load(Ordering::Relaxed),
        },
    }
}

/// One stripe write: analyse, plan, execute. Buffers come from the stripe's head.
#[allow(clippy::too_many_arguments)]
fn write_stripe(
    a: &Array,
    g: &ParityGeometry,
    map: &StripeMap,
    stripe: u64,
    sector: u64,
    data: &[u8],
    exclude: &[MemberIdx],
    bufs: &mut HeadBufs,
    skip_copy: bool,
) -> Result<Outcome, ArrayError> {
    // Without skip_copy, parity and member writes both come from one private copy of the
    // new data, so a caller changing its buffer meanwhile cannot make them disagree.
    let copy = (!skip_copy).then(|| {
        let mut b = bufs.take(data.len());
        b.copy_from_slice(data);
        b
    });
    let data = copy.as_deref().unwrap_or(data);
    let an = analyse(a, g, map, stripe, sector, data, exclude);
    let plan = stripe_plan::plan(&an.summary);
    let r = execute(a, g, map, stripe, &an, &plan, exclude, bufs, Log::Stripe);
    if let Some(c) = copy {
        bufs.put(c);
    }
    r
}

/// Execute a stripe write's plan: reads, parity, journal, member writes.
#[allow(clippy::too_many_arguments)]
fn execute(
    a: &Array,
    g: &ParityGeometry,
    map: &StripeMap,
    stripe: u64,
    an: &Analysis<'_>,
    plan: &Plan,
    exclude: &[MemberIdx],
    bufs: &mut HeadBufs,
    log: Log,
) -> Result<Outcome, ArrayError> {
    let (pieces, lo, hi) = (&an.pieces, an.lo, an.hi);
    let mut p = bufs.take(hi - lo);
    let mut q = map.q.map(|_| bufs.take(hi - lo));
    let mut cols: Vec<AlignedBuf> = Vec::new();
    match plan {
        Plan::Unrecoverable => return Err(no_redundancy(a, "write")),
        Plan::Full => {
            let srcs: Vec<&[u8]> = pieces
                .iter()
                .map(|p| p.as_ref().expect("full").data)
                .collect();
            gen_parity(map, &srcs, &mut p, q.as_deref_mut());
        }
        Plan::Rmw { read_data } => {
            // Read-modify-write: fold old ^ new of each touched chunk into the old parity.
            let mut old: Vec<Option<AlignedBuf>> = (0..pieces.len()).map(|_| None).collect();
            for &i in read_data {
                let pc = pieces[i].as_ref().expect("touched");
                old[i] = Some(bufs.take(pc.data.len()));
            }
            let msec_lo = g.member_sector(stripe, sectors(lo));
            let failed = {
                let mut ops = OpList::new();
                for (i, b) in old.iter_mut().enumerate() {
                    if let (Some(b), Some(pc)) = (b, &pieces[i]) {
                        let r = map.data[i];
                        // A member may fail between the analysis and here (another
                        // request saw it): then redo the stripe with the new lost set.
                        let Some(dev) = a.usable(r, stripe) else {
                            return Ok(Outcome::Retry(Vec::new()));
                        };
                        ops.read(a, dev, r, g.member_sector(stripe, sectors(pc.start)), b);
                    }
                }
                let Some(pdev) = a.usable(map.p, stripe) else {
                    return Ok(Outcome::Retry(Vec::new()));
                };
                ops.read(a, pdev, map.p, msec_lo, &mut p);
                if let (Some(q), Some(qr)) = (q.as_deref_mut(), map.q) {
                    let Some(qdev) = a.usable(qr, stripe) else {
                        return Ok(Outcome::Retry(Vec::new()));
                    };
                    ops.read(a, qdev, qr, msec_lo, q);
                }
                ops.run(a)
            };
            if !failed.reads.is_empty() {
                return Ok(Outcome::Retry(failed.reads));
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
                                .map(|k| map.syndrome_slots[k])
                                .expect("slot");
                            uraid_parity::update_pq(slot, b, &mut p[range.clone()], &mut q[range]);
                        }
                    }
                }
            }
            for b in old.into_iter().flatten() {
                bufs.put(b);
            }
        }
        Plan::Rcw {
            read_data,
            reconstruct,
        } => {
            // Reconstruct-write: read what the write does not cover (and, when a lost chunk
            // is not fully rewritten, everything needed to rebuild it), then compute parity
            // afresh.
            let want = |r: MemberIdx| {
                *reconstruct
                    || map
                        .data
                        .iter()
                        .position(|&d| d == r)
                        .is_some_and(|i| read_data.contains(&i))
            };
            let mut take = |len| bufs.take(len);
            let loaded = Rows::load_into(a, g, map, stripe, lo, hi, exclude, want, &mut take);
            let mut rows = match loaded {
                Ok(r) => r,
                Err(failed) => return Ok(Outcome::Retry(failed)),
            };
            if *reconstruct {
                rows.reconstruct(a, g, map)?;
            } else if read_data
                .iter()
                .any(|&i| rows.bufs[map.data[i].0].is_none())
            {
                // A member failed after the analysis: redo with the new set.
                return Ok(Outcome::Retry(Vec::new()));
            }
            for (i, r) in map.data.iter().enumerate() {
                let mut b = bufs.take(hi - lo);
                if an.summary.cover[i] != Cover::Full {
                    b.copy_from_slice(rows.get(*r));
                }
                if let Some(pc) = &pieces[i] {
                    b[pc.start - lo..pc.end() - lo].copy_from_slice(pc.data);
                }
                cols.push(b);
            }
            let srcs: Vec<&[u8]> = cols.iter().map(|b| &b[..]).collect();
            gen_parity(map, &srcs, &mut p, q.as_deref_mut());
            for b in rows.bufs.into_iter().flatten() {
                bufs.put(b);
            }
        }
    }

    // Write-through: the stripe's new pages are durable in the journal before any member write.
    let ticket = match &a.journal {
        Some(j) if log != Log::Skip => {
            let pages: Vec<Option<(usize, &[u8])>> = pieces
                .iter()
                .enumerate()
                .map(|(i, pc)| {
                    pc.as_ref().map(|pc| {
                        let (s, e) = (pc.start / 4096 * 4096, pc.end().div_ceil(4096) * 4096);
                        if (s, e) == (pc.start, pc.end()) {
                            (s, pc.data)
                        } else {
                            (s, &cols[i][s - lo..e - lo])
                        }
                    })
                })
                .collect();
            let logged = if log == Log::ParityOnly {
                j.log_parity(g, stripe, &pages, &p, q.as_deref(), a)
            } else {
                j.log_stripe(g, stripe, &pages, &p, q.as_deref(), a)
            };
            Some(logged.map_err(|e| a.journal_error(e))?)
        }
        _ => None,
    };
    // Excluded members (read errors) still take writes: writing is how a bad sector heals.
    let msec_lo = g.member_sector(stripe, sectors(lo));
    let mut ops = OpList::new();
    for (i, pc) in pieces.iter().enumerate() {
        if let Some(pc) = pc {
            let r = map.data[i];
            if let Some(dev) = a.usable(r, stripe) {
                ops.write(
                    a,
                    dev,
                    r,
                    g.member_sector(stripe, sectors(pc.start)),
                    pc.data,
                );
            }
        }
    }
    if let Some(dev) = a.usable(map.p, stripe) {
        ops.write(a, dev, map.p, msec_lo, &p);
    }
    if let (Some(qr), Some(q)) = (map.q, q.as_deref()) {
        if let Some(dev) = a.usable(qr, stripe) {
            ops.write(a, dev, qr, msec_lo, q);
        }
    }
    ops.run(a);
    if let (Some(j), Some(t)) = (&a.journal, ticket) {
        j.stripe_written(t);
    }
    for b in cols.into_iter().chain(std::iter::once(p)).chain(q) {
        bufs.put(b);
    }
    // A failed write leaves the stripe consistent on the survivors; it only matters if
    // the array lost more than it tolerates.
    if lost_roles(a, map, stripe, &[]).len() > g.parity_disks() {
        return Err(no_redundancy(a, "write"));
    }
    Ok(Outcome::Done)
}

/// Rows per sync step inside a chunk.
const SYNC_ROWS_BYTES: usize = 64 * 1024;
/// md compares and counts in pages.
const PAGE: usize = 4096;

/// Sync stripes from `start`, at most `max` stripes: resync/check/repair compare parity with
/// the data (counting mismatched sectors as md's mismatch_cnt), recovery rebuilds the
/// `targets`' blocks. Returns (stripes done, mismatched sectors).
pub(crate) fn sync_range(
    a: &Array,
    g: &ParityGeometry,
    start: u64,
    max: u64,
    ctx: &SyncCtx,
) -> Result<(u64, u64), ArrayError> {
    let (mode, targets) = (ctx.mode, ctx.targets);
    let cb = chunk_bytes(g);
    let end = (start + max.max(1)).min(g.stripes());
    let mut mismatches = 0u64;
    let batch = (a.tuning.sync_batch_bytes.load(Ordering::Relaxed) / cb).max(1) as u64;
    let mut next = start;
    // The previous pass, read and rebuilt, its writes not yet issued (stripes still locked).
    let mut pending: Option<SyncPass> = None;
    while next < end {
        // Several whole stripes per pass: one read of each member and one write, so that
        // members stream instead of waiting for each other stripe by stripe.
        let k = batch.min(end - next);
        if k >= 2 {
            // Pipelined: the writes of the previous pass go out together with the reads of
            // this one. While the previous pass still holds stripe heads, this one's are
            // only taken if at hand (waiting for a head while holding others could wait
            // for ourselves in a small cache); if the first is not, the previous pass
            // completes first. As many of the k stripes as are at hand make the pass.
            let how = if pending.is_some() {
                Get::Try
            } else {
                Get::Wait
            };
            let heads = take_run(a, next, k as usize, how);
            let Some(heads) = heads else {
                if let Some(p) = pending.take() {
                    p.complete(a, g, ctx);
                }
                continue;
            };
            let k = heads.len() as u64;
            let mut reads = SyncPass::plan(a, g, ctx, next, k, heads);
            let mut ops = OpList::new();
            if let Some(p) = &pending {
                p.queue_writes(a, g, ctx, &mut ops);
            }
            let read_ok = reads.queue_reads(a, g, ops);
            if let Some(p) = pending.take() {
                // Its writes completed (a failed write has failed its member): the cursor
                // moves past its stripes before their locks go.
                ctx.advance(a, p.first + p.k);
            }
            if read_ok {
                mismatches += reads.rebuild(a, g, ctx)?;
                next += k;
                pending = Some(reads);
                continue;
            }
            drop(reads);
        }
        if let Some(p) = pending.take() {
            p.complete(a, g, ctx);
        }
        let stripe = next;
        next += 1;
        let map = g.stripe_map(stripe);
        // The recovery cursor moves only while the stripe's head is held (ctx.advance).
        let _head = a.stripe_cache.get(stripe, Get::Wait);
        // The bitmap counts member sectors for the parity levels.
        let mut lo = if ctx.skip_clean && a.bitmap_clean(stripe * g.chunk_sectors, g.chunk_sectors)
        {
            cb
        } else {
            0
        };
        while lo < cb {
            let hi = (lo + SYNC_ROWS_BYTES).min(cb);
            let mut exclude: Vec<MemberIdx> = Vec::new();
            let mut rows = loop {
                match Rows::load(a, g, &map, stripe, lo, hi, &exclude, |_| true) {
                    Ok(r) => break r,
                    Err(failed) => {
                        exclude.extend(failed);
                        if lost_roles(a, &map, stripe, &exclude).len() > g.parity_disks() {
                            for r in &exclude {
                                a.member_error(
                                    *r,
                                    &std::io::Error::other("read error during sync"),
                                );
                            }
                            return Err(no_redundancy(a, "sync"));
                        }
                    }
                }
            };
            let lost = lost_roles(a, &map, stripe, &exclude);
            let msec = g.member_sector(stripe, sectors(lo));
            let mut ops = OpList::new();
            let mut writes: Vec<(MemberIdx, AlignedBuf)> = Vec::new();
            if !lost.is_empty() {
                // Rebuild what is missing (recovery targets, read errors).
                rows.reconstruct(a, g, &map)?;
                for r in lost.iter().filter(|r| targets.contains(r)) {
                    let mut b = AlignedBuf::new(hi - lo);
                    b.copy_from_slice(rows.get(*r));
                    writes.push((*r, b));
                }
            } else {
                mismatches += compare_rows(&mut rows, &map, hi - lo, mode, &mut writes);
            }
            for (r, b) in &writes {
                let dev = if targets.contains(r) {
                    a.slot(*r).device()
                } else {
                    a.usable(*r, stripe)
                };
                if let Some(dev) = dev {
                    ops.write(a, dev, *r, msec, b);
                }
            }
            ops.run(a);
            // Read errors: the rebuilt block is written back and counted, as any read-error
            // repair (md's fix_read_error: decaying count, bad block log, limit of 20).
            for r in exclude.iter().filter(|r| !targets.contains(r)) {
                if a.usable(*r, stripe).is_some() {
                    a.repair_read(*r, msec, rows.get(*r));
                }
            }
            lo = hi;
        }
        ctx.advance(a, stripe + 1);
    }
    if let Some(p) = pending.take() {
        p.complete(a, g, ctx);
    }
    Ok((end - start, mismatches))
}

/// `k` whole stripes from `first` synced in one pass: read (every member once), rebuilt or
/// compared, then written; the stripes' heads are held from the read until the writes complete.
struct SyncPass<'a> {
    first: u64,
    k: u64,
    _heads: Vec<StripeHead<'a>>,
    stripes: Vec<u64>,
    maps: Vec<StripeMap>,
    rows: Vec<Rows>,
    /// Blocks to write: (stripe, role, data).
    writes: Vec<(u64, MemberIdx, AlignedBuf)>,
}

impl<'a> SyncPass<'a> {
    /// Buffers for the stripes that need syncing (the bitmap may say some are clean).
    fn plan(
        a: &Array,
        g: &ParityGeometry,
        ctx: &SyncCtx,
        first: u64,
        k: u64,
        heads: Vec<StripeHead<'a>>,
    ) -> SyncPass<'a> {
        let cb = chunk_bytes(g);
        let stripes: Vec<u64> = (first..first + k)
            .filter(|&s| !(ctx.skip_clean && a.bitmap_clean(s * g.chunk_sectors, g.chunk_sectors)))
            .collect();
        let maps: Vec<StripeMap> = stripes.iter().map(|&s| g.stripe_map(s)).collect();
        let rows = maps
            .iter()
            .zip(&stripes)
            .map(|(map, &s)| {
                let mut bufs: Vec<Option<AlignedBuf>> = (0..a.raid_disks()).map(|_| None).collect();
                for role in stripe_roles(map) {
                    if a.usable(role, s).is_some() {
                        bufs[role.0] = Some(AlignedBuf::scratch(cb));
                    }
                }
                Rows { bufs, len: cb }
            })
            .collect();
        SyncPass {
            first,
            k,
            _heads: heads,
            stripes,
            maps,
            rows,
            writes: Vec::new(),
        }
    }

    /// Read every planned block, together with what `ops` already holds (the previous
    /// pass's writes). False if a read failed: then nothing of this pass may be used.
    fn queue_reads<'o>(&'o mut self, a: &Array, g: &ParityGeometry, mut ops: OpList<'o>) -> bool {
        for (r, &s) in self.rows.iter_mut().zip(&self.stripes) {
            for (i, b) in r.bufs.iter_mut().enumerate() {
                let Some(b) = b else { continue };
                match a.usable(MemberIdx(i), s) {
                    Some(dev) => ops.read(a, dev, MemberIdx(i), g.member_sector(s, 0), b),
                    // Gone since planning (failed): the stripe-by-stripe path copes.
                    None => return false,
                }
            }
        }
        ops.run(a).reads.is_empty()
    }

    /// Rebuild the targets' blocks (recovery) or compare parity (resync, check, repair);
    /// queue the blocks to write. Returns mismatched sectors.
    fn rebuild(&mut self, a: &Array, g: &ParityGeometry, ctx: &SyncCtx) -> Result<u64, ArrayError> {
        let cb = chunk_bytes(g);
        let mut mismatches = 0;
        for ((map, &s), r) in self
            .maps
            .iter()
            .zip(&self.stripes)
            .zip(self.rows.iter_mut())
        {
            let lost = lost_roles(a, map, s, &[]);
            let mut w: Vec<(MemberIdx, AlignedBuf)> = Vec::new();
            if !lost.is_empty() {
                // Rebuilt straight into the buffer that is then written.
                r.reconstruct(a, g, map)?;
                for l in lost.iter().filter(|l| ctx.targets.contains(l)) {
                    w.push((*l, r.bufs[l.0].take().expect("rebuilt block")));
                }
            } else {
                mismatches += compare_rows(r, map, cb, ctx.mode, &mut w);
            }
            self.writes
                .extend(w.into_iter().map(|(role, b)| (s, role, b)));
        }
        // The read buffers are not needed any more: back to the pool for the next pass.
        self.rows.clear();
        Ok(mismatches)
    }

    fn queue_writes<'o>(
        &'o self,
        a: &Array,
        g: &ParityGeometry,
        ctx: &SyncCtx,
        ops: &mut OpList<'o>,
    ) {
        for (s, role, b) in &self.writes {
            let dev = if ctx.targets.contains(role) {
                a.slot(*role).device()
            } else {
                a.usable(*role, *s)
            };
            if let Some(dev) = dev {
                ops.write(a, dev, *role, g.member_sector(*s, 0), b);
            }
        }
    }

    /// Write the pass (with whatever `ops` holds) and move the cursor past it.
    fn complete(self, a: &Array, g: &ParityGeometry, ctx: &SyncCtx) {
        let mut ops = OpList::new();
        self.queue_writes(a, g, ctx, &mut ops);
        ops.run(a);
        ctx.advance(a, self.first + self.k);
    }
}

/// Check parity of complete rows page by page; in repair mode queue fixed blocks in
/// `writes`. For raid6, a page where both P and Q disagree in a way that one data block
/// explains gets that data block fixed (md only does this offline, in raid6check).
fn compare_rows(
    rows: &mut Rows,
    map: &StripeMap,
    len: usize,
    mode: SyncMode,
    writes: &mut Vec<(MemberIdx, AlignedBuf)>,
) -> u64 {
    let data: Vec<&[u8]> = map.data.iter().map(|r| rows.get(*r)).collect();
    let mut p = AlignedBuf::new(len);
    let mut q = map.q.map(|_| AlignedBuf::new(len));
    gen_parity(map, &data, &mut p, q.as_deref_mut());
    let mut mismatched = 0u64;
    let mut fix: Vec<(MemberIdx, usize, Vec<u8>)> = Vec::new(); // (role, page offset, bytes)
    for off in (0..len).step_by(PAGE) {
        let end = (off + PAGE).min(len);
        let p_bad = rows.get(map.p)[off..end] != p[off..end];
        let q_bad = match (map.q, &q) {
            (Some(qr), Some(q)) => rows.get(qr)[off..end] != q[off..end],
            _ => false,
        };
        if !p_bad && !q_bad {
            continue;
        }
        mismatched += ((end - off) / 512) as u64;
        if mode != SyncMode::Repair {
            continue;
        }
        match (map.q, &q) {
            (Some(qr), Some(qq)) if p_bad && q_bad => {
                let dp: Vec<u8> = rows.get(map.p)[off..end]
                    .iter()
                    .zip(&p[off..end])
                    .map(|(a, b)| a ^ b)
                    .collect();
                let dq: Vec<u8> = rows.get(qr)[off..end]
                    .iter()
                    .zip(&qq[off..end])
                    .map(|(a, b)| a ^ b)
                    .collect();
                let located = locate_bad_data(&dp, &dq, map.syndrome_width())
                    .and_then(|slot| map.syndrome_slots.iter().position(|&x| x == slot));
                match located {
                    Some(k) => {
                        let r = map.data[map.syndrome_order[k]];
                        let fixed: Vec<u8> = rows.get(r)[off..end]
                            .iter()
                            .zip(&dp)
                            .map(|(a, b)| a ^ b)
                            .collect();
                        fix.push((r, off, fixed));
                    }
                    None => {
                        fix.push((map.p, off, p[off..end].to_vec()));
                        fix.push((qr, off, qq[off..end].to_vec()));
                    }
                }
            }
            (Some(qr), Some(qq)) if q_bad => fix.push((qr, off, qq[off..end].to_vec())),
            _ => fix.push((map.p, off, p[off..end].to_vec())),
        }
    }
    if !fix.is_empty() {
        let mut touched: Vec<MemberIdx> = Vec::new();
        for (r, off, bytes) in fix {
            rows.get_mut(r)[off..off + bytes.len()].copy_from_slice(&bytes);
            if !touched.contains(&r) {
                touched.push(r);
            }
        }
        for r in touched {
            let mut b = AlignedBuf::new(len);
            b.copy_from_slice(rows.get(r));
            writes.push((r, b));
        }
    }
    mismatched
}

/// raid6: given P and Q deltas of one page, the syndrome slot z of a single bad data block
/// explains them iff dq = {02}^z * dp at every byte (and both are zero together).
pub fn locate_bad_data(dp: &[u8], dq: &[u8], ndata: usize) -> Option<usize> {
    use uraid_parity::gf;
    let mut z: Option<usize> = None;
    for (&p, &q) in dp.iter().zip(dq) {
        match (p, q) {
            (0, 0) => continue,
            (0, _) | (_, 0) => return None,
            (p, q) => {
                let k = (gf::LOG[q as usize] as usize + 255 - gf::LOG[p as usize] as usize) % 255;
                match z {
                    None => z = Some(k),
                    Some(prev) if prev != k => return None,
                    _ => {}
                }
            }
        }
    }
    z.filter(|&k| k < ndata)
}
