//! A raid4/5/6 array in the middle of a reshape (md's `reshape_position` with the old and
//! the new geometry), as a personality that reads through both.
//!
//! Each request is cut at the position ([`ReshapeState::split`]); each run is read in its
//! side's geometry at that side's data offset (md's `ahead_of_reshape` and
//! `use_new_offset`), straight from the data member, or, where that member is missing or
//! its read fails, rebuilt from P and the rest of its stripe in the same geometry.
//!
//! Writes go the same way, each stripe written whole-rows with its parity in its side's
//! geometry (reconstruct-write, under a per-stripe lock). A write to data the reshape has
//! copied but whose position no superblock records yet (between the recorded and the
//! in-memory position) goes to both geometries: after a power cut the reshape goes on from
//! the recorded position and copies it again from the old one (md makes such writes wait
//! for the superblock update instead).
//!
//! The position lives under a read-write lock that is also the window lock: a request holds
//! it shared while it runs; the restripe of a served array (`restripe::run_served`) holds it
//! exclusively while it moves one window, so no request sees a window half moved.
//!
//! A member the reshape rebuilds ([`Rebuilt`]: md's device put into an empty role by
//! `raid5_start_reshape`, with a `recovery_offset`) is missing in the old geometry and
//! valid in the new one below its recovery cursor (member sectors of the new geometry, md's
//! `recovery_offset`). Every new-geometry write reaches it (the windows of the reshape, and
//! requests below the in-memory position, which the reshape has written whole), so when a
//! checkpoint moves its cursor to the recorded position no block below it is stale.

use crate::array::{Array, Personality};
use crate::array::{SyncCtx, ZeroKind};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::io::{execute, Op};
use std::any::Any;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use uraid_core::geometry::{ParityGeometry, ReshapeState, Side};
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// Where a reshape stands while the array runs.
#[derive(Clone, Debug)]
pub(crate) struct Progress {
    /// Both geometries and the in-memory position (data before it is in the new one).
    pub st: ReshapeState,
    /// The position the superblocks record (md's reshape_safe).
    pub safe: u64,
    /// The superblocks say the new shape (the reshape is over).
    pub finished: bool,
}

/// A member the reshape rebuilds (md's recovering device mid-reshape).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rebuilt {
    pub role: MemberIdx,
    /// Its recovery_offset had reached the recorded position when the array was
    /// assembled: it holds every new stripe below it, so each checkpoint moves its
    /// cursor with the position, and the finish makes it in sync. Otherwise (it missed
    /// rows) its cursor stays, and it recovers from there after the reshape.
    pub follows: bool,
    /// The slot's generation when the array was assembled: another device that takes
    /// the role later is not this member.
    pub generation: u64,
}

/// Stripe locks (hashed by side and stripe): writes and degraded reads of one stripe take
/// turns, so parity always matches the data on the members.
const STRIPE_LOCKS: usize = 64;

/// The personality of an array mid-reshape.
pub(crate) struct ReshapePers {
    live: RwLock<Progress>,
    /// Per role: where the new geometry's data area starts, in bytes (data_offset +
    /// new_offset of that member's superblock).
    new_data_offset_bytes: Vec<u64>,
    locks: Vec<Mutex<()>>,
    /// Members both geometries can lose (fixed; read without the lock, as member failure
    /// handling asks it while a request holds the lock).
    max_degraded: usize,
    /// A new stripe's data bytes.
    unit_bytes: u64,
    /// The old and the new geometry (fixed for the whole reshape), for the bitmap.
    old: ParityGeometry,
    new: ParityGeometry,
    /// The members the reshape rebuilds (fixed at assembly).
    rebuilt: Vec<Rebuilt>,
}

/// The bitmap positions (member sectors from the side's own data offset, as md's
/// `sh->sector`) of the whole chunk rows that array sectors [sector, sector+sectors)
/// touch in geometry `g`.
fn chunk_rows(g: &ParityGeometry, sector: u64, sectors: u64) -> (u64, u64) {
    let sds = g.stripe_data_sectors();
    let (a, b) = (sector / sds, (sector + sectors.max(1) - 1) / sds);
    (a * g.chunk_sectors, (b - a + 1) * g.chunk_sectors)
}

impl ReshapePers {
    pub(crate) fn new(
        state: ReshapeState,
        new_data_offset_bytes: Vec<u64>,
        rebuilt: Vec<Rebuilt>,
    ) -> ReshapePers {
        let max_degraded = state.old.parity_disks().min(state.new.parity_disks());
        let unit_bytes = state.new.stripe_data_sectors() * SECTOR_BYTES;
        ReshapePers {
            max_degraded,
            unit_bytes,
            old: state.old.clone(),
            new: state.new.clone(),
            live: RwLock::new(Progress {
                safe: state.position_sectors,
                finished: false,
                st: state,
            }),
            new_data_offset_bytes,
            locks: (0..STRIPE_LOCKS).map(|_| Mutex::new(())).collect(),
            rebuilt,
        }
    }

    /// The rebuilt member of `role`, while the same device is recovering it.
    fn rebuilt_in(&self, a: &Array, role: MemberIdx) -> Option<&Rebuilt> {
        let b = self.rebuilt.iter().find(|b| b.role == role)?;
        let slot = a.slot(role);
        (slot.generation() == b.generation && slot.state() == crate::slot::SlotState::Recovering)
            .then_some(b)
    }

    /// The device to read member sectors `[ms, ms + sectors)` of `side` from: an in-sync
    /// member, or in the new geometry a rebuilt one below its recovery cursor.
    fn reader(
        &self,
        a: &Array,
        side: Side,
        role: MemberIdx,
        ms: u64,
        sectors: u64,
    ) -> Option<Arc<dyn crate::member::Member>> {
        if let Some(d) = a.live(role) {
            return Some(d);
        }
        if side == Side::New && self.rebuilt_in(a, role).is_some() {
            let slot = a.slot(role);
            if ms + sectors <= slot.recovery_cursor() {
                return slot.device();
            }
        }
        None
    }

    /// The device a write of `side` goes to: an in-sync member, or in the new geometry a
    /// rebuilt one (everywhere: the new geometry holds only stripes below the in-memory
    /// position, which the reshape wrote whole to it).
    pub(crate) fn writer(
        &self,
        a: &Array,
        side: Side,
        role: MemberIdx,
    ) -> Option<Arc<dyn crate::member::Member>> {
        if let Some(d) = a.live(role) {
            return Some(d);
        }
        if side == Side::New && self.rebuilt_in(a, role).is_some() {
            return a.slot(role).device();
        }
        None
    }

    /// Every role's device for the new geometry's writes (see [`ReshapePers::writer`]).
    pub(crate) fn new_writers(&self, a: &Array) -> Vec<Option<Arc<dyn crate::member::Member>>> {
        (0..self.new.raid_disks)
            .map(|r| self.writer(a, Side::New, MemberIdx(r)))
            .collect()
    }

    /// The rebuilt members that follow the reshape, with their devices (to flush before a
    /// checkpoint, and to move their cursors with it).
    pub(crate) fn following(&self, a: &Array) -> Vec<(MemberIdx, Arc<dyn crate::member::Member>)> {
        self.rebuilt
            .iter()
            .filter(|b| b.follows)
            .filter_map(|b| {
                self.rebuilt_in(a, b.role)?;
                Some((b.role, a.slot(b.role).device()?))
            })
            .collect()
    }

    /// A checkpoint at `at` is about to be recorded (the members flushed): the cursors of
    /// the rebuilt members that follow the reshape move to it, as md moves their
    /// recovery_offset in `reshape_request`.
    pub(crate) fn advance_rebuilt(&self, a: &Array, st: &ReshapeState, at: u64) {
        let Some(to) = st.recovery_offset_at(at) else {
            return;
        };
        for (role, _) in self.following(a) {
            let slot = a.slot(role);
            if slot.recovery_cursor() < to {
                slot.set_recovery_cursor(to);
            }
        }
    }

    /// The reshape ended: a rebuilt member whose cursor reached the end of the new shape
    /// is in sync (md's end_reshape); one that missed rows keeps recovering.
    pub(crate) fn rebuilt_in_sync(&self, a: &Array, st: &ReshapeState) {
        for b in &self.rebuilt {
            if self.rebuilt_in(a, b.role).is_none() {
                continue;
            }
            let slot = a.slot(b.role);
            if slot.recovery_cursor() >= st.dev_sectors() {
                slot.transition(
                    crate::slot::SlotState::Recovering,
                    crate::slot::SlotState::InSync,
                );
            }
        }
    }

    /// The position, shared (requests hold it while they run).
    pub(crate) fn progress(&self) -> RwLockReadGuard<'_, Progress> {
        self.live.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The position, exclusive: the window lock of a served restripe.
    pub(crate) fn progress_mut(&self) -> RwLockWriteGuard<'_, Progress> {
        self.live.write().unwrap_or_else(|e| e.into_inner())
    }

    fn stripe_lock(&self, side: Side, stripe: u64) -> std::sync::MutexGuard<'_, ()> {
        let k = (stripe.wrapping_mul(2) + u64::from(side == Side::New)) as usize % STRIPE_LOCKS;
        self.locks[k].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the array is doing, for messages.
    pub(crate) fn reason(&self) -> String {
        let p = self.progress();
        let state = &p.st;
        let (o, n) = (&state.old, &state.new);
        format!(
            "a reshape is in progress (at array sector {} of {}, {} -> {} disks, chunk {} -> {} sectors, layout {} -> {}{})",
            state.position_sectors,
            state.new_array_sectors(),
            o.raid_disks,
            n.raid_disks,
            o.chunk_sectors,
            n.chunk_sectors,
            o.algorithm,
            n.algorithm,
            if state.backwards { ", backwards" } else { "" }
        )
    }

    /// The reshape as it stands in memory (its position may be ahead of the superblocks').
    pub(crate) fn state(&self) -> ReshapeState {
        self.progress().st.clone()
    }

    /// Read array sectors from `sector` through the old geometry (the restripe's source).
    pub(crate) fn read_old(
        &self,
        a: &Array,
        st: &ReshapeState,
        sector: u64,
        buf: &mut [u8],
    ) -> Result<(), ArrayError> {
        self.read_side(a, st, Side::Old, sector, buf, false)
    }

    /// The array size while the reshape runs.
    pub(crate) fn array_sectors(&self) -> u64 {
        self.progress().st.array_sectors()
    }

    fn refuse(&self, what: &str) -> ArrayError {
        ArrayError::Refused(format!(
            "{what} refused: {}; it can run once the reshape is done",
            self.reason()
        ))
    }

    /// Byte offset on role `role`'s device of member sector `ms` of `side`'s data area.
    pub(crate) fn member_byte(&self, a: &Array, side: Side, role: MemberIdx, ms: u64) -> u64 {
        let base = match side {
            Side::Old => a.slot(role).data_offset_bytes(),
            Side::New => self.new_data_offset_bytes[role.0],
        };
        base + ms * SECTOR_BYTES
    }

    /// Read one member range; false when the member is missing (or, rebuilt, not valid
    /// there) or the read failed.
    fn read_member(&self, a: &Array, side: Side, role: MemberIdx, ms: u64, out: &mut [u8]) -> bool {
        let sectors = out.len() as u64 / SECTOR_BYTES;
        let Some(dev) = self.reader(a, side, role, ms, sectors) else {
            return false;
        };
        let mut ops = [Op::read(
            dev.as_ref(),
            self.member_byte(a, side, role, ms),
            out,
        )];
        match execute(&mut ops).pop() {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                tracing::warn!(
                    "member {role}: read error mid-reshape at member sector {ms}: {e}; rebuilding from parity"
                );
                false
            }
            None => false,
        }
    }

    /// Rebuild the data of `role` at member sector `ms` from the rest of its stripe in the
    /// same geometry: from P and the other data chunks (raid4/5, or raid6 with one chunk
    /// lost), or from P and Q with two lost (raid6, md's two-failure recovery).
    #[allow(clippy::too_many_arguments)]
    fn rebuild(
        &self,
        a: &Array,
        g: &ParityGeometry,
        side: Side,
        stripe: u64,
        role: MemberIdx,
        ms: u64,
        out: &mut [u8],
    ) -> Result<(), ArrayError> {
        let map = g.stripe_map(stripe);
        let all: Vec<MemberIdx> = map
            .data
            .iter()
            .copied()
            .chain(std::iter::once(map.p))
            .chain(map.q)
            .collect();
        let mut bufs: Vec<Option<AlignedBuf>> = Vec::with_capacity(all.len());
        let mut lost = vec![role];
        for &r in &all {
            if r == role {
                bufs.push(None);
                continue;
            }
            let mut b = AlignedBuf::new(out.len());
            if self.read_member(a, side, r, ms, &mut b) {
                bufs.push(Some(b));
            } else {
                lost.push(r);
                bufs.push(None);
            }
        }
        if lost.len() > g.parity_disks() {
            return Err(ArrayError::Failed(format!(
                "cannot read array data at member sector {ms} of member {role}: members {} \
                 of its stripe are unreadable, more than its parity covers",
                lost.iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if lost.len() == 1 && !lost.contains(&map.p) {
            // One chunk: the XOR of the others with P (Q not needed).
            let srcs: Vec<&[u8]> = all
                .iter()
                .zip(&bufs)
                .filter(|(r, _)| Some(**r) != map.q)
                .filter_map(|(_, b)| b.as_deref())
                .collect();
            uraid_parity::xor_gen(out, &srcs);
            return Ok(());
        }
        // raid6: blocks by syndrome slot (zero blocks in the DDF layouts' holes), then P, Q.
        let width = map.syndrome_width();
        let mut blocks_owned: Vec<AlignedBuf> = Vec::with_capacity(width + 2);
        let mut lost_idx = Vec::new();
        let mut role_at = 0;
        let take = |r: MemberIdx, bufs: &mut Vec<Option<AlignedBuf>>| {
            let i = all.iter().position(|&x| x == r).expect("role in stripe");
            bufs[i].take().unwrap_or_else(|| AlignedBuf::new(out.len()))
        };
        let mut slot_role: Vec<Option<MemberIdx>> = vec![None; width];
        for (k, &i) in map.syndrome_order.iter().enumerate() {
            slot_role[map.syndrome_slots[k]] = Some(map.data[i]);
        }
        for (k, r) in slot_role.iter().enumerate() {
            match r {
                Some(r) => {
                    if lost.contains(r) {
                        lost_idx.push(k);
                    }
                    if *r == role {
                        role_at = k;
                    }
                    blocks_owned.push(take(*r, &mut bufs));
                }
                None => blocks_owned.push(AlignedBuf::new(out.len())),
            }
        }
        let q = map.q.expect("two lost chunks only in raid6");
        for (k, r) in [(width, map.p), (width + 1, q)] {
            if lost.contains(&r) {
                lost_idx.push(k);
            }
            blocks_owned.push(take(r, &mut bufs));
        }
        let mut blocks: Vec<&mut [u8]> = blocks_owned.iter_mut().map(|b| &mut b[..]).collect();
        uraid_parity::recover(&mut blocks, &lost_idx);
        out.copy_from_slice(&blocks_owned[role_at]);
        Ok(())
    }

    /// Read array sectors of one side; a piece on a missing or failing member is rebuilt
    /// from its stripe, under that stripe's lock when `lock` (a caller writing the stripe
    /// holds it already).
    fn read_side(
        &self,
        a: &Array,
        st: &ReshapeState,
        side: Side,
        sector: u64,
        buf: &mut [u8],
        lock: bool,
    ) -> Result<(), ArrayError> {
        let g = st.geometry(side);
        let chunk_bytes = (g.chunk_sectors * SECTOR_BYTES) as usize;
        let mut s = sector;
        let mut rest = buf;
        while !rest.is_empty() {
            let loc = g.locate(s);
            let in_chunk = (loc.offset_sectors * SECTOR_BYTES) as usize;
            let n = (chunk_bytes - in_chunk).min(rest.len());
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
            let role = g.stripe_map(loc.stripe).data[loc.data_index];
            let ms = g.member_sector(loc.stripe, loc.offset_sectors);
            if !self.read_member(a, side, role, ms, head) {
                a.stats
                    .degraded_reads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _held = lock.then(|| self.stripe_lock(side, loc.stripe));
                self.rebuild(a, g, side, loc.stripe, role, ms, head)?;
            }
            rest = tail;
            s += n as u64 / SECTOR_BYTES;
        }
        Ok(())
    }

    /// Write array sectors of one side, stripe by stripe: the touched rows of every data
    /// chunk (read where the request does not cover them), then their parity, to every
    /// member present. A member whose write fails is failed; the write goes on while the
    /// array keeps its data.
    fn write_side(
        &self,
        a: &Array,
        st: &ReshapeState,
        side: Side,
        sector: u64,
        data: &[u8],
    ) -> Result<(), ArrayError> {
        let g = st.geometry(side);
        let sds = g.stripe_data_sectors();
        let chunk = g.chunk_sectors;
        let end = sector + data.len() as u64 / SECTOR_BYTES;
        let mut s = sector;
        while s < end {
            let stripe = s / sds;
            let base = stripe * sds;
            let e = end.min(base + sds);
            // The rows (sectors inside the chunk) the request touches in this stripe.
            let (c0, c1) = ((s - base) / chunk, (e - 1 - base) / chunk);
            let (r0, r1) = if c0 == c1 {
                ((s - base) % chunk, (e - 1 - base) % chunk + 1)
            } else {
                (0, chunk)
            };
            let rows = ((r1 - r0) * SECTOR_BYTES) as usize;
            let map = g.stripe_map(stripe);
            let _held = self.stripe_lock(side, stripe);
            let mut chunks: Vec<AlignedBuf> = Vec::with_capacity(map.data.len());
            for i in 0..map.data.len() as u64 {
                let (lo, hi) = (base + i * chunk + r0, base + i * chunk + r1);
                let mut b = AlignedBuf::new(rows);
                // The part the request gives; the rest is read.
                let (wlo, whi) = (lo.max(s), hi.min(e));
                if wlo >= whi || wlo > lo || whi < hi {
                    self.read_side(a, st, side, lo, &mut b, false)?;
                }
                if wlo < whi {
                    let from = ((wlo - sector) * SECTOR_BYTES) as usize;
                    let to = ((wlo - lo) * SECTOR_BYTES) as usize;
                    let n = ((whi - wlo) * SECTOR_BYTES) as usize;
                    b[to..to + n].copy_from_slice(&data[from..from + n]);
                }
                chunks.push(b);
            }
            let mut p = AlignedBuf::new(rows);
            let mut q = map.q.map(|_| AlignedBuf::new(rows));
            {
                let srcs: Vec<&[u8]> = chunks.iter().map(|b| &b[..]).collect();
                crate::raid5::gen_parity(&map, &srcs, &mut p, q.as_deref_mut());
            }
            let ms = g.member_sector(stripe, r0);
            let mut targets: Vec<(MemberIdx, &[u8])> = Vec::new();
            for (i, &role) in map.data.iter().enumerate() {
                let (lo, hi) = (base + i as u64 * chunk + r0, base + i as u64 * chunk + r1);
                if lo.max(s) < hi.min(e) {
                    targets.push((role, &chunks[i]));
                }
            }
            targets.push((map.p, &p));
            if let (Some(qr), Some(qb)) = (map.q, q.as_ref()) {
                targets.push((qr, qb));
            }
            let devs: Vec<(MemberIdx, Arc<dyn crate::member::Member>, &[u8])> = targets
                .into_iter()
                .filter_map(|(r, b)| self.writer(a, side, r).map(|d| (r, d, b)))
                .collect();
            let mut ops: Vec<Op> = devs
                .iter()
                .map(|(r, d, b)| Op::write(d.as_ref(), self.member_byte(a, side, *r, ms), b))
                .collect();
            let results = execute(&mut ops);
            drop(ops);
            for ((r, _, _), res) in devs.iter().zip(results) {
                if let Err(e) = res {
                    tracing::warn!(
                        "member {r}: write error mid-reshape at member sector {ms}: {e}"
                    );
                    a.member_error(*r, &e);
                }
            }
            if !self.survives(&a.missing_roles()) {
                return Err(ArrayError::Failed(format!(
                    "write at array sector {s} mid-reshape failed: too many members lost"
                )));
            }
            s = e;
        }
        Ok(())
    }
}

/// A write of `buf` to an array mid-reshape (raid4/5/6 here, raid10 in `reshape10.rs`),
/// cut into `pieces` at the position (`split` of either plan): each piece written in its
/// side's geometry by `write_side`, and the part of a New-side piece that the superblocks
/// still place in the old geometry (between the recorded position `safe` and the in-memory
/// `position`) written there too, first (see the module doc).
pub(crate) fn write_pieces(
    pieces: Vec<(u64, u64, Side)>,
    (backwards, position, safe): (bool, u64, u64),
    buf: &[u8],
    mut write_side: impl FnMut(Side, u64, &[u8]) -> Result<(), ArrayError>,
) -> Result<(), ArrayError> {
    let (lo, hi) = if backwards {
        (position, safe)
    } else {
        (safe, position)
    };
    let mut off = 0usize;
    for (start, n, side) in pieces {
        let len = (n * SECTOR_BYTES) as usize;
        let piece = &buf[off..off + len];
        let (a, b) = (start.max(lo), (start + n).min(hi));
        if side == Side::New && a < b {
            let from = ((a - start) * SECTOR_BYTES) as usize;
            let to = ((b - start) * SECTOR_BYTES) as usize;
            write_side(Side::Old, a, &piece[from..to])?;
        }
        write_side(side, start, piece)?;
        off += len;
    }
    Ok(())
}

/// A read of `buf` from an array mid-reshape, cut into `pieces` at the position: each
/// piece read in its side's geometry by `read_side`.
pub(crate) fn read_pieces(
    pieces: Vec<(u64, u64, Side)>,
    buf: &mut [u8],
    mut read_side: impl FnMut(Side, u64, &mut [u8]) -> Result<(), ArrayError>,
) -> Result<(), ArrayError> {
    let mut off = 0usize;
    for (start, n, side) in pieces {
        let len = (n * SECTOR_BYTES) as usize;
        read_side(side, start, &mut buf[off..off + len])?;
        off += len;
    }
    Ok(())
}

/// Discard and write-zeroes mid-reshape: zeros written through `write` (the reshaping
/// personality's own write), 1 MiB at a time. A discard may leave anything, and zeros keep
/// parity and copies right in both geometries without a path of their own.
pub(crate) fn zero_by_writing(
    sector: Sector,
    sectors: u64,
    mut write: impl FnMut(Sector, &[u8]) -> Result<(), ArrayError>,
) -> Result<(), ArrayError> {
    const PIECE: u64 = 2048;
    let zeros = AlignedBuf::new((PIECE.min(sectors) * SECTOR_BYTES) as usize);
    let mut s = sector.0;
    let end = sector.0 + sectors;
    while s < end {
        let n = PIECE.min(end - s);
        write(Sector(s), &zeros[..(n * SECTOR_BYTES) as usize])?;
        s += n;
    }
    Ok(())
}

impl Personality for ReshapePers {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        let p = self.progress();
        read_pieces(
            p.st.split(sector.0, buf.len() as u64 / SECTOR_BYTES),
            buf,
            |side, start, piece| self.read_side(a, &p.st, side, start, piece, true),
        )
    }

    fn write(&self, a: &Array, sector: Sector, buf: &[u8]) -> Result<(), ArrayError> {
        let p = self.progress();
        write_pieces(
            p.st.split(sector.0, buf.len() as u64 / SECTOR_BYTES),
            (p.st.backwards, p.st.position_sectors, p.safe),
            buf,
            |side, start, data| self.write_side(a, &p.st, side, start, data),
        )
    }

    /// Discard and write-zeroes write zeros ([`zero_by_writing`]).
    fn zero(
        &self,
        a: &Array,
        sector: Sector,
        sectors: u64,
        _kind: ZeroKind,
    ) -> Result<(), ArrayError> {
        zero_by_writing(sector, sectors, |s, zeros| self.write(a, s, zeros))
    }

    fn sync_range(
        &self,
        _a: &Array,
        _start: u64,
        _max: u64,
        _ctx: &SyncCtx,
    ) -> Result<(u64, u64), ArrayError> {
        Err(self.refuse("resync"))
    }

    fn total_units(&self) -> u64 {
        0
    }

    fn unit_bytes(&self) -> u64 {
        self.unit_bytes
    }

    /// A recovering member's cursor mid-reshape is md's recovery_offset itself: member
    /// sectors of the new geometry (see [`Rebuilt`]).
    fn recovery_offset_sectors(&self, cursor: u64) -> u64 {
        cursor
    }

    fn cursor_for_offset(&self, offset_sectors: u64) -> u64 {
        offset_sectors
    }

    fn member_units(&self, _start: u64, _end: u64) -> Option<(u64, u64)> {
        None
    }

    /// The write's rows in the new geometry; [`Self::bitmap_range_previous`] adds the old
    /// one's. Both are counted whatever side of the position the write is on, so a window
    /// moving under it between the bits and the data leaves nothing uncounted. After a
    /// crash the bits stay (a resync is owed) until the reshape has ended and the resync of
    /// the new shape has passed them; rows of the old geometry are rewritten with fresh
    /// parity by the reshape itself.
    fn bitmap_range(&self, sector: Sector, sectors: u64) -> (u64, u64) {
        chunk_rows(&self.new, sector.0, sectors)
    }

    fn bitmap_range_previous(&self, sector: Sector, sectors: u64) -> Option<(u64, u64)> {
        Some(chunk_rows(&self.old, sector.0, sectors))
    }

    fn locate(&self, sector: Sector) -> Vec<(MemberIdx, Sector)> {
        let p = self.progress();
        let side = p.st.side_of(sector.0);
        let g = p.st.geometry(side);
        let loc = g.locate(sector.0);
        vec![(
            g.stripe_map(loc.stripe).data[loc.data_index],
            Sector(g.member_sector(loc.stripe, loc.offset_sectors)),
        )]
    }

    /// As many members missing as the parity covers in both geometries (raid6: two).
    fn survives(&self, missing: &[MemberIdx]) -> bool {
        missing.len() <= self.max_degraded()
    }

    fn max_degraded(&self) -> usize {
        self.max_degraded
    }

    fn rebuilds(&self) -> bool {
        false
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
