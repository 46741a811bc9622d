//! The memory pool on a real GPU, owner and importer in separate processes, legacy and vmm: named buffers checked
//! in place by the importer; the attach cost at 1 GiB and 16 GiB and the per-lookup cost (printed, and appended to
//! `pool-<GPU_IPC_RESULTS_TAG>.jsonl` in `GPU_IPC_RESULTS_DIR` when set); memory another allocator made
//! (`cuMemAlloc`, and `cuMemCreate` with the POSIX-fd handle type) shared in place and read by another process;
//! memory that cannot be shared so refused with the reason; a freed buffer's bytes waiting for the stream its work
//! was queued on, and its stale handle refusing its span; an importer on another GPU refused (two GPUs). Ignored
//! without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{exe, socket};
use gpu_ipc::core::backend::GpuBackend;
use gpu_ipc::driver::{
    Context, Device, DeviceBuffer, DeviceMemory, DevicePtr, DeviceSpan, HandleTypes, PoolAllocation, Stream,
    VmmAllocation, VmmGranularity, VmmMapping,
};
use gpu_ipc::legacy::Legacy;
use gpu_ipc::pool::{AttachOptions, DType, PoolConfig, PoolError, PoolImporter, SharedPool, TensorDesc};
use gpu_ipc::vmm::Vmm;
use gpu_ipc_examples::pool_work::{checked_ranges, pattern_word, seed_of};

const BACKENDS: [&str; 2] = ["legacy", "vmm"];

fn record(result: &serde_json::Value) {
    common::record("pool", result);
}

/// Runs the `pool` program with `args` and returns its JSON summary (it must succeed).
fn pool_program(args: &[&str]) -> serde_json::Value {
    let out = Command::new(exe("pool")).args(args).stderr(Stdio::inherit()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pool {args:?}: {}\n{stdout}", out.status);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("pool {args:?} printed {stdout:?}: {e}"))
}

/// An importer process that checks every buffer of the pool at `path` against its pattern.
fn importer_checks(backend: &str, path: &Path) -> serde_json::Value {
    pool_program(&[
        "importer",
        "--json",
        "--backend",
        backend,
        "--socket",
        path.to_str().unwrap(),
        "--attaches",
        "1",
        "--rounds",
        "10",
    ])
}

fn bench(backend: &str, capacity_mib: u64, buffers: u64, attaches: u64) -> serde_json::Value {
    let args = [
        "bench",
        "--json",
        "--backend",
        backend,
        "--capacity-mib",
        &capacity_mib.to_string(),
        "--buffers",
        &buffers.to_string(),
        "--attaches",
        &attaches.to_string(),
        "--rounds",
        "2000",
    ];
    let summary = pool_program(&args);
    let importer = &summary["importer"];
    assert_eq!(importer["buffers"], buffers, "{summary}");
    assert_eq!(importer["verified"], buffers, "{summary}");
    assert_eq!(importer["mismatched_words"], 0, "{summary}");
    assert!(importer["attach_ms_p50"].as_f64().unwrap() > 0.0, "{summary}");
    assert!(importer["lookup_ns_p50"].as_f64().unwrap() > 0.0, "{summary}");
    summary
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_importer_process_finds_and_checks_every_named_buffer_on_both_backends() {
    for backend in BACKENDS {
        let summary = bench(backend, 256, 32, 5);
        record(&serde_json::json!({ "test": "pool-buffers", "summary": summary }));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attach_cost_at_1_and_16_gib_and_lookup_cost() {
    for backend in BACKENDS {
        for gib in [1u64, 16] {
            let summary = bench(backend, gib << 10, 64, 20);
            let i = &summary["importer"];
            eprintln!(
                "pool {backend} {gib} GiB: attach p50 {:.3} ms p99 {:.3} ms; lookup p50 {:.0} ns p99 {:.0} ns",
                i["attach_ms_p50"].as_f64().unwrap(),
                i["attach_ms_p99"].as_f64().unwrap(),
                i["lookup_ns_p50"].as_f64().unwrap(),
                i["lookup_ns_p99"].as_f64().unwrap()
            );
            record(&serde_json::json!({ "test": "pool-attach-cost", "gib": gib, "summary": summary }));
        }
    }
}

/// Writes the pattern of buffer `name` (as the `pool` program checks it) into `span`.
fn write_pattern(span: DeviceSpan<'_>, name: &str) {
    for (first, count) in checked_ranges(span.len()) {
        let words: Vec<u32> = (first..first + count).map(|i| pattern_word(seed_of(name), i)).collect();
        span.write(first * 4, &words).unwrap();
    }
}

/// Shares two ranges of `memory` (made by another allocator) through a pool of backend `B`, and has an importer
/// process check both in place.
fn share_and_check<B: GpuBackend>(ctx: &Context, memory: DeviceSpan<'_>, tag: &str) {
    let ranges = [("torch/0", 64 * 1024, 1 << 20), ("torch/1", 2 << 20, 512 * 1024)];
    share_ranges_and_check::<B>(ctx, memory, tag, &ranges, 1);
}

/// Shares `ranges` (name, offset, bytes) of `memory` through a pool of backend `B`, expecting `allocations` shared
/// allocations (blocks), and has an importer process check every one in place.
fn share_ranges_and_check<B: GpuBackend>(
    ctx: &Context,
    memory: DeviceSpan<'_>,
    tag: &str,
    ranges: &[(&str, u64, u64)],
    allocations: u32,
) {
    let path = socket(&format!("existing-{tag}"));
    let pool = SharedPool::<B>::create(ctx, &path, PoolConfig::sharing_only()).unwrap();
    let mut handles = Vec::new();
    for &(name, offset, len) in ranges {
        let span = memory.slice(offset, len).unwrap();
        write_pattern(span, name);
        let desc = TensorDesc::contiguous(DType::F32, [len / 4]).unwrap();
        handles.push(pool.share_existing(name, span.ptr(), len, Some(desc)).unwrap());
    }
    assert_eq!(pool.stats().shared_allocations, allocations, "one export per allocation (or run of them) shared");
    let report = importer_checks(B::KIND.name(), &path);
    let n = ranges.len() as u64;
    assert_eq!((report["buffers"].as_u64(), report["verified"].as_u64()), (Some(n), Some(n)), "{report}");
    assert_eq!(report["mismatched_words"], 0, "{report}");
    record(
        &serde_json::json!({ "test": "pool-share-existing", "tag": tag, "backend": B::KIND.name(), "importer": report }),
    );
    for handle in handles {
        pool.free(handle).unwrap();
    }
    assert_eq!(pool.stats().shared_allocations, 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cumemalloc_allocation_is_shared_in_place_and_read_by_another_process() {
    let ctx = Context::for_ordinal(0).unwrap();
    let memory = DeviceBuffer::alloc(&ctx, 8 << 20).unwrap();
    share_and_check::<Legacy>(&ctx, memory.span(), "legacy");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_vmm_allocation_with_the_posix_fd_handle_type_is_shared_in_place_and_read_by_another_process() {
    let ctx = Context::for_ordinal(0).unwrap();
    let size = VmmGranularity::for_device(ctx.device()).unwrap().round_up(8 << 20);
    let memory = VmmMapping::map(VmmAllocation::create(&ctx, size).unwrap()).unwrap();
    share_and_check::<Vmm>(&ctx, memory.span(), "vmm");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_range_over_vmm_allocations_side_by_side_is_shared_as_one_span_and_read_by_another_process() {
    // What PyTorch's expandable segments make: many cuMemCreate allocations mapped one after the other. Here 12 of
    // the minimum granularity (more than the 8 fds one block-channel message carries).
    let ctx = Context::for_ordinal(0).unwrap();
    let g = VmmGranularity::for_device(ctx.device()).unwrap().minimum;
    let allocations = (0..12).map(|_| VmmAllocation::create(&ctx, g).unwrap()).collect();
    let memory = VmmMapping::map_side_by_side(allocations).unwrap();
    assert_eq!(memory.allocations().count(), 12);
    let ranges = [
        ("torch/inside", 64 * 1024, 1 << 20),
        ("torch/straddles-2", g - 4096, 8192),
        ("torch/straddles-3", 3 * g - (256 << 10), g + (512 << 10)),
        ("torch/all-12", 0, 12 * g),
    ];
    share_ranges_and_check::<Vmm>(&ctx, memory.span(), "vmm-side-by-side", &ranges, 4);
}

/// The error `share_existing` gives for `len` bytes at `ptr` through a sharing-only pool of backend `B`.
fn refusal<B: GpuBackend>(ctx: &Context, ptr: DevicePtr, len: u64, tag: &str) -> String {
    let pool = SharedPool::<B>::create(ctx, socket(&format!("refuse-{tag}")), PoolConfig::sharing_only()).unwrap();
    match pool.share_existing("x", ptr, len, None) {
        Err(e @ PoolError::Backend(_)) => e.to_string(),
        other => panic!("{tag}: expected the backend's refusal, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn memory_that_cannot_be_shared_in_place_is_refused_with_the_reason() {
    let ctx = Context::for_ordinal(0).unwrap();
    let granularity = VmmGranularity::for_device(ctx.device()).unwrap();
    let plain = DeviceBuffer::alloc(&ctx, 1 << 20).unwrap();
    let vmm = VmmMapping::map(VmmAllocation::create(&ctx, granularity.minimum).unwrap()).unwrap();
    let private =
        VmmMapping::map(VmmAllocation::create_with_handle_types(&ctx, granularity.minimum, HandleTypes::NONE).unwrap())
            .unwrap();
    let stream_ordered = PoolAllocation::alloc(&ctx, None, 1 << 20).unwrap();

    let e = refusal::<Vmm>(&ctx, plain.ptr(), 4096, "vmm-cumemalloc");
    assert!(e.contains("cuMemAlloc allocation") && e.contains("use the legacy backend"), "{e}");
    let e = refusal::<Legacy>(&ctx, vmm.ptr(), 4096, "legacy-vmm");
    assert!(e.contains("VMM (cuMemCreate) allocation") && e.contains("use the vmm backend"), "{e}");
    let e = refusal::<Vmm>(&ctx, private.ptr(), 4096, "vmm-no-fd");
    assert!(e.contains("allows no shareable handle type") && e.contains("POSIX-fd handle type"), "{e}");
    let e = refusal::<Legacy>(&ctx, stream_ordered.ptr(), 4096, "legacy-async");
    assert!(e.contains("stream-ordered memory pool"), "{e}");
    let e = refusal::<Vmm>(&ctx, stream_ordered.ptr(), 4096, "vmm-async");
    assert!(e.contains("stream-ordered") || e.contains("allows no shareable handle type"), "{e}");
    let e = refusal::<Legacy>(&ctx, plain.ptr().offset(4096), 1 << 20, "legacy-past-end");
    assert!(e.contains("run past the end of the allocation") && e.contains("cuIpcGetMemHandle covers one"), "{e}");
    assert!(e.contains("use the vmm backend"), "{e}");
    // A range that runs from a shareable allocation into one side by side with it that is not: refused, naming why.
    let mixed = VmmMapping::map_side_by_side(vec![
        VmmAllocation::create(&ctx, granularity.minimum).unwrap(),
        VmmAllocation::create_with_handle_types(&ctx, granularity.minimum, HandleTypes::NONE).unwrap(),
    ])
    .unwrap();
    let e = refusal::<Vmm>(&ctx, mixed.ptr().offset(4096), granularity.minimum, "vmm-into-private");
    assert!(e.contains("run past the memory mapped there") && e.contains("allows no shareable handle type"), "{e}");
}

/// Frees a buffer of a pool of backend `B` while its stream is held busy: its bytes wait for the stream; a handle
/// kept after `free_name` refuses its span and holds its bytes until dropped.
fn freed_bytes_wait_for_the_gpu<B: GpuBackend>(ctx: &Context, tag: &str) {
    let pool = SharedPool::<B>::create(ctx, socket(&format!("fence-{tag}")), PoolConfig::new(4 << 20)).unwrap();
    let a = pool.alloc("a", 1 << 20, 256, None).unwrap();
    a.span().unwrap().write(0, &[7u32; 64]).unwrap();
    let watch = a.reclaim_watch();
    let stream = Stream::new(ctx).unwrap();
    // The stream's work "runs" until the test lets it go (bounded: 20 s).
    let (go, gate) = std::sync::mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = gate.recv_timeout(std::time::Duration::from_secs(20));
        })
        .unwrap();
    pool.free_after(a, &stream).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(pool.reclaim(), 0, "{tag}: the stream's work is not done");
    assert!(watch.is_freed() && !watch.is_reclaimed());
    assert_eq!(pool.stats().pending_buffers, 1);
    go.send(()).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(pool.reclaim(), 1, "{tag}: the stream finished and nobody pins it");
    assert!(watch.is_reclaimed());

    let b = pool.alloc("b", 1 << 20, 256, None).unwrap();
    pool.free_name("b").unwrap(); // waits for the context's work, then the name is gone
    assert!(matches!(b.span(), Err(PoolError::StaleBuffer { ref name, current: None, .. }) if name == "b"));
    assert_eq!((pool.reclaim(), pool.stats().pending_buffers), (0, 1), "{tag}: the handle holds the bytes");
    drop(b);
    assert_eq!(pool.reclaim(), 1);
    record(&serde_json::json!({ "test": "pool-free-waits-for-gpu", "backend": tag, "ok": true }));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_freed_buffer_waits_for_its_stream_and_a_stale_handle_refuses_its_span() {
    let ctx = Context::for_ordinal(0).unwrap();
    freed_bytes_wait_for_the_gpu::<Legacy>(&ctx, "legacy");
    freed_bytes_wait_for_the_gpu::<Vmm>(&ctx, "vmm");
}

/// Tests that need two GPUs (scripts/gpu-suite.sh runs them where it finds two).
mod two_gpus {
    use super::*;

    #[test]
    #[ignore = "needs two CUDA GPUs"]
    fn an_importer_on_another_gpu_is_refused_naming_both() {
        let count = Device::count().unwrap();
        assert!(count >= 2, "this test needs two GPUs; this machine has {count}");
        let (ctx0, ctx1) = (Context::for_ordinal(0).unwrap(), Context::for_ordinal(1).unwrap());
        let (uuid0, uuid1) = (ctx0.device().uuid().unwrap(), ctx1.device().uuid().unwrap());
        let pool = SharedPool::<Vmm>::create(&ctx0, socket("other-gpu"), PoolConfig::new(2 << 20)).unwrap();
        let err = PoolImporter::<Vmm>::attach(&ctx1, pool.path(), &AttachOptions::default()).unwrap_err();
        match &err {
            PoolError::WrongDevice { offered, here, .. } => assert_eq!((*offered, *here), (uuid0, uuid1)),
            other => panic!("expected WrongDevice, got {other}"),
        }
        let message = err.to_string();
        assert!(message.contains(&uuid0.to_string()) && message.contains(&uuid1.to_string()), "{message}");
        assert!(PoolImporter::<Vmm>::attach(&ctx0, pool.path(), &AttachOptions::default()).is_ok());
    }
}
