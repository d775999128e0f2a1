//! Per-connection guards against clients that hold resources without making
//! progress: a request head that never completes (slowloris), and a keep-alive
//! connection that sits idle.
//!
//! [`Activity`] is fed from two sides: [`ActivityIo`] sees bytes arrive, and
//! [`TrackRequests`] sees requests start and finish. [`Activity::expired`]
//! resolves when either guard trips; the connection task then closes the
//! connection (at once for a stuck head, gracefully for an idle one).
//!
//! Feeding it only records times: nothing is woken and no timer is touched per
//! request. The guard's one timer checks lazily instead. A deadline that moved
//! later is found when the timer fires early and is re-armed for it. A deadline
//! can also appear while the timer sleeps: a head starting (due
//! `header_read_timeout` after its first byte) or a request finishing (idle
//! `idle_timeout` after). Neither can be due sooner than that timeout from the
//! moment the timer was set, so the timer never sleeps longer than the timeout
//! of whatever may happen next: both, with a request in flight; the head's, on
//! an idle connection; the idle one, while a head arrives. Every deadline is
//! then met exactly.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tower::{Layer, Service};

/// What the connection is doing, as far as the guards care.
#[derive(Debug)]
pub struct Activity {
    state: Mutex<State>,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

#[derive(Debug)]
struct State {
    /// The connection speaks HTTP/2: its frames (PING, WINDOW_UPDATE) arrive
    /// between requests, so the slow-head guard does not apply.
    http2: bool,
    /// Nothing has been read yet.
    fresh: bool,
    in_flight: usize,
    /// When the last request finished (or the connection opened).
    idle_since: Instant,
    /// When the first byte of a request head arrived, while no request is in flight.
    head_started: Option<Instant>,
}

/// Why a connection should close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Bytes arrived but no complete request head within `header_read_timeout`.
    SlowHead,
    /// No request in flight and nothing received for `idle_timeout`.
    Idle,
}

impl Activity {
    pub fn new(header_read_timeout: Duration, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Activity {
            state: Mutex::new(State {
                http2: false,
                fresh: true,
                in_flight: 0,
                idle_since: Instant::now(),
                head_started: None,
            }),
            header_read_timeout,
            idle_timeout,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bytes_received(&self, first: &[u8]) {
        let mut s = self.state();
        if s.fresh {
            s.fresh = false;
            // The HTTP/2 connection preface starts "PRI * HTTP/2.0"; no HTTP/1
            // request starts with "PRI ".
            s.http2 = first.starts_with(b"PRI ");
        }
        if !s.http2 && s.in_flight == 0 && s.head_started.is_none() {
            s.head_started = Some(Instant::now());
        }
    }

    fn request_started(&self) {
        let mut s = self.state();
        s.in_flight += 1;
        s.head_started = None;
    }

    fn request_finished(&self) {
        let mut s = self.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.idle_since = Instant::now();
        }
    }

    /// What tripped, or when to look again: no later than the next moment a
    /// guard could trip, given that nobody says when the state changes (see
    /// the [module docs](self)).
    fn check(&self) -> Result<Instant, Expiry> {
        let s = self.state();
        let now = Instant::now();
        if s.in_flight > 0 {
            // A request is being served: its own timeouts apply. Look again in
            // time to catch a head that starts once it is done.
            return Ok(now + self.idle_timeout.min(self.header_read_timeout));
        }
        if let Some(started) = s.head_started {
            let deadline = started + self.header_read_timeout;
            // The head may complete and its request finish before then, and
            // the connection fall idle: no sooner than now + idle_timeout.
            return if now >= deadline { Err(Expiry::SlowHead) } else { Ok(deadline.min(now + self.idle_timeout)) };
        }
        let deadline = s.idle_since + self.idle_timeout;
        if now >= deadline {
            Err(Expiry::Idle)
        } else {
            // A head starting from now on trips no sooner than this.
            Ok(deadline.min(now + self.header_read_timeout))
        }
    }

    /// Resolves when a guard trips.
    pub async fn expired(&self) -> Expiry {
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        loop {
            match self.check() {
                Err(expiry) => return expiry,
                Ok(next) => {
                    sleep.as_mut().reset(next);
                    sleep.as_mut().await;
                }
            }
        }
    }
}

/// A connection's IO that tells its [`Activity`] when bytes arrive.
#[derive(Debug)]
pub struct ActivityIo<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I> ActivityIo<I> {
    pub fn new(inner: I, activity: Arc<Activity>) -> Self {
        ActivityIo { inner, activity }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for ActivityIo<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_received(&buf.filled()[before..]);
        }
        result
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for ActivityIo<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
}

/// Counts a connection's requests in flight for its [`Activity`].
#[derive(Clone)]
pub struct TrackRequestsLayer(pub Arc<Activity>);

impl<S> Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests { inner, activity: self.0.clone() }
    }
}

/// See [`TrackRequestsLayer`].
#[derive(Clone)]
pub struct TrackRequests<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, R, B> Service<R> for TrackRequests<S>
where
    S: Service<R, Response = http::Response<B>>,
{
    type Response = http::Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.activity.request_started();
        // The guard travels with the response body: a request counts until its
        // body is sent (or dropped), including one whose future is dropped early.
        let guard = Some(InFlight(self.activity.clone()));
        TrackedFuture { inner: self.inner.call(req), guard }
    }
}

pin_project_lite::pin_project! {
    /// [`TrackRequests`]' response future: hands the request's guard to the body.
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        guard: Option<InFlight>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let guard = this.guard.take();
        Poll::Ready(Ok(response.map(|body| TrackedBody { inner: body, _guard: guard })))
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted until it is done.
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        _guard: Option<InFlight>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Counts one request in flight until dropped.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The connection task's side: waits for a guard to trip.
    fn guard(a: &Arc<Activity>) -> tokio::task::JoinHandle<Expiry> {
        let a = a.clone();
        tokio::spawn(async move { a.expired().await })
    }

    /// One request on `a`: its head takes `head` to arrive, then it is served
    /// for `served`.
    async fn request(a: &Activity, head: Duration, served: Duration) {
        a.bytes_received(b"PUT / HTTP/1.1");
        tokio::time::sleep(head).await;
        a.request_started();
        tokio::time::sleep(served).await;
        a.request_finished();
    }

    /// `waiting` trips with `expiry` exactly `after` from now.
    async fn trips(waiting: tokio::task::JoinHandle<Expiry>, expiry: Expiry, after: Duration) {
        let now = Instant::now();
        assert_eq!(waiting.await.unwrap(), expiry);
        assert_eq!(now.elapsed(), after);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_expires_after_idle_timeout() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(a.expired().await, Expiry::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_started_head_must_complete_within_header_read_timeout() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        tokio::time::sleep(Duration::from_secs(30)).await;
        a.bytes_received(b"PUT / HTTP/1.1");
        let started = Instant::now();
        assert_eq!(a.expired().await, Expiry::SlowHead);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_the_connection() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        a.bytes_received(b"GET / HTTP/1.1");
        a.request_started();
        let waiting = guard(&a);
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!waiting.is_finished());
        a.request_finished();
        trips(waiting, Expiry::Idle, Duration::from_secs(60)).await;
    }

    /// Nobody wakes the guard when a head starts: its timer must already be
    /// due by then, and the head is still timed from its first byte.
    #[tokio::test(start_paused = true)]
    async fn a_head_that_starts_while_the_guard_waits_is_timed_from_its_first_byte() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        let waiting = guard(&a);
        tokio::time::sleep(Duration::from_secs(25)).await;
        a.bytes_received(b"PUT / HTTP/1.1");
        trips(waiting, Expiry::SlowHead, Duration::from_secs(10)).await;
    }

    /// Nobody wakes the guard when a request finishes either: with
    /// `idle_timeout` below `header_read_timeout`, a guard that went to sleep
    /// while a head arrived must still close the connection on time.
    #[tokio::test(start_paused = true)]
    async fn a_request_that_ends_while_the_guard_waits_on_its_head_is_idle_on_time() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(2));
        // The guard first looks while the head is still arriving.
        let waiting = guard(&a);
        request(&a, Duration::from_secs(1), Duration::from_millis(500)).await;
        trips(waiting, Expiry::Idle, Duration::from_secs(2)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_serving_request_after_request_never_expires() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        let waiting = guard(&a);
        // 600 s of 7 s requests, each head taking 1 s to arrive.
        for _ in 0..75 {
            request(&a, Duration::from_secs(1), Duration::from_secs(7)).await;
        }
        assert!(!waiting.is_finished());
        trips(waiting, Expiry::Idle, Duration::from_secs(60)).await;
    }
}
