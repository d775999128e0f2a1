//! Prometheus metrics, all named `fencegate_*`.
//!
//! Per-route handles are made when a route table is put in service and ride
//! with each request's route, so recording a request costs four atomic adds
//! to its worker's own shard (shards.rs: its outcome, its status class and
//! the latency histogram's bucket and sum) and no label hashing or lock, and
//! a request routed by a table a reload has since replaced is still counted
//! under its own route.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::fence::store::{CallStats, CommitStats};
use crate::http::Outcome;

mod certificates;
mod handles;
mod latency;
mod shards;
pub use certificates::CertificateExpiry;
pub use handles::{ConnectionCount, HeldBack, OpenConnection, Reloads, TlsReloads};
use latency::Latency;
use shards::Count;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

/// The status classes of `fencegate_responses_total`, in the order of
/// [`RouteMetrics::by_class`]: a status's hundreds digit, less one.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResponseLabels {
    route: String,
    status_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    arch: &'static str,
    os: &'static str,
}

/// The label used for requests that matched no route.
pub const NO_ROUTE_LABEL: &str = "none";

/// One route's request counters, latency histogram and settles.
pub struct RouteMetrics {
    by_outcome: Vec<Count>,
    /// In [`STATUS_CLASSES`] order.
    by_class: [Count; 5],
    duration: Latency,
    settles: Count,
}

impl RouteMetrics {
    /// Records one finished request, answered with `status`; `settled`: its
    /// key was held for a settle period after it.
    pub fn record(&self, outcome: Outcome, status: u16, seconds: f64, settled: bool) {
        // `by_outcome` is in `Outcome::ALL` order, which is declaration order.
        self.by_outcome[outcome as usize].inc();
        // A status is 100..=999 (http's StatusCode): past 5xx counts as 5xx.
        self.by_class[usize::from(status / 100).clamp(1, 5) - 1].inc();
        self.duration.observe(seconds);
        if settled {
            self.settles.inc();
        }
    }

    /// Counters registered nowhere: a route's until it is put in service.
    pub fn detached() -> Arc<RouteMetrics> {
        Arc::new(RouteMetrics {
            by_outcome: Outcome::ALL.iter().map(|_| Count::default()).collect(),
            by_class: Default::default(),
            duration: Latency::default(),
            settles: Count::default(),
        })
    }
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMetrics").finish_non_exhaustive()
    }
}

/// The series of every route, by name.
struct RouteFamilies {
    requests: Family<RequestLabels, Count>,
    responses: Family<ResponseLabels, Count>,
    duration: Family<RouteLabel, Latency>,
    settles: Family<RouteLabel, Count>,
}

impl RouteFamilies {
    fn route(&self, name: &str) -> Arc<RouteMetrics> {
        let label = RouteLabel { route: name.to_string() };
        Arc::new(RouteMetrics {
            by_outcome: Outcome::ALL
                .iter()
                .map(|o| self.requests.get_or_create(&RequestLabels { route: name.to_string(), outcome: *o }).clone())
                .collect(),
            by_class: STATUS_CLASSES.map(|status_class| {
                self.responses.get_or_create(&ResponseLabels { route: name.to_string(), status_class }).clone()
            }),
            duration: self.duration.get_or_create(&label).clone(),
            settles: self.settles.get_or_create(&label).clone(),
        })
    }
}

/// Every metric fencegate exports.
pub struct Metrics {
    registry: Registry,
    families: RouteFamilies,
    /// Requests that matched no route.
    no_route: Arc<RouteMetrics>,
    store_writable: Gauge<i64, AtomicI64>,
    tracked_keys: Gauge<i64, AtomicI64>,
    active_keys: Gauge<i64, AtomicI64>,
    waiting: Gauge<i64, AtomicI64>,
    cached_keys: Gauge<i64, AtomicI64>,
    buffered_bytes: Gauge<i64, AtomicI64>,
    resting: Gauge<i64, AtomicI64>,
    held_back: HeldBack,
    tls_handshake_failures: Counter,
    reloads: Reloads,
    tls_reloads: TlsReloads,
    connections: Family<ListenerLabel, Gauge<i64, AtomicI64>>,
    certificates: CertificateExpiry,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhatLabel {
    what: String,
}

/// `fencegate_log_dropped_total`, read from the log writer at each scrape.
#[derive(Debug)]
struct DroppedLines;

impl prometheus_client::encoding::EncodeMetric for DroppedLines {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&crate::telemetry::dropped_lines(), None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Counter
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Gauge values read at scrape time.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    /// Whether the fence store takes fenced writes now (`fencegate_store_writable`).
    pub store_writable: bool,
    pub tracked_keys: usize,
    pub cached_keys: usize,
    pub active_keys: usize,
    pub waiting: i64,
    /// Bytes of fenced request bodies held in memory now.
    pub buffered_bytes: u64,
}

impl Metrics {
    /// Metrics with the series of routes named `route_names` (more come with
    /// [`route`](Self::route)). `store` adds the `fencegate_store_*` series of a store that commits.
    pub fn new<'a>(route_names: impl IntoIterator<Item = &'a str>, store: Option<&CommitStats>) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Count>::default();
        let responses = Family::<ResponseLabels, Count>::default();
        // 100 µs .. ~52 s (latency.rs)
        let duration = Family::<RouteLabel, Latency>::default();
        registry.register(
            "fencegate_requests",
            format!("Requests by route and outcome ({})", Outcome::ALL.map(Outcome::as_str).join(", ")),
            requests.clone(),
        );
        registry.register(
            "fencegate_responses",
            "Responses by route and status class (1xx .. 5xx), fencegate's own refusals and the upstream's answers alike",
            responses.clone(),
        );
        registry.register(
            "fencegate_request_duration_seconds",
            "Time from request head to response head, by route",
            duration.clone(),
        );
        let settles = Family::<RouteLabel, Count>::default();
        registry.register(
            "fencegate_settles",
            "Fenced writes whose outcome was unknown (upstream timeout or connection lost after sending), after which the key was held for the route's settle period",
            settles.clone(),
        );
        let families = RouteFamilies { requests, responses, duration, settles };
        // Every configured route's series exist from the start, at zero.
        for name in route_names {
            families.route(name);
        }
        let no_route = families.route(NO_ROUTE_LABEL);
        let store_writable = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "fencegate_store_writable",
            "1 while the fence store takes fenced writes; 0 while it refuses them (unreachable, distrusted, \
             holding writes after a confirmation, or its last commit failed): fenced writes get 503, reads are \
             served and /readyz stays 200 (/readyz?verbose says why)",
            store_writable.clone(),
        );
        let tracked_keys = Gauge::<i64, AtomicI64>::default();
        let active_keys = Gauge::<i64, AtomicI64>::default();
        let waiting = Gauge::<i64, AtomicI64>::default();
        let cached_keys = Gauge::<i64, AtomicI64>::default();
        registry.register("fencegate_tracked_keys", "Keys with a fence mark in the store", tracked_keys.clone());
        registry.register(
            "fencegate_active_keys",
            "Keys with a fenced request in flight or waiting (each has a queue)",
            active_keys.clone(),
        );
        registry.register(
            "fencegate_waiting_requests",
            "Fenced requests waiting for their key's turn",
            waiting.clone(),
        );
        registry.register("fencegate_cached_keys", "Fence marks held in memory", cached_keys.clone());
        let buffered_bytes = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "fencegate_buffered_bytes",
            "Bytes of fenced request bodies held in memory now, over every connection (server.max_buffered_bytes bounds it)",
            buffered_bytes.clone(),
        );
        let held_back = Family::<WhatLabel, Counter>::default();
        registry.register(
            "fencegate_abuse",
            "Connections closed for abuse (what=strike: a run of refusals, or HTTP/2 GOAWAY for resets or refused streams), and new connections of the addresses struck, held back before being served (what=held)",
            held_back.clone(),
        );
        // One statement each: the guard get_or_create returns lives to the
        // end of its statement, and a second call in the same one would wait
        // for it forever.
        let counter = |what: &str| held_back.get_or_create(&WhatLabel { what: what.into() }).clone();
        let held = counter("held");
        let strikes = counter("strike");
        let held_back = HeldBack { held, strikes };
        let resting = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "fencegate_resting_connections",
            "Idle HTTP/1.1 client connections resting: holding their socket and no buffers",
            resting.clone(),
        );
        let reloads = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "fencegate_config_reloads",
            "Config reloads (SIGHUP or a change of the file) by outcome: applied, invalid (the running config \
             keeps serving), restart_needed (a section other than the routes changed; nothing applied)",
            reloads.clone(),
        );
        let reload = |outcome: &str| reloads.get_or_create(&OutcomeLabel { outcome: outcome.into() }).clone();
        let applied = reload("applied");
        let invalid = reload("invalid");
        let restart_needed = reload("restart_needed");
        let reloads = Reloads { applied, invalid, restart_needed };
        let tls_reloads = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "fencegate_tls_reloads",
            "TLS certificate, key and client CA files read again after they changed: applied (new connections use \
             them) or refused (they do not load; the last good ones keep serving)",
            tls_reloads.clone(),
        );
        let tls_reload = |outcome: &str| tls_reloads.get_or_create(&OutcomeLabel { outcome: outcome.into() }).clone();
        let applied = tls_reload("applied");
        let refused = tls_reload("refused");
        let certificates = CertificateExpiry::register(&mut registry);
        let tls_reloads = TlsReloads { applied, refused, certificates: certificates.clone() };
        let build_info = Family::<BuildLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "fencegate_build_info",
            "Always 1: the version of fencegate running, and the CPU architecture and OS it was built for",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                arch: std::env::consts::ARCH,
                os: std::env::consts::OS,
            })
            .set(1);
        let connections = Family::<ListenerLabel, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "fencegate_open_connections",
            "Client connections open now, by listener (proxy, admin): from accept to close, TLS handshakes and \
             connections held back included",
            connections.clone(),
        );
        for listener in ["proxy", "admin"] {
            // At zero from the start, so a dashboard shows the listener before its first connection.
            let _ = connections.get_or_create(&ListenerLabel { listener });
        }
        let tls_handshake_failures = Counter::default();
        registry.register(
            "fencegate_tls_handshake_failures",
            "TLS client connections closed before serving: the handshake failed (no or a refused client \
             certificate, no shared protocol version or cipher) or did not end within header_read_timeout",
            tls_handshake_failures.clone(),
        );
        registry.register(
            "fencegate_log_dropped",
            "Log lines dropped because the log writer's queue was full (stdout slower than the lines; process-wide)",
            DroppedLines,
        );
        registry.register(
            "fencegate_log_suppressed",
            "Warning and error lines dropped by the per-call-site log rate limit (process-wide)",
            crate::telemetry::suppressed_counter(),
        );
        if let Some(stats) = store {
            let counters = [
                (
                    "fencegate_store_commits",
                    "Fence store batches made durable (one journal append and fsync each)",
                    &stats.commits,
                ),
                ("fencegate_store_raises", "Marks raised on disk (more than commits: group commit)", &stats.raises),
                ("fencegate_store_commit_failures", "Fence store commits that failed", &stats.failures),
                ("fencegate_store_folds", "Fence journal files folded into the store's B-tree", &stats.folds),
                (
                    "fencegate_store_fold_failures",
                    "Folds of the fence journal that failed and were retried",
                    &stats.fold_failures,
                ),
            ];
            for (name, help, counter) in counters {
                registry.register(name, help, counter.clone());
            }
            registry.register(
                "fencegate_store_commit_duration_seconds",
                "Fence store commit latency, fsync included",
                stats.commit_seconds.clone(),
            );
            registry.register(
                "fencegate_store_disk_bytes",
                "Bytes the fence store takes on disk (B-tree file and journal files), read at each scrape",
                stats.disk_bytes.clone(),
            );
        }
        Metrics {
            registry,
            families,
            no_route,
            store_writable,
            tracked_keys,
            active_keys,
            waiting,
            cached_keys,
            buffered_bytes,
            resting,
            held_back,
            tls_handshake_failures,
            reloads,
            tls_reloads,
            connections,
            certificates,
        }
    }

    /// Adds the `fencegate_store_*{store}` series of a store reached over
    /// the network (Redis, etcd): its round trips, reconnects and trust.
    pub fn with_store_calls(mut self, calls: Option<&CallStats>) -> Self {
        let Some(calls) = calls else { return self };
        let registry = self.registry.sub_registry_with_label(("store".into(), calls.store.into()));
        registry.register(
            "fencegate_store_roundtrip_seconds",
            "Time from a call to the shared fence store to its answer (Redis: with WAIT when min_replicas asks for \
             it; etcd: one member's answer), for calls answered without error",
            calls.roundtrip_seconds.clone(),
        );
        registry.register(
            "fencegate_store_reconnects",
            "Times the shared fence store answered again after calls to it had failed or timed out",
            calls.reconnects.clone(),
        );
        registry.register(
            "fencegate_store_trusted",
            "1 while this replica trusts the shared fence store; 0 from the moment it finds the store lost what it \
             acknowledged (identity lost or changed, a mark or revision gone back) until an operator confirms it",
            calls.trusted.clone(),
        );
        self
    }

    /// `fencegate_open_connections{listener}` of the listener named `listener` (`proxy`, `admin`).
    pub fn connections(&self, listener: &'static str) -> ConnectionCount {
        ConnectionCount::new(self.connections.get_or_create(&ListenerLabel { listener }).clone())
    }

    /// `fencegate_tls_certificate_expiry_timestamp_seconds`.
    pub fn certificates(&self) -> CertificateExpiry {
        self.certificates.clone()
    }

    /// `fencegate_tls_reloads_total`, kept by the TLS files' watch.
    pub fn tls_reloads(&self) -> TlsReloads {
        self.tls_reloads.clone()
    }

    /// `fencegate_config_reloads_total`, kept by the reloader.
    pub fn reloads(&self) -> Reloads {
        self.reloads.clone()
    }

    /// The counters of the route named `name`, made if new: a route put in
    /// service by a reload has series of its own from then on, and one that
    /// keeps its name keeps counting where it was.
    pub fn route(&self, name: &str) -> Arc<RouteMetrics> {
        self.families.route(name)
    }

    /// Records one finished request that matched no route, as
    /// [`RouteMetrics::record`] does a routed one.
    pub fn record_unrouted(&self, outcome: Outcome, status: u16, seconds: f64, settled: bool) {
        self.no_route.record(outcome, status, seconds, settled);
    }

    /// `fencegate_abuse_total`, kept by the proxy listener.
    pub fn held_back(&self) -> HeldBack {
        self.held_back.clone()
    }

    /// One more `fencegate_tls_handshake_failures_total`.
    pub fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.inc();
    }

    /// `fencegate_resting_connections`, kept by the connections themselves.
    pub fn resting_connections(&self) -> Gauge<i64, AtomicI64> {
        self.resting.clone()
    }

    /// The Prometheus text exposition, with gauges set from `snapshot`.
    pub fn encode(&self, snapshot: Snapshot) -> String {
        self.store_writable.set(i64::from(snapshot.store_writable));
        self.tracked_keys.set(snapshot.tracked_keys as i64);
        self.active_keys.set(snapshot.active_keys as i64);
        self.waiting.set(snapshot.waiting);
        self.cached_keys.set(snapshot.cached_keys as i64);
        self.buffered_bytes.set(i64::try_from(snapshot.buffered_bytes).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_by_route_and_outcome() {
        let m = Metrics::new(["objects", "blobs"], None);
        let (objects, blobs) = (m.route("objects"), m.route("blobs"));
        objects.record(Outcome::Stale, 409, 0.001, false);
        objects.record(Outcome::Stale, 409, 0.001, false);
        blobs.record(Outcome::Forwarded, 201, 0.002, false);
        blobs.record(Outcome::UpstreamTimeout, 504, 0.002, true);
        m.record_unrouted(Outcome::NoRoute, 404, 0.0001, false);
        // A route put in service again (a reload) counts on where it was.
        m.route("objects").record(Outcome::Stale, 409, 0.001, false);
        let proxy = m.connections("proxy");
        let (_one, two) = (proxy.opened(), proxy.opened());
        drop(two);
        let text = m.encode(Snapshot {
            store_writable: false,
            tracked_keys: 3,
            cached_keys: 3,
            active_keys: 1,
            waiting: 2,
            buffered_bytes: 5,
        });
        assert!(text.contains(r#"fencegate_requests_total{route="objects",outcome="stale"} 3"#), "{text}");
        assert!(text.contains(r#"fencegate_requests_total{route="blobs",outcome="forwarded"} 1"#), "{text}");
        assert!(text.contains(r#"fencegate_requests_total{route="none",outcome="no_route"} 1"#), "{text}");
        assert!(text.contains("fencegate_tracked_keys 3"), "{text}");
        assert!(text.contains("fencegate_store_writable 0"), "{text}");
        assert!(text.contains(r#"fencegate_settles_total{route="blobs"} 1"#), "{text}");
        assert!(text.contains("fencegate_waiting_requests 2"), "{text}");
        assert!(text.contains("fencegate_buffered_bytes 5"), "{text}");
        assert!(text.contains(r#"fencegate_request_duration_seconds_count{route="objects"} 3"#), "{text}");
        assert!(text.contains(r#"fencegate_responses_total{route="objects",status_class="4xx"} 3"#), "{text}");
        assert!(text.contains(r#"fencegate_responses_total{route="blobs",status_class="5xx"} 1"#), "{text}");
        assert!(text.contains(r#"fencegate_responses_total{route="none",status_class="4xx"} 1"#), "{text}");
        assert!(text.contains(r#"fencegate_open_connections{listener="proxy"} 1"#), "{text}");
        assert!(text.contains(r#"fencegate_open_connections{listener="admin"} 0"#), "{text}");
        let version = env!("CARGO_PKG_VERSION");
        assert!(text.contains(&format!(r#"fencegate_build_info{{version="{version}","#)), "{text}");
    }

    #[test]
    fn a_shared_store_shows_its_calls_under_its_name_and_certificates_follow_what_is_served() {
        let calls = CallStats::new("etcd");
        calls.answered(std::time::Duration::from_millis(3));
        calls.trusts(false);
        let m = Metrics::new(["objects"], None).with_store_calls(Some(&calls));
        m.tls_reloads().served_certificates(Some(1_900_000_000), None);
        let text = m.encode(Snapshot {
            store_writable: true,
            tracked_keys: 0,
            cached_keys: 0,
            active_keys: 0,
            waiting: 0,
            buffered_bytes: 0,
        });
        assert!(text.contains(r#"fencegate_store_roundtrip_seconds_count{store="etcd"} 1"#), "{text}");
        assert!(text.contains(r#"fencegate_store_trusted{store="etcd"} 0"#), "{text}");
        assert!(text.contains(r#"fencegate_store_reconnects_total{store="etcd"} 0"#), "{text}");
        let served = r#"fencegate_tls_certificate_expiry_timestamp_seconds{certificate="served",route=""} 1900000000"#;
        assert!(text.contains(served), "{text}");
        assert!(!text.contains(r#"certificate="client_ca""#), "no client CA, no series: {text}");
    }
}
