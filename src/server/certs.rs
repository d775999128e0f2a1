//! TLS for client connections (`[server.tls]`), with rustls.
//!
//! The certificate chain, its key and the optional client CA bundle are PEM
//! files, read at start (a problem there stops fencegate, naming the field)
//! and read again whenever their directory changes (`server/watch.rs`): a
//! rotated certificate serves the next handshake, connections already open
//! keep the one they shook hands with, and a new set that does not load (a
//! key that does not match its certificate, a file half-written) is logged
//! and the last good one keeps serving.
//!
//! ALPN offers `h2` and `http/1.1`; which one a connection speaks is then
//! told from its first bytes, as for plain connections. With `client_ca`,
//! every client must present a certificate that CA signed: one without, or
//! signed by another, is refused in the handshake.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::CertificateDer;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use crate::config::{earliest_expiry, pem_certificates, pem_private_key, TlsError, TlsFiles};
use crate::metrics::TlsReloads;
use crate::server::watch::{watch_dirs_of, DirWatch};

/// The contents of the TLS files, as last read.
#[derive(Debug, PartialEq, Eq)]
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// What a look at the files did.
#[derive(Debug)]
pub enum CertsReloaded {
    /// New files, loaded: the next handshake uses them.
    Applied,
    /// The files hold what is already served.
    Unchanged,
    /// New files that do not load: the last good ones keep serving.
    Refused(TlsError),
}

/// The server side of TLS: what the next handshake uses.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    /// What `current` was built from (a change event that leaves the files
    /// as they were changes nothing), or the last refused set (not logged
    /// again until it changes).
    seen: Mutex<Material>,
    /// When the certificates `current` serves expire.
    expiry: Mutex<Expiry>,
}

/// When the served chain and the client CA bundle expire: the earliest
/// notAfter of each file's certificates, in seconds since the Unix epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expiry {
    pub cert: Option<i64>,
    /// `None` also without `client_ca`.
    pub client_ca: Option<i64>,
}

impl ServerTls {
    /// Reads and checks the files named in `[server.tls]`.
    pub fn load(files: &TlsFiles) -> Result<ServerTls, TlsError> {
        let material = read(files)?;
        let (config, expiry) = build(&material)?;
        Ok(ServerTls {
            files: files.clone(),
            current: RwLock::new(Arc::new(config)),
            seen: Mutex::new(material),
            expiry: Mutex::new(expiry),
        })
    }

    /// When the certificates served now expire.
    pub fn expiry(&self) -> Expiry {
        *self.expiry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().unwrap_or_else(PoisonError::into_inner).clone())
    }

    /// Reads the files again and serves them from the next handshake on if
    /// they changed and load.
    pub fn reload(&self) -> CertsReloaded {
        let material = match read(&self.files) {
            Ok(material) => material,
            Err(e) => return CertsReloaded::Refused(e),
        };
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if *seen == material {
            return CertsReloaded::Unchanged;
        }
        let built = build(&material);
        *seen = material;
        match built {
            Ok((config, expiry)) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
                *self.expiry.lock().unwrap_or_else(PoisonError::into_inner) = expiry;
                CertsReloaded::Applied
            }
            Err(e) => CertsReloaded::Refused(e),
        }
    }

    /// Reloads (and logs and counts it) whenever the files' directories
    /// change, until the watch is dropped. The expiry of the certificates
    /// served is shown from now, and again at each reload applied.
    pub(crate) fn watch(self: &Arc<Self>, counts: TlsReloads) -> notify::Result<DirWatch> {
        let shown = self.expiry();
        counts.served_certificates(shown.cert, shown.client_ca);
        let files = [Some(&self.files.cert), Some(&self.files.key), self.files.client_ca.as_ref()];
        let tls = Arc::downgrade(self);
        watch_dirs_of(files.into_iter().flatten().map(|p| p.as_path()), move || {
            let Some(tls) = tls.upgrade() else { return };
            match tls.reload() {
                CertsReloaded::Applied => {
                    counts.applied.inc();
                    let shown = tls.expiry();
                    counts.served_certificates(shown.cert, shown.client_ca);
                    info!("TLS certificate reloaded: new connections use it");
                }
                CertsReloaded::Unchanged => {}
                CertsReloaded::Refused(e) => {
                    counts.refused.inc();
                    warn!(error = %e, "TLS files changed but do not load; the last good certificate keeps serving");
                }
            }
        })
    }
}

fn read(files: &TlsFiles) -> Result<Material, TlsError> {
    let file = |field, path: &Path| {
        std::fs::read(path).map_err(|e| TlsError::new(field, format!("cannot read '{}': {e}", path.display())))
    };
    Ok(Material {
        cert: file("server.tls.cert", &files.cert)?,
        key: file("server.tls.key", &files.key)?,
        client_ca: files.client_ca.as_deref().map(|path| file("server.tls.client_ca", path)).transpose()?,
    })
}

fn build(material: &Material) -> Result<(ServerConfig, Expiry), TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates("server.tls.cert", &material.cert)?;
    let mut expiry = Expiry { cert: earliest_expiry(&chain), client_ca: None };
    let key = pem_private_key(&material.key).map_err(|message| TlsError::new("server.tls.key", message))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::new("server.tls", e.to_string()))?;
    let builder = match &material.client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            let cas = certificates("server.tls.client_ca", pem)?;
            expiry.client_ca = earliest_expiry(&cas);
            for ca in cas {
                roots
                    .add(ca)
                    .map_err(|e| TlsError::new("server.tls.client_ca", format!("not a usable CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::new("server.tls.client_ca", e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::new("server.tls.key", format!("does not go with the certificate: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((config, expiry))
}

fn certificates(field: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    pem_certificates(pem).map_err(|message| TlsError::new(field, message))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    /// A self-signed certificate for localhost and its key, as PEM.
    fn pair() -> (String, String) {
        pair_until(4096)
    }

    /// [`pair`], expiring on the first of January of `year`.
    fn pair_until(year: i32) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    fn files(dir: &Path, cert: &str, key: &str, client_ca: Option<&str>) -> TlsFiles {
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        TlsFiles {
            cert: write("tls.crt", cert),
            key: write("tls.key", key),
            client_ca: client_ca.map(|text| write("ca.crt", text)),
        }
    }

    fn field_of(result: Result<ServerTls, TlsError>) -> &'static str {
        result.expect_err("does not load").field
    }

    #[test]
    fn each_bad_file_is_named_by_its_field() {
        let tmp = tempfile::tempdir().unwrap();
        let (cert, key) = pair();
        let (other_cert, other_key) = pair();
        assert!(ServerTls::load(&files(tmp.path(), &cert, &key, None)).is_ok());
        assert!(ServerTls::load(&files(tmp.path(), &cert, &key, Some(&other_cert))).is_ok());

        let mut missing = files(tmp.path(), &cert, &key, None);
        missing.cert = PathBuf::from("/nonexistent/tls.crt");
        assert_eq!(field_of(ServerTls::load(&missing)), "server.tls.cert");
        assert_eq!(field_of(ServerTls::load(&files(tmp.path(), "not PEM", &key, None))), "server.tls.cert");
        assert_eq!(field_of(ServerTls::load(&files(tmp.path(), &key, &key, None))), "server.tls.cert");
        assert_eq!(field_of(ServerTls::load(&files(tmp.path(), &cert, &cert, None))), "server.tls.key");
        assert_eq!(field_of(ServerTls::load(&files(tmp.path(), &cert, &other_key, None))), "server.tls.key");
        assert_eq!(field_of(ServerTls::load(&files(tmp.path(), &cert, &key, Some("")))), "server.tls.client_ca");
        let e = ServerTls::load(&files(tmp.path(), &cert, &other_key, None)).unwrap_err();
        assert!(e.to_string().starts_with("server.tls.key: does not go with the certificate"), "{e}");
    }

    #[test]
    fn a_reload_applies_new_files_ignores_the_same_ones_and_keeps_serving_on_a_bad_set() {
        let tmp = tempfile::tempdir().unwrap();
        let (cert, key) = pair();
        let tls = ServerTls::load(&files(tmp.path(), &cert, &key, None)).unwrap();
        let serving = |tls: &ServerTls| Arc::as_ptr(&tls.current.read().unwrap());
        let first = serving(&tls);
        assert!(matches!(tls.reload(), CertsReloaded::Unchanged));
        assert_eq!(serving(&tls), first);

        let (cert2, key2) = pair();
        files(tmp.path(), &cert2, &key, None);
        assert!(matches!(tls.reload(), CertsReloaded::Refused(TlsError { field: "server.tls.key", .. })));
        assert_eq!(serving(&tls), first, "a pair that does not match is not served");
        assert!(matches!(tls.reload(), CertsReloaded::Unchanged), "and not tried again until it changes");

        files(tmp.path(), &cert2, &key2, None);
        assert!(matches!(tls.reload(), CertsReloaded::Applied));
        assert_ne!(serving(&tls), first);

        // 2031-01-01T00:00:00Z, as the metrics show it once applied.
        let (cert3, key3) = pair_until(2031);
        files(tmp.path(), &cert3, &key3, None);
        assert!(matches!(tls.reload(), CertsReloaded::Applied));
        assert_eq!(tls.expiry(), Expiry { cert: Some(1_924_992_000), client_ca: None });

        // With a client CA: its own expiry.
        let (ca, _) = pair_until(2030);
        let tls = ServerTls::load(&files(tmp.path(), &cert3, &key3, Some(&ca))).unwrap();
        // 2030-01-01T00:00:00Z
        assert_eq!(tls.expiry(), Expiry { cert: Some(1_924_992_000), client_ca: Some(1_893_456_000) });
    }
}
