//! The `[fences]` section: the store (`file`, `memory`, `redis` or `etcd`), the
//! fields each store takes, and the bound on keys every store shares.

use std::path::PathBuf;

use crate::config::defaults::*;
use crate::config::file::FencesSection;
use crate::config::model::{EtcdConfig, FencesConfig, RedisConfig, StoreKind};
use crate::config::problems::Problems;

pub(super) fn fences(f: &FencesSection, p: &mut Problems) -> FencesConfig {
    let max_key_bytes = p.size("fences.max_key_bytes", f.max_key_bytes.as_ref(), DEFAULT_MAX_KEY_BYTES as u64);
    FencesConfig { store: store(f, p), max_key_bytes: usize::try_from(max_key_bytes).unwrap_or(usize::MAX) }
}

fn store(f: &FencesSection, p: &mut Problems) -> StoreKind {
    let kind = f.store.as_deref().unwrap_or("file");
    // Each field names the stores it applies to.
    for (field, set, applies) in [
        ("path", f.path.is_some(), &["file"][..]),
        ("require_existing", f.require_existing.is_some(), &["file"]),
        ("cache_keys", f.cache_keys.is_some(), &["file", "redis", "etcd"]),
        ("cache_bytes", f.cache_bytes.is_some(), &["file"]),
        ("url", f.url.is_some(), &["redis"]),
        ("key_prefix", f.key_prefix.is_some(), &["redis", "etcd"]),
        ("timeout", f.timeout.is_some(), &["redis", "etcd"]),
        ("min_replicas", f.min_replicas.is_some(), &["redis"]),
        ("replica_timeout", f.replica_timeout.is_some(), &["redis"]),
        ("ca_file", f.ca_file.is_some(), &["redis", "etcd"]),
        ("endpoints", f.endpoints.is_some(), &["etcd"]),
        ("cert_file", f.cert_file.is_some(), &["etcd"]),
        ("key_file", f.key_file.is_some(), &["etcd"]),
        ("user", f.user.is_some(), &["etcd"]),
        ("password", f.password.is_some(), &["etcd"]),
    ] {
        if set && STORES.contains(&kind) && !applies.contains(&kind) {
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
        "etcd" => StoreKind::Etcd(etcd(f, cache_keys, p)),
        other => {
            p.add(
                "fences.store",
                format!("'{other}' is not a store this build has; use \"file\", \"memory\", \"redis\" or \"etcd\""),
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

/// The stores `[fences] store` names.
const STORES: [&str; 4] = ["file", "memory", "redis", "etcd"];

/// `[fences]` of `store = "etcd"`.
fn etcd(f: &FencesSection, cache_keys: usize, p: &mut Problems) -> EtcdConfig {
    let endpoints = f.endpoints.clone().unwrap_or_default();
    if f.endpoints.is_none() {
        p.add("fences.endpoints", "is required with store = \"etcd\" (e.g. [\"http://127.0.0.1:2379\"])");
    } else if endpoints.is_empty() {
        p.add("fences.endpoints", "must name at least one etcd member");
    }
    let mut schemes = endpoints.iter().filter_map(|e| check_etcd_endpoint(e).map_err(|why| (e, why)).err());
    if let Some((endpoint, why)) = schemes.next() {
        p.add("fences.endpoints", format!("'{endpoint}' {why}"));
    }
    let https = endpoints.first().is_some_and(|e| e.starts_with("https://"));
    if endpoints.iter().any(|e| e.starts_with("https://") != https) {
        p.add("fences.endpoints", "mixes http:// and https://: every member is reached the same way");
    }
    let key_prefix = f.key_prefix.clone().unwrap_or_else(|| DEFAULT_ETCD_KEY_PREFIX.to_owned());
    if key_prefix.is_empty() {
        p.add("fences.key_prefix", "must not be empty: fencegate's keys would mix with every other key in etcd");
    }
    let timeout = p.duration("fences.timeout", f.timeout.as_deref(), DEFAULT_ETCD_TIMEOUT);
    if timeout.is_zero() {
        p.add("fences.timeout", "must be above zero");
    }
    let ca_file = f.ca_file.as_deref().map(PathBuf::from);
    if ca_file.is_some() && !https {
        p.add("fences.ca_file", "applies to https:// endpoints (etcd over TLS) only");
    }
    let client_identity = match (&f.cert_file, &f.key_file) {
        (Some(cert), Some(key)) => {
            if !https {
                p.add("fences.cert_file", "applies to https:// endpoints (etcd over TLS) only");
            }
            Some((PathBuf::from(cert), PathBuf::from(key)))
        }
        (Some(_), None) => {
            p.add("fences.key_file", "is required with cert_file: the client certificate's private key");
            None
        }
        (None, Some(_)) => {
            p.add("fences.cert_file", "is required with key_file: the client certificate the key belongs to");
            None
        }
        (None, None) => None,
    };
    let credentials = match (&f.user, &f.password) {
        (Some(user), Some(password)) if !user.is_empty() => Some((user.clone(), password.clone())),
        (Some(_), Some(_)) => {
            p.add("fences.user", "must not be empty");
            None
        }
        (Some(_), None) => {
            p.add("fences.password", "is required with user");
            None
        }
        (None, Some(_)) => {
            p.add("fences.user", "is required with password");
            None
        }
        (None, None) => None,
    };
    EtcdConfig { endpoints, key_prefix, timeout, cache_keys, ca_file, client_identity, credentials }
}

/// Why `endpoint` is not an etcd member's client URL: `http://host:port`
/// or `https://host:port`, nothing after the port.
fn check_etcd_endpoint(endpoint: &str) -> Result<(), &'static str> {
    let uri: http::Uri = endpoint.parse().map_err(|_| "is not a URL like \"http://127.0.0.1:2379\"")?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("is not an http:// or https:// URL");
    }
    if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
        return Err("names no host and port (etcd's client port is usually 2379)");
    }
    if uri.path_and_query().is_some_and(|pq| pq.as_str() != "/") {
        return Err("has a path; an etcd endpoint is a scheme, a host and a port");
    }
    Ok(())
}

/// `[fences]` of `store = "redis"`.
fn redis(f: &FencesSection, cache_keys: usize, p: &mut Problems) -> RedisConfig {
    let url = match f.url.as_deref() {
        None => {
            p.add("fences.url", "is required with store = \"redis\" (e.g. \"redis://127.0.0.1:6379/0\")");
            String::new()
        }
        Some(url) => {
            if let Err(e) = check_redis_url(url) {
                p.add("fences.url", e.to_string());
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

/// A `[fences] url` the Redis client does not take: only the kind of its
/// error is kept, never the URL or the client's message, which may quote a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("is not a Redis URL like \"redis://[user:password@]host:6379/0\" or \"rediss://...\" ({kind:?})")]
struct RedisUrlError {
    kind: redis::ErrorKind,
}

/// Whether `url` is one the Redis client takes.
fn check_redis_url(url: &str) -> Result<(), RedisUrlError> {
    redis::Client::open(url).map(drop).map_err(|e| RedisUrlError { kind: e.kind() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{fields, problems, MINIMAL};
    use crate::config::Config;

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
    fn an_unknown_store_names_the_field() {
        let text = format!("[fences]\nstore = \"zookeeper\"\n{MINIMAL}");
        let p = problems(&text);
        assert_eq!(p[0].field, "fences.store");
        assert!(p[0].message.contains("\"etcd\""), "{}", p[0].message);
    }

    #[test]
    fn the_etcd_store_takes_its_fields_and_defaults() {
        let c = Config::from_toml_str(&format!(
            "[fences]\nstore = \"etcd\"\nendpoints = [\"http://e1:2379\", \"http://e2:2379\"]\n{MINIMAL}"
        ))
        .unwrap();
        let StoreKind::Etcd(e) = &c.fences.store else { panic!("{:?}", c.fences.store) };
        assert_eq!(e.endpoints, ["http://e1:2379", "http://e2:2379"]);
        assert_eq!(e.key_prefix, DEFAULT_ETCD_KEY_PREFIX);
        assert_eq!(e.timeout, DEFAULT_ETCD_TIMEOUT);
        assert_eq!((&e.ca_file, &e.client_identity, &e.credentials), (&None, &None, &None));

        let c = Config::from_toml_str(&format!(
            "[fences]\nstore = \"etcd\"\nendpoints = [\"https://e1:2379\"]\nkey_prefix = \"fg/a/\"\n\
             timeout = \"3s\"\nca_file = \"ca.pem\"\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n\
             user = \"fg\"\npassword = \"pw\"\ncache_keys = 7\n{MINIMAL}"
        ))
        .unwrap();
        let StoreKind::Etcd(e) = &c.fences.store else { panic!("{:?}", c.fences.store) };
        assert_eq!((e.key_prefix.as_str(), e.timeout, e.cache_keys), ("fg/a/", std::time::Duration::from_secs(3), 7));
        assert_eq!(e.ca_file.as_deref(), Some(std::path::Path::new("ca.pem")));
        assert_eq!(e.client_identity, Some(("c.pem".into(), "k.pem".into())));
        assert_eq!(e.credentials, Some(("fg".into(), "pw".into())));
        assert!(!format!("{e:?}").contains("pw"), "the password shows in {e:?}");
    }

    #[test]
    fn etcd_fields_name_themselves_when_wrong_or_misplaced() {
        let fields_of = |fences: &str| fields(&format!("[fences]\n{fences}\n{MINIMAL}"));
        let etcd = |rest: &str| format!("store = \"etcd\"\nendpoints = [\"http://e:2379\"]\n{rest}");
        assert_eq!(fields_of("store = \"etcd\""), ["fences.endpoints"]);
        assert_eq!(fields_of("store = \"etcd\"\nendpoints = []"), ["fences.endpoints"]);
        for bad in ["\"e:2379\"", "\"ftp://e:2379\"", "\"http://e\"", "\"http://e:2379/v3\"", "\"not a url\""] {
            assert_eq!(fields_of(&format!("store = \"etcd\"\nendpoints = [{bad}]")), ["fences.endpoints"], "{bad}");
        }
        let mixed = "store = \"etcd\"\nendpoints = [\"http://a:2379\", \"https://b:2379\"]";
        assert_eq!(fields_of(mixed), ["fences.endpoints"]);
        assert_eq!(fields_of(&etcd("timeout = \"soon\"")), ["fences.timeout"]);
        assert_eq!(fields_of(&etcd("timeout = \"0s\"")), ["fences.timeout"]);
        assert_eq!(fields_of(&etcd("key_prefix = \"\"")), ["fences.key_prefix"]);
        assert_eq!(fields_of(&etcd("ca_file = \"ca.pem\"")), ["fences.ca_file"]);
        assert_eq!(fields_of(&etcd("cert_file = \"c.pem\"")), ["fences.key_file"]);
        assert_eq!(fields_of(&etcd("key_file = \"k.pem\"")), ["fences.cert_file"]);
        assert_eq!(fields_of(&etcd("user = \"u\"")), ["fences.password"]);
        assert_eq!(fields_of(&etcd("password = \"p\"")), ["fences.user"]);
        // Another store's fields, and etcd's with another store.
        for other in ["url = \"redis://r\"", "path = \"d\"", "min_replicas = 1", "replica_timeout = \"1s\""] {
            let field = format!("fences.{}", other.split(' ').next().unwrap());
            assert_eq!(fields_of(&etcd(other)), [field], "{other}");
        }
        for field in [
            "endpoints = [\"http://e:2379\"]",
            "cert_file = \"c\"",
            "key_file = \"k\"",
            "user = \"u\"",
            "password = \"p\"",
        ] {
            let name = format!("fences.{}", field.split(' ').next().unwrap());
            let with_redis = format!("store = \"redis\"\nurl = \"redis://r\"\n{field}");
            assert!(fields_of(&with_redis).contains(&name), "{field} with redis: {:?}", fields_of(&with_redis));
        }
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
        assert_eq!(check_redis_url("http://x"), Err(RedisUrlError { kind: redis::ErrorKind::InvalidClientConfig }));
    }
}
