//! The configuration in force, as `fencegate --config F --print` and the
//! admin listener's `GET /config` show it (as `nginx -T` and Envoy's config
//! dump do): every field of the file, defaults filled in with the values the
//! running process uses, secrets redacted.
//!
//! It is the file's own shape ([`FileConfig`]), so the TOML printed parses
//! back as a config, and the same config, once its redacted secrets are put
//! back. Numbers, durations, switches and addresses come from the validated
//! [`Config`] (so a derived value, like `workers` or an unset
//! `max_connection_buffered_bytes`, shows as the process computed it); what
//! the validated model keeps only in parsed form (a route's `upstream`,
//! `key`, `pattern` and the files it names) comes from the file as written,
//! which validation accepted as is.
//!
//! Redacted, as [`REDACTED`]: `[admin] auth_token`, each
//! `[[admin.lease_tokens]]` token, `[fences] password`, and the password of
//! a `[fences] url` (`redis://user:<redacted>@host`). Files are shown by
//! their path (TLS keys, signing keys, the admin token file), never read.
//! [`SECRET_FIELDS`] lists them, and a test fails for any field of the file
//! that is in neither it nor [`PUBLIC_FIELDS`], so a new secret cannot be
//! shown by mistake.

use std::path::Path;
use std::time::Duration;

use super::file::{
    AdminSection, FencesSection, FileConfig, LeaseTokenSection, LogSection, RouteSection, ServerSection, TlsSection,
    TracingSection,
};
use super::model::{Config, LogFormat, StoreKind};
use super::route::RouteConfig;
use super::size::Size;
use crate::canonical::{EscapedSlashes, NonUtf8};

/// What a secret's value is replaced with.
pub const REDACTED: &str = "<redacted>";

/// Every field whose value is a secret, as `section.field` (a route's as
/// `route.field`, a lease token's as `admin.lease_tokens.token`).
pub const SECRET_FIELDS: [&str; 4] = ["admin.auth_token", "admin.lease_tokens.token", "fences.password", "fences.url"];

/// Every other field: shown as it is in force. A field in neither list fails
/// a test, so whoever adds one says which it is.
pub const PUBLIC_FIELDS: [&str; 83] = [
    "server.listen",
    "server.shutdown_grace",
    "server.header_read_timeout",
    "server.max_header_bytes",
    "server.max_connections",
    "server.idle_timeout",
    "server.workers",
    "server.max_buffered_bytes",
    "server.max_connection_buffered_bytes",
    "server.max_concurrent_streams",
    "server.max_headers",
    "server.max_upstream_header_rate",
    "server.abuse_penalty",
    "server.underscores_in_headers",
    "server.refusal_drain_bytes",
    "server.refusal_drain_time",
    "server.refusal_drain_silence",
    "server.proxy_protocol",
    "server.trusted_proxies",
    "server.tls",
    "server.tls.cert",
    "server.tls.key",
    "server.tls.client_ca",
    "admin.listen",
    "admin.auth_token_file",
    "admin.max_connections",
    "admin.lease_tokens",
    "admin.lease_tokens.prefixes",
    "fences.store",
    "fences.path",
    "fences.require_existing",
    "fences.cache_keys",
    "fences.cache_bytes",
    "fences.max_key_bytes",
    "fences.key_prefix",
    "fences.timeout",
    "fences.min_replicas",
    "fences.replica_timeout",
    "fences.ca_file",
    "fences.endpoints",
    "fences.cert_file",
    "fences.key_file",
    "fences.user",
    "log.format",
    "log.level",
    "tracing.otlp_endpoint",
    "tracing.sample_ratio",
    "tracing.service_name",
    "route.name",
    "route.prefix",
    "route.upstream",
    "route.pattern",
    "route.key",
    "route.fenced_methods",
    "route.safe_methods",
    "route.escaped_slashes",
    "route.merge_slashes",
    "route.non_utf8",
    "route.key_case",
    "route.allow_safe_body",
    "route.stream_body",
    "route.unfenced_tunnels",
    "route.missing_token",
    "route.timeout",
    "route.queue_timeout",
    "route.settle",
    "route.token_header",
    "route.preserve_host",
    "route.max_body",
    "route.signing_key_file",
    "route.max_token_jump",
    "route.strict",
    "route.max_upstream_connections",
    "route.upstream_idle_timeout",
    "route.upstream_http2",
    "route.ca_file",
    "route.client_cert",
    "route.client_key",
    "server",
    "admin",
    "fences",
    "log",
    "tracing",
];

/// The file a [`Config`] was validated from, kept to show what the model
/// holds only parsed. Its `Debug` shows nothing: it holds the secrets as written.
#[derive(Clone, Default)]
pub struct Written(std::sync::Arc<FileConfig>);

impl Written {
    pub(super) fn new(file: FileConfig) -> Written {
        Written(std::sync::Arc::new(file))
    }
}

impl std::fmt::Debug for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Written(..)")
    }
}

impl Config {
    /// The configuration in force, every field filled in, secrets redacted.
    pub fn effective(&self) -> FileConfig {
        let written = &self.written.0;
        FileConfig {
            server: self.effective_server(),
            admin: self.effective_admin(&written.admin),
            fences: self.effective_fences(),
            log: LogSection {
                format: Some(
                    match self.log.format {
                        LogFormat::Human => "human",
                        LogFormat::Json => "json",
                    }
                    .into(),
                ),
                level: Some(self.log.level.clone()),
            },
            // The endpoint as spans are posted to it (`/v1/traces` added):
            // printed back, it names the same URL. It holds no secret, as
            // validation refuses a user or password in it.
            tracing: TracingSection {
                otlp_endpoint: self.tracing.otlp_endpoint.as_ref().map(ToString::to_string),
                sample_ratio: Some(self.tracing.sample_ratio),
                service_name: Some(self.tracing.service_name.clone()),
            },
            routes: self
                .routes
                .iter()
                .enumerate()
                .map(|(i, route)| effective_route(route, written.routes.get(i).cloned().unwrap_or_default()))
                .collect(),
        }
    }

    /// [`effective`](Self::effective) as TOML: what `--print` writes.
    pub fn effective_toml(&self) -> String {
        toml::to_string(&self.effective()).unwrap_or_else(|e| format!("# the configuration cannot be shown: {e}\n"))
    }

    /// [`effective`](Self::effective) as JSON: what `GET /config` answers.
    pub fn effective_json(&self) -> serde_json::Value {
        serde_json::to_value(self.effective()).unwrap_or_default()
    }

    fn effective_server(&self) -> ServerSection {
        let s = &self.server;
        ServerSection {
            listen: Some(s.listen.to_string()),
            shutdown_grace: duration(s.shutdown_grace),
            header_read_timeout: duration(s.header_read_timeout),
            max_header_bytes: size(s.max_header_bytes as u64),
            max_connections: Some(s.max_connections as u64),
            idle_timeout: duration(s.idle_timeout),
            workers: Some(s.workers as u64),
            max_buffered_bytes: size(s.max_buffered_bytes),
            max_connection_buffered_bytes: size(s.max_connection_buffered_bytes),
            max_concurrent_streams: Some(u64::from(s.max_concurrent_streams)),
            max_headers: Some(s.max_headers as u64),
            max_upstream_header_rate: size(s.max_upstream_header_rate),
            abuse_penalty: duration(s.abuse_penalty),
            underscores_in_headers: Some(s.underscores_in_headers),
            refusal_drain_bytes: size(s.refusal_drain.bytes),
            refusal_drain_time: duration(s.refusal_drain.time),
            refusal_drain_silence: duration(s.refusal_drain.silence),
            proxy_protocol: Some(s.proxy_protocol.as_str().into()),
            trusted_proxies: Some(s.trusted_proxies.iter().map(ToString::to_string).collect()),
            tls: s.tls.as_ref().map(|tls| TlsSection {
                cert: Some(path(&tls.cert)),
                key: Some(path(&tls.key)),
                client_ca: tls.client_ca.as_deref().map(path),
            }),
        }
    }

    fn effective_admin(&self, written: &AdminSection) -> AdminSection {
        let a = &self.admin;
        // A token read from a file shows as the file's path; one written
        // inline or given by the environment, as redacted.
        let from_file = a.auth_token.is_some() && written.auth_token_file.is_some();
        AdminSection {
            listen: Some(a.listen.to_string()),
            auth_token: a.auth_token.as_ref().filter(|_| !from_file).map(|_| REDACTED.into()),
            auth_token_file: written.auth_token_file.clone().filter(|_| from_file),
            max_connections: Some(a.max_connections as u64),
            lease_tokens: Some(
                a.lease_tokens
                    .iter()
                    .map(|t| LeaseTokenSection { token: Some(REDACTED.into()), prefixes: Some(t.prefixes.clone()) })
                    .collect(),
            ),
        }
    }

    fn effective_fences(&self) -> FencesSection {
        let mut f = FencesSection { max_key_bytes: size(self.fences.max_key_bytes as u64), ..Default::default() };
        match &self.fences.store {
            StoreKind::Memory => f.store = Some("memory".into()),
            StoreKind::File { path: dir, require_existing, cache_keys, cache_bytes } => {
                f.store = Some("file".into());
                f.path = Some(path(dir));
                f.require_existing = Some(*require_existing);
                f.cache_keys = Some(*cache_keys as u64);
                f.cache_bytes = size(*cache_bytes);
            }
            StoreKind::Redis(redis) => {
                f.store = Some("redis".into());
                f.url = Some(redact_password(&redis.url));
                f.key_prefix = Some(redis.key_prefix.clone());
                f.timeout = duration(redis.timeout);
                f.min_replicas = Some(u64::from(redis.min_replicas));
                f.replica_timeout = duration(redis.replica_timeout);
                f.cache_keys = Some(redis.cache_keys as u64);
                f.ca_file = redis.ca_file.as_deref().map(path);
            }
            StoreKind::Etcd(etcd) => {
                f.store = Some("etcd".into());
                f.endpoints = Some(etcd.endpoints.clone());
                f.key_prefix = Some(etcd.key_prefix.clone());
                f.timeout = duration(etcd.timeout);
                f.cache_keys = Some(etcd.cache_keys as u64);
                f.ca_file = etcd.ca_file.as_deref().map(path);
                f.cert_file = etcd.client_identity.as_ref().map(|(cert, _)| path(cert));
                f.key_file = etcd.client_identity.as_ref().map(|(_, key)| path(key));
                f.user = etcd.credentials.as_ref().map(|(user, _)| user.clone());
                f.password = etcd.credentials.as_ref().map(|_| REDACTED.into());
            }
        }
        f
    }
}

fn effective_route(r: &RouteConfig, written: RouteSection) -> RouteSection {
    let files = r.upstream_tls.as_ref().map(|tls| tls.files());
    let file = |f: fn(&crate::config::UpstreamTlsFiles) -> &Option<std::path::PathBuf>| {
        files.and_then(|files| f(files).as_deref().map(path))
    };
    RouteSection {
        name: Some(r.name.to_string()),
        prefix: Some(r.prefix.clone()),
        upstream: written.upstream,
        pattern: r.key.pattern().map(|p| p.source().to_string()),
        key: Some(written.key.unwrap_or_else(|| super::defaults::DEFAULT_KEY.into())),
        fenced_methods: None,
        safe_methods: Some(r.safe_methods.iter().map(|m| m.as_str().to_string()).collect()),
        escaped_slashes: Some(
            match r.path_options.escaped_slashes {
                EscapedSlashes::Reject => "reject",
                EscapedSlashes::Keep => "keep",
            }
            .into(),
        ),
        merge_slashes: Some(r.path_options.merge_slashes),
        non_utf8: Some(
            match r.path_options.non_utf8 {
                NonUtf8::Reject => "reject",
                NonUtf8::Raw => "raw",
            }
            .into(),
        ),
        key_case: Some(if r.fold_key_case { "fold" } else { "exact" }.into()),
        allow_safe_body: Some(r.allow_safe_body),
        stream_body: Some(r.stream_body),
        unfenced_tunnels: Some(r.unfenced_tunnels),
        missing_token: Some(if r.allow_missing_token { "allow" } else { "reject" }.into()),
        timeout: duration(r.timeout),
        queue_timeout: duration(r.queue_timeout),
        settle: duration(r.settle),
        token_header: Some(r.token_header.as_str().into()),
        preserve_host: Some(r.preserve_host),
        max_body: size(r.max_body),
        signing_key_file: written.signing_key_file,
        max_token_jump: r.max_token_jump,
        strict: Some(r.strict),
        max_upstream_connections: Some(r.max_upstream_connections as u64),
        upstream_idle_timeout: duration(r.upstream_idle_timeout),
        upstream_http2: Some(r.upstream_http2),
        ca_file: file(|f| &f.ca_file).or(written.ca_file),
        client_cert: file(|f| &f.client_cert).or(written.client_cert),
        client_key: file(|f| &f.client_key).or(written.client_key),
    }
}

fn duration(d: Duration) -> Option<String> {
    Some(humantime::format_duration(d).to_string())
}

fn size(bytes: u64) -> Option<Size> {
    Some(Size::Bytes(bytes))
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `url` with the password of its userinfo (`scheme://user:password@`)
/// replaced by [`REDACTED`]; the user, host and database stay.
fn redact_password(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else { return url.to_string() };
    let authority_end = url[start..].find('/').map_or(url.len(), |i| start + i);
    let Some(at) = url[start..authority_end].rfind('@').map(|i| start + i) else { return url.to_string() };
    match url[start..at].find(':') {
        Some(colon) => format!("{}:{REDACTED}{}", &url[..start + colon], &url[at..]),
        // A user without a password: nothing secret.
        None => url.to_string(),
    }
}

#[cfg(test)]
#[path = "effective_tests.rs"]
mod tests;
