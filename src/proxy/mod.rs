//! The upstream client: each client connection's own upstream connections
//! (HTTP/1.1, or HTTP/2 streams shared by all) within each route's cap, in
//! clear or over TLS (`tls.rs`), and the header rewrite. This module knows
//! nothing of tokens or layers: the stack's forward (`stack/forward`) hands
//! it a request the fence has decided on.

mod error;
mod headers;
mod pool;
mod tls;

use std::net::SocketAddr;

use http::header::HeaderValue;

pub use error::UpstreamError;
pub use headers::{add_forwarded, strip_found, strip_hop_by_hop, HopFields};

pub use pool::{Parking, StreamHeld, UpstreamSlots, Upstreams};

/// The client's address, for `X-Forwarded-For`.
#[derive(Debug, Clone)]
pub struct ClientAddr {
    /// The IP as a header value, formatted once per connection.
    ip: HeaderValue,
    /// `X-Forwarded-Proto`: `http`, or `https` over TLS.
    proto: HeaderValue,
}

impl ClientAddr {
    /// A client over plain HTTP.
    pub fn new(addr: SocketAddr) -> ClientAddr {
        let ip = HeaderValue::try_from(addr.ip().to_string()).expect("an IP address is a valid header value");
        ClientAddr { ip, proto: HeaderValue::from_static("http") }
    }

    /// The same client, over TLS.
    pub fn over_tls(self) -> ClientAddr {
        ClientAddr { proto: HeaderValue::from_static("https"), ..self }
    }

    /// The client's IP, as `X-Forwarded-For` names it.
    pub fn ip(&self) -> &HeaderValue {
        &self.ip
    }

    /// Whether the client speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.proto == "https"
    }
}
