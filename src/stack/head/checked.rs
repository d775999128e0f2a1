//! What the head checks hand on: the routed request, and the fence it must
//! pass.

use std::sync::Arc;

use crate::route::Route;
use crate::stack::error::{ProxyError, Rejection};
use crate::stack::router::Routed;

/// A routed request after the head checks, with what they decided.
#[derive(Debug)]
pub(crate) struct Checked<B> {
    pub routed: Routed<B>,
    /// `None`: the request passes unfenced (safe method, or a missing token
    /// the route allows).
    pub fence: Option<Fence>,
}

/// What a fenced request must pass: its token against each key's mark.
#[derive(Debug, Clone)]
pub struct Fence {
    pub token: u64,
    pub key: Arc<str>,
    /// The WebDAV destination's key and its route, when the request has one.
    pub destination: Option<(Arc<str>, Arc<Route>)>,
    /// The store had the key's mark at hand, and it was the token: the
    /// request may share an idle key at once ([`Ask::ShareAtMark`]).
    ///
    /// [`Ask::ShareAtMark`]: crate::fence::gate::Ask::ShareAtMark
    pub at_mark: bool,
}

impl Fence {
    /// A refusal of this fence's request for `key`, one of the keys it writes.
    pub fn rejection(&self, error: ProxyError, key: &Arc<str>) -> Rejection {
        Rejection::new(error, Some(key.clone()), Some(self.token))
    }
}

impl<B> Checked<B> {
    /// Splits off the body; [`with_body`](Self::with_body) puts one back.
    pub fn take_body(self) -> (Checked<()>, B) {
        let Checked { routed, fence } = self;
        let (parts, body) = routed.request.into_parts();
        let request = http::Request::from_parts(parts, ());
        let Routed { route, fenced, destination, slot_taken, token, .. } = routed;
        (Checked { routed: Routed { route, request, fenced, destination, slot_taken, token }, fence }, body)
    }

    /// A refusal of this request, naming its key and token when it has them.
    pub fn rejection(&self, error: ProxyError) -> Rejection {
        match &self.fence {
            Some(fence) => fence.rejection(error, &fence.key),
            None => Rejection::from(error),
        }
    }
}

impl<B> Checked<B> {
    /// The same request with its body mapped by `f`.
    pub fn map_body<C>(self, f: impl FnOnce(B) -> C) -> Checked<C> {
        let Checked { routed: Routed { route, request, fenced, destination, slot_taken, token }, fence } = self;
        Checked { routed: Routed { route, request: request.map(f), fenced, destination, slot_taken, token }, fence }
    }
}

impl Checked<()> {
    /// Puts a body back where [`take_body`](Checked::take_body) took one.
    pub fn with_body<B>(self, body: B) -> Checked<B> {
        self.map_body(|()| body)
    }
}
