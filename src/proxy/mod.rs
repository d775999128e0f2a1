//! Forwarding to the upstream: each client connection's own HTTP/1.1 upstream
//! connections within each route's cap and the connection's share of it, in
//! clear or over TLS (`tls.rs`), URI and header rewrite, timeouts, and
//! protocol upgrades. This module knows nothing of tokens: the fence has
//! decided before a request gets here.

mod error;
mod headers;
mod pool;
mod teardown;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tower::Service;

pub(crate) use error::BoxError;
pub use error::UpstreamError;
pub use headers::{add_forwarded, strip_hop_by_hop, wants_upgrade};
pub use pool::{Parking, UpstreamSlots};
pub use teardown::Teardown;
pub use tls::{PlatformRoots, UpstreamTls, UpstreamTlsFiles};

use crate::body::{Handover, RequestBody};
use crate::error::ProxyError;
use crate::outcome::{Decision, Outcome};
use crate::route::Route;
use crate::routing::{Destination, Routed};

pin_project_lite::pin_project! {
    /// The body of every response fencegate sends: streamed from the upstream,
    /// or made here in one piece (a problem document). It carries the
    /// request's [`Decision`] up to the access log: in the body, not in the
    /// response's extensions, which cost three allocations a response.
    #[derive(Debug)]
    pub struct ProxyBody {
        #[pin]
        inner: Either<hyper::body::Incoming, Full<Bytes>>,
        decision: Option<Decision>,
        // The upstream HTTP/2 stream the body comes on, counted in use
        // until the body is dropped (http2.rs).
        stream: Option<pool::StreamHeld>,
    }
}

impl ProxyBody {
    /// A body streamed from the upstream.
    pub fn upstream(body: hyper::body::Incoming) -> Self {
        ProxyBody { inner: Either::Left(body), decision: None, stream: None }
    }

    /// A body made here.
    pub fn full(body: Full<Bytes>) -> Self {
        ProxyBody { inner: Either::Right(body), decision: None, stream: None }
    }

    /// The decision the layers below recorded, if any.
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }

    pub fn decision_mut(&mut self) -> Option<&mut Decision> {
        self.decision.as_mut()
    }
}

impl Default for ProxyBody {
    fn default() -> Self {
        ProxyBody::full(Full::default())
    }
}

impl hyper::body::Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The statuses fencegate refuses a request's head with (400: malformed, a
/// bad token or key; 429: over the header rate; 431: too many or too large
/// fields). A connection's count of refused heads counts only fencegate's.
pub fn refuses_heads_with(status: StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 429 | 431)
}

/// Records `decision` in `response`. An upstream's answer whose status is
/// one fencegate refuses heads with ([`refuses_heads_with`]) is marked
/// [`UpstreamAnswer`] too, so the count of refused heads can tell them apart.
pub fn decide(response: &mut Response<ProxyBody>, decision: Decision) {
    if refuses_heads_with(response.status()) && matches!(decision.outcome, Outcome::Forwarded | Outcome::Unfenced) {
        response.extensions_mut().insert(UpstreamAnswer);
    }
    response.body_mut().decision = Some(decision);
}

/// Marks the upstream's answers whose status is one fencegate refuses heads
/// with (see [`decide`]).
#[derive(Debug, Clone, Copy)]
pub struct UpstreamAnswer;

/// The client's address, for `X-Forwarded-For`.
#[derive(Debug, Clone)]
pub struct ClientAddr {
    /// The IP as a header value, formatted once per connection.
    ip: HeaderValue,
    /// `X-Forwarded-Proto`: `http`, or `https` over TLS.
    proto: HeaderValue,
}

impl ClientAddr {
    /// A client over plain HTTP.
    pub fn new(addr: SocketAddr) -> ClientAddr {
        let ip = HeaderValue::try_from(addr.ip().to_string()).expect("an IP address is a valid header value");
        ClientAddr { ip, proto: HeaderValue::from_static("http") }
    }

    /// The same client, over TLS.
    pub fn over_tls(self) -> ClientAddr {
        ClientAddr { proto: HeaderValue::from_static("https"), ..self }
    }

    /// Whether the client speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.proto == "https"
    }
}

/// Given with a request (`Routed::slot_taken`) by whoever runs its forward
/// to its end even if the caller leaves (the fence): the forward marks it
/// once it has its way to the upstream, before it sends a byte. Until then a
/// forward whose caller is gone (its client connection closed, its HTTP/2
/// stream was reset) can simply be dropped, with nothing sent, instead of
/// holding its key's turn until `queue_timeout` for nobody; from then on it
/// runs to its end whatever the caller does.
#[derive(Clone, Debug, Default)]
pub struct SlotTaken(Arc<Handover>);

impl SlotTaken {
    fn mark(&self) {
        self.0.mark_taken();
    }

    /// Whether the forward may have sent something.
    pub fn is_taken(&self) -> bool {
        self.0.is_taken()
    }

    /// How far the request's body went to the upstream, and on which
    /// connection.
    pub fn handover(&self) -> &Arc<Handover> {
        &self.0
    }

    /// This flag, cleared for a new request; a new one if the last
    /// request's body is still going out.
    fn renewed(&self) -> SlotTaken {
        if self.0.renew() {
            self.clone()
        } else {
            SlotTaken::default()
        }
    }
}

/// The innermost service: sends a request to its route's upstream, on an
/// upstream connection of the worker's (HTTP/1.1 clients) or of the client
/// connection's own (HTTP/2; upstream.rs says why). Make one per client
/// connection. The layers above clone it for every request: one count, of
/// this connection's, is all a clone touches.
#[derive(Clone, Debug)]
pub struct Forward(Arc<ClientSide>);

#[derive(Debug)]
struct ClientSide {
    upstreams: pool::Upstreams,
    client: ClientAddr,
    /// The flag of this connection's fenced requests over HTTP/1.1, one at a
    /// time (see [`Upstream::slot_flag`]).
    slot_taken: SlotTaken,
}

impl Forward {
    /// Whether its client speaks TLS.
    pub fn over_tls(&self) -> bool {
        self.0.client.is_tls()
    }

    /// The forwarder of the client connection `client`.
    pub fn of(client: ClientAddr) -> Forward {
        Forward(Arc::new(ClientSide {
            upstreams: pool::Upstreams::default(),
            client,
            slot_taken: SlotTaken::default(),
        }))
    }
}

/// Where the fence sends the requests it lets through: [`Forward`], or any
/// tower service (tests). A trait of its own rather than `tower::Service`, so
/// the forward's future needs no name: it rides inside the fence's one boxed
/// future, not in a box of its own.
pub trait Upstream<B>: Clone + Send + 'static {
    /// Sends `request` upstream; resolves with the response head.
    fn send(self, request: Routed<B>) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send;

    /// A cleared flag for a fenced request of `version` to be sent (its
    /// [`Routed::slot_taken`]).
    fn slot_flag(&self, _version: http::Version) -> SlotTaken {
        SlotTaken::default()
    }
}

impl Upstream<RequestBody> for Forward {
    fn send(
        self,
        request: Routed<RequestBody>,
    ) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send {
        forward(self, request)
    }

    /// An HTTP/1.1 connection has one request at a time in the fence: the
    /// next is not read before the last one's response head has come, and
    /// only a connection its client closed has a forward left running. So
    /// its requests share one flag, the connection's (no allocation per
    /// request); an HTTP/2 connection's streams each get their own.
    fn slot_flag(&self, version: http::Version) -> SlotTaken {
        if version == http::Version::HTTP_2 {
            SlotTaken::default()
        } else {
            self.0.slot_taken.renewed()
        }
    }
}

impl<S, B> Upstream<B> for S
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = ProxyError> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    fn send(self, request: Routed<B>) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send {
        tower::ServiceExt::oneshot(self, request)
    }
}

/// Sends a routed request to its route's upstream. The head is rewritten
/// before the first await, so the future keeps only what it still needs (it
/// rides in every fenced request's box, and every move of it copies it all).
fn forward(
    connection: Forward,
    req: Routed<RequestBody>,
) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>> + Send {
    let Routed { route, request, fenced, destination, slot_taken } = req;
    let prepared = prepare(&connection, &route, request, fenced, destination);
    async move {
        let (request, upgrade) = prepared?;
        // A way to the upstream first, outside the timeout: at the route's cap
        // the wait for a slot is bounded by `queue_timeout` and ends, if no slot
        // frees, in a refusal with nothing sent, never in an unknown outcome.
        let upstreams = &connection.0.upstreams;
        let (authority, tls, slots) = (&route.upstream.authority, route.upstream_tls.as_ref(), &route.upstream_slots);
        let checkout = upstreams.checkout(authority, slots, route.queue_timeout, upgrade.parking).await?;
        if let Some(taken) = &slot_taken {
            taken.mark();
        }
        let handover = slot_taken.as_ref().map(SlotTaken::handover);
        // The timeout covers connecting, retries and backoff included. A
        // fenced request past it has its HTTP/1.1 connection torn down
        // before the error goes back (and with it the key's settle period
        // starts): a graceful close would still write out what the kernel
        // held of the request. (Over HTTP/2, dropping the exchange resets
        // its stream.)
        let (answered, teardown) = {
            let mut sending = std::pin::pin!(upstreams.send(authority, tls, slots, checkout, request, handover));
            let answered = tokio::time::timeout(route.timeout, sending.as_mut()).await;
            let on = handover.filter(|_| answered.is_err()).and_then(|h| h.connection());
            (answered, on.filter(|connection| !connection.is_multiplexed()))
        };
        if let Some(teardown) = teardown {
            teardown.tear_down().await;
        }
        let mut response = match answered {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                // A streamed body that overran the route's limit (an unfenced one,
                // or a fenced one on a `stream_body` route): the client's fault,
                // but part of it reached the upstream, so a fenced write settles.
                if crate::body::overran_limit(&e) {
                    return Err(ProxyError::BodyTooLarge { limit: route.max_body, partly_sent: true });
                }
                return Err(e.into());
            }
            Err(_) => return Err(ProxyError::UpstreamTimeout(route.timeout)),
        };

        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching && !upgrade.asked {
            // The upstream took over the connection for a request that never
            // asked it to: whatever it does with the request is unknown (a
            // fenced write settles), and nothing of the switch is relayed.
            return Err(UpstreamError::exchange(UNREQUESTED_SWITCH).into());
        }
        if switching {
            if let Some(client_upgrade) = upgrade.client {
                let upstream_upgrade = hyper::upgrade::on(&mut response);
                tokio::spawn(splice(client_upgrade, upstream_upgrade));
            }
        }
        strip_hop_by_hop(response.headers_mut(), switching && upgrade.asked, |_| false);
        let stream = response.extensions_mut().remove::<pool::StreamHeld>();
        Ok(response.map(|body| ProxyBody { stream, ..ProxyBody::upstream(body) }))
    }
}

/// Why a 101 to a request that did not ask to switch protocols is an error.
const UNREQUESTED_SWITCH: &str =
    "the upstream answered 101 Switching Protocols to a request that did not ask to switch protocols";

/// What the forward keeps of the client's request besides the request itself.
struct Upgrade {
    /// The request asks to switch protocols, and may (it is not fenced).
    asked: bool,
    /// The client's side of the switch, when asked.
    client: Option<OnUpgrade>,
    /// Where the upstream connection comes from and goes back to.
    parking: Parking,
}

/// The request as the upstream gets it: origin form, hop-by-hop headers
/// removed, `X-Forwarded-*`, `Host` and `Destination` on the upstream's terms.
fn prepare(
    connection: &Forward,
    route: &Route,
    req: Request<RequestBody>,
    fenced: bool,
    destination: Option<Destination>,
) -> Result<(Request<RequestBody>, Upgrade), ProxyError> {
    let (mut parts, body) = req.into_parts();
    // HTTP/1.1 clients share their worker's upstream connections; an HTTP/2
    // client's streams stay on its own (upstream.rs says why). Over HTTP/2 to
    // the upstream, every client's requests share the worker's (http2.rs).
    let parking = match (route.upstream_http2, parts.version) {
        (true, _) => Parking::Multiplexed,
        (false, http::Version::HTTP_2) => Parking::Client,
        (false, _) => Parking::Worker,
    };

    // Only requests the fence does not cover may switch protocols, and only
    // on routes with `unfenced_tunnels` (routing refused the others): a
    // fenced write must end with its response head, or the key's turn would
    // never pass on. HTTP/2 to the upstream carries no upgrades: `Upgrade` is
    // dropped with the other hop-by-hop fields.
    let asked = wants_upgrade(&parts.headers) && !fenced && !route.upstream_http2;
    let client = if asked { parts.extensions.remove::<OnUpgrade>() } else { None };

    // The host the client asked for, made canonical by routing (no copy).
    let original_host = parts.headers.get(HOST).cloned();
    // Origin form: the connection already goes to the upstream.
    let uri = std::mem::take(&mut parts.uri);
    parts.uri = route.upstream.origin_form(uri).map_err(|e| ProxyError::internal("upstream URI", e))?;

    // What the fence read must reach the upstream as it was read: a
    // `Connection` that names the token or a header the key is made from
    // would otherwise forward the write under another key than the one fenced.
    strip_hop_by_hop(&mut parts.headers, asked, |name| {
        route.reads_header(name) || destination.as_ref().is_some_and(|d| d.route.reads_header(name))
    });
    add_forwarded(&mut parts.headers, &connection.0.client, original_host.clone());
    let host = match (&original_host, route.preserve_host) {
        (Some(h), true) => h.clone(),
        _ => route.upstream.host.clone(),
    };
    if let Some(destination) = destination {
        // The form that was keyed, on the upstream's terms: its Host and base
        // path, as a WebDAV server checks a Destination against them.
        let target = format!(
            "{}://{}{}{}{}{}",
            route.upstream.scheme,
            host.to_str().unwrap_or_default(),
            route.upstream.base_path,
            destination.path,
            if destination.query.is_some() { "?" } else { "" },
            destination.query.as_deref().unwrap_or_default()
        );
        let value = HeaderValue::try_from(target).map_err(|e| ProxyError::internal("Destination", e))?;
        parts.headers.insert(crate::routing::DESTINATION, value);
    }
    let mut request = Request::new(body);
    if route.upstream_http2 {
        // HTTP/2 names the host in `:authority`, from an absolute URI.
        let uri = http2_uri(route, &host, parts.uri)?;
        parts.uri = uri;
        parts.headers.remove(HOST);
        *request.version_mut() = http::Version::HTTP_2;
    } else {
        parts.headers.insert(HOST, host);
    }
    *request.method_mut() = parts.method;
    *request.uri_mut() = parts.uri;
    *request.headers_mut() = parts.headers;
    Ok((request, Upgrade { asked, client, parking }))
}

/// `origin`, an origin-form URI, as the absolute URI whose `:authority` is
/// `host` (the `Host` an HTTP/1.1 upstream would get).
fn http2_uri(route: &Route, host: &HeaderValue, origin: http::Uri) -> Result<http::Uri, ProxyError> {
    let mut parts = origin.into_parts();
    parts.scheme = Some(route.upstream.scheme.clone());
    let authority =
        http::uri::Authority::try_from(host.as_bytes()).map_err(|e| ProxyError::internal("upstream :authority", e))?;
    parts.authority = Some(authority);
    http::Uri::from_parts(parts).map_err(|e| ProxyError::internal("upstream URI", e))
}

/// Copies bytes both ways between an upgraded client and upstream connection.
async fn splice(client: OnUpgrade, upstream: OnUpgrade) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, "protocol upgrade failed");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        tracing::debug!(error = %e, "upgraded connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP/1.1 connection's fenced requests share its flag, cleared for
    /// each (a flag left set would make the next request's forward outlive
    /// a client that left before anything was sent); HTTP/2 streams each
    /// get one of their own.
    #[test]
    fn http1_requests_share_a_cleared_flag_and_http2_streams_get_their_own() {
        let forward = Forward::of(ClientAddr::new(SocketAddr::from(([127, 0, 0, 1], 1))));
        let first = forward.slot_flag(http::Version::HTTP_11);
        first.mark();
        assert!(first.is_taken());
        let second = forward.slot_flag(http::Version::HTTP_11);
        assert!(!second.is_taken() && !first.is_taken(), "the connection's flag, cleared");
        let stream = forward.slot_flag(http::Version::HTTP_2);
        second.mark();
        assert!(!stream.is_taken(), "a stream's flag is its own");
    }
}
