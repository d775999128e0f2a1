//! Request bodies: the route's `max_body` (413 past it), and fenced bodies
//! read whole before they may take their key's turn (the layer: `stack/body`).
//!
//! A declared `Content-Length` above the limit is refused before anything is
//! read. A fenced body is read in full, up to the limit, before it may take
//! its key's turn (unless its route sets `stream_body`): a client that dies or
//! stalls mid-body, or a body that turns out too large, is refused with
//! nothing forwarded, so the upstream never sees part of a fenced write. The
//! bytes held that way count against one budget for the whole process
//! (`[server] max_buffered_bytes`) and against the share of it one client
//! connection may hold over all its HTTP/2 streams
//! (`[server] max_connection_buffered_bytes`): a request that would overrun
//! either gets 503 with `Retry-After`, and its bytes are handed back as soon
//! as its body is dropped. Other bodies stream, and one that overruns the
//! limit is cut off.
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
