//! Bounds: logs.
