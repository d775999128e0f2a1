//! Routes: where a request goes and the policy it meets on the way.
//!
//! A [`Route`] is built once at config time from its parts, each in its own
//! file: the [`Upstream`] it sends to, the [`PathPattern`] and [`KeyTemplate`]
//! that make its fence key, and the [`RouteTable`] that finds it by prefix.

mod key;
mod pattern;
mod table;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method};

pub use key::{KeyError, KeyTemplate};
pub use pattern::PathPattern;
pub use table::{LiveRoutes, RouteTable};
pub use upstream::Upstream;

use crate::canonical::PathOptions;
use crate::fence::signature::SigningKey;
use crate::http::{Outcome, RouteLabel};
use crate::metrics::{Metrics, RouteMetrics};
use crate::proxy::{UpstreamSlots, UpstreamTls};

/// One configured route, validated.
#[derive(Debug, Clone)]
pub struct Route {
    pub name: Arc<str>,
    /// Plain string prefix of the request path; the longest matching one wins.
    pub prefix: String,
    pub upstream: Upstream,
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
    pub upstream_slots: UpstreamSlots,
    /// Its requests' counters: registered nowhere until the route is put in
    /// service ([`in_service`](Self::in_service)).
    pub metrics: Arc<RouteMetrics>,
}

/// The access log's view of a route: its name and its counters, as the
/// request was routed, whatever table serves requests by the time it is logged.
impl RouteLabel for Route {
    fn name(&self) -> &str {
        &self.name
    }

    fn record(&self, outcome: Outcome, seconds: f64, settled: bool) {
        self.metrics.record(outcome, seconds, settled);
    }
}

impl Route {
    /// This route as a running fencegate serves it: counted in `metrics`
    /// under its name, with a connection cap of its own (each running
    /// fencegate counts its own upstream connections, even when built from
    /// one config), or the cap of `serving`, the route a reload replaces,
    /// when it has the same name, upstream and cap: its connections stay
    /// counted.
    pub fn in_service(&self, metrics: &Metrics, serving: Option<&Route>) -> Route {
        let upstream_slots = match serving {
            Some(old)
                if old.name == self.name
                    && old.upstream == self.upstream
                    && old.upstream_http2 == self.upstream_http2
                    && old.upstream_slots.cap() == self.upstream_slots.cap()
                    && old.upstream_slots.idle_timeout() == self.upstream_slots.idle_timeout() =>
            {
                old.upstream_slots.clone()
            }
            _ => self.upstream_slots.fresh(),
        };
        Route { upstream_slots, metrics: metrics.route(&self.name), ..self.clone() }
    }

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
    pub(super) fn covers(&self, path: &str) -> bool {
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
pub(crate) fn test_route(name: &str, prefix: &str) -> Route {
    Route {
        name: name.into(),
        prefix: prefix.into(),
        upstream: Upstream::parse("http://127.0.0.1:1").unwrap(),
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
        upstream_slots: UpstreamSlots::new(8, std::time::Duration::from_secs(60)),
        metrics: RouteMetrics::detached(),
    }
}
