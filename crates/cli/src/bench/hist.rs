//! Latency histogram with log-linear buckets (HDR-like): 32 sub-buckets per power of two, so a
//! reported percentile is within about 3% of the true value. Fixed size, no allocation while
//! recording, merged by adding counts.

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Enough buckets for any u64 value.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

#[derive(Clone)]
pub struct Hist {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros() - SUB_BITS;
    ((e as u64 + 1) * SUB + ((v >> e) - SUB)) as usize
}

/// Smallest value that falls in bucket `i`.
fn lower(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let e = i / SUB - 1;
    (i % SUB + SUB) << e
}

/// Largest value that falls in bucket `i`.
fn upper(i: usize) -> u64 {
    if i + 1 >= BUCKETS {
        u64::MAX
    } else {
        lower(i + 1) - 1
    }
}

impl Default for Hist {
    fn default() -> Self {
        Hist::new()
    }
}

impl Hist {
    pub fn new() -> Hist {
        Hist {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0,
            max: 0,
        }
    }

    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.total += 1;
        self.sum += v as u128;
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, o: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.sum += o.sum;
        self.max = self.max.max(o.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1): the middle of the bucket holding it, capped by the
    /// largest value seen.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = (lower(i), upper(i));
                return (lo + (hi - lo) / 2).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_ordered() {
        let mut prev_hi = None;
        for i in 0..BUCKETS - 1 {
            let (lo, hi) = (lower(i), upper(i));
            assert!(lo <= hi, "bucket {i}");
            if let Some(p) = prev_hi {
                assert_eq!(lo, p + 1, "gap before bucket {i}");
            }
            assert_eq!(index(lo), i);
            assert_eq!(index(hi), i);
            prev_hi = Some(hi);
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_the_bucket_precision() {
        let mut h = Hist::new();
        // 1..=100_000 ns: the q-quantile is q * 100_000.
        for v in 1..=100_000u64 {
            h.record(v);
        }
        for (q, want) in [(0.5, 50_000.0), (0.99, 99_000.0), (0.999, 99_900.0)] {
            let got = h.quantile(q) as f64;
            assert!(
                (got - want).abs() / want < 0.035,
                "q{q}: got {got}, want {want}"
            );
        }
        assert_eq!(h.count(), 100_000);
        assert_eq!(h.max(), 100_000);
        assert!((h.mean() - 50_000.5).abs() < 1e-6);
    }

    #[test]
    fn merge_adds_counts_and_a_lone_outlier_is_the_max() {
        let mut a = Hist::new();
        let mut b = Hist::new();
        for _ in 0..999 {
            a.record(1000);
        }
        b.record(5_000_000);
        a.merge(&b);
        assert_eq!(a.count(), 1000);
        assert!((a.quantile(0.5) as f64 - 1000.0).abs() < 35.0);
        assert_eq!(a.quantile(1.0), 5_000_000);
        assert_eq!(a.max(), 5_000_000);
    }
}
