//! What the access log does once per response: count it when its head
//! comes, and write its line when its body is done.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::HeaderValue;
use http::{Method, Response, Version};
use tracing::Span;

use super::line::Line;
use crate::http::Outcome;
use crate::http::ProxyBody;
use crate::metrics::{Metrics, NO_ROUTE_LABEL};
use crate::proxy::ClientAddr;
use crate::telemetry::{access_sink, ACCESS_TARGET};

/// One access-log line and one metrics update per request, of one client
/// connection's.
#[derive(Clone)]
pub struct AccessLog(Arc<Logged>);

struct Logged {
    metrics: Arc<Metrics>,
    client: ClientAddr,
    /// The request body bytes read on this connection, over HTTP/1.1: one
    /// request at a time, so its requests share one count (no allocation
    /// per request), each logging what it added.
    read: Arc<AtomicU64>,
}

/// What the line of a request needs from its start.
pub(super) struct Started {
    pub log: AccessLog,
    pub method: Method,
    pub id: HeaderValue,
    /// The client a trusted proxy named for the request, if the connection
    /// is one's.
    pub behind: Option<IpAddr>,
    /// The count the request's body adds its bytes to (the connection's
    /// when `None`), and where it stood when the request came.
    pub read: Option<Arc<AtomicU64>>,
    pub read_before: u64,
}

/// What the line of a request needs once its response head has come.
pub(super) struct Answered {
    pub started: Started,
    pub status: u16,
    /// The response is the upstream's, not one fencegate made.
    pub upstream: bool,
    pub latency_us: u64,
}

impl AccessLog {
    pub(super) fn new(metrics: Arc<Metrics>, client: ClientAddr) -> Self {
        AccessLog(Arc::new(Logged { metrics, client, read: Arc::default() }))
    }

    /// The connection's client.
    pub(super) fn client(&self) -> &ClientAddr {
        &self.0.client
    }

    /// The count a request of `version` adds its body's bytes to, and its
    /// own if it is not the connection's: the connection's over HTTP/1.1,
    /// its own over HTTP/2 (streams run at once).
    pub(super) fn read_count(&self, version: Version) -> (Arc<AtomicU64>, Option<Arc<AtomicU64>>) {
        match version {
            Version::HTTP_2 | Version::HTTP_3 => {
                let own = Arc::<AtomicU64>::default();
                (own.clone(), Some(own))
            }
            _ => (self.0.read.clone(), None),
        }
    }

    /// Counts `response`, answered `latency` after its request was handed
    /// over.
    pub(super) fn on_response(&self, response: &Response<ProxyBody>, latency: Duration) {
        let decision = response.body().decision();
        let outcome = decision.map(|d| d.outcome).unwrap_or(Outcome::Internal);
        let settled = decision.is_some_and(|d| d.settled);
        let status = response.status().as_u16();
        match decision.and_then(|d| d.route.as_ref()) {
            Some(route) => route.0.record(outcome, status, latency.as_secs_f64(), settled),
            None => self.0.metrics.record_unrouted(outcome, status, latency.as_secs_f64(), settled),
        }
    }
}

impl Answered {
    /// Writes the line of a request whose response `body` has ended (or was
    /// dropped) after `sent` bytes, in `span`, the request's.
    pub(super) fn write(&self, body: &ProxyBody, sent: u64, span: &Span) {
        let Answered { started, status, upstream, latency_us } = self;
        let decision = body.decision();
        let route = decision.and_then(|d| d.route.as_ref());
        let outcome = decision.map(|d| d.outcome).unwrap_or(Outcome::Internal);
        let read = started.read.as_ref().unwrap_or(&started.log.0.read);
        // Formatted here only behind a trusted proxy: the connection's own
        // address was formatted once, when it was accepted.
        let behind_text = started.behind.map(|ip| ip.to_string());
        let line = Line {
            route: route.map(|r| r.0.name()).unwrap_or(NO_ROUTE_LABEL),
            method: started.method.as_str(),
            client: match &behind_text {
                Some(text) => text,
                None => started.log.0.client.ip_text(),
            },
            key: decision.and_then(|d| d.key.as_deref()),
            token: decision.and_then(|d| d.token),
            decision: outcome.as_str(),
            status: *status,
            upstream_status: upstream.then_some(*status),
            bytes_in: read.load(Ordering::Relaxed).wrapping_sub(started.read_before),
            bytes_out: sent,
            latency_us: *latency_us,
            request_id: started.id.to_str().unwrap_or_default(),
        };
        match access_sink() {
            Some(sink) if span.is_disabled() => {
                if lines_enabled() {
                    sink.writer.line(false, |out| line.write(sink.format, SystemTime::now(), out));
                }
            }
            _ => {
                let _entered = span.enter();
                line.event();
            }
        }
    }
}

/// Whether the filter lets the access log's lines through: decided as
/// `tracing::info!` decides for its own event, from its call site's cached
/// interest, the subscriber asked only when that is "sometimes".
/// (`tracing::enabled!` asks the subscriber every time.)
fn lines_enabled() -> bool {
    use tracing::callsite::{Callsite, DefaultCallsite};
    static CALLSITE: DefaultCallsite = DefaultCallsite::new(&META);
    static META: tracing::Metadata<'static> = tracing::metadata! {
        name: "access line",
        target: ACCESS_TARGET,
        level: tracing::Level::INFO,
        fields: &[],
        callsite: &CALLSITE,
        kind: tracing::metadata::Kind::HINT,
    };
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return false;
    }
    let interest = CALLSITE.interest();
    !interest.is_never()
        && (interest.is_always() || tracing::dispatcher::get_default(|current| current.enabled(CALLSITE.metadata())))
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::EnvFilter;

    use super::*;

    /// What the filter says of `fencegate::access` at info, as
    /// `tracing::enabled!` says it.
    #[test]
    fn lines_are_enabled_as_the_filter_says() {
        for (directives, expected) in
            [("info", true), ("info,fencegate::access=off", false), ("warn", false), ("off,fencegate=info", true)]
        {
            let subscriber = tracing_subscriber::registry().with(EnvFilter::new(directives));
            tracing::subscriber::with_default(subscriber, || {
                let theirs = tracing::enabled!(target: "fencegate::access", tracing::Level::INFO);
                assert_eq!(theirs, expected, "{directives}");
                assert_eq!(lines_enabled(), expected, "{directives}");
            });
        }
    }
}
