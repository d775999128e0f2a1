//! The access log: one `fencegate::access` event and one metrics update per
//! response, with the decision the layers below recorded in its body
//! ([`ProxyBody`](crate::http::ProxyBody)).
//!
//! Outermost but for the server's count of requests in flight, so it sees
//! every response, the ones fencegate makes itself below included.
//!
//! The layer (layer.rs) opens a debug span per request, which its service
//! (service.rs) calls the inner service in, and its future and the response
//! body (future.rs) are polled in. The future times the request from the
//! moment it is handed over to its response head, with one clock read at
//! each end; what happens then (on_response.rs) counts the response and
//! writes its line (line.rs). (tower-http's trace layer did the same with
//! four more clock reads per request, for body chunk and end-of-stream
//! callbacks the access log has none of.)

mod future;
mod layer;
mod line;
mod on_response;
mod service;

pub use layer::access_log;
pub use on_response::AccessLog;
