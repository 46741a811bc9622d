//! `pipeline transform` (B): a [`Stage`] from the ring at `--upstream` into its own ring at `--socket`, writing each
//! frame XORed with `--xor` (every bit inverted by default; `gpu_ipc_xor_words` on a GPU). It waits for its
//! consumer before it attaches upstream, passes the end of the upstream stream on as a clean end of its own, and
//! when the upstream producer dies it ends its ring as a death (its consumer gets `ProducerGone`) and exits 4.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpu_ipc::BackendKind;
use gpu_ipc::core::backend::Backend;
use gpu_ipc::core::frames::{
    AttachOptions, DownstreamEmpty, FrameError, ProducerConfig, Stage, StageConfig, StageError, StageStep,
};

use super::{EXIT_NO_CONSUMER, RingArgs, mask_name, parse_mask};
use crate::work::{StageVisitor, StageWork, run_with_stage_backends};
use crate::{CommonArgs, EXIT_PRODUCER_GONE, cpu_time, fps};

/// Options of `pipeline transform`.
#[derive(Debug, Clone, clap::Args)]
pub struct TransformArgs {
    /// `--socket` and `--backend` are the ring this role creates (downstream).
    #[command(flatten)]
    pub common: CommonArgs,
    /// The downstream ring (give it the upstream frame size: the transform keeps it).
    #[command(flatten)]
    pub ring: RingArgs,
    /// The upstream ring's socket (the `generate` role's, or another stage's).
    #[arg(long)]
    pub upstream: PathBuf,
    /// The upstream ring's backend [default: --backend].
    #[arg(long)]
    pub upstream_backend: Option<BackendKind>,
    /// The mask every 32-bit word is XORed with (decimal or 0x hexadecimal; 0xffffffff inverts every bit).
    #[arg(long, default_value = "0xffffffff", value_parser = parse_mask)]
    pub xor: u32,
    /// When its consumer goes, wait up to --attach-timeout for another instead of exiting with status 6.
    #[arg(long)]
    pub wait_for_downstream: bool,
    /// Print `transform: frame N` on stderr every N frames (0: never).
    #[arg(long, default_value_t = 0)]
    pub progress_every: u64,
}

/// What `pipeline transform` prints.
#[derive(Debug, serde::Serialize)]
pub struct TransformSummary {
    /// `transform`.
    pub role: &'static str,
    /// The upstream ring's backend.
    pub upstream_backend: &'static str,
    /// The upstream ring's sync strategy (the upstream producer's choice).
    pub upstream_sync: &'static str,
    /// Its own ring's backend.
    pub backend: &'static str,
    /// Its own ring's sync strategy.
    pub sync: &'static str,
    /// The mask, as `0xffffffff`.
    pub xor: String,
    /// The first upstream frame it took (its frame `n` is upstream frame `first_upstream + n`).
    pub first_upstream: u64,
    /// Frames it passed on.
    pub frames: u64,
    /// Frames the upstream producer published in all, when its stream ended cleanly.
    pub upstream_published: Option<u64>,
    /// Seconds from the start of the stage to its end.
    pub seconds: f64,
    /// Frames per second over them.
    pub fps: f64,
    /// CPU time per frame, in microseconds.
    pub cpu_us_per_frame: f64,
}

/// How `pipeline transform` ended when the stage itself failed: the exit status and the one line it prints.
pub fn exit_for_stage(e: &StageError) -> (u8, String) {
    match e {
        e if e.is_upstream_gone() => (EXIT_PRODUCER_GONE, format!("transform: {e}")),
        StageError::NoDownstreamConsumers { .. } => {
            (EXIT_NO_CONSUMER, format!("transform: {e} (this program: --wait-for-downstream)"))
        }
        _ => (1, format!("transform: {e}")),
    }
}

/// Runs `pipeline transform`: the outer error is a failure to set up (no driver, a backend pair it cannot run),
/// the inner one the stage's.
///
/// # Errors
/// As above.
pub fn transform(args: TransformArgs) -> Result<Result<TransformSummary, StageError>, FrameError> {
    let upstream = args.upstream_backend.unwrap_or(args.common.backend);
    run_with_stage_backends(upstream, args.common.backend, Transform(args))
}

struct Transform(TransformArgs);

impl StageVisitor for Transform {
    type Output = Result<TransformSummary, StageError>;

    fn run<U: Backend, D: Backend, W: StageWork<U, D>>(self) -> Result<Self::Output, FrameError> {
        let args = self.0;
        let work = W::open(args.common.device)?;
        let geometry = args.ring.geometry(D::KIND)?;
        let patience = Duration::from_secs(args.common.attach_timeout);
        let downstream = ProducerConfig::new(&args.common.socket, geometry, args.ring.slots, args.ring.sync(D::KIND));
        let mut config = StageConfig::new(&args.upstream, downstream);
        config.attach = AttachOptions { name: "transform".into(), wait_for_producer: patience, ..config.attach };
        config.consumer_timeout = patience;
        if args.wait_for_downstream {
            config.when_downstream_empty = DownstreamEmpty::Wait;
        }
        eprintln!("transform: waiting for a consumer on {}", args.common.socket.display());
        let (cpu0, t0) = (cpu_time(), Instant::now());
        let (up_ctx, down_ctx) = work.contexts();
        let mut stage = match Stage::<U, D>::start(up_ctx, down_ctx, config) {
            Ok(stage) => stage,
            Err(e) => return Ok(Err(e)),
        };
        eprintln!(
            "transform: attached to {}; its frame 0 is upstream frame {}",
            args.upstream.display(),
            stage.first_upstream()
        );
        let upstream_sync = stage.upstream().offer().sync.name();
        let mask = args.xor;
        let published = loop {
            let step = stage.process(work.stream(), |io| Ok(work.xor(&io, mask)?));
            match step {
                Ok(StageStep::Frame { downstream, .. }) => {
                    if args.progress_every != 0 && (downstream + 1).is_multiple_of(args.progress_every) {
                        eprintln!("transform: frame {}", downstream + 1);
                    }
                }
                Ok(StageStep::End { upstream_published }) => break upstream_published,
                Ok(other) => return Ok(Err(unexpected(other))),
                // Dropping the stage on the way out abandons its ring: its consumer sees this stage die.
                Err(e) => return Ok(Err(e)),
            }
        };
        let first_upstream = stage.first_upstream();
        let frames = match stage.finish(work.stream(), Duration::from_secs(10)) {
            Ok(frames) => frames,
            Err(e) => return Ok(Err(e)),
        };
        let elapsed = t0.elapsed();
        Ok(Ok(TransformSummary {
            role: "transform",
            upstream_backend: U::KIND.name(),
            upstream_sync,
            backend: D::KIND.name(),
            sync: args.ring.sync(D::KIND).name(),
            xor: mask_name(mask),
            first_upstream,
            frames,
            upstream_published: Some(published),
            seconds: elapsed.as_secs_f64(),
            fps: fps(frames, elapsed),
            cpu_us_per_frame: cpu_time().saturating_sub(cpu0).as_secs_f64() * 1e6 / frames.max(1) as f64,
        }))
    }
}

/// A step this program does not know (the enum may grow).
fn unexpected(step: StageStep) -> StageError {
    StageError::Work { seq: 0, source: format!("unexpected stage step {step:?}").into() }
}
