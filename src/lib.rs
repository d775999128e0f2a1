//! fencegate: an HTTP reverse proxy that enforces fencing tokens.
//!
//! Lock services hand out fencing tokens that grow with every new lock owner,
//! but only the place where data is written can refuse a write from an owner
//! whose lease has expired. fencegate is that place for upstreams that cannot
//! compare tokens themselves: it reads `X-Fencing-Token`, compares it atomically
//! with the highest token seen for the resource key, and forwards only writes that
//! are not stale, a raise of a key's mark only once every write in flight for
//! the key has ended. The guarantee, step by step, is written
//! down once, in `docs/behaviour.md`.
//!
//! Start it in-process with [`Fencegate::bind`] and [`Fencegate::run`], or use
//! the `fencegate` binary.
//!
//! # Where things are
//!
//! The modules are floors, each using only the floors below it; the picture,
//! and a line per module, are in `docs/architecture.md` (`tests/floors.rs`
//! keeps them true). Bottom up: `http/` (bodies, outcomes, problem+json:
//! what every layer shares), `canonical/`, `config/` (pure data),
//! `telemetry/`, `fence/` (token, signature, per-key turns, the stores),
//! `metrics/`, `proxy/` (the upstream client), `route/` (a route in
//! service), `admin/`, `stack/` (the layers, in the order a request meets
//! them), `server/` (listeners, connections, workers, reload), and on
//! top `demo/` (`fencegate demo`: the fence in front of a store of its own).

#![forbid(unsafe_code)]

pub mod admin;
pub mod canonical;
pub mod config;
pub mod demo;
pub mod fence;
mod http;
mod metrics;
mod proxy;
pub mod route;
mod server;
mod stack;
pub mod telemetry;

pub use config::Config;
pub use server::{
    give_back_memory_with, run, shutdown_signal, CertsReloaded, Fencegate, Reloaded, Reloader, ServerTls, StartError,
    MAX_BLOCKING_THREADS,
};
