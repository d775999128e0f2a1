//! The upstream client: each client connection's own upstream connections
//! (HTTP/1.1, or HTTP/2 streams shared by all) within each route's cap, in
//! clear or over TLS (`tls.rs`), and the header rewrite. This module knows
//! nothing of tokens or layers: the stack's forward (`stack/forward`) hands
//! it a request the fence has decided on. Who the client is (`client.rs`:
//! its address, the one a trusted proxy names) is decided here too, beside
//! the `X-Forwarded-For` it is forwarded in.

mod client;
mod error;
mod headers;
mod pool;
mod tls;

pub use client::{ClientAddr, TrustedProxies};
pub use error::UpstreamError;
pub use headers::{add_forwarded, strip_found, strip_hop_by_hop, HopFields};

pub use pool::{Parking, StreamHeld, UpstreamSlots, Upstreams};
