//! Requests that would open a tunnel: an HTTP/1.1 `Upgrade` (websocket, h2c,
//! anything else), a `CONNECT`, or HTTP/2's extended `CONNECT` (RFC 8441,
//! a `:protocol` pseudo-header).
//!
//! A tunnel is a write channel the fence cannot see into: once the upstream
//! answers 101 the two sockets are joined, and whatever the client sends
//! next reaches the upstream with no token, no signature and no turn, for as
//! long as the tunnel lives, long after the token that opened it was
//! superseded. So a route refuses them (400 `tunnel-refused`) unless it says
//! `unfenced_tunnels = true`, for upstreams whose tunnels carry nothing the
//! fence protects. Even then:
//! - `h2c` is never forwarded: the upstream would speak HTTP/2 on the
//!   connection, every stream of which would pass unfenced;
//! - `CONNECT` and extended `CONNECT` are refused: fencegate is a reverse
//!   proxy and opens no tunnel to another host, nor translates a websocket
//!   over HTTP/2 into HTTP/1.1.

use http::header::{self, HeaderMap};
use http::{Extensions, Method};

/// Why a request that would open a tunnel was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TunnelError {
    #[error(
        "the request asks to switch protocols (Upgrade: {0}); a tunnel would carry writes past the fence, so this \
         route refuses it (a route may allow unfenced tunnels with unfenced_tunnels = true)"
    )]
    Upgrade(String),
    #[error(
        "the request asks to switch to h2c (HTTP/2 in clear), which fencegate never forwards: every stream of the \
         upgraded connection would pass unfenced; speak HTTP/2 to fencegate directly instead"
    )]
    H2c,
    #[error("fencegate opens no CONNECT tunnels: a tunnel would carry writes past the fence")]
    Connect,
    #[error(
        "the request is an extended CONNECT (:protocol {0}); fencegate forwards no tunnels opened over HTTP/2: a \
         tunnel would carry writes past the fence"
    )]
    ExtendedConnect(String),
}

/// `Err` when the request would open a tunnel that the route does not let
/// through (`unfenced_tunnels` lets HTTP/1.1 upgrades other than h2c pass).
/// `upgrade` is whether `headers` has an `Upgrade` field; without one, they
/// are not read.
pub(super) fn check(
    method: &Method,
    headers: &HeaderMap,
    upgrade: bool,
    extensions: &Extensions,
    unfenced_tunnels: bool,
) -> Result<(), TunnelError> {
    if let Some(protocol) = extensions.get::<hyper::ext::Protocol>() {
        return Err(TunnelError::ExtendedConnect(protocol.as_str().to_string()));
    }
    if method == Method::CONNECT {
        return Err(TunnelError::Connect);
    }
    if !upgrade {
        return Ok(());
    }
    // Any `Upgrade` field counts, whatever `Connection` says: a server that
    // switches on `Upgrade` alone must not be handed the choice.
    let mut upgrades = headers.get_all(header::UPGRADE).iter().peekable();
    if upgrades.peek().is_none() {
        return Ok(());
    }
    let mut named = String::new();
    for value in upgrades {
        let text = String::from_utf8_lossy(value.as_bytes());
        // Protocol names are compared without their version (`h2c/1`) and
        // case (RFC 9110 §7.8 makes them case-insensitive).
        if text
            .split(',')
            .any(|p| p.trim().split('/').next().is_some_and(|name| name.trim().eq_ignore_ascii_case("h2c")))
        {
            return Err(TunnelError::H2c);
        }
        if !named.is_empty() {
            named.push_str(", ");
        }
        named.push_str(text.trim());
    }
    if unfenced_tunnels {
        Ok(())
    } else {
        Err(TunnelError::Upgrade(named))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn check_with(method: &str, upgrade: &[&str], unfenced_tunnels: bool) -> Result<(), TunnelError> {
        let mut headers = HeaderMap::new();
        for value in upgrade {
            headers.append(header::UPGRADE, HeaderValue::from_str(value).unwrap());
        }
        let upgrade = headers.contains_key(header::UPGRADE);
        check(&Method::from_bytes(method.as_bytes()).unwrap(), &headers, upgrade, &Extensions::new(), unfenced_tunnels)
    }

    #[test]
    fn upgrades_are_refused_unless_the_route_allows_unfenced_tunnels() {
        assert_eq!(check_with("GET", &[], false), Ok(()));
        for method in ["GET", "HEAD", "OPTIONS", "PUT"] {
            assert_eq!(check_with(method, &["websocket"], false), Err(TunnelError::Upgrade("websocket".into())));
            assert_eq!(check_with(method, &["websocket"], true), Ok(()));
        }
        assert_eq!(check_with("GET", &["", "x"], false), Err(TunnelError::Upgrade("x".into())));
        assert_eq!(check_with("GET", &[""], false), Err(TunnelError::Upgrade(String::new())), "even an empty one");
    }

    #[test]
    fn h2c_connect_and_extended_connect_are_refused_everywhere() {
        for spelling in ["h2c", "H2C", "websocket, h2c", " h2c/1 ", "h2c/2.0"] {
            for allowed in [false, true] {
                assert_eq!(check_with("GET", &[spelling], allowed), Err(TunnelError::H2c), "{spelling}");
            }
        }
        assert_eq!(check_with("CONNECT", &[], true), Err(TunnelError::Connect));
        let mut extensions = Extensions::new();
        extensions.insert(hyper::ext::Protocol::from_static("websocket"));
        assert_eq!(
            check(&Method::CONNECT, &HeaderMap::new(), false, &extensions, true),
            Err(TunnelError::ExtendedConnect("websocket".into()))
        );
    }
}
