//! A pipeline stage: the consumer of one ring and the producer of another. Each frame taken from upstream is
//! turned, by the caller's work, into a frame published downstream; the end of the upstream stream becomes the
//! clean end of the downstream one, and an upstream that dies makes the downstream ring end as a death, so no stage
//! after it takes a broken stream for a whole one. See `docs/pipelines.md`.
//!
//! ```no_run
//! use std::time::Duration;
//! use ipc_core::host::{HostContext, Host};
//! use ipc_core::frames::{ProducerConfig, Stage, StageConfig};
//! use ipc_core::wire::{FrameGeometry, PixelFormat, SyncStrategy};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let geometry = FrameGeometry::new(640, 480, PixelFormat::Rgb8)?;
//! let downstream = ProducerConfig::new("/tmp/b.sock", geometry, 4, SyncStrategy::CpuSpin);
//! let mut stage =
//!     Stage::<Host, Host>::start(&HostContext, &HostContext, StageConfig::new("/tmp/a.sock", downstream))?;
//! let mut pixels = Vec::new();
//! stage.run(None, |io| {
//!     // Host memory here; with a GPU backend, `io.input_span()?` and `io.output_span()?` for your kernel.
//!     pixels.resize(io.input.bytes() as usize, 0);
//!     io.upstream.region().read(io.input.ptr(), &mut pixels)?;
//!     pixels.iter_mut().for_each(|p| *p = !*p);
//!     io.downstream.region().write(io.output.ptr(), &pixels)?;
//!     Ok(())
//! })?;
//! stage.finish(None, Duration::from_secs(10))?; // downstream consumers get EndOfStream after every frame
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::Backend;
use crate::frames::{AttachOptions, Consumer, Frame, FrameError, Producer, ProducerConfig, SlotLease};
use gpu_ipc_driver::{DeviceMemory, DeviceSpan, Stream};

/// An error of the caller's work on a frame, whatever its type (`?` converts any error).
pub type WorkError = Box<dyn std::error::Error + Send + Sync>;

/// How a stage is set up: where its upstream ring is, and its downstream ring.
#[derive(Debug, Clone)]
pub struct StageConfig {
    /// The upstream ring's rendezvous socket.
    pub upstream: PathBuf,
    /// How to attach upstream (its name, how long to wait for the upstream producer to appear, ...).
    pub attach: AttachOptions,
    /// The downstream ring: its own socket, geometry, slots and sync strategy.
    pub downstream: ProducerConfig,
    /// Downstream consumers to wait for before the stage attaches upstream (default 1): until someone reads what
    /// the stage publishes it takes nothing from upstream.
    pub downstream_consumers: usize,
    /// Bound on each wait for downstream consumers (at the start, and under [`DownstreamEmpty::Wait`]), default
    /// 30 s.
    pub consumer_timeout: Duration,
    /// Bound on each wait for one frame: for the upstream frame, for a free downstream slot, for the upstream
    /// frame's publish (default 10 s).
    pub frame_timeout: Duration,
    /// What to do when no downstream consumer is left (default: fail).
    pub when_downstream_empty: DownstreamEmpty,
}

impl StageConfig {
    /// A stage reading the ring at `upstream` and publishing into `downstream`: 1 downstream consumer awaited for
    /// at most 30 s, 10 s bounds per frame, a failure when the downstream consumers are gone, attached upstream
    /// under the name `stage` (waiting for its producer no longer than the default: set
    /// [`AttachOptions::wait_for_producer`] in [`StageConfig::attach`] when the upstream producer may start later).
    pub fn new(upstream: impl Into<PathBuf>, downstream: ProducerConfig) -> Self {
        Self {
            upstream: upstream.into(),
            attach: AttachOptions { name: "stage".into(), ..AttachOptions::default() },
            downstream,
            downstream_consumers: 1,
            consumer_timeout: Duration::from_secs(30),
            frame_timeout: Duration::from_secs(10),
            when_downstream_empty: DownstreamEmpty::Fail,
        }
    }
}

/// What a stage does when every downstream consumer is gone (killed, detached, evicted): looked at before each
/// frame is taken from upstream, so a frame is never taken for nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DownstreamEmpty {
    /// Fail with [`StageError::NoDownstreamConsumers`] (the default).
    #[default]
    Fail,
    /// Wait up to [`StageConfig::consumer_timeout`] for a consumer to attach, taking nothing from upstream
    /// meanwhile (the upstream producer waits too, once its ring is full), then fail as above.
    Wait,
}

/// What one call of [`Stage::process`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StageStep {
    /// Upstream frame `upstream` was worked on and published downstream as frame `downstream`.
    Frame {
        /// Its sequence number in the upstream ring.
        upstream: u64,
        /// Its sequence number in the downstream ring.
        downstream: u64,
    },
    /// The upstream producer closed its ring cleanly after publishing `upstream_published` frames, and every one
    /// this stage received went downstream. Nothing more will come: call [`Stage::finish`].
    End {
        /// Frames the upstream producer published in all (sequences `0..upstream_published`).
        upstream_published: u64,
    },
}

/// What the caller's work gets for one frame: the upstream frame to read and the downstream slot to write.
pub struct StageIo<'a, U: Backend, D: Backend> {
    /// The upstream ring (for [`Consumer::region`] on the host backend).
    pub upstream: &'a Consumer<U>,
    /// The frame to read.
    pub input: &'a Frame,
    /// The downstream ring (for [`Producer::region`] on the host backend).
    pub downstream: &'a Producer<D>,
    /// The slot to write.
    pub output: &'a SlotLease,
}

impl<'a, U: Backend, D: Backend> StageIo<'a, U, D>
where
    U::Imported: DeviceMemory,
    D::Exported: DeviceMemory,
{
    /// The input frame's device memory, bounds-checked, for a kernel to read.
    ///
    /// # Errors
    /// As [`Consumer::frame_span`].
    pub fn input_span(&self) -> Result<DeviceSpan<'a>, FrameError> {
        self.upstream.frame_span(self.input)
    }

    /// The output slot's device memory, bounds-checked, for a kernel to write.
    ///
    /// # Errors
    /// As [`Producer::slot_span`].
    pub fn output_span(&self) -> Result<DeviceSpan<'a>, FrameError> {
        self.downstream.slot_span(self.output)
    }
}

/// What went wrong in a stage, and on which side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// The upstream ring failed: its producer died ([`FrameError::ProducerGone`]), it evicted this stage, a wait
    /// timed out, attaching failed.
    #[error("upstream ring {}: {source}", path.display())]
    Upstream {
        /// The upstream socket.
        path: PathBuf,
        /// What happened.
        #[source]
        source: FrameError,
    },
    /// The downstream ring failed: it could not be created, no consumer attached in time, a wait for a free slot
    /// timed out (a consumer that does not release), a publish failed.
    #[error("downstream ring {}: {source}", path.display())]
    Downstream {
        /// The downstream socket.
        path: PathBuf,
        /// What happened.
        #[source]
        source: FrameError,
    },
    /// Every downstream consumer is gone, so nobody would read what the stage publishes.
    #[error(
        "downstream ring {}: no consumer is attached any more ({lost} vanished, {evicted} evicted); start the next \
         stage again, or let this one wait for it (DownstreamEmpty::Wait)",
        path.display()
    )]
    NoDownstreamConsumers {
        /// The downstream socket.
        path: PathBuf,
        /// Consumers that vanished without detaching (killed, crashed) so far.
        lost: usize,
        /// Consumers evicted so far.
        evicted: usize,
    },
    /// The caller's work on a frame failed.
    #[error("the stage's work on upstream frame {seq} failed: {source}")]
    Work {
        /// The upstream frame.
        seq: u64,
        /// The work's error.
        #[source]
        source: WorkError,
    },
}

impl StageError {
    /// Whether the upstream producer is gone without ending its stream (it died): the stage cannot go on.
    pub fn is_upstream_gone(&self) -> bool {
        matches!(self, Self::Upstream { source: FrameError::ProducerGone { .. }, .. })
    }
}

/// A frame taken from upstream by a call that failed after taking it: the next call goes on with it.
struct Pending {
    frame: Frame,
    lease: Option<SlotLease>,
    /// The work on `lease` is done (queued, on a GPU).
    worked: bool,
}

/// A pipeline stage: consumes the frames of the upstream ring and publishes what the caller's work makes of each
/// into the downstream ring, one for one, in order. Each side has its own backend (`U`, `D`) and sync strategy (the
/// upstream producer's, [`ProducerConfig::sync`]); both sides' GPU work goes on the one stream given to
/// [`Stage::process`].
///
/// Per frame: the upstream frame, a free downstream slot, the work, a check that the upstream frame was really
/// published ([`Consumer::wait_published`]: with a GPU-side strategy upstream, the one CPU wait of the stage, so
/// that a frame released by the end of the stream or the producer's death is never sent on), the downstream
/// publish, the upstream release.
///
/// How it ends: [`Stage::finish`] (or dropping it after [`StageStep::End`]) closes the downstream ring cleanly, so its
/// consumers get [`FrameError::EndOfStream`] after the last frame. Dropping it otherwise (an error, a panic)
/// abandons the downstream ring ([`Producer::abandon`]): its consumers get [`FrameError::ProducerGone`], as if this
/// stage had died, and never mistake the frames so far for a whole stream.
pub struct Stage<U: Backend, D: Backend> {
    upstream: Consumer<U>,
    downstream: Producer<D>,
    upstream_path: PathBuf,
    downstream_path: PathBuf,
    frame_timeout: Duration,
    consumer_timeout: Duration,
    when_empty: DownstreamEmpty,
    pending: Option<Pending>,
    first_upstream: u64,
    frames: u64,
    /// Set at the clean end of the upstream stream: what it published.
    end: Option<u64>,
    /// The downstream ring ends cleanly when the stage is dropped: after [`StageStep::End`], or in [`Stage::finish`].
    clean: bool,
}

impl<U: Backend, D: Backend> Stage<U, D> {
    /// Creates the downstream ring, waits (up to [`StageConfig::consumer_timeout`]) for its first
    /// [`StageConfig::downstream_consumers`] consumers, then attaches upstream: the first frame it takes is the
    /// upstream producer's next one.
    ///
    /// # Errors
    /// [`StageError::Downstream`] (the ring could not be made, consumers did not come), [`StageError::Upstream`]
    /// (no upstream producer, a refusal, a backend mismatch). The downstream ring, if made, is abandoned.
    pub fn start(up_ctx: &U::Context, down_ctx: &D::Context, config: StageConfig) -> Result<Self, StageError> {
        let downstream_path = config.downstream.socket_path.clone();
        let down = |source| StageError::Downstream { path: downstream_path.clone(), source };
        let mut downstream = Producer::<D>::create(down_ctx, config.downstream).map_err(down)?;
        let started = downstream
            .wait_for_consumers(config.downstream_consumers, config.consumer_timeout)
            .map_err(down)
            .and_then(|()| {
                Consumer::<U>::attach(up_ctx, &config.upstream, &config.attach)
                    .map_err(|source| StageError::Upstream { path: config.upstream.clone(), source })
            });
        let upstream = match started {
            Ok(upstream) => upstream,
            Err(e) => {
                downstream.abandon();
                return Err(e);
            }
        };
        tracing::info!(
            upstream = %config.upstream.display(),
            downstream = %downstream_path.display(),
            first = upstream.next_sequence(),
            "stage started"
        );
        Ok(Self {
            first_upstream: upstream.next_sequence(),
            upstream,
            downstream,
            upstream_path: config.upstream,
            downstream_path,
            frame_timeout: config.frame_timeout,
            consumer_timeout: config.consumer_timeout,
            when_empty: config.when_downstream_empty,
            pending: None,
            frames: 0,
            end: None,
            clean: false,
        })
    }

    /// Moves one frame through the stage: takes the next upstream frame (after [`DownstreamEmpty`]'s look at the
    /// downstream consumers), acquires a downstream slot, runs `work` on both, checks the upstream frame was
    /// published, publishes the slot and releases the frame. GPU-side strategies queue their waits and signals on
    /// `stream`, where `work` queues its kernels too; CPU strategies ignore it (`None` on the host backend).
    ///
    /// After an error the frame already taken is kept, and the next call goes on with it (a timeout may pass;
    /// the work is run again only when it failed, or when the publish failed). [`StageStep::End`] once the upstream
    /// stream ended cleanly, and on every call after it.
    ///
    /// # Errors
    /// [`StageError::Upstream`] ([`StageError::is_upstream_gone`] when its producer died),
    /// [`StageError::Downstream`], [`StageError::NoDownstreamConsumers`], [`StageError::Work`].
    pub fn process<W>(&mut self, stream: Option<&Stream>, work: W) -> Result<StageStep, StageError>
    where
        W: FnOnce(StageIo<'_, U, D>) -> Result<(), WorkError>,
    {
        if let Some(upstream_published) = self.end {
            return Ok(StageStep::End { upstream_published });
        }
        let mut pending = match self.pending.take() {
            Some(pending) => pending,
            None => {
                self.check_downstream_consumers()?;
                match self.upstream.next_frame(stream, self.frame_timeout) {
                    Ok(frame) => Pending { frame, lease: None, worked: false },
                    Err(FrameError::EndOfStream { published, .. }) => return Ok(self.ended(published)),
                    Err(source) => return Err(self.upstream_error(source)),
                }
            }
        };
        let lease = match pending.lease.take() {
            Some(lease) => lease,
            None => match self.downstream.acquire(stream, self.frame_timeout) {
                Ok(lease) => lease,
                Err(source) => {
                    self.pending = Some(pending);
                    return Err(self.downstream_error(source));
                }
            },
        };
        let upstream_seq = pending.frame.seq().0;
        if !pending.worked {
            let io = StageIo {
                upstream: &self.upstream,
                input: &pending.frame,
                downstream: &self.downstream,
                output: &lease,
            };
            if let Err(source) = work(io) {
                self.pending = Some(Pending { lease: Some(lease), ..pending });
                return Err(StageError::Work { seq: upstream_seq, source });
            }
        }
        match self.upstream.wait_published(&pending.frame, self.frame_timeout) {
            Ok(()) => {}
            // Never written (a GPU-side wait released by the end of the stream): neither the frame nor what was
            // made of it goes on; the unpublished slot is rewritten by the next acquire.
            Err(FrameError::EndOfStream { published, .. }) => return Ok(self.ended(published)),
            Err(source @ FrameError::Timeout { .. }) => {
                self.pending = Some(Pending { lease: Some(lease), worked: true, ..pending });
                return Err(self.upstream_error(source));
            }
            Err(source) => return Err(self.upstream_error(source)),
        }
        let downstream_seq = lease.seq().0;
        if let Err(source) = self.downstream.publish(lease, stream) {
            // The lease is spent but the frame unpublished: the next call acquires the same slot again.
            self.pending = Some(Pending { frame: pending.frame, lease: None, worked: false });
            return Err(self.downstream_error(source));
        }
        // Published downstream: the frame has moved through, whatever its release upstream says.
        self.frames += 1;
        match self.upstream.release(pending.frame, stream) {
            Ok(()) => {}
            Err(FrameError::EndOfStream { published, .. }) => return Ok(self.ended(published)),
            // The upstream producer died after publishing this frame: what it published before dying still goes
            // through (the next call takes it), and its death is reported where no frame is left to take.
            Err(FrameError::ProducerGone { .. }) => {}
            Err(source) => return Err(self.upstream_error(source)),
        }
        Ok(StageStep::Frame { upstream: upstream_seq, downstream: downstream_seq })
    }

    /// Runs [`Stage::process`] until the upstream stream ends cleanly; returns the frames the upstream producer
    /// published in all. Then call [`Stage::finish`].
    ///
    /// # Errors
    /// The first error of [`Stage::process`].
    pub fn run<W>(&mut self, stream: Option<&Stream>, mut work: W) -> Result<u64, StageError>
    where
        W: FnMut(StageIo<'_, U, D>) -> Result<(), WorkError>,
    {
        loop {
            if let StageStep::End { upstream_published } = self.process(stream, &mut work)? {
                return Ok(upstream_published);
            }
        }
    }

    /// Ends the stage cleanly, at the end of the upstream stream or before it: waits (up to `timeout`) until every
    /// downstream consumer released every frame published, then closes the downstream ring (its consumers get
    /// [`FrameError::EndOfStream`] after the last frame) and detaches from upstream. Returns the frames it
    /// published downstream.
    ///
    /// # Errors
    /// [`StageError::Downstream`] when the drain timed out; the ring is closed cleanly all the same (every frame
    /// counted was published).
    pub fn finish(mut self, stream: Option<&Stream>, timeout: Duration) -> Result<u64, StageError> {
        self.clean = true;
        self.pending = None;
        let frames = self.downstream.next_sequence();
        self.downstream.drain(stream, timeout).map_err(|source| self.downstream_error(source))?;
        Ok(frames)
    }

    /// The upstream ring, as this stage's consumer of it.
    pub fn upstream(&self) -> &Consumer<U> {
        &self.upstream
    }

    /// The downstream ring, as this stage's producer of it (consumer counts, eviction, ...).
    pub fn downstream(&mut self) -> &mut Producer<D> {
        &mut self.downstream
    }

    /// Frames moved through the stage so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The first upstream frame this stage took (or will take): the upstream producer's next frame when it
    /// attached. Downstream frame `n` is upstream frame `first_upstream() + n`.
    pub fn first_upstream(&self) -> u64 {
        self.first_upstream
    }

    /// The upstream socket.
    pub fn upstream_path(&self) -> &Path {
        &self.upstream_path
    }

    /// The downstream socket.
    pub fn downstream_path(&self) -> &Path {
        &self.downstream_path
    }

    fn ended(&mut self, published: u64) -> StageStep {
        tracing::info!(upstream_published = published, frames = self.frames, "stage: upstream ended cleanly");
        self.end = Some(published);
        self.clean = true;
        self.pending = None;
        StageStep::End { upstream_published: published }
    }

    /// Before a frame is taken from upstream: some consumer must read what comes out downstream.
    fn check_downstream_consumers(&mut self) -> Result<(), StageError> {
        if self.downstream.consumers() > 0 {
            return Ok(());
        }
        let no_consumers = |producer: &mut Producer<D>, path: &Path| StageError::NoDownstreamConsumers {
            path: path.to_owned(),
            lost: producer.consumers_lost(),
            evicted: producer.consumers_evicted(),
        };
        match self.when_empty {
            DownstreamEmpty::Fail => Err(no_consumers(&mut self.downstream, &self.downstream_path)),
            DownstreamEmpty::Wait => {
                tracing::warn!(
                    downstream = %self.downstream_path.display(),
                    timeout = ?self.consumer_timeout,
                    "stage: no downstream consumer; waiting for one"
                );
                match self.downstream.wait_for_consumers(1, self.consumer_timeout) {
                    Ok(()) => Ok(()),
                    Err(FrameError::Timeout { .. }) => Err(no_consumers(&mut self.downstream, &self.downstream_path)),
                    Err(source) => Err(self.downstream_error(source)),
                }
            }
        }
    }

    fn upstream_error(&self, source: FrameError) -> StageError {
        StageError::Upstream { path: self.upstream_path.clone(), source }
    }

    fn downstream_error(&self, source: FrameError) -> StageError {
        StageError::Downstream { path: self.downstream_path.clone(), source }
    }
}

impl<U: Backend, D: Backend> Drop for Stage<U, D> {
    fn drop(&mut self) {
        if !self.clean {
            tracing::warn!(
                downstream = %self.downstream_path.display(),
                "stage dropped before the end of its stream: abandoning the downstream ring"
            );
            self.downstream.mark_abandoned();
        }
    }
}
