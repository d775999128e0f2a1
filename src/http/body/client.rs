//! The request body as hyper hands it over, counted open by its connection
//! until it is read to its end; one dropped before that is handed back to the
//! connection, which drains it so the client reads the answer.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, Incoming, SizeHint};

/// The connection's side of its request bodies (the server implements it):
/// the connection guards must know which bodies are still open, and a body
/// refused before its end is the connection's to drain.
pub trait OpenBodies: Send + Sync {
    /// A body with more to come was handed over.
    fn body_started(&self);
    /// A body was read to its end.
    fn body_ended(&self);
    /// A body was dropped before its end: `rest` is what is left of it.
    fn dropped_early(self: Arc<Self>, rest: Incoming, http1: bool);
}

/// A request body as hyper hands it over, counted in its connection's
/// [`OpenBodies`] until it is read to its end. Dropped before that, it is
/// handed back to be drained.
pub struct ClientBody {
    /// `None` only once dropped.
    inner: Option<Incoming>,
    open: Option<Arc<dyn OpenBodies>>,
    http1: bool,
    /// The client asked for `100 Continue` and nothing has polled the body
    /// yet: hyper has not sent it, so the client holds the body back, and a
    /// drain would send it (hyper does on the first poll of the body),
    /// inviting a body nobody wants. Dropped now, hyper reads what was sent
    /// anyway and closes the connection after the answer.
    awaits_continue: bool,
    /// Where the bytes read of it are added up, for the access log.
    read: Option<Arc<AtomicU64>>,
}

impl ClientBody {
    /// `inner`, counted in `bodies` until its end; `awaits_continue`: its
    /// client asked for `100 Continue`.
    pub fn new(inner: Incoming, bodies: &Arc<dyn OpenBodies>, http1: bool, awaits_continue: bool) -> ClientBody {
        let open = (!inner.is_end_stream()).then(|| {
            bodies.body_started();
            bodies.clone()
        });
        ClientBody { inner: Some(inner), open, http1, awaits_continue, read: None }
    }

    /// From now on, adds the bytes of each data frame read to `read`.
    pub fn count_into(&mut self, read: Arc<AtomicU64>) {
        self.read = Some(read);
    }

    fn inner(&self) -> &Incoming {
        self.inner.as_ref().expect("a body's Incoming is taken only when it is dropped")
    }
}

impl Drop for ClientBody {
    /// A body dropped before its end is handed back to be drained, unless
    /// its client still waits for `100 Continue`: see
    /// [`ClientBody::awaits_continue`].
    fn drop(&mut self) {
        let (Some(bodies), Some(inner)) = (self.open.take(), self.inner.take()) else { return };
        if !self.awaits_continue {
            bodies.dropped_early(inner, self.http1);
        }
    }
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Body for ClientBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        // Polled: hyper sends `100 Continue` now if it was asked for.
        this.awaits_continue = false;
        let inner = this.inner.as_mut().expect("a body's Incoming is taken only when it is dropped");
        let frame = std::task::ready!(Pin::new(&mut *inner).poll_frame(cx));
        if let (Some(read), Some(Ok(frame))) = (&this.read, &frame) {
            if let Some(data) = frame.data_ref() {
                read.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        // The end: no more frames, or (with a declared length) the last byte
        // of it. hyper has left the body behind by then: it marks its reading
        // done before it hands over the last chunk. A reader that stops at
        // the declared length (hyper's client does) never asks again.
        if frame.is_none() || inner.is_end_stream() {
            if let Some(bodies) = this.open.take() {
                bodies.body_ended();
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner().is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner().size_hint()
    }
}
