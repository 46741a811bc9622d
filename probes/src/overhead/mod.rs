//! `gpu-ipc probe overhead`: is memory imported from another process slower for kernels than memory the process
//! allocated itself?
//!
//! The same kernels (`kernels/cuda/probe_memory.cu`) run on every memory kind: the process's own `cuMemAlloc`
//! memory, `cuMemAlloc` memory of another process opened with a legacy handle, the process's own VMM memory
//! (`cuMemCreate` + map), another process's VMM memory imported from an fd, and, on a machine with two GPUs, another
//! GPU's memory imported from a process on that GPU. Per kind: read and write bandwidth over sizes from 4 KiB to
//! 1 GiB, dependent-load latency over working sets that sit in L1, L2 and DRAM, store latency; each measured in
//! several runs so that the run-to-run spread is known. Then attach and detach cost per backend and size, in this
//! process (repeated) and as the first import of fresh processes.

mod measure;
mod model;
mod render;
mod verdict;

use std::time::Duration;

use gpu_ipc::driver::{Context, Device, DeviceBuffer, DeviceMemory, DeviceSpan};

use harness::env::MeasurementEnv;
use harness::progress::Progress;
use harness::regions::{ExportedRegion, ImportedRegion};
use harness::stats::Distribution;
use harness::{CommonArgs, MeasurementError, Verdict};

use measure::*;
pub use measure::{chain_words, child};
pub use model::*;
pub use render::{render_text, report_section};
pub use verdict::{FINDING_RULE, MIN_EFFECT, NOISE_MULTIPLE, compare, is_finding, verdict};

/// Options of `gpu-ipc probe overhead`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    /// Options every probe takes.
    pub common: CommonArgs,
    /// Runs per measurement (the spread across runs is the noise band). Default 5 (--quick 3).
    #[arg(long)]
    pub runs: Option<u32>,
    /// Attach/detach repetitions per backend and size. Default 200 (--quick 20).
    #[arg(long)]
    pub attach_reps: Option<u32>,
    /// Fresh processes whose first import is timed, per backend. Default 5 (--quick 2).
    #[arg(long)]
    pub first_imports: Option<u32>,
    /// Largest attach size in MiB (default 4096: 4 MiB, 256 MiB, 4 GiB).
    #[arg(long, default_value_t = 4096)]
    pub max_attach_mib: u64,
}

/// Runs the probe; returns the exit status.
pub fn main(args: &ProbeArgs) -> u8 {
    harness::execute("overhead", &args.common, |env, progress| run(args, env, progress), render_text)
}

pub(super) fn sizes(quick: bool) -> Vec<u64> {
    let top = if quick { 256 * MIB } else { GIB };
    let mut out = Vec::new();
    let mut size = 4 * KIB;
    while size <= top {
        out.push(size);
        size *= 4;
    }
    out
}

pub(super) fn working_sets(quick: bool) -> Vec<(u64, &'static str)> {
    let mut sets = vec![(16 * KIB, "L1"), (4 * MIB, "L2"), (256 * MIB, "DRAM")];
    if !quick {
        sets.insert(1, (128 * KIB, "L1/L2"));
        sets.insert(3, (32 * MIB, "L2/DRAM"));
    }
    sets
}

pub(super) fn run(
    args: &ProbeArgs,
    _env: &MeasurementEnv,
    progress: &Progress,
) -> Result<(Results, Verdict), MeasurementError> {
    let quick = args.common.quick;
    let runs = args.runs.unwrap_or(if quick { 3 } else { 5 }).max(2);
    let attach_reps = args.attach_reps.unwrap_or(if quick { 20 } else { 200 }).max(1);
    let first_imports = args.first_imports.unwrap_or(if quick { 2 } else { 5 });
    let device = args.common.device;
    let ctx = Context::for_ordinal(device)?;
    let bench = Bench::new(&ctx)?;
    let buffer_bytes = sizes(quick).last().copied().unwrap_or(GIB);
    let mut notes = Vec::new();

    // The memory kinds: our own, and the exporter child's.
    let exporter = spawn_child(OverheadTask::Exporter { device })?;
    let local = DeviceBuffer::alloc(&ctx, buffer_bytes)?;
    let mut keep_imports: Vec<(MemoryKind, ImportedRegion)> = Vec::new();
    let mut keep_local: Vec<(MemoryKind, ExportedRegion)> = Vec::new();
    for &backend in gpu_ipc::COMPILED_GPU {
        let (message, fd) = ask_export(&exporter, backend, buffer_bytes)?;
        let imported = ImportedRegion::import(&ctx, &message, fd)?;
        let kind = if backend.name() == "legacy" { MemoryKind::LegacyImported } else { MemoryKind::VmmImported };
        keep_imports.push((kind, imported));
        if backend.name() == "vmm" {
            let own = ExportedRegion::allocate(backend, &ctx, buffer_bytes)?;
            keep_local.push((MemoryKind::VmmLocal, own));
        }
    }
    let peer = if Device::count()? >= 2 {
        match peer_import(&ctx, device, buffer_bytes) {
            Ok((child, region)) => Some((child, region)),
            Err(e) => {
                notes.push(format!("peer import not measured: {e}"));
                None
            }
        }
    } else {
        notes.push("one GPU: no peer-imported memory (run on a machine with two GPUs for that row)".to_owned());
        None
    };
    let mut kinds: Vec<(MemoryKind, DeviceSpan<'_>)> = vec![(MemoryKind::Local, local.span())];
    kinds.extend(keep_imports.iter().map(|(kind, region)| (*kind, region.span())));
    kinds.extend(keep_local.iter().map(|(kind, region)| (*kind, region.span())));
    kinds.extend(peer.iter().map(|(_, region)| (MemoryKind::PeerImported, region.span())));
    kinds.sort_by_key(|(kind, _)| *kind);

    let sizes = sizes(quick);
    let sets = working_sets(quick);
    progress.stage("bandwidth and latency", (kinds.len() * (sizes.len() + sets.len() + 1)) as u64);
    let mut kind_results = Vec::new();
    for &(kind, base) in &kinds {
        let mut bandwidth = Vec::new();
        for &bytes in &sizes {
            bandwidth.push(BandwidthPoint {
                bytes,
                read_gbps: bench.bandwidth(base, bytes, runs, false)?,
                write_gbps: bench.bandwidth(base, bytes, runs, true)?,
            });
            progress.step(&format!("{} {}", kind.label(), human(bytes)));
            tracing::info!(kind = kind.label(), bytes, "bandwidth measured");
        }
        let mut latency = Vec::new();
        for &(bytes, level) in &sets {
            latency.push(LatencyPoint { bytes, level: level.to_owned(), load_ns: bench.chase(base, bytes, runs)? });
            progress.step(&format!("{} chase {}", kind.label(), human(bytes)));
            tracing::info!(kind = kind.label(), bytes, "chase measured");
        }
        let store_ns = bench.store_latency(base, runs)?;
        progress.step(&format!("{} stores", kind.label()));
        kind_results.push(KindResults { kind, bandwidth, latency, store_ns });
    }
    drop(kinds);
    drop(keep_imports);
    drop(keep_local);
    drop(peer);

    // Attach and detach: repeated imports in this process.
    let attach_sizes: Vec<u64> =
        [4 * MIB, 256 * MIB, 4 * GIB].into_iter().filter(|&b| b <= args.max_attach_mib * MIB).collect();
    progress.stage("attach and detach", (gpu_ipc::COMPILED_GPU.len() * attach_sizes.len()) as u64 + 1);
    let mut attach = Vec::new();
    for &backend in gpu_ipc::COMPILED_GPU {
        for &bytes in &attach_sizes {
            let (message, fd) = ask_export(&exporter, backend, bytes)?;
            attach.push(time_attach(&ctx, backend, &message, fd, attach_reps)?);
            progress.step(&format!("{backend} {}", human(bytes)));
        }
    }

    // First imports of fresh processes.
    let mut firsts = Vec::new();
    for &backend in gpu_ipc::COMPILED_GPU {
        let (message, fd) = ask_export(&exporter, backend, 4 * MIB)?;
        let (mut context, mut first, mut second) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..first_imports {
            let importer = spawn_child(OverheadTask::Importer { device })?;
            let dup = fd
                .as_ref()
                .map(std::os::fd::OwnedFd::try_clone)
                .transpose()
                .map_err(|source| MeasurementError::Io { op: "duplicate the fd", source })?;
            importer.channel().send(&ToChild::Import(message.clone()), dup.into_iter().collect())?;
            match recv_reply(&importer, Duration::from_secs(60))? {
                FromChild::Imported { context_ms, first_ms, second_ms } => {
                    context.push(context_ms);
                    first.push(first_ms);
                    second.push(second_ms);
                }
                other => {
                    return Err(MeasurementError::Unexpected {
                        peer: "importer",
                        expected: "its reply",
                        got: format!("{other:?}"),
                    });
                }
            }
        }
        if let (Some(context_ms), Some(first_attach_ms), Some(second_attach_ms)) = (
            Distribution::from_samples(&mut context),
            Distribution::from_samples(&mut first),
            Distribution::from_samples(&mut second),
        ) {
            firsts.push(FirstImport { backend, bytes: 4 * MIB, context_ms, first_attach_ms, second_attach_ms });
        }
    }
    progress.step("first imports");
    let _ = exporter.channel().send(&ToChild::Exit, Vec::new());

    let comparisons = compare(&kind_results);
    let results = Results { runs, kinds: kind_results, attach, first_imports: firsts, comparisons, notes };
    let verdict = verdict(&results);
    Ok((results, verdict))
}

/// The overhead probe, as [`crate::PROBES`] lists it.
#[derive(Debug, Clone, Copy)]
pub struct Overhead;

crate::probe::impl_probe!(Overhead {
    name: "overhead",
    title: "Import overhead",
    question: "Is memory imported from another process slower for kernels than the process's own memory?",
    args: ProbeArgs,
    main: main,
    child: child,
    results: Results,
    section: report_section,
    verdict: verdict,
});

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
