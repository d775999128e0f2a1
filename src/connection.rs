//! Per-connection guards against clients that hold resources without making
//! progress: a request head that never completes (slowloris), a keep-alive
//! connection that sits idle, and a client that does not let an idle
//! connection close.
//!
//! [`Activity`] is fed from two sides: [`ActivityIo`] sees bytes arrive, and
//! [`TrackRequests`] sees requests start and finish. [`Activity::expired`]
//! resolves when either guard trips; the connection task then closes the
//! connection (at once for a stuck head, gracefully for an idle one), and
//! [`Activity::overstayed`] tells it when a graceful close has taken too long.
//!
//! # What must arrive in time
//!
//! Every connection, whatever it starts with, is timed from its first byte:
//! until what is arriving is complete, `header_read_timeout` runs. On an HTTP/1
//! connection that is the request head (its end is the request starting). A
//! connection whose first bytes are a prefix of the HTTP/2 connection preface
//! is timed the same way, and turns into an HTTP/1 connection, clock running,
//! at the first byte that departs from it. After the full preface,
//! [`ActivityIo`] follows the HTTP/2 frame boundaries (the 9-byte frame
//! headers only; payloads are skipped, not copied) and times, while no request
//! is in flight, each *unit* from its first byte to its last:
//!
//! - a **head**: the preface with the client's first frame (its SETTINGS), or
//!   a header block (HEADERS or PUSH_PROMISE up to the frame with END_HEADERS).
//!   Like an HTTP/1 head it is the start of work: while it arrives the
//!   connection is not idle, and its end restarts the idle clock;
//! - any other **frame** (PING, WINDOW_UPDATE, SETTINGS, ...): it must arrive
//!   whole within `header_read_timeout` too, but it is not work: the idle
//!   clock keeps running, so a client that trickles frames is still closed
//!   after `idle_timeout`. Complete frames between requests cost nothing.
//!
//! With a request in flight nothing is timed here (the route's timeouts
//! govern), and a unit left incomplete when the last request finishes is timed
//! from that moment.
//!
//! # The lazy timer
//!
//! Feeding it only records times: nothing is woken and no timer is touched per
//! request or per read. The guard's one timer checks lazily instead. A
//! deadline that moved later is found when the timer fires early and is
//! re-armed for it. A deadline can also appear while the timer sleeps:
//! something starting to arrive (due `header_read_timeout` after its first
//! byte), a request finishing or an HTTP/2 head completing (idle
//! `idle_timeout` after). None can be due sooner than that timeout from the
//! moment the timer was set, so the timer never sleeps longer than the timeout
//! of whatever may happen next: both, with a request in flight; the head's, on
//! an idle connection; the idle one, while a head arrives (its end starts a
//! request or the idle clock afresh); and while an HTTP/2 frame arrives, the
//! two deadlines already set, since anything that follows (the frame ending, a
//! later unit starting, the frame turning out to open a header block) only
//! moves them later or drops one. Every deadline is then met exactly.
//!
//! # Closing
//!
//! An idle HTTP/1 connection closes at once. An idle HTTP/2 connection gets
//! GOAWAY and a PING, and closes once the client has answered the PING; a
//! client that never answers would keep it open for ever. So a connection
//! asked to close gracefully (idle, or at shutdown) that has not ended
//! [`Activity::close_grace`] after that, with no request in flight, is closed
//! at once. A request in flight is never cut by this: it finishes first.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tower::{Layer, Service};

/// The longest a connection asked to close gracefully may stay open with no
/// request in flight (shorter if `header_read_timeout` is): see
/// [`Activity::close_grace`].
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The HTTP/2 connection preface (RFC 9113 §3.4). No HTTP/1 request line is a
/// prefix of it, nor starts with it.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the connection is doing, as far as the guards care.
#[derive(Debug)]
pub struct Activity {
    state: Mutex<State>,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    /// When the last request finished, an HTTP/2 head completed, or the
    /// connection opened.
    idle_since: Instant,
    /// What is arriving, while no request is in flight, and since when.
    arriving: Option<Arriving>,
    /// HTTP/2: what the latest read left incomplete, request in flight or not.
    /// It starts arriving when the last request in flight finishes.
    incomplete: Option<Unit>,
}

#[derive(Debug, Clone, Copy)]
struct Arriving {
    unit: Unit,
    since: Instant,
}

/// Something a client sends that must arrive whole within `header_read_timeout`
/// (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// An HTTP/1 request head, an HTTP/2 header block, or the HTTP/2 preface
    /// with the client's first frame: work starting, not idleness.
    Head,
    /// Any other HTTP/2 frame: the idle clock keeps running while it arrives.
    Frame,
}

/// Why a connection should close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Bytes arrived but no complete request head (or HTTP/2 frame, with no
    /// request in flight) within `header_read_timeout`.
    SlowHead,
    /// No request in flight and no request head arriving for `idle_timeout`.
    Idle,
}

/// What one read of an HTTP/2 connection did, by frame boundaries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct FramesRead {
    /// A unit ended in this read: whatever is incomplete now began in it.
    completed: bool,
    /// A head ended in this read.
    head_completed: bool,
    /// What is incomplete at the end of the read.
    incomplete: Option<Unit>,
}

impl Activity {
    pub fn new(header_read_timeout: Duration, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Activity {
            state: Mutex::new(State { in_flight: 0, idle_since: Instant::now(), arriving: None, incomplete: None }),
            header_read_timeout,
            idle_timeout,
        })
    }

    /// How long a connection asked to close gracefully may take to end once no
    /// request is in flight: `header_read_timeout`, at most [`CLOSE_GRACE`].
    /// A client needs one round trip to answer HTTP/2's closing PING (or to
    /// see an HTTP/1 close); one that could not do that within
    /// `header_read_timeout` could not have sent a request head in time
    /// either, and five seconds cover a few lost packets on a slow link
    /// without letting a client that ignores the PING hold its slot.
    pub fn close_grace(&self) -> Duration {
        self.header_read_timeout.min(CLOSE_GRACE)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of an HTTP/1 request head (or of what may still become the HTTP/2
    /// preface) arrived: with no request in flight, the head's clock starts at
    /// its first byte and is not reset by later ones.
    fn head_bytes(&self) {
        let mut s = self.state();
        if s.in_flight == 0 && s.arriving.is_none() {
            s.arriving = Some(Arriving { unit: Unit::Head, since: Instant::now() });
        }
    }

    /// An HTTP/2 read, as [`Frames`] saw it.
    fn frames(&self, read: FramesRead) {
        let mut s = self.state();
        s.incomplete = read.incomplete;
        if s.in_flight > 0 {
            return;
        }
        let now = Instant::now();
        if read.head_completed {
            s.idle_since = now;
        }
        s.arriving = read.incomplete.map(|unit| {
            let since = match s.arriving {
                // Still the same unit: its clock keeps running.
                Some(arriving) if !read.completed => arriving.since,
                _ => now,
            };
            Arriving { unit, since }
        });
    }

    fn request_started(&self) {
        let mut s = self.state();
        s.in_flight += 1;
        s.arriving = None;
    }

    fn request_finished(&self) {
        let mut s = self.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            let now = Instant::now();
            s.idle_since = now;
            s.arriving = s.incomplete.map(|unit| Arriving { unit, since: now });
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
        let idle_deadline = s.idle_since + self.idle_timeout;
        match s.arriving {
            Some(Arriving { unit, since }) => {
                let deadline = since + self.header_read_timeout;
                if now >= deadline {
                    return Err(Expiry::SlowHead);
                }
                match unit {
                    // The head may complete (and its request finish) before
                    // then, and the connection fall idle: no sooner than now +
                    // idle_timeout.
                    Unit::Head => Ok(deadline.min(now + self.idle_timeout)),
                    // A frame is not work: the idle deadline stands.
                    Unit::Frame if now >= idle_deadline => Err(Expiry::Idle),
                    Unit::Frame => Ok(deadline.min(idle_deadline)),
                }
            }
            None if now >= idle_deadline => Err(Expiry::Idle),
            // A head starting from now on trips no sooner than this.
            None => Ok(idle_deadline.min(now + self.header_read_timeout)),
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

    /// Resolves when a connection asked to close gracefully at `closing_since`
    /// has stayed open [`close_grace`](Activity::close_grace) past that moment
    /// and past its last request's end, with no request in flight: the client
    /// is not letting it close, and it may be closed at once.
    pub async fn overstayed(&self, closing_since: Instant) {
        let grace = self.close_grace();
        loop {
            let at = {
                let s = self.state();
                if s.in_flight > 0 {
                    // Nobody says when it finishes: look again a grace later,
                    // no later than its end + grace.
                    Instant::now() + grace
                } else {
                    closing_since.max(s.idle_since) + grace
                }
            };
            if Instant::now() >= at {
                return;
            }
            tokio::time::sleep_until(at).await;
        }
    }
}

/// A connection's IO that tells its [`Activity`] when bytes arrive, and where
/// they stand in the protocol (see the [module docs](self)).
#[derive(Debug)]
pub struct ActivityIo<I> {
    inner: I,
    activity: Arc<Activity>,
    framing: Framing,
}

impl<I> ActivityIo<I> {
    pub fn new(inner: I, activity: Arc<Activity>) -> Self {
        ActivityIo { inner, activity, framing: Framing::Preface(0) }
    }

    fn received(&mut self, bytes: &[u8]) {
        self.framing.received(bytes, &self.activity);
    }
}

/// Which protocol the connection speaks, told from its first bytes as
/// hyper's server tells it, and where it stands in it.
#[derive(Debug)]
enum Framing {
    /// This many bytes of the HTTP/2 preface have arrived, and nothing else.
    Preface(usize),
    /// Something other than the preface arrived first.
    Http1,
    Http2(Frames),
}

impl Framing {
    fn received(&mut self, bytes: &[u8], activity: &Activity) {
        match self {
            Framing::Http1 => activity.head_bytes(),
            Framing::Http2(frames) => activity.frames(frames.read(bytes)),
            Framing::Preface(seen) => {
                let expected = &PREFACE[*seen..];
                let n = expected.len().min(bytes.len());
                // The head's clock starts at the first byte, whichever protocol
                // the bytes turn out to be.
                activity.head_bytes();
                if bytes[..n] != expected[..n] {
                    *self = Framing::Http1;
                } else if *seen + n < PREFACE.len() {
                    *seen += n;
                } else {
                    let mut frames = Frames::after_preface();
                    activity.frames(frames.read(&bytes[n..]));
                    *self = Framing::Http2(frames);
                }
            }
        }
    }
}

/// HTTP/2 frame boundaries across reads (RFC 9113 §4.1): only the 9-byte
/// frame headers are looked at.
#[derive(Debug)]
struct Frames {
    /// The current frame's header, as far as it has arrived.
    header: [u8; Frames::HEADER_LEN],
    header_len: usize,
    /// Payload bytes of the current frame still to come, once its header is in.
    payload_left: usize,
    /// The current frame is the first after the preface: the client's SETTINGS.
    first: bool,
    /// A header block is open: its frames so far lack END_HEADERS.
    in_block: bool,
    /// The current frame carries END_HEADERS: it closes a header block.
    ends_block: bool,
}

impl Frames {
    const HEADER_LEN: usize = 9;
    const HEADERS: u8 = 0x1;
    const PUSH_PROMISE: u8 = 0x5;
    const CONTINUATION: u8 = 0x9;
    const END_HEADERS: u8 = 0x4;

    fn after_preface() -> Frames {
        Frames {
            header: [0; Frames::HEADER_LEN],
            header_len: 0,
            payload_left: 0,
            first: true,
            in_block: false,
            ends_block: false,
        }
    }

    fn read(&mut self, mut bytes: &[u8]) -> FramesRead {
        let mut read = FramesRead::default();
        while !bytes.is_empty() {
            if self.header_len < Frames::HEADER_LEN {
                let n = (Frames::HEADER_LEN - self.header_len).min(bytes.len());
                self.header[self.header_len..][..n].copy_from_slice(&bytes[..n]);
                self.header_len += n;
                bytes = &bytes[n..];
                if self.header_len < Frames::HEADER_LEN {
                    break;
                }
                let [l0, l1, l2, kind, flags, ..] = self.header;
                self.payload_left = u32::from_be_bytes([0, l0, l1, l2]) as usize;
                if matches!(kind, Frames::HEADERS | Frames::PUSH_PROMISE | Frames::CONTINUATION) {
                    self.ends_block = flags & Frames::END_HEADERS != 0;
                    self.in_block = !self.ends_block;
                }
            }
            let n = self.payload_left.min(bytes.len());
            self.payload_left -= n;
            bytes = &bytes[n..];
            if self.payload_left > 0 {
                break;
            }
            // The frame is complete.
            self.header_len = 0;
            let ends_head = self.first || self.ends_block;
            self.first = false;
            self.ends_block = false;
            if !self.in_block {
                read.completed = true;
                read.head_completed |= ends_head;
            }
        }
        read.incomplete = self.incomplete();
        read
    }

    fn incomplete(&self) -> Option<Unit> {
        if self.first || self.in_block || self.ends_block {
            Some(Unit::Head)
        } else if self.header_len > 0 {
            Some(Unit::Frame)
        } else {
            None
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for ActivityIo<I> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.received(&buf.filled()[before..]);
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
        a.head_bytes();
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
        a.head_bytes();
        let started = Instant::now();
        assert_eq!(a.expired().await, Expiry::SlowHead);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_the_connection() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        a.head_bytes();
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
        a.head_bytes();
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

    // --- What arrives: protocol and frame boundaries -----------------------

    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const WINDOW_UPDATE: u8 = 0x8;
    const DATA: u8 = 0x0;

    /// An HTTP/2 frame: its 9-byte header and a zeroed payload of `len` bytes.
    fn frame(kind: u8, flags: u8, len: usize) -> Vec<u8> {
        let len_bytes = (len as u32).to_be_bytes();
        let mut out = vec![len_bytes[1], len_bytes[2], len_bytes[3], kind, flags, 0, 0, 0, 1];
        out.resize(Frames::HEADER_LEN + len, 0);
        out
    }

    /// A connection's IO on `a`; bytes are handed to it with `received`.
    fn io(a: &Arc<Activity>) -> ActivityIo<tokio::io::Empty> {
        ActivityIo::new(tokio::io::empty(), a.clone())
    }

    /// The preface and the client's SETTINGS: an HTTP/2 connection's first head.
    fn opening() -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        out.extend(frame(SETTINGS, 0, 12));
        out
    }

    #[test]
    fn the_preface_is_told_apart_from_http1_byte_by_byte() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        for (bytes, http2) in [
            (&PREFACE[..], true),
            (&b"PRI / HTTP/1.1\r\nHost: x\r\n\r\n"[..], false),
            (&b"PRI * HTTP/1.1\r\nHost: x\r\n\r\n"[..], false),
            (&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\r"[..], false),
            (&b"GET / HTTP/1.1\r\n\r\n"[..], false),
        ] {
            for split in [1, 3, 4, 24] {
                let mut io = io(&a);
                for chunk in bytes.chunks(split) {
                    io.received(chunk);
                }
                assert_eq!(
                    matches!(io.framing, Framing::Http2(_)),
                    http2,
                    "{:?} in reads of {split}",
                    String::from_utf8_lossy(bytes)
                );
                assert_eq!(matches!(io.framing, Framing::Http1), !http2);
            }
        }
    }

    /// Frames in one stream, each with what is incomplete while it arrives
    /// (before and after its 9-byte header is in) and whether its end ends a
    /// head; `None`: its end leaves a header block open.
    fn conversation() -> Vec<(Vec<u8>, Unit, Unit, Option<bool>)> {
        use Unit::{Frame as F, Head as H};
        vec![
            (frame(SETTINGS, 0, 6), H, H, Some(true)),
            (frame(SETTINGS, 1, 0), F, F, Some(false)),
            (frame(PING, 0, 8), F, F, Some(false)),
            (frame(Frames::HEADERS, 0, 20), F, H, None),
            (frame(Frames::CONTINUATION, 0, 7), H, H, None),
            (frame(Frames::CONTINUATION, Frames::END_HEADERS, 5), H, H, Some(true)),
            (frame(WINDOW_UPDATE, 0, 4), F, F, Some(false)),
            (frame(Frames::HEADERS, Frames::END_HEADERS | 0x1, 30), F, H, Some(true)),
            (frame(DATA, 0x1, 100), F, F, Some(false)),
            (frame(Frames::PUSH_PROMISE, 0, 8), F, H, None),
            (frame(Frames::CONTINUATION, Frames::END_HEADERS, 0), H, H, Some(true)),
        ]
    }

    #[test]
    fn frame_boundaries_are_followed_byte_by_byte() {
        let mut frames = Frames::after_preface();
        for (i, (bytes, before_header, after_header, ends)) in conversation().into_iter().enumerate() {
            for (k, byte) in bytes.iter().enumerate() {
                let read = frames.read(&[*byte]);
                let last = k + 1 == bytes.len();
                let expected = match (last, ends) {
                    (true, Some(head)) => FramesRead { completed: true, head_completed: head, incomplete: None },
                    (true, None) => {
                        FramesRead { completed: false, head_completed: false, incomplete: Some(Unit::Head) }
                    }
                    (false, _) => FramesRead {
                        completed: false,
                        head_completed: false,
                        incomplete: Some(if k + 1 < Frames::HEADER_LEN { before_header } else { after_header }),
                    },
                };
                assert_eq!(read, expected, "frame {i}, byte {k}");
            }
        }
    }

    #[test]
    fn frame_boundaries_are_followed_across_any_split() {
        let stream: Vec<u8> = conversation().into_iter().flat_map(|(bytes, ..)| bytes).collect();
        let heads = conversation().iter().filter(|(.., ends)| *ends == Some(true)).count();
        for a in 0..=stream.len() {
            for b in (a..=stream.len()).step_by(7) {
                let mut frames = Frames::after_preface();
                let reads = [&stream[..a], &stream[a..b], &stream[b..]].map(|part| frames.read(part));
                assert_eq!(reads[2].incomplete, None, "cut at {a} and {b}");
                assert!(reads.iter().any(|r| r.head_completed), "cut at {a} and {b}");
                assert!(reads.iter().filter(|r| r.head_completed).count() <= heads);
            }
        }
    }

    // --- What arrives: timing -------------------------------------------------

    fn activity() -> Arc<Activity> {
        Activity::new(Duration::from_secs(10), Duration::from_secs(60))
    }

    /// The reported problem: "PRI " first, then HTTP/1, then nothing.
    #[tokio::test(start_paused = true)]
    async fn bytes_that_only_start_like_the_preface_are_a_slow_head_from_the_first_byte() {
        for later in [&b"/ HTTP/1.1\r\nHost: x\r\n"[..], b"* HTTP/2.0\r\n"] {
            let a = activity();
            let mut io = io(&a);
            let waiting = guard(&a);
            tokio::time::sleep(Duration::from_secs(3)).await;
            io.received(b"PRI ");
            tokio::time::sleep(Duration::from_secs(4)).await;
            io.received(later);
            trips(waiting, Expiry::SlowHead, Duration::from_secs(6)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_preface_and_the_first_settings_must_arrive_within_header_read_timeout() {
        let opening = opening();
        // Cut after the preface's first byte, the whole preface, part of the
        // SETTINGS header, and part of its payload.
        for cut in [1, 24, 28, 36] {
            let a = activity();
            let mut io = io(&a);
            let waiting = guard(&a);
            io.received(&opening[..cut]);
            trips(waiting, Expiry::SlowHead, Duration::from_secs(10)).await;
        }
        // Complete in time, it is an idle connection from then on.
        let a = activity();
        let mut io = io(&a);
        let waiting = guard(&a);
        io.received(&opening[..30]);
        tokio::time::sleep(Duration::from_secs(9)).await;
        io.received(&opening[30..]);
        trips(waiting, Expiry::Idle, Duration::from_secs(60)).await;
    }

    /// One HTTP/2 request on `io`: its HEADERS frame, then served for `served`.
    async fn h2_request(a: &Activity, io: &mut ActivityIo<tokio::io::Empty>, served: Duration) {
        io.received(&frame(Frames::HEADERS, Frames::END_HEADERS | 0x1, 20));
        a.request_started();
        tokio::time::sleep(served).await;
        a.request_finished();
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_client_pinging_between_requests_is_closed_only_when_idle() {
        let a = activity();
        let mut io = io(&a);
        let waiting = guard(&a);
        io.received(&opening());
        for _ in 0..5 {
            h2_request(&a, &mut io, Duration::from_secs(3)).await;
            // Between requests: PINGs, SETTINGS acks and WINDOW_UPDATEs, well
            // past header_read_timeout.
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                io.received(&[frame(PING, 0, 8), frame(WINDOW_UPDATE, 0, 4), frame(SETTINGS, 1, 0)].concat());
            }
        }
        assert!(!waiting.is_finished());
        // PINGs are not requests: idle_timeout after the last request, closed.
        let pinging = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                io.received(&frame(PING, 0, 8));
            }
        });
        trips(waiting, Expiry::Idle, Duration::from_secs(60 - 30)).await;
        pinging.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_or_header_block_left_incomplete_between_requests_is_a_slow_head() {
        let stalls: [&[Vec<u8>]; 4] = [
            // A PING whose header arrived but not its payload.
            &[frame(PING, 0, 8)[..12].to_vec()],
            // Part of a frame header.
            &[frame(WINDOW_UPDATE, 0, 4)[..5].to_vec()],
            // HEADERS without END_HEADERS, and no CONTINUATION.
            &[frame(Frames::HEADERS, 0, 20)],
            // A CONTINUATION without END_HEADERS, then none.
            &[frame(Frames::HEADERS, 0, 20), frame(Frames::CONTINUATION, 0, 20)],
        ];
        for stall in stalls {
            let a = activity();
            let mut io = io(&a);
            let waiting = guard(&a);
            io.received(&opening());
            h2_request(&a, &mut io, Duration::from_secs(2)).await;
            tokio::time::sleep(Duration::from_secs(25)).await;
            for part in stall {
                io.received(part);
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            let waited = Duration::from_secs(3) * stall.len() as u32;
            trips(waiting, Expiry::SlowHead, Duration::from_secs(10) - waited).await;
        }
    }

    /// Each frame arrives in time, but one is always incomplete: the idle
    /// clock still runs, since frames are not requests.
    #[tokio::test(start_paused = true)]
    async fn frames_trickled_back_to_back_do_not_outlast_idle_timeout() {
        let a = activity();
        let mut io = io(&a);
        let waiting = guard(&a);
        io.received(&opening());
        let opened = Instant::now();
        let ping = frame(PING, 0, 8);
        io.received(&ping[..10]);
        loop {
            tokio::time::sleep(Duration::from_secs(7)).await;
            if waiting.is_finished() {
                break;
            }
            // The rest of this PING and the start of the next, in one read.
            io.received(&[&ping[10..], &ping[..10]].concat());
        }
        assert_eq!(waiting.await.unwrap(), Expiry::Idle);
        assert_eq!(opened.elapsed(), Duration::from_secs(63));
    }

    #[tokio::test(start_paused = true)]
    async fn a_header_block_that_completes_restarts_the_idle_clock() {
        let a = activity();
        let mut io = io(&a);
        let waiting = guard(&a);
        io.received(&opening());
        tokio::time::sleep(Duration::from_secs(50)).await;
        // A request's header block that takes a while and is then refused
        // before it becomes a request (no request_started).
        io.received(&frame(Frames::HEADERS, 0, 20));
        tokio::time::sleep(Duration::from_secs(8)).await;
        io.received(&frame(Frames::CONTINUATION, Frames::END_HEADERS, 20));
        trips(waiting, Expiry::Idle, Duration::from_secs(60)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_http2_request_in_flight_is_never_timed_and_what_it_leaves_is() {
        let a = activity();
        let mut io = io(&a);
        let waiting = guard(&a);
        io.received(&opening());
        io.received(&frame(Frames::HEADERS, Frames::END_HEADERS, 20));
        a.request_started();
        // A long upload: DATA frames split across reads, for ten minutes.
        let data = frame(DATA, 0, 16_384);
        for _ in 0..600 {
            io.received(&data[..5_000]);
            tokio::time::sleep(Duration::from_secs(1)).await;
            io.received(&data[5_000..]);
        }
        // A frame is half in when the request finishes: timed from then.
        io.received(&data[..5_000]);
        assert!(!waiting.is_finished());
        tokio::time::sleep(Duration::from_secs(4)).await;
        a.request_finished();
        trips(waiting, Expiry::SlowHead, Duration::from_secs(10)).await;
    }

    // --- Closing -----------------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_graceful_close_overstays_after_the_grace() {
        let a = activity();
        assert_eq!(a.close_grace(), CLOSE_GRACE);
        let closing = Instant::now();
        a.overstayed(closing).await;
        assert_eq!(closing.elapsed(), CLOSE_GRACE);

        // A short header_read_timeout shortens the grace.
        let a = Activity::new(Duration::from_millis(300), Duration::from_secs(60));
        let closing = Instant::now();
        a.overstayed(closing).await;
        assert_eq!(closing.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_graceful_close_never_cuts_a_request_in_flight() {
        let a = activity();
        a.head_bytes();
        a.request_started();
        let closing = Instant::now();
        let overstayed = {
            let a = a.clone();
            tokio::spawn(async move { a.overstayed(closing).await })
        };
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!overstayed.is_finished());
        a.request_finished();
        let finished = Instant::now();
        overstayed.await.unwrap();
        assert_eq!(finished.elapsed(), CLOSE_GRACE);
    }
}
