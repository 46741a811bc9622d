//! `gpu-ipc-stress ...`, a development tool (not a user command, so not in the `gpu-ipc` binary): the GPU-side
//! evidence of the hardening issues, in one command, driving the staged
//! `producer` and `consumer` programs (next to this program, or `--bin-dir`):
//!
//! - `hostile`: careless and hostile clients at a real producer's door while frames flow (issue 8): every
//!   behaviour of [`hostile`], then a real consumer attaches; the producer's fds come back flat and neither it
//!   nor its two streaming consumers go `--max-gap-ms` (100) without a frame;
//! - `namespace`: a consumer in another PID namespace (`unshare --pid --fork --mount-proc`) attaches and verifies
//!   frames, per backend (legacy failing there is recorded as a finding);
//! - `users`: (root) a consumer running as uid/gid 65534 (`nobody`) imports the ring of a producer of ours, per
//!   backend and strategy (cpu-spin, gpu-stream-ops), through a socket open by uid, and once by group; either
//!   answer is recorded (imported and verified, or refused with the CUDA error: a finding) ([`users`]);
//! - `kills`: the random-kill matrix (issue 9), backend x strategy x victim (under MPS `gpu-poll` too), `--kills`
//!   SIGKILLs per cell at random points, without and under a private MPS daemon; hangs, lost frames, mismatches,
//!   `ProducerGone` times;
//! - `cycles`: 1,000 attach/detach cycles per backend with a GPU and a CPU strategy; fd and device-memory deltas;
//! - `evict`: a stuck consumer evicted while the healthy one goes on;
//! - `containers`: every ring strategy and every toolkit primitive (pool, semaphore, work queue, pipeline) with its
//!   client in an isolated container (own PID, IPC, network and mount namespaces, a private `/dev/shm`), per backend
//!   ([`containers`]);
//! - `mps-kills`: SIGKILL of a process while its persistent kernel, frame graphs or gpu-poll wait runs, without and
//!   under MPS, with an unrelated pair of MPS clients beside it: how many clients faulted is recorded
//!   ([`kernel_kills`]).
//!
//! `soak` (not part of `all`): 10,000,000 4K frames from a producer process to a consumer process, every word
//! checked on the GPU ([`soak`]).
//!
//! `all` runs every part (`--only` picks some); `--list` prints the cells instead of running them. `--out DIR` writes `stress.json` and `stress.md` (tables for
//! docs/results.md). Exit status: 0 every check passed (findings and parts that could not run for a documented
//! reason do not fail it); 1 a check failed; 2 usage error. Progress goes to stderr.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

pub mod containers;
pub mod hostile;
pub mod kernel_kills;
pub mod kill_rates;
pub mod outcome;
mod parts;
pub mod procs;
pub mod render;
pub mod run;
pub mod schedule;
pub mod soak;
pub mod users;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

use containers::ContainerRun;
use harness::mps::{MpsControl, MpsDaemon};
use kernel_kills::KernelKillRun;
use kill_rates::KernelKillRate;
use outcome::{CellCounts, Check, Status, Trial, TrialOutcome};
use procs::ChildEnv;
use run::{Ctx, CyclesRun, FrontDoorRun, NamespaceRun};
use schedule::{BACKENDS, Sizes, SplitMix};
use soak::SoakReport;
use users::UsersReport;

use parts::*;

/// Version of the JSON document.
pub const SCHEMA_VERSION: u32 = 2;

/// A part of the stress run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// Every part (or those `--only` names).
    All,
    /// Hostile clients against a streaming producer.
    Hostile,
    /// A consumer in another PID namespace.
    Namespace,
    /// Consumers of another user (uid 65534) importing a root producer's memory.
    Users,
    /// The random-kill matrix.
    Kills,
    /// Attach/detach cycles.
    Cycles,
    /// Eviction of a stuck consumer.
    Evict,
    /// Every ring strategy and toolkit primitive with its client in an isolated container.
    Containers,
    /// SIGKILL while a persistent kernel, frame graphs or a gpu-poll wait runs; MPS clients faulted, recorded.
    MpsKills,
    /// 10,000,000 4K frames between two processes, every word checked (not part of `all`).
    Soak,
}

/// Which MPS modes the kill matrix runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MpsMode {
    /// Without MPS only.
    Off,
    /// Under a private MPS daemon only.
    On,
    /// Both, without first.
    Both,
}

/// Options of `gpu-ipc-stress`.
#[derive(Debug, Clone, Args)]
pub struct StressArgs {
    /// What to run: all, hostile, namespace, users, kills, cycles, evict, containers, mps-kills, or soak (not in
    /// all).
    #[arg(value_enum)]
    pub part: Part,
    /// Print the cells the selected parts would run, with what each must do, and exit.
    #[arg(long)]
    pub list: bool,
    /// With `all`: only these parts (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Part>,
    /// A short run (about 3 minutes on an H100): 3 kills per cell, 200 cycles.
    #[arg(long)]
    pub quick: bool,
    /// Print the JSON document on stdout instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// Write `stress.json` and `stress.md` (and the MPS daemon's logs) into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Where the `producer` and `consumer` programs are [default: next to this program].
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Only this backend [default: legacy and vmm; soak: vmm]. `host` (no GPU) runs only the CPU cells
    /// of `containers` and `soak --sync cpu-spin`: the harness's own check.
    #[arg(long, value_parser = ["legacy", "vmm", "host"])]
    pub backend: Option<String>,
    /// MPS modes of the kill matrix, mps-kills and the containers' gpu-poll cells (the other parts run without MPS);
    /// the soak runs under MPS unless `off`. A bare `--mps` is `on`.
    #[arg(long, value_enum, default_value = "both", num_args = 0..=1, default_missing_value = "on")]
    pub mps: MpsMode,
    /// An MPS pass that cannot start (no nvidia-cuda-mps-control, no daemon) is "not run" instead of a failure.
    #[arg(long)]
    pub allow_no_mps: bool,
    /// Kills per matrix cell [default: 10; 3 with --quick].
    #[arg(long, value_name = "N")]
    pub kills: Option<u32>,
    /// Trials per mps-kills cell, so that a fault is a rate, not an anecdote [default: 3].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub trials: Option<u32>,
    /// mps-kills under MPS: the cells with the library's kernel lease (its default), the same cells with it off
    /// (`GPU_IPC_KERNEL_LEASE_MS=0`: the comparison), or both.
    #[arg(long, value_enum, default_value = "both")]
    pub kernel_lease: kernel_kills::LeaseModes,
    /// Attach/detach cycles per run [default: 1000; 200 with --quick].
    #[arg(long, value_name = "N")]
    pub cycles: Option<u64>,
    /// Seed of the random kill points and bytes [default: from the clock; the JSON records it].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Frame width (RGB frames) [default: 1280; soak: 3840].
    #[arg(long)]
    pub width: Option<u32>,
    /// Frame height [default: 720; soak: 2160].
    #[arg(long)]
    pub height: Option<u32>,
    /// Soak: frames to send.
    #[arg(long, default_value_t = soak::SOAK_FRAMES)]
    pub frames: u64,
    /// Soak: sync strategy.
    #[arg(long, default_value = "gpu-stream-ops", value_parser = ["cpu-spin", "cpu-sleep", "ipc-event", "gpu-stream-ops", "gpu-poll"])]
    pub sync: String,
    /// Soak: frame graphs on both sides (gpu-stream-ops or gpu-poll).
    #[arg(long)]
    pub graph: bool,
    /// Soak: the longest it may run, start-up included; past it both programs are killed and the soak fails with
    /// the figures so far (the default leaves a 10-minute call time to write the report).
    #[arg(long, default_value_t = 570)]
    pub max_seconds: u64,
    /// The longest a producer may go without publishing, or a streaming consumer without a frame, in ms.
    #[arg(long, default_value_t = 100)]
    pub max_gap_ms: u64,
    /// How soon after a producer's death every consumer must exit with ProducerGone, in ms.
    #[arg(long, default_value_t = 2000)]
    pub gone_bound_ms: u64,
    /// After a kill, seconds the others have to finish before they count as hung.
    #[arg(long, default_value_t = 20)]
    pub hang_after: u64,
    /// Sync strategy of the hostile and namespace runs.
    #[arg(long, default_value = "cpu-spin", value_parser = ["cpu-spin", "cpu-sleep", "ipc-event", "gpu-stream-ops"])]
    pub front_door_sync: String,
}

impl StressArgs {
    /// The parts this run selects, in the order they run.
    pub fn parts(&self) -> Vec<Part> {
        selected_parts(self.part, &self.only)
    }

    /// The sizes, with the overrides.
    pub fn sizes(&self) -> Sizes {
        let base = if self.quick { Sizes::QUICK } else { Sizes::FULL };
        Sizes {
            kills_per_cell: self.kills.unwrap_or(base.kills_per_cell),
            cycles: self.cycles.unwrap_or(base.cycles),
            ..base
        }
    }

    fn backends(&self) -> Vec<&'static str> {
        if self.backend.as_deref() == Some("host") {
            return vec!["host"];
        }
        BACKENDS.iter().copied().filter(|b| self.backend.as_deref().is_none_or(|x| x == *b)).collect()
    }

    /// Trials per mps-kills cell: `--trials`, else [`kernel_kills::DEFAULT_TRIALS`].
    pub fn mps_kill_trials(&self) -> u32 {
        self.trials.unwrap_or(kernel_kills::DEFAULT_TRIALS)
    }

    /// The one backend of the soak: `--backend`, else vmm.
    fn one_backend(&self) -> &'static str {
        self.backends().first().copied().filter(|_| self.backend.is_some()).unwrap_or("vmm")
    }

    /// The frame size: `--width`/`--height`, else 1280x720 (soak: 3840x2160).
    pub fn frame(&self) -> (u32, u32) {
        let (w, h) = if self.part == Part::Soak { soak::SOAK_SIZE } else { (1280, 720) };
        (self.width.unwrap_or(w), self.height.unwrap_or(h))
    }

    /// The MPS modes (`false`: without) of the parts that run in both.
    fn mps_modes(&self) -> &'static [bool] {
        match self.mps {
            MpsMode::Off => &[false],
            MpsMode::On => &[true],
            MpsMode::Both => &[false, true],
        }
    }
}

/// `part` with `only`: the parts to run, in their fixed order.
pub fn selected_parts(part: Part, only: &[Part]) -> Vec<Part> {
    let every = [
        Part::Hostile,
        Part::Namespace,
        Part::Users,
        Part::Containers,
        Part::Cycles,
        Part::Evict,
        Part::Kills,
        Part::MpsKills,
    ];
    match part {
        Part::All if only.is_empty() || only.contains(&Part::All) => every.to_vec(),
        Part::All => every.into_iter().filter(|p| only.contains(p)).collect(),
        one => vec![one],
    }
}

/// One pass of the kill matrix.
#[derive(Debug, Clone, Serialize)]
pub struct KillPass {
    /// Under a private MPS daemon.
    pub mps: bool,
    /// Passed, failed, not run (no MPS).
    pub status: Status,
    /// Why not run, or notes.
    pub note: String,
    /// Times the MPS daemon stopped answering and was started again.
    pub mps_restarts: u32,
    /// Seconds.
    pub seconds: f64,
    /// Per-cell counts.
    pub cells: Vec<CellCounts>,
    /// Every trial.
    pub trials: Vec<Trial>,
}

/// The document `--json` prints and `--out` writes.
#[derive(Debug, Clone, Serialize)]
pub struct StressReport {
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// `--quick`.
    pub quick: bool,
    /// The seed (replay with `--seed`).
    pub seed: u64,
    /// Parts run.
    pub parts: Vec<Part>,
    /// Counts.
    pub sizes: Sizes,
    /// Frame width and height.
    pub frame: [u32; 2],
    /// Seconds since the epoch at the start.
    pub started_unix: u64,
    /// Wall time of the whole run.
    pub seconds: f64,
    /// The kill matrix, per MPS mode.
    pub kill_passes: Vec<KillPass>,
    /// The hostile runs' figures.
    pub front_door: Vec<FrontDoorRun>,
    /// The namespace consumers.
    pub namespace: Vec<NamespaceRun>,
    /// The consumers of another user (`null` when the part was not selected).
    pub users: Option<UsersReport>,
    /// The cycles runs.
    pub cycles: Vec<CyclesRun>,
    /// What the containers' check saw inside one (`null` when the part was not selected or could not run).
    pub container_proof: Option<String>,
    /// The containers' cells.
    pub containers: Vec<ContainerRun>,
    /// The kills while a kernel waits: every trial, per backend and MPS mode.
    pub mps_kills: Vec<KernelKillRun>,
    /// The same, counted per cell: how often a kill faulted the other clients.
    pub mps_kill_rates: Vec<KernelKillRate>,
    /// The soak (`null` unless `soak` ran).
    pub soak: Option<SoakReport>,
    /// Every check.
    pub checks: Vec<Check>,
    /// No check failed.
    pub passed: bool,
}

/// `gpu-ipc-stress PART`. Returns the exit status.
pub fn main(args: &StressArgs) -> u8 {
    if args.list {
        print!("{}", list_cells(args));
        return 0;
    }
    let parts = args.parts();
    if args.backend.as_deref() == Some("host")
        && let Some(part) = parts.iter().find(|p| !matches!(p, Part::Containers | Part::Soak))
    {
        eprintln!(
            "gpu-ipc-stress: --backend host runs only the containers part's CPU cells and the soak (not {part:?}): \
             pass --only containers, or soak --sync cpu-spin"
        );
        return 2;
    }
    let bins = match procs::Bins::find(args.bin_dir.as_deref()) {
        Ok(bins) => bins,
        Err(e) => {
            eprintln!("gpu-ipc-stress: {e}");
            return 2;
        }
    };
    let started = Instant::now();
    let started_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let (width, height) = args.frame();
    let ctx = Ctx {
        bins,
        env: ChildEnv::new(),
        sizes: args.sizes(),
        width,
        height,
        max_gap: Duration::from_millis(args.max_gap_ms),
        gone_bound: Duration::from_millis(args.gone_bound_ms),
        hang_after: Duration::from_secs(args.hang_after.max(1)),
        front_door_sync: args.front_door_sync.clone(),
        seed,
        mps: false,
    };
    let mut report = StressReport {
        schema: SCHEMA_VERSION,
        quick: args.quick,
        seed,
        parts: parts.clone(),
        sizes: ctx.sizes,
        frame: [width, height],
        started_unix,
        seconds: 0.0,
        kill_passes: Vec::new(),
        front_door: Vec::new(),
        namespace: Vec::new(),
        users: None,
        cycles: Vec::new(),
        container_proof: None,
        containers: Vec::new(),
        mps_kills: Vec::new(),
        mps_kill_rates: Vec::new(),
        soak: None,
        checks: Vec::new(),
        passed: false,
    };
    eprintln!("gpu-ipc-stress: parts {parts:?}, seed {seed}, {width}x{height} RGB frames");
    let backends = args.backends();
    let (hostile_on, namespace_on) = (parts.contains(&Part::Hostile), parts.contains(&Part::Namespace));
    if hostile_on || namespace_on {
        for backend in &backends {
            eprintln!(
                "gpu-ipc-stress: front door ({backend}, {}): hostile {hostile_on}, namespace {namespace_on}",
                ctx.front_door_sync
            );
            let from = report.checks.len();
            let (run, ns) = run::front_door(&ctx, backend, hostile_on, namespace_on, &mut report.checks);
            print_checks(&report.checks[from..]);
            report.front_door.push(run);
            report.namespace.extend(ns);
        }
    }
    if parts.contains(&Part::Users) {
        eprintln!("gpu-ipc-stress: consumers of uid {} against a producer of ours", procs::NOBODY);
        let users = users::users(&ctx, &backends);
        let from = report.checks.len();
        report.checks.extend(users_checks(&users));
        print_checks(&report.checks[from..]);
        report.users = Some(users);
    }
    if parts.contains(&Part::Containers) {
        run_containers(&ctx, &backends, args, &mut report);
    }
    if parts.contains(&Part::Cycles) {
        for backend in &backends {
            for sync in ["gpu-stream-ops", "cpu-spin"] {
                eprintln!("gpu-ipc-stress: {} attach/detach cycles ({backend}, {sync})", ctx.sizes.cycles);
                let c = run::cycles(&ctx, backend, sync);
                let check = Check::new(
                    "cycles",
                    format!(
                        "{backend}/{sync}: {} attach/detach cycles leave fds and device memory flat",
                        ctx.sizes.cycles
                    ),
                    c.status,
                    c.detail.clone(),
                );
                print_checks(std::slice::from_ref(&check));
                report.checks.push(check);
                report.cycles.push(c);
            }
        }
    }
    if parts.contains(&Part::Evict) {
        for backend in &backends {
            let check = run::evict(&ctx, backend, "cpu-spin");
            print_checks(std::slice::from_ref(&check));
            report.checks.push(check);
        }
    }
    if parts.contains(&Part::Kills) {
        let modes: &[bool] = match args.mps {
            MpsMode::Off => &[false],
            MpsMode::On => &[true],
            MpsMode::Both => &[false, true],
        };
        for &mps in modes {
            let pass = kill_pass(&ctx, &backends, mps, args);
            report.checks.extend(pass_checks(&pass, args.allow_no_mps));
            report.kill_passes.push(pass);
        }
    }
    if parts.contains(&Part::MpsKills) {
        run_mps_kills(&ctx, args, &mut report);
    }
    if parts.contains(&Part::Soak) {
        run_soak(&ctx, args, &mut report);
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.passed = !report.checks.iter().any(|c| c.status == Status::Failed);
    finish(&report, args)
}

/// `--list`: every cell of the selected parts, one a line: part, cell, what it must do.
pub fn list_cells(args: &StressArgs) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let backends = args.backends();
    let modes = args.mps_modes();
    for part in args.parts() {
        let mut line = |cell: &str, must: &str| {
            let _ = writeln!(
                out,
                "{:<11} {cell}: {must}",
                serde_json::to_value(part).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
            );
        };
        match part {
            Part::Hostile => {
                line("per backend", "hostile clients at a streaming producer; fds flat, gaps < --max-gap-ms")
            }
            Part::Namespace => line("per backend", "a consumer in another PID namespace verifies 50 frames"),
            Part::Users => {
                for r in users::rows(&backends) {
                    line(
                        &format!("{}/{} {}", r.backend, r.sync, r.door.name()),
                        "a consumer of uid 65534 imports and verifies, or is refused (finding)",
                    );
                }
            }
            Part::Containers => {
                let mps = modes.contains(&true) && !backends.contains(&"host");
                for c in containers::cells(&backends, mps) {
                    let must = containers::needs_gpu(&c.backend, c.sync.as_deref())
                        .map_or(c.expectation.clone(), |why| format!("not run: {why}"));
                    line(&c.name(), &must);
                }
            }
            Part::Cycles => {
                line("per backend x gpu-stream-ops, cpu-spin", "attach/detach cycles leave fds and device memory flat")
            }
            Part::Evict => line("per backend", "a stuck consumer is evicted, the healthy one reads every frame"),
            Part::Kills => {
                for &mps in modes {
                    for c in schedule::cells(&backends, mps) {
                        line(
                            &format!("{} ({})", c.name(), if mps { "MPS" } else { "no MPS" }),
                            "random SIGKILLs; ProducerGone in bound or the survivor reads all",
                        );
                    }
                }
            }
            Part::MpsKills => {
                let trials = args.mps_kill_trials();
                for &backend in &backends {
                    for &mps in modes {
                        for c in kernel_kills::cells(backend, mps, args.kernel_lease) {
                            let must = kernel_kills::unavailable(c.kind, mps).map_or_else(
                                || format!("{trials} trials: {}", kernel_kills::EXPECTATION),
                                |why| format!("not run: {why}"),
                            );
                            line(&c.name(), &must);
                        }
                    }
                }
            }
            Part::Soak => {
                let (w, h) = args.frame();
                line(
                    &format!("{}/{}{}", args.one_backend(), args.sync, if args.graph { " (frame graphs)" } else { "" }),
                    &format!(
                        "{} frames of {w}x{h} rgb8, every word checked on the GPU, 0 mismatched (MPS unless --mps off)",
                        args.frames
                    ),
                );
            }
            Part::All => {}
        }
    }
    out
}

fn finish(report: &StressReport, args: &StressArgs) -> u8 {
    let code = if report.passed { 0 } else { 1 };
    let json = match serde_json::to_string_pretty(report) {
        Ok(json) => json,
        Err(e) => {
            eprintln!("gpu-ipc-stress: could not encode the report: {e}");
            return 1;
        }
    };
    if let Some(out) = &args.out {
        let written = std::fs::create_dir_all(out)
            .and_then(|()| std::fs::write(out.join("stress.json"), &json))
            .and_then(|()| std::fs::write(out.join("stress.md"), render::markdown(report)));
        if let Err(e) = written {
            eprintln!("gpu-ipc-stress: could not write into {}: {e}", out.display());
            return 1;
        }
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", render::summary(report));
    }
    code
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: StressArgs,
    }

    fn parse(line: &[&str]) -> StressArgs {
        Cli::try_parse_from(std::iter::once("stress").chain(line.iter().copied())).unwrap().args
    }

    #[test]
    fn all_runs_every_part_and_only_picks_some_in_the_fixed_order() {
        assert_eq!(
            parse(&["all"]).parts(),
            vec![
                Part::Hostile,
                Part::Namespace,
                Part::Users,
                Part::Containers,
                Part::Cycles,
                Part::Evict,
                Part::Kills,
                Part::MpsKills
            ]
        );
        // The soak is not part of `all`.
        assert_eq!(parse(&["all", "--only", "soak,containers"]).parts(), vec![Part::Containers]);
        assert_eq!(parse(&["soak"]).parts(), vec![Part::Soak]);
        assert_eq!(parse(&["all", "--only", "kills,hostile"]).parts(), vec![Part::Hostile, Part::Kills]);
        assert_eq!(parse(&["all", "--only", "users"]).parts(), vec![Part::Users]);
        assert_eq!(parse(&["users"]).parts(), vec![Part::Users]);
        assert_eq!(parse(&["cycles"]).parts(), vec![Part::Cycles]);
    }

    #[test]
    fn quick_and_overrides_set_the_sizes() {
        assert_eq!(parse(&["all"]).sizes(), Sizes::FULL);
        assert_eq!(parse(&["all", "--quick"]).sizes().kills_per_cell, 3);
        let s = parse(&["kills", "--quick", "--kills", "12", "--cycles", "5"]).sizes();
        assert_eq!((s.kills_per_cell, s.cycles), (12, 5));
        assert_eq!(parse(&["kills", "--backend", "vmm"]).backends(), vec!["vmm"]);
        assert_eq!(parse(&["kills"]).backends(), vec!["legacy", "vmm"]);
        assert!(Cli::try_parse_from(["stress", "kills", "--backend", "cuda"]).is_err());
    }

    #[test]
    fn the_soak_line_of_the_issue_parses_with_4k_frames_under_mps() {
        let a = parse(&["soak", "--frames", "10000000", "--mps"]);
        assert_eq!((a.part, a.frames, a.mps, a.frame()), (Part::Soak, 10_000_000, MpsMode::On, (3840, 2160)));
        assert_eq!(a.one_backend(), "vmm");
        assert_eq!(a.sync, "gpu-stream-ops");
        assert_eq!(parse(&["soak", "--mps", "off", "--graph"]).mps, MpsMode::Off);
        assert_eq!(parse(&["all"]).mps, MpsMode::Both);
        assert_eq!(parse(&["all"]).frame(), (1280, 720));
        assert_eq!(parse(&["soak", "--backend", "legacy"]).one_backend(), "legacy");
        assert_eq!(parse(&["containers", "--backend", "host"]).backends(), vec!["host"]);
        // --backend host runs only the containers' CPU cells and the soak.
        assert_eq!(main(&parse(&["all", "--backend", "host"])), 2);
        let list = list_cells(&parse(&["all", "--only", "containers,mps-kills", "--list"]));
        assert!(
            list.contains("containers  vmm/ipc-event ring: a consumer in a container verifies all 200 frames"),
            "{list}"
        );
        assert!(
            list.contains("mps-kills   vmm/persistent kernel/producer killed (no MPS): not run: needs MPS"),
            "{list}"
        );
        assert!(list.contains("mps-kills   vmm/gpu-poll wait/consumer killed (MPS): 3 trials: no hang"), "{list}");
        assert!(
            list.contains("mps-kills   legacy/persistent kernel/producer killed (MPS): 3 trials: no hang"),
            "{list}"
        );
        let five = list_cells(&parse(&["mps-kills", "--backend", "vmm", "--trials", "5", "--list"]));
        assert!(five.contains("vmm/frame graphs/producer killed (no MPS): 5 trials: no hang"), "{five}");
        assert!(!five.contains("legacy/"), "{five}");
        assert!(Cli::try_parse_from(["stress", "mps-kills", "--trials", "0"]).is_err());
        assert_eq!(main(&parse(&["soak", "--list"])), 0);
    }

    #[test]
    fn a_pass_without_mps_fails_unless_allowed() {
        let pass = KillPass {
            mps: true,
            status: Status::NotRun,
            note: "no daemon".into(),
            mps_restarts: 0,
            seconds: 0.0,
            cells: vec![],
            trials: vec![],
        };
        assert_eq!(pass_checks(&pass, false)[0].status, Status::Failed);
        assert_eq!(pass_checks(&pass, true)[0].status, Status::NotRun);
    }

    #[test]
    fn missing_programs_are_a_usage_error_that_says_what_to_do() {
        let args = parse(&["all", "--bin-dir", "/nonexistent-gpu-ipc"]);
        assert_eq!(main(&args), 2);
        let e = procs::Bins::find(Some(std::path::Path::new("/nonexistent-gpu-ipc"))).unwrap_err();
        assert!(e.contains("--bin-dir") && e.contains("producer"), "{e}");
    }
}
