//! Canonicalize + route: the first step that looks at the target (only the
//! access log, the rescue and the header count come before it), so every
//! step after it sees one spelling of each resource.
//!
//! Before any route or fence sees a request, its target is put in the one form
//! it is routed, keyed, signed and forwarded by (see [`crate::canonical`]):
//!
//! - the path is canonical (escapes, dot segments, repeated slashes), and a
//!   path that cannot be made so unambiguously is refused (400 `bad-path`);
//! - the host (`Host`, an absolute-form target's authority, HTTP/2
//!   `:authority`) is canonical and becomes the `Host` header; a malformed
//!   one, or two that disagree, is refused (400 `bad-host`);
//! - an HTTP/2 header value with leading or trailing whitespace (which RFC 9113
//!   §8.2.1 forbids, and servers strip) is refused (400 `bad-header`);
//! - the request is fenced when its method, exactly as sent, or a
//!   method-override header names a method the route does not list as safe;
//!   overrides that disagree are refused (400 `method-override`);
//! - header names spelled with `_` are dropped (servers that fold `_` into `-`
//!   would read them as other fields), unless `[server]
//!   underscores_in_headers` passes them; then two that fold into one are
//!   refused (400 `bad-header`);
//! - a request that would open a tunnel (`Upgrade`, `CONNECT`, extended
//!   `CONNECT`) is refused (400 `tunnel-refused`) unless its route allows
//!   unfenced tunnels; h2c and CONNECT tunnels are refused on every route;
//! - a fenced request's WebDAV `Destination` is made canonical and routed too:
//!   its host must be the request's, and its route must send to the same
//!   upstream (400 `bad-destination` otherwise).
//!
//! The request then goes on as [`Routed`]; no route is 404.

mod destination;
mod fields;
mod host;
mod method;
mod path;
mod routed;
mod service;
#[cfg(test)]
mod tests;
mod tunnel;
mod underscores;

pub use destination::{Destination, DestinationError, DESTINATION};
pub use host::RequestHostError;
pub use routed::Routed;
pub(crate) use service::route_request;
pub use tunnel::TunnelError;
pub use underscores::FoldedHeaders;
