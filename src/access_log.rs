//! The access log: one `fencegate::access` event and one metrics update per
//! response, with the decision the layers below recorded in its extensions.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;

use crate::metrics::{Metrics, NO_ROUTE_LABEL};
use crate::outcome::{Decision, Outcome};

/// The trace layer that writes the access log: a debug span per request, and
/// an event per response (nothing per body chunk).
pub type AccessLogLayer = TraceLayer<SharedClassifier<ServerErrorsAsFailures>, RequestSpan, (), AccessLog, (), (), ()>;

/// The access-log layer, counting into `metrics`.
pub fn access_log(metrics: Arc<Metrics>) -> AccessLogLayer {
    TraceLayer::new_for_http()
        .make_span_with(RequestSpan)
        .on_request(())
        .on_response(AccessLog { metrics })
        .on_body_chunk(())
        .on_eos(())
        .on_failure(())
}

/// A debug-level span per request: free when debug logging is off.
#[derive(Clone, Copy)]
pub struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, req: &Request<B>) -> Span {
        tracing::debug_span!("request", method = %req.method(), path = %req.uri().path())
    }
}

/// One access-log event and one metrics update per request.
#[derive(Clone)]
pub struct AccessLog {
    metrics: Arc<Metrics>,
}

impl<B> OnResponse<B> for AccessLog {
    fn on_response(self, response: &Response<B>, latency: Duration, _span: &Span) {
        let decision = response.extensions().get::<Decision>();
        let route = decision.and_then(|d| d.route.as_ref());
        let outcome = decision.map(|d| d.outcome).unwrap_or(Outcome::Internal);
        let settled = decision.is_some_and(|d| d.settled);
        self.metrics.record(route.map(|r| r.index), outcome, latency.as_secs_f64(), settled);
        tracing::info!(
            target: "fencegate::access",
            route = route.map(|r| &*r.name).unwrap_or(NO_ROUTE_LABEL),
            key = decision.and_then(|d| d.key.as_deref()),
            token = decision.and_then(|d| d.token),
            decision = outcome.as_str(),
            status = response.status().as_u16(),
            latency_us = latency.as_micros() as u64,
        );
    }
}
