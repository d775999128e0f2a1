//! No way around, third pass: the classes an attacker and a buggy client
//! found after the second pass, each against upstreams that behave like real
//! servers, each judged by what the upstream applied.
//!
//! | module | class |
//! |---|---|
//! | `tunnels` | protocol upgrades and extended CONNECT on fenced routes; `_` in header names and method overrides |
//! | `keys` | escapes that are not UTF-8; key templates whose parts could run together |
//! | `drain` | every refusal reaches a client still uploading (HTTP/1.1 write-first clients, HTTP/2) |
//! | `turns` | no byte of an older write reaches the upstream after its turn passed |

mod drain;
mod keys;
mod tunnels;
mod turns;
