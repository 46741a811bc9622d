//! The probe's results: which allocations were made, what their pointer attributes said, and one cell per
//! (allocation, operation) with the CUDA result code and whether data crossed.

use gpu_ipc::BackendKind;
use serde::{Deserialize, Serialize};

/// A kind of allocation the matrix examines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocationKind {
    /// `cuMemAlloc`, 2 MiB.
    MemAlloc,
    /// Two 4 KiB `cuMemAlloc`s that may share one underlying block.
    MemAllocSmallPair,
    /// `cuMemAllocAsync` from the device's default pool.
    AsyncDefaultPool,
    /// `cuMemAllocFromPoolAsync` from a pool created with the POSIX-fd handle type.
    AsyncFdPool,
    /// `cuMemCreate` without a requested handle type.
    VmmNoHandle,
    /// `cuMemCreate` with `requestedHandleTypes = POSIX_FD` (what the vmm backend uses).
    VmmPosixFd,
    /// `cuMemCreate` with the fabric handle type.
    VmmFabric,
    /// Page-locked host memory (`cuMemAllocHost`).
    PinnedHost,
    /// A small managed allocation (`cuMemAllocManaged`).
    Managed,
}

impl AllocationKind {
    /// Every kind, in the matrix's row order.
    pub const ALL: [Self; 9] = [
        Self::MemAlloc,
        Self::MemAllocSmallPair,
        Self::AsyncDefaultPool,
        Self::AsyncFdPool,
        Self::VmmNoHandle,
        Self::VmmPosixFd,
        Self::VmmFabric,
        Self::PinnedHost,
        Self::Managed,
    ];

    /// How the matrix names the row.
    pub fn label(self) -> &'static str {
        match self {
            Self::MemAlloc => "cuMemAlloc 2 MiB",
            Self::MemAllocSmallPair => "2 x cuMemAlloc 4 KiB",
            Self::AsyncDefaultPool => "cuMemAllocAsync, default pool",
            Self::AsyncFdPool => "cuMemAllocFromPoolAsync, POSIX-fd pool",
            Self::VmmNoHandle => "cuMemCreate, no handle type",
            Self::VmmPosixFd => "cuMemCreate, POSIX_FD",
            Self::VmmFabric => "cuMemCreate, FABRIC",
            Self::PinnedHost => "pinned host (cuMemAllocHost)",
            Self::Managed => "managed (cuMemAllocManaged)",
        }
    }

    /// True for the stream-ordered (pool) allocations, the only ones the pool operations apply to.
    pub fn is_pool(self) -> bool {
        matches!(self, Self::AsyncDefaultPool | Self::AsyncFdPool)
    }
}

/// An operation tried on each allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// Making the allocation.
    Allocate,
    /// `cuIpcGetMemHandle` in the exporter.
    LegacyExport,
    /// `cuIpcOpenMemHandle` in another process, data checked both ways.
    LegacyImport,
    /// A second `cuIpcOpenMemHandle` of the same handle in the importing process.
    LegacyOpenTwice,
    /// `cuMemExportToShareableHandle(POSIX_FD)` (after `cuMemRetainAllocationHandle` for memory not made with
    /// `cuMemCreate`).
    FdExport,
    /// `cuMemImportFromShareableHandle` + map in another process, data checked both ways.
    FdImport,
    /// A second import and mapping of the same fd in the importing process.
    FdImportTwice,
    /// `cuMemExportToShareableHandle(FABRIC)`.
    FabricExport,
    /// Import of the fabric handle in another process, data checked both ways.
    FabricImport,
    /// `cuMemPoolExportToShareableHandle(POSIX_FD)` of the allocation's pool.
    PoolExport,
    /// `cuMemPoolExportPointer` of the allocation.
    PoolExportPointer,
    /// Pool import + `cuMemPoolImportPointer` in another process, data checked both ways.
    PoolImport,
    /// An interprocess event (`cuIpcGetEventHandle`/`cuIpcOpenEventHandle`) opened and queried in the process
    /// that imported (or tried to import) this memory.
    IpcEvent,
}

impl Operation {
    /// Every operation, in the matrix's column order.
    pub const ALL: [Self; 13] = [
        Self::Allocate,
        Self::LegacyExport,
        Self::LegacyImport,
        Self::LegacyOpenTwice,
        Self::FdExport,
        Self::FdImport,
        Self::FdImportTwice,
        Self::FabricExport,
        Self::FabricImport,
        Self::PoolExport,
        Self::PoolExportPointer,
        Self::PoolImport,
        Self::IpcEvent,
    ];

    /// How the matrix names the column.
    pub fn label(self) -> &'static str {
        match self {
            Self::Allocate => "allocate",
            Self::LegacyExport => "cuIpcGetMemHandle",
            Self::LegacyImport => "legacy import",
            Self::LegacyOpenTwice => "legacy open twice",
            Self::FdExport => "export POSIX fd",
            Self::FdImport => "fd import",
            Self::FdImportTwice => "fd import twice",
            Self::FabricExport => "export fabric",
            Self::FabricImport => "fabric import",
            Self::PoolExport => "pool export fd",
            Self::PoolExportPointer => "pool export pointer",
            Self::PoolImport => "pool import",
            Self::IpcEvent => "IPC event beside",
        }
    }
}

/// What happened in a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The call succeeded (and, for an import, data crossed both ways).
    Works,
    /// The call failed, the data did not cross, or the importing child died or hung.
    Fails,
    /// Not tried: a step it depends on failed, or the operation does not apply (the detail says which).
    NotRun,
}

/// The result of one operation, in one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The CUDA result name (`CUDA_SUCCESS`, `CUDA_ERROR_INVALID_VALUE`, ...), or `CHILD_DIED`,
    /// `CHILD_TIMEOUT`, `DATA_MISMATCH`, `NOT_RUN`, `NOT_APPLICABLE`.
    pub code: String,
    /// The verdict.
    pub outcome: Outcome,
    /// Which call failed, or what the data check saw; empty when there is nothing to add.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Attempt {
    /// A call that succeeded.
    pub fn works() -> Self {
        Self { code: SUCCESS.to_owned(), outcome: Outcome::Works, detail: String::new() }
    }

    /// A failure with a code and a detail.
    pub fn fails(code: &str, detail: impl Into<String>) -> Self {
        Self { code: code.to_owned(), outcome: Outcome::Fails, detail: detail.into() }
    }

    /// Not tried, and why.
    pub fn not_run(detail: impl Into<String>) -> Self {
        Self { code: NOT_RUN.to_owned(), outcome: Outcome::NotRun, detail: detail.into() }
    }

    /// Does not apply to this allocation.
    pub fn not_applicable(detail: impl Into<String>) -> Self {
        Self { code: NOT_APPLICABLE.to_owned(), outcome: Outcome::NotRun, detail: detail.into() }
    }
}

/// The name of success.
pub const SUCCESS: &str = "CUDA_SUCCESS";
/// Code of a cell whose importing child exited or hung up.
pub const CHILD_DIED: &str = "CHILD_DIED";
/// Code of a cell whose importing child did not answer in time (it was killed).
pub const CHILD_TIMEOUT: &str = "CHILD_TIMEOUT";
/// Code of an import whose calls succeeded but whose data did not cross.
pub const DATA_MISMATCH: &str = "DATA_MISMATCH";
/// Code of a cell not tried because a step before it failed.
pub const NOT_RUN: &str = "NOT_RUN";
/// Code of a cell whose operation does not apply to the allocation.
pub const NOT_APPLICABLE: &str = "NOT_APPLICABLE";

/// One cell of the matrix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// The row.
    pub allocation: AllocationKind,
    /// The column.
    pub operation: Operation,
    /// Exporter and importer in two processes (for export operations: in the exporter).
    pub observed: Attempt,
    /// The same import in the exporting process (the control); `None` for export operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_process: Option<Attempt>,
}

/// Device attributes that bear on sharing (`None` where the driver did not know the attribute).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAttributes {
    /// `CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING` (the legacy backend's check).
    pub unified_addressing: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    pub virtual_memory_management: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
    pub posix_fd_handles: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`.
    pub fabric_handles: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`.
    pub memory_pools: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES` (a `CU_MEM_HANDLE_TYPE_*` mask).
    pub mempool_handle_types: Option<u32>,
    /// `CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED`.
    pub ipc_events: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY`.
    pub managed_memory: Option<bool>,
}

/// What the driver said about one allocation's pointer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationFacts {
    /// The row.
    pub allocation: AllocationKind,
    /// Bytes allocated (each, for the pair).
    pub bytes: u64,
    /// `CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`; `None` when the query failed or never ran.
    pub legacy_ipc_capable: Option<bool>,
    /// `CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES` (a `CU_MEM_HANDLE_TYPE_*` mask); `None` when the query failed.
    pub allowed_handle_types: Option<u64>,
    /// The failing query's code, when one failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_error: Option<String>,
}

/// The two small allocations: does each get its own handle, and what happens when one process opens both?
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedBlock {
    /// Whether the two 64-byte legacy handles are byte-for-byte equal (`None` if an export failed).
    pub handles_equal: Option<bool>,
    /// `cuMemGetAddressRange` of each: (offset of the pointer from its block's base, block size).
    pub ranges: Vec<Option<(u64, u64)>>,
    /// Whether both pointers lie in the same block.
    pub same_block: Option<bool>,
    /// The importer's `cuIpcOpenMemHandle` result for each handle, in order.
    pub open_codes: Vec<String>,
    /// Whether the importer read each allocation's own pattern through its mapping.
    pub data_ok: Vec<Option<bool>>,
}

/// What a backend's own check said about an allocation (the backends run through the project's API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendCheck {
    /// `legacy` or `vmm`.
    pub backend: BackendKind,
    /// The allocation checked (for vmm: the backend's own allocation, `vmm-posix-fd`).
    pub allocation: AllocationKind,
    /// Whether the backend accepted (export for legacy; check, allocate and export for vmm).
    pub accepted: bool,
    /// The backend's error, when it refused.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// What the probe measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// The device ordinal.
    pub device: i32,
    /// Its sharing-related attributes.
    pub attributes: DeviceAttributes,
    /// Per allocation: its pointer attributes.
    pub allocations: Vec<AllocationFacts>,
    /// The matrix, row by row.
    pub cells: Vec<Cell>,
    /// The small-allocation question.
    pub shared_block: SharedBlock,
    /// The backends' own capability checks, per allocation.
    pub backend_checks: Vec<BackendCheck>,
}

impl Results {
    /// The cell for `(allocation, operation)`.
    pub fn cell(&self, allocation: AllocationKind, operation: Operation) -> Option<&Cell> {
        self.cells.iter().find(|c| c.allocation == allocation && c.operation == operation)
    }

    /// The pointer facts of `allocation`.
    pub fn facts(&self, allocation: AllocationKind) -> Option<&AllocationFacts> {
        self.allocations.iter().find(|f| f.allocation == allocation)
    }
}
