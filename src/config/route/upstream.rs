//! Where a route sends: the upstream origin and the base path every request
//! path is put under, parsed once at config time.

use http::header::InvalidHeaderValue;
use http::uri::{Authority, InvalidUri, Scheme};
use http::Uri;
use rustls_pki_types::{InvalidDnsNameError, ServerName};

/// An upstream origin with an optional base path prepended to every request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    pub scheme: Scheme,
    pub authority: Authority,
    /// Empty, or starts with '/' and has no trailing '/'.
    pub base_path: String,
    /// `authority` as a `Host` header value, made once.
    pub host: http::HeaderValue,
}

/// Why an `upstream` is not one a route can send to; each variant keeps the
/// text as written.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamUrlError {
    #[error("'{text}' is not a URL ({source})")]
    NotAUrl { text: String, source: InvalidUri },
    /// A scheme other than `http` or `https`.
    #[error("'{text}' has scheme '{scheme}'; use http://host:port or https://host:port")]
    Scheme { text: String, scheme: String },
    #[error("'{0}' has no http:// or https:// scheme")]
    NoScheme(String),
    #[error("'{0}' has no host")]
    NoHost(String),
    /// An upstream carries a base path only: a query would be sent with every request.
    #[error("'{0}' has a query string; an upstream may only carry a base path")]
    Query(String),
    /// The authority cannot be sent as a `Host` header.
    #[error("'{text}': host: {source}")]
    HostHeader { text: String, source: InvalidHeaderValue },
    /// An https upstream whose host no certificate can be checked against.
    #[error("'{text}': {source}")]
    CertificateName { text: String, source: CertNameError },
}

/// Errors are equal when they say the same: the sources from `http` and
/// rustls hold nothing but their message.
impl PartialEq for UpstreamUrlError {
    fn eq(&self, other: &UpstreamUrlError) -> bool {
        use UpstreamUrlError::*;
        match (self, other) {
            (NotAUrl { text: a, source: x }, NotAUrl { text: b, source: y }) => {
                a == b && x.to_string() == y.to_string()
            }
            (Scheme { text: a, scheme: x }, Scheme { text: b, scheme: y }) => a == b && x == y,
            (NoScheme(a), NoScheme(b)) | (NoHost(a), NoHost(b)) | (Query(a), Query(b)) => a == b,
            (HostHeader { text: a, .. }, HostHeader { text: b, .. }) => a == b,
            (CertificateName { text: a, source: x }, CertificateName { text: b, source: y }) => a == b && x == y,
            _ => false,
        }
    }
}

impl Eq for UpstreamUrlError {}

/// An https upstream's host that is neither a DNS name nor an IP address.
#[derive(Debug, thiserror::Error)]
#[error("host '{host}' is not a name a certificate can be checked against ({source})")]
pub struct CertNameError {
    pub host: String,
    source: InvalidDnsNameError,
}

impl PartialEq for CertNameError {
    fn eq(&self, other: &CertNameError) -> bool {
        self.host == other.host
    }
}

impl Eq for CertNameError {}

impl UpstreamUrl {
    /// Parses `http://host[:port][/base]` or `https://host[:port][/base]`
    /// (default ports 80 and 443); the error says what to fix.
    pub fn parse(text: &str) -> Result<UpstreamUrl, UpstreamUrlError> {
        let written = || text.to_string();
        let uri: Uri = text.parse().map_err(|source| UpstreamUrlError::NotAUrl { text: written(), source })?;
        let scheme = match uri.scheme() {
            Some(s) if *s == Scheme::HTTP => Scheme::HTTP,
            Some(s) if *s == Scheme::HTTPS => Scheme::HTTPS,
            Some(other) => return Err(UpstreamUrlError::Scheme { text: written(), scheme: other.to_string() }),
            None => return Err(UpstreamUrlError::NoScheme(written())),
        };
        let authority = match uri.authority() {
            Some(a) if !a.host().is_empty() => a.clone(),
            _ => return Err(UpstreamUrlError::NoHost(written())),
        };
        if uri.query().is_some() {
            return Err(UpstreamUrlError::Query(written()));
        }
        let base_path = uri.path().trim_end_matches('/').to_string();
        let host = http::HeaderValue::from_str(authority.as_str())
            .map_err(|source| UpstreamUrlError::HostHeader { text: written(), source })?;
        let upstream = UpstreamUrl { scheme, authority, base_path, host };
        if upstream.is_tls() {
            upstream.server_name().map_err(|source| UpstreamUrlError::CertificateName { text: written(), source })?;
        }
        Ok(upstream)
    }

    /// Whether the upstream is spoken to over TLS (`https://`).
    pub fn is_tls(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }

    /// The name an https upstream's certificate must carry, also sent as
    /// SNI: its host, a DNS name or an IP address.
    pub fn server_name(&self) -> Result<ServerName<'static>, CertNameError> {
        let host = self.authority.host().trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string()).map_err(|source| CertNameError { host: host.to_string(), source })
    }

    /// The upstream URI for a request path and query (`path_and_query` starts with '/').
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(self.under_base(path_and_query))
            .build()
    }

    /// `uri` in origin form (path and query only) under this upstream's base
    /// path, for a connection that already goes to it. One that already is
    /// (the common HTTP/1.1 case, with no base path) is kept as it is.
    pub fn origin_form(&self, uri: Uri) -> Result<Uri, http::Error> {
        if self.base_path.is_empty() && uri.scheme().is_none() && uri.authority().is_none() {
            return Ok(uri);
        }
        let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str());
        Ok(Uri::try_from(self.under_base(path_and_query))?)
    }

    fn under_base(&self, path_and_query: &str) -> String {
        let mut pq = String::with_capacity(self.base_path.len() + path_and_query.len());
        pq.push_str(&self.base_path);
        pq.push_str(path_and_query);
        pq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_base_path_is_prepended() {
        let u = UpstreamUrl::parse("http://10.0.0.5:9000/v1/").unwrap();
        assert_eq!(u.base_path, "/v1");
        assert_eq!(u.uri_for("/objects/a?x=1").unwrap().to_string(), "http://10.0.0.5:9000/v1/objects/a?x=1");
        let origin = |u: &UpstreamUrl, uri: &str| u.origin_form(uri.parse().unwrap()).unwrap().to_string();
        assert_eq!(origin(&u, "/objects/a?x=1"), "/v1/objects/a?x=1");
        assert_eq!(origin(&u, "http://a.example/objects/a"), "/v1/objects/a");
        let u = UpstreamUrl::parse("http://10.0.0.5:9000").unwrap();
        assert_eq!(u.uri_for("/a").unwrap().to_string(), "http://10.0.0.5:9000/a");
        assert_eq!(origin(&u, "/a?b"), "/a?b");
        assert_eq!(origin(&u, "http://a.example/a?b"), "/a?b");
    }

    #[test]
    fn https_upstreams_name_the_host_their_certificate_must_carry() {
        let u = UpstreamUrl::parse("https://store.example/v1").unwrap();
        assert!(u.is_tls());
        assert_eq!(u.authority.port_u16(), None, "443 is the default, filled in when connecting");
        assert_eq!(u.host, "store.example");
        assert_eq!(u.server_name().unwrap(), ServerName::try_from("store.example").unwrap());
        assert_eq!(u.uri_for("/a").unwrap().to_string(), "https://store.example/v1/a");
        let ip = UpstreamUrl::parse("https://[::1]:8443").unwrap();
        assert_eq!(ip.server_name().unwrap(), ServerName::try_from("::1").unwrap());
        assert!(!UpstreamUrl::parse("http://store.example").unwrap().is_tls());
        assert!(UpstreamUrl::parse("HTTPS://store.example").unwrap().is_tls());
    }

    #[test]
    fn each_refusal_keeps_the_text_and_says_what_is_wrong() {
        let e = |text: &str| UpstreamUrl::parse(text).unwrap_err();
        assert_eq!(e("ftp://x"), UpstreamUrlError::Scheme { text: "ftp://x".into(), scheme: "ftp".into() });
        assert_eq!(e("ftp://x").to_string(), "'ftp://x' has scheme 'ftp'; use http://host:port or https://host:port");
        assert_eq!(e("/x"), UpstreamUrlError::NoScheme("/x".into()));
        assert_eq!(e("http://x/b?q=1"), UpstreamUrlError::Query("http://x/b?q=1".into()));
        assert!(matches!(e("http://"), UpstreamUrlError::NotAUrl { .. }), "{}", e("http://"));
        let UpstreamUrlError::CertificateName { source, .. } = e("https://store..example") else { panic!() };
        assert_eq!(source.host, "store..example");
        assert_eq!(
            e("https://store..example").to_string(),
            "'https://store..example': host 'store..example' is not a name a certificate can be checked against \
             (invalid dns name)"
        );
    }
}
