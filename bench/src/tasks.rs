//! What the bench process and its helper processes say to each other: the task a helper is given ([`BenchTask`],
//! with the plan of its role) and the messages that come back. Plain data, below both sides.

use std::path::PathBuf;

use gpu_ipc::BackendKind;
use serde::{Deserialize, Serialize};

use super::results::ConsumerReport;
use super::rows::RowSpec;
use harness::regions::HandleMessage;

/// What a helper of the bench is asked to do (the envelope is [`harness::child::ChildTask`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "role", content = "params")]
pub enum BenchTask {
    /// A consumer process of one row.
    #[serde(rename = "bench-consumer")]
    Consumer(ConsumerPlan),
    /// The middle stage of a three-stage row.
    #[serde(rename = "bench-stage")]
    Stage(StagePlan),
    /// The exporter of an imported-buffer row.
    #[serde(rename = "bench-exporter")]
    Exporter(ExporterPlan),
}

/// What a consumer process is asked to do (the task's parameters).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsumerPlan {
    /// The row.
    pub spec: RowSpec,
    /// The device.
    pub device: i32,
    /// Bytes of a frame.
    pub frame_bytes: u64,
    /// Frames in all, warm-up included.
    pub frames_total: u64,
    /// Frames before the measured window.
    pub warmup: u64,
    /// The producer's rendezvous socket (our rows).
    pub socket: Option<PathBuf>,
    /// This consumer's number within the row.
    pub index: u32,
    /// Bound of every wait for one frame, in milliseconds.
    pub frame_timeout_ms: u64,
    /// The mask every word of the frames was XORed with on the way (three-stage rows): frame `seq` is checked
    /// against the pattern of `xor_sequence(seq, mask)`. `None`: the producer's frames as they are.
    #[serde(default)]
    pub expect_xor: Option<u32>,
}

/// Sent by the producer right after the task, with fds: the publish stamps, then (study rows) the flags, then
/// (designs a and b) the host frame buffer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setup {
    /// The shared device buffer (designs c and d).
    pub handle: Option<HandleMessage>,
}

/// What a consumer sends to the producer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "kebab-case")]
pub enum ConsumerMessage {
    /// Set up and waiting for frames (study rows; our rows attach instead).
    Ready,
    /// Done: the figures.
    Report(ConsumerReport),
}

/// What the middle stage is asked to do (the task's parameters).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StagePlan {
    /// The row (a [`RowSpec::ThreeStage`]).
    pub spec: RowSpec,
    /// The device.
    pub device: i32,
    /// Frame width, height and bytes per pixel.
    pub shape: [u32; 3],
    /// The bench process's ring.
    pub upstream: PathBuf,
    /// The ring this stage creates.
    pub downstream: PathBuf,
    /// Frames in all, warm-up included.
    pub frames_total: u64,
    /// Frames before the measured window.
    pub warmup: u64,
    /// Bound of every wait for one frame, in milliseconds.
    pub frame_timeout_ms: u64,
}

/// What a `bench-exporter` child is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExporterPlan {
    /// The backend to allocate and export through.
    pub backend: BackendKind,
    /// The device.
    pub device: i32,
    /// Bytes to allocate (two frames).
    pub bytes: u64,
    /// How long it keeps the allocation for the bench process, in milliseconds, at most.
    pub hold_ms: u64,
}

/// The exporter's and the bench process's messages.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "kebab-case")]
pub enum ExporterMessage {
    /// The exporter's handle (its fd, for VMM, beside the message).
    Exported {
        /// The handle.
        handle: HandleMessage,
    },
    /// The bench process unmapped the buffer: the exporter may free it and exit.
    Done,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    /// A single-process row's plan of 4K frames (shared with the consumer's tests).
    pub(crate) fn plan(frames_total: u64, warmup: u64) -> ConsumerPlan {
        ConsumerPlan {
            spec: RowSpec::SingleProcess,
            device: 0,
            frame_bytes: 24_883_200,
            frames_total,
            warmup,
            socket: None,
            index: 0,
            frame_timeout_ms: 1000,
            expect_xor: None,
        }
    }

    #[test]
    fn plans_and_messages_round_trip_as_json() {
        let p = plan(100, 10);
        let back: ConsumerPlan = serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
        assert_eq!((back.frames_total, back.warmup, back.spec), (100, 10, RowSpec::SingleProcess));
        let ready = serde_json::to_value(&ConsumerMessage::Ready).unwrap();
        assert_eq!(ready, serde_json::json!({"message": "ready"}));
        assert!(ready.get("error").is_none(), "never mistaken for a ChildFailure");
    }

    #[test]
    fn exporter_messages_round_trip() {
        let handle = HandleMessage { backend: BackendKind::Vmm, bytes: Vec::new(), size: 64 };
        let json = serde_json::to_value(ExporterMessage::Exported { handle }).unwrap();
        assert_eq!(json["message"], "exported");
        assert!(json.get("error").is_none(), "never mistaken for a ChildFailure");
        let back: ExporterMessage = serde_json::from_value(json).unwrap();
        assert!(matches!(back, ExporterMessage::Exported { handle } if handle.size == 64));
        let plan = ExporterPlan { backend: BackendKind::Legacy, device: 0, bytes: 2, hold_ms: 5 };
        let back: ExporterPlan = serde_json::from_value(serde_json::to_value(&plan).unwrap()).unwrap();
        assert_eq!((back.backend, back.bytes, back.hold_ms), (BackendKind::Legacy, 2, 5));
    }
}
