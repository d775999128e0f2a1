//! An HTTP/1.1 upstream connection: opened in its slot, then run by a task
//! of its own that holds the slot until the connection ends. The task closes
//! it early once it is idle while a request waits for the slot, or once it
//! has been idle for the route's `upstream_idle_timeout`, and tears it down
//! when asked (`http/teardown.rs`).

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Weak};
use std::task::Poll;

use http::uri::Authority;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::connect::open_with_retries;
use super::parking::{Parked, Sender};
use super::slots::Slot;
use crate::config::UpstreamTls;
use crate::http::teardown::{Resettable, Teardown};
use crate::http::RequestBody;
use crate::http::WokenOnly;
use crate::proxy::error::UpstreamError;

/// Opens an HTTP/1.1 connection to `authority` in `slot`, over `tls` if
/// given, and starts its driver.
pub(super) async fn connect(
    authority: &Authority,
    tls: Option<&UpstreamTls>,
    slot: Slot,
) -> Result<(Arc<Parked>, Sender), UpstreamError> {
    let stream = open_with_retries(authority, tls).await?;
    let teardown = Teardown::new(false);
    let io = TokioIo::new(Resettable::new(stream, &teardown));
    // Bodies queued for a vectored write, not copied into the head's buffer
    // (hyper's default here): that buffer stays with the connection while it
    // is parked, and a large upload would leave it hundreds of KiB wide.
    let (sender, conn) = http1::Builder::new().handshake(io).await.map_err(UpstreamError::connect)?;
    let parked = Parked::new(authority, &slot, teardown.clone());
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
        // woke the task, not on each of the connection's wakes (http/woken.rs).
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
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use http_body_util::BodyExt;
    use tokio::sync::Semaphore;
    use tokio::time::Instant;

    use crate::proxy::pool::testing::{get, holding_upstream, request, upstream};
    use crate::proxy::pool::{Parking, Upstreams};
    use crate::proxy::UpstreamSlots;

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
            Parking::Client.take(&first.idle, slots.route(), &authority).is_none(),
            "the first client's idle connection was closed"
        );
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
        while !slots.route().wanted() {
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
            Parking::Client.take(&client.idle, slots.route(), &authority).is_none(),
            "the closed connection is not handed out"
        );
        get(&client, &authority, &slots).await.expect("a new connection is opened after the idle one closed");
    }
}
