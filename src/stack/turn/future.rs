//! The fence's response future: one per request that gets past the head.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use crate::http::ProxyBody;
use crate::stack::error::Rejection;
use crate::stack::forward::SlotTaken;

type BoxedDecision = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Rejection>> + Send>>;

/// The response future of a request the fence lets on: resolves once the upstream's
/// response head arrived (the key's turn has been passed on by then) or the
/// request was refused.
///
/// A fenced forward runs to its end whatever its caller does. While the
/// caller waits it is polled in place, on the request's own task: no task of
/// its own to spawn, schedule and join for every request. Dropped before it
/// is done (the client's connection closed, its HTTP/2 stream was reset)
/// once the forward has its way to the upstream, it is handed to a task of
/// its own that finishes it, so the keys' turns pass on only when the
/// upstream has answered (or after the settle period), never while the write
/// may still land. Dropped before that, nothing was sent: it is dropped too.
pub struct ResponseFuture {
    /// Taken out while polled: a future that panics is dropped where it
    /// panicked (its turns then settle), never handed to a task to resume.
    inner: Option<BoxedDecision>,
    /// Marked by a fenced request's forward once it may send something;
    /// `None` for a request that need not run to its end.
    taken: Option<SlotTaken>,
}

impl ResponseFuture {
    /// The future `make` makes, made where it is kept: in its box. A future
    /// handed over already made is copied in whole, with the room of every
    /// state it may reach; made in place, only what it starts with is written.
    pub(super) fn new<Fut>(taken: Option<SlotTaken>, make: impl FnOnce() -> Fut) -> Self
    where
        Fut: Future<Output = Result<Response<ProxyBody>, Rejection>> + Send + 'static,
    {
        let inner: Box<Fut> = Box::write(Box::new_uninit(), make());
        ResponseFuture { inner: Some(Box::into_pin(inner)), taken }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<ProxyBody>, Rejection>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = self.inner.take().expect("the fence's future polled after it was done");
        match inner.as_mut().poll(cx) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => {
                self.inner = Some(inner);
                Poll::Pending
            }
        }
    }
}

impl Drop for ResponseFuture {
    fn drop(&mut self) {
        let Some(unfinished) = self.inner.take() else { return };
        if !self.taken.as_ref().is_some_and(SlotTaken::is_taken) {
            // Refused, waiting for its turn or its way to the upstream, or
            // not fenced: nothing fenced was sent.
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = unfinished.await;
                });
            }
            // No runtime left (the process is stopping): nothing else will
            // forward, and dropping it lets its keys' turns go.
            Err(_) => drop(unfinished),
        }
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
