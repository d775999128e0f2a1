//! The fence: token parsing, mark stores, per-key turns and the tower middleware.
//!
//! Two layers, in the order a request meets them, with the body read between
//! them (see [`crate::stack`]). [`HeadChecksLayer`] decides everything the
//! request head can decide, before a byte of the body is read. For a request
//! its route fences ([`Routed::fenced`](crate::routing::Routed)):
//!
//! 1. a token that is malformed or repeated is refused (400) and a missing one
//!    is refused (428) unless the route allows it;
//! 2. the fence key is made (400 when it cannot be), and for a WebDAV request
//!    with a `Destination`, the destination's key too;
//! 3. on a route with a `signing_key_file`, a token whose [`signature`] is
//!    missing, repeated or wrong is refused (403) before anything else
//!    happens: such a request never reads or raises the mark, and never queues;
//! 4. a token below a key's mark is refused at once (409), without queueing,
//!    and on a route with `max_token_jump` so is a token more than that above
//!    the mark (403; a key with no mark yet has no jump limit).
//!
//! A request that is not fenced must not carry a body unless its route allows
//! it (400): an upstream that expects none may read it as the next request.
//!
//! [`FencingLayer`] then, for a fenced request whose body is in:
//!
//! 5. waits (at most `queue_timeout`, else 503) for its keys' turns, taken in
//!    key order so two requests can never deadlock: at most one fenced request
//!    per key is in flight to the upstream;
//! 6. with the turns held, checks the jump limit again against the marks as
//!    they are now, and has the store atomically raise each mark to the token
//!    or say it is stale (409): the checks that count happen when the turn comes;
//! 7. forwards the request on a task of its own, so it runs to its end at the
//!    upstream whether or not its client stays; the turns pass on when the
//!    upstream's response head has arrived or the forward failed (after the
//!    route's `settle` when the outcome is unknown).

mod future;
pub mod gate;
mod head;
mod layer;
mod service;
pub mod signature;
pub mod store;
pub mod token;

use std::sync::Arc;

pub use future::ResponseFuture;
pub use gate::KeyGate;
pub use head::{HeadChecks, HeadChecksLayer, DESTINATION_SIGNATURE_HEADER};
pub use layer::FencingLayer;
pub use service::Fencing;

use crate::error::{ProxyError, Rejection};
use crate::route::Route;
use crate::routing::Routed;

/// A concurrent map keyed by fence key, hashed with a per-process random seed
/// (keys come from clients, so the seed matters as much as the speed).
pub(crate) type KeyMap<V> = dashmap::DashMap<Box<str>, V, ahash::RandomState>;

/// A routed request after the head checks, with what they decided.
#[derive(Debug)]
pub struct Checked<B> {
    pub routed: Routed<B>,
    /// `None`: the request passes unfenced (safe method, or a missing token
    /// the route allows).
    pub fence: Option<Fence>,
}

/// What a fenced request must pass: its token against each key's mark.
#[derive(Debug, Clone)]
pub struct Fence {
    pub token: u64,
    pub key: String,
    /// The WebDAV destination's key and its route, when the request has one.
    pub destination: Option<(String, Arc<Route>)>,
}

impl<B> Checked<B> {
    /// Splits off the body; [`with_body`](Self::with_body) puts one back.
    pub fn take_body(self) -> (Checked<()>, B) {
        let Checked { routed, fence } = self;
        let (parts, body) = routed.request.into_parts();
        let request = http::Request::from_parts(parts, ());
        let Routed { route, fenced, destination, .. } = routed;
        (Checked { routed: Routed { route, request, fenced, destination }, fence }, body)
    }

    /// A refusal of this request, naming its key and token when it has them.
    pub fn rejection(&self, error: ProxyError) -> Rejection {
        match &self.fence {
            Some(fence) => Rejection::new(error, Some(fence.key.clone()), Some(fence.token)),
            None => Rejection::from(error),
        }
    }
}

impl Checked<()> {
    pub fn with_body<B>(self, body: B) -> Checked<B> {
        let Checked { routed, fence } = self;
        let (parts, ()) = routed.request.into_parts();
        let request = http::Request::from_parts(parts, body);
        Checked {
            routed: Routed { request, route: routed.route, fenced: routed.fenced, destination: routed.destination },
            fence,
        }
    }
}
