//! Routing: each request's target made canonical and its route found.

use http::header::HOST;
use http::uri::PathAndQuery;
use http::{HeaderMap, Request, Uri, Version};

use super::fields::Tokens;
use super::path::find_route;
use super::{destination, host, method, tunnel, underscores, Routed};
use crate::fence::token::{parse_token, TokenError};
use crate::http::RouteTag;
use crate::route::RouteTable;
use crate::stack::error::ProxyError;

/// The request in canonical form with its route, or why it was refused (with
/// its route, when it had one).
pub(crate) fn route_request<B>(
    routes: &RouteTable,
    mut request: Request<B>,
    over_tls: bool,
) -> Result<(Routed<B>, RouteTag), (ProxyError, Option<RouteTag>)> {
    // The request is checked and changed where it is, not taken apart and
    // put back together (two moves of its head).
    let untagged = |e: ProxyError| (e, None);
    if request.version() == Version::HTTP_2 {
        check_header_whitespace(request.headers()).map_err(untagged)?;
    }
    // The route first (from the path alone; a refusal of the host comes
    // before its own), so the pass below reads the route's token field too.
    let found = find_route(routes, request.uri().path());
    // Not when the token is `Host`: routing rewrites it below.
    let token_header = found.as_ref().ok().map(|(route, _)| &route.token_header).filter(|name| **name != HOST);
    // One pass over the fields finds what every check below reads, rather
    // than a lookup by name (a hash and a probe) for each.
    let fields = super::fields::scan(request.headers(), token_header);
    let present = fields.present;
    // Read now, while the pass's fields are at hand; taken by the head
    // check unless a step below changes the fields (dropping `_` names).
    let token = token_header.map(|_| match fields.tokens {
        Tokens::None => Ok(None),
        Tokens::One(value) => parse_token(value.as_bytes()).map(Some),
        Tokens::Repeated => Err(TokenError::Repeated),
    });
    if let Some(host) = host::request_host(request.uri(), fields.hosts, over_tls).map_err(|e| untagged(e.into()))? {
        request.headers_mut().insert(HOST, host);
    }

    let (route, path) = found.map_err(untagged)?;
    // Only a changed path is written back: what comes after routing reads the
    // path and query only, so an absolute-form or HTTP/2 target that is
    // already canonical needs no new URI.
    if let Some(path) = path {
        // The canonical form, in origin form: what is keyed is what is forwarded.
        let target = match request.uri().query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        let target =
            PathAndQuery::try_from(target).map_err(|e| untagged(ProxyError::internal("canonical target", e)))?;
        *request.uri_mut() = Uri::from(target);
    }
    let tag = RouteTag(route.clone());
    let tagged = |e: ProxyError| (e, Some(tag.clone()));

    // Before anything reads a header: names spelled with `_` are dropped, or
    // refused when they fold into another's (underscores.rs).
    let token = match present.underscored {
        false => token,
        true => {
            underscores::apply(request.headers_mut(), route.underscores_in_headers).map_err(|e| tagged(e.into()))?;
            None
        }
    };
    let (method, headers) = (request.method(), request.headers());
    // A tunnel outlives its token and carries writes no fence sees (tunnel.rs).
    tunnel::check(method, headers, present.upgrade, request.extensions(), route.unfenced_tunnels)
        .map_err(|e| tagged(e.into()))?;
    let mut fenced = method::is_fenced(&route, method, headers, present.overrides).map_err(tagged)?;
    // A COPY or MOVE writes its Destination: the request is fenced when the
    // destination's route fences its method, whatever the source route says.
    let destination = match present.destination {
        false => Ok(None),
        true => destination::destination(routes, &route, headers.get(HOST), headers),
    };
    let destination = match destination {
        Ok(Some(d)) => {
            fenced |= method::is_fenced(&d.route, method, headers, present.overrides).map_err(tagged)?;
            fenced.then_some(d)
        }
        Ok(None) => None,
        // Even on a request its own route does not fence: a Destination that
        // cannot be made canonical and routed could be one the upstream reads
        // as a fenced resource (`/objects/b%2Fc` to a server that decodes it).
        Err(e) => return Err(tagged(e.into())),
    };
    Ok((Routed { route, request, fenced, destination, slot_taken: None, token }, tag))
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
