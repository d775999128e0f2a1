//! The proxy's tower stack, top to bottom: this file only composes it.
//!
//! Data flows one way, one concern per layer, in the order a request meets
//! them: requests in flight (the server's) → trace and access log → rescue
//! (refusals and panics) → header count → canonicalize + route → head-byte
//! rate → head checks → body → the key's turn + advance → forward. What the
//! layers guarantee together is written down once, in `docs/behaviour.md`
//! ("The guarantee, step by step").
//!
//! Each layer has a folder in tower-http's layout: `mod.rs` says what it
//! guarantees and why it sits where it does, `layer.rs` holds the `Layer`
//! (the forward, at the bottom, is a service only), `service.rs` the
//! `Service` and its `call`, `future.rs` its own response future when it has
//! one; other files are named for their concern.
//! `error.rs` holds the refusals every layer raises.
//!
//! Layers use the types of the layers below them, and two use each other:
//! a request routed by `router` carries the `SlotTaken` flag the `forward`
//! marks once it has its way upstream, and the forward reads the routed
//! request. The flag is the one thing the forward hands back up.

pub(crate) mod access_log;
pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod forward;
pub(crate) mod head;
pub(crate) mod header_count;
pub(crate) mod header_rate;
pub(crate) mod rescue;
pub(crate) mod router;
pub(crate) mod turn;

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};
use tower::{Service, ServiceBuilder};

use crate::config::RefusalDrain;
use crate::fence::store::AnyStore;
use crate::fence::KeyGate;
use crate::http::BufferBudget;
use crate::http::ClientBody;
use crate::metrics::Metrics;
use crate::route::LiveRoutes;
use access_log::access_log;
use body::BodyLayer;
use forward::Forward;
use head::HeadChecksLayer;
use header_count::HeaderCountLayer;
use header_rate::HeaderRateLayer;
use rescue::RescueLayer;
use router::RoutingLayer;
use turn::FencingLayer;

/// What every connection's stack shares.
#[derive(Debug)]
pub struct Shared {
    /// Replaced by a config reload.
    pub routes: Arc<LiveRoutes>,
    pub store: Arc<AnyStore>,
    pub gate: Arc<KeyGate>,
    pub metrics: Arc<Metrics>,
    /// The budget for fenced bodies read whole before forwarding.
    pub buffers: Arc<BufferBudget>,
    /// What each client connection may spend on its own.
    pub per_connection: ConnectionLimits,
}

/// Bounds each client connection gets afresh (from `[server]`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Bytes of `buffers` one connection may hold, over all its streams.
    pub buffer_share: u64,
    /// Header fields a request head may carry.
    pub max_headers: usize,
    /// Bytes of request heads a connection may send upstream per second.
    pub header_rate: u64,
    /// Bytes of heads a new connection may send at once (the largest head):
    /// the rest of a second's burst accrues at `header_rate`.
    pub header_start: u64,
    /// How much of a body refused before its end is read and discarded, so
    /// its client reads the refusal.
    pub refusal_drain: RefusalDrain,
}

/// The stack for one client connection, forwarding through `forward` (its own
/// upstream connections, which know the client's address). The server wraps
/// it in the connection's count of requests in flight, which hands it each
/// request's body as a [`ClientBody`].
pub fn proxy_service(
    shared: &Shared,
    forward: &Forward,
) -> impl Service<
    Request<ClientBody>,
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
    let limits = shared.per_connection;
    ServiceBuilder::new()
        // Outermost but for the server's count of requests in flight, so the access log and metrics see every
        // response, including the ones fencegate makes itself below.
        .layer(access_log(shared.metrics.clone()))
        // Rescue: every refusal from the layers below becomes its problem+json
        // response here, and a panic a 500 problem, so no error escapes to
        // hyper as a connection reset; inside the access log, so both are
        // logged and counted.
        .layer(RescueLayer)
        // Before anything else acts on a request: a head with more fields
        // than allowed (an HTTP/2 head may decode to many more than its
        // frames suggest) gets 431 here, as hyper answers one over HTTP/1.1.
        .layer(HeaderCountLayer { max: limits.max_headers })
        // Before anything looks at the target: make it canonical, then route
        // it. Every layer below sees one spelling of each resource, and the
        // route says which methods are fenced, how the key is made and where
        // the request goes (404 without one).
        .layer(RoutingLayer::new(shared.routes.clone(), forward.over_tls()))
        // Per connection, the bytes of heads it may have sent upstream a
        // second: after routing, so the refusal is counted under its route,
        // and before the head checks, so a refused request reads and raises
        // no mark. Built here, per connection: the bucket starts at accept.
        .layer(HeaderRateLayer::new(limits.header_rate, limits.header_start))
        // Everything the head can decide, before a body byte is read: token,
        // key, signature, stale and jump checks, and no body on unfenced
        // methods. A request already condemned never makes fencegate read
        // (or buffer) its body.
        .layer(HeadChecksLayer::new(shared.store.clone()))
        // The body limit, and fenced bodies read whole (within the buffer
        // budget) before they may take their key's turn: a slow or broken
        // upload never holds a key, and never reaches the upstream in part.
        .layer(BodyLayer::new(shared.buffers.clone(), limits.buffer_share))
        // The key's turn and the atomic raise, then the forward, which ends
        // at the upstream even if the client leaves (on a task of its own then).
        .layer(FencingLayer::new(shared.store.clone(), shared.gate.clone()))
        .service(forward.clone())
}
