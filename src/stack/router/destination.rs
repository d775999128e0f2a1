//! The WebDAV `Destination` of a COPY or MOVE: where it writes, made canonical
//! and routed like the request's own target.

use std::sync::Arc;

use http::header::HeaderValue;
use http::{HeaderMap, HeaderName, Uri};

use super::path::find_route;
use crate::canonical::{self, canonical_host};
use crate::route::{Route, RouteTable};
use crate::stack::error::ProxyError;

/// The WebDAV header naming where a COPY or MOVE writes (RFC 4918 §10.3).
pub const DESTINATION: HeaderName = HeaderName::from_static("destination");

/// Where a COPY or MOVE writes: the `Destination` header's target, canonical,
/// with the route that covers it (same upstream as the request's own).
#[derive(Debug, Clone)]
pub struct Destination {
    pub route: Arc<Route>,
    /// Canonical path.
    pub path: String,
    pub query: Option<String>,
}

/// Why a `Destination` cannot be fenced (a 400 `bad-destination`). The texts
/// are the problem's `detail`, after "the Destination header cannot be
/// fenced: ".
#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    #[error("more than one Destination header")]
    Repeated,
    #[error("not ASCII")]
    NotAscii,
    #[error("'{text}' is not a URI ({source})")]
    NotUri {
        text: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("'{0}' is not an http URI")]
    NotHttp(String),
    #[error("host '{authority}': {source}")]
    Host {
        authority: String,
        #[source]
        source: canonical::HostError,
    },
    #[error("'{0}' names another host than the request's")]
    OtherHost(String),
    #[error("'{0}' is neither an absolute URI nor an absolute path")]
    NotAbsolute(String),
    #[error("no route covers '{0}'")]
    NoRoute(String),
    /// Routing refused the destination's path as it refuses a request's own
    /// (a path with no canonical form), in the same words.
    #[error(transparent)]
    Unroutable(Box<ProxyError>),
    #[error("'{path}' is served by route '{route}', which sends to another upstream")]
    OtherUpstream { path: String, route: Arc<str> },
}

/// The canonical, routed `Destination` of a fenced request, if it has one.
pub(super) fn destination(
    routes: &RouteTable,
    route: &Route,
    host: Option<&HeaderValue>,
    headers: &HeaderMap,
) -> Result<Option<Destination>, DestinationError> {
    let mut values = headers.get_all(DESTINATION).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(DestinationError::Repeated);
    }
    let text = value.to_str().map_err(|_| DestinationError::NotAscii)?;
    let uri: Uri = text.parse().map_err(|source| DestinationError::NotUri { text: text.to_string(), source })?;
    if let Some(authority) = uri.authority() {
        let default_port = match uri.scheme_str() {
            Some("http") => 80,
            Some("https") => 443,
            _ => return Err(DestinationError::NotHttp(text.to_string())),
        };
        let theirs = canonical_host(authority.as_str(), default_port)
            .map_err(|source| DestinationError::Host { authority: authority.to_string(), source })?;
        if host.map(HeaderValue::as_bytes) != Some(theirs.as_bytes()) {
            return Err(DestinationError::OtherHost(text.to_string()));
        }
    } else if !text.starts_with('/') {
        return Err(DestinationError::NotAbsolute(text.to_string()));
    }
    let (to, path) = find_route(routes, uri.path()).map_err(|e| match e {
        ProxyError::NoRoute { path } => DestinationError::NoRoute(path),
        other => DestinationError::Unroutable(Box::new(other)),
    })?;
    if to.upstream != route.upstream {
        return Err(DestinationError::OtherUpstream { path: uri.path().to_string(), route: to.name.clone() });
    }
    let path = path.unwrap_or_else(|| uri.path().to_string());
    Ok(Some(Destination { route: to, path, query: uri.query().map(str::to_string) }))
}

#[cfg(test)]
mod tests {
    use super::super::service::route_request;
    use super::super::tests::route;
    use super::*;
    use crate::route::test_route;
    use http::Request;

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
        // A request that is not fenced may not carry one either: the upstream
        // could read it as a fenced resource.
        let safe = route("GET", "/objects/a", &[("destination", "/objects/b%2Fc")]);
        assert!(matches!(safe, Err(ProxyError::BadDestination(_))), "{safe:?}");
        // A method the source route lets through is still fenced when the
        // destination's route fences it: the destination is what it writes.
        let mut lenient = crate::config::test_route_config("lenient", "/lenient/");
        lenient.safe_methods.push(http::Method::from_bytes(b"COPY").unwrap());
        let table = RouteTable::new([test_route("objects", "/objects/"), Route::detached(lenient)]);
        let copy = |to: &str| {
            let request = Request::builder().method("COPY").uri("/lenient/a").header("host", "a.example");
            let request = request.header("destination", to).body(()).unwrap();
            route_request(&table, request, false).map(|(r, _)| r).map_err(|(e, _)| e)
        };
        let into_fenced = copy("/objects/b").unwrap();
        assert!(into_fenced.fenced);
        assert_eq!(into_fenced.destination.unwrap().path, "/objects/b");
        assert!(!copy("/lenient/b").unwrap().fenced);
        // One the source route lets through is refused when its Destination
        // cannot be routed: nginx would decode this one into /objects/b/c.
        assert!(matches!(copy("/objects/b%2Fc"), Err(ProxyError::BadDestination(_))));
    }

    /// The problem's `detail` reads as it did when these were strings.
    #[test]
    fn destination_refusals_keep_their_wording() {
        let detail = |values: &[&str]| {
            let mut headers = vec![("host", "a.example")];
            headers.extend(values.iter().map(|v| ("destination", *v)));
            route("COPY", "/objects/a", &headers).err().map(|e| e.to_string()).unwrap_or_default()
        };
        let prefix = "the Destination header cannot be fenced: ";
        for (values, want) in [
            (&["/objects/b", "/objects/c"][..], "more than one Destination header".to_string()),
            (&["ftp://a.example/objects/b"], "'ftp://a.example/objects/b' is not an http URI".into()),
            (
                &["http://user@a.example/objects/b"],
                format!("host 'user@a.example': {}", canonical::HostError::Userinfo),
            ),
            (
                &["http://b.example/objects/b"],
                "'http://b.example/objects/b' names another host than the request's".into(),
            ),
            (&["objects/b"], "'objects/b' is not a URI (invalid format)".into()),
            (&["*"], "'*' is neither an absolute URI nor an absolute path".into()),
            (&["/nowhere/b"], "no route covers '/nowhere/b'".into()),
            (
                &["/objects/b%2Fc"],
                format!("the request path cannot be made canonical: {}", canonical::PathError::EncodedSlash),
            ),
            (
                &["/elsewhere/b"],
                "'/elsewhere/b' is served by route 'elsewhere', which sends to another upstream".into(),
            ),
        ] {
            assert_eq!(detail(values), format!("{prefix}{want}"), "{values:?}");
        }
    }
}
