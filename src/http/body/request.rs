//! The request body sent upstream: streamed under the route's limit, or read
//! whole already, and telling its [`Handover`] how far it went.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::HeaderMap;
use http_body_util::{LengthLimitError, Limited};
use hyper::body::{Body, Frame, SizeHint};

use super::blocks::Blocks;
use super::budget::Held;
use super::client::ClientBody;
use super::handover::{Delivery, Handover};
use super::response::BoxError;

/// A request body on its way upstream: streamed under the route's limit, or
/// read in full already (with the share of the budget it holds). A fenced
/// request's body tells its [`Handover`] when hyper has taken its last frame,
/// or dropped it unfinished.
#[derive(Debug)]
pub struct RequestBody {
    kind: Kind,
    /// Where to tell how far the body went, and the generation it was
    /// handed out in ([`RequestBody::report_to`]).
    report: Option<(Arc<Handover>, u64)>,
}

#[derive(Debug)]
enum Kind {
    Streaming(Limited<ClientBody>),
    /// Streaming, and telling `overran` when it goes past its limit: for an
    /// HTTP/2 upstream, whose layer resets the stream on a body error
    /// instead of handing the error back (see [`RequestBody::watch_overrun`]).
    Watched {
        inner: Limited<ClientBody>,
        overran: Arc<AtomicBool>,
    },
    Buffered {
        blocks: Blocks,
        _held: Option<Held>,
    },
}

impl RequestBody {
    fn of(kind: Kind) -> Self {
        RequestBody { kind, report: None }
    }

    /// An empty body.
    pub fn empty() -> Self {
        RequestBody::of(Kind::Buffered { blocks: Blocks::default(), _held: None })
    }

    /// A body read whole, holding its share of the budgets.
    pub(super) fn buffered(blocks: Blocks, held: Held) -> Self {
        RequestBody::of(Kind::Buffered { blocks, _held: Some(held) })
    }

    /// `body`, streamed, failing once more than `limit` bytes have come.
    pub(crate) fn streaming(body: ClientBody, limit: u64) -> Self {
        RequestBody::of(Kind::Streaming(Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX))))
    }

    /// The same body again, to send once more if this one is refused
    /// unprocessed: a buffered body (which then holds its budget share, so
    /// the bytes stay counted while either lives) or an empty one; `None`
    /// for a body still streaming from the client. The twin reports to no
    /// [`Handover`] until it is handed out ([`RequestBody::report_to`]).
    pub fn twin(&mut self) -> Option<RequestBody> {
        match &mut self.kind {
            Kind::Buffered { blocks, _held } => {
                Some(RequestBody::of(Kind::Buffered { blocks: blocks.clone(), _held: _held.take() }))
            }
            Kind::Streaming(inner) | Kind::Watched { inner, .. } if inner.is_end_stream() => Some(RequestBody::empty()),
            Kind::Streaming(_) | Kind::Watched { .. } => None,
        }
    }

    /// For a body still streaming from the client: a flag set if it goes
    /// past the route's limit. The HTTP/2 layer does not hand that error
    /// back (it resets the stream), so the forward asks the flag to answer
    /// 413 rather than 502.
    pub fn watch_overrun(&mut self) -> Option<Arc<AtomicBool>> {
        let kind = std::mem::replace(&mut self.kind, Kind::Buffered { blocks: Blocks::default(), _held: None });
        match kind {
            Kind::Streaming(inner) => {
                let overran = Arc::new(AtomicBool::new(false));
                self.kind = Kind::Watched { inner, overran: overran.clone() };
                Some(overran)
            }
            other => {
                self.kind = other;
                None
            }
        }
    }

    /// From now on, tells `handover` when hyper has taken this body's last
    /// frame, or dropped it before. A body with nothing left to send tells
    /// nothing: there is nothing to wait for.
    pub(crate) fn report_to(&mut self, handover: &Arc<Handover>) {
        if self.kind_is_end_stream() {
            return;
        }
        if let Some((old, generation)) = self.report.take() {
            old.end(generation, Delivery::Cut);
        }
        self.report = Some((handover.clone(), handover.begin()));
    }

    /// Tells the handover, once, how the body ended.
    fn ended(&mut self, how: Delivery) {
        if let Some((handover, generation)) = self.report.take() {
            handover.end(generation, how);
        }
    }

    fn kind_is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Buffered { blocks, .. } => blocks.is_empty(),
            Kind::Streaming(inner) | Kind::Watched { inner, .. } => inner.is_end_stream(),
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        // Dropped with frames left: by hyper when the exchange failed or its
        // connection closed, or unsent. What of it was written may still
        // be in the sockets' buffers.
        self.ended(Delivery::Cut);
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = match &mut this.kind {
            Kind::Buffered { blocks, .. } => Poll::Ready(blocks.pop_frame().map(|b| Ok(Frame::data(b)))),
            Kind::Streaming(inner) => Pin::new(inner).poll_frame(cx),
            Kind::Watched { inner, overran } => {
                let polled = Pin::new(inner).poll_frame(cx);
                if let Poll::Ready(Some(Err(e))) = &polled {
                    if overran_limit(&**e) {
                        overran.store(true, Ordering::Release);
                    }
                }
                polled
            }
        };
        if this.report.is_some() {
            // The last frame is out once it is handed over: hyper may stop
            // polling a body whose `is_end_stream` says so.
            match &polled {
                Poll::Ready(None) => this.ended(Delivery::Whole),
                Poll::Ready(Some(Ok(_))) if this.kind_is_end_stream() => this.ended(Delivery::Whole),
                Poll::Ready(Some(Err(_))) => this.ended(Delivery::Cut),
                _ => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.kind_is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Buffered { blocks, .. } => SizeHint::with_exact(blocks.len()),
            Kind::Streaming(inner) | Kind::Watched { inner, .. } => inner.size_hint(),
        }
    }
}

/// Whether an upstream exchange failed because a streamed body overran its
/// route's limit (the client's fault, not the upstream's).
pub fn overran_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(err) = current {
        if err.is::<LengthLimitError>() || err.is::<Overran>() {
            return true;
        }
        current = err.source();
    }
    false
}

/// A streamed body went past the route's limit, as a watched body's flag
/// says ([`RequestBody::watch_overrun`]).
#[derive(Debug)]
pub struct Overran;

impl std::fmt::Display for Overran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body went past the route's max_body")
    }
}

impl std::error::Error for Overran {}

/// The body length a request declares in `Content-Length`, if it is one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::super::blocks::MAX_FRAME;
    use super::*;

    fn buffered(len: usize) -> RequestBody {
        let mut blocks = Blocks::default();
        blocks.push(Bytes::from(vec![b'x'; len]));
        RequestBody::of(Kind::Buffered { blocks, _held: None })
    }

    /// A body tells its handover "whole" when hyper takes its last frame
    /// (in frames of at most MAX_FRAME), "cut" when dropped before; a body
    /// handed out again starts a generation the old one's end cannot touch.
    #[tokio::test]
    async fn a_body_tells_when_its_last_frame_is_taken_or_it_is_dropped_unfinished() {
        use http_body_util::BodyExt;
        let handover = Arc::new(Handover::default());
        let mut body = buffered(2 * MAX_FRAME + 1);
        body.report_to(&handover);
        let (_, generation) = handover.delivery();
        let mut sizes = Vec::new();
        while !body.is_end_stream() {
            assert_eq!(handover.delivery().0, Delivery::Sending, "whole before the last frame");
            let frame = body.frame().await.unwrap().unwrap();
            sizes.push(frame.into_data().unwrap().len());
        }
        assert_eq!(sizes, [MAX_FRAME, MAX_FRAME, 1]);
        assert_eq!(handover.delivery(), (Delivery::Whole, generation));
        handover.delivered(generation).await;
        drop(body);
        assert_eq!(handover.delivery().0, Delivery::Whole, "a body sent whole is not cut by its drop");

        assert!(handover.renew());
        let mut first = buffered(3 * MAX_FRAME);
        first.report_to(&handover);
        first.frame().await.unwrap().unwrap();
        assert!(!handover.renew(), "a body still going out keeps its handover");
        let mut again = first.twin().unwrap();
        again.report_to(&handover);
        let (_, second) = handover.delivery();
        drop(first);
        assert_eq!(handover.delivery(), (Delivery::Sending, second), "the old try's end counts for nothing");
        drop(again);
        assert_eq!(handover.delivery(), (Delivery::Cut, second));
        RequestBody::empty().report_to(&handover);
        assert_eq!(handover.delivery(), (Delivery::Cut, second), "an empty body has nothing to tell");
    }
}
