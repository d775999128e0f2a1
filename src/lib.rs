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

pub mod access_log;
pub mod admin;
pub mod body;
pub mod canonical;
pub mod config;
pub mod error;
pub mod fence;
pub mod metrics;
pub mod outcome;
pub mod problem;
pub mod proxy;
pub mod rescue;
pub mod route;
pub mod routing;
mod server;
pub mod stack;
pub mod telemetry;

pub use config::Config;
pub use server::{run, Fencegate, StartError, MAX_BLOCKING_THREADS};
