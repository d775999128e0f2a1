//! The fence core: tokens, signatures, per-key turns and the stores that
//! keep each key's mark. It knows nothing of HTTP layers above it: the stack
//! (`stack/head`, `stack/turn`) puts it in front of the upstream.

pub mod gate;
pub mod lease;
pub mod signature;
pub mod store;
pub mod token;

pub use gate::KeyGate;

/// A concurrent map keyed by fence key, hashed with a per-process random seed
/// (keys come from clients, so the seed matters as much as the speed).
pub(crate) type KeyMap<V> = dashmap::DashMap<Box<str>, V, ahash::RandomState>;
