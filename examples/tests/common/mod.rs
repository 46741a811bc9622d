//! What the example programs' process tests share: finding the binaries, a child process with its stderr lines
//! and JSON summary, and the producer, consumer and pipeline stages' command lines.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The GPU backends every GPU test runs.
pub const BACKENDS: [&str; 2] = ["legacy", "vmm"];
/// The strategies whose waits run on the GPU (their frames carry a stamp; persistent kernels need one of them), as
/// the strategy's descriptor says.
pub fn gpu_side() -> impl Iterator<Item = &'static str> {
    gpu_ipc::core::wire::SyncStrategy::ALL.into_iter().filter(|s| s.is_gpu_side()).map(|s| s.name())
}

/// The strategies that run without MPS, as the strategy's descriptor says.
pub fn without_mps() -> impl Iterator<Item = &'static str> {
    gpu_ipc::core::wire::SyncStrategy::ALL.into_iter().filter(|s| !s.traits().needs_mps).map(|s| s.name())
}

/// Fails the test, saying why, unless MPS runs for device 0 as the strategies judge it (`MpsEvidence`). The gpu-poll,
/// persistent-kernel and frame-graph cases call it first: they sit in `under_mps` modules marked
/// `#[ignore = "needs a CUDA GPU with MPS running ..."]`, which the MPS pass of scripts/gpu-suite.sh runs under its
/// private daemon (and its pass without MPS leaves out); asked for without MPS, such a test fails, never passes.
pub fn require_mps() {
    let ctx = gpu_ipc::driver::Context::for_ordinal(0).expect("a CUDA device");
    if let Some(why) = gpu_ipc::driver::mps::MpsEvidence::gather(ctx.device()).why_not() {
        panic!(
            "this test needs MPS running for device 0 and it is not: {why}; run it in the MPS pass of \
             scripts/gpu-suite.sh (a private MPS daemon), or start nvidia-cuda-mps-control -d first"
        );
    }
}

pub fn exe(name: &str) -> PathBuf {
    // nextest sets NEXTEST_BIN_EXE_* when it replays an archive on another machine.
    std::env::var_os(format!("NEXTEST_BIN_EXE_{name}")).map_or_else(
        || {
            PathBuf::from(match name {
                "producer" => env!("CARGO_BIN_EXE_producer"),
                "pipeline" => env!("CARGO_BIN_EXE_pipeline"),
                "semaphore" => env!("CARGO_BIN_EXE_semaphore"),
                "pool" => env!("CARGO_BIN_EXE_pool"),
                "work_queue" => env!("CARGO_BIN_EXE_work_queue"),
                "weights" => env!("CARGO_BIN_EXE_weights"),
                _ => env!("CARGO_BIN_EXE_consumer"),
            })
        },
        PathBuf::from,
    )
}

/// Appends `result` as one JSON line to `<prefix>-<GPU_IPC_RESULTS_TAG>.jsonl` in `GPU_IPC_RESULTS_DIR`, when set
/// (how the GPU suite keeps the figures of its runs).
pub fn record(prefix: &str, result: &serde_json::Value) {
    use std::io::Write;
    let Some(dir) = std::env::var_os("GPU_IPC_RESULTS_DIR") else { return };
    let tag = std::env::var("GPU_IPC_RESULTS_TAG").unwrap_or_else(|_| "default".into());
    let path = PathBuf::from(dir).join(format!("{prefix}-{tag}.jsonl"));
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    writeln!(file, "{result}").unwrap();
}

pub fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-test-{}-{tag}.sock", std::process::id()))
}

/// Removes a socket file when dropped, even when the test fails: a SIGKILLed owner cannot unlink its own socket,
/// and the kill tests would otherwise leave one in the temporary directory per run.
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A child process whose stderr lines arrive on a channel and whose stdout is kept for its JSON summary.
pub struct Proc {
    child: Child,
    /// The child's stdin, open until [`Proc::close_stdin`] (programs that serve until stdin closes).
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    name: String,
}

impl Proc {
    pub fn spawn(name: &str, program: PathBuf, args: &[String]) -> Self {
        Self::spawn_env(name, program, args, &[])
    }

    /// As [`Proc::spawn`], with these variables added to the child's environment.
    pub fn spawn_env(name: &str, program: PathBuf, args: &[String], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let tag = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{tag}] {line}");
                let _ = tx.send(line);
            }
        });
        let stdin = child.stdin.take();
        Self { child, stdin, lines, name: name.to_owned() }
    }

    /// Waits for a stderr line containing `needle`.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!("{}: no line containing {needle:?} within {timeout:?}", self.name),
            }
        }
    }

    /// Waits for exit; returns the status, how long it took, and the JSON summary on stdout.
    pub fn finish(mut self, timeout: Duration) -> (ExitStatus, Duration, serde_json::Value) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut out = String::new();
                self.child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
                let json = serde_json::from_str(out.trim()).unwrap_or(serde_json::Value::Null);
                return (status, start.elapsed(), json);
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                panic!("{} did not finish within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Writes `line` to the child's stdin (a program waiting for a go-ahead).
    pub fn write_line(&mut self, line: &str) {
        use std::io::Write;
        if let Some(stdin) = self.stdin.as_mut() {
            writeln!(stdin, "{line}").unwrap();
        }
    }

    /// Closes the child's stdin: a program that serves until stdin closes ends cleanly.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        rustix::process::kill_process(rustix::process::Pid::from_child(&self.child), rustix::process::Signal::KILL)
            .unwrap();
    }
}

/// A producer of `frames` frames (`--slots 2`), waiting for `consumers`; `extra` adds options.
pub fn producer(backend: &str, sync: &str, sock: &Path, frames: u64, consumers: usize) -> Proc {
    producer_with(backend, sync, sock, frames, consumers, &[])
}

/// As [`producer`], with more options.
pub fn producer_with(backend: &str, sync: &str, sock: &Path, frames: u64, consumers: usize, extra: &[&str]) -> Proc {
    producer_on(backend, sync, sock, frames, consumers, 2, extra)
}

/// As [`producer_with`], on a ring of `slots` slots.
pub fn producer_on(
    backend: &str,
    sync: &str,
    sock: &Path,
    frames: u64,
    consumers: usize,
    slots: u32,
    extra: &[&str],
) -> Proc {
    let args = producer_args(backend, sync, sock, frames, consumers, slots, extra);
    Proc::spawn(&format!("producer {backend}/{sync}"), exe("producer"), &args)
}

/// The producer's command line of [`producer_on`].
pub fn producer_args(
    backend: &str,
    sync: &str,
    sock: &Path,
    frames: u64,
    consumers: usize,
    slots: u32,
    extra: &[&str],
) -> Vec<String> {
    let slots = slots.to_string();
    [
        "--socket",
        sock.to_str().unwrap(),
        "--backend",
        backend,
        "--sync",
        sync,
        "--slots",
        &slots,
        "--frames",
        &frames.to_string(),
        "--consumers",
        &consumers.to_string(),
        "--json",
    ]
    .iter()
    .chain(extra)
    .map(ToString::to_string)
    .collect()
}

/// A consumer reading `frames` frames (0: until the end of the stream), reporting every 500 frames.
pub fn consumer(name: &str, backend: &str, sock: &Path, frames: u64) -> Proc {
    consumer_with(name, backend, sock, frames, &[])
}

/// As [`consumer`], with more options.
pub fn consumer_with(name: &str, backend: &str, sock: &Path, frames: u64, extra: &[&str]) -> Proc {
    let args = consumer_args(name, backend, sock, frames, extra);
    Proc::spawn(&format!("consumer {name}"), exe("consumer"), &args)
}

/// The consumer's command line of [`consumer_with`].
pub fn consumer_args(name: &str, backend: &str, sock: &Path, frames: u64, extra: &[&str]) -> Vec<String> {
    [
        "--socket",
        sock.to_str().unwrap(),
        "--backend",
        backend,
        "--frames",
        &frames.to_string(),
        "--name",
        name,
        "--progress-every",
        "500",
        "--json",
    ]
    .iter()
    .chain(extra)
    .map(ToString::to_string)
    .collect()
}

/// One role of the `pipeline` program (`generate`, `transform`, `verify`) with `args`, `--json` added, named `name`
/// in the test's output.
pub fn stage(name: &str, role: &str, args: &[&str]) -> Proc {
    let args: Vec<String> = [role].iter().chain(args).chain(&["--json"]).map(ToString::to_string).collect();
    Proc::spawn(name, exe("pipeline"), &args)
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Stage A of the pipeline: `generate` into ring `a`.
pub fn generate(a: &Path, backend: &str, sync: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--socket", path_str(a), "--backend", backend, "--sync", sync];
    args.extend(extra);
    stage("A generate", "generate", &args)
}

/// Stage B of the pipeline, named `name`: `transform` from ring `a` (backend `backends.0`) into ring `b`
/// (`backends.1`).
pub fn transform(name: &str, a: &Path, b: &Path, backends: (&str, &str), sync: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--upstream", path_str(a), "--upstream-backend", backends.0, "--socket", path_str(b)];
    args.extend(["--backend", backends.1, "--sync", sync]);
    args.extend(extra);
    stage(name, "transform", &args)
}

/// Stage C of the pipeline: `verify` of ring `b`.
pub fn verify(b: &Path, backend: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--socket", path_str(b), "--backend", backend];
    args.extend(extra);
    stage("C verify", "verify", &args)
}

/// A -> B -> C with `backend` and `sync` on both rings (`size` options for A and B), A SIGKILLed once C has read
/// `after` frames: B must exit 4 (its upstream died) and C 4 (its producer ended as a death, not a clean end),
/// each within a second, with no wrong word counted. Returns C's summary.
pub fn first_stage_killed(tag: &str, backend: &str, sync: &str, size: &[&str], after: u64) -> serde_json::Value {
    let (a, b) = (socket(&format!("{tag}-a")), socket(&format!("{tag}-b")));
    let _cleanup = (RemoveOnDrop(a.clone()), RemoveOnDrop(b.clone()));
    let c = verify(&b, backend, &["--first-upstream", "0", "--progress-every", &after.to_string()]);
    let t = transform("B transform", &a, &b, (backend, backend), sync, size);
    let mut g = generate(&a, backend, sync, &[size, &["--frames", "0"]].concat());
    c.wait_for_line(&format!("frame {after}"), Duration::from_secs(120));
    g.kill9();
    let killed = Instant::now();
    // Each exit is seen within a millisecond of happening: the time since the kill bounds how long it took.
    let (ts, _, _) = t.finish(Duration::from_secs(5));
    let t_after = killed.elapsed();
    let (cs, _, cj) = c.finish(Duration::from_secs(5));
    let c_after = killed.elapsed();
    let _ = g.finish(Duration::from_secs(5));
    assert_eq!(ts.code(), Some(4), "{tag}: B, whose upstream died");
    assert_eq!(cs.code(), Some(4), "{tag}: C, whose producer (B) ended as a death, not a clean end: {cj}");
    assert!(cj["producer_gone"].is_string() && cj["end_of_stream_after"].is_null(), "{tag}: {cj}");
    assert_eq!(cj["mismatched_words"], 0, "{tag}: {cj}");
    assert!(
        t_after < Duration::from_secs(1) && c_after < Duration::from_secs(1),
        "{tag}: B {t_after:?}, C {c_after:?}"
    );
    cj
}

/// The `semaphore` example program with `--backend BACKEND --json` and `args`.
pub fn semaphore(name: &str, backend: &str, args: &[&str]) -> Proc {
    let args: Vec<String> = ["--backend", backend, "--json"].iter().chain(args).map(ToString::to_string).collect();
    Proc::spawn(name, exe("semaphore"), &args)
}

/// A semaphore owner serving at `sock` until its stdin closes; returns once it is ready.
pub fn semaphore_owner(backend: &str, sock: &Path, initial: u64) -> Proc {
    let initial = initial.to_string();
    let p = semaphore("owner", backend, &["owner", "--socket", sock.to_str().unwrap(), "--initial", &initial]);
    p.wait_for_line("ready", Duration::from_secs(30));
    p
}

/// A semaphore poster posting `count` times (`extra`: e.g. `--stream`, `--hold-secs N`).
pub fn semaphore_poster(name: &str, backend: &str, sock: &Path, count: u64, extra: &[&str]) -> Proc {
    let count = count.to_string();
    let args: Vec<&str> = ["post", "--socket", sock.to_str().unwrap(), "--count", &count]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    semaphore(name, backend, &args)
}

/// A pure semaphore waiter taking up to `count` posts, each wait bounded by `timeout_ms` (`extra`: e.g.
/// `--stream`, `--until-idle`); returns once it is attached.
pub fn semaphore_waiter(name: &str, backend: &str, sock: &Path, count: u64, timeout_ms: u64, extra: &[&str]) -> Proc {
    let (count, timeout) = (count.to_string(), timeout_ms.to_string());
    let args: Vec<&str> = ["wait", "--socket", sock.to_str().unwrap(), "--count", &count, "--timeout-ms", &timeout]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let p = semaphore(name, backend, &args);
    p.wait_for_line("attached", Duration::from_secs(30));
    p
}

/// The `work_queue` example program with `--backend BACKEND --json` and `args`.
pub fn work_queue(name: &str, backend: &str, args: &[&str]) -> Proc {
    let args: Vec<String> = ["--backend", backend, "--json"].iter().chain(args).map(ToString::to_string).collect();
    Proc::spawn(name, exe("work_queue"), &args)
}

/// The field `key` of a JSON summary.
pub fn field<'a>(json: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    json.get(key).unwrap_or_else(|| panic!("no {key} in {json}"))
}
