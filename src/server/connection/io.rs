//! A connection's IO, watched: [`ActivityIo`] tells which protocol the
//! connection speaks from its first bytes (as hyper's server tells it), and
//! feeds its [`Activity`] what arrives, in request heads or, on HTTP/2, frames.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::activity::Activity;
use super::frames::Frames;

/// The HTTP/2 connection preface (RFC 9113 §3.4). No HTTP/1 request line is a
/// prefix of it, nor starts with it.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection's IO that tells its [`Activity`] when bytes arrive, and where
/// they stand in the protocol (see the [connection docs](super)).
#[derive(Debug)]
pub(crate) struct ActivityIo<I> {
    inner: I,
    activity: Arc<Activity>,
    framing: Framing,
    /// Bytes already read (and seen) that reads return again first: the
    /// first bytes, read to tell the protocol before hyper takes the
    /// connection, or what hyper had read and not parsed when it rested.
    unread: Bytes,
}

impl<I> ActivityIo<I> {
    pub(crate) fn new(inner: I, activity: Arc<Activity>) -> Self {
        ActivityIo { inner, activity, framing: Framing::Preface(0), unread: Bytes::new() }
    }

    /// `bytes` are read again before anything not yet read. (An empty `Bytes`
    /// may still hold a whole buffer: it is not kept.)
    pub(crate) fn unread(&mut self, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        if self.unread.is_empty() {
            self.unread = bytes;
        } else {
            let mut both = BytesMut::with_capacity(bytes.len() + self.unread.len());
            both.extend_from_slice(&bytes);
            both.extend_from_slice(&self.unread);
            self.unread = both.freeze();
        }
    }

    /// Whether bytes wait to be read again.
    pub(crate) fn has_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    fn received(&mut self, bytes: &[u8]) {
        self.framing.received(bytes, &self.activity);
    }

    /// The protocol the first bytes told, once they have.
    pub(crate) fn protocol(&self) -> Option<Protocol> {
        match self.framing {
            Framing::Preface(_) => None,
            Framing::Http1 => Some(Protocol::Http1),
            Framing::Http2(_) => Some(Protocol::Http2),
        }
    }

    pub(crate) fn get_ref(&self) -> &I {
        &self.inner
    }

    /// Bytes are being written: they are unflushed until a flush succeeds,
    /// whether this write takes them or not (one that returns `Pending`
    /// leaves them in the writer's buffer, which is no less unflushed).
    fn writing(&self, len: usize) {
        if len > 0 {
            self.activity.unflushed(true);
        }
    }
}

/// What a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http1,
    Http2,
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

impl<I: AsyncRead + Unpin> AsyncRead for ActivityIo<I> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.unread.is_empty() {
            // Seen when first read: not told to the activity again.
            let n = this.unread.len().min(buf.remaining());
            buf.put_slice(&this.unread[..n]);
            this.unread.advance(n);
            if this.unread.is_empty() {
                // Read through: let go of its buffer.
                this.unread = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
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
        self.writing(buf.len());
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(result, Poll::Ready(Ok(()))) {
            self.activity.unflushed(false);
        }
        result
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
        self.writing(bufs.iter().map(|b| b.len()).sum());
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::server::connection::activity::Expiry;
    use crate::server::connection::testing::{activity, frame, guard, trips, DATA, PING, SETTINGS, WINDOW_UPDATE};

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

    // --- What arrives: timing -------------------------------------------------

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
}
