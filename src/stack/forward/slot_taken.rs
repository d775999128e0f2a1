//! The flag a forward sets once it may have sent something: from then on it
//! runs to its end whatever its caller does.

use std::sync::Arc;

use crate::http::Handover;

/// Given with a request (`Routed::slot_taken`) by whoever runs its forward
/// to its end even if the caller leaves (the fence): the forward marks it
/// once it has its way to the upstream, before it sends a byte. Until then a
/// forward whose caller is gone (its client connection closed, its HTTP/2
/// stream was reset) can simply be dropped, with nothing sent, instead of
/// holding its key's turn until `queue_timeout` for nobody; from then on it
/// runs to its end whatever the caller does.
#[derive(Clone, Debug, Default)]
pub struct SlotTaken(Arc<Handover>);

impl SlotTaken {
    pub(super) fn mark(&self) {
        self.0.mark_taken();
    }

    /// Whether the forward may have sent something.
    pub fn is_taken(&self) -> bool {
        self.0.is_taken()
    }

    /// How far the request's body went to the upstream, and on which
    /// connection.
    pub fn handover(&self) -> &Arc<Handover> {
        &self.0
    }

    /// This flag, cleared for a new request; a new one if the last
    /// request's body is still going out.
    pub(super) fn renewed(&self) -> SlotTaken {
        if self.0.renew() {
            self.clone()
        } else {
            SlotTaken::default()
        }
    }
}
