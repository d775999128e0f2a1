//! The admin listener: health, readiness, metrics and the fence API over
//! HTTP/1.1, with the proxy listener's bounds (a limit of `max_connections` of
//! its own, `header_read_timeout`, `idle_timeout`, `max_header_bytes`) and its
//! own drain, so a client can no more hold an admin slot than a proxy one.

use std::convert::Infallible;
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use super::connection::{self, Activity, ActivityIo, TrackRequestsLayer};
use super::guard::Connections;
use crate::admin::{self, AdminState};
use crate::config::ServerConfig;

/// Accepts and serves admin connections on this runtime until the future is
/// dropped: it never ends on its own.
pub(super) async fn accept(
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
            .layer(TrackRequestsLayer(activity.clone()))
            .service_fn(move |req| admin::handle(state.clone(), peer, req));
        let conn = builder.serve_connection(
            TokioIo::new(ActivityIo::new(stream, activity.clone())),
            TowerToHyperService::new(service),
        );
        connections.spawn(connection::serve(conn, activity, admission, peer), None);
    }
}
