//! Validating one `[[route]]` table into a [`RouteConfig`] through the
//! parsers of its parts (the upstream's URL, the path pattern, the key
//! template), with every problem named by the route's index and name.
//!
//! The route's `signing_key_file`, and an https upstream's `ca_file`,
//! `client_cert` and `client_key`, are only named here; reading them is
//! [`crate::config::secrets`]' job, so validation never touches the disk.

use std::path::PathBuf;

use http::{HeaderName, Method};

use super::{KeyTemplate, PathPattern, RouteConfig, UpstreamUrl};
use crate::canonical::{canonical_path, EscapedSlashes, NonUtf8, PathOptions};
use crate::config::defaults::*;
use crate::config::file::RouteSection;
use crate::config::problems::Problems;
use crate::config::signing_key::SigningKey;
use crate::config::tls::{UpstreamTls, UpstreamTlsFiles};

/// How problems of the route at index `i` are labelled: `route[1] 'objects'`,
/// or `route[1]` when it has no name.
pub(in crate::config) fn route_label(i: usize, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("route[{i}] '{name}'"),
        None => format!("route[{i}]"),
    }
}

/// The route at index `i`, or `None` after recording why it is unusable.
pub(in crate::config) fn validate_route(i: usize, s: RouteSection, p: &mut Problems) -> Option<RouteConfig> {
    let label = route_label(i, s.name.as_deref());
    let field = |f: &str| format!("{label}.{f}");
    let before = p.count();

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
    let upstream = match s.upstream.as_deref().map(UpstreamUrl::parse) {
        Some(Ok(u)) => Some(u),
        Some(Err(e)) => {
            p.add(field("upstream"), e.to_string());
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
        Some(Err(e)) => {
            p.add(field("pattern"), e.to_string());
            None
        }
        None => None,
    };
    let key_text = s.key.as_deref().unwrap_or(DEFAULT_KEY);
    let key = match KeyTemplate::parse(key_text, pattern.as_ref()) {
        Ok(k) => Some(k),
        Err(e) => {
            p.add(field("key"), e.to_string());
            None
        }
    };
    // What the fence reads must reach the upstream as it was read: a key made
    // from a field fencegate rewrites would fence one resource under keys the
    // client picks.
    if let Some(key) = &key {
        for name in rewritten_fields() {
            if key.reads_header(&name) {
                p.add(field("key"), format!("'{key_text}': {{header.{name}}} {REWRITTEN}"));
            }
        }
    }
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
    let non_utf8 = match s.non_utf8.as_deref() {
        None | Some("reject") => NonUtf8::Reject,
        Some("raw") => NonUtf8::Raw,
        Some(other) => {
            p.add(field("non_utf8"), format!("'{other}' is not \"reject\" or \"raw\""));
            NonUtf8::Reject
        }
    };
    let key = key.map(|k| k.with_non_utf8(non_utf8));
    let path_options = PathOptions { merge_slashes: s.merge_slashes.unwrap_or(true), escaped_slashes, non_utf8 };
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
        Ok(h) if rewritten_fields().any(|name| name == h) => {
            p.add(field("token_header"), format!("'{token_header_text}' {REWRITTEN}"));
            None
        }
        Ok(h) => Some(h),
        Err(_) => {
            p.add(field("token_header"), format!("'{token_header_text}' is not a valid header name"));
            None
        }
    };
    let max_body = p.size(&field("max_body"), s.max_body.as_ref(), DEFAULT_MAX_BODY);
    let upstream_idle_timeout =
        p.duration(&field("upstream_idle_timeout"), s.upstream_idle_timeout.as_deref(), DEFAULT_UPSTREAM_IDLE_TIMEOUT);
    let named = [("ca_file", &s.ca_file), ("client_cert", &s.client_cert), ("client_key", &s.client_key)];
    let upstream_http2 = s.upstream_http2.unwrap_or(false);
    let upstream_tls = upstream_tls(named, upstream.as_ref(), upstream_http2, &field, p);
    let max_upstream_connections = match s.max_upstream_connections {
        None => DEFAULT_MAX_UPSTREAM_CONNECTIONS,
        Some(0) => {
            p.add(field("max_upstream_connections"), "must be at least 1");
            DEFAULT_MAX_UPSTREAM_CONNECTIONS
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };

    if p.count() != before {
        return None;
    }
    Some(RouteConfig {
        name: name.into(),
        prefix,
        upstream: upstream?,
        upstream_tls,
        upstream_http2,
        key: key?,
        safe_methods,
        path_options,
        fold_key_case,
        allow_safe_body: s.allow_safe_body.unwrap_or(false),
        stream_body: s.stream_body.unwrap_or(false),
        unfenced_tunnels: s.unfenced_tunnels.unwrap_or(false),
        // The `[server]` value; set for every route once that section is read.
        underscores_in_headers: false,
        allow_missing_token,
        timeout,
        queue_timeout,
        settle,
        token_header: token_header?,
        preserve_host: s.preserve_host.unwrap_or(false),
        max_body,
        // Read after validation, from `signing_key_file`, by the secrets step;
        // until then the route refuses every signature.
        signing_key: s.signing_key_file.as_ref().map(|_| SigningKey::unread()),
        max_token_jump: s.max_token_jump,
        strict: s.strict.unwrap_or(false),
        // The `[fences]` value; set for every route once that section is read.
        max_key_bytes: DEFAULT_MAX_KEY_BYTES,
        max_upstream_connections,
        upstream_idle_timeout,
    })
}

/// An https upstream's TLS, its files named (not read); `None` for an http
/// upstream, which may name none of them.
/// `named` is `ca_file`, `client_cert` and `client_key`, in that order.
fn upstream_tls(
    named: [(&str, &Option<String>); 3],
    upstream: Option<&UpstreamUrl>,
    http2: bool,
    field: &dyn Fn(&str) -> String,
    p: &mut Problems,
) -> Option<UpstreamTls> {
    let [ca_file, client_cert, client_key] = named.map(|(name, value)| match value.as_deref() {
        Some("") => {
            p.add(field(name), "must not be empty");
            None
        }
        Some(path) => Some(PathBuf::from(path)),
        None => None,
    });
    match (named[1].1, named[2].1) {
        (Some(_), None) => {
            p.add(field("client_key"), "is required with client_cert (the certificate's PEM private key)")
        }
        (None, Some(_)) => {
            p.add(field("client_cert"), "is required with client_key (the PEM certificate it goes with)")
        }
        _ => {}
    }
    let upstream = upstream?;
    if !upstream.is_tls() {
        for (name, value) in named {
            if value.is_some() {
                p.add(field(name), "applies to https:// upstreams only; this route's upstream is http://");
            }
        }
        return None;
    }
    let files = UpstreamTlsFiles { ca_file, client_cert, client_key };
    // `UpstreamUrl::parse` has checked the name of an https upstream.
    let name = upstream.server_name().ok()?;
    Some(UpstreamTls::named(name, files, http2))
}

/// Why a key or token may not be read from a field fencegate rewrites.
const REWRITTEN: &str = "is a field fencegate removes or sets on the way to the upstream (a hop-by-hop field or \
                         X-Forwarded-*): the upstream would not get what the fence read";

/// The fields fencegate removes or sets on the way to the upstream.
fn rewritten_fields() -> impl Iterator<Item = HeaderName> {
    super::HOP_BY_HOP.into_iter().chain(super::FORWARDED).map(HeaderName::from_static)
}

#[cfg(test)]
mod tests {
    use http::Method;

    use crate::canonical::{EscapedSlashes, NonUtf8, PathOptions};
    use crate::config::tests::{fields, problems, MINIMAL};
    use crate::config::Config;

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
        assert!(msg("ftp://x").contains("https://"), "{}", msg("ftp://x"));
        assert!(msg("https://store..example").contains("certificate"), "{}", msg("https://store..example"));
        assert!(msg("http://").contains("not a URL"), "{}", msg("http://"));
        assert!(msg("http:///x").contains("not a URL") || msg("http:///x").contains("host"), "{}", msg("http:///x"));
        assert!(msg("http://x/base?q=1").contains("query"), "{}", msg("http://x/base?q=1"));
    }

    #[test]
    fn tls_files_belong_to_https_upstreams_and_name_their_field() {
        let https = MINIMAL.replace("http://127.0.0.1:9000", "https://store.example");
        let c = Config::from_toml_str(&https).unwrap();
        let tls = c.routes[0].upstream_tls.as_ref().expect("an https upstream has TLS");
        assert!(!tls.is_read(), "validation reads no file");
        assert_eq!(tls.files(), &crate::config::UpstreamTlsFiles::default());
        assert!(Config::from_toml_str(MINIMAL).unwrap().routes[0].upstream_tls.is_none());

        let set = |text: &str, fields: &str| format!("{text}{fields}\n");
        let c = Config::from_toml_str(&set(&https, "ca_file = 'ca.pem'\nclient_cert = 'c.pem'\nclient_key = 'k.pem'"))
            .unwrap();
        let files = c.routes[0].upstream_tls.as_ref().unwrap().files();
        assert_eq!(files.ca_file.as_deref(), Some(std::path::Path::new("ca.pem")));
        assert_eq!(files.client_key.as_deref(), Some(std::path::Path::new("k.pem")));

        assert_eq!(fields(&set(&https, "client_cert = 'c.pem'")), ["route[0] 'objects'.client_key"]);
        assert_eq!(fields(&set(&https, "client_key = 'k.pem'")), ["route[0] 'objects'.client_cert"]);
        assert_eq!(fields(&set(&https, "ca_file = ''")), ["route[0] 'objects'.ca_file"]);
        let on_http = problems(&set(MINIMAL, "ca_file = 'ca.pem'\nclient_cert = 'c.pem'\nclient_key = 'k.pem'"));
        let f: Vec<_> = on_http.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            f,
            ["route[0] 'objects'.ca_file", "route[0] 'objects'.client_cert", "route[0] 'objects'.client_key"]
        );
        assert!(on_http[0].message.contains("https:// upstreams only"), "{}", on_http[0].message);
    }

    #[test]
    fn tls_files_are_read_with_the_secrets_and_a_missing_one_names_its_field() {
        let text = MINIMAL.replace("http://127.0.0.1:9000", "https://127.0.0.1:9443")
            + "ca_file = '/nonexistent/fencegate/ca.pem'\n";
        let err = Config::from_toml_str(&text).unwrap().read_secrets_with(None).unwrap_err();
        let f: Vec<_> = err.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(f, ["route[0] 'objects'.ca_file"]);
        assert!(err.problems[0].message.contains("/nonexistent/fencegate/ca.pem"), "{err}");

        let tmp = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertificateParams::new(vec!["ca".to_string()]).unwrap().self_signed(&key).unwrap();
        let ca_file = tmp.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let text = text.replace("/nonexistent/fencegate/ca.pem", &ca_file.display().to_string());
        let c = Config::from_toml_str(&text).unwrap().read_secrets_with(None).unwrap();
        assert!(c.routes[0].upstream_tls.as_ref().is_some_and(|t| t.is_read()));
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
    fn non_utf8_is_read_and_an_unknown_value_names_the_field() {
        assert_eq!(Config::from_toml_str(MINIMAL).unwrap().routes[0].path_options.non_utf8, NonUtf8::Reject);
        let text = format!("{MINIMAL}non_utf8 = \"raw\"\nkey = \"{{query.id}}\"\n");
        let r = &Config::from_toml_str(&text).unwrap().routes[0];
        assert_eq!(r.path_options.non_utf8, NonUtf8::Raw);
        // The key reads query values as bytes too.
        let key = r.key_for("/objects/a", Some("id=%FF"), &http::HeaderMap::new()).unwrap();
        assert_eq!(&*key, "%FF");
        let p = problems(&format!("{MINIMAL}non_utf8 = \"replace\"\n"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].field, "route[0] 'objects'.non_utf8");
        assert!(p[0].message.contains("\"raw\""), "{}", p[0].message);
    }

    /// A route's durations add up in a write's lease: one too long to add
    /// is refused at load, naming the field, never a panic later.
    #[test]
    fn a_duration_too_long_to_add_up_names_the_field() {
        for field in ["timeout", "queue_timeout", "settle"] {
            let p = problems(&format!("{MINIMAL}{field} = \"400000000000years\"\n"));
            assert_eq!(p.len(), 1, "{p:?}");
            assert_eq!(p[0].field, format!("route[0] 'objects'.{field}"));
        }
        let text = format!("{MINIMAL}timeout = \"100y\"\nqueue_timeout = \"100y\"\nsettle = \"100y\"\n");
        let config = Config::from_toml_str(&text).unwrap();
        let lease = crate::fence::store::longest_write_lease(config.routes.iter().map(Into::into));
        assert_eq!(lease, crate::config::MAX_DURATION * 5);
    }

    #[test]
    fn a_key_template_that_could_run_together_names_the_field_and_the_fix() {
        let p = problems(&format!("{MINIMAL}key = \"{{query.a}}{{query.b}}\"\n"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].field, "route[0] 'objects'.key");
        assert!(p[0].message.contains("separator"), "{}", p[0].message);
        assert!(Config::from_toml_str(&format!("{MINIMAL}key = \"{{header.x-tenant}}:{{path}}\"\n")).is_ok());
    }

    /// A key or token read from a field fencegate removes or sets on the way
    /// to the upstream is refused, naming the field.
    #[test]
    fn keys_and_tokens_are_not_read_from_fields_fencegate_rewrites() {
        for name in super::super::HOP_BY_HOP.iter().chain(&super::super::FORWARDED) {
            let p = problems(&format!("{MINIMAL}key = \"{{header.{name}}}:{{path}}\"\n"));
            assert_eq!(p.len(), 1, "{name}: {p:?}");
            assert_eq!(p[0].field, "route[0] 'objects'.key");
            assert!(p[0].message.contains("on the way to the upstream"), "{}", p[0].message);
            let p = problems(&format!("{MINIMAL}token_header = \"{}\"\n", name.to_uppercase()));
            assert_eq!(p.len(), 1, "{name}: {p:?}");
            assert_eq!(p[0].field, "route[0] 'objects'.token_header");
        }
        assert!(Config::from_toml_str(&format!("{MINIMAL}key = \"{{header.x-tenant}}:{{path}}\"\n")).is_ok());
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
    fn tunnels_and_underscored_names_are_off_unless_switched_on() {
        let r = &Config::from_toml_str(MINIMAL).unwrap().routes[0];
        assert!(!r.unfenced_tunnels && !r.underscores_in_headers);
        let text = format!("[server]\nunderscores_in_headers = true\n{MINIMAL}unfenced_tunnels = true\n");
        let r = &Config::from_toml_str(&text).unwrap().routes[0];
        assert!(r.unfenced_tunnels && r.underscores_in_headers, "the [server] switch reaches every route");
        for (text, field) in [
            (format!("{MINIMAL}unfenced_tunnels = \"yes\"\n"), "unfenced_tunnels"),
            (format!("[server]\nunderscores_in_headers = 1\n{MINIMAL}"), "underscores_in_headers"),
        ] {
            let p = problems(&text);
            assert!(p[0].message.contains(field) || p[0].field.contains(field), "{field}: {p:?}");
        }
    }

    #[test]
    fn path_switches_are_read_and_prefixes_must_be_canonical() {
        let text = format!(
            "{MINIMAL}escaped_slashes = \"keep\"\nmerge_slashes = false\nkey_case = \"fold\"\n\
             allow_safe_body = true\nstream_body = true\n"
        );
        let r = &Config::from_toml_str(&text).unwrap().routes[0];
        assert_eq!(
            r.path_options,
            PathOptions { merge_slashes: false, escaped_slashes: EscapedSlashes::Keep, non_utf8: NonUtf8::Reject }
        );
        assert!(r.fold_key_case && r.allow_safe_body && r.stream_body);
        let text = MINIMAL.replace("\"/objects/\"", "\"/obj%65cts/\"");
        let p = problems(&text);
        assert_eq!(p[0].field, "route[0] 'objects'.prefix");
        assert!(p[0].message.contains("'/objects/'"), "{}", p[0].message);
    }
}
