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

/// Default `[fences] path`, relative to the working directory.
pub const DEFAULT_FENCES_PATH: &str = "data/fences";
/// Default `[fences] cache_keys`.
pub const DEFAULT_CACHE_KEYS: usize = 1_000_000;

pub(super) const DEFAULT_LOG_LEVEL: &str = "info";

/// Default route `max_upstream_connections`.
pub(super) const DEFAULT_MAX_UPSTREAM_CONNECTIONS: usize = 256;
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
