//! `pipeline generate` (A): publishes frames of the check pattern (frame `seq` holds `pattern(seq, i)` in word `i`)
//! into a ring. Unlike `producer`, it publishes only while a consumer is attached: when its consumer goes (the
//! next stage died), it says so on stderr and waits, up to `--attach-timeout`, for another, then goes on from its
//! next frame.

use std::time::{Duration, Instant};

use gpu_ipc::core::backend::Backend;
use gpu_ipc::core::frames::{FrameError, Producer, ProducerConfig};

use super::RingArgs;
use crate::work::{FrameWork, ProgramVisitor, run_with_backend};
use crate::{CommonArgs, cpu_time, fps};

/// Options of `pipeline generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// `--socket` is the ring this role creates.
    #[command(flatten)]
    pub common: CommonArgs,
    /// The ring.
    #[command(flatten)]
    pub ring: RingArgs,
    /// Frames to publish (0: until killed).
    #[arg(long, default_value_t = 10_000)]
    pub frames: u64,
    /// Pause between two frames, in microseconds (a camera's pace; 0: as fast as the pipeline goes).
    #[arg(long, default_value_t = 0)]
    pub interval_us: u64,
    /// Print `generate: frame N` on stderr every N frames (0: never).
    #[arg(long, default_value_t = 0)]
    pub progress_every: u64,
}

/// What `pipeline generate` prints.
#[derive(Debug, serde::Serialize)]
pub struct GenerateSummary {
    /// `generate`.
    pub role: &'static str,
    /// The ring's backend.
    pub backend: &'static str,
    /// The ring's sync strategy.
    pub sync: &'static str,
    /// Bytes of a frame.
    pub frame_bytes: u64,
    /// Frames published.
    pub frames: u64,
    /// Seconds from the first consumer's attach to the drain.
    pub seconds: f64,
    /// Frames per second over them.
    pub fps: f64,
    /// CPU time per frame, in microseconds.
    pub cpu_us_per_frame: f64,
    /// Consumers that vanished without detaching.
    pub consumers_lost: usize,
    /// Times it found no consumer attached and waited for one.
    pub consumer_waits: u64,
}

/// Runs `pipeline generate`.
///
/// # Errors
/// No consumer within `--attach-timeout` (at the start or after losing one), and any error of the ring.
pub fn generate(args: GenerateArgs) -> Result<GenerateSummary, FrameError> {
    run_with_backend(args.common.backend, Generate(args))
}

struct Generate(GenerateArgs);

impl ProgramVisitor for Generate {
    type Output = GenerateSummary;

    fn run<B: Backend, W: FrameWork<B>>(self) -> Result<GenerateSummary, FrameError> {
        let args = self.0;
        let mut work = W::open(args.common.device)?;
        let geometry = args.ring.geometry(B::KIND)?;
        let config = ProducerConfig::new(&args.common.socket, geometry, args.ring.slots, args.ring.sync(B::KIND));
        let mut producer = Producer::<B>::create(work.ctx(), config)?;
        let patience = Duration::from_secs(args.common.attach_timeout);
        eprintln!("generate: waiting for a consumer on {}", args.common.socket.display());
        producer.wait_for_consumers(1, patience)?;
        let (timeout, interval) = (Duration::from_secs(10), Duration::from_micros(args.interval_us));
        let (mut produced, mut consumer_waits) = (0u64, 0u64);
        let (cpu0, t0) = (cpu_time(), Instant::now());
        while args.frames == 0 || produced < args.frames {
            if producer.consumers() == 0 {
                // Its consumer went: publish nothing for nobody; wait for the next stage to come back.
                consumer_waits += 1;
                eprintln!(
                    "generate: no consumer attached any more ({} vanished so far); waiting up to {}s for one, at \
                     frame {}",
                    producer.consumers_lost(),
                    patience.as_secs(),
                    producer.next_sequence()
                );
                producer.wait_for_consumers(1, patience)?;
                eprintln!("generate: a consumer attached; going on at frame {}", producer.next_sequence());
            }
            let slot = producer.acquire(work.stream(), timeout)?;
            work.fill(&producer, &slot)?;
            producer.publish(slot, work.stream())?;
            produced += 1;
            if args.progress_every != 0 && produced.is_multiple_of(args.progress_every) {
                eprintln!("generate: frame {produced}");
            }
            if !interval.is_zero() {
                std::thread::sleep(interval);
            }
        }
        producer.drain(work.stream(), timeout)?;
        let elapsed = t0.elapsed();
        Ok(GenerateSummary {
            role: "generate",
            backend: B::KIND.name(),
            sync: args.ring.sync(B::KIND).name(),
            frame_bytes: geometry.frame_bytes(),
            frames: produced,
            seconds: elapsed.as_secs_f64(),
            fps: fps(produced, elapsed),
            cpu_us_per_frame: cpu_time().saturating_sub(cpu0).as_secs_f64() * 1e6 / produced.max(1) as f64,
            consumers_lost: producer.consumers_lost(),
            consumer_waits,
        })
    }
}
