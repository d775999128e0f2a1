//! fencegate: an HTTP reverse proxy that enforces fencing tokens.
//!
//! Lock services hand out fencing tokens that grow with every new lock owner,
//! but only the place where data is written can refuse a write from an owner
//! whose lease has expired. fencegate is that place for upstreams that cannot
//! compare tokens themselves: it reads `X-Fencing-Token`, compares it atomically
//! with the highest token seen for the resource key, and forwards only writes that
//! are not stale, one at a time per key.
//!
//! Start it in-process with [`Fencegate::bind`] and [`Fencegate::run`], or use
//! the `fencegate` binary.

#![forbid(unsafe_code)]

mod access_log;
pub mod admin;
mod body;
pub mod canonical;
pub mod config;
mod error;
pub mod fence;
mod metrics;
mod outcome;
mod problem;
mod proxy;
mod rescue;
pub mod route;
mod routing;
mod server;
mod stack;
pub mod telemetry;

pub use config::Config;
pub use server::{run, Fencegate, StartError, MAX_BLOCKING_THREADS};
