//! The socket to an upstream: TCP, with TLS over it for an https upstream
//! (`proxy/tls.rs`); the handshake is part of connecting, within the same
//! timeout. Connecting, the TLS handshake included, is retried with backoff:
//! it happens before a request is handed to a connection, so not one byte of
//! it was sent.

use std::time::Duration;

use http::uri::Authority;
use tokio::net::TcpStream;

use crate::config::UpstreamTls;
use crate::http::stream::TcpOrTls;
use crate::http::teardown::UpstreamStream;
use crate::http::BoxError;
use crate::proxy::error::{chain, UpstreamError};
use crate::proxy::tls;

/// Connection attempts after the first.
pub const MAX_RETRIES: u32 = 3;
/// Wait before the first retry; doubled for each one after it.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(25);
/// Connecting to the upstream, the TLS handshake included, gives up after
/// this long (then retries).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The socket to `authority`, over `tls` if given, retrying failures with
/// backoff: nothing has been sent yet, so a retry can't apply anything twice.
pub(super) async fn open_with_retries(
    authority: &Authority,
    tls: Option<&UpstreamTls>,
) -> Result<UpstreamStream, UpstreamError> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        match try_open(authority, tls).await {
            Ok(stream) => return Ok(stream),
            Err(e) if attempt == MAX_RETRIES => {
                // A certificate refused now is refused on every request until
                // someone fixes it: say why where an operator looks.
                if let Some(failed) = e.downcast_ref::<HandshakeFailed>() {
                    let reason = tls::failure_reason(failed);
                    match tls.and_then(UpstreamTls::no_roots) {
                        Some(no_roots) => crate::telemetry::warn_limited!(
                            upstream = %authority, reason, error = %chain(failed), no_roots,
                            "TLS handshake with the upstream failed: the route trusts the platform's roots and \
                             there are none (set ca_file, or install the system's CA certificates); answering 502"
                        ),
                        None => crate::telemetry::warn_limited!(
                            upstream = %authority, reason, error = %chain(failed),
                            "TLS handshake with the upstream failed; answering 502"
                        ),
                    }
                }
                return Err(UpstreamError::connect(e));
            }
            Err(e) => {
                tracing::debug!(attempt, error = %e, "upstream connect failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
        }
    }
}

/// One attempt at the socket to `authority`: TCP, then over `tls` the TLS
/// handshake, both within [`CONNECT_TIMEOUT`].
async fn try_open(authority: &Authority, tls: Option<&UpstreamTls>) -> Result<UpstreamStream, BoxError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, open(authority, tls)).await {
        Ok(opened) => opened,
        Err(_) => {
            let what = format!("connecting to {authority} timed out after {CONNECT_TIMEOUT:?}");
            Err(std::io::Error::new(std::io::ErrorKind::TimedOut, what).into())
        }
    }
}

/// The socket to `authority`, over `tls` if given (its default port 443).
async fn open(authority: &Authority, tls: Option<&UpstreamTls>) -> Result<UpstreamStream, BoxError> {
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(if tls.is_some() { 443 } else { 80 });
    let stream = TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    let Some(tls) = tls else { return Ok(TcpOrTls::Plain(stream)) };
    // Fencegate::bind refuses a route whose TLS files were never read.
    let (connector, name) = tls::connector(tls).ok_or("the route's TLS files were never read")?;
    match connector.connect(name, stream).await {
        Ok(stream) => Ok(TcpOrTls::Tls(Box::new(stream))),
        Err(source) => Err(HandshakeFailed { upstream: authority.clone(), source }.into()),
    }
}

/// A TLS handshake with the upstream that failed: its certificate was
/// refused, it refused ours, or it spoke no TLS. Nothing was sent.
#[derive(Debug)]
struct HandshakeFailed {
    upstream: Authority,
    source: std::io::Error,
}

impl std::fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TLS handshake with {} failed", self.upstream)
    }
}

impl std::error::Error for HandshakeFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Why the first exchange on a new connection over `tls` failed. TLS 1.3:
/// the upstream checks our certificate after our side of the handshake has
/// ended, and refuses it in place of a response; that is a failure to
/// connect (it read nothing). Anything else is the exchange's.
pub(super) fn first_exchange_failed(
    authority: &Authority,
    tls: Option<&UpstreamTls>,
    e: hyper::Error,
) -> UpstreamError {
    if tls.is_none() || !tls::refused_our_certificate(&e) {
        return UpstreamError::exchange(e);
    }
    let refused = CertificateRefused(e);
    crate::telemetry::warn_limited!(
        upstream = %authority,
        reason = tls::failure_reason(&refused),
        error = %chain(&refused),
        "the upstream refused the route's TLS client certificate; answering 502"
    );
    UpstreamError::connect(refused)
}

/// The upstream refused the route's client certificate after the handshake
/// ended on our side (TLS 1.3), before it read the request.
#[derive(Debug)]
struct CertificateRefused(hyper::Error);

impl std::fmt::Display for CertificateRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the upstream refused the route's TLS client certificate before it read the request")
    }
}

impl std::error::Error for CertificateRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}
