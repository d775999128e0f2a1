//! The bottom floor: what every layer shares, and nothing else of the crate.
//!
//! The bodies a request and its response travel in ([`ClientBody`] as hyper
//! hands it over, [`ProxyBody`] back out, with the [`Decision`] the access
//! log reads), the outcomes and problem+json documents of refusals, the
//! refuse-or-pass future every refusing layer returns, the request IDs, and the wrappers for
//! sockets and futures that both the listener and the upstream pool use.
//! Nothing here imports another module of the crate.

pub(crate) mod body;
mod outcome;
pub mod problem;
mod request_id;
pub(crate) mod stream;
pub(crate) mod teardown;
mod woken;

pub use body::{
    decide, declared_length, overran_limit, refuses_heads_with, BoxError, BudgetFull, BufferBudget, ClientBody,
    Delivery, Guard, Handover, Held, OpenBodies, Overran, ProxyBody, RequestBody, UpstreamAnswer,
};
pub(crate) use body::{ReadError, Reader};
pub use outcome::{Decision, Outcome, RouteLabel, RouteTag};
pub use request_id::{request_id, REQUEST_ID};
pub use teardown::Teardown;
pub(crate) use woken::WokenOnly;
