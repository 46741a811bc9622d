//! Running the probes for the report: each probe is a child process of this same binary
//! (`gpu-ipc probe <name> --json --out DIR/raw/<name>-<pass>.json --no-progress [--quick]`) with its stderr in
//! `DIR/raw/<name>-<pass>.log` and a time limit; the first pass runs without MPS, the second under a private MPS
//! daemon ([`MpsDaemon`]) that is stopped on every path.
//!
//! Without MPS means without *any* daemon: a client whose `CUDA_MPS_PIPE_DIRECTORY` names a directory with no
//! daemon in it runs without MPS, so the first pass points that variable at an empty private directory. Removing
//! the variable would not do: the client would then try the default `/tmp/nvidia-mps`, where a system-wide daemon
//! may be listening; inheriting it could attach the pass to a daemon someone else started.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use harness::exit::EXIT_NO_CUDA;
use harness::mps::{MPS_LOG_VAR, MPS_PIPE_VAR, MpsControl, MpsDaemon};
use harness::process::{PrivateDir, kill_group, wait_until};

use super::Pass;
use crate::ProbeName;

/// The run log's file name, beside the probes' JSON.
pub const RUN_LOG_FILE: &str = "runs.json";

/// How one probe run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RunStatus {
    /// It exited with status 0 and wrote its JSON.
    Ok {
        /// Wall time, seconds.
        seconds: f64,
    },
    /// It exited with another status, was killed by a signal, wrote no JSON, or could not be started.
    Failed {
        /// Wall time, seconds.
        seconds: f64,
        /// Its exit status, when it exited.
        exit_code: Option<i32>,
        /// What went wrong: the last line it printed, or why it could not start.
        message: String,
    },
    /// It was still running at the time limit and was killed (with its process group).
    TimedOut {
        /// The limit, seconds.
        limit_s: u64,
    },
    /// It was not run, and why (e.g. the MPS daemon would not start).
    Skipped {
        /// Why.
        reason: String,
    },
}

impl RunStatus {
    /// Whether the run produced a result.
    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok { .. })
    }

    /// In a few words, for tables: `ran in 12.3 s`, `FAILED (exit 1): ...`, `TIMED OUT after 900 s`,
    /// `SKIPPED: ...`.
    pub fn describe(&self) -> String {
        match self {
            Self::Ok { seconds } => format!("ran in {seconds:.1} s"),
            Self::Failed { exit_code: Some(code), message, .. } => format!("FAILED (exit {code}): {message}"),
            Self::Failed { exit_code: None, message, .. } => format!("FAILED: {message}"),
            Self::TimedOut { limit_s } => format!("TIMED OUT after {limit_s} s (killed)"),
            Self::Skipped { reason } => format!("SKIPPED: {reason}"),
        }
    }
}

/// One probe run of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Which probe.
    pub probe: ProbeName,
    /// Which pass.
    pub pass: Pass,
    /// How it ended.
    #[serde(flatten)]
    pub status: RunStatus,
    /// Its stderr, relative to the raw folder (`<probe>-<pass>.log`); `None` when it did not run.
    pub log: Option<String>,
}

/// What a report run did, written as `raw/runs.json` so that `--from` can say later which runs failed or were
/// skipped, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunLog {
    /// The `gpu-ipc report` command line.
    pub command: String,
    /// When it started, UTC.
    pub date: String,
    /// Whether `--quick` was given.
    pub quick: bool,
    /// Every probe run, in order.
    pub runs: Vec<RunRecord>,
    /// What else happened that a reader should know (the MPS daemon did not stop in time, ...).
    pub notes: Vec<String>,
}

impl RunLog {
    /// The record of `probe` in `pass`.
    pub fn record(&self, probe: ProbeName, pass: Pass) -> Option<&RunRecord> {
        self.runs.iter().find(|r| r.probe == probe && r.pass == pass)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The `gpu-ipc` binary (this one).
    pub exe: PathBuf,
    /// Where the JSON, the logs and the run log go.
    pub raw_dir: PathBuf,
    /// Which probes.
    pub probes: Vec<ProbeName>,
    /// Which passes, in order.
    pub passes: Vec<Pass>,
    /// Pass `--quick` to every probe.
    pub quick: bool,
    /// Time limit of each probe run.
    pub timeout: Duration,
    /// How to start the MPS daemon.
    pub mps_control: MpsControl,
    /// The report's command line, for the run log.
    pub command: String,
}

/// How running the plan ended.
#[derive(Debug)]
pub enum PlanOutcome {
    /// Every run was tried (each record says how it went).
    Done(RunLog),
    /// The first probe run said there is no usable CUDA here; its message.
    NoCuda(String),
}

/// Runs every probe of `plan` in every pass, writes `raw/runs.json`, and returns what happened. An `Err` only when
/// the raw folder cannot be written.
pub fn execute(plan: &RunPlan, progress: &RunProgress) -> std::io::Result<PlanOutcome> {
    std::fs::create_dir_all(&plan.raw_dir)?;
    let mut log = RunLog {
        command: plan.command.clone(),
        date: harness::env::utc_now(),
        quick: plan.quick,
        runs: Vec::new(),
        notes: Vec::new(),
    };
    let total = plan.probes.len() * plan.passes.len();
    for &pass in &plan.passes {
        // Held for the whole pass: the empty pipe directory (no MPS) or the daemon (MPS), removed or stopped on
        // every way out of this block.
        let (no_daemon_dir, mut daemon) = match pass {
            Pass::NoMps => (Some(PrivateDir::new("no-mps")?), None),
            Pass::Mps => match MpsDaemon::start(&plan.mps_control) {
                Ok(daemon) => (None, Some(daemon)),
                Err(reason) => {
                    progress.note(&format!("MPS pass SKIPPED: {reason}"));
                    tracing::warn!(%reason, "MPS pass skipped");
                    for &probe in &plan.probes {
                        let status = RunStatus::Skipped { reason: reason.to_string() };
                        log.runs.push(RunRecord { probe, pass, status, log: None });
                    }
                    continue;
                }
            },
        };
        let env: Vec<(OsString, Option<OsString>)> = match (&no_daemon_dir, &daemon) {
            (Some(dir), _) => {
                vec![(MPS_PIPE_VAR.into(), Some(dir.path().as_os_str().to_owned())), (MPS_LOG_VAR.into(), None)]
            }
            (None, Some(daemon)) => daemon.client_env(),
            (None, None) => Vec::new(),
        };
        for &probe in &plan.probes {
            let json = plan.raw_dir.join(pass.file_name(probe));
            let log_name = format!("{}-{}.log", probe.name(), pass.suffix());
            let invocation = ProbeInvocation {
                program: plan.exe.clone(),
                args: probe_args(probe, &json, plan.quick),
                env: env.clone(),
                log: plan.raw_dir.join(&log_name),
                json: Some(json),
                timeout: plan.timeout,
            };
            let n = log.runs.len() + 1;
            let running = progress.start(&format!("[{n}/{total}] {probe} {}", pass.label()));
            let status = run_probe(&invocation);
            running.finish(&status, &invocation.log);
            let first = log.runs.is_empty();
            if first
                && matches!(status, RunStatus::Failed { exit_code: Some(code), .. } if code == i32::from(EXIT_NO_CUDA))
            {
                let text = std::fs::read_to_string(&invocation.log).unwrap_or_default();
                let message = text.trim();
                let message = if message.is_empty() { "gpu-ipc report: no usable CUDA driver or GPU" } else { message };
                return Ok(PlanOutcome::NoCuda(message.to_owned()));
            }
            log.runs.push(RunRecord { probe, pass, status, log: Some(log_name) });
        }
        if let Some(daemon) = daemon.as_mut() {
            if let Err(problem) = daemon.stop() {
                progress.note(&problem.to_string());
                log.notes.push(problem.to_string());
            }
            daemon.copy_logs(&plan.raw_dir.join("mps-log"));
        }
    }
    let text = serde_json::to_string_pretty(&log).map_err(std::io::Error::other)?;
    std::fs::write(plan.raw_dir.join(RUN_LOG_FILE), format!("{text}\n"))?;
    Ok(PlanOutcome::Done(log))
}

/// The arguments of one probe run.
pub fn probe_args(probe: ProbeName, json: &Path, quick: bool) -> Vec<OsString> {
    let mut args: Vec<OsString> =
        vec!["probe".into(), probe.name().into(), "--json".into(), "--out".into(), json.as_os_str().to_owned()];
    args.push("--no-progress".into());
    if quick {
        args.push("--quick".into());
    }
    args
}

/// One probe process to run.
#[derive(Debug, Clone)]
pub struct ProbeInvocation {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables to set (`Some`) or remove (`None`).
    pub env: Vec<(OsString, Option<OsString>)>,
    /// Where its stderr goes.
    pub log: PathBuf,
    /// The JSON file it must write; a run that exits 0 without it counts as failed.
    pub json: Option<PathBuf>,
    /// Its time limit.
    pub timeout: Duration,
}

/// Runs `invocation` in a process group of its own, so that at the time limit the probe and the children it
/// started are all killed; stdout is discarded (the JSON goes to `--out`), stderr goes to the log.
pub fn run_probe(invocation: &ProbeInvocation) -> RunStatus {
    let started = Instant::now();
    let failed =
        |message: String| RunStatus::Failed { seconds: started.elapsed().as_secs_f64(), exit_code: None, message };
    // A file from an earlier run must not pass for this run's result, and is not this run's to delete: the JSON
    // counts only if this run wrote it (it appeared, or changed).
    let before = invocation.json.as_deref().map(FileStamp::of);
    let log = match File::create(&invocation.log) {
        Ok(log) => log,
        Err(e) => return failed(format!("cannot create {}: {e}", invocation.log.display())),
    };
    let mut command = Command::new(&invocation.program);
    command.args(&invocation.args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).process_group(0);
    for (key, value) in &invocation.env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return failed(format!("cannot start {}: {e}", invocation.program.display())),
    };
    tracing::debug!(pid = child.id(), program = %invocation.program.display(), "probe started");
    let status = match wait_until(&mut child, started + invocation.timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            kill_group(&mut child);
            return RunStatus::TimedOut { limit_s: invocation.timeout.as_secs() };
        }
        Err(e) => {
            kill_group(&mut child);
            return failed(format!("lost track of the probe process: {e}"));
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    if status.success() {
        match &invocation.json {
            Some(json) if !before.as_ref().is_some_and(|before| before.written_since(json)) => RunStatus::Failed {
                seconds,
                exit_code: Some(0),
                message: format!("exited 0 but wrote no {}", json.display()),
            },
            _ => RunStatus::Ok { seconds },
        }
    } else {
        RunStatus::Failed { seconds, exit_code: status.code(), message: failure_message(status, &invocation.log) }
    }
}

/// What a file looked like before a run (`None`: it did not exist), to tell whether the run wrote it.
#[derive(Debug, PartialEq)]
struct FileStamp(Option<(std::time::SystemTime, i64, i64, u64, u64)>);

impl FileStamp {
    fn of(path: &Path) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self(
            std::fs::metadata(path)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.ctime(), m.ctime_nsec(), m.ino(), m.len()))),
        )
    }

    /// Whether `path` exists now and was created or rewritten since this stamp was taken.
    fn written_since(&self, path: &Path) -> bool {
        let now = Self::of(path);
        now.0.is_some() && now != *self
    }
}

/// Why a probe failed, in one line: its last line on stderr, or the signal that ended it.
fn failure_message(status: ExitStatus, log: &Path) -> String {
    use std::os::unix::process::ExitStatusExt;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let last = text.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let mut message: String = last.chars().take(300).collect();
    if let Some(signal) = status.signal() {
        message = if message.is_empty() {
            format!("killed by signal {signal}")
        } else {
            format!("killed by signal {signal}; {message}")
        };
    }
    if message.is_empty() { "no message on stderr".to_owned() } else { message }
}

/// Progress of the report's probe runs on stderr: a spinner with the elapsed time on a terminal, a line at the
/// start and end of each run otherwise.
#[derive(Debug)]
pub struct RunProgress {
    terminal: bool,
}

/// One probe run in progress.
#[derive(Debug)]
pub struct RunningProbe {
    label: String,
    bar: Option<ProgressBar>,
}

impl RunProgress {
    /// Progress for a terminal (`true`: a spinner) or a log (`false`: lines).
    pub fn new(terminal: bool) -> Self {
        Self { terminal }
    }

    /// Shows that `label` started.
    pub fn start(&self, label: &str) -> RunningProbe {
        let bar = if self.terminal {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("gpu-ipc report: {spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.set_message(label.to_owned());
            bar.enable_steady_tick(Duration::from_millis(200));
            Some(bar)
        } else {
            eprintln!("gpu-ipc report: {label}: running");
            None
        };
        RunningProbe { label: label.to_owned(), bar }
    }

    /// A line of its own.
    pub fn note(&self, text: &str) {
        eprintln!("gpu-ipc report: {text}");
    }
}

impl RunningProbe {
    /// Shows how the run ended.
    pub fn finish(self, status: &RunStatus, log: &Path) {
        let mut line = format!("gpu-ipc report: {}: {}", self.label, status.describe());
        if !status.is_ok() {
            line.push_str(&format!(" (log: {})", log.display()));
        }
        match self.bar {
            Some(bar) => {
                bar.finish_and_clear();
                eprintln!("{line}");
            }
            None => eprintln!("{line}"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use harness::mps::fake::{calls, fake_control, script};

    use super::*;

    fn invocation(dir: &Path, body: &str, timeout: Duration) -> ProbeInvocation {
        ProbeInvocation {
            program: script(dir, "probe.sh", body),
            args: vec!["probe".into(), "overhead".into()],
            env: vec![("GPU_IPC_TEST_VAR".into(), Some("set".into())), ("HOME".into(), None)],
            log: dir.join("probe.log"),
            json: Some(dir.join("probe.json")),
            timeout,
        }
    }

    #[test]
    fn a_probe_that_times_out_is_killed_with_its_children() {
        let tmp = PrivateDir::new("test-run").unwrap();
        let pids = tmp.path().join("pids");
        // The probe starts a child of its own, then hangs: both must go.
        let body = format!("sleep 60 & echo $! >{0}; echo $$ >>{0}; echo working >&2; wait\n", pids.display());
        let started = Instant::now();
        let status = run_probe(&invocation(tmp.path(), &body, Duration::from_millis(500)));
        assert_eq!(status, RunStatus::TimedOut { limit_s: 0 });
        assert!(started.elapsed() < Duration::from_secs(10));
        let text = std::fs::read_to_string(&pids).unwrap();
        for pid in text.lines() {
            let pid = rustix::process::Pid::from_raw(pid.trim().parse().unwrap()).unwrap();
            // The sleep is reparented and may linger as a zombie for a moment: alive means really running.
            let deadline = Instant::now() + Duration::from_secs(5);
            while harness::process::process_alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(!harness::process::process_alive(pid), "pid {pid:?} survived the timeout");
        }
        assert_eq!(std::fs::read_to_string(tmp.path().join("probe.log")).unwrap(), "working\n");
        assert!(status.describe().starts_with("TIMED OUT"));
    }

    #[test]
    fn probe_exits_are_recorded() {
        let tmp = PrivateDir::new("test-run").unwrap();
        let json = tmp.path().join("probe.json");
        let ok = format!(
            "[ \"$GPU_IPC_TEST_VAR\" = set ] && [ -z \"$HOME\" ] && [ \"$2\" = overhead ] && echo {{}} >{}\n",
            json.display()
        );
        assert!(matches!(run_probe(&invocation(tmp.path(), &ok, Duration::from_secs(10))), RunStatus::Ok { .. }));
        // The JSON of the run above does not pass for the next run's result (exiting 0 without writing one is a
        // failure), and is left where it is: the report deletes nothing it did not write.
        let status = run_probe(&invocation(tmp.path(), "exit 0\n", Duration::from_secs(10)));
        assert!(
            matches!(&status, RunStatus::Failed { exit_code: Some(0), message, .. } if message.contains("wrote no")),
            "{status:?}"
        );
        assert_eq!(std::fs::read_to_string(&json).unwrap(), "{}\n", "the earlier JSON is kept");
        let status = run_probe(&invocation(
            tmp.path(),
            "echo 'step 1' >&2; echo 'cuInit failed' >&2; exit 3\n",
            Duration::from_secs(10),
        ));
        assert!(
            matches!(&status, RunStatus::Failed { exit_code: Some(3), message, .. } if message == "cuInit failed"),
            "{status:?}"
        );
        let mut missing = invocation(tmp.path(), "", Duration::from_secs(1));
        missing.program = tmp.path().join("nonexistent");
        assert!(
            matches!(run_probe(&missing), RunStatus::Failed { exit_code: None, message, .. } if message.contains("cannot start"))
        );
    }

    fn fake_probe_plan(tmp: &Path, probe_body: &str, mps: MpsControl) -> RunPlan {
        RunPlan {
            exe: script(tmp, "gpu-ipc", probe_body),
            raw_dir: tmp.join("out/raw"),
            probes: vec![crate::test_name("overhead"), crate::test_name("crash")],
            passes: Pass::ALL.to_vec(),
            quick: true,
            timeout: Duration::from_secs(20),
            mps_control: mps,
            command: "gpu-ipc report --quick".to_owned(),
        }
    }

    /// A fake `gpu-ipc probe NAME --json --out FILE --no-progress --quick` that writes which MPS pipe it saw.
    const FAKE_PROBE: &str = r#"
[ "$1" = probe ] && [ "$3" = --json ] && [ "$4" = --out ] && [ "$6" = --no-progress ] && [ "$7" = --quick ] || exit 2
echo "{\"pipe\": \"$CUDA_MPS_PIPE_DIRECTORY\", \"log\": \"${CUDA_MPS_LOG_DIRECTORY:-none}\"}" >"$5"
echo "probe $2 done" >&2
"#;

    #[test]
    fn a_plan_runs_both_passes_with_the_right_environment() {
        let tmp = PrivateDir::new("test-plan").unwrap();
        let mps_dir = tmp.path().join("mps-bin");
        std::fs::create_dir(&mps_dir).unwrap();
        let plan = fake_probe_plan(tmp.path(), FAKE_PROBE, fake_control(&mps_dir));
        let PlanOutcome::Done(log) = execute(&plan, &RunProgress::new(false)).unwrap() else { panic!("no CUDA?") };
        assert_eq!(log.runs.len(), 4);
        assert!(log.runs.iter().all(|r| r.status.is_ok()), "{log:?}");
        assert!(log.quick && log.notes.is_empty());
        let read = |name: &str| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(plan.raw_dir.join(name)).unwrap()).unwrap()
        };
        let no_mps = read("overhead-no-mps.json");
        let pipe = no_mps["pipe"].as_str().unwrap();
        assert!(pipe.contains("gpu-ipc-no-mps-"), "an empty private pipe directory: {pipe}");
        assert_eq!(no_mps["log"], "none");
        let mps = read("crash-mps.json");
        assert!(
            mps["pipe"].as_str().unwrap().ends_with("/pipe") && mps["pipe"].as_str().unwrap().contains("gpu-ipc-mps-")
        );
        assert!(
            !Path::new(pipe).exists() && !Path::new(mps["pipe"].as_str().unwrap()).exists(),
            "temporary dirs removed"
        );
        assert_eq!(std::fs::read_to_string(plan.raw_dir.join("crash-mps.log")).unwrap(), "probe crash done\n");
        assert!(plan.raw_dir.join("mps-log/control.log").exists());
        let written: RunLog =
            serde_json::from_str(&std::fs::read_to_string(plan.raw_dir.join(RUN_LOG_FILE)).unwrap()).unwrap();
        assert_eq!(written, log);
        assert!(calls(&mps_dir).last().unwrap().starts_with("quit "));
    }

    #[test]
    fn a_plan_without_mps_records_the_pass_as_skipped() {
        let tmp = PrivateDir::new("test-plan").unwrap();
        let plan = fake_probe_plan(tmp.path(), FAKE_PROBE, MpsControl::with_program(None));
        let PlanOutcome::Done(log) = execute(&plan, &RunProgress::new(false)).unwrap() else { panic!("no CUDA?") };
        let skipped: Vec<_> = log.runs.iter().filter(|r| r.pass == Pass::Mps).collect();
        assert_eq!(skipped.len(), 2);
        for record in skipped {
            assert_eq!(
                record.status,
                RunStatus::Skipped { reason: "nvidia-cuda-mps-control not found on PATH".into() }
            );
            assert_eq!(record.log, None);
        }
        assert!(log.record(crate::test_name("crash"), Pass::NoMps).unwrap().status.is_ok());
    }

    #[test]
    fn no_cuda_on_the_first_run_stops_the_plan() {
        let tmp = PrivateDir::new("test-plan").unwrap();
        let body = "echo 'gpu-ipc: no CUDA driver (libcuda.so.1 not found): install the NVIDIA driver' >&2; exit 3\n";
        let plan = fake_probe_plan(tmp.path(), body, MpsControl::with_program(None));
        match execute(&plan, &RunProgress::new(false)).unwrap() {
            PlanOutcome::NoCuda(message) => assert!(message.contains("no CUDA driver"), "{message}"),
            PlanOutcome::Done(log) => panic!("ran on: {log:?}"),
        }
        assert!(!plan.raw_dir.join(RUN_LOG_FILE).exists());
    }
}
