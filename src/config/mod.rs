//! Configuration: `config.toml -> FileConfig (serde) -> validate -> Config`.
//!
//! Validation collects *every* problem and names the field it concerns, so one
//! `fencegate --check` run tells an operator everything to fix:
//!
//! ```
//! let err = fencegate::config::Config::from_toml_str(r#"
//!     [[route]]
//!     name = "objects"
//!     prefix = "objects/"
//!     upstream = "htp://10.0.0.5:9000"
//! "#).unwrap_err();
//! let text = err.to_string();
//! assert!(text.contains("route[0] 'objects'.prefix"));
//! assert!(text.contains("route[0] 'objects'.upstream"));
//! ```

mod file;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, Method};

pub use file::FileConfig;

use crate::canonical::{canonical_path, EscapedSlashes, PathOptions};
use crate::fence::signature::SigningKey;
use crate::route::{KeyTemplate, PathPattern, Route, Upstream};

const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9901";
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_MAX_HEADER_BYTES: u64 = 64 * 1024;
const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// More serving threads than this is a typo, not a machine.
const MAX_WORKERS: u64 = 1024;

/// One serving thread per CPU this process may run on.
fn default_workers() -> usize {
    std::thread::available_parallelism().map(usize::from).unwrap_or(1)
}
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_MAX_BODY: u64 = 16 * 1024 * 1024;
/// hyper cannot buffer a request head smaller than this.
const MIN_HEADER_BYTES: u64 = 8192;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_SETTLE: Duration = Duration::from_secs(2);
const DEFAULT_TOKEN_HEADER: &str = "x-fencing-token";
const DEFAULT_KEY: &str = "{path}";
/// Methods that pass unfenced unless a route lists others; every other method,
/// whatever its spelling, is fenced.
const DEFAULT_SAFE_METHODS: [Method; 3] = [Method::GET, Method::HEAD, Method::OPTIONS];
/// Default `[server] max_buffered_bytes`.
const DEFAULT_MAX_BUFFERED_BYTES: u64 = 256 * 1024 * 1024;

/// A validated configuration: everything here is known to be usable.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub fences: FencesConfig,
    pub log: LogConfig,
    pub routes: Vec<Route>,
}

/// The proxy listener.
#[derive(Debug, Clone)]
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
}

/// The admin listener.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer token for mutating admin calls (the fence API).
    pub auth_token: Option<String>,
}

/// Where fence marks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencesConfig {
    pub store: StoreKind,
}

/// The fence store backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// In-process map: fast, and every fence dies with the process.
    Memory,
    /// Durable marks on local disk, with an in-memory cache of at most
    /// `cache_keys` marks in front of them.
    File { path: PathBuf, require_existing: bool, cache_keys: usize },
}

/// Default `[fences] path`, relative to the working directory.
pub const DEFAULT_FENCES_PATH: &str = "data/fences";
/// Default `[fences] cache_keys`.
pub const DEFAULT_CACHE_KEYS: usize = 1_000_000;
/// Environment variable that overrides `[admin] auth_token` and `auth_token_file`.
pub const ADMIN_TOKEN_ENV: &str = "FENCEGATE_ADMIN_TOKEN";

/// Log output.
#[derive(Debug, Clone)]
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

/// One problem found in a config, with the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Dotted path of the field, e.g. `route[1] 'objects'.timeout`.
    pub field: String,
    pub message: String,
}

/// Everything wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub source_name: String,
    pub problems: Vec<ConfigProblem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(f, "{}: {} problem{}", self.source_name, n, if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            if p.field.is_empty() {
                write!(f, "\n  - {}", p.message)?;
            } else {
                write!(f, "\n  - {}: {}", p.field, p.message)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            source_name: name.clone(),
            problems: vec![ConfigProblem { field: String::new(), message: format!("cannot read the file: {e}") }],
        })?;
        Self::parse(&text, &name)
    }

    /// Parses and validates config text (what tests and `--check` use).
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        Self::parse(text, "config")
    }

    fn parse(text: &str, name: &str) -> Result<Config, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError {
            source_name: name.to_string(),
            problems: vec![ConfigProblem { field: String::new(), message: e.to_string().trim_end().to_string() }],
        })?;
        validate(file).map_err(|problems| ConfigError { source_name: name.to_string(), problems })
    }
}

/// Collects problems while validating, so all of them are reported together.
#[derive(Default)]
struct Problems(Vec<ConfigProblem>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem { field: field.into(), message: message.into() });
    }

    fn addr(&mut self, field: &str, value: Option<&str>, default: &str) -> SocketAddr {
        let text = value.unwrap_or(default);
        text.parse().unwrap_or_else(|_| {
            self.add(field, format!("'{text}' is not an IP:port address (e.g. \"127.0.0.1:8080\")"));
            default.parse().expect("default address parses")
        })
    }

    fn size(&mut self, field: &str, value: Option<&str>, default: u64) -> u64 {
        let Some(text) = value else { return default };
        match parse_size(text) {
            Some(0) => {
                self.add(field, "must be greater than zero");
                default
            }
            Some(n) => n,
            None => {
                self.add(field, format!("'{text}' is not a size like \"16MiB\", \"512KiB\" or \"1048576\""));
                default
            }
        }
    }

    fn duration(&mut self, field: &str, value: Option<&str>, default: Duration) -> Duration {
        self.duration_from(field, value, default, false)
    }

    fn duration_from(&mut self, field: &str, value: Option<&str>, default: Duration, zero_ok: bool) -> Duration {
        let Some(text) = value else { return default };
        match humantime::parse_duration(text) {
            Ok(d) if d.is_zero() && !zero_ok => {
                self.add(field, "must be greater than zero");
                default
            }
            Ok(d) => d,
            Err(e) => {
                self.add(field, format!("'{text}' is not a duration like \"250ms\" or \"30s\" ({e})"));
                default
            }
        }
    }
}

/// Parses a byte size: a whole number with an optional unit `B`, `KB`/`KiB`,
/// `MB`/`MiB`, `GB`/`GiB` (decimal and binary units as written).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1000 * 1000,
        "MiB" => 1 << 20,
        "GB" => 1000 * 1000 * 1000,
        "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// Turns a parsed file into a typed [`Config`], or lists every problem.
pub fn validate(file: FileConfig) -> Result<Config, Vec<ConfigProblem>> {
    let mut p = Problems::default();

    let server = ServerConfig {
        listen: p.addr("server.listen", file.server.listen.as_deref(), DEFAULT_LISTEN),
        shutdown_grace: p.duration(
            "server.shutdown_grace",
            file.server.shutdown_grace.as_deref(),
            DEFAULT_SHUTDOWN_GRACE,
        ),
        header_read_timeout: p.duration(
            "server.header_read_timeout",
            file.server.header_read_timeout.as_deref(),
            DEFAULT_HEADER_READ_TIMEOUT,
        ),
        max_header_bytes: match p.size(
            "server.max_header_bytes",
            file.server.max_header_bytes.as_deref(),
            DEFAULT_MAX_HEADER_BYTES,
        ) {
            n if n < MIN_HEADER_BYTES => {
                p.add("server.max_header_bytes", format!("must be at least {MIN_HEADER_BYTES} bytes (8KiB)"));
                DEFAULT_MAX_HEADER_BYTES as usize
            }
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
        max_connections: match file.server.max_connections {
            None => DEFAULT_MAX_CONNECTIONS,
            Some(0) => {
                p.add("server.max_connections", "must be at least 1");
                DEFAULT_MAX_CONNECTIONS
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        },
        idle_timeout: p.duration("server.idle_timeout", file.server.idle_timeout.as_deref(), DEFAULT_IDLE_TIMEOUT),
        workers: match file.server.workers {
            None => default_workers(),
            Some(n @ 1..=MAX_WORKERS) => n as usize,
            Some(_) => {
                p.add("server.workers", format!("must be between 1 and {MAX_WORKERS}"));
                default_workers()
            }
        },
        max_buffered_bytes: p.size(
            "server.max_buffered_bytes",
            file.server.max_buffered_bytes.as_deref(),
            DEFAULT_MAX_BUFFERED_BYTES,
        ),
    };

    let admin = AdminConfig {
        listen: p.addr("admin.listen", file.admin.listen.as_deref(), DEFAULT_ADMIN_LISTEN),
        auth_token: admin_token(&file.admin, std::env::var(ADMIN_TOKEN_ENV).ok(), &mut p),
    };

    let f = &file.fences;
    let store = match f.store.as_deref() {
        None | Some("file") => StoreKind::File {
            path: PathBuf::from(f.path.as_deref().unwrap_or(DEFAULT_FENCES_PATH)),
            require_existing: f.require_existing.unwrap_or(false),
            cache_keys: match f.cache_keys {
                None => DEFAULT_CACHE_KEYS,
                Some(0) => {
                    p.add("fences.cache_keys", "must be at least 1");
                    DEFAULT_CACHE_KEYS
                }
                Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            },
        },
        Some("memory") => {
            for (field, set) in [
                ("path", f.path.is_some()),
                ("require_existing", f.require_existing.is_some()),
                ("cache_keys", f.cache_keys.is_some()),
            ] {
                if set {
                    p.add(
                        format!("fences.{field}"),
                        "applies to store = \"file\" only; the memory store keeps nothing",
                    );
                }
            }
            StoreKind::Memory
        }
        Some(other) => {
            p.add("fences.store", format!("'{other}' is not a store this build has; use \"file\" or \"memory\""));
            StoreKind::Memory
        }
    };
    if let StoreKind::File { path, .. } = &store {
        if path.as_os_str().is_empty() {
            p.add("fences.path", "must not be empty");
        }
    }
    let fences = FencesConfig { store };

    let log = LogConfig {
        format: match file.log.format.as_deref() {
            None | Some("human") => LogFormat::Human,
            Some("json") => LogFormat::Json,
            Some(other) => {
                p.add("log.format", format!("'{other}' is not \"human\" or \"json\""));
                LogFormat::Human
            }
        },
        level: file.log.level.unwrap_or_else(|| "info".to_string()),
    };
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log.level) {
        p.add("log.level", format!("'{}' is not a log filter ({e})", log.level));
    }

    if file.routes.is_empty() {
        p.add("route", "no [[route]] is configured; fencegate would answer 404 to everything");
    }
    let mut routes = Vec::with_capacity(file.routes.len());
    for (i, section) in file.routes.into_iter().enumerate() {
        if let Some(route) = validate_route(i, section, &mut p) {
            routes.push(route);
        }
    }
    for r in &routes {
        if !r.stream_body && r.max_body > server.max_buffered_bytes {
            p.add(
                format!("route '{}'.max_body", r.name),
                format!(
                    "{} bytes is more than server.max_buffered_bytes ({}): a fenced body that large could never be \
                     held whole; raise max_buffered_bytes, lower max_body, or set stream_body = true",
                    r.max_body, server.max_buffered_bytes
                ),
            );
        }
    }
    for (i, a) in routes.iter().enumerate() {
        for b in &routes[..i] {
            if a.name == b.name {
                p.add(format!("route '{}'.name", a.name), "two routes have this name; names must be unique");
            }
            if a.prefix == b.prefix {
                p.add(
                    format!("route '{}'.prefix", a.name),
                    format!("route '{}' has the same prefix '{}'; the match would be ambiguous", b.name, a.prefix),
                );
            }
        }
    }

    if p.0.is_empty() {
        Ok(Config { server, admin, fences, log, routes })
    } else {
        Err(p.0)
    }
}

/// The admin bearer token: `FENCEGATE_ADMIN_TOKEN`, else `auth_token_file`, else
/// `auth_token`. Empty means unset.
fn admin_token(section: &file::AdminSection, env: Option<String>, p: &mut Problems) -> Option<String> {
    if section.auth_token.is_some() && section.auth_token_file.is_some() {
        p.add("admin.auth_token_file", "set either auth_token or auth_token_file, not both");
    }
    if let Some(token) = env.filter(|t| !t.is_empty()) {
        return Some(token);
    }
    if let Some(path) = &section.auth_token_file {
        return match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => {
                p.add("admin.auth_token_file", format!("'{path}' is empty"));
                None
            }
            Ok(text) => Some(text.trim().to_string()),
            Err(e) => {
                p.add("admin.auth_token_file", format!("cannot read '{path}': {e}"));
                None
            }
        };
    }
    section.auth_token.clone().filter(|t| !t.is_empty())
}

/// Shortest signing key accepted, in bytes.
pub const MIN_SIGNING_KEY_BYTES: usize = 16;

/// Reads a route's `signing_key_file`: the file's bytes with trailing ASCII
/// whitespace removed, at least [`MIN_SIGNING_KEY_BYTES`] of them. The server and
/// `fencegate sign` both load keys here, so they always agree on the key.
pub fn load_signing_key(path: &Path) -> Result<SigningKey, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read '{}': {e}", path.display()))?;
    // Trailing whitespace is a file-editing accident, not key material.
    let key = bytes.trim_ascii_end();
    if key.len() < MIN_SIGNING_KEY_BYTES {
        return Err(format!(
            "'{}' holds {} bytes; use a key of at least {MIN_SIGNING_KEY_BYTES}",
            path.display(),
            key.len()
        ));
    }
    Ok(SigningKey::new(key))
}

fn validate_route(i: usize, s: file::RouteSection, p: &mut Problems) -> Option<Route> {
    let label = match &s.name {
        Some(name) => format!("route[{i}] '{name}'"),
        None => format!("route[{i}]"),
    };
    let field = |f: &str| format!("{label}.{f}");
    let before = p.0.len();

    let name = match s.name {
        Some(n) if !n.trim().is_empty() => n,
        _ => {
            p.add(field("name"), "is required (it labels metrics and logs)");
            String::new()
        }
    };
    let prefix = match s.prefix {
        Some(pre) if pre.starts_with('/') => pre,
        Some(pre) => {
            p.add(field("prefix"), format!("'{pre}' must start with '/'"));
            pre
        }
        None => {
            p.add(field("prefix"), "is required, e.g. \"/objects/\"");
            String::new()
        }
    };
    let upstream = match s.upstream.as_deref().map(Upstream::parse) {
        Some(Ok(u)) => Some(u),
        Some(Err(msg)) => {
            p.add(field("upstream"), msg);
            None
        }
        None => {
            p.add(field("upstream"), "is required, e.g. \"http://10.0.0.5:9000\"");
            None
        }
    };
    let pattern = match s.pattern.as_deref().map(PathPattern::parse) {
        Some(Ok(pat)) => {
            if !pat.literal_prefix().starts_with(prefix.as_str()) && !prefix.starts_with(pat.literal_prefix()) {
                p.add(field("pattern"), format!("'{}' can never match a path under prefix '{prefix}'", pat.source()));
            }
            Some(pat)
        }
        Some(Err(msg)) => {
            p.add(field("pattern"), msg);
            None
        }
        None => None,
    };
    let key_text = s.key.as_deref().unwrap_or(DEFAULT_KEY);
    let key = match KeyTemplate::parse(key_text, pattern.as_ref()) {
        Ok(k) => Some(k),
        Err(msg) => {
            p.add(field("key"), msg);
            None
        }
    };
    if s.fenced_methods.is_some() {
        p.add(
            field("fenced_methods"),
            "was replaced by safe_methods: list the methods that pass unfenced (default [\"GET\", \"HEAD\", \
             \"OPTIONS\"]); every other method, in any spelling, is fenced",
        );
    }
    let safe_methods = match s.safe_methods {
        None => DEFAULT_SAFE_METHODS.to_vec(),
        Some(list) => {
            let mut methods = Vec::with_capacity(list.len());
            for m in list {
                // Exactly as written: a request's method is compared byte for
                // byte, so "get" here would not make "GET" safe.
                match Method::from_bytes(m.as_bytes()) {
                    Ok(method) if !methods.contains(&method) => methods.push(method),
                    Ok(_) => p.add(field("safe_methods"), format!("'{m}' is listed twice")),
                    Err(_) => p.add(field("safe_methods"), format!("'{m}' is not an HTTP method")),
                }
            }
            methods
        }
    };
    let escaped_slashes = match s.escaped_slashes.as_deref() {
        None | Some("reject") => EscapedSlashes::Reject,
        Some("keep") => EscapedSlashes::Keep,
        Some(other) => {
            p.add(field("escaped_slashes"), format!("'{other}' is not \"reject\" or \"keep\""));
            EscapedSlashes::Reject
        }
    };
    let path_options = PathOptions { merge_slashes: s.merge_slashes.unwrap_or(true), escaped_slashes };
    let fold_key_case = match s.key_case.as_deref() {
        None | Some("exact") => false,
        Some("fold") => true,
        Some(other) => {
            p.add(field("key_case"), format!("'{other}' is not \"exact\" or \"fold\""));
            false
        }
    };
    // Requests are routed by their canonical path, so a prefix in any other
    // spelling could never match.
    if let Ok(canonical) = canonical_path(&prefix, path_options) {
        if canonical != prefix && prefix.starts_with('/') {
            p.add(field("prefix"), format!("'{prefix}' is not in canonical form; write it as '{canonical}'"));
        }
    } else if prefix.starts_with('/') {
        p.add(field("prefix"), format!("'{prefix}' is not a path a request can have"));
    }
    let allow_missing_token = match s.missing_token.as_deref() {
        None | Some("reject") => false,
        Some("allow") => true,
        Some(other) => {
            p.add(field("missing_token"), format!("'{other}' is not \"reject\" or \"allow\""));
            false
        }
    };
    let timeout = p.duration(&field("timeout"), s.timeout.as_deref(), DEFAULT_TIMEOUT);
    let queue_timeout = p.duration(&field("queue_timeout"), s.queue_timeout.as_deref(), DEFAULT_QUEUE_TIMEOUT);
    // "0s" turns settling off.
    let settle = p.duration_from(&field("settle"), s.settle.as_deref(), DEFAULT_SETTLE, true);
    let token_header_text = s.token_header.as_deref().unwrap_or(DEFAULT_TOKEN_HEADER);
    let token_header = match HeaderName::from_bytes(token_header_text.as_bytes()) {
        Ok(h) => Some(h),
        Err(_) => {
            p.add(field("token_header"), format!("'{token_header_text}' is not a valid header name"));
            None
        }
    };

    let max_body = p.size(&field("max_body"), s.max_body.as_deref(), DEFAULT_MAX_BODY);
    let signing_key = match &s.signing_key_file {
        None => Some(None),
        Some(path) => match load_signing_key(Path::new(path)) {
            Ok(key) => Some(Some(key)),
            Err(msg) => {
                p.add(field("signing_key_file"), msg);
                None
            }
        },
    };
    let max_token_jump = s.max_token_jump;

    if p.0.len() != before {
        return None;
    }
    Some(Route {
        name: name.into(),
        prefix,
        upstream: upstream?,
        key: key?,
        safe_methods,
        path_options,
        fold_key_case,
        allow_safe_body: s.allow_safe_body.unwrap_or(false),
        stream_body: s.stream_body.unwrap_or(false),
        allow_missing_token,
        timeout,
        queue_timeout,
        settle,
        token_header: token_header?,
        preserve_host: s.preserve_host.unwrap_or(false),
        max_body,
        signing_key: signing_key?,
        max_token_jump,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<ConfigProblem> {
        Config::from_toml_str(text).unwrap_err().problems
    }

    fn fields(text: &str) -> Vec<String> {
        problems(text).into_iter().map(|p| p.field).collect()
    }

    const MINIMAL: &str = r#"
        [[route]]
        name = "objects"
        prefix = "/objects/"
        upstream = "http://127.0.0.1:9000"
    "#;

    #[test]
    fn minimal_config_takes_the_documented_defaults() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.server.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9901");
        assert_eq!(
            c.fences.store,
            StoreKind::File { path: "data/fences".into(), require_existing: false, cache_keys: 1_000_000 }
        );
        let r = &c.routes[0];
        assert_eq!(r.safe_methods, DEFAULT_SAFE_METHODS.to_vec());
        assert_eq!(r.path_options, PathOptions::default());
        assert!(!r.fold_key_case && !r.allow_safe_body && !r.stream_body);
        assert_eq!(c.server.max_buffered_bytes, 256 << 20);
        assert!(!r.allow_missing_token);
        assert_eq!(r.timeout, Duration::from_secs(30));
        assert_eq!(r.queue_timeout, Duration::from_secs(10));
        assert_eq!(r.settle, Duration::from_secs(2));
        assert_eq!(r.max_body, 16 << 20);
        assert!(r.signing_key.is_none());
        assert_eq!(r.max_token_jump, None);
        assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.server.max_header_bytes, 64 << 10);
        assert_eq!(c.server.max_connections, 10_000);
        assert_eq!(c.server.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.server.workers, default_workers());
        assert_eq!(r.token_header.as_str(), "x-fencing-token");
        assert!(!r.preserve_host);
    }

    #[test]
    fn the_shipped_reference_config_is_valid() {
        let text = include_str!("../../config/fencegate.toml");
        if let Err(e) = Config::from_toml_str(text) {
            panic!("config/fencegate.toml does not validate:\n{e}");
        }
    }

    #[test]
    fn unknown_fields_are_errors_that_name_the_field() {
        let text = format!("{MINIMAL}\nfenced_method = [\"PUT\"]\n");
        let msg = problems(&text)[0].message.clone();
        assert!(msg.contains("unknown field `fenced_method`"), "{msg}");
        let msg = problems("[server]\nlisten = \"127.0.0.1:1\"\nbacklog = 5\n")[0].message.clone();
        assert!(msg.contains("unknown field `backlog`"), "{msg}");
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_field() {
        let f = fields(
            r#"
            [server]
            listen = "localhost"
            [log]
            format = "xml"
            [[route]]
            name = "a"
            prefix = "a/"
            upstream = "htp://x"
            timeout = "soon"
            queue_timeout = "0s"
            missing_token = "maybe"
            safe_methods = ["GET", "P UT", "GET"]
            escaped_slashes = "decode"
            key_case = "lower"
            token_header = "bad header"
            key = "{query.}"
            [[route]]
            prefix = "/b/"
        "#,
        );
        let want = [
            "server.listen",
            "log.format",
            "route[0] 'a'.prefix",
            "route[0] 'a'.upstream",
            "route[0] 'a'.key",
            "route[0] 'a'.safe_methods",
            "route[0] 'a'.safe_methods",
            "route[0] 'a'.escaped_slashes",
            "route[0] 'a'.key_case",
            "route[0] 'a'.missing_token",
            "route[0] 'a'.timeout",
            "route[0] 'a'.queue_timeout",
            "route[0] 'a'.token_header",
            "route[1].name",
            "route[1].upstream",
        ];
        for w in want {
            assert!(f.iter().any(|x| x == w), "missing problem for {w}; got {f:?}");
        }
        assert_eq!(f.len(), want.len(), "{f:?}");
    }

    #[test]
    fn upstream_messages_say_what_is_wrong() {
        let msg = |u: &str| {
            problems(&format!("[[route]]\nname=\"a\"\nprefix=\"/\"\nupstream=\"{u}\"\n"))
                .into_iter()
                .find(|p| p.field.ends_with(".upstream"))
                .unwrap()
                .message
        };
        assert!(msg("htp://x").contains("http://"), "{}", msg("htp://x"));
        assert!(msg("https://x").contains("https"), "{}", msg("https://x"));
        assert!(msg("http://").contains("not a URL"), "{}", msg("http://"));
        assert!(msg("http:///x").contains("not a URL") || msg("http:///x").contains("host"), "{}", msg("http:///x"));
        assert!(msg("http://x/base?q=1").contains("query"), "{}", msg("http://x/base?q=1"));
    }

    #[test]
    fn duplicate_names_and_prefixes_are_rejected() {
        let f = fields(
            r#"
            [[route]]
            name = "a"
            prefix = "/x/"
            upstream = "http://127.0.0.1:1"
            [[route]]
            name = "a"
            prefix = "/x/"
            upstream = "http://127.0.0.1:1"
        "#,
        );
        assert_eq!(f, vec!["route 'a'.name".to_string(), "route 'a'.prefix".to_string()]);
    }

    #[test]
    fn key_segments_must_come_from_the_pattern() {
        let p = problems(
            r#"
            [[route]]
            name = "b"
            prefix = "/buckets/"
            upstream = "http://127.0.0.1:1"
            key = "{bucket}/{object}"
            pattern = "/buckets/{bucket}/objects/{obj*}"
        "#,
        );
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].field, "route[0] 'b'.key");
        assert!(p[0].message.contains("{object}"), "{}", p[0].message);
    }

    #[test]
    fn a_pattern_outside_the_prefix_is_rejected() {
        let p = problems(
            r#"
            [[route]]
            name = "b"
            prefix = "/buckets/"
            upstream = "http://127.0.0.1:1"
            pattern = "/other/{x}"
        "#,
        );
        assert_eq!(p[0].field, "route[0] 'b'.pattern");
    }

    #[test]
    fn sizes_take_decimal_and_binary_units() {
        assert_eq!(parse_size("16MiB"), Some(16 << 20));
        assert_eq!(parse_size("512KiB"), Some(512 << 10));
        assert_eq!(parse_size("1GB"), Some(1_000_000_000));
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("10 MB"), Some(10_000_000));
        for bad in ["", "MiB", "1.5MiB", "-1", "16mib", "16XB", "99999999999999999999GiB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        let text = format!(
            "[server]\nmax_header_bytes = \"1KiB\"\nidle_timeout = \"x\"\nmax_connections = 0\nworkers = 0\n{MINIMAL}max_body = \"lots\"\n"
        );
        assert_eq!(
            fields(&text),
            [
                "server.max_header_bytes",
                "server.max_connections",
                "server.idle_timeout",
                "server.workers",
                "route[0] 'objects'.max_body"
            ]
        );
    }

    #[test]
    fn file_store_options_are_read_and_refused_for_memory() {
        let text = format!(
            "[fences]\nstore = \"file\"\npath = \"/var/lib/f\"\nrequire_existing = true\ncache_keys = 5\n{MINIMAL}"
        );
        let c = Config::from_toml_str(&text).unwrap();
        assert_eq!(
            c.fences.store,
            StoreKind::File { path: "/var/lib/f".into(), require_existing: true, cache_keys: 5 }
        );
        let text = format!("[fences]\nstore = \"memory\"\npath = \"x\"\n{MINIMAL}");
        assert_eq!(fields(&text), ["fences.path"]);
        let text = format!("[fences]\ncache_keys = 0\n{MINIMAL}");
        assert_eq!(fields(&text), ["fences.cache_keys"]);
    }

    #[test]
    fn admin_token_comes_from_env_then_file_then_config() {
        let dir = std::env::temp_dir().join(format!("fencegate-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file_path = dir.join("token");
        std::fs::write(&file_path, "from-file\n").unwrap();
        let section = |token: Option<&str>, file: Option<&std::path::Path>| file::AdminSection {
            listen: None,
            auth_token: token.map(str::to_string),
            auth_token_file: file.map(|f| f.display().to_string()),
        };
        let mut p = Problems::default();
        assert_eq!(admin_token(&section(Some("inline"), None), None, &mut p).as_deref(), Some("inline"));
        assert_eq!(admin_token(&section(None, Some(&file_path)), None, &mut p).as_deref(), Some("from-file"));
        assert_eq!(admin_token(&section(None, Some(&file_path)), Some("env".into()), &mut p).as_deref(), Some("env"));
        assert_eq!(admin_token(&section(Some(""), None), None, &mut p), None);
        assert!(p.0.is_empty());
        admin_token(&section(Some("a"), Some(&file_path)), None, &mut p);
        admin_token(&section(None, Some(&dir.join("missing"))), None, &mut p);
        let f: Vec<_> = p.0.iter().map(|x| x.field.as_str()).collect();
        assert_eq!(f, ["admin.auth_token_file", "admin.auth_token_file"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn fenced_methods_is_refused_with_a_pointer_to_safe_methods() {
        let p = problems(&format!("{MINIMAL}fenced_methods = [\"PUT\"]\n"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].field, "route[0] 'objects'.fenced_methods");
        assert!(p[0].message.contains("safe_methods"), "{}", p[0].message);
    }

    #[test]
    fn safe_methods_are_taken_exactly_as_written() {
        let c = Config::from_toml_str(&format!("{MINIMAL}safe_methods = [\"GET\", \"get\", \"PROPFIND\"]\n")).unwrap();
        let names: Vec<_> = c.routes[0].safe_methods.iter().map(Method::as_str).collect();
        assert_eq!(names, ["GET", "get", "PROPFIND"]);
        let c = Config::from_toml_str(&format!("{MINIMAL}safe_methods = []\n")).unwrap();
        assert!(c.routes[0].safe_methods.is_empty());
    }

    #[test]
    fn path_switches_are_read_and_prefixes_must_be_canonical() {
        let text = format!(
            "{MINIMAL}escaped_slashes = \"keep\"\nmerge_slashes = false\nkey_case = \"fold\"\n\
             allow_safe_body = true\nstream_body = true\n"
        );
        let r = &Config::from_toml_str(&text).unwrap().routes[0];
        assert_eq!(r.path_options, PathOptions { merge_slashes: false, escaped_slashes: EscapedSlashes::Keep });
        assert!(r.fold_key_case && r.allow_safe_body && r.stream_body);
        let text = MINIMAL.replace("\"/objects/\"", "\"/obj%65cts/\"");
        let p = problems(&text);
        assert_eq!(p[0].field, "route[0] 'objects'.prefix");
        assert!(p[0].message.contains("'/objects/'"), "{}", p[0].message);
    }

    #[test]
    fn a_route_body_must_fit_the_buffer_budget_unless_it_streams() {
        let text = format!("[server]\nmax_buffered_bytes = \"1MiB\"\n{MINIMAL}max_body = \"2MiB\"\n");
        assert_eq!(fields(&text), ["route 'objects'.max_body"]);
        assert!(Config::from_toml_str(&format!("{text}stream_body = true\n")).is_ok());
    }

    #[test]
    fn an_unknown_store_names_the_field() {
        let text = format!("[fences]\nstore = \"etcd\"\n{MINIMAL}");
        let p = problems(&text);
        assert_eq!(p[0].field, "fences.store");
    }

    #[test]
    fn signing_keys_lose_trailing_whitespace_and_must_be_long_enough() {
        let dir = std::env::temp_dir().join(format!("fencegate-signing-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, b" 0123456789abcdef\r\n\t ").unwrap();
        assert_eq!(load_signing_key(&good).unwrap().bytes(), b" 0123456789abcdef");
        let short = dir.join("short");
        std::fs::write(&short, b"0123456789abcde\n").unwrap();
        assert!(load_signing_key(&short).unwrap_err().contains("holds 15 bytes"));
        assert!(load_signing_key(&dir.join("missing")).unwrap_err().contains("cannot read"));

        let route = |path: &Path| format!("{MINIMAL}signing_key_file = '{}'\nmax_token_jump = 1000\n", path.display());
        let c = Config::from_toml_str(&route(&good)).unwrap();
        assert_eq!(c.routes[0].signing_key.as_ref().unwrap().bytes(), b" 0123456789abcdef");
        assert_eq!(c.routes[0].max_token_jump, Some(1000));
        assert_eq!(fields(&route(&short)), ["route[0] 'objects'.signing_key_file"]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
