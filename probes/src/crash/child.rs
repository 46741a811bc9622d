//! The crash probe's child processes: the exporter and the importer (one of which dies, the other survives and
//! checks the memory), and the observer (reads free device memory from a context of its own).
//!
//! Each role answers [`Command`]s until `Quit`. Every GPU step is bounded: the hammer and wait kernels end by
//! `%globaltimer`, host polls of their streams have deadlines, and the parent kills a child that does not answer in
//! time (so a synchronous driver call that never returns is also bounded, by the parent).

use std::time::{Duration, Instant};

use gpu_ipc::GpuBackendVisitor;
use gpu_ipc::core::backend::{ExportedHandle, GpuBackend};
use gpu_ipc::driver::{
    Context, DeviceBuffer, DeviceMemory, DeviceSpan, Function, KernelArg, LaunchConfig, Stream, WaitCondition,
};
use gpu_ipc::kernels::launch::PatternKernels;
use gpu_ipc::kernels::pattern::count_mismatches_host;
use gpu_ipc::kernels::probe::{MEM_HAMMER, MEM_WAIT_FLAG, ProbeKernels};

use super::model::{SurvivorReport, WaitOutcome};
use super::protocol::{
    Command, CrashTask, FLAG_AREA_BYTES, FLAG_RELEASE, FLAG_VICTIM_TARGET, ObserverParams, Reply, SAMPLE_WORDS,
    SEQ_AFTER, SEQ_BEFORE, pattern_bytes,
};
use harness::MeasurementError;
use harness::child::{Channel, ChildTask};

/// How long a child waits for its next command (the parent settles memory readings between commands); a parent
/// that died is noticed at once (hang-up).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// The survivor's own GPU-side wait: the kernel's deadline, and the host's deadline for the kernel to end.
const SURVIVOR_WAIT_TIMEOUT: Duration = Duration::from_secs(2);
const SURVIVOR_WAIT_HOST_DEADLINE: Duration = Duration::from_secs(5);
/// How much longer than its own duration a hammer kernel may take before it counts as stuck (time-slicing with
/// other processes without MPS can stretch it).
const HAMMER_GRACE: Duration = Duration::from_secs(10);
const THREADS: u32 = 256;

/// Runs a crash child role.
///
/// # Errors
/// Unknown role or parameters, or a failure that ends the role (reported to the parent by `child_main`).
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    let what = format!("{} task", task.role);
    match task.decode::<CrashTask>().map_err(|source| MeasurementError::Malformed { what, source })? {
        CrashTask::Observer(params) => observer(params, channel),
        CrashTask::Exporter(params) | CrashTask::Importer(params) => {
            gpu_ipc::dispatch_gpu(params.backend, PeerRole { device: params.device, channel })
                .unwrap_or_else(|e| Err(e.into()))
        }
    }
}

fn observer(params: ObserverParams, channel: &Channel) -> Result<(), MeasurementError> {
    let ctx = Context::for_ordinal(params.device)?;
    channel.send(&Reply::Ready { pid: std::process::id() }, Vec::new())?;
    loop {
        let command: Command = channel.recv_plain(COMMAND_TIMEOUT)?;
        match command {
            Command::Measure => {
                let (free, total) = ctx.memory_info()?;
                channel.send(&Reply::Memory { free, total }, Vec::new())?;
            }
            Command::Quit => {
                channel.send(&Reply::Bye, Vec::new())?;
                return Ok(());
            }
            other => {
                return Err(MeasurementError::Unexpected {
                    peer: "parent",
                    expected: "an observer command",
                    got: format!("{other:?}"),
                });
            }
        }
    }
}

struct PeerRole<'a> {
    device: i32,
    channel: &'a Channel,
}

impl GpuBackendVisitor for PeerRole<'_> {
    type Output = Result<(), MeasurementError>;
    fn visit<B: GpuBackend>(self) -> Self::Output {
        let ctx = Context::for_ordinal(self.device)?;
        B::check_support(&ctx)?;
        let mut peer = Peer::<B>::new(ctx)?;
        self.channel.send(&Reply::Ready { pid: std::process::id() }, Vec::new())?;
        loop {
            let (command, fds): (Command, _) = self.channel.recv(COMMAND_TIMEOUT)?;
            let (reply, reply_fds) = match command {
                Command::Allocate { bytes } => peer.allocate(bytes)?,
                Command::Import { handle, size } => {
                    let fd = fds.into_iter().next();
                    (peer.import(ExportedHandle { bytes: handle, fd, size })?, Vec::new())
                }
                Command::Hammer { duration_ms } => (peer.hammer(duration_ms)?, Vec::new()),
                Command::HoldWait { timeout_ms } => (peer.hold_wait(timeout_ms)?, Vec::new()),
                // No destructor runs: the allocation, mapping and context are left for the driver to clean up.
                Command::Exit => std::process::exit(0),
                Command::Survive { hammer_ms } => {
                    (Reply::Survived { report: Box::new(peer.survive(hammer_ms)) }, Vec::new())
                }
                Command::Close => (peer.close()?, Vec::new()),
                Command::Quit => {
                    peer.close()?;
                    self.channel.send(&Reply::Bye, Vec::new())?;
                    return Ok(());
                }
                Command::Measure => {
                    return Err(MeasurementError::Unexpected {
                        peer: "parent",
                        expected: "an exporter or importer command",
                        got: "Measure".to_owned(),
                    });
                }
            };
            self.channel.send(&reply, reply_fds)?;
        }
    }
}

/// One side of the sharing. Fields drop in order: the memory first, then the buffers, streams and context.
struct Peer<B: GpuBackend> {
    exported: Option<B::Exported>,
    imported: Option<B::Imported>,
    /// A victim's GPU-side waits are outstanding on the flag (released before closing).
    holding_wait: bool,
    hammer_stats: DeviceBuffer,
    wait_out: DeviceBuffer,
    victim_wait_out: DeviceBuffer,
    victim_marker: DeviceBuffer,
    hammer: Function,
    wait_flag: Function,
    kernels: PatternKernels,
    stream: Stream,
    side_stream: Stream,
    blocks: u32,
    ctx: Context,
}

impl<B: GpuBackend> Peer<B> {
    fn new(ctx: Context) -> Result<Self, MeasurementError> {
        let probe_kernels = ProbeKernels::load(&ctx)?;
        let sms = ctx.device().sm_count()?;
        Ok(Self {
            exported: None,
            imported: None,
            holding_wait: false,
            hammer_stats: DeviceBuffer::alloc(&ctx, 16)?,
            wait_out: DeviceBuffer::alloc(&ctx, 24)?,
            victim_wait_out: DeviceBuffer::alloc(&ctx, 24)?,
            victim_marker: DeviceBuffer::alloc(&ctx, 8)?,
            hammer: probe_kernels.function(MEM_HAMMER)?,
            wait_flag: probe_kernels.function(MEM_WAIT_FLAG)?,
            kernels: PatternKernels::load(&ctx)?,
            stream: Stream::new(&ctx)?,
            side_stream: Stream::new(&ctx)?,
            blocks: sms * 4,
            ctx,
        })
        .and_then(Self::warm_up)
    }

    /// Runs each kernel once on scratch memory, so that costs the driver charges to a context lazily (module
    /// data, local memory for the first launch) are paid before `Ready`, where the observer counts them as the
    /// context's and not as the shared allocation's.
    fn warm_up(self) -> Result<Self, MeasurementError> {
        self.kernels.fill(&self.stream, self.victim_marker.span(), SEQ_BEFORE)?;
        self.kernels.count_mismatches(&self.stream, self.victim_marker.span(), SEQ_BEFORE)?;
        self.hammer.launch_typed(
            &self.stream,
            LaunchConfig::linear(self.blocks, THREADS),
            &[
                KernelArg::Span(self.victim_marker.span()),
                KernelArg::U64(0),
                KernelArg::U64(SEQ_BEFORE),
                KernelArg::U64(0),
                KernelArg::Span(self.hammer_stats.span()),
            ],
        )?;
        // Target 0: satisfied by any value, so the kernel returns at once.
        self.wait_flag.launch_typed(
            &self.stream,
            LaunchConfig::linear(1, 32),
            &[
                KernelArg::Span(self.victim_marker.span()),
                KernelArg::U64(0),
                KernelArg::U64(1_000_000),
                KernelArg::Span(self.wait_out.span()),
            ],
        )?;
        self.stream.synchronize()?;
        Ok(self)
    }

    /// The shared memory, whichever side this is.
    fn region(&self) -> Result<DeviceSpan<'_>, MeasurementError> {
        match (&self.exported, &self.imported) {
            (Some(r), _) => Ok(r.span()),
            (_, Some(r)) => Ok(r.span()),
            _ => Err(MeasurementError::Missing("no shared memory yet (allocate or import first)")),
        }
    }

    /// The flag area after the pattern, whose first word is the flag.
    fn flag(&self) -> Result<DeviceSpan<'_>, MeasurementError> {
        let region = self.region()?;
        Ok(region.slice(pattern_bytes(region.len()), FLAG_AREA_BYTES)?)
    }

    fn allocate(&mut self, bytes: u64) -> Result<(Reply, Vec<std::os::fd::OwnedFd>), MeasurementError> {
        let region = B::allocate(&self.ctx, bytes.max(2 * FLAG_AREA_BYTES))?;
        let span = region.span();
        let pattern = pattern_bytes(span.len());
        self.kernels.fill(&self.stream, span.slice(0, pattern)?, SEQ_BEFORE)?;
        span.slice(pattern, FLAG_AREA_BYTES)?.fill_u32_async(0, &self.stream)?;
        self.stream.synchronize()?;
        let handle = B::export(&region)?;
        self.exported = Some(region);
        // The fd (if any) is closed once sent: the exporter keeps no copy.
        Ok((Reply::Exported { handle: handle.bytes, size: handle.size }, handle.fd.into_iter().collect()))
    }

    fn import(&mut self, handle: ExportedHandle) -> Result<Reply, MeasurementError> {
        let started = Instant::now();
        let region = B::import(&self.ctx, handle)?;
        let import_ms = ms(started);
        let span = region.span();
        let mismatches =
            self.kernels.count_mismatches(&self.stream, span.slice(0, pattern_bytes(span.len()))?, SEQ_BEFORE)?;
        self.imported = Some(region);
        Ok(Reply::Imported { mismatches, import_ms })
    }

    fn hammer(&mut self, duration_ms: u64) -> Result<Reply, MeasurementError> {
        let region = self.region()?;
        let pattern = region.slice(0, pattern_bytes(region.len()))?;
        self.hammer_stats.write(0, &[0u64; 2])?;
        self.hammer.launch_typed(
            &self.stream,
            LaunchConfig::linear(self.blocks, THREADS),
            &[
                KernelArg::Span(pattern),
                KernelArg::U64(pattern.len() / 4),
                KernelArg::U64(SEQ_BEFORE),
                KernelArg::U64(duration_ms.saturating_mul(1_000_000)),
                KernelArg::Span(self.hammer_stats.span()),
            ],
        )?;
        Ok(Reply::Launched)
    }

    fn hold_wait(&mut self, timeout_ms: u64) -> Result<Reply, MeasurementError> {
        let flag = self.flag()?;
        self.victim_wait_out.write(0, &[0u64; 3])?;
        self.wait_flag.launch_typed(
            &self.stream,
            LaunchConfig::linear(1, 32),
            &[
                KernelArg::Span(flag),
                KernelArg::U64(FLAG_VICTIM_TARGET),
                KernelArg::U64(timeout_ms.saturating_mul(1_000_000)),
                KernelArg::Span(self.victim_wait_out.span()),
            ],
        )?;
        // Released by the flag reaching the target: the survivor's release value does, and so does `close`.
        let waited = flag.wait_value_u64(&self.side_stream, 0, FLAG_VICTIM_TARGET, WaitCondition::AtLeast);
        self.holding_wait = true;
        waited?;
        self.victim_marker.span().write_value_u64(&self.side_stream, 0, 1)?;
        Ok(Reply::Launched)
    }

    /// The survivor's checks. Never fails as a whole: each step records its own error, so one broken step does not
    /// hide what the others found.
    fn survive(&mut self, hammer_ms: Option<u64>) -> SurvivorReport {
        let mut report = SurvivorReport::default();
        let (pattern, flag) = match self.region().and_then(|region| Ok((region, self.flag()?))) {
            Ok((region, flag)) => match region.slice(0, pattern_bytes(region.len())) {
                Ok(pattern) => (pattern, flag),
                Err(e) => {
                    report.read_error = Some(e.to_string());
                    return report;
                }
            },
            Err(e) => {
                report.read_error = Some(e.to_string());
                return report;
            }
        };
        if let Some(hammer_ms) = hammer_ms {
            let deadline = Duration::from_millis(hammer_ms) + HAMMER_GRACE;
            match poll_idle(&self.stream, deadline) {
                Ok(true) => {
                    let mut stats = [0u64; 2];
                    match self.hammer_stats.read(0, &mut stats) {
                        Ok(()) => {
                            report.hammer_passes = Some(stats[0]);
                            report.hammer_mismatches = Some(stats[1]);
                        }
                        Err(e) => report.launch_error = Some(format!("reading the hammer's counts: {e}")),
                    }
                }
                Ok(false) => {
                    // Anything queued behind the kernel would wait for it: report what is known and stop.
                    report.hammer_stuck = true;
                    report.wait = Some(WaitOutcome::NotRun);
                    return report;
                }
                Err(e) => report.launch_error = Some(format!("the hammer kernel: {e}")),
            }
        }

        let mut sample = vec![0u32; SAMPLE_WORDS.min((pattern.len() / 4) as usize)];
        let started = Instant::now();
        match pattern.read(0, &mut sample) {
            Ok(()) => {
                report.read_ms = Some(ms(started));
                report.sample_mismatches = Some(count_mismatches_host(&sample, SEQ_BEFORE));
            }
            Err(e) => report.read_error = Some(e.to_string()),
        }

        let started = Instant::now();
        match self.kernels.count_mismatches(&self.stream, pattern, SEQ_BEFORE) {
            Ok(n) => {
                report.verify_ms = Some(ms(started));
                report.data_mismatches = Some(n);
            }
            Err(e) => {
                let earlier = report.launch_error.take().map(|e| format!("{e}; ")).unwrap_or_default();
                report.launch_error = Some(format!("{earlier}{e}"));
            }
        }

        let started = Instant::now();
        let written = self
            .kernels
            .fill(&self.stream, pattern, SEQ_AFTER)
            .and_then(|()| self.kernels.count_mismatches(&self.stream, pattern, SEQ_AFTER));
        match written {
            Ok(n) => {
                report.write_ms = Some(ms(started));
                report.write_mismatches = Some(n);
            }
            Err(e) => report.write_error = Some(e.to_string()),
        }

        match self.survivor_wait(flag) {
            Ok((outcome, wait_ms)) => {
                report.wait = Some(outcome);
                report.wait_ms = wait_ms;
            }
            Err(e) => {
                report.wait = Some(WaitOutcome::Error);
                report.wait_error = Some(e.to_string());
            }
        }
        report
    }

    /// Starts a polling kernel on the shared flag, then writes the release value from the host; returns how the
    /// kernel ended and how long it waited.
    fn survivor_wait(&self, flag: DeviceSpan<'_>) -> Result<(WaitOutcome, Option<f64>), MeasurementError> {
        self.wait_out.write(0, &[0u64; 3])?;
        self.wait_flag.launch_typed(
            &self.stream,
            LaunchConfig::linear(1, 32),
            &[
                KernelArg::Span(flag),
                KernelArg::U64(FLAG_RELEASE),
                KernelArg::U64(SURVIVOR_WAIT_TIMEOUT.as_nanos() as u64),
                KernelArg::Span(self.wait_out.span()),
            ],
        )?;
        // Let the kernel start polling before the flag changes (a launch takes microseconds).
        std::thread::sleep(Duration::from_millis(5));
        flag.write(0, &[FLAG_RELEASE])?;
        if !poll_idle(&self.stream, SURVIVOR_WAIT_HOST_DEADLINE)? {
            return Ok((WaitOutcome::Stuck, None));
        }
        let mut out = [0u64; 3];
        self.wait_out.read(0, &mut out)?;
        let waited = Some(out[2] as f64 / 1e6);
        Ok(match out[0] {
            1 => (WaitOutcome::Released, waited),
            2 => (WaitOutcome::TimedOut, waited),
            other => return Err(MeasurementError::Other(format!("the wait kernel wrote state {other}"))),
        })
    }

    /// Releases any wait this process holds, waits for its streams (every kernel on them is bounded), and drops
    /// the memory. The context stays.
    fn close(&mut self) -> Result<Reply, MeasurementError> {
        if self.holding_wait {
            self.flag()?.write(0, &[FLAG_RELEASE])?;
            self.holding_wait = false;
        }
        self.stream.synchronize()?;
        self.side_stream.synchronize()?;
        self.imported = None;
        self.exported = None;
        self.ctx.synchronize()?;
        Ok(Reply::Closed)
    }
}

/// Polls `stream` until it is idle or `deadline` passes; `Ok(false)` on the deadline.
fn poll_idle(stream: &Stream, deadline: Duration) -> Result<bool, MeasurementError> {
    let started = Instant::now();
    loop {
        if stream.is_idle()? {
            return Ok(true);
        }
        if started.elapsed() > deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}
