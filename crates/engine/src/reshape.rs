//! A raid4/5/6 array in the middle of a reshape (md's `reshape_position` with the old and
//! the new geometry), as a personality that reads through both.
//!
//! Each request is cut at the position ([`ReshapeState::split`]); each run is read in its
//! side's geometry at that side's data offset (md's `ahead_of_reshape` and
//! `use_new_offset`), straight from the data member, or, where that member is missing or
//! its read fails, rebuilt from P and the rest of its stripe in the same geometry.
//!
//! The array is served read-only and says why ([`ReshapePers::reason`]); the restripe
//! engine (`restripe.rs`) continues the reshape on the members of an array not served.

use crate::array::{Array, Personality};
use crate::array::{SyncCtx, ZeroKind};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::io::{execute, Op};
use std::any::Any;
use uraid_core::geometry::{ParityGeometry, ReshapeState, Side};
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// The personality of an array mid-reshape (read-only for now).
pub(crate) struct ReshapePers {
    state: ReshapeState,
    /// Per role: where the new geometry's data area starts, in bytes (data_offset +
    /// new_offset of that member's superblock).
    new_data_offset_bytes: Vec<u64>,
}

impl ReshapePers {
    pub(crate) fn new(state: ReshapeState, new_data_offset_bytes: Vec<u64>) -> ReshapePers {
        ReshapePers {
            state,
            new_data_offset_bytes,
        }
    }

    /// Why the array is served read-only.
    pub(crate) fn reason(&self) -> String {
        let (o, n) = (&self.state.old, &self.state.new);
        format!(
            "a reshape is in progress (at array sector {} of {}, {} -> {} disks, chunk {} -> {} sectors, layout {} -> {}{}); uraid serves it read-only until the reshape is done: run uraid grow --continue on its members (or assemble it with Linux md / mdadm) to finish it",
            self.state.position_sectors,
            self.state.new_array_sectors(),
            o.raid_disks,
            n.raid_disks,
            o.chunk_sectors,
            n.chunk_sectors,
            o.algorithm,
            n.algorithm,
            if self.state.backwards { ", backwards" } else { "" }
        )
    }

    /// The reshape as the superblocks record it.
    pub(crate) fn state(&self) -> &ReshapeState {
        &self.state
    }

    /// Read array sectors from `sector` through the old geometry (the restripe's source).
    pub(crate) fn read_old(
        &self,
        a: &Array,
        sector: u64,
        buf: &mut [u8],
    ) -> Result<(), ArrayError> {
        self.read_side(a, Side::Old, sector, buf)
    }

    /// The array size while the reshape runs.
    pub(crate) fn array_sectors(&self) -> u64 {
        self.state.array_sectors()
    }

    fn refuse(&self, what: &str) -> ArrayError {
        ArrayError::ReadOnly(format!("{what} refused: {}", self.reason()))
    }

    /// Byte offset on role `role`'s device of member sector `ms` of `side`'s data area.
    pub(crate) fn member_byte(&self, a: &Array, side: Side, role: MemberIdx, ms: u64) -> u64 {
        let base = match side {
            Side::Old => a.slot(role).data_offset_bytes(),
            Side::New => self.new_data_offset_bytes[role.0],
        };
        base + ms * SECTOR_BYTES
    }

    /// Read one member range; false when the member is missing or the read failed.
    fn read_member(&self, a: &Array, side: Side, role: MemberIdx, ms: u64, out: &mut [u8]) -> bool {
        let Some(dev) = a.live(role) else {
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

    fn read_side(
        &self,
        a: &Array,
        side: Side,
        sector: u64,
        buf: &mut [u8],
    ) -> Result<(), ArrayError> {
        let g = self.state.geometry(side);
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
                self.rebuild(a, g, side, loc.stripe, role, ms, head)?;
            }
            rest = tail;
            s += n as u64 / SECTOR_BYTES;
        }
        Ok(())
    }
}

impl Personality for ReshapePers {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        let mut off = 0usize;
        for (start, n, side) in self.state.split(sector.0, buf.len() as u64 / SECTOR_BYTES) {
            let len = (n * SECTOR_BYTES) as usize;
            self.read_side(a, side, start, &mut buf[off..off + len])?;
            off += len;
        }
        Ok(())
    }

    fn write(&self, _a: &Array, _sector: Sector, _buf: &[u8]) -> Result<(), ArrayError> {
        Err(self.refuse("write"))
    }

    fn zero(
        &self,
        _a: &Array,
        _sector: Sector,
        _sectors: u64,
        _kind: ZeroKind,
    ) -> Result<(), ArrayError> {
        Err(self.refuse("discard"))
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
        self.state.new.stripe_data_sectors() * SECTOR_BYTES
    }

    fn recovery_offset_sectors(&self, _cursor: u64) -> u64 {
        0
    }

    fn cursor_for_offset(&self, _offset_sectors: u64) -> u64 {
        0
    }

    fn member_units(&self, _start: u64, _end: u64) -> Option<(u64, u64)> {
        None
    }

    fn locate(&self, sector: Sector) -> Vec<(MemberIdx, Sector)> {
        let side = self.state.side_of(sector.0);
        let g = self.state.geometry(side);
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
        self.state
            .old
            .parity_disks()
            .min(self.state.new.parity_disks())
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
