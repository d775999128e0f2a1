//! An upstream connection's off switch, [`Teardown`], and the socket it
//! closes with a reset, [`Resettable`]: for a fenced write whose request or
//! body went past its route's timeout, so nothing more of it is written.
//! Both HTTP/1.1 and HTTP/2 connections have one. It knows nothing of the
//! pool, so the body types that carry it (`Handover`) need not either.

use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::http::stream::TcpOrTls;

/// What an upstream connection reads and writes.
pub(crate) type UpstreamStream = TcpOrTls<tokio_rustls::client::TlsStream<TcpStream>>;

/// An upstream connection's off switch. Asked ([`Teardown::tear_down`]),
/// the connection's driver drops it, and its socket closes with a reset
/// (`SO_LINGER` 0): the kernel discards what it still held to send, so
/// nothing of the connection's requests is written after, as it would be
/// after a graceful close. The connection's other closes stay graceful: a
/// body written whole still reaches the upstream.
#[derive(Clone)]
pub struct Teardown(Arc<Switch>);

struct Switch {
    asked: AtomicBool,
    /// Wakes the connection's driver.
    ask: Notify,
    /// The task reading the socket, while a read waits (HTTP/2: hyper reads
    /// on a task of its own, which the driver cannot drop).
    reader: Mutex<Option<Waker>>,
    closed: AtomicBool,
    done: Notify,
    multiplexed: bool,
}

impl std::fmt::Debug for Teardown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Teardown").field("multiplexed", &self.0.multiplexed).finish_non_exhaustive()
    }
}

impl Teardown {
    /// For a new connection: HTTP/2 (`multiplexed`, other requests' streams
    /// on it) or HTTP/1.1.
    pub(crate) fn new(multiplexed: bool) -> Teardown {
        Teardown(Arc::new(Switch {
            asked: AtomicBool::new(false),
            ask: Notify::new(),
            reader: Mutex::new(None),
            closed: AtomicBool::new(false),
            done: Notify::new(),
            multiplexed,
        }))
    }

    /// Whether the connection carries other requests too (HTTP/2).
    pub fn is_multiplexed(&self) -> bool {
        self.0.multiplexed
    }

    /// Tears the connection down; resolves once its socket is closed.
    pub async fn tear_down(&self) {
        let mut done = pin!(self.0.done.notified());
        done.as_mut().enable();
        self.0.asked.store(true, Ordering::Release);
        self.0.ask.notify_one();
        let reader = self.0.reader.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(reader) = reader {
            reader.wake();
        }
        while !self.0.closed.load(Ordering::Acquire) {
            done.as_mut().await;
            done.set(self.0.done.notified());
            done.as_mut().enable();
        }
    }

    /// Resolves once someone asked for the teardown (the driver's watch).
    pub(crate) async fn asked(&self) {
        loop {
            let asked = self.0.ask.notified();
            if self.0.asked.load(Ordering::Acquire) {
                return;
            }
            asked.await;
        }
    }
}

/// An upstream connection's socket, closed with a reset once its
/// [`Teardown`] was asked for.
pub(crate) struct Resettable {
    stream: UpstreamStream,
    /// Dropped after `stream`: tells the teardown the socket is closed.
    closed: Closed,
}

impl Resettable {
    pub(crate) fn new(stream: UpstreamStream, teardown: &Teardown) -> Resettable {
        Resettable { stream, closed: Closed(teardown.clone()) }
    }
}

struct Closed(Teardown);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0 .0.closed.store(true, Ordering::Release);
        self.0 .0.done.notify_waiters();
    }
}

impl Drop for Resettable {
    fn drop(&mut self) {
        if !self.closed.0 .0.asked.load(Ordering::Acquire) {
            return;
        }
        let tcp = match &self.stream {
            TcpOrTls::Plain(tcp) => tcp,
            TcpOrTls::Tls(tls) => tls.get_ref().0,
        };
        // Deprecated for a linger above zero, which blocks the thread that
        // closes the socket; zero never blocks: the close resets at once.
        #[allow(deprecated)]
        if let Err(e) = tcp.set_linger(Some(Duration::ZERO)) {
            tracing::debug!(error = %e, "could not set SO_LINGER on an upstream socket torn down");
        }
    }
}

impl tokio::io::AsyncRead for Resettable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Torn down: the connection fails where it reads, and whoever runs
        // it drops it (and this socket with it).
        let this = &mut *self;
        let switch = &this.closed.0 .0;
        if switch.asked.load(Ordering::Acquire) {
            return Poll::Ready(Err(torn_down()));
        }
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if polled.is_pending() && switch.multiplexed {
            let mut reader = switch.reader.lock().unwrap_or_else(PoisonError::into_inner);
            if !reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *reader = Some(cx.waker().clone());
            }
            drop(reader);
            // Asked meanwhile: the waker may have been taken before it was left.
            if switch.asked.load(Ordering::Acquire) {
                return Poll::Ready(Err(torn_down()));
            }
        }
        polled
    }
}

fn torn_down() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the upstream connection was torn down")
}

impl tokio::io::AsyncWrite for Resettable {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
}
