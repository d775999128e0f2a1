//! The access log's layer: a debug span per request, and [`AccessLog`]
//! called once per response.

use std::sync::Arc;

use http::Request;
use tower::Layer;
use tracing::Span;

use super::service::AccessLogService;
use super::AccessLog;
use crate::metrics::Metrics;
use crate::proxy::ClientAddr;
use crate::telemetry::traces::REQUEST_TARGET;

/// The layer that writes the access log: a debug span per request, and a
/// line per response once its body is done.
#[derive(Clone)]
pub struct AccessLogLayer {
    log: AccessLog,
}

/// The access-log layer of the connection of `client`, counting into `metrics`.
pub fn access_log(metrics: Arc<Metrics>, client: ClientAddr) -> AccessLogLayer {
    AccessLogLayer { log: AccessLog::new(metrics, client) }
}

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLogService<S>;

    fn layer(&self, inner: S) -> AccessLogService<S> {
        AccessLogService::new(inner, self.log.clone())
    }
}

/// A debug-level span per request: free when debug logging and traces are
/// off. Its last four fields are recorded once the response is decided.
pub(super) fn request_span<B>(req: &Request<B>) -> Span {
    use tracing::field::Empty;
    tracing::debug_span!(
        target: REQUEST_TARGET,
        "request",
        method = %req.method(),
        path = %req.uri().path(),
        decision = Empty,
        route = Empty,
        key = Empty,
        token = Empty,
    )
}
