//! The request's host, made canonical: one `Host` header that agrees with the
//! target's authority, so a key made from it is the host the upstream serves.

use std::borrow::Cow;

use http::header::{HeaderValue, InvalidHeaderValue};
use http::Uri;

use super::fields::Hosts;
use crate::canonical::{self, canonical_host, is_canonical_host};

/// Why the request's host cannot be routed by (a 400 `bad-host`). The texts
/// are the problem's `detail`, after "the request's host is not one
/// fencegate can route by: ".
#[derive(Debug, thiserror::Error)]
pub enum RequestHostError {
    #[error("more than one Host header")]
    Repeated,
    #[error("the Host header is not ASCII")]
    NotAscii,
    /// The `Host` header or the target's authority has no canonical form.
    #[error("'{text}': {source}")]
    Malformed {
        text: String,
        #[source]
        source: canonical::HostError,
    },
    /// Both name a host, canonical, and not the same one.
    #[error("the target names host '{target}' and the Host header '{header}'")]
    Disagree { target: String, header: String },
    /// The canonical host is not a valid header value; canonical hosts are
    /// plain ASCII, so this is refused rather than unwrapped.
    #[error("'{host}'")]
    NotHeaderValue {
        host: String,
        #[source]
        source: InvalidHeaderValue,
    },
}

/// The request's canonical host, from its target and its `Host` fields
/// (`hosts`, as the one pass over the fields found them): `None` when the
/// one `Host` field is that already, or there is no host at all; else the
/// value the one `Host` field must take. A target without a scheme (origin
/// form) has the connection's: `https` when it came `over_tls`.
pub(super) fn request_host(
    uri: &Uri,
    hosts: Hosts<'_>,
    over_tls: bool,
) -> Result<Option<HeaderValue>, RequestHostError> {
    let https = match uri.scheme() {
        Some(scheme) => *scheme == http::uri::Scheme::HTTPS,
        None => over_tls,
    };
    let default_port = if https { 443 } else { 80 };
    let header = match hosts {
        Hosts::None => None,
        Hosts::One(value) => Some(value),
        Hosts::Repeated => return Err(RequestHostError::Repeated),
    };
    let from_uri = uri.authority();
    // The common case, in one pass over the value's bytes: an origin-form
    // target and a canonical `Host` (so ASCII too).
    if let (Some(value), None) = (header, from_uri) {
        if is_canonical_host(value.as_bytes(), default_port) {
            return Ok(None);
        }
    }
    let from_header = match header {
        Some(value) => Some(canonical(value.to_str().map_err(|_| RequestHostError::NotAscii)?, default_port)?),
        None => None,
    };
    let from_uri = from_uri.map(|authority| canonical(authority.as_str(), default_port)).transpose()?;
    let host = match (from_header, from_uri) {
        (Some(named), Some(target)) if named != target => {
            return Err(RequestHostError::Disagree { target: target.into_owned(), header: named.into_owned() })
        }
        (Some(host), _) | (None, Some(host)) => host,
        (None, None) => return Ok(None),
    };
    if header.is_some_and(|h| h.as_bytes() == host.as_bytes()) {
        return Ok(None);
    }
    HeaderValue::from_str(&host)
        .map(Some)
        .map_err(|source| RequestHostError::NotHeaderValue { host: host.to_string(), source })
}

/// `text`'s canonical host, refused in the words of a malformed one.
fn canonical(text: &str, default_port: u16) -> Result<Cow<'_, str>, RequestHostError> {
    canonical_host(text, default_port).map_err(|source| RequestHostError::Malformed { text: text.to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::super::tests::route;
    use crate::stack::error::ProxyError;
    use http::header::HOST;

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
            // A canonical Host beside a target that names another host in
            // another spelling: the target is still compared.
            ("http://B.example./objects/a", "a.example"),
            ("http://a.example:8080/objects/a", "a.example"),
        ] {
            assert!(matches!(route("PUT", target, &[("host", host)]), Err(ProxyError::BadHost(_))), "{target} {host}");
        }
        // Two Host fields, each canonical and the same: still two.
        let twice = route("PUT", "/objects/a", &[("host", "a.example"), ("host", "a.example")]);
        assert!(matches!(twice, Err(ProxyError::BadHost(_))));
    }

    /// The problem's `detail` reads as it did when these were strings.
    #[test]
    fn host_refusals_keep_their_wording() {
        let detail = |target: &str, hosts: &[&str]| {
            let headers: Vec<_> = hosts.iter().map(|h| ("host", *h)).collect();
            route("PUT", target, &headers).err().map(|e| e.to_string()).unwrap_or_default()
        };
        let prefix = "the request's host is not one fencegate can route by: ";
        for (target, hosts, want) in [
            ("/objects/a", &["a.example", "b.example"][..], "more than one Host header"),
            ("/objects/a", &["a.example:x"], "'a.example:x': the port is not a number from 1 to 65535"),
            (
                "http://a..example/objects/a",
                &[],
                "'a..example': the host has an empty label (a leading dot, '..', or more than one trailing dot)",
            ),
            (
                "http://b.example/objects/a",
                &["A.example"],
                "the target names host 'b.example' and the Host header 'a.example'",
            ),
        ] {
            assert_eq!(detail(target, hosts), format!("{prefix}{want}"), "{target} {hosts:?}");
        }
    }
}
