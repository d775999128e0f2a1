//! The integration tests, one test binary: each module below is a group
//! that `cargo test --profile ci --test it NAME::` runs alone
//! (docs/testing.md). One binary compiles the helpers and links fencegate and
//! the test dependencies once, where a binary per file did it once per file.
//!
//! The floors test (`tests/floors.rs`) stays a binary of its own: it reads
//! the source tree only and runs first in CI.
//!
//! A new group: put it in `tests/it/NAME.rs` (or `tests/it/NAME/mod.rs` with
//! submodules), reach the shared helpers with `use crate::common;`, and add
//! `mod NAME;` below, in alphabetical order. No group's name may end
//! another's, so that `NAME::` selects one group.

// The shared helpers: upstreams, clients, fencegate in process and as a child.
mod common;

mod binary;
mod bounds;
mod build_profile;
mod checker;
mod cli;
mod client_address;
mod config_docs;
mod config_view;
mod connections;
mod contract;
mod demo;
mod deployments;
mod durability;
mod etcd_shared;
mod etcd_tls;
mod faults;
mod fence_api;
mod fuzz_regressions;
mod leases;
mod limits;
mod no_way_around;
mod observability;
mod ordering;
mod proxying;
mod readiness;
mod recipes;
mod redis_shared;
mod redis_tls;
mod reload;
mod request_ids;
mod server_tls;
mod signing;
mod third_pass;
mod traces;
mod upstream_http2;
mod upstream_tls;
