//! What the array knows was never written: regions of array sectors that read as zeros on
//! every member, parity and copies included, because nothing was written there since they
//! were last made zeros as a whole. A recovery or resync passes over such a region as it
//! passes over holes (it zeroes its targets there, reads and compares nothing), on members
//! that cannot say where they were never written (block devices), which md cannot do.
//!
//! A region is "written" (its bit set) unless the array knows better, so the map starts
//! all written, and is cleared only
//! - at create, where every member reads zeros everywhere ([`crate::Member::known_zero`]);
//! - by a zeroing of whole regions through the array (WRITE_ZEROES, or a discard that the
//!   members turn into zeros, as on a level with redundancy it must be), once the zeroing
//!   is done and no write touched the region since the zeroing began.
//!
//! Every write through the array sets the bits of the regions it touches before it
//! reaches the members. A zeroing claims its regions first, then waits for the writes
//! that were under way when it claimed them (a grace period over the array's writes in
//! flight, [`crate::counter::Generations`]), so that none of those lands after its zeros;
//! a write that enters after the claim sees it and spoils it. Writes that run beside a
//! zeroing thus leave the region written whatever order they reach the members in.
//!
//! The map lives as long as the array object: a restart starts it all written again, and
//! so does a change of shape (the regions are array addresses, which a reshape moves).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The smallest region: 1 MiB, in sectors.
const MIN_REGION_SHIFT: u32 = 11;
/// At most this many regions (a bit each: 128 KiB of map).
const MAX_REGIONS_SHIFT: u32 = 20;

/// A zeroing's claim on whole regions [first, end).
struct Claim {
    id: u64,
    first: u64,
    end: u64,
    spoiled: bool,
}

/// Which regions of an array were written (or may have been).
pub(crate) struct Written {
    /// A region is `1 << shift` sectors.
    shift: u32,
    /// Array sectors the map covers; past them everything counts as written.
    sectors: u64,
    /// One bit per region, set: written.
    bits: Box<[AtomicU64]>,
    /// Claims under way (a write looks at the list only while this is not zero).
    claiming: AtomicUsize,
    claims: Mutex<(u64, Vec<Claim>)>,
}

/// A claim to hand back to [`Written::settle`] or [`Written::drop_claim`].
pub(crate) struct ClaimId(u64);

impl Written {
    /// A map of an array of `sectors`, every region written.
    pub(crate) fn new(sectors: u64) -> Written {
        let need = 64 - sectors.max(1).saturating_sub(1).leading_zeros();
        let shift = need.saturating_sub(MAX_REGIONS_SHIFT).max(MIN_REGION_SHIFT);
        let regions = sectors.div_ceil(1 << shift);
        let bits = (0..regions.div_ceil(64))
            .map(|_| AtomicU64::new(u64::MAX))
            .collect();
        Written {
            shift,
            sectors,
            bits,
            claiming: AtomicUsize::new(0),
            claims: Mutex::new((0, Vec::new())),
        }
    }

    /// Sectors in a region.
    #[cfg(test)]
    pub(crate) fn region_sectors(&self) -> u64 {
        1 << self.shift
    }

    /// Regions [first, end) that array sectors [sector, sector+sectors) touch, within the
    /// map.
    fn touched(&self, sector: u64, sectors: u64) -> (u64, u64) {
        let end = sector.saturating_add(sectors).min(self.sectors);
        if sectors == 0 || sector >= end {
            return (0, 0);
        }
        (sector >> self.shift, ((end - 1) >> self.shift) + 1)
    }

    /// Regions [first, end) wholly inside array sectors [sector, sector+sectors); the last
    /// region of the map counts as whole when the range reaches the map's end.
    fn inside(&self, sector: u64, sectors: u64) -> (u64, u64) {
        let end = sector.saturating_add(sectors).min(self.sectors);
        let first = sector.div_ceil(1 << self.shift);
        let last = if end == self.sectors {
            end.div_ceil(1 << self.shift)
        } else {
            end >> self.shift
        };
        (first, last.max(first))
    }

    fn bit(&self, r: u64) -> (&AtomicU64, u64) {
        (&self.bits[(r / 64) as usize], 1 << (r % 64))
    }

    /// A write of array sectors [sector, sector+sectors) is about to reach the members;
    /// called inside the write's entry in the array's writes in flight, before the
    /// members see it.
    pub(crate) fn mark(&self, sector: u64, sectors: u64) {
        let (first, end) = self.touched(sector, sectors);
        if self.claiming.load(Ordering::SeqCst) != 0 {
            let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
            for c in claims.1.iter_mut() {
                if c.first < end && first < c.end {
                    c.spoiled = true;
                }
            }
        }
        for r in first..end {
            let (word, bit) = self.bit(r);
            // A region written once stays so: a load, no store, on the hot path.
            if word.load(Ordering::Relaxed) & bit == 0 {
                word.fetch_or(bit, Ordering::SeqCst);
            }
        }
    }

    /// Every region written (a change of shape; tests).
    pub(crate) fn mark_all(&self) {
        for w in self.bits.iter() {
            w.store(u64::MAX, Ordering::SeqCst);
        }
    }

    /// Nothing written anywhere (create over members that all read zeros).
    pub(crate) fn forget_all(&self) {
        for w in self.bits.iter() {
            w.store(0, Ordering::SeqCst);
        }
    }

    /// Whether no region that array sectors [sector, sector+sectors) touch was written
    /// (false for anything past the map).
    pub(crate) fn never_written(&self, sector: u64, sectors: u64) -> bool {
        if sector.saturating_add(sectors) > self.sectors || sectors == 0 {
            return false;
        }
        let (first, end) = self.touched(sector, sectors);
        (first..end).all(|r| {
            let (word, bit) = self.bit(r);
            word.load(Ordering::SeqCst) & bit == 0
        })
    }

    /// Array sectors in regions never written.
    pub(crate) fn never_written_sectors(&self) -> u64 {
        let regions = self.sectors.div_ceil(1 << self.shift);
        if regions == 0 {
            return 0;
        }
        // Bits past the last region are padding (set or not, as the last store left them).
        // Each word is loaded once, so that the short last region is judged by the same
        // load that counted it.
        let tail = regions % 64;
        let last = self.bits.len() - 1;
        let (mut clear, mut last_clear) = (0u64, false);
        for (i, w) in self.bits.iter().enumerate() {
            let free = !w.load(Ordering::Relaxed);
            let valid = if i == last && tail != 0 {
                (1 << tail) - 1
            } else {
                u64::MAX
            };
            clear += u64::from((free & valid).count_ones());
            if i == last {
                last_clear = free >> ((regions - 1) % 64) & 1 == 1;
            }
        }
        // The last region may be short of a whole one.
        let short = (regions << self.shift) - self.sectors;
        (clear << self.shift) - if last_clear { short } else { 0 }
    }

    /// A region's size as log2 of sectors, and the sectors covered (for the state file).
    pub(crate) fn extent(&self) -> (u32, u64) {
        (self.shift, self.sectors)
    }

    /// The map's words (bit set: written).
    pub(crate) fn words(&self) -> Vec<u64> {
        self.bits.iter().map(|w| w.load(Ordering::SeqCst)).collect()
    }

    /// Takes a saved map's words (as many as this map has); false, with nothing changed,
    /// if the count differs.
    pub(crate) fn load(&self, words: &[u64]) -> bool {
        if words.len() != self.bits.len() {
            return false;
        }
        for (w, &v) in self.bits.iter().zip(words) {
            w.store(v, Ordering::SeqCst);
        }
        true
    }

    /// Claims the whole regions inside array sectors [sector, sector+sectors) for a
    /// zeroing about to start; None if there are none. The caller then waits for the
    /// writes already under way ([`crate::counter::Generations::wait_for_earlier`]) before
    /// it zeroes.
    pub(crate) fn claim(&self, sector: u64, sectors: u64) -> Option<ClaimId> {
        let (first, end) = self.inside(sector, sectors);
        if first >= end {
            return None;
        }
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.0 += 1;
        let id = claims.0;
        claims.1.push(Claim {
            id,
            first,
            end,
            spoiled: false,
        });
        // SeqCst, before the grace period's flip: a write entering after the flip sees it.
        self.claiming.fetch_add(1, Ordering::SeqCst);
        Some(ClaimId(id))
    }

    /// Where claim `id` is in the list (its lock held by the caller).
    fn position(claims: &(u64, Vec<Claim>), id: &ClaimId) -> usize {
        claims
            .1
            .iter()
            .position(|c| c.id == id.0)
            .expect("a claim is settled once")
    }

    /// Takes the claim at `i` off the list (its lock held by the caller).
    fn remove(&self, claims: &mut (u64, Vec<Claim>), i: usize) -> Claim {
        self.claiming.fetch_sub(1, Ordering::SeqCst);
        claims.1.swap_remove(i)
    }

    /// The zeroing of a claim is done on every member: its regions are never written
    /// again, unless a write touched them since the claim. Returns whether it cleared them.
    pub(crate) fn settle(&self, id: ClaimId) -> bool {
        // Under the list's lock, which a write that saw a claim takes to spoil it; and
        // the bits are cleared before the claim leaves the list, so a write that finds no
        // claim finds them cleared and sets its own again.
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        let i = Self::position(&claims, &id);
        let c = &claims.1[i];
        let clear = !c.spoiled;
        if clear {
            for r in c.first..c.end {
                let (word, bit) = self.bit(r);
                word.fetch_and(!bit, Ordering::SeqCst);
            }
        }
        self.remove(&mut claims, i);
        clear
    }

    /// A claim whose zeroing failed or did not happen: its regions stay as they are.
    pub(crate) fn drop_claim(&self, id: ClaimId) {
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        let i = Self::position(&claims, &id);
        self.remove(&mut claims, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 2048;

    #[test]
    fn regions_are_a_mebibyte_or_as_large_as_a_megabit_map_needs() {
        assert_eq!(Written::new(100 * MIB).region_sectors(), MIB);
        assert_eq!(Written::new(1 << 31).region_sectors(), MIB); // 1 TiB
        assert_eq!(Written::new((1 << 31) + 1).region_sectors(), 2 * MIB);
        assert_eq!(Written::new(1 << 35).region_sectors(), 16 * MIB); // 16 TiB
        assert!(Written::new(1 << 40).bits.len() * 64 <= 1 << MAX_REGIONS_SHIFT);
        assert_eq!(Written::new(0).bits.len(), 0);
    }

    #[test]
    fn a_new_map_is_all_written_and_a_write_marks_what_it_touches() {
        let w = Written::new(10 * MIB + 100);
        assert!(!w.never_written(0, 1));
        assert_eq!(w.never_written_sectors(), 0);
        w.forget_all();
        assert!(w.never_written(0, 10 * MIB + 100));
        assert_eq!(w.never_written_sectors(), 10 * MIB + 100);
        // Past the map: written.
        assert!(!w.never_written(10 * MIB + 99, 2));
        w.mark(3 * MIB - 1, 2);
        assert!(!w.never_written(2 * MIB, 1) && !w.never_written(3 * MIB, 1));
        assert!(w.never_written(0, 2 * MIB) && w.never_written(4 * MIB, 6 * MIB + 100));
        w.mark(10 * MIB + 50, 10);
        assert!(!w.never_written(10 * MIB, 1) && w.never_written(9 * MIB, MIB));
        w.mark_all();
        assert!(!w.never_written(5 * MIB, 1));
    }

    #[test]
    fn the_count_of_never_written_sectors_is_that_of_its_regions() {
        // Region by region, as the definition says; the count works a word at a time.
        let by_region = |w: &Written| -> u64 {
            let regions = w.sectors.div_ceil(w.region_sectors());
            (0..regions)
                .filter(|&r| w.never_written(r * w.region_sectors(), 1))
                .map(|r| (w.sectors - r * w.region_sectors()).min(w.region_sectors()))
                .sum()
        };
        for sectors in [MIB, 64 * MIB, 64 * MIB + 1, 65 * MIB - 7, 130 * MIB] {
            let w = Written::new(sectors);
            // forget_all clears the padding past the last region, load may set it.
            w.forget_all();
            assert_eq!(w.never_written_sectors(), sectors);
            let mut words = w.words();
            for (i, x) in words.iter_mut().enumerate() {
                *x = 0x9e37_79b9_7f4a_7c15u64.rotate_left(i as u32 * 7);
            }
            assert!(w.load(&words));
            assert_eq!(
                w.never_written_sectors(),
                by_region(&w),
                "{sectors} sectors"
            );
            w.mark(sectors - 1, 1);
            assert_eq!(
                w.never_written_sectors(),
                by_region(&w),
                "{sectors} sectors"
            );
            w.mark_all();
            assert_eq!(w.never_written_sectors(), 0);
        }
    }

    #[test]
    fn a_settled_claim_clears_only_whole_regions() {
        let w = Written::new(10 * MIB + 100);
        // 1.5 MiB .. 5.5 MiB holds regions 2, 3, 4 whole.
        let c = w.claim(3 * MIB / 2, 4 * MIB).unwrap();
        assert!(w.settle(c));
        assert!(w.never_written(2 * MIB, 3 * MIB));
        assert!(!w.never_written(MIB, 1) && !w.never_written(5 * MIB, 1));
        // Nothing whole inside.
        assert!(w.claim(MIB + 1, MIB).is_none());
        // The map's last, short region counts as whole when the range reaches the end.
        let c = w.claim(10 * MIB, 100).unwrap();
        assert!(w.settle(c));
        assert!(w.never_written(10 * MIB, 100));
    }

    #[test]
    fn a_write_during_a_claim_spoils_it_and_others_do_not() {
        let w = Written::new(16 * MIB);
        let c = w.claim(0, 4 * MIB).unwrap();
        w.mark(8 * MIB, 8); // elsewhere
        assert!(w.settle(c));
        assert!(w.never_written(0, 4 * MIB));
        let c = w.claim(0, 4 * MIB).unwrap();
        w.mark(3 * MIB + 5, 1);
        assert!(!w.settle(c), "a write inside the claim must spoil it");
        assert!(!w.never_written(3 * MIB, 1));
        // Regions the write did not touch stay as they were (never written).
        assert!(w.never_written(0, 3 * MIB));
        // A dropped claim changes nothing, and later writes look at no list.
        w.mark_all();
        let c = w.claim(0, 4 * MIB).unwrap();
        w.drop_claim(c);
        assert!(!w.never_written(0, 1));
        assert_eq!(w.claiming.load(Ordering::SeqCst), 0);
    }
}
