//! What the access log does once per response: count it, and write its line.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Response;
use tracing::Span;

use super::line::Line;
use crate::http::Outcome;
use crate::http::ProxyBody;
use crate::metrics::{Metrics, NO_ROUTE_LABEL};
use crate::telemetry::access_sink;

/// One access-log event and one metrics update per request.
#[derive(Clone)]
pub struct AccessLog {
    metrics: Arc<Metrics>,
}

impl AccessLog {
    pub(super) fn new(metrics: Arc<Metrics>) -> Self {
        AccessLog { metrics }
    }

    /// Counts `response`, answered `latency` after its request was handed
    /// over, and writes its line (in `span`, the request's).
    pub(super) fn on_response(&self, response: &Response<ProxyBody>, latency: Duration, span: &Span) {
        let decision = response.body().decision();
        let route = decision.and_then(|d| d.route.as_ref());
        let outcome = decision.map(|d| d.outcome).unwrap_or(Outcome::Internal);
        let settled = decision.is_some_and(|d| d.settled);
        match route {
            Some(route) => route.0.record(outcome, latency.as_secs_f64(), settled),
            None => self.metrics.record_unrouted(outcome, latency.as_secs_f64(), settled),
        }
        let line = Line {
            route: route.map(|r| r.0.name()).unwrap_or(NO_ROUTE_LABEL),
            key: decision.and_then(|d| d.key.as_deref()),
            token: decision.and_then(|d| d.token),
            decision: outcome.as_str(),
            status: response.status().as_u16(),
            latency_us: latency.as_micros() as u64,
        };
        match access_sink() {
            Some(sink) if span.is_disabled() => {
                if tracing::enabled!(target: "fencegate::access", tracing::Level::INFO) {
                    sink.writer.line(false, |out| line.write(sink.format, SystemTime::now(), out));
                }
            }
            _ => line.event(),
        }
    }
}
