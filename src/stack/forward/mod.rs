//! The forward, at the bottom of the stack: the request's URI and headers
//! rewritten for its route's upstream, sent on one of the client
//! connection's upstream connections within the route's timeout, and a
//! protocol switch spliced when one was asked for and allowed.
//!
//! The bottom of the stack: every check above has passed, and for a fenced
//! request its keys' turns are held, by the time anything reaches it.

mod prepare;
mod service;
mod slot_taken;
mod upgrade;

pub use service::{Forward, Forwarder};
pub use slot_taken::SlotTaken;
