//! The bottom floor: what every layer shares, and nothing else of the crate.
//!
//! The bodies a request and its response travel in ([`ClientBody`] as hyper
//! hands it over, [`ProxyBody`] back out, with the [`Decision`] the access
//! log reads), the outcomes and problem+json documents of refusals, the
//! refuse-or-pass future every refusing layer returns, and the wrappers for
//! sockets and futures that both the listener and the upstream pool use.
//! Nothing here imports another module of the crate.

mod client_body;
mod outcome;
pub mod problem;
mod refused;
mod response;
pub(crate) mod stream;
mod woken;

pub use client_body::{ClientBody, OpenBodies};
pub use outcome::{Decision, Outcome, RouteLabel, RouteTag};
pub use refused::RefusedOr;
pub use response::{decide, refuses_heads_with, BoxError, Guard, ProxyBody, UpstreamAnswer};
pub(crate) use woken::WokenOnly;
