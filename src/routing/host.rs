//! The request's host, made canonical: one `Host` header that agrees with the
//! target's authority, so a key made from it is the host the upstream serves.

use http::header::{HeaderValue, HOST};
use http::{HeaderMap, Uri};

use crate::canonical::canonical_host;
use crate::error::ProxyError;

/// Makes the request's host canonical and the one `Host` header; returns it.
pub(super) fn request_host(uri: &Uri, headers: &mut HeaderMap) -> Result<Option<HeaderValue>, ProxyError> {
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

#[cfg(test)]
mod tests {
    use super::super::tests::route;
    use super::*;

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
