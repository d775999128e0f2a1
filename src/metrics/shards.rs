//! Counts every request adds to, kept apart per worker thread: one shared
//! atomic per count would pass its cache line between the cores on every
//! request (a locked add that waits for the other core's copy). Each thread
//! adds to a shard of its own, on a line of its own; a scrape sums them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Shards per count: a thread each for up to this many threads (the workers,
/// one per core by default); more share them, still counting right.
pub(super) const SHARDS: usize = 8;

/// A shard on a cache line (two, for the adjacent-line prefetch) of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

/// This thread's shard.
pub(super) fn shard() -> usize {
    crate::telemetry::thread_number() % SHARDS
}

/// A Prometheus counter in [`SHARDS`] shards.
#[derive(Clone, Debug, Default)]
pub struct Count(Arc<[Padded<AtomicU64>; SHARDS]>);

impl Count {
    pub fn inc(&self) {
        self.0[shard()].0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for Count {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for Count {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads_add_up() {
        let count = Count::default();
        std::thread::scope(|s| {
            for _ in 0..(SHARDS + 3) {
                s.spawn(|| (0..1000).for_each(|_| count.inc()));
            }
        });
        assert_eq!(count.get(), 1000 * (SHARDS as u64 + 3));
    }
}
