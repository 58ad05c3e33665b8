//! Which copy a mirrored read goes to (md's read_balance for raid1 and raid10, simplified).
//!
//! Every member has a head position (the member sector where its last read ended) and a
//! count of reads pending on it, both atomics updated around member reads. A read that
//! continues where a copy's last read ended stays on that copy (sequential streams keep one
//! member busy and let the others serve other streams); otherwise the copy with the fewest
//! pending reads wins, ties going to the copy whose head is nearest (seek distance on
//! rotating media, harmless elsewhere), then to the first in the rotation the caller gives.
//! Copies that are not valid for the range (faulty, recovering above the cursor) are not
//! candidates: the caller filters them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Per-member read state; a hint only, so Relaxed is enough: a stale value picks a worse
/// copy, never a wrong one.
#[repr(align(64))]
#[derive(Default)]
pub(crate) struct Head {
    /// Member sector just past the last read.
    position: AtomicU64,
    pending: AtomicU32,
}

impl Head {
    /// Count a read of `sectors` at `member_sector` pending until the guard drops.
    pub(crate) fn start(&self, member_sector: u64, sectors: u64) -> Reading<'_> {
        self.pending.fetch_add(1, Relaxed);
        self.position.store(member_sector + sectors, Relaxed);
        Reading(self)
    }

    pub(crate) fn snapshot(&self) -> (u64, u32) {
        (self.position.load(Relaxed), self.pending.load(Relaxed))
    }
}

pub(crate) struct Reading<'a>(&'a Head);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Relaxed);
    }
}

/// A valid copy as the balancer sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    /// Member sector where the read would start on this copy.
    pub member_sector: u64,
    /// That member's head position and pending reads.
    pub head: u64,
    pub pending: u32,
}

/// The copy to read among (index, candidate) pairs; None when there is none. Streams
/// over the candidates, so the caller builds no list.
pub(crate) fn choose(c: impl IntoIterator<Item = (usize, Candidate)>) -> Option<usize> {
    let mut best: Option<(usize, (u32, u64))> = None;
    for (i, x) in c {
        if x.head == x.member_sector {
            return Some(i);
        }
        let key = (x.pending, x.head.abs_diff(x.member_sector));
        if best.is_none_or(|(_, k)| key < k) {
            best = Some((i, key));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(member_sector: u64, head: u64, pending: u32) -> Candidate {
        Candidate {
            member_sector,
            head,
            pending,
        }
    }

    fn choose(c: &[Candidate]) -> Option<usize> {
        super::choose(c.iter().copied().enumerate())
    }

    #[test]
    fn a_sequential_read_stays_on_its_copy_even_when_busier() {
        let c = [cand(100, 0, 0), cand(100, 100, 5)];
        assert_eq!(choose(&c), Some(1));
    }

    #[test]
    fn otherwise_the_least_pending_copy_wins() {
        let c = [cand(100, 50, 3), cand(100, 900, 1), cand(100, 120, 2)];
        assert_eq!(choose(&c), Some(1));
    }

    #[test]
    fn ties_go_to_the_nearest_head_then_the_first() {
        let c = [cand(100, 900, 1), cand(100, 90, 1), cand(100, 110, 1)];
        assert_eq!(choose(&c), Some(1));
        let c = [cand(100, 90, 0), cand(100, 110, 0)];
        assert_eq!(choose(&c), Some(0));
        assert_eq!(choose(&[]), None);
    }

    #[test]
    fn raid10_copies_compare_each_at_its_own_member_sector() {
        // far layout: copy 1 lives half a member further; its head sits right there.
        let c = [cand(64, 0, 0), cand(4160, 4160, 2)];
        assert_eq!(choose(&c), Some(1));
    }

    #[test]
    fn head_tracks_position_and_pending() {
        let h = Head::default();
        let r = h.start(10, 8);
        assert_eq!(h.snapshot(), (18, 1));
        drop(r);
        assert_eq!(h.snapshot(), (18, 0));
    }
}
