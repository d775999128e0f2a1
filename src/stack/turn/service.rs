//! The turn-taking step: a checked request waits for its keys' turns (in
//! key order, within one deadline), has its marks raised under them, and is
//! forwarded to its end (on a task of its own if the client leaves first),
//! passing the turns on when the upstream answers, or after the settle period
//! when the outcome is unknown.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tokio::time::Instant;

use super::future::ResponseFuture;
use super::turns::{hold_for, pass_when_sent, sent_whole, SettlingTurns, Turns};
use crate::fence::gate::{Ask, NoTurn};
use crate::fence::store::{Entered, FenceStore};
use crate::fence::KeyGate;
use crate::http::{decide, ProxyBody};
use crate::http::{Decision, Outcome};
use crate::route::Route;
use crate::stack::error::{ProxyError, Rejection};
use crate::stack::forward::Forwarder;
use crate::stack::forward::SlotTaken;
use crate::stack::head::{check_mark, Checked, Fence};
use crate::stack::router::Routed;
use crate::telemetry::traces;

/// A request the fence lets through unfenced: forwarded as it is.
fn unfenced<F, B>(forward: F, routed: Routed<B>) -> ResponseFuture
where
    F: Forwarder<B>,
    B: Send + 'static,
{
    // Only a fenced forward must run to its end (future.rs). The two are
    // futures of their own: the larger one would size the other's box.
    ResponseFuture::new(None, || forward_unfenced(forward, routed))
}

/// A fenced request with its body ready (read whole, or streaming): it
/// waits for its keys' turns (in key order, within one deadline), has its
/// marks raised under them, and is forwarded to its end. Steps 4 to 6 of the
/// guarantee in `docs/behaviour.md` ("The guarantee, step by step"). An
/// unfenced one (`fence` is `None`) is forwarded as it is.
///
/// It takes [`Checked`] requests, so a request that was not routed and had
/// its head checked cannot take a turn.
pub(crate) fn fenced<F, St, B>(forward: F, store: Arc<St>, gate: Arc<KeyGate>, checked: Checked<B>) -> ResponseFuture
where
    F: Forwarder<B>,
    St: FenceStore,
    B: Send + 'static,
{
    let Checked { routed, fence } = checked;
    let Some(fence) = fence else {
        return unfenced(forward, routed);
    };
    let taken = forward.slot_flag(routed.request.version());
    ResponseFuture::new(Some(taken.clone()), || take_turn_and_forward(forward, store, gate, routed, fence, taken))
}

/// [`fenced`], for a request over HTTP `version` that `ready` must make
/// ready first (a fenced body read whole, a mark read from the store), in
/// one future with the rest.
pub(crate) fn fenced_after<F, St, B>(
    forward: F,
    store: Arc<St>,
    gate: Arc<KeyGate>,
    version: http::Version,
    mut ready: impl Future<Output = Result<Checked<B>, Rejection>> + Send + Unpin + 'static,
) -> ResponseFuture
where
    F: Forwarder<B>,
    St: FenceStore,
    B: Send + 'static,
{
    let taken = forward.slot_flag(version);
    let slot = taken.clone();
    ResponseFuture::new(Some(taken), move || async move {
        // Polled where the block keeps it: an `.await` would move it first.
        let Checked { routed, fence } = poll_fn(|cx| Pin::new(&mut ready).poll(cx)).await?;
        match fence {
            Some(fence) => take_turn_and_forward(forward, store, gate, routed, fence, slot).await,
            None => forward_unfenced(forward, routed).await,
        }
    })
}

/// A fenced request's way through: its keys' turns, its marks raised, its
/// forward run to its end. (An `async` block, not an `async fn`: a function's
/// future would keep its arguments twice, as given and as moved into locals.)
#[allow(clippy::manual_async_fn)]
fn take_turn_and_forward<F, St, B>(
    inner: F,
    store: Arc<St>,
    gate: Arc<KeyGate>,
    mut routed: Routed<B>,
    fence: Fence,
    taken: SlotTaken,
) -> impl Future<Output = Result<Response<ProxyBody>, Rejection>> + Send
where
    F: Forwarder<B>,
    St: FenceStore,
    B: Send + 'static,
{
    async move {
        let store = &*store;
        // Borrowed, not cloned: every worker's requests share the route, and
        // a count of it is a cache line the workers would pass back and forth.
        // The borrow ends before the request is sent; what is read after is
        // copied out first.
        let route: &Route = &routed.route;
        let timeout = route.timeout;
        let Fence { token, key, destination, at_mark } = fence;
        let reject = |e: ProxyError, key: &Arc<str>| Rejection::new(e, Some(key.clone()), Some(token));
        // Each key settles as long as its own route asks: a COPY into a route
        // that settles for 2s holds that key 2s, whatever its source route says.
        let settle = destination.as_ref().map_or(route.settle, |(_, to)| route.settle.max(to.settle));

        // The span of the step under way (traces): the wait for the turns,
        // then the store's reads and raises. One local for both, as each one
        // held across several awaits takes room of its own in the fence's box.
        let mut step = traces::turn_span();
        // After a restart on a store a previous process wrote to, that process may
        // have died with writes in flight: keys start closed for the settle period.
        if !gate.wait_reopened(settle, route.queue_timeout).await {
            return Err(reject(ProxyError::QueueTimeout(route.queue_timeout), &key));
        }
        // Every key the request writes, each with the route whose limits apply to
        // it, turns taken in key order: two requests that write the same two keys
        // (a COPY each way) then never hold one each and wait for the other.
        let (one, mut two);
        let keys: &[(&Arc<str>, &Route)] = match &destination {
            Some((dest_key, dest_route)) if *dest_key != key => {
                two = [(&key, route), (dest_key, &**dest_route)];
                two.sort_by(|a, b| a.0.cmp(b.0));
                &two
            }
            _ => {
                one = [(&key, route)];
                &one
            }
        };
        // One deadline for all of them: `queue_timeout` bounds the whole wait
        // (WaitBudget).
        // A request that writes two keys, or a key of a strict route, holds its
        // keys alone; any other shares its key with the requests carrying the
        // key's mark (fence/gate).
        let mut budget = WaitBudget::new(route.queue_timeout);
        let mut turns = Turns::default();
        for (k, r) in keys {
            let ask = match (keys.len() > 1 || r.strict, at_mark) {
                (true, _) => Ask::Alone,
                // The mark at hand was the token: nothing to decide alone.
                (false, true) => Ask::ShareAtMark,
                (false, false) => Ask::Share,
            };
            let wait = budget.left();
            match spend!(budget, gate.acquire(k, token, ask, wait)) {
                Ok(turn) => turns.push(turn),
                Err(NoTurn::Timeout) => return Err(reject(ProxyError::QueueTimeout(route.queue_timeout), &key)),
                Err(NoTurn::Stale { current }) => return Err(reject(ProxyError::StaleToken { token, current }, k)),
                Err(NoTurn::Superseded { waiting }) => {
                    return Err(reject(ProxyError::Superseded { token, waiting }, k))
                }
            }
        }
        // The turns are held: the store's step begins (the turn's span ends).
        drop(std::mem::replace(&mut step, traces::store_span()));
        // The checks that count happen with the turns held: a newer token may have
        // won while this request waited. Every mark is read first, so a request
        // refused on one key raises none (with a store replicas share, another
        // replica may still raise the second key between this read and its
        // advance: then the first key's mark moved, and nothing is forwarded).
        // The jump is measured against the mark as it is now; between this
        // read and the advance only the fence API (or another replica) can
        // move a mark, and raising it only makes the jump smaller.
        // One key of a route without a jump limit or strictness: its advance
        // refuses exactly what the read would (a token below the mark), so the
        // read is skipped.
        let advance_decides = matches!(keys, [(_, r)] if r.max_token_jump.is_none() && !r.strict);
        if !advance_decides {
            for (k, r) in keys {
                spend!(budget, check_mark(store, r, k, token)).map_err(|e| reject(e, k))?;
            }
        }
        for (k, r) in keys {
            let ask = if keys.len() > 1 || r.strict { Ask::Alone } else { Ask::Share };
            let wait = budget.left();
            // A store replicas share records the write in flight for as long
            // as it may take, should this process die mid-write: what is left
            // of the wait for the keys' turns (a second key's may follow), a
            // wait for an upstream connection, the exchange, the wait for a
            // body answered early to leave (bounded by `timeout` too), and the
            // settle period. (The store adds its own replica wait and a margin.)
            let lease = wait + route.queue_timeout + route.timeout * 2 + settle;
            match spend!(budget, store.enter(k, token, ask, lease, wait)) {
                // A strict route takes one write per token, and the advance is
                // where that is decided for good: the fence API may have raised
                // the mark to this very token since it was read. An equal
                // advance changed nothing.
                Ok(Entered::Accepted { previous: Some(current), .. }) if r.strict && current == token => {
                    return Err(reject(ProxyError::StaleToken { token, current }, k))
                }
                Ok(Entered::Accepted { in_flight, .. }) => turns.record(in_flight),
                Ok(Entered::Stale { current }) => return Err(reject(ProxyError::StaleToken { token, current }, k)),
                Ok(Entered::Superseded { waiting }) => {
                    return Err(reject(ProxyError::Superseded { token, waiting }, k))
                }
                Ok(Entered::TimedOut) => return Err(reject(ProxyError::QueueTimeout(route.queue_timeout), &key)),
                Err(e) => return Err(reject(e.into(), k)),
            }
        }
        // Every mark is this token now: the key's other requests carrying it may
        // go too (a no-op for turns held alone).
        turns.share();
        drop(step);

        // The forward runs to its end whatever the client does: if the client
        // goes away (its connection closes, its HTTP/2 stream is reset), this
        // future moves to a task of its own (future.rs), still runs to its end
        // at the upstream, and only then do the turns pass on. Were it dropped
        // half-way, the next holder's write could land before this one. Until
        // it has its way to the upstream nothing was sent: a forward whose client
        // left by then is dropped, and its turns pass on at once.
        routed.slot_taken = Some(taken.clone());
        let settling = SettlingTurns { turns, settle, taken };
        let result = inner.send(routed).await;
        let (turns, taken) = settling.disarm();
        let mut still_sending = false;
        match &result {
            // The answer came before the body was handed over whole (the
            // upstream answers on the head, or before it has read on): the
            // rest may still land. The client has its answer now; the keys
            // wait for the body (see `pass_when_sent`).
            Ok(_) if !sent_whole(&taken) => {
                still_sending = true;
                pass_when_sent(turns, taken, settle, timeout);
            }
            // The upstream may still apply this write. Keep the keys closed for
            // the settle period, so a newer write cannot land and then be
            // overwritten by this one (the idea of Chubby's lock-delay).
            Err(e) if e.is_ambiguous() && !settle.is_zero() => hold_for(turns, settle),
            // The response head arrived after the body was handed over whole,
            // nothing reached the upstream, or settling is off: the next
            // fenced request for these keys may go.
            _ => drop(turns),
        }
        match result {
            Ok(mut response) => {
                let decision = Decision {
                    outcome: Outcome::Forwarded,
                    key: Some(key),
                    token: Some(token),
                    settled: still_sending && !settle.is_zero(),
                    route: None,
                };
                decide(&mut response, decision);
                Ok(response)
            }
            Err(e) => {
                let settled = e.is_ambiguous() && !settle.is_zero();
                let mut rejection = reject(e, &key);
                rejection.settle = settled.then_some(settle);
                Err(rejection)
            }
        }
    }
}

/// The one deadline of a request's waits for its keys (`queue_timeout` for
/// all of them together), counted from the first wait that suspends: a
/// request whose keys are free at once reads no clock for it.
struct WaitBudget {
    timeout: Duration,
    started: Option<Instant>,
}

impl WaitBudget {
    fn new(timeout: Duration) -> Self {
        WaitBudget { timeout, started: None }
    }

    /// What is left of it.
    fn left(&self) -> Duration {
        match self.started {
            None => self.timeout,
            Some(started) => (started + self.timeout).saturating_duration_since(Instant::now()),
        }
    }

    /// Starts the clock, if no wait has yet: one suspends now.
    fn suspended(&mut self) {
        if self.started.is_none() {
            self.started = Some(Instant::now());
        }
    }
}

/// Awaits `$wait` within `$budget` ([`WaitBudget`]), starting its clock if
/// it suspends (a wait that does not suspend takes no time that counts). A
/// macro, not a method: the wait is made in place, not moved into a future
/// of the method's.
macro_rules! spend {
    ($budget:expr, $wait:expr) => {{
        let mut wait = pin!($wait);
        poll_fn(|cx| {
            let poll = wait.as_mut().poll(cx);
            if poll.is_pending() {
                $budget.suspended();
            }
            poll
        })
        .await
    }};
}
use spend;

async fn forward_unfenced<F, B>(inner: F, req: Routed<B>) -> Result<Response<ProxyBody>, Rejection>
where
    F: Forwarder<B>,
{
    let mut response = inner.send(req).await?;
    let decision = Decision { outcome: Outcome::Unfenced, key: None, token: None, settled: false, route: None };
    decide(&mut response, decision);
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Method, Request};
    use http_body_util::Empty;

    use super::*;
    use crate::config::RouteConfig;
    use crate::fence::signature::sign;
    use crate::fence::signature::SigningKey;
    use crate::fence::store::{Advance, Deleted, MemoryStore, Selection, StoreError};
    use crate::route::Route;

    const SECRET: &[u8] = b"service-test-secret-0123";

    fn route(signing_key: Option<&[u8]>, max_token_jump: Option<u64>) -> Arc<Route> {
        Arc::new(Route::detached(RouteConfig {
            signing_key: signing_key.map(SigningKey::new),
            max_token_jump,
            ..crate::config::test_route_config("objects", "/objects/")
        }))
    }

    /// A memory store that counts reads, and whose read number `race_on`
    /// (0: the first) answers what the mark was just before another request
    /// raised it to `raced_to`.
    #[derive(Default)]
    struct WitnessStore {
        inner: MemoryStore,
        gets: AtomicUsize,
        advances: AtomicUsize,
        raced_to: Option<u64>,
        race_on: usize,
    }

    impl FenceStore for WitnessStore {
        async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
            let racing = self.gets.fetch_add(1, Ordering::SeqCst) == self.race_on;
            let mark = self.inner.get(key).await;
            if let (true, Some(token)) = (racing, self.raced_to) {
                self.inner.advance_now(key, token);
            }
            mark
        }
        async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
            self.advances.fetch_add(1, Ordering::SeqCst);
            self.inner.advance(key, token).await
        }
        async fn list(&self, _: &str, _: Option<&str>, _: usize) -> Result<Vec<(String, u64)>, StoreError> {
            Ok(Vec::new())
        }
        async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
            self.inner.delete(which).await
        }
        fn tracked_keys(&self) -> usize {
            0
        }
        fn cached_keys(&self) -> usize {
            0
        }
    }

    /// Runs one `PUT /objects/a` through the fence; returns the status and how
    /// many requests reached the inner service.
    async fn put(route: Arc<Route>, store: Arc<WitnessStore>, headers: &[(&str, &str)]) -> (u16, usize) {
        let forwarded = Arc::new(AtomicUsize::new(0));
        let seen = forwarded.clone();
        let inner = tower::service_fn(move |_req: Routed<Empty<Bytes>>| {
            seen.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ProxyError>(Response::new(ProxyBody::default())) }
        });
        let mut req = Request::builder().method(Method::PUT).uri("/objects/a");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let request = req.body(Empty::<Bytes>::new()).unwrap();
        let req = Routed { route, request, fenced: true, destination: None, slot_taken: None, token: None };
        let decided = match crate::stack::head::check(&*store, req).await {
            Ok(checked) => fenced(inner, store, Arc::new(KeyGate::default()), checked).await,
            Err(rejection) => Err(rejection),
        };
        let status = match decided {
            Ok(response) => response.status().as_u16(),
            Err(rejection) => rejection.error.status().as_u16(),
        };
        (status, forwarded.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_bad_signature_never_touches_the_store() {
        let route = route(Some(SECRET), Some(5));
        let wrong = sign(b"some-other-secret-012345", "/objects/a", 7);
        for headers in [
            vec![("x-fencing-token", "18446744073709551615")],
            vec![("x-fencing-token", "7"), ("x-fencing-signature", wrong.as_str())],
        ] {
            let store = Arc::new(WitnessStore::default());
            assert_eq!(put(route.clone(), store.clone(), &headers).await, (403, 0));
            assert_eq!(store.gets.load(Ordering::SeqCst), 0, "the mark was read");
            assert_eq!(store.advances.load(Ordering::SeqCst), 0, "the mark was raised");
        }
        let store = Arc::new(WitnessStore::default());
        let good = sign(SECRET, "/objects/a", 7);
        let headers = [("x-fencing-token", "7"), ("x-fencing-signature", good.as_str())];
        assert_eq!(put(route, store.clone(), &headers).await, (200, 1));
        assert_eq!(store.inner.get("/objects/a").await.unwrap(), Some(7));
    }

    #[tokio::test]
    async fn the_jump_is_checked_again_when_the_turn_comes() {
        // The early read sees a fresh key (no limit); by the time the turn comes
        // another request has made the mark 1. u64::MAX must not get through.
        let store = Arc::new(WitnessStore { raced_to: Some(1), ..Default::default() });
        let headers = [("x-fencing-token", "18446744073709551615")];
        assert_eq!(put(route(None, Some(5)), store.clone(), &headers).await, (403, 0));
        assert_eq!(store.advances.load(Ordering::SeqCst), 0);
        assert_eq!(store.inner.get("/objects/a").await.unwrap(), Some(1));
        // Without a limit the same race is just a higher token.
        let store = Arc::new(WitnessStore { raced_to: Some(1), ..Default::default() });
        assert_eq!(put(route(None, None), store.clone(), &headers).await, (200, 1));
    }

    /// On a strict route a token equal to the mark is refused even when the
    /// mark reached it after the last read (the fence API raising it between
    /// the read with the turn held and the advance): nothing is forwarded.
    #[tokio::test]
    async fn a_strict_route_refuses_a_mark_raised_to_the_token_after_it_was_read() {
        let strict = Arc::new(Route::detached(RouteConfig {
            strict: true,
            ..crate::config::test_route_config("objects", "/objects/")
        }));
        let headers = [("x-fencing-token", "7")];
        // Reads: 0 early from the head, 1 with the turn held; the race follows 1.
        let store = Arc::new(WitnessStore { raced_to: Some(7), race_on: 1, ..Default::default() });
        assert_eq!(put(strict.clone(), store.clone(), &headers).await, (409, 0));
        assert_eq!(store.inner.get("/objects/a").await.unwrap(), Some(7));
        // The same race on a route that is not strict (the mark reaching the
        // token after the only read, the head's: the advance decides there):
        // the holder writes.
        let store = Arc::new(WitnessStore { raced_to: Some(7), race_on: 0, ..Default::default() });
        assert_eq!(put(route(None, None), store.clone(), &headers).await, (200, 1));
        assert_eq!(store.gets.load(Ordering::SeqCst), 1, "read again with the turn held");
        // And a strict route's first write with a token above the mark goes.
        let store = Arc::new(WitnessStore::default());
        assert_eq!(put(strict, store, &headers).await, (200, 1));
    }

    /// A COPY from a route that does not settle into one that does: when the
    /// outcome is unknown, the destination's key stays closed for its own
    /// route's settle period, not the source route's none.
    #[tokio::test(start_paused = true)]
    async fn each_key_settles_as_long_as_its_route_asks() {
        let source = Arc::new(Route::detached(RouteConfig {
            settle: Duration::ZERO,
            ..crate::config::test_route_config("lenient", "/lenient/")
        }));
        let dest = Arc::new(Route::detached(RouteConfig {
            settle: Duration::from_secs(2),
            ..crate::config::test_route_config("objects", "/objects/")
        }));
        let request = Request::builder().method("COPY").uri("/lenient/a").body(Empty::<Bytes>::new()).unwrap();
        let checked = Checked {
            routed: Routed { route: source, request, fenced: true, destination: None, slot_taken: None, token: None },
            fence: Some(Fence {
                token: 5,
                key: "/lenient/a".into(),
                destination: Some(("/objects/b".into(), dest)),
                at_mark: false,
            }),
        };
        let timing_out = tower::service_fn(|_req: Routed<Empty<Bytes>>| async {
            Err::<Response<ProxyBody>, _>(ProxyError::UpstreamTimeout(Duration::from_secs(1)))
        });
        let gate = Arc::new(KeyGate::default());
        let store = Arc::new(WitnessStore::default());
        let refused = fenced(timing_out, store, gate.clone(), checked).await.unwrap_err();
        assert_eq!(refused.settle, Some(Duration::from_secs(2)));
        let started = tokio::time::Instant::now();
        let b_key: Arc<str> = "/objects/b".into();
        let b = |wait| gate.acquire(&b_key, 5, Ask::Alone, wait);
        assert!(b(Duration::from_millis(1500)).await.is_err(), "the key settled too soon");
        assert!(b(Duration::from_secs(1)).await.is_ok());
        assert_eq!(started.elapsed(), Duration::from_secs(2), "paused time: the settle period exactly");
    }

    /// The keys' waits share one `queue_timeout`, counted from the first
    /// wait that suspends: what is left after it is what the next one gets.
    #[tokio::test(start_paused = true)]
    async fn the_waits_share_one_budget_from_the_first_that_suspends() {
        let mut budget = WaitBudget::new(Duration::from_secs(1));
        assert_eq!(spend!(budget, async { 7 }), 7);
        assert_eq!(budget.left(), Duration::from_secs(1), "a wait that did not suspend took nothing");
        spend!(budget, tokio::time::sleep(Duration::from_millis(300)));
        assert_eq!(budget.left(), Duration::from_millis(700));
        spend!(budget, tokio::time::sleep(Duration::from_millis(900)));
        assert_eq!(budget.left(), Duration::ZERO);
    }
}
