//! The proxy's client connection: HTTP/1.1 or h2c, told apart by its first
//! bytes, and an idle HTTP/1.1 connection that rests (see the
//! [connection docs](super#resting)).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::rt::bounds::Http2ServerConnExec;
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, ReadBuf};

use super::activity::Activity;
use super::io::{ActivityIo, Protocol};
use super::stream::ClientStream;
use super::ClientConnection;
use crate::http::BoxError;

/// How long after a connection rests its thread asks the allocator to give
/// freed memory back: past mimalloc's purge delays (10 ms for pages, 100 ms
/// for its arenas), so one call returns every rest of the spell.
const GIVE_BACK_AFTER: Duration = Duration::from_millis(200);

/// What returns memory freed on the calling thread to the system, if the
/// program set it (see [`give_back_memory_with`]).
static GIVE_BACK: OnceLock<fn()> = OnceLock::new();

/// Sets what a worker thread calls, a moment after its connections rest or
/// close, to return the memory they freed to the system. An allocator that keeps freed
/// memory until it is next called (mimalloc does, and a worker whose
/// connections all rest is not calling it) would otherwise hold it: resting
/// frees hyper's buffers, this lets the process shrink. Set once, before
/// serving; later calls are ignored.
pub fn give_back_memory_with(give_back: fn()) {
    let _ = GIVE_BACK.set(give_back);
}

thread_local! {
    /// A give-back is already due on this thread.
    static GIVE_BACK_DUE: Cell<bool> = const { Cell::new(false) };
}

/// After a rest, or a connection's end: calls the give-back on this thread
/// [`GIVE_BACK_AFTER`] from now, unless one is already due.
pub(super) fn give_back_soon() {
    let Some(&give_back) = GIVE_BACK.get() else { return };
    if GIVE_BACK_DUE.with(|due| due.replace(true)) {
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(GIVE_BACK_AFTER).await;
        GIVE_BACK_DUE.with(|due| due.set(false));
        give_back();
    });
}

/// How each protocol is served, and the count of resting connections.
pub(crate) struct Protocols {
    /// HTTP/1.1 for a connection that rests: it writes from one buffer,
    /// which its rests free (server/listener.rs says why).
    pub(crate) http1_resting: http1::Builder,
    /// HTTP/1.1 for one that never rests (TLS).
    pub(crate) http1: http1::Builder,
    pub(crate) http2: http2::Builder<TokioExecutor>,
    /// `fencegate_resting_connections`.
    pub(crate) resting: Gauge<i64, AtomicI64>,
}

/// One connection counted as resting while this lives.
struct Counted(Gauge<i64, AtomicI64>);

impl Counted {
    fn new(gauge: &Gauge<i64, AtomicI64>) -> Counted {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

type Io = ActivityIo<ClientStream>;

/// One client connection of the proxy listener, from its first byte to its
/// close.
pub(crate) struct ProxyConnection<S: HttpService<Incoming>> {
    state: State<S>,
    protocols: Arc<Protocols>,
    activity: Arc<Activity>,
    /// Whether it may rest at all ([`ClientStream::can_rest`]).
    rests: bool,
}

enum State<S: HttpService<Incoming>> {
    /// Reading the first bytes, which tell the protocol (at most the 24 of
    /// the HTTP/2 preface).
    Opening {
        io: Io,
        service: S,
        first: [u8; 24],
        len: usize,
    },
    /// hyper's connection state is boxed, so that a resting connection's task
    /// holds nothing of it.
    Http1(Pin<Box<http1::UpgradeableConnection<TokioIo<Io>, S>>>),
    Http2(Pin<Box<http2::Connection<TokioIo<Io>, S, TokioExecutor>>>),
    /// An HTTP/1.1 connection between requests, without hyper: the socket and
    /// the service, waiting for the client's next bytes.
    Resting {
        io: Io,
        service: S,
        _counted: Counted,
    },
    Closed,
}

impl<S, B> ProxyConnection<S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(io: Io, service: S, protocols: Arc<Protocols>, activity: Arc<Activity>) -> ProxyConnection<S> {
        let rests = io.get_ref().can_rest();
        let state = State::Opening { io, service, first: [0; 24], len: 0 };
        ProxyConnection { state, protocols, activity, rests }
    }

    fn http1(&self, io: Io, service: S) -> State<S> {
        let http1 = if self.rests { &self.protocols.http1_resting } else { &self.protocols.http1 };
        State::Http1(Box::pin(http1.serve_connection(TokioIo::new(io), service).with_upgrades()))
    }
}

impl<S, B> Future for ProxyConnection<S>
where
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    B: Body + 'static,
    B::Error: Into<BoxError>,
    TokioExecutor: Http2ServerConnExec<S::Future, B>,
{
    type Output = Result<(), BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Opening { io, first, len, .. } => {
                    let mut buf = ReadBuf::new(&mut first[*len..]);
                    ready!(Pin::new(&mut *io).poll_read(cx, &mut buf))?;
                    let read = buf.filled().len();
                    if read == 0 && *len == 0 {
                        // Closed before it said anything.
                        this.state = State::Closed;
                        continue;
                    }
                    *len += read;
                    // Closed after the start of the preface: HTTP/1, for hyper
                    // to answer what it makes of it (400).
                    let protocol = if read == 0 { Some(Protocol::Http1) } else { io.protocol() };
                    let Some(protocol) = protocol else { continue };
                    let State::Opening { io, service, first, len } = std::mem::replace(&mut this.state, State::Closed)
                    else {
                        unreachable!("matched above")
                    };
                    let mut io = io;
                    io.unread(Bytes::copy_from_slice(&first[..len]));
                    this.state = match protocol {
                        Protocol::Http1 => this.http1(io, service),
                        Protocol::Http2 => {
                            State::Http2(Box::pin(this.protocols.http2.serve_connection(TokioIo::new(io), service)))
                        }
                    };
                }
                State::Http1(conn) => return conn.as_mut().poll(cx).map_err(Into::into),
                State::Http2(conn) => return conn.as_mut().poll(cx).map_err(Into::into),
                State::Resting { io, .. } => {
                    // Readable, or closed: hyper reads either.
                    ready!(io.get_ref().poll_read_ready(cx))?;
                    let State::Resting { io, service, .. } = std::mem::replace(&mut this.state, State::Closed) else {
                        unreachable!("matched above")
                    };
                    this.state = this.http1(io, service);
                }
                State::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl<S, B> ClientConnection for ProxyConnection<S>
where
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    B: Body + 'static,
    B::Error: Into<BoxError>,
    TokioExecutor: Http2ServerConnExec<S::Future, B>,
{
    type Error = BoxError;

    fn abused(error: &BoxError) -> bool {
        // h2 ends a connection with GOAWAY(ENHANCE_YOUR_CALM) when its client
        // resets or earns refusals for too many streams (rapid reset, a
        // pipelined flood past the stream limit).
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&**error);
        while let Some(e) = source {
            if let Some(h2) = e.downcast_ref::<h2::Error>() {
                return h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
            }
            source = e.source();
        }
        false
    }

    fn graceful_shutdown(self: Pin<&mut Self>) {
        let this = self.get_mut();
        match &mut this.state {
            State::Http1(conn) => conn.as_mut().graceful_shutdown(),
            State::Http2(conn) => conn.as_mut().graceful_shutdown(),
            // Nothing in flight, nothing half-read: close now.
            State::Opening { .. } | State::Resting { .. } => this.state = State::Closed,
            State::Closed => {}
        }
    }

    /// An HTTP/1.1 connection between requests gives back hyper's state (its
    /// read and write buffers) and waits for the client's next bytes on the
    /// bare socket. Anything hyper had read and not yet parsed is read again
    /// first by the connection that follows.
    fn rest(self: Pin<&mut Self>) {
        let this = self.get_mut();
        if !this.rests || !matches!(this.state, State::Http1(_)) || !this.activity.between_requests() {
            return;
        }
        let State::Http1(conn) = std::mem::replace(&mut this.state, State::Closed) else {
            unreachable!("matched above")
        };
        // None: the connection was upgraded, and hyper is done with it.
        let Some(parts) = Pin::into_inner(conn).into_parts() else { return };
        let mut io = parts.io.into_inner();
        io.unread(parts.read_buf);
        this.state = if !io.has_unread() {
            State::Resting { io, service: parts.service, _counted: Counted::new(&this.protocols.resting) }
        } else {
            this.http1(io, parts.service)
        };
        give_back_soon();
    }
}

impl<S: HttpService<Incoming>> std::fmt::Debug for ProxyConnection<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Opening { .. } => "opening",
            State::Http1(_) => "http1",
            State::Http2(_) => "http2",
            State::Resting { .. } => "resting",
            State::Closed => "closed",
        };
        f.debug_struct("ProxyConnection").field("state", &state).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::service::TowerToHyperService;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::http::ClientBody;
    use crate::server::connection::requests::{TrackRequestsLayer, TrackedBody};

    const DRAIN: crate::config::RefusalDrain = crate::config::RefusalDrain {
        bytes: 1 << 20,
        time: std::time::Duration::from_secs(30),
        silence: std::time::Duration::from_secs(5),
    };

    /// A first response this large, then a short second one.
    const FIRST: usize = 50_000;

    type Served = http1::Connection<TokioIo<ActivityIo<tokio::io::DuplexStream>>, BoxedService>;
    type BoxedService = TowerToHyperService<
        tower::util::BoxCloneService<http::Request<Incoming>, http::Response<TrackedBody<Full<Bytes>>>, Infallible>,
    >;

    /// hyper serving `/1` (FIRST bytes) and `/2` ("second") over a pipe that
    /// holds `window` bytes the client has not read.
    fn serve(activity: &Arc<Activity>, window: usize) -> (tokio::io::DuplexStream, Served) {
        let service = tower::ServiceBuilder::new().layer(TrackRequestsLayer::new(activity.clone(), DRAIN)).service(
            tower::service_fn(|req: http::Request<ClientBody>| async move {
                let body = if req.uri().path() == "/1" { vec![b'x'; FIRST] } else { b"second".to_vec() };
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(body))))
            }),
        );
        let service = TowerToHyperService::new(tower::util::BoxCloneService::new(service));
        let (client, server) = tokio::io::duplex(window);
        let conn =
            http1::Builder::new().serve_connection(TokioIo::new(ActivityIo::new(server, activity.clone())), service);
        (client, conn)
    }

    /// A client that has not read its first response yet: hyper has ended
    /// both requests (their bodies are done) but holds the second response
    /// in its write buffer, the socket being full. Taking hyper apart then
    /// would lose it: the connection must not count as between requests.
    #[tokio::test]
    async fn a_response_held_in_hypers_write_buffer_keeps_the_connection_from_resting() {
        // How long the first response is on the wire.
        let activity = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        let (mut client, conn) = serve(&activity, 1 << 20);
        let serving = tokio::spawn(conn);
        client.write_all(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut first = Vec::new();
        let mut chunk = [0; 8192];
        while first.windows(4).position(|w| w == b"\r\n\r\n").is_none_or(|head| first.len() < head + 4 + FIRST) {
            let n = client.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed early");
            first.extend_from_slice(&chunk[..n]);
        }
        serving.abort();

        // Room for exactly the first response: the second finds the pipe full.
        let activity = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        let (mut client, mut conn) = serve(&activity, first.len());
        client.write_all(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(200), &mut conn).await.is_err(), "hyper is still serving");
        assert!(!activity.between_requests(), "the second response is not flushed");

        // Once the client reads, both responses arrive and the connection is
        // between requests.
        let mut got = Vec::new();
        let reading = async {
            let mut chunk = [0; 8192];
            while !got.ends_with(b"second") {
                let n = client.read(&mut chunk).await.unwrap();
                assert!(n > 0, "closed early");
                got.extend_from_slice(&chunk[..n]);
            }
        };
        tokio::select! {
            () = reading => {}
            _ = &mut conn => panic!("the connection ended"),
        }
        assert!(tokio::time::timeout(Duration::from_millis(100), &mut conn).await.is_err());
        assert!(activity.between_requests());
    }
}
