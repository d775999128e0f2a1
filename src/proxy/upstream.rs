//! The upstream connections: each client connection keeps the ones its
//! requests used, and each route caps how many are open at once over all
//! client connections.
//!
//! Each client connection keeps the upstream connections its requests used,
//! idle between requests: an HTTP/1.1 client (one request at a time) needs one,
//! an HTTP/2 client as many as it has requests in flight at once. There is no
//! pool shared between client connections to look up, lock or hash on every
//! request, and the upstream exchange stays on the worker thread that serves
//! the client. They close with the client connection.
//!
//! The cap: every open upstream connection, busy or idle, holds one of its
//! route's [`UpstreamSlots`] until it closes, so HTTP/2 streams whose responses
//! are never read pin at most `max_upstream_connections` of them. A request
//! that needs a new connection when none is free asks the route's idle
//! connections (those of every client connection) to close, and waits for a
//! slot up to the route's `queue_timeout`; then it is refused (503
//! `upstream-busy`) with nothing sent.
//!
//! Retries: only what never reached the upstream is sent again.
//! - Connecting is retried (with backoff): it happens before the request is
//!   handed to a connection, so not one byte of it was sent.
//! - A request that a kept connection hands back unsent (the upstream had
//!   closed it while idle) goes out on a fresh connection.
//! - Anything else (a connection that broke after sending, a timeout) is never
//!   retried: the upstream may have acted on it. That holds for every method,
//!   fenced or not.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::error::{BoxError, UpstreamError};
use crate::body::RequestBody;

/// Connection attempts after the first.
pub const MAX_RETRIES: u32 = 3;
/// Wait before the first retry; doubled for each one after it.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(25);
/// Connecting to the upstream gives up after this long (then retries).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle upstream connections one client connection keeps at most; an HTTP/2
/// burst beyond this opens connections that close after their request.
const MAX_IDLE: usize = 32;

type Sender = http1::SendRequest<RequestBody>;

/// One route's cap on open upstream connections, shared by every client
/// connection and HTTP/2 stream. Clones share the cap.
#[derive(Clone)]
pub struct UpstreamSlots {
    inner: Arc<SlotsInner>,
}

struct SlotsInner {
    /// One permit per open upstream connection, busy or idle.
    free: Arc<Semaphore>,
    cap: usize,
    /// Asks every idle connection of the route to close: a request is
    /// waiting for a slot.
    shed: Notify,
}

impl std::fmt::Debug for UpstreamSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamSlots").field("cap", &self.inner.cap).finish_non_exhaustive()
    }
}

impl UpstreamSlots {
    /// At most `cap` upstream connections open at once (at least one).
    pub fn new(cap: usize) -> UpstreamSlots {
        let cap = cap.clamp(1, Semaphore::MAX_PERMITS);
        UpstreamSlots { inner: Arc::new(SlotsInner { free: Arc::new(Semaphore::new(cap)), cap, shed: Notify::new() }) }
    }

    /// A cap of the same size that shares nothing with this one: each running
    /// fencegate counts its own connections.
    pub fn fresh(&self) -> UpstreamSlots {
        UpstreamSlots::new(self.inner.cap)
    }

    pub fn cap(&self) -> usize {
        self.inner.cap
    }

    /// Upstream connections open now.
    pub fn open(&self) -> usize {
        self.inner.cap - self.inner.free.available_permits()
    }

    /// A slot for a new connection: at once if one is free; otherwise the
    /// route's idle connections are asked to close, and the wait for one of
    /// theirs, or of a busy one that ends, lasts at most `wait`.
    async fn acquire(&self, wait: Duration) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = self.inner.free.clone().try_acquire_owned() {
            return Some(slot);
        }
        self.inner.shed.notify_waiters();
        tokio::time::timeout(wait, self.inner.free.clone().acquire_owned()).await.ok()?.ok()
    }
}

/// An upstream connection's sender while no request uses it. The client
/// connection owns the cell; the connection's driver task only looks into it,
/// to close the connection if it is idle when its route needs the slot.
#[derive(Default)]
struct Parked {
    sender: Mutex<Option<Sender>>,
}

impl Parked {
    /// Takes the sender out if it is parked and has finished its last
    /// response: the connection may then close without cutting anything.
    fn take_if_idle(&self) -> Option<Sender> {
        let mut sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if sender.as_ref().is_some_and(Sender::is_ready) {
            sender.take()
        } else {
            None
        }
    }
}

/// How a request reaches the upstream: on a kept connection, or on a new one
/// for which it holds a slot.
pub struct Checkout(Way);

enum Way {
    Kept(Arc<Parked>, Sender),
    Slot(OwnedSemaphorePermit),
}

/// The client connection's idle upstream connections.
#[derive(Clone, Default)]
pub struct Upstreams {
    idle: Arc<Mutex<Vec<Kept>>>,
}

/// A kept connection: where it goes, and the cell its sender is parked in.
type Kept = (Authority, Arc<Parked>);

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

impl Upstreams {
    /// A way to `authority`: an idle connection of this client connection's,
    /// or a slot of `slots` for a new one, waiting for it at most `wait`.
    /// Nothing is sent yet, so a refusal here leaves the upstream untouched.
    pub async fn checkout(
        &self,
        authority: &Authority,
        slots: &UpstreamSlots,
        wait: Duration,
    ) -> Result<Checkout, UpstreamError> {
        if let Some((parked, sender)) = self.take(authority) {
            return Ok(Checkout(Way::Kept(parked, sender)));
        }
        match slots.acquire(wait).await {
            Some(slot) => Ok(Checkout(Way::Slot(slot))),
            None => Err(UpstreamError::busy(slots.cap(), wait)),
        }
    }

    /// Sends `req` to `authority` the way `checkout` gives.
    pub async fn send(
        &self,
        authority: &Authority,
        slots: &UpstreamSlots,
        checkout: Checkout,
        mut req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let slot = match checkout.0 {
            Way::Slot(slot) => slot,
            Way::Kept(parked, mut sender) => match sender.try_send_request(req).await {
                Ok(response) => {
                    self.put_back(authority, parked, sender);
                    return Ok(response);
                }
                Err(mut e) => match e.take_message() {
                    // Handed back before a byte was written: the upstream had
                    // closed the idle connection. Safe to send on a fresh one,
                    // if a slot is free now: this request holds a key's turn
                    // and its timeout is running, so it does not wait.
                    Some(unsent) => {
                        tracing::debug!(error = %e.error(), "kept upstream connection was closed; reconnecting");
                        req = unsent;
                        drop(sender);
                        tokio::task::yield_now().await;
                        match slots.acquire(Duration::ZERO).await {
                            Some(slot) => slot,
                            None => return Err(UpstreamError::busy(slots.cap(), Duration::ZERO)),
                        }
                    }
                    None => return Err(UpstreamError::exchange(e.into_error())),
                },
            },
        };
        let (parked, mut sender) = connect(authority, slot, slots).await?;
        match sender.send_request(req).await {
            Ok(response) => {
                self.put_back(authority, parked, sender);
                Ok(response)
            }
            Err(e) => Err(UpstreamError::exchange(e)),
        }
    }

    /// An idle, still open connection to `authority` that has finished its
    /// last response; closed ones (and ones closed to make room) are dropped,
    /// and ones still sending a response body are left for later: at the
    /// route's cap a request then waits for a slot instead of being refused
    /// by a busy connection of its own client's.
    fn take(&self, authority: &Authority) -> Option<(Arc<Parked>, Sender)> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|(_, parked)| {
            parked.sender.lock().unwrap_or_else(PoisonError::into_inner).as_ref().is_some_and(|s| !s.is_closed())
        });
        let at = idle.iter().rposition(|(to, parked)| {
            to == authority
                && parked.sender.lock().unwrap_or_else(PoisonError::into_inner).as_ref().is_some_and(Sender::is_ready)
        })?;
        let (_, parked) = idle.swap_remove(at);
        let sender = parked.sender.lock().unwrap_or_else(PoisonError::into_inner).take()?;
        Some((parked, sender))
    }

    /// Keeps `sender` for the next request. It may still be finishing this
    /// one's response body; a request that finds it busy gets the request back
    /// unsent and opens another.
    fn put_back(&self, authority: &Authority, parked: Arc<Parked>, sender: Sender) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            *parked.sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
            idle.push((authority.clone(), parked));
        }
    }
}

/// Opens a connection to `authority` in `slot`, retrying failures with
/// backoff: nothing has been sent yet, so a retry can't apply anything twice.
async fn connect(
    authority: &Authority,
    slot: OwnedSemaphorePermit,
    slots: &UpstreamSlots,
) -> Result<(Arc<Parked>, Sender), UpstreamError> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        match try_connect(authority).await {
            Ok((sender, conn)) => {
                let parked = Arc::new(Parked::default());
                tokio::spawn(drive(conn, slot, slots.clone(), Arc::downgrade(&parked)));
                return Ok((parked, sender));
            }
            Err(e) if attempt == MAX_RETRIES => return Err(UpstreamError::connect(e)),
            Err(e) => {
                tracing::debug!(attempt, error = %e, "upstream connect failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
        }
    }
}

type Connection = http1::Connection<TokioIo<TcpStream>, RequestBody>;

async fn try_connect(authority: &Authority) -> Result<(Sender, Connection), BoxError> {
    let addr = (authority.host().trim_start_matches('[').trim_end_matches(']'), authority.port_u16().unwrap_or(80));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(connected) => connected?,
        Err(_) => {
            let what = format!("connecting to {authority} timed out after {CONNECT_TIMEOUT:?}");
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, what).into());
        }
    };
    stream.set_nodelay(true)?;
    Ok(http1::Builder::new().handshake(TokioIo::new(stream)).await?)
}

/// Runs one upstream connection until it ends, holding its route slot; closes
/// it early if it is idle when the route needs the slot.
async fn drive(conn: Connection, _slot: OwnedSemaphorePermit, slots: UpstreamSlots, parked: Weak<Parked>) {
    let conn = conn.with_upgrades();
    tokio::pin!(conn);
    loop {
        let shed = slots.inner.shed.notified();
        tokio::select! {
            // The connection first: polled, it notes that its last response
            // is done, so an idle connection reads as idle below.
            biased;
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "upstream connection ended with an error");
                }
                return;
            }
            () = shed => {
                // Taken out of its cell, the sender can no longer be handed a
                // request; dropping the connection closes the socket.
                if parked.upgrade().and_then(|p| p.take_if_idle()).is_some() {
                    tracing::debug!("closing an idle upstream connection: its route needs the slot");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_a_slot_is_waited_for_then_refused() {
        let slots = UpstreamSlots::new(2);
        let a = slots.acquire(Duration::ZERO).await.unwrap();
        let _b = slots.acquire(Duration::ZERO).await.unwrap();
        assert_eq!(slots.open(), 2);
        assert!(slots.acquire(Duration::from_secs(1)).await.is_none());
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(Duration::from_secs(5)).await.is_some() }
        });
        tokio::task::yield_now().await;
        drop(a);
        assert!(waiting.await.unwrap(), "a slot given back goes to the request waiting for one");
        assert_eq!(slots.fresh().open(), 0, "a fresh cap shares nothing");
    }
}

#[cfg(test)]
mod shedding {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use tokio::net::TcpListener;

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

    async fn get(upstreams: &Upstreams, authority: &Authority, slots: &UpstreamSlots) -> Result<(), UpstreamError> {
        let checkout = upstreams.checkout(authority, slots, Duration::from_secs(5)).await?;
        let request =
            Request::get("/").body(RequestBody::Buffered { blocks: Default::default(), _held: None }).unwrap();
        let response = upstreams.send(authority, slots, checkout, request).await?;
        response.into_body().collect().await.unwrap();
        Ok(())
    }

    #[tokio::test]
    async fn at_the_cap_another_clients_idle_connection_closes_to_make_room() {
        let authority = upstream().await;
        let slots = UpstreamSlots::new(1);
        let (first, second) = (Upstreams::default(), Upstreams::default());
        get(&first, &authority, &slots).await.unwrap();
        assert_eq!(slots.open(), 1, "the first client keeps its connection");
        get(&second, &authority, &slots).await.unwrap();
        assert_eq!(slots.open(), 1, "the cap held");
        assert!(first.take(&authority).is_none(), "the first client's idle connection was closed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_route_refuses_with_nothing_sent() {
        let slots = UpstreamSlots::new(1);
        let _taken = slots.acquire(Duration::ZERO).await.unwrap();
        let authority = Authority::from_static("127.0.0.1:1");
        let Err(refused) = Upstreams::default().checkout(&authority, &slots, Duration::from_millis(300)).await else {
            panic!("a slot past the cap");
        };
        assert!(refused.is_busy() && !refused.may_have_sent(), "{refused}");
    }
}
