//! The parts of a stress run, each driving the staged `producer` and `consumer` programs on the GPU (this process
//! never touches CUDA): the hostile front door and the PID-namespace consumer against a producer while frames
//! flow, the random-kill matrix, attach/detach cycles, and eviction of a stuck consumer.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::hostile;
use super::outcome::{
    Check, EXIT_EVICTED, KILL_TRIAL_SLOTS, ProcEnd, Status, Trial, TrialOutcome, consumer_killed, producer_killed,
};
use super::procs::{Bins, Child, ChildEnv, args, fd_count, fds_settle, finish_all, socket_path};
use super::schedule::{Cell, KillPoint, Sizes, Victim};

/// Bound of a process's start-up (CUDA, kernels, attach) until it reports progress.
pub(super) const START_LIMIT: Duration = Duration::from_secs(60);
/// Device memory a consumer may lose over its cycles before it counts as a leak (one frame allocation would be
/// megabytes per cycle, gigabytes over a run).
pub const DEVICE_LEAK_TOLERANCE: u64 = 16 << 20;

/// What every part runs with.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The programs.
    pub bins: Bins,
    /// Added to every child's environment (the MPS client variables during an MPS pass).
    pub env: ChildEnv,
    /// Counts.
    pub sizes: Sizes,
    /// Frame width and height (RGB).
    pub width: u32,
    /// Frame height.
    pub height: u32,
    /// The longest a producer may go without publishing, or a streaming consumer without a frame.
    pub max_gap: Duration,
    /// How soon after a producer's death every consumer must have exited with `ProducerGone`.
    pub gone_bound: Duration,
    /// After a kill, how long the others have to finish before they count as hung.
    pub hang_after: Duration,
    /// Sync strategy of the front-door runs.
    pub front_door_sync: String,
    /// Seed of the random choices.
    pub seed: u64,
    /// Whether children run as clients of a private MPS daemon.
    pub mps: bool,
}

impl Ctx {
    fn producer_args(&self, socket: &Path, backend: &str, sync: &str, extra: &[&str]) -> Vec<String> {
        let mut a = args(&["--socket"]);
        a.push(socket.display().to_string());
        a.extend(args(&["--backend", backend, "--sync", sync, "--json", "--format", "rgb8"]));
        a.extend(["--width".to_owned(), self.width.to_string(), "--height".to_owned(), self.height.to_string()]);
        a.extend(args(extra));
        a
    }

    pub(super) fn consumer_args(socket: &Path, backend: &str, name: &str, extra: &[&str]) -> Vec<String> {
        let mut a = args(&["--socket"]);
        a.push(socket.display().to_string());
        a.extend(args(&["--backend", backend, "--json", "--name", name]));
        a.extend(args(extra));
        a
    }

    pub(super) fn producer(&self, socket: &Path, backend: &str, sync: &str, extra: &[&str]) -> Result<Child, String> {
        Child::spawn("producer", &self.bins.producer, &self.producer_args(socket, backend, sync, extra), &self.env)
    }

    fn consumer(&self, socket: &Path, backend: &str, name: &str, extra: &[&str]) -> Result<Child, String> {
        let a = Self::consumer_args(socket, backend, name, extra);
        Child::spawn(&format!("consumer {name}"), &self.bins.consumer, &a, &self.env)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn kill_all(children: Vec<Child>) {
    let _ = finish_all(children, Instant::now(), None);
}

/// Figures of one front-door run (hostile clients and the PID-namespace consumer against a streaming producer).
#[derive(Debug, Clone, Default, Serialize)]
pub struct FrontDoorRun {
    /// Backend.
    pub backend: String,
    /// Sync strategy.
    pub sync: String,
    /// The producer's longest time without publishing, in ms.
    pub producer_max_gap_ms: Option<f64>,
    /// The two streaming consumers' longest time without a frame, in ms.
    pub consumer_max_gap_ms: Vec<Option<f64>>,
    /// Frames the producer published.
    pub frames: Option<u64>,
    /// The producer's open fds before the hostile clients, and after (once settled).
    pub producer_fds_before: Option<u64>,
    /// After.
    pub producer_fds_after: Option<u64>,
}

/// The namespace consumer's result, per backend.
#[derive(Debug, Clone, Serialize)]
pub struct NamespaceRun {
    /// Backend.
    pub backend: String,
    /// Whether it attached.
    pub attached: bool,
    /// Frames it verified.
    pub frames: u64,
    /// Mismatched words.
    pub mismatched_words: u64,
    /// The verdict (legacy failing here is a finding).
    pub status: Status,
    /// Its exit and last error line.
    pub detail: String,
}

/// A streaming producer with two streaming consumers; hostile clients (`hostile`) and a consumer in another PID
/// namespace (`namespace`) are let loose while frames flow; then the checks of issue 8.
pub fn front_door(
    ctx: &Ctx,
    backend: &str,
    hostile_on: bool,
    namespace_on: bool,
    checks: &mut Vec<Check>,
) -> (FrontDoorRun, Option<NamespaceRun>) {
    let part = if hostile_on { "hostile" } else { "namespace" };
    let sync = ctx.front_door_sync.as_str();
    let mut run = FrontDoorRun { backend: backend.to_owned(), sync: sync.to_owned(), ..FrontDoorRun::default() };
    let socket = socket_path("door");
    let started = (|| -> Result<Vec<Child>, String> {
        let mut producer = ctx.producer(
            &socket,
            backend,
            sync,
            &["--slots", "4", "--consumers", "2", "--frames", "0", "--until-stdin-closes"],
        )?;
        producer.wait_line(|l| l.contains("waiting for"), Instant::now() + START_LIMIT)?;
        let mut a = ctx.consumer(&socket, backend, "a", &["--frames", "0", "--progress-every", "100"])?;
        let mut b = ctx.consumer(&socket, backend, "b", &["--frames", "0", "--progress-every", "100"])?;
        a.wait_progress(200, Instant::now() + START_LIMIT)?;
        b.wait_progress(200, Instant::now() + START_LIMIT)?;
        Ok(vec![producer, a, b])
    })();
    let children = match started {
        Ok(c) => c,
        Err(e) => {
            checks.push(Check::new(part, format!("{backend}: a producer streams to two consumers"), Status::Failed, e));
            return (run, None);
        }
    };
    let pid = children[0].pid();
    run.producer_fds_before = fd_count(pid);
    let after_consumer = |name: &str| -> hostile::Verdict {
        let started = Instant::now();
        match ctx.consumer(&socket, backend, name, &["--frames", "50"]) {
            Ok(c) => {
                let end = c.finish(Instant::now() + START_LIMIT);
                let ok =
                    end.exit == Some(0) && end.count("frames") == Some(50) && end.count("mismatched_words") == Some(0);
                let detail = format!(
                    "{} in {:.2} s, {} frames verified",
                    end.describe(),
                    started.elapsed().as_secs_f64(),
                    end.count("frames").unwrap_or(0)
                );
                (if ok { Status::Passed } else { Status::Failed }, detail)
            }
            Err(e) => (Status::Failed, e),
        }
    };
    if hostile_on {
        let s = ctx.sizes;
        let door: Vec<(String, hostile::Verdict)> = vec![
            ("random bytes".into(), hostile::random_bytes(&socket, ctx.seed)),
            ("wrong magic, version, message type".into(), hostile::wrong_header(&socket)),
            ("payload_len of 2^31".into(), hostile::huge_payload_len(&socket)),
            ("fds announced not sent, sent not announced".into(), hostile::fd_mismatch(&socket)),
            ("truncated then hang-up".into(), hostile::truncated(&socket)),
            ("silent clients".into(), hostile::silent(&socket, 20, Duration::from_millis(500))),
            (format!("{} rapid connect/close", s.rapid_connects), hostile::rapid(&socket, s.rapid_connects)),
            (
                format!("{} idle connections while a consumer attaches", s.idle_connections),
                hostile::idle_while_a_consumer_attaches(&socket, s.idle_connections, || after_consumer("idle")),
            ),
            (
                format!("{} abandoned handshakes", s.abandoned_handshakes),
                hostile::abandoned_handshakes(&socket, s.abandoned_handshakes),
            ),
            ("a peer of another uid (nobody)".into(), hostile::other_user(&socket, 3)),
        ];
        for (name, (status, detail)) in door {
            checks.push(Check::new("hostile", format!("{backend}: {name}"), status, detail));
        }
        let (status, detail) = after_consumer("after");
        checks.push(Check::new(
            "hostile",
            format!("{backend}: afterwards a real consumer attaches and verifies 50 frames"),
            status,
            detail,
        ));
    }
    let namespace = namespace_on.then(|| namespace_consumer(ctx, &socket, backend));
    if let Some(ns) = &namespace {
        checks.push(Check::new(
            "namespace",
            format!("{backend}: a consumer in another PID namespace attaches and verifies frames"),
            ns.status,
            ns.detail.clone(),
        ));
    }
    let baseline = run.producer_fds_before.unwrap_or(0);
    run.producer_fds_after = fds_settle(pid, baseline, Duration::from_secs(5));
    let mut children = children;
    children[0].close_stdin();
    let ends = finish_all(children, Instant::now() + Duration::from_secs(60), None);
    let _ = std::fs::remove_file(&socket);
    let (producer, consumers) = (&ends[0], &ends[1..]);
    run.producer_max_gap_ms = producer.num("max_publish_gap_ms");
    run.consumer_max_gap_ms = consumers.iter().map(|c| c.num("max_frame_gap_ms")).collect();
    run.frames = producer.count("frames");
    checks.push(Check::pass_if(
        part,
        format!("{backend}: the producer ran to the end"),
        producer.exit == Some(0),
        format!("{}; {} frames", producer.describe(), run.frames.unwrap_or(0)),
    ));
    if hostile_on {
        let fds_ok = matches!((run.producer_fds_before, run.producer_fds_after), (Some(b), Some(a)) if a <= b);
        checks.push(Check::pass_if(
            part,
            format!("{backend}: the producer's open fds are back to where they were"),
            fds_ok,
            format!("{:?} before, {:?} after", run.producer_fds_before, run.producer_fds_after),
        ));
    }
    let bound = ms(ctx.max_gap);
    let gap_ok = run.producer_max_gap_ms.is_some_and(|g| g < bound);
    checks.push(Check::pass_if(
        part,
        format!("{backend}: the producer's longest publish gap < {bound:.0} ms"),
        gap_ok,
        format!("{:.1} ms", run.producer_max_gap_ms.unwrap_or(f64::NAN)),
    ));
    for c in consumers {
        let gap = c.num("max_frame_gap_ms");
        // The streaming consumers end when the producer does: ProducerGone (exit 4) is how they learn it.
        let intact = matches!(c.exit, Some(0 | 4))
            && c.count("mismatched_words") == Some(0)
            && c.count("frames").unwrap_or(0) > 0;
        checks.push(Check::pass_if(
            part,
            format!("{backend}: {} streamed intact frames, longest gap < {bound:.0} ms", c.name),
            intact && gap.is_some_and(|g| g < bound),
            format!(
                "{}; {} frames, {} mismatched words, longest gap {:.1} ms",
                c.describe(),
                c.count("frames").unwrap_or(0),
                c.count("mismatched_words").unwrap_or(0),
                gap.unwrap_or(f64::NAN)
            ),
        ));
    }
    (run, namespace)
}

/// `unshare --pid --fork --mount-proc consumer ...` against the streaming producer.
fn namespace_consumer(ctx: &Ctx, socket: &Path, backend: &str) -> NamespaceRun {
    let not_run = |detail: String| NamespaceRun {
        backend: backend.to_owned(),
        attached: false,
        frames: 0,
        mismatched_words: 0,
        status: Status::NotRun,
        detail,
    };
    if !rustix::process::geteuid().is_root() {
        return not_run("needs root (unshare --pid)".into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let Some(unshare) = harness::mps::find_on_path("unshare", &path) else {
        return not_run("no `unshare` on PATH".into());
    };
    let mut command = Command::new(unshare);
    command.args(["--pid", "--fork", "--mount-proc"]).arg(&ctx.bins.consumer).args(Ctx::consumer_args(
        socket,
        backend,
        "pidns",
        &["--frames", "50"],
    ));
    let end = match Child::spawn_command("consumer pidns", &mut command, &ctx.env) {
        Ok(c) => c.finish(Instant::now() + START_LIMIT),
        Err(e) => return not_run(e),
    };
    let frames = end.count("frames").unwrap_or(0);
    let mismatched = end.count("mismatched_words").unwrap_or(0);
    let ok = end.exit == Some(0) && frames == 50 && mismatched == 0;
    let status = match (ok, backend) {
        (true, _) => Status::Passed,
        // Legacy IPC across PID namespaces is documented as not working: what it says is the finding.
        (false, "legacy") => Status::Finding,
        (false, _) => Status::Failed,
    };
    NamespaceRun {
        backend: backend.to_owned(),
        attached: end.summary.is_some(),
        frames,
        mismatched_words: mismatched,
        status,
        detail: format!("{}; {frames} frames verified, {mismatched} mismatched words", end.describe()),
    }
}

/// One kill trial of `cell`: a producer and two consumers (`a`, `b`) move `kill_frames` frames; the victim
/// (the producer, or consumer `a`) is killed with SIGKILL at `kill`; the others are judged.
pub fn kill_trial(ctx: &Ctx, cell: Cell, trial: u32, kill: KillPoint) -> Trial {
    let s = ctx.sizes;
    let socket = socket_path("kill");
    let (frames, every) = (s.kill_frames.to_string(), s.progress_every.to_string());
    let mut record = Trial {
        cell,
        trial,
        kill,
        killed_at_ms: None,
        outcome: TrialOutcome::Passed,
        gone_s: Vec::new(),
        lost_frames: 0,
        mismatched_words: 0,
        frames_never_published: 0,
        frames_skipped: 0,
    };
    let mut children = Vec::new();
    let spawned = (|| -> Result<(), String> {
        children.push(ctx.producer(
            &socket,
            cell.backend,
            cell.sync,
            &[
                "--slots",
                &KILL_TRIAL_SLOTS.to_string(),
                "--consumers",
                "2",
                "--frames",
                &frames,
                "--progress-every",
                &every,
            ],
        )?);
        for name in ["a", "b"] {
            children.push(ctx.consumer(
                &socket,
                cell.backend,
                name,
                &["--frames", &frames, "--progress-every", &every],
            )?);
        }
        Ok(())
    })();
    if let Err(e) = spawned {
        kill_all(children);
        record.outcome = TrialOutcome::Failed { reason: e };
        return record;
    }
    let victim = match cell.victim {
        Victim::Producer => 0,
        Victim::Consumer => 1,
    };
    if let Err(e) = children[victim].wait_progress(kill.after_frames, Instant::now() + START_LIMIT) {
        let hung = e.contains("in time");
        let ends = finish_all(children, Instant::now() + Duration::from_secs(5), None);
        let why = ends.iter().filter(|e| e.exit != Some(0)).map(ProcEnd::describe).collect::<Vec<_>>().join("; ");
        record.outcome = if hung {
            TrialOutcome::Hang {
                who: format!("no progress to frame {} within {START_LIMIT:?}: {why}", kill.after_frames),
            }
        } else {
            TrialOutcome::Failed { reason: format!("before the kill: {e}") }
        };
        let _ = std::fs::remove_file(&socket);
        return record;
    }
    std::thread::sleep(Duration::from_micros(kill.extra_delay_us));
    children[victim].kill();
    let killed_at = Instant::now();
    record.killed_at_ms = Some(ms(killed_at.saturating_duration_since(children[0].started)));
    let ends = finish_all(children, killed_at + ctx.hang_after, Some(killed_at));
    let _ = std::fs::remove_file(&socket);
    match cell.victim {
        Victim::Producer => {
            let frame_words = (u64::from(ctx.width) * u64::from(ctx.height) * 3).div_ceil(4);
            let (outcome, gone, mismatched) = producer_killed(&ends[1..], ctx.gone_bound, ctx.mps, frame_words);
            (record.outcome, record.gone_s, record.mismatched_words) = (outcome, gone, mismatched);
            record.frames_never_published = ends[1..].iter().filter_map(|c| c.count("frames_never_published")).sum();
            record.frames_skipped = ends[1..].iter().filter_map(|c| c.count("skipped_frames")).sum();
        }
        Victim::Consumer => {
            let (outcome, lost, mismatched) = consumer_killed(&ends[0], &ends[2], s.kill_frames, ctx.mps);
            (record.outcome, record.lost_frames, record.mismatched_words) = (outcome, lost, mismatched);
        }
    }
    record
}

/// Figures of one attach/detach cycles run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CyclesRun {
    /// Backend.
    pub backend: String,
    /// Sync strategy.
    pub sync: String,
    /// Cycles done.
    pub cycles: u64,
    /// Frames verified in all.
    pub frames: u64,
    /// Mismatched words.
    pub mismatched_words: u64,
    /// The consumer's open fds at the end minus after its first cycle.
    pub consumer_fd_delta: Option<i64>,
    /// Free device memory after the first cycle minus at the end, bytes (positive: memory lost).
    pub device_bytes_lost: Option<i64>,
    /// The producer's open fds after the cycles (settled) minus before.
    pub producer_fd_delta: Option<i64>,
    /// Seconds the cycles took.
    pub seconds: f64,
    /// The verdict.
    pub status: Status,
    /// What was seen.
    pub detail: String,
}

fn delta(a: Option<u64>, b: Option<u64>) -> Option<i64> {
    Some(i64::try_from(a?).ok()? - i64::try_from(b?).ok()?)
}

/// A producer streaming to nobody; one consumer process attaches, reads a few frames and detaches, `cycles`
/// times; fds and device memory must come back flat.
pub fn cycles(ctx: &Ctx, backend: &str, sync: &str) -> CyclesRun {
    let mut run = CyclesRun {
        backend: backend.to_owned(),
        sync: sync.to_owned(),
        status: Status::Failed,
        ..CyclesRun::default()
    };
    let socket = socket_path("cycles");
    let mut producer = match ctx.producer(
        &socket,
        backend,
        sync,
        &["--slots", "2", "--consumers", "0", "--frames", "0", "--until-stdin-closes", "--progress-every", "1000"],
    ) {
        Ok(p) => p,
        Err(e) => {
            run.detail = e;
            return run;
        }
    };
    if let Err(e) = producer.wait_progress(1000, Instant::now() + START_LIMIT) {
        kill_all(vec![producer]);
        run.detail = e;
        return run;
    }
    let pid = producer.pid();
    let before = fd_count(pid);
    let (n, per) = (ctx.sizes.cycles.to_string(), ctx.sizes.frames_per_cycle.to_string());
    let started = Instant::now();
    let limit = START_LIMIT + Duration::from_millis(200) * u32::try_from(ctx.sizes.cycles).unwrap_or(u32::MAX);
    let consumer = match ctx.consumer(&socket, backend, "cycler", &["--cycles", &n, "--frames", &per]) {
        Ok(c) => c.finish(Instant::now() + limit),
        Err(e) => ProcEnd { name: "consumer cycler".into(), stderr_tail: e, ..ProcEnd::default() },
    };
    run.seconds = started.elapsed().as_secs_f64();
    let after = fds_settle(pid, before.unwrap_or(0), Duration::from_secs(5));
    producer.close_stdin();
    let producer = producer.finish(Instant::now() + Duration::from_secs(30));
    let _ = std::fs::remove_file(&socket);
    run.cycles = consumer.count("cycles").unwrap_or(0);
    run.frames = consumer.count("frames").unwrap_or(0);
    run.mismatched_words = consumer.count("mismatched_words").unwrap_or(0);
    run.consumer_fd_delta = delta(consumer.count("fds_at_end"), consumer.count("fds_after_first_cycle"));
    run.device_bytes_lost =
        delta(consumer.count("device_free_after_first_cycle"), consumer.count("device_free_at_end"));
    run.producer_fd_delta = delta(after, before);
    let mut problems = Vec::new();
    if consumer.exit != Some(0) || producer.exit != Some(0) {
        problems.push(format!("{}; {}", consumer.describe(), producer.describe()));
    }
    if run.cycles != ctx.sizes.cycles || run.mismatched_words != 0 {
        problems
            .push(format!("{} of {} cycles, {} mismatched words", run.cycles, ctx.sizes.cycles, run.mismatched_words));
    }
    if run.consumer_fd_delta.is_none_or(|d| d > 0) || run.producer_fd_delta.is_none_or(|d| d > 0) {
        problems.push(format!("fds grew: consumer {:?}, producer {:?}", run.consumer_fd_delta, run.producer_fd_delta));
    }
    if run.device_bytes_lost.is_none_or(|d| d > DEVICE_LEAK_TOLERANCE as i64) {
        problems.push(format!("device memory lost: {:?} bytes", run.device_bytes_lost));
    }
    run.status = if problems.is_empty() { Status::Passed } else { Status::Failed };
    run.detail = if problems.is_empty() {
        format!("{} cycles in {:.1} s, {} frames verified", run.cycles, run.seconds, run.frames)
    } else {
        problems.join("; ")
    };
    run
}

/// A producer with the evict policy, a healthy consumer and one that stalls after 100 frames: the producer must
/// go on publishing to the healthy one; the stuck one must be told it was evicted.
pub fn evict(ctx: &Ctx, backend: &str, sync: &str) -> Check {
    let name = format!("{backend}/{sync}: a stuck consumer is evicted, the healthy one reads every frame");
    let socket = socket_path("evict");
    let frames = ctx.sizes.evict_frames.to_string();
    let mut producer = match ctx.producer(
        &socket,
        backend,
        sync,
        &["--slots", "2", "--consumers", "2", "--frames", &frames, "--evict-after-ms", "500"],
    ) {
        Ok(p) => p,
        Err(e) => return Check::new("evict", name, Status::Failed, e),
    };
    if producer.wait_line(|l| l.contains("waiting for"), Instant::now() + START_LIMIT).is_err() {
        let end = producer.finish(Instant::now() + Duration::from_secs(10));
        let _ = std::fs::remove_file(&socket);
        return Check::new("evict", name, Status::Failed, end.describe());
    }
    let mut children = vec![producer];
    for (who, extra) in [
        ("healthy", vec!["--frames", &frames]),
        ("stuck", vec!["--frames", &frames, "--stall-after", "100", "--stall-timeout", "20"]),
    ] {
        match ctx.consumer(&socket, backend, who, &extra) {
            Ok(c) => children.push(c),
            Err(e) => {
                kill_all(children);
                return Check::new("evict", name, Status::Failed, e);
            }
        }
    }
    let ends = finish_all(children, Instant::now() + Duration::from_secs(120), None);
    let _ = std::fs::remove_file(&socket);
    let (producer, healthy, stuck) = (&ends[0], &ends[1], &ends[2]);
    let ok = producer.exit == Some(0)
        && producer.count("frames") == Some(ctx.sizes.evict_frames)
        && healthy.exit == Some(0)
        && healthy.count("frames") == Some(ctx.sizes.evict_frames)
        && healthy.count("mismatched_words") == Some(0)
        && stuck.exit == Some(EXIT_EVICTED)
        && stuck.text("stall_outcome").is_some_and(|o| o.starts_with("evicted"));
    let detail = format!(
        "{}; {} ({} frames); {} (stall: {}); producer longest publish gap {:.1} ms",
        producer.describe(),
        healthy.describe(),
        healthy.count("frames").unwrap_or(0),
        stuck.describe(),
        stuck.text("stall_outcome").unwrap_or("none"),
        producer.num("max_publish_gap_ms").unwrap_or(f64::NAN)
    );
    Check::pass_if("evict", name, ok, detail)
}

/// Whether the private MPS daemon whose client variables are in `env` still answers (`get_server_list`, bounded).
pub fn mps_answers(program: &Path, env: &ChildEnv) -> bool {
    match Child::spawn_command("mps-control", &mut Command::new(program), env) {
        Ok(mut control) => {
            control.write_stdin("get_server_list\n");
            control.close_stdin();
            control.finish(Instant::now() + Duration::from_secs(10)).exit == Some(0)
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests;
