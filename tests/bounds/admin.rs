//! Bounds: admin.
