//! What both sides of a coherency cell share: the words in host or device memory, as the GPU addresses them and as
//! each side owns them, and the throttle that keeps a stream-driven side from running too far ahead of the GPU.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu_ipc::core::shm::{SharedMemory, SharedObject};
use gpu_ipc::driver::{Context, DeviceMemory, DeviceSpan, DriverError, Event, EventFlags, HostRegistration, Stream};
use gpu_ipc::kernels::probe::coherency_layout as layout;

use harness::MeasurementError;

use super::*;

/// Host memory shared by a memfd and registered with CUDA in this process. The CPU sees it only as atomics
/// (`SharedObject`), which is what makes lending it to kernels safe.
pub(super) struct HostShared {
    pub(super) block: Arc<SharedObject<HostBlock>>,
    pub(super) registration: Arc<HostRegistration<SharedObject<HostBlock>>>,
}

impl HostShared {
    pub(super) fn create(ctx: &Context) -> Result<Self, MeasurementError> {
        let memory = SharedMemory::create("gpu-ipc-coherency", HOST_WORDS * 8)?;
        let block = Arc::new(SharedObject::new(memory)?);
        let registration = Arc::new(HostRegistration::new(ctx, block.clone())?);
        Ok(Self { block, registration })
    }
}

/// An owner of a cell's words that the threads enqueueing GPU work can share.
pub(super) type WordsOwner = Arc<dyn DeviceMemory + Send + Sync>;

/// A cell's words as the GPU addresses them: flag, ack and payload at fixed offsets, then (in device memory) the
/// writer's timestamps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Words<'a> {
    whole: DeviceSpan<'a>,
    pub(super) flag: DeviceSpan<'a>,
    pub(super) ack: DeviceSpan<'a>,
    pub(super) payload: DeviceSpan<'a>,
}

impl<'a> Words<'a> {
    pub(super) fn of(whole: DeviceSpan<'a>) -> Result<Self, DriverError> {
        Ok(Self {
            whole,
            flag: whole.slice(layout::FLAG, 8)?,
            ack: whole.slice(layout::ACK, 8)?,
            payload: whole.slice(layout::PAYLOAD, PAYLOAD_WORDS * 4)?,
        })
    }

    /// The writer's per-round timestamps, from [`WRITE_TS_OFFSET`] to the end (device memory only).
    pub(super) fn write_ts(&self) -> Result<DeviceSpan<'a>, DriverError> {
        self.whole.slice(WRITE_TS_OFFSET, self.whole.len().saturating_sub(WRITE_TS_OFFSET))
    }
}

/// The shared words of a cell, as the reader (this process) sees them.
pub(super) enum Memory<'a> {
    Device(WordsOwner),
    Host(&'a HostShared),
}

/// The shared words as a writer side owns or borrows them.
#[derive(Clone)]
pub(super) enum OwnedMemory {
    Device(WordsOwner),
    Host(Arc<SharedObject<HostBlock>>),
}

impl Memory<'_> {
    pub(super) fn owned(&self) -> OwnedMemory {
        match self {
            Memory::Device(owner) => OwnedMemory::Device(owner.clone()),
            Memory::Host(host) => OwnedMemory::Host(host.block.clone()),
        }
    }

    /// The owner of the words as the GPU addresses them (device memory, or the host block's registration).
    pub(super) fn device_words(&self) -> WordsOwner {
        match self {
            Memory::Device(owner) => owner.clone(),
            Memory::Host(host) => host.registration.clone(),
        }
    }

    /// Zeroes flag, ack and payload (synchronously).
    pub(super) fn reset(&self, stream: &Stream) -> Result<(), MeasurementError> {
        match self {
            Memory::Device(owner) => {
                owner.span().slice(0, WRITE_TS_OFFSET)?.fill_u32_async(0, stream)?;
                wait_idle(stream, Instant::now() + Duration::from_secs(10))?;
            }
            Memory::Host(host) => {
                for word in host.block.get() {
                    word.store(0, Ordering::SeqCst);
                }
            }
        }
        Ok(())
    }

    /// Writes the abort value into flag and ack, releasing whatever waits on either.
    pub(super) fn abort(&self) {
        match self {
            Memory::Device(owner) => {
                let span = owner.span();
                let _ = span.write(layout::FLAG, &[layout::ABORT]);
                let _ = span.write(layout::ACK, &[layout::ABORT]);
            }
            Memory::Host(host) => {
                let words = host.block.get();
                words[(layout::FLAG / 8) as usize].store(layout::ABORT, Ordering::SeqCst);
                words[(layout::ACK / 8) as usize].store(layout::ABORT, Ordering::SeqCst);
            }
        }
    }
}

/// Keeps a stream-driven side from queueing more than [`THROTTLE_ROUNDS`] rounds ahead of the GPU: a stream's queue
/// is finite, and a side that fills it blocks in the driver, which in one process can starve the other side's
/// launches (a deadlock the cell deadline could not end). An event every [`THROTTLE_EVERY`] rounds; before queueing
/// more, wait (bounded) until the event from [`THROTTLE_ROUNDS`] rounds back has completed.
pub(super) struct Throttle {
    pub(super) events: std::collections::VecDeque<(u64, Event)>,
    pub(super) ctx: Context,
}

/// Rounds a stream-driven side may run ahead of the GPU.
pub(super) const THROTTLE_ROUNDS: u64 = 128;
/// Rounds between two throttle events.
pub(super) const THROTTLE_EVERY: u64 = 32;

impl Throttle {
    pub(super) fn new(ctx: &Context) -> Self {
        Self { events: std::collections::VecDeque::new(), ctx: ctx.clone() }
    }

    /// Call before queueing `round`.
    pub(super) fn before(&mut self, stream: &Stream, round: u64) -> Result<(), MeasurementError> {
        if round.is_multiple_of(THROTTLE_EVERY) {
            let event = Event::new(&self.ctx, EventFlags::default())?;
            event.record(stream)?;
            self.events.push_back((round, event));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some((queued, event)) = self.events.front() {
            if queued + THROTTLE_ROUNDS > round {
                break;
            }
            if event.is_complete()? {
                self.events.pop_front();
                continue;
            }
            if Instant::now() > deadline {
                return Err(MeasurementError::Wait(format!(
                    "round {queued} did not complete within 30 s while queueing round {round}"
                )));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }
}

/// Waits (bounded by `deadline`) until `stream` has no work left.
pub(super) fn wait_idle(stream: &Stream, deadline: Instant) -> Result<(), MeasurementError> {
    loop {
        match stream.is_idle()? {
            true => return Ok(()),
            false if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(100)),
            false => return Err(MeasurementError::Wait("the GPU stream did not drain before the deadline".to_owned())),
        }
    }
}
