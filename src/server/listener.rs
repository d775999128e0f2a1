//! The proxy listener: accept a client connection within the limit, deal it to
//! a worker, read its PROXY header there if one is required
//! (proxy_header.rs), shake hands if it speaks TLS, and serve it through the
//! proxy stack, HTTP/1.1 or HTTP/2 (h2c, or h2 over TLS).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Duration;
use tower::Layer;
use tracing::debug;

use super::calls::Calls;
use super::connection::{
    self, Activity, ActivityIo, ClientStream, Ended, Protocols, ProxyConnection, TrackRequestsLayer, REFUSALS_IN_A_ROW,
};
use super::guard::{Admission, Connections};
use super::penalty::Penalties;
use super::proxy_header;
use super::workers::Workers;
use crate::config::{ProxyProtocol, ServerConfig};
use crate::http::stream::TcpOrTls;
use crate::metrics::HeldBack;
use crate::proxy::{ClientAddr, TrustedProxies};
use crate::server::certs::ServerTls;
use crate::stack::forward::Forward;
use crate::stack::{proxy_service, Shared};

/// Accepts and serves proxy connections until the future is dropped:
/// it never ends on its own.
pub(super) async fn accept(
    listener: &TcpListener,
    connections: &Connections,
    workers: &mut Workers,
    shared: &Arc<Shared>,
    server: &ServerConfig,
    tls: Option<Arc<ServerTls>>,
) -> Infallible {
    let protocols = Arc::new(protocols(server, shared.metrics.resting_connections()));
    let penalties = Penalties::new(server.abuse_penalty);
    let counts = shared.metrics.held_back();
    let trusted = Arc::new(TrustedProxies::new(server.trusted_proxies.clone()));
    let proxy_protocol = server.proxy_protocol;
    loop {
        let (stream, peer, admission) = connections.accept(listener).await;
        // An address whose connections were closed for abuse waits before
        // its next one is served (penalty.rs). Behind a PROXY header, the
        // address is the one it names, known once it is read.
        let hold = match proxy_protocol {
            ProxyProtocol::Off => held_back(&penalties, &counts, peer),
            _ => None,
        };
        let (shared, protocols, penalties, counts, tls, trusted) =
            (shared.clone(), protocols.clone(), penalties.clone(), counts.clone(), tls.clone(), trusted.clone());
        let (header_read_timeout, idle_timeout) = (server.header_read_timeout, server.idle_timeout);
        workers.serve(stream, peer, connections, move |mut stream| async move {
            let mut hold = hold;
            let mut address = peer;
            if proxy_protocol != ProxyProtocol::Off {
                // Before anything else, within the time a request head has.
                let read = tokio::select! {
                    read = tokio::time::timeout(header_read_timeout, proxy_header::read(&mut stream, proxy_protocol)) => read,
                    () = admission.closing() => return,
                };
                match read {
                    Ok(Ok(source)) => address = source.unwrap_or(peer),
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "closing a connection at its PROXY header");
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "closing a connection whose PROXY header did not arrive within header_read_timeout");
                        return;
                    }
                }
                hold = held_back(&penalties, &counts, address);
            }
            if let Some(until) = hold {
                // Unread: its client's bytes wait in the socket, and its
                // guards start when it is served. Shutdown does not wait
                // for it: nothing was read, so nothing is lost.
                tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    () = admission.closing() => return,
                }
            }
            let _ = stream.set_nodelay(true);
            let client = match tls {
                None => ClientAddr::new(address),
                Some(_) => ClientAddr::new(address).over_tls(),
            }
            .trusting(&trusted);
            let stream = match tls {
                None => TcpOrTls::Plain(stream),
                Some(tls) => {
                    let shaken = tokio::select! {
                        shaken = handshake(&tls, stream, address, header_read_timeout) => shaken,
                        () = admission.closing() => return,
                    };
                    match shaken {
                        Some(stream) => stream,
                        None => {
                            shared.metrics.tls_handshake_failed();
                            return;
                        }
                    }
                }
            };
            let activity = Activity::new(header_read_timeout, idle_timeout);
            let ended = serve(stream, client.clone(), address, admission, activity, &shared, protocols).await;
            // Behind a trusted proxy, the strike falls on the client its
            // last request named, never on the proxy.
            if let Some(struck) = client.struck_address() {
                if penalties.ended(struck, ended) {
                    counts.strikes.inc();
                }
            }
        });
    }
}

/// Until when a new connection from `address` waits, counted and logged.
fn held_back(penalties: &Penalties, counts: &HeldBack, address: SocketAddr) -> Option<tokio::time::Instant> {
    let hold = penalties.wait(address.ip());
    if hold.is_some() {
        counts.held.inc();
        debug!(%address, "holding a connection back: its address was struck for abuse");
    }
    hold
}

/// The TLS handshake of a client connection, which must end within
/// `header_read_timeout` as a request head must arrive (a client that
/// trickles its handshake holds a slot as a slow head would). `None`: it
/// failed (logged).
async fn handshake(tls: &ServerTls, stream: TcpStream, peer: SocketAddr, timeout: Duration) -> Option<ClientStream> {
    match tokio::time::timeout(timeout, tls.acceptor().accept(stream)).await {
        Ok(Ok(stream)) => Some(TcpOrTls::Tls(Box::new(stream))),
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            debug!(%peer, "TLS handshake did not end within header_read_timeout");
            None
        }
    }
}

/// Serves one proxy connection of `client` on the worker it was dealt to.
async fn serve(
    stream: ClientStream,
    client: ClientAddr,
    peer: SocketAddr,
    admission: Admission,
    activity: Arc<Activity>,
    shared: &Arc<Shared>,
    protocols: Arc<Protocols>,
) -> Ended {
    let io = ActivityIo::new(stream, activity.clone());
    // Requests in flight, so the idle and slow-head guards never close a
    // connection that is serving a request; and every body dropped before its
    // end, by whichever layer refused its request, drained so the client
    // reads the refusal.
    let tracked = TrackRequestsLayer::new(activity.clone(), shared.per_connection.refusal_drain);
    let service = Calls::new(tracked.layer(proxy_service(shared, &Forward::of(client))));
    let conn = ProxyConnection::new(io, service, protocols, activity.clone());
    connection::serve(conn, activity, admission, peer).await
}

/// The HTTP/2 flow-control windows we grant a client: what it may send that
/// fencegate has not read yet. hyper's defaults, written down because they
/// bound a connection's unread bytes (one connection window, however many
/// streams) and give one stream the whole window, for uploads over links
/// with a long round trip.
const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;
const H2_STREAM_WINDOW: u32 = 1024 * 1024;

/// The fields hyper's HTTP/1.1 parser allows in a head when not told.
const HYPER_MAX_HEADERS: usize = 100;

/// HTTP/1.1 and h2c, with the head and stream limits from `[server]`.
fn protocols(server: &ServerConfig, resting: Gauge<i64, AtomicI64>) -> Protocols {
    let mut h1 = http1::Builder::new();
    h1.timer(TokioTimer::new())
        // Our own guards (connection/) time request heads and idleness:
        // hyper's head timer would also close idle keep-alive connections.
        .header_read_timeout(None)
        // A head larger than this gets 431.
        .max_buf_size(server.max_header_bytes);
    // So does one with more fields than this; HTTP/2 heads are counted in
    // the stack (stack/header_count). hyper's own limit is 100 fields, in arrays
    // on the stack; a limit set here, even 100, makes it allocate and fill
    // two arrays of that many slots for every head it parses (docs/perf-log.md,
    // "Code comments' figures"), so it is set only when it differs.
    if server.max_headers != HYPER_MAX_HEADERS {
        h1.max_headers(server.max_headers);
    }
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        // A decoded header list larger than this gets 431 from h2 (HPACK:
        // each field counts its name, its value and 32 bytes).
        .max_header_list_size(u32::try_from(server.max_header_bytes).unwrap_or(u32::MAX))
        // Streams at once: with the connection's share of the buffer
        // budget, what bounds the memory one connection can take.
        .max_concurrent_streams(server.max_concurrent_streams)
        // Streams h2 itself refuses or resets (over max_concurrent_streams,
        // a header list over max_header_list_size, a flow-control breach)
        // before the stack sees them: a client that earns this many gets
        // GOAWAY, as one whose requests the stack refuses this many times in
        // a row is closed (connection/activity.rs). h2's default, 1024,
        // let a pipelined flood make it decode a thousand heads per handshake.
        .max_local_error_reset_streams(REFUSALS_IN_A_ROW as usize)
        // Fixed windows: an adaptive window would let a client that reads
        // fast grow what it may leave unread.
        .adaptive_window(false)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .initial_stream_window_size(H2_STREAM_WINDOW);
    // For connections that rest (plain TCP): a response's head and body
    // copied into one buffer and written at once (hyper's flatten strategy)
    // instead of queued as slices for a vectored write. For the heads and
    // small bodies most answers are, the queue's bookkeeping costs more than
    // the copy (docs/perf-log.md). But the buffer keeps the width of the
    // largest body it took (up to `max_buf_size` and one upstream chunk past
    // it, hundreds of KiB) until hyper's state is freed, which only a rest
    // does (connection/resting.rs): a TLS connection, which never rests,
    // keeps the queue.
    let mut http1_resting = h1.clone();
    http1_resting.writev(false);
    Protocols { http1_resting, http1: h1, http2: h2, resting }
}
