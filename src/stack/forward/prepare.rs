//! The request's head rewritten for its route's upstream.

use http::header::{HeaderName, HeaderValue, HOST};
use http::{Extensions, Request};
use hyper::upgrade::OnUpgrade;

use super::upgrade::Upgrade;
use crate::http::RequestBody;
use crate::proxy::{add_forwarded, strip_found, ClientAddr, HopFields, Parking};
use crate::route::Route;
use crate::stack::error::ProxyError;
use crate::stack::router::{Destination, DESTINATION};

/// The request as the upstream gets it: origin form, hop-by-hop headers
/// removed, `X-Forwarded-*`, `Host` and `Destination` on the upstream's terms.
pub(super) fn prepare(
    client_addr: &ClientAddr,
    route: &Route,
    req: Request<RequestBody>,
    fenced: bool,
    destination: Option<Destination>,
) -> Result<(Request<RequestBody>, Upgrade), ProxyError> {
    rewrite(client_addr, route, req, fenced, destination, Path::Quick)
}

/// Which way [`rewrite`] may take: the quick one where it applies, or (for
/// the tests that hold the two to each other) always the general one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Quick,
    #[cfg(test)]
    General,
}

fn rewrite(
    client_addr: &ClientAddr,
    route: &Route,
    mut req: Request<RequestBody>,
    fenced: bool,
    destination: Option<Destination>,
    path: Path,
) -> Result<(Request<RequestBody>, Upgrade), ProxyError> {
    // HTTP/1.1 clients share their worker's upstream connections; an HTTP/2
    // client's streams stay on its own (proxy/pool/parking.rs says why). Over HTTP/2 to
    // the upstream, every client's requests share the worker's (proxy/pool/h2).
    let parking = match (route.upstream_http2, req.version()) {
        (true, _) => Parking::Multiplexed,
        (false, http::Version::HTTP_2) => Parking::Client,
        (false, _) => Parking::Worker,
    };

    // One pass over the fields finds the hop-by-hop ones and `Host`.
    let found = HopFields::find(req.headers());
    // Only requests the fence does not cover may switch protocols, and only
    // on routes with `unfenced_tunnels` (routing refused the others): a
    // fenced write must end with its response head, or the key's turn would
    // never pass on. HTTP/2 to the upstream carries no upgrades: `Upgrade` is
    // dropped with the other hop-by-hop fields.
    let asked = !fenced && !route.upstream_http2 && found.wants_upgrade(req.headers());
    let client = if asked { req.extensions_mut().remove::<OnUpgrade>() } else { None };
    // The request is rewritten where it is; what the upstream gets is a new
    // request's head: none of the client's extensions, the upstream's version.
    *req.extensions_mut() = Extensions::new();
    *req.version_mut() = if route.upstream_http2 { http::Version::HTTP_2 } else { http::Version::HTTP_11 };

    // Origin form: the connection already goes to the upstream.
    let uri = std::mem::take(req.uri_mut());
    *req.uri_mut() = route.upstream.origin_form(uri).map_err(|e| ProxyError::internal("upstream URI", e))?;

    // What the fence read must reach the upstream as it was read: a
    // `Connection` that names the token or a header the key is made from
    // would otherwise forward the write under another key than the one fenced.
    let keep = |name: &HeaderName| {
        route.reads_header(name) || destination.as_ref().is_some_and(|d| d.route.reads_header(name))
    };
    let headers = req.headers_mut();
    if path == Path::Quick && !route.upstream_http2 && !found.connection_names_fields() && found.hosts() == 1 {
        // The common case: an HTTP/1.1 upstream, one `Host` (routing made it
        // canonical) and a `Connection` that names no field, so `Host` stays
        // where it is. It takes the upstream's value in place, and the
        // client's goes on to `X-Forwarded-Host`: no copy, no lookup by name,
        // and the same fields in the same order as the general case below.
        strip_found(headers, found, asked, keep);
        let slot = headers.iter_mut().find(|(name, _)| *name == HOST).map(|(_, value)| value);
        let slot = slot.ok_or_else(|| ProxyError::internal("Host", "the Host field went missing"))?;
        let original_host = match route.preserve_host {
            true => slot.clone(),
            false => std::mem::replace(slot, route.upstream.host.clone()),
        };
        let host = if route.preserve_host { &original_host } else { &route.upstream.host };
        let destination = destination.map(|d| destination_value(route, host, &d)).transpose()?;
        add_forwarded(headers, client_addr, Some(original_host));
        if let Some(value) = destination {
            headers.insert(DESTINATION, value);
        }
        return Ok((req, Upgrade { asked, client, parking }));
    }

    // The host the client asked for, made canonical by routing.
    let original_host = headers.get(HOST).cloned();
    strip_found(headers, found, asked, keep);
    add_forwarded(headers, client_addr, original_host.clone());
    let host = match (&original_host, route.preserve_host) {
        (Some(h), true) => h.clone(),
        _ => route.upstream.host.clone(),
    };
    if let Some(destination) = destination {
        let value = destination_value(route, &host, &destination)?;
        headers.insert(DESTINATION, value);
    }
    if route.upstream_http2 {
        // HTTP/2 names the host in `:authority`, from an absolute URI.
        headers.remove(HOST);
        let origin = std::mem::take(req.uri_mut());
        *req.uri_mut() = http2_uri(route, &host, origin)?;
    } else {
        headers.insert(HOST, host);
    }
    Ok((req, Upgrade { asked, client, parking }))
}

/// The `Destination` the upstream gets: the form that was keyed, on the
/// upstream's terms (its `host` and base path), as a WebDAV server checks a
/// Destination against them.
fn destination_value(route: &Route, host: &HeaderValue, destination: &Destination) -> Result<HeaderValue, ProxyError> {
    let target = format!(
        "{}://{}{}{}{}{}",
        route.upstream.scheme,
        host.to_str().unwrap_or_default(),
        route.upstream.base_path,
        destination.path,
        if destination.query.is_some() { "?" } else { "" },
        destination.query.as_deref().unwrap_or_default()
    );
    HeaderValue::try_from(target).map_err(|e| ProxyError::internal("Destination", e))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::header::HeaderValue;

    use super::*;
    use crate::config::{test_route_config, RouteConfig};

    /// A request's head after [`rewrite`]: its target, version and fields in order.
    fn rewritten(
        route: &Route,
        fields: &[(&str, &str)],
        fenced: bool,
        destination: Option<Destination>,
        path: Path,
    ) -> (String, http::Version, Vec<(String, HeaderValue)>) {
        let mut req = Request::builder().method("PUT").uri("/objects/a?x=1");
        for (name, value) in fields {
            req = req.header(*name, *value);
        }
        let req = req.body(RequestBody::empty()).unwrap();
        let client = ClientAddr::new(std::net::SocketAddr::from(([192, 0, 2, 7], 40000)));
        let (req, _) = rewrite(&client, route, req, fenced, destination, path).unwrap();
        let fields = req.headers().iter().map(|(n, v)| (n.as_str().to_string(), v.clone())).collect();
        (req.uri().to_string(), req.version(), fields)
    }

    /// The quick way gives the upstream exactly what the general way does,
    /// field for field and in the same order, for every head it takes.
    #[test]
    fn the_quick_rewrite_matches_the_general_one_field_for_field() {
        let heads: &[&[(&str, &str)]] = &[
            &[("host", "a.example"), ("x-fencing-token", "7"), ("content-length", "3")],
            &[("user-agent", "t"), ("host", "a.example"), ("connection", "keep-alive"), ("x-fencing-token", "7")],
            &[("host", "a.example"), ("x-forwarded-for", "198.51.100.1"), ("x-forwarded-for", "203.0.113.9, 10.0.0.1")],
            &[("x-forwarded-proto", "https"), ("host", "a.example"), ("x-forwarded-host", "evil.example")],
            &[("host", "a.example"), ("keep-alive", "timeout=5"), ("te", "trailers"), ("proxy-connection", "x")],
            &[("host", "a.example"), ("connection", "Keep-Alive"), ("transfer-encoding", "chunked"), ("trailer", "x")],
            &[("host", "a.example"), ("upgrade", "websocket"), ("connection", "upgrade"), ("x-a", "1")],
            &[("host", "a.example:8080"), ("proxy-authorization", "Basic eA=="), ("x-b", "2"), ("x-b", "3")],
        ];
        for preserve_host in [false, true] {
            let route = Route::detached(RouteConfig { preserve_host, ..test_route_config("objects", "/objects/") });
            let target = Arc::new(Route::detached(test_route_config("other", "/other/")));
            for head in heads {
                for fenced in [true, false] {
                    let destinations = [
                        None,
                        Some(Destination { route: target.clone(), path: "/other/b".into(), query: Some("y=2".into()) }),
                    ];
                    for destination in destinations {
                        let quick = rewritten(&route, head, fenced, destination.clone(), Path::Quick);
                        let general = rewritten(&route, head, fenced, destination.clone(), Path::General);
                        assert_eq!(
                            quick, general,
                            "head {head:?}, preserve_host {preserve_host}, fenced {fenced}, destination {destination:?}"
                        );
                    }
                }
            }
        }
    }
}
