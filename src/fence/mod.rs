//! The fence: token parsing, mark stores, per-key turns and the tower middleware.
//!
//! [`FencingLayer`] wraps the service that forwards to the upstream, and takes
//! requests already routed ([`Routed`](crate::route::Routed)). For a request
//! whose method its route fences, [`Fencing`] guarantees, in this order:
//!
//! 1. a token that is malformed or repeated is refused (400) and a missing one is
//!    refused (428) unless the route allows it;
//! 2. on a route with a `signing_key_file`, a token whose [`signature`] is
//!    missing, repeated or wrong is refused (403) before anything else happens:
//!    such a request never reads or raises the mark, and never queues;
//! 3. a token below the key's mark is refused at once (409), without queueing,
//!    and on a route with `max_token_jump` so is a token more than that above
//!    the mark (403; a key with no mark yet has no jump limit);
//! 4. the request waits (at most `queue_timeout`, else 503) for the key's turn, so
//!    at most one fenced request per key is in flight to the upstream;
//! 5. with the turn held, the jump limit is checked again against the mark as it
//!    is now, then the store atomically raises the mark to the token or says it
//!    is stale (409): the checks that count happen when the turn comes;
//! 6. the request is forwarded, and the turn passes on only when the upstream's
//!    response head has arrived or the forward failed.
//!
//! Requests with other methods pass through untouched.

mod future;
pub mod gate;
mod layer;
mod service;
pub mod signature;
pub mod store;
pub mod token;

pub use future::ResponseFuture;
pub use gate::KeyGate;
pub use layer::FencingLayer;
pub use service::Fencing;

/// A concurrent map keyed by fence key, hashed with a per-process random seed
/// (keys come from clients, so the seed matters as much as the speed).
pub(crate) type KeyMap<V> = dashmap::DashMap<Box<str>, V, ahash::RandomState>;
