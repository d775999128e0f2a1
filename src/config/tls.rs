//! TLS files as config reads them: PEM certificates and keys, and each https
//! route's client config, built when the secrets step reads the route's
//! files (a missing or bad `ca_file`, `client_cert` or `client_key` is a
//! config problem that names its field, at `--check` and on reload as at
//! start). The upstream's certificate is verified against the route's
//! `ca_file` alone when it has one, else against the platform's root
//! certificates (read once, for every route that trusts them), for the
//! upstream's host: a DNS name or an IP address, which is also the SNI sent.
//! With `client_cert` and `client_key` the route presents that certificate to
//! an upstream that asks for one. ALPN offers `http/1.1`, or `h2` alone for a
//! route that speaks HTTP/2 upstream.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Why TLS files could not be used, naming the field whose file it is
/// (`server.tls.cert`, or a route's `ca_file`, `client_cert`, `client_key`).
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TlsError {
    pub field: &'static str,
    pub message: String,
}

impl TlsError {
    /// `message` is what is wrong with the field's file: text, or an error
    /// such as [`PemError`] whose Display says it.
    pub fn new(field: &'static str, message: impl fmt::Display) -> TlsError {
        TlsError { field, message: message.to_string() }
    }
}

/// Why a PEM file holds no usable certificate chain or private key.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// A section that is not a well-formed PEM certificate.
    #[error("not a PEM certificate file: {0}")]
    Certificates(#[source] pem::Error),
    /// Well-formed, but with no certificate in it.
    #[error("holds no PEM certificate")]
    NoCertificate,
    #[error("no usable PEM private key: {0}")]
    PrivateKey(#[source] pem::Error),
}

/// Every certificate of a PEM file, at least one; the error says what is
/// wrong with the file. The server's certificates and each https route's
/// are read here.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(PemError::Certificates)?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// The earliest notAfter of `certs`, in seconds since the Unix epoch: when
/// the first of them expires (a chain stops verifying when any link does).
/// `None` when none of them parses as X.509, which rustls would then refuse
/// anyway.
pub fn earliest_expiry(certs: &[CertificateDer<'_>]) -> Option<i64> {
    certs
        .iter()
        .filter_map(|der| x509_parser::parse_x509_certificate(der).ok())
        .map(|(_, cert)| cert.validity().not_after.timestamp())
        .min()
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn pem_private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(PemError::PrivateKey)
}

/// The files an https route names for its TLS, as validated (none empty,
/// `client_cert` and `client_key` both or neither).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamTlsFiles {
    /// The CA bundle the upstream's certificate must chain to; unset: the
    /// platform's roots.
    pub ca_file: Option<PathBuf>,
    /// The client certificate chain presented to the upstream, leaf first.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub client_key: Option<PathBuf>,
}

/// TLS to one route's upstream: the name its certificate must carry, the
/// files the route names and, once they are read, the client config built
/// from them. Clones share the config.
#[derive(Clone)]
pub struct UpstreamTls {
    name: ServerName<'static>,
    files: UpstreamTlsFiles,
    /// `None` until the files are read ([`UpstreamTls::read`]).
    client: Option<Arc<ClientConfig>>,
    /// The route speaks HTTP/2 to the upstream: ALPN offers `h2` alone.
    http2: bool,
    /// Set when the route trusts the platform's roots and none were found:
    /// what was wrong, for the start-up warning and each failure's log line.
    no_roots: Option<Arc<str>>,
    /// When the certificates of the files read expire, for the metrics.
    expiry: UpstreamExpiry,
}

/// When an https route's certificate files expire: the earliest notAfter of
/// each file's certificates, in seconds since the Unix epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpstreamExpiry {
    /// `ca_file`'s, when the route names one.
    pub ca_file: Option<i64>,
    /// `client_cert`'s, when the route names one.
    pub client_cert: Option<i64>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("name", &self.name)
            .field("files", &self.files)
            .field("http2", &self.http2)
            .field("read", &self.client.is_some())
            .field("no_roots", &self.no_roots)
            .finish()
    }
}

impl UpstreamTls {
    /// TLS to an upstream named `name`, with `files` named but not read: what
    /// validation makes, so it never touches the disk. With `http2`, ALPN
    /// offers `h2` alone, and a handshake that does not select it fails.
    pub fn named(name: ServerName<'static>, files: UpstreamTlsFiles, http2: bool) -> UpstreamTls {
        UpstreamTls { name, files, http2, client: None, no_roots: None, expiry: UpstreamExpiry::default() }
    }

    /// Whether the route speaks HTTP/2 to the upstream.
    pub fn http2(&self) -> bool {
        self.http2
    }

    /// The files this route names.
    pub fn files(&self) -> &UpstreamTlsFiles {
        &self.files
    }

    /// The client config, once read, and the name the upstream's
    /// certificate must carry.
    pub fn client(&self) -> Option<(&Arc<ClientConfig>, &ServerName<'static>)> {
        Some((self.client.as_ref()?, &self.name))
    }

    /// Whether the files were read and the client config built.
    pub fn is_read(&self) -> bool {
        self.client.is_some()
    }

    /// When the certificates of the files read expire (nothing before they are read).
    pub fn expiry(&self) -> UpstreamExpiry {
        self.expiry
    }

    /// The reason every handshake of this route will fail, if there is one
    /// known at start: it trusts the platform's roots, and there are none.
    pub fn no_roots(&self) -> Option<&str> {
        self.no_roots.as_deref()
    }

    /// This TLS with its files read and its client config built, trusting
    /// `platform`'s roots when there is no `ca_file`. Each problem names the
    /// field whose file it is.
    pub fn read(&self, platform: &mut PlatformRoots) -> Result<UpstreamTls, TlsError> {
        let files = &self.files;
        let mut expiry = UpstreamExpiry::default();
        let (roots, no_roots) = match &files.ca_file {
            Some(path) => {
                let mut roots = RootCertStore::empty();
                let cas = pem_certificates(&read("ca_file", path)?).map_err(|e| TlsError::new("ca_file", e))?;
                expiry.ca_file = earliest_expiry(&cas);
                for ca in cas {
                    roots.add(ca).map_err(|e| {
                        TlsError::new("ca_file", format!("'{}': not a usable CA certificate: {e}", path.display()))
                    })?;
                }
                (Arc::new(roots), None)
            }
            None => platform.get(),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new("upstream", e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match (&files.client_cert, &files.client_key) {
            (Some(cert), Some(key)) => {
                let chain = pem_certificates(&read("client_cert", cert)?)
                    .map_err(|e| TlsError::new("client_cert", format!("'{}': {e}", cert.display())))?;
                expiry.client_cert = earliest_expiry(&chain);
                let key_der = pem_private_key(&read("client_key", key)?)
                    .map_err(|e| TlsError::new("client_key", format!("'{}': {e}", key.display())))?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    TlsError::new(
                        "client_key",
                        format!("'{}' does not go with client_cert '{}': {e}", key.display(), cert.display()),
                    )
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            // Validation refuses one without the other.
            (Some(_), None) => return Err(TlsError::new("client_key", "is required with client_cert")),
            (None, Some(_)) => return Err(TlsError::new("client_cert", "is required with client_key")),
        };
        config.alpn_protocols = vec![if self.http2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
        Ok(UpstreamTls { client: Some(Arc::new(config)), no_roots, expiry, ..self.clone() })
    }
}

fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::new(field, format!("cannot read '{}': {e}", path.display())))
}

/// The platform's root certificates (the system's CA store, or the bundle
/// `SSL_CERT_FILE` / `SSL_CERT_DIR` name), read at most once for every route
/// that trusts them.
#[derive(Default)]
pub struct PlatformRoots {
    loaded: Option<(Arc<RootCertStore>, Option<Arc<str>>)>,
}

impl PlatformRoots {
    /// Roots made of `certs`, as if the platform had them; `errors` are what
    /// went wrong reading the store.
    pub fn from_certs(certs: Vec<CertificateDer<'static>>, errors: Vec<String>) -> PlatformRoots {
        PlatformRoots { loaded: Some(Self::build(certs, errors)) }
    }

    /// The roots, and why there are none if there are none.
    fn get(&mut self) -> (Arc<RootCertStore>, Option<Arc<str>>) {
        self.loaded
            .get_or_insert_with(|| {
                let found = rustls_native_certs::load_native_certs();
                Self::build(found.certs, found.errors.iter().map(ToString::to_string).collect())
            })
            .clone()
    }

    fn build(certs: Vec<CertificateDer<'static>>, errors: Vec<String>) -> (Arc<RootCertStore>, Option<Arc<str>>) {
        let mut roots = RootCertStore::empty();
        let (added, _unusable) = roots.add_parsable_certificates(certs);
        let no_roots = (added == 0).then(|| {
            let mut why = "no root certificate was found in the platform's store".to_string();
            if !errors.is_empty() {
                why.push_str(&format!(" ({})", errors.join("; ")));
            }
            why.into()
        });
        (Arc::new(roots), no_roots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> ServerName<'static> {
        ServerName::try_from("localhost").unwrap()
    }

    #[test]
    fn a_route_without_roots_says_so_and_one_with_a_ca_file_does_not_look() {
        let mut none = PlatformRoots::from_certs(Vec::new(), vec!["no such file".into()]);
        let tls = UpstreamTls::named(name(), UpstreamTlsFiles::default(), false).read(&mut none).unwrap();
        assert!(tls.is_read());
        let why = tls.no_roots().expect("no roots is said");
        assert!(why.contains("no root certificate") && why.contains("no such file"), "{why}");

        let tmp = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
        let ca_file = tmp.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let files = UpstreamTlsFiles { ca_file: Some(ca_file), ..Default::default() };
        let tls = UpstreamTls::named(name(), files, false).read(&mut none).unwrap();
        assert_eq!(tls.no_roots(), None);
    }

    #[test]
    fn each_bad_file_is_named_by_its_field() {
        let tmp = tempfile::tempdir().unwrap();
        let write = |file: &str, text: &str| {
            let path = tmp.path().join(file);
            std::fs::write(&path, text).unwrap();
            Some(path)
        };
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["client".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 5, 6);
        let cert = params.self_signed(&key).unwrap();
        let other_key = rcgen::KeyPair::generate().unwrap();
        let field = |files: UpstreamTlsFiles| {
            let mut roots = PlatformRoots::from_certs(Vec::new(), Vec::new());
            UpstreamTls::named(name(), files, false).read(&mut roots).map(|_| ()).map_err(|p| p.field)
        };
        let good = UpstreamTlsFiles {
            ca_file: write("ca.pem", &cert.pem()),
            client_cert: write("c.pem", &cert.pem()),
            client_key: write("k.pem", &key.serialize_pem()),
        };
        assert_eq!(field(good.clone()), Ok(()));
        let mut roots = PlatformRoots::from_certs(Vec::new(), Vec::new());
        let read = UpstreamTls::named(name(), good.clone(), false).read(&mut roots).unwrap();
        // 2031-05-06T00:00:00Z
        let not_after = 1_935_792_000;
        assert_eq!(read.expiry(), UpstreamExpiry { ca_file: Some(not_after), client_cert: Some(not_after) });
        let missing = Some(tmp.path().join("missing.pem"));
        assert_eq!(field(UpstreamTlsFiles { ca_file: missing.clone(), ..good.clone() }), Err("ca_file"));
        assert_eq!(field(UpstreamTlsFiles { ca_file: write("bad.pem", "not PEM"), ..good.clone() }), Err("ca_file"));
        assert_eq!(field(UpstreamTlsFiles { client_cert: missing.clone(), ..good.clone() }), Err("client_cert"));
        let as_cert = write("key-as-cert.pem", &key.serialize_pem());
        assert_eq!(field(UpstreamTlsFiles { client_cert: as_cert, ..good.clone() }), Err("client_cert"));
        assert_eq!(field(UpstreamTlsFiles { client_key: missing, ..good.clone() }), Err("client_key"));
        let mismatched = write("other.pem", &other_key.serialize_pem());
        assert_eq!(field(UpstreamTlsFiles { client_key: mismatched, ..good.clone() }), Err("client_key"));
    }

    #[test]
    fn pem_errors_say_what_the_file_lacks() {
        assert!(matches!(pem_certificates(b"not PEM"), Err(PemError::NoCertificate)));
        assert_eq!(pem_certificates(b"").unwrap_err().to_string(), "holds no PEM certificate");
        let cut = b"-----BEGIN CERTIFICATE-----\nabc";
        let e = pem_certificates(cut).unwrap_err();
        assert!(matches!(e, PemError::Certificates(_)), "{e:?}");
        assert!(std::error::Error::source(&e).is_some(), "the PEM parser's error is the source");
        assert!(e.to_string().starts_with("not a PEM certificate file: "), "{e}");
        let e = pem_private_key(b"not PEM").unwrap_err();
        assert_eq!(e.to_string(), "no usable PEM private key: no items found");
    }
}
