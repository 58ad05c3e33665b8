//! md's partial parity log for raid5 (raid5-ppl): the write hole closed without a journal
//! device. Before a stripe write reaches the members, its partial parity (the XOR of the
//! data chunks it does not modify, over the rows it writes) goes to the PPL area of the
//! stripe's parity member, durable (written, then flushed). After an unclean stop each
//! member's newest PPL is replayed before the array serves: every logged rectangle gets
//! parity = XOR of its data as it is now on the members ^ partial parity, which matches
//! whatever of the interrupted write reached the members. The codec is
//! [`uraid_core::ppl`]; this file does the IO.
//!
//! As in md: one log per member, its writes one at a time (a PPL is finished, its data
//! and parity written and flushed, before the next PPL of that member replaces it); the
//! generation counts PPLs since the array started; at start every area is zeroed and gets
//! an empty header; a PPL whose header checksum or signature is wrong is a mismatch, and
//! an entry whose partial parity fails its checksum is skipped (md skips it too); after
//! any mismatch the array is resynced, as md leaves it dirty.

use super::write::Piece;
use crate::array::Array;
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::member::Member;
use crate::member_io::{member_byte, MemberHost};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use uraid_core::geometry::{ParityGeometry, StripeMap};
use uraid_core::ppl::{self as fmt, PplArea, PplHeader};
use uraid_core::{MemberIdx, Sector, SECTOR_BYTES};

/// One member's PPL area.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Area {
    /// Byte offset of the area on the member.
    pub start_bytes: u64,
    /// How it is used.
    pub area: PplArea,
}

/// One member's log: its area and where its next PPL goes (md's next_io_sector).
struct Log {
    area: Option<Area>,
    next_at: u64,
}

/// The PPL of a raid5 (md's ppl_conf).
pub(crate) struct Ppl {
    signature: u32,
    logs: Vec<Mutex<Log>>,
    /// PPLs written since the array started (md's ppl_conf->seq).
    generation: AtomicU64,
}

/// What assembly's recovery did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PplRecovery {
    /// Entries whose parity was rewritten.
    pub(crate) recovered_entries: u64,
    /// Headers that could not be used and entries skipped (bad checksum, bad geometry,
    /// a missing data member): md's mismatch_count. Non-zero leaves a resync owed.
    pub(crate) mismatches: u64,
}

/// A member's PPL area from its superblock (`ppl.offset` sectors from the superblock,
/// `ppl.size` sectors); None without a usable one.
pub(crate) fn area_of(sb: &uraid_core::superblock::Superblock) -> Option<Area> {
    let (offset, size) = sb.ppl();
    let at = sb.super_offset.checked_add_signed(i64::from(offset))?;
    Some(Area {
        start_bytes: at * SECTOR_BYTES,
        area: PplArea::new(u64::from(size))?,
    })
}

impl Ppl {
    /// The PPL of an array with `uuid` and these areas (by role).
    pub(crate) fn new(uuid: &[u8; 16], areas: Vec<Option<Area>>) -> Ppl {
        Ppl {
            signature: fmt::signature(uuid),
            logs: areas
                .into_iter()
                .map(|area| Mutex::new(Log { area, next_at: 0 }))
                .collect(),
            generation: AtomicU64::new(0),
        }
    }

    fn log(&self, role: MemberIdx) -> MutexGuard<'_, Log> {
        self.logs[role.0].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Zero `role`'s area and write an empty header (md's ppl_write_empty_header).
    fn write_empty(&self, dev: &dyn Member, a: Area) -> std::io::Result<()> {
        let mut buf = AlignedBuf::new((a.area.size_sectors * SECTOR_BYTES) as usize);
        buf[..fmt::PPL_HEADER_SIZE].copy_from_slice(&PplHeader::empty(self.signature).encode());
        dev.write_at(&buf, a.start_bytes)?;
        dev.flush()
    }

    /// Start: replay the newest PPL of every present member if the array was not stopped
    /// cleanly (`unclean`), then give every area an empty header. Returns what recovery did.
    pub(crate) fn start(
        &self,
        a: &Array,
        g: &ParityGeometry,
        unclean: bool,
    ) -> Result<PplRecovery, ArrayError> {
        let mut rep = PplRecovery::default();
        for (r, log) in self.logs.iter().enumerate() {
            let role = MemberIdx(r);
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            let (Some(area), Some(dev)) = (log.area, a.live(role)) else {
                continue;
            };
            if unclean {
                self.recover_member(a, g, role, dev.as_ref(), area, &mut rep)?;
            }
            self.write_empty(dev.as_ref(), area).map_err(|e| {
                ArrayError::Assemble(format!("{}: writing its PPL: {e}", dev.name()))
            })?;
            log.next_at = 0;
        }
        Ok(rep)
    }

    fn recover_member(
        &self,
        a: &Array,
        g: &ParityGeometry,
        role: MemberIdx,
        dev: &dyn Member,
        area: Area,
        rep: &mut PplRecovery,
    ) -> Result<(), ArrayError> {
        let bytes = (area.area.size_sectors * SECTOR_BYTES) as usize;
        let mut buf = AlignedBuf::new(bytes);
        dev.read_at(&mut buf, area.start_bytes)
            .map_err(|e| ArrayError::Assemble(format!("{}: reading its PPL: {e}", dev.name())))?;
        let read = |at: u64| {
            let o = (at * SECTOR_BYTES) as usize;
            buf.get(o..o + fmt::PPL_HEADER_SIZE).map(|b| b.to_vec())
        };
        let latest = match fmt::find_latest(area.area.size_sectors, self.signature, read) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(
                    "{}: no usable PPL ({e}); the array will be resynced",
                    dev.name()
                );
                rep.mismatches += 1;
                return Ok(());
            }
        };
        let mut pp_at = ((latest.at_sectors + 8) * SECTOR_BYTES) as usize;
        for (i, e) in latest.header.entries.iter().enumerate() {
            let pp_len = e.pp_size as usize;
            let Some(pp) = buf.get(pp_at..pp_at + pp_len) else {
                tracing::warn!(
                    "{}: PPL entry {i} has {pp_len} bytes of partial parity past the end of \
                     its area; skipped",
                    dev.name()
                );
                rep.mismatches += 1;
                break;
            };
            pp_at += pp_len;
            if fmt::pp_checksum(pp) != e.checksum {
                tracing::warn!(
                    "{}: PPL entry {i} (array sector {}): partial parity checksum does not \
                     match; skipped, as md skips it",
                    dev.name(),
                    e.data_sector
                );
                rep.mismatches += 1;
                continue;
            }
            match recover_entry(a, g, role, i, e, pp) {
                Ok(true) => rep.recovered_entries += 1,
                Ok(false) => rep.mismatches += 1,
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Log one stripe write before its member writes: `rects` of stripe `stripe` (whose
    /// parity member is `parity`) with their partial parity. The caller holds the guard
    /// from [`Ppl::lock`] until its member writes are done and flushed. Returns false if the
    /// parity member has no log (missing, failed, no area): the write goes unlogged, as in
    /// md.
    pub(crate) fn lock(&self, parity: MemberIdx) -> Option<PplGuard<'_>> {
        let g = self.log(parity);
        g.area?;
        Some(PplGuard {
            ppl: self,
            log: g,
            role: parity,
        })
    }

    /// Partial parity bytes one PPL of `parity` may carry.
    pub(crate) fn entry_space(&self, parity: MemberIdx) -> Option<u64> {
        self.log(parity).area.map(|a| a.area.entry_space_bytes)
    }
}

/// A member's log, held by one stripe write at a time.
pub(crate) struct PplGuard<'p> {
    ppl: &'p Ppl,
    log: MutexGuard<'p, Log>,
    role: MemberIdx,
}

impl PplGuard<'_> {
    /// Write one PPL (header + `pp`) with `entries` and make it durable. An IO error fails
    /// the parity member (md's md_error) and the write goes on without the log.
    pub(crate) fn write(
        &mut self,
        a: &Array,
        dev: &dyn Member,
        entries: Vec<fmt::PplEntry>,
        pp: &[u8],
    ) -> bool {
        let area = self.log.area.expect("a log with an area");
        let at = area.area.place(self.log.next_at, pp.len() as u64);
        let generation = self.ppl.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let h = PplHeader {
            signature: self.ppl.signature,
            generation,
            entries,
        };
        let mut buf = AlignedBuf::new(fmt::PPL_HEADER_SIZE + pp.len());
        buf[..fmt::PPL_HEADER_SIZE].copy_from_slice(&h.encode());
        buf[fmt::PPL_HEADER_SIZE..].copy_from_slice(pp);
        let r = dev
            .write_at(&buf, area.start_bytes + at * SECTOR_BYTES)
            .and_then(|_| dev.flush());
        a.note_member_ios(0, 1);
        match r {
            Ok(()) => {
                self.log.next_at = area.area.next_at(at, pp.len() as u64);
                true
            }
            Err(e) => {
                tracing::error!("{}: PPL write failed: {e}", dev.name());
                MemberHost::member_error(a, self.role, &e);
                false
            }
        }
    }
}

/// Replay one entry of `parity`'s log: parity = XOR of the rectangle's data on the
/// members ^ partial parity. Ok(false) when it cannot be used (bad geometry, another
/// member's parity, a data member missing).
fn recover_entry(
    a: &Array,
    g: &ParityGeometry,
    parity: MemberIdx,
    index: usize,
    e: &fmt::PplEntry,
    pp: &[u8],
) -> Result<bool, ArrayError> {
    let chunk = g.chunk_sectors;
    let x = match fmt::entry_extent(index, e, chunk, g.data_disks() as u64) {
        Ok(x) => x,
        Err(err) => {
            tracing::warn!("PPL of role {}: {err}; skipped", parity.0);
            return Ok(false);
        }
    };
    let loc = g.locate(x.first_sector);
    let map = g.stripe_map(loc.stripe);
    if map.p != parity || e.parity_disk as usize != parity.0 {
        tracing::warn!(
            "PPL of role {}: entry {index} names parity disk {} for array sector {}, whose \
             parity is on role {}; skipped",
            parity.0,
            e.parity_disk,
            x.first_sector,
            map.p.0
        );
        return Ok(false);
    }
    let rows = x.rows_of(0, chunk);
    let mut acc = AlignedBuf::new((rows * SECTOR_BYTES) as usize);
    let mut tmp = AlignedBuf::new((rows * SECTOR_BYTES) as usize);
    let msec = g.member_sector(loc.stripe, loc.offset_sectors);
    for d in 0..x.data_disks {
        let n = (x.rows_of(d, chunk) * SECTOR_BYTES) as usize;
        if n == 0 {
            continue;
        }
        let role = map.data[loc.data_index + d as usize];
        let Some(dev) = a.live(role) else {
            tracing::warn!(
                "PPL entry {index} of role {}: data member {} is missing; not recovered",
                parity.0,
                role.0
            );
            return Ok(false);
        };
        dev.read_at(&mut tmp[..n], member_byte(a.slot(role), Sector(msec)))
            .map_err(|err| {
                ArrayError::Assemble(format!("{}: PPL recovery read: {err}", dev.name()))
            })?;
        uraid_parity::xor_acc(&mut acc[..n], &[&tmp[..n]]);
    }
    if !pp.is_empty() {
        let n = acc.len().min(pp.len());
        uraid_parity::xor_acc(&mut acc[..n], &[&pp[..n]]);
    }
    let Some(pdev) = a.live(parity) else {
        return Ok(false);
    };
    pdev.write_at(&acc, member_byte(a.slot(parity), Sector(msec)))
        .and_then(|_| pdev.flush())
        .map_err(|err| {
            ArrayError::Assemble(format!("{}: PPL recovery write: {err}", pdev.name()))
        })?;
    Ok(true)
}

/// The areas of an array's members, by role, from their superblocks.
/// The PPL offset and size are array-wide (the template's, as md writes them); each
/// member's own superblock says where its superblock is.
pub(crate) fn areas(a: &Array) -> Vec<Option<Area>> {
    let meta = a.meta();
    let ppl = meta.template().bitmap_offset;
    (0..a.raid_disks())
        .map(|r| {
            let mut sb = meta.member_sb(MemberIdx(r))?.clone();
            sb.bitmap_offset = ppl;
            area_of(&sb)
        })
        .collect()
}

/// The PPL area mdadm gives a running array it switches to PPL (super1.c's "ppl" update,
/// which keeps the bad block log where it is), as `bitmap_offset`'s bytes and whether md
/// writes several PPLs there; Err says why there is no room.
pub(crate) fn update_placement(
    sb: &uraid_core::superblock::Superblock,
    chunk_sectors: u64,
) -> Result<(i32, bool), String> {
    let bb = i64::from(sb.bblog_offset);
    let (offset, space): (i64, i64) = if sb.super_offset < sb.data_offset {
        let space = if bb > 0 {
            bb
        } else {
            (sb.data_offset - sb.super_offset) as i64
        } - 8;
        (8, space)
    } else {
        let off = (-((sb.super_offset - sb.data_offset - sb.data_size) as i64)).max(-32768);
        (off, if bb < 0 { bb } else { 0 } - off)
    };
    if space < 16 {
        return Err(format!(
            "no room for a partial parity log: {space} sectors between the superblock and \
             the bad block log or the data (mdadm --grow --consistency-policy=ppl refuses it \
             too); create the array with --consistency-policy ppl instead"
        ));
    }
    let space = if space >= 2048 {
        2048
    } else {
        space.min(8 + (chunk_sectors as i64).max(256))
    };
    let area = PplArea::new(space as u64).ok_or("no room for a partial parity log")?;
    let raw = (offset as i16 as u16 as u32) | ((area.size_sectors as u32) << 16);
    Ok((raw as i32, area.multiple))
}

/// Write one stripe (parity `p` over rows `[lo, hi)` computed) with its PPL first: in
/// windows of at most one PPL's partial parity, each window logged (header + partial
/// parity, flushed), then written by `write` (which returns the members it wrote), then
/// those members flushed, so that the next PPL of this member never replaces one whose
/// writes are not yet durable (md's ppl_do_flush before the io_unit is finished).
#[allow(clippy::too_many_arguments)]
pub(super) fn write_logged(
    a: &Array,
    g: &ParityGeometry,
    map: &StripeMap,
    stripe: u64,
    pieces: &[Option<Piece<'_>>],
    lo: usize,
    hi: usize,
    p: &[u8],
    ppl: &Ppl,
    mut write: impl FnMut(std::ops::Range<usize>) -> crate::member_io::Roles,
) {
    // md logs only while the parity member is in sync; otherwise the write goes unlogged.
    let pdev = a.live(map.p);
    let (Some(pdev), Some(space)) = (pdev, ppl.entry_space(map.p)) else {
        write(lo..hi);
        return;
    };
    let Some(mut guard) = ppl.lock(map.p) else {
        write(lo..hi);
        return;
    };
    let ranges: Vec<Option<std::ops::Range<usize>>> = pieces
        .iter()
        .map(|pc| pc.as_ref().map(|pc| pc.start..pc.end()))
        .collect();
    // A stripe write is one contiguous range of the array: each row's written chunks are
    // consecutive (write-back's scattered pieces only exist with a journal, never with PPL).
    let rects = fmt::rects(&ranges).expect("a stripe write's chunks are consecutive in each row");
    let dd = g.data_disks();
    let cb = (g.chunk_sectors * SECTOR_BYTES) as usize;
    let stripe_sector = g.array_sector(stripe, 0);
    let mut w0 = lo;
    while w0 < hi {
        let w1 = (w0 + space as usize).min(hi);
        let mut entries = Vec::new();
        let mut pp: Vec<u8> = Vec::new();
        for r in &rects {
            let rows = r.rows.start.max(w0)..r.rows.end.min(w1);
            if rows.is_empty() {
                continue;
            }
            let mut checksum = 0;
            if r.count < dd {
                // Partial parity: the new parity without the rectangle's new data is the
                // XOR of the chunks the write leaves alone.
                let mut b = p[rows.start - lo..rows.end - lo].to_vec();
                for pc in pieces[r.first..r.first + r.count].iter() {
                    let pc = pc.as_ref().expect("a rectangle's chunks are written");
                    uraid_parity::xor_acc(
                        &mut b,
                        &[&pc.data[rows.start - pc.start..rows.end - pc.start]],
                    );
                }
                checksum = fmt::pp_checksum(&b);
                pp.extend_from_slice(&b);
            }
            let rect = fmt::Rect {
                first: r.first,
                count: r.count,
                rows,
            };
            entries.push(fmt::entry_for(
                &rect,
                stripe_sector,
                cb,
                dd,
                map.p.0 as u32,
                checksum,
            ));
        }
        if !guard.write(a, pdev.as_ref(), entries, &pp) {
            // The parity member failed: the rest goes out unlogged, as md's does.
            write(w0..hi);
            return;
        }
        let mut written = write(w0..w1);
        written.sort_unstable_by_key(|r| r.0);
        written.dedup();
        for r in written {
            if let Some(dev) = a.usable(r, stripe) {
                if let Err(e) = dev.flush() {
                    MemberHost::member_error(a, r, &e);
                }
            }
        }
        w0 = w1;
    }
}
