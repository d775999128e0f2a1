//! `fencegate_request_duration_seconds`: a histogram every request records
//! into, so one without a lock. prometheus-client's `Histogram` takes a
//! write lock and scans its buckets per observation; here a bucket is found
//! from the value's bits and counted with one atomic add, the sum with
//! another, in the recording thread's shard (shards.rs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use super::shards::{shard, Padded, SHARDS};

/// The first bucket's upper bound, in nanoseconds (100 µs); each next
/// bucket's is twice the one before.
const FIRST_NS: u64 = 100_000;
/// Buckets with a bound (100 µs .. ~52 s), then `+Inf`.
const BOUNDED: usize = 20;

/// Request latencies in buckets of 100 µs × 2^i, i in 0..20, and `+Inf`.
#[derive(Clone, Debug, Default)]
pub struct Latency(Arc<[Padded<Counts>; SHARDS]>);

#[derive(Debug, Default)]
struct Counts {
    buckets: [AtomicU64; BOUNDED + 1],
    sum_ns: AtomicU64,
}

impl Latency {
    pub fn observe(&self, seconds: f64) {
        // A saturating cast: NaN and negatives are 0, anything past u64 is u64::MAX.
        let ns = (seconds * 1e9) as u64;
        let counts = &self.0[shard()].0;
        counts.buckets[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        counts.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// The first bucket whose bound is at least `ns`: `ns ≤ FIRST_NS × 2^i`
/// exactly when `⌈ns / FIRST_NS⌉ ≤ 2^i`.
fn bucket(ns: u64) -> usize {
    let units = ns.div_ceil(FIRST_NS);
    let i = if units <= 1 { 0 } else { (u64::BITS - (units - 1).leading_zeros()) as usize };
    i.min(BOUNDED)
}

fn bound(i: usize) -> f64 {
    if i == BOUNDED {
        f64::MAX
    } else {
        (FIRST_NS << i) as f64 / 1e9
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let shards = || self.0.iter().map(|s| &s.0);
        let buckets: Vec<(f64, u64)> =
            (0..=BOUNDED).map(|i| (bound(i), shards().map(|c| c.buckets[i].load(Ordering::Relaxed)).sum())).collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = shards().map(|c| c.sum_ns.load(Ordering::Relaxed)).sum::<u64>() as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

    #[test]
    fn a_value_lands_in_the_bucket_prometheus_clients_scan_finds() {
        let bounds: Vec<f64> = exponential_buckets(0.0001, 2.0, 20).collect();
        for (i, b) in bounds.iter().enumerate() {
            assert!((bound(i) - b).abs() < 1e-12, "bound {i}: {} against {b}", bound(i));
        }
        let values = [
            0.0,
            1e-9,
            0.00005,
            0.0001,
            0.000100001,
            0.0002,
            0.0003,
            0.0016,
            0.0017,
            1.0,
            26.2144,
            52.4288,
            52.43,
            1e6,
        ];
        for v in values {
            let scanned = bounds.iter().position(|b| *b >= v).unwrap_or(BOUNDED);
            assert_eq!(bucket((v * 1e9) as u64), scanned, "{v} s");
        }
    }

    #[test]
    fn it_encodes_as_prometheus_clients_histogram_does() {
        let (ours, theirs) = (Latency::default(), Histogram::new(exponential_buckets(0.0001, 2.0, 20)));
        for v in [0.00005, 0.0003, 0.0003, 0.002, 0.5, 100.0] {
            ours.observe(v);
            theirs.observe(v);
        }
        fn text(metric: impl prometheus_client::registry::Metric) -> String {
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register("d", "d", metric);
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        }
        let (ours, theirs) = (text(ours), text(theirs));
        // The sums differ in their last digits: ours is kept in whole nanoseconds.
        let without_sum = |t: &str| t.lines().filter(|l| !l.starts_with("d_sum")).collect::<Vec<_>>().join("\n");
        assert_eq!(without_sum(&ours), without_sum(&theirs));
        assert!(ours.contains("d_sum 100.50265"), "{ours}");
    }
}
