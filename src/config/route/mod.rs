//! A route's policy ([`RouteConfig`]), as pure data, and the parsers of its
//! parts: the upstream's URL, the path pattern, the key template.
//!
//! | file | what it owns |
//! |---|---|
//! | `validate.rs` | one `[[route]]` table into a `RouteConfig`, each problem named by route and field |
//! | `upstream.rs` | the upstream's URL and base path |
//! | `pattern.rs` | path patterns and their captures |
//! | `key/` | fence key templates: parsing, rendering, escaping |

mod key;
mod pattern;
mod upstream;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method};

pub use key::{KeyError, KeyInput, KeyTemplate, TemplateError};
pub use pattern::{PathPattern, PatternError};
pub use upstream::{CertNameError, UpstreamUrl, UpstreamUrlError};
pub(super) use validate::{route_label, validate_route};

/// Fields that describe one connection, never the message (RFC 9110
/// §7.6.1): fencegate removes them on the way to the upstream.
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Fields fencegate sets itself on the way to the upstream, replacing or
/// extending the client's.
pub const FORWARDED: [&str; 3] = ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"];

use super::signing_key::SigningKey;
use super::tls::UpstreamTls;
use crate::canonical::PathOptions;

/// One configured route, validated: its policy, as pure data. The server
/// puts it in service as a running route (`route::Route`).
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: Arc<str>,
    /// Plain string prefix of the request path; the longest matching one wins.
    pub prefix: String,
    pub upstream: UpstreamUrl,
    /// TLS to an `https://` upstream: its client config, once the route's
    /// files are read (`ca_file`, `client_cert`, `client_key`); `None` for
    /// an `http://` upstream.
    pub upstream_tls: Option<UpstreamTls>,
    /// `upstream_http2`: requests go to the upstream over HTTP/2 (with prior
    /// knowledge on `http://`, by ALPN on `https://`), many on one connection.
    pub upstream_http2: bool,
    /// The fence key template, with the route's `pattern` if it has one.
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
    /// `unfenced_tunnels = true`: requests may switch protocols (websocket),
    /// and what passes through the tunnel is not fenced. Off: refused (400).
    pub unfenced_tunnels: bool,
    /// `[server] underscores_in_headers`: header names with `_` pass (and are
    /// read as servers that fold `_` into `-` read them). Off: dropped.
    pub underscores_in_headers: bool,
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
    /// One write per token: a token equal to the key's mark is stale too
    /// (409), as `UPDATE ... WHERE last_token < :token` would have it. Off:
    /// the holder of the mark may write again.
    pub strict: bool,
    /// Longest fence key, in bytes (`[fences] max_key_bytes`): a longer one is
    /// refused (400 `bad-key`) before it reads or raises a mark.
    pub max_key_bytes: usize,
    /// The cap on this route's open upstream connections
    /// (`max_upstream_connections`), over every client connection and stream.
    pub max_upstream_connections: usize,
    /// An idle upstream connection closes after this long.
    pub upstream_idle_timeout: Duration,
}

impl RouteConfig {
    /// Whether the fence reads header `name` on this route: the token, or a
    /// header the key is made from. The upstream must see those as read.
    pub fn reads_header(&self, name: &HeaderName) -> bool {
        *name == self.token_header || self.key.reads_header(name)
    }

    /// Whether `method`, exactly as sent, passes unfenced on this route.
    pub fn is_safe(&self, method: &[u8]) -> bool {
        self.safe_methods.iter().any(|m| m.as_str().as_bytes() == method)
    }

    /// Whether this route's prefix covers the canonical `path`.
    pub(crate) fn covers(&self, path: &str) -> bool {
        if self.fold_key_case {
            path.len() >= self.prefix.len()
                && path.as_bytes()[..self.prefix.len()].eq_ignore_ascii_case(self.prefix.as_bytes())
        } else {
            path.starts_with(self.prefix.as_str())
        }
    }

    /// The fence key of a request for the canonical `path` and `query`, with
    /// this route's template and key case.
    /// A key longer than `max_key_bytes` is refused: every key that reads or
    /// raises a mark can hold memory and disk, so none may be unbounded.
    /// Made once per request as an `Arc`: the key's turn in the gate shares it.
    pub fn key_for(&self, path: &str, query: Option<&str>, headers: &HeaderMap) -> Result<Arc<str>, KeyError> {
        let key = self.key.render_target(path, query, headers)?;
        if key.len() > self.max_key_bytes {
            return Err(KeyError::TooLong { len: key.len(), max: self.max_key_bytes });
        }
        Ok(if self.fold_key_case { key.to_ascii_lowercase().into() } else { key.into() })
    }
}

/// A route with small test values, for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn test_route_config(name: &str, prefix: &str) -> RouteConfig {
    RouteConfig {
        name: name.into(),
        prefix: prefix.into(),
        upstream: UpstreamUrl::parse("http://127.0.0.1:1").unwrap(),
        upstream_tls: None,
        upstream_http2: false,
        key: KeyTemplate::parse("{path}", None).unwrap(),
        safe_methods: vec![Method::GET, Method::HEAD, Method::OPTIONS],
        path_options: PathOptions::default(),
        fold_key_case: false,
        allow_safe_body: false,
        stream_body: false,
        unfenced_tunnels: false,
        underscores_in_headers: false,
        allow_missing_token: false,
        timeout: Duration::from_secs(1),
        queue_timeout: Duration::from_secs(1),
        settle: Duration::ZERO,
        token_header: HeaderName::from_static("x-fencing-token"),
        preserve_host: false,
        max_body: 1 << 20,
        signing_key: None,
        max_token_jump: None,
        strict: false,
        max_key_bytes: 1024,
        max_upstream_connections: 8,
        upstream_idle_timeout: Duration::from_secs(60),
    }
}
