//! What the access log does once per response: count it, and write its line.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Response;
use tracing::Span;

use super::line::Line;
use crate::http::Outcome;
use crate::http::ProxyBody;
use crate::metrics::{Metrics, NO_ROUTE_LABEL};
use crate::proxy::ClientAddr;
use crate::telemetry::{access_sink, ACCESS_TARGET};

/// One access-log event and one metrics update per request, of one client
/// connection's.
#[derive(Clone)]
pub struct AccessLog(Arc<Logged>);

struct Logged {
    metrics: Arc<Metrics>,
    client: ClientAddr,
}

impl AccessLog {
    pub(super) fn new(metrics: Arc<Metrics>, client: ClientAddr) -> Self {
        AccessLog(Arc::new(Logged { metrics, client }))
    }

    /// The connection's client.
    pub(super) fn client(&self) -> &ClientAddr {
        &self.0.client
    }

    /// Counts `response`, answered `latency` after its request was handed
    /// over, and writes its line (in `span`, the request's); `behind` is the
    /// client a trusted proxy named for it, if any.
    pub(super) fn on_response(
        &self,
        response: &Response<ProxyBody>,
        latency: Duration,
        span: &Span,
        behind: Option<IpAddr>,
    ) {
        let decision = response.body().decision();
        let route = decision.and_then(|d| d.route.as_ref());
        let outcome = decision.map(|d| d.outcome).unwrap_or(Outcome::Internal);
        let settled = decision.is_some_and(|d| d.settled);
        let status = response.status().as_u16();
        match route {
            Some(route) => route.0.record(outcome, status, latency.as_secs_f64(), settled),
            None => self.0.metrics.record_unrouted(outcome, status, latency.as_secs_f64(), settled),
        }
        // Formatted here only behind a trusted proxy: the connection's own
        // address was formatted once, when it was accepted.
        let behind_text = behind.map(|ip| ip.to_string());
        let line = Line {
            route: route.map(|r| r.0.name()).unwrap_or(NO_ROUTE_LABEL),
            key: decision.and_then(|d| d.key.as_deref()),
            token: decision.and_then(|d| d.token),
            decision: outcome.as_str(),
            status,
            latency_us: latency.as_micros() as u64,
            client: match &behind_text {
                Some(text) => text,
                None => self.0.client.ip_text(),
            },
        };
        match access_sink() {
            Some(sink) if span.is_disabled() => {
                if lines_enabled() {
                    sink.writer.line(false, |out| line.write(sink.format, SystemTime::now(), out));
                }
            }
            _ => line.event(),
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
