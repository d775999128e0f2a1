//! The upstream connections: HTTP/1.1 clients share their worker thread's,
//! HTTP/2 clients keep their own; each route caps how many are open at once
//! over all client connections, and each client connection may open only a
//! share of them.
//!
//! An upstream connection whose response has come back is parked for the
//! next request, under the route it was opened for:
//! - for an HTTP/1.1 client, in its worker thread's spares: any HTTP/1.1
//!   client connection of that worker takes the most recently parked one that
//!   is free, before it opens one. A client that sends one request at a time
//!   usually gets its own connection back, and clients that come and go don't
//!   each cost the upstream a connection (as nginx's `keepalive` cache). The
//!   spares are a plain list on the worker's thread: no lock, no hash, and
//!   the upstream exchange stays on the thread that serves the client.
//! - for an HTTP/2 client, with the client connection, which needs as many as
//!   it has requests in flight at once; they close with it. They are not
//!   shared: the client connection's share of the route's slots (below) bounds
//!   the connections its streams can pin, so its streams must not run on
//!   connections counted in another client's share.
//!
//! The cap: every open upstream connection, busy or idle, holds one of its
//! route's [`UpstreamSlots`] until it closes, so HTTP/2 streams whose responses
//! are never read pin at most `max_upstream_connections` of them. Within it,
//! one HTTP/2 client connection holds at most its share of a route's slots (a
//! quarter of the cap, at least one), so the streams of one connection can't
//! take the whole route from every other client. (An HTTP/1.1 client has one
//! request in flight at a time, and the connections its requests open serve
//! the whole worker: they count in the route's cap only.) A request that needs a new
//! connection when none is free (of the route, or of its connection's share)
//! waits for a slot up to the route's `queue_timeout`; then it is refused
//! (503 `upstream-busy`) with nothing sent. While it waits, every connection
//! it could take a slot from closes as soon as it is idle: the ones idle when
//! the wait begins, and the ones that finish their response during it.
//!
//! An upstream connection is TCP, with TLS over it for an https upstream
//! (`tls.rs`): the handshake is part of connecting, within the same timeout.
//!
//! Retries: only what never reached the upstream is sent again.
//! - Connecting, the TLS handshake included, is retried (with backoff): it
//!   happens before the request is handed to a connection, so not one byte of
//!   it was sent.
//! - A request that a kept connection hands back unsent (the upstream had
//!   closed it while idle) goes out on a fresh connection.
//! - Anything else (a connection that broke after sending, a timeout) is never
//!   retried: the upstream may have acted on it. That holds for every method,
//!   fenced or not.

mod connect;
mod h2;
mod parking;
mod slots;

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use crate::body::{Handover, RequestBody};
use crate::proxy::error::UpstreamError;
use crate::proxy::teardown::{Resettable, Teardown};
use crate::proxy::tls::UpstreamTls;
use crate::server::connection::WokenOnly;

pub(super) use h2::StreamHeld;
pub use parking::Parking;
use parking::{Idle, Parked, Sender};
pub use slots::UpstreamSlots;
use slots::{Shares, Slot};

/// How a request reaches the upstream: on a kept connection, or on a new one
/// for which it holds a slot; and where the connection is parked after.
pub struct Checkout(Way, Parking);

enum Way {
    Kept(Arc<Parked>, Sender),
    Slot(Slot),
    Http2(h2::Way),
}

type RareSend<'a> = Pin<Box<dyn Future<Output = Result<Response<Incoming>, UpstreamError>> + Send + 'a>>;

/// Where a request goes and its connection is parked after.
#[derive(Clone, Copy)]
struct Destined<'a> {
    upstreams: &'a Upstreams,
    authority: &'a Authority,
    tls: Option<&'a UpstreamTls>,
    slots: &'a UpstreamSlots,
    parking: Parking,
    handover: Option<&'a Arc<Handover>>,
}

pin_project_lite::pin_project! {
    /// [`Upstreams::send`]'s future.
    #[project = SendingProj]
    enum Sending<'a, F> {
        /// On a kept connection, which is parked again when the head comes.
        Kept { #[pin] exchange: F, kept: Option<(Arc<Parked>, Sender)>, to: Destined<'a> },
        /// On a new connection.
        Rare { future: RareSend<'a> },
    }
}

impl<'a, F> Future for Sending<'a, F>
where
    F: Future<Output = Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<RequestBody>>>>,
{
    type Output = Result<Response<Incoming>, UpstreamError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (unsent, to) = match self.as_mut().project() {
            SendingProj::Rare { future } => return future.as_mut().poll(cx),
            SendingProj::Kept { exchange, kept, to } => match ready!(exchange.poll(cx)) {
                Ok(response) => {
                    let (parked, sender) = kept.take().expect("a kept connection's exchange polled after it was done");
                    to.parking.put_back(&to.upstreams.idle, to.authority, parked, sender);
                    return Poll::Ready(Ok(response));
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) => {
                        tracing::debug!(error = %e.error(), "kept upstream connection was closed; reconnecting");
                        kept.take();
                        (unsent, *to)
                    }
                    None => return Poll::Ready(Err(UpstreamError::exchange(e.into_error()))),
                },
            },
        };
        // Handed back before a byte was written: the upstream had closed the
        // idle connection. Safe to send on a fresh one, if a slot is free
        // now: this request holds a key's turn and its timeout is running,
        // so it does not wait.
        let Destined { upstreams, authority, tls, slots, parking, handover } = to;
        let mut future: RareSend<'a> = Box::pin(async move {
            tokio::task::yield_now().await;
            let slot = upstreams.slot(slots, Instant::now(), parking).await?;
            upstreams.send_on_new(authority, tls, slot, unsent, parking, handover).await
        });
        let polled = future.as_mut().poll(cx);
        if polled.is_pending() {
            self.set(Sending::Rare { future });
        }
        polled
    }
}

/// The client connection's idle upstream connections, and its share of each
/// route's slots.
#[derive(Clone, Default)]
pub struct Upstreams {
    idle: Arc<Idle>,
    shares: Arc<Shares>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

impl Upstreams {
    /// A way to `authority` for a request of the route of `slots`: an idle
    /// connection of that route parked where `parking` says, or a slot of the
    /// route's (within this client connection's share) for a new one, waiting
    /// for it at most `wait`. Nothing is sent yet, so a refusal here leaves
    /// the upstream untouched.
    pub async fn checkout(
        &self,
        authority: &Authority,
        slots: &UpstreamSlots,
        wait: Duration,
        parking: Parking,
    ) -> Result<Checkout, UpstreamError> {
        if parking == Parking::Multiplexed {
            // Boxed, as the wait below: HTTP/1.1 upstreams are the common case.
            let way = Box::pin(h2::checkout(authority, slots, wait)).await?;
            return Ok(Checkout(Way::Http2(way), parking));
        }
        if let Some((parked, sender)) = parking.take(&self.idle, slots.pool(), authority) {
            return Ok(Checkout(Way::Kept(parked, sender), parking));
        }
        // Boxed: the wait is the rare path, and inline it would make every
        // request's future larger (and every move of it longer).
        let slot = Box::pin(self.slot(slots, Instant::now() + wait, parking)).await?;
        Ok(Checkout(Way::Slot(slot), parking))
    }

    /// A slot of the route's by `deadline`; for an HTTP/2 client, first one
    /// of this client connection's share of the route. (An HTTP/1.1 client
    /// has one request in flight at a time, so it pins one connection at
    /// most, and its connections serve every client of the worker: counting
    /// them in the share of the client that opened them would hold that
    /// client's share with other clients' requests.)
    async fn slot(&self, slots: &UpstreamSlots, deadline: Instant, parking: Parking) -> Result<Slot, UpstreamError> {
        let share = (parking == Parking::Client).then(|| self.shares.of(slots));
        Slot::acquire(slots, share, deadline).await
    }

    /// Sends `req` to `authority` the way `checkout` gives, over `tls` when
    /// the route's upstream is https. The exchange on a kept connection is
    /// polled in place; a new connection, and sending again a request a kept
    /// connection handed back unsent, are the rare paths, boxed: inline, the
    /// connect and the handshake would make every request's future several
    /// times larger (and every move of it longer).
    pub fn send<'a>(
        &'a self,
        authority: &'a Authority,
        tls: Option<&'a UpstreamTls>,
        slots: &'a UpstreamSlots,
        checkout: Checkout,
        mut req: Request<RequestBody>,
        handover: Option<&'a Arc<Handover>>,
    ) -> impl Future<Output = Result<Response<Incoming>, UpstreamError>> + Send + 'a {
        let Checkout(way, parking) = checkout;
        if let Some(handover) = handover {
            req.body_mut().report_to(handover);
        }
        match way {
            Way::Slot(slot) => {
                Sending::Rare { future: Box::pin(self.send_on_new(authority, tls, slot, req, parking, handover)) }
            }
            Way::Http2(way) => Sending::Rare { future: Box::pin(h2::send(way, authority, tls, slots, req, handover)) },
            Way::Kept(parked, mut sender) => {
                if let Some(handover) = handover {
                    handover.went_on(parked.teardown().clone());
                }
                Sending::Kept {
                    exchange: sender.try_send_request(req),
                    kept: Some((parked, sender)),
                    to: Destined { upstreams: self, authority, tls, slots, parking, handover },
                }
            }
        }
    }

    /// `send` on a new connection in `slot`. The rare path, boxed by `send`:
    /// inline, the connect and the handshake would make every request's
    /// future several times larger.
    async fn send_on_new(
        &self,
        authority: &Authority,
        tls: Option<&UpstreamTls>,
        slot: Slot,
        req: Request<RequestBody>,
        parking: Parking,
        handover: Option<&Arc<Handover>>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let (parked, mut sender) = connect(authority, tls, slot).await?;
        if let Some(handover) = handover {
            handover.went_on(parked.teardown().clone());
        }
        match sender.send_request(req).await {
            Ok(response) => {
                parking.put_back(&self.idle, authority, parked, sender);
                Ok(response)
            }
            Err(e) => Err(connect::first_exchange_failed(authority, tls, e)),
        }
    }
}

/// Opens an HTTP/1.1 connection to `authority` in `slot`, over `tls` if
/// given, and starts its driver.
async fn connect(
    authority: &Authority,
    tls: Option<&UpstreamTls>,
    slot: Slot,
) -> Result<(Arc<Parked>, Sender), UpstreamError> {
    let stream = connect::open_with_retries(authority, tls).await?;
    let teardown = Teardown::new(false);
    let io = TokioIo::new(Resettable::new(stream, &teardown));
    let (sender, conn) = http1::Builder::new().handshake(io).await.map_err(UpstreamError::connect)?;
    let parked = Parked::new(&slot, teardown.clone());
    tokio::spawn(drive(conn, slot, Arc::downgrade(&parked), teardown));
    Ok((parked, sender))
}

type Connection = http1::Connection<TokioIo<Resettable>, RequestBody>;

/// What woke a connection's driver.
enum Woken {
    /// The connection ended.
    Ended,
    /// It was idle while a request waited for its slot, and was closed.
    Shed,
    /// A request started waiting: look again with fresh notifications.
    Asked,
    /// The idle timer went off: close the connection if it has been idle
    /// for the route's `upstream_idle_timeout`.
    IdleCheck,
    /// A request asked for the connection to be torn down.
    TornDown,
}

/// Runs one upstream connection until it ends, holding its slot; closes it
/// early once it is idle while a request waits for that slot, or once it has
/// been idle for the route's `upstream_idle_timeout`. A connection only turns
/// idle while it is polled here (its last response's end is read in that
/// poll), so looking after every poll misses none, and a request that starts
/// waiting wakes the idle ones. The idle timer goes off at most once per
/// timeout and looks at when the connection was last parked.
async fn drive(conn: Connection, slot: Slot, parked: Weak<Parked>, teardown: Teardown) {
    let mut conn = pin!(conn.with_upgrades());
    let mut idle_check = pin!(tokio::time::sleep(slot.idle_timeout));
    let mut torn_down = pin!(teardown.asked());
    loop {
        let mut route_asks = pin!(slot.route.shed.notified());
        let mut share_asks = pin!(async {
            match &slot.share {
                Some(share) => share.shed.notified().await,
                None => std::future::pending().await,
            }
        });
        // The timer and the two signals are looked at only when one of them
        // woke the task, not on each of the connection's wakes (watch.rs).
        let mut watchers = pin!(WokenOnly::new(std::future::poll_fn(|cx| {
            if torn_down.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woken::TornDown);
            }
            if idle_check.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woken::IdleCheck);
            }
            let asked = route_asks.as_mut().poll(cx).is_ready() | share_asks.as_mut().poll(cx).is_ready();
            if asked {
                Poll::Ready(Woken::Asked)
            } else {
                Poll::Pending
            }
        })));
        let woken = std::future::poll_fn(|cx| {
            if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "upstream connection ended with an error");
                }
                return Poll::Ready(Woken::Ended);
            }
            // Taken out of its cell, the sender can no longer be handed a
            // request; dropping the connection closes the socket.
            if slot.wanted() && parked.upgrade().and_then(|p| p.take_if_idle()).is_some() {
                return Poll::Ready(Woken::Shed);
            }
            watchers.as_mut().poll(cx)
        })
        .await;
        match woken {
            Woken::Ended => return,
            // Dropping the connection closes its socket with a reset
            // (`Resettable`): nothing it still held is written.
            Woken::TornDown => {
                tracing::debug!("tearing an upstream connection down: a request on it went past its route's timeout");
                return;
            }
            Woken::Shed => {
                tracing::debug!("closing an idle upstream connection: a request waits for its slot");
                return;
            }
            Woken::Asked => {}
            Woken::IdleCheck => {
                let now = Instant::now();
                let parked = parked.upgrade();
                match parked.as_ref().and_then(|p| p.parked_since()) {
                    Some(since) if now >= since + slot.idle_timeout => {
                        if parked.and_then(|p| p.take_if_idle()).is_some() {
                            tracing::debug!("closing an upstream connection idle for upstream_idle_timeout");
                            return;
                        }
                        // Still sending its last response's body.
                        idle_check.as_mut().reset(now + slot.idle_timeout);
                    }
                    Some(since) => idle_check.as_mut().reset(since + slot.idle_timeout),
                    // Busy: it can't be idle for long before the next look.
                    None => idle_check.as_mut().reset(now + slot.idle_timeout),
                }
            }
        }
    }
}
#[cfg(test)]
mod shedding {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use tokio::net::TcpListener;
    use tokio::sync::Semaphore;

    use super::*;

    /// An upstream that answers every request 200 "ok", keeping connections alive.
    async fn upstream() -> Authority {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                    TokioIo::new(stream),
                    hyper::service::service_fn(|_| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
                    }),
                ));
            }
        });
        authority
    }

    /// A GET through `upstreams` as an HTTP/2 client's: on its own connections.
    async fn get(upstreams: &Upstreams, authority: &Authority, slots: &UpstreamSlots) -> Result<(), UpstreamError> {
        get_parking(upstreams, authority, slots, Parking::Client).await
    }

    async fn get_parking(
        upstreams: &Upstreams,
        authority: &Authority,
        slots: &UpstreamSlots,
        parking: Parking,
    ) -> Result<(), UpstreamError> {
        let checkout = upstreams.checkout(authority, slots, Duration::from_secs(5), parking).await?;
        let request = Request::get("/").body(RequestBody::empty()).unwrap();
        let response = upstreams.send(authority, None, slots, checkout, request, None).await?;
        response.into_body().collect().await.unwrap();
        Ok(())
    }

    /// HTTP/1.1 clients of one worker thread take each other's idle
    /// connections; HTTP/2 clients keep their own.
    #[tokio::test]
    async fn http1_clients_of_a_worker_share_its_upstream_connections() {
        let authority = upstream().await;
        let slots = UpstreamSlots::new(4, Duration::from_secs(60));
        let (first, second, third) = (Upstreams::default(), Upstreams::default(), Upstreams::default());
        get_parking(&first, &authority, &slots, Parking::Worker).await.unwrap();
        get_parking(&second, &authority, &slots, Parking::Worker).await.unwrap();
        assert_eq!(slots.open(), 1, "the second client took the first's connection");
        get(&third, &authority, &slots).await.unwrap();
        assert_eq!(slots.open(), 2, "an HTTP/2 client opens its own");
        get_parking(&first, &authority, &slots, Parking::Worker).await.unwrap();
        assert_eq!(slots.open(), 2, "and does not hand it to the worker");
    }

    /// An HTTP/1.1 client's connections count in the route's cap only: one
    /// another client is using leaves the first client free to open another
    /// (with a share of one, counting it in the opener's share would make the
    /// first client wait for a request not its own).
    #[tokio::test]
    async fn a_worker_connection_in_another_clients_use_does_not_hold_its_openers_share() {
        let release = Arc::new(Semaphore::new(0));
        let authority = holding_upstream(release.clone()).await;
        let slots = UpstreamSlots::new(4, Duration::from_secs(60));
        assert_eq!(slots.share(), 1);
        let (first, second) = (Upstreams::default(), Upstreams::default());
        // The first client opens a connection and reads its response whole.
        release.add_permits(1);
        let checkout = first.checkout(&authority, &slots, Duration::ZERO, Parking::Worker).await.unwrap();
        let response = first.send(&authority, None, &slots, checkout, request(), None).await.unwrap();
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "ok");
        // The second client takes it, and keeps it busy.
        let checkout = second.checkout(&authority, &slots, Duration::ZERO, Parking::Worker).await.unwrap();
        let busy = second.send(&authority, None, &slots, checkout, request(), None).await.unwrap();
        assert_eq!(slots.open(), 1);
        // The first client is not held by its share.
        let checkout = first.checkout(&authority, &slots, Duration::ZERO, Parking::Worker).await;
        assert!(checkout.is_ok(), "refused: {:?}", checkout.err());
        drop(busy);
    }

    #[tokio::test]
    async fn at_the_cap_another_clients_idle_connection_closes_to_make_room() {
        let authority = upstream().await;
        let slots = UpstreamSlots::new(1, Duration::from_secs(60));
        let (first, second) = (Upstreams::default(), Upstreams::default());
        get(&first, &authority, &slots).await.unwrap();
        assert_eq!(slots.open(), 1, "the first client keeps its connection");
        get(&second, &authority, &slots).await.unwrap();
        assert_eq!(slots.open(), 1, "the cap held");
        assert!(
            Parking::Client.take(&first.idle, slots.pool(), &authority).is_none(),
            "the first client's idle connection was closed"
        );
    }

    /// An upstream that answers every request 200 with a two-byte body whose
    /// bytes it sends only once `release` is notified, one response each.
    async fn holding_upstream(release: Arc<Semaphore>) -> Authority {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = Authority::try_from(listener.local_addr().unwrap().to_string()).unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let release = release.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0; 1024];
                    loop {
                        let Ok(n @ 1..) = stream.read(&mut buf).await else { return };
                        head.extend_from_slice(&buf[..n]);
                        if !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            continue;
                        }
                        head.clear();
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n";
                        if stream.write_all(answer).await.is_err() {
                            return;
                        }
                        release.acquire().await.unwrap().forget();
                        if stream.write_all(b"ok").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        authority
    }

    #[tokio::test]
    async fn at_the_cap_a_connection_that_turns_idle_during_the_wait_gives_its_slot() {
        let release = Arc::new(Semaphore::new(0));
        let authority = holding_upstream(release.clone()).await;
        let slots = UpstreamSlots::new(2, Duration::from_secs(60));
        let clients: Vec<Upstreams> = (0..3).map(|_| Upstreams::default()).collect();
        // Two clients' downloads fill the route's cap.
        let mut downloads = Vec::new();
        for client in &clients[..2] {
            let checkout = client.checkout(&authority, &slots, Duration::ZERO, Parking::Client).await.unwrap();
            let response = client.send(&authority, None, &slots, checkout, request(), None).await.unwrap();
            downloads.push(response);
        }
        assert_eq!(slots.open(), 2);
        // The third waits: both connections are still sending their bodies.
        let waiting = tokio::spawn({
            let (client, authority, slots) = (clients[2].clone(), authority.clone(), slots.clone());
            async move { client.checkout(&authority, &slots, Duration::from_secs(30), Parking::Client).await.map(|_| ()) }
        });
        while !slots.pool().wanted() {
            tokio::task::yield_now().await;
        }
        // Both downloads end; their connections sit idle in their clients.
        release.add_permits(2);
        for response in downloads {
            assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "ok");
        }
        waiting.await.unwrap().expect("an idle connection gave its slot to the waiting request");
    }

    #[tokio::test]
    async fn a_connection_idle_for_the_idle_timeout_closes() {
        let authority = upstream().await;
        let slots = UpstreamSlots::new(4, Duration::from_millis(300));
        let client = Upstreams::default();
        get(&client, &authority, &slots).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Used again before the timeout: kept, and idle from then on.
        let last_used = Instant::now();
        get(&client, &authority, &slots).await.unwrap();
        assert_eq!(slots.open(), 1, "the connection was reused");
        while slots.open() > 0 {
            assert!(last_used.elapsed() < Duration::from_secs(5), "the idle connection was never closed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let idle = last_used.elapsed();
        assert!(idle >= Duration::from_millis(300), "closed after {idle:?} idle, before the timeout");
        assert!(
            Parking::Client.take(&client.idle, slots.pool(), &authority).is_none(),
            "the closed connection is not handed out"
        );
        get(&client, &authority, &slots).await.expect("a new connection is opened after the idle one closed");
    }

    #[tokio::test]
    async fn kept_connections_serve_only_the_route_they_were_opened_for() {
        let authority = upstream().await;
        let (a, b) = (UpstreamSlots::new(4, Duration::from_secs(60)), UpstreamSlots::new(4, Duration::from_secs(60)));
        let client = Upstreams::default();
        get(&client, &authority, &a).await.unwrap();
        get(&client, &authority, &b).await.unwrap();
        assert_eq!((a.open(), b.open()), (1, 1), "route b opened its own connection");
        get(&client, &authority, &a).await.unwrap();
        get(&client, &authority, &b).await.unwrap();
        assert_eq!((a.open(), b.open()), (1, 1), "each route reused its own");
    }

    #[tokio::test]
    async fn one_client_connection_holds_at_most_its_share() {
        let release = Arc::new(Semaphore::new(0));
        let authority = holding_upstream(release.clone()).await;
        let slots = UpstreamSlots::new(8, Duration::from_secs(60));
        assert_eq!(slots.share(), 2);
        let (greedy, other) = (Upstreams::default(), Upstreams::default());
        let mut held = Vec::new();
        for _ in 0..2 {
            let checkout = greedy.checkout(&authority, &slots, Duration::ZERO, Parking::Client).await.unwrap();
            held.push(greedy.send(&authority, None, &slots, checkout, request(), None).await.unwrap());
        }
        let Err(refused) = greedy.checkout(&authority, &slots, Duration::from_millis(200), Parking::Client).await
        else {
            panic!("a slot past the client connection's share");
        };
        assert!(refused.is_busy() && !refused.may_have_sent(), "{refused}");
        assert!(refused.to_string().contains("one client connection may hold"), "{refused}");
        // Another client connection is served beside it (every upstream
        // connection may now send its body).
        release.add_permits(3);
        let checkout = other.checkout(&authority, &slots, Duration::ZERO, Parking::Client).await.unwrap();
        let response = other.send(&authority, None, &slots, checkout, request(), None).await.unwrap();
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "ok");
        assert_eq!(slots.open(), 3);
    }

    fn request() -> Request<RequestBody> {
        Request::get("/").body(RequestBody::empty()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_route_refuses_with_nothing_sent() {
        let slots = UpstreamSlots::new(1, Duration::from_secs(60));
        let _taken = slots.acquire(Duration::ZERO).await.unwrap();
        let authority = Authority::from_static("127.0.0.1:1");
        let Err(refused) =
            Upstreams::default().checkout(&authority, &slots, Duration::from_millis(300), Parking::Client).await
        else {
            panic!("a slot past the cap");
        };
        assert!(refused.is_busy() && !refused.may_have_sent(), "{refused}");
    }
}
