//! Kernel read and write bandwidth and latency on the process's own device memory against memory imported from
//! another process, per backend. The kernels are the overhead probe's (`kernels/cuda/probe_memory.cu`), timed
//! with CUDA events around the launches (`iter_custom`), never with the CPU clock.
//!
//! Memory kinds: `local` (`cuMemAlloc` here), `vmm-local` (`cuMemCreate` + map here), `legacy-imported` and
//! `vmm-imported` (a ring a helper process allocated and exported, attached here with `Consumer::attach`: legacy
//! IPC cannot import in the exporting process, so both imports come from another process).
//!
//! Groups (one bench per memory kind in each):
//! - `read-32MiB`, `read-256MiB`, `write-32MiB`, `write-256MiB`: one iteration is one kernel pass over the size
//!   (16-byte vectors, grid-stride); rate in GB/s. 32 MiB fits the 50 MB L2 of an H100, 256 MiB does not. (A
//!   smaller size would time the launches rather than the memory: a pass must outlast the CPU's launch call.)
//! - `load-latency-4MiB`, `load-latency-256MiB`: one iteration is one dependent load of a pointer chase (one
//!   thread) over that working set; launches of 16,384 loads, the time scaled to the iterations asked.
//! - `store-latency`: one iteration is one store + `__threadfence()` (one thread, 1 MiB of lines).
//!
//! Without a GPU it prints one line saying it is skipped and exits 0.

#![forbid(unsafe_code)]
// Benches may panic on setup failure: there is nobody to report an error to.
#![allow(clippy::expect_used)]

use std::time::Duration;

use criterion::{Criterion, Throughput};
use gpu_ipc::core::frames::Consumer;
use gpu_ipc::core::wire::SyncStrategy;
use gpu_ipc::driver::{
    Context, DeviceBuffer, DeviceMemory, DeviceSpan, Event, EventFlags, Function, KernelArg, LaunchConfig, Stream,
};
use gpu_ipc::kernels::probe::{MEM_CHASE, MEM_READ, MEM_STORE_LATENCY, MEM_WRITE, ProbeKernels};
use gpu_ipc::{BackendKind, legacy::Legacy, vmm::Vmm};
use gpu_ipc_benches::harness;
use gpu_ipc_benches::memory::{LINE, launches_for, scale_to_iters, stride_chain};
use gpu_ipc_benches::peer::{self, Helper, Role, attach_retrying, flat_geometry, socket_path};

const MIB: u64 = 1024 * 1024;
/// Every kind's buffer: the largest size measured.
const BYTES: u64 = 256 * MIB;
/// Dependent loads (or stores) per chase launch.
const STEPS: u64 = 16_384;

/// The kernels, a stream, and the events that time it.
struct Gpu {
    ctx: Context,
    stream: Stream,
    read: Function,
    write: Function,
    chase: Function,
    store: Function,
    /// The chase's per-step cycle counts and totals (read by nobody here) and its sink.
    scratch: DeviceBuffer,
    blocks: u32,
    start: Event,
    end: Event,
}

impl Gpu {
    fn new(ctx: &Context) -> Self {
        let kernels = ProbeKernels::load(ctx).expect("the probe kernels load");
        let sms = ctx.device().sm_count().expect("SM count");
        Self {
            ctx: ctx.clone(),
            stream: Stream::new(ctx).expect("stream"),
            read: kernels.function(MEM_READ).expect("read kernel"),
            write: kernels.function(MEM_WRITE).expect("write kernel"),
            chase: kernels.function(MEM_CHASE).expect("chase kernel"),
            store: kernels.function(MEM_STORE_LATENCY).expect("store kernel"),
            scratch: DeviceBuffer::alloc(ctx, 8 * (STEPS + 16)).expect("scratch"),
            blocks: sms * 8,
            start: Event::new(ctx, EventFlags::TIMING).expect("event"),
            end: Event::new(ctx, EventFlags::TIMING).expect("event"),
        }
    }

    /// GPU time of `launches` launches made by `launch(i)`, back to back on the stream, between two events.
    fn time(&self, launches: u64, mut launch: impl FnMut(u64)) -> Duration {
        self.start.record(&self.stream).expect("record");
        for i in 0..launches {
            launch(i);
        }
        self.end.record(&self.stream).expect("record");
        self.end.synchronize().expect("the launches complete");
        let ms = Event::elapsed_ms(&self.start, &self.end).expect("elapsed time");
        Duration::from_secs_f64(f64::from(ms) * 1e-3)
    }

    fn pass(&self, span: DeviceSpan<'_>, bytes: u64, write: bool, i: u64) {
        let span = span.slice(0, bytes).expect("the kind holds the size");
        let n_vec = bytes / 16;
        let blocks = n_vec.div_ceil(256).min(u64::from(self.blocks)).max(1) as u32;
        let config = LaunchConfig::linear(blocks, 256);
        let launched = if write {
            self.write.launch_typed(
                &self.stream,
                config,
                &[KernelArg::Span(span), KernelArg::U64(n_vec), KernelArg::U32(i as u32)],
            )
        } else {
            self.read.launch_typed(
                &self.stream,
                config,
                &[
                    KernelArg::Span(span),
                    KernelArg::U64(n_vec),
                    KernelArg::U32(0x9E37_79B9),
                    KernelArg::Span(self.scratch.span()),
                ],
            )
        };
        launched.expect("launch");
    }

    /// One chase launch of [`STEPS`] loads over `lines` lines of `span`, from line `start_line`.
    fn chase_once(&self, span: DeviceSpan<'_>, lines: u64, start_line: u64) {
        let sink = self.scratch.span().slice(8 * (STEPS + 8), 8 * 8).expect("sink");
        self.chase
            .launch_typed(
                &self.stream,
                LaunchConfig::linear(1, 32),
                &[
                    KernelArg::Span(span.slice(0, lines * LINE).expect("the kind holds the chain")),
                    KernelArg::U64((start_line % lines) * (LINE / 8)),
                    KernelArg::U64(0),
                    KernelArg::U64(STEPS),
                    KernelArg::Span(self.scratch.span()),
                    KernelArg::Span(sink),
                ],
            )
            .expect("launch");
    }

    fn store_once(&self, span: DeviceSpan<'_>) {
        self.store
            .launch_typed(
                &self.stream,
                LaunchConfig::linear(1, 32),
                &[
                    KernelArg::Span(span.slice(0, MIB).expect("1 MiB")),
                    KernelArg::U64(MIB / LINE),
                    KernelArg::U64(STEPS),
                    KernelArg::Span(self.scratch.span()),
                ],
            )
            .expect("launch");
    }

    /// Writes the chase chain over `bytes` at the start of `span`.
    fn write_chain(&self, span: DeviceSpan<'_>, bytes: u64) {
        span.write(0, &stride_chain(bytes / LINE)).expect("chain written");
        // The copy from pageable memory may still be in flight when cuMemcpyHtoD returns, and our stream does not
        // wait for the stream it ran on (the overhead probe saw a half-written chain without this).
        self.ctx.synchronize().expect("chain copy done");
    }
}

/// The memory kinds, each with what keeps it alive.
struct Kinds {
    local: DeviceBuffer,
    vmm_local: <Vmm as gpu_ipc::core::backend::Backend>::Exported,
    legacy_imported: Consumer<Legacy>,
    vmm_imported: Consumer<Vmm>,
    /// The exporting processes: they must outlive the imports.
    _helpers: Vec<Helper>,
}

impl Kinds {
    fn new(ctx: &Context) -> Self {
        let local = DeviceBuffer::alloc(ctx, BYTES).expect("local cuMemAlloc");
        let vmm_local = <Vmm as gpu_ipc::core::backend::Backend>::allocate(ctx, BYTES).expect("local VMM allocation");
        let geometry = flat_geometry(BYTES).expect("geometry");
        let mut helpers = Vec::new();
        let mut exporter = |backend: BackendKind| {
            let socket = socket_path(&format!("memory-{backend}"));
            let role = Role::Exporter {
                backend,
                sync: SyncStrategy::CpuSpin,
                socket: socket.clone(),
                geometry,
                slots: 1,
                device: harness::device_ordinal(),
            };
            helpers.push(Helper::spawn(&format!("{backend} exporter"), &role).expect("exporter helper"));
            socket
        };
        let legacy_socket = exporter(BackendKind::Legacy);
        let vmm_socket = exporter(BackendKind::Vmm);
        let legacy_imported = attach_retrying::<Legacy>(ctx, &legacy_socket, "memory-bench").expect("legacy import");
        let vmm_imported = attach_retrying::<Vmm>(ctx, &vmm_socket, "memory-bench").expect("vmm import");
        Self { local, vmm_local, legacy_imported, vmm_imported, _helpers: helpers }
    }

    fn spans(&self) -> [(&'static str, DeviceSpan<'_>); 4] {
        [
            ("local", self.local.span()),
            ("vmm-local", self.vmm_local.span()),
            ("legacy-imported", self.legacy_imported.region().span()),
            ("vmm-imported", self.vmm_imported.region().span()),
        ]
    }
}

fn bandwidth(c: &mut Criterion, gpu: &Gpu, kinds: &Kinds) {
    for (write, what) in [(false, "read"), (true, "write")] {
        for bytes in [32 * MIB, BYTES] {
            let mut group = c.benchmark_group(format!("{what}-{}MiB", bytes / MIB));
            group.throughput(Throughput::BytesDecimal(bytes));
            for (kind, span) in kinds.spans() {
                group.bench_function(kind, |b| {
                    b.iter_custom(|iters| gpu.time(iters, |i| gpu.pass(span, bytes, write, i)));
                });
            }
            group.finish();
        }
    }
}

fn latency(c: &mut Criterion, gpu: &Gpu, kinds: &Kinds) {
    for bytes in [4 * MIB, BYTES] {
        let lines = bytes / LINE;
        for (_, span) in kinds.spans() {
            gpu.write_chain(span, bytes);
        }
        let mut group = c.benchmark_group(format!("load-latency-{}MiB", bytes / MIB));
        for (kind, span) in kinds.spans() {
            group.bench_function(kind, |b| {
                b.iter_custom(|iters| {
                    let launches = launches_for(iters, STEPS);
                    let took = gpu.time(launches, |i| gpu.chase_once(span, lines, i * 7919));
                    scale_to_iters(took, launches * STEPS, iters)
                });
            });
        }
        group.finish();
    }
    let mut group = c.benchmark_group("store-latency");
    for (kind, span) in kinds.spans() {
        group.bench_function(kind, |b| {
            b.iter_custom(|iters| {
                let launches = launches_for(iters, STEPS);
                let took = gpu.time(launches, |_| gpu.store_once(span));
                scale_to_iters(took, launches * STEPS, iters)
            });
        });
    }
    group.finish();
}

fn main() {
    peer::run_if_helper();
    let Some(ctx) = harness::gpu_or_skip("gpu_memory") else { return };
    let mut c = harness::criterion();
    let gpu = Gpu::new(&ctx);
    let kinds = Kinds::new(&ctx);
    bandwidth(&mut c, &gpu, &kinds);
    latency(&mut c, &gpu, &kinds);
    c.final_summary();
}
