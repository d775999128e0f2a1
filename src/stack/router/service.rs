//! Routing: each request's target made canonical and its route found.

use http::uri::PathAndQuery;
use http::{HeaderMap, Request, Uri, Version};

use super::path::find_route;
use super::{destination, host, method, tunnel, underscores, Routed};
use crate::http::RouteTag;
use crate::route::RouteTable;
use crate::stack::error::ProxyError;

/// The request in canonical form with its route, or why it was refused (with
/// its route, when it had one).
pub(crate) fn route_request<B>(
    routes: &RouteTable,
    request: Request<B>,
    over_tls: bool,
) -> Result<(Routed<B>, RouteTag), (ProxyError, Option<RouteTag>)> {
    let (mut parts, body) = request.into_parts();
    let untagged = |e: ProxyError| (e, None);
    if parts.version == Version::HTTP_2 {
        check_header_whitespace(&parts.headers).map_err(untagged)?;
    }
    let host = host::request_host(&parts.uri, &mut parts.headers, over_tls).map_err(|e| untagged(e.into()))?;

    let (route, path) = find_route(routes, parts.uri.path()).map_err(untagged)?;
    // Only a changed path is written back: what comes after routing reads the
    // path and query only, so an absolute-form or HTTP/2 target that is
    // already canonical needs no new URI.
    if path.is_some() {
        // The canonical form, in origin form: what is keyed is what is forwarded.
        let path = path.as_deref().unwrap_or(parts.uri.path());
        let target = match parts.uri.query() {
            Some(query) => format!("{path}?{query}"),
            None => path.to_string(),
        };
        let target =
            PathAndQuery::try_from(target).map_err(|e| untagged(ProxyError::internal("canonical target", e)))?;
        parts.uri = Uri::from(target);
    }
    let tag = RouteTag(route.clone());
    let tagged = |e: ProxyError| (e, Some(tag.clone()));

    // Before anything reads a header: names spelled with `_` are dropped, or
    // refused when they fold into another's (underscores.rs).
    underscores::apply(&mut parts.headers, route.underscores_in_headers).map_err(|e| tagged(e.into()))?;
    // A tunnel outlives its token and carries writes no fence sees (tunnel.rs).
    tunnel::check(&parts.method, &parts.headers, &parts.extensions, route.unfenced_tunnels)
        .map_err(|e| tagged(e.into()))?;
    let mut fenced = method::is_fenced(&route, &parts.method, &parts.headers).map_err(tagged)?;
    // A COPY or MOVE writes its Destination: the request is fenced when the
    // destination's route fences its method, whatever the source route says.
    let destination = match destination::destination(routes, &route, host.as_ref(), &parts.headers) {
        Ok(Some(d)) => {
            fenced |= method::is_fenced(&d.route, &parts.method, &parts.headers).map_err(tagged)?;
            fenced.then_some(d)
        }
        Ok(None) => None,
        // Even on a request its own route does not fence: a Destination that
        // cannot be made canonical and routed could be one the upstream reads
        // as a fenced resource (`/objects/b%2Fc` to a server that decodes it).
        Err(e) => return Err(tagged(e.into())),
    };
    let request = Request::from_parts(parts, body);
    Ok((Routed { route, request, fenced, destination, slot_taken: None }, tag))
}

/// HTTP/2 forbids leading and trailing whitespace in field values (RFC 9113
/// §8.2.1); servers strip it, so a key made from the raw value would differ
/// from the one the upstream acts on.
fn check_header_whitespace(headers: &HeaderMap) -> Result<(), ProxyError> {
    let padded = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    for (name, value) in headers {
        let bytes = value.as_bytes();
        if padded(bytes.first()) || padded(bytes.last()) {
            return Err(ProxyError::BadHeader(name.clone()));
        }
    }
    Ok(())
}
