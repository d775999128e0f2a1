//! The config file as written: serde structs that mirror the TOML one to one.
//!
//! Every struct denies unknown fields, so a typo fails loudly and names the field
//! instead of silently falling back to a default. Values stay close to their text
//! form here (durations and addresses are strings, sizes a [`Size`] as written);
//! validation turns them into typed values and reports every problem at once.
//!
//! The same structs, serialized, are the effective configuration that
//! `fencegate --print` and the admin `GET /config` show (effective.rs).

use serde::{Deserialize, Serialize};

use super::size::Size;

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub admin: AdminSection,
    #[serde(default)]
    pub fences: FencesSection,
    #[serde(default)]
    pub log: LogSection,
    #[serde(default)]
    pub tracing: TracingSection,
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteSection>,
}

/// `[server]`: the proxy listener.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub listen: Option<String>,
    pub shutdown_grace: Option<String>,
    pub header_read_timeout: Option<String>,
    pub max_header_bytes: Option<Size>,
    pub max_connections: Option<u64>,
    pub idle_timeout: Option<String>,
    pub workers: Option<u64>,
    pub max_buffered_bytes: Option<Size>,
    pub max_connection_buffered_bytes: Option<Size>,
    pub max_concurrent_streams: Option<u64>,
    pub max_headers: Option<u64>,
    pub max_upstream_header_rate: Option<Size>,
    pub abuse_penalty: Option<String>,
    pub underscores_in_headers: Option<bool>,
    pub refusal_drain_bytes: Option<Size>,
    pub refusal_drain_time: Option<String>,
    pub refusal_drain_silence: Option<String>,
    pub proxy_protocol: Option<String>,
    pub trusted_proxies: Option<Vec<String>>,
    pub tls: Option<TlsSection>,
}

/// `[server.tls]`: TLS for client connections.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub client_ca: Option<String>,
}

/// `[admin]`: health, readiness, metrics.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    pub listen: Option<String>,
    pub auth_token: Option<String>,
    pub auth_token_file: Option<String>,
    pub max_connections: Option<u64>,
    pub lease_tokens: Option<Vec<LeaseTokenSection>>,
}

/// `[[admin.lease_tokens]]`: a bearer token for the lease API on some keys.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseTokenSection {
    pub token: Option<String>,
    pub prefixes: Option<Vec<String>>,
}

/// `[fences]`: where marks are kept.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FencesSection {
    pub store: Option<String>,
    pub path: Option<String>,
    pub require_existing: Option<bool>,
    pub cache_keys: Option<u64>,
    pub cache_bytes: Option<Size>,
    pub max_key_bytes: Option<Size>,
    pub url: Option<String>,
    pub key_prefix: Option<String>,
    pub timeout: Option<String>,
    pub min_replicas: Option<u64>,
    pub replica_timeout: Option<String>,
    pub ca_file: Option<String>,
    pub endpoints: Option<Vec<String>>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
}

/// `[log]`: tracing output.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    pub format: Option<String>,
    pub level: Option<String>,
}

/// `[tracing]`: OpenTelemetry traces over OTLP.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TracingSection {
    pub otlp_endpoint: Option<String>,
    pub sample_ratio: Option<f64>,
    pub service_name: Option<String>,
}

/// One `[[route]]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    pub name: Option<String>,
    pub prefix: Option<String>,
    pub upstream: Option<String>,
    pub pattern: Option<String>,
    pub key: Option<String>,
    /// Replaced by `safe_methods`; still read so the problem can say so.
    #[serde(skip_serializing)]
    pub fenced_methods: Option<toml::Value>,
    pub safe_methods: Option<Vec<String>>,
    pub escaped_slashes: Option<String>,
    pub merge_slashes: Option<bool>,
    pub non_utf8: Option<String>,
    pub key_case: Option<String>,
    pub allow_safe_body: Option<bool>,
    pub stream_body: Option<bool>,
    pub unfenced_tunnels: Option<bool>,
    pub missing_token: Option<String>,
    pub timeout: Option<String>,
    pub queue_timeout: Option<String>,
    pub settle: Option<String>,
    pub token_header: Option<String>,
    pub preserve_host: Option<bool>,
    pub max_body: Option<Size>,
    pub signing_key_file: Option<String>,
    pub max_token_jump: Option<u64>,
    pub strict: Option<bool>,
    pub max_upstream_connections: Option<u64>,
    pub upstream_idle_timeout: Option<String>,
    pub upstream_http2: Option<bool>,
    pub ca_file: Option<String>,
    pub client_cert: Option<String>,
    pub client_key: Option<String>,
}
