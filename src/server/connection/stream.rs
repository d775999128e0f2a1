//! A proxy connection's socket: plain TCP, or TLS over it (`[server.tls]`).

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// What a proxy connection reads and writes.
#[derive(Debug)]
pub(crate) enum ClientStream {
    Plain(TcpStream),
    /// Boxed: rustls' state is large, and most connections are plain.
    Tls(Box<TlsStream<TcpStream>>),
}

impl ClientStream {
    /// Whether the connection may rest between requests: a TLS connection
    /// keeps rustls' state, and may hold bytes it has decrypted but not
    /// handed out, which a wait on the bare socket would not see.
    pub(crate) fn can_rest(&self) -> bool {
        matches!(self, ClientStream::Plain(_))
    }

    /// Ready once the client has sent something (or closed). A TLS stream is
    /// never left waiting here (see [`can_rest`](Self::can_rest)): it is
    /// ready at once.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self {
            ClientStream::Plain(tcp) => tcp.poll_read_ready(cx),
            ClientStream::Tls(_) => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Plain(s) => s.is_write_vectored(),
            ClientStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }
}
