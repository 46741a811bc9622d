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
//! ```no_run
//! use std::time::Duration;
//! use ipc_core::backend::Backend;
//! use ipc_core::driver::{Context, DevicePtr, Stream};
//! use ipc_core::frames::{FrameError, Producer, ProducerConfig};
//! use ipc_core::wire::{FrameGeometry, PixelFormat, SyncStrategy};
//!
//! // Generic over the backend: `ipc_legacy::Legacy` or `ipc_vmm::Vmm`.
//! fn produce<B: Backend<Context = Context>>(
//!     ctx: &Context,
//!     mut fill_frame: impl FnMut(DevicePtr, &Stream),
//! ) -> Result<(), FrameError> {
//!     let geometry = FrameGeometry::new(3840, 2160, PixelFormat::Rgb8)?;
//!     let config = ProducerConfig::new("/tmp/frames.sock", geometry, 4, SyncStrategy::GpuStreamOps);
//!     let mut producer = Producer::<B>::create(ctx, config)?;
//!     let stream = Stream::new(ctx)?;
//!     loop {
//!         let slot = producer.acquire(Some(&stream), Duration::from_secs(1))?;
//!         fill_frame(slot.ptr, &stream); // your kernel, queued on `stream`
//!         producer.publish(slot, Some(&stream))?;
//!     }
//! }
//! ```
//!
//! A consumer, in another process:
//!
//! ```no_run
//! use std::path::Path;
//! use std::time::Duration;
//! use ipc_core::backend::Backend;
//! use ipc_core::driver::{Context, DevicePtr, Stream};
//! use ipc_core::frames::{AttachOptions, Consumer, FrameError};
//!
//! fn consume<B: Backend<Context = Context>>(
//!     ctx: &Context,
//!     mut read_frame: impl FnMut(DevicePtr, u64, &Stream),
//! ) -> Result<(), FrameError> {
//!     let options = AttachOptions { name: "detector".into(), ..AttachOptions::default() };
//!     let mut consumer = Consumer::<B>::attach(ctx, Path::new("/tmp/frames.sock"), &options)?;
//!     let stream = Stream::new(ctx)?;
//!     loop {
//!         let frame = match consumer.next_frame(Some(&stream), Duration::from_secs(1)) {
//!             Ok(frame) => frame,
//!             Err(FrameError::ProducerGone { .. }) => break, // it stopped or died: every wait was released
//!             Err(e) => return Err(e),
//!         };
//!         read_frame(frame.ptr, frame.bytes, &stream); // your kernel, queued on `stream`, reads in place
//!         consumer.release(frame, Some(&stream))?; // the producer may rewrite the slot once the kernel is done
//!     }
//!     consumer.detach();
//!     Ok(())
//! }
//! ```

mod admission;
mod consumer;
mod error;
mod producer;
mod run_ahead;
mod strategy;
mod watchdog;

pub use consumer::{AttachOptions, Consumer, Frame};
pub use error::FrameError;
pub use producer::{Producer, ProducerConfig, SlotLease, SlowConsumerPolicy};

/// Polls `event` until it completes, `alive()` turns false ([`FrameError::PeerGone`]) or `deadline` passes
/// ([`FrameError::Timeout`]): every CPU wait on GPU work in this module goes through here, so none is unbounded.
/// `nap` `None` spins (lowest latency, one core busy); `Some(d)` sleeps `d` between polls.
///
/// Why not `cuEventSynchronize` or `cuStreamWaitEvent`: neither has a timeout, and an IPC event recorded by a
/// process that dies before the recorded work completes never completes, so a stream or thread made to wait on it
/// could never be freed. Polling keeps the survivor in control.
fn wait_for_event(
    event: &crate::driver::Event,
    deadline: std::time::Instant,
    nap: Option<std::time::Duration>,
    alive: impl Fn() -> bool,
    what: impl Fn() -> String,
) -> Result<(), FrameError> {
    let start = std::time::Instant::now();
    let mut polls = 0u32;
    loop {
        if event.is_complete()? {
            return Ok(());
        }
        polls = polls.wrapping_add(1);
        if nap.is_some() || polls.is_multiple_of(64) {
            if !alive() {
                return Err(FrameError::PeerGone);
            }
            if std::time::Instant::now() >= deadline {
                return Err(FrameError::Timeout { what: what(), waited: start.elapsed() });
            }
        }
        match nap {
            Some(d) => std::thread::sleep(d),
            None if polls.is_multiple_of(64) => std::thread::yield_now(),
            None => std::hint::spin_loop(),
        }
    }
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
