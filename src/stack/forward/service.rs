//! The forward service: [`Forward`], one per client connection, and what it
//! does with each request.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};
use std::time::Duration;

use http::{Response, StatusCode};
use tokio::time::{Instant, Sleep};
use tower::Service;

use super::prepare::prepare;
use super::upgrade::splice;
use super::SlotTaken;
use crate::http::ProxyBody;
use crate::http::RequestBody;
use crate::proxy::{strip_hop_by_hop, ClientAddr, StreamHeld, UpstreamError, Upstreams};
use crate::stack::error::ProxyError;
use crate::stack::router::Routed;
use crate::telemetry::traces;

/// The innermost service: sends a request to its route's upstream, on an
/// upstream connection of the worker's (HTTP/1.1 clients) or of the client
/// connection's own (HTTP/2; proxy/pool/parking.rs says why). Make one per client
/// connection. The layers above clone it for every request: one count, of
/// this connection's, is all a clone touches.
#[derive(Clone, Debug)]
pub struct Forward(Arc<ClientSide>);

#[derive(Debug)]
struct ClientSide {
    upstreams: Upstreams,
    client: ClientAddr,
    /// The flag of this connection's fenced requests over HTTP/1.1, one at a
    /// time (see [`Forwarder::slot_flag`]).
    slot_taken: SlotTaken,
    /// The timer of this connection's forwards' timeouts.
    timer: Timer,
}

impl Forward {
    /// Its client.
    pub fn client(&self) -> &ClientAddr {
        &self.0.client
    }

    /// Whether its client speaks TLS.
    pub fn over_tls(&self) -> bool {
        self.0.client.is_tls()
    }

    /// The forwarder of the client connection `client`.
    pub fn of(client: ClientAddr) -> Forward {
        Forward(Arc::new(ClientSide {
            upstreams: Upstreams::default(),
            client,
            slot_taken: SlotTaken::default(),
            timer: Timer::default(),
        }))
    }
}

/// Where the fence sends the requests it lets through: [`Forward`], or any
/// tower service (tests). A trait of its own rather than `tower::Service`, so
/// the forward's future needs no name: it rides inside the fence's one boxed
/// future, not in a box of its own.
pub trait Forwarder<B>: Clone + Send + 'static {
    /// Sends `request` upstream; resolves with the response head.
    fn send(self, request: Routed<B>) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send;

    /// A cleared flag for a fenced request of `version` to be sent (its
    /// [`Routed::slot_taken`]).
    fn slot_flag(&self, _version: http::Version) -> SlotTaken {
        SlotTaken::default()
    }
}

impl Forwarder<RequestBody> for Forward {
    fn send(
        self,
        request: Routed<RequestBody>,
    ) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send {
        forward(self, request)
    }

    /// An HTTP/1.1 connection has one request at a time in the fence: the
    /// next is not read before the last one's response head has come, and
    /// only a connection its client closed has a forward left running. So
    /// its requests share one flag, the connection's (no allocation per
    /// request); an HTTP/2 connection's streams each get their own.
    fn slot_flag(&self, version: http::Version) -> SlotTaken {
        if version == http::Version::HTTP_2 {
            SlotTaken::default()
        } else {
            self.0.slot_taken.renewed()
        }
    }
}

impl<S, B> Forwarder<B> for S
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = ProxyError> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    fn send(self, request: Routed<B>) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send {
        tower::ServiceExt::oneshot(self, request)
    }
}

/// Sends a routed request to its route's upstream. The head is rewritten
/// before the first await, so the future keeps only what it still needs (it
/// rides in every fenced request's box, and every move of it copies it all).
fn forward(
    connection: Forward,
    req: Routed<RequestBody>,
) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send {
    let Routed { route, request, fenced, destination, slot_taken, .. } = req;
    let mut prepared = prepare(&connection.0.client, &route, request, fenced, destination);
    // Open until the response head (or the failure): the exchange's span.
    // Its trace context is written here, not in the future: a request the
    // future borrows is kept apart from the send's state, not overlapped.
    let exchange = traces::upstream_span();
    if let Ok((request, _)) = &mut prepared {
        traces::pass_on(&exchange, request.headers_mut());
    }
    async move {
        let (request, upgrade) = prepared?;
        // A way to the upstream first, outside the timeout: at the route's cap
        // the wait for a slot is bounded by `queue_timeout` and ends, if no slot
        // frees, in a refusal with nothing sent, never in an unknown outcome.
        let upstreams = &connection.0.upstreams;
        let (authority, tls, slots) = (&route.upstream.authority, route.upstream_tls.as_ref(), &route.upstream_slots);
        let checkout = upstreams.checkout(authority, slots, route.queue_timeout, upgrade.parking).await?;
        if let Some(taken) = &slot_taken {
            taken.mark();
        }
        let handover = slot_taken.as_ref().map(SlotTaken::handover);
        // The timeout covers connecting, retries and backoff included. A
        // fenced request past it has its HTTP/1.1 connection torn down
        // before the error goes back (and with it the key's settle period
        // starts): a graceful close would still write out what the kernel
        // held of the request. (Over HTTP/2, dropping the exchange resets
        // its stream.)
        let (answered, teardown) = {
            let mut sending = std::pin::pin!(upstreams.send(authority, tls, slots, checkout, request, handover));
            let answered = connection.0.timer.within(route.timeout, sending.as_mut()).await;
            let on = handover.filter(|_| answered.is_err()).and_then(|h| h.connection());
            (answered, on.filter(|connection| !connection.is_multiplexed()))
        };
        if let Some(teardown) = teardown {
            teardown.tear_down().await;
        }
        let mut response = match answered {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                // A streamed body that overran the route's limit (an unfenced one,
                // or a fenced one on a `stream_body` route): the client's fault,
                // but part of it reached the upstream, so a fenced write settles.
                if crate::http::overran_limit(&e) {
                    return Err(ProxyError::BodyTooLarge { limit: route.max_body, partly_sent: true });
                }
                return Err(e.into());
            }
            Err(Elapsed) => return Err(ProxyError::UpstreamTimeout(route.timeout)),
        };

        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching && !upgrade.asked {
            // The upstream took over the connection for a request that never
            // asked it to: whatever it does with the request is unknown (a
            // fenced write settles), and nothing of the switch is relayed.
            return Err(UpstreamError::exchange(UNREQUESTED_SWITCH).into());
        }
        if switching {
            if let Some(client_upgrade) = upgrade.client {
                let upstream_upgrade = hyper::upgrade::on(&mut response);
                tokio::spawn(splice(client_upgrade, upstream_upgrade));
            }
        }
        strip_hop_by_hop(response.headers_mut(), switching && upgrade.asked, |_| false);
        let stream = response.extensions_mut().remove::<StreamHeld>().map(StreamHeld::into_guard);
        Ok(response.map(|body| ProxyBody::upstream(body).holding(stream)))
    }
}

/// A client connection's timer for its forwards' timeouts: one [`Sleep`]
/// for all its requests, rather than a timer made, registered with the
/// runtime's wheel and taken out of it again for each. HTTP/1.1 requests come
/// one at a time, so one timer serves them all; an HTTP/2 stream that finds
/// it in use gets one of its own.
///
/// The timer is moved to a request's deadline lazily: one it holds for an
/// earlier request (an earlier deadline) is left to go off, and only then
/// set for the request's own, so most requests set no timer at all (a timer
/// set takes a division and the wheel's lock). It never holds a deadline
/// later than the request's: those are set at once. Left with the last
/// request's task to wake, a connection idle past that request's deadline
/// is woken once for nothing: cheaper than a timer made per request.
#[derive(Debug, Default)]
struct Timer(Mutex<Option<Pin<Box<Sleep>>>>);

/// The route's timeout passed before the upstream's answer came.
#[derive(Debug)]
struct Elapsed;

impl Timer {
    /// `exchange`'s output, or [`Elapsed`] once `timeout` has passed: what
    /// `tokio::time::timeout(timeout, exchange)` gives, timed out on the
    /// same tick. The exchange is polled first; the timer only when it may
    /// have news: on the first poll, when it went off, or when the task
    /// polling changed (it wakes the task that last polled it).
    async fn within<F: Future>(&self, timeout: Duration, mut exchange: Pin<&mut F>) -> Result<F::Output, Elapsed> {
        // As tokio's: a deadline past what an `Instant` holds never comes.
        let Some(deadline) = Instant::now().checked_add(timeout) else {
            return Ok(exchange.await);
        };
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        let mut timer = match kept {
            Some(mut timer) => {
                if timer.deadline() > deadline {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        // The task the timer wakes, once it has been polled.
        let mut waking: Option<Waker> = None;
        let answered = poll_fn(|cx| {
            if let Poll::Ready(output) = exchange.as_mut().poll(cx) {
                return Poll::Ready(Ok(output));
            }
            if !timer.is_elapsed() && waking.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                return Poll::Pending;
            }
            loop {
                // Outside the task's budget, always: a timer refused by the
                // budget answers Pending without registering to wake anyone,
                // and the shortcut above would then never poll it again.
                match Pin::new(&mut tokio::task::coop::unconstrained(timer.as_mut())).poll(cx) {
                    Poll::Pending => {
                        waking = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                    Poll::Ready(()) if timer.deadline() >= deadline => return Poll::Ready(Err(Elapsed)),
                    // An earlier request's deadline: now this one's.
                    Poll::Ready(()) => timer.as_mut().reset(deadline),
                }
            }
        })
        .await;
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(timer);
        answered
    }
}

/// Why a 101 to a request that did not ask to switch protocols is an error.
const UNREQUESTED_SWITCH: &str =
    "the upstream answered 101 Switching Protocols to a request that did not ask to switch protocols";

#[cfg(test)]
mod tests {
    use super::*;

    /// An exchange that answers `after` from now.
    async fn answering(after: Duration) -> &'static str {
        tokio::time::sleep(after).await;
        "answered"
    }

    /// A request whose first poll comes with its task's budget spent still
    /// times out: a timer the budget refused would never wake it (the
    /// upstream's write could then land after a newer one).
    #[tokio::test(start_paused = true)]
    async fn a_timeout_first_polled_with_the_budget_spent_still_goes_off() {
        let ours = tokio::spawn(async {
            let timer = Timer::default();
            for _ in 0..128 {
                tokio::task::consume_budget().await;
            }
            let exchange = std::pin::pin!(std::future::pending::<()>());
            timer.within(Duration::from_millis(10), exchange).await.is_err()
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(ours.is_finished(), "the timeout never went off");
        assert!(ours.await.unwrap());
    }

    /// The timeout of each request, on the connection's one timer, as
    /// `tokio::time::timeout` would time it: a deadline kept from an
    /// earlier request neither cuts a later one short nor lets it run
    /// long, whichever of the two is longer.
    #[tokio::test(start_paused = true)]
    async fn each_request_times_out_at_its_own_deadline_on_the_shared_timer() {
        let timer = Timer::default();
        let within = |timeout: u64, answer: u64| {
            let timer = &timer;
            async move {
                let start = Instant::now();
                let exchange = std::pin::pin!(answering(Duration::from_millis(answer)));
                let answered = timer.within(Duration::from_millis(timeout), exchange).await;
                (answered.is_ok(), start.elapsed())
            }
        };
        // Answered in time: the timer is kept with a deadline still to come.
        assert_eq!(within(1_000, 10).await, (true, Duration::from_millis(10)));
        // A later request: the kept deadline goes off first, and is moved on.
        assert_eq!(within(1_000, 2_000).await, (false, Duration::from_millis(1_000)));
        assert_eq!(within(5_000, 3_000).await, (true, Duration::from_millis(3_000)));
        // A shorter timeout than the deadline kept: set at once.
        assert_eq!(within(100, 2_000).await, (false, Duration::from_millis(100)));
        // The timer went off and was kept: the next request sets it afresh.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(within(300, 200).await, (true, Duration::from_millis(200)));
        assert_eq!(within(300, 400).await, (false, Duration::from_millis(300)));
        // Exactly as tokio's own, side by side.
        for (timeout, answer) in [(250, 249), (250, 250), (250, 251)] {
            let ours = within(timeout, answer).await;
            let start = Instant::now();
            let theirs = tokio::time::timeout(Duration::from_millis(timeout), answering(Duration::from_millis(answer)))
                .await
                .is_ok();
            assert_eq!(ours, (theirs, start.elapsed()), "{timeout} ms, answered after {answer} ms");
        }
    }

    /// An HTTP/1.1 connection's fenced requests share its flag, cleared for
    /// each (a flag left set would make the next request's forward outlive
    /// a client that left before anything was sent); HTTP/2 streams each
    /// get one of their own.
    #[test]
    fn http1_requests_share_a_cleared_flag_and_http2_streams_get_their_own() {
        let forward = Forward::of(ClientAddr::new(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
        let first = forward.slot_flag(http::Version::HTTP_11);
        first.mark();
        assert!(first.is_taken());
        let second = forward.slot_flag(http::Version::HTTP_11);
        assert!(!second.is_taken() && !first.is_taken(), "the connection's flag, cleared");
        let stream = forward.slot_flag(http::Version::HTTP_2);
        second.mark();
        assert!(!stream.is_taken(), "a stream's flag is its own");
    }
}
