//! The request's way through the fence, below the access log and the rescue:
//! one service whose `call` runs the steps that need only the head as plain
//! functions, one after another, and one future for what must wait (a mark
//! read from the store, the body, the key's turn, the upstream).
//!
//! The steps, in the order a request meets them (each in its own folder, with
//! its tests; what they guarantee together is written down once, in
//! `docs/behaviour.md`, "The guarantee, step by step"):
//!
//! 1. `header_count`: a head with more fields than allowed gets 431 before
//!    anything else looks at it (an HTTP/2 head may decode to many more
//!    fields than its frames suggest).
//! 2. `router`: the target made canonical, then routed: every step after it
//!    sees one spelling of each resource, and the route says which methods
//!    are fenced, how the key is made and where the request goes (404
//!    without one).
//! 3. `header_rate`: the bytes of heads the connection may send upstream a
//!    second. After routing, so the refusal is counted under its route, and
//!    before the head checks, so a refused request reads and raises no mark.
//! 4. `head`: everything the head can decide (token, key, signature, stale
//!    and jump checks, no body on unfenced methods), before a body byte is
//!    read: a request already condemned never makes fencegate read its body.
//! 5. `body`: the body limit, and fenced bodies read whole (within the buffer
//!    budget) before they may take their key's turn.
//! 6. `turn`: the key's turn and the atomic raise, then `forward`, which ends
//!    at the upstream even if the client leaves (on a task of its own then).
//!
//! Why one service and not a tower layer per step: each layer took the
//! request by value, handed it on and wrapped the next one's future, and
//! measured under callgrind, those moves and polls cost more than several
//! of the checks themselves (docs/perf-log.md). Every response and refusal
//! from step 3 on is tagged with the request's route.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Sleep;
use tower::Service;

use super::body::{plan, Budgets, Plan};
use super::error::Rejection;
use super::forward::Forwarder;
use super::head::{check_head, check_marks, marks_at_hand};
use super::header_rate::HeaderRate;
use super::router::route_request;
use super::turn::{self, ResponseFuture};
use super::{header_count, ConnectionLimits};
use crate::fence::store::FenceStore;
use crate::fence::KeyGate;
use crate::http::{BufferBudget, ClientBody, ProxyBody, RequestBody, RouteTag};
use crate::route::LiveRoutes;
use crate::telemetry::traces;

/// The fence for one client connection, forwarding through `F`.
#[derive(Debug)]
pub(crate) struct Pipeline<F, St> {
    forward: F,
    connection: Arc<Connection<St>>,
}

/// What a connection's requests share: the process's routes, store and gate,
/// and the connection's own bounds.
#[derive(Debug)]
struct Connection<St> {
    routes: Arc<LiveRoutes>,
    store: Arc<St>,
    gate: Arc<KeyGate>,
    /// The client speaks TLS: a target without a scheme is `https`.
    over_tls: bool,
    max_headers: usize,
    header_rate: HeaderRate,
    budgets: Budgets,
}

impl<F: Clone, St> Clone for Pipeline<F, St> {
    fn clone(&self) -> Self {
        Pipeline { forward: self.forward.clone(), connection: self.connection.clone() }
    }
}

/// Where a fence's shared parts come from.
pub(crate) struct Fences<St> {
    pub routes: Arc<LiveRoutes>,
    pub store: Arc<St>,
    pub gate: Arc<KeyGate>,
    pub buffers: Arc<BufferBudget>,
}

impl<F, St> Pipeline<F, St> {
    /// The fence of one client connection (over TLS or not), with its own
    /// header-rate bucket and share of the buffer budget from `limits`.
    pub(crate) fn new(forward: F, fences: Fences<St>, limits: &ConnectionLimits, over_tls: bool) -> Self {
        let Fences { routes, store, gate, buffers } = fences;
        let connection = Connection {
            routes,
            store,
            gate,
            over_tls,
            max_headers: limits.max_headers,
            header_rate: HeaderRate::new(limits.header_rate, limits.header_start),
            budgets: Budgets::new(buffers, limits.buffer_share),
        };
        Pipeline { forward, connection: Arc::new(connection) }
    }
}

impl<F, St> Service<Request<ClientBody>> for Pipeline<F, St>
where
    F: Forwarder<RequestBody>,
    St: FenceStore,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = PipelineFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ClientBody>) -> PipelineFuture {
        let connection = &*self.connection;
        // Routing and the head's checks, up to the future (traces).
        let head = traces::head_span();
        let _head = head.enter();
        if let Err(e) = header_count::check(request.headers(), connection.max_headers) {
            return PipelineFuture::refused(e.into(), None);
        }
        let (routed, tag) = match route_request(&connection.routes.load(), request, connection.over_tls) {
            Ok(routed) => routed,
            Err((error, tag)) => {
                let mut rejection = Rejection::from(error);
                rejection.route = tag;
                return PipelineFuture::refused(rejection, None);
            }
        };
        let tag = Some(tag);
        if let Err((error, wait)) = connection.header_rate.spend(&routed.request) {
            return PipelineFuture::refused(on_route(error.into(), &tag), Some(wait));
        }
        let mut checked = match check_head(routed) {
            Ok(checked) => checked,
            Err(rejection) => return PipelineFuture::refused(on_route(rejection, &tag), None),
        };
        let version = checked.routed.request.version();
        let inner = match marks_at_hand(&*connection.store, checked.fence.as_mut(), &checked.routed.route) {
            Some(Err(rejection)) => return PipelineFuture::refused(on_route(rejection, &tag), None),
            Some(Ok(())) => match plan(checked, &connection.budgets) {
                Err(rejection) => return PipelineFuture::refused(on_route(rejection, &tag), None),
                Ok(Plan::Ready(checked)) => turn::fenced(self.forward.clone(), self.store(), self.gate(), checked),
                // A body to read whole: read in the fence's own future, which
                // is boxed, so the one every layer above moves stays small.
                Ok(reading) => {
                    turn::fenced_after(self.forward.clone(), self.store(), self.gate(), version, reading.ready())
                }
            },
            // A mark to read first: the rest waits for it, in one future
            // (boxed, as the fence's future polls what it waits for in place).
            None => {
                let connection = self.connection.clone();
                let ready = Box::pin(async move {
                    // The store's read, a step of its own (traces).
                    let reading = traces::store_span();
                    check_marks(&*connection.store, checked.fence.as_ref(), &checked.routed.route).await?;
                    drop(reading);
                    plan(checked, &connection.budgets)?.ready().await
                });
                turn::fenced_after(self.forward.clone(), self.store(), self.gate(), version, ready)
            }
        };
        PipelineFuture::Deciding { inner, tag }
    }
}

impl<F, St> Pipeline<F, St> {
    fn store(&self) -> Arc<St> {
        self.connection.store.clone()
    }

    fn gate(&self) -> Arc<KeyGate> {
        self.connection.gate.clone()
    }
}

pin_project_lite::pin_project! {
    /// The response future: a refusal made from the head, or the fence's
    /// own future (boxed: it reads a fenced body, waits for the key's turn
    /// and forwards). Every answer from routing on is tagged with the
    /// request's route. Small, as every layer above moves it: the refusal
    /// is boxed too.
    #[project = PipelineProj]
    pub(crate) enum PipelineFuture {
        Refused { rejection: Option<Box<Rejection>>, after: Option<Pin<Box<Sleep>>> },
        Deciding { #[pin] inner: ResponseFuture, tag: Option<RouteTag> },
    }
}

impl PipelineFuture {
    /// Refused, the refusal held back `after` a while (the header rate's).
    fn refused(rejection: Rejection, after: Option<Duration>) -> Self {
        let after = after.map(|wait| Box::pin(tokio::time::sleep(wait)));
        PipelineFuture::Refused { rejection: Some(Box::new(rejection)), after }
    }
}

impl Future for PipelineFuture {
    type Output = Result<Response<ProxyBody>, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            PipelineProj::Refused { rejection, after } => {
                if let Some(after) = after {
                    ready!(after.as_mut().poll(cx));
                }
                Poll::Ready(Err(*rejection.take().expect("the fence's future polled after it was done")))
            }
            PipelineProj::Deciding { inner, tag } => tagged(ready!(inner.poll(cx)), tag),
        }
    }
}

/// A refusal, tagged with the request's route.
fn on_route(mut rejection: Rejection, tag: &Option<RouteTag>) -> Rejection {
    rejection.route = tag.clone();
    rejection
}

/// The answer, tagged with the request's route.
fn tagged(
    result: Result<Response<ProxyBody>, Rejection>,
    tag: &mut Option<RouteTag>,
) -> Poll<Result<Response<ProxyBody>, Rejection>> {
    let tag = tag.take();
    Poll::Ready(match result {
        Ok(mut response) => {
            if let Some(decision) = response.body_mut().decision_mut() {
                decision.route = tag;
            }
            Ok(response)
        }
        Err(mut rejection) => {
            rejection.route = tag;
            Err(rejection)
        }
    })
}

#[cfg(test)]
mod tests;
