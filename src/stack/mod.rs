//! The proxy's tower stack, top to bottom: this file only composes it.
//!
//! Data flows one way, in the order a request meets it: requests in flight
//! (the server's) → trace and access log → rescue (refusals and panics) →
//! the pipeline, whose steps run as plain functions one after another:
//! header count → canonicalize + route → head-byte rate → head checks → body
//! → the key's turn + advance → forward. What the steps guarantee together
//! is written down once, in `docs/behaviour.md` ("The guarantee, step by
//! step"); `pipeline/mod.rs` says why they are steps of one service and not
//! a layer each.
//!
//! The two layers have folders in tower-http's layout: `mod.rs` says what it
//! guarantees and why it sits where it does, `layer.rs` holds the `Layer`,
//! `service.rs` the `Service` and its `call`, `future.rs` its own response
//! future. Each step has a folder of its own too, its files named for their
//! concern. `error.rs` holds the refusals every step raises.
//!
//! Steps use the types of the steps after them, and two use each other:
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
pub(crate) mod pipeline;
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
use forward::Forward;
use pipeline::{Fences, Pipeline};
use rescue::RescueLayer;

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
    let fences = Fences {
        routes: shared.routes.clone(),
        store: shared.store.clone(),
        gate: shared.gate.clone(),
        buffers: shared.buffers.clone(),
    };
    ServiceBuilder::new()
        // Outermost but for the server's count of requests in flight, so the access log and metrics see every
        // response, including the ones fencegate makes itself below; and so every request has its ID (which
        // the rescue puts in its problems) before any step looks at it.
        .layer(access_log(shared.metrics.clone(), forward.client().clone()))
        // Rescue: every refusal from the steps below becomes its problem+json
        // response here, and a panic a 500 problem, so no error escapes to
        // hyper as a connection reset; inside the access log, so both are
        // logged and counted.
        .layer(RescueLayer)
        // The fence itself, one step after another (pipeline/mod.rs).
        .service(Pipeline::new(forward.clone(), fences, &shared.per_connection, forward.over_tls()))
}
