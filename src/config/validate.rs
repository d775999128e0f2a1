//! `FileConfig -> Config`: the `[server]`, `[admin]`, `[fences]` and `[log]`
//! sections, every `[[route]]` (through [`super::route`]) and the checks that
//! span routes.
//!
//! Pure: it reads nothing but its input, so `--check`, tests and the fuzzer see
//! exactly what the server would. Secrets are read afterwards by
//! [`super::secrets`].

use std::path::PathBuf;

use super::defaults::*;
use super::file::{AdminSection, FencesSection, FileConfig, LogSection, ServerSection, TlsSection};
use super::model::{
    AdminConfig, Config, FencesConfig, LogConfig, LogFormat, RedisConfig, RefusalDrain, ServerConfig, StoreKind,
    TlsFiles,
};
use super::problems::{ConfigProblem, Problems};
use super::route::validate_route;
use super::route::RouteConfig;

/// Turns a parsed file into a typed [`Config`], or lists every problem.
///
/// The admin token is the inline `auth_token` and no route has a signing key
/// yet: those come from the secrets step.
pub(crate) fn validate(file: FileConfig) -> Result<Config, Vec<ConfigProblem>> {
    let mut p = Problems::default();
    let server = server(&file.server, &mut p);
    let admin = admin(&file.admin, &mut p);
    let fences = fences(&file.fences, &mut p);
    let log = log(file.log, &mut p);

    if file.routes.is_empty() {
        p.add("route", "no [[route]] is configured; fencegate would answer 404 to everything");
    }
    let mut routes: Vec<RouteConfig> =
        file.routes.into_iter().enumerate().filter_map(|(i, section)| validate_route(i, section, &mut p)).collect();
    for route in &mut routes {
        route.max_key_bytes = fences.max_key_bytes;
        route.underscores_in_headers = server.underscores_in_headers;
    }
    across_routes(&routes, &server, &mut p);
    let mut server = server;
    server.max_connection_buffered_bytes = connection_share(&file.server, &server, &routes, &mut p);
    if server.max_upstream_header_rate < server.max_header_bytes as u64 {
        p.add(
            "server.max_upstream_header_rate",
            format!(
                "{} bytes a second is less than server.max_header_bytes ({}): a head that large could never be sent",
                server.max_upstream_header_rate, server.max_header_bytes
            ),
        );
    }

    p.or(Config { server, admin, fences, log, routes })
}

fn server(s: &ServerSection, p: &mut Problems) -> ServerConfig {
    ServerConfig {
        listen: p.addr("server.listen", s.listen.as_deref(), DEFAULT_LISTEN),
        shutdown_grace: p.duration("server.shutdown_grace", s.shutdown_grace.as_deref(), DEFAULT_SHUTDOWN_GRACE),
        header_read_timeout: p.duration(
            "server.header_read_timeout",
            s.header_read_timeout.as_deref(),
            DEFAULT_HEADER_READ_TIMEOUT,
        ),
        max_header_bytes: match p.size("server.max_header_bytes", s.max_header_bytes.as_ref(), DEFAULT_MAX_HEADER_BYTES)
        {
            n if n < MIN_HEADER_BYTES => {
                p.add("server.max_header_bytes", format!("must be at least {MIN_HEADER_BYTES} bytes (8KiB)"));
                DEFAULT_MAX_HEADER_BYTES as usize
            }
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
        max_connections: match s.max_connections {
            None => DEFAULT_MAX_CONNECTIONS,
            Some(0) => {
                p.add("server.max_connections", "must be at least 1");
                DEFAULT_MAX_CONNECTIONS
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        },
        idle_timeout: p.duration("server.idle_timeout", s.idle_timeout.as_deref(), DEFAULT_IDLE_TIMEOUT),
        workers: match s.workers {
            None => default_workers(),
            Some(n @ 1..=MAX_WORKERS) => n as usize,
            Some(_) => {
                p.add("server.workers", format!("must be between 1 and {MAX_WORKERS}"));
                default_workers()
            }
        },
        max_buffered_bytes: p.size(
            "server.max_buffered_bytes",
            s.max_buffered_bytes.as_ref(),
            DEFAULT_MAX_BUFFERED_BYTES,
        ),
        // Set once the routes are known: see `connection_share`.
        max_connection_buffered_bytes: 0,
        max_connection_buffered_bytes_set: s.max_connection_buffered_bytes.is_some(),
        max_concurrent_streams: match s.max_concurrent_streams.unwrap_or(DEFAULT_MAX_CONCURRENT_STREAMS) {
            n @ 1..=MAX_CONCURRENT_STREAMS => n as u32,
            _ => {
                p.add("server.max_concurrent_streams", format!("must be between 1 and {MAX_CONCURRENT_STREAMS}"));
                DEFAULT_MAX_CONCURRENT_STREAMS as u32
            }
        },
        max_headers: match s.max_headers.unwrap_or(DEFAULT_MAX_HEADERS) {
            n @ MIN_HEADERS..=MAX_HEADERS => n as usize,
            _ => {
                p.add("server.max_headers", format!("must be between {MIN_HEADERS} and {MAX_HEADERS}"));
                DEFAULT_MAX_HEADERS as usize
            }
        },
        max_upstream_header_rate: p.size(
            "server.max_upstream_header_rate",
            s.max_upstream_header_rate.as_ref(),
            DEFAULT_MAX_UPSTREAM_HEADER_RATE,
        ),
        abuse_penalty: match p.duration_from(
            "server.abuse_penalty",
            s.abuse_penalty.as_deref(),
            DEFAULT_ABUSE_PENALTY,
            true,
        ) {
            d if d > MAX_ABUSE_PENALTY => {
                p.add(
                    "server.abuse_penalty",
                    format!("must be at most {}", humantime::format_duration(MAX_ABUSE_PENALTY)),
                );
                DEFAULT_ABUSE_PENALTY
            }
            d => d,
        },
        underscores_in_headers: s.underscores_in_headers.unwrap_or(false),
        refusal_drain: refusal_drain(s, p),
        tls: s.tls.as_ref().and_then(|t| tls(t, p)),
    }
}

/// `[server] refusal_drain_*`: every bound above zero, and the silence
/// within the whole time (a longer one could never be reached).
fn refusal_drain(s: &ServerSection, p: &mut Problems) -> RefusalDrain {
    let bytes = p.size("server.refusal_drain_bytes", s.refusal_drain_bytes.as_ref(), DEFAULT_REFUSAL_DRAIN_BYTES);
    let time = p.duration("server.refusal_drain_time", s.refusal_drain_time.as_deref(), DEFAULT_REFUSAL_DRAIN_TIME);
    let silence =
        p.duration("server.refusal_drain_silence", s.refusal_drain_silence.as_deref(), DEFAULT_REFUSAL_DRAIN_SILENCE);
    if silence > time {
        p.add(
            "server.refusal_drain_silence",
            format!(
                "{} is longer than server.refusal_drain_time ({}), the whole drain",
                humantime::format_duration(silence),
                humantime::format_duration(time)
            ),
        );
    }
    RefusalDrain { bytes, time, silence: silence.min(time) }
}

/// `[server.tls]`: both files named, none empty. They are read when fencegate
/// starts (and by `--check`), not here.
fn tls(t: &TlsSection, p: &mut Problems) -> Option<TlsFiles> {
    let mut path = |field: &str, value: &Option<String>, required: bool| match value.as_deref() {
        Some("") => {
            p.add(format!("server.tls.{field}"), "must not be empty");
            None
        }
        Some(path) => Some(PathBuf::from(path)),
        None => {
            if required {
                p.add(format!("server.tls.{field}"), "is required when [server.tls] is set (a PEM file)");
            }
            None
        }
    };
    let cert = path("cert", &t.cert, true);
    let key = path("key", &t.key, true);
    let client_ca = path("client_ca", &t.client_ca, false);
    Some(TlsFiles { cert: cert?, key: key?, client_ca })
}

/// `[server] max_connection_buffered_bytes`: at least the largest body a
/// route reads whole (else that body could never be held), at most the
/// whole budget. Unset, a quarter of `max_buffered_bytes`, raised to that
/// largest body, so every config valid without the field stays valid.
fn connection_share(s: &ServerSection, server: &ServerConfig, routes: &[RouteConfig], p: &mut Problems) -> u64 {
    let largest = routes.iter().filter(|r| !r.stream_body).map(|r| r.max_body).max().unwrap_or(0);
    let budget = server.max_buffered_bytes;
    let Some(size) = &s.max_connection_buffered_bytes else {
        return (budget / DEFAULT_CONNECTION_BUFFER_SHARE).max(largest).min(budget);
    };
    let field = "server.max_connection_buffered_bytes";
    match p.size(field, Some(size), budget) {
        n if n > budget => {
            p.add(field, format!("{n} bytes is more than server.max_buffered_bytes ({budget}), the whole budget"));
            budget
        }
        n if n < largest => {
            p.add(
                field,
                format!(
                    "{n} bytes is less than the largest max_body of a route that reads bodies whole ({largest}): \
                     such a body could never be held"
                ),
            );
            largest
        }
        n => n,
    }
}

fn admin(s: &AdminSection, p: &mut Problems) -> AdminConfig {
    if s.auth_token.is_some() && s.auth_token_file.is_some() {
        p.add("admin.auth_token_file", "set either auth_token or auth_token_file, not both");
    }
    AdminConfig {
        listen: p.addr("admin.listen", s.listen.as_deref(), DEFAULT_ADMIN_LISTEN),
        // An empty token means unset.
        auth_token: s.auth_token.clone().filter(|t| !t.is_empty()),
        max_connections: match s.max_connections {
            None => DEFAULT_ADMIN_MAX_CONNECTIONS,
            Some(0) => {
                p.add("admin.max_connections", "must be at least 1");
                DEFAULT_ADMIN_MAX_CONNECTIONS
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        },
    }
}

fn fences(f: &FencesSection, p: &mut Problems) -> FencesConfig {
    let max_key_bytes = p.size("fences.max_key_bytes", f.max_key_bytes.as_ref(), DEFAULT_MAX_KEY_BYTES as u64);
    FencesConfig { store: store(f, p), max_key_bytes: usize::try_from(max_key_bytes).unwrap_or(usize::MAX) }
}

fn store(f: &FencesSection, p: &mut Problems) -> StoreKind {
    let kind = f.store.as_deref().unwrap_or("file");
    // Each field names the stores it applies to.
    for (field, set, applies) in [
        ("path", f.path.is_some(), &["file"][..]),
        ("require_existing", f.require_existing.is_some(), &["file"]),
        ("cache_keys", f.cache_keys.is_some(), &["file", "redis"]),
        ("cache_bytes", f.cache_bytes.is_some(), &["file"]),
        ("url", f.url.is_some(), &["redis"]),
        ("key_prefix", f.key_prefix.is_some(), &["redis"]),
        ("timeout", f.timeout.is_some(), &["redis"]),
        ("min_replicas", f.min_replicas.is_some(), &["redis"]),
        ("replica_timeout", f.replica_timeout.is_some(), &["redis"]),
        ("ca_file", f.ca_file.is_some(), &["redis"]),
    ] {
        if set && ["file", "memory", "redis"].contains(&kind) && !applies.contains(&kind) {
            let stores = applies.iter().map(|s| format!("store = \"{s}\"")).collect::<Vec<_>>().join(" and ");
            p.add(format!("fences.{field}"), format!("applies to {stores} only, not to store = \"{kind}\""));
        }
    }
    let cache_keys = match f.cache_keys {
        None => DEFAULT_CACHE_KEYS,
        Some(0) => {
            p.add("fences.cache_keys", "must be at least 1");
            DEFAULT_CACHE_KEYS
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let store = match kind {
        "file" => StoreKind::File {
            path: PathBuf::from(f.path.as_deref().unwrap_or(DEFAULT_FENCES_PATH)),
            require_existing: f.require_existing.unwrap_or(false),
            cache_keys,
            cache_bytes: p.size("fences.cache_bytes", f.cache_bytes.as_ref(), DEFAULT_CACHE_BYTES),
        },
        "memory" => StoreKind::Memory,
        "redis" => StoreKind::Redis(redis(f, cache_keys, p)),
        other => {
            p.add(
                "fences.store",
                format!("'{other}' is not a store this build has; use \"file\", \"memory\" or \"redis\""),
            );
            StoreKind::Memory
        }
    };
    if let StoreKind::File { path, .. } = &store {
        if path.as_os_str().is_empty() {
            p.add("fences.path", "must not be empty");
        }
    }
    store
}

/// `[fences]` of `store = "redis"`.
fn redis(f: &FencesSection, cache_keys: usize, p: &mut Problems) -> RedisConfig {
    let url = match f.url.as_deref() {
        None => {
            p.add("fences.url", "is required with store = \"redis\" (e.g. \"redis://127.0.0.1:6379/0\")");
            String::new()
        }
        Some(url) => {
            if let Err(why) = check_redis_url(url) {
                p.add("fences.url", why);
            }
            url.to_owned()
        }
    };
    let key_prefix = f.key_prefix.clone().unwrap_or_else(|| DEFAULT_REDIS_KEY_PREFIX.to_owned());
    let timeout = p.duration("fences.timeout", f.timeout.as_deref(), DEFAULT_REDIS_TIMEOUT);
    let replica_timeout = p.duration("fences.replica_timeout", f.replica_timeout.as_deref(), DEFAULT_REPLICA_TIMEOUT);
    let min_replicas = match f.min_replicas {
        None => 0,
        Some(n) => u32::try_from(n).unwrap_or_else(|_| {
            p.add("fences.min_replicas", "is more replicas than Redis can have");
            0
        }),
    };
    let ca_file = f.ca_file.as_deref().map(PathBuf::from);
    if ca_file.is_some() && !url.starts_with("rediss://") {
        p.add("fences.ca_file", "applies to a rediss:// url (Redis over TLS) only");
    }
    RedisConfig { url, key_prefix, timeout, min_replicas, replica_timeout, cache_keys, ca_file }
}

fn log(s: LogSection, p: &mut Problems) -> LogConfig {
    let log = LogConfig {
        format: match s.format.as_deref() {
            None | Some("human") => LogFormat::Human,
            Some("json") => LogFormat::Json,
            Some(other) => {
                p.add("log.format", format!("'{other}' is not \"human\" or \"json\""));
                LogFormat::Human
            }
        },
        level: s.level.unwrap_or_else(|| DEFAULT_LOG_LEVEL.to_string()),
    };
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log.level) {
        p.add("log.level", format!("'{}' is not a log filter ({e})", log.level));
    }
    log
}

/// What only shows with every route in view: unique names and prefixes, and
/// bodies that fit the buffer budget.
fn across_routes(routes: &[RouteConfig], server: &ServerConfig, p: &mut Problems) {
    for r in routes {
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
}

/// Whether `url` is one the Redis client takes. The reason never repeats
/// the URL, which may carry a password.
fn check_redis_url(url: &str) -> Result<(), String> {
    match redis::Client::open(url) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "is not a Redis URL like \"redis://[user:password@]host:6379/0\" or \"rediss://...\" ({:?})",
            e.kind()
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::tests::{fields, problems, MINIMAL};
    use crate::config::{Config, StoreKind};

    #[test]
    fn sizes_are_integers_or_strings_and_bad_ones_name_their_field() {
        let text =
            format!("[server]\nmax_header_bytes = 16384\nmax_buffered_bytes = \"1GB\"\n{MINIMAL}max_body = 1048576\n");
        let c = Config::from_toml_str(&text).unwrap();
        assert_eq!(c.server.max_header_bytes, 16_384);
        assert_eq!(c.server.max_buffered_bytes, 1_000_000_000);
        assert_eq!(c.routes[0].max_body, 1 << 20);

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
        let p = problems(&format!("[server]\nmax_buffered_bytes = -1\n{MINIMAL}max_body = 0\n"));
        let f: Vec<_> = p.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(f, ["server.max_buffered_bytes", "route[0] 'objects'.max_body"]);
        assert!(p[0].message.contains("-1 is negative"), "{}", p[0].message);
        assert_eq!(p[1].message, "must be greater than zero");
        assert_eq!(fields("[server]\nmax_header_bytes = 8191\n"), ["server.max_header_bytes", "route"]);
    }

    #[test]
    fn file_store_options_are_read_and_refused_for_memory() {
        let text = format!(
            "[fences]\nstore = \"file\"\npath = \"/var/lib/f\"\nrequire_existing = true\ncache_keys = 5\n{MINIMAL}"
        );
        let c = Config::from_toml_str(&text).unwrap();
        assert_eq!(
            c.fences.store,
            StoreKind::File {
                path: "/var/lib/f".into(),
                require_existing: true,
                cache_keys: 5,
                cache_bytes: 256 << 20
            }
        );
        let text = format!("[fences]\nstore = \"memory\"\npath = \"x\"\n{MINIMAL}");
        assert_eq!(fields(&text), ["fences.path"]);
        let text = format!("[fences]\ncache_keys = 0\n{MINIMAL}");
        assert_eq!(fields(&text), ["fences.cache_keys"]);
    }

    #[test]
    fn the_connection_share_defaults_within_the_budget_and_is_checked_against_routes() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.server.max_connection_buffered_bytes, 64 << 20, "a quarter of 256MiB");
        assert_eq!((c.server.max_concurrent_streams, c.server.max_headers), (100, 100));
        assert_eq!(c.server.max_upstream_header_rate, 32 << 20);
        // Unset, never below the largest body read whole: old configs stay valid.
        let text = format!("[server]\nmax_buffered_bytes = \"1MiB\"\n{MINIMAL}max_body = \"1MiB\"\n");
        assert_eq!(Config::from_toml_str(&text).unwrap().server.max_connection_buffered_bytes, 1 << 20);
        let set = |v: &str| {
            format!("[server]\nmax_buffered_bytes = \"1MiB\"\nmax_connection_buffered_bytes = {v}\n{MINIMAL}max_body = \"64KiB\"\n")
        };
        assert_eq!(Config::from_toml_str(&set("\"128KiB\"")).unwrap().server.max_connection_buffered_bytes, 128 << 10);
        assert_eq!(fields(&set("\"2MiB\"")), ["server.max_connection_buffered_bytes"]);
        assert_eq!(fields(&set("\"32KiB\"")), ["server.max_connection_buffered_bytes"]);
        let text = format!(
            "[server]\nmax_concurrent_streams = 0\nmax_headers = 2\nmax_upstream_header_rate = \"x\"\n{MINIMAL}"
        );
        assert_eq!(
            fields(&text),
            ["server.max_concurrent_streams", "server.max_headers", "server.max_upstream_header_rate"]
        );
    }

    #[test]
    fn server_tls_names_both_files_and_a_missing_or_empty_one_names_its_field() {
        assert_eq!(Config::from_toml_str(MINIMAL).unwrap().server.tls, None);
        let set = |tls: &str| format!("[server.tls]\n{tls}\n{MINIMAL}");
        let c = Config::from_toml_str(&set("cert = 'c.pem'\nkey = 'k.pem'\nclient_ca = 'ca.pem'")).unwrap();
        assert_eq!(
            c.server.tls,
            Some(crate::config::TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: Some("ca.pem".into())
            })
        );
        assert_eq!(fields(&set("cert = 'c.pem'")), ["server.tls.key"]);
        assert_eq!(fields(&set("key = 'k.pem'\nclient_ca = ''")), ["server.tls.cert", "server.tls.client_ca"]);
        let typo = problems(&set("cert = 'c.pem'\nkey = 'k.pem'\nca = 'x'"))[0].message.clone();
        assert!(typo.contains("unknown field `ca`"), "{typo}");
    }

    #[test]
    fn the_abuse_penalty_has_a_default_may_be_off_and_a_bad_one_names_its_field() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.server.abuse_penalty, crate::config::defaults::DEFAULT_ABUSE_PENALTY);
        let set = |v: &str| format!("[server]\nabuse_penalty = {v}\n{MINIMAL}");
        assert_eq!(Config::from_toml_str(&set("\"0s\"")).unwrap().server.abuse_penalty, Duration::ZERO);
        assert_eq!(Config::from_toml_str(&set("\"30s\"")).unwrap().server.abuse_penalty, Duration::from_secs(30));
        assert_eq!(fields(&set("\"soon\"")), ["server.abuse_penalty"]);
        assert_eq!(fields(&set("\"61s\"")), ["server.abuse_penalty"]);
    }

    #[test]
    fn the_refusal_drain_has_bounds_by_default_and_a_bad_one_names_its_field() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        let drain = c.server.refusal_drain;
        assert_eq!(
            (drain.bytes, drain.time, drain.silence),
            (64 << 20, Duration::from_secs(30), Duration::from_secs(5))
        );
        let set = |lines: &str| format!("[server]\n{lines}\n{MINIMAL}");
        let c = Config::from_toml_str(&set(
            "refusal_drain_bytes = \"1MiB\"\nrefusal_drain_time = \"2s\"\nrefusal_drain_silence = \"500ms\"",
        ))
        .unwrap();
        let drain = c.server.refusal_drain;
        assert_eq!(
            (drain.bytes, drain.time, drain.silence),
            (1 << 20, Duration::from_secs(2), Duration::from_millis(500))
        );
        assert_eq!(
            fields(&set("refusal_drain_bytes = 0\nrefusal_drain_time = \"0s\"\nrefusal_drain_silence = \"x\"")),
            ["server.refusal_drain_bytes", "server.refusal_drain_time", "server.refusal_drain_silence"]
        );
        // A silence longer than the whole drain could never be reached.
        assert_eq!(
            fields(&set("refusal_drain_time = \"1s\"\nrefusal_drain_silence = \"2s\"")),
            ["server.refusal_drain_silence"]
        );
    }

    #[test]
    fn key_and_cache_byte_bounds_are_read_and_checked() {
        use crate::config::defaults::DEFAULT_MAX_KEY_BYTES;
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.fences.max_key_bytes, DEFAULT_MAX_KEY_BYTES);
        assert!(c.routes.iter().all(|r| r.max_key_bytes == DEFAULT_MAX_KEY_BYTES));
        let text = format!("[fences]\nmax_key_bytes = \"2KiB\"\ncache_bytes = \"1MiB\"\n{MINIMAL}");
        let c = Config::from_toml_str(&text).unwrap();
        assert_eq!(c.fences.max_key_bytes, 2048);
        assert!(c.routes.iter().all(|r| r.max_key_bytes == 2048));
        assert!(matches!(c.fences.store, StoreKind::File { cache_bytes: 1_048_576, .. }));
        let text = format!("[fences]\nmax_key_bytes = 0\ncache_bytes = 0\n{MINIMAL}");
        assert_eq!(fields(&text), ["fences.max_key_bytes", "fences.cache_bytes"]);
        let text = format!("[fences]\nstore = \"memory\"\ncache_bytes = 5\nmax_key_bytes = 64\n{MINIMAL}");
        assert_eq!(fields(&text), ["fences.cache_bytes"]);
    }

    #[test]
    fn connection_caps_have_defaults_and_refuse_zero_by_name() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.admin.max_connections, 64);
        assert_eq!(c.routes[0].max_upstream_connections, 256);
        let c =
            Config::from_toml_str(&format!("[admin]\nmax_connections = 3\n{MINIMAL}max_upstream_connections = 5\n"))
                .unwrap();
        assert_eq!((c.admin.max_connections, c.routes[0].max_upstream_connections), (3, 5));
        let text = format!("[admin]\nmax_connections = 0\n{MINIMAL}max_upstream_connections = 0\n");
        assert_eq!(fields(&text), ["admin.max_connections", "route[0] 'objects'.max_upstream_connections"]);
    }

    #[test]
    fn upstream_idle_timeout_has_a_default_and_refuses_zero_by_name() {
        let c = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(c.routes[0].upstream_idle_timeout, Duration::from_secs(60));
        let c = Config::from_toml_str(&format!("{MINIMAL}upstream_idle_timeout = \"5s\"\n")).unwrap();
        assert_eq!(c.routes[0].upstream_idle_timeout, Duration::from_secs(5));
        let text = format!("{MINIMAL}upstream_idle_timeout = \"0s\"\n");
        assert_eq!(fields(&text), ["route[0] 'objects'.upstream_idle_timeout"]);
    }

    #[test]
    fn an_unknown_store_names_the_field() {
        let text = format!("[fences]\nstore = \"etcd\"\n{MINIMAL}");
        let p = problems(&text);
        assert_eq!(p[0].field, "fences.store");
    }

    #[test]
    fn an_inline_admin_token_and_a_token_file_are_not_both_allowed() {
        let text = format!("[admin]\nauth_token = \"a\"\nauth_token_file = \"/x\"\n{MINIMAL}");
        assert_eq!(fields(&text), ["admin.auth_token_file"]);
        let c = Config::from_toml_str(&format!("[admin]\nauth_token = \"\"\n{MINIMAL}")).unwrap();
        assert_eq!(c.admin.auth_token, None, "an empty token means unset");
    }

    #[test]
    fn a_route_body_must_fit_the_buffer_budget_unless_it_streams() {
        let text = format!("[server]\nmax_buffered_bytes = \"1MiB\"\n{MINIMAL}max_body = \"2MiB\"\n");
        assert_eq!(fields(&text), ["route 'objects'.max_body"]);
        assert!(Config::from_toml_str(&format!("{text}stream_body = true\n")).is_ok());
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
    fn the_redis_store_takes_its_fields_and_defaults() {
        let c =
            Config::from_toml_str(&format!("[fences]\nstore = \"redis\"\nurl = \"redis://u:p@r:6380/2\"\n{MINIMAL}"))
                .unwrap();
        let StoreKind::Redis(r) = &c.fences.store else { panic!("{:?}", c.fences.store) };
        assert_eq!(r.url, "redis://u:p@r:6380/2");
        assert_eq!(r.key_prefix, "fencegate:");
        assert_eq!(r.timeout, std::time::Duration::from_millis(250));
        assert_eq!((r.min_replicas, r.replica_timeout), (0, std::time::Duration::from_millis(250)));
        assert_eq!(r.cache_keys, 1_000_000);
        // The password never reaches a log through Debug.
        assert!(!format!("{r:?}").contains("u:p@"));
        let c = Config::from_toml_str(&format!(
            "[fences]\nstore = \"redis\"\nurl = \"rediss://r\"\nkey_prefix = \"fg:a:\"\ntimeout = \"1s\"\n\
             min_replicas = 2\nreplica_timeout = \"50ms\"\ncache_keys = 7\n{MINIMAL}"
        ))
        .unwrap();
        let StoreKind::Redis(r) = &c.fences.store else { panic!() };
        assert_eq!((r.key_prefix.as_str(), r.min_replicas, r.cache_keys), ("fg:a:", 2, 7));
        assert_eq!(
            (r.timeout, r.replica_timeout),
            (std::time::Duration::from_secs(1), std::time::Duration::from_millis(50))
        );
    }

    #[test]
    fn redis_fields_name_themselves_when_wrong_or_misplaced() {
        let fields_of = |fences: &str| -> Vec<String> {
            match Config::from_toml_str(&format!("[fences]\n{fences}\n{MINIMAL}")) {
                Ok(_) => vec![],
                Err(e) => e.problems.iter().map(|p| p.field.clone()).collect(),
            }
        };
        assert_eq!(fields_of("store = \"redis\""), ["fences.url"]);
        assert_eq!(fields_of("store = \"redis\"\nurl = \"http://x\""), ["fences.url"]);
        assert_eq!(fields_of("store = \"redis\"\nurl = \"redis://x\"\ntimeout = \"soon\""), ["fences.timeout"]);
        assert_eq!(fields_of("store = \"redis\"\nurl = \"redis://x\"\npath = \"d\""), ["fences.path"]);
        assert_eq!(fields_of("store = \"file\"\nurl = \"redis://x\""), ["fences.url"]);
        assert_eq!(fields_of("store = \"memory\"\nmin_replicas = 1"), ["fences.min_replicas"]);
        assert_eq!(fields_of("store = \"memory\"\ncache_keys = 5"), ["fences.cache_keys"]);
        // A bad URL's message never repeats it: it may carry a password.
        let e =
            Config::from_toml_str(&format!("[fences]\nstore = \"redis\"\nurl = \"redis://u:secret@[x\"\n{MINIMAL}"))
                .unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
