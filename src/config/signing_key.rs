//! A route's signing key: data, read by the secrets step, used by the fence.

use std::sync::Arc;

/// A route's shared secret for token signatures, read once from its key file.
/// Its `Debug` never shows the bytes, so a logged config cannot leak it.
#[derive(Clone)]
pub struct SigningKey(Option<Arc<[u8]>>);

impl SigningKey {
    pub fn new(bytes: &[u8]) -> Self {
        SigningKey(Some(bytes.into()))
    }

    /// The key of a route whose config names a key file that has not been
    /// read yet. No signature verifies against it: a route that signs fails
    /// closed, never open, if its secrets step was skipped.
    pub fn unread() -> Self {
        SigningKey(None)
    }

    /// The secret, or `None` while it is unread.
    pub fn bytes(&self) -> Option<&[u8]> {
        self.0.as_deref()
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}
