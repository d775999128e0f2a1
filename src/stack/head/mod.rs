//! The head checks: everything the request head can decide (token,
//! signature, key, a stale or jumping token) before a byte of its body is
//! read. What each refuses, and with which status, is written down once in
//! `docs/behaviour.md` ("The guarantee, step by step").
//!
//! It sits after routing, whose route says what is fenced and how the key is
//! made, and before the body step: a request already condemned never makes
//! fencegate read (or buffer) its body.

mod checked;
mod checks;

pub(crate) use checked::{Checked, Fence};
#[cfg(test)]
pub(crate) use checks::check;
pub(crate) use checks::{check_head, check_mark, check_marks, marks_at_hand};
