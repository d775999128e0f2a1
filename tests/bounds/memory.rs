//! Bounds: memory.
