//! A turn: the right to forward one fenced request for a key, passed on to
//! the next waiter when dropped.

use std::sync::Arc;

use super::key::{Held, KeyTurns};
use super::map::KeyGate;

/// The right to forward one fenced request for a key. Dropping it ends the
/// request's part: the next waiter may get the key.
#[derive(Debug)]
pub struct Turn {
    gate: Arc<KeyGate>,
    key: Arc<str>,
    token: u64,
    held: Held,
}

impl Turn {
    pub(super) fn new(gate: Arc<KeyGate>, key: Arc<str>, token: u64, held: Held) -> Self {
        Turn { gate, key, token, held }
    }

    /// How this turn holds its key.
    #[cfg(test)]
    pub(super) fn held(&self) -> Held {
        self.held
    }

    /// The key's mark is now this turn's token (raised or confirmed under
    /// the turn): requests carrying it may share the key. A no-op for a turn
    /// that holds its key alone for good, or shares already.
    pub fn share(&mut self) {
        if self.held == Held::Deciding {
            self.held = Held::Shared;
            let token = self.token;
            self.gate.update(&self.key, |turns| turns.share(token));
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.gate.update(&self.key, KeyTurns::leave);
    }
}
