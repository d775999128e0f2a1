//! What a checked request's body needs before its key's turn: nothing (it
//! streams), or a read of the whole body within the budgets and the route's
//! `timeout`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use hyper::body::Body;
use tokio::time::Sleep;

use crate::http::{BufferBudget, ClientBody, Held, Reader, RequestBody};
use crate::stack::error::{ProxyError, Rejection};
use crate::stack::head::Checked;

/// The buffer budget of the whole process and the share of it one client
/// connection may hold over all its streams.
#[derive(Debug)]
pub(crate) struct Budgets {
    process: Arc<BufferBudget>,
    connection: Arc<BufferBudget>,
}

impl Budgets {
    /// For one client connection: a share of `process` of its own.
    pub(crate) fn new(process: Arc<BufferBudget>, connection_share: u64) -> Budgets {
        Budgets { process, connection: BufferBudget::new(connection_share) }
    }
}

/// A checked request whose body is ready to go on, or must be read first.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Plan {
    Ready(Checked<RequestBody>),
    Read(Reading),
}

/// A fenced body to read whole before its request may take its key's turn.
pub(crate) struct Reading {
    reader: Reader,
    checked: Checked<()>,
    timeout: std::time::Duration,
}

/// The route's body limit, then the plan: a declared `Content-Length` above
/// the limit is refused before anything is read; an unfenced body, one of a
/// `stream_body` route or an empty one streams; any other fenced body is
/// read whole, its declared length taken from the budgets at once.
#[allow(clippy::result_large_err)]
pub(crate) fn plan(checked: Checked<ClientBody>, budgets: &Budgets) -> Result<Plan, Rejection> {
    let route = &checked.routed.route;
    let limit = route.max_body;
    // The length hyper frames the body by: its `Content-Length`, already
    // parsed (none for a chunked body), with no second lookup of the field.
    let declared = checked.routed.request.body().size_hint().exact();
    if declared.is_some_and(|len| len > limit) {
        return Err(checked.rejection(ProxyError::BodyTooLarge { limit, partly_sent: false }));
    }
    if checked.fence.is_none() || route.stream_body || checked.routed.request.body().is_end_stream() {
        return Ok(Plan::Ready(checked.map_body(|body| RequestBody::streaming(body, limit))));
    }
    let mut held = Held::new(&budgets.process, &budgets.connection);
    if let Some(len) = declared {
        if let Err(e) = held.take(len) {
            return Err(checked.rejection(e.into()));
        }
    }
    let timeout = route.timeout;
    let (checked, body) = checked.take_body();
    Ok(Plan::Read(Reading { reader: Reader::new(body, limit, declared, held), checked, timeout }))
}

impl Plan {
    /// The request with its body ready to go on: a future that holds the
    /// plan itself, so awaiting it moves nothing but its answer.
    pub(crate) fn ready(self) -> Ready {
        Ready { plan: Some(self), deadline: None }
    }
}

/// [`Plan::ready`]'s future. Its deadline is made at the read's first wait,
/// boxed: most bodies come with their head and need no timer at all, and
/// without one inline the future is `Unpin`, so its owner polls it where it
/// is rather than moving it to await it.
pub(crate) struct Ready {
    plan: Option<Plan>,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl Future for Ready {
    type Output = Result<Checked<RequestBody>, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(Plan::Read(reading)) = this.plan.as_mut() {
            let failed = match reading.reader.poll_read(cx) {
                Poll::Ready(Ok(())) => None,
                Poll::Ready(Err(e)) => Some(ProxyError::from(e)),
                Poll::Pending => {
                    let timeout = reading.timeout;
                    ready!(this
                        .deadline
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)))
                        .as_mut()
                        .poll(cx));
                    Some(ProxyError::BodyTimeout(timeout))
                }
            };
            if let Some(failed) = failed {
                return Poll::Ready(Err(reading.checked.rejection(failed)));
            }
        }
        Poll::Ready(match this.plan.take().expect("Ready polled after it was done") {
            Plan::Ready(checked) => Ok(checked),
            Plan::Read(Reading { reader, checked, .. }) => Ok(checked.with_body(reader.into_body())),
        })
    }
}
