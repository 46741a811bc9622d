//! The frame-sharing API: a [`Producer`] publishes frames into a ring of slots in one exported allocation;
//! [`Consumer`]s in other processes attach once, then read each frame in place and release it.
//!
//! The same API runs over every [`Backend`](crate::backend::Backend) and every
//! [`SyncStrategy`](crate::wire::SyncStrategy):
//!
//! | strategy | producer waits for a free slot | consumer waits for a frame | CPU in the per-frame path |
//! |---|---|---|---|
//! | `CpuSpin` | CPU spins on the release counters | CPU spins on the publish counter | yes (one core busy) |
//! | `CpuSleep` | CPU polls with short sleeps | CPU polls with short sleeps | yes |
//! | `IpcEvent` | CPU sees the release, then polls the consumer's IPC event | CPU sees the publish, then polls the producer's IPC event | polling; streams never synchronised |
//! | `GpuStreamOps` | `cuStreamWaitValue64` on the release counters | `cuStreamWaitValue64` on the publish counter | no |
//! | `GpuPoll` (MPS only) | a kernel polls the release counters (`ld.acquire.sys`) | a kernel polls the publish counter | no |
//!
//! With `GpuStreamOps` and `GpuPoll` the calls return as soon as the work is queued: the GPU does the waiting. A
//! dead peer never hangs the survivor: a watchdog thread notices the hang-up on the rendezvous socket and writes a
//! poison value into the counters the survivor's stream waits on (see `docs/ring.md`).
//!
//! Consumers are admitted off the frame path: the producer's admission thread owns the socket and every handshake
//! in flight, each bounded by [`ProducerConfig::handshake_timeout`]; `acquire` and `publish` only take, without
//! waiting, what it finished. No client, slow, silent, refused or hostile, can stop the producer or delay a frame
//! before it holds a consumer record; from then on (the moment its offer leaves) it counts in back-pressure like any
//! consumer, and [`SlowConsumerPolicy`] says what the producer does about one that stops releasing.
//!
//! This module is the host-driven ring: the CPU calls `acquire`/`publish` and `next_frame`/`release` for each frame
//! (the strategy decides whether the CPU or the GPU waits). What runs on the ring from the GPU with no call per
//! frame (kernels launched on the ring, frame graphs) is the GPU-resident path, [`crate::resident`]; its public types
//! are re-exported here.
//!
//! A pipeline [`Stage`] is the consumer of one ring and the producer of another: each frame it takes, the caller's
//! work turns into a frame it publishes, and the end of the stream (or the upstream's death) travels on.
//!
//! ```no_run
//! use std::time::Duration;
//! use ipc_core::backend::GpuBackend;
//! use gpu_ipc_driver::{Context, DeviceSpan, Stream};
//! use ipc_core::frames::{FrameError, Producer, ProducerConfig};
//! use ipc_core::wire::{FrameGeometry, PixelFormat, SyncStrategy};
//!
//! // Generic over the backend: `ipc_legacy::Legacy` or `ipc_vmm::Vmm`.
//! fn produce<B: GpuBackend>(
//!     ctx: &Context,
//!     frames: u64,
//!     mut fill_frame: impl FnMut(DeviceSpan<'_>, u64, &Stream),
//! ) -> Result<(), FrameError> {
//!     let geometry = FrameGeometry::new(3840, 2160, PixelFormat::Rgb8)?;
//!     let config = ProducerConfig::new("/tmp/frames.sock", geometry, 4, SyncStrategy::GpuStreamOps);
//!     let mut producer = Producer::<B>::create(ctx, config)?;
//!     let stream = Stream::new(ctx)?;
//!     producer.wait_for_consumers(1, Duration::from_secs(30))?;
//!     for _ in 0..frames {
//!         let slot = producer.acquire(Some(&stream), Duration::from_secs(1))?;
//!         // Your kernel, queued on `stream`, writes the slot in place (a bounds-checked span of it).
//!         fill_frame(producer.slot_span(&slot)?, slot.seq().0, &stream);
//!         producer.publish(slot, Some(&stream))?; // takes the lease: it cannot be published twice
//!     }
//!     // Until every consumer released the last frame; dropping the producer then closes the ring: the clean end of
//!     // the stream that consumers see as `FrameError::EndOfStream`.
//!     producer.drain(Some(&stream), Duration::from_secs(10))
//! }
//! ```
//!
//! A consumer, in another process, reading until the end of the stream:
//!
//! ```no_run
//! use std::path::Path;
//! use std::time::Duration;
//! use ipc_core::backend::GpuBackend;
//! use gpu_ipc_driver::{Context, DeviceSpan, Stream};
//! use ipc_core::frames::{AttachOptions, Consumer, FrameError};
//!
//! fn consume<B: GpuBackend>(
//!     ctx: &Context,
//!     mut read_frame: impl FnMut(DeviceSpan<'_>, u64, &Stream),
//! ) -> Result<u64, FrameError> {
//!     let options = AttachOptions { name: "detector".into(), ..AttachOptions::default() };
//!     let mut consumer = Consumer::<B>::attach(ctx, Path::new("/tmp/frames.sock"), &options)?;
//!     let stream = Stream::new(ctx)?;
//!     let first = consumer.next_sequence();
//!     let published = loop {
//!         let frame = match consumer.next_frame(Some(&stream), Duration::from_secs(1)) {
//!             Ok(frame) => frame,
//!             // The producer closed the ring after `published` frames: every one was delivered.
//!             Err(FrameError::EndOfStream { published, .. }) => break published,
//!             // `ProducerGone`: it died. `Evicted`, `Timeout`: see their docs.
//!             Err(e) => return Err(e),
//!         };
//!         // Your kernel, queued on `stream`, reads the frame in place.
//!         read_frame(consumer.frame_span(&frame)?, frame.seq().0, &stream);
//!         match consumer.release(frame, Some(&stream)) {
//!             Ok(()) => {}
//!             // A GPU-side strategy had queued this frame past the end: it was never written.
//!             Err(FrameError::EndOfStream { published, .. }) => break published,
//!             Err(e) => return Err(e),
//!         }
//!     };
//!     // With a GPU-side strategy, frames numbered `published` and above that were handed out (their release may have
//!     // returned before the end was known) were never written: discard what was computed from them.
//!     let read = consumer.next_sequence().min(published).saturating_sub(first);
//!     consumer.detach();
//!     Ok(read)
//! }
//! ```

mod consumer;
mod error;
mod producer;
mod stage;
mod strategy;
mod watchdog;

use crate::ring::{WaitMode, bounded_wait};

pub use consumer::{AttachOptions, Consumer, Frame};
pub use error::FrameError;
pub use producer::{Producer, ProducerConfig, SlotLease, SlowConsumerPolicy};
// The GPU-resident path (kernels on the ring, frame graphs: `crate::resident`), under the paths it had here.
pub use crate::resident::{
    FrameGraphs, FrameStamp, GraphOptions, GraphSlot, GraphWaits, ProducerRingDescriptor, RingDescriptor, STAMP_MASK,
    device_words, run_ahead_depth,
};

pub use stage::{DownstreamEmpty, Stage, StageConfig, StageError, StageIo, StageStep, WorkError};

/// Polls `event` until it completes, `alive()` turns false ([`FrameError::PeerGone`]) or `deadline` passes
/// ([`FrameError::Timeout`]): every CPU wait on GPU work in this module goes through here, so none is unbounded.
/// `nap` `None` spins (lowest latency, one core busy; `alive` and the clock are looked at every 64 polls); `Some(d)`
/// sleeps `d` between polls and looks at both after each. The loop is the ring's [`bounded_wait`], so the event is
/// polled once more before a gone peer or the deadline is reported.
///
/// Why not `cuEventSynchronize` or `cuStreamWaitEvent`: neither has a timeout, and an IPC event recorded by a
/// process that dies before the recorded work completes never completes, so a stream or thread made to wait on it
/// could never be freed. Polling keeps the survivor in control.
pub(crate) fn wait_for_event(
    event: &gpu_ipc_driver::Event,
    deadline: std::time::Instant,
    nap: Option<std::time::Duration>,
    alive: impl Fn() -> bool,
    what: impl Fn() -> String,
) -> Result<(), FrameError> {
    let mode = nap.map_or(WaitMode::Spin, WaitMode::Sleep);
    bounded_wait(
        deadline,
        mode,
        // Zero: `alive` at every look at the clock (every 64 spins, or after every nap).
        std::time::Duration::ZERO,
        || Ok(event.is_complete()?),
        || if alive() { Ok(()) } else { Err(FrameError::PeerGone) },
        |waited| FrameError::Timeout { what: what(), waited },
    )
}

/// A number no other producer or consumer of this process has: what tells a lease or frame of one ring from
/// another's.
fn owner_token() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Bytes between slots: the frame size rounded up to 256 bytes, so every slot starts aligned for vector loads.
pub fn slot_stride(frame_bytes: u64) -> u64 {
    frame_bytes.div_ceil(256) * 256
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_256_byte_aligned() {
        assert_eq!(slot_stride(24_883_200), 24_883_200);
        assert_eq!(slot_stride(1), 256);
        assert_eq!(slot_stride(257), 512);
    }
}
