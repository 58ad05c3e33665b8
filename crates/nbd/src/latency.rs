//! Reply latency of a client's connections: a moving average for `uraid detail` and a
//! histogram of every reply for the Prometheus metrics, kept with atomics (the reader
//! path takes no lock for them).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Buckets of [`LatencyHistogram`]: the first ends at this many microseconds, each next
/// one at twice the last ([`BUCKETS`] of them, 10 us to about 5 s), then one without end.
pub const FIRST_BUCKET_US: u64 = 10;
/// Bounded buckets of [`LatencyHistogram`].
pub const BUCKETS: usize = 20;

/// Reply latencies: a moving average (weight 1/8) and a histogram.
#[derive(Debug, Default)]
pub struct Latency {
    /// Moving average in microseconds (0: no reply yet).
    average_us: AtomicU64,
    /// Replies per bucket (not cumulative); the last has no upper bound.
    counts: [AtomicU64; BUCKETS + 1],
    sum_us: AtomicU64,
}

/// A copy of a [`Latency`]'s histogram (or the sum of several).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Replies whose latency fell in each bucket, not cumulative: bucket `i < BUCKETS`
    /// holds those up to [`bucket_upper_us`]`(i)`, the last one the rest.
    pub counts: Vec<u64>,
    /// Sum of the latencies in microseconds.
    pub sum_us: u64,
}

/// Upper bound of bucket `i` (`i < BUCKETS`), in microseconds.
pub fn bucket_upper_us(i: usize) -> u64 {
    FIRST_BUCKET_US << i
}

fn bucket_of(us: u64) -> usize {
    (0..BUCKETS)
        .find(|&i| us <= bucket_upper_us(i))
        .unwrap_or(BUCKETS)
}

impl Latency {
    /// One reply came `took` after its request was sent.
    pub fn record(&self, took: Duration) {
        let us = (took.as_micros() as u64).max(1);
        let old = self.average_us.load(Relaxed);
        let new = if old == 0 { us } else { old - old / 8 + us / 8 };
        self.average_us.store(new.max(1), Relaxed);
        self.counts[bucket_of(us)].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    /// The moving average in microseconds, none before the first reply.
    pub fn average_us(&self) -> Option<u64> {
        Some(self.average_us.load(Relaxed)).filter(|&l| l > 0)
    }

    /// The histogram now.
    pub fn histogram(&self) -> LatencyHistogram {
        LatencyHistogram {
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum_us: self.sum_us.load(Relaxed),
        }
    }
}

impl LatencyHistogram {
    /// Replies counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other`'s replies to these.
    pub fn add(&mut self, other: &LatencyHistogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_us += other.sum_us;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_fall_in_their_buckets_and_the_average_moves_by_an_eighth() {
        let l = Latency::default();
        assert_eq!(l.average_us(), None);
        assert_eq!(l.histogram().count(), 0);
        l.record(Duration::from_micros(10)); // bucket 0 (up to 10 us)
        l.record(Duration::from_micros(11)); // bucket 1 (up to 20 us)
        l.record(Duration::from_millis(1)); // bucket 7 (up to 1280 us)
        l.record(Duration::from_secs(60)); // past the last bound
        let h = l.histogram();
        assert_eq!(h.counts.len(), BUCKETS + 1);
        assert_eq!((h.counts[0], h.counts[1], h.counts[7]), (1, 1, 1));
        assert_eq!(h.counts[BUCKETS], 1);
        assert_eq!(h.count(), 4);
        assert_eq!(h.sum_us, 10 + 11 + 1000 + 60_000_000);
        // 10, then 10 - 1 + 1 = 10, then 10 - 1 + 125 = 134, ...
        let m = Latency::default();
        m.record(Duration::from_micros(10));
        m.record(Duration::from_micros(11));
        assert_eq!(m.average_us(), Some(10));
        m.record(Duration::from_micros(1000));
        assert_eq!(m.average_us(), Some(134));

        let mut sum = h.clone();
        sum.add(&m.histogram());
        assert_eq!(sum.count(), 7);
        assert_eq!(sum.counts[0], 2);
        assert_eq!(bucket_upper_us(BUCKETS - 1), 10 << 19);
    }
}
