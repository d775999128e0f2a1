//! The bodies a request and its response travel in, and what reading a
//! fenced body whole needs: a reader bounded by a limit, blocks to hold the
//! bytes, and the buffer budget they count against (the process's, and one
//! client connection's share of it). What the request path does with them
//! (413 past `max_body`, 503 with `Retry-After` when a budget is full, a
//! fenced body read whole before its key's turn) is the body step's, and is
//! written down there: `stack/body`.
//!
//! The budget counts what is allocated, not what arrived: a declared length
//! is one allocation of exactly that size, and other bodies are copied into
//! blocks whose whole capacity is taken before a byte goes in. Nothing keeps
//! a reference into hyper's read buffers, which a small chunk would otherwise
//! pin whole. Blocks of 16 KiB and more are memory mapped for themselves, so
//! what a body held goes back to the system the moment it is dropped.
//!
//! The bodies a request and its response travel in, one concern a file:
//! `client` (the body as hyper hands it over), `request` (the body sent
//! upstream), `response` (every response's body), `handover` (how far a
//! request body went), `budget`, `blocks` and `reader` (a fenced body read
//! whole). The layer that applies them is `stack/body`.

mod blocks;
mod budget;
mod client;
mod handover;
mod reader;
mod request;
mod response;

pub use budget::{BudgetFull, BufferBudget, Held};
pub use client::{ClientBody, OpenBodies};
pub use handover::{Delivery, Handover};
pub(crate) use reader::{ReadError, Reader};
pub use request::{declared_length, overran_limit, Overran, RequestBody};
pub use response::{decide, refuses_heads_with, BoxError, Guard, ProxyBody, UpstreamAnswer};
