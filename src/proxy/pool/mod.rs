//! The upstream connections, and the checkout: which one a request takes.
//! An HTTP/1.1 client takes an idle connection of its worker thread's, an
//! HTTP/2 client one of its own (`parking.rs` says why), before it opens one;
//! on a route with `upstream_http2`, every client's requests take streams on
//! the worker's HTTP/2 connections (`h2/`). Every open connection holds a
//! slot of its route's cap; a request that needs a new one when none is free
//! waits for one, then is refused with nothing sent (`slots.rs`).
//!
//! Retries: only what never reached the upstream is sent again.
//! - Connecting, the TLS handshake included, is retried (with backoff): it
//!   happens before the request is handed to a connection, so not one byte of
//!   it was sent (`connect.rs`).
//! - A request that a kept connection hands back unsent (the upstream had
//!   closed it while idle) goes out on a fresh connection.
//! - Anything else (a connection that broke after sending, a timeout) is never
//!   retried: the upstream may have acted on it. That holds for every method,
//!   fenced or not. (An HTTP/2 upstream also says which streams it refused
//!   unprocessed: `h2/`.)
//!
//! Each file uses only those listed after it, and `http/teardown.rs` below
//! them all; no two use each other: `h2/` (HTTP/2 connections and their
//! streams), `h1.rs` (an HTTP/1.1 connection and the task that runs it),
//! `parking.rs` (idle HTTP/1.1 connections), `connect.rs` (TCP and TLS),
//! `slots.rs` (the cap and its accounting).

mod connect;
mod h1;
mod h2;
mod parking;
mod slots;
#[cfg(test)]
mod testing;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::config::UpstreamTls;
use crate::http::{Handover, RequestBody};
use crate::proxy::error::UpstreamError;

pub use h2::StreamHeld;
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
                    to.parking.put_back(&to.upstreams.idle, parked, sender);
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
        if let Some((parked, sender)) = parking.take(&self.idle, slots.route(), authority) {
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
    /// connect and the handshake would make every request's future larger
    /// (and every move of it longer; docs/perf-log.md).
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
    /// future larger.
    async fn send_on_new(
        &self,
        authority: &Authority,
        tls: Option<&UpstreamTls>,
        slot: Slot,
        req: Request<RequestBody>,
        parking: Parking,
        handover: Option<&Arc<Handover>>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let (parked, mut sender) = h1::connect(authority, tls, slot).await?;
        if let Some(handover) = handover {
            handover.went_on(parked.teardown().clone());
        }
        match sender.send_request(req).await {
            Ok(response) => {
                parking.put_back(&self.idle, parked, sender);
                Ok(response)
            }
            Err(e) => Err(connect::first_exchange_failed(authority, tls, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tokio::sync::Semaphore;

    use super::testing::{get, get_parking, holding_upstream, request, upstream};
    use super::*;

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
