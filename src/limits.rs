//! Request body limits (route `max_body`, 413 past it).
//!
//! A declared `Content-Length` above the limit is refused before anything else.
//! A fenced request without one (a chunked upload) is read in full, up to the
//! limit, before it may take its key's turn: a body that turns out too large is
//! refused with nothing forwarded, so the upstream never sees part of a fenced
//! write. Other requests stream, and one that overruns the limit is cut off.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::Request;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::error::ProxyError;
use crate::route::Route;

/// A request body on its way upstream: streamed with a byte limit, or read in
/// full already.
#[derive(Debug)]
pub enum RequestBody {
    Streaming { inner: Incoming, limit: u64, seen: u64 },
    Buffered(Option<Bytes>),
}

/// Why a request body stopped.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is larger than the route's limit of {0} bytes")]
    TooLarge(u64),
    #[error(transparent)]
    Client(#[from] hyper::Error),
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RequestBody::Buffered(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            RequestBody::Streaming { inner, limit, seen } => match Pin::new(inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        *seen += data.len() as u64;
                        if *seen > *limit {
                            return Poll::Ready(Some(Err(BodyError::TooLarge(*limit))));
                        }
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Buffered(bytes) => bytes.is_none(),
            RequestBody::Streaming { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Buffered(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            RequestBody::Buffered(None) => SizeHint::with_exact(0),
            RequestBody::Streaming { inner, .. } => inner.size_hint(),
        }
    }
}

/// The route limit an error chain ran into, if a body overran it.
pub fn overran_limit(e: &(dyn std::error::Error + 'static)) -> Option<u64> {
    let mut current = Some(e);
    while let Some(err) = current {
        if let Some(BodyError::TooLarge(limit)) = err.downcast_ref::<BodyError>() {
            return Some(*limit);
        }
        current = err.source();
    }
    None
}

/// Applies `route`'s `max_body` to `req`; see the [module docs](self). The
/// request that comes back carries a body that keeps to the limit.
pub async fn limit_body(route: &Route, req: Request<Incoming>) -> Result<Request<RequestBody>, ProxyError> {
    let limit = route.max_body;
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let (parts, body) = req.into_parts();
    let body = if route.is_fenced(&parts.method) && declared.is_none() && !body.is_end_stream() {
        // Read it all before the fence: a fenced write is forwarded whole or not at all.
        // Bounded in time too (the route's timeout): a client that stalls
        // mid-body must not hold its connection and the buffered bytes forever.
        let collect = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX)).collect();
        match tokio::time::timeout(route.timeout, collect).await {
            Ok(Ok(collected)) => RequestBody::Buffered(Some(collected.to_bytes())),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return Err(ProxyError::BodyTooLarge { limit }),
            Ok(Err(e)) => return Err(ProxyError::ClientBody(e.to_string())),
            Err(_) => return Err(ProxyError::BodyTimeout(route.timeout)),
        }
    } else {
        RequestBody::Streaming { inner: body, limit, seen: 0 }
    };
    Ok(Request::from_parts(parts, body))
}
