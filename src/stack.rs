//! The proxy's tower stack, top to bottom, and the access log it writes.
//!
//! Data flows one way, one concern per layer, in the order a request meets
//! them: requests in flight → trace and access log → panic rescue → rescue →
//! canonicalize + route → head checks → body → the key's turn + advance →
//! forward.

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::{Layer, Service, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;

use crate::body::{BodyLayer, BufferBudget};
use crate::error::{Decision, Outcome, ProxyBody, ProxyError, Rejection};
use crate::fence::store::AnyStore;
use crate::fence::{FencingLayer, HeadChecksLayer, KeyGate};
use crate::metrics::Metrics;
use crate::proxy::Forward;
use crate::route::{RouteTable, RouteTag};
use crate::routing::RoutingLayer;
use crate::server::connection::{Activity, TrackRequestsLayer};

/// What every connection's stack shares.
#[derive(Debug)]
pub struct Shared {
    pub routes: Arc<RouteTable>,
    pub store: Arc<AnyStore>,
    pub gate: Arc<KeyGate>,
    pub metrics: Arc<Metrics>,
    /// The budget for fenced bodies read whole before forwarding.
    pub buffers: Arc<BufferBudget>,
}

/// The stack for one client connection, forwarding through `forward` (its own
/// upstream connections, which know the client's address).
pub fn proxy_service(
    shared: &Shared,
    forward: &Forward,
    activity: Arc<Activity>,
) -> impl Service<
    Request<Incoming>,
    Response = Response<
        impl hyper::body::Body<Data = bytes::Bytes, Error = impl Into<Box<dyn std::error::Error + Send + Sync>>>
            + Send
            + 'static,
    >,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    ServiceBuilder::new()
        // Per connection: requests in flight, so the idle and slow-head guards
        // never close a connection that is serving a request.
        .layer(TrackRequestsLayer(activity))
        // Outermost but for that, so the access log and metrics see every
        // response, including the ones fencegate makes itself below.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(RequestSpan)
                .on_request(())
                .on_response(AccessLog { metrics: shared.metrics.clone() })
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        // A panic anywhere below becomes a 500 problem, never a reset
        // connection; inside the access log, so it is logged and counted.
        .layer(CatchPanicLayer::custom(panic_response))
        // Rescue: every refusal from the layers below becomes its problem+json
        // response here, so no error escapes to hyper as a connection reset.
        .layer(RescueLayer)
        // Before anything looks at the target: make it canonical, then route
        // it. Every layer below sees one spelling of each resource, and the
        // route says which methods are fenced, how the key is made and where
        // the request goes (404 without one).
        .layer(RoutingLayer::new(shared.routes.clone()))
        // Everything the head can decide, before a body byte is read: token,
        // key, signature, stale and jump checks, and no body on unfenced
        // methods. A request already condemned never makes fencegate read
        // (or buffer) its body.
        .layer(HeadChecksLayer::new(shared.store.clone()))
        // The body limit, and fenced bodies read whole (within the buffer
        // budget) before they may take their key's turn: a slow or broken
        // upload never holds a key, and never reaches the upstream in part.
        .layer(BodyLayer::new(shared.buffers.clone()))
        // The key's turn and the atomic raise, then the forward on a task of
        // its own that ends at the upstream even if the client leaves.
        .layer(FencingLayer::new(shared.store.clone(), shared.gate.clone()))
        .service(forward.clone())
}

/// Turns every [`Rejection`] into its problem+json response.
#[derive(Debug, Clone, Copy)]
struct RescueLayer;

impl<S> Layer<S> for RescueLayer {
    type Service = Rescue<S>;

    fn layer(&self, inner: S) -> Rescue<S> {
        Rescue { inner }
    }
}

/// See [`RescueLayer`].
#[derive(Debug, Clone)]
struct Rescue<S> {
    inner: S,
}

impl<S, R> Service<R> for Rescue<S>
where
    S: Service<R, Response = Response<ProxyBody>, Error = Rejection>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = RescueFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The layers below are always ready; were one not, its refusal is
        // answered with the request's response, not by closing the connection.
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: R) -> Self::Future {
        RescueFuture { inner: self.inner.call(req) }
    }
}

pin_project_lite::pin_project! {
    /// [`Rescue`]'s response future.
    struct RescueFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> Future for RescueFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Rejection>>,
{
    type Output = Result<Response<ProxyBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map(|result| Ok(result.unwrap_or_else(Rejection::into_response)))
    }
}

/// The 500 problem for a panic below the rescue layer.
fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response<ProxyBody> {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string());
    tracing::error!(panic = %what, "a request panicked");
    Rejection::from(ProxyError::Internal("the request could not be completed".into())).into_response()
}

/// A debug-level span per request: free when debug logging is off.
#[derive(Clone, Copy)]
struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, req: &Request<B>) -> Span {
        tracing::debug_span!("request", method = %req.method(), path = %req.uri().path())
    }
}

/// One access-log event and one metrics update per request.
#[derive(Clone)]
struct AccessLog {
    metrics: Arc<Metrics>,
}

impl<B> OnResponse<B> for AccessLog {
    fn on_response(self, response: &Response<B>, latency: Duration, _span: &Span) {
        let route = response.extensions().get::<RouteTag>();
        let decision = response.extensions().get::<Decision>();
        let outcome = decision.map(|d| d.outcome).unwrap_or(Outcome::Internal);
        let settled = decision.is_some_and(|d| d.settled);
        self.metrics.record(route.map(|r| r.index), outcome, latency.as_secs_f64(), settled);
        tracing::info!(
            target: "fencegate::access",
            route = route.map(|r| &*r.name).unwrap_or(crate::metrics::NO_ROUTE_LABEL),
            key = decision.and_then(|d| d.key.as_deref()),
            token = decision.and_then(|d| d.token),
            decision = outcome.as_str(),
            status = response.status().as_u16(),
            latency_us = latency.as_micros() as u64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// A panic below the rescue becomes a 500 problem with its decision, as
    /// the stack places the two layers; it never unwinds into hyper.
    #[tokio::test]
    async fn a_panic_becomes_a_500_problem() {
        let panicking = tower::service_fn(|_: Request<()>| async move {
            if true {
                panic!("a bug");
            }
            Ok::<Response<ProxyBody>, Rejection>(Response::new(ProxyBody::Right(Default::default())))
        });
        let service =
            ServiceBuilder::new().layer(CatchPanicLayer::custom(panic_response)).layer(RescueLayer).service(panicking);
        let response = service.oneshot(Request::new(())).await.unwrap();
        assert_eq!(response.status(), 500);
        assert_eq!(response.headers()["content-type"], "application/problem+json");
        assert_eq!(response.extensions().get::<Decision>().map(|d| d.outcome), Some(Outcome::Internal));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["type"], "urn:fencegate:problem:internal");
        assert_eq!(problem["status"], 500);
    }

    /// The rescue answers every refusal with its problem, never an error.
    #[tokio::test]
    async fn the_rescue_answers_refusals() {
        let refusing = tower::service_fn(|_: Request<()>| async move {
            Err::<Response<ProxyBody>, _>(Rejection::from(ProxyError::BufferFull(1)))
        });
        let response = RescueLayer.layer(refusing).oneshot(Request::new(())).await.unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
    }
}
