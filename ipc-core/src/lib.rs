//! Placeholder; filled in by the foundation issue.

pub mod ring;
#[allow(unsafe_code)]
pub mod sys;
