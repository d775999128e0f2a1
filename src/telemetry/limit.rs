//! Rate-limited warnings: at most [`BURST`] lines per [`INTERVAL`] from one
//! call site, so a flood of clients, resets or disk errors costs a few lines,
//! not one line per event. The next line a call site logs after some were
//! dropped carries `suppressed = N`; every dropped line also counts in the
//! `fencegate_log_suppressed_total` metric, which is the complete account
//! (a site that falls silent never logs the count it dropped last).
//!
//! Our own sites use [`warn_limited!`](crate::telemetry::warn_limited) and
//! [`error_limited!`](crate::telemetry::error_limited), each with a static
//! [`CallSiteLimit`]. Warnings of the libraries below us (h2 warns once per
//! connection it closes for too many resets) go through [`ForeignLimit`], a
//! subscriber layer with the same limit per call site that logs the count
//! as a line of its own.
//!
//! tracing-throttle does this as a layer only, hashing each event's
//! message into a signature map and reporting through a summary task; a
//! static counter per call site is cheaper and attaches the count to the line.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use prometheus_client::metrics::counter::Counter;
use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Lines one call site may log per interval.
pub const BURST: u32 = 5;
/// The interval [`BURST`] counts over.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Lines dropped by any call site since the process started.
static SUPPRESSED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// The counter behind `fencegate_log_suppressed_total` (process-wide: the
/// call sites' state is static).
pub(crate) fn suppressed_counter() -> Counter {
    SUPPRESSED.clone()
}

/// The current interval's number since the first use.
fn interval_now() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let elapsed = EPOCH.get_or_init(Instant::now).elapsed();
    (elapsed.as_millis() / INTERVAL.as_millis()) as u64
}

/// One call site's budget. Races between threads may let a line or two more
/// through at an interval's turn; the count of dropped lines stays exact.
#[derive(Debug, Default)]
pub struct CallSiteLimit {
    /// The interval `logged` counts in, plus one (0: never used).
    interval: AtomicU64,
    logged: AtomicU32,
    suppressed: AtomicU64,
}

impl CallSiteLimit {
    pub const fn new() -> CallSiteLimit {
        CallSiteLimit { interval: AtomicU64::new(0), logged: AtomicU32::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(n)`: log this line, and say `n` were dropped before it; `None`:
    /// drop it (counted).
    pub fn admit(&self) -> Option<u64> {
        let now = interval_now() + 1;
        let seen = self.interval.load(Ordering::Relaxed);
        if seen != now && self.interval.compare_exchange(seen, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            self.logged.store(0, Ordering::Relaxed);
        }
        if self.logged.fetch_add(1, Ordering::Relaxed) < BURST {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            // Saturate instead of wrapping after four billion drops.
            self.logged.store(BURST, Ordering::Relaxed);
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            SUPPRESSED.inc();
            None
        }
    }
}

/// Logs at `$level` through the call site's static [`CallSiteLimit`],
/// adding `suppressed = N` when lines were dropped before this one.
#[doc(hidden)]
#[macro_export]
macro_rules! __fencegate_log_limited {
    ($level:ident, target: $target:expr, $($rest:tt)+) => {{
        static LIMIT: $crate::telemetry::CallSiteLimit = $crate::telemetry::CallSiteLimit::new();
        match LIMIT.admit() {
            Some(0) => $crate::telemetry::__tracing::$level!(target: $target, $($rest)+),
            Some(suppressed) => $crate::telemetry::__tracing::$level!(target: $target, suppressed, $($rest)+),
            None => {}
        }
    }};
    ($level:ident, $($rest:tt)+) => {{
        static LIMIT: $crate::telemetry::CallSiteLimit = $crate::telemetry::CallSiteLimit::new();
        match LIMIT.admit() {
            Some(0) => $crate::telemetry::__tracing::$level!($($rest)+),
            Some(suppressed) => $crate::telemetry::__tracing::$level!(suppressed, $($rest)+),
            None => {}
        }
    }};
}

/// `tracing::warn!` for a line a client, the network or a failing disk can
/// repeat: at most [`BURST`] per [`INTERVAL`] from this call site.
///
/// ```
/// # let peer = "127.0.0.1:1";
/// fencegate::telemetry::warn_limited!(caller = %peer, "refused");
/// ```
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => { $crate::__fencegate_log_limited!(warn, $($arg)+) };
}

/// `tracing::error!` with the limit of [`warn_limited!`](crate::telemetry::warn_limited).
#[macro_export]
macro_rules! error_limited {
    ($($arg:tt)+) => { $crate::__fencegate_log_limited!(error, $($arg)+) };
}

/// A subscriber layer that holds warnings and errors of other crates to the
/// same limit per call site, and logs the count it dropped as a line of its
/// own (`fencegate::log`) before the next one it lets through. Records of the
/// `log` crate share one call site per level, so they share one budget.
#[derive(Debug, Default)]
pub struct ForeignLimit {
    sites: DashMap<Identifier, CallSiteLimit>,
}

impl<S: Subscriber> Layer<S> for ForeignLimit {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::WARN || meta.target().starts_with("fencegate") {
            return true;
        }
        // The guard is dropped before logging: the summary below is an event too.
        let admitted = self.sites.entry(meta.callsite()).or_default().admit();
        match admitted {
            None => false,
            Some(0) => true,
            Some(suppressed) => {
                tracing::warn!(
                    target: "fencegate::log",
                    suppressed,
                    from = meta.target(),
                    site = meta.name(),
                    "repeated warnings were suppressed"
                );
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_site_logs_a_burst_then_counts_what_it_drops() {
        let limit = CallSiteLimit::new();
        let before = SUPPRESSED.get();
        let admitted: Vec<_> = (0..BURST + 7).map(|_| limit.admit()).collect();
        assert!(admitted[..BURST as usize].iter().all(|a| *a == Some(0)), "{admitted:?}");
        assert!(admitted[BURST as usize..].iter().all(Option::is_none), "{admitted:?}");
        assert!(SUPPRESSED.get() - before >= 7);
        // The next interval: the first line carries the count.
        limit.interval.store(0, Ordering::Relaxed);
        assert_eq!(limit.admit(), Some(7));
        assert_eq!(limit.admit(), Some(0));
    }

    #[test]
    fn call_sites_have_budgets_of_their_own() {
        let (a, b) = (CallSiteLimit::new(), CallSiteLimit::new());
        for _ in 0..BURST * 3 {
            a.admit();
        }
        assert_eq!(b.admit(), Some(0));
    }
}
