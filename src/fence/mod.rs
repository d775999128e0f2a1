//! The fence: token parsing, mark stores, per-key turns and the tower middleware.
//!
//! [`FencingLayer`] wraps the service that forwards to the upstream. For a request
//! whose method its route fences, [`Fencing`] guarantees, in this order:
//!
//! 1. a token that is malformed or repeated is refused (400) and a missing one is
//!    refused (428) unless the route allows it;
//! 2. a token below the key's mark is refused at once (409), without queueing;
//! 3. the request waits (at most `queue_timeout`, else 503) for the key's turn, so
//!    at most one fenced request per key is in flight to the upstream;
//! 4. with the turn held, the store atomically raises the mark to the token or
//!    says it is stale (409): the check happens when the turn comes;
//! 5. the request is forwarded, and the turn passes on only when the upstream's
//!    response head has arrived or the forward failed.
//!
//! Requests with other methods pass through untouched.

mod future;
pub mod gate;
mod layer;
mod service;
pub mod store;
pub mod token;

pub use future::ResponseFuture;
pub use gate::KeyGate;
pub use layer::FencingLayer;
pub use service::Fencing;
