//! The route table: longest-prefix match, upstream addresses and key templates.
//!
//! A [`Route`] says where a request goes and how its fence key is made. The key
//! template is parsed once at config time into [`KeyTemplate`] parts, so rendering
//! a key on the hot path is a walk over a short slice with no parsing.

use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderMap, HeaderName, Method, Uri};

use crate::canonical::{query_param, PathOptions, QueryError};
use crate::fence::signature::SigningKey;

/// A request and the route it matched: what the layers below routing take, so
/// none of them can be reached by a request that was not routed.
///
/// By the time a request is `Routed`, its target is canonical (see
/// [`crate::canonical`]): the path, the `Host` header and the `Destination`
/// are the forms it is keyed by and forwarded with.
#[derive(Debug)]
pub struct Routed<B> {
    pub route: Arc<Route>,
    pub request: http::Request<B>,
    /// The request may write: its method, or a method-override header, is not
    /// one of the route's safe methods.
    pub fenced: bool,
    /// The WebDAV `Destination` of a fenced request, canonical and routed.
    pub destination: Option<Destination>,
}

/// Which route a response belongs to: its index in config order and its name.
#[derive(Debug, Clone)]
pub struct RouteTag {
    pub index: usize,
    pub name: Arc<str>,
}

/// Where a COPY or MOVE writes: the `Destination` header's target, canonical,
/// with the route that covers it (same upstream as the request's own).
#[derive(Debug, Clone)]
pub struct Destination {
    pub route: Arc<Route>,
    /// Canonical path.
    pub path: String,
    pub query: Option<String>,
}

/// One configured route, validated.
#[derive(Debug, Clone)]
pub struct Route {
    pub name: Arc<str>,
    /// Plain string prefix of the request path; the longest matching one wins.
    pub prefix: String,
    pub upstream: Upstream,
    pub pattern: Option<PathPattern>,
    pub key: KeyTemplate,
    /// Methods that pass unfenced, compared exactly as sent; every other
    /// method is fenced.
    pub safe_methods: Vec<Method>,
    /// How the request path is canonicalized (escaped slashes, merged slashes).
    pub path_options: PathOptions,
    /// `key_case = "fold"`: the key is lower-cased and the prefix matched
    /// ignoring ASCII case, for upstreams that ignore case.
    pub fold_key_case: bool,
    /// A request that is not fenced may carry a body (400 otherwise).
    pub allow_safe_body: bool,
    /// Fenced bodies stream to the upstream instead of being read whole first.
    pub stream_body: bool,
    /// `missing_token = "allow"`: a fenced method without a token passes unfenced.
    pub allow_missing_token: bool,
    /// Upstream timeout, from sending the request to its response head (504 past it).
    pub timeout: Duration,
    /// Longest wait for the key's turn (503 past it).
    pub queue_timeout: Duration,
    /// How long the key stays closed after a fenced write's outcome became
    /// unknown (upstream timeout, or connection lost after sending). Zero: off.
    pub settle: Duration,
    pub token_header: HeaderName,
    pub preserve_host: bool,
    /// Largest request body, in bytes (413 past it).
    pub max_body: u64,
    /// Key for signed tokens: when set, a fenced request needs a valid
    /// `X-Fencing-Signature` (403 otherwise).
    pub signing_key: Option<SigningKey>,
    /// A token more than this above the key's mark is refused (403).
    pub max_token_jump: Option<u64>,
}

impl Route {
    /// Whether `method`, exactly as sent, passes unfenced on this route.
    pub fn is_safe(&self, method: &[u8]) -> bool {
        self.safe_methods.iter().any(|m| m.as_str().as_bytes() == method)
    }

    /// Whether this route's prefix covers the canonical `path`.
    fn covers(&self, path: &str) -> bool {
        if self.fold_key_case {
            path.len() >= self.prefix.len()
                && path.as_bytes()[..self.prefix.len()].eq_ignore_ascii_case(self.prefix.as_bytes())
        } else {
            path.starts_with(self.prefix.as_str())
        }
    }

    /// The fence key of a request for the canonical `path` and `query`, with
    /// this route's template and key case.
    pub fn key_for(&self, path: &str, query: Option<&str>, headers: &HeaderMap) -> Result<String, KeyError> {
        let key = self.key.render_target(path, query, headers, self.pattern.as_ref())?;
        Ok(if self.fold_key_case { key.to_ascii_lowercase() } else { key })
    }
}

/// An upstream origin with an optional base path prepended to every request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: Scheme,
    pub authority: Authority,
    /// Empty, or starts with '/' and has no trailing '/'.
    pub base_path: String,
    /// `authority` as a `Host` header value, made once.
    pub host: http::HeaderValue,
}

impl Upstream {
    /// Parses `http://host:port[/base]`; the error says what to fix.
    pub fn parse(text: &str) -> Result<Upstream, String> {
        let uri: Uri = text.parse().map_err(|e| format!("'{text}' is not a URL ({e})"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(format!("'{text}': https upstreams are not supported yet; use http://")),
            Some(other) => return Err(format!("'{text}' has scheme '{other}'; use http://host:port")),
            None => return Err(format!("'{text}' has no http:// scheme")),
        }
        let authority = match uri.authority() {
            Some(a) if !a.host().is_empty() => a.clone(),
            _ => return Err(format!("'{text}' has no host")),
        };
        if uri.query().is_some() {
            return Err(format!("'{text}' has a query string; an upstream may only carry a base path"));
        }
        let base_path = uri.path().trim_end_matches('/').to_string();
        let host = http::HeaderValue::from_str(authority.as_str()).map_err(|e| format!("'{text}': host: {e}"))?;
        Ok(Upstream { scheme: Scheme::HTTP, authority, base_path, host })
    }

    /// The upstream URI for a request path and query (`path_and_query` starts with '/').
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        let mut pq = String::with_capacity(self.base_path.len() + path_and_query.len());
        pq.push_str(&self.base_path);
        pq.push_str(path_and_query);
        Uri::builder().scheme(self.scheme.clone()).authority(self.authority.clone()).path_and_query(pq).build()
    }

    /// The same, in origin form (path and query only), for a connection that
    /// already goes to this upstream.
    pub fn origin_form(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        if self.base_path.is_empty() {
            return Ok(Uri::try_from(path_and_query)?);
        }
        let mut pq = String::with_capacity(self.base_path.len() + path_and_query.len());
        pq.push_str(&self.base_path);
        pq.push_str(path_and_query);
        Ok(Uri::try_from(pq)?)
    }
}

/// Routes sorted so that the first prefix that matches is the longest.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    /// `(index in config order, route)`, longest prefix first.
    routes: Vec<(usize, Arc<Route>)>,
}

impl RouteTable {
    pub fn new(routes: impl IntoIterator<Item = Route>) -> Self {
        let mut routes: Vec<(usize, Arc<Route>)> = routes.into_iter().map(Arc::new).enumerate().collect();
        routes.sort_by_key(|(_, r)| std::cmp::Reverse(r.prefix.len()));
        RouteTable { routes }
    }

    /// The route whose prefix is the longest one `path` starts with.
    pub fn find(&self, path: &str) -> Option<&Arc<Route>> {
        self.find_indexed(path).map(|(_, r)| r)
    }

    /// Like [`find`](Self::find), with the route's index in config order.
    pub fn find_indexed(&self, path: &str) -> Option<(usize, &Arc<Route>)> {
        self.routes.iter().find(|(_, r)| r.covers(path)).map(|(i, r)| (*i, r))
    }

    /// Route names in config order.
    pub fn names(&self) -> Vec<Arc<str>> {
        let mut named: Vec<_> = self.routes.iter().map(|(i, r)| (*i, r.name.clone())).collect();
        named.sort_by_key(|(i, _)| *i);
        named.into_iter().map(|(_, n)| n).collect()
    }
}

/// A path pattern such as `/buckets/{bucket}/objects/{object*}`.
///
/// `{name}` captures one non-empty segment; `{name*}` (last only) captures the
/// non-empty rest of the path, slashes included. Everything else is literal.
#[derive(Debug, Clone)]
pub struct PathPattern {
    source: String,
    segments: Vec<PatternSegment>,
    literal_prefix: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PatternSegment {
    Literal(String),
    Capture(String),
    Rest(String),
}

impl PathPattern {
    pub fn parse(text: &str) -> Result<PathPattern, String> {
        let Some(body) = text.strip_prefix('/') else {
            return Err(format!("'{text}' must start with '/'"));
        };
        let parts: Vec<&str> = body.split('/').collect();
        let mut segments = Vec::with_capacity(parts.len());
        let mut names: Vec<&str> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let seg = if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                let (name, rest) = match inner.strip_suffix('*') {
                    Some(n) => (n, true),
                    None => (inner, false),
                };
                if !is_identifier(name) {
                    return Err(format!("'{text}': '{{{inner}}}' needs a name of letters, digits and '_'"));
                }
                if names.contains(&name) {
                    return Err(format!("'{text}': '{{{name}}}' is captured twice"));
                }
                names.push(name);
                if rest && i + 1 != parts.len() {
                    return Err(format!("'{text}': '{{{name}*}}' must be the last segment"));
                }
                if rest {
                    PatternSegment::Rest(name.to_string())
                } else {
                    PatternSegment::Capture(name.to_string())
                }
            } else if part.contains('{') || part.contains('}') {
                return Err(format!("'{text}': segment '{part}' must be all literal or one whole {{name}}"));
            } else {
                PatternSegment::Literal(part.to_string())
            };
            segments.push(seg);
        }
        let mut literal_prefix = String::from("/");
        for seg in &segments {
            match seg {
                PatternSegment::Literal(l) => {
                    literal_prefix.push_str(l);
                    literal_prefix.push('/');
                }
                _ => break,
            }
        }
        if matches!(segments.last(), Some(PatternSegment::Literal(_))) {
            literal_prefix.pop();
        }
        Ok(PathPattern { source: text.to_string(), segments, literal_prefix })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The literal text every matching path starts with.
    pub fn literal_prefix(&self) -> &str {
        &self.literal_prefix
    }

    fn has_capture(&self, name: &str) -> bool {
        self.capture_index(name).is_some()
    }

    fn capture_index(&self, name: &str) -> Option<usize> {
        self.segments
            .iter()
            .filter(|s| !matches!(s, PatternSegment::Literal(_)))
            .position(|s| matches!(s, PatternSegment::Capture(n) | PatternSegment::Rest(n) if n == name))
    }

    /// The captured values in pattern order, or `None` when `path` does not match.
    pub fn captures<'p>(&self, path: &'p str) -> Option<Vec<&'p str>> {
        let mut rest = path.strip_prefix('/')?;
        let mut out = Vec::new();
        for (i, seg) in self.segments.iter().enumerate() {
            let last = i + 1 == self.segments.len();
            let (part, tail) = match seg {
                PatternSegment::Rest(_) => (rest, ""),
                _ => match rest.find('/') {
                    Some(at) if !last => (&rest[..at], &rest[at + 1..]),
                    Some(_) => return None,
                    None if last => (rest, ""),
                    None => return None,
                },
            };
            match seg {
                PatternSegment::Literal(l) if l == part => {}
                PatternSegment::Literal(_) => return None,
                _ if part.is_empty() => return None,
                _ => out.push(part),
            }
            rest = tail;
        }
        Some(out)
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A fence key template such as `{header.x-tenant}:{path}`, parsed once.
#[derive(Debug, Clone)]
pub struct KeyTemplate {
    parts: Vec<KeyPart>,
}

#[derive(Debug, Clone)]
enum KeyPart {
    Literal(String),
    Path,
    Host,
    Header(HeaderName),
    Query(String),
    Capture(usize),
}

/// Why a key could not be made for a request (the request gets a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the request has no {0}, which the route's key template needs")]
    Missing(String),
    #[error("the request has more than one {0}; the route's key template needs exactly one")]
    Repeated(String),
    #[error("the path does not match the route's pattern '{0}'")]
    PatternMismatch(String),
}

impl KeyTemplate {
    /// Parses a template; `{name}` parts must be captures of `pattern`.
    pub fn parse(text: &str, pattern: Option<&PathPattern>) -> Result<KeyTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or_else(|| format!("'{text}': a '{{' is never closed"))?;
                    let inner = &rest[1..end];
                    parts.push(Self::placeholder(text, inner, pattern)?);
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    let lit = &rest[..end];
                    if lit.contains('}') {
                        return Err(format!("'{text}': a '}}' has no opening '{{'"));
                    }
                    parts.push(KeyPart::Literal(lit.to_string()));
                    rest = &rest[end..];
                }
            }
        }
        if !parts.iter().any(|p| !matches!(p, KeyPart::Literal(_))) {
            return Err(format!("'{text}' has no placeholder, so every request would share one key"));
        }
        Ok(KeyTemplate { parts })
    }

    fn placeholder(text: &str, inner: &str, pattern: Option<&PathPattern>) -> Result<KeyPart, String> {
        if inner == "path" {
            return Ok(KeyPart::Path);
        }
        if inner == "host" {
            return Ok(KeyPart::Host);
        }
        if let Some(name) = inner.strip_prefix("header.") {
            return HeaderName::from_bytes(name.as_bytes())
                .map(KeyPart::Header)
                .map_err(|_| format!("'{text}': '{{{inner}}}' does not name a valid header"));
        }
        if let Some(name) = inner.strip_prefix("query.") {
            if name.is_empty() {
                return Err(format!("'{text}': '{{{inner}}}' needs a parameter name"));
            }
            return Ok(KeyPart::Query(name.to_string()));
        }
        match pattern {
            Some(pat) if pat.has_capture(inner) => Ok(KeyPart::Capture(pat.capture_index(inner).expect("checked"))),
            Some(pat) => Err(format!(
                "'{text}': {{{inner}}} is not {{path}}, {{host}}, {{header.NAME}}, {{query.NAME}} or a capture of pattern '{}'",
                pat.source()
            )),
            None => Err(format!(
                "'{text}': {{{inner}}} is not {{path}}, {{host}}, {{header.NAME}} or {{query.NAME}} (named segments need a route `pattern`)"
            )),
        }
    }

    /// Renders the key for a request.
    pub fn render(&self, uri: &Uri, headers: &HeaderMap, pattern: Option<&PathPattern>) -> Result<String, KeyError> {
        self.render_target(uri.path(), uri.query(), headers, pattern)
    }

    /// Renders the key for a request target given as its path and query.
    /// Query parameters are decoded as web frameworks decode them
    /// ([`query_param`]); the `Host` header is used as it is (routing made it
    /// canonical).
    pub fn render_target(
        &self,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
        pattern: Option<&PathPattern>,
    ) -> Result<String, KeyError> {
        // The default `{path}` template is the hot case: no captures, one copy.
        if let [KeyPart::Path] = self.parts.as_slice() {
            return Ok(path.to_string());
        }
        let captures = match pattern {
            Some(pat) if self.parts.iter().any(|p| matches!(p, KeyPart::Capture(_))) => {
                Some(pat.captures(path).ok_or_else(|| KeyError::PatternMismatch(pat.source().to_string()))?)
            }
            _ => None,
        };
        let mut key = String::new();
        for part in &self.parts {
            match part {
                KeyPart::Literal(l) => key.push_str(l),
                KeyPart::Path => key.push_str(path),
                KeyPart::Host => match headers.get(http::header::HOST) {
                    Some(host) => {
                        let host = host.to_str().map_err(|_| KeyError::Missing("readable Host header".into()))?;
                        key.push_str(&host_name(host).to_ascii_lowercase());
                    }
                    None => return Err(KeyError::Missing("Host header".into())),
                },
                KeyPart::Header(name) => {
                    let mut values = headers.get_all(name).iter();
                    let value = values.next().ok_or_else(|| KeyError::Missing(format!("header '{name}'")))?;
                    if values.next().is_some() {
                        return Err(KeyError::Repeated(format!("header '{name}'")));
                    }
                    let text = value.to_str().map_err(|_| KeyError::Missing(format!("readable header '{name}'")))?;
                    key.push_str(text);
                }
                KeyPart::Query(name) => match query_param(query.unwrap_or(""), name) {
                    Ok(Some(value)) => key.push_str(&value),
                    Ok(None) => return Err(KeyError::Missing(format!("query parameter '{name}'"))),
                    Err(QueryError::Repeated) => return Err(KeyError::Repeated(format!("query parameter '{name}'"))),
                },
                KeyPart::Capture(i) => match captures.as_ref().and_then(|c| c.get(*i)) {
                    Some(capture) => key.push_str(capture),
                    None => return Err(KeyError::PatternMismatch(String::new())),
                },
            }
        }
        Ok(key)
    }
}

/// The name part of a `Host` value, without its port: servers choose a
/// virtual host by name (nginx picks `a.example` for `a.example:8080` too), so
/// the port must not give one resource a second key.
fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(literal) => literal.find(']').map_or(host, |end| &host[..end + 2]),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
}

/// A route with small test values, for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn test_route(name: &str, prefix: &str) -> Route {
    Route {
        name: name.into(),
        prefix: prefix.into(),
        upstream: Upstream::parse("http://127.0.0.1:1").unwrap(),
        pattern: None,
        key: KeyTemplate::parse("{path}", None).unwrap(),
        safe_methods: vec![Method::GET, Method::HEAD, Method::OPTIONS],
        path_options: PathOptions::default(),
        fold_key_case: false,
        allow_safe_body: false,
        stream_body: false,
        allow_missing_token: false,
        timeout: Duration::from_secs(1),
        queue_timeout: Duration::from_secs(1),
        settle: Duration::ZERO,
        token_header: HeaderName::from_static("x-fencing-token"),
        preserve_host: false,
        max_body: 1 << 20,
        signing_key: None,
        max_token_jump: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn route(name: &str, prefix: &str) -> Route {
        test_route(name, prefix)
    }

    #[test]
    fn longest_prefix_wins_whatever_the_config_order() {
        let t = RouteTable::new([route("root", "/"), route("objects", "/objects/"), route("deep", "/objects/deep/")]);
        assert_eq!(&*t.find("/objects/deep/x").unwrap().name, "deep");
        assert_eq!(&*t.find("/objects/x").unwrap().name, "objects");
        assert_eq!(&*t.find("/objects").unwrap().name, "root");
        assert_eq!(&*t.find("/other").unwrap().name, "root");
        let t = RouteTable::new([route("objects", "/objects/")]);
        assert!(t.find("/other").is_none());
        assert!(t.find("/objects").is_none());
    }

    #[test]
    fn upstream_base_path_is_prepended() {
        let u = Upstream::parse("http://10.0.0.5:9000/v1/").unwrap();
        assert_eq!(u.base_path, "/v1");
        assert_eq!(u.uri_for("/objects/a?x=1").unwrap().to_string(), "http://10.0.0.5:9000/v1/objects/a?x=1");
        let u = Upstream::parse("http://10.0.0.5:9000").unwrap();
        assert_eq!(u.uri_for("/a").unwrap().to_string(), "http://10.0.0.5:9000/a");
    }

    fn render(template: &str, pattern: Option<&str>, uri: &str, headers: &[(&str, &str)]) -> Result<String, KeyError> {
        let pat = pattern.map(|p| PathPattern::parse(p).unwrap());
        let t = KeyTemplate::parse(template, pat.as_ref()).unwrap();
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        t.render(&uri.parse().unwrap(), &h, pat.as_ref())
    }

    #[test]
    fn key_templates_render_each_placeholder() {
        assert_eq!(render("{path}", None, "/objects/a?v=2", &[]).unwrap(), "/objects/a");
        // The host's name: a virtual host is chosen by name, whatever the port.
        assert_eq!(render("{host}{path}", None, "/a", &[("host", "store.example:8080")]).unwrap(), "store.example/a");
        assert_eq!(render("{host}", None, "/a", &[("host", "store.example")]).unwrap(), "store.example");
        assert_eq!(render("{host}", None, "/a", &[("host", "[2001:db8::1]:8080")]).unwrap(), "[2001:db8::1]");
        assert_eq!(render("t={header.x-tenant}:{path}", None, "/a", &[("x-tenant", "acme")]).unwrap(), "t=acme:/a");
        assert_eq!(render("{query.id}", None, "/a?x=1&id=42", &[]).unwrap(), "42");
        assert_eq!(render("{query.id}", None, "/a?id", &[]).unwrap(), "");
        // Decoded as frameworks decode them: names and values.
        assert_eq!(render("{query.id}", None, "/a?id=%37", &[]).unwrap(), "7");
        assert_eq!(render("{query.id}", None, "/a?x=1&%69d=a+b", &[]).unwrap(), "a b");
        assert_eq!(
            render(
                "{bucket}/{object}",
                Some("/buckets/{bucket}/objects/{object*}"),
                "/buckets/b1/objects/x/y.txt",
                &[]
            )
            .unwrap(),
            "b1/x/y.txt"
        );
    }

    #[test]
    fn key_templates_refuse_missing_or_repeated_parts() {
        assert_eq!(render("{header.x-tenant}", None, "/a", &[]), Err(KeyError::Missing("header 'x-tenant'".into())));
        assert_eq!(
            render("{header.x-tenant}", None, "/a", &[("x-tenant", "a"), ("x-tenant", "b")]),
            Err(KeyError::Repeated("header 'x-tenant'".into()))
        );
        assert_eq!(
            render("{query.id}", None, "/a?id=1&id=2", &[]),
            Err(KeyError::Repeated("query parameter 'id'".into()))
        );
        assert_eq!(render("{query.id}", None, "/a?idx=1", &[]), Err(KeyError::Missing("query parameter 'id'".into())));
        assert_eq!(
            render("{query.id}", None, "/a?i%64=7&id=fresh", &[]),
            Err(KeyError::Repeated("query parameter 'id'".into()))
        );
        let p = "/buckets/{bucket}/objects/{object*}";
        assert!(matches!(render("{bucket}", Some(p), "/buckets/b1", &[]), Err(KeyError::PatternMismatch(_))));
        assert!(matches!(render("{bucket}", Some(p), "/buckets//objects/x", &[]), Err(KeyError::PatternMismatch(_))));
        assert!(matches!(render("{bucket}", Some(p), "/buckets/b/objects/", &[]), Err(KeyError::PatternMismatch(_))));
    }

    #[test]
    fn key_template_parse_errors() {
        assert!(KeyTemplate::parse("{path", None).unwrap_err().contains("never closed"));
        assert!(KeyTemplate::parse("path}", None).unwrap_err().contains("no opening"));
        assert!(KeyTemplate::parse("static", None).unwrap_err().contains("no placeholder"));
        assert!(KeyTemplate::parse("{bucket}", None).unwrap_err().contains("pattern"));
        assert!(KeyTemplate::parse("{header.a b}", None).unwrap_err().contains("valid header"));
    }

    #[test]
    fn pattern_parse_and_match() {
        assert!(PathPattern::parse("buckets/{b}").unwrap_err().contains("start with '/'"));
        assert!(PathPattern::parse("/{rest*}/x").unwrap_err().contains("last segment"));
        assert!(PathPattern::parse("/{a}/{a}").unwrap_err().contains("twice"));
        assert!(PathPattern::parse("/x{a}").unwrap_err().contains("whole"));
        let p = PathPattern::parse("/buckets/{bucket}/objects/{object*}").unwrap();
        assert_eq!(p.literal_prefix(), "/buckets/");
        assert_eq!(p.captures("/buckets/b/objects/o/p"), Some(vec!["b", "o/p"]));
        assert_eq!(p.captures("/buckets/b/object/o"), None);
        let p = PathPattern::parse("/a/{x}").unwrap();
        assert_eq!(p.captures("/a/1"), Some(vec!["1"]));
        assert_eq!(p.captures("/a/1/2"), None);
        assert_eq!(PathPattern::parse("/a/b").unwrap().literal_prefix(), "/a/b");
    }
}
