//! The port of kernels launched on a ring (the device API of `kernels/cuda/gpu_ipc_ring.cuh`), one per side that
//! launches them: page-locked words registered for the device that hold the exit words ([`ExitWords`]: the abort
//! word, the heartbeat and lease of [`super::KernelLease`], the survivor's abort word's address), the progress word
//! (the kernel's next frame) and the descriptor the kernel gets as its first argument, and the event that says when
//! the kernel is done. Consumers (`Consumer::launch_on_ring`) and producers (`Producer::launch_on_ring`) share it;
//! each keeps it in its [`ResidentSide`].

use std::mem::offset_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::lease::{HeartbeatWord, KernelLease, keep_beating};
use crate::frames::{FrameError, wait_for_event};
use crate::ring::RingError;
use crate::shm::{SharedMemory, SharedObject};
use gpu_ipc_driver::{DeviceMemory, Event, EventFlags, Function, HostRegistration, KernelArg, LaunchConfig, Stream};

device_struct! {
    /// The words a kernel on the ring watches to know it must leave, the first words of its side's port (whose
    /// device address is the descriptor's `abort`), host memory this process owns: the mirror of
    /// `struct gpu_ipc_ring_exit` (`gpu_ipc_ring_layout.cuh`, generated from this struct).
    pub(crate) struct ExitWords => "gpu_ipc_ring_exit" {
        /// Non-zero: leave now (the host raises it at teardown and when its watchdog sees the peer die; a ring step
        /// that gives up raises it too, so the steps queued behind it leave).
        pub abort,
        /// Moved forward by this process's heartbeat thread every 10 ms while the process lives.
        pub heartbeat,
        /// 0: no lease. Else nanoseconds of %globaltimer: a kernel that sees `heartbeat` stand still that long takes
        /// its process for gone and leaves (GPU_IPC_RING_ORPHANED).
        pub lease_ns,
        /// Device address of the word the survivor raises in the control block when it sees this side's process
        /// gone (the producer's or this consumer's kernel abort word); 0: none. Non-zero there: leave now.
        pub peer_abort,
    }
}

/// Words of the port: the exit words, the progress word, then the descriptor.
const ABORT: usize = offset_of!(ExitWords, abort) / 8;
const HEARTBEAT: usize = offset_of!(ExitWords, heartbeat) / 8;
const LEASE_NS: usize = offset_of!(ExitWords, lease_ns) / 8;
const PEER_ABORT: usize = offset_of!(ExitWords, peer_abort) / 8;
const PROGRESS: usize = ExitWords::WORDS;
const DESCRIPTOR: usize = PROGRESS + 1;
/// Most words a descriptor may have (the producer's has 19, the consumer's 15).
pub(super) const MAX_DESCRIPTOR_WORDS: usize = 30;
type PortWords = [AtomicU64; DESCRIPTOR + MAX_DESCRIPTOR_WORDS];

impl HeartbeatWord for SharedObject<PortWords> {
    fn heartbeat(&self) -> &AtomicU64 {
        &self.get()[HEARTBEAT]
    }
}

/// Bytes of the port's memfd: 64 KiB, whole pages on every Linux page size, as `cuMemHostRegister` wants.
const PORT_BYTES: usize = 64 * 1024;

/// The abort word of a side's ring kernels, shared with its watchdog: set once the port exists.
#[derive(Debug, Default)]
pub(crate) struct AbortWord(OnceLock<Arc<SharedObject<PortWords>>>);

impl AbortWord {
    /// Tells every kernel on the ring to leave (nothing when none was ever launched).
    pub fn raise(&self) {
        if let Some(words) = self.0.get() {
            words.get()[ABORT].store(1, Ordering::Release);
        }
    }
}

/// What a producer or consumer keeps for the work it launches on the ring (a kernel, frame graphs): the abort word,
/// shared with its watchdog, the port, made at the first launch, and the kernel lease ([`KernelLease::default`] at
/// first).
#[derive(Default)]
pub(crate) struct ResidentSide {
    pub(super) abort: Arc<AbortWord>,
    pub(super) port: Option<RingPort>,
    /// The lease the side's kernels get from the next launch on.
    pub(super) lease: KernelLease,
}

/// How the work launched on the ring ended at teardown ([`ResidentSide::leave`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Departure {
    /// Nothing was ever launched.
    NoneLaunched,
    /// It left; the progress word: the first frame it did not publish or release.
    Left(u64),
    /// It did not leave by the deadline: its port is leaked (never unregistered under a running kernel), and so
    /// must be the ring's memory it may still touch.
    Stuck,
}

impl ResidentSide {
    /// The check both sides make before host-driven work on the ring: [`FrameError::Config`] while a kernel
    /// launched on the ring may still run (`what` says what it does with the frames, e.g. "reads its frames"), as
    /// it owns them. `Ok(true)`: one was launched and has finished, so the caller takes the frames back
    /// (`finish_ring_kernel`); `Ok(false)`: none was launched.
    ///
    /// # Errors
    /// As above; a driver error from the port's event.
    pub(crate) fn check_no_kernel_running(&self, what: &str) -> Result<bool, FrameError> {
        match &self.port {
            Some(port) if port.busy()? => Err(FrameError::Config(format!(
                "a kernel launched on the ring still {what}: call finish_ring_kernel first"
            ))),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    /// The abort word, for the side's watchdog to raise when the peer dies.
    pub(crate) fn abort_word(&self) -> Arc<AbortWord> {
        self.abort.clone()
    }

    /// Teardown: raises the abort word and waits, at most until `deadline`, for the work launched on the ring to
    /// leave.
    pub(crate) fn leave(&mut self, deadline: Instant) -> Departure {
        let Some(mut port) = self.port.take() else { return Departure::NoneLaunched };
        match port.finish(deadline, true) {
            Ok(progress) => Departure::Left(progress),
            Err(error) => {
                tracing::error!(%error, "the work launched on the ring did not leave on its abort word");
                std::mem::forget(port);
                Departure::Stuck
            }
        }
    }
}

impl ResidentSide {
    /// Makes the port ready for a kernel or frame graphs on the ring of a side whose strategy is `strategy`, with
    /// the side's lease and `peer_abort` (the device address of its kernel abort word in the control block) in its
    /// exit words: the control block must be registered for the device (`peer_abort` non-zero: the GPU-side
    /// strategies), else [`FrameError::StrategyUnavailable`] saying that `user` needs it and what to `fix`; the port
    /// is made at first use.
    pub(super) fn open(
        &mut self,
        peer_abort: Option<u64>,
        strategy: impl std::fmt::Display,
        (user, fix): (&str, &str),
        stream: &Stream,
    ) -> Result<(), FrameError> {
        let Some(peer_abort) = peer_abort else {
            return Err(FrameError::StrategyUnavailable {
                strategy: strategy.to_string(),
                reason: format!(
                    "{user} the control block registered for the device, which only gpu-stream-ops and gpu-poll do; \
                     {fix} with one of them"
                ),
            });
        };
        if self.port.is_none() {
            self.port = Some(RingPort::new(stream, &self.abort)?);
        }
        if let Some(port) = &self.port {
            port.set_exit(self.lease, peer_abort);
        }
        Ok(())
    }
}

/// A side's port for kernels on the ring: its host-registered words and the kernel (or frame graphs) running, if
/// any.
pub(super) struct RingPort {
    words: HostRegistration<SharedObject<PortWords>>,
    /// Recorded after the last work launched on the ring (made once, recorded again at each launch).
    event: Option<Event>,
    /// Whether `event` was recorded and not yet seen complete by `finish`.
    running: bool,
}

impl RingPort {
    /// Creates the words (abort 0) in `stream`'s context and hands them to `abort`.
    pub fn new(stream: &Stream, abort: &AbortWord) -> Result<Self, FrameError> {
        let memory = SharedMemory::create("gpu-ipc-ring-port", PORT_BYTES).map_err(RingError::from)?;
        let object = Arc::new(SharedObject::<PortWords>::new(memory).map_err(RingError::from)?);
        let words = HostRegistration::new(stream.context(), object.clone())?;
        let beating: Arc<dyn HeartbeatWord> = object.clone();
        keep_beating(&beating);
        // One port per consumer (made at its first launch), so the watchdog's handle is still empty here.
        if abort.0.set(object).is_err() {
            tracing::debug!("ring port: the abort word was already handed to the watchdog");
        }
        Ok(Self { words, event: None, running: false })
    }

    /// Whether a kernel launched on the ring may still run.
    pub fn busy(&self) -> Result<bool, FrameError> {
        Ok(match &self.event {
            Some(event) if self.running => !event.is_complete()?,
            _ => false,
        })
    }

    /// Records the port's event (made at first use) after the work queued on `stream` so far: `busy` and `finish`
    /// then cover it.
    pub fn record(&mut self, stream: &Stream) -> Result<(), FrameError> {
        if self.event.is_none() {
            self.event = Some(Event::new(stream.context(), EventFlags::default())?);
        }
        if let Some(event) = &self.event {
            event.record(stream)?;
        }
        self.running = true;
        Ok(())
    }

    /// Writes the lease and the survivor's abort word's address into the exit words (both 0 with the lease off).
    fn set_exit(&self, lease: KernelLease, peer_abort: u64) {
        let words = self.words.memory().get();
        words[LEASE_NS].store(lease.lease_ns(), Ordering::Release);
        words[PEER_ABORT].store(if lease.watches_peer() { peer_abort } else { 0 }, Ordering::Release);
    }

    /// Stores `next` into the progress word (before work that starts from it is launched).
    pub fn set_progress(&self, next: u64) {
        self.words.memory().get()[PROGRESS].store(next, Ordering::Release);
    }

    /// The descriptor's addresses of the exit words (the abort word first) and of the progress word.
    pub fn word_addresses(&self) -> (u64, u64) {
        let base = self.words.device_ptr().raw();
        (base + 8 * ABORT as u64, base + 8 * PROGRESS as u64)
    }

    /// Writes the descriptor's `words` and the progress word (`first_sequence`), launches `kernel` with the
    /// descriptor as its first argument, then records the event that says when it is done.
    pub fn launch(
        &mut self,
        words: &[u64],
        first_sequence: u64,
        kernel: &Function,
        stream: &Stream,
        config: LaunchConfig,
        args: &[KernelArg<'_>],
    ) -> Result<(), FrameError> {
        if words.len() > MAX_DESCRIPTOR_WORDS {
            return Err(FrameError::Config(format!("a ring descriptor of {} words", words.len())));
        }
        let port = self.words.memory().get();
        port[PROGRESS].store(first_sequence, Ordering::Release);
        for (word, &value) in port[DESCRIPTOR..].iter().zip(words) {
            word.store(value, Ordering::Release);
        }
        let span = self.words.span().slice(8 * DESCRIPTOR as u64, 8 * words.len() as u64)?;
        let all: Vec<KernelArg<'_>> = std::iter::once(KernelArg::Span(span)).chain(args.iter().copied()).collect();
        kernel.launch_typed(stream, config, &all)?;
        self.record(stream)
    }

    /// Waits until the kernel launched on the ring is done, at most until `deadline` (raising the abort word when
    /// `abort_first`); then the progress word: the first frame the kernel did not release.
    pub fn finish(&mut self, deadline: Instant, abort_first: bool) -> Result<u64, FrameError> {
        if abort_first {
            self.words.memory().get()[ABORT].store(1, Ordering::Release);
        }
        if let Some(event) = self.event.as_ref().filter(|_| self.running) {
            wait_for_event(
                event,
                deadline,
                Some(Duration::from_micros(50)),
                || true,
                || "the kernel launched on the ring".to_owned(),
            )?;
        }
        self.running = false;
        Ok(self.words.memory().get()[PROGRESS].load(Ordering::Acquire))
    }

    /// The progress word: the kernel's next frame (the first it has not released or published).
    pub fn progress(&self) -> u64 {
        self.words.memory().get()[PROGRESS].load(Ordering::Acquire)
    }

    /// The abort word's current value (non-zero once raised).
    pub fn aborted(&self) -> bool {
        self.words.memory().get()[ABORT].load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_an_abort_word_that_no_port_set_does_nothing() {
        AbortWord::default().raise();
    }
}
