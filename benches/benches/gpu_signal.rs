//! Cross-process signalling through the frame API, per backend and strategy.
//!
//! - `round-trip-<backend>/<strategy>`: a ping-pong between this process and a helper process over two one-slot
//!   rings of 256-byte frames. One iteration is one round trip: this process acquires and publishes a frame on its
//!   ring; the helper's `next_frame` sees it, it releases it and publishes a frame on its own ring; this
//!   process's `next_frame` sees that and releases it. Both sides pass a stream, as an application does. Timed on
//!   the CPU over the batch, ending with a stream sync, so for the GPU-side strategies (whose calls return once
//!   the waits are queued) the figure is the GPU's round trip with the run-ahead bound's CPU naps included.
//!   After criterion's measurement, 10,000 round trips are timed one by one (for `gpu-stream-ops`, each followed
//!   by a stream sync) for their percentiles (printed, and written where `GPU_IPC_BENCH_SAMPLES` points).
//! - `device-api-round-trip-<backend>/<strategy>`: the ring's device API for persistent kernels. This process
//!   publishes 256-byte frames on a one-slot ring (`gpu-stream-ops` or `gpu-poll`); a helper process consumes them
//!   with one persistent kernel (`gpu_ipc_persistent_verify`, launched once through `Consumer::launch_on_ring`),
//!   which waits for each frame and releases it through the device API (`kernels/cuda/gpu_ipc_ring.cuh`: the
//!   ring's device words when the publisher writes them, as gpu-poll's release kernel and a persistent kernel do,
//!   the control block's counters when it does not, as a gpu-stream-ops stream does). One iteration is one
//!   round trip: this process's stream waits for the kernel's release of the previous frame, then publishes the
//!   next; timed over the batch, ending with a stream sync. Under MPS only (without it the kernel and this
//!   process's stream take turns on the GPU): it says NOT MEASURED otherwise. `<strategy>-both-persistent`: the
//!   same, with this process's frames published by a persistent kernel too (`gpu_ipc_persistent_fill`, launched
//!   through `Producer::launch_on_ring`), so no stream and no CPU is on the path: one iteration is one frame of a
//!   kernel launched for the whole batch, timed from its launch to its end.
//! - `attach-<backend>/<strategy>`: `Consumer::attach` end to end (connect, handshake, control block, import of
//!   a ring of two 4K RGB frames, the strategy's setup) against a helper producer that admits continuously; the
//!   detach after each attach is not timed. After the measurement, 50 attaches and detaches are timed one by one.
//!
//! Without a GPU it prints one line saying it is skipped and exits 0.

#![forbid(unsafe_code)]
// Benches may panic on setup failure: there is nobody to report an error to.
#![allow(clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy};
use gpu_ipc::driver::mps::MpsEvidence;
use gpu_ipc::driver::{Context, Stream};
use gpu_ipc::{BackendKind, GpuBackendVisitor};
use gpu_ipc_benches::harness::{self, record_one_by_one};
use gpu_ipc_benches::peer::{self, Helper, Role, WAIT, attach_retrying, flat_geometry, socket_path};
use gpu_ipc_kernels::persistent::{PersistentFill, PersistentOutcome};

/// Round trips timed one by one after criterion's measurement (after as many untimed).
const ONE_BY_ONE_ROUND_TRIPS: usize = 10_000;
const WARM_UP_ROUND_TRIPS: usize = 1_000;
/// Attaches (and detaches) timed one by one after criterion's measurement.
const ONE_BY_ONE_ATTACHES: usize = 50;

/// This process's end of the ping-pong. Fields drop in order: our consumer, our producer (the helper then sees
/// its producer gone and leaves), the helper, the stream.
struct PingPong<B: GpuBackend> {
    pong: Consumer<B>,
    ping: Producer<B>,
    _helper: Helper,
    stream: Stream,
}

impl<B: GpuBackend> PingPong<B> {
    fn new(ctx: &Context, backend: BackendKind, sync: SyncStrategy) -> Result<Self, FrameError> {
        let (ping_path, pong_path) =
            (socket_path(&format!("ping-{backend}-{sync}")), socket_path(&format!("pong-{backend}-{sync}")));
        let geometry = flat_geometry(256)?;
        let mut ping = Producer::<B>::create(ctx, ProducerConfig::new(&ping_path, geometry, 1, sync))?;
        let role =
            Role::Echo { backend, sync, ping: ping_path, pong: pong_path.clone(), device: harness::device_ordinal() };
        let helper =
            Helper::spawn(&format!("echo {backend} {sync}"), &role).map_err(|e| FrameError::Config(e.to_string()))?;
        // The helper attaches to our ring first (we hand it its offer here), then we attach to its ring.
        ping.wait_for_consumers(1, WAIT)?;
        let pong = attach_retrying::<B>(ctx, &pong_path, "signal-bench")?;
        Ok(Self { pong, ping, _helper: helper, stream: Stream::new(ctx)? })
    }

    fn round_trip(&mut self) {
        let stream = Some(&self.stream);
        let lease = self.ping.acquire(stream, WAIT).expect("acquire");
        self.ping.publish(lease, stream).expect("publish");
        let frame = self.pong.next_frame(stream, WAIT).expect("the answer");
        self.pong.release(frame, stream).expect("release");
    }

    fn batch(&mut self, iters: u64) -> Duration {
        let started = Instant::now();
        for _ in 0..iters {
            self.round_trip();
        }
        self.stream.synchronize().expect("the round trips complete");
        started.elapsed()
    }

    /// Round trips timed one by one. A CPU-side strategy's round trip is over when `next_frame` returns (this
    /// process saw the answer); a GPU-side one's calls return once the waits are queued, so each round trip is
    /// followed by a stream sync, which the time includes.
    fn one_by_one(&mut self, sync_each: bool) -> Vec<f64> {
        for _ in 0..WARM_UP_ROUND_TRIPS {
            self.round_trip();
        }
        self.stream.synchronize().expect("sync");
        (0..ONE_BY_ONE_ROUND_TRIPS)
            .map(|_| {
                let started = Instant::now();
                self.round_trip();
                if sync_each {
                    self.stream.synchronize().expect("the round trip completes");
                }
                started.elapsed().as_nanos() as f64
            })
            .collect()
    }
}

struct RoundTrips<'a> {
    c: &'a mut Criterion,
    ctx: &'a Context,
    backend: BackendKind,
}

impl GpuBackendVisitor for RoundTrips<'_> {
    type Output = ();
    fn visit<B: GpuBackend>(self) {
        let group_name = format!("round-trip-{}", self.backend);
        let mut group = self.c.benchmark_group(&group_name);
        for sync in SyncStrategy::ALL {
            let id = format!("{group_name}/{sync}");
            let mut pair = match PingPong::<B>::new(self.ctx, self.backend, sync) {
                Ok(pair) => pair,
                Err(e) => {
                    eprintln!("{id}: NOT MEASURED: {e}");
                    continue;
                }
            };
            let mut ran = false;
            group.bench_function(sync.to_string(), |b| {
                ran = true;
                b.iter_custom(|iters| pair.batch(iters));
            });
            if ran && harness::measuring() {
                let what = if sync.is_gpu_side() { "one round trip, then a stream sync" } else { "one round trip" };
                record_one_by_one(&id, what, pair.one_by_one(sync.is_gpu_side()));
            }
        }
        group.finish();
    }
}

/// This process's end of the device API's round trip: its producer, then the helper whose kernel consumes; with
/// `fill`, a persistent kernel publishes this side's frames too.
struct PersistentPair<B: GpuBackend> {
    ping: Producer<B>,
    _helper: Helper,
    stream: Stream,
    fill: Option<PersistentFill>,
}

impl<B: GpuBackend> PersistentPair<B> {
    fn new(ctx: &Context, backend: BackendKind, sync: SyncStrategy, both: bool) -> Result<Self, FrameError> {
        let tag = if both { "both" } else { "one" };
        let path = socket_path(&format!("persistent-{tag}-{backend}-{sync}"));
        let geometry = flat_geometry(256)?;
        let mut ping = Producer::<B>::create(ctx, ProducerConfig::new(&path, geometry, 1, sync))?;
        let role = Role::PersistentSink { backend, ping: path, device: harness::device_ordinal() };
        let helper = Helper::spawn(&format!("persistent sink {backend} {sync}"), &role)
            .map_err(|e| FrameError::Config(e.to_string()))?;
        ping.wait_for_consumers(1, WAIT)?;
        let fill =
            if both { Some(PersistentFill::load(ctx).map_err(|e| FrameError::Config(e.to_string()))?) } else { None };
        Ok(Self { ping, _helper: helper, stream: Stream::new(ctx)?, fill })
    }

    fn batch(&mut self, iters: u64) -> Duration {
        if let Some(fill) = &self.fill {
            let started = Instant::now();
            fill.launch(&mut self.ping, &self.stream, iters, WAIT).expect("launch the persistent producer");
            let result = fill.finish(&mut self.ping, WAIT.saturating_mul(4)).expect("the persistent producer ends");
            let elapsed = started.elapsed();
            assert_eq!((result.frames, result.outcome), (iters, PersistentOutcome::Done), "{result:?}");
            return elapsed;
        }
        let stream = Some(&self.stream);
        let started = Instant::now();
        for _ in 0..iters {
            let lease = self.ping.acquire(stream, WAIT).expect("acquire");
            self.ping.publish(lease, stream).expect("publish");
        }
        self.stream.synchronize().expect("the round trips complete");
        started.elapsed()
    }
}

struct DeviceApiRoundTrips<'a> {
    c: &'a mut Criterion,
    ctx: &'a Context,
    backend: BackendKind,
}

impl GpuBackendVisitor for DeviceApiRoundTrips<'_> {
    type Output = ();
    fn visit<B: GpuBackend>(self) {
        let group_name = format!("device-api-round-trip-{}", self.backend);
        if let Some(why) = MpsEvidence::gather(self.ctx.device()).why_not() {
            eprintln!("{group_name}: NOT MEASURED: a persistent kernel needs MPS here ({why})");
            return;
        }
        let mut group = self.c.benchmark_group(&group_name);
        // The GPU-side strategies, as the strategy describes itself.
        for sync in SyncStrategy::ALL.into_iter().filter(|s| s.is_gpu_side()) {
            for both in [false, true] {
                let id = if both { format!("{sync}-both-persistent") } else { sync.to_string() };
                let mut pair = match PersistentPair::<B>::new(self.ctx, self.backend, sync, both) {
                    Ok(pair) => pair,
                    Err(e) => {
                        eprintln!("{group_name}/{id}: NOT MEASURED: {e}");
                        continue;
                    }
                };
                group.bench_function(id, |b| b.iter_custom(|iters| pair.batch(iters)));
            }
        }
        group.finish();
    }
}

struct Attaches<'a> {
    c: &'a mut Criterion,
    ctx: &'a Context,
    backend: BackendKind,
}

impl GpuBackendVisitor for Attaches<'_> {
    type Output = ();
    fn visit<B: GpuBackend>(self) {
        let group_name = format!("attach-{}", self.backend);
        let mut group = self.c.benchmark_group(&group_name);
        group.sampling_mode(SamplingMode::Flat).sample_size(10);
        let geometry = FrameGeometry::new(3840, 2160, PixelFormat::Rgb8).expect("4K RGB");
        // cpu-sleep sets up exactly as cpu-spin does.
        for sync in [SyncStrategy::CpuSpin, SyncStrategy::IpcEvent, SyncStrategy::GpuStreamOps] {
            let id = format!("{group_name}/{sync}");
            let socket = socket_path(&format!("attach-{}-{sync}", self.backend));
            let role = Role::Exporter {
                backend: self.backend,
                sync,
                socket: socket.clone(),
                geometry,
                slots: 2,
                device: harness::device_ordinal(),
            };
            let _helper = match Helper::spawn(&format!("exporter {} {sync}", self.backend), &role) {
                Ok(helper) => helper,
                Err(e) => {
                    eprintln!("{id}: NOT MEASURED: {e}");
                    continue;
                }
            };
            // The first import of a process is slower (the driver sets up IPC); it is not what is measured here.
            let attacher = Attacher::<B> { ctx: self.ctx, socket, _backend: std::marker::PhantomData };
            if let Err(e) = attacher.attach() {
                eprintln!("{id}: NOT MEASURED: {e}");
                continue;
            }
            let mut ran = false;
            group.bench_function(sync.to_string(), |b| {
                ran = true;
                b.iter_custom(|iters| (0..iters).map(|_| attacher.attach().expect("attach").0).sum::<Duration>());
            });
            if ran && harness::measuring() {
                let (attach, detach): (Vec<f64>, Vec<f64>) = (0..ONE_BY_ONE_ATTACHES)
                    .map(|_| attacher.attach().expect("attach"))
                    .map(|(a, d)| (a.as_nanos() as f64, d.as_nanos() as f64))
                    .unzip();
                record_one_by_one(&id, "one Consumer::attach", attach);
                record_one_by_one(&format!("detach-{}/{sync}", self.backend), "one Consumer::detach", detach);
            }
        }
        group.finish();
    }
}

struct Attacher<'a, B> {
    ctx: &'a Context,
    socket: PathBuf,
    _backend: std::marker::PhantomData<B>,
}

impl<B: GpuBackend> Attacher<'_, B> {
    /// One attach and one detach; how long each took.
    fn attach(&self) -> Result<(Duration, Duration), FrameError> {
        let options = AttachOptions { name: "attach-bench".to_owned(), timeout: WAIT, ..AttachOptions::default() };
        let started = Instant::now();
        let consumer = Consumer::<B>::attach(self.ctx, &self.socket, &options)?;
        let attached = started.elapsed();
        let started = Instant::now();
        consumer.detach();
        Ok((attached, started.elapsed()))
    }
}

fn main() {
    peer::run_if_helper();
    let Some(ctx) = harness::gpu_or_skip("gpu_signal") else { return };
    let mut c = harness::criterion();
    for &backend in gpu_ipc::COMPILED_GPU {
        if let Err(e) = gpu_ipc::dispatch_gpu(backend, RoundTrips { c: &mut c, ctx: &ctx, backend }) {
            eprintln!("gpu_signal: {e}");
        }
    }
    for &backend in gpu_ipc::COMPILED_GPU {
        if let Err(e) = gpu_ipc::dispatch_gpu(backend, DeviceApiRoundTrips { c: &mut c, ctx: &ctx, backend }) {
            eprintln!("gpu_signal: {e}");
        }
    }
    for &backend in gpu_ipc::COMPILED_GPU {
        if let Err(e) = gpu_ipc::dispatch_gpu(backend, Attaches { c: &mut c, ctx: &ctx, backend }) {
            eprintln!("gpu_signal: {e}");
        }
    }
    c.final_summary();
}
