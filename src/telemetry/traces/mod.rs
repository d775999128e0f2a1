//! Traces through the fence: OpenTelemetry spans over OTLP/HTTP
//! (`[tracing] otlp_endpoint`), off unless the config names an endpoint.
//!
//! One span per request (`request`, opened by the access log, continued
//! from the client's `traceparent`), with a child for each step that may
//! take time: `head` (routing and the checks of the head), `turn` (the wait
//! for the keys' turns), `store` (the marks read and raised) and `upstream`
//! (the exchange, whose context goes to the upstream as its `traceparent`).
//! The request span carries the decision, route, key and token.
//!
//! What it costs when off: the child spans are `info` spans of their own
//! target, [`SPAN_TARGET`], which the log's filter always turns off, so
//! each is a call site whose cached interest says "never" (a few
//! instructions); the request span is the access log's debug span, off
//! unless debug logging is on; propagation does nothing. When on, only the
//! OpenTelemetry layer sees these spans (a filter of its own): the log's
//! lines look as they did.
//!
//! Finished spans are batched on the SDK's thread and posted by a runtime
//! of their own (export.rs), so no request's thread waits on the
//! collector; [`Traces`] flushes them when dropped, at shutdown.

mod export;
mod propagate;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::{Level, Span, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::config::TracingConfig;
use export::{ExportClient, ExportRuntime};
pub use propagate::{continue_from, pass_on};

/// The target of the child spans: the log's filter turns it off, the
/// OpenTelemetry layer's lets it through.
pub const SPAN_TARGET: &str = "fencegate::otel";

/// The target of the request span (the access log's, at debug level).
pub const REQUEST_TARGET: &str = "fencegate::request";

/// How long one post of spans to the collector may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the flush at shutdown may take.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the OpenTelemetry layer is installed: propagation reads it.
static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are on in this process.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The span of the checks made from the request's head, routing included.
#[inline]
pub fn head_span() -> Span {
    tracing::info_span!(target: SPAN_TARGET, "head")
}

/// The span of the wait for the request's keys' turns.
#[inline]
pub fn turn_span() -> Span {
    tracing::info_span!(target: SPAN_TARGET, "turn")
}

/// The span of the fence store's reads and raises of the request's marks.
#[inline]
pub fn store_span() -> Span {
    tracing::info_span!(target: SPAN_TARGET, "store")
}

/// The span of the exchange with the upstream, up to its response head.
#[inline]
pub fn upstream_span() -> Span {
    tracing::info_span!(target: SPAN_TARGET, "upstream", otel.kind = "client")
}

/// Records what the fence decided on the request's span (on a disabled
/// span, recording does nothing: the caller looks first, so as not to work
/// out the fields).
pub fn record_decision(span: &Span, decision: &str, route: &str, key: Option<&str>, token: Option<u64>) {
    span.record("decision", decision);
    span.record("route", route);
    if let Some(key) = key {
        span.record("key", key);
    }
    if let Some(token) = token {
        span.record("token", token);
    }
}

/// The exporter of a process whose traces are on; dropping it sends the
/// spans still batched (within [`SHUTDOWN_TIMEOUT`]).
pub struct Traces {
    provider: SdkTracerProvider,
    /// Dropped after the provider's flush, which posts through it.
    _runtime: ExportRuntime,
}

impl Drop for Traces {
    fn drop(&mut self) {
        ON.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(error = %e, "cannot send the last spans to the OTLP endpoint");
        }
    }
}

/// Why traces could not be started.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error("cannot start the OTLP exporter's runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The OpenTelemetry layer for `config`, filtered to fencegate's spans, and
/// what keeps its exporter; `None` when traces are off.
pub fn layer<S>(config: &TracingConfig) -> Result<Option<(impl Layer<S>, Traces)>, TracesError>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(endpoint) = &config.otlp_endpoint else { return Ok(None) };
    let runtime = ExportRuntime::start()?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(ExportClient::new(&runtime, EXPORT_TIMEOUT))
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint.to_string())
        .with_timeout(EXPORT_TIMEOUT)
        .build()?;
    let resource = Resource::builder_empty()
        .with_service_name(config.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    // A client's traceparent decides for its trace; others are kept at the ratio.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("fencegate");
    let filter = Targets::new().with_target(SPAN_TARGET, Level::INFO).with_target(REQUEST_TARGET, Level::DEBUG);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(filter);
    ON.store(true, Ordering::Relaxed);
    Ok(Some((layer, Traces { provider, _runtime: runtime })))
}
