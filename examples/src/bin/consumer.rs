//! A consumer: attaches to a `producer`, checks every frame on the GPU against the pattern of its sequence number
//! (no copy: the kernel reads the shared slot in place), releases it, and prints frames per second and the number
//! of mismatched words (which must be 0).
//!
//! ```text
//! consumer --socket /tmp/frames.sock --backend vmm --frames 10000 --json
//! ```
//! With `--frames 0` it reads until the end of the stream: a producer that closes its ring cleanly ends the run
//! with status 0 and the number of frames read (frames a GPU-side strategy queued past the end are counted
//! apart, never as read or mismatched); a producer that dies ends it with status 4.
//!
//! `--backend host` runs without a GPU (host memory, CPU strategies; the demo of the README). A ring of tensors (a
//! producer started with `--tensor`) is read the same way; the summary says what its slots hold (`slot`).
//!
//! Exit status: 0 all frames verified; 1 mismatches or another error; 3 no CUDA driver (use `--backend host`);
//! 4 the producer died; 5 the producer evicted this consumer (after `--stall-after`).
//!
//! With a GPU-side strategy (gpu-stream-ops, gpu-poll) each frame is checked behind its stamp
//! (`Frame::stamp`, `gpu_ipc_verify_stamped`): a frame a dead producer never wrote is skipped, never read, and
//! counted in `skipped_frames`, so `mismatched_words` stays 0 after a producer is killed. `--persistent` verifies
//! the frames in one persistent kernel on the ring's device API instead (`gpu_ipc_persistent_verify`: no launch
//! and no CPU work per frame; the summary's `persistent` says how it ended).
//!
//! For the stress harness (`gpu-ipc stress`): `--cycles N` attaches, reads `--frames` frames and detaches N times
//! (the summary has the fds and free device memory after the first cycle and at the end); `--stall-after N` stops
//! releasing after N frames, as a stuck consumer would, and waits for the producer to evict it. The summary has the
//! longest gap between two frames received.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use gpu_ipc::core::backend::Backend;
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError};
use gpu_ipc::core::wire::PeerPolicy;
use gpu_ipc::driver::Stream;
use gpu_ipc::kernels::persistent::{PersistentOutcome, PersistentResult};
use gpu_ipc_examples::work::{FrameWork, ProgramVisitor, run_with_backend};
use gpu_ipc_examples::{
    CommonArgs, EXIT_EVICTED, EXIT_PRODUCER_GONE, GapMeter, cpu_time, exit_for, fps, open_fds, print_summary,
};

/// Read and verify frames from shared GPU memory.
#[derive(Debug, Clone, Parser)]
#[command(version, after_help = gpu_ipc_examples::exit::HELP)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    /// Frames to read (0: until the producer goes away).
    #[arg(long, default_value_t = 10_000)]
    frames: u64,
    /// A name for the producer's logs.
    #[arg(long, default_value = "consumer")]
    name: String,
    /// Print `consumer NAME: frame SEQ` on stderr every N frames (0: never).
    #[arg(long, default_value_t = 0)]
    progress_every: u64,
    /// Attach, read `--frames` frames (which must not be 0) and detach, this many times.
    #[arg(long, default_value_t = 1)]
    cycles: u64,
    /// Stop releasing after this many frames (a stuck consumer): hold the next frame and wait until the producer
    /// evicts this consumer, goes away, or `--stall-timeout` passes.
    #[arg(long, value_name = "N")]
    stall_after: Option<u64>,
    /// How long a stalled consumer waits for the producer's verdict, in seconds.
    #[arg(long, default_value_t = 30)]
    stall_timeout: u64,
    /// Diagnosis: wait for each frame's check before taking the next one, and report on stderr each frame whose
    /// words mismatched (its sequence number, and milliseconds since the start). Slow: the consumer never runs
    /// ahead.
    #[arg(long)]
    check_each_frame: bool,
    /// Verify and release the `--frames` frames in one persistent kernel on the ring's device API (gpu-stream-ops
    /// or gpu-poll; read docs/kernels.md about MPS first).
    #[arg(long)]
    persistent: bool,
    /// Verify and release the frames with frame graphs: one CUDA graph per slot (wait and stamp check, the check,
    /// release), one launch per frame (gpu-stream-ops or gpu-poll, under MPS).
    #[arg(long, conflicts_with_all = ["persistent", "stall_after", "check_each_frame"])]
    graph: bool,
    /// Also accept a producer running as this uid (repeatable; default: our own uid only).
    #[arg(long = "producer-uid", value_name = "UID")]
    producer_uids: Vec<u32>,
}

#[derive(Debug, serde::Serialize)]
struct Summary {
    role: &'static str,
    name: String,
    backend: &'static str,
    sync: &'static str,
    /// What each slot of the ring holds, as the producer described it (`float32 [4, 1024, 1024] tensors (16777216
    /// bytes)`, `3840x2160 rgb8 frames (24883200 bytes)`).
    slot: Option<String>,
    /// The wire protocol version agreed with the producer.
    protocol_version: Option<u16>,
    first_seq: u64,
    frames: u64,
    mismatched_words: u64,
    seconds: f64,
    fps: f64,
    cpu_us_per_frame: f64,
    producer_gone: Option<String>,
    /// When the producer closed the ring cleanly: how many frames it published in all.
    end_of_stream_after: Option<u64>,
    /// Frames a GPU-side strategy had queued work for past the end of the stream (never written; not counted in
    /// `frames` nor in `mismatched_words`).
    frames_past_end: u64,
    /// Attach-read-detach cycles done.
    cycles: u64,
    /// Longest time between two frames received within one attachment, in milliseconds.
    max_frame_gap_ms: f64,
    /// Open fds after the first cycle's detach and at the end (`--cycles`; equal when nothing leaks).
    fds_after_first_cycle: Option<u64>,
    fds_at_end: u64,
    /// Free device memory (`cuMemGetInfo`, device-wide) after the first cycle and at the end.
    device_free_after_first_cycle: Option<u64>,
    device_free_at_end: Option<u64>,
    /// With `--stall-after`: `evicted`, `producer-gone`, `timeout` or `error`, then what was seen.
    stall_outcome: Option<String>,
    /// When the producer died: frames this consumer took that it had never published (their waits were released
    /// by the poison; `Consumer::published_below_at_hang_up`). Mismatched words can only come from these.
    frames_never_published: u64,
    /// Frames whose stamp said the producer never wrote them (a GPU-side strategy's wait released by a dead
    /// producer's poison): checked on the device before the kernel read a word, skipped, and not counted in
    /// `mismatched_words`. `None` when no frame had a stamp (CPU strategies, ipc-event, the host backend).
    skipped_frames: Option<u64>,
    /// With `--persistent`: what the persistent kernel reported.
    persistent: Option<PersistentResult>,
}

struct Run(Args);

impl ProgramVisitor for Run {
    type Output = Summary;
    fn run<B: Backend, W: FrameWork<B>>(self) -> Result<Summary, FrameError> {
        let args = self.0;
        if args.cycles > 1 && args.frames == 0 {
            return Err(FrameError::Config("--cycles needs a --frames count to read in each cycle".into()));
        }
        if args.graph && args.cycles > 1 {
            return Err(FrameError::Config("--graph reads one attachment: leave out --cycles".into()));
        }
        if args.persistent && (args.frames == 0 || args.stall_after.is_some() || args.check_each_frame) {
            return Err(FrameError::Config(
                "--persistent needs a --frames count, and neither --stall-after nor --check-each-frame".into(),
            ));
        }
        let mut persistent = None;
        let mut graph_mismatched = 0u64;
        let mut graph_skipped = None;
        let mut work = W::open(args.common.device)?;
        let producer = match args.producer_uids.as_slice() {
            [] => PeerPolicy::SameUser,
            uids => PeerPolicy::Users(uids.to_vec()),
        };
        let options = AttachOptions {
            name: args.name.clone(),
            producer,
            // Consumers may start before their producer.
            wait_for_producer: Duration::from_secs(args.common.attach_timeout),
            ..AttachOptions::default()
        };
        let timeout = Duration::from_secs(10);
        let (cpu0, t0) = (cpu_time(), Instant::now());
        let mut frames = 0;
        let mut gone = None;
        let mut ended: Option<u64> = None;
        let mut past_end_total = 0u64;
        let mut stall_outcome = None;
        let mut gaps = GapMeter::default();
        let mut seen_mismatched = 0u64;
        let mut frames_never_published = 0u64;
        // The last frame counted as read: frames past a clean end are taken back out of the count.
        let mut last_counted: Option<u64> = None;
        let (mut first_seq, mut sync, mut cycles) = (None, None, 0);
        let (mut slot, mut protocol_version) = (None, None);
        let (mut fds_after_first_cycle, mut device_free_after_first_cycle) = (None, None);
        while cycles < args.cycles.max(1) && gone.is_none() && ended.is_none() && stall_outcome.is_none() {
            let mut consumer = Consumer::<B>::attach(work.ctx(), &args.common.socket, &options)?;
            first_seq.get_or_insert(consumer.next_sequence());
            sync.get_or_insert(consumer.offer().sync);
            slot.get_or_insert_with(|| consumer.slot_layout().to_string());
            protocol_version.get_or_insert(consumer.protocol_version());
            gaps.restart();
            let mut read = 0;
            if args.persistent {
                let result = work.run_persistent(&mut consumer, args.frames, timeout)?;
                frames += result.frames;
                read = result.frames;
                if result.outcome != PersistentOutcome::Done {
                    match consumer.check_producer() {
                        Err(FrameError::ProducerGone { pid, how }) => gone = Some(format!("producer pid {pid}: {how}")),
                        Err(FrameError::EndOfStream { published, .. }) => ended = Some(published),
                        _ => {
                            return Err(FrameError::Config(format!(
                                "the persistent kernel stopped at frame {} ({:?}) with the producer still there",
                                result.stopped_at, result.outcome
                            )));
                        }
                    }
                }
                persistent = Some(result);
            }
            if args.graph {
                let run = work.run_graph_verify(&mut consumer, args.frames, timeout, args.progress_every)?;
                let past_end = match run.ended {
                    Some(FrameError::EndOfStream { published, .. }) => {
                        ended = Some(published);
                        consumer.next_sequence().saturating_sub(published)
                    }
                    Some(FrameError::ProducerGone { pid, how }) => {
                        gone = Some(format!("producer pid {pid}: {how}"));
                        0
                    }
                    _ => 0,
                };
                read = run.launched - run.skipped;
                frames += read;
                graph_mismatched = run.mismatched_words;
                graph_skipped = Some(run.skipped.saturating_sub(past_end));
                // Frames past the end were launched and skipped, not read: `frames` already leaves them out.
                last_counted = None;
            }
            while !args.persistent && !args.graph && (args.frames == 0 || read < args.frames) {
                if args.stall_after.is_some_and(|n| frames >= n) {
                    stall_outcome = Some(stall(&mut consumer, work.stream(), Duration::from_secs(args.stall_timeout)));
                    break;
                }
                let step = consumer.next_frame(work.stream(), timeout).and_then(|frame| {
                    let seq = frame.seq().0;
                    work.verify(&consumer, &frame)?;
                    consumer.release(frame, work.stream()).map(|()| seq)
                });
                if args.check_each_frame {
                    report_mismatch(&work, consumer.next_sequence(), t0, &mut seen_mismatched)?;
                }
                match step {
                    Ok(seq) => {
                        frames += 1;
                        read += 1;
                        last_counted = Some(seq);
                        gaps.tick();
                        if args.progress_every != 0 && frames % args.progress_every == 0 {
                            eprintln!("consumer {}: frame {frames}", args.name);
                        }
                    }
                    Err(FrameError::EndOfStream { published, .. }) => {
                        ended = Some(published);
                        break;
                    }
                    Err(FrameError::ProducerGone { pid, how }) => {
                        gone = Some(format!("producer pid {pid}: {how}"));
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            work.synchronize()?;
            if let Some(below) = consumer.published_below_at_hang_up()
                && ended.is_none()
            {
                frames_never_published += consumer.next_sequence().saturating_sub(below);
            }
            let past_end = ended.map_or(0, |end| consumer.next_sequence().saturating_sub(end));
            if gone.is_none() {
                consumer.detach();
            }
            cycles += 1;
            if cycles == 1 && args.cycles > 1 {
                fds_after_first_cycle = Some(open_fds());
                device_free_after_first_cycle = work.device_free();
            }
            if let Some(end) = ended {
                // Frames at or past the end that were counted (their release returned before the end was known)
                // were never written: take them back out.
                let counted_past_end = last_counted.map_or(0, |last| (last + 1).saturating_sub(end));
                frames -= counted_past_end.min(frames);
                past_end_total += past_end;
            }
        }
        let elapsed = t0.elapsed();
        // With a clean end, only the frames the producer published count: their last is `end - 1`.
        let mismatched = work.mismatches(ended.map(|end| end.saturating_sub(1)))?
            + persistent.map_or(0, |p: PersistentResult| p.mismatched_words)
            + graph_mismatched;
        Ok(Summary {
            role: "consumer",
            name: args.name,
            backend: B::KIND.name(),
            sync: sync.map_or("unknown", |s| s.name()),
            slot,
            protocol_version,
            first_seq: first_seq.unwrap_or(0),
            frames,
            mismatched_words: mismatched,
            seconds: elapsed.as_secs_f64(),
            fps: fps(frames, elapsed),
            cpu_us_per_frame: cpu_time().saturating_sub(cpu0).as_secs_f64() * 1e6 / frames.max(1) as f64,
            producer_gone: gone,
            end_of_stream_after: ended,
            frames_past_end: past_end_total,
            cycles,
            max_frame_gap_ms: gaps.max_ms(),
            fds_after_first_cycle,
            fds_at_end: open_fds(),
            device_free_after_first_cycle,
            device_free_at_end: work.device_free(),
            stall_outcome,
            frames_never_published,
            skipped_frames: match graph_skipped {
                Some(skipped) => Some(skipped),
                None => work.skipped()?,
            },
            persistent,
        })
    }
}

/// A stuck consumer: takes the next frame and never releases it; waits until the producer says something about
/// it (evicts it, goes away) or `limit` passes. Returns `kind: detail`.
fn stall<B: Backend>(consumer: &mut Consumer<B>, stream: Option<&Stream>, limit: Duration) -> String {
    let held = consumer.next_frame(stream, Duration::from_secs(10));
    eprintln!("consumer: stalling (holding frame {:?}, releasing nothing)", held.as_ref().map(|f| f.seq().0));
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match consumer.check_producer() {
            Ok(()) => std::thread::sleep(Duration::from_millis(10)),
            Err(FrameError::ProducerGone { pid, how }) => return format!("producer-gone: producer pid {pid}: {how}"),
            Err(e @ FrameError::EndOfStream { .. }) => return format!("producer-gone: {e}"),
            Err(e @ FrameError::Evicted { .. }) => return format!("evicted: {e}"),
            Err(e) => return format!("error: {e}"),
        }
    }
    format!("timeout: neither evicted nor told the producer is gone within {limit:?}")
}

fn main() -> ExitCode {
    let args = Args::parse();
    let json = args.common.json;
    match run_with_backend(args.common.backend, Run(args)) {
        Ok(s) => {
            print_summary(json, &s, |s| {
                format!(
                    "consumer {}: {} frames{} from #{} in {:.3} s: {:.1} frames/s, {} mismatched words{}, {:.1} us CPU/frame{}{}",
                    s.name,
                    s.frames,
                    s.slot.as_deref().map(|slot| format!(" of {slot}")).unwrap_or_default(),
                    s.first_seq,
                    s.seconds,
                    s.fps,
                    s.mismatched_words,
                    s.skipped_frames
                        .map(|n| format!(", {n} frames skipped (stamp not the producer's)"))
                        .unwrap_or_default(),
                    s.cpu_us_per_frame,
                    s.end_of_stream_after
                        .map(|n| format!("; end of stream: the producer closed the ring after {n} frames"))
                        .unwrap_or_default(),
                    s.producer_gone.as_deref().map(|g| format!("; {g}")).unwrap_or_default()
                )
            });
            if s.stall_outcome.as_deref().is_some_and(|o| o.starts_with("evicted")) {
                ExitCode::from(EXIT_EVICTED)
            } else if s.producer_gone.is_some() {
                ExitCode::from(EXIT_PRODUCER_GONE)
            } else if s.mismatched_words != 0 {
                ExitCode::from(gpu_ipc_examples::exit::EXIT_FAILURE)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(FrameError::ProducerGone { pid, how }) => {
            eprintln!("consumer: the producer (pid {pid}) is gone: {how}");
            ExitCode::from(EXIT_PRODUCER_GONE)
        }
        Err(e) => {
            let (code, line) = exit_for("consumer", &e);
            eprintln!("{line}");
            ExitCode::from(code)
        }
    }
}

/// `--check-each-frame`: waits for the work queued, and says on stderr when the mismatch count grew with the frame
/// just checked (`seq_after` is the consumer's next sequence).
fn report_mismatch<B: Backend, W: FrameWork<B>>(
    work: &W,
    seq_after: u64,
    t0: Instant,
    seen: &mut u64,
) -> Result<(), FrameError> {
    work.synchronize()?;
    let now = work.mismatches(None)?;
    if now != *seen {
        eprintln!(
            "consumer: frame {} mismatched {} words at {:.3} ms ({:.3} s since the epoch)",
            seq_after.saturating_sub(1),
            now - *seen,
            t0.elapsed().as_secs_f64() * 1e3,
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
        );
        *seen = now;
    }
    Ok(())
}
