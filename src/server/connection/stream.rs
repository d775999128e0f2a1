//! A proxy connection's socket: plain TCP, or TLS over it (`[server.tls]`).

use std::task::{Context, Poll};

use tokio::net::TcpStream;

use crate::http::stream::TcpOrTls;

/// What a proxy connection reads and writes.
pub(crate) type ClientStream = TcpOrTls<tokio_rustls::server::TlsStream<TcpStream>>;

impl ClientStream {
    /// Whether the connection may rest between requests: a TLS connection
    /// keeps rustls' state, and may hold bytes it has decrypted but not
    /// handed out, which a wait on the bare socket would not see.
    pub(crate) fn can_rest(&self) -> bool {
        matches!(self, TcpOrTls::Plain(_))
    }

    /// Ready once the client has sent something (or closed). A TLS stream is
    /// never left waiting here (see [`can_rest`](Self::can_rest)): it is
    /// ready at once.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self {
            TcpOrTls::Plain(tcp) => tcp.poll_read_ready(cx),
            TcpOrTls::Tls(_) => Poll::Ready(Ok(())),
        }
    }
}
