//! Who the client is: the connection's address (its TCP peer, or the source
//! its PROXY protocol header names), and, when that address is a trusted
//! proxy's (`[server] trusted_proxies`), the address its `X-Forwarded-For`
//! names.
//!
//! The walk is the usual one (nginx's `real_ip_recursive`, Envoy's
//! `xff_num_trusted_hops` by address): from the right end of
//! `X-Forwarded-For`, past every address inside a trusted CIDR, to the first
//! one that is not; that is the client. Everything to its left was written
//! by the client or by proxies nobody vouches for, so it is never believed.
//! A connection from an address that is not trusted has its
//! `X-Forwarded-For` ignored for this: its client is its own address.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use http::header::{HeaderMap, HeaderValue};

static X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

/// `[server] trusted_proxies`: the addresses whose `X-Forwarded-For` is believed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TrustedProxies(Vec<ipnet::IpNet>);

impl TrustedProxies {
    pub fn new(nets: Vec<ipnet::IpNet>) -> TrustedProxies {
        TrustedProxies(nets)
    }

    /// Whether none is trusted (the default): nothing is looked up then.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` is inside a trusted CIDR; an IPv4 address mapped into
    /// IPv6 counts as the IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request from the trusted address `peer`: the
    /// rightmost address of `headers`' `X-Forwarded-For` (all its fields,
    /// in order, as one list) that is not trusted. Walking left stops at an
    /// entry that is not an IP address (nothing past it is believed): the
    /// client is then the last address reached, as when every entry is
    /// trusted. No `X-Forwarded-For`: `peer`.
    pub fn client_of(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer;
        for value in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
            let Ok(list) = value.to_str() else { return client };
            for entry in list.rsplit(',') {
                let entry = entry.trim();
                if entry.is_empty() {
                    continue;
                }
                let Some(ip) = parse_entry(entry) else { return client };
                client = ip.to_canonical();
                if !self.contains(client) {
                    return client;
                }
            }
        }
        client
    }
}

/// One `X-Forwarded-For` entry: an address, or as some proxies write it, an
/// IPv4 address with a port or a bracketed IPv6 address with or without one.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = entry.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    entry.strip_prefix('[')?.strip_suffix(']')?.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
}

/// A client connection's address, for `X-Forwarded-For`, the access log and
/// the abuse penalty.
#[derive(Debug, Clone)]
pub struct ClientAddr {
    /// The connection's address (its peer, or its PROXY header's source).
    pub(super) addr: IpAddr,
    /// The IP as a header value, formatted once per connection.
    pub(super) ip: HeaderValue,
    /// `X-Forwarded-Proto`: `http`, or `https` over TLS.
    pub(super) proto: HeaderValue,
    /// Set when the address is a trusted proxy's: its requests' clients are
    /// the ones their `X-Forwarded-For` names.
    behind: Option<Arc<BehindProxy>>,
}

/// What a connection from a trusted proxy knows of the clients behind it.
#[derive(Debug)]
pub struct BehindProxy {
    proxies: Arc<TrustedProxies>,
    /// The client its last request named: what a strike for abuse of the
    /// connection falls on (never the proxy's own address).
    last: Mutex<Option<IpAddr>>,
}

impl ClientAddr {
    /// A client over plain HTTP.
    pub fn new(addr: SocketAddr) -> ClientAddr {
        let ip = HeaderValue::try_from(addr.ip().to_string()).expect("an IP address is a valid header value");
        ClientAddr { addr: addr.ip(), ip, proto: HeaderValue::from_static("http"), behind: None }
    }

    /// The same client, over TLS.
    pub fn over_tls(self) -> ClientAddr {
        ClientAddr { proto: HeaderValue::from_static("https"), ..self }
    }

    /// The same client, whose `X-Forwarded-For` is believed if its address
    /// is in `proxies`.
    pub fn trusting(self, proxies: &Arc<TrustedProxies>) -> ClientAddr {
        if proxies.is_empty() || !proxies.contains(self.addr) {
            return self;
        }
        let behind = BehindProxy { proxies: proxies.clone(), last: Mutex::new(None) };
        ClientAddr { behind: Some(Arc::new(behind)), ..self }
    }

    /// Whether the client speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.proto == "https"
    }

    /// The connection's address, as text.
    pub fn ip_text(&self) -> &str {
        self.ip.to_str().unwrap_or_default()
    }

    /// The client of a request with these `headers`, if it is not the
    /// connection's own address (`None`: it is): the one `X-Forwarded-For`
    /// names when the connection is a trusted proxy's. It becomes the
    /// client a strike of this connection falls on.
    pub fn behind_proxy(&self, headers: &HeaderMap) -> Option<IpAddr> {
        let behind = self.behind.as_deref()?;
        let client = behind.proxies.client_of(self.addr, headers);
        *behind.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(client);
        Some(client)
    }

    /// The address a strike of this connection for abuse falls on: its own,
    /// or behind a trusted proxy the client its last request named (`None`
    /// before any: a trusted proxy is never struck itself).
    pub fn struck_address(&self) -> Option<IpAddr> {
        match &self.behind {
            None => Some(self.addr),
            Some(behind) => *behind.last.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(nets: &[&str]) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().unwrap()).collect())
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&X_FORWARDED_FOR, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_client_is_the_rightmost_untrusted_address() {
        let t = trusted(&["10.0.0.0/8", "2001:db8::/32"]);
        let peer = ip("10.0.0.1");
        assert_eq!(t.client_of(peer, &xff(&[])), peer);
        assert_eq!(t.client_of(peer, &xff(&["1.2.3.4"])), ip("1.2.3.4"));
        // The client wrote 6.6.6.6 itself: only the address the trusted
        // proxy appended is believed.
        assert_eq!(t.client_of(peer, &xff(&["6.6.6.6, 1.2.3.4, 10.0.0.9"])), ip("1.2.3.4"));
        assert_eq!(t.client_of(peer, &xff(&["6.6.6.6", "1.2.3.4 , 10.0.0.9"])), ip("1.2.3.4"));
        assert_eq!(t.client_of(peer, &xff(&["10.0.0.3, 10.0.0.9"])), ip("10.0.0.3"), "all trusted: the leftmost");
        assert_eq!(t.client_of(peer, &xff(&["1.2.3.4, bogus, 10.0.0.9"])), ip("10.0.0.9"), "stops at garbage");
        assert_eq!(t.client_of(peer, &xff(&["bogus"])), peer);
        assert_eq!(t.client_of(peer, &xff(&["1.2.3.4:5678"])), ip("1.2.3.4"));
        assert_eq!(t.client_of(peer, &xff(&["[2001:db9::1]:80, 2001:db8::5"])), ip("2001:db9::1"));
        assert_eq!(t.client_of(peer, &xff(&["[2001:db9::2]"])), ip("2001:db9::2"));
        assert_eq!(t.client_of(peer, &xff(&["::ffff:1.2.3.4"])), ip("1.2.3.4"));
        assert_eq!(t.client_of(peer, &xff(&["::ffff:10.0.0.4"])), ip("10.0.0.4"), "mapped is trusted too");
    }

    #[test]
    fn only_a_trusted_address_is_behind_a_proxy() {
        let proxies = Arc::new(trusted(&["127.0.0.2/32"]));
        let headers = xff(&["1.2.3.4"]);
        let untrusted = ClientAddr::new(SocketAddr::from(([127, 0, 0, 1], 1))).trusting(&proxies);
        assert_eq!(untrusted.behind_proxy(&headers), None);
        assert_eq!(untrusted.struck_address(), Some(ip("127.0.0.1")));
        let proxy = ClientAddr::new(SocketAddr::from(([127, 0, 0, 2], 1))).trusting(&proxies);
        assert_eq!(proxy.struck_address(), None, "never the proxy itself");
        assert_eq!(proxy.behind_proxy(&headers), Some(ip("1.2.3.4")));
        assert_eq!(proxy.struck_address(), Some(ip("1.2.3.4")));
        assert_eq!(proxy.ip_text(), "127.0.0.2");
    }
}
