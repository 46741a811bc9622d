//! The parent's side of one crash trial, and the observer it reads free memory from.
//!
//! Every step has a deadline: a child that does not answer in time is counted as hung ([`FailureKind::ChildHung`])
//! and killed when its [`ChildProcess`] drops at the end of the trial; nothing here waits without a bound.

use std::os::fd::OwnedFd;
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use gpu_ipc::BackendKind;
use gpu_ipc::core::wire::WireError;

use super::model::{CrashCase, FailureKind, MemoryReading, MemoryTrace, SurvivorReport, TrialFailure, TrialRecord};
use super::protocol::{Command, CrashTask, ObserverParams, PeerParams, Reply};
use harness::MeasurementError;
use harness::child::{ChannelError, ChildProcess, ChildTask};

/// How long the survivor's hammer kernel runs across the death, in ms (the victim is reaped only once it ends,
/// without MPS: the teardown waits for the GPU; so this bounds a hammer trial's length).
pub const HAMMER_MS: u64 = 400;
/// How long after the survivor's hammer (or the victim's wait) starts the victim dies, in ms (a launch takes
/// microseconds: this only makes sure the kernel is running).
pub const KILL_AFTER_MS: u64 = 150;
/// The victim's polling kernel's own deadline (long, so that a wait the driver failed to tear down would show).
const VICTIM_WAIT_TIMEOUT_MS: u64 = 10_000;
/// A child's connect, and its CUDA start-up (context, modules, warm-up).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Any other step of a child.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// The survivor's checks (hammer, reads, kernels, its own bounded wait).
const SURVIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// From `exit`/SIGKILL, or `Quit`, until the process is reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// Settling the free memory after a change: poll period, how long it must stay put, the longest wait.
const SETTLE_POLL: Duration = Duration::from_millis(10);
const SETTLE_STABLE: Duration = Duration::from_millis(100);
const SETTLE_MAX: Duration = Duration::from_secs(3);
/// Changes of free memory below this are noise when settling.
const SETTLE_NOISE_BYTES: i128 = 1 << 20;
const SMI_TIMEOUT: Duration = Duration::from_secs(5);
/// After a fault: how long the survivor gets to report what it sees (its errors are the evidence).
const FAULT_EVIDENCE_TIMEOUT: Duration = Duration::from_secs(15);

/// What every trial of a run shares.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The device ordinal.
    pub device: i32,
    /// Bytes asked for per allocation.
    pub allocation_bytes: u64,
    /// Whether the run is under MPS (names a fault of a process that was never killed).
    pub mps: bool,
}

/// Why a step with a child did not give the expected answer.
#[derive(Debug)]
enum AskError {
    /// No answer by the deadline.
    Hung(String),
    /// The child reported an error, hung up or answered something else.
    Failed(String),
}

impl AskError {
    fn into_failure(self, hang: FailureKind, other: FailureKind, stage: &str) -> TrialFailure {
        let (kind, detail) = match self {
            Self::Hung(d) => (hang, d),
            Self::Failed(d) => (other, d),
        };
        TrialFailure { kind, stage: stage.to_owned(), detail }
    }
}

/// Sends `command` (with `fds`) and waits at most `timeout` for the reply.
fn ask(
    child: &ChildProcess,
    command: &Command,
    fds: Vec<OwnedFd>,
    timeout: Duration,
) -> Result<(Reply, Vec<OwnedFd>), AskError> {
    child.channel().send(command, fds).map_err(channel_error)?;
    let (value, fds): (serde_json::Value, _) = child.channel().recv(timeout).map_err(channel_error)?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        return Err(AskError::Failed(error.to_owned()));
    }
    let reply = serde_json::from_value(value).map_err(|e| AskError::Failed(format!("unreadable reply: {e}")))?;
    Ok((reply, fds))
}

fn channel_error(e: ChannelError) -> AskError {
    match e {
        ChannelError::Wire(WireError::Timeout { .. }) | ChannelError::Timeout { .. } => AskError::Hung(e.to_string()),
        other => AskError::Failed(other.to_string()),
    }
}

fn unexpected(reply: &Reply) -> AskError {
    AskError::Failed(format!("unexpected reply {reply:?}"))
}

/// The observer child: a process with its own CUDA context that reads `cuMemGetInfo` on request, plus
/// `nvidia-smi` beside it.
#[derive(Debug)]
pub struct Observer {
    child: ChildProcess,
    device: i32,
    device_uuid: Option<String>,
    smi_answered: std::cell::Cell<bool>,
}

impl Observer {
    /// Starts the observer on `device` (`device_uuid`, as `nvidia-smi` prints it, picks its row there).
    ///
    /// # Errors
    /// The child could not start or create its context.
    pub fn spawn(device: i32, device_uuid: Option<String>) -> Result<Self, MeasurementError> {
        let task = ChildTask::of(&CrashTask::Observer(ObserverParams { device }))
            .map_err(|source| MeasurementError::Malformed { what: "observer task".to_owned(), source })?;
        let child = ChildProcess::spawn(&task, &[], CONNECT_TIMEOUT)?;
        let observer = Self { child, device, device_uuid, smi_answered: std::cell::Cell::new(false) };
        observer.ready().map_err(|e| MeasurementError::Child {
            role: "crash-observer".to_owned(),
            reason: match e {
                AskError::Hung(d) | AskError::Failed(d) => d,
            },
        })?;
        Ok(observer)
    }

    fn ready(&self) -> Result<(), AskError> {
        let (value, _): (serde_json::Value, _) = self.child.channel().recv(READY_TIMEOUT).map_err(channel_error)?;
        match serde_json::from_value::<Reply>(value.clone()) {
            Ok(Reply::Ready { .. }) => Ok(()),
            _ => Err(AskError::Failed(format!("the observer did not start: {value}"))),
        }
    }

    /// Whether `nvidia-smi` answered at least once.
    pub fn nvidia_smi_answered(&self) -> bool {
        self.smi_answered.get()
    }

    /// Ends the observer (killed if it does not leave in time).
    pub fn quit(mut self) {
        let _ = ask(&self.child, &Command::Quit, Vec::new(), STEP_TIMEOUT);
        let _ = self.child.wait(REAP_TIMEOUT);
    }

    fn free(&self) -> Result<u64, AskError> {
        match ask(&self.child, &Command::Measure, Vec::new(), STEP_TIMEOUT)? {
            (Reply::Memory { free, .. }, _) => Ok(free),
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// Whether the observer still answers a reading (after a failed trial: did its context survive?).
    pub fn healthy(&self) -> bool {
        self.free().is_ok()
    }

    /// A reading; `nvidia-smi` (tens of ms a call) only where `smi` asks, at the key points of a trial.
    fn reading(&self, smi: bool) -> Result<MemoryReading, AskError> {
        let free_bytes = self.free()?;
        Ok(MemoryReading { free_bytes, smi_used_mib: if smi { self.smi_used_mib() } else { None } })
    }

    /// Polls free memory after a change that starts from `from_free`: records when at least half of
    /// `allocation_bytes` beyond `context_bytes` has come back, and stops once the context's memory is back (when
    /// one is expected) and the reading has stayed put for a while, or after [`SETTLE_MAX`].
    fn settle(
        &self,
        from_free: u64,
        context_bytes: i64,
        allocation_bytes: i64,
    ) -> Result<(MemoryReading, Option<f64>), AskError> {
        let started = Instant::now();
        let from = i128::from(from_free);
        let context = i128::from(context_bytes.max(0));
        let allocation_back = from + context + i128::from(allocation_bytes.max(0)) / 2;
        let mut first_back = None;
        let mut last = from;
        let mut stable_since = Instant::now();
        loop {
            let free = i128::from(self.free()?);
            if first_back.is_none() && allocation_bytes > 0 && free >= allocation_back {
                first_back = Some(started.elapsed().as_secs_f64() * 1e3);
            }
            if (free - last).abs() > SETTLE_NOISE_BYTES {
                last = free;
                stable_since = Instant::now();
            }
            let context_back = free >= from + context / 2;
            if (context_back && stable_since.elapsed() >= SETTLE_STABLE) || started.elapsed() >= SETTLE_MAX {
                break;
            }
            std::thread::sleep(SETTLE_POLL);
        }
        Ok((self.reading(true)?, first_back))
    }

    /// `nvidia-smi`'s used memory of the device, in MiB; `None` when it is not on `PATH`, fails or is late.
    fn smi_used_mib(&self) -> Option<u64> {
        let mut child = Process::new("nvidia-smi")
            .args(["--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + SMI_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => break,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
            }
        }
        let mut text = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take()?, &mut text).ok()?;
        let used = parse_smi_used(&text, self.device, self.device_uuid.as_deref());
        if used.is_some() {
            self.smi_answered.set(true);
        }
        used
    }
}

/// The used-memory column of the `index, uuid, memory.used` row of the device: by UUID when known, else by index
/// (which is `nvidia-smi`'s numbering, the same as CUDA's only under `CUDA_DEVICE_ORDER=PCI_BUS_ID`).
pub fn parse_smi_used(text: &str, device: i32, uuid: Option<&str>) -> Option<u64> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, row_uuid, used] = fields.as_slice() else { return None };
        let ours = match uuid {
            Some(u) => row_uuid.eq_ignore_ascii_case(u),
            None => index.parse::<i32>().ok() == Some(device),
        };
        if ours { used.parse().ok() } else { None }
    })
}

fn spawn_peer(exporter: bool, plan: &Plan, backend: BackendKind) -> Result<ChildProcess, AskError> {
    let params = PeerParams { backend, device: plan.device };
    let task = if exporter { CrashTask::Exporter(params) } else { CrashTask::Importer(params) };
    let role = format!("crash-{}", task.role());
    let task = ChildTask::of(&task).map_err(|e| AskError::Failed(e.to_string()))?;
    let child = ChildProcess::spawn(&task, &[], CONNECT_TIMEOUT).map_err(channel_error)?;
    let (value, _): (serde_json::Value, _) = child.channel().recv(READY_TIMEOUT).map_err(channel_error)?;
    match serde_json::from_value::<Reply>(value.clone()) {
        Ok(Reply::Ready { .. }) => Ok(child),
        _ => Err(AskError::Failed(value.get("error").and_then(|e| e.as_str()).map_or_else(
            || format!("the {role} did not start: {value}"),
            |e| format!("the {role} did not start: {e}"),
        ))),
    }
}

/// Runs one trial; never fails as a whole (a failure is recorded in the trial) and never outlives its deadlines.
pub fn run_trial(
    plan: &Plan,
    observer: &Observer,
    backend: BackendKind,
    case: CrashCase,
    repetition: u32,
) -> TrialRecord {
    let mut record = TrialRecord {
        backend,
        case,
        repetition,
        failure: None,
        victim_reap_ms: None,
        import_mismatches: None,
        survivor: None,
        memory: None,
    };
    if let Err(mut failure) = trial_steps(plan, observer, backend, &mut record) {
        // After the death, a failure of the survivor alone is the survivor's; if the observer (which never
        // touches the shared memory) lost its context too, the death broke more than the two processes.
        if record.victim_reap_ms.is_some()
            && !failure.kind.is_fault()
            && let Err(e) = observer.free()
        {
            failure = TrialFailure {
                kind: FailureKind::fault(plan.mps),
                stage: format!("observer after the death ({})", failure.stage),
                detail: format!("observer: {}; survivor: {}", ask_detail(e), failure.detail),
            };
        }
        tracing::debug!(?failure, "crash trial failed");
        record.failure = Some(failure);
    }
    record
}

fn ask_detail(e: AskError) -> String {
    match e {
        AskError::Hung(d) => format!("no answer ({d})"),
        AskError::Failed(d) => d,
    }
}

/// The first error a survivor's report names, or that its checks all worked.
pub fn survivor_evidence(report: &SurvivorReport) -> String {
    let errors = [
        ("host read", &report.read_error),
        ("kernel", &report.launch_error),
        ("rewrite", &report.write_error),
        ("wait", &report.wait_error),
    ];
    errors.iter().find_map(|(what, e)| e.as_ref().map(|e| format!("{what}: {e}"))).unwrap_or_else(|| {
        if report.fully_usable() {
            "its checks still worked".into()
        } else {
            "its checks found the memory changed".into()
        }
    })
}

/// A failure of the observer after the death: the death broke a process that was never killed. The survivor is
/// asked for its checks (bounded) so that the record says whether it lost its context too.
fn observer_fault(
    plan: &Plan,
    stage: &str,
    error: AskError,
    survivor: Option<(&ChildProcess, Option<u64>)>,
    record: &mut TrialRecord,
) -> TrialFailure {
    let survivor_said = match (&record.survivor, survivor) {
        (Some(report), _) => survivor_evidence(report),
        (None, Some((child, hammer_ms))) => {
            match ask(child, &Command::Survive { hammer_ms }, Vec::new(), FAULT_EVIDENCE_TIMEOUT) {
                Ok((Reply::Survived { report }, _)) => {
                    let said = survivor_evidence(&report);
                    record.survivor = Some(*report);
                    said
                }
                Ok((other, _)) => format!("unexpected reply {other:?}"),
                Err(e) => ask_detail(e),
            }
        }
        (None, None) => "not asked (it had exited)".into(),
    };
    TrialFailure {
        kind: FailureKind::fault(plan.mps),
        stage: stage.to_owned(),
        detail: format!("observer: {}; survivor: {survivor_said}", ask_detail(error)),
    }
}

fn setup(stage: &'static str) -> impl Fn(AskError) -> TrialFailure {
    move |e| e.into_failure(FailureKind::ChildHung, FailureKind::Setup, stage)
}

fn after_death(stage: &'static str) -> impl Fn(AskError) -> TrialFailure {
    move |e| e.into_failure(FailureKind::ChildHung, FailureKind::SurvivorFailed, stage)
}

fn trial_steps(
    plan: &Plan,
    observer: &Observer,
    backend: BackendKind,
    record: &mut TrialRecord,
) -> Result<(), TrialFailure> {
    let case = record.case;
    let base = observer.reading(false).map_err(setup("observer"))?;
    let exporter = spawn_peer(true, plan, backend).map_err(setup("exporter start"))?;
    let exporter_started = observer.reading(false).map_err(setup("observer"))?;
    let importer = spawn_peer(false, plan, backend).map_err(setup("importer start"))?;
    let both_started = observer.reading(false).map_err(setup("observer"))?;

    let (handle, size, fds) =
        match ask(&exporter, &Command::Allocate { bytes: plan.allocation_bytes }, Vec::new(), STEP_TIMEOUT)
            .map_err(setup("allocate and export"))?
        {
            (Reply::Exported { handle, size }, fds) => (handle, size, fds),
            (other, _) => return Err(setup("allocate and export")(unexpected(&other))),
        };
    // A VMM fd passes through the parent to the importer; the parent's copy closes once sent.
    match ask(&importer, &Command::Import { handle, size }, fds, STEP_TIMEOUT).map_err(setup("import"))? {
        (Reply::Imported { mismatches, .. }, _) => record.import_mismatches = Some(mismatches),
        (other, _) => return Err(setup("import")(unexpected(&other))),
    }
    let shared = observer.reading(true).map_err(setup("observer"))?;
    let mut trace = MemoryTrace {
        base,
        exporter_started,
        both_started,
        shared,
        after_death: shared,
        after_close: None,
        after_exit: None,
        return_after_death_ms: None,
    };

    let (mut victim, mut survivor) = if case.exporter_dies() { (exporter, importer) } else { (importer, exporter) };
    let launched = match case {
        CrashCase::ExporterExit | CrashCase::ExporterKill => None,
        CrashCase::ExporterKillDuringImporterKernel | CrashCase::ImporterKillDuringExporterKernel => {
            Some(ask(&survivor, &Command::Hammer { duration_ms: HAMMER_MS }, Vec::new(), STEP_TIMEOUT))
        }
        CrashCase::ImporterKillDuringGpuWait => {
            Some(ask(&victim, &Command::HoldWait { timeout_ms: VICTIM_WAIT_TIMEOUT_MS }, Vec::new(), STEP_TIMEOUT))
        }
    };
    if let Some(launched) = launched {
        match launched.map_err(setup("launch before the death"))? {
            (Reply::Launched, _) => std::thread::sleep(Duration::from_millis(KILL_AFTER_MS)),
            (other, _) => return Err(setup("launch before the death")(unexpected(&other))),
        }
    }

    let death = Instant::now();
    if case == CrashCase::ExporterExit {
        victim.channel().send(&Command::Exit, Vec::new()).map_err(|e| TrialFailure {
            kind: FailureKind::Setup,
            stage: "exit".into(),
            detail: e.to_string(),
        })?;
    } else {
        victim.kill();
    }
    victim.wait(REAP_TIMEOUT).map_err(|e| TrialFailure {
        kind: FailureKind::VictimDidNotDie,
        stage: "death".into(),
        detail: e.to_string(),
    })?;
    record.victim_reap_ms = Some(death.elapsed().as_secs_f64() * 1e3);
    drop(victim);

    let victim_context =
        if case.exporter_dies() { trace.exporter_context_bytes() } else { trace.importer_context_bytes() };
    let survivor_context =
        if case.exporter_dies() { trace.importer_context_bytes() } else { trace.exporter_context_bytes() };
    let allocation = trace.allocation_bytes();
    let hammer_ms = case.survivor_hammers().then_some(HAMMER_MS);
    let (reading, returned_ms) = match observer.settle(shared.free_bytes, victim_context, allocation) {
        Ok(settled) => settled,
        Err(e) => {
            return Err(observer_fault(plan, "observer after the death", e, Some((&survivor, hammer_ms)), record));
        }
    };
    trace.after_death = reading;
    trace.return_after_death_ms = returned_ms;
    record.memory = Some(trace.clone());

    match ask(&survivor, &Command::Survive { hammer_ms }, Vec::new(), SURVIVE_TIMEOUT)
        .map_err(after_death("survivor checks"))?
    {
        (Reply::Survived { report }, _) => record.survivor = Some(*report),
        (other, _) => return Err(after_death("survivor checks")(unexpected(&other))),
    }

    match ask(&survivor, &Command::Close, Vec::new(), STEP_TIMEOUT).map_err(after_death("survivor close"))? {
        (Reply::Closed, _) => {}
        (other, _) => return Err(after_death("survivor close")(unexpected(&other))),
    }
    let (reading, _) = match observer.settle(trace.after_death.free_bytes, 0, allocation) {
        Ok(settled) => settled,
        Err(e) => return Err(observer_fault(plan, "observer after the survivor closed", e, None, record)),
    };
    trace.after_close = Some(reading);
    record.memory = Some(trace.clone());

    match ask(&survivor, &Command::Quit, Vec::new(), STEP_TIMEOUT).map_err(after_death("survivor exit"))? {
        (Reply::Bye, _) => {}
        (other, _) => return Err(after_death("survivor exit")(unexpected(&other))),
    }
    survivor.wait(REAP_TIMEOUT).map_err(|e| TrialFailure {
        kind: FailureKind::ChildHung,
        stage: "survivor exit".into(),
        detail: e.to_string(),
    })?;
    let (reading, _) = match observer.settle(reading.free_bytes, survivor_context, allocation) {
        Ok(settled) => settled,
        Err(e) => return Err(observer_fault(plan, "observer after the survivor exited", e, None, record)),
    };
    trace.after_exit = Some(reading);
    record.memory = Some(trace);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smi_rows_are_picked_by_uuid_then_index() {
        let text = "0, GPU-aaaa, 1200\n1, GPU-bbbb, 81000\n";
        assert_eq!(parse_smi_used(text, 0, Some("GPU-bbbb")), Some(81000));
        assert_eq!(parse_smi_used(text, 0, None), Some(1200));
        assert_eq!(parse_smi_used(text, 5, None), None);
        assert_eq!(parse_smi_used("[N/A]\n", 0, None), None);
        assert_eq!(parse_smi_used("0, GPU-aaaa, [N/A]\n", 0, None), None);
    }

    #[test]
    fn survivor_evidence_names_the_first_error_or_that_the_checks_worked() {
        let mut report = SurvivorReport {
            read_ms: Some(0.1),
            sample_mismatches: Some(0),
            data_mismatches: Some(0),
            write_mismatches: Some(0),
            ..SurvivorReport::default()
        };
        assert_eq!(survivor_evidence(&report), "its checks still worked");
        report.data_mismatches = Some(3);
        assert_eq!(survivor_evidence(&report), "its checks found the memory changed");
        report.launch_error = Some("cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)".into());
        report.wait_error = Some("later".into());
        assert_eq!(survivor_evidence(&report), "kernel: cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)");
        assert_eq!(ask_detail(AskError::Hung("30 s".into())), "no answer (30 s)");
    }

    #[test]
    fn timeouts_are_hangs_and_the_rest_failures() {
        let hung = channel_error(ChannelError::Wire(WireError::Timeout { op: "recv", after: Duration::from_secs(1) }));
        assert!(matches!(hung, AskError::Hung(_)));
        let failure = AskError::Failed("boom".into()).into_failure(FailureKind::ChildHung, FailureKind::Setup, "x");
        assert_eq!((failure.kind, failure.stage.as_str(), failure.detail.as_str()), (FailureKind::Setup, "x", "boom"));
    }
}
