//! The key's turn: fenced writes of one key take turns in key order, the
//! mark is raised atomically under the turn, and the forward runs to its end
//! even if the client leaves (then on a task of its own). The turn passes on
//! only once the write can no longer land (`docs/behaviour.md`).
//!
//! It comes after the body step, last before the forward: a fenced body is
//! read whole before its request takes its keys' turns (unless its route
//! sets `stream_body`), so a slow or broken upload never holds a key.

mod future;
mod service;
mod turns;

pub(crate) use future::ResponseFuture;
pub(crate) use service::{fenced, fenced_after};
