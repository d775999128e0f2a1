//! The request's head rewritten for its route's upstream.

use http::header::{HeaderValue, HOST};
use http::Request;
use hyper::upgrade::OnUpgrade;

use super::upgrade::Upgrade;
use crate::http::RequestBody;
use crate::proxy::{add_forwarded, strip_hop_by_hop, wants_upgrade, ClientAddr, Parking};
use crate::route::Route;
use crate::stack::error::ProxyError;
use crate::stack::router::Destination;

/// The request as the upstream gets it: origin form, hop-by-hop headers
/// removed, `X-Forwarded-*`, `Host` and `Destination` on the upstream's terms.
pub(super) fn prepare(
    client_addr: &ClientAddr,
    route: &Route,
    req: Request<RequestBody>,
    fenced: bool,
    destination: Option<Destination>,
) -> Result<(Request<RequestBody>, Upgrade), ProxyError> {
    let (mut parts, body) = req.into_parts();
    // HTTP/1.1 clients share their worker's upstream connections; an HTTP/2
    // client's streams stay on its own (proxy/pool/parking.rs says why). Over HTTP/2 to
    // the upstream, every client's requests share the worker's (proxy/pool/h2).
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
    add_forwarded(&mut parts.headers, client_addr, original_host.clone());
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
        parts.headers.insert(crate::stack::router::DESTINATION, value);
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
