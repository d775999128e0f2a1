//! `FileConfig -> Config`: every section and every `[[route]]` (through
//! [`super::route`]), then the checks that span routes.
//!
//! Pure: it reads nothing but its input, so `--check`, tests and the fuzzer see
//! exactly what the server would. Secrets are read afterwards by
//! [`super::secrets`].
//!
//! | file | what it owns |
//! |---|---|
//! | `mod.rs` | the order sections are read in, `[admin]`, `[log]`, `[tracing]`, checks across routes |
//! | `server.rs` | `[server]`: limits, timeouts, the buffer budget's share, `[server.tls]` |
//! | `store.rs` | `[fences]`: the store and the fields each store takes |

mod server;
mod store;

use super::defaults::*;
use super::effective::Written;
use super::file::{AdminSection, FileConfig, LeaseTokenSection, LogSection, TracingSection};
use super::model::{AdminConfig, Config, LeaseToken, LogConfig, LogFormat, ServerConfig, TracingConfig};
use super::problems::{ConfigProblem, Problems};
use super::route::validate_route;
use super::route::RouteConfig;
use server::{connection_share, header_rate, server};
use store::fences;

/// Turns a parsed file into a typed [`Config`], or lists every problem.
///
/// The admin token is the inline `auth_token` and no route has a signing key
/// yet: those come from the secrets step.
pub(crate) fn validate(file: FileConfig) -> Result<Config, Vec<ConfigProblem>> {
    let mut p = Problems::default();
    let written = Written::new(file.clone());
    let server = server(&file.server, &mut p);
    let admin = admin(&file.admin, &mut p);
    let fences = fences(&file.fences, &mut p);
    let log = log(file.log, &mut p);
    let tracing = tracing(file.tracing, &mut p);

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
    header_rate(&server, &mut p);

    p.or(Config { server, admin, fences, log, tracing, routes, written })
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
        lease_tokens: lease_tokens(s.lease_tokens.as_deref().unwrap_or_default(), s.auth_token.as_ref(), p),
    }
}

/// `[[admin.lease_tokens]]`: each a non-empty token and at least one
/// non-empty prefix (a token for every key is `auth_token`).
fn lease_tokens(sections: &[LeaseTokenSection], admin_token: Option<&String>, p: &mut Problems) -> Vec<LeaseToken> {
    let mut tokens = Vec::with_capacity(sections.len());
    for (i, s) in sections.iter().enumerate() {
        let field = |name: &str| format!("admin.lease_tokens[{i}].{name}");
        let token = s.token.clone().filter(|t| !t.is_empty());
        if token.is_none() {
            p.add(field("token"), "a bearer token is required (a non-empty string)");
        } else if sections[..i].iter().any(|before| before.token == s.token) {
            p.add(field("token"), "the same token is given twice: give it once, with all its prefixes");
        } else if token.is_some() && token.as_ref() == admin_token {
            p.add(field("token"), "is the admin auth_token, which takes leases on every key (and changes fences)");
        }
        let prefixes = s.prefixes.clone().unwrap_or_default();
        if prefixes.is_empty() {
            p.add(field("prefixes"), "at least one key prefix is required");
        } else if prefixes.iter().any(String::is_empty) {
            p.add(field("prefixes"), "an empty prefix would cover every key: use [admin] auth_token for that");
        }
        if let Some(token) = token {
            tokens.push(LeaseToken { token, prefixes });
        }
    }
    tokens
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

fn tracing(s: TracingSection, p: &mut Problems) -> TracingConfig {
    let otlp_endpoint = s.otlp_endpoint.filter(|e| !e.is_empty()).and_then(|e| match otlp_endpoint(&e) {
        Ok(uri) => Some(uri),
        Err(why) => {
            p.add("tracing.otlp_endpoint", format!("'{}' {why}", super::redact_userinfo(&e)));
            None
        }
    });
    let sample_ratio = s.sample_ratio.unwrap_or(DEFAULT_SAMPLE_RATIO);
    if !(0.0..=1.0).contains(&sample_ratio) {
        p.add("tracing.sample_ratio", format!("{sample_ratio} is not between 0.0 and 1.0"));
    }
    let service_name = s.service_name.unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
    if service_name.is_empty() {
        p.add("tracing.service_name", "is empty; leave it out for \"fencegate\"");
    }
    TracingConfig { otlp_endpoint, sample_ratio, service_name }
}

/// The URL spans are posted to: the collector's base URL with `/v1/traces`
/// added when it has no path of its own (the OTLP/HTTP convention).
fn otlp_endpoint(text: &str) -> Result<http::Uri, &'static str> {
    let uri: http::Uri = text.parse().map_err(|_| "is not a URL")?;
    if uri.scheme() != Some(&http::uri::Scheme::HTTP) || uri.authority().is_none() {
        return Err("is not an http:// URL with a host (https is not supported: send to a local collector)");
    }
    // Credentials in the URL would never be sent, and would be shown by
    // `--print` and `GET /config`, which take this field for public.
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err("names a user or password, which are not sent: leave them out");
    }
    if matches!(uri.path(), "" | "/") && uri.query().is_none() {
        return format!("{}/v1/traces", text.trim_end_matches('/')).parse().map_err(|_| "is not a URL");
    }
    Ok(uri)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::tests::{fields, MINIMAL};
    use crate::config::Config;

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
    fn lease_tokens_need_a_token_and_prefixes_and_each_problem_names_its_field() {
        let text = format!(
            "[[admin.lease_tokens]]\nprefixes = [\"/jobs/\"]\n[[admin.lease_tokens]]\ntoken = \"t\"\n\
             [[admin.lease_tokens]]\ntoken = \"t\"\nprefixes = [\"\"]\n{MINIMAL}"
        );
        assert_eq!(
            fields(&text),
            [
                "admin.lease_tokens[0].token",
                "admin.lease_tokens[1].prefixes",
                "admin.lease_tokens[2].token",
                "admin.lease_tokens[2].prefixes"
            ]
        );
        let text = format!(
            "[admin]\nauth_token = \"t\"\n[[admin.lease_tokens]]\ntoken = \"t\"\nprefixes = [\"/j/\"]\n{MINIMAL}"
        );
        assert_eq!(fields(&text), ["admin.lease_tokens[0].token"], "the admin token is no lease token");
        let text = format!("[[admin.lease_tokens]]\ntoken = \"t\"\nprefixes = [\"/jobs/\", \"/q/\"]\n{MINIMAL}");
        let c = Config::from_toml_str(&text).unwrap();
        assert!(c.admin.lease_tokens[0].covers("/q/1") && !c.admin.lease_tokens[0].covers("/other"));
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
}
