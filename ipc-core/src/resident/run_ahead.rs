//! Bounds how far the CPU may queue GPU-side work ahead of the GPU (the `GpuStreamOps` strategy), so a producer
//! or consumer never queues an unbounded number of frames behind a stream wait, and tells teardown when the
//! stream has passed everything queued on the ring.
//!
//! The stream reports its progress itself: each side owns a private word of page-locked host memory, and the
//! batches that end a frame (a publish, a release) end with a write of the next *mark* (1, 2, 3, ...) to that word.
//! The CPU learns how far the stream got with one atomic load: no event is recorded or queried per frame. Batches of
//! waits carry no mark of their own (a mark after a wait cost 1.1 us of GPU time per wait on an H100 under MPS,
//! `tools/scripts/signal-paths.sh`, "ours" against "ours-lite"): the frame's next mark covers them, and teardown
//! reports a wait queued after the last mark (see [`Tail`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::frames::FrameError;
use crate::ring::RingError;
use crate::ring::Sequence;
use crate::shm::{SharedMemory, SharedObject};
use gpu_ipc_driver::{
    Context, DeviceMemory, DeviceSpan, DriverError, Event, EventFlags, HostRegistration, MemOpBatch, Stream,
};

/// How long the CPU naps between looks at the stream's progress: the CPU is not on the per-frame path here, so
/// it may as well sleep (the run-ahead depth keeps the GPU busy meanwhile).
const NAP: Duration = Duration::from_micros(20);

/// Naps between two checks for an error of the context (a faulted kernel stops the stream for good).
const NAPS_PER_HEALTH_CHECK: u32 = 16;

/// The progress words' memory: one page, of which word 0 is used.
type ProgressWords = [AtomicU64; 8];
const PROGRESS_BYTES: usize = 4096;

/// Where the marks are in `ProgressWords`.
const PROGRESS_OFFSET: u64 = 0;

/// The fewest frames a side may have in flight, whatever the slot count. A nap lasts about 70 us (`NAP` plus the
/// kernel's timer slack), and the CPU resumes queueing only when half the depth is through the stream (see
/// [`RunAhead::before`]), so half the depth must hold more GPU work than one nap, or the GPU idles while the CPU
/// sleeps. A one-slot round trip through two processes' streams is about 8 us of GPU work under MPS
/// (`tools/scripts/signal-paths.sh`, "ours"); with a depth of 8 the library's round trip measured 20-21 us, the stream
/// idling behind the naps (docs/benchmarks.md). 16 such frames are about 130 us.
pub(crate) const MIN_DEPTH: usize = 32;

/// The run-ahead bound of a side of a ring of `slots` slots.
pub(crate) const fn depth_for(slots: u32) -> usize {
    let twice = 2 * slots as usize;
    if twice > MIN_DEPTH { twice } else { MIN_DEPTH }
}

/// Before queueing frame `seq`, the CPU naps until frame `seq - depth` has gone through the stream, or the
/// deadline passes.
pub(crate) struct RunAhead {
    progress: HostRegistration<SharedObject<ProgressWords>>,
    /// The mark queued after frame `seq`, at `seq % depth`.
    frames: Box<[AtomicU64]>,
    /// The latest mark queued (0: none yet).
    queued: AtomicU64,
    /// Whether work without a mark (a batch of waits) was queued after the latest mark.
    unmarked: AtomicBool,
    /// Never recorded: querying it reports the context's sticky error, if any.
    health: Event,
}

/// What teardown found once the stream passed the last mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Nothing was queued after the last mark: the stream is past everything this side queued on the ring.
    Clear,
    /// A batch of waits was queued after the last mark (e.g. `next_frame` without its `release`): the stream may
    /// still read the memory those waits name, so its owner must not be freed (leak it).
    UnmarkedWait,
}

impl RunAhead {
    /// Allows `depth` frames in flight.
    ///
    /// # Errors
    /// The progress word's memory could not be made or registered.
    pub(crate) fn new(ctx: &Context, depth: usize) -> Result<Self, FrameError> {
        let memory = SharedMemory::create("gpu-ipc-run-ahead", PROGRESS_BYTES).map_err(RingError::from)?;
        let words = SharedObject::new(memory).map_err(RingError::from)?;
        let progress = HostRegistration::new(ctx, Arc::new(words))?;
        let flags = EventFlags { timing: false, blocking_sync: false, interprocess: false };
        Ok(Self {
            progress,
            frames: (0..depth.max(1)).map(|_| AtomicU64::new(0)).collect(),
            queued: AtomicU64::new(0),
            unmarked: AtomicBool::new(false),
            health: Event::new(ctx, flags)?,
        })
    }

    /// Frames allowed in flight.
    pub(crate) fn depth(&self) -> u64 {
        self.frames.len() as u64
    }

    /// The latest mark the stream has passed.
    pub(crate) fn progress(&self) -> u64 {
        // Acquire: what the stream did before the mark (the ring's counters it wrote) is visible after it.
        self.progress.memory().get()[0].load(Ordering::Acquire)
    }

    /// The mark the next marked submission will write: once the stream passes it, it is past everything queued
    /// before, unmarked batches of waits included.
    pub(crate) fn next_mark(&self) -> u64 {
        self.queued.load(Ordering::Relaxed) + 1
    }

    /// Whether the stream has passed `mark`.
    pub(crate) fn passed(&self, mark: u64) -> bool {
        passed(self.progress(), mark)
    }

    /// Naps until frame `seq - depth` is through the stream (nothing to wait for on the first `depth` frames).
    ///
    /// When it has to nap, it naps until frame `seq - depth / 2` is through: the CPU then wakes once per half
    /// depth of frames rather than once per frame (every nap costs the CPU a few microseconds of system time), and
    /// the stream still holds half the depth of queued work while the CPU sleeps.
    ///
    /// # Errors
    /// [`FrameError::Timeout`] at `deadline`: the stream is stuck behind a wait that nobody satisfies; a driver
    /// error when the context failed (e.g. a kernel's illegal address).
    pub(crate) fn before(&self, seq: Sequence, deadline: Instant) -> Result<(), FrameError> {
        // `frames[seq % depth]` holds frame `seq - depth`'s mark (0 for none: the first `depth` frames).
        let bound = self.frames[self.index(seq)].load(Ordering::Relaxed);
        if self.passed(bound) {
            return Ok(());
        }
        // Here seq >= depth (a non-zero mark), so frame `seq - depth / 2` exists and was queued; an entry older
        // than the bound (a frame that was never marked) must not weaken it.
        let half = Sequence(seq.0 - self.depth() / 2);
        let resume = self.frames[self.index(half)].load(Ordering::Relaxed).max(bound);
        self.wait_for(resume, deadline, || {
            format!("the stream to finish frame {} (a GPU-side wait is not satisfied)", seq.0 - self.depth())
        })
    }

    /// The progress word and the next mark, for a kernel that stores the mark itself when it is done (gpu-poll's
    /// kernels: no stream memory operation between two kernels). Call [`marked`](Self::marked) once the kernel is
    /// queued.
    ///
    /// # Errors
    /// None in practice (the word lies inside the progress page).
    pub(crate) fn kernel_mark(&self) -> Result<(DeviceSpan<'_>, u64), DriverError> {
        Ok((self.progress.span().slice(PROGRESS_OFFSET, 8)?, self.next_mark()))
    }

    /// Records that `mark` ([`kernel_mark`](Self::kernel_mark)) was queued, as frame `frame`'s mark when given.
    pub(crate) fn marked(&self, mark: u64, frame: Option<Sequence>) {
        self.record(mark, frame);
    }

    /// Queues on `stream` a mark of the latest work (one `cuStreamWriteValue64`).
    fn mark(&self, stream: &Stream) -> Result<(), DriverError> {
        let mark = self.next_mark();
        self.progress.write_value_u64(stream, PROGRESS_OFFSET as usize, mark)?;
        self.record(mark, None);
        Ok(())
    }

    fn record(&self, mark: u64, frame: Option<Sequence>) {
        self.queued.store(mark, Ordering::Relaxed);
        self.unmarked.store(false, Ordering::Relaxed);
        if let Some(seq) = frame {
            self.frames[self.index(seq)].store(mark, Ordering::Relaxed);
        }
    }

    /// Queues `batch` on `stream` followed by the next mark (one driver call for both), and records that mark as
    /// frame `frame`'s when one is given.
    ///
    /// # Errors
    /// A failing `cuStreamBatchMemOp` (nothing is recorded then).
    pub(crate) fn submit<'a>(
        &'a self,
        mut batch: MemOpBatch<'a>,
        stream: &Stream,
        frame: Option<Sequence>,
    ) -> Result<(), DriverError> {
        let mark = self.queued.load(Ordering::Relaxed) + 1;
        let span = self.progress.span();
        batch.write_u64(&span, PROGRESS_OFFSET, mark)?;
        batch.submit(stream)?;
        self.record(mark, frame);
        Ok(())
    }

    /// Queues `batch` on `stream` without a mark (a batch of waits, which the frame's next mark covers).
    ///
    /// # Errors
    /// A failing `cuStreamBatchMemOp`.
    pub(crate) fn submit_unmarked(&self, batch: MemOpBatch<'_>, stream: &Stream) -> Result<(), DriverError> {
        batch.submit(stream)?;
        self.unmarked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until everything queued on `stream` so far is done, or `deadline` passes.
    ///
    /// # Errors
    /// [`FrameError::Timeout`], driver errors.
    pub(crate) fn drain(&self, stream: &Stream, deadline: Instant) -> Result<(), FrameError> {
        self.mark(stream)?;
        self.wait_for(self.queued.load(Ordering::Relaxed), deadline, || "the stream to drain".to_owned())
    }

    /// Naps until the stream has passed every mark queued so far, or `deadline` passes: before the memory its
    /// waits and writes use is freed. Every batch that writes the ring ends with a mark; a batch of waits queued
    /// after the last one is reported as [`Tail::UnmarkedWait`], whose memory must then be leaked.
    ///
    /// # Errors
    /// [`FrameError::Timeout`]: the stream is stuck; the caller must leak that memory rather than free it.
    pub(crate) fn settle(&self, deadline: Instant) -> Result<Tail, FrameError> {
        self.wait_for(self.queued.load(Ordering::Relaxed), deadline, || "the stream to pass the ring's work".into())?;
        Ok(if self.unmarked.load(Ordering::Relaxed) { Tail::UnmarkedWait } else { Tail::Clear })
    }

    fn index(&self, seq: Sequence) -> usize {
        (seq.0 % self.frames.len() as u64) as usize
    }

    /// Naps until the stream has passed `mark` (at once for mark 0, "nothing"), checking now and then that the
    /// context did not fail.
    fn wait_for(&self, mark: u64, deadline: Instant, what: impl Fn() -> String) -> Result<(), FrameError> {
        let start = Instant::now();
        let mut naps = 0u32;
        loop {
            if self.passed(mark) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline || (naps > 0 && naps.is_multiple_of(NAPS_PER_HEALTH_CHECK)) {
                // A failed context never reaches the mark: report its error rather than a timeout.
                self.health.is_complete()?;
                if now >= deadline {
                    return Err(FrameError::Timeout { what: what(), waited: start.elapsed() });
                }
            }
            std::thread::sleep(NAP);
            naps = naps.wrapping_add(1);
        }
    }
}

/// Whether a stream whose progress word reads `progress` has passed `mark` (marks only grow; 0 is "nothing").
fn passed(progress: u64, mark: u64) -> bool {
    progress >= mark
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_twice_the_slots_but_never_below_the_minimum() {
        assert_eq!(depth_for(1), MIN_DEPTH);
        assert_eq!(depth_for(8), MIN_DEPTH);
        assert_eq!(depth_for(16), 32);
        assert_eq!(depth_for(32), 64);
    }

    #[test]
    fn nothing_queued_is_always_passed_and_marks_compare_by_order() {
        assert!(passed(0, 0));
        assert!(!passed(0, 1));
        assert!(passed(5, 5));
        assert!(passed(6, 5));
        assert!(!passed(4, 5));
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn the_stream_reports_its_marks_and_the_bound_waits_for_them() {
        use gpu_ipc_driver::MemOpScratch;
        let ctx = Context::for_ordinal(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let run_ahead = RunAhead::new(&ctx, 2).unwrap();
        let soon = || Instant::now() + Duration::from_secs(5);
        assert_eq!(run_ahead.settle(soon()).unwrap(), Tail::Clear);
        for seq in 0..6 {
            run_ahead.before(Sequence(seq), soon()).unwrap();
            let mut scratch = MemOpScratch::default();
            run_ahead.submit(MemOpBatch::new(&mut scratch), &stream, Some(Sequence(seq))).unwrap();
        }
        run_ahead.mark(&stream).unwrap();
        assert_eq!(run_ahead.next_mark(), 8);
        assert_eq!(run_ahead.settle(soon()).unwrap(), Tail::Clear);
        assert_eq!(run_ahead.progress(), 7);
        // A batch without a mark after the last one: reported, until a mark covers it.
        let mut scratch = MemOpScratch::default();
        run_ahead.submit_unmarked(MemOpBatch::new(&mut scratch), &stream).unwrap();
        assert_eq!(run_ahead.settle(soon()).unwrap(), Tail::UnmarkedWait);
        run_ahead.drain(&stream, soon()).unwrap();
        assert_eq!(run_ahead.progress(), 8);
        assert_eq!(run_ahead.settle(soon()).unwrap(), Tail::Clear);
    }
}
