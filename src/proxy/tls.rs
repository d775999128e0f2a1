//! TLS to the upstream (`upstream = "https://..."`), with rustls: each https
//! route's client config (`config/tls.rs`, read with the config) is shared
//! by every connection the route opens.
//!
//! The handshake is part of connecting (`pool/connect.rs`): it counts in the
//! connect timeout, and a failed one is a failed connect (502, retried, since
//! nothing was sent). Failures are logged at warn with their reason, since
//! the next request will fail the same way until the certificates are fixed.

use std::error::Error;

use rustls::{AlertDescription, CertificateError};
use rustls_pki_types::ServerName;

use crate::config::UpstreamTls;

/// The connector for `tls`'s upstream, and the name to verify, once its
/// files were read.
pub(super) fn connector(tls: &UpstreamTls) -> Option<(tokio_rustls::TlsConnector, ServerName<'static>)> {
    let (config, name) = tls.client()?;
    Some((tokio_rustls::TlsConnector::from(config.clone()), name.clone()))
}

/// Why a TLS handshake with the upstream failed, in a word or two when the
/// upstream's certificate was refused (`unknown CA`, `name mismatch`,
/// `expired`...), or when the upstream refused ours.
pub(super) fn failure_reason(e: &(dyn Error + 'static)) -> &'static str {
    match rustls_error(e) {
        Some(rustls::Error::InvalidCertificate(cert)) => match cert {
            CertificateError::UnknownIssuer => "unknown CA",
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => "name mismatch",
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "expired",
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => "not valid yet",
            CertificateError::Revoked => "revoked",
            CertificateError::BadSignature => "bad signature",
            _ => "invalid certificate",
        },
        Some(rustls::Error::AlertReceived(alert)) if refuses_client_certificate(*alert) => {
            "the upstream refused the client certificate"
        }
        Some(rustls::Error::AlertReceived(_)) => "the upstream ended the handshake",
        Some(rustls::Error::NoApplicationProtocol) => "no common application protocol",
        Some(_) => "handshake failed",
        None => "connection failed",
    }
}

/// Whether `e` (an exchange on a connection just opened) failed because
/// the upstream refused this route's client certificate. Under TLS 1.3 the
/// client's handshake ends before the server has checked its certificate, so
/// the refusal arrives as an alert in place of the response; the server sends
/// it while reading the certificate, which comes before the request, so the
/// upstream has not acted on the request.
pub(super) fn refused_our_certificate(e: &(dyn Error + 'static)) -> bool {
    matches!(rustls_error(e), Some(rustls::Error::AlertReceived(alert)) if refuses_client_certificate(*alert))
}

/// Alerts a server sends about the client's certificate flight.
fn refuses_client_certificate(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
            | AlertDescription::DecryptError
    )
}

/// The rustls error somewhere in `e`'s chain. An `io::Error` that wraps one
/// (as tokio-rustls reports them) gives it through `get_ref`, not `source`.
fn rustls_error<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            if let Some(found) = inner.downcast_ref::<rustls::Error>() {
                return Some(found);
            }
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_found_through_io_errors() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        assert_eq!(failure_reason(&io), "unknown CA");
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
        );
        assert!(refused_our_certificate(&alert));
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!refused_our_certificate(&reset));
        assert_eq!(failure_reason(&reset), "connection failed");
    }
}
