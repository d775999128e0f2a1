//! The PROXY protocol header (`[server] proxy_protocol`): a load balancer in
//! front that speaks it (HAProxy, AWS NLB, nginx's `proxy_protocol on`)
//! starts each connection with the client's address, before TLS and HTTP.
//!
//! When it is on, every proxy connection must start with the header of the
//! version configured: one without it, with a malformed one, or with one
//! past [`MAX_V2_BYTES`] is closed before anything else is read, as HAProxy's
//! `accept-proxy` and nginx's `listen ... proxy_protocol` do; the header must
//! arrive within `header_read_timeout`, as a request head must. Exactly the
//! header's bytes are read, so what follows (a TLS handshake, a request) is
//! read by what reads it without the header. The parsing itself is the `ppp`
//! crate's.
//!
//! The source address it names is the connection's client from then on;
//! a `LOCAL` header (v2, the balancer's own health checks) or `UNKNOWN` (v1)
//! names none, and the connection's peer stays its client.

use std::net::{IpAddr, SocketAddr};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::config::ProxyProtocol;

/// The longest a v1 header may be, `\r\n` included (the specification's).
pub const MAX_V1_BYTES: usize = 107;
/// The longest v2 header taken, its 16-byte preamble included: room for the
/// addresses and the TLVs balancers add (AWS's endpoint id, GCP's, TLS
/// details), well short of the 64 KiB the length field could claim.
pub const MAX_V2_BYTES: usize = 1024;

/// What starts every v2 header.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// What starts every v1 header.
const V1_PREFIX: &[u8; 6] = b"PROXY ";

/// Why a connection was closed at its PROXY header.
#[derive(Debug, thiserror::Error)]
pub enum ProxyHeaderError {
    #[error("the connection does not start with a PROXY protocol {0} header")]
    Missing(&'static str),
    #[error("its PROXY header is longer than {0} bytes")]
    TooLong(usize),
    #[error("its PROXY header is malformed: {0}")]
    Malformed(String),
    #[error("reading its PROXY header: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads the PROXY header `accepted` asks for from the start of `stream`:
/// the client's address it names, or `None` when it names none (the peer
/// stays the client).
pub async fn read(stream: &mut TcpStream, accepted: ProxyProtocol) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    let expected = match accepted {
        ProxyProtocol::Off => return Ok(None),
        ProxyProtocol::V1 => "v1",
        ProxyProtocol::V2 => "v2",
        ProxyProtocol::Any => "v1 or v2",
    };
    let mut buf = [0u8; MAX_V2_BYTES];
    // Both versions tell themselves apart in their first six bytes, and no
    // header is shorter.
    stream.read_exact(&mut buf[..6]).await?;
    let v1 = matches!(accepted, ProxyProtocol::V1 | ProxyProtocol::Any) && buf[..6] == V1_PREFIX[..];
    let v2 = matches!(accepted, ProxyProtocol::V2 | ProxyProtocol::Any) && buf[..6] == V2_SIGNATURE[..6];
    if v1 {
        let len = read_v1_line(stream, &mut buf[..MAX_V1_BYTES]).await?;
        let header = ppp::v1::Header::try_from(&buf[..len]).map_err(|e| ProxyHeaderError::Malformed(e.to_string()))?;
        return Ok(match header.addresses {
            ppp::v1::Addresses::Tcp4(a) => Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port)),
            ppp::v1::Addresses::Tcp6(a) => Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port)),
            ppp::v1::Addresses::Unknown => None,
        });
    }
    if !v2 {
        return Err(ProxyHeaderError::Missing(expected));
    }
    stream.read_exact(&mut buf[6..16]).await?;
    if buf[..12] != V2_SIGNATURE {
        return Err(ProxyHeaderError::Missing(expected));
    }
    let len = 16 + usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if len > MAX_V2_BYTES {
        return Err(ProxyHeaderError::TooLong(MAX_V2_BYTES));
    }
    stream.read_exact(&mut buf[16..len]).await?;
    let header = ppp::v2::Header::try_from(&buf[..len]).map_err(|e| ProxyHeaderError::Malformed(e.to_string()))?;
    if header.command == ppp::v2::Command::Local {
        return Ok(None);
    }
    Ok(match header.addresses {
        ppp::v2::Addresses::IPv4(a) => Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port)),
        ppp::v2::Addresses::IPv6(a) => Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port)),
        // Unix sockets and unspecified families name no IP client.
        _ => None,
    })
}

/// Reads the rest of a v1 header (its first six bytes are in `buf`) up to
/// and including its `\n`, and no further: the bytes are peeked, and only
/// the header's taken. Its length.
async fn read_v1_line(stream: &mut TcpStream, buf: &mut [u8]) -> Result<usize, ProxyHeaderError> {
    let mut len = 6;
    loop {
        let peeked = stream.peek(&mut buf[len..]).await?;
        if peeked == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        match buf[len..len + peeked].iter().position(|&b| b == b'\n') {
            Some(at) => {
                stream.read_exact(&mut buf[len..len + at + 1]).await?;
                return Ok(len + at + 1);
            }
            None if len + peeked >= buf.len() => return Err(ProxyHeaderError::TooLong(MAX_V1_BYTES)),
            // Not all here yet: take what came (it is all header), and wait
            // for more rather than peek the same bytes again.
            None => {
                stream.read_exact(&mut buf[len..len + peeked]).await?;
                len += peeked;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;

    /// What `read` makes of `bytes` sent in `pieces` (split where given),
    /// and what the stream holds after it.
    async fn read_sent(accepted: ProxyProtocol, pieces: &[&[u8]]) -> (Result<Option<SocketAddr>, String>, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            for piece in pieces {
                c.write_all(&piece).await.unwrap();
                c.flush().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            c.shutdown().await.unwrap();
        });
        let (mut stream, _) = listener.accept().await.unwrap();
        let got = read(&mut stream, accepted).await.map_err(|e| e.to_string());
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
        client.await.unwrap();
        (got, rest)
    }

    fn v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
        let addresses = match (source, destination) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => {
                ppp::v2::Addresses::IPv4(ppp::v2::IPv4::new(*s.ip(), *d.ip(), s.port(), d.port()))
            }
            (SocketAddr::V6(s), SocketAddr::V6(d)) => {
                ppp::v2::Addresses::IPv6(ppp::v2::IPv6::new(*s.ip(), *d.ip(), s.port(), d.port()))
            }
            _ => unreachable!(),
        };
        ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Proxy,
            ppp::v2::Protocol::Stream,
            addresses,
        )
        .build()
        .unwrap()
    }

    #[tokio::test]
    async fn a_v1_header_names_the_client_and_only_it_is_read() {
        let header = b"PROXY TCP4 192.0.2.7 198.51.100.1 40000 8080\r\n";
        let (got, rest) = read_sent(ProxyProtocol::V1, &[header, b"GET / HTTP/1.1\r\n"]).await;
        assert_eq!(got, Ok(Some("192.0.2.7:40000".parse().unwrap())));
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
        // In pieces, the line split in its middle.
        let (got, rest) = read_sent(ProxyProtocol::Any, &[b"PROXY TCP6 2001:db8", b"::7 2001:db8::1 1 2\r\nX"]).await;
        assert_eq!(got, Ok(Some("[2001:db8::7]:1".parse().unwrap())));
        assert_eq!(rest, b"X");
        let (got, _) = read_sent(ProxyProtocol::V1, &[b"PROXY UNKNOWN\r\n"]).await;
        assert_eq!(got, Ok(None));
    }

    #[tokio::test]
    async fn a_v2_header_names_the_client_and_only_it_is_read() {
        let mut sent = v2("192.0.2.7:40000".parse().unwrap(), "198.51.100.1:8080".parse().unwrap());
        sent.extend_from_slice(b"rest");
        let (got, rest) = read_sent(ProxyProtocol::V2, &[&sent]).await;
        assert_eq!(got, Ok(Some("192.0.2.7:40000".parse().unwrap())));
        assert_eq!(rest, b"rest");
        let sent = v2("[2001:db8::7]:1".parse().unwrap(), "[2001:db8::1]:2".parse().unwrap());
        let (got, _) = read_sent(ProxyProtocol::Any, &[&sent[..10], &sent[10..]]).await;
        assert_eq!(got, Ok(Some("[2001:db8::7]:1".parse().unwrap())));
    }

    #[tokio::test]
    async fn what_is_not_the_header_configured_is_refused() {
        let v1 = b"PROXY TCP4 192.0.2.7 198.51.100.1 40000 8080\r\n";
        let sent = v2("192.0.2.7:1".parse().unwrap(), "198.51.100.1:2".parse().unwrap());
        for (accepted, bytes) in [
            (ProxyProtocol::V1, &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]),
            (ProxyProtocol::Any, &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]),
            (ProxyProtocol::V2, &v1[..]),
            (ProxyProtocol::V1, &sent[..]),
        ] {
            let (got, _) = read_sent(accepted, &[bytes]).await;
            assert!(got.as_ref().is_err_and(|e| e.contains("does not start")), "{accepted:?}: {got:?}");
        }
        let (got, _) = read_sent(ProxyProtocol::V1, &[b"PROXY TCP4 not-an-address 1.2.3.4 1 2\r\n"]).await;
        assert!(got.as_ref().is_err_and(|e| e.contains("malformed")), "{got:?}");
        let long = [&b"PROXY TCP4 "[..], &[b'1'; 200][..]].concat();
        let (got, _) = read_sent(ProxyProtocol::V1, &[&long]).await;
        assert!(got.as_ref().is_err_and(|e| e.contains("longer than 107")), "{got:?}");
        let mut huge = sent.clone();
        huge[14..16].copy_from_slice(&2000u16.to_be_bytes());
        let (got, _) = read_sent(ProxyProtocol::V2, &[&huge]).await;
        assert!(got.as_ref().is_err_and(|e| e.contains("longer than 1024")), "{got:?}");
        let (got, _) = read_sent(ProxyProtocol::V1, &[b"PROXY TCP4 1.2.3.4"]).await;
        assert!(got.is_err(), "ended before its line: {got:?}");
    }
}
