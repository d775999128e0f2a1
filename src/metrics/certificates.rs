//! `fencegate_tls_certificate_expiry_timestamp_seconds{certificate, route}`:
//! when each certificate file fencegate serves or trusts expires, as the Unix
//! time of its earliest notAfter (Prometheus's convention for a moment: an
//! alert subtracts `time()`). Set when the files are read: at start, when the
//! served files are reloaded, and when a config reload puts routes in service.

use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::config::RouteConfig;

/// Which certificate file a series is of.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    /// `served` (`[server.tls] cert`), `client_ca` (`[server.tls]
    /// client_ca`), `upstream_ca` (a route's `ca_file`) or `upstream_client`
    /// (a route's `client_cert`).
    certificate: &'static str,
    /// The route, for an upstream's files; empty for the server's.
    route: String,
}

/// The expiry series, shared by the server's TLS files and the routes'.
#[derive(Clone, Debug, Default)]
pub struct CertificateExpiry {
    family: Family<CertificateLabels, Gauge<i64, AtomicI64>>,
    /// The upstream series shown now, to remove when the routes change.
    upstream: Arc<Mutex<Vec<CertificateLabels>>>,
}

impl CertificateExpiry {
    pub(super) fn register(registry: &mut Registry) -> CertificateExpiry {
        let expiry = CertificateExpiry::default();
        registry.register(
            "fencegate_tls_certificate_expiry_timestamp_seconds",
            "When a certificate file expires: the earliest notAfter of its certificates, in seconds since the Unix \
             epoch, by certificate (served, client_ca, upstream_ca, upstream_client) and route (upstream files)",
            expiry.family.clone(),
        );
        expiry
    }

    fn set(&self, certificate: &'static str, route: &str, not_after: Option<i64>) {
        let labels = CertificateLabels { certificate, route: route.to_string() };
        match not_after {
            Some(at) => {
                self.family.get_or_create(&labels).set(at);
            }
            None => {
                self.family.remove(&labels);
            }
        }
    }

    /// The server's chain and client CA bundle, as served now.
    pub fn served(&self, cert: Option<i64>, client_ca: Option<i64>) {
        self.set("served", "", cert);
        self.set("client_ca", "", client_ca);
    }

    /// The upstream files of `routes`, the routes in service now: the series
    /// of routes no longer served (or no longer naming a file) go.
    pub fn upstreams<'a>(&self, routes: impl IntoIterator<Item = &'a RouteConfig>) {
        let mut shown = self.upstream.lock().unwrap_or_else(PoisonError::into_inner);
        for labels in shown.drain(..) {
            self.family.remove(&labels);
        }
        for route in routes {
            let expiry = route.upstream_tls.as_ref().map(|tls| tls.expiry()).unwrap_or_default();
            for (certificate, not_after) in [("upstream_ca", expiry.ca_file), ("upstream_client", expiry.client_cert)] {
                if let Some(at) = not_after {
                    let labels = CertificateLabels { certificate, route: route.name.to_string() };
                    self.family.get_or_create(&labels).set(at);
                    shown.push(labels);
                }
            }
        }
    }
}
