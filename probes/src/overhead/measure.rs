//! The measurements of the overhead probe: the kernels and buffers they use, the exporter and importer helper
//! processes and the messages to them, attach timing.

use super::model::{AttachPoint, LINE, MIB, Measured};
use std::time::{Duration, Instant};

use gpu_ipc::BackendKind;
use gpu_ipc::driver::{
    Context, DeviceBuffer, DeviceMemory, DeviceSpan, Event, EventFlags, KernelArg, LaunchConfig, Stream,
};
use gpu_ipc::kernels::probe::{MEM_CHASE, MEM_READ, MEM_STORE_LATENCY, MEM_WRITE, ProbeKernels};
use serde::{Deserialize, Serialize};

use harness::MeasurementError;
use harness::child::ChildFailure;
use harness::child::{Channel, ChildProcess, ChildTask};
use harness::regions::{ExportedRegion, HandleMessage, ImportedRegion};
use harness::stats::Distribution;

/// Messages to an exporter or importer child.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub(super) enum ToChild {
    /// Allocate `bytes` through `backend`, fill it, and send its handle back.
    Allocate { backend: BackendKind, bytes: u64 },
    /// Import (the fd rides along), time it, close, import again, and report.
    Import(HandleMessage),
    /// Leave.
    Exit,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub(super) enum FromChild {
    Exported(HandleMessage),
    Imported { context_ms: f64, first_ms: f64, second_ms: f64 },
}

/// What an overhead helper is asked to do (the envelope is [`ChildTask`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(tag = "role", content = "params")]
pub enum OverheadTask {
    /// Allocates and exports on request.
    #[serde(rename = "overhead-exporter")]
    Exporter {
        /// The device ordinal.
        device: i32,
    },
    /// A fresh process whose first import is timed.
    #[serde(rename = "overhead-importer")]
    Importer {
        /// The device ordinal.
        device: i32,
    },
}

pub(super) fn spawn_child(task: OverheadTask) -> Result<ChildProcess, MeasurementError> {
    let task = ChildTask::of(&task)
        .map_err(|source| MeasurementError::Malformed { what: "overhead task".to_owned(), source })?;
    Ok(ChildProcess::spawn(&task, &[], Duration::from_secs(30))?)
}

pub(super) fn recv_reply(child: &ChildProcess, timeout: Duration) -> Result<FromChild, MeasurementError> {
    let (reply, fds): (serde_json::Value, _) = child.channel().recv(timeout)?;
    drop(fds);
    if let Ok(failure) = serde_json::from_value::<ChildFailure>(reply.clone()) {
        return Err(MeasurementError::Child { role: "overhead".to_owned(), reason: failure.error });
    }
    serde_json::from_value(reply)
        .map_err(|source| MeasurementError::Malformed { what: "overhead child".to_owned(), source })
}

pub(super) fn ask_export(
    exporter: &ChildProcess,
    backend: BackendKind,
    bytes: u64,
) -> Result<(HandleMessage, Option<std::os::fd::OwnedFd>), MeasurementError> {
    exporter.channel().send(&ToChild::Allocate { backend, bytes }, Vec::new())?;
    let (reply, mut fds): (serde_json::Value, _) = exporter.channel().recv(Duration::from_secs(120))?;
    if let Ok(failure) = serde_json::from_value::<ChildFailure>(reply.clone()) {
        return Err(MeasurementError::Child { role: "overhead-exporter".to_owned(), reason: failure.error });
    }
    match serde_json::from_value(reply) {
        Ok(FromChild::Exported(message)) => Ok((message, fds.pop())),
        other => {
            Err(MeasurementError::Unexpected { peer: "exporter", expected: "its reply", got: format!("{other:?}") })
        }
    }
}

pub(super) fn peer_import(
    ctx: &Context,
    device: i32,
    bytes: u64,
) -> Result<(ChildProcess, ImportedRegion), MeasurementError> {
    let peer_device = if device == 0 { 1 } else { 0 };
    let peer = spawn_child(OverheadTask::Exporter { device: peer_device })?;
    #[cfg(feature = "legacy")]
    let backend = BackendKind::Legacy;
    #[cfg(not(feature = "legacy"))]
    let backend = BackendKind::Vmm;
    let (message, fd) = ask_export(&peer, backend, bytes)?;
    let region = ImportedRegion::import(ctx, &message, fd)?;
    Ok((peer, region))
}

/// Times `reps` imports and closes of one exported allocation in this process.
pub(super) fn time_attach(
    ctx: &Context,
    backend: BackendKind,
    message: &HandleMessage,
    fd: Option<std::os::fd::OwnedFd>,
    reps: u32,
) -> Result<AttachPoint, MeasurementError> {
    let (mut attach, mut detach) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let dup = fd
            .as_ref()
            .map(std::os::fd::OwnedFd::try_clone)
            .transpose()
            .map_err(|source| MeasurementError::Io { op: "duplicate the fd", source })?;
        let started = Instant::now();
        let region = ImportedRegion::import(ctx, message, dup)?;
        attach.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        drop(region);
        detach.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let none = || MeasurementError::Missing("no attach samples");
    Ok(AttachPoint {
        backend,
        bytes: message.size,
        attach_ms: Distribution::from_samples(&mut attach).ok_or_else(none)?,
        detach_ms: Distribution::from_samples(&mut detach).ok_or_else(none)?,
    })
}

/// The kernels and buffers the measurements use.
pub(super) struct Bench {
    ctx: Context,
    stream: Stream,
    read: gpu_ipc::driver::Function,
    write: gpu_ipc::driver::Function,
    chase: gpu_ipc::driver::Function,
    store: gpu_ipc::driver::Function,
    scratch: DeviceBuffer,
    blocks: u32,
    start: Event,
    end: Event,
}

/// Chase samples per run.
pub(super) const CHASE_STEPS: u64 = 4096;

impl Bench {
    pub(super) fn new(ctx: &Context) -> Result<Self, MeasurementError> {
        let kernels = ProbeKernels::load(ctx)?;
        let sms = ctx.device().sm_count()?;
        Ok(Self {
            ctx: ctx.clone(),
            stream: Stream::new(ctx)?,
            read: kernels.function(MEM_READ)?,
            write: kernels.function(MEM_WRITE)?,
            chase: kernels.function(MEM_CHASE)?,
            store: kernels.function(MEM_STORE_LATENCY)?,
            scratch: DeviceBuffer::alloc(ctx, 8 * (CHASE_STEPS + 16))?,
            blocks: sms * 8,
            start: Event::new(ctx, EventFlags::TIMING)?,
            end: Event::new(ctx, EventFlags::TIMING)?,
        })
    }

    /// GB/s of reading (or writing) `bytes` at `base`: per run, enough launches back to back to take a few ms,
    /// timed with events.
    pub(super) fn bandwidth(
        &self,
        base: DeviceSpan<'_>,
        bytes: u64,
        runs: u32,
        write: bool,
    ) -> Result<Measured, MeasurementError> {
        let base = base.slice(0, bytes)?;
        let n_vec = bytes / 16;
        let blocks = (n_vec.div_ceil(256).min(u64::from(self.blocks)).max(1)) as u32;
        let config = LaunchConfig::linear(blocks, 256);
        let launches = (256 * MIB / bytes).clamp(4, 2000) as u32;
        let launch = |i: u32| -> Result<(), MeasurementError> {
            if write {
                self.write.launch_typed(
                    &self.stream,
                    config,
                    &[KernelArg::Span(base), KernelArg::U64(n_vec), KernelArg::U32(i)],
                )?;
            } else {
                self.read.launch_typed(
                    &self.stream,
                    config,
                    &[
                        KernelArg::Span(base),
                        KernelArg::U64(n_vec),
                        KernelArg::U32(0x9E37_79B9),
                        KernelArg::Span(self.scratch.span()),
                    ],
                )?;
            }
            Ok(())
        };
        // Warm-up: module, caches, TLB.
        launch(0)?;
        launch(1)?;
        self.stream.synchronize()?;
        let mut values = Vec::new();
        for _ in 0..runs {
            self.start.record(&self.stream)?;
            for i in 0..launches {
                launch(i)?;
            }
            self.end.record(&self.stream)?;
            self.end.synchronize()?;
            let ms = f64::from(Event::elapsed_ms(&self.start, &self.end)?);
            values.push(bytes as f64 * f64::from(launches) / (ms * 1e-3) / 1e9);
        }
        measured(values, None)
    }

    /// ns per dependent load over a random cyclic chain of 128-byte lines spanning `bytes` at `base`.
    pub(super) fn chase(&self, base: DeviceSpan<'_>, bytes: u64, runs: u32) -> Result<Measured, MeasurementError> {
        let lines = (bytes / LINE).max(2);
        let chain = chain_words(lines, 0x5eed_0000 ^ bytes);
        let base = base.slice(0, lines * LINE)?;
        base.write(0, &chain)?;
        // A copy from pageable memory may still be in flight when cuMemcpyHtoD returns, and our stream does not
        // wait for the legacy stream it ran on: without this the chase can read a half-written chain (seen on the
        // H100 as CUDA_ERROR_ILLEGAL_ADDRESS).
        self.ctx.synchronize()?;
        let warm = lines.min(1 << 20);
        let mut values = Vec::new();
        let mut pooled = Vec::new();
        for run in 0..runs {
            let start = (u64::from(run) * 7919 % lines) * (LINE / 8);
            self.chase.launch_typed(
                &self.stream,
                LaunchConfig::linear(1, 32),
                &[
                    KernelArg::Span(base),
                    KernelArg::U64(start),
                    KernelArg::U64(warm),
                    KernelArg::U64(CHASE_STEPS),
                    KernelArg::Span(self.scratch.span()),
                    KernelArg::Span(self.scratch.span().slice(8 * (CHASE_STEPS + 8), 8 * 8)?),
                ],
            )?;
            self.stream.synchronize()?;
            let samples = self.read_cycles()?;
            values.push(median(&samples));
            pooled.extend(samples);
        }
        measured(values, Distribution::from_samples(&mut pooled))
    }

    /// ns per store + `__threadfence()` over 1 MiB of lines at `base`.
    pub(super) fn store_latency(&self, base: DeviceSpan<'_>, runs: u32) -> Result<Measured, MeasurementError> {
        let base = base.slice(0, MIB)?;
        let mut values = Vec::new();
        let mut pooled = Vec::new();
        for _ in 0..runs {
            self.store.launch_typed(
                &self.stream,
                LaunchConfig::linear(1, 32),
                &[
                    KernelArg::Span(base),
                    KernelArg::U64(MIB / LINE),
                    KernelArg::U64(CHASE_STEPS),
                    KernelArg::Span(self.scratch.span()),
                ],
            )?;
            self.stream.synchronize()?;
            let samples = self.read_cycles()?;
            values.push(median(&samples));
            pooled.extend(samples);
        }
        measured(values, Distribution::from_samples(&mut pooled))
    }

    /// The per-step cycle counts the last chase or store kernel wrote, converted to ns with the kernel's own
    /// total cycles / total `%globaltimer` ns.
    pub(super) fn read_cycles(&self) -> Result<Vec<f64>, MeasurementError> {
        let mut words = vec![0u64; (CHASE_STEPS + 2) as usize];
        self.scratch.read(0, &mut words)?;
        let total_cycles = words[CHASE_STEPS as usize] as f64;
        let total_ns = words[CHASE_STEPS as usize + 1] as f64;
        let ns_per_cycle = if total_cycles > 0.0 && total_ns > 0.0 { total_ns / total_cycles } else { f64::NAN };
        Ok(words[..CHASE_STEPS as usize].iter().map(|&c| c as f64 * ns_per_cycle).collect())
    }
}

pub(super) fn median(samples: &[f64]) -> f64 {
    let mut copy = samples.to_vec();
    Distribution::from_samples(&mut copy).map_or(f64::NAN, |d| d.p50)
}

pub(super) fn measured(values: Vec<f64>, samples: Option<Distribution>) -> Result<Measured, MeasurementError> {
    let summary = Distribution::from_samples(&mut values.clone())
        .ok_or_else(|| MeasurementError::Missing("a measurement produced no value"))?;
    Ok(Measured { runs: values, summary, samples })
}

/// A random cyclic permutation of `lines` lines as a chase chain: word `16 * a` holds `16 * b` when line `b`
/// follows line `a` (indices in u64 words; one element per 128-byte line). Deterministic for a seed.
pub fn chain_words(lines: u64, seed: u64) -> Vec<u64> {
    let words_per_line = LINE / 8;
    let mut order: Vec<u64> = (0..lines).collect();
    // Sattolo's algorithm: a single cycle through every line.
    let mut state = seed | 1;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % i as u64) as usize;
        order.swap(i, j);
    }
    let mut chain = vec![0u64; (lines * words_per_line) as usize];
    for (i, &next) in order.iter().enumerate() {
        chain[i * words_per_line as usize] = next * words_per_line;
    }
    chain
}

/// The child processes: `overhead-exporter` allocates and exports on request; `overhead-importer` is a fresh process
/// whose first import is timed.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    // Both roles serve the same requests; the importer is asked only to import.
    let (OverheadTask::Exporter { device } | OverheadTask::Importer { device }) =
        task.decode().map_err(|source| MeasurementError::Malformed { what: "overhead task".to_owned(), source })?;
    let started = Instant::now();
    let ctx = Context::for_ordinal(device)?;
    let context_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut kept: Vec<ExportedRegion> = Vec::new();
    loop {
        let (message, mut fds): (ToChild, _) = channel.recv(Duration::from_secs(3600))?;
        match message {
            ToChild::Allocate { backend, bytes } => {
                let region = ExportedRegion::allocate(backend, &ctx, bytes)?;
                region.span().fill_u32_async(0x0D15_EA5E, &Stream::new(&ctx)?)?;
                ctx.synchronize()?;
                let (handle, fd) = region.export()?;
                kept.push(region);
                channel.send(&FromChild::Exported(handle), fd.into_iter().collect())?;
            }
            ToChild::Import(handle) => {
                let fd = fds.pop();
                let dup = fd
                    .as_ref()
                    .map(std::os::fd::OwnedFd::try_clone)
                    .transpose()
                    .map_err(|source| MeasurementError::Io { op: "duplicate the fd", source })?;
                let t = Instant::now();
                let first = ImportedRegion::import(&ctx, &handle, fd)?;
                let first_ms = t.elapsed().as_secs_f64() * 1e3;
                drop(first);
                let t = Instant::now();
                let second = ImportedRegion::import(&ctx, &handle, dup)?;
                let second_ms = t.elapsed().as_secs_f64() * 1e3;
                drop(second);
                channel.send(&FromChild::Imported { context_ms, first_ms, second_ms }, Vec::new())?;
                return Ok(());
            }
            ToChild::Exit => return Ok(()),
        }
    }
}
