//! The drain after a refusal: a request refused before its body ended still
//! has a client sending that body. Many clients (Python's `requests` and
//! `http.client`, most SDKs) write the whole body before they read a byte of
//! the answer; closing the connection on them, or leaving the bytes unread
//! until the socket buffers fill, gives them a broken pipe instead of their
//! 409. So a [`ClientBody`](super::ClientBody) dropped before its end is
//! handed here, and the rest of it is read and discarded, frame by frame,
//! nothing kept, as nginx's lingering close does, within the bounds of
//! `[server] refusal_drain_*` ([`RefusalDrain`]): its bytes, its whole time
//! from the refusal, and the longest silence between two reads.
//!
//! A drain that reaches the body's end leaves the connection as a body read
//! to its end would: HTTP/1.1 serves the next request, HTTP/2 closes the
//! stream. One that reaches a bound first lets go of the body: HTTP/2 resets
//! the stream (`NO_ERROR` once the answer is sent); on HTTP/1.1 the connection
//! is closed at once ([`Activity::drain_stopped`]), since nothing else would
//! tell hyper, which waits for the body's next bytes. A body that breaks off
//! (the client left) ends its drain at once.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::time::{timeout_at, Instant};

use super::activity::Activity;
use crate::config::RefusalDrain;

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Drained {
    /// At the body's end: the connection goes on.
    Ended,
    /// The body broke off: the client left, or the connection closed.
    Broken,
    /// A bound came first.
    Stopped,
}

/// Drains `body` on a task of its own within `bounds`; see the
/// [module docs](self). `activity` counts the body as open until its end
/// (a body let go of before it stays counted: the connection never rests
/// again). Without a runtime to run on, the body is dropped undrained.
pub(super) fn start<B>(body: B, bounds: RefusalDrain, activity: Arc<Activity>, http1: bool)
where
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        match drain(body, bounds).await {
            Drained::Ended => activity.body_ended(),
            Drained::Stopped if http1 => activity.drain_stopped(),
            Drained::Stopped | Drained::Broken => {}
        }
    });
}

/// Reads `body` to its end and discards it, unless a bound comes first.
pub(super) async fn drain<B: Body + Unpin>(mut body: B, bounds: RefusalDrain) -> Drained {
    let deadline = Instant::now() + bounds.time;
    let mut left = bounds.bytes;
    loop {
        if body.is_end_stream() {
            return Drained::Ended;
        }
        let wait = deadline.min(Instant::now() + bounds.silence);
        match timeout_at(wait, body.frame()).await {
            Err(_) => return Drained::Stopped,
            Ok(None) => return Drained::Ended,
            Ok(Some(Err(_))) => return Drained::Broken,
            Ok(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, |data| bytes::Buf::remaining(data) as u64);
                match left.checked_sub(len) {
                    Some(rest) => left = rest,
                    None => return Drained::Stopped,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use bytes::Bytes;
    use hyper::body::Frame;
    use tokio::sync::mpsc;

    use super::*;

    const BOUNDS: RefusalDrain =
        RefusalDrain { bytes: 1000, time: Duration::from_secs(30), silence: Duration::from_secs(5) };

    /// A body of the chunks (their lengths) the test sends; closing the
    /// sender ends it.
    struct Chunks(mpsc::UnboundedReceiver<usize>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0.poll_recv(cx).map(|n| n.map(|n| Ok(Frame::data(Bytes::from(vec![b'x'; n])))))
        }
    }

    fn body() -> (mpsc::UnboundedSender<usize>, Chunks) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Chunks(rx))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_within_the_bounds_is_drained_to_its_end() {
        let (tx, body) = body();
        let drained = tokio::spawn(drain(body, BOUNDS));
        // 1000 bytes over 28 s, each within the silence of the last.
        for _ in 0..7 {
            tx.send(1000 / 7).unwrap();
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        drop(tx);
        assert_eq!(drained.await.unwrap(), Drained::Ended);
    }

    #[tokio::test(start_paused = true)]
    async fn more_bytes_than_the_bound_stop_the_drain() {
        let (tx, body) = body();
        let drained = tokio::spawn(drain(body, BOUNDS));
        tx.send(1000).unwrap();
        tx.send(1).unwrap();
        assert_eq!(drained.await.unwrap(), Drained::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silence_stops_the_drain() {
        let (tx, body) = body();
        let start = Instant::now();
        let drained = tokio::spawn(drain(body, BOUNDS));
        tx.send(1).unwrap();
        assert_eq!(drained.await.unwrap(), Drained::Stopped);
        assert_eq!(start.elapsed(), BOUNDS.silence);
    }

    /// A client that trickles a byte just within every silence is stopped
    /// by the drain's whole time.
    #[tokio::test(start_paused = true)]
    async fn a_trickle_is_stopped_by_the_whole_time() {
        let (tx, body) = body();
        let start = Instant::now();
        let drained = tokio::spawn(drain(body, BOUNDS));
        let trickle = tokio::spawn(async move {
            while tx.send(1).is_ok() {
                tokio::time::sleep(Duration::from_secs(4)).await;
            }
        });
        assert_eq!(drained.await.unwrap(), Drained::Stopped);
        assert_eq!(start.elapsed(), BOUNDS.time);
        trickle.abort();
    }
}
