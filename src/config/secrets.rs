//! The step after validation that reads what a config only names: the admin
//! token (`FENCEGATE_ADMIN_TOKEN`, else `auth_token_file`, else `auth_token`),
//! each route's `signing_key_file`, and each https route's `ca_file`,
//! `client_cert` and `client_key` (or, without a `ca_file`, the platform's
//! root certificates), from which its TLS client config is built.
//!
//! Kept apart so validation stays pure; its problems still name the field, as
//! validation's do.

use std::path::{Path, PathBuf};

use super::file::FileConfig;
use super::model::Config;
use super::problems::{ConfigProblem, Problems};
use super::route::route_label;
use super::route::UpstreamUrl;
use super::signing_key::SigningKey;
use super::tls::{PlatformRoots, UpstreamTls, UpstreamTlsFiles};

/// Environment variable that overrides `[admin] auth_token` and `auth_token_file`.
pub const ADMIN_TOKEN_ENV: &str = "FENCEGATE_ADMIN_TOKEN";

/// Shortest signing key accepted, in bytes.
pub const MIN_SIGNING_KEY_BYTES: usize = 16;

/// The secrets a config file names, taken from it before validation so they
/// can be read (and their problems reported) even when validation fails.
#[derive(Debug, Clone, Default)]
pub(super) struct SecretSources {
    admin_token: Option<String>,
    admin_token_file: Option<String>,
    /// Route index, the route's problem label, and its key file.
    signing_key_files: Vec<(usize, String, String)>,
    /// Route index, the route's problem label, and its https upstream's TLS.
    upstream_tls: Vec<(usize, String, UpstreamTls)>,
}

/// The secrets, read.
pub(super) struct Secrets {
    admin_token: Option<String>,
    signing_keys: Vec<(usize, SigningKey)>,
    upstream_tls: Vec<(usize, UpstreamTls)>,
}

impl SecretSources {
    pub(super) fn named_in(file: &FileConfig) -> SecretSources {
        SecretSources {
            admin_token: file.admin.auth_token.clone(),
            admin_token_file: file.admin.auth_token_file.clone(),
            signing_key_files: file
                .routes
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let path = r.signing_key_file.clone()?;
                    Some((i, route_label(i, r.name.as_deref()), path))
                })
                .collect(),
            upstream_tls: file
                .routes
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    // Only an https upstream that parses; validation reports
                    // the rest (files on an http upstream, an empty path).
                    let upstream = UpstreamUrl::parse(r.upstream.as_deref()?).ok().filter(UpstreamUrl::is_tls)?;
                    let path = |p: &Option<String>| p.as_deref().filter(|p| !p.is_empty()).map(Into::into);
                    let files = UpstreamTlsFiles {
                        ca_file: path(&r.ca_file),
                        client_cert: path(&r.client_cert),
                        client_key: path(&r.client_key),
                    };
                    if files.client_cert.is_some() != files.client_key.is_some() {
                        return None;
                    }
                    let tls =
                        UpstreamTls::named(upstream.server_name().ok()?, files, r.upstream_http2.unwrap_or(false));
                    Some((i, route_label(i, r.name.as_deref()), tls))
                })
                .collect(),
        }
    }

    /// The files the secrets are read from.
    pub(super) fn files(&self) -> Vec<PathBuf> {
        let keys = self.signing_key_files.iter().map(|(_, _, path)| PathBuf::from(path));
        let tls = self.upstream_tls.iter().flat_map(|(_, _, tls)| {
            let files = tls.files();
            [&files.ca_file, &files.client_cert, &files.client_key].into_iter().flatten().cloned()
        });
        self.admin_token_file.iter().map(PathBuf::from).chain(keys).chain(tls).collect()
    }

    /// Reads every secret; `env_token` is the value of [`ADMIN_TOKEN_ENV`].
    pub(super) fn read(&self, env_token: Option<String>) -> Result<Secrets, Vec<ConfigProblem>> {
        let mut p = Problems::default();
        let admin_token = self.admin_token(env_token, &mut p);
        let mut signing_keys = Vec::with_capacity(self.signing_key_files.len());
        for (i, label, path) in &self.signing_key_files {
            match load_signing_key(Path::new(path)) {
                Ok(key) => signing_keys.push((*i, key)),
                Err(e) => p.add(format!("{label}.signing_key_file"), e.to_string()),
            }
        }
        // Read from the system at most once, for every route without a ca_file.
        let mut platform = PlatformRoots::default();
        let mut upstream_tls = Vec::with_capacity(self.upstream_tls.len());
        for (i, label, named) in &self.upstream_tls {
            match named.read(&mut platform) {
                Ok(tls) => upstream_tls.push((*i, tls)),
                Err(problem) => p.add(format!("{label}.{}", problem.field), problem.message),
            }
        }
        p.or(Secrets { admin_token, signing_keys, upstream_tls })
    }

    /// Reads the admin token alone, no other secret; `env_token` is the value
    /// of [`ADMIN_TOKEN_ENV`].
    pub(super) fn read_admin_token(&self, env_token: Option<String>) -> Result<Option<String>, Vec<ConfigProblem>> {
        let mut p = Problems::default();
        let token = self.admin_token(env_token, &mut p);
        p.or(token)
    }

    /// An empty value anywhere means unset. The environment's value loses its
    /// surrounding whitespace, as a token file's does, so the server and the
    /// CLI (which trims it too) read the same token from the same variable.
    fn admin_token(&self, env_token: Option<String>, p: &mut Problems) -> Option<String> {
        if let Some(token) = env_token.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()) {
            return Some(token);
        }
        if let Some(path) = &self.admin_token_file {
            return match load_admin_token(Path::new(path)) {
                Ok(token) => Some(token),
                Err(e) => {
                    p.add("admin.auth_token_file", e.to_string());
                    None
                }
            };
        }
        self.admin_token.clone().filter(|t| !t.is_empty())
    }
}

impl Secrets {
    /// `config` with its secrets in place. `config` must be the validation of
    /// the file these secrets were named in, so route indexes line up.
    pub(super) fn apply(self, mut config: Config) -> Config {
        config.admin.auth_token = self.admin_token;
        for (i, key) in self.signing_keys {
            if let Some(route) = config.routes.get_mut(i) {
                route.signing_key = Some(key);
            }
        }
        for (i, tls) in self.upstream_tls {
            if let Some(route) = config.routes.get_mut(i) {
                route.upstream_tls = Some(tls);
            }
        }
        config
    }
}

/// Why a secret file could not be used (the caller names the field).
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read '{}': {source}", path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    /// An admin token file with nothing but whitespace in it.
    #[error("'{}' is empty", path.display())]
    Empty { path: PathBuf },
    /// A signing key shorter than [`MIN_SIGNING_KEY_BYTES`], without its trailing whitespace.
    #[error("'{}' holds {len} bytes; use a key of at least {MIN_SIGNING_KEY_BYTES}", path.display())]
    ShortKey { path: PathBuf, len: usize },
}

/// Reads a route's `signing_key_file`: the file's bytes with trailing ASCII
/// whitespace removed, at least [`MIN_SIGNING_KEY_BYTES`] of them. The server and
/// `fencegate sign` both load keys here, so they always agree on the key.
pub fn load_signing_key(path: &Path) -> Result<SigningKey, SecretError> {
    let bytes = std::fs::read(path).map_err(|source| SecretError::Unreadable { path: path.into(), source })?;
    // Trailing whitespace is a file-editing accident, not key material.
    let key = bytes.trim_ascii_end();
    if key.len() < MIN_SIGNING_KEY_BYTES {
        return Err(SecretError::ShortKey { path: path.into(), len: key.len() });
    }
    Ok(SigningKey::new(key))
}

/// Reads `[admin] auth_token_file` (and `fencegate fence --token-file`): its
/// text without surrounding whitespace, which must leave something.
pub fn load_admin_token(path: &Path) -> Result<String, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::Unreadable { path: path.into(), source })?;
    match text.trim() {
        "" => Err(SecretError::Empty { path: path.into() }),
        token => Ok(token.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{fields, MINIMAL};
    use crate::config::Config;

    #[test]
    fn admin_token_comes_from_env_then_file_then_config() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let file_path = dir.join("token");
        std::fs::write(&file_path, "from-file\n").unwrap();
        let sources = |token: Option<&str>, file: Option<&Path>| SecretSources {
            admin_token: token.map(str::to_string),
            admin_token_file: file.map(|f| f.display().to_string()),
            signing_key_files: Vec::new(),
            upstream_tls: Vec::new(),
        };
        let mut p = Problems::default();
        assert_eq!(sources(Some("inline"), None).admin_token(None, &mut p).as_deref(), Some("inline"));
        assert_eq!(sources(None, Some(&file_path)).admin_token(None, &mut p).as_deref(), Some("from-file"));
        let env = Some("env".to_string());
        assert_eq!(sources(None, Some(&file_path)).admin_token(env.clone(), &mut p).as_deref(), Some("env"));
        assert_eq!(sources(Some("inline"), None).admin_token(env, &mut p).as_deref(), Some("env"));
        assert_eq!(sources(Some("inline"), None).admin_token(Some(String::new()), &mut p).as_deref(), Some("inline"));
        assert_eq!(sources(Some(""), None).admin_token(None, &mut p), None);
        assert_eq!(p.count(), 0);
        std::fs::write(dir.join("empty"), " \n").unwrap();
        sources(None, Some(&dir.join("empty"))).admin_token(None, &mut p);
        sources(None, Some(&dir.join("missing"))).admin_token(None, &mut p);
        let f: Vec<_> = p.into_vec().into_iter().map(|x| x.field).collect();
        assert_eq!(f, ["admin.auth_token_file", "admin.auth_token_file"]);
        assert!(matches!(load_admin_token(&dir.join("empty")), Err(SecretError::Empty { .. })));
        let missing = load_admin_token(&dir.join("missing")).unwrap_err();
        assert!(
            matches!(&missing, SecretError::Unreadable { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
        );
        assert!(missing.to_string().starts_with("cannot read '"), "{missing}");
    }

    #[test]
    fn signing_keys_lose_trailing_whitespace_and_must_be_long_enough() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let good = dir.join("good");
        std::fs::write(&good, b" 0123456789abcdef\r\n\t ").unwrap();
        assert_eq!(load_signing_key(&good).unwrap().bytes(), Some(&b" 0123456789abcdef"[..]));
        let short = dir.join("short");
        std::fs::write(&short, b"0123456789abcde\n").unwrap();
        let e = load_signing_key(&short).unwrap_err();
        assert!(matches!(&e, SecretError::ShortKey { path, len: 15 } if *path == short), "{e:?}");
        assert_eq!(e.to_string(), format!("'{}' holds 15 bytes; use a key of at least 16", short.display()));
        let e = load_signing_key(&dir.join("missing")).unwrap_err();
        assert!(matches!(e, SecretError::Unreadable { .. }), "{e:?}");

        let route = |path: &Path| format!("{MINIMAL}signing_key_file = '{}'\nmax_token_jump = 1000\n", path.display());
        let validated = Config::from_toml_str(&route(&good)).unwrap();
        assert_eq!(validated.routes[0].signing_key.as_ref().map(|k| k.bytes()), Some(None), "unread until read");
        let c = validated.read_secrets_with(None).unwrap();
        assert_eq!(c.routes[0].signing_key.as_ref().unwrap().bytes(), Some(&b" 0123456789abcdef"[..]));
        assert_eq!(c.routes[0].max_token_jump, Some(1000));
        let err = Config::from_toml_str(&route(&short)).unwrap().read_secrets_with(None).unwrap_err();
        let f: Vec<_> = err.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(f, ["route[0] 'objects'.signing_key_file"]);
    }

    #[test]
    fn each_key_goes_to_the_route_that_names_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, "aaaaaaaaaaaaaaaa").unwrap();
        std::fs::write(&b, "bbbbbbbbbbbbbbbb").unwrap();
        let text = format!(
            "{MINIMAL}signing_key_file = '{}'\n[[route]]\nname = \"open\"\nprefix = \"/open/\"\n\
             upstream = \"http://127.0.0.1:9000\"\n[[route]]\nname = \"b\"\nprefix = \"/b/\"\n\
             upstream = \"http://127.0.0.1:9000\"\nsigning_key_file = '{}'\n",
            a.display(),
            b.display()
        );
        let c = Config::from_toml_str(&text).unwrap().read_secrets_with(None).unwrap();
        let keys: Vec<_> =
            c.routes.iter().map(|r| r.signing_key.as_ref().and_then(|k| k.bytes()).map(|b| b[0])).collect();
        assert_eq!(keys, [Some(b'a'), None, Some(b'b')]);
        assert!(fields(&format!("{text}[fences]\nstore = \"x\"\n")).contains(&"fences.store".to_string()));
    }
}
