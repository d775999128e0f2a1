//! A client connection's own upstream connections.
//!
//! Each client connection keeps the upstream connections its requests used,
//! idle between requests: an HTTP/1.1 client (one request at a time) needs one,
//! an HTTP/2 client as many as it has requests in flight at once. There is no
//! pool shared between client connections to look up, lock or hash on every
//! request, and the upstream exchange stays on the worker thread that serves
//! the client. They close with the client connection.
//!
//! Retries: only what never reached the upstream is sent again.
//! - Connecting is retried (with backoff): it happens before the request is
//!   handed to a connection, so not one byte of it was sent.
//! - A request that a kept connection hands back unsent (the upstream had
//!   closed it while idle) goes out on a fresh connection.
//! - Anything else (a connection that broke after sending, a timeout) is never
//!   retried: the upstream may have acted on it. That holds for every method,
//!   fenced or not.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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

/// The client connection's idle upstream connections.
#[derive(Clone, Default)]
pub struct Upstreams {
    idle: Arc<Mutex<Vec<(Authority, Sender)>>>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

impl Upstreams {
    /// Sends `req` to `authority` on an idle connection of this client
    /// connection's, or on a new one.
    pub async fn send(
        &self,
        authority: &Authority,
        mut req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        if let Some(mut sender) = self.take(authority) {
            match sender.try_send_request(req).await {
                Ok(response) => {
                    self.put_back(authority, sender);
                    return Ok(response);
                }
                Err(mut e) => match e.take_message() {
                    // Handed back before a byte was written: the upstream had
                    // closed the idle connection. Safe to send on a fresh one.
                    Some(unsent) => {
                        tracing::debug!(error = %e.error(), "kept upstream connection was closed; reconnecting");
                        req = unsent;
                    }
                    None => return Err(UpstreamError::exchange(e.into_error())),
                },
            }
        }
        let mut sender = connect(authority).await?;
        match sender.send_request(req).await {
            Ok(response) => {
                self.put_back(authority, sender);
                Ok(response)
            }
            Err(e) => Err(UpstreamError::exchange(e)),
        }
    }

    /// An idle, still open connection to `authority`; closed ones are dropped.
    fn take(&self, authority: &Authority) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|(_, sender)| !sender.is_closed());
        let at = idle.iter().rposition(|(to, _)| to == authority)?;
        Some(idle.swap_remove(at).1)
    }

    /// Keeps `sender` for the next request. It may still be finishing this
    /// one's response body; a request that finds it busy gets the request back
    /// unsent and opens another.
    fn put_back(&self, authority: &Authority, sender: Sender) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push((authority.clone(), sender));
        }
    }
}

/// Opens a connection to `authority`, retrying failures with backoff: nothing
/// has been sent yet, so a retry can't apply anything twice.
async fn connect(authority: &Authority) -> Result<Sender, UpstreamError> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        match try_connect(authority).await {
            Ok(sender) => return Ok(sender),
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

async fn try_connect(authority: &Authority) -> Result<Sender, BoxError> {
    let addr = (authority.host().trim_start_matches('[').trim_end_matches(']'), authority.port_u16().unwrap_or(80));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(connected) => connected?,
        Err(_) => {
            let what = format!("connecting to {authority} timed out after {CONNECT_TIMEOUT:?}");
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, what).into());
        }
    };
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::Builder::new().handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}
