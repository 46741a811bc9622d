//! Vocabulary shared by the wire protocol, the ring and the backends.
//!
//! Every enum here has a stable numeric wire code (`code()` / `from_code()`); the codes are
//! part of the protocol (see `docs/protocol.md`) and never change meaning. Code 0 is never
//! assigned, so an all-zero field is always recognisably "unset".

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which backend shares the frame memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum BackendKind {
    /// `cuMemAlloc` + `cuIpcGetMemHandle` / `cuIpcOpenMemHandle` (name `legacy`).
    #[serde(rename = "legacy", alias = "Legacy")]
    Legacy,
    /// `cuMemCreate` exported as a POSIX file descriptor (name `vmm`).
    #[serde(rename = "vmm", alias = "Vmm")]
    Vmm,
    /// Host memory in a memfd: lets the ring and protocol run without a GPU, with the CPU sync strategies
    /// (name `host`; `host-fake` is accepted too).
    #[serde(rename = "host", alias = "HostFake", alias = "host-fake")]
    Host,
}

impl BackendKind {
    /// The host backend's name before it was [`BackendKind::Host`].
    #[deprecated(since = "0.1.0", note = "renamed `BackendKind::Host`")]
    #[allow(non_upper_case_globals)]
    pub const HostFake: BackendKind = BackendKind::Host;

    /// Every backend, in wire-code order. Whether one is compiled into an application is the `gpu-ipc` crate's
    /// business (its Cargo features); this type names them all.
    pub const ALL: [BackendKind; 3] = [Self::Legacy, Self::Vmm, Self::Host];

    /// The name the command line, JSON reports and logs use: `legacy`, `vmm`, `host`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Legacy => "legacy",
            Self::Vmm => "vmm",
            Self::Host => "host",
        }
    }

    /// Whether the backend shares GPU memory (legacy, vmm); the host backend shares host memory.
    pub const fn is_gpu(self) -> bool {
        !matches!(self, Self::Host)
    }

    /// Stable wire code.
    pub const fn code(self) -> u16 {
        match self {
            Self::Legacy => 1,
            Self::Vmm => 2,
            Self::Host => 3,
        }
    }

    /// Decodes a wire code; `field` names the message field for the error.
    pub fn from_code(code: u16, field: &'static str) -> Result<Self, UnknownCode> {
        match code {
            1 => Ok(Self::Legacy),
            2 => Ok(Self::Vmm),
            3 => Ok(Self::Host),
            _ => Err(UnknownCode { field, code: u32::from(code) }),
        }
    }

    /// The handle type this backend exports its frame memory with.
    pub const fn handle_type(self) -> HandleType {
        match self {
            Self::Legacy => HandleType::LegacyIpc,
            Self::Vmm => HandleType::PosixFd,
            Self::Host => HandleType::HostMemfd,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = UnknownName;

    /// Parses a name as [`BackendKind::name`] spells it (`host-fake` is accepted for `host`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "host-fake" {
            return Ok(Self::Host);
        }
        Self::ALL.into_iter().find(|b| b.name() == text).ok_or_else(|| UnknownName {
            what: "backend",
            given: text.to_owned(),
            known: Self::ALL.iter().map(|b| b.name()).collect(),
        })
    }
}

/// What a rendezvous socket serves: a frame ring, or one of the toolkit's other objects. A client names the kind
/// it expects in its hello (`ClientHello::object`), so a ring consumer pointed at a pool's socket is told so
/// instead of misreading an offer. Unlike the other wire enums, code 0 is assigned: it is the ring, because the
/// field was a reserved zero before the other kinds existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ObjectKind {
    /// A frame ring (`RingOffer`).
    #[default]
    Ring,
    /// An IPC memory pool with named buffers.
    Pool,
    /// A cross-process counting semaphore.
    Semaphore,
    /// A work queue of task records in device memory.
    WorkQueue,
}

impl ObjectKind {
    /// Every kind, in wire-code order.
    pub const ALL: [ObjectKind; 4] = [Self::Ring, Self::Pool, Self::Semaphore, Self::WorkQueue];

    /// The name logs, refusals and `gpu-ipc ps` use.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Pool => "pool",
            Self::Semaphore => "semaphore",
            Self::WorkQueue => "work-queue",
        }
    }

    /// Stable wire code.
    pub const fn code(self) -> u16 {
        match self {
            Self::Ring => 0,
            Self::Pool => 1,
            Self::Semaphore => 2,
            Self::WorkQueue => 3,
        }
    }

    /// Decodes a wire code; `field` names the message field for the error.
    pub fn from_code(code: u16, field: &'static str) -> Result<Self, UnknownCode> {
        Self::ALL.into_iter().find(|k| k.code() == code).ok_or(UnknownCode { field, code: u32::from(code) })
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that names no backend or sync strategy; says which names there are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{given}`; expected one of: {}", known.join(", "))]
pub struct UnknownName {
    /// What was being named (`backend`, `sync strategy`).
    pub what: &'static str,
    /// The name given.
    pub given: String,
    /// The names there are.
    pub known: Vec<&'static str>,
}

/// A wire code that names nothing this version defines; `WireError::UnknownCode` carries it on (`?` converts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("field {field} holds unknown code {code}")]
pub struct UnknownCode {
    /// Which field.
    pub field: &'static str,
    /// The code received.
    pub code: u32,
}

/// How the frame allocation travels to a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum HandleType {
    /// A 64-byte `CUipcMemHandle` inside the message; no fd for the data.
    LegacyIpc,
    /// A POSIX fd from `cuMemExportToShareableHandle`, passed with `SCM_RIGHTS`.
    PosixFd,
    /// A memfd holding host memory, passed with `SCM_RIGHTS`.
    HostMemfd,
}

impl HandleType {
    /// Stable wire code.
    pub const fn code(self) -> u16 {
        match self {
            Self::LegacyIpc => 1,
            Self::PosixFd => 2,
            Self::HostMemfd => 3,
        }
    }

    /// Decodes a wire code; `field` names the message field for the error.
    pub fn from_code(code: u16, field: &'static str) -> Result<Self, UnknownCode> {
        match code {
            1 => Ok(Self::LegacyIpc),
            2 => Ok(Self::PosixFd),
            3 => Ok(Self::HostMemfd),
            _ => Err(UnknownCode { field, code: u32::from(code) }),
        }
    }

    /// Whether the data allocation travels as a file descriptor (rather than inside the message).
    pub const fn carries_data_fd(self) -> bool {
        match self {
            Self::LegacyIpc => false,
            Self::PosixFd | Self::HostMemfd => true,
        }
    }
}

impl fmt::Display for HandleType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::LegacyIpc => "legacy-ipc",
            Self::PosixFd => "posix-fd",
            Self::HostMemfd => "host-memfd",
        })
    }
}

/// How producer and consumers wait for each other, chosen per ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum SyncStrategy {
    /// CPU busy-polls the control block.
    #[serde(rename = "cpu-spin", alias = "CpuSpin")]
    CpuSpin,
    /// CPU polls the control block with sleeps in between.
    #[serde(rename = "cpu-sleep", alias = "CpuSleep")]
    CpuSleep,
    /// CUDA IPC events (`cuIpcGetEventHandle`), one or two per slot.
    #[serde(rename = "ipc-event", alias = "IpcEvent")]
    IpcEvent,
    /// `cuStreamWaitValue64` / `cuStreamWriteValue64` on the control block: no CPU per frame.
    #[serde(rename = "gpu-stream-ops", alias = "GpuStreamOps")]
    GpuStreamOps,
    /// A one-thread kernel polls the control block with `ld.acquire.sys` (bounded by `%globaltimer`) and another
    /// publishes with `st.release.sys`: no CPU per frame; only where MPS runs.
    #[serde(rename = "gpu-poll", alias = "GpuPoll")]
    GpuPoll,
}

/// Which side of the machine does a strategy's per-frame work: the CPU (the call returns once it is done) or the
/// GPU (the call returns once the work is queued on the caller's stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncSide {
    /// The CPU, in the call.
    Cpu,
    /// The GPU, in work queued on the caller's stream.
    Gpu,
}

/// What a sync strategy is, in one place: every front end (the benchmark's rows and targets, the criterion benches,
/// the Python package, the doctor) asks this rather than matching on [`SyncStrategy`]'s variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StrategyTraits {
    /// The name the command line, JSON reports and logs use (`--sync cpu-spin`).
    pub name: &'static str,
    /// Stable wire code.
    pub code: u16,
    /// Who waits for a frame (consumer) and for a free slot (producer). [`SyncSide::Gpu`]: the calls return once the
    /// wait is queued, and they need a stream.
    pub waits: SyncSide,
    /// Who marks a frame published. [`SyncSide::Gpu`]: `publish` returns before the frame's work is done (an event
    /// recorded, a stream write queued), so a caller cannot time the publish on the CPU after the work.
    pub publishes: SyncSide,
    /// Whether a peer's queued GPU work writes the ring's counters (so a dead peer's stores can land after it died).
    pub gpu_writes_counters: bool,
    /// Whether it needs a CUDA backend (legacy or vmm); the others also run on the host backend (which runs
    /// `ipc-event` too, with stand-ins for the events, for tests).
    pub needs_cuda: bool,
    /// Whether it needs MPS (two processes' kernels running at the same time).
    pub needs_mps: bool,
    /// Whether a consumer in its own IPC namespace (a container's default) can run it.
    pub isolated_container: bool,
    /// Whether a wait may be given a near deadline and called again after its `Timeout` as if nothing happened
    /// (what lets the Python package check for Ctrl-C between slices).
    pub waits_in_slices: bool,
}

impl SyncStrategy {
    /// Every strategy, in wire-code order.
    pub const ALL: [SyncStrategy; 5] =
        [Self::CpuSpin, Self::CpuSleep, Self::IpcEvent, Self::GpuStreamOps, Self::GpuPoll];

    /// The one default strategy, where a GPU backend runs: the GPU waits (no CPU per frame), it needs no MPS, and it
    /// runs in an isolated container. With the host backend, [`SyncStrategy::default_for`] picks the first strategy
    /// that needs no CUDA.
    pub const DEFAULT: SyncStrategy = Self::GpuStreamOps;

    /// What this strategy is: who waits, who publishes, what it needs. The only place these facts are written.
    pub const fn traits(self) -> StrategyTraits {
        const fn t(name: &'static str, code: u16, waits: SyncSide, publishes: SyncSide) -> StrategyTraits {
            let gpu = matches!(waits, SyncSide::Gpu);
            StrategyTraits {
                name,
                code,
                waits,
                publishes,
                gpu_writes_counters: gpu,
                needs_cuda: true,
                needs_mps: false,
                isolated_container: true,
                waits_in_slices: true,
            }
        }
        match self {
            Self::CpuSpin => StrategyTraits { needs_cuda: false, ..t("cpu-spin", 1, SyncSide::Cpu, SyncSide::Cpu) },
            Self::CpuSleep => StrategyTraits { needs_cuda: false, ..t("cpu-sleep", 2, SyncSide::Cpu, SyncSide::Cpu) },
            // In its own IPC namespace a consumer cannot open the events and runs the ring without them.
            Self::IpcEvent => t("ipc-event", 3, SyncSide::Cpu, SyncSide::Gpu),
            // Its one CPU wait (the run-ahead bound) comes before it queues anything, so it may be sliced.
            Self::GpuStreamOps => t("gpu-stream-ops", 4, SyncSide::Gpu, SyncSide::Gpu),
            // MPS clients share the host's IPC namespace (docker --ipc=host); the deadline also sets the polling
            // kernel's budget on the GPU, which a slice would cut short.
            Self::GpuPoll => StrategyTraits {
                needs_mps: true,
                isolated_container: false,
                waits_in_slices: false,
                ..t("gpu-poll", 5, SyncSide::Gpu, SyncSide::Gpu)
            },
        }
    }

    /// The default strategy for `backend`: [`SyncStrategy::DEFAULT`], or, where the backend has no CUDA, the first
    /// strategy that needs none (`cpu-spin`).
    pub fn default_for(backend: BackendKind) -> SyncStrategy {
        if backend.is_gpu() || !Self::DEFAULT.traits().needs_cuda {
            return Self::DEFAULT;
        }
        Self::ALL.into_iter().find(|s| !s.traits().needs_cuda).unwrap_or(Self::CpuSpin)
    }

    /// The name the command line, JSON reports and logs use (`cpu-spin`, `cpu-sleep`, `ipc-event`,
    /// `gpu-stream-ops`, `gpu-poll`); [`FromStr`] parses it back.
    pub const fn name(self) -> &'static str {
        self.traits().name
    }

    /// Whether the GPU does the waiting (`gpu-stream-ops`, `gpu-poll`): the calls return once the work is queued,
    /// and they need a stream.
    pub const fn is_gpu_side(self) -> bool {
        matches!(self.traits().waits, SyncSide::Gpu)
    }

    /// Whether it needs a CUDA backend (everything but `cpu-spin` and `cpu-sleep`, the ones the host backend runs).
    pub const fn needs_cuda(self) -> bool {
        self.traits().needs_cuda
    }

    /// Stable wire code.
    pub const fn code(self) -> u16 {
        self.traits().code
    }

    /// Decodes a wire code; `field` names the message field for the error.
    pub fn from_code(code: u16, field: &'static str) -> Result<Self, UnknownCode> {
        Self::ALL.into_iter().find(|s| s.code() == code).ok_or(UnknownCode { field, code: u32::from(code) })
    }
}

impl fmt::Display for SyncStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SyncStrategy {
    type Err = UnknownName;

    /// Parses a name as [`SyncStrategy::name`] spells it.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|s| s.name() == text).ok_or_else(|| UnknownName {
            what: "sync strategy",
            given: text.to_owned(),
            known: Self::ALL.iter().map(|s| s.name()).collect(),
        })
    }
}

/// Layout of one pixel in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PixelFormat {
    /// 8-bit R, G, B.
    Rgb8,
    /// 8-bit R, G, B, A.
    Rgba8,
    /// 8-bit B, G, R, A.
    Bgra8,
    /// One 8-bit channel.
    Gray8,
    /// One 16-bit channel.
    Gray16,
    /// Four 16-bit floats.
    RgbaF16,
    /// Four 32-bit floats.
    RgbaF32,
}

impl PixelFormat {
    /// Stable wire code.
    pub const fn code(self) -> u16 {
        match self {
            Self::Rgb8 => 1,
            Self::Rgba8 => 2,
            Self::Bgra8 => 3,
            Self::Gray8 => 4,
            Self::Gray16 => 5,
            Self::RgbaF16 => 6,
            Self::RgbaF32 => 7,
        }
    }

    /// Decodes a wire code; `field` names the message field for the error.
    pub fn from_code(code: u16, field: &'static str) -> Result<Self, UnknownCode> {
        match code {
            1 => Ok(Self::Rgb8),
            2 => Ok(Self::Rgba8),
            3 => Ok(Self::Bgra8),
            4 => Ok(Self::Gray8),
            5 => Ok(Self::Gray16),
            6 => Ok(Self::RgbaF16),
            7 => Ok(Self::RgbaF32),
            _ => Err(UnknownCode { field, code: u32::from(code) }),
        }
    }

    /// The name protocol.md's table, logs and the command line use (`rgb8`, `rgba-f16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Rgb8 => "rgb8",
            Self::Rgba8 => "rgba8",
            Self::Bgra8 => "bgra8",
            Self::Gray8 => "gray8",
            Self::Gray16 => "gray16",
            Self::RgbaF16 => "rgba-f16",
            Self::RgbaF32 => "rgba-f32",
        }
    }

    /// Bytes one pixel occupies.
    pub const fn bytes_per_pixel(self) -> u32 {
        match self {
            Self::Gray8 => 1,
            Self::Gray16 => 2,
            Self::Rgb8 => 3,
            Self::Rgba8 | Self::Bgra8 => 4,
            Self::RgbaF16 => 8,
            Self::RgbaF32 => 16,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for b in [BackendKind::Legacy, BackendKind::Vmm, BackendKind::Host] {
            assert_eq!(BackendKind::from_code(b.code(), "b").unwrap(), b);
        }
        for h in [HandleType::LegacyIpc, HandleType::PosixFd, HandleType::HostMemfd] {
            assert_eq!(HandleType::from_code(h.code(), "h").unwrap(), h);
        }
        for s in SyncStrategy::ALL {
            assert_eq!(SyncStrategy::from_code(s.code(), "s").unwrap(), s);
            assert_eq!(s.name().parse::<SyncStrategy>().unwrap(), s);
        }
        assert_eq!((SyncStrategy::GpuPoll.code(), SyncStrategy::GpuPoll.to_string().as_str()), (5, "gpu-poll"));
        assert!(matches!(SyncStrategy::from_code(6, "s"), Err(UnknownCode { field: "s", code: 6 })));
        let codes: Vec<u16> = SyncStrategy::ALL.iter().map(|s| s.code()).collect();
        assert_eq!(codes, [1, 2, 3, 4, 5], "wire codes never change meaning");
        for code in 1..=7 {
            assert_eq!(PixelFormat::from_code(code, "p").unwrap().code(), code);
        }
        assert!(matches!(PixelFormat::from_code(0, "p"), Err(UnknownCode { field: "p", code: 0 })));
    }

    #[test]
    fn the_strategy_descriptor_says_who_waits_and_what_each_needs() {
        let gpu_side: Vec<_> = SyncStrategy::ALL.into_iter().filter(|s| s.is_gpu_side()).map(|s| s.name()).collect();
        assert_eq!(gpu_side, ["gpu-stream-ops", "gpu-poll"]);
        let gpu_publishes: Vec<_> =
            SyncStrategy::ALL.into_iter().filter(|s| s.traits().publishes == SyncSide::Gpu).map(|s| s.name()).collect();
        assert_eq!(gpu_publishes, ["ipc-event", "gpu-stream-ops", "gpu-poll"]);
        let host: Vec<_> = SyncStrategy::ALL.into_iter().filter(|s| !s.needs_cuda()).map(|s| s.name()).collect();
        assert_eq!(host, ["cpu-spin", "cpu-sleep"]);
        let mps: Vec<_> = SyncStrategy::ALL.into_iter().filter(|s| s.traits().needs_mps).collect();
        assert_eq!(mps, [SyncStrategy::GpuPoll]);
        assert!(!SyncStrategy::GpuPoll.traits().waits_in_slices && !SyncStrategy::GpuPoll.traits().isolated_container);
        for s in SyncStrategy::ALL {
            assert_eq!(s.traits().gpu_writes_counters, s.is_gpu_side(), "{s}");
        }
    }

    #[test]
    fn one_default_strategy_and_the_host_backend_gets_the_first_that_needs_no_cuda() {
        let d = SyncStrategy::DEFAULT.traits();
        assert_eq!((d.waits, d.needs_mps, d.isolated_container), (SyncSide::Gpu, false, true));
        assert_eq!(SyncStrategy::default_for(BackendKind::Vmm), SyncStrategy::DEFAULT);
        assert_eq!(SyncStrategy::default_for(BackendKind::Legacy), SyncStrategy::DEFAULT);
        assert_eq!(SyncStrategy::default_for(BackendKind::Host), SyncStrategy::CpuSpin);
    }
}
