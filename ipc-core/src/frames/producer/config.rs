//! How a producer sets up its ring ([`ProducerConfig`]) and treats a slow consumer ([`SlowConsumerPolicy`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::wire::{SlotLayout, SocketAccess, SyncStrategy};

/// How a producer sets up its ring.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Where the rendezvous socket is created (mode 0600 unless `access` says otherwise).
    pub socket_path: PathBuf,
    /// Who may attach: the socket file's mode and group and the uid check on each consumer (default: the
    /// producer's user alone). See [`SocketAccess`] for serving consumers of other users.
    pub access: SocketAccess,
    /// What each slot holds: pixel frames ([`FrameGeometry`](crate::wire::FrameGeometry)), a tensor
    /// ([`TensorDesc`](crate::wire::TensorDesc)) or bare bytes. A ring of pixel frames serves consumers of every
    /// protocol version; any other needs consumers of version 2 (older ones are refused, told why).
    pub slot_layout: SlotLayout,
    /// Number of slots (1 to 256; 2 to 4 lets the producer work ahead of the consumers). Up to 32 the control block
    /// uses layout 1, which every consumer reads; a deeper ring uses layout 2, which only consumers of wire protocol
    /// version 3 and later are offered: older ones are refused at the handshake.
    pub slots: u32,
    /// How producer and consumers wait for each other.
    pub sync: SyncStrategy,
    /// Consumer records (consumers attached at the same time, at most 16).
    pub max_consumers: u32,
    /// Poll interval of `CpuSleep`.
    pub sleep_interval: Duration,
    /// Bound on each handshake with a new consumer, from accepting its connection to its `Attached` (default
    /// 10 s: long enough for a Python consumer to start CUDA and import the ring). Handshakes run on the
    /// producer's admission thread: frames never wait for one, however long it is allowed to take.
    pub handshake_timeout: Duration,
    /// Connections in flight at most (default 64): when a new one arrives and there is no room, the oldest that
    /// has not said a valid hello is closed. Bounds the fds that slow or silent clients can hold.
    pub max_pending_handshakes: usize,
    /// What to do about a live consumer that stops releasing frames (default: wait for it).
    pub slow_consumer: SlowConsumerPolicy,
    /// Bound on each CPU wait for GPU work the producer makes without a caller's timeout: a CPU strategy's wait
    /// for the frame's work in `publish`, and the wait at teardown for the work queued on the ring (default 10 s).
    pub gpu_timeout: Duration,
}

impl ProducerConfig {
    /// A configuration with the usual defaults (16 consumers, 20 us sleeps, 10 s handshakes, 64 in flight, slow
    /// consumers waited for, 10 s bound on waits for GPU work). `slot` is what each slot holds: a
    /// [`FrameGeometry`](crate::wire::FrameGeometry) for a ring of pixel frames, a
    /// [`TensorDesc`](crate::wire::TensorDesc) for a ring of tensors, or any [`SlotLayout`].
    pub fn new(socket_path: impl Into<PathBuf>, slot: impl Into<SlotLayout>, slots: u32, sync: SyncStrategy) -> Self {
        Self {
            socket_path: socket_path.into(),
            access: SocketAccess::default(),
            slot_layout: slot.into(),
            slots,
            sync,
            max_consumers: 16,
            sleep_interval: Duration::from_micros(20),
            handshake_timeout: Duration::from_secs(10),
            max_pending_handshakes: 64,
            slow_consumer: SlowConsumerPolicy::Block,
            gpu_timeout: Duration::from_secs(10),
        }
    }
}

/// What a producer does about a live consumer that stops releasing frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SlowConsumerPolicy {
    /// Wait for it (the default): `acquire` returns [`FrameError::Timeout`](crate::frames::FrameError::Timeout) at its own timeout and can be called
    /// again, or the application calls [`Producer::evict`](super::Producer::evict).
    #[default]
    Block,
    /// Evict a consumer that has held up the next frame for this long: it stops counting, the producer goes on,
    /// and its next call returns [`FrameError::Evicted`](crate::frames::FrameError::Evicted).
    Evict {
        /// How long a consumer may hold up a frame.
        after: Duration,
    },
}
