//! The admin listener: health, readiness, metrics and the fence API over
//! HTTP/1.1, on an OS thread of its own with its own single-threaded runtime,
//! so that admin work (a large listing, a scrape) never delays the proxy's
//! accept or its connections. It has the proxy listener's bounds
//! (`header_read_timeout`, `idle_timeout`, `max_header_bytes`), a connection
//! limit of its own (`[admin] max_connections`), and its own drain, so a
//! client can no more hold an admin slot than a proxy one, and idle admin
//! connections cannot take the proxy's descriptors.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::header::AUTHORIZATION;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tracing::warn;

use super::connection::{self, Activity, ActivityIo, TrackRequestsLayer};
use super::guard::Connections;
use crate::admin::{self, AdminState};
use crate::config::ServerConfig;

type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The admin listener, serving until [`stop`](Self::stop).
pub(super) struct AdminListener {
    stop: oneshot::Sender<Instant>,
    drained: oneshot::Receiver<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AdminListener {
    /// Serves `listener` on a thread of its own; if that thread cannot be
    /// started, on the caller's runtime rather than not at all.
    pub(super) fn start(
        listener: TcpListener,
        connections: Connections,
        state: Arc<AdminState>,
        server: ServerConfig,
    ) -> AdminListener {
        let (stop, stopped) = oneshot::channel::<Instant>();
        let (done, drained) = oneshot::channel::<bool>();
        // The listener is registered with this runtime's event loop; it moves
        // to the admin thread's as a plain socket.
        let listener = match listener.into_std() {
            Ok(listener) => listener,
            Err(e) => {
                warn!(error = %e, "cannot hand the admin listener to its thread; the admin API is not served");
                let _ = done.send(true);
                return AdminListener { stop, drained, thread: None };
            }
        };
        let serving: Serving = Box::pin(async move {
            let drained = match TcpListener::from_std(listener) {
                Ok(listener) => serve(listener, connections, state, server, stopped).await,
                Err(e) => {
                    warn!(error = %e, "cannot register the admin listener; the admin API is not served");
                    true
                }
            };
            let _ = done.send(drained);
        });
        match start_thread(serving) {
            Ok(thread) => AdminListener { stop, drained, thread: Some(thread) },
            Err((e, serving)) => {
                warn!(error = %e, "cannot start the admin thread; serving the admin API on the main runtime");
                tokio::spawn(serving);
                AdminListener { stop, drained, thread: None }
            }
        }
    }

    /// Stops accepting and drains the admin connections until `deadline`;
    /// returns whether all of them closed in time.
    pub(super) async fn stop(mut self, deadline: Instant) -> bool {
        let _ = self.stop.send(deadline);
        let drained = (&mut self.drained).await.unwrap_or(false);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        drained
    }
}

/// The admin thread, with a single-threaded runtime that runs `serving` to
/// its end; or, if either cannot be made, `serving` back.
fn start_thread(serving: Serving) -> Result<std::thread::JoinHandle<()>, (std::io::Error, Serving)> {
    // A few blocking threads: the file store's reads for the fence API.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().max_blocking_threads(4).build() {
        Ok(runtime) => runtime,
        Err(e) => return Err((e, serving)),
    };
    // The future goes over a channel, so that it is still ours if the thread
    // cannot be spawned.
    let (give, take) = std::sync::mpsc::channel::<Serving>();
    let thread = std::thread::Builder::new().name("fencegate-admin".into()).spawn(move || {
        if let Ok(serving) = take.recv() {
            runtime.block_on(serving);
        }
    });
    match thread {
        Ok(thread) => match give.send(serving) {
            Ok(()) => Ok(thread),
            Err(std::sync::mpsc::SendError(serving)) => {
                Err((std::io::Error::other("the admin thread ended before it started"), serving))
            }
        },
        Err(e) => Err((e, serving)),
    }
}

/// Accepts and serves until told to stop, then closes the listener and
/// drains its connections until the deadline it was given.
async fn serve(
    listener: TcpListener,
    connections: Connections,
    state: Arc<AdminState>,
    server: ServerConfig,
    stop: oneshot::Receiver<Instant>,
) -> bool {
    let deadline = tokio::select! {
        never = accept(&listener, &connections, &state, &server) => match never {},
        // Dropped unsent: fencegate is going away; drain at once.
        deadline = stop => deadline.unwrap_or_else(|_| Instant::now()),
    };
    drop(listener);
    connections.drain(deadline).await
}

/// Accepts and serves admin connections on this runtime until the future is
/// dropped: it never ends on its own.
async fn accept(
    listener: &TcpListener,
    connections: &Connections,
    state: &Arc<AdminState>,
    server: &ServerConfig,
) -> Infallible {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // As on the proxy listener: our own guards time heads and idleness.
        .header_read_timeout(None)
        .max_buf_size(server.max_header_bytes);
    loop {
        let (stream, peer, admission) = connections.accept(listener).await;
        let activity = Activity::new(server.header_read_timeout, server.idle_timeout);
        let state = state.clone();
        let service = tower::ServiceBuilder::new()
            .layer(TrackRequestsLayer::new(activity.clone(), server.refusal_drain))
            // The bearer token shows as `Sensitive` wherever a request's
            // headers are printed (a debug line, a panic message).
            .layer(SetSensitiveRequestHeadersLayer::new([AUTHORIZATION]))
            // A handler that panics answers 500 problem+json instead of
            // resetting the operator's connection.
            .layer(CatchPanicLayer::custom(admin::panicked))
            .service_fn(move |req| admin::handle(state.clone(), peer, req));
        let conn = builder.serve_connection(
            TokioIo::new(ActivityIo::new(stream, activity.clone())),
            TowerToHyperService::new(service),
        );
        let serving = connection::serve(connection::Graceful::new(conn), activity, admission, peer);
        connections.spawn(
            async move {
                serving.await;
            },
            None,
        );
    }
}
