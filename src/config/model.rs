//! The validated configuration: the types the rest of fencegate is built from.
//!
//! Every value here has passed validation, so the server never re-checks a
//! field; secrets (the admin token, signing keys) are filled in by
//! [`super::secrets`] after validation.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::effective::Written;
use super::route::RouteConfig;

/// A validated configuration: everything here is known to be usable.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub fences: FencesConfig,
    pub log: LogConfig,
    pub tracing: TracingConfig,
    pub routes: Vec<RouteConfig>,
    /// The file this was validated from, for [`Config::effective`].
    pub written: Written,
}

/// The proxy listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// How long in-flight requests may take to finish after SIGTERM/SIGINT.
    pub shutdown_grace: Duration,
    /// Longest a client may take to send a request head (slowloris guard).
    pub header_read_timeout: Duration,
    /// Largest request head accepted (431 past it).
    pub max_header_bytes: usize,
    /// Most client connections open at once; further ones wait in the backlog.
    pub max_connections: usize,
    /// A keep-alive connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Threads serving client connections, each with its own event loop and
    /// upstream connections; a connection stays on the thread that took it.
    pub workers: usize,
    /// Most bytes of fenced request bodies held in memory at once, over every
    /// connection, while they are read whole before forwarding (503 past it).
    pub max_buffered_bytes: u64,
    /// Most bytes of buffered fenced bodies one client connection may hold at
    /// once, over all its HTTP/2 streams (503 past it); within
    /// `max_buffered_bytes`.
    pub max_connection_buffered_bytes: u64,
    /// Whether the file set `max_connection_buffered_bytes`; unset, it is
    /// derived from `max_buffered_bytes` and the routes' `max_body`.
    pub max_connection_buffered_bytes_set: bool,
    /// HTTP/2 streams one client connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Most header fields in a request head (431 past it), HTTP/1.1 and HTTP/2.
    pub max_headers: usize,
    /// Bytes of request heads one client connection may send upstream per
    /// second, with one second of burst (429 past it).
    pub max_upstream_header_rate: u64,
    /// The longest an address whose connection was closed for abuse waits
    /// before its next connection is served; zero: never.
    pub abuse_penalty: Duration,
    /// Header names containing `_` pass to the upstream (read as servers that
    /// fold `_` into `-` read them); `false` (default): dropped, as nginx does.
    pub underscores_in_headers: bool,
    /// How much of a request body fencegate reads and discards after refusing
    /// the request before its body ended, so the client reads the refusal.
    pub refusal_drain: RefusalDrain,
    /// Whether each proxy connection starts with a PROXY protocol header,
    /// whose source address is then the connection's client.
    pub proxy_protocol: ProxyProtocol,
    /// Addresses whose `X-Forwarded-For` is believed: a request from one
    /// (its peer, or its PROXY header's source) is the client's that the
    /// rightmost address of `X-Forwarded-For` outside these names.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// TLS for client connections; `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
}

/// `[server] proxy_protocol`: which PROXY protocol header (HAProxy's) every
/// proxy connection must start with. Not `Off`, a connection without one (or
/// with one of the other version, malformed, or too long) is closed before
/// anything else is read, as HAProxy's `accept-proxy` and nginx's
/// `proxy_protocol` do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyProtocol {
    /// No header: the TCP peer is the client.
    #[default]
    Off,
    /// The text header, `PROXY TCP4 ...\r\n`.
    V1,
    /// The binary header.
    V2,
    /// Either.
    Any,
}

impl ProxyProtocol {
    /// The config file's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyProtocol::Off => "off",
            ProxyProtocol::V1 => "v1",
            ProxyProtocol::V2 => "v2",
            ProxyProtocol::Any => "any",
        }
    }
}

/// The bounds of the drain that follows a refusal sent before its request's
/// body ended (`[server] refusal_drain_*`): the rest of the body is read and
/// discarded until its end, or until one of these is reached, whichever
/// comes first; then the connection (HTTP/1.1) or the stream (HTTP/2) is
/// closed. Like nginx's `lingering_time` and `lingering_timeout`, with a cap
/// in bytes besides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalDrain {
    /// Most bytes of body discarded.
    pub bytes: u64,
    /// Longest the drain lasts, from the refusal.
    pub time: Duration,
    /// Longest the drain waits for the client's next bytes.
    pub silence: Duration,
}

/// `[server.tls]`: the PEM files TLS is served from, read at start and again
/// whenever their directory changes (the server's `tls`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CAs that sign client certificates: set, every client must present one.
    pub client_ca: Option<PathBuf>,
}

/// The admin listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer token for mutating admin calls (the fence API).
    pub auth_token: Option<String>,
    /// Most admin connections open at once; further ones wait in the backlog.
    pub max_connections: usize,
    /// Bearer tokens for the lease API on the keys under their prefixes
    /// (`auth_token` takes leases on every key).
    pub lease_tokens: Vec<LeaseToken>,
}

/// A bearer token for the lease API on the keys that start with one of its
/// prefixes (as the lease API makes keys canonical).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseToken {
    pub token: String,
    pub prefixes: Vec<String>,
}

impl LeaseToken {
    /// Whether it covers `key`.
    pub fn covers(&self, key: &str) -> bool {
        self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }
}

/// Where fence marks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencesConfig {
    pub store: StoreKind,
    /// Longest fence key, in bytes: a longer one is refused (400 `bad-key`)
    /// before it reads or raises a mark.
    pub max_key_bytes: usize,
}

/// The fence store backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// In-process map: fast, and every fence dies with the process.
    Memory,
    /// Durable marks on local disk, with an in-memory cache of about
    /// `cache_keys` marks and `cache_bytes` bytes in front of them.
    File { path: PathBuf, require_existing: bool, cache_keys: usize, cache_bytes: u64 },
    /// Marks in Redis, shared by every replica that names the same server
    /// and prefix (store/redis/).
    Redis(RedisConfig),
    /// Marks in etcd, linearizable, shared by every replica that names the
    /// same cluster and prefix (store/etcd/).
    Etcd(EtcdConfig),
}

/// `[fences] store = "etcd"`.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://host:port` or `https://host:port`, one scheme for all: the
    /// client fails over between them by itself.
    pub endpoints: Vec<String>,
    /// Put before every etcd key fencegate writes.
    pub key_prefix: String,
    /// The longest one etcd call may take before the write it serves is
    /// refused (503).
    pub timeout: std::time::Duration,
    /// Marks this replica remembers (how it notices a store that went back).
    pub cache_keys: usize,
    /// PEM roots to verify `https://` members with, instead of the system's.
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for members that ask for one.
    pub client_identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// etcd's own authentication: a user and its password.
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("cache_keys", &self.cache_keys)
            .field("ca_file", &self.ca_file)
            .field("client_identity", &self.client_identity)
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("password", &self.credentials.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// `[fences] store = "redis"`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port/db` or `rediss://` (TLS).
    pub url: String,
    /// Put before every Redis key fencegate writes.
    pub key_prefix: String,
    /// The longest a Redis call may take before the write it serves is
    /// refused (503): unreachable and slow are the same to a fenced write.
    pub timeout: std::time::Duration,
    /// Replicas that must acknowledge a decision before its write goes on.
    pub min_replicas: u32,
    /// How long to wait for them.
    pub replica_timeout: std::time::Duration,
    /// Marks this replica remembers (its fast path, and how it notices a
    /// store that lost writes).
    pub cache_keys: usize,
    /// PEM roots to verify a `rediss://` server with, instead of the system's.
    pub ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("RedisConfig")
            .field("url", &"<redacted>")
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("min_replicas", &self.min_replicas)
            .field("replica_timeout", &self.replica_timeout)
            .field("cache_keys", &self.cache_keys)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// Log output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A `tracing_subscriber::EnvFilter` directive, e.g. `info` or `fencegate=debug`.
    pub level: String,
}

/// Human-readable lines or one JSON object per event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

/// OpenTelemetry traces: off unless an OTLP endpoint is set.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// Where spans are sent: an OTLP/HTTP collector's `/v1/traces`
    /// (`http://` only); `None`: traces are off.
    pub otlp_endpoint: Option<http::Uri>,
    /// The share of traces started here that are kept, `0.0 ..= 1.0`; a
    /// request whose `traceparent` says whether its trace is sampled follows it.
    pub sample_ratio: f64,
    /// The `service.name` the spans carry.
    pub service_name: String,
}

/// Traces off, as when the file has no `[tracing]`.
impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig { otlp_endpoint: None, sample_ratio: 1.0, service_name: "fencegate".to_string() }
    }
}
