//! The value every optional field takes when the file leaves it out.
//!
//! One place, so `config/fencegate.toml`, the docs and the code can be checked
//! against each other at a glance.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use http::Method;

/// `0.0.0.0:8080`.
pub(super) const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080));
/// `127.0.0.1:9901`: the admin API stays off the network unless asked.
pub(super) const DEFAULT_ADMIN_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9901));
pub(super) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
pub(super) const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const DEFAULT_MAX_HEADER_BYTES: u64 = 64 * 1024;
/// hyper cannot buffer a request head smaller than this.
pub(super) const MIN_HEADER_BYTES: u64 = 8192;
pub(super) const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default `[admin] max_connections`: probes, scrapers and operators need a
/// few; every one is a file descriptor the proxy cannot use.
pub(super) const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
pub(super) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// More serving threads than this is a typo, not a machine.
pub(super) const MAX_WORKERS: u64 = 1024;
/// Default `[server] max_buffered_bytes`.
pub(super) const DEFAULT_MAX_BUFFERED_BYTES: u64 = 256 * 1024 * 1024;
/// Unset `[server] max_connection_buffered_bytes` is this share of
/// `max_buffered_bytes` (raised to the largest buffered route `max_body`), so
/// no one connection can hold the whole budget.
pub(super) const DEFAULT_CONNECTION_BUFFER_SHARE: u64 = 4;
/// Default `[server] max_concurrent_streams`: what browsers and gRPC clients
/// expect at least (RFC 9113 recommends no fewer than 100).
pub(super) const DEFAULT_MAX_CONCURRENT_STREAMS: u64 = 100;
/// HTTP/2 streams a connection may have open at once can't exceed this: past
/// it the per-stream state, not the bodies, is what one connection costs.
pub(super) const MAX_CONCURRENT_STREAMS: u64 = 10_000;
/// Default `[server] max_headers`: hyper's own HTTP/1.1 parser limit.
pub(super) const DEFAULT_MAX_HEADERS: u64 = 100;
/// A request carries at least `Host` and the token; hyper parses heads with
/// one slot per allowed header, so the top is kept sane too.
pub(super) const MIN_HEADERS: u64 = 8;
pub(super) const MAX_HEADERS: u64 = 10_000;
/// Default `[server] max_upstream_header_rate`, bytes of request heads per
/// second per client connection: 32k requests a second with 1 KiB heads.
pub(super) const DEFAULT_MAX_UPSTREAM_HEADER_RATE: u64 = 32 * 1024 * 1024;
/// Default `[server] abuse_penalty`: the longest a struck address's next
/// connection waits (server/penalty.rs).
pub(super) const DEFAULT_ABUSE_PENALTY: Duration = Duration::from_secs(2);
/// The most `[server] abuse_penalty` may be: longer, a client behind a shared
/// address could wait past any client timeout.
pub(super) const MAX_ABUSE_PENALTY: Duration = Duration::from_secs(60);
/// Default `[server] refusal_drain_bytes`: four times the default route
/// `max_body`, so a body refused for its size is drained too.
pub(super) const DEFAULT_REFUSAL_DRAIN_BYTES: u64 = 64 * 1024 * 1024;
/// Default `[server] refusal_drain_time`: nginx's `lingering_time`.
pub(super) const DEFAULT_REFUSAL_DRAIN_TIME: Duration = Duration::from_secs(30);
/// Default `[server] refusal_drain_silence`: nginx's `lingering_timeout`.
pub(super) const DEFAULT_REFUSAL_DRAIN_SILENCE: Duration = Duration::from_secs(5);

/// Default `[fences] path`, relative to the working directory.
pub const DEFAULT_FENCES_PATH: &str = "data/fences";
/// Default `[fences] cache_keys`.
pub const DEFAULT_CACHE_KEYS: usize = 1_000_000;
/// Default `[fences] cache_bytes`: the same budget as fenced bodies get
/// (`max_buffered_bytes`), and room for the default `cache_keys` marks with
/// keys of up to about 150 bytes, so only unusually long keys meet it first.
pub const DEFAULT_CACHE_BYTES: u64 = 256 * 1024 * 1024;
/// Default `[fences] max_key_bytes`: far longer than any path a store names
/// its objects by, and small enough that a million marks stay near a GiB.
pub const DEFAULT_MAX_KEY_BYTES: usize = 1024;

/// Default `[fences] key_prefix` of the Redis store.
pub const DEFAULT_REDIS_KEY_PREFIX: &str = "fencegate:";
/// Default `[fences] timeout` of the Redis store: a fenced write waits at
/// most this long for one Redis call before it is refused.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(250);
/// Put before every etcd key fencegate writes, unless `[fences] key_prefix` says otherwise.
pub const DEFAULT_ETCD_KEY_PREFIX: &str = "fencegate/";
/// The longest one etcd call may take: a transaction commits on a quorum
/// (a disk sync on each member), so more than a Redis call.
pub const DEFAULT_ETCD_TIMEOUT: Duration = Duration::from_secs(1);
/// Default `[fences] replica_timeout`.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_millis(250);

pub(super) const DEFAULT_LOG_LEVEL: &str = "info";
/// The `service.name` of fencegate's spans.
pub(super) const DEFAULT_SERVICE_NAME: &str = "fencegate";
/// Every trace kept, when traces are on.
pub(super) const DEFAULT_SAMPLE_RATIO: f64 = 1.0;

/// Default route `max_upstream_connections`.
pub(super) const DEFAULT_MAX_UPSTREAM_CONNECTIONS: usize = 256;
/// Default route `upstream_idle_timeout`: nginx's `keepalive_timeout` for
/// upstream connections, and this proxy's own client `idle_timeout`.
pub(super) const DEFAULT_UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub(super) const DEFAULT_MAX_BODY: u64 = 16 * 1024 * 1024;
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
pub(super) const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const DEFAULT_SETTLE: Duration = Duration::from_secs(2);
pub(super) const DEFAULT_TOKEN_HEADER: &str = "x-fencing-token";
pub(super) const DEFAULT_KEY: &str = "{path}";
/// Methods that pass unfenced unless a route lists others; every other method,
/// whatever its spelling, is fenced.
pub(super) const DEFAULT_SAFE_METHODS: [Method; 3] = [Method::GET, Method::HEAD, Method::OPTIONS];

/// One serving thread per CPU this process may run on.
pub(super) fn default_workers() -> usize {
    std::thread::available_parallelism().map(usize::from).unwrap_or(1)
}
