//! The layer that puts [`Fencing`] in a stack, with the store and the gate
//! every connection shares.

use std::sync::Arc;

use tower::Layer;

use super::service::Fencing;
use crate::fence::store::FenceStore;
use crate::fence::KeyGate;

/// Applies [`Fencing`] to a service that forwards requests upstream.
///
/// The store and the gate are shared by every connection: they are what makes
/// one key's writes take turns no matter which connection carries them.
#[derive(Debug)]
pub struct FencingLayer<St> {
    store: Arc<St>,
    gate: Arc<KeyGate>,
}

impl<St> FencingLayer<St> {
    pub fn new(store: Arc<St>, gate: Arc<KeyGate>) -> Self {
        FencingLayer { store, gate }
    }
}

impl<St> Clone for FencingLayer<St> {
    fn clone(&self) -> Self {
        FencingLayer { store: self.store.clone(), gate: self.gate.clone() }
    }
}

impl<S, St: FenceStore> Layer<S> for FencingLayer<St> {
    type Service = Fencing<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Fencing::new(inner, self.store.clone(), self.gate.clone())
    }
}
