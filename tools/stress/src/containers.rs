//! The `containers` part: every ring strategy and every toolkit primitive with its client in an isolated container,
//! per backend. "Container" means what Docker's defaults give a process, made with `unshare` (root): its own PID,
//! IPC, network and mount namespaces, `/proc` mounted for its PID namespace, and a private tmpfs on `/dev/shm`
//! ([`Isolation`]). The producer (or owner) runs here, outside; the socket is a path both see, as a shared volume
//! would be.
//!
//! Ring cells ([`ring_syncs`], and under MPS `gpu-poll`): a producer of [`CONTAINER_FRAMES`] frames waits for one
//! consumer, which runs in the container and must verify every frame with 0 mismatched words; the producer must then
//! finish within [`PRODUCER_AFTER`] (else it was left waiting: a failure). The `ipc-event` cell has the same
//! expectation, stated in its name: it passes only when the consumer reads every frame intact (a fallback that waits
//! on the control block when `cuIpcOpenEventHandle` fails with `CUDA_ERROR_MAP_FAILED` in another IPC namespace); a
//! raw CUDA error, any nonzero exit (a refusal included) or a producer left waiting fails it. Under MPS the `gpu-poll`
//! cell's container keeps the host's IPC namespace and `/dev/shm` ([`Ipc::Host`], Docker's `--ipc=host`: MPS clients
//! need it, and without it they fail to connect, crash or hang); its own PID, network and mount namespaces stay. A
//! client there that fails before its first frame with an MPS or CUDA error, or a signal, is a *finding*, not a
//! failure.
//!
//! Toolkit cells ([`TOOLKIT`]): the pool's importer, the semaphore's poster and waiter (stream waits on a GPU
//! backend), a work-queue worker (popping from a kernel on a GPU backend) and the pipeline's middle stage each run in
//! a container against an owner (or stages) outside; every one must end with status 0 and its figures add up.
//!
//! `--backend host` runs the CPU cells without a GPU (the harness's own check); cells that need a GPU say so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_ipc::core::wire::SyncStrategy;
use serde::Serialize;

use super::outcome::{Check, ProcEnd, Status, looks_like_mps_fault};
use super::procs::{Child, args, finish_all, socket_path};
use super::run::{Ctx, START_LIMIT};

/// Frames each ring cell's consumer must verify.
pub const CONTAINER_FRAMES: u64 = 200;
/// The ring strategies of the part (without MPS; under MPS `gpu-poll` too).
pub fn ring_syncs() -> impl Iterator<Item = &'static str> {
    super::schedule::strategies(false)
}
/// The toolkit primitives of the part.
pub const TOOLKIT: [&str; 4] = ["pool", "semaphore", "work-queue", "pipeline"];
/// How long a client in a container may take, start-up included, before it counts as hung (each cell's work takes
/// a second or two on a GPU; a hang costs no more than this).
pub const CLIENT_LIMIT: Duration = Duration::from_secs(30);
/// How long after its consumer ended a producer (or owner) may take to finish before it counts as left waiting.
pub const PRODUCER_AFTER: Duration = Duration::from_secs(10);
/// The shell line run inside the namespaces: a private tmpfs on /dev/shm, then the program.
const INSIDE: &str = "mount -t tmpfs -o mode=1777,size=64m gpu-ipc-shm /dev/shm && exec \"$0\" \"$@\"";
/// The same with the host's IPC namespace: the host's /dev/shm stays.
const INSIDE_HOST_IPC: &str = "exec \"$0\" \"$@\"";

/// A container's IPC namespace and `/dev/shm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ipc {
    /// Its own, with a private tmpfs on `/dev/shm` (Docker's default).
    Private,
    /// The host's, and the host's `/dev/shm` (Docker's `--ipc=host`, which MPS clients need).
    Host,
}
/// Posts the semaphore cell makes and takes.
const SEMAPHORE_POSTS: u64 = 200;
/// Tasks of the work-queue cell.
const QUEUE_TASKS: u64 = 20_000;
/// Frames of the pipeline cell.
const PIPELINE_FRAMES: u64 = 300;

/// How a process is put in a container: `unshare --pid --fork --mount-proc --ipc --net --mount` and a private
/// tmpfs on `/dev/shm`.
#[derive(Debug, Clone)]
pub struct Isolation {
    unshare: PathBuf,
}

/// The namespace flags of [`Isolation`].
pub const UNSHARE_FLAGS: [&str; 7] =
    ["--pid", "--fork", "--mount-proc", "--ipc", "--net", "--mount", "--propagation=private"];

impl Isolation {
    /// `unshare` from `PATH`, checked once: inside, the shell is pid 1, its IPC, network and mount namespaces are not
    /// ours, and `/dev/shm` is empty. Returns it and what the check saw.
    ///
    /// # Errors
    /// Why containers cannot be made here (not root, no `unshare`, the check's output).
    pub fn find() -> Result<(Self, String), String> {
        if !rustix::process::geteuid().is_root() {
            return Err("needs root (unshare of PID, IPC, network and mount namespaces)".into());
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let unshare = harness::mps::find_on_path("unshare", &path).ok_or("no `unshare` on PATH")?;
        let iso = Self { unshare };
        let probe = "echo pid=$$; for n in ipc net mnt; do readlink /proc/self/ns/$n; done; ls -A /dev/shm | wc -l";
        let out = iso
            .command(Path::new("/bin/sh"), &args(&["-c", probe]))
            .output()
            .map_err(|e| format!("cannot run unshare: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let ours: Vec<String> = ["ipc", "net", "mnt"]
            .iter()
            .map(|n| {
                std::fs::read_link(format!("/proc/self/ns/{n}")).map(|p| p.display().to_string()).unwrap_or_default()
            })
            .collect();
        let seen = proof(&text, &ours).map_err(|why| {
            format!("{why} (stdout {:?}, stderr {:?})", text.trim(), String::from_utf8_lossy(&out.stderr).trim())
        })?;
        Ok((iso, seen))
    }

    /// `program args` in a fresh container (its own IPC namespace and `/dev/shm`).
    pub fn command(&self, program: &Path, program_args: &[String]) -> Command {
        self.command_with(Ipc::Private, program, program_args)
    }

    /// `program args` in a fresh container with `ipc`.
    pub fn command_with(&self, ipc: Ipc, program: &Path, program_args: &[String]) -> Command {
        let mut c = Command::new(&self.unshare);
        match ipc {
            Ipc::Private => c.args(UNSHARE_FLAGS).args(["/bin/sh", "-c", INSIDE]),
            Ipc::Host => {
                c.args(UNSHARE_FLAGS.iter().filter(|f| **f != "--ipc")).args(["/bin/sh", "-c", INSIDE_HOST_IPC])
            }
        };
        c.arg(program).args(program_args);
        c
    }
}

/// Checks the probe's output (`pid=1`, three namespace links, the count of entries in /dev/shm) against our
/// namespaces `ours` (ipc, net, mnt): what was seen, in words, or what is wrong.
pub fn proof(stdout: &str, ours: &[String]) -> Result<String, String> {
    let lines: Vec<&str> = stdout.lines().map(str::trim).collect();
    let [pid, ipc, net, mnt, shm] = lines.as_slice() else {
        return Err("the container's probe printed something else".into());
    };
    if *pid != "pid=1" {
        return Err(format!("inside, the shell was {pid}, not pid 1"));
    }
    for (name, (inside, outside)) in ["ipc", "net", "mnt"].iter().zip([ipc, net, mnt].iter().zip(ours)) {
        if inside.is_empty() || *inside == outside {
            return Err(format!("the {name} namespace inside ({inside}) is not a new one (ours: {outside})"));
        }
    }
    if *shm != "0" {
        return Err(format!("/dev/shm inside is not empty ({shm} entries)"));
    }
    Ok(format!("inside: pid 1, {ipc}, {net}, {mnt} (ours: {}), an empty private /dev/shm", ours.join(", ")))
}

/// One cell of the part.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerRun {
    /// `ring` or the primitive (`pool`, `semaphore`, `work-queue`, `pipeline`).
    pub what: String,
    /// Backend.
    pub backend: String,
    /// Sync strategy (ring and pipeline cells).
    pub sync: Option<String>,
    /// Under a private MPS daemon.
    pub mps: bool,
    /// The container's IPC namespace and `/dev/shm`: private, or the host's (MPS cells).
    pub ipc: Ipc,
    /// What must happen for it to pass, in words.
    pub expectation: String,
    /// Frames (or posts, tasks, buffers) the client in the container verified.
    pub verified: u64,
    /// Mismatched words (or bad records) it counted.
    pub mismatched_words: u64,
    /// Seconds the cell took.
    pub seconds: f64,
    /// The verdict.
    pub status: Status,
    /// What was seen.
    pub detail: String,
}

impl ContainerRun {
    fn new(what: &str, backend: &str, sync: Option<&str>, mps: bool) -> Self {
        Self {
            what: what.to_owned(),
            backend: backend.to_owned(),
            sync: sync.map(str::to_owned),
            mps,
            ipc: if mps { Ipc::Host } else { Ipc::Private },
            expectation: expectation(what, sync),
            verified: 0,
            mismatched_words: 0,
            seconds: 0.0,
            status: Status::NotRun,
            detail: String::new(),
        }
    }

    /// Its name in checks and tables, e.g. `vmm/ipc-event ring (MPS)`.
    pub fn name(&self) -> String {
        let mode = if self.mps { " (MPS, host IPC)" } else { "" };
        match &self.sync {
            Some(sync) => format!("{}/{sync} {}{mode}", self.backend, self.what),
            None => format!("{}/{}{mode}", self.backend, self.what),
        }
    }

    /// Its check.
    pub fn check(&self) -> Check {
        Check::new("containers", format!("{}: {}", self.name(), self.expectation), self.status, self.detail.clone())
    }
}

/// What a cell must do to pass, in words.
pub fn expectation(what: &str, sync: Option<&str>) -> String {
    match (what, sync) {
        ("ring", Some("ipc-event")) => format!(
            "a consumer in a container verifies all {CONTAINER_FRAMES} frames (the fallback when \
             cuIpcOpenEventHandle fails with CUDA_ERROR_MAP_FAILED) and the producer finishes; a raw CUDA error, a \
             nonzero exit or a producer left waiting fails"
        ),
        ("ring", Some("gpu-poll")) => format!(
            "a consumer in a container with the host's IPC namespace and /dev/shm (docker --ipc=host, as MPS needs) \
             verifies all {CONTAINER_FRAMES} frames under MPS (an MPS client that cannot start there is a finding)"
        ),
        ("ring", _) => {
            format!("a consumer in a container verifies all {CONTAINER_FRAMES} frames, the producer finishes")
        }
        ("pool", _) => "an importer in a container attaches and checks every buffer in place".to_owned(),
        ("semaphore", _) => format!(
            "a poster and a waiter in two containers move {SEMAPHORE_POSTS} posts (stream waits on a GPU backend)"
        ),
        ("work-queue", _) => format!(
            "a worker in a container pops all {QUEUE_TASKS} tasks (from a kernel on a GPU backend) and they add up"
        ),
        ("pipeline", _) => format!(
            "the middle stage in a container XORs {PIPELINE_FRAMES} frames from a ring outside into one read outside, \
             every word checked"
        ),
        _ => String::new(),
    }
}

/// The cells of the part, as runs not yet run: per backend, the ring strategies then the toolkit; under MPS (when
/// `mps`) `gpu-poll` per backend.
pub fn cells(backends: &[&str], mps: bool) -> Vec<ContainerRun> {
    let mut cells = Vec::new();
    for &backend in backends {
        cells.extend(ring_syncs().map(|s| ContainerRun::new("ring", backend, Some(s), false)));
        for what in TOOLKIT {
            let sync = (what == "pipeline").then(|| pipeline_sync(backend));
            cells.push(ContainerRun::new(what, backend, sync, false));
        }
    }
    if mps {
        for sync in super::schedule::strategies(true) {
            cells.extend(backends.iter().map(|&b| ContainerRun::new("ring", b, Some(sync), true)));
        }
    }
    cells
}

fn pipeline_sync(backend: &str) -> &'static str {
    backend.parse().map_or(SyncStrategy::DEFAULT, SyncStrategy::default_for).name()
}

/// Why a cell cannot run on `backend`, or `None`.
pub fn needs_gpu(backend: &str, sync: Option<&str>) -> Option<String> {
    let gpu_sync = sync.is_some_and(|s| !matches!(s.parse::<SyncStrategy>(), Ok(s) if !s.needs_cuda()));
    (backend == "host" && gpu_sync).then(|| format!("{} needs a GPU backend (legacy or vmm)", sync.unwrap_or_default()))
}

/// Runs `cell` (one of [`cells`]) with `iso` (the containers) and `ctx` (its env: MPS client variables for MPS cells).
pub fn run_cell(ctx: &Ctx, iso: &Isolation, mut cell: ContainerRun) -> ContainerRun {
    if let Some(why) = needs_gpu(&cell.backend, cell.sync.as_deref()) {
        cell.detail = why;
        return cell;
    }
    let started = Instant::now();
    let result = match cell.what.as_str() {
        "ring" => ring(ctx, iso, &mut cell),
        "pool" => pool(ctx, iso, &mut cell),
        "semaphore" => semaphore(ctx, iso, &mut cell),
        "work-queue" => work_queue(ctx, iso, &mut cell),
        "pipeline" => pipeline(ctx, iso, &mut cell),
        other => Err(format!("no such cell: {other}")),
    };
    cell.seconds = started.elapsed().as_secs_f64();
    match result {
        Ok((status, detail)) => (cell.status, cell.detail) = (status, detail),
        Err(e) => (cell.status, cell.detail) = (Status::Failed, e),
    }
    cell
}

/// A child in a container.
fn boxed(ctx: &Ctx, iso: &Isolation, name: &str, program: &Path, a: &[String]) -> Result<Child, String> {
    Child::spawn_command(&format!("{name} (container)"), &mut iso.command(program, a), &ctx.env)
}

/// A verdict.
type Verdict = (Status, String);

fn ring(ctx: &Ctx, iso: &Isolation, cell: &mut ContainerRun) -> Result<Verdict, String> {
    let sync = cell.sync.clone().unwrap_or_default();
    let socket = socket_path("box");
    let n = CONTAINER_FRAMES.to_string();
    let mut producer = ctx.producer(
        &socket,
        &cell.backend,
        &sync,
        &["--slots", "4", "--consumers", "1", "--frames", &n, "--progress-every", "50"],
    )?;
    if let Err(e) = producer.wait_line(|l| l.contains("waiting for"), Instant::now() + START_LIMIT) {
        let end = producer.finish(Instant::now() + Duration::from_secs(5));
        let _ = std::fs::remove_file(&socket);
        return Err(format!("the producer did not start: {e}; {}", end.describe()));
    }
    let consumer_args =
        Ctx::consumer_args(&socket, &cell.backend, "boxed", &["--frames", &n, "--progress-every", "50"]);
    let mut command = iso.command_with(cell.ipc, &ctx.bins.consumer, &consumer_args);
    let consumer = match Child::spawn_command("consumer (container)", &mut command, &ctx.env) {
        Ok(c) => c.finish(Instant::now() + CLIENT_LIMIT),
        Err(e) => ProcEnd { name: "consumer (container)".into(), stderr_tail: e, ..ProcEnd::default() },
    };
    let producer = producer.finish(Instant::now() + PRODUCER_AFTER);
    let _ = std::fs::remove_file(&socket);
    cell.verified = consumer.count("frames").unwrap_or(0);
    cell.mismatched_words = consumer.count("mismatched_words").unwrap_or(0);
    Ok(judge_ring(&sync, cell.mps, &consumer, &producer, CONTAINER_FRAMES))
}

/// The verdict of a ring cell of `sync` (under MPS when `mps`): the consumer in the container must have verified all
/// `frames` with 0 mismatched words and exited 0, the producer must have made them all and ended 0 (not hung:
/// left waiting). Under MPS, a gpu-poll consumer that failed before its first frame with an MPS or CUDA error, or
/// was ended by a signal, is a finding.
pub fn judge_ring(sync: &str, mps: bool, consumer: &ProcEnd, producer: &ProcEnd, frames: u64) -> Verdict {
    let (read, words) = (consumer.count("frames").unwrap_or(0), consumer.count("mismatched_words").unwrap_or(0));
    let seen =
        format!("{}; {}; {read} frames verified, {words} mismatched words", consumer.describe(), producer.describe());
    if consumer.hung {
        return (Status::Failed, format!("the consumer hung: {seen}"));
    }
    let consumer_ok = consumer.exit == Some(0) && read == frames && words == 0;
    if !consumer_ok {
        let raw = consumer.stderr_tail.contains("CUDA_ERROR");
        let crashed = consumer.exit.is_none();
        if mps && sync == "gpu-poll" && read == 0 && (raw || crashed || looks_like_mps_fault(&consumer.stderr_tail)) {
            return (Status::Finding, format!("an MPS client in a container could not start: {seen}"));
        }
        let why = if raw { "a raw CUDA error" } else { "the consumer did not verify every frame" };
        return (Status::Failed, format!("{why}: {seen}"));
    }
    if producer.hung {
        return (Status::Failed, format!("the producer was left waiting: {seen}"));
    }
    if producer.exit != Some(0) || producer.count("frames") != Some(frames) {
        return (Status::Failed, format!("the producer did not finish its {frames} frames: {seen}"));
    }
    (Status::Passed, seen)
}

/// Options the toolkit programs share: the backend and `--json` (their own names).
fn tool_common(backend: &str) -> Vec<String> {
    args(&["--backend", backend, "--json"])
}

/// Starts a toolkit owner (outside the container) and waits for the line with `marker` that says it serves; if it
/// does not come, the owner is stopped and the error says what it printed.
fn start_owner(
    ctx: &Ctx,
    label: &str,
    what: &str,
    program: &std::path::Path,
    owner_args: &[String],
    marker: &str,
) -> Result<Child, String> {
    let mut owner = Child::spawn(label, program, owner_args, &ctx.env)?;
    if let Err(e) = owner.wait_line(|l| l.contains(marker), Instant::now() + START_LIMIT) {
        let end = owner.finish(Instant::now() + Duration::from_secs(5));
        return Err(format!("{what} did not start: {e}; {}", end.describe()));
    }
    Ok(owner)
}

fn pool(ctx: &Ctx, iso: &Isolation, cell: &mut ContainerRun) -> Result<Verdict, String> {
    let program = ctx.bins.tool("pool")?;
    let socket = socket_path("box-pool");
    let s = socket.display().to_string();
    let mut owner_args =
        args(&["owner", "--socket", &s, "--capacity-mib", "64", "--buffers", "8", "--hold-secs", "120"]);
    owner_args.extend(tool_common(&cell.backend));
    let mut owner = start_owner(ctx, "pool owner", "the pool owner", &program, &owner_args, "READY")?;
    let mut importer_args = args(&["importer", "--socket", &s, "--attaches", "3", "--rounds", "100"]);
    importer_args.extend(tool_common(&cell.backend));
    let importer = match boxed(ctx, iso, "pool importer", &program, &importer_args) {
        Ok(i) => i.finish(Instant::now() + CLIENT_LIMIT),
        Err(e) => {
            let _ = owner.finish(Instant::now());
            return Err(e);
        }
    };
    owner.close_stdin();
    let owner = owner.finish(Instant::now() + PRODUCER_AFTER);
    let _ = std::fs::remove_file(&socket);
    let (buffers, verified) = (importer.count("buffers").unwrap_or(0), importer.count("verified").unwrap_or(0));
    cell.verified = verified;
    cell.mismatched_words = importer.count("mismatched_words").unwrap_or(0);
    let ok = importer.exit == Some(0)
        && owner.exit == Some(0)
        && buffers > 0
        && verified == buffers
        && cell.mismatched_words == 0;
    let detail = format!(
        "{}; {}; {verified} of {buffers} buffers verified, {} mismatched words",
        importer.describe(),
        owner.describe(),
        cell.mismatched_words
    );
    Ok((if ok { Status::Passed } else { Status::Failed }, detail))
}

fn semaphore(ctx: &Ctx, iso: &Isolation, cell: &mut ContainerRun) -> Result<Verdict, String> {
    let program = ctx.bins.tool("semaphore")?;
    let socket = socket_path("box-sem");
    let s = socket.display().to_string();
    let posts = SEMAPHORE_POSTS.to_string();
    let mut owner_args = args(&["owner", "--socket", &s]);
    owner_args.extend(tool_common(&cell.backend));
    let mut owner = start_owner(ctx, "semaphore owner", "the semaphore owner", &program, &owner_args, "ready at")?;
    let gpu = cell.backend != "host";
    let mut wait_args = args(&["wait", "--socket", &s, "--count", &posts, "--timeout-ms", "20000"]);
    let mut post_args = args(&["post", "--socket", &s, "--count", &posts]);
    if gpu {
        wait_args.push("--stream".into());
        post_args.push("--stream".into());
    }
    wait_args.extend(tool_common(&cell.backend));
    post_args.extend(tool_common(&cell.backend));
    let spawned = boxed(ctx, iso, "semaphore wait", &program, &wait_args)
        .and_then(|w| Ok((w, boxed(ctx, iso, "semaphore post", &program, &post_args)?)));
    let ends = match spawned {
        Ok((w, p)) => finish_all(vec![w, p], Instant::now() + CLIENT_LIMIT, None),
        Err(e) => {
            let _ = owner.finish(Instant::now());
            return Err(e);
        }
    };
    owner.close_stdin();
    let owner = owner.finish(Instant::now() + PRODUCER_AFTER);
    let _ = std::fs::remove_file(&socket);
    let (waiter, poster) = (&ends[0], &ends[1]);
    let (taken, posted) = (waiter.count("count").unwrap_or(0), poster.count("count").unwrap_or(0));
    cell.verified = taken;
    let ok = waiter.exit == Some(0)
        && poster.exit == Some(0)
        && owner.exit == Some(0)
        && taken == SEMAPHORE_POSTS
        && posted == SEMAPHORE_POSTS;
    let detail = format!(
        "{}; {}; {}; {posted} posted, {taken} taken{}",
        waiter.describe(),
        poster.describe(),
        owner.describe(),
        if gpu { " (on CUDA streams)" } else { "" }
    );
    Ok((if ok { Status::Passed } else { Status::Failed }, detail))
}

fn work_queue(ctx: &Ctx, iso: &Isolation, cell: &mut ContainerRun) -> Result<Verdict, String> {
    let program = ctx.bins.tool("work_queue")?;
    let socket = socket_path("box-queue");
    let s = socket.display().to_string();
    let tasks = QUEUE_TASKS.to_string();
    let mut owner_args = args(&["owner", "--socket", &s, "--tasks", &tasks, "--workers", "1"]);
    owner_args.extend(tool_common(&cell.backend));
    let owner = start_owner(ctx, "work_queue owner", "the work-queue owner", &program, &owner_args, "serving")?;
    let pop = if cell.backend == "host" { "cpu" } else { "kernel" };
    let mut worker_args = args(&["worker", "--socket", &s, "--name", "boxed", "--pop", pop]);
    worker_args.extend(tool_common(&cell.backend));
    let worker = match boxed(ctx, iso, "work_queue worker", &program, &worker_args) {
        Ok(w) => w.finish(Instant::now() + CLIENT_LIMIT),
        Err(e) => {
            let _ = owner.finish(Instant::now());
            return Err(e);
        }
    };
    let owner = owner.finish(Instant::now() + PRODUCER_AFTER);
    let _ = std::fs::remove_file(&socket);
    let bad = worker.count("bad_records").unwrap_or(0);
    cell.mismatched_words = bad;
    cell.verified =
        worker.summary.as_ref().and_then(|s| s.pointer("/sums/count")).and_then(|v| v.as_u64()).unwrap_or(0);
    // The owner exits 0 only when the completed tasks add up to those pushed.
    let ok = worker.exit == Some(0) && owner.exit == Some(0) && bad == 0 && cell.verified == QUEUE_TASKS;
    let detail = format!(
        "{}; {}; {} tasks popped from {}, {bad} bad records",
        worker.describe(),
        owner.describe(),
        cell.verified,
        if pop == "kernel" { "a kernel" } else { "the CPU" }
    );
    Ok((if ok { Status::Passed } else { Status::Failed }, detail))
}

fn pipeline(ctx: &Ctx, iso: &Isolation, cell: &mut ContainerRun) -> Result<Verdict, String> {
    let program = ctx.bins.tool("pipeline")?;
    let sync = cell.sync.clone().unwrap_or_default();
    let (a, b) = (socket_path("box-a"), socket_path("box-b"));
    let (a_s, b_s) = (a.display().to_string(), b.display().to_string());
    let (w, h, n) = (ctx.width.to_string(), ctx.height.to_string(), PIPELINE_FRAMES.to_string());
    let ring = args(&["--sync", &sync, "--slots", "2", "--width", &w, "--height", &h]);
    let mut gen_args = args(&["generate", "--socket", &a_s, "--frames", &n]);
    gen_args.extend(ring.iter().cloned());
    gen_args.extend(tool_common(&cell.backend));
    let mut stage_args = args(&["transform", "--upstream", &a_s, "--socket", &b_s]);
    stage_args.extend(ring);
    stage_args.extend(tool_common(&cell.backend));
    let mut verify_args = args(&["verify", "--socket", &b_s, "--name", "verify"]);
    verify_args.extend(tool_common(&cell.backend));
    let mut children = Vec::new();
    let spawned = (|| -> Result<(), String> {
        children.push(Child::spawn("pipeline generate", &program, &gen_args, &ctx.env)?);
        children.push(boxed(ctx, iso, "pipeline transform", &program, &stage_args)?);
        children.push(Child::spawn("pipeline verify", &program, &verify_args, &ctx.env)?);
        Ok(())
    })();
    if let Err(e) = spawned {
        let _ = finish_all(children, Instant::now(), None);
        return Err(e);
    }
    let ends = finish_all(children, Instant::now() + CLIENT_LIMIT, None);
    let _ = (std::fs::remove_file(&a), std::fs::remove_file(&b));
    let verify = &ends[2];
    let (frames, words) = (verify.count("frames").unwrap_or(0), verify.count("mismatched_words").unwrap_or(0));
    let out_of_order = verify.count("out_of_order").unwrap_or(0);
    cell.verified = frames;
    cell.mismatched_words = words;
    let ok = ends.iter().all(|e| e.exit == Some(0)) && frames == PIPELINE_FRAMES && words == 0 && out_of_order == 0;
    let detail = format!(
        "{}; {frames} frames verified after the stage, {words} mismatched words, {out_of_order} out of order",
        ends.iter().map(ProcEnd::describe).collect::<Vec<_>>().join("; ")
    );
    Ok((if ok { Status::Passed } else { Status::Failed }, detail))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn end(name: &str, exit: Option<i32>, summary: serde_json::Value, stderr: &str) -> ProcEnd {
        ProcEnd { name: name.into(), exit, summary: Some(summary), stderr_tail: stderr.into(), ..ProcEnd::default() }
    }

    fn producer_done() -> ProcEnd {
        end("producer", Some(0), serde_json::json!({"frames": 200}), "")
    }

    #[test]
    fn the_probe_must_show_new_namespaces_pid_1_and_an_empty_shm() {
        let ours = vec!["ipc:[1]".to_owned(), "net:[2]".to_owned(), "mnt:[3]".to_owned()];
        let good = "pid=1\nipc:[10]\nnet:[20]\nmnt:[30]\n0\n";
        assert!(proof(good, &ours).unwrap().contains("pid 1, ipc:[10]"));
        assert!(proof("pid=7\nipc:[10]\nnet:[20]\nmnt:[30]\n0\n", &ours).unwrap_err().contains("pid=7"));
        assert!(proof("pid=1\nipc:[10]\nnet:[2]\nmnt:[30]\n0\n", &ours).unwrap_err().contains("net namespace"));
        assert!(proof("pid=1\nipc:[10]\nnet:[20]\nmnt:[30]\n3\n", &ours).unwrap_err().contains("3 entries"));
        assert!(proof("", &ours).is_err());
    }

    #[test]
    fn the_ipc_event_cell_passes_only_when_every_frame_is_read_and_the_producer_finishes() {
        let read_all = end("consumer", Some(0), serde_json::json!({"frames": 200, "mismatched_words": 0}), "");
        assert_eq!(judge_ring("ipc-event", false, &read_all, &producer_done(), 200).0, Status::Passed);
        // A raw CUDA error.
        let raw = end(
            "consumer",
            Some(1),
            serde_json::json!({}),
            "consumer: cuIpcOpenEventHandle failed: CUDA_ERROR_MAP_FAILED (205)",
        );
        let left_waiting = ProcEnd { hung: true, exit: None, ..producer_done() };
        let (s, d) = judge_ring("ipc-event", false, &raw, &left_waiting, 200);
        assert_eq!(s, Status::Failed);
        assert!(d.starts_with("a raw CUDA error"), "{d}");
        // A refusal with a named cause is a nonzero exit: it fails too.
        let refused = end("consumer", Some(1), serde_json::json!({}), "consumer: refused: ipc events unavailable");
        assert_eq!(judge_ring("ipc-event", false, &refused, &producer_done(), 200).0, Status::Failed);
        // Every frame read, but the producer was left waiting.
        let (s, d) = judge_ring("ipc-event", false, &read_all, &left_waiting, 200);
        assert_eq!(s, Status::Failed);
        assert!(d.starts_with("the producer was left waiting"), "{d}");
        // Short or mismatched.
        let short = end("consumer", Some(0), serde_json::json!({"frames": 150, "mismatched_words": 0}), "");
        assert_eq!(judge_ring("cpu-spin", false, &short, &producer_done(), 200).0, Status::Failed);
        let bad = end("consumer", Some(1), serde_json::json!({"frames": 200, "mismatched_words": 4}), "");
        assert_eq!(judge_ring("cpu-spin", false, &bad, &producer_done(), 200).0, Status::Failed);
    }

    #[test]
    fn an_mps_client_that_cannot_start_in_its_ipc_namespace_is_a_finding_only_for_gpu_poll_under_mps() {
        let refused = end(
            "consumer",
            Some(1),
            serde_json::json!({}),
            "consumer: cuInit failed: CUDA_ERROR_MPS_CONNECTION_FAILED (805)",
        );
        let waiting = ProcEnd { hung: true, exit: None, ..producer_done() };
        assert_eq!(judge_ring("gpu-poll", true, &refused, &waiting, 200).0, Status::Finding);
        assert_eq!(judge_ring("gpu-stream-ops", true, &refused, &waiting, 200).0, Status::Failed);
        assert_eq!(judge_ring("gpu-poll", false, &refused, &waiting, 200).0, Status::Failed);
        let crashed = ProcEnd { exit: None, ..end("consumer", None, serde_json::json!({}), "") };
        assert_eq!(judge_ring("gpu-poll", true, &crashed, &waiting, 200).0, Status::Finding);
    }

    #[test]
    fn cells_cover_every_strategy_and_primitive_per_backend_and_gpu_poll_under_mps() {
        let all = cells(&["legacy", "vmm"], true);
        assert_eq!(all.len(), 2 * (4 + 4) + 2);
        let names: Vec<String> = all.iter().map(ContainerRun::name).collect();
        for want in [
            "legacy/cpu-spin ring",
            "legacy/cpu-sleep ring",
            "legacy/ipc-event ring",
            "vmm/gpu-stream-ops ring",
            "vmm/pool",
            "vmm/semaphore",
            "vmm/work-queue",
            "vmm/gpu-stream-ops pipeline",
            "legacy/gpu-poll ring (MPS, host IPC)",
            "vmm/gpu-poll ring (MPS, host IPC)",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        assert_eq!(cells(&["vmm"], false).len(), 8);
        assert!(all.iter().all(|c| !c.expectation.is_empty()));
        let event = all.iter().find(|c| c.name() == "vmm/ipc-event ring").unwrap();
        assert!(event.expectation.contains("raw CUDA error") && event.expectation.contains("left waiting"));
    }

    #[test]
    fn the_host_backend_runs_only_the_cpu_cells() {
        assert_eq!(needs_gpu("host", Some("cpu-spin")), None);
        assert_eq!(needs_gpu("host", None), None);
        assert!(needs_gpu("host", Some("ipc-event")).unwrap().contains("GPU backend"));
        assert_eq!(needs_gpu("vmm", Some("gpu-stream-ops")), None);
        assert_eq!(pipeline_sync("host"), "cpu-spin");
    }

    #[test]
    fn a_container_command_unshares_every_namespace_and_mounts_a_private_shm() {
        let iso = Isolation { unshare: PathBuf::from("/usr/bin/unshare") };
        let c = iso.command(Path::new("/bin/consumer"), &args(&["--frames", "5"]));
        let a: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        for flag in ["--pid", "--fork", "--mount-proc", "--ipc", "--net", "--mount"] {
            assert!(a.iter().any(|x| x == flag), "{flag} missing in {a:?}");
        }
        assert!(a.iter().any(|x| x.contains("tmpfs") && x.contains("/dev/shm")));
        assert_eq!(&a[a.len() - 3..], ["/bin/consumer", "--frames", "5"]);
        // MPS cells keep the host's IPC namespace and /dev/shm (docker --ipc=host).
        let c = iso.command_with(Ipc::Host, Path::new("/bin/consumer"), &args(&["--frames", "5"]));
        let a: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(!a.iter().any(|x| x == "--ipc" || x.contains("/dev/shm")), "{a:?}");
        assert!(a.iter().any(|x| x == "--net") && a.iter().any(|x| x == "--pid"));
        assert_eq!(cells(&["vmm"], true).last().unwrap().ipc, Ipc::Host);
    }
}
