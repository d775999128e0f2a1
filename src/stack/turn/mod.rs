//! The key's turn: fenced writes of one key take turns in key order, the
//! mark is raised atomically under the turn, and the forward runs to its end
//! even if the client leaves (then on a task of its own). The turn passes on
//! only once the write can no longer land (`docs/behaviour.md`).

mod future;
mod layer;
mod service;

pub(crate) use layer::FencingLayer;
