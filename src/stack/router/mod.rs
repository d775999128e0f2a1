//! Canonicalize + route: the first layer a request meets after the access log.
//!
//! Before any route or fence sees a request, its target is put in the one form
//! it is routed, keyed, signed and forwarded by (see [`crate::canonical`]):
//!
//! - the path is canonical (escapes, dot segments, repeated slashes), and a
//!   path that cannot be made so unambiguously is refused (400 `bad-path`);
//! - the host (`Host`, an absolute-form target's authority, HTTP/2
//!   `:authority`) is canonical and becomes the `Host` header; a malformed
//!   one, or two that disagree, is refused (400 `bad-host`);
//! - an HTTP/2 header value with leading or trailing whitespace (which RFC 9113
//!   §8.2.1 forbids, and servers strip) is refused (400 `bad-header`);
//! - the request is fenced when its method, exactly as sent, or a
//!   method-override header names a method the route does not list as safe;
//!   overrides that disagree are refused (400 `method-override`);
//! - header names spelled with `_` are dropped (servers that fold `_` into `-`
//!   would read them as other fields), unless `[server]
//!   underscores_in_headers` passes them; then two that fold into one are
//!   refused (400 `bad-header`);
//! - a request that would open a tunnel (`Upgrade`, `CONNECT`, extended
//!   `CONNECT`) is refused (400 `tunnel-refused`) unless its route allows
//!   unfenced tunnels; h2c and CONNECT tunnels are refused on every route;
//! - a fenced request's WebDAV `Destination` is made canonical and routed too:
//!   its host must be the request's, and its route must send to the same
//!   upstream (400 `bad-destination` otherwise).
//!
//! The request then goes on as [`Routed`]; no route is 404.

mod destination;
mod future;
mod host;
mod layer;
mod method;
mod service;
mod tunnel;
mod underscores;

use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{HeaderMap, Request, Uri, Version};

pub use destination::{Destination, DestinationError, DESTINATION};
pub use host::RequestHostError;
pub use layer::RoutingLayer;
pub use service::Routing;
pub use tunnel::TunnelError;
pub use underscores::FoldedHeaders;

use crate::canonical::{canonical_path, check_path_utf8, EscapedSlashes, NonUtf8, PathOptions};
use crate::http::RouteTag;
use crate::route::{Route, RouteTable};
use crate::stack::error::ProxyError;
use crate::stack::forward::SlotTaken;

/// A request and the route it matched: what the layers below routing take, so
/// none of them can be reached by a request that was not routed.
///
/// By the time a request is `Routed`, its target is canonical (see
/// [`crate::canonical`]): the path, the `Host` header and the `Destination`
/// are the forms it is keyed by and forwarded with.
#[derive(Debug)]
pub struct Routed<B> {
    /// The route the canonical path found.
    pub route: Arc<Route>,
    /// The request, its target and `Host` in canonical form.
    pub request: http::Request<B>,
    /// The request may write: its method, or a method-override header, is not
    /// one of the route's safe methods.
    pub fenced: bool,
    /// The WebDAV `Destination` of a fenced request, canonical and routed.
    pub destination: Option<Destination>,
    /// Set by whoever runs the forward to its end even if the caller leaves
    /// (the fence): the forward marks it once it may send something.
    pub slot_taken: Option<SlotTaken>,
}

/// How paths are canonicalized for routing: escaped slashes, and escapes that
/// are not UTF-8, are kept until the route says what it does with them.
const ROUTING: PathOptions =
    PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Keep, non_utf8: NonUtf8::Raw };

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

/// Finds the route for a raw request path. Returns its canonical form too
/// when that differs from the raw one.
fn find_route(routes: &RouteTable, raw: &str) -> Result<(Arc<Route>, Option<String>), ProxyError> {
    let path = canonical_path(raw, ROUTING)?;
    let Some((index, route)) = routes.find_indexed(&path) else {
        return Err(ProxyError::NoRoute { path: path.into_owned() });
    };
    let route = route.clone();
    let own = route.path_options;
    if own.non_utf8 == NonUtf8::Reject {
        check_path_utf8(&path)?;
    }
    // The route's own rules, where they differ from routing's: it refuses
    // escaped slashes (the default), or keeps repeated ones.
    let refuses_escaped_slash = own.escaped_slashes == EscapedSlashes::Reject
        && path.contains('%')
        && (path.contains("%2F") || path.contains("%5C"));
    if !refuses_escaped_slash && own.merge_slashes {
        let changed = (path != raw).then(|| path.into_owned());
        return Ok((route, changed));
    }
    let path = canonical_path(raw, own)?;
    match routes.find_indexed(&path) {
        Some((i, _)) if i == index => {
            let changed = (path != raw).then(|| path.into_owned());
            Ok((route, changed))
        }
        _ => Err(ProxyError::NoRoute { path: path.into_owned() }),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::PathError;
    use crate::config::UpstreamUrl;
    use crate::route::test_route;

    pub(super) fn table() -> RouteTable {
        let mut keep = crate::config::test_route_config("keep", "/keep/");
        keep.path_options.escaped_slashes = EscapedSlashes::Keep;
        let mut unmerged = crate::config::test_route_config("unmerged", "/unmerged/");
        unmerged.path_options.merge_slashes = false;
        let mut folded = crate::config::test_route_config("folded", "/folded/");
        folded.fold_key_case = true;
        let mut elsewhere = crate::config::test_route_config("elsewhere", "/elsewhere/");
        elsewhere.upstream = UpstreamUrl::parse("http://127.0.0.1:2").unwrap();
        RouteTable::new([
            test_route("objects", "/objects/"),
            test_route("secure", "/secure/"),
            Route::detached(keep),
            Route::detached(unmerged),
            Route::detached(folded),
            Route::detached(elsewhere),
        ])
    }

    pub(super) fn route(method: &str, target: &str, headers: &[(&str, &str)]) -> Result<Routed<()>, ProxyError> {
        let mut request = Request::builder().method(method).uri(target);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        route_request(&table(), request.body(()).unwrap(), false).map(|(routed, _)| routed).map_err(|(e, _)| e)
    }

    #[test]
    fn an_origin_form_target_over_tls_has_port_443_by_default() {
        let host = |over_tls: bool, value: &str| {
            let request = Request::put("/objects/a").header("host", value).body(()).unwrap();
            let (routed, _) = route_request(&table(), request, over_tls).map_err(|(e, _)| e).unwrap();
            routed.request.headers()["host"].to_str().unwrap().to_string()
        };
        assert_eq!(host(true, "a.example:443"), "a.example");
        assert_eq!(host(true, "a.example:80"), "a.example:80");
        assert_eq!(host(false, "a.example:443"), "a.example:443");
        assert_eq!(host(false, "a.example:80"), "a.example");
    }

    fn target(method: &str, target: &str) -> (String, String) {
        let routed = route(method, target, &[("host", "a.example")]).unwrap();
        (routed.route.name.to_string(), routed.request.uri().to_string())
    }

    #[test]
    fn every_spelling_of_a_path_is_routed_and_forwarded_as_one() {
        for spelling in
            ["/objects/a", "/objects//a", "/objects/./a", "/objects/x/../a", "/objects/%61", "/objects/x/%2E%2e/a"]
        {
            assert_eq!(target("PUT", spelling), ("objects".into(), "/objects/a".into()), "{spelling}");
        }
        assert_eq!(target("PUT", "/objects/a%3f?x=%41"), ("objects".into(), "/objects/a%3F?x=%41".into()));
        // The route the canonical path names, not the one the raw text starts with.
        assert_eq!(target("PUT", "/objects/../secure/doc"), ("secure".into(), "/secure/doc".into()));
        assert_eq!(target("PUT", "http://a.example/objects/%61"), ("objects".into(), "/objects/a".into()));
    }

    #[test]
    fn what_stays_ambiguous_is_refused() {
        for (raw, want) in [
            ("/objects/a%2Fb", PathError::EncodedSlash),
            ("/objects/a%5cb", PathError::EncodedSlash),
            ("/../objects/a", PathError::AboveRoot),
            ("/objects/..;/secure/doc", PathError::DotSegmentParameter),
        ] {
            match route("PUT", raw, &[]) {
                Err(ProxyError::BadPath(e)) => assert_eq!(e, want, "{raw}"),
                other => panic!("{raw}: {other:?}"),
            }
        }
        // A route that keeps escaped slashes takes them as they are.
        assert_eq!(target("PUT", "/keep/a%2fb"), ("keep".into(), "/keep/a%2Fb".into()));
        assert!(matches!(route("PUT", "/nowhere/a", &[]), Err(ProxyError::NoRoute { path }) if path == "/nowhere/a"));
    }

    #[test]
    fn route_switches_apply_to_their_routes() {
        assert_eq!(target("PUT", "/unmerged//a/./b"), ("unmerged".into(), "/unmerged//a/b".into()));
        // Fold: the prefix matches in any case, the path is forwarded as sent,
        // and every case of it is one key.
        assert_eq!(target("PUT", "/FOLDED/A"), ("folded".into(), "/FOLDED/A".into()));
        let key = |target: &str| {
            let routed = route("PUT", target, &[]).unwrap();
            routed.route.key_for(routed.request.uri().path(), None, routed.request.headers()).unwrap().to_string()
        };
        assert_eq!(key("/FOLDED/A"), "/folded/a");
        assert_eq!(key("/Folded/a"), "/folded/a");
        assert_eq!(key("/objects/A"), "/objects/A", "a route that does not fold keeps the case");
        // Unmerged: routed by the merged form, then made canonical by the
        // route's own rules, the path must still fall under that route, else
        // 404: merged, /a//../unmerged/b is /unmerged/b; unmerged, /a/unmerged/b.
        assert_eq!(target("PUT", "/x/../unmerged/b"), ("unmerged".into(), "/unmerged/b".into()));
        assert!(
            matches!(route("PUT", "/a//../unmerged/b", &[]), Err(ProxyError::NoRoute { path }) if path == "/a/unmerged/b")
        );
    }

    #[test]
    fn http2_header_values_must_not_be_padded() {
        for value in [" acme", "acme\t", " "] {
            let request =
                Request::builder().version(Version::HTTP_2).uri("http://a.example/objects/a").header("x-tenant", value);
            let refused = route_request(&table(), request.body(()).unwrap(), false).map(|_| ()).map_err(|(e, _)| e);
            assert!(matches!(refused, Err(ProxyError::BadHeader(_))), "{value:?}");
        }
    }
}
