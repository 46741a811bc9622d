//! The two sides of a coherency cell (reader here, writer in a child or beside it) and the bounded run of one cell;
//! the words they share are in [`super::words`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu_ipc::core::shm::{SharedMemory, SharedObject};
use gpu_ipc::driver::{Context, DeviceBuffer, DeviceMemory, KernelArg, LaunchConfig, Stream, WaitCondition};
use gpu_ipc::kernels::probe::{
    COH_PAYLOAD_CHECK, COH_PAYLOAD_WRITE, ProbeKernels, coherency_layout as layout, coherency_reader, coherency_writer,
};
use serde::{Deserialize, Serialize};

use harness::MeasurementError;
use harness::child::ChildFailure;
use harness::child::{Channel, ChildProcess, ChildTask};
use harness::regions::{HandleMessage, ImportedRegion};
use harness::stats::Distribution;

use super::words::*;
use super::*;
/// Parameters of one cell, as the writer side needs them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct CellPlan {
    pub(super) writer: Writer,
    pub(super) rounds: u64,
    pub(super) round_timeout_ns: u64,
}

/// Messages from the parent to the writer child.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub(super) enum ToWriter {
    /// Import the device buffer (legacy handle bytes here; a VMM fd rides along).
    ImportDevice(HandleMessage),
    /// Map the host block (its memfd rides along).
    MapHost,
    /// Start a cell.
    Start(CellPlan),
    /// The reader is done (or aborted); finish and report.
    Finish,
    /// Leave.
    Exit,
}

/// Messages from the writer child to the parent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "kebab-case")]
pub(super) enum FromWriter {
    Ready,
    Started,
    Finished(WriterReport),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct WriterReport {
    pub(super) rounds_done: u64,
    pub(super) timeouts: u64,
    /// CPU writer only: flag store to ack seen, per round, in ns.
    pub(super) round_trip_ns: Vec<f64>,
    pub(super) error: Option<String>,
}

/// The reader's resources: kernels, a stream, result and timestamp buffers.
pub(super) struct ReaderSide {
    pub(super) ctx: Context,
    pub(super) kernels: ProbeKernels,
    pub(super) stream: Arc<Stream>,
    pub(super) results: Arc<DeviceBuffer>,
    pub(super) seen_ts: Arc<DeviceBuffer>,
}

impl ReaderSide {
    pub(super) fn new(ctx: &Context, rounds: u64) -> Result<Self, MeasurementError> {
        Ok(Self {
            ctx: ctx.clone(),
            kernels: ProbeKernels::load(ctx)?,
            stream: Arc::new(Stream::new(ctx)?),
            results: Arc::new(DeviceBuffer::alloc(ctx, 8 * layout::RESULTS as u64)?),
            seen_ts: Arc::new(DeviceBuffer::alloc(ctx, 8 * rounds.max(1))?),
        })
    }

    /// Zeroes the results and timestamps (bounded wait), before the writer starts.
    pub(super) fn prepare(&self) -> Result<(), MeasurementError> {
        self.results.fill_u32_async(0, &self.stream)?;
        self.seen_ts.fill_u32_async(0, &self.stream)?;
        wait_idle(&self.stream, Instant::now() + Duration::from_secs(10))
    }

    /// Queues (kernel reader) or starts enqueueing on a thread (stream-wait reader) the reader of one cell.
    pub(super) fn start(
        &self,
        reader: Reader,
        memory: &Memory<'_>,
        plan: CellPlan,
    ) -> Result<Option<std::thread::JoinHandle<Result<(), MeasurementError>>>, MeasurementError> {
        let owner = memory.device_words();
        match reader {
            Reader::Kernel { load, payload: payload_load, fence } => {
                let kernel = self.kernels.function(&coherency_reader(load, payload_load, fence))?;
                let words = Words::of(owner.span())?;
                kernel.launch_typed(
                    &self.stream,
                    LaunchConfig::linear(1, 32),
                    &[
                        KernelArg::Span(words.flag),
                        KernelArg::Span(words.ack),
                        KernelArg::Span(words.payload),
                        KernelArg::U64(PAYLOAD_WORDS),
                        KernelArg::U64(plan.rounds),
                        KernelArg::U64(plan.round_timeout_ns),
                        KernelArg::Span(self.seen_ts.span()),
                        KernelArg::Span(self.results.span()),
                    ],
                )?;
                Ok(None)
            }
            Reader::StreamWait => {
                let check = self.kernels.function(COH_PAYLOAD_CHECK)?;
                let (ctx, stream) = (self.ctx.clone(), self.stream.clone());
                let (seen_ts, results) = (self.seen_ts.clone(), self.results.clone());
                Ok(Some(std::thread::spawn(move || -> Result<(), MeasurementError> {
                    ctx.bind()?;
                    let words = Words::of(owner.span())?;
                    let mut throttle = Throttle::new(&ctx);
                    for round in 1..=plan.rounds {
                        throttle.before(&stream, round)?;
                        words.flag.wait_value_u64(&stream, 0, round, WaitCondition::AtLeast)?;
                        check.launch_typed(
                            &stream,
                            LaunchConfig::linear(1, 32),
                            &[
                                KernelArg::Span(words.flag),
                                KernelArg::Span(words.payload),
                                KernelArg::U64(PAYLOAD_WORDS),
                                KernelArg::U64(round),
                                KernelArg::Span(seen_ts.span()),
                                KernelArg::Span(results.span()),
                            ],
                        )?;
                        words.ack.write_value_u64(&stream, 0, round)?;
                    }
                    Ok(())
                })))
            }
        }
    }
}

/// Where the writer of a cell runs.
pub(super) enum WriterAt<'a> {
    /// In the child process behind this channel.
    Child(&'a ChildProcess),
    /// In this process (the control).
    Here(&'a WriterSide),
}

/// The writer's resources (in the child, or in this process for the control).
pub(super) struct WriterSide {
    pub(super) ctx: Context,
    pub(super) kernels: ProbeKernels,
    pub(super) stream: Arc<Stream>,
    pub(super) results: Arc<DeviceBuffer>,
    pub(super) memory: Option<OwnedMemory>,
}

/// A writer that was started: the thread that enqueues or spins, and what it needs to finish.
pub(super) struct RunningWriter {
    pub(super) thread: std::thread::JoinHandle<WriterReport>,
}

impl WriterSide {
    pub(super) fn new(ctx: &Context, memory: Option<OwnedMemory>) -> Result<Self, MeasurementError> {
        Ok(Self {
            ctx: ctx.clone(),
            kernels: ProbeKernels::load(ctx)?,
            stream: Arc::new(Stream::new(ctx)?),
            results: Arc::new(DeviceBuffer::alloc(ctx, 8 * layout::RESULTS as u64)?),
            memory,
        })
    }

    /// Starts the writer of `plan` on a thread: a kernel writer is one launch; a stream writer enqueues every round
    /// (which blocks while the stream's queue is full); the CPU writer spins through the rounds itself.
    pub(super) fn start(&self, plan: CellPlan) -> Result<RunningWriter, MeasurementError> {
        let memory = self.memory.clone().ok_or_else(|| MeasurementError::Missing("the writer has no memory"))?;
        self.results.fill_u32_async(0, &self.stream)?;
        wait_idle(&self.stream, Instant::now() + Duration::from_secs(10))?;
        let kernel = match plan.writer {
            Writer::Kernel { store } => Some(self.kernels.function(&coherency_writer(store))?),
            _ => None,
        };
        let payload_write = self.kernels.function(COH_PAYLOAD_WRITE)?;
        let (ctx, stream, results) = (self.ctx.clone(), self.stream.clone(), self.results.clone());
        let thread = std::thread::spawn(move || {
            let run = || -> Result<WriterReport, MeasurementError> {
                ctx.bind()?;
                match (&memory, plan.writer) {
                    (OwnedMemory::Host(block), Writer::Cpu) => Ok(cpu_writer(block.get(), plan)),
                    (OwnedMemory::Device(owner), Writer::Kernel { .. }) => {
                        let kernel = kernel.ok_or_else(|| MeasurementError::Missing("no writer kernel"))?;
                        let words = Words::of(owner.span())?;
                        kernel.launch_typed(
                            &stream,
                            LaunchConfig::linear(1, 32),
                            &[
                                KernelArg::Span(words.flag),
                                KernelArg::Span(words.ack),
                                KernelArg::Span(words.payload),
                                KernelArg::U64(PAYLOAD_WORDS),
                                KernelArg::U64(plan.rounds),
                                KernelArg::U64(plan.round_timeout_ns),
                                KernelArg::Span(words.write_ts()?),
                                KernelArg::Span(results.span()),
                            ],
                        )?;
                        Ok(WriterReport::default())
                    }
                    (OwnedMemory::Device(owner), Writer::StreamWrite) => {
                        let words = Words::of(owner.span())?;
                        let write_ts = words.write_ts()?;
                        let mut throttle = Throttle::new(&ctx);
                        for round in 1..=plan.rounds {
                            throttle.before(&stream, round)?;
                            if round > 1 {
                                words.ack.wait_value_u64(&stream, 0, round - 1, WaitCondition::AtLeast)?;
                            }
                            payload_write.launch_typed(
                                &stream,
                                LaunchConfig::linear(1, 32),
                                &[
                                    KernelArg::Span(words.payload),
                                    KernelArg::U64(PAYLOAD_WORDS),
                                    KernelArg::U64(round),
                                    KernelArg::Span(write_ts),
                                ],
                            )?;
                            words.flag.write_value_u64(&stream, 0, round)?;
                        }
                        Ok(WriterReport { rounds_done: plan.rounds, ..WriterReport::default() })
                    }
                    _ => Err(MeasurementError::Other(format!("writer {:?} does not run on this memory", plan.writer))),
                }
            };
            run().unwrap_or_else(|e| WriterReport { error: Some(e.to_string()), ..WriterReport::default() })
        });
        Ok(RunningWriter { thread })
    }

    /// Waits (bounded) for the writer's thread and stream, and reads its results.
    pub(super) fn finish(&self, running: RunningWriter, plan: CellPlan) -> WriterReport {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !running.thread.is_finished() {
            if Instant::now() > deadline {
                return WriterReport {
                    error: Some("the writer's thread did not finish within 30 s".to_owned()),
                    ..WriterReport::default()
                };
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut report = running.thread.join().unwrap_or_else(|_| WriterReport {
            error: Some("the writer's thread panicked".to_owned()),
            ..WriterReport::default()
        });
        if let Err(e) = wait_idle(&self.stream, deadline) {
            report.error.get_or_insert(e.to_string());
            return report;
        }
        if let Writer::Kernel { .. } = plan.writer {
            let mut words = [0u64; layout::RESULTS];
            match self.ctx.bind().and_then(|()| self.results.read(0, &mut words)) {
                Ok(()) => {
                    report.rounds_done = words[layout::R_DONE];
                    report.timeouts = words[layout::R_TIMEOUT];
                }
                Err(e) => report.error = Some(e.to_string()),
            }
        }
        report
    }
}

/// The CPU writer: relaxed payload stores, a release store of the flag, then a bounded spin for the ack.
pub(super) fn cpu_writer(words: &HostBlock, plan: CellPlan) -> WriterReport {
    let flag = &words[(layout::FLAG / 8) as usize];
    let ack = &words[(layout::ACK / 8) as usize];
    let payload = &words[(layout::PAYLOAD / 8) as usize..];
    let timeout = Duration::from_nanos(plan.round_timeout_ns);
    let mut report = WriterReport::default();
    report.round_trip_ns.reserve(plan.rounds as usize);
    for round in 1..=plan.rounds {
        for (k, word) in payload.iter().take((PAYLOAD_WORDS / 2) as usize).enumerate() {
            let k = k as u64;
            let pair = u64::from(layout::value(round, 2 * k)) | (u64::from(layout::value(round, 2 * k + 1)) << 32);
            word.store(pair, Ordering::Relaxed);
        }
        let stored = Instant::now();
        flag.store(round, Ordering::Release);
        loop {
            let seen = ack.load(Ordering::Acquire);
            if seen >= layout::ABORT {
                return report;
            }
            if seen >= round {
                break;
            }
            if stored.elapsed() > timeout {
                report.timeouts = 1;
                return report;
            }
            std::hint::spin_loop();
        }
        report.round_trip_ns.push(stored.elapsed().as_nanos() as f64);
        report.rounds_done = round;
    }
    report
}

/// Runs one cell; never fails (a failure is the cell's outcome), never hangs (every wait has a deadline, and the
/// abort value releases kernels and stream waits on both sides).
pub(super) fn run_cell(
    reader: &ReaderSide,
    memory: &Memory<'_>,
    writer_at: WriterAt<'_>,
    plan: CellPlan,
    reader_kind: Reader,
    placement: Placement,
) -> Cell {
    let mut cell = Cell {
        writer: plan.writer,
        reader: reader_kind,
        placement,
        rounds_planned: plan.rounds,
        rounds_done: 0,
        stale_rounds: 0,
        stale_words: 0,
        first_stale_round: 0,
        reader_timeouts: 0,
        writer_timeouts: 0,
        outcome: Outcome::Failed,
        latency_ns: None,
        latency_is_round_trip: plan.writer == Writer::Cpu,
        note: None,
    };
    let started = Instant::now();
    let result = run_cell_inner(reader, memory, &writer_at, plan, reader_kind, &mut cell);
    tracing::info!(
        writer = %plan.writer.label(),
        reader = %reader_kind.label(),
        placement = placement.label(),
        outcome = ?cell.outcome,
        rounds = cell.rounds_done,
        ms = started.elapsed().as_secs_f64() * 1e3,
        error = ?result.as_ref().err().map(ToString::to_string),
        "coherency cell"
    );
    match result {
        Ok(()) => {}
        Err(e) => {
            memory.abort();
            let _ = wait_idle(&reader.stream, Instant::now() + Duration::from_secs(10));
            cell.outcome = Outcome::Failed;
            cell.note = Some(e.to_string());
        }
    }
    cell
}

pub(super) fn run_cell_inner(
    reader: &ReaderSide,
    memory: &Memory<'_>,
    writer_at: &WriterAt<'_>,
    plan: CellPlan,
    reader_kind: Reader,
    cell: &mut Cell,
) -> Result<(), MeasurementError> {
    reader.ctx.bind()?;
    memory.reset(&reader.stream)?;
    reader.prepare()?;
    // The writer first: it waits for the reader's acks, the reader for its flags; either order works.
    let running_here = match writer_at {
        WriterAt::Child(child) => {
            child.channel().send(&ToWriter::Start(plan), Vec::new())?;
            match recv_from_writer(child, Duration::from_secs(30))? {
                FromWriter::Started => None,
                other => {
                    return Err(MeasurementError::Unexpected {
                        peer: "writer",
                        expected: "started",
                        got: format!("{other:?}"),
                    });
                }
            }
        }
        WriterAt::Here(side) => Some(side.start(plan)?),
    };
    let enqueue = reader.start(reader_kind, memory, plan)?;

    // Bounded wait for the reader; the kernel ends on its own at the first timed-out round.
    let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_micros(50 * plan.rounds);
    let mut late = false;
    loop {
        let enqueued = enqueue.as_ref().is_none_or(std::thread::JoinHandle::is_finished);
        if enqueued && reader.stream.is_idle()? {
            break;
        }
        if Instant::now() > deadline {
            late = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // Release whatever still waits (a writer whose reader gave up, or everything after the deadline).
    memory.abort();
    if let Some(thread) = enqueue {
        let until = Instant::now() + Duration::from_secs(10);
        while !thread.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(200));
        }
        if thread.is_finished()
            && let Ok(Err(e)) = thread.join()
        {
            cell.note = Some(format!("reader: {e}"));
        }
    }
    wait_idle(&reader.stream, Instant::now() + Duration::from_secs(10))?;

    let writer_report = match writer_at {
        WriterAt::Child(child) => {
            child.channel().send(&ToWriter::Finish, Vec::new())?;
            match recv_from_writer(child, Duration::from_secs(60))? {
                FromWriter::Finished(report) => report,
                other => {
                    return Err(MeasurementError::Unexpected {
                        peer: "writer",
                        expected: "finished",
                        got: format!("{other:?}"),
                    });
                }
            }
        }
        WriterAt::Here(side) => match running_here {
            Some(running) => side.finish(running, plan),
            None => WriterReport::default(),
        },
    };

    let mut words = [0u64; layout::RESULTS];
    reader.results.read(0, &mut words)?;
    cell.rounds_done = words[layout::R_DONE];
    cell.stale_rounds = words[layout::R_STALE_ROUNDS];
    cell.stale_words = words[layout::R_STALE_WORDS];
    cell.first_stale_round = words[layout::R_FIRST_STALE];
    cell.reader_timeouts = words[layout::R_TIMEOUT];
    cell.writer_timeouts = writer_report.timeouts;
    let aborted = words[layout::R_ABORTED] != 0;

    cell.latency_ns = if plan.writer == Writer::Cpu {
        Distribution::from_samples(&mut writer_report.round_trip_ns.clone())
    } else {
        let n = cell.rounds_done.min(plan.rounds) as usize;
        let mut seen = vec![0u64; n];
        let mut written = vec![0u64; n];
        if n > 0 {
            reader.seen_ts.read(0, &mut seen)?;
            let owner = memory.device_words();
            Words::of(owner.span())?.write_ts()?.read(0, &mut written)?;
        }
        let mut samples: Vec<f64> = seen.iter().zip(&written).map(|(&s, &w)| s.saturating_sub(w) as f64).collect();
        Distribution::from_samples(&mut samples)
    };
    cell.outcome = classify(cell, aborted || late);
    let mut notes: Vec<String> = cell.note.take().into_iter().collect();
    if late {
        notes.push("the reader did not finish before the cell's deadline and was aborted".to_owned());
    } else if aborted && cell.rounds_done < plan.rounds {
        notes.push("aborted".to_owned());
    }
    if let Some(e) = writer_report.error {
        notes.push(format!("writer: {e}"));
    }
    cell.note = (!notes.is_empty()).then(|| notes.join("; "));
    Ok(())
}

/// The outcome of a cell from its counts: stale data outranks everything (it is the failure that matters), then
/// timeouts, then anything that kept the cell from finishing.
pub fn classify(cell: &Cell, aborted: bool) -> Outcome {
    if cell.stale_rounds > 0 {
        Outcome::Stale
    } else if cell.reader_timeouts > 0 {
        Outcome::Timeout
    } else if aborted || cell.rounds_done < cell.rounds_planned {
        Outcome::Failed
    } else {
        Outcome::Correct
    }
}

pub(super) fn recv_from_writer(child: &ChildProcess, timeout: Duration) -> Result<FromWriter, MeasurementError> {
    let reply: serde_json::Value = child.channel().recv_plain(timeout)?;
    if let Ok(failure) = serde_json::from_value::<ChildFailure>(reply.clone()) {
        return Err(MeasurementError::Child { role: "coherency-writer".to_owned(), reason: failure.error });
    }
    serde_json::from_value(reply).map_err(|source| MeasurementError::Malformed { what: "writer".to_owned(), source })
}

/// What a coherency helper is asked to do (the envelope is [`ChildTask`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(tag = "role", content = "params")]
pub enum CoherencyTask {
    /// The writer of the cross-process cells, on `device`.
    #[serde(rename = "coherency-writer")]
    Writer {
        /// The device ordinal.
        device: i32,
    },
}

/// The writer child: imports the memory it is sent, then runs cells on request.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    let CoherencyTask::Writer { device } =
        task.decode().map_err(|source| MeasurementError::Malformed { what: "coherency task".to_owned(), source })?;
    let ctx = Context::for_ordinal(device)?;
    let mut side = WriterSide::new(&ctx, None)?;
    let mut _imported: Option<WordsOwner> = None;
    let mut running: Option<(RunningWriter, CellPlan)> = None;
    loop {
        let (message, mut fds): (ToWriter, _) = channel.recv(Duration::from_secs(3600))?;
        match message {
            ToWriter::ImportDevice(handle) => {
                let region: WordsOwner = Arc::new(ImportedRegion::import(&ctx, &handle, fds.pop())?);
                side.memory = Some(OwnedMemory::Device(region.clone()));
                _imported = Some(region);
                channel.send(&FromWriter::Ready, Vec::new())?;
            }
            ToWriter::MapHost => {
                let fd = fds.pop().ok_or_else(|| MeasurementError::Missing("no memfd came with MapHost"))?;
                let memory = SharedMemory::from_fd(fd, HOST_WORDS * 8)?;
                side.memory = Some(OwnedMemory::Host(Arc::new(SharedObject::new(memory)?)));
                channel.send(&FromWriter::Ready, Vec::new())?;
            }
            ToWriter::Start(plan) => {
                running = Some((side.start(plan)?, plan));
                channel.send(&FromWriter::Started, Vec::new())?;
            }
            ToWriter::Finish => {
                let report = match running.take() {
                    Some((writer, plan)) => side.finish(writer, plan),
                    None => WriterReport { error: Some("no cell was running".to_owned()), ..WriterReport::default() },
                };
                channel.send(&FromWriter::Finished(report), Vec::new())?;
            }
            ToWriter::Exit => return Ok(()),
        }
    }
}
