//! Configuration, as a pipeline:
//! `config.toml -> FileConfig (serde) -> validate -> Validated -> read secrets -> Config`.
//!
//! Validation is pure and collects *every* problem, naming the field it
//! concerns, so one `fencegate --check` run tells an operator everything to fix:
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
//!
//! Reading the secrets a config names (`FENCEGATE_ADMIN_TOKEN`, the admin token
//! file, signing key files) is a separate step, [`Validated::read_secrets`];
//! [`Config::load`], the binary's loader, runs both.

mod defaults;
mod effective;
mod file;
mod model;
mod problems;
mod route;
mod secrets;
mod signing_key;
mod size;
mod tls;
mod validate;

use std::ops::Deref;
use std::path::Path;

pub use defaults::{DEFAULT_CACHE_KEYS, DEFAULT_FENCES_PATH};
pub use effective::{Written, PUBLIC_FIELDS, REDACTED, SECRET_FIELDS};
pub use file::FileConfig;
pub use model::{
    AdminConfig, Config, EtcdConfig, FencesConfig, LeaseToken, LogConfig, LogFormat, ProxyProtocol, RedisConfig,
    RefusalDrain, ServerConfig, StoreKind, TlsFiles, TracingConfig,
};
pub use problems::{ConfigError, ConfigProblem, MAX_DURATION};
#[cfg(test)]
pub(crate) use route::test_route_config;
pub use route::{
    CertNameError, KeyError, KeyInput, KeyTemplate, PathPattern, PatternError, RouteConfig, TemplateError, UpstreamUrl,
    UpstreamUrlError, FORWARDED, HOP_BY_HOP,
};
pub use secrets::{load_admin_token, load_signing_key, SecretError, ADMIN_TOKEN_ENV, MIN_SIGNING_KEY_BYTES};
pub use signing_key::SigningKey;
pub use size::{parse_size, Size, SizeError};
pub use tls::{
    earliest_expiry, pem_certificates, pem_private_key, PemError, PlatformRoots, TlsError, UpstreamExpiry, UpstreamTls,
    UpstreamTlsFiles,
};

use secrets::SecretSources;

/// A config that passed validation, whose secrets are named but not yet read:
/// the admin token is only the inline `auth_token` and no route has its
/// signing key. It reads as a [`Config`]; [`read_secrets`](Self::read_secrets)
/// makes it one, so a route that names a key can never run without it.
#[derive(Debug)]
pub struct Validated {
    config: Config,
    secrets: SecretSources,
    source_name: String,
}

impl Deref for Validated {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.config
    }
}

impl Validated {
    /// Reads the secrets with the admin token override from the process
    /// environment ([`ADMIN_TOKEN_ENV`]).
    pub fn read_secrets(self) -> Result<Config, ConfigError> {
        self.read_secrets_with(admin_token_from_env())
    }

    /// Reads the admin token alone (from [`ADMIN_TOKEN_ENV`], else `auth_token_file`,
    /// else `auth_token`, as [`read_secrets`](Self::read_secrets) does), no other
    /// secret: what `fencegate fence` needs from a copy of the config.
    pub fn read_admin_token(&self) -> Result<Option<String>, ConfigError> {
        self.secrets
            .read_admin_token(admin_token_from_env())
            .map_err(|problems| ConfigError { source_name: self.source_name.clone(), problems })
    }

    /// Reads the secrets, with `env_token` standing for [`ADMIN_TOKEN_ENV`].
    pub fn read_secrets_with(self, env_token: Option<String>) -> Result<Config, ConfigError> {
        match self.secrets.read(env_token) {
            Ok(secrets) => Ok(secrets.apply(self.config)),
            Err(problems) => Err(ConfigError { source_name: self.source_name, problems }),
        }
    }
}

impl Config {
    /// Reads, validates and reads the secrets of a config file: what the binary
    /// runs. Secret problems are listed with validation's, all at once.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::whole_file(&path.display().to_string(), format!("cannot read the file: {e}")))?;
        Config::load_text(path, &text)
    }

    /// Like [`load`](Self::load), with the file's text already read.
    pub fn load_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let file = parse(text, &name)?;
        let sources = SecretSources::named_in(&file);
        match (validate::validate(file), sources.read(admin_token_from_env())) {
            (Ok(config), Ok(secrets)) => Ok(secrets.apply(config)),
            (validated, secrets) => {
                let mut problems = validated.err().unwrap_or_default();
                problems.extend(secrets.err().unwrap_or_default());
                Err(ConfigError { source_name: name, problems })
            }
        }
    }

    /// Reads and validates a config file, reading none of the secrets it names.
    pub fn load_validated(path: &Path) -> Result<Validated, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::whole_file(&name, format!("cannot read the file: {e}")))?;
        let file = parse(&text, &name)?;
        let secrets = SecretSources::named_in(&file);
        validate::validate(file)
            .map(|config| Validated { config, secrets, source_name: name.clone() })
            .map_err(|problems| ConfigError { source_name: name, problems })
    }

    /// Parses and validates config text, reading nothing else: the same input
    /// always gives the same answer (what tests and the fuzzer use).
    pub fn from_toml_str(text: &str) -> Result<Validated, ConfigError> {
        let name = "config";
        let file = parse(text, name)?;
        let secrets = SecretSources::named_in(&file);
        validate::validate(file)
            .map(|config| Validated { config, secrets, source_name: name.to_string() })
            .map_err(|problems| ConfigError { source_name: name.to_string(), problems })
    }
}

/// The files config `text` reads secrets from (`[admin] auth_token_file`,
/// each route's `signing_key_file`); none if it does not parse.
pub fn secret_files(text: &str) -> Vec<std::path::PathBuf> {
    parse(text, "config").map(|file| SecretSources::named_in(&file).files()).unwrap_or_default()
}

fn parse(text: &str, name: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::whole_file(name, redact_userinfo(e.to_string().trim_end())))
}

/// `text` with the user and password of every `scheme://user:password@`
/// it quotes replaced: a parse error quotes the line it failed on, which
/// may be `[fences] url` with a Redis password in it.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends at the first '/', quote or whitespace; its
        // userinfo at its last '@'.
        let end = tail.find(|c: char| c == '/' || c == '"' || c == '\'' || c.is_whitespace()).unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(userinfo) => {
                out.push_str("<redacted>");
                rest = &tail[userinfo..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

fn admin_token_from_env() -> Option<String> {
    std::env::var(ADMIN_TOKEN_ENV).ok()
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use super::defaults::{default_workers, DEFAULT_SAFE_METHODS};
    use super::*;
    use crate::canonical::PathOptions;

    pub(crate) fn problems(text: &str) -> Vec<ConfigProblem> {
        Config::from_toml_str(text).unwrap_err().problems
    }

    pub(crate) fn fields(text: &str) -> Vec<String> {
        problems(text).into_iter().map(|p| p.field).collect()
    }

    pub(crate) const MINIMAL: &str = r#"
        [[route]]
        name = "objects"
        prefix = "/objects/"
        upstream = "http://127.0.0.1:9000"
    "#;

    #[test]
    fn minimal_config_takes_the_documented_defaults() {
        let c = Config::from_toml_str(MINIMAL).unwrap().read_secrets_with(None).unwrap();
        assert_eq!(c.server.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9901");
        assert_eq!(
            c.fences.store,
            StoreKind::File {
                path: "data/fences".into(),
                require_existing: false,
                cache_keys: 1_000_000,
                cache_bytes: 256 << 20
            }
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
        assert!(!r.strict);
        assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.server.max_header_bytes, 64 << 10);
        assert_eq!(c.server.max_connections, 10_000);
        assert_eq!(c.server.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.server.workers, default_workers());
        assert_eq!(r.token_header.as_str(), "x-fencing-token");
        assert!(!r.preserve_host);
        assert_eq!(c.admin.auth_token, None);
    }

    /// FENCEGATE_ADMIN_TOKEN is read as a token file is: surrounding
    /// whitespace dropped, blank meaning unset (the CLI reads it the same way).
    #[test]
    fn the_admin_token_from_the_environment_is_trimmed() {
        let token = |env: &str| {
            Config::from_toml_str(MINIMAL).unwrap().read_secrets_with(Some(env.to_string())).unwrap().admin.auth_token
        };
        assert_eq!(token(" s3cret-token\n").as_deref(), Some("s3cret-token"));
        assert_eq!(token(" \n"), None);
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
    fn traces_are_off_by_default_and_their_fields_are_checked() {
        let config = Config::from_toml_str(MINIMAL).unwrap();
        assert_eq!(config.tracing.otlp_endpoint, None);
        assert_eq!(config.tracing.service_name, "fencegate");
        let on = format!("{MINIMAL}\n[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\nsample_ratio = 0.25\n");
        let config = Config::from_toml_str(&on).unwrap();
        let endpoint = config.tracing.otlp_endpoint.as_ref().map(|u| u.to_string());
        assert_eq!(endpoint.as_deref(), Some("http://127.0.0.1:4318/v1/traces"));
        assert_eq!(config.tracing.sample_ratio, 0.25);
        let own_path = format!("{MINIMAL}\n[tracing]\notlp_endpoint = \"http://collector:4318/otlp/v1/traces\"\n");
        let endpoint = Config::from_toml_str(&own_path).unwrap().tracing.otlp_endpoint.as_ref().map(|u| u.to_string());
        assert_eq!(endpoint.as_deref(), Some("http://collector:4318/otlp/v1/traces"));
        let bad = format!(
            "{MINIMAL}\n[tracing]\notlp_endpoint = \"https://collector\"\nsample_ratio = 1.5\nservice_name = \"\"\n"
        );
        assert_eq!(fields(&bad), ["tracing.otlp_endpoint", "tracing.sample_ratio", "tracing.service_name"]);
        let credentials = format!("{MINIMAL}\n[tracing]\notlp_endpoint = \"http://otel:hunter2@collector:4318\"\n");
        let msg = Config::from_toml_str(&credentials).unwrap_err().to_string();
        assert!(msg.contains("tracing.otlp_endpoint") && !msg.contains("hunter2"), "{msg}");
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
    fn from_toml_str_reads_no_file_and_no_environment() {
        let text = format!(
            "[admin]\nauth_token_file = '/nonexistent/fencegate/token'\n{MINIMAL}\
             signing_key_file = '/nonexistent/fencegate/key'\n"
        );
        let validated = Config::from_toml_str(&text).expect("validation does not open the files it names");
        assert!(validated.routes[0].signing_key.as_ref().is_some_and(|k| k.bytes().is_none()), "named, not read");
        let err = validated.read_secrets_with(None).unwrap_err();
        let f: Vec<_> = err.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(f, ["admin.auth_token_file", "route[0] 'objects'.signing_key_file"]);
    }

    #[test]
    fn load_lists_secret_problems_with_validation_problems() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join("fencegate.toml");
        let text = format!("{MINIMAL}timeout = \"soon\"\nsigning_key_file = '/nonexistent/fencegate/key'\n");
        std::fs::write(&path, text).unwrap();
        let err = Config::load(&path).unwrap_err();
        assert_eq!(err.source_name, path.display().to_string());
        let f: Vec<_> = err.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(f, ["route[0] 'objects'.timeout", "route[0] 'objects'.signing_key_file"]);
        assert!(err.problems[1].message.starts_with("cannot read '/nonexistent/fencegate/key'"), "{err}");
    }

    #[test]
    fn a_parse_error_never_quotes_a_url_password() {
        let e = Config::from_toml_str("[fences]\nstore = \"redis\"\nurl = \"rediss://fg:hunter2@r:6379/0\" x\n")
            .unwrap_err();
        let text = e.to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("rediss://<redacted>@r:6379/0"), "{text}");
        assert_eq!(super::redact_userinfo("a http://h/x b://u:p@h c"), "a http://h/x b://<redacted>@h c");
    }
}
