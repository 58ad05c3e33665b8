//! raid4/5/6 writes: runs of whole stripes in one pass, otherwise one stripe at a time as
//! analyse -> plan ([`crate::stripe_plan`]) -> execute (rmw or rcw, journal first if any);
//! discard and write-zeroes of whole stripes.

use super::stripe::{gen_parity, Rows, Sources};
use super::StripeHead;
use super::{chunk_bytes, lost_roles, retrying, sectors, Outcome};
use crate::array::{no_redundancy, Array};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::member_io::{OpList, Roles};
use crate::stripe_cache::{Get, HeadBufs, WHOLE};
use crate::stripe_plan::{self, Cover, Plan, Summary};
use std::sync::atomic::Ordering;
use uraid_core::geometry::{ParityGeometry, StripeList, StripeLocation, StripeMap};
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

pub(crate) fn write(
    a: &Array,
    g: &ParityGeometry,
    sector: u64,
    buf: &[u8],
) -> Result<(), ArrayError> {
    // Counted while it runs, so that a leader knows whether anyone else could join.
    let _writing = a.r5().joins.writing();
    // Every piece is offered first: written at once, or joined to another write's pending
    // stripe, or leading one. Then the stripes this request leads are written, waiting for
    // their joiners: a request that waited there before offering its next piece kept the
    // stripe that piece belongs to from filling (the request behind it, started first, led
    // that stripe alone and gave up waiting). Last, the joined pieces are waited for.
    let (mut joined, mut led) = (Vec::new(), Vec::new());
    let r = offer_pieces(a, g, sector, buf, &mut joined, &mut led);
    let first = led
        .into_iter()
        .map(|l| write_led(a, g, l))
        .chain(joined.into_iter().map(|j| j.wait()))
        .fold(r.err(), |first, r| first.or(r.err()));
    first.map_or(Ok(()), Err)
}

/// Write `buf` at array sector `sector` piece by piece (a stripe or a run of whole stripes
/// each): written at once, or joined (`joined`), or leading a pending stripe (`led`,
/// written by the caller afterwards).
fn offer_pieces<'a>(
    a: &'a Array,
    g: &ParityGeometry,
    sector: u64,
    buf: &'a [u8],
    joined: &mut Vec<super::join::Joined<'a>>,
    led: &mut Vec<Led<'a>>,
) -> Result<(), ArrayError> {
    let mut s = sector;
    let mut off = 0usize;
    let stripe_bytes = (g.stripe_data_sectors() * SECTOR_BYTES) as usize;
    let tuning = &a.r5().tuning;
    let skip_copy = tuning.skip_copy.load(Ordering::Relaxed);
    // Only writes that may lead a stripe count (small ones only join).
    let sequential = buf.len() >= lead_min_bytes(g)
        && a.r5().joins.sequential(sector, sector + sectors(buf.len()));
    while off < buf.len() {
        let loc = g.locate(s);
        // A run of whole stripes goes out in one pass (md's full-stripe batching).
        let whole = (buf.len() - off) / stripe_bytes;
        if whole >= 2
            && loc.data_index == 0
            && loc.offset_sectors == 0
            && tuning.batching.load(Ordering::Relaxed)
            && a.journal().is_none()
            && a.ppl().is_none()
        {
            let mut n = whole.min(MAX_BATCH_STRIPES);
            if !skip_copy {
                // The copy of the new data is per batch: bound it.
                n = n.min((COPY_BATCH_BYTES / stripe_bytes).max(1));
            }
            let heads = take_run(a, loc.stripe, n, Get::Wait).expect("waited");
            let n = heads.len();
            let data = &buf[off..off + n * stripe_bytes];
            let done = a
                .r5()
                .run_stripe(|| write_full_stripes(a, g, loc.stripe, n, data, skip_copy))?;
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
        match join(a, g, &loc, data, stripe_bytes, sequential) {
            Some(Joining::Led(l)) => led.push(l),
            Some(Joining::Pending(j)) => joined.push(j),
            None => write_in_stripe(a, g, &loc, s, data, skip_copy)?,
        }
        off += n;
        s += sectors(n);
    }
    Ok(())
}

/// Pieces of at least this many bytes (or a chunk, if smaller) lead a pending stripe
/// ([`super::join`]); smaller ones only join: a small write reads little, and waiting for
/// joiners that random small writes never bring would only add latency.
const LEAD_MIN_BYTES: usize = 64 << 10;

/// [`LEAD_MIN_BYTES`], or a chunk if that is smaller.
fn lead_min_bytes(g: &ParityGeometry) -> usize {
    LEAD_MIN_BYTES.min(chunk_bytes(g))
}

/// What became of a piece offered to the pending stripes.
enum Joining<'a> {
    /// It leads its stripe: to gather and write ([`write_led`]).
    Led(Led<'a>),
    /// It joined another write's stripe: to wait for.
    Pending(super::join::Joined<'a>),
}

/// A pending stripe that a piece leads, with how long it waits for joiners.
struct Led<'a> {
    leader: super::join::Leader<'a>,
    wait: std::time::Duration,
    sequential: bool,
}

/// Gather a led stripe's pieces (waiting for joiners), write them, and report to the
/// joiners.
fn write_led(a: &Array, g: &ParityGeometry, mut l: Led<'_>) -> Result<(), ArrayError> {
    let mut gathered = l.leader.gather(l.wait, l.sequential);
    let r = write_gathered(a, g, l.leader.stripe(), &mut gathered);
    l.leader.finish(gathered, &r);
    r
}

/// Write the part `data` of `loc`'s stripe (less than the whole stripe) together with
/// other writes in flight that cover the rest, if it can join or lead ([`super::join`]):
/// Some when it leads or joined (both pending), None when it is to be written the
/// ordinary way. Not with a journal or PPL (they log per request), nor on a degraded
/// stripe.
fn join<'a>(
    a: &'a Array,
    g: &ParityGeometry,
    loc: &StripeLocation,
    data: &'a [u8],
    stripe_bytes: usize,
    sequential: bool,
) -> Option<Joining<'a>> {
    let wait_us = a.r5().tuning.join_wait_us.load(Ordering::Relaxed);
    if wait_us == 0 || data.len() >= stripe_bytes || a.journal().is_some() || a.ppl().is_some() {
        return None;
    }
    let joins = &a.r5().joins;
    let may_lead = data.len() >= lead_min_bytes(g) && joins.may_lead(sequential);
    if !may_lead && !joins.any_open() {
        // The common small write: nothing to join, nothing to look up.
        return None;
    }
    let map = g.stripe_map(loc.stripe);
    if !lost_roles(a, &map, loc.stripe, &[]).is_empty() {
        return None;
    }
    let cb = chunk_bytes(g);
    let start = loc.data_index * cb + (loc.offset_sectors * SECTOR_BYTES) as usize;
    // With skip_copy the pieces' bytes stay in their requests' buffers (lent).
    let lend = a.r5().tuning.skip_copy.load(Ordering::Relaxed);
    let offer = joins.offer(loc.stripe, start, data, stripe_bytes, may_lead, lend);
    let leader = match offer {
        super::join::Offer::Alone => return None,
        super::join::Offer::Joined(j) => return Some(Joining::Pending(j)),
        super::join::Offer::Lead(l) => l,
    };
    // A sequential stream's piece: the rest of its stripe is the stream's next write,
    // which comes a payload later, or its previous one, started first but not always
    // scheduled first; any other leader expects only writes already in flight.
    let wait_us = if sequential && joins.streams_join() {
        wait_us.saturating_mul(super::SEQUENTIAL_JOIN_WAITS)
    } else {
        wait_us
    };
    Some(Joining::Led(Led {
        leader,
        wait: std::time::Duration::from_micros(wait_us),
        sequential,
    }))
}

/// A leader's write: the whole stripe from the new data alone when the pieces cover it
/// (unless a member was lost meanwhile), else each run of adjacent pieces the ordinary
/// way. A chunk inside one lent piece goes out from its request's buffer; the rest from
/// the entry's buffer, so nothing is copied twice.
fn write_gathered(
    a: &Array,
    g: &ParityGeometry,
    stripe: u64,
    gathered: &mut super::join::Gathered,
) -> Result<(), ArrayError> {
    if gathered.is_full() {
        let chunks = gathered.chunks(chunk_bytes(g));
        let head = a.r5().stripe_cache.get(stripe, Get::Wait).expect("waited");
        let done = a
            .r5()
            .run_stripe(|| write_full_chunks(a, g, stripe, 1, &chunks))?;
        drop(head);
        if done {
            return Ok(());
        }
    }
    let first = g.array_sector(stripe, 0);
    for (start, bytes) in gathered.runs() {
        let s = first + sectors(start);
        write_in_stripe(a, g, &g.locate(s), s, bytes, true)?;
    }
    Ok(())
}

/// Write `data` at array sector `s` (`loc`), all inside one stripe, holding the stripe's
/// head (only the rows it writes, without a journal or PPL).
fn write_in_stripe(
    a: &Array,
    g: &ParityGeometry,
    loc: &StripeLocation,
    s: u64,
    data: &[u8],
    skip_copy: bool,
) -> Result<(), ArrayError> {
    let map = g.stripe_map(loc.stripe);
    // Without a journal or PPL (both log per stripe) a write owns only the rows it
    // writes: the rows [lo, hi) of its data chunks and of parity are all it reads
    // and writes, so writes to other rows of the stripe go on meanwhile. A PPL
    // switch quiesces the array first, so it cannot start under such a head.
    let rows = if a.journal().is_none() && a.ppl().is_none() {
        write_rows(g, loc, data.len())
    } else {
        WHOLE
    };
    let mut head = a
        .r5()
        .stripe_cache
        .get_rows(loc.stripe, rows, Get::Wait)
        .expect("waited");
    let bufs = head.bufs();
    a.r5().run_stripe(|| {
        retrying(a, &map, loc.stripe, g, |exclude| {
            write_stripe(a, g, &map, loc.stripe, s, data, exclude, bufs, skip_copy)
        })
    })
}

/// The rows (byte offsets inside the chunk) that a write of `len` bytes from `loc` covers
/// in its stripe: its own within one chunk, every row once it crosses into the next chunk
/// (as [`analyse`]'s `[lo, hi)`, which is never wider).
fn write_rows(g: &ParityGeometry, loc: &StripeLocation, len: usize) -> std::ops::Range<usize> {
    let start = (loc.offset_sectors * SECTOR_BYTES) as usize;
    let cb = chunk_bytes(g);
    if start + len <= cb {
        start..start + len
    } else {
        0..cb
    }
}

/// The member writes of a stripe write, for the byte rows `rows` (within `[lo, hi)`):
/// each piece's part in them, parity and Q over them. Returns the members written.
/// Excluded members (read errors) still take writes: writing is how a bad sector heals.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_members(
    a: &Array,
    g: &ParityGeometry,
    map: &StripeMap,
    stripe: u64,
    pieces: &[Option<Piece<'_>>],
    lo: usize,
    p: &[u8],
    q: Option<&[u8]>,
    rows: std::ops::Range<usize>,
) -> Roles {
    let mut ops = OpList::new();
    let mut written = Roles::new();
    for (i, pc) in pieces.iter().enumerate() {
        if let Some(pc) = pc {
            let (s, e) = (pc.start.max(rows.start), pc.end().min(rows.end));
            if s >= e {
                continue;
            }
            let r = map.data[i];
            if let Some(dev) = a.usable(r, stripe) {
                ops.write(
                    a,
                    dev,
                    r,
                    Sector(g.member_sector(stripe, sectors(s))),
                    &pc.data[s - pc.start..e - pc.start],
                );
                written.push(r);
            }
        }
    }
    let msec = g.member_sector(stripe, sectors(rows.start));
    let prange = rows.start - lo..rows.end - lo;
    if let Some(dev) = a.usable(map.p, stripe) {
        ops.write(a, dev, map.p, Sector(msec), &p[prange.clone()]);
        written.push(map.p);
    }
    if let (Some(qr), Some(q)) = (map.q, q) {
        if let Some(dev) = a.usable(qr, stripe) {
            ops.write(a, dev, qr, Sector(msec), &q[prange]);
            written.push(qr);
        }
    }
    ops.run(a);
    written
}

/// Most stripes written in one batch.
const MAX_BATCH_STRIPES: usize = 64;
/// Most new data copied per batch when skip_copy is off.
const COPY_BATCH_BYTES: usize = 4 << 20;

/// The heads of up to `n` stripes from `first`: the first as `first_how` says (None if
/// `Get::Try` finds it taken), the others only while they are at hand, so that a thread
/// never waits while it holds a head (no deadlock between batches, whatever the cache size).
pub(super) fn take_run(
    a: &Array,
    first: u64,
    n: usize,
    first_how: Get,
) -> Option<Vec<StripeHead<'_>>> {
    let mut heads = vec![a.r5().stripe_cache.get(first, first_how)?];
    for s in first + 1..first + n as u64 {
        match a.r5().stripe_cache.get(s, Get::Try) {
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
    let copy;
    let data = if skip_copy {
        data
    } else {
        let mut b = AlignedBuf::scratch(data.len());
        b.copy_from_slice(data);
        copy = b;
        &copy[..]
    };
    let chunks: Vec<&[u8]> = data.chunks(chunk_bytes(g)).collect();
    write_full_chunks(a, g, first, n, &chunks)
}

/// [`write_full_stripes`] from the stripes' data chunks (`n` x data disks of them, one
/// chunk each, in stripe and data index order), wherever each lies.
fn write_full_chunks(
    a: &Array,
    g: &ParityGeometry,
    first: u64,
    n: usize,
    chunks: &[&[u8]],
) -> Result<bool, ArrayError> {
    let maps: Vec<StripeMap> = (first..first + n as u64).map(|s| g.stripe_map(s)).collect();
    if maps
        .iter()
        .zip(first..)
        .any(|(m, s)| !lost_roles(a, m, s, &[]).is_empty())
    {
        return Ok(false);
    }
    let cb = chunk_bytes(g);
    let dd = g.data_disks();
    debug_assert_eq!(chunks.len(), n * dd);
    let mut parity: Vec<(AlignedBuf, Option<AlignedBuf>)> = Vec::with_capacity(n);
    for (k, map) in maps.iter().enumerate() {
        let srcs = &chunks[k * dd..(k + 1) * dd];
        let mut p = AlignedBuf::scratch(cb);
        let mut q = map.q.map(|_| AlignedBuf::scratch(cb));
        gen_parity(map, srcs, &mut p, q.as_deref_mut());
        parity.push((p, q));
    }
    let mut ops = OpList::new();
    for (k, (map, (p, q))) in maps.iter().zip(&parity).enumerate() {
        let stripe = first + k as u64;
        let msec = g.member_sector(stripe, 0);
        for (i, chunk) in chunks[k * dd..(k + 1) * dd].iter().enumerate() {
            let r = map.data[i];
            match a.usable(r, stripe) {
                Some(dev) => ops.write(a, dev, r, Sector(msec), chunk),
                None => return Ok(false),
            }
        }
        match a.usable(map.p, stripe) {
            Some(dev) => ops.write(a, dev, map.p, Sector(msec), p),
            None => return Ok(false),
        }
        if let (Some(qr), Some(q)) = (map.q, q) {
            match a.usable(qr, stripe) {
                Some(dev) => ops.write(a, dev, qr, Sector(msec), q),
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
        a.r5().run_stripe(|| zero_stripes(a, g, s, k, kind))?;
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
pub(super) struct Piece<'a> {
    pub(super) start: usize,
    pub(super) data: &'a [u8],
}

impl Piece<'_> {
    pub(super) fn end(&self) -> usize {
        self.start + self.data.len()
    }
}

/// A stripe write's pieces by logical data chunk, inline up to 16 data disks.
type Pieces<'d> = StripeList<Option<Piece<'d>>>;

/// Analyse: split the write into per-chunk pieces, the rows [lo, hi) they span, and what the
/// stripe's members can give (a [`Summary`] for the plan step).
struct Analysis<'d> {
    pieces: Pieces<'d>,
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
    let mut pieces: Pieces = (0..dd).map(|_| None).collect();
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
        let pieces: Pieces = pieces
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
    pieces: Pieces<'d>,
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
    let (lo, hi) = match a.journal() {
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
    let sub_page_journal = a.journal().is_some()
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
            rmw_level: a.r5().tuning.rmw_level.load(Ordering::Relaxed),
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
    let r = {
        let an = analyse(a, g, map, stripe, sector, data, exclude);
        let plan = stripe_plan::plan(&an.summary);
        execute(a, g, map, stripe, &an, &plan, exclude, bufs, Log::Stripe)
    };
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
    // Partly written chunks of an rcw, merged (old around new), by data index.
    let mut cols: StripeList<Option<AlignedBuf>> = StripeList::new();
    match plan {
        Plan::Unrecoverable => return Err(no_redundancy(a, "write")),
        Plan::Full => {
            let srcs: Sources = pieces
                .iter()
                .map(|p| p.as_ref().expect("full").data)
                .collect();
            gen_parity(map, &srcs, &mut p, q.as_deref_mut());
        }
        Plan::Rmw { read_data } => {
            // Read-modify-write: fold old ^ new of each touched chunk into the old parity.
            // `old` is by data index (the stripe's logical chunk, as `pieces`), not by role:
            // the role is `map.data[i]`.
            let mut old: StripeList<Option<AlignedBuf>> = (0..pieces.len()).map(|_| None).collect();
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
                        ops.read(
                            a,
                            dev,
                            r,
                            Sector(g.member_sector(stripe, sectors(pc.start))),
                            b,
                        );
                    }
                }
                let Some(pdev) = a.usable(map.p, stripe) else {
                    return Ok(Outcome::Retry(Vec::new()));
                };
                ops.read(a, pdev, map.p, Sector(msec_lo), &mut p);
                if let (Some(q), Some(qr)) = (q.as_deref_mut(), map.q) {
                    let Some(qdev) = a.usable(qr, stripe) else {
                        return Ok(Outcome::Retry(Vec::new()));
                    };
                    ops.read(a, qdev, qr, Sector(msec_lo), q);
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
            let loaded = Rows::load(a, g, map, stripe, lo, hi, exclude, want, &mut take);
            let mut rows = match loaded {
                Ok(r) => r,
                Err(failed) => return Ok(Outcome::Retry(failed)),
            };
            if *reconstruct {
                rows.reconstruct(a, g, map)?;
            } else if read_data.iter().any(|&i| !rows.has(map.data[i])) {
                // A member failed after the analysis: redo with the new set.
                return Ok(Outcome::Retry(Vec::new()));
            }
            // Parity from the sources as they are: a chunk written whole from the new data,
            // one not written from the member's row; only a partly written one is merged.
            for (i, r) in map.data.iter().enumerate() {
                cols.push(match &pieces[i] {
                    Some(pc) if an.summary.cover[i] != Cover::Full => {
                        let mut b = bufs.take(hi - lo);
                        b.copy_from_slice(rows.get(*r));
                        b[pc.start - lo..pc.end() - lo].copy_from_slice(pc.data);
                        Some(b)
                    }
                    _ => None,
                });
            }
            let srcs: Sources = (0..map.data.len())
                .map(|i| match (&cols[i], &pieces[i]) {
                    (Some(b), _) => &b[..],
                    (None, Some(pc)) => pc.data,
                    (None, None) => rows.get(map.data[i]),
                })
                .collect();
            gen_parity(map, &srcs, &mut p, q.as_deref_mut());
            drop(srcs);
            for b in rows.bufs.into_values().flatten() {
                bufs.put(b);
            }
        }
    }

    // Write-through: the stripe's new pages are durable in the journal before any member write.
    let ticket = match a.journal() {
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
                            let merged = cols[i].as_ref().expect("a partly written page");
                            (s, &merged[s - lo..e - lo])
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
    // md's PPL: the partial parity of each row range, durable on the parity member before
    // the data and parity of that range go out (raid5 only; never with a journal).
    match a.ppl().filter(|_| log != Log::Skip && map.q.is_none()) {
        Some(ppl) => {
            super::ppl::write_logged(a, g, map, stripe, pieces, lo, hi, &p, &ppl, |rows| {
                write_members(a, g, map, stripe, pieces, lo, &p, q.as_deref(), rows)
            })
        }
        None => {
            write_members(a, g, map, stripe, pieces, lo, &p, q.as_deref(), lo..hi);
        }
    }
    if let (Some(j), Some(t)) = (a.journal(), ticket) {
        j.stripe_written(t);
    }
    for b in cols
        .into_iter()
        .flatten()
        .chain(std::iter::once(p))
        .chain(q)
    {
        bufs.put(b);
    }
    // A failed write leaves the stripe consistent on the survivors; it only matters if
    // the array lost more than it tolerates.
    if lost_roles(a, map, stripe, &[]).len() > g.parity_disks() {
        return Err(no_redundancy(a, "write"));
    }
    Ok(Outcome::Done)
}
