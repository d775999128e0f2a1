//! The proxy's tower stack, top to bottom, and the small layers that only make
//! sense inside it (routing, access log).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_http::trace::{MakeSpan, OnResponse, TraceLayer};
use tracing::Span;

use crate::connection::{Activity, TrackRequestsLayer};
use crate::error::{Decision, Outcome, ProxyBody, ProxyError, Rejection};
use crate::fence::store::AnyStore;
use crate::fence::{FencingLayer, KeyGate};
use crate::limits::{limit_body, RequestBody};
use crate::metrics::Metrics;
use crate::proxy::Forward;
use crate::route::{Route, RouteTable, Routed};

/// What every connection's stack shares.
#[derive(Debug)]
pub struct Shared {
    pub routes: RouteTable,
    pub store: Arc<AnyStore>,
    pub gate: Arc<KeyGate>,
    pub metrics: Arc<Metrics>,
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
        // Outermost, so the access log and metrics see every response, including
        // the ones fencegate makes itself below.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(RequestSpan)
                .on_request(())
                .on_response(AccessLog { metrics: shared.metrics.clone() })
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        // Routing comes before the fence: the route says which methods are fenced,
        // how the key is made and where the request goes. It answers 404 itself,
        // applies the route's body limit, and turns every rejection below into a
        // problem+json response, so no error escapes to hyper as a connection reset.
        .layer(RoutingLayer { routes: Arc::new(shared.routes.clone()) })
        // The fence decides before anything reaches the upstream, and holds the
        // key's turn until the upstream's response head is back.
        .layer(FencingLayer::new(shared.store.clone(), shared.gate.clone()))
        .service(forward.clone())
}

/// Which route a response belongs to: its index in config order and its name.
#[derive(Debug, Clone)]
pub struct RouteTag {
    pub index: usize,
    pub name: Arc<str>,
}

#[derive(Clone)]
struct RoutingLayer {
    routes: Arc<RouteTable>,
}

impl<S> tower::Layer<S> for RoutingLayer {
    type Service = Routing<S>;

    fn layer(&self, inner: S) -> Routing<S> {
        Routing { inner, routes: self.routes.clone() }
    }
}

/// Finds the request's route (longest prefix) and hands the request on with it
/// ([`Routed`]), or answers 404 when there is none. Then the route's body limit
/// (see [`crate::limits`]): it comes before the fence, so a fenced chunked
/// upload is read whole (up to `max_body`) before it may take its key's turn,
/// and a slow or oversized upload never holds the key or reaches the upstream
/// in part. It also rescues: every [`Rejection`] from the layers below becomes
/// its problem+json response here, and it drives the inner service to
/// readiness inside the response future, so a readiness error is answered like
/// any other instead of closing the connection. (One layer for all three: one
/// boxed future per request.)
#[derive(Clone)]
struct Routing<S> {
    inner: S,
    routes: Arc<RouteTable>,
}

impl<S> Service<Request<Incoming>> for Routing<S>
where
    S: Service<Routed<RequestBody>, Response = Response<ProxyBody>, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let Some((index, route)) = self.routes.find_indexed(req.uri().path()) else {
            let path = req.uri().path().to_string();
            return Box::pin(async move { Ok(Rejection::from(ProxyError::NoRoute { path }).into_response()) });
        };
        let route: Arc<Route> = route.clone();
        let tag = RouteTag { index, name: route.name.clone() };
        let inner = self.inner.clone();
        Box::pin(async move {
            let response = match limit_body(&route, req).await {
                Ok(request) => inner.oneshot(Routed { route, request }).await,
                Err(e) => Err(e.into()),
            };
            let mut response = response.unwrap_or_else(Rejection::into_response);
            response.extensions_mut().insert(tag);
            Ok(response)
        })
    }
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
