//! The CUDA facts of a machine: the driver, and each device's identity and IPC-relevant attributes. The doctor
//! reports them and every probe records them ([`crate::env`]), so they are read in one place.

use gpu_ipc::driver::{self, Device, DeviceFeature, Driver, DriverError, VmmGranularity};

use serde::{Deserialize, Serialize};

/// Loading and initialising the CUDA driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverSection {
    /// The library the doctor tried to load, e.g. `libcuda.so.1`.
    pub library_name: String,
    /// Whether it loaded.
    pub library_found: bool,
    /// Where it was loaded from when found; the loader's error when not.
    pub library_path_or_error: String,
    /// The CUDA version the driver supports, from `cuDriverGetVersion`.
    pub driver_version: Option<DriverVersion>,
    /// The first driver call that failed after loading (e.g. `cuInit: CUDA_ERROR_NO_DEVICE`).
    pub error: Option<String>,
}

/// A CUDA driver API version, e.g. 13.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DriverVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// What one CUDA device can do, as its attributes say.
///
/// `Option<bool>` fields are `None` when the attribute query failed (typically a driver too old to know it); the
/// failure is then listed in `query_errors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// The device ordinal (`CUdevice`), as numbered under the current `CUDA_VISIBLE_DEVICES`.
    pub ordinal: u32,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDeviceGetUuid`, formatted as `nvidia-smi` prints it (`GPU-xxxxxxxx-xxxx-...`).
    pub uuid: String,
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR`.
    pub compute_capability: ComputeCapability,
    /// `cuDeviceTotalMem`.
    pub total_memory_bytes: u64,
    /// `cuDeviceGetPCIBusId`, e.g. `0000:19:00.0`.
    pub pci_bus_id: String,
    /// `CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING`: legacy IPC needs it.
    pub unified_addressing: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`.
    pub compute_mode: ComputeMode,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`: the vmm backend needs it.
    pub vmm_supported: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`: the vmm backend needs it.
    pub posix_fd_handles: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` (CUDA 12.3+): sharing across nodes and IMEX domains.
    pub fabric_handles: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED`: the IPC-event sync strategy needs it.
    pub ipc_events: Option<bool>,
    /// Stream memory operations, used by the GPU-side sync strategy.
    pub stream_mem_ops: StreamMemOps,
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`.
    pub memory_pools: Option<bool>,
    /// `cuMemGetAllocationGranularity` for a POSIX-fd exportable allocation; `None` without VMM.
    pub vmm_granularity_bytes: Option<Granularity>,
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`.
    pub can_use_host_pointer_for_registered_mem: Option<bool>,
    /// One line per attribute query that failed: which attribute, which `CUresult`.
    pub query_errors: Vec<String>,
}

/// A compute capability, e.g. 9.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// A device's compute mode (`CUcomputemode`).
///
/// In JSON: `{"mode": "default"}`, or `{"mode": "unknown", "code": 1}` for a code this tool does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", content = "code", rename_all = "snake_case")]
pub enum ComputeMode {
    /// `CU_COMPUTEMODE_DEFAULT`: any number of processes may create contexts.
    Default,
    /// `CU_COMPUTEMODE_PROHIBITED`: no process may create a context.
    Prohibited,
    /// `CU_COMPUTEMODE_EXCLUSIVE_PROCESS`: one process at a time may hold contexts.
    ExclusiveProcess,
    /// A code this tool does not know (1 was the long-removed exclusive-thread mode).
    Unknown(i32),
}

/// Stream memory operation support (`cuStreamWaitValue*` / `cuStreamWriteValue*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMemOps {
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`: the ring's 64-bit sequence counters need it.
    pub ops_64_bit: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR`.
    pub wait_value_nor: Option<bool>,
    /// `CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES`.
    pub flush_remote_writes: Option<bool>,
}

/// VMM allocation granularity for one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Granularity {
    /// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
    pub minimum_bytes: u64,
    /// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
    pub recommended_bytes: u64,
}

/// Loads the driver and reads its version; `cuInit` failing (e.g. no device) is recorded, not fatal.
pub fn driver_section() -> DriverSection {
    let library_name = std::env::var("GPU_IPC_LIBCUDA").unwrap_or_else(|_| "libcuda.so.1".to_owned());
    match Driver::load() {
        Err(e) => {
            let reason = match &e {
                DriverError::LibraryNotFound { reason, .. } => reason.clone(),
                other => other.to_string(),
            };
            DriverSection {
                library_name,
                library_found: false,
                library_path_or_error: reason.clone(),
                driver_version: None,
                error: Some(reason),
            }
        }
        Ok(d) => DriverSection {
            library_name,
            library_found: true,
            library_path_or_error: d.library().to_owned(),
            driver_version: Some(DriverVersion::from(d.version())),
            error: Driver::get().err().map(|e| short(&e)),
        },
    }
}

/// "cuInit: CUDA_ERROR_NO_DEVICE" rather than the full sentence, for the report's one-line field.
fn short(e: &DriverError) -> String {
    match e {
        DriverError::Call { function, name, .. } => format!("{function}: {name}"),
        other => other.to_string(),
    }
}

impl From<driver::DriverVersion> for DriverVersion {
    fn from(v: driver::DriverVersion) -> Self {
        Self { major: v.major().max(0) as u32, minor: v.minor().max(0) as u32 }
    }
}

impl From<driver::ComputeMode> for ComputeMode {
    fn from(m: driver::ComputeMode) -> Self {
        match m {
            driver::ComputeMode::Default => Self::Default,
            driver::ComputeMode::Prohibited => Self::Prohibited,
            driver::ComputeMode::ExclusiveProcess => Self::ExclusiveProcess,
            driver::ComputeMode::Unknown(code) => Self::Unknown(code),
        }
    }
}

/// Every device the driver sees (none when `cuInit` failed).
pub fn devices() -> Vec<DeviceReport> {
    let count = Device::count().unwrap_or(0);
    (0..count).filter_map(|i| Device::get(i).ok()).map(device_report).collect()
}

fn device_report(dev: Device) -> DeviceReport {
    let mut errors = Vec::new();
    let mut note = |what: &str, e: DriverError| errors.push(format!("{what}: {e}"));
    let name = dev.name().unwrap_or_else(|e| {
        note("name", e);
        String::new()
    });
    let uuid = dev.uuid().map(|u| u.to_string()).unwrap_or_else(|e| {
        note("uuid", e);
        String::new()
    });
    let (major, minor) = dev.compute_capability().unwrap_or_else(|e| {
        note("compute capability", e);
        (0, 0)
    });
    let total_memory_bytes = dev.total_memory().unwrap_or_else(|e| {
        note("total memory", e);
        0
    });
    let pci_bus_id = dev.pci_bus_id().unwrap_or_else(|e| {
        note("PCI bus id", e);
        String::new()
    });
    let compute_mode = dev.compute_mode().map(ComputeMode::from).unwrap_or_else(|e| {
        note("compute mode", e);
        ComputeMode::Unknown(-1)
    });
    let mut flag = |what: &str, feature: DeviceFeature| match dev.supports(feature) {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(format!("{what}: {e}"));
            None
        }
    };
    let unified_addressing = flag("unified addressing", DeviceFeature::UnifiedAddressing);
    let vmm_supported = flag("VMM", DeviceFeature::VirtualMemoryManagement);
    let posix_fd_handles = flag("POSIX fd handles", DeviceFeature::PosixFdHandles);
    let fabric_handles = flag("fabric handles", DeviceFeature::FabricHandles);
    let ipc_events = flag("IPC events", DeviceFeature::IpcEvents);
    let stream_mem_ops = StreamMemOps {
        ops_64_bit: flag("64-bit stream memory ops", DeviceFeature::StreamMemOps64),
        wait_value_nor: flag("stream wait value NOR", DeviceFeature::StreamWaitValueNor),
        flush_remote_writes: flag("flush remote writes", DeviceFeature::FlushRemoteWrites),
    };
    let memory_pools = flag("memory pools", DeviceFeature::MemoryPools);
    let can_use_host_pointer_for_registered_mem =
        flag("host pointer for registered memory", DeviceFeature::HostPointerForRegisteredMemory);
    let vmm_granularity_bytes = if vmm_supported == Some(true) && posix_fd_handles == Some(true) {
        match VmmGranularity::for_device(dev) {
            Ok(g) => Some(Granularity { minimum_bytes: g.minimum, recommended_bytes: g.recommended }),
            Err(e) => {
                errors.push(format!("VMM granularity: {e}"));
                None
            }
        }
    } else {
        None
    };
    DeviceReport {
        ordinal: dev.ordinal().max(0) as u32,
        name,
        uuid,
        compute_capability: ComputeCapability { major, minor },
        total_memory_bytes,
        pci_bus_id,
        unified_addressing,
        compute_mode,
        vmm_supported,
        posix_fd_handles,
        fabric_handles,
        ipc_events,
        stream_mem_ops,
        memory_pools,
        vmm_granularity_bytes,
        can_use_host_pointer_for_registered_mem,
        query_errors: errors,
    }
}

/// Why CUDA cannot be used here, in one sentence (the missing library, the failing call, or no device); `None`
/// when the driver loaded and lists a device. The doctor's verdict "no CUDA" and every probe's early stop say this.
pub fn no_cuda_reason(driver: &DriverSection, devices: &[DeviceReport]) -> Option<String> {
    if driver.library_found && !devices.is_empty() {
        return None;
    }
    Some(if !driver.library_found {
        format!(
            "no CUDA driver: {} could not be loaded ({}). Install the NVIDIA driver or run on a machine with a GPU.",
            driver.library_name, driver.library_path_or_error
        )
    } else {
        match &driver.error {
            Some(error) => format!(
                "no usable CUDA driver: {} loaded but {error}. Run nvidia-smi to check the driver and the GPUs.",
                driver.library_name
            ),
            None => "no GPU: the CUDA driver reports no device. Check CUDA_VISIBLE_DEVICES and nvidia-smi.".to_owned(),
        }
    })
}
