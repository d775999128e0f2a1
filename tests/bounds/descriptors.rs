//! Bounds: descriptors.
