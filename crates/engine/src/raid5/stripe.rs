//! One stripe's blocks over a range of rows: loading them from the members, rebuilding
//! the lost ones, computing parity.

use super::{sectors, stripe_roles};
use crate::array::{no_redundancy, Array};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::member::Member;
use crate::member_io::{OpList, INLINE_OPS};
use smallvec::SmallVec;
use std::sync::Arc;
use uraid_core::geometry::{ParityGeometry, StripeList, StripeMap};
use uraid_core::{Level, MemberIdx, MemberMap, Sector};

/// Blocks of one stripe over rows [lo, hi), by role (None: not loaded or lost).
pub(super) struct Rows {
    pub(super) bufs: MemberMap<Option<AlignedBuf>>,
    pub(super) len: usize,
}

impl Rows {
    /// Read rows [lo, hi) of every usable, non-excluded role for which `want` says yes,
    /// into buffers from `take` (a stripe head's, or `AlignedBuf::scratch`).
    /// Err holds the roles whose reads failed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn load(
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
        let mut bufs: MemberMap<Option<AlignedBuf>> = MemberMap::from_fn(a.raid_disks(), |_| None);
        let mut devs: SmallVec<[(MemberIdx, Arc<dyn Member>); INLINE_OPS]> = SmallVec::new();
        for role in stripe_roles(map) {
            if exclude.contains(&role) || !want(role) {
                continue;
            }
            if let Some(dev) = a.usable(role, stripe) {
                bufs[role] = Some(take(len));
                devs.push((role, dev));
            }
        }
        let msec = g.member_sector(stripe, sectors(lo));
        let mut ops = OpList::new();
        for (role, b) in bufs.iter_mut() {
            let Some(b) = b else { continue };
            let dev = devs
                .iter()
                .position(|(r, _)| *r == role)
                .map(|i| devs.swap_remove(i).1);
            ops.read(
                a,
                dev.expect("a loaded block's member"),
                role,
                Sector(msec),
                b,
            );
        }
        let failed = ops.run(a);
        if !failed.reads.is_empty() {
            return Err(failed.reads);
        }
        Ok(Rows { bufs, len })
    }

    pub(super) fn get(&self, role: MemberIdx) -> &[u8] {
        self.bufs[role].as_ref().expect("block loaded")
    }

    pub(super) fn get_mut(&mut self, role: MemberIdx) -> &mut [u8] {
        self.bufs[role].as_mut().expect("block loaded")
    }

    /// Whether `role`'s block is loaded (or rebuilt).
    pub(super) fn has(&self, role: MemberIdx) -> bool {
        self.bufs[role].is_some()
    }

    /// Rebuild `target`, a data block or P (of any parity level), as the XOR of the stripe's
    /// other data blocks and P (loaded): Q is not used, so it need not be loaded.
    pub(super) fn reconstruct_from_p(&mut self, map: &StripeMap, target: MemberIdx) {
        let mut acc = AlignedBuf::scratch(self.len);
        let srcs: Vec<&[u8]> = map
            .data
            .iter()
            .chain([&map.p])
            .filter(|&&r| r != target)
            .map(|r| self.get(*r))
            .collect();
        for r in parity_slices(self.len) {
            let part: Vec<&[u8]> = srcs.iter().map(|b| &b[r.clone()]).collect();
            uraid_parity::xor_gen(&mut acc[r], &part);
        }
        self.bufs[target] = Some(acc);
    }

    /// Rebuild every block of the stripe's roles that is not loaded.
    pub(super) fn reconstruct(
        &mut self,
        a: &Array,
        g: &ParityGeometry,
        map: &StripeMap,
    ) -> Result<(), ArrayError> {
        let lost: Vec<MemberIdx> = stripe_roles(map).filter(|&r| !self.has(r)).collect();
        if lost.is_empty() {
            return Ok(());
        }
        if lost.len() > g.parity_disks() {
            return Err(no_redundancy(a, "reconstruct"));
        }
        if g.level != Level::Raid6 {
            // raid4/5: the stripe's roles are its data and P.
            self.reconstruct_from_p(map, lost[0]);
            return Ok(());
        }
        for r in &lost {
            self.bufs[*r] = Some(AlignedBuf::scratch(self.len));
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
        let mut refs: MemberMap<Option<&mut [u8]>> = self
            .bufs
            .iter_mut()
            .map(|(_, b)| b.as_mut().map(|b| &mut b[..]))
            .collect();
        let mut blocks: Vec<&mut [u8]> = Vec::with_capacity(width + 2);
        for r in &slot_role {
            match r {
                Some(r) => blocks.push(refs[*r].take().expect("block present")),
                None => blocks.push(&mut hole_refs.next().expect("hole")[..]),
            }
        }
        blocks.push(refs[pr].take().expect("P present"));
        blocks.push(refs[qr].take().expect("Q present"));
        for r in parity_slices(self.len) {
            let mut part: Vec<&mut [u8]> = blocks.iter_mut().map(|b| &mut b[r.clone()]).collect();
            uraid_parity::recover(&mut part, &lost_idx);
        }
        Ok(())
    }
}

/// The engine computes parity in slices of at most this many bytes per block. The parity
/// crate writes outputs of 256 KiB and more with non-temporal stores, past the cache, which
/// suits a caller that will not read them soon; the engine reads them at once (a member
/// write that is a copy: memory, tmpfs, the page cache), and a slice's output is still in
/// the cache then. A recovery of a raid5 or raid6 over memory members, whose 1 MiB passes
/// rebuilt each block in one call, ran 10-25% faster this way (docs/PERFORMANCE.md,
/// "Rebuild: items done early go on"). Each slice's sources and output also fit in L2.
const PARITY_SLICE_BYTES: usize = 128 << 10;

/// `0..len` in [`PARITY_SLICE_BYTES`] pieces.
fn parity_slices(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..len)
        .step_by(PARITY_SLICE_BYTES)
        .map(move |s| s..(s + PARITY_SLICE_BYTES).min(len))
}

/// A stripe's parity sources (one slice per data block), inline for up to 16 data blocks.
pub(super) type Sources<'a> = StripeList<&'a [u8]>;

/// Compute P (and Q) of `data` (logical order) into `p`/`q`.
pub(crate) fn gen_parity(map: &StripeMap, data: &[&[u8]], p: &mut [u8], q: Option<&mut [u8]>) {
    match q {
        None => {
            for r in parity_slices(p.len()) {
                let part: Sources = data.iter().map(|b| &b[r.clone()]).collect();
                uraid_parity::xor_gen(&mut p[r], &part);
            }
        }
        Some(q) => {
            // Data by coefficient slot; the DDF layouts' holes (P and Q) are zero blocks.
            let zero;
            let mut ordered = Sources::with_capacity(map.syndrome_width());
            if map.syndrome_width() == map.syndrome_order.len() {
                ordered.extend(map.syndrome_order.iter().map(|&i| data[i]));
            } else {
                zero = vec![0u8; p.len()];
                ordered.resize(map.syndrome_width(), &zero[..]);
                for (k, &i) in map.syndrome_order.iter().enumerate() {
                    ordered[map.syndrome_slots[k]] = data[i];
                }
            }
            for r in parity_slices(p.len()) {
                let part: Sources = ordered.iter().map(|b| &b[r.clone()]).collect();
                uraid_parity::gen_pq(&part, &mut p[r.clone()], &mut q[r]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uraid_core::geometry::ArrayGeometry;

    fn map(level: Level, layout: u32, disks: usize) -> StripeMap {
        let g = ArrayGeometry {
            level,
            layout,
            chunk_sectors: 2048,
            raid_disks: disks,
            dev_sectors: 2048 * 8,
            member_sectors: Vec::new(),
        };
        ParityGeometry::new(&g).unwrap().stripe_map(3)
    }

    /// Parity computed in slices is the parity of the whole blocks, for lengths that are
    /// and are not a whole number of slices, with and without the DDF layouts' zero blocks.
    #[test]
    fn parity_in_slices_is_the_parity_of_the_whole() {
        let mut seed = 1u64;
        let mut bytes = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 56) as u8
                })
                .collect()
        };
        // raid6 layouts: left-symmetric (2) and DDF rotating with zero blocks (8, 3 data).
        for (level, layout, disks) in [
            (Level::Raid5, 2, 5),
            (Level::Raid6, 2, 6),
            (Level::Raid6, 8, 5),
        ] {
            let m = map(level, layout, disks);
            for len in [
                4096,
                PARITY_SLICE_BYTES,
                3 * PARITY_SLICE_BYTES + 4096 + 512,
            ] {
                assert_eq!(parity_slices(len).map(|r| r.len()).sum::<usize>(), len);
                let data: Vec<Vec<u8>> = m.data.iter().map(|_| bytes(len)).collect();
                let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
                let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
                let q_out = (level == Level::Raid6).then_some(&mut q[..]);
                gen_parity(&m, &refs, &mut p, q_out);
                // Each byte column on its own, by the byte-wise reference.
                let ordered = |col: usize| -> Vec<u8> {
                    let mut v = vec![0u8; m.syndrome_width()];
                    for (k, &i) in m.syndrome_order.iter().enumerate() {
                        v[m.syndrome_slots[k]] = data[i][col];
                    }
                    v
                };
                for col in (0..len).step_by(997).chain([len - 1]) {
                    let xor = data.iter().fold(0u8, |x, d| x ^ d[col]);
                    assert_eq!(p[col], xor, "{level} P at {col} of {len}");
                    if level == Level::Raid6 {
                        let v = ordered(col);
                        let cols: Vec<&[u8]> = v.iter().map(std::slice::from_ref).collect();
                        let (mut pp, mut qq) = ([0u8], [0u8]);
                        uraid_parity::scalar::gen_pq(&cols, &mut pp, &mut qq);
                        assert_eq!(q[col], qq[0], "{level} Q at {col} of {len}");
                    }
                }
            }
        }
    }
}
