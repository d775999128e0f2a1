//! What routing hands on: a request in canonical form with its route.

use std::sync::Arc;

use super::Destination;
use crate::fence::token::TokenError;
use crate::route::Route;
use crate::stack::forward::SlotTaken;

/// A request and the route it matched: what the layers below routing take, so
/// none of them can be reached by a request that was not routed.
///
/// By the time a request is `Routed`, its target is canonical (see
/// [`crate::canonical`]): the path, the `Host` header and the `Destination`
/// are the forms it is keyed by and forwarded with.
#[derive(Debug)]
pub struct Routed<B> {
    /// The route the canonical path found.
    pub route: Arc<Route>,
    /// The request, its target and `Host` in canonical form.
    pub request: http::Request<B>,
    /// The request may write: its method, or a method-override header, is not
    /// one of the route's safe methods.
    pub fenced: bool,
    /// The WebDAV `Destination` of a fenced request, canonical and routed.
    pub destination: Option<Destination>,
    /// Set by whoever runs the forward to its end even if the caller leaves
    /// (the fence): the forward marks it once it may send something.
    pub slot_taken: Option<SlotTaken>,
    /// The route's token field as routing's one pass over the fields read
    /// it (`Some`), or `None`: the head check looks it up by name.
    pub token: Option<Result<Option<u64>, TokenError>>,
}
