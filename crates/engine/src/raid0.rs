//! raid0 IO: each piece of a request goes to exactly one member; no redundancy.

use crate::array::{no_redundancy, Array, Personality, SyncCtx, ZeroKind};
use crate::error::ArrayError;
use crate::member_io::OpList;
use uraid_core::geometry::Raid0;
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

fn pieces(g: &Raid0, sector: u64, len: usize) -> Vec<(uraid_core::MemberIdx, u64, usize)> {
    let mut out = Vec::new();
    let mut s = sector;
    let mut done = 0usize;
    while done < len {
        let m = g.map(s);
        let n = ((m.contiguous_sectors * SECTOR_BYTES) as usize).min(len - done);
        out.push((m.member, m.member_sector, n));
        done += n;
        s += (n as u64) / SECTOR_BYTES;
    }
    out
}

pub(crate) fn read(a: &Array, g: &Raid0, sector: u64, buf: &mut [u8]) -> Result<(), ArrayError> {
    let mut ops = OpList::new();
    let mut rest = buf;
    for (role, msec, n) in pieces(g, sector, rest.len()) {
        let dev = a.live(role).ok_or_else(|| no_redundancy(a, "read"))?;
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
        ops.read(a, dev, role, Sector(msec), head);
        rest = tail;
    }
    // raid0 has nothing to answer a read error from: the caller gets EIO, the member stays
    // (md's raid0 does not fail members either).
    if ops.run(a).is_empty() {
        Ok(())
    } else {
        Err(no_redundancy(a, "read"))
    }
}

pub(crate) fn write(a: &Array, g: &Raid0, sector: u64, buf: &[u8]) -> Result<(), ArrayError> {
    let mut ops = OpList::new();
    let mut off = 0;
    for (role, msec, n) in pieces(g, sector, buf.len()) {
        let dev = a.live(role).ok_or_else(|| no_redundancy(a, "write"))?;
        ops.write(a, dev, role, Sector(msec), &buf[off..off + n]);
        off += n;
    }
    if ops.run(a).is_empty() {
        Ok(())
    } else {
        Err(no_redundancy(a, "write"))
    }
}

/// Discard or zero array sectors [sector, sector+sectors): one member range per member
/// (a member's consecutive chunks in a zone are adjacent on it).
pub(crate) fn zero(
    a: &Array,
    g: &Raid0,
    sector: u64,
    sectors: u64,
    kind: ZeroKind,
) -> Result<(), ArrayError> {
    let mut runs: Vec<(uraid_core::MemberIdx, u64, u64)> = Vec::new(); // role, sector, sectors
    let end = sector + sectors;
    let mut s = sector;
    while s < end {
        let m = g.map(s);
        let n = m.contiguous_sectors.min(end - s);
        match runs
            .iter_mut()
            .find(|r| r.0 == m.member && r.1 + r.2 == m.member_sector)
        {
            Some(r) => r.2 += n,
            None => runs.push((m.member, m.member_sector, n)),
        }
        s += n;
    }
    for (role, msec, n) in runs {
        let dev = a
            .live(role)
            .ok_or_else(|| no_redundancy(a, "write-zeroes"))?;
        let off = a.member_byte(role, msec);
        let len = n * SECTOR_BYTES;
        if !crate::discard::member_zero(a, role, dev.as_ref(), off, len, kind, false) {
            return Err(no_redundancy(a, "write-zeroes"));
        }
    }
    Ok(())
}

/// raid0's conf (md's r0conf): its zones, no state of its own.
pub(crate) struct Raid0Conf {
    map: Raid0,
}

impl Raid0Conf {
    pub(crate) fn new(map: Raid0) -> Raid0Conf {
        Raid0Conf { map }
    }
}

impl Personality for Raid0Conf {
    fn read(&self, a: &Array, sector: Sector, buf: &mut [u8]) -> Result<(), ArrayError> {
        read(a, &self.map, sector.0, buf)
    }

    fn write(&self, a: &Array, sector: Sector, buf: &[u8]) -> Result<(), ArrayError> {
        write(a, &self.map, sector.0, buf)
    }

    fn zero(
        &self,
        a: &Array,
        sector: Sector,
        sectors: u64,
        kind: ZeroKind,
    ) -> Result<(), ArrayError> {
        zero(a, &self.map, sector.0, sectors, kind)
    }

    /// No redundancy: nothing to sync.
    fn sync_range(
        &self,
        _a: &Array,
        _start: u64,
        _max: u64,
        _ctx: &SyncCtx,
    ) -> Result<(u64, u64), ArrayError> {
        Ok((0, 0))
    }

    fn total_units(&self) -> u64 {
        0
    }

    fn unit_bytes(&self) -> u64 {
        0
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
        let m = self.map.map(sector.0);
        vec![(m.member, Sector(m.member_sector))]
    }

    fn survives(&self, missing: &[MemberIdx]) -> bool {
        missing.is_empty()
    }

    fn max_degraded(&self) -> usize {
        0
    }

    fn rebuilds(&self) -> bool {
        false
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
