//! Retrying only what never reached the upstream.
//!
//! A request is retried only when connecting failed *and* its body was never
//! touched: then not one byte of it reached the upstream, so sending it again
//! cannot apply a write twice or out of order. That holds for every method,
//! fenced or not. Anything else (a connection that broke after sending, a
//! timeout) is never retried: the upstream may have acted on it.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::SendError;
use crate::limits::{BodyError, RequestBody};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

/// Connection attempts after the first.
pub const MAX_RETRIES: u32 = 3;
/// Wait before the first retry; doubled for each one after it.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(25);

/// A request body that stays in its slot until the client first polls it, so a
/// request whose connection never came up can be sent again with its body.
pub struct Rewindable {
    slot: Arc<Mutex<Option<RequestBody>>>,
    taken: Option<RequestBody>,
    // Known up front, so the client frames the request (length or chunked)
    // exactly as the original before it ever polls the body.
    hint: SizeHint,
    end: bool,
}

impl Rewindable {
    fn new(body: RequestBody) -> (Self, Arc<Mutex<Option<RequestBody>>>) {
        let (hint, end) = (body.size_hint(), body.is_end_stream());
        let slot = Arc::new(Mutex::new(Some(body)));
        (Rewindable { slot: slot.clone(), taken: None, hint, end }, slot)
    }
}

impl Body for Rewindable {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.taken.is_none() {
            let body = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            match body {
                Some(body) => self.taken = Some(body),
                None => return Poll::Ready(None),
            }
        }
        match self.taken.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.taken {
            Some(body) => body.is_end_stream(),
            None => self.end,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.taken {
            Some(body) => body.size_hint(),
            None => self.hint,
        }
    }
}

/// The parts of a request head that a retry sends again.
pub struct Head {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
}

/// Sends `head` + `body`, retrying connection failures that happened before
/// the body was touched, with exponential backoff.
pub async fn send(
    client: &Client<HttpConnector, Rewindable>,
    mut head: Head,
    body: RequestBody,
) -> Result<Response<Incoming>, SendError> {
    let (mut body, mut slot) = Rewindable::new(body);
    let mut backoff = FIRST_BACKOFF;
    for attempt in 0..=MAX_RETRIES {
        let last = attempt == MAX_RETRIES;
        let mut request = Request::new(body);
        *request.method_mut() = head.method.clone();
        *request.uri_mut() = head.uri.clone();
        *request.version_mut() = Version::HTTP_11;
        // The head is kept for a retry: a connect error consumes the request.
        *request.headers_mut() = if last { std::mem::take(&mut head.headers) } else { head.headers.clone() };
        let error = match client.request(request).await {
            Ok(response) => return Ok(response),
            Err(e) if !e.is_connect() => return Err(SendError::Failed(e.into())),
            Err(e) => e,
        };
        let untouched = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        match untouched {
            Some(original) if !last => {
                tracing::debug!(attempt, error = %error, "upstream connect failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                (body, slot) = Rewindable::new(original);
            }
            _ => return Err(SendError::Connect(error.into())),
        }
    }
    unreachable!("the last attempt returns")
}
