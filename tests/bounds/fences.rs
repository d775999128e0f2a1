//! Bounds: fences.
