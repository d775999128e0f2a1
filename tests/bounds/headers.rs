//! Bounds: headers.
