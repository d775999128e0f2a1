//! The handles of the counters and gauges that parts other than the request
//! path keep: the reloaders, the TLS files' watch, the listeners.

use std::sync::atomic::AtomicI64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::CertificateExpiry;

/// `fencegate_tls_reloads_total{outcome}`: TLS files read again after a
/// change, and served (`applied`) or not (`refused`: the last good ones serve).
#[derive(Clone, Debug)]
pub struct TlsReloads {
    pub applied: Counter,
    pub refused: Counter,
    pub(super) certificates: CertificateExpiry,
}

impl TlsReloads {
    /// Shows when the certificates served now expire (the earliest notAfter
    /// of the chain and of the client CA bundle, Unix seconds).
    pub fn served_certificates(&self, cert: Option<i64>, client_ca: Option<i64>) {
        self.certificates.served(cert, client_ca);
    }
}

/// One open connection of a listener, counted in
/// `fencegate_open_connections` until it is dropped.
#[derive(Debug)]
pub struct OpenConnection(Gauge<i64, AtomicI64>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A listener's `fencegate_open_connections` series.
#[derive(Clone, Debug, Default)]
pub struct ConnectionCount(Gauge<i64, AtomicI64>);

impl ConnectionCount {
    pub(super) fn new(gauge: Gauge<i64, AtomicI64>) -> ConnectionCount {
        ConnectionCount(gauge)
    }

    /// Counts one more connection, until the guard is dropped.
    pub fn opened(&self) -> OpenConnection {
        self.0.inc();
        OpenConnection(self.0.clone())
    }
}

/// `fencegate_config_reloads_total{outcome}`: config reloads applied, and
/// refused because the new config does not validate or changes what only a
/// restart can (server/reload.rs).
#[derive(Clone, Debug)]
pub struct Reloads {
    pub applied: Counter,
    pub invalid: Counter,
    pub restart_needed: Counter,
}

/// `fencegate_abuse_total{what}`: connections closed for abuse (`strike`),
/// and new connections of the addresses struck held back before they were
/// served (`held`; server/penalty.rs).
#[derive(Clone, Debug)]
pub struct HeldBack {
    pub held: Counter,
    pub strikes: Counter,
}
