//! One upstream connection per HTTP/1 client connection.
//!
//! An HTTP/1 client connection carries one request at a time, so it can own one
//! upstream connection outright: no shared pool to look up, lock or hash on every
//! request, and the upstream exchange stays on the worker thread that serves the
//! client. The connection is opened on the first request, kept while it stays
//! usable, and closed with the client connection. (HTTP/2 clients, which send
//! many requests at once, use the worker's shared pool instead.)
//!
//! Retry rules are those of [`super::retry`]: connecting is retried, because
//! nothing was sent; so is a request that a kept connection refused before
//! writing a byte of it (the upstream had closed it while idle), on a fresh
//! connection. Anything else is never sent twice.

use std::sync::{Arc, Mutex, PoisonError};

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::retry::{FIRST_BACKOFF, MAX_RETRIES};
use super::{BoxError, SendError, CONNECT_TIMEOUT};
use crate::limits::RequestBody;

type Sender = http1::SendRequest<RequestBody>;

/// The client connection's upstream connection, when it has one.
#[derive(Clone, Default)]
pub struct Dedicated {
    slot: Arc<Mutex<Option<(Authority, Sender)>>>,
}

impl std::fmt::Debug for Dedicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dedicated").finish_non_exhaustive()
    }
}

impl Dedicated {
    /// Sends `req` to `authority` on this client connection's upstream
    /// connection, opening one if there is none (or none to that upstream).
    pub async fn send(
        &self,
        authority: &Authority,
        mut req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, SendError> {
        if let Some(mut sender) = self.take(authority) {
            match sender.try_send_request(req).await {
                Ok(response) => {
                    self.put_back(authority, sender);
                    return Ok(response);
                }
                Err(mut e) => match e.take_message() {
                    // Refused before a byte was written: the upstream had closed
                    // the idle connection. Safe to send on a fresh one.
                    Some(unsent) => {
                        tracing::debug!(error = %e.error(), "kept upstream connection was closed; reconnecting");
                        req = unsent;
                    }
                    None => return Err(SendError::Failed(e.into_error().into())),
                },
            }
        }
        let mut sender = connect(authority).await?;
        match sender.send_request(req).await {
            Ok(response) => {
                self.put_back(authority, sender);
                Ok(response)
            }
            Err(e) => Err(SendError::Failed(e.into())),
        }
    }

    fn take(&self, authority: &Authority) -> Option<Sender> {
        let kept = self.slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        kept.filter(|(to, sender)| to == authority && !sender.is_closed()).map(|(_, sender)| sender)
    }

    fn put_back(&self, authority: &Authority, sender: Sender) {
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some((authority.clone(), sender));
    }
}

/// Opens a connection to `authority`, retrying failures with backoff: nothing
/// has been sent yet, so a retry can't apply anything twice.
async fn connect(authority: &Authority) -> Result<Sender, SendError> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        match try_connect(authority).await {
            Ok(sender) => return Ok(sender),
            Err(e) if attempt == MAX_RETRIES => return Err(SendError::Connect(e)),
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
        Err(_) => return Err(format!("connecting to {authority} timed out after {CONNECT_TIMEOUT:?}").into()),
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
