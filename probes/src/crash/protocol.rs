//! The messages between the crash probe's parent and its children (`crash-exporter`, `crash-importer`,
//! `crash-observer`), and the layout of the shared allocation.

use gpu_ipc::BackendKind;
use serde::{Deserialize, Serialize};

use super::model::SurvivorReport;

/// What a crash helper is asked to do: its role and that role's parameters (the envelope is
/// [`harness::child::ChildTask`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "role", content = "params")]
pub enum CrashTask {
    /// The exporter: allocates, exports, and dies or survives as the case says.
    #[serde(rename = "crash-exporter")]
    Exporter(PeerParams),
    /// The importer.
    #[serde(rename = "crash-importer")]
    Importer(PeerParams),
    /// The observer: answers "free memory now" from its own context.
    #[serde(rename = "crash-observer")]
    Observer(ObserverParams),
}

impl CrashTask {
    /// The role's name, for messages.
    pub fn role(&self) -> &'static str {
        match self {
            Self::Exporter(_) => "exporter",
            Self::Importer(_) => "importer",
            Self::Observer(_) => "observer",
        }
    }
}

/// Bytes at the end of the allocation that hold the flag word (its own 128-byte line), outside the pattern area.
pub const FLAG_AREA_BYTES: u64 = 4096;
/// The value the survivor writes to release every wait on the flag (its own and any left by the victim).
pub const FLAG_RELEASE: u64 = 2;
/// The value the victim's GPU-side waits wait for (below [`FLAG_RELEASE`], so the release frees them too).
pub const FLAG_VICTIM_TARGET: u64 = 1;
/// The pattern sequence the exporter writes before the death.
pub const SEQ_BEFORE: u64 = 0xc4a5_0001;
/// The pattern sequence the survivor writes after the death.
pub const SEQ_AFTER: u64 = 0xc4a5_0002;
/// Words of the host-copied sample the survivor compares with the pattern.
pub const SAMPLE_WORDS: usize = 4096;

/// The pattern area of an allocation of `size` bytes: everything before the flag area.
pub const fn pattern_bytes(size: u64) -> u64 {
    size.saturating_sub(FLAG_AREA_BYTES)
}

/// Parameters of the exporter and importer roles.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerParams {
    /// The backend whose export and import the role runs.
    pub backend: BackendKind,
    /// The device ordinal.
    pub device: i32,
}

/// Parameters of the observer role.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObserverParams {
    /// The device ordinal.
    pub device: i32,
}

/// What the parent asks a child to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Command {
    /// Exporter: allocate at least `bytes`, fill the pattern of [`SEQ_BEFORE`], zero the flag, export (the fd of
    /// an fd-based backend rides with the reply).
    Allocate {
        /// Minimum size in bytes.
        bytes: u64,
    },
    /// Importer: import the handle (the fd, if any, rides with this message) and check the pattern.
    Import {
        /// The handle bytes (legacy: 64; vmm: none).
        handle: Vec<u8>,
        /// The allocation's size.
        size: u64,
    },
    /// Launch the hammer kernel on the pattern area for `duration_ms`, answer at once.
    Hammer {
        /// How long the kernel runs (bounded by `%globaltimer`).
        duration_ms: u64,
    },
    /// Launch GPU-side waits on the flag (a polling kernel bounded by `timeout_ms`, and `cuStreamWaitValue64` on a
    /// second stream), answer at once.
    HoldWait {
        /// The polling kernel's own deadline.
        timeout_ms: u64,
    },
    /// Exporter: `exit` without freeing anything (no reply: the process is gone).
    Exit,
    /// The survivor: check the memory after the death and report.
    Survive {
        /// Whether a hammer kernel of this process runs across the death (wait for it first).
        hammer_ms: Option<u64>,
    },
    /// Drop the mapping or allocation (after the stream is idle), keep the context.
    Close,
    /// Observer: read `cuMemGetInfo`.
    Measure,
    /// End the role normally.
    Quit,
}

/// What a child answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
pub enum Reply {
    /// The context, kernels and streams are ready.
    Ready {
        /// The child's pid.
        pid: u32,
    },
    /// Exporter: the allocation is made and exported (fd attached for fd-based backends).
    Exported {
        /// Handle bytes.
        handle: Vec<u8>,
        /// Allocation size in bytes.
        size: u64,
    },
    /// Importer: imported and checked.
    Imported {
        /// Words that did not hold [`SEQ_BEFORE`]'s pattern.
        mismatches: u64,
        /// Milliseconds the import took.
        import_ms: f64,
    },
    /// A kernel or wait was launched.
    Launched,
    /// The survivor's findings.
    Survived {
        /// The findings (boxed: the report is much larger than the other replies).
        report: Box<SurvivorReport>,
    },
    /// The mapping is dropped.
    Closed,
    /// The observer's reading.
    Memory {
        /// Free bytes.
        free: u64,
        /// Total bytes.
        total: u64,
    },
    /// The role ended.
    Bye,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_replies_round_trip_as_tagged_json() {
        let json = serde_json::to_string(&Command::Survive { hammer_ms: Some(600) }).unwrap();
        assert_eq!(json, r#"{"op":"survive","hammer_ms":600}"#);
        let back: Command = serde_json::from_str(&json).unwrap();
        assert!(matches!(back, Command::Survive { hammer_ms: Some(600) }));
        let reply: Reply = serde_json::from_str(r#"{"reply":"memory","free":5,"total":9}"#).unwrap();
        assert!(matches!(reply, Reply::Memory { free: 5, total: 9 }));
        // A child failure is not a reply: the parent tells the two apart.
        assert!(serde_json::from_str::<Reply>(r#"{"error":"boom"}"#).is_err());
    }

    #[test]
    fn the_flag_lies_outside_the_pattern() {
        assert_eq!(pattern_bytes(64 << 20), (64 << 20) - 4096);
        assert_eq!(pattern_bytes(100), 0);
        const { assert!(FLAG_VICTIM_TARGET < FLAG_RELEASE) };
    }
}
