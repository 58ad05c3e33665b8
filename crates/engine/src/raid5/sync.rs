//! raid4/5/6 sync: resync, check and repair compare parity with the data (md's
//! mismatch_cnt); recovery rebuilds the targets' blocks. Batched passes of whole stripes.

use super::stripe::{gen_parity, Rows};
use super::write::take_run;
use super::StripeHead;
use super::{chunk_bytes, lost_roles, sectors, stripe_roles};
use crate::array::{no_redundancy, Array};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::in_order::in_order;
use crate::member_io::{member_byte, OpList};
use crate::mirror::{SyncCtx, SyncMode};
use crate::stripe_cache::Get;
use std::sync::atomic::{AtomicU64, Ordering};
use uraid_core::geometry::{ParityGeometry, StripeMap};
use uraid_core::{MemberIdx, MemberMap, Sector};

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
    let cb = chunk_bytes(g);
    let end = (start + max.max(1)).min(g.stripes());
    let mut mismatches = 0u64;
    let batch = (a.r5().tuning.sync_batch_bytes.load(Ordering::Relaxed) / cb).max(1) as u64;
    let threads = a.r5().tuning.sync_threads.load(Ordering::Relaxed).max(1);
    if threads > 1 && batch >= 2 && end - start > batch {
        return sync_passes_side_by_side(a, g, start, end, batch, threads, ctx);
    }
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
        // The recovery cursor moves only while the stripe's head is held (ctx.advance).
        let _head = a.r5().stripe_cache.get(stripe, Get::Wait);
        mismatches += sync_stripe(a, g, stripe, ctx)?;
    }
    if let Some(p) = pending.take() {
        p.complete(a, g, ctx);
    }
    Ok((end - start, mismatches))
}

/// The passes of [start, end) on `threads` threads ([`in_order`]): each thread runs
/// whole passes (take the next pass's heads, read, rebuild or compare, write), so one
/// pass's parity is computed while another's member IO runs. A pass's heads are taken in
/// order, the first waited for and the rest only if at hand, while its thread holds no
/// other head ([`take_run`]); the pass keeps them until its turn has moved the cursor.
fn sync_passes_side_by_side(
    a: &Array,
    g: &ParityGeometry,
    start: u64,
    end: u64,
    batch: u64,
    threads: usize,
    ctx: &SyncCtx,
) -> Result<(u64, u64), ArrayError> {
    let mismatches = AtomicU64::new(0);
    let mut next = start;
    in_order(
        threads,
        || {
            if next >= end {
                return None;
            }
            let want = batch.min(end - next) as usize;
            let heads = take_run(a, next, want, Get::Wait).expect("Get::Wait gives a head");
            let first = next;
            next += heads.len() as u64;
            Some((first, heads))
        },
        |(first, heads)| {
            let k = heads.len() as u64;
            let mut pass = SyncPass::plan(a, g, ctx, *first, k, std::mem::take(heads));
            let rebuilt = pass.queue_reads(a, g, OpList::new()).then(|| {
                let r = pass.rebuild(a, g, ctx);
                if r.is_ok() {
                    pass.write(a, g, ctx);
                }
                r
            });
            (pass, rebuilt)
        },
        |(first, _), (pass, rebuilt)| {
            let k = pass.k;
            let m = match rebuilt {
                // Its writes completed (a failed write has failed its member): the cursor
                // moves past its stripes before their heads go.
                Some(r) => {
                    let m = r?;
                    ctx.advance(a, first + k);
                    m
                }
                // A read failed: stripe by stripe, row by row, on the heads the pass holds.
                None => {
                    let _heads = pass.into_heads();
                    (first..first + k).try_fold(0, |m, s| {
                        Ok::<_, ArrayError>(m + sync_stripe(a, g, s, ctx)?)
                    })?
                }
            };
            mismatches.fetch_add(m, Ordering::Relaxed);
            Ok(())
        },
    )?;
    Ok((end - start, mismatches.into_inner()))
}

/// Sync one stripe row by row (the caller holds its head), then move the cursor past it.
/// Returns mismatched sectors. Read errors are answered from redundancy and repaired.
fn sync_stripe(
    a: &Array,
    g: &ParityGeometry,
    stripe: u64,
    ctx: &SyncCtx,
) -> Result<u64, ArrayError> {
    let (mode, targets) = (ctx.mode, ctx.targets);
    let cb = chunk_bytes(g);
    let map = g.stripe_map(stripe);
    let mut mismatches = 0u64;
    // The bitmap counts member sectors for the parity levels.
    let mut lo = if ctx.skip_clean && a.bitmap_clean(stripe * g.chunk_sectors, g.chunk_sectors) {
        cb
    } else {
        0
    };
    while lo < cb {
        let hi = (lo + SYNC_ROWS_BYTES).min(cb);
        let mut exclude: Vec<MemberIdx> = Vec::new();
        let mut rows = loop {
            match Rows::load(
                a,
                g,
                &map,
                stripe,
                lo,
                hi,
                &exclude,
                |_| true,
                &mut AlignedBuf::scratch,
            ) {
                Ok(r) => break r,
                Err(failed) => {
                    exclude.extend(failed);
                    if lost_roles(a, &map, stripe, &exclude).len() > g.parity_disks() {
                        for r in &exclude {
                            a.member_error(*r, &std::io::Error::other("read error during sync"));
                        }
                        return Err(no_redundancy(a, "sync"));
                    }
                }
            }
        };
        let lost = lost_roles(a, &map, stripe, &exclude);
        let msec = g.member_sector(stripe, sectors(lo));
        let mut writes: Vec<(MemberIdx, AlignedBuf)> = Vec::new();
        let mut ops = OpList::new();
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
                ops.write(a, dev, *r, Sector(msec), b);
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
    Ok(mismatches)
}

/// `k` whole stripes from `first` synced in one pass: read (every member once), rebuilt or
/// compared, then written; the stripes' heads are held from the read until the writes complete.
struct SyncPass<'a> {
    first: u64,
    k: u64,
    heads: Vec<StripeHead<'a>>,
    stripes: Vec<u64>,
    maps: Vec<StripeMap>,
    rows: Vec<Rows>,
    /// Blocks to write: (stripe, role, data).
    writes: Vec<(u64, MemberIdx, AlignedBuf)>,
    /// Recovery targets' blocks of stripes that are holes on every member read: zeroed
    /// (role, stripe), sorted, never read nor computed (see [`holes_everywhere`]).
    zeroes: Vec<(MemberIdx, u64)>,
}

/// The parity block a raid6 recovery of this stripe need not read: with one member lost
/// and rebuilt, P gives back a data block or itself (XOR, [`Rows::reconstruct_from_p`]),
/// and Q is computed from the data (P is then recomputed beside it and dropped), so the
/// other parity is not needed. One read fewer per stripe; md reads them all.
fn unneeded_parity(map: &StripeMap, lost: &[MemberIdx], ctx: &SyncCtx) -> Option<MemberIdx> {
    match (map.q, lost) {
        (Some(q), [l]) if ctx.targets.contains(l) => Some(if *l == q { map.p } else { q }),
        _ => None,
    }
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
        let mut zeroes = Vec::new();
        let stripes: Vec<u64> = (first..first + k)
            .filter(|&s| !(ctx.skip_clean && a.bitmap_clean(s * g.chunk_sectors, g.chunk_sectors)))
            .filter(|&s| {
                let map = g.stripe_map(s);
                if !holes_everywhere(a, g, &map, s) {
                    return true;
                }
                a.stats
                    .sync_zero_bytes
                    .fetch_add(cb as u64 * g.data_disks() as u64, Ordering::Relaxed);
                let lost = lost_roles(a, &map, s, &[]);
                zeroes.extend(
                    lost.into_iter()
                        .filter(|l| ctx.targets.contains(l))
                        .map(|l| (l, s)),
                );
                false
            })
            .collect();
        zeroes.sort_unstable();
        let maps: Vec<StripeMap> = stripes.iter().map(|&s| g.stripe_map(s)).collect();
        let rows = maps
            .iter()
            .zip(&stripes)
            .map(|(map, &s)| {
                let mut bufs: MemberMap<Option<AlignedBuf>> =
                    MemberMap::from_fn(a.raid_disks(), |_| None);
                let unread = unneeded_parity(map, &lost_roles(a, map, s, &[]), ctx);
                for role in stripe_roles(map) {
                    if Some(role) != unread && a.usable(role, s).is_some() {
                        bufs[role] = Some(AlignedBuf::scratch(cb));
                    }
                }
                Rows { bufs, len: cb }
            })
            .collect();
        SyncPass {
            first,
            k,
            heads,
            stripes,
            maps,
            rows,
            writes: Vec::new(),
            zeroes,
        }
    }

    /// Read every planned block, together with what `ops` already holds (the previous
    /// pass's writes). False if a read failed: then nothing of this pass may be used.
    fn queue_reads<'o>(&'o mut self, a: &Array, g: &ParityGeometry, mut ops: OpList<'o>) -> bool {
        for (r, &s) in self.rows.iter_mut().zip(&self.stripes) {
            for (role, b) in r.bufs.iter_mut() {
                let Some(b) = b else { continue };
                match a.usable(role, s) {
                    Some(dev) => ops.read(a, dev, role, Sector(g.member_sector(s, 0)), b),
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
                // Rebuilt straight into the buffer that is then written: from P alone where
                // the plan left Q unread (`unneeded_parity`) and one block is lost, by the
                // stripe's whole parity math otherwise. Told from the buffers themselves, so
                // a member that failed after planning cannot make the two disagree.
                let q_unread = map.q.is_some_and(|q| !r.has(q) && !lost.contains(&q));
                match lost.as_slice() {
                    [l] if q_unread => r.reconstruct_from_p(map, *l),
                    _ => r.reconstruct(a, g, map)?,
                }
                for l in lost.iter().filter(|l| ctx.targets.contains(l)) {
                    w.push((*l, r.bufs[*l].take().expect("rebuilt block")));
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
        // Consecutive stripes are consecutive on a member: one zeroing per run and role
        // (`zeroes` is in role, then stripe order).
        let cb = chunk_bytes(g) as u64;
        let mut i = 0;
        while i < self.zeroes.len() {
            let (role, first) = self.zeroes[i];
            let n = self.zeroes[i..]
                .iter()
                .zip(first..)
                .take_while(|&(&(r, s), want)| r == role && s == want)
                .count();
            i += n;
            let at = member_byte(a.slot(role), Sector(g.member_sector(first, 0)));
            crate::discard::zero_target(a, role, at, cb * n as u64);
        }
        for (s, role, b) in &self.writes {
            let dev = if ctx.targets.contains(role) {
                a.slot(*role).device()
            } else {
                a.usable(*role, *s)
            };
            if let Some(dev) = dev {
                ops.write(a, dev, *role, Sector(g.member_sector(*s, 0)), b);
            }
        }
    }

    /// The heads of its stripes, its buffers dropped.
    fn into_heads(self) -> Vec<StripeHead<'a>> {
        self.heads
    }

    /// Write the pass's blocks (zeroings first) and wait for the writes.
    fn write(&self, a: &Array, g: &ParityGeometry, ctx: &SyncCtx) {
        let mut ops = OpList::new();
        self.queue_writes(a, g, ctx, &mut ops);
        ops.run(a);
    }

    /// Write the pass and move the cursor past it.
    fn complete(self, a: &Array, g: &ParityGeometry, ctx: &SyncCtx) {
        self.write(a, g, ctx);
        ctx.advance(a, self.first + self.k);
    }
}

/// Whether stripe `s` is a hole (SEEK_DATA: nothing allocated) on every member that holds
/// valid data for it: then its data, its parity and any block rebuilt from them are zeros
/// (the parity of zeros is zeros, P and Q alike), so a sync neither reads nor compares it
/// and a recovery zeroes its targets' blocks (md cannot tell, and reads and rewrites
/// them). Never with a journal, whose log may hold the stripe's newest data; members that
/// cannot tell (block devices) say data, and the stripe is synced as any other.
fn holes_everywhere(a: &Array, g: &ParityGeometry, map: &StripeMap, s: u64) -> bool {
    if a.has_journal() {
        return false;
    }
    let cb = chunk_bytes(g) as u64;
    // Or the array knows the stripe's data was never written: zeros everywhere too.
    let known = a.never_written(g.array_sector(s, 0), g.stripe_data_sectors());
    let mut asked = 0;
    for role in stripe_roles(map) {
        let slot = a.slot(role);
        let Some(dev) = slot.usable(s) else { continue };
        let at = member_byte(slot, Sector(g.member_sector(s, 0)));
        if !known && !dev.is_hole(at, cb).unwrap_or(false) {
            return false;
        }
        asked += 1;
    }
    // A stripe with fewer valid members than its data disks cannot be rebuilt at all.
    asked >= g.data_disks()
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
