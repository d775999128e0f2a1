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
//! - a fenced request's WebDAV `Destination` is made canonical and routed too:
//!   its host must be the request's, and its route must send to the same
//!   upstream (400 `bad-destination` otherwise).
//!
//! The request then goes on as [`Routed`]; no route is 404.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderValue, HOST};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, Request, Response, Uri, Version};
use tower::{Layer, Service, ServiceExt};

use crate::canonical::{canonical_host, canonical_path, EscapedSlashes, PathOptions};
use crate::error::{ProxyError, Rejection};
use crate::proxy::ProxyBody;
use crate::route::{Destination, Route, RouteTable, RouteTag, Routed};

/// The WebDAV header naming where a COPY or MOVE writes (RFC 4918 §10.3).
pub const DESTINATION: HeaderName = HeaderName::from_static("destination");

/// Headers that common middleware (Rails, Express, Werkzeug, Symfony) honour
/// as the method a request is to be run as.
pub const METHOD_OVERRIDE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// How paths are canonicalized for routing: escaped slashes are kept until the
/// route says what it does with them.
const ROUTING: PathOptions = PathOptions { merge_slashes: true, escaped_slashes: EscapedSlashes::Keep };

/// Applies [`Routing`].
#[derive(Debug, Clone)]
pub struct RoutingLayer {
    routes: Arc<RouteTable>,
}

impl RoutingLayer {
    pub fn new(routes: Arc<RouteTable>) -> Self {
        RoutingLayer { routes }
    }
}

impl<S> Layer<S> for RoutingLayer {
    type Service = Routing<S>;

    fn layer(&self, inner: S) -> Routing<S> {
        Routing { inner, routes: self.routes.clone() }
    }
}

/// Canonicalizes a request's target and finds its route; see the [module docs](self).
/// Every response below, and every refusal, is tagged with the route.
#[derive(Debug, Clone)]
pub struct Routing<S> {
    inner: S,
    routes: Arc<RouteTable>,
}

impl<S, B> Service<Request<B>> for Routing<S>
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Rejection>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (routed, tag) = match route_request(&self.routes, request) {
            Ok(routed) => routed,
            Err((error, tag)) => {
                let mut rejection = Rejection::from(error);
                rejection.route = tag;
                return Box::pin(std::future::ready(Err(rejection)));
            }
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            match inner.oneshot(routed).await {
                Ok(mut response) => {
                    response.extensions_mut().insert(tag);
                    Ok(response)
                }
                Err(mut rejection) => {
                    rejection.route = Some(tag);
                    Err(rejection)
                }
            }
        })
    }
}

/// The request in canonical form with its route, or why it was refused (with
/// its route, when it had one).
pub fn route_request<B>(
    routes: &RouteTable,
    request: Request<B>,
) -> Result<(Routed<B>, RouteTag), (ProxyError, Option<RouteTag>)> {
    let (mut parts, body) = request.into_parts();
    let untagged = |e: ProxyError| (e, None);
    if parts.version == Version::HTTP_2 {
        check_header_whitespace(&parts.headers).map_err(untagged)?;
    }
    let host = canonical_request_host(&parts.uri, &mut parts.headers).map_err(untagged)?;

    let (index, route, path) = find_route(routes, parts.uri.path()).map_err(untagged)?;
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
        let target = PathAndQuery::try_from(target)
            .map_err(|e| untagged(ProxyError::Internal(format!("canonical target: {e}"))))?;
        parts.uri = Uri::from(target);
    }
    let tag = RouteTag { index, name: route.name.clone() };
    let tagged = |e: ProxyError| (e, Some(tag.clone()));

    let mut fenced = is_fenced(&route, &parts.method, &parts.headers).map_err(tagged)?;
    // A COPY or MOVE writes its Destination: the request is fenced when the
    // destination's route fences its method, whatever the source route says.
    let destination = match destination(routes, &route, host.as_ref(), &parts.headers) {
        Ok(Some(d)) => {
            fenced |= is_fenced(&d.route, &parts.method, &parts.headers).map_err(tagged)?;
            fenced.then_some(d)
        }
        Ok(None) => None,
        Err(e) if fenced => return Err(tagged(e)),
        // A request its route does not fence, whose Destination names nothing
        // fencegate routes: not a write fencegate guards, passed on untouched.
        Err(_) => None,
    };
    let request = Request::from_parts(parts, body);
    Ok((Routed { route, request, fenced, destination }, tag))
}

/// Finds the route for a raw request path. Returns its canonical form too
/// when that differs from the raw one.
fn find_route(routes: &RouteTable, raw: &str) -> Result<(usize, Arc<Route>, Option<String>), ProxyError> {
    let path = canonical_path(raw, ROUTING)?;
    let Some((index, route)) = routes.find_indexed(&path) else {
        return Err(ProxyError::NoRoute { path: path.into_owned() });
    };
    let route = route.clone();
    let own = route.path_options;
    // The route's own rules, where they differ from routing's: it refuses
    // escaped slashes (the default), or keeps repeated ones.
    let refuses_escaped_slash =
        own.escaped_slashes == EscapedSlashes::Reject && (path.contains("%2F") || path.contains("%5C"));
    if !refuses_escaped_slash && own.merge_slashes {
        let changed = (path != raw).then(|| path.into_owned());
        return Ok((index, route, changed));
    }
    let path = canonical_path(raw, own)?;
    match routes.find_indexed(&path) {
        Some((i, _)) if i == index => {
            let changed = (path != raw).then(|| path.into_owned());
            Ok((index, route, changed))
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

/// Makes the request's host canonical and the one `Host` header; returns it.
fn canonical_request_host(uri: &Uri, headers: &mut HeaderMap) -> Result<Option<HeaderValue>, ProxyError> {
    let default_port = if uri.scheme() == Some(&http::uri::Scheme::HTTPS) { 443 } else { 80 };
    let mut hosts = headers.get_all(HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::BadHost("more than one Host header".into()));
    }
    let from_header = match header {
        Some(value) => {
            let text = value.to_str().map_err(|_| ProxyError::BadHost("the Host header is not ASCII".into()))?;
            Some(canonical_host(text, default_port).map_err(|e| ProxyError::BadHost(format!("'{text}': {e}")))?)
        }
        None => None,
    };
    let from_uri = match uri.authority() {
        Some(authority) => Some(
            canonical_host(authority.as_str(), default_port)
                .map_err(|e| ProxyError::BadHost(format!("'{authority}': {e}")))?,
        ),
        None => None,
    };
    let host = match (from_header, from_uri) {
        (Some(a), Some(b)) if a != b => {
            return Err(ProxyError::BadHost(format!("the target names host '{b}' and the Host header '{a}'")))
        }
        (Some(host), _) | (None, Some(host)) => host,
        (None, None) => return Ok(None),
    };
    let unchanged = header.is_some_and(|h| h.as_bytes() == host.as_bytes());
    if unchanged {
        return Ok(header.cloned());
    }
    let value = HeaderValue::from_str(&host).map_err(|_| ProxyError::BadHost(format!("'{host}'")))?;
    headers.insert(HOST, value.clone());
    Ok(Some(value))
}

/// Whether the request may write: its method or a method override is not one
/// of the route's safe methods.
fn is_fenced(route: &Route, method: &http::Method, headers: &HeaderMap) -> Result<bool, ProxyError> {
    let mut fenced = !route.is_safe(method.as_str().as_bytes());
    let mut first: Option<&HeaderValue> = None;
    for header in &METHOD_OVERRIDE_HEADERS {
        for value in headers.get_all(header) {
            match first {
                Some(first) if !first.as_bytes().eq_ignore_ascii_case(value.as_bytes()) => {
                    let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
                    return Err(ProxyError::MethodOverride(text(first), text(value)));
                }
                Some(_) => {}
                None => first = Some(value),
            }
            // Each value exactly as sent, like the method itself.
            fenced |= !route.is_safe(value.as_bytes());
        }
    }
    Ok(fenced)
}

/// The canonical, routed `Destination` of a fenced request, if it has one.
fn destination(
    routes: &RouteTable,
    route: &Route,
    host: Option<&HeaderValue>,
    headers: &HeaderMap,
) -> Result<Option<Destination>, ProxyError> {
    let mut values = headers.get_all(DESTINATION).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ProxyError::BadDestination("more than one Destination header".into()));
    }
    let text = value.to_str().map_err(|_| ProxyError::BadDestination("not ASCII".into()))?;
    let uri: Uri = text.parse().map_err(|e| ProxyError::BadDestination(format!("'{text}' is not a URI ({e})")))?;
    if let Some(authority) = uri.authority() {
        let default_port = match uri.scheme_str() {
            Some("http") => 80,
            Some("https") => 443,
            _ => return Err(ProxyError::BadDestination(format!("'{text}' is not an http URI"))),
        };
        let theirs = canonical_host(authority.as_str(), default_port)
            .map_err(|e| ProxyError::BadDestination(format!("host '{authority}': {e}")))?;
        if host.map(HeaderValue::as_bytes) != Some(theirs.as_bytes()) {
            return Err(ProxyError::BadDestination(format!("'{text}' names another host than the request's")));
        }
    } else if !text.starts_with('/') {
        return Err(ProxyError::BadDestination(format!("'{text}' is neither an absolute URI nor an absolute path")));
    }
    let (_, to, path) = find_route(routes, uri.path()).map_err(|e| match e {
        ProxyError::NoRoute { path } => ProxyError::BadDestination(format!("no route covers '{path}'")),
        other => ProxyError::BadDestination(other.to_string()),
    })?;
    if to.upstream != route.upstream {
        return Err(ProxyError::BadDestination(format!(
            "'{}' is served by route '{}', which sends to another upstream",
            uri.path(),
            to.name
        )));
    }
    let path = path.unwrap_or_else(|| uri.path().to_string());
    Ok(Some(Destination { route: to, path, query: uri.query().map(str::to_string) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::PathError;
    use crate::route::{test_route, Upstream};

    fn table() -> RouteTable {
        let mut keep = test_route("keep", "/keep/");
        keep.path_options.escaped_slashes = EscapedSlashes::Keep;
        let mut unmerged = test_route("unmerged", "/unmerged/");
        unmerged.path_options.merge_slashes = false;
        let mut folded = test_route("folded", "/folded/");
        folded.fold_key_case = true;
        let mut elsewhere = test_route("elsewhere", "/elsewhere/");
        elsewhere.upstream = Upstream::parse("http://127.0.0.1:2").unwrap();
        RouteTable::new([
            test_route("objects", "/objects/"),
            test_route("secure", "/secure/"),
            keep,
            unmerged,
            folded,
            elsewhere,
        ])
    }

    fn route(method: &str, target: &str, headers: &[(&str, &str)]) -> Result<Routed<()>, ProxyError> {
        let mut request = Request::builder().method(method).uri(target);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        route_request(&table(), request.body(()).unwrap()).map(|(routed, _)| routed).map_err(|(e, _)| e)
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
        // Fold: the prefix matches in any case, the path is forwarded as sent.
        assert_eq!(target("PUT", "/FOLDED/A"), ("folded".into(), "/FOLDED/A".into()));
    }

    #[test]
    fn hosts_are_canonical_and_must_agree() {
        for spelling in ["a.example", "A.Example.", "a.example:80", "A.EXAMPLE.:0080", "a.example:"] {
            let routed = route("PUT", "/objects/a", &[("host", spelling)]).unwrap();
            assert_eq!(routed.request.headers()[HOST], "a.example", "{spelling}");
        }
        let routed = route("PUT", "http://A.example:80/objects/a", &[]).unwrap();
        assert_eq!(routed.request.headers()[HOST], "a.example");
        for (target, host) in [
            ("/objects/a", "a.example:x"),
            ("/objects/a", "user@a.example"),
            ("http://b.example/objects/a", "a.example"),
        ] {
            assert!(matches!(route("PUT", target, &[("host", host)]), Err(ProxyError::BadHost(_))), "{target} {host}");
        }
    }

    #[test]
    fn methods_and_overrides_decide_what_is_fenced() {
        let fenced = |method: &str, headers: &[(&str, &str)]| route(method, "/objects/a", headers).map(|r| r.fenced);
        assert!(!fenced("GET", &[]).unwrap());
        for method in ["PUT", "put", "Put", "MKCOL", "FROB", "get"] {
            assert!(fenced(method, &[]).unwrap(), "{method}");
        }
        assert!(fenced("GET", &[("x-http-method-override", "PUT")]).unwrap());
        assert!(fenced("POST", &[("x-method-override", "GET")]).unwrap());
        assert!(!fenced("GET", &[("x-http-method", "GET")]).unwrap());
        assert!(fenced("GET", &[("x-http-method-override", "put"), ("x-http-method", "PUT")]).unwrap());
        // Every value counts, exactly as sent: `get` is not a safe method.
        assert!(fenced("GET", &[("x-http-method-override", "GET"), ("x-http-method", "get")]).unwrap());
        assert!(matches!(
            fenced("POST", &[("x-http-method-override", "GET"), ("x-method-override", "DELETE")]),
            Err(ProxyError::MethodOverride(..))
        ));
    }

    #[test]
    fn a_destination_is_canonical_on_the_same_host_and_upstream() {
        let dest = |value: &str| route("COPY", "/objects/a", &[("host", "a.example"), ("destination", value)]);
        for spelling in ["http://a.example/objects/%62", "http://A.example:80/objects//b", "/objects/x/../b"] {
            let d = dest(spelling).unwrap().destination.unwrap();
            assert_eq!((&*d.route.name, d.path.as_str()), ("objects", "/objects/b"), "{spelling}");
        }
        assert_eq!(&*dest("/secure/b").unwrap().destination.unwrap().route.name, "secure");
        for bad in [
            "http://b.example/objects/b",
            "/nowhere/b",
            "/elsewhere/b",
            "/objects/b%2Fc",
            "objects/b",
            "ftp://a.example/objects/b",
        ] {
            assert!(matches!(dest(bad), Err(ProxyError::BadDestination(_))), "{bad}: {:?}", dest(bad));
        }
        // A request that is not fenced carries its Destination through untouched.
        let safe = route("GET", "/objects/a", &[("destination", "/nowhere")]).unwrap();
        assert!(safe.destination.is_none() && !safe.fenced);
        // A method the source route lets through is still fenced when the
        // destination's route fences it: the destination is what it writes.
        let mut lenient = test_route("lenient", "/lenient/");
        lenient.safe_methods.push(http::Method::from_bytes(b"COPY").unwrap());
        let table = RouteTable::new([test_route("objects", "/objects/"), lenient]);
        let copy = |to: &str| {
            let request = Request::builder().method("COPY").uri("/lenient/a").header("host", "a.example");
            let request = request.header("destination", to).body(()).unwrap();
            route_request(&table, request).map(|(r, _)| r).map_err(|(e, _)| e)
        };
        let into_fenced = copy("/objects/b").unwrap();
        assert!(into_fenced.fenced);
        assert_eq!(into_fenced.destination.unwrap().path, "/objects/b");
        assert!(!copy("/lenient/b").unwrap().fenced);
    }

    #[test]
    fn http2_header_values_must_not_be_padded() {
        for value in [" acme", "acme\t", " "] {
            let request =
                Request::builder().version(Version::HTTP_2).uri("http://a.example/objects/a").header("x-tenant", value);
            let refused = route_request(&table(), request.body(()).unwrap()).map(|_| ()).map_err(|(e, _)| e);
            assert!(matches!(refused, Err(ProxyError::BadHeader(_))), "{value:?}");
        }
    }
}
