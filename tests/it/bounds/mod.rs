//! Every resource bounded under hostile clients: each attack in miniature
//! (small limits, so it runs in seconds), asserting the refusal, the bound
//! (memory, descriptors, disk, lines logged) and that a normal client beside
//! the attack is still served.

// The attacks of the hostile benchmark, run here in miniature.
#[path = "../../../benches/hostile/attacks.rs"]
mod attacks;

mod admin;
mod descriptors;
mod fences;
mod headers;
mod logs;
mod memory;
mod penalty;
