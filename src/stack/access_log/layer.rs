//! The access log's layer: tower-http's trace layer, configured to open a
//! debug span per request and to call [`AccessLog`] once per response.

use std::sync::Arc;

use http::Request;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{MakeSpan, TraceLayer};
use tracing::Span;

use super::AccessLog;
use crate::metrics::Metrics;

/// The trace layer that writes the access log: a debug span per request, and
/// an event per response (nothing per body chunk).
pub type AccessLogLayer = TraceLayer<SharedClassifier<ServerErrorsAsFailures>, RequestSpan, (), AccessLog, (), (), ()>;

/// The access-log layer, counting into `metrics`.
pub fn access_log(metrics: Arc<Metrics>) -> AccessLogLayer {
    TraceLayer::new_for_http()
        .make_span_with(RequestSpan)
        .on_request(())
        .on_response(AccessLog::new(metrics))
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
