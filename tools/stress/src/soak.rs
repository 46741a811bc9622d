//! `gpu-ipc-stress soak`: one producer process sends `--frames` frames (10,000,000 4K RGB frames, 3840x2160 rgb8,
//! by default) to one consumer process, under a private MPS daemon by default (`--mps off` without), with the
//! strategy of `--sync` (gpu-stream-ops by default; `--graph` uses frame graphs on both sides). The consumer checks
//! every word of every frame on the GPU (its verify kernel counts mismatched words, read once at the end); the soak
//! passes when both end with status 0, the producer published and the consumer read every frame, and 0 words
//! mismatched. A line on stderr about every [`PRINT_EVERY`] (frames, FPS over the last stretch, the estimated time
//! left); no progress for [`STALL`] is a hang (both are killed). `--json` prints the [`SoakReport`].

use std::time::{Duration, Instant};

use serde::Serialize;

use super::outcome::{ProcEnd, Status};
use super::procs::{Child, finish_all, socket_path};
use super::run::{Ctx, START_LIMIT};

/// Default frames of a soak.
pub const SOAK_FRAMES: u64 = 10_000_000;
/// Default frame size of a soak: 4K.
pub const SOAK_SIZE: (u32, u32) = (3840, 2160);
/// How often a progress line is printed.
pub const PRINT_EVERY: Duration = Duration::from_secs(10);
/// No frame read for this long is a hang.
pub const STALL: Duration = Duration::from_secs(30);
/// Ring slots of the soak.
pub const SOAK_SLOTS: u32 = 4;

/// What a soak did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SoakReport {
    /// Backend.
    pub backend: String,
    /// Sync strategy.
    pub sync: String,
    /// Frame graphs on both sides.
    pub graph: bool,
    /// Under a private MPS daemon.
    pub mps: bool,
    /// Frame width and height (RGB, 8 bits per channel).
    pub frame: [u32; 2],
    /// Ring slots.
    pub slots: u32,
    /// Frames asked for.
    pub frames_wanted: u64,
    /// Frames the producer published.
    pub producer_frames: u64,
    /// The longest the soak may run (`--max-seconds`): past it both are killed and the soak fails with the figures
    /// so far, so that a machine lent for 10 minutes still gets a report.
    pub max_seconds: u64,
    /// Frames the consumer read and checked.
    pub frames: u64,
    /// Words of those frames that did not match (must be 0).
    pub mismatched_words: u64,
    /// Frames the consumer skipped (stamp not the producer's; must be 0 in a soak).
    pub skipped_frames: u64,
    /// Words checked: frames x words per frame.
    pub words_checked: u64,
    /// Seconds of the consumer's run (its summary).
    pub seconds: f64,
    /// Frames per second (the consumer's).
    pub fps: f64,
    /// Gigabytes per second through the ring (frames x frame bytes / seconds).
    pub gb_per_s: f64,
    /// Wall seconds of the whole soak (start-up included).
    pub wall_seconds: f64,
    /// The progress lines' figures: (seconds since the start, frames read).
    pub progress: Vec<(f64, u64)>,
    /// The verdict.
    pub status: Status,
    /// What was seen.
    pub detail: String,
}

/// Bytes of one RGB8 frame.
pub fn frame_bytes(width: u32, height: u32) -> u64 {
    u64::from(width) * u64::from(height) * 3
}

/// The progress line: frames so far of `wanted`, FPS over the stretch since the last line, the time left at that rate.
pub fn progress_line(elapsed: Duration, frames: u64, wanted: u64, stretch_frames: u64, stretch: Duration) -> String {
    let fps = stretch_frames as f64 / stretch.as_secs_f64().max(1e-9);
    let left = wanted.saturating_sub(frames) as f64 / fps.max(1e-9);
    format!(
        "gpu-ipc-stress: soak {:.0} s: {frames} of {wanted} frames ({:.1}%), {fps:.0} frames/s, about {left:.0} s left",
        elapsed.as_secs_f64(),
        100.0 * frames as f64 / wanted.max(1) as f64
    )
}

/// The verdict of a soak from the two ends.
pub fn judge(report: &mut SoakReport, producer: &ProcEnd, consumer: &ProcEnd) {
    let wanted = report.frames_wanted;
    let mut problems = Vec::new();
    for p in [producer, consumer] {
        if p.hung || p.exit != Some(0) {
            problems.push(p.describe());
        }
    }
    if report.producer_frames != wanted {
        problems.push(format!("the producer published {} of {wanted} frames", report.producer_frames));
    }
    if report.frames != wanted {
        problems.push(format!("the consumer read {} of {wanted} frames", report.frames));
    }
    if report.mismatched_words != 0 {
        problems.push(format!("{} mismatched words", report.mismatched_words));
    }
    if report.skipped_frames != 0 {
        problems.push(format!("{} frames skipped", report.skipped_frames));
    }
    let figures = format!(
        "{} frames of {}x{} rgb8 read, {} words checked, {} mismatched, {:.1} s, {:.0} frames/s ({:.1} GB/s)",
        report.frames,
        report.frame[0],
        report.frame[1],
        report.words_checked,
        report.mismatched_words,
        report.seconds,
        report.fps,
        report.gb_per_s
    );
    if problems.is_empty() {
        report.status = Status::Passed;
        report.detail = figures;
    } else {
        report.status = Status::Failed;
        report.detail = format!("{}; {figures}", problems.join("; "));
    }
}

/// Runs the soak with `ctx` (its env carries the MPS client variables when `report.mps`); `report` holds the
/// settings and receives the figures.
pub fn soak(ctx: &Ctx, mut report: SoakReport) -> SoakReport {
    let started = Instant::now();
    let socket = socket_path("soak");
    let (frames, slots) = (report.frames_wanted.to_string(), report.slots.to_string());
    let every = (report.frames_wanted / 1000).clamp(1, 10_000).to_string();
    let mut producer_extra = vec!["--slots", &slots, "--consumers", "1", "--frames", &frames];
    let mut consumer_extra = vec!["--frames", &frames, "--progress-every", &every];
    if report.graph {
        producer_extra.push("--graph");
        consumer_extra.push("--graph");
    }
    let mut children = Vec::new();
    let spawned = (|| -> Result<(), String> {
        children.push(ctx.producer(&socket, &report.backend, &report.sync, &producer_extra)?);
        let a = Ctx::consumer_args(&socket, &report.backend, "soak", &consumer_extra);
        children.push(Child::spawn("consumer soak", &ctx.bins.consumer, &a, &ctx.env)?);
        Ok(())
    })();
    if let Err(e) = spawned {
        let _ = finish_all(children, Instant::now(), None);
        report.status = Status::Failed;
        report.detail = e;
        return report;
    }
    let (mut last_print, mut last_frames, mut read) = (Instant::now(), 0u64, 0u64);
    let mut stalled = None;
    let budget = started + Duration::from_secs(report.max_seconds.max(1));
    while read < report.frames_wanted {
        let limit = if read == 0 { START_LIMIT } else { STALL };
        let deadline = (Instant::now() + limit).min(budget);
        match children[1].next_progress(deadline) {
            Ok(n) => read = n,
            Err(e) if e.contains("in time") && Instant::now() >= budget => {
                stalled =
                    Some(format!("not done within --max-seconds {} ({read} frames read by then)", report.max_seconds));
                break;
            }
            Err(e) if e.contains("in time") => {
                stalled = Some(format!("no frame read for {limit:?} after frame {read}"));
                break;
            }
            Err(_) => break,
        }
        if last_print.elapsed() >= PRINT_EVERY {
            let elapsed = started.elapsed();
            eprintln!(
                "{}",
                progress_line(elapsed, read, report.frames_wanted, read - last_frames, last_print.elapsed())
            );
            report.progress.push((elapsed.as_secs_f64(), read));
            (last_print, last_frames) = (Instant::now(), read);
        }
    }
    let deadline = if stalled.is_some() { Instant::now() } else { Instant::now() + STALL };
    let ends = finish_all(children, deadline, None);
    let _ = std::fs::remove_file(&socket);
    let (producer, consumer) = (&ends[0], &ends[1]);
    report.producer_frames = producer.count("frames").unwrap_or(0);
    report.frames = consumer.count("frames").unwrap_or(0);
    report.mismatched_words = consumer.count("mismatched_words").unwrap_or(0);
    report.skipped_frames = consumer.count("skipped_frames").unwrap_or(0);
    report.words_checked = report.frames * frame_bytes(report.frame[0], report.frame[1]).div_ceil(4);
    report.seconds = consumer.num("seconds").unwrap_or(0.0);
    report.fps = consumer.num("fps").unwrap_or(0.0);
    report.gb_per_s = report.fps * frame_bytes(report.frame[0], report.frame[1]) as f64 / 1e9;
    report.wall_seconds = started.elapsed().as_secs_f64();
    judge(&mut report, producer, consumer);
    if let Some(why) = stalled {
        report.status = Status::Failed;
        report.detail = format!("{why}; {}", report.detail);
    }
    report
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn settings() -> SoakReport {
        SoakReport {
            backend: "vmm".into(),
            sync: "gpu-stream-ops".into(),
            mps: true,
            frame: [3840, 2160],
            slots: SOAK_SLOTS,
            frames_wanted: 1000,
            ..SoakReport::default()
        }
    }

    fn end(name: &str, exit: Option<i32>) -> ProcEnd {
        ProcEnd { name: name.into(), exit, ..ProcEnd::default() }
    }

    #[test]
    fn a_soak_passes_only_with_every_frame_read_and_zero_mismatched_words() {
        let mut r = SoakReport { producer_frames: 1000, frames: 1000, fps: 50_000.0, seconds: 0.02, ..settings() };
        r.words_checked = 1000 * frame_bytes(3840, 2160) / 4;
        judge(&mut r, &end("producer", Some(0)), &end("consumer", Some(0)));
        assert_eq!(r.status, Status::Passed, "{}", r.detail);
        assert!(r.detail.contains("1000 frames of 3840x2160 rgb8 read, 6220800000 words checked,"), "{}", r.detail);
        let mut bad = SoakReport { mismatched_words: 3, ..r.clone() };
        judge(&mut bad, &end("producer", Some(0)), &end("consumer", Some(1)));
        assert_eq!(bad.status, Status::Failed);
        assert!(bad.detail.contains("3 mismatched words"), "{}", bad.detail);
        let mut short = SoakReport { frames: 999, ..r };
        judge(&mut short, &end("producer", Some(0)), &end("consumer", Some(0)));
        assert!(short.detail.starts_with("the consumer read 999 of 1000"), "{}", short.detail);
    }

    #[test]
    fn the_progress_line_has_frames_rate_and_time_left() {
        let line = progress_line(Duration::from_secs(20), 1_000_000, 10_000_000, 500_000, Duration::from_secs(10));
        assert_eq!(
            line,
            "gpu-ipc-stress: soak 20 s: 1000000 of 10000000 frames (10.0%), 50000 frames/s, about 180 s left"
        );
        assert_eq!(frame_bytes(3840, 2160), 24_883_200);
    }
}
