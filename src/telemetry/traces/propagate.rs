//! W3C trace context: the client's `traceparent`/`tracestate` continued by
//! the request span, and the upstream span's handed to the upstream in
//! their place, as a proxy does. With traces off, both headers pass
//! through untouched like any other.

use http::header::HeaderName;
use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::on;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Makes the client's trace, if its `headers` name one, the parent of
/// `span` (the request's, not entered yet).
pub fn continue_from(span: &Span, headers: &HeaderMap) {
    if !on() || span.is_disabled() || !headers.contains_key(TRACEPARENT) {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    // Fails only without the OpenTelemetry layer, which `on()` rules out.
    let _ = span.set_parent(parent);
}

/// Replaces the client's trace context in the upstream request's `headers`
/// with `span`'s (the upstream exchange's).
pub fn pass_on(span: &Span, headers: &mut HeaderMap) {
    if !on() || span.is_disabled() {
        return;
    }
    headers.remove(TRACEPARENT);
    headers.remove(TRACESTATE);
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
}
