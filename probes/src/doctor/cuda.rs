//! The CUDA half of the doctor: the driver, and each device's identity and IPC-relevant attributes.

use gpu_ipc::core::driver::{self, Device, Driver, DriverError, VmmGranularity, sys};

use super::report::{
    ComputeCapability, ComputeMode, DeviceReport, DriverSection, DriverVersion, Granularity, StreamMemOps,
};

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
    let mut flag = |what: &str, attr: sys::CUdevice_attribute| match dev.flag(attr) {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(format!("{what}: {e}"));
            None
        }
    };
    let unified_addressing = flag("unified addressing", sys::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
    let vmm_supported = flag("VMM", sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
    let posix_fd_handles =
        flag("POSIX fd handles", sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
    let fabric_handles = flag("fabric handles", sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
    let ipc_events = flag("IPC events", sys::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED);
    let stream_mem_ops = StreamMemOps {
        ops_64_bit: flag("64-bit stream memory ops", sys::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS),
        wait_value_nor: flag("stream wait value NOR", sys::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR),
        flush_remote_writes: flag("flush remote writes", sys::CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES),
    };
    let memory_pools = flag("memory pools", sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
    let can_use_host_pointer_for_registered_mem =
        flag("host pointer for registered memory", sys::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
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
