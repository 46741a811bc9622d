//! The resident rows (`resident-BACKEND-sN`, `resident-BACKEND-sN-one-block`): both sides persistent kernels on the
//! ring's device API (`kernels/cuda/gpu_ipc_ring.cuh`), each launched once for the whole row through
//! `launch_on_ring`. The producer's kernel (here) waits for each slot to come free, writes the frame's pattern and
//! publishes it; one consumer process's kernel waits for each frame, checks every word against its pattern and
//! releases it. No CPU is on the per-frame path and there is no launch between frames, so what is left between these
//! rows and the same kernels pipelined in one process (`single-process-pipelined-sN`, the same depth) is the ring's
//! handoff itself.
//!
//! The grid rows run `gpu_ipc_persistent_fill_grid` / `gpu_ipc_persistent_verify_grid` (a leader block and a worker
//! block per SM but one on each side, `gpu_ipc_kernels::persistent::GridShape::per_sm`), which time every frame on
//! the GPU's `%globaltimer`, one clock for both processes: the row's window runs from the consumer's release of the
//! last warm-up frame to its release of the last frame, and each frame's latency from its publish to its release.
//! The one-block rows run the device API's one-block examples (`gpu_ipc_persistent_fill` / `_verify`), timed on the
//! host from launch to finish, warm-up included: they show what one SM's share of the memory bandwidth costs a 4K
//! frame. Under MPS only: without it the two kernels never run at once (each holds its context's time slice).

use std::time::{Duration, Instant};

use gpu_ipc::GpuBackendVisitor;
use gpu_ipc::core::backend::{Backend, GpuBackend};
use gpu_ipc::core::frames::{Consumer, FrameError, Producer, ProducerConfig};
use gpu_ipc::driver::mps::MpsEvidence;
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::kernels::persistent::{
    GridShape, PersistentFill, PersistentFillGrid, PersistentOutcome, PersistentResult, PersistentVerify,
    PersistentVerifyGrid,
};

use super::consumer::attach;
use super::results::{ConsumerReport, Measurement};
use super::rig::{
    RunConfig, base_plan, collect_reports, failed_row, frame_error, frame_geometry, measurement, socket_path,
    spawn_consumers, wait_for_consumers,
};
use super::rows::{RESIDENT_STRATEGY, ResidentShape, RowSpec};
use super::shared::{PublishStamps, cpu_ns};
use super::tasks::{ConsumerPlan, Setup};
use harness::MeasurementError;
use harness::gpu::GpuSetup;

/// Runs a resident row: unavailable without MPS, else the producer's kernel here and one consumer process's.
pub(crate) fn row(
    gpu: &GpuSetup,
    cfg: &RunConfig,
    spec: RowSpec,
    backend: gpu_ipc::BackendKind,
    slots: u32,
    shape: ResidentShape,
) -> Result<Measurement, MeasurementError> {
    if let Some(why) = MpsEvidence::gather(gpu.context().device()).why_not() {
        return Err(MeasurementError::Unavailable(format!(
            "both sides are persistent kernels that wait for each other on the GPU, which without MPS never run at \
             once (each holds its context's time slice): MPS is not running ({why})"
        )));
    }
    gpu_ipc::dispatch_gpu(backend, ResidentProducer { gpu, cfg, spec, slots, shape }).unwrap_or_else(|e| Err(e.into()))
}

/// How long a side's kernel may take for `frames` frames, each bounded by `per_frame` in the kernel: a frame every
/// 10 ms on average (a hundred times slower than one SM fills a 4K frame), plus two bounds.
fn kernel_bound(frames: u64, per_frame: Duration) -> Duration {
    let frames = u32::try_from(frames).unwrap_or(u32::MAX);
    Duration::from_millis(10).saturating_mul(frames).saturating_add(per_frame.saturating_mul(2))
}

/// CPU nanoseconds of a whole run (`total` frames, warm-up included) pro-rated to its `measured` frames: the CPU time
/// per frame of a run whose one launch covers the warm-up too.
fn pro_rated(cpu_ns: u64, measured: u64, total: u64) -> u64 {
    if total == 0 {
        return 0;
    }
    u64::try_from(u128::from(cpu_ns) * u128::from(measured) / u128::from(total)).unwrap_or(u64::MAX)
}

/// The measured window of a grid row on the GPU's clock, in ns: from the consumer's release of the last warm-up
/// frame (without a warm-up: the producer's first publish) to its release of the last frame. `None` when the times
/// do not cover the run or do not move forward.
fn gpu_window_ns(published: &[u64], released: &[u64], warmup: u64) -> Option<u64> {
    let last = *released.last()?;
    let start = match usize::try_from(warmup).ok()? {
        0 => *published.first()?,
        w => *released.get(w - 1)?,
    };
    last.checked_sub(start).filter(|&ns| ns > 0)
}

/// Each measured frame's latency on the GPU's clock, publish to release, in ns (0 where the clock reads the release
/// first: both are taken by different SMs after different stores).
fn gpu_latencies_ns(published: &[u64], released: &[u64], warmup: u64) -> Vec<u64> {
    let from = usize::try_from(warmup).unwrap_or(usize::MAX);
    published.iter().zip(released).skip(from).map(|(p, r)| r.saturating_sub(*p)).collect()
}

/// The producer's kernel of a resident row.
enum FillKernel {
    Grid(PersistentFillGrid, GridShape),
    OneBlock(PersistentFill),
}

impl FillKernel {
    fn load(ctx: &Context, shape: ResidentShape, slot_bytes: u64) -> Result<Self, MeasurementError> {
        Ok(match shape {
            ResidentShape::Grid => {
                let grid = GridShape::per_sm(slot_bytes, ctx.device().sm_count()?);
                Self::Grid(PersistentFillGrid::load(ctx)?, grid)
            }
            ResidentShape::OneBlock => Self::OneBlock(PersistentFill::load(ctx)?),
        })
    }

    fn launch<B: Backend>(
        &mut self,
        producer: &mut Producer<B>,
        stream: &Stream,
        frames: u64,
        per_frame: Duration,
    ) -> Result<(), FrameError> {
        match self {
            Self::Grid(kernel, grid) => kernel.launch(producer, stream, frames, per_frame, *grid),
            Self::OneBlock(kernel) => kernel.launch(producer, stream, frames, per_frame),
        }
    }

    fn finish<B: Backend>(
        &mut self,
        producer: &mut Producer<B>,
        timeout: Duration,
    ) -> Result<PersistentResult, FrameError> {
        match self {
            Self::Grid(kernel, _) => kernel.finish(producer, timeout),
            Self::OneBlock(kernel) => kernel.finish(producer, timeout),
        }
    }

    /// The publish time of each frame on the GPU's clock (the grid kernel; none for the one-block one).
    fn times(&self) -> Result<Vec<u64>, FrameError> {
        match self {
            Self::Grid(kernel, _) => kernel.grid().frame_times(),
            Self::OneBlock(_) => Ok(Vec::new()),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Grid(_, grid) => format!(
                "grid kernels: a leader block and {} worker blocks of {} threads on each side",
                grid.workers,
                gpu_ipc::kernels::persistent::GRID_THREADS
            ),
            Self::OneBlock(_) => "one-block kernels (the device API's examples)".to_owned(),
        }
    }
}

/// The consumer's kernel of a resident row.
enum VerifyKernel {
    Grid(PersistentVerifyGrid, GridShape),
    OneBlock(PersistentVerify),
}

impl VerifyKernel {
    fn load(ctx: &Context, shape: ResidentShape, slot_bytes: u64) -> Result<Self, MeasurementError> {
        Ok(match shape {
            ResidentShape::Grid => {
                let grid = GridShape::per_sm(slot_bytes, ctx.device().sm_count()?);
                Self::Grid(PersistentVerifyGrid::load(ctx)?, grid)
            }
            ResidentShape::OneBlock => Self::OneBlock(PersistentVerify::load(ctx)?),
        })
    }

    fn launch<B: Backend>(
        &mut self,
        consumer: &mut Consumer<B>,
        stream: &Stream,
        frames: u64,
        per_frame: Duration,
    ) -> Result<(), FrameError> {
        match self {
            Self::Grid(kernel, grid) => kernel.launch(consumer, stream, frames, per_frame, *grid),
            Self::OneBlock(kernel) => kernel.launch(consumer, stream, frames, per_frame),
        }
    }

    fn finish<B: Backend>(
        &mut self,
        consumer: &mut Consumer<B>,
        timeout: Duration,
    ) -> Result<PersistentResult, FrameError> {
        match self {
            Self::Grid(kernel, _) => kernel.finish(consumer, timeout),
            Self::OneBlock(kernel) => kernel.finish(consumer, timeout),
        }
    }

    /// The release time of each frame on the GPU's clock (the grid kernel; none for the one-block one).
    fn times(&self) -> Result<Vec<u64>, FrameError> {
        match self {
            Self::Grid(kernel, _) => kernel.grid().frame_times(),
            Self::OneBlock(_) => Ok(Vec::new()),
        }
    }
}

/// [`MeasurementError::Other`] unless a side's kernel did all `total` frames.
fn check_done(side: &str, result: &PersistentResult, total: u64) -> Result<(), MeasurementError> {
    if result.frames == total && result.outcome == PersistentOutcome::Done {
        return Ok(());
    }
    Err(MeasurementError::Other(format!(
        "the {side}'s kernel did {} of {total} frames and stopped at frame {}: {:?}",
        result.frames, result.stopped_at, result.outcome
    )))
}

struct ResidentProducer<'a> {
    gpu: &'a GpuSetup,
    cfg: &'a RunConfig,
    spec: RowSpec,
    slots: u32,
    shape: ResidentShape,
}

impl GpuBackendVisitor for ResidentProducer<'_> {
    type Output = Result<Measurement, MeasurementError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let (gpu, cfg) = (self.gpu, self.cfg);
        let socket = socket_path();
        let config = ProducerConfig::new(&socket, frame_geometry(cfg.shape)?, self.slots, RESIDENT_STRATEGY);
        let stream = Stream::new(gpu.context())?;
        let mut producer = Producer::<B>::create(gpu.context(), config).map_err(frame_error)?;
        let slot_bytes = producer.slot_layout().bytes();
        let stamps = PublishStamps::create()?;
        let plan = base_plan(cfg, self.spec, Some(socket));
        let mut children = spawn_consumers(&plan, 1, &stamps, &Setup { handle: None }, &|| Ok(Vec::new()))?;
        let total = cfg.total();
        let produced = (|| -> Result<(FillKernel, Duration, u64), MeasurementError> {
            wait_for_consumers(&mut producer, 1, &children)?;
            let mut kernel = FillKernel::load(gpu.context(), self.shape, slot_bytes)?;
            let (t0, cpu0) = (Instant::now(), cpu_ns());
            kernel.launch(&mut producer, &stream, total, cfg.frame_timeout).map_err(frame_error)?;
            let bound = kernel_bound(total, cfg.frame_timeout).min(cfg.row_timeout);
            let result = kernel.finish(&mut producer, bound).map_err(frame_error)?;
            let (wall, cpu) = (t0.elapsed(), cpu_ns().saturating_sub(cpu0));
            check_done("producer", &result, total)?;
            producer.drain(Some(&stream), cfg.frame_timeout).map_err(frame_error)?;
            Ok((kernel, wall, cpu))
        })();
        let (kernel, wall, cpu) = match produced {
            Ok(done) => done,
            Err(e) => return Err(failed_row(e, children, gpu.context(), &stream, cfg.frame_timeout)),
        };
        let mut reports = collect_reports(&mut children)?;
        let published = kernel.times()?;
        let mut notes = vec![format!(
            "both sides persistent kernels on the ring's device API, one launch each for all {total} frames (ring \
             strategy {}, whose own waits are not used); {}",
            RESIDENT_STRATEGY.name(),
            kernel.describe()
        )];
        let seconds = match (&published[..], reports.first_mut()) {
            ([], _) | (_, None) => {
                notes.push(format!(
                    "timed on the host from launch to finish, warm-up included ({total} frames); no latency figure"
                ));
                wall.as_secs_f64() * cfg.frames as f64 / total.max(1) as f64
            }
            (published, Some(report)) => {
                let released = std::mem::take(&mut report.gpu_done_ns);
                let window = gpu_window_ns(published, &released, cfg.warmup).ok_or_else(|| {
                    MeasurementError::Other(format!(
                        "the kernels' frame times do not cover the run ({} published, {} released)",
                        published.len(),
                        released.len()
                    ))
                })?;
                report.latencies_ns = gpu_latencies_ns(published, &released, cfg.warmup);
                notes.push(
                    "timed on the GPU's %globaltimer: the consumer's releases after the warm-up; latency from each \
                     frame's publish to its release"
                        .to_owned(),
                );
                window as f64 / 1e9
            }
        };
        notes.push("CPU per frame over the whole launch (warm-up included)".to_owned());
        measurement(cfg, seconds, pro_rated(cpu, cfg.frames, total), &reports, notes)
    }
}

/// The consumer process of a resident row: its kernel checks and releases every frame; it reports the kernel's
/// mismatched words, its CPU time over the launch (pro-rated to the measured frames) and each frame's release time
/// on the GPU's clock.
pub(crate) struct ResidentConsumer<'a> {
    pub(crate) plan: &'a ConsumerPlan,
}

impl GpuBackendVisitor for ResidentConsumer<'_> {
    type Output = Result<ConsumerReport, MeasurementError>;

    fn visit<B: GpuBackend>(self) -> Self::Output {
        let plan = self.plan;
        let RowSpec::Resident { shape, .. } = plan.spec else {
            return Err(MeasurementError::Other(format!("{} is not a resident row", plan.spec.name())));
        };
        let gpu = GpuSetup::open(plan.device)?;
        let mut consumer = attach::<B>(gpu.context(), plan)?;
        let per_frame = Duration::from_millis(plan.frame_timeout_ms);
        let mut kernel = VerifyKernel::load(gpu.context(), shape, consumer.slot_layout().bytes())?;
        let total = plan.frames_total;
        let cpu0 = cpu_ns();
        kernel.launch(&mut consumer, gpu.stream(), total, per_frame).map_err(MeasurementError::Frames)?;
        let result = kernel.finish(&mut consumer, kernel_bound(total, per_frame)).map_err(MeasurementError::Frames)?;
        let cpu = cpu_ns().saturating_sub(cpu0);
        check_done("consumer", &result, total)?;
        let released = kernel.times().map_err(MeasurementError::Frames)?;
        consumer.detach();
        let measured = total.saturating_sub(plan.warmup);
        Ok(ConsumerReport {
            frames: result.frames,
            measured_frames: measured,
            cpu_ns: pro_rated(cpu, measured, total),
            mismatches: result.mismatched_words,
            latencies_ns: Vec::new(),
            missing_stamps: 0,
            gpu_done_ns: released,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod gpu_tests;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_window_runs_from_the_last_warm_up_release_to_the_last_release() {
        let published = [100, 200, 300, 400, 500];
        let released = [150, 260, 330, 470, 560];
        assert_eq!(gpu_window_ns(&published, &released, 2), Some(560 - 260));
        assert_eq!(gpu_window_ns(&published, &released, 0), Some(560 - 100), "no warm-up: from the first publish");
        assert_eq!(gpu_window_ns(&published, &released[..1], 2), None, "times that do not cover the warm-up");
        assert_eq!(gpu_window_ns(&published, &[], 2), None);
        assert_eq!(gpu_window_ns(&[5], &[5], 0), None, "a window that does not move forward");
    }

    #[test]
    fn latencies_are_publish_to_release_of_the_measured_frames() {
        let published = [100, 200, 300, 400];
        let released = [150, 260, 290, 470];
        assert_eq!(gpu_latencies_ns(&published, &released, 1), vec![60, 0, 70]);
        assert_eq!(gpu_latencies_ns(&published, &released, 9), Vec::<u64>::new());
    }

    #[test]
    fn cpu_time_of_the_whole_launch_is_pro_rated_to_the_measured_frames() {
        assert_eq!(pro_rated(1_100, 1_000, 1_100), 1_000);
        assert_eq!(pro_rated(u64::MAX, 1, 1), u64::MAX);
        assert_eq!(pro_rated(5, 1, 0), 0);
    }

    #[test]
    fn a_kernel_that_stopped_early_fails_the_row_with_where_and_why() {
        let done =
            PersistentResult { frames: 10, mismatched_words: 0, outcome: PersistentOutcome::Done, stopped_at: 10 };
        assert!(check_done("producer", &done, 10).is_ok());
        let stopped = PersistentResult { frames: 4, outcome: PersistentOutcome::TimedOut, stopped_at: 4, ..done };
        let e = check_done("consumer", &stopped, 10).unwrap_err().to_string();
        assert!(e.contains("consumer's kernel did 4 of 10 frames") && e.contains("TimedOut"), "{e}");
        let short = PersistentResult { frames: 9, ..done };
        assert!(check_done("producer", &short, 10).is_err(), "done, but not every frame");
    }

    #[test]
    fn the_kernels_get_a_bound_that_covers_a_slow_frame_rate() {
        assert_eq!(kernel_bound(100, Duration::from_secs(1)), Duration::from_secs(3));
        assert_eq!(kernel_bound(u64::MAX, Duration::MAX), Duration::MAX);
    }
}
