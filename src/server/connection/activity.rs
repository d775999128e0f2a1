//! What a connection is doing, as far as its guards care, and when a guard
//! trips: [`Activity`] is fed bytes and requests and answers "closed for a
//! slow head", "closed as idle", or "overstayed a graceful close".
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

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::frames::FramesRead;

/// The longest a connection asked to close gracefully may stay open with no
/// request in flight (shorter if `header_read_timeout` is): see
/// [`Activity::close_grace`].
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// How long an HTTP/1 connection sits idle before it rests: gives back the
/// buffers of its idle state (see [`Expiry::Rest`] and the
/// [connection docs](super#resting)).
pub(crate) const REST_AFTER: Duration = Duration::from_secs(1);

/// How many answers in a row may refuse a connection's requests for what their
/// heads are (400, 429, 431) before the connection is closed: see
/// [`Activity::answered`].
pub(crate) const REFUSALS_IN_A_ROW: u32 = 64;

/// What the connection is doing, as far as the guards care.
#[derive(Debug)]
pub(crate) struct Activity {
    state: Mutex<State>,
    header_read_timeout: Duration,
    idle_timeout: Duration,
    /// Answers in a row that refused a request for its head.
    refusals: AtomicU32,
    /// Told once `refusals` reaches [`REFUSALS_IN_A_ROW`].
    refusing: Notify,
    /// Request bodies that have begun and not been read to their end. A body
    /// dropped before its end stays counted: hyper may still be reading (or
    /// discarding) the rest of it, so the connection never rests again.
    open_bodies: AtomicU32,
    /// Bytes were written to the connection and not flushed since.
    unflushed: AtomicBool,
    /// Told when an HTTP/1 request body's drain reached one of its bounds
    /// (drain.rs): the connection closes.
    drain_stopped: Notify,
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
    /// [`Expiry::Rest`] was reported since the last request started.
    rested: bool,
}

#[derive(Debug, Clone, Copy)]
struct Arriving {
    unit: Unit,
    since: Instant,
}

/// Something a client sends that must arrive whole within `header_read_timeout`
/// (see the [connection docs](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unit {
    /// An HTTP/1 request head, an HTTP/2 header block, or the HTTP/2 preface
    /// with the client's first frame: work starting, not idleness.
    Head,
    /// Any other HTTP/2 frame: the idle clock keeps running while it arrives.
    Frame,
}

/// Why a connection should close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// Bytes arrived but no complete request head (or HTTP/2 frame, with no
    /// request in flight) within `header_read_timeout`.
    SlowHead,
    /// No request in flight and no request head arriving for `idle_timeout`.
    Idle,
    /// No request in flight and no request head arriving for [`REST_AFTER`]:
    /// the connection may give back what its idle state holds, and go on
    /// waiting (reported once per idle spell).
    Rest,
}

impl Activity {
    pub(crate) fn new(header_read_timeout: Duration, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Activity {
            state: Mutex::new(State {
                in_flight: 0,
                idle_since: Instant::now(),
                arriving: None,
                incomplete: None,
                rested: false,
            }),
            header_read_timeout,
            idle_timeout,
            refusals: AtomicU32::new(0),
            refusing: Notify::new(),
            open_bodies: AtomicU32::new(0),
            unflushed: AtomicBool::new(false),
            drain_stopped: Notify::new(),
        })
    }

    /// A request of this connection was answered; `refused`: by fencegate,
    /// refusing it for what its head is (requests.rs says which answers are).
    /// A client whose requests keep being refused gets nothing more from the
    /// connection, and a flood of such requests costs the proxy a decode and
    /// an answer each: after [`REFUSALS_IN_A_ROW`] of them, with no other
    /// answer in between, [`refusing`](Activity::refusing) resolves and the
    /// connection is closed. A client that means well reconnects; a flood
    /// pays a handshake per few dozen requests, and an HTTP/2 flood loses what
    /// it had queued.
    pub(crate) fn answered(&self, refused: bool) {
        if refused {
            if self.refusals.fetch_add(1, Ordering::Relaxed) + 1 == REFUSALS_IN_A_ROW {
                self.refusing.notify_one();
            }
        } else if self.refusals.load(Ordering::Relaxed) != 0 {
            self.refusals.store(0, Ordering::Relaxed);
        }
    }

    /// How many answers in a row have refused this connection's requests
    /// since its last other answer.
    pub(crate) fn refusal_run(&self) -> u32 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Resolves once [`REFUSALS_IN_A_ROW`] answers in a row have refused this
    /// connection's requests (see [`answered`](Activity::answered)).
    pub(crate) async fn refusing(&self) {
        self.refusing.notified().await;
    }

    /// An HTTP/1 request body's drain reached one of its bounds (drain.rs)
    /// and let go of the body. With a response still being written, hyper
    /// sees that as it writes, and closes the connection once the response
    /// is out. With none, it waits for the body's next bytes: only
    /// [`drained_past_bounds`](Activity::drained_past_bounds) closes the
    /// connection (and the idle guard, had that been missed).
    pub(super) fn drain_stopped(&self) {
        if self.state().in_flight == 0 {
            self.drain_stopped.notify_one();
        }
    }

    /// Resolves once an HTTP/1 request body's drain reached one of its
    /// bounds: the connection should close at once.
    pub(crate) async fn drained_past_bounds(&self) {
        self.drain_stopped.notified().await;
    }

    /// How long a connection asked to close gracefully may take to end once no
    /// request is in flight: `header_read_timeout`, at most [`CLOSE_GRACE`].
    /// A client needs one round trip to answer HTTP/2's closing PING (or to
    /// see an HTTP/1 close); one that could not do that within
    /// `header_read_timeout` could not have sent a request head in time
    /// either, and five seconds cover a few lost packets on a slow link
    /// without letting a client that ignores the PING hold its slot.
    pub(crate) fn close_grace(&self) -> Duration {
        self.header_read_timeout.min(CLOSE_GRACE)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of an HTTP/1 request head (or of what may still become the HTTP/2
    /// preface) arrived: with no request in flight, the head's clock starts at
    /// its first byte and is not reset by later ones. Bytes that arrive while
    /// a body is still open are that body's (one drained after its request
    /// was answered: drain.rs), not a head: the drain's own bounds time them,
    /// and the idle clock keeps running.
    pub(super) fn head_bytes(&self) {
        if self.open_bodies.load(Ordering::Relaxed) != 0 {
            return;
        }
        let mut s = self.state();
        if s.in_flight == 0 && s.arriving.is_none() {
            s.arriving = Some(Arriving { unit: Unit::Head, since: Instant::now() });
        }
    }

    /// An HTTP/2 read, as [`Frames`](super::frames::Frames) saw it.
    pub(super) fn frames(&self, read: FramesRead) {
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

    pub(super) fn request_started(&self) {
        let mut s = self.state();
        s.in_flight += 1;
        s.arriving = None;
        s.rested = false;
    }

    /// A request body began that has not ended yet.
    pub(super) fn body_started(&self) {
        self.open_bodies.fetch_add(1, Ordering::Relaxed);
    }

    /// A request body was read to its end.
    pub(super) fn body_ended(&self) {
        self.open_bodies.fetch_sub(1, Ordering::Relaxed);
    }

    /// Bytes were written to the connection (`true`), or everything written
    /// was flushed (`false`).
    pub(super) fn unflushed(&self, unflushed: bool) {
        self.unflushed.store(unflushed, Ordering::Relaxed);
    }

    /// Whether an HTTP/1 connection's state between requests is all that
    /// hyper holds: nothing in flight, every request body read to its end,
    /// every response byte flushed, no head arriving. Only then may the
    /// connection rest; anything else (a body hyper still reads or drains, a
    /// client that does not read its response) keeps hyper's state.
    pub(super) fn between_requests(&self) -> bool {
        let s = self.state();
        s.in_flight == 0
            && s.arriving.is_none()
            && self.open_bodies.load(Ordering::Relaxed) == 0
            && !self.unflushed.load(Ordering::Relaxed)
    }

    pub(super) fn request_finished(&self) {
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
    /// the [lazy timer](self#the-lazy-timer)).
    fn check(&self) -> Result<Instant, Expiry> {
        let mut s = self.state();
        let now = Instant::now();
        // While a rest is still to come, look again no later than a rest's
        // wait from now: the connection may fall idle meanwhile.
        let rest_check = if s.rested { Duration::MAX } else { REST_AFTER };
        if s.in_flight > 0 {
            // A request is being served: its own timeouts apply. Look again in
            // time to catch a head that starts once it is done.
            return Ok(now + self.idle_timeout.min(self.header_read_timeout).min(rest_check));
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
                    // Its request may end sooner, and the connection rest
                    // REST_AFTER after that.
                    Unit::Head => Ok(deadline.min(now + self.idle_timeout.min(REST_AFTER))),
                    // A frame is not work: the idle deadline stands.
                    Unit::Frame if now >= idle_deadline => Err(Expiry::Idle),
                    Unit::Frame => Ok(deadline.min(idle_deadline)),
                }
            }
            None if now >= idle_deadline => Err(Expiry::Idle),
            None if !s.rested && now >= s.idle_since + REST_AFTER => {
                s.rested = true;
                Err(Expiry::Rest)
            }
            // A head starting from now on trips no sooner than this.
            None => {
                let rest = if s.rested { idle_deadline } else { s.idle_since + REST_AFTER };
                Ok(idle_deadline.min(now + self.header_read_timeout).min(rest))
            }
        }
    }

    /// Resolves when a guard trips.
    pub(crate) async fn expired(&self) -> Expiry {
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

    /// [`expired`](Activity::expired), past any [`Expiry::Rest`], as a
    /// connection that cannot rest sees it.
    #[cfg(test)]
    pub(crate) async fn expired_past_rest(&self) -> Expiry {
        loop {
            match self.expired().await {
                Expiry::Rest => continue,
                expiry => return expiry,
            }
        }
    }

    /// Resolves when a connection asked to close gracefully at `closing_since`
    /// has stayed open [`close_grace`](Activity::close_grace) past that moment
    /// and past its last request's end, with no request in flight: the client
    /// is not letting it close, and it may be closed at once.
    pub(crate) async fn overstayed(&self, closing_since: Instant) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::connection::testing::{activity, guard, trips};

    /// One request on `a`: its head takes `head` to arrive, then it is served
    /// for `served`.
    async fn request(a: &Activity, head: Duration, served: Duration) {
        a.head_bytes();
        tokio::time::sleep(head).await;
        a.request_started();
        tokio::time::sleep(served).await;
        a.request_finished();
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_rests_once_then_expires_after_idle_timeout() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        let opened = Instant::now();
        assert_eq!(a.expired().await, Expiry::Rest);
        assert_eq!(opened.elapsed(), REST_AFTER);
        assert_eq!(a.expired().await, Expiry::Idle);
        assert_eq!(opened.elapsed(), Duration::from_secs(60));
    }

    /// Each idle spell rests once, [`REST_AFTER`] after the last request
    /// ended, though nobody wakes the guard when a request starts or ends.
    #[tokio::test(start_paused = true)]
    async fn every_idle_spell_rests_once_on_time() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(a.expired().await, Expiry::Rest);
        let waiting = {
            let a = a.clone();
            tokio::spawn(async move { a.expired().await })
        };
        tokio::time::sleep(Duration::from_secs(20)).await;
        request(&a, Duration::from_millis(300), Duration::from_secs(7)).await;
        trips(waiting, Expiry::Rest, REST_AFTER).await;
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_connection_between_requests_may_rest() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        assert!(a.between_requests());
        a.head_bytes();
        assert!(!a.between_requests(), "a head arriving");
        a.request_started();
        a.body_started();
        assert!(!a.between_requests(), "a request in flight");
        a.request_finished();
        assert!(!a.between_requests(), "a body not read to its end");
        a.body_ended();
        a.unflushed(true);
        assert!(!a.between_requests(), "a response not flushed");
        a.unflushed(false);
        assert!(a.between_requests());
    }

    #[tokio::test(start_paused = true)]
    async fn a_started_head_must_complete_within_header_read_timeout() {
        let a = Activity::new(Duration::from_secs(10), Duration::from_secs(60));
        tokio::time::sleep(Duration::from_secs(30)).await;
        a.head_bytes();
        let started = Instant::now();
        assert_eq!(a.expired_past_rest().await, Expiry::SlowHead);
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

    // --- Refusals in a row --------------------------------------------------------

    #[tokio::test(start_paused = true)]
    async fn a_run_of_refusals_closes_and_any_other_answer_breaks_the_run() {
        let a = activity();
        let refusing = {
            let a = a.clone();
            tokio::spawn(async move { a.refusing().await })
        };
        for _ in 0..REFUSALS_IN_A_ROW - 1 {
            a.answered(true);
        }
        // Any other answer breaks the run.
        a.answered(false);
        for _ in 0..REFUSALS_IN_A_ROW - 1 {
            a.answered(true);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!refusing.is_finished());
        a.answered(true);
        tokio::time::timeout(Duration::from_secs(1), refusing).await.expect("closed after the run").unwrap();
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
