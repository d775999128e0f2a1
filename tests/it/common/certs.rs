//! Certificates made at test time (rcgen): a CA of a test's own, and the
//! certificates it issues.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A certificate authority made for one test.
pub struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Ca(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    pub fn pem(&self) -> String {
        self.0.pem()
    }

    /// A certificate for `localhost` and 127.0.0.1 named `name`, and its key.
    pub fn issue(&self, name: &str) -> Identity {
        self.issue_for(name, &["localhost", "127.0.0.1"])
    }

    /// A certificate for `hosts` (DNS names or IP addresses) named `name`, and its key.
    pub fn issue_for(&self, name: &str, hosts: &[&str]) -> Identity {
        let mut params = CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.0).unwrap();
        Identity { cert: cert.pem(), key: key.serialize_pem(), der: cert.der().to_vec() }
    }
}

/// A certificate with its key, as PEM, and the certificate as DER.
#[derive(Clone)]
pub struct Identity {
    pub cert: String,
    pub key: String,
    pub der: Vec<u8>,
}
