//! The `mps-kills` part: SIGKILL of a process while its kernel waits on the ring's shared memory (a persistent
//! kernel, frame graphs, a gpu-poll wait), without and under a private MPS daemon, and what it does to the survivor
//! and to an unrelated pair of MPS clients.
//!
//! Each trial ([`KernelCell`]): an unrelated *bystander* ring pair (cpu-spin producer and consumer, its fill and
//! verify kernels on the GPU: two more clients of the same MPS server) streams; then the pair under test, one side
//! running the kind's kernel (`--persistent`, `--graph`, or plain loops with `--sync gpu-poll`), the other a plain
//! loop; the side with the kernel is killed once the survivor has reported [`KILL_AFTER`] frames. Then the bystander
//! producer's stdin is closed and its pair must end cleanly.
//!
//! Recorded as data, per trial: how many of the clients that were not killed (the survivor and the two bystanders)
//! faulted (`mps clients faulted: k/3`: they ended with CUDA error 700 or an MPS error: the known effect of killing
//! under MPS a process whose kernel polls shared memory, which the library cannot prevent), and how long after the
//! kill the survivor ended. The expectation ([`EXPECTATION`]): no process hangs; the survivor gets its typed outcome
//! (a consumer: `ProducerGone`, exit 4, within `--gone-bound-ms`; a producer: finishes every frame counting one
//! consumer lost) and the bystanders end cleanly, unless they faulted; a fault under MPS is a *finding* (recorded,
//! said in the output), a fault without MPS or any other ending is a failure. Without MPS, persistent kernels and
//! gpu-poll are *not run* (they need MPS: see [`unavailable`]); frame graphs (the driver's stream waits) run.
//!
//! The library's mitigation, the kernel lease and the survivor's abort word (`ipc_core::resident::KernelLease`: a
//! kernel whose process is gone leaves by itself), is on in every cell; under MPS the persistent-kernel and
//! frame-graph cells run a second time with it off (`GPU_IPC_KERNEL_LEASE_MS=0` in the pair's environment, the
//! cell named `... (MPS, kernel lease off)`), so the rates show what it changes (`--kernel-lease on|off|both`).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::outcome::{EXIT_PRODUCER_GONE, ProcEnd, Status, looks_like_mps_fault};
use super::procs::{Child, finish_all, socket_path};
use super::run::{Ctx, START_LIMIT};
use super::schedule::Victim;

/// Frames of the pair under test (enough that it is still running at the kill).
pub const TRIAL_FRAMES: u64 = 20_000;
/// The victim is killed once the survivor has reported this many frames.
pub const KILL_AFTER: u64 = 500;
/// Progress reports every this many frames.
const EVERY: u64 = 100;
/// Clients that were not killed: the survivor and the two bystanders.
pub const CLIENTS: u32 = 3;
/// The expectation every cell is judged by, in words.
pub const EXPECTATION: &str = "no hang; the survivor gets its typed outcome (consumer: ProducerGone within the \
     bound; producer: every frame, one consumer lost) and the bystander pair ends cleanly; under MPS a fault of \
     the clients (error 700) is recorded as a finding";

/// What runs in the victim while it is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelKind {
    /// A persistent kernel on the ring's device API (`--persistent`, gpu-stream-ops ring).
    Persistent,
    /// Frame graphs (`--graph`, gpu-stream-ops ring: the driver's stream waits in the graph).
    Graph,
    /// Plain loops on a gpu-poll ring (a polling kernel waits for each frame or release).
    GpuPoll,
}

impl KernelKind {
    /// All of them, in table order.
    pub const ALL: [Self; 3] = [Self::Persistent, Self::Graph, Self::GpuPoll];

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Persistent => "persistent kernel",
            Self::Graph => "frame graphs",
            Self::GpuPoll => "gpu-poll wait",
        }
    }

    /// The ring's strategy.
    pub fn sync(self) -> &'static str {
        match self {
            Self::Persistent | Self::Graph => "gpu-stream-ops",
            Self::GpuPoll => "gpu-poll",
        }
    }

    /// The victim's extra flag.
    pub fn flag(self) -> Option<&'static str> {
        match self {
            Self::Persistent => Some("--persistent"),
            Self::Graph => Some("--graph"),
            Self::GpuPoll => None,
        }
    }
}

/// Why `kind` does not run without MPS, or `None` when it does.
pub fn unavailable(kind: KernelKind, mps: bool) -> Option<&'static str> {
    match kind {
        _ if mps => None,
        KernelKind::Graph => None,
        KernelKind::Persistent => Some(
            "needs MPS: without it the two processes' kernels take turns on the GPU, so a persistent kernel waiting \
             for the other process's work waits out whole time slices",
        ),
        KernelKind::GpuPoll => {
            Some("needs MPS: gpu-poll's polling kernels run only where MPS lets kernels of two processes run at once")
        }
    }
}

/// One cell: backend, kind, victim, MPS mode, kernel lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KernelCell {
    /// Backend.
    pub backend: &'static str,
    /// What runs in the victim.
    pub kind: KernelKind,
    /// Who is killed (the side running the kernel).
    pub victim: Victim,
    /// Under a private MPS daemon.
    pub mps: bool,
    /// The library's mitigation on (its default): the kernel lease and the survivor's abort word. Off: the pair runs
    /// with `GPU_IPC_KERNEL_LEASE_MS=0`.
    pub lease: bool,
}

impl KernelCell {
    /// `vmm/persistent kernel/producer killed (MPS)`, or `... (MPS, kernel lease off)`.
    pub fn name(&self) -> String {
        let mode = if self.mps { "MPS" } else { "no MPS" };
        let lease = if self.lease { "" } else { ", kernel lease off" };
        format!("{}/{}/{} killed ({mode}{lease})", self.backend, self.kind.name(), self.victim.name())
    }

    /// What the pair's environment adds for this cell: `GPU_IPC_KERNEL_LEASE_MS=0` with the lease off.
    pub fn pair_env(&self) -> Option<(&'static str, &'static str)> {
        (!self.lease).then_some((gpu_ipc::core::resident::LEASE_ENV, "0"))
    }
}

/// Which cells run with the library's mitigation (the kernel lease) on, off, or both (`--kernel-lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseModes {
    /// With the lease only (the library's default).
    On,
    /// Without it only (`GPU_IPC_KERNEL_LEASE_MS=0`), where it could change anything.
    Off,
    /// Both.
    Both,
}

impl LeaseModes {
    fn has(self, lease: bool) -> bool {
        match self {
            Self::On => lease,
            Self::Off => !lease,
            Self::Both => true,
        }
    }
}

/// Whether turning the lease off could change what a kill does to `kind`: only under MPS (without it a killed
/// process's kernels end with its context), and not for gpu-poll, whose polls have no lease (each ends within its
/// budget).
fn lease_matters(kind: KernelKind, mps: bool) -> bool {
    mps && kind != KernelKind::GpuPoll
}

/// The cells of one MPS mode for `backend`: every kind x victim, with the lease as `leases` asks where it matters
/// (with it on elsewhere).
pub fn cells(backend: &'static str, mps: bool, leases: LeaseModes) -> Vec<KernelCell> {
    let mut out = Vec::new();
    for kind in KernelKind::ALL {
        for lease in [true, false] {
            let wanted = if lease_matters(kind, mps) { leases.has(lease) } else { lease };
            if !wanted {
                continue;
            }
            for victim in [Victim::Producer, Victim::Consumer] {
                out.push(KernelCell { backend, kind, victim, mps, lease });
            }
        }
    }
    out
}

/// Trials per cell by default (`--trials`): enough for a rate, not an anecdote, in a few minutes per backend.
pub const DEFAULT_TRIALS: u32 = 3;

/// One trial's record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelKillRun {
    /// The cell.
    pub cell: KernelCell,
    /// Which trial of the cell this is, from 1.
    pub trial: u32,
    /// The verdict.
    pub status: Status,
    /// What was seen, starting with the fault count.
    pub detail: String,
    /// Clients not killed (survivor, bystanders).
    pub clients: u32,
    /// Of those, how many faulted (error 700 or an MPS error).
    pub faulted: u32,
    /// Seconds from the kill to the survivor's end.
    pub survivor_end_s: Option<f64>,
    /// Milliseconds from the victim's start to the kill.
    pub killed_at_ms: Option<f64>,
    /// Seconds the trial took.
    pub seconds: f64,
}

impl KernelKillRun {
    pub(crate) fn new(cell: KernelCell, status: Status, detail: String) -> Self {
        Self {
            cell,
            trial: 1,
            status,
            detail,
            clients: CLIENTS,
            faulted: 0,
            survivor_end_s: None,
            killed_at_ms: None,
            seconds: 0.0,
        }
    }
}

/// Runs one trial of `cell` (`ctx.env` carries the MPS client variables under MPS).
pub fn trial(ctx: &Ctx, cell: KernelCell) -> KernelKillRun {
    if let Some(why) = unavailable(cell.kind, cell.mps) {
        return KernelKillRun::new(cell, Status::NotRun, why.to_owned());
    }
    let started = Instant::now();
    let mut run = match bystanders(ctx, cell.backend) {
        Ok(by) => pair(ctx, cell, by),
        Err(e) => KernelKillRun::new(cell, Status::Failed, format!("the bystander pair did not stream: {e}")),
    };
    run.seconds = started.elapsed().as_secs_f64();
    run
}

/// The bystander pair, streaming (its producer ends when its stdin closes).
fn bystanders(ctx: &Ctx, backend: &str) -> Result<(Vec<Child>, std::path::PathBuf), String> {
    let socket = socket_path("bystander");
    let mut producer = ctx.producer(
        &socket,
        backend,
        "cpu-spin",
        &["--slots", "2", "--consumers", "1", "--frames", "0", "--until-stdin-closes"],
    )?;
    let a = Ctx::consumer_args(&socket, backend, "bystander", &["--frames", "0", "--progress-every", "100"]);
    let consumer = match Child::spawn("bystander consumer", &ctx.bins.consumer, &a, &ctx.env) {
        Ok(c) => c,
        Err(e) => {
            producer.kill();
            let _ = producer.finish(Instant::now());
            return Err(e);
        }
    };
    let mut pair = vec![producer, consumer];
    if let Err(e) = pair[1].wait_progress(100, Instant::now() + START_LIMIT) {
        let ends = finish_all(pair, Instant::now(), None);
        let _ = std::fs::remove_file(&socket);
        return Err(format!("{e}; {}", ends.iter().map(ProcEnd::describe).collect::<Vec<_>>().join("; ")));
    }
    Ok((pair, socket))
}

/// The pair under test with the bystanders running; kills the victim; judges.
fn pair(ctx: &Ctx, cell: KernelCell, (mut by, by_socket): (Vec<Child>, std::path::PathBuf)) -> KernelKillRun {
    let mut pair_ctx = ctx.clone();
    if let Some((name, value)) = cell.pair_env() {
        pair_ctx.env.push((name.into(), value.into()));
    }
    let ctx = &pair_ctx;
    let socket = socket_path("kernel-kill");
    let (frames, every) = (TRIAL_FRAMES.to_string(), EVERY.to_string());
    let flag = cell.kind.flag();
    let mut producer_extra = vec!["--slots", "4", "--consumers", "1", "--frames", &frames];
    let mut consumer_extra = vec!["--frames", &frames];
    match (cell.victim, flag) {
        (Victim::Producer, Some(f)) => producer_extra.push(f),
        (Victim::Consumer, Some(f)) => consumer_extra.push(f),
        (_, None) => {}
    }
    // A persistent producer reports no progress (and refuses the flag); every other side does.
    if !(cell.victim == Victim::Producer && cell.kind == KernelKind::Persistent) {
        producer_extra.extend(["--progress-every", &every]);
    }
    consumer_extra.extend(["--progress-every", &every]);
    let mut children = Vec::new();
    let spawned = (|| -> Result<(), String> {
        children.push(ctx.producer(&socket, cell.backend, cell.kind.sync(), &producer_extra)?);
        let a = Ctx::consumer_args(&socket, cell.backend, "survivor", &consumer_extra);
        let name = if cell.victim == Victim::Consumer { "consumer (victim)" } else { "consumer" };
        children.push(Child::spawn(name, &ctx.bins.consumer, &a, &ctx.env)?);
        Ok(())
    })();
    let (victim, survivor) = match cell.victim {
        Victim::Producer => (0, 1),
        Victim::Consumer => (1, 0),
    };
    let reached = spawned.and_then(|()| children[survivor].wait_progress(KILL_AFTER, Instant::now() + START_LIMIT));
    if let Err(e) = reached {
        let ends = finish_all(children, Instant::now() + Duration::from_secs(5), None);
        by[0].close_stdin();
        let by_ends = finish_all(by, Instant::now() + Duration::from_secs(20), None);
        let _ = (std::fs::remove_file(&socket), std::fs::remove_file(&by_socket));
        let all = ends.iter().chain(&by_ends).map(ProcEnd::describe).collect::<Vec<_>>().join("; ");
        return KernelKillRun::new(cell, Status::Failed, format!("before the kill: {e}; {all}"));
    }
    children[victim].kill();
    let killed_at = Instant::now();
    let killed_at_ms = killed_at.saturating_duration_since(children[victim].started).as_secs_f64() * 1e3;
    let ends = finish_all(children, killed_at + ctx.hang_after, Some(killed_at));
    by[0].close_stdin();
    let by_ends = finish_all(by, Instant::now() + ctx.hang_after, None);
    let _ = (std::fs::remove_file(&socket), std::fs::remove_file(&by_socket));
    let survivor_end = &ends[survivor];
    let (status, detail, faulted) =
        judge(cell.mps, cell.lease, cell.victim, survivor_end, &by_ends, TRIAL_FRAMES, ctx.gone_bound);
    KernelKillRun {
        cell,
        trial: 1,
        status,
        detail,
        clients: CLIENTS,
        faulted,
        survivor_end_s: survivor_end.after_kill_s,
        killed_at_ms: Some(killed_at_ms),
        seconds: 0.0,
    }
}

/// How one client that was not killed ended: fine, faulted (error 700 / MPS), or wrong (with why).
#[derive(Debug, Clone, PartialEq, Eq)]
enum ClientEnd {
    Fine,
    Faulted,
    Wrong(String),
}

fn client_end(p: &ProcEnd, fine: bool, what_was_expected: &str) -> ClientEnd {
    if p.hung {
        ClientEnd::Wrong(format!("HANG: {}", p.describe()))
    } else if fine {
        ClientEnd::Fine
    } else if looks_like_mps_fault(&p.stderr_tail) {
        ClientEnd::Faulted
    } else {
        ClientEnd::Wrong(format!("{} (expected {what_was_expected})", p.describe()))
    }
}

/// The verdict of a trial: `survivor` (the side not killed, a consumer when the producer was the `victim`), the
/// bystander pair's ends (producer, consumer), the trial's `frames`, the bound on `ProducerGone`, whether the kernel
/// `lease` was on. Returns the status, the detail (starting with `mps clients faulted: k/3` under MPS,
/// `clients faulted: k/3 (no MPS)` without) and the count of faulted clients.
pub fn judge(
    mps: bool,
    lease: bool,
    victim: Victim,
    survivor: &ProcEnd,
    bystanders: &[ProcEnd],
    frames: u64,
    gone_bound: Duration,
) -> (Status, String, u32) {
    let survivor_fine = match victim {
        Victim::Producer => {
            let stamped_clean =
                survivor.count("skipped_frames").is_none() || survivor.count("mismatched_words") == Some(0);
            survivor.exit == Some(EXIT_PRODUCER_GONE)
                && survivor.after_kill_s.is_some_and(|s| s <= gone_bound.as_secs_f64())
                && stamped_clean
        }
        Victim::Consumer => {
            survivor.exit == Some(0)
                && survivor.count("frames") == Some(frames)
                && survivor.count("consumers_lost") == Some(1)
        }
    };
    let expected = match victim {
        Victim::Producer => {
            format!("exit {EXIT_PRODUCER_GONE}, ProducerGone, within {gone_bound:?}, 0 mismatched words")
        }
        Victim::Consumer => format!("exit 0, all {frames} frames, 1 consumer lost"),
    };
    let mut ends = vec![("survivor", client_end(survivor, survivor_fine, &expected))];
    for (i, b) in bystanders.iter().enumerate() {
        let fine = b.exit == Some(0) && b.count("mismatched_words").unwrap_or(0) == 0;
        ends.push((if i == 0 { "bystander producer" } else { "bystander consumer" }, client_end(b, fine, "exit 0")));
    }
    let clients = ends.len() as u32;
    let faulted = ends.iter().filter(|(_, e)| *e == ClientEnd::Faulted).count() as u32;
    let counted = if mps {
        format!("mps clients faulted: {faulted}/{clients}")
    } else {
        format!("clients faulted: {faulted}/{clients} (no MPS)")
    };
    let when =
        survivor.after_kill_s.map(|s| format!("; the survivor ended {s:.3} s after the kill")).unwrap_or_default();
    let each = ends
        .iter()
        .zip(std::iter::once(survivor).chain(bystanders))
        .map(|((who, e), p)| match e {
            ClientEnd::Fine => format!("{who} fine"),
            ClientEnd::Faulted => format!("{who} FAULTED: {}", p.describe()),
            ClientEnd::Wrong(why) => format!("{who} WRONG: {why}"),
        })
        .collect::<Vec<_>>()
        .join("; ");
    let detail = format!("{counted} ({each}){when}");
    // A fault without MPS is no known effect: a failure like any other wrong ending.
    let status = if ends.iter().any(|(_, e)| matches!(e, ClientEnd::Wrong(_))) || (faulted > 0 && !mps) {
        Status::Failed
    } else if faulted > 0 {
        Status::Finding
    } else {
        Status::Passed
    };
    let detail = match status {
        Status::Finding if lease => format!(
            "{detail}; a fault despite the kernel lease (the kernel of the killed process should have left by itself): \
             the MPS effect of killing a process whose kernel waits on shared memory, recorded"
        ),
        Status::Finding => format!(
            "{detail}; the known MPS effect of killing a process whose kernel waits on shared memory, with the kernel \
             lease off (the comparison; recorded, not prevented)"
        ),
        _ => detail,
    };
    (status, detail, faulted)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn end(name: &str, exit: Option<i32>, summary: serde_json::Value, stderr: &str) -> ProcEnd {
        ProcEnd { name: name.into(), exit, summary: Some(summary), stderr_tail: stderr.into(), ..ProcEnd::default() }
    }

    fn fine_bystanders() -> Vec<ProcEnd> {
        vec![
            end("producer", Some(0), serde_json::json!({"frames": 900}), ""),
            end("consumer", Some(0), serde_json::json!({"frames": 900, "mismatched_words": 0}), ""),
        ]
    }

    const FAULT: &str =
        "consumer: cuStreamSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access";
    const B: Duration = Duration::from_secs(2);

    fn gone(after: f64) -> ProcEnd {
        ProcEnd {
            after_kill_s: Some(after),
            ..end("consumer", Some(4), serde_json::json!({"mismatched_words": 0, "skipped_frames": 2}), "")
        }
    }

    #[test]
    fn a_clean_kill_passes_and_says_none_faulted() {
        let (s, d, f) = judge(true, true, Victim::Producer, &gone(0.2), &fine_bystanders(), 100, B);
        assert_eq!((s, f), (Status::Passed, 0));
        assert!(d.starts_with("mps clients faulted: 0/3 (survivor fine; bystander producer fine"), "{d}");
        assert!(d.contains("ended 0.200 s after the kill"), "{d}");
        let producer = end("producer", Some(0), serde_json::json!({"frames": 100, "consumers_lost": 1}), "");
        let (s, d, _) = judge(false, true, Victim::Consumer, &producer, &fine_bystanders(), 100, B);
        assert_eq!(s, Status::Passed);
        assert!(d.starts_with("clients faulted: 0/3 (no MPS)"), "{d}");
    }

    #[test]
    fn faults_under_mps_are_findings_counted_and_without_mps_failures() {
        let faulted = end("consumer", Some(1), serde_json::json!({}), FAULT);
        let bys = vec![end("producer", Some(1), serde_json::json!({}), FAULT), faulted.clone()];
        let (s, d, f) = judge(true, true, Victim::Producer, &faulted, &bys, 100, B);
        assert_eq!((s, f), (Status::Finding, 3));
        assert!(d.starts_with("mps clients faulted: 3/3"), "{d}");
        assert!(d.contains("a fault despite the kernel lease"), "{d}");
        let (s, d, _) = judge(true, false, Victim::Producer, &faulted, &bys, 100, B);
        assert_eq!(s, Status::Finding);
        assert!(d.contains("with the kernel lease off (the comparison; recorded, not prevented)"), "{d}");
        let (s, _, f) =
            judge(true, true, Victim::Producer, &gone(0.3), &[fine_bystanders()[0].clone(), faulted.clone()], 100, B);
        assert_eq!((s, f), (Status::Finding, 1));
        assert_eq!(judge(false, true, Victim::Producer, &faulted, &fine_bystanders(), 100, B).0, Status::Failed);
    }

    #[test]
    fn a_hang_a_slow_or_wrong_survivor_fails_even_under_mps() {
        let hung = ProcEnd { hung: true, exit: None, ..gone(0.0) };
        let (s, d, _) = judge(true, true, Victim::Producer, &hung, &fine_bystanders(), 100, B);
        assert_eq!(s, Status::Failed);
        assert!(d.contains("survivor WRONG: HANG"), "{d}");
        assert_eq!(judge(true, true, Victim::Producer, &gone(2.5), &fine_bystanders(), 100, B).0, Status::Failed);
        let short = end("producer", Some(0), serde_json::json!({"frames": 90, "consumers_lost": 1}), "");
        assert_eq!(judge(true, true, Victim::Consumer, &short, &fine_bystanders(), 100, B).0, Status::Failed);
        let mismatched = ProcEnd {
            after_kill_s: Some(0.1),
            ..end("consumer", Some(4), serde_json::json!({"mismatched_words": 5, "skipped_frames": 0}), "")
        };
        assert_eq!(judge(true, true, Victim::Producer, &mismatched, &fine_bystanders(), 100, B).0, Status::Failed);
    }

    /// Stand-ins for the example programs (no GPU here): a producer that leaves its pid beside its socket and makes
    /// its frames (or, with `--until-stdin-closes`, waits for its stdin to close and leaves a `.done` file); a
    /// consumer that reports progress until its frames are read (exit 0), its producer is gone (exit 4, as
    /// ProducerGone) or, as the bystander, the `.done` file appears.
    const STAND_IN: &str = r#"#!/bin/sh
frames=0; name=p; every=100; until=0; socket=x
while [ $# -gt 0 ]; do
  case "$1" in --frames) frames=$2; shift;; --name) name=$2; shift;; --progress-every) every=$2; shift;;
    --socket) socket=$2; shift;; --until-stdin-closes) until=1;; esac
  shift
done
case "$0" in
  *producer)
    if [ "$until" = 1 ]; then cat >/dev/null; touch "$socket.done"; echo '{"frames": 10}'; exit 0; fi
    echo $$ > "$socket.pid"
    i=0; while [ "$i" -lt "$frames" ]; do i=$((i + 1000)); echo "producer: frame $i" >&2; sleep 0.01; done
    echo "{\"frames\": $frames, \"consumers_lost\": 1}"; exit 0;;
  *)
    i=0
    while :; do
      i=$((i + every)); echo "consumer $name: frame $i" >&2; sleep 0.01
      if [ "$name" = bystander ] && [ -e "$socket.done" ]; then
        rm -f "$socket.done"; echo '{"frames": 5, "mismatched_words": 0}'; exit 0
      fi
      if [ "$name" != bystander ] && [ -e "$socket.pid" ] && ! kill -0 "$(cat "$socket.pid")" 2>/dev/null; then
        echo '{"mismatched_words": 0, "skipped_frames": 1}'; exit 4
      fi
    done;;
esac
"#;

    fn stand_in_ctx(tag: &str) -> (std::path::PathBuf, Ctx) {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gpu-ipc-stress-kernel-kill-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["producer", "consumer"] {
            let path = dir.join(name);
            std::fs::write(&path, STAND_IN).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let ctx = Ctx {
            bins: crate::procs::Bins::find(Some(&dir)).unwrap(),
            env: crate::procs::ChildEnv::new(),
            sizes: crate::schedule::Sizes::QUICK,
            width: 64,
            height: 16,
            max_gap: Duration::from_millis(100),
            gone_bound: Duration::from_secs(2),
            hang_after: Duration::from_secs(10),
            front_door_sync: "cpu-spin".into(),
            seed: 1,
            mps: false,
        };
        (dir, ctx)
    }

    #[test]
    fn a_consumer_kill_trial_runs_with_its_bystanders_on_stand_ins() {
        let (dir, ctx) = stand_in_ctx("consumer");
        let cell =
            KernelCell { backend: "vmm", kind: KernelKind::Graph, victim: Victim::Consumer, mps: false, lease: true };
        let run = trial(&ctx, cell);
        assert_eq!(run.status, Status::Passed, "{run:?}");
        assert!(
            run.detail.starts_with(
                "clients faulted: 0/3 (no MPS) (survivor fine; bystander producer fine; bystander consumer fine)"
            ),
            "{}",
            run.detail
        );
        assert!(run.killed_at_ms.is_some());
        // Without MPS, a persistent kernel is not run, with why.
        let cell = KernelCell { kind: KernelKind::Persistent, ..cell };
        assert_eq!(trial(&ctx, cell).status, Status::NotRun);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_producer_kill_trial_times_the_survivors_producer_gone_on_stand_ins() {
        let (dir, ctx) = stand_in_ctx("producer");
        let cell = KernelCell {
            backend: "legacy",
            kind: KernelKind::Graph,
            victim: Victim::Producer,
            mps: false,
            lease: true,
        };
        let run = trial(&ctx, cell);
        assert_eq!(run.status, Status::Passed, "{run:?}");
        assert!(run.survivor_end_s.is_some_and(|s| s < 2.0), "{run:?}");
        assert!(run.detail.contains("the survivor ended"), "{}", run.detail);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn without_mps_only_frame_graphs_run() {
        assert!(unavailable(KernelKind::Persistent, false).unwrap().contains("needs MPS"));
        assert!(unavailable(KernelKind::GpuPoll, false).unwrap().contains("needs MPS"));
        assert_eq!(unavailable(KernelKind::Graph, false), None);
        assert!(KernelKind::ALL.iter().all(|&k| unavailable(k, true).is_none()));
        let c = cells("vmm", true, LeaseModes::On);
        assert_eq!(c.len(), 6);
        assert_eq!(c[0].name(), "vmm/persistent kernel/producer killed (MPS)");
        assert_eq!(cells("legacy", false, LeaseModes::Both)[3].name(), "legacy/frame graphs/consumer killed (no MPS)");
    }

    #[test]
    fn under_mps_the_lease_is_also_turned_off_where_it_could_change_the_outcome() {
        let names = |mps, leases| cells("vmm", mps, leases).iter().map(KernelCell::name).collect::<Vec<_>>();
        let both = names(true, LeaseModes::Both);
        assert_eq!(both.len(), 10, "{both:?}");
        assert!(both.contains(&"vmm/persistent kernel/producer killed (MPS, kernel lease off)".to_owned()));
        assert!(both.contains(&"vmm/frame graphs/consumer killed (MPS, kernel lease off)".to_owned()));
        assert!(!both.iter().any(|n| n.starts_with("vmm/gpu-poll") && n.contains("lease off")), "no lease there");
        let off = names(true, LeaseModes::Off);
        assert_eq!(off.len(), 6, "{off:?}: four without the lease, gpu-poll as it is");
        assert_eq!(names(false, LeaseModes::Both), names(false, LeaseModes::On), "without MPS, no comparison");
        let cell = cells("vmm", true, LeaseModes::Off)[0];
        assert_eq!(cell.pair_env(), Some(("GPU_IPC_KERNEL_LEASE_MS", "0")));
        assert_eq!(KernelCell { lease: true, ..cell }.pair_env(), None);
    }
}
