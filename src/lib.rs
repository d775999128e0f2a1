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
//! A request, from the listener to the upstream, file by file:
//!
//! | file | what it owns |
//! |---|---|
//! | `server/` | listeners, the connection limit, worker threads, the slow-head and idle guards, the drain |
//! | `stack.rs` | the tower stack, composed in the order below |
//! | `access_log.rs` | one access-log event and one metrics update per response |
//! | `rescue.rs` | refusals and panics become problem+json responses, never resets |
//! | `head_limits.rs` | per connection: header fields per head (431), head bytes sent upstream per second (429) |
//! | `routing/` | the canonical target, the route, method overrides, the WebDAV `Destination` |
//! | `fence/head.rs` | everything the head decides: token, signature, key, a stale or jumping token |
//! | `body.rs` | the body limit, and fenced bodies read whole within a global budget |
//! | `fence/service.rs` | the keys' turns, the atomic raise, the forward that outlives its client |
//! | `proxy/` | the upstream connections (plain or TLS), header rewrite, timeouts, upgrades |
//!
//! And what they lean on: `canonical/` (path, host and query canonical forms),
//! `route/` (routes, patterns, key templates), `fence/store/` (marks in memory
//! or on disk), `fence/gate.rs` (per-key turns), `error.rs` (the refusals, and
//! the outcome and problem type of each), `problem.rs` (problem+json, and the
//! problem types with their status and title), `outcome.rs` (what the log
//! and metrics call each outcome), `config/` (file → validated config →
//! secrets), `admin/` (health, metrics, the fence API and its CLI client).

#![forbid(unsafe_code)]

pub mod admin;
pub mod canonical;
pub mod config;
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
    give_back_memory_with, run, CertsReloaded, Fencegate, Reloaded, Reloader, ServerTls, StartError,
    MAX_BLOCKING_THREADS,
};
