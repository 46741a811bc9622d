//! What `gpu-ipc bench pipeline` measures: the rows (the references, the research's designs, ours over every
//! backend, strategy, ring depth and consumer count, three-stage pipelines, ours paced at a frame rate, the memory
//! benchmarks and each kernel alone), their names, how many frames each measures, and which of them a run selects.

use gpu_ipc::BackendKind;
use gpu_ipc::core::wire::{SyncSide, SyncStrategy};
use serde::{Deserialize, Serialize};

/// Ring depths of our rows.
pub const SLOTS: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// Ring depths of the deep rows (control-block layout 2), beyond [`SLOTS`]: where the ring's depth still hides
/// the time-slicing of two processes without MPS.
pub const DEEP_SLOTS: [u32; 3] = [64, 128, 256];
/// Ring depths of our rows with `--quick`.
pub const QUICK_SLOTS: [u32; 2] = [1, 4];
/// Consumer counts of our rows.
pub const CONSUMERS: [u32; 2] = [1, 4];
/// Ring depth of the three-stage rows (both rings), the depth of the two-process rows they are read beside
/// (`ours-BACKEND-STRATEGY-s4-c1`), in the quick grid too.
pub const THREE_STAGE_SLOTS: u32 = 4;
/// The mask the three-stage rows' middle stage XORs every word with (every bit inverted).
pub const THREE_STAGE_MASK: u32 = u32::MAX;

/// Frame rates of the paced rows (`paced-FPS-...`): a video rate, a fast display's, and 1 ms per frame.
pub const PACES: [u32; 3] = [60, 240, 1_000];
/// Ring depth of the paced rows, the depth of the unpaced rows they are read beside (`ours-BACKEND-STRATEGY-s4-c1`).
pub const PACED_SLOTS: u32 = 4;
/// A paced row measures at least this many frames (so that its p99.9 rests on a thousand frames), or
/// [`PACED_MIN_SECONDS`] of them if that is more, and never more than `--frames`.
pub const PACED_MIN_FRAMES: u64 = 1_000;
/// A paced row measures at least this long (when `--frames` allows).
pub const PACED_MIN_SECONDS: u64 = 2;
/// Warm-up frames of a paced row (at its pace).
pub const PACED_WARMUP: u64 = 10;
/// Frames of the study's basic design with its 16 ms sleeps (each frame waits a sleep or two on each side).
pub const SLOW_STUDY_FRAMES: u64 = 100;
/// Frames (or copies) of the rows that move every byte over PCIe: the mapped zero-copy design, the pinned copies
/// and the kernels on mapped host memory.
pub const PCIE_FRAMES: u64 = 500;

/// One of the designs of the frame-pipeline study, reproduced as the study describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StudyDesign {
    /// (a) Host shared memory (a memfd), pageable `cuMemcpyDtoH` in the producer and `cuMemcpyHtoD` in the
    /// consumer, a CPU flag polled with 1 ms sleeps.
    PageableShm,
    /// (a) as the study ran it: the same, the flag polled with 16 ms sleeps (the study's cap).
    PageableShm16ms,
    /// The study's mapped zero-copy design: one memfd page-locked and mapped for the device in both processes
    /// (`cuMemHostRegister` with `DEVICEMAP`, `cuMemHostGetDevicePointer`); the producer's fill kernel writes the
    /// frame straight into host memory and the consumer's verify kernel reads it from there, over PCIe; the flags of
    /// design (b), polled with 1 us sleeps.
    MappedZeroCopy,
    /// (b) The same buffer page-locked (`cuMemHostRegister`) in each process, async copies on a stream, an atomic
    /// frame counter and a ready flag in shared memory, polled with 1 us sleeps.
    PinnedStaging,
    /// (c) One device buffer shared with a legacy IPC handle; the CPU polls a shared flag with 10 us sleeps.
    LegacyIpcSleep,
    /// (d) As (c), the CPU spinning on the flag, one stream synchronisation per frame (the seed architecture).
    LegacyIpcSpin,
}

impl StudyDesign {
    /// Every design, in the study's order.
    pub const ALL: [Self; 6] = [
        Self::PageableShm16ms,
        Self::PageableShm,
        Self::PinnedStaging,
        Self::MappedZeroCopy,
        Self::LegacyIpcSleep,
        Self::LegacyIpcSpin,
    ];

    /// The row name, e.g. `study-d-ipc-spin`.
    pub fn name(self) -> &'static str {
        match self {
            Self::PageableShm16ms => "study-a-pageable-shm-16ms",
            Self::PageableShm => "study-a-pageable-shm",
            Self::MappedZeroCopy => "study-mapped-zero-copy",
            Self::PinnedStaging => "study-b-pinned-staging",
            Self::LegacyIpcSleep => "study-c-ipc-sleep",
            Self::LegacyIpcSpin => "study-d-ipc-spin",
        }
    }

    /// How each side waits for the other's flag: `None` spins, `Some(d)` sleeps `d` between polls.
    pub fn poll_interval(self) -> Option<std::time::Duration> {
        use std::time::Duration;
        match self {
            // The study capped its sleep at 16 ms (the design as it was); 1 ms is the shortest `Sleep(1)` a WDDM
            // thread gets (today's variant).
            Self::PageableShm16ms => Some(Duration::from_millis(16)),
            Self::PageableShm => Some(Duration::from_millis(1)),
            Self::PinnedStaging | Self::MappedZeroCopy => Some(Duration::from_micros(1)),
            Self::LegacyIpcSleep => Some(Duration::from_micros(10)),
            Self::LegacyIpcSpin => None,
        }
    }

    /// Whether the frame is copied through a host staging buffer (designs a and b): each side has its own device
    /// buffer, and the producer may fill its next frame while the consumer copies the last one out.
    pub fn through_host(self) -> bool {
        matches!(self, Self::PageableShm | Self::PageableShm16ms | Self::PinnedStaging)
    }

    /// Whether a shared memfd carries the frame (copied through it, or read and written in place when mapped).
    pub fn in_host_memory(self) -> bool {
        self.through_host() || self == Self::MappedZeroCopy
    }

    /// Whether the memfd is page-locked (registered) in both processes.
    pub fn pinned(self) -> bool {
        matches!(self, Self::PinnedStaging | Self::MappedZeroCopy)
    }

    /// Frames this design measures at most (the slow ones fewer than `--frames`).
    pub fn frame_cap(self) -> Option<u64> {
        match self {
            Self::PageableShm16ms => Some(SLOW_STUDY_FRAMES),
            Self::MappedZeroCopy => Some(PCIE_FRAMES),
            _ => None,
        }
    }
}

/// A memory benchmark of the research (device, pinned and mapped host memory) or of the course chapter (copies to,
/// from and within an imported buffer), one frame per operation, in the bench process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryTest {
    /// Copies of a frame from page-locked host memory to a device buffer.
    #[serde(rename = "pinned-htod")]
    PinnedHtoD,
    /// Copies of a frame from a device buffer to page-locked host memory.
    #[serde(rename = "pinned-dtoh")]
    PinnedDtoH,
    /// The fill kernel writing a frame into host memory mapped for the device.
    MappedKernelWrite,
    /// The verify kernel reading a frame from host memory mapped for the device.
    MappedKernelRead,
    /// Copies within one local allocation of two frames (first half to second half): the reference of
    /// [`ImportedCopy::Within`].
    LocalWithin,
}

impl MemoryTest {
    /// Every test, in run order.
    pub const ALL: [Self; 5] =
        [Self::PinnedHtoD, Self::PinnedDtoH, Self::MappedKernelWrite, Self::MappedKernelRead, Self::LocalWithin];

    /// The row name, e.g. `memory-pinned-htod`.
    pub fn name(self) -> &'static str {
        match self {
            Self::PinnedHtoD => "memory-pinned-htod",
            Self::PinnedDtoH => "memory-pinned-dtoh",
            Self::MappedKernelWrite => "memory-mapped-kernel-write",
            Self::MappedKernelRead => "memory-mapped-kernel-read",
            Self::LocalWithin => "memory-local-within",
        }
    }

    /// Whether every byte crosses PCIe (the row measures [`PCIE_FRAMES`] operations at most).
    pub fn over_pcie(self) -> bool {
        self != Self::LocalWithin
    }
}

/// Which copy a course-chapter bandwidth row makes with a buffer another process exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImportedCopy {
    /// A local device buffer into the imported one.
    To,
    /// The imported buffer into a local one.
    From,
    /// The imported buffer's first frame into its second.
    Within,
}

impl ImportedCopy {
    /// Every copy.
    pub const ALL: [Self; 3] = [Self::To, Self::From, Self::Within];

    /// The name's suffix.
    pub fn name(self) -> &'static str {
        match self {
            Self::To => "to",
            Self::From => "from",
            Self::Within => "within",
        }
    }
}

/// One of the pattern kernels alone, back to back in one process: the parts of the single-process limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelAlone {
    /// Generation only: the fill kernel.
    Fill,
    /// Processing only: the verify kernel.
    Verify,
}

impl KernelAlone {
    /// Both.
    pub const ALL: [Self; 2] = [Self::Fill, Self::Verify];

    /// The row name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fill => "kernel-fill-only",
            Self::Verify => "kernel-verify-only",
        }
    }
}

/// Whether the producer's `publish` returns before the frame's work is done with `strategy` (so the bench cannot
/// time the publish on the CPU after the work, only when it was queued).
pub fn publishes_on_gpu(strategy: SyncStrategy) -> bool {
    strategy.traits().publishes == SyncSide::Gpu
}

/// A strategy in the bench's JSON by its name (`cpu-spin`, ...), as recorded results spell it.
mod strategy_name {
    use gpu_ipc::core::wire::SyncStrategy;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(strategy: &SyncStrategy, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(strategy.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SyncStrategy, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// One row of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RowSpec {
    /// Fill and verify of the same frames in one process on one stream, back to back.
    SingleProcess,
    /// The same kernels in one process, pipelined through `slots` frame buffers between two streams (fill on one,
    /// verify on the other, each buffer handed over with events): what any design that fills the next frame while
    /// the current one is verified can reach, with no IPC at all.
    SingleProcessPipelined {
        /// Frame buffers.
        slots: u32,
    },
    /// As [`RowSpec::SingleProcessPipelined`], each buffer handed over by stream memory operations instead of
    /// events (`cuStreamWaitValue64` / `cuStreamWriteValue64` on two counters in registered host memory, as
    /// `gpu-stream-ops` waits and publishes): what that handoff allows with no IPC at all, the floor of
    /// `gpu-stream-ops` against the pipelined reference.
    SingleProcessMemOps {
        /// Frame buffers.
        slots: u32,
    },
    /// A device-to-device copy of a frame, repeated: the memory-bandwidth floor.
    Bandwidth,
    /// One of the study's designs.
    Study {
        /// Which.
        design: StudyDesign,
    },
    /// The frame API: a `Producer` and `consumers` `Consumer` processes.
    Ours {
        /// The backend.
        backend: BackendKind,
        /// The sync strategy.
        #[serde(with = "strategy_name")]
        strategy: SyncStrategy,
        /// Ring slots.
        slots: u32,
        /// Consumer processes.
        consumers: u32,
    },
    /// A three-stage pipeline through the frame API: a `Producer` (A), a `Stage` process (B) that XORs every word
    /// of each frame into its own ring (`gpu_ipc_xor_words`), and a `Consumer` process (C) that verifies the
    /// transformed frames; latency from A's publish to C's verify done. Both rings have the same backend, strategy
    /// and depth.
    ThreeStage {
        /// The backend of both rings.
        backend: BackendKind,
        /// The sync strategy of both rings.
        #[serde(with = "strategy_name")]
        strategy: SyncStrategy,
        /// Slots of each ring.
        slots: u32,
    },
    /// As [`RowSpec::Ours`] with one consumer, the producer paced at `fps` frames per second (each frame starts at
    /// its due time on a fixed schedule): the latency a real-time user sees, not the maximum rate.
    Paced {
        /// The backend.
        backend: BackendKind,
        /// The sync strategy.
        #[serde(with = "strategy_name")]
        strategy: SyncStrategy,
        /// Ring slots.
        slots: u32,
        /// Frames per second the producer publishes.
        fps: u32,
    },
    /// A memory benchmark in the bench process.
    Memory {
        /// Which.
        test: MemoryTest,
    },
    /// A copy with a buffer a helper process allocated and exported through `backend`, imported here.
    Imported {
        /// The backend that exported it.
        backend: BackendKind,
        /// Which copy.
        copy: ImportedCopy,
    },
    /// As [`RowSpec::Ours`] with one consumer, both sides on frame graphs (`capture_frame_graphs`: one CUDA graph
    /// per slot holding the ring's wait, the pattern kernel and the publish or release; a lap of the ring per
    /// `cuGraphLaunch`): the CPU's cost per frame when no ring call is made per frame. The row's name ends with
    /// how the graphs wait: `kernel-waits` (MPS only) or `stream-op-waits` (both passes).
    Graphs {
        /// The backend.
        backend: BackendKind,
        /// The sync strategy: one whose waits the GPU does (`gpu-stream-ops`, `gpu-poll`).
        #[serde(with = "strategy_name")]
        strategy: SyncStrategy,
        /// Ring slots.
        slots: u32,
        /// How the graphs wait (absent in results from before stream-op waits: kernels).
        #[serde(default)]
        waits: GraphWait,
    },
    /// One pattern kernel alone, back to back in one process.
    Kernel {
        /// Which.
        kernel: KernelAlone,
    },
    /// Both sides persistent kernels on the ring's device API, one launch each for the whole row (warm-up
    /// included): the producer's kernel waits for each slot, writes the frame's pattern and publishes it; one
    /// consumer process's kernel waits for each frame, checks every word and releases it. No CPU on the per-frame
    /// path and no launch between frames; timed on the GPU's clock. Under MPS only (both kernels must run at once).
    /// The ring's strategy is [`RESIDENT_STRATEGY`] (the kernels wait on the ring's words themselves).
    Resident {
        /// The backend.
        backend: BackendKind,
        /// Ring slots.
        slots: u32,
        /// How the kernels spread over the GPU.
        #[serde(default)]
        shape: ResidentShape,
    },
}

impl RowSpec {
    /// The row's name: `single-process`, `bandwidth-floor`, `study-c-ipc-sleep`, `ours-vmm-gpu-stream-ops-s4-c1`,
    /// `three-stage-vmm-gpu-stream-ops-s4`.
    pub fn name(&self) -> String {
        match self {
            Self::SingleProcess => "single-process".to_owned(),
            Self::SingleProcessPipelined { slots } => format!("single-process-pipelined-s{slots}"),
            Self::SingleProcessMemOps { slots } => format!("single-process-memops-s{slots}"),
            Self::Bandwidth => "bandwidth-floor".to_owned(),
            Self::Study { design } => design.name().to_owned(),
            Self::Ours { backend, strategy, slots, consumers } => {
                format!("ours-{}-{}-s{slots}-c{consumers}", backend.name(), strategy.name())
            }
            Self::ThreeStage { backend, strategy, slots } => {
                format!("three-stage-{}-{}-s{slots}", backend.name(), strategy.name())
            }
            Self::Paced { backend, strategy, slots, fps } => {
                format!("paced-{fps}-{}-{}-s{slots}", backend.name(), strategy.name())
            }
            Self::Memory { test } => test.name().to_owned(),
            Self::Imported { backend, copy } => format!("memory-imported-{}-{}", backend.name(), copy.name()),
            Self::Graphs { backend, strategy, slots, waits } => {
                format!("graphs-{}-{}-s{slots}-{}", backend.name(), strategy.name(), waits.name())
            }
            Self::Kernel { kernel } => kernel.name().to_owned(),
            Self::Resident { backend, slots, shape } => {
                format!("resident-{}-s{slots}{}", backend.name(), shape.suffix())
            }
        }
    }

    /// The frames (or operations) this row measures and its warm-up, from the run's `frames` and `warmup`: the
    /// run's own, fewer for the slow designs and for what crosses PCIe, and for a paced row as many as
    /// [`paced_frames`] says.
    pub fn budget(&self, frames: u64, warmup: u64) -> (u64, u64) {
        let capped = |cap: u64| {
            let frames = frames.min(cap).max(1);
            (frames, warmup.min((frames / 10).max(5)))
        };
        match self {
            Self::Paced { fps, .. } => (paced_frames(*fps, frames), warmup.min(PACED_WARMUP)),
            Self::Study { design } => design.frame_cap().map_or((frames, warmup), capped),
            Self::Memory { test } if test.over_pcie() => capped(PCIE_FRAMES),
            _ => (frames, warmup),
        }
    }

    /// Whether this row is a reference (always run: the ratios need them).
    pub fn is_reference(&self) -> bool {
        matches!(
            self,
            Self::SingleProcess
                | Self::SingleProcessPipelined { .. }
                | Self::SingleProcessMemOps { .. }
                | Self::Bandwidth
        )
    }
}

/// How a frame-graph row's graphs wait (`gpu_ipc::core::frames::GraphWaits`), the end of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GraphWait {
    /// Kernels that poll the ring's words: under MPS only.
    #[default]
    Kernels,
    /// Batch memory operation nodes of stream waits: with and without MPS.
    StreamOps,
}

impl GraphWait {
    /// Both, in the order the rows run.
    pub const ALL: [GraphWait; 2] = [GraphWait::Kernels, GraphWait::StreamOps];

    /// The library's choice this stands for.
    pub fn waits(self) -> gpu_ipc::core::frames::GraphWaits {
        match self {
            Self::Kernels => gpu_ipc::core::frames::GraphWaits::Kernels,
            Self::StreamOps => gpu_ipc::core::frames::GraphWaits::StreamOps,
        }
    }

    /// `kernel-waits` or `stream-op-waits`.
    pub fn name(self) -> &'static str {
        self.waits().name()
    }
}

/// Strategies of the frame-graph rows: those whose waits the GPU does (the strategy's descriptor says which).
pub fn graph_strategies() -> impl Iterator<Item = SyncStrategy> {
    SyncStrategy::ALL.into_iter().filter(|s| s.is_gpu_side())
}
/// Ring depths of the frame-graph rows (a lap per launch: 4 and 8 frames per `cuGraphLaunch`).
pub const GRAPH_SLOTS: [u32; 2] = [4, 8];

/// Frames per `cuGraphLaunch` of a frame-graph row of `slots` slots measuring `frames` after `warmup`: a lap of the
/// ring when both are whole laps (the warm-up ends between launches), else one.
pub fn graph_lap(slots: u32, frames: u64, warmup: u64) -> u32 {
    let lap = u64::from(slots.max(1));
    if frames.is_multiple_of(lap) && warmup.is_multiple_of(lap) { slots.max(1) } else { 1 }
}

/// How the persistent kernels of a [`RowSpec::Resident`] row spread over the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResidentShape {
    /// A leader block and a worker block per SM but one on each side
    /// (`gpu_ipc_persistent_fill_grid` / `gpu_ipc_persistent_verify_grid`).
    #[default]
    Grid,
    /// One block on each side (`gpu_ipc_persistent_fill` / `gpu_ipc_persistent_verify`, the device API's examples):
    /// what a single SM's share of the memory bandwidth costs a 4K frame.
    OneBlock,
}

impl ResidentShape {
    /// The end of the row's name: nothing for the grid, `-one-block`.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Grid => "",
            Self::OneBlock => "-one-block",
        }
    }
}

/// The ring's strategy in the resident rows: one that registers the control block for the device, which a kernel
/// on the ring needs (`launch_on_ring`); its own waits are never used, the kernels wait on the ring's words.
pub const RESIDENT_STRATEGY: SyncStrategy = SyncStrategy::GpuStreamOps;
/// Ring depth of the one-block resident rows (one depth: they show the cost of one block, not of depth).
pub const ONE_BLOCK_SLOTS: u32 = 4;

/// The resident rows of `backend`: the grid kernels at each depth of the pipelined references (so that each has its
/// reference at equal depth), and the one-block kernels at [`ONE_BLOCK_SLOTS`].
pub fn resident_rows(backend: BackendKind) -> impl Iterator<Item = RowSpec> {
    PIPELINED_SLOTS
        .iter()
        .map(move |&slots| RowSpec::Resident { backend, slots, shape: ResidentShape::Grid })
        .chain(std::iter::once(RowSpec::Resident { backend, slots: ONE_BLOCK_SLOTS, shape: ResidentShape::OneBlock }))
}

/// Buffers of the pipelined single-process references (by events and by stream memory operations): the shallowest
/// ring that overlaps a fill with a verify, the depth of the paced, three-stage and frame-graph rows, and the depth
/// where the frame API's best rows are.
pub const PIPELINED_SLOTS: [u32; 3] = [2, 4, 8];

/// Frames a row paced at `fps` measures: at least [`PACED_MIN_FRAMES`] and [`PACED_MIN_SECONDS`] of frames, at
/// most `frames` (the run's `--frames`).
pub fn paced_frames(fps: u32, frames: u64) -> u64 {
    PACED_MIN_FRAMES.max(u64::from(fps) * PACED_MIN_SECONDS).min(frames).max(1)
}

/// The backend of the paced rows: one backend only, to keep the run short (each paced row lasts seconds whatever
/// the GPU), `vmm` when it is among `backends`, else the first.
pub fn paced_backend(backends: &[BackendKind]) -> Option<BackendKind> {
    backends.iter().copied().find(|b| b.name() == "vmm").or_else(|| backends.first().copied())
}

/// Every row of a run, references first: the full grid, or with `quick` slots 1 and 4 and 4 consumers only at 4
/// slots; then the three-stage rows (every backend and strategy at [`THREE_STAGE_SLOTS`] slots), the paced rows
/// (every strategy at each of [`PACES`], [`paced_backend`], [`PACED_SLOTS`] slots, one consumer), the frame-graph
/// rows ([`graph_strategies`] at [`GRAPH_SLOTS`], every backend, both [`GraphWait`]s), the resident rows
/// ([`resident_rows`], every backend), the memory benchmarks (the imported-buffer copies
/// for every backend) and the kernels alone, in both.
pub fn all_rows(backends: &[BackendKind], quick: bool) -> Vec<RowSpec> {
    let mut rows = vec![RowSpec::SingleProcess];
    rows.extend(PIPELINED_SLOTS.iter().map(|&slots| RowSpec::SingleProcessPipelined { slots }));
    rows.extend(PIPELINED_SLOTS.iter().map(|&slots| RowSpec::SingleProcessMemOps { slots }));
    rows.push(RowSpec::Bandwidth);
    rows.extend(KernelAlone::ALL.iter().map(|&kernel| RowSpec::Kernel { kernel }));
    rows.extend(StudyDesign::ALL.iter().map(|&design| RowSpec::Study { design }));
    let slots: &[u32] = if quick { &QUICK_SLOTS } else { &SLOTS };
    for &backend in backends {
        for strategy in SyncStrategy::ALL {
            for &consumers in &CONSUMERS {
                for &s in slots {
                    if quick && consumers > 1 && s != 4 {
                        continue;
                    }
                    rows.push(RowSpec::Ours { backend, strategy, slots: s, consumers });
                }
            }
        }
    }
    for &backend in backends {
        for strategy in SyncStrategy::ALL {
            rows.push(RowSpec::ThreeStage { backend, strategy, slots: THREE_STAGE_SLOTS });
        }
    }
    if let Some(backend) = paced_backend(backends) {
        for fps in PACES {
            for strategy in SyncStrategy::ALL {
                rows.push(RowSpec::Paced { backend, strategy, slots: PACED_SLOTS, fps });
            }
        }
    }
    for &backend in backends {
        for strategy in graph_strategies() {
            for waits in GraphWait::ALL {
                rows.extend(GRAPH_SLOTS.iter().map(|&slots| RowSpec::Graphs { backend, strategy, slots, waits }));
            }
        }
    }
    for &backend in backends {
        rows.extend(resident_rows(backend));
    }
    rows.extend(MemoryTest::ALL.iter().map(|&test| RowSpec::Memory { test }));
    for &backend in backends {
        rows.extend(ImportedCopy::ALL.iter().map(|&copy| RowSpec::Imported { backend, copy }));
    }
    if !quick {
        rows.extend(deep_rows(backends, &DEEP_SLOTS));
    }
    rows
}

/// Our rows at ring depths `slots` (each 1 to 256), one consumer, for the strategies whose frames the CPU does not
/// wait for one by one (`ipc-event`, `gpu-stream-ops`, `gpu-poll`: the ones a deeper ring lets run further
/// ahead; the CPU strategies wait for every frame on the CPU, so depth past the grid's changes nothing for them).
pub fn deep_rows(backends: &[BackendKind], slots: &[u32]) -> Vec<RowSpec> {
    let mut rows = Vec::new();
    for &backend in backends {
        for strategy in SyncStrategy::ALL.into_iter().filter(|&s| publishes_on_gpu(s)) {
            rows.extend(slots.iter().map(|&slots| RowSpec::Ours { backend, strategy, slots, consumers: 1 }));
        }
    }
    rows
}

/// The references and the study's designs of the grid, in its order.
fn base_rows(backends: &[BackendKind]) -> Vec<RowSpec> {
    all_rows(backends, true).into_iter().filter(|r| r.is_reference() || matches!(r, RowSpec::Study { .. })).collect()
}

/// Every row of a run given `--slots`: the references and the study's designs, then our rows at those depths only
/// (every strategy and consumer count of the grid), in place of the grid's depths; none of the grid's other rows.
pub fn rows_at_slots(backends: &[BackendKind], slots: &[u32]) -> Vec<RowSpec> {
    let mut rows = base_rows(backends);
    for &backend in backends {
        for strategy in SyncStrategy::ALL {
            for &consumers in &CONSUMERS {
                rows.extend(slots.iter().map(|&slots| RowSpec::Ours { backend, strategy, slots, consumers }));
            }
        }
    }
    rows
}

/// The rows `filters` select: every reference, and every other row that matches a filter. A filter matches when
/// each of its `+`-separated parts occurs in the row's name (`vmm+gpu-stream-ops` matches
/// `ours-vmm-gpu-stream-ops-s4-c1`); no filter selects everything.
pub fn select(rows: &[RowSpec], filters: &[String]) -> Vec<RowSpec> {
    rows.iter()
        .filter(|row| {
            if row.is_reference() || filters.is_empty() {
                return true;
            }
            let name = row.name();
            filters.iter().any(|f| f.split('+').filter(|p| !p.is_empty()).all(|part| name.contains(part)))
        })
        .copied()
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
