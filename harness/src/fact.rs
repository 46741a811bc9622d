//! One fact about the machine, or why it could not be read: what the doctor reports and the MPS detection returns.

use serde::{Deserialize, Serialize};

/// The outcome of reading one fact about the machine: the fact, or why it could not be read.
///
/// In JSON: `{"known": <value>}` or `{"unknown": "<why>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fact<T> {
    /// The fact was read.
    Known(T),
    /// The fact could not be read; the text says why (which path, which error).
    Unknown(String),
}

impl<T> Fact<T> {
    /// The fact, when it was read.
    pub fn known(&self) -> Option<&T> {
        match self {
            Fact::Known(value) => Some(value),
            Fact::Unknown(_) => None,
        }
    }
}
