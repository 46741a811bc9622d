//! What the doctor concludes, one [`Finding`] at a time, and how much each matters ([`Severity`]): the words the
//! report, the network-transport checks and the socket check all speak, below each of them.

use serde::{Deserialize, Serialize};

/// One conclusion drawn from the facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// A stable identifier for scripts, e.g. `compute-mode-prohibited` (listed in `docs/doctor.md`).
    pub id: String,
    /// How much it matters.
    pub severity: Severity,
    /// What was found, in one line.
    pub what: String,
    /// Why it matters.
    pub why: String,
    /// What to do about it, when something can be done.
    pub fix: Option<String>,
}

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; nothing is broken.
    Info,
    /// Something may not work or may be slow.
    Warn,
    /// Something will not work.
    Fail,
}
