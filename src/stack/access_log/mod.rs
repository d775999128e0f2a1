//! The access log: one `fencegate::access` event and one metrics update per
//! response, with the decision the layers below recorded in its body
//! ([`ProxyBody`](crate::http::ProxyBody)).
//!
//! Outermost but for the server's count of requests in flight, so it sees
//! every response, the ones fencegate makes itself below included.
//!
//! tower-http's trace layer is the layer, its service and its future;
//! fencegate configures it (layer.rs) and brings what happens per response
//! (on_response.rs) and the line itself (line.rs).

mod layer;
mod line;
mod on_response;

pub use layer::access_log;
pub use on_response::AccessLog;
