//! The frame-sharing API end to end on a real GPU, in separate processes: for each backend and each sync
//! strategy, one producer and two consumers exchange 10,000 4K RGB frames, every frame checked by a kernel;
//! a consumer killed with SIGKILL mid-run leaves the others running to the end; a producer killed with SIGKILL
//! gives every consumer `ProducerGone` within a second. Ignored without a GPU.
//!
//! With `GPU_IPC_RESULTS_DIR` set, each run's figures are appended to `frames-<GPU_IPC_RESULTS_TAG>.jsonl`
//! there (the GPU suite runs this file once without MPS and once under a private MPS daemon).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BACKENDS: [&str; 2] = ["legacy", "vmm"];
const STRATEGIES: [&str; 4] = ["cpu-spin", "cpu-sleep", "ipc-event", "gpu-stream-ops"];
const FRAMES: u64 = 10_000;

fn exe(name: &str) -> PathBuf {
    // nextest sets NEXTEST_BIN_EXE_* when it replays an archive on another machine.
    std::env::var_os(format!("NEXTEST_BIN_EXE_{name}")).map_or_else(
        || {
            PathBuf::from(if name == "producer" {
                env!("CARGO_BIN_EXE_producer")
            } else {
                env!("CARGO_BIN_EXE_consumer")
            })
        },
        PathBuf::from,
    )
}

fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-test-{}-{tag}.sock", std::process::id()))
}

/// A child process whose stderr lines arrive on a channel and whose stdout is kept for its JSON summary.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    name: String,
}

impl Proc {
    fn spawn(name: &str, program: PathBuf, args: &[String]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
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
        Self { child, lines, name: name.to_owned() }
    }

    /// Waits for a stderr line containing `needle`.
    fn wait_for_line(&self, needle: &str, timeout: Duration) {
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
    fn finish(mut self, timeout: Duration) -> (ExitStatus, Duration, serde_json::Value) {
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

    fn kill9(&mut self) {
        rustix::process::kill_process(rustix::process::Pid::from_child(&self.child), rustix::process::Signal::KILL)
            .unwrap();
    }
}

fn producer(backend: &str, sync: &str, sock: &Path, frames: u64, consumers: usize) -> Proc {
    let args: Vec<String> = [
        "--socket",
        sock.to_str().unwrap(),
        "--backend",
        backend,
        "--sync",
        sync,
        "--slots",
        "2",
        "--frames",
        &frames.to_string(),
        "--consumers",
        &consumers.to_string(),
        "--json",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    Proc::spawn(&format!("producer {backend}/{sync}"), exe("producer"), &args)
}

fn consumer(name: &str, backend: &str, sock: &Path, frames: u64) -> Proc {
    let args: Vec<String> = [
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
    .map(ToString::to_string)
    .collect();
    Proc::spawn(&format!("consumer {name}"), exe("consumer"), &args)
}

fn record(result: &serde_json::Value) {
    let Some(dir) = std::env::var_os("GPU_IPC_RESULTS_DIR") else { return };
    let tag = std::env::var("GPU_IPC_RESULTS_TAG").unwrap_or_else(|_| "default".into());
    let path = PathBuf::from(dir).join(format!("frames-{tag}.jsonl"));
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    writeln!(file, "{result}").unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_backend_and_strategy_moves_10000_verified_4k_frames_to_two_consumers() {
    for backend in BACKENDS {
        for sync in STRATEGIES {
            let sock = socket(&format!("{backend}-{sync}"));
            let p = producer(backend, sync, &sock, FRAMES, 2);
            let a = consumer("a", backend, &sock, FRAMES);
            let b = consumer("b", backend, &sock, FRAMES);
            let (ps, _, pj) = p.finish(Duration::from_secs(120));
            let (as_, _, aj) = a.finish(Duration::from_secs(10));
            let (bs, _, bj) = b.finish(Duration::from_secs(10));
            assert!(ps.success() && as_.success() && bs.success(), "{backend}/{sync}: {ps} {as_} {bs}");
            for c in [&aj, &bj] {
                assert_eq!(c["frames"], FRAMES, "{backend}/{sync}: {c}");
                assert_eq!(c["first_seq"], 0, "{backend}/{sync}: {c}");
                assert_eq!(c["mismatched_words"], 0, "{backend}/{sync}: {c}");
            }
            assert_eq!(pj["frames"], FRAMES);
            assert_eq!(pj["consumers_at_start"], 2, "{pj}");
            assert_eq!(pj["consumers_lost"], 0, "{pj}");
            record(&serde_json::json!({
                "test": "throughput", "backend": backend, "sync": sync,
                "producer": pj, "consumers": [aj, bj],
            }));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_consumer_killed_mid_run_stalls_nobody() {
    for backend in BACKENDS {
        for sync in STRATEGIES {
            let sock = socket(&format!("kill-consumer-{backend}-{sync}"));
            let p = producer(backend, sync, &sock, FRAMES, 2);
            let mut victim = consumer("victim", backend, &sock, FRAMES);
            let survivor = consumer("survivor", backend, &sock, FRAMES);
            victim.wait_for_line("frame 1000", Duration::from_secs(60));
            victim.kill9();
            let (vs, _, _) = victim.finish(Duration::from_secs(5));
            assert!(!vs.success());
            let (ps, _, pj) = p.finish(Duration::from_secs(120));
            let (ss, _, sj) = survivor.finish(Duration::from_secs(10));
            assert!(ps.success(), "{backend}/{sync}: producer {ps}");
            assert!(ss.success(), "{backend}/{sync}: survivor {ss}");
            assert_eq!(sj["frames"], FRAMES, "{backend}/{sync}: {sj}");
            assert_eq!(sj["mismatched_words"], 0, "{backend}/{sync}: {sj}");
            assert_eq!(pj["consumers_lost"], 1, "{backend}/{sync}: {pj}");
            record(&serde_json::json!({"test": "kill-consumer", "backend": backend, "sync": sync,
                "producer": pj, "survivor": sj}));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_producer_killed_mid_run_gives_consumers_producer_gone_within_a_second() {
    for backend in BACKENDS {
        for sync in STRATEGIES {
            let sock = socket(&format!("kill-producer-{backend}-{sync}"));
            let mut p = producer(backend, sync, &sock, u64::MAX / 4, 2);
            let a = consumer("a", backend, &sock, 0);
            let b = consumer("b", backend, &sock, 0);
            a.wait_for_line("frame 1000", Duration::from_secs(60));
            b.wait_for_line("frame 1000", Duration::from_secs(60));
            p.kill9();
            let killed = Instant::now();
            let (as_, _, aj) = a.finish(Duration::from_secs(5));
            let a_after = killed.elapsed();
            let (bs, _, bj) = b.finish(Duration::from_secs(5));
            let b_after = killed.elapsed();
            let _ = p.finish(Duration::from_secs(5));
            for (status, after, json) in [(as_, a_after, &aj), (bs, b_after, &bj)] {
                assert_eq!(status.code(), Some(4), "{backend}/{sync}: consumer exit {status}, {json}");
                assert!(json["producer_gone"].is_string(), "{backend}/{sync}: {json}");
                assert!(after < Duration::from_secs(1), "{backend}/{sync}: ProducerGone after {after:?}");
            }
            record(&serde_json::json!({"test": "kill-producer", "backend": backend, "sync": sync,
                "a_ms": a_after.as_secs_f64() * 1e3, "b_ms": b_after.as_secs_f64() * 1e3}));
        }
    }
}
