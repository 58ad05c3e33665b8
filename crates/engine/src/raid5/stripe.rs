//! One stripe's blocks over a range of rows: loading them from the members, rebuilding
//! the lost ones, computing parity.

use super::{sectors, stripe_roles};
use crate::array::{no_redundancy, Array};
use crate::buf::AlignedBuf;
use crate::error::ArrayError;
use crate::member_io::OpList;
use uraid_core::geometry::{ParityGeometry, StripeMap};
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
        let mut devs: MemberMap<Option<std::sync::Arc<dyn crate::member::Member>>> =
            MemberMap::from_fn(a.raid_disks(), |_| None);
        for role in stripe_roles(map) {
            if exclude.contains(&role) || !want(role) {
                continue;
            }
            if let Some(dev) = a.usable(role, stripe) {
                bufs[role] = Some(take(len));
                devs[role] = Some(dev);
            }
        }
        let msec = g.member_sector(stripe, sectors(lo));
        let mut ops = OpList::new();
        for (role, b) in bufs.iter_mut() {
            if let (Some(b), Some(dev)) = (b, devs[role].take()) {
                ops.read(a, dev, role, Sector(msec), b);
            }
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

    /// Rebuild every block of the stripe's roles that is not loaded.
    pub(super) fn reconstruct(
        &mut self,
        a: &Array,
        g: &ParityGeometry,
        map: &StripeMap,
    ) -> Result<(), ArrayError> {
        let roles = stripe_roles(map);
        let lost: Vec<MemberIdx> = roles.iter().copied().filter(|&r| !self.has(r)).collect();
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
            self.bufs[target] = Some(acc);
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
