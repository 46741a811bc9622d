//! Devices: enumeration, identity and attributes.

use std::ffi::{CStr, c_char};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::Result;
use super::loader::{Driver, entry};
use super::sys;

/// A CUDA device, by ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    ordinal: i32,
    raw: sys::CUdevice,
}

/// A device's compute mode (`CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    /// Any number of processes may create contexts.
    Default,
    /// No process may create a context.
    Prohibited,
    /// One process at a time may hold a context: a second process cannot attach.
    ExclusiveProcess,
    /// A value this build does not know.
    Unknown(i32),
}

impl ComputeMode {
    fn from_raw(value: i32) -> Self {
        match u32::try_from(value) {
            Ok(sys::CU_COMPUTEMODE_DEFAULT) => Self::Default,
            Ok(sys::CU_COMPUTEMODE_PROHIBITED) => Self::Prohibited,
            Ok(sys::CU_COMPUTEMODE_EXCLUSIVE_PROCESS) => Self::ExclusiveProcess,
            _ => Self::Unknown(value),
        }
    }
}

impl Device {
    /// Number of CUDA devices the driver sees.
    ///
    /// # Errors
    /// No driver, or `cuInit` / `cuDeviceGetCount` failing.
    pub fn count() -> Result<i32> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceGetCount, "cuDeviceGetCount")?;
        let mut n = 0;
        // SAFETY: the out-pointer is a valid local i32.
        d.check("cuDeviceGetCount", unsafe { f(&mut n) })?;
        Ok(n)
    }

    /// The device with this ordinal.
    ///
    /// # Errors
    /// `CUDA_ERROR_INVALID_DEVICE` for an ordinal out of range.
    pub fn get(ordinal: i32) -> Result<Self> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceGet, "cuDeviceGet")?;
        let mut raw = 0;
        // SAFETY: the out-pointer is a valid local; the ordinal is checked by the driver.
        d.check("cuDeviceGet", unsafe { f(&mut raw, ordinal) })?;
        Ok(Self { ordinal, raw })
    }

    /// The device whose UUID is `uuid` among those this process sees (`CUDA_VISIBLE_DEVICES` may number them
    /// otherwise than another process does; the UUID names the same device in both), or `None`.
    ///
    /// # Errors
    /// As [`count`](Self::count), [`get`](Self::get) and [`uuid`](Self::uuid).
    pub fn with_uuid(uuid: DeviceUuid) -> Result<Option<Self>> {
        for ordinal in 0..Self::count()? {
            let device = Self::get(ordinal)?;
            if device.uuid()? == uuid {
                return Ok(Some(device));
            }
        }
        Ok(None)
    }

    /// The ordinal this device was opened with.
    pub fn ordinal(self) -> i32 {
        self.ordinal
    }

    pub(crate) fn raw(self) -> sys::CUdevice {
        self.raw
    }

    /// The product name, e.g. `NVIDIA H100 80GB HBM3`.
    ///
    /// # Errors
    /// A failing `cuDeviceGetName`.
    pub fn name(self) -> Result<String> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceGetName, "cuDeviceGetName")?;
        // SAFETY: the buffer is writable for the length passed; the driver NUL-terminates within it.
        read_c_string::<256>(|buf, len| d.check("cuDeviceGetName", unsafe { f(buf, len, self.raw) }))
    }

    /// The device UUID.
    ///
    /// # Errors
    /// A failing `cuDeviceGetUuid_v2`.
    pub fn uuid(self) -> Result<DeviceUuid> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceGetUuid_v2, "cuDeviceGetUuid_v2")?;
        let mut raw = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: the out-pointer is a valid local CUuuid.
        d.check("cuDeviceGetUuid_v2", unsafe { f(&mut raw, self.raw) })?;
        Ok(DeviceUuid(raw.bytes.map(|b| b as u8)))
    }

    /// The PCI bus id, e.g. `0000:17:00.0`.
    ///
    /// # Errors
    /// A failing `cuDeviceGetPCIBusId`.
    pub fn pci_bus_id(self) -> Result<String> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId")?;
        // SAFETY: the buffer is writable for the length passed; the driver NUL-terminates within it.
        read_c_string::<64>(|buf, len| d.check("cuDeviceGetPCIBusId", unsafe { f(buf, len, self.raw) }))
    }

    /// Total memory in bytes.
    ///
    /// # Errors
    /// A failing `cuDeviceTotalMem_v2`.
    pub fn total_memory(self) -> Result<u64> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceTotalMem_v2, "cuDeviceTotalMem")?;
        let mut bytes = 0usize;
        // SAFETY: the out-pointer is a valid local.
        d.check("cuDeviceTotalMem", unsafe { f(&mut bytes, self.raw) })?;
        Ok(bytes as u64)
    }

    /// One device attribute (`CU_DEVICE_ATTRIBUTE_*`).
    ///
    /// # Errors
    /// `CUDA_ERROR_INVALID_VALUE` for an attribute this driver does not know.
    pub(crate) fn attribute(self, attribute: sys::CUdevice_attribute) -> Result<i32> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceGetAttribute, "cuDeviceGetAttribute")?;
        let mut value = 0;
        // SAFETY: the out-pointer is a valid local; the driver validates the attribute.
        d.check("cuDeviceGetAttribute", unsafe { f(&mut value, attribute, self.raw) })?;
        Ok(value)
    }

    /// Whether the device has `feature` (its `CU_DEVICE_ATTRIBUTE_*` is non-zero).
    ///
    /// # Errors
    /// A failing `cuDeviceGetAttribute` (`CUDA_ERROR_INVALID_VALUE` from a driver too old to know the attribute).
    pub fn supports(self, feature: DeviceFeature) -> Result<bool> {
        Ok(self.attribute(feature.attribute())? != 0)
    }

    /// How many streaming multiprocessors the device has (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`), at least 1:
    /// what a grid is sized by (one block per SM, a few per SM).
    ///
    /// # Errors
    /// A failing `cuDeviceGetAttribute`.
    pub fn sm_count(self) -> Result<u32> {
        let count = self.attribute(sys::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(u32::try_from(count).unwrap_or(0).max(1))
    }

    /// The handle types a stream-ordered memory pool on this device may export
    /// (`CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES`).
    ///
    /// # Errors
    /// A failing `cuDeviceGetAttribute`.
    pub fn memory_pool_handle_types(self) -> Result<HandleTypes> {
        let mask = self.attribute(sys::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)?;
        Ok(HandleTypes::from_bits(u64::from(mask as u32)))
    }

    /// Compute capability `(major, minor)`.
    ///
    /// # Errors
    /// A failing `cuDeviceGetAttribute`.
    pub fn compute_capability(self) -> Result<(u32, u32)> {
        let major = self.attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok((major.max(0) as u32, minor.max(0) as u32))
    }

    /// The compute mode.
    ///
    /// # Errors
    /// A failing `cuDeviceGetAttribute`.
    pub fn compute_mode(self) -> Result<ComputeMode> {
        Ok(ComputeMode::from_raw(self.attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)?))
    }

    /// Whether this device can map memory of `peer` (`cuDeviceCanAccessPeer`).
    ///
    /// # Errors
    /// A failing `cuDeviceCanAccessPeer`.
    pub fn can_access_peer(self, peer: Device) -> Result<bool> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer")?;
        let mut can = 0;
        // SAFETY: the out-pointer is a valid local; both devices came from cuDeviceGet.
        d.check("cuDeviceCanAccessPeer", unsafe { f(&mut can, self.raw, peer.raw) })?;
        Ok(can != 0)
    }
}

/// Runs `fill(buffer, length)` on an `N`-byte buffer and returns the NUL-terminated string it wrote.
fn read_c_string<const N: usize>(fill: impl FnOnce(*mut c_char, i32) -> Result<()>) -> Result<String> {
    let mut buf = [0 as c_char; N];
    fill(buf.as_mut_ptr(), (N - 1) as i32)?;
    buf[N - 1] = 0;
    // SAFETY: the buffer is NUL-terminated (its last byte is 0) and lives until the copy below is made.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(text.to_string_lossy().into_owned())
}

/// A GPU's 16-byte UUID, as `cuDeviceGetUuid_v2` returns it.
///
/// Displays and parses in the form `nvidia-smi -L` prints: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`,
/// so a user can match it against `nvidia-smi` output and `CUDA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct DeviceUuid(pub [u8; 16]);

impl fmt::Display for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU-")?;
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for DeviceUuid {
    type Err = InvalidDeviceUuid;

    /// Parses `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex digits in either case).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidDeviceUuid { text: text.to_owned() };
        let rest = text.strip_prefix("GPU-").ok_or_else(bad)?;
        let groups: Vec<&str> = rest.split('-').collect();
        let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        if lengths != [8, 4, 4, 4, 12] {
            return Err(bad());
        }
        let hex: String = groups.concat();
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2).ok_or_else(bad)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(Self(bytes))
    }
}

/// Text that should be a GPU UUID in `nvidia-smi` form is not (what [`DeviceUuid`]'s `FromStr` returns).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a GPU UUID of the form GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
pub struct InvalidDeviceUuid {
    /// The text given.
    pub text: String,
}

/// A capability of a device, read from its `CU_DEVICE_ATTRIBUTE_*` ([`Device::supports`]): what a backend or a
/// sync strategy checks before it relies on it, so a missing one is an error that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceFeature {
    /// One address space for host and device (`CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING`).
    UnifiedAddressing,
    /// Host memory can be mapped into the device's address space (`CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY`).
    MapHostMemory,
    /// 64-bit stream memory operations, `cuStreamWaitValue64`/`cuStreamWriteValue64`
    /// (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`).
    StreamMemOps64,
    /// The NOR condition of `cuStreamWaitValue*` (`CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR`).
    StreamWaitValueNor,
    /// `CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES` (`CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES`).
    FlushRemoteWrites,
    /// The VMM API, `cuMemCreate` and `cuMemMap` (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
    VirtualMemoryManagement,
    /// VMM allocations exported as POSIX file descriptors
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`).
    PosixFdHandles,
    /// VMM allocations exported as fabric handles (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`).
    FabricHandles,
    /// Legacy IPC event handles, `cuIpcGetEventHandle` (`CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED`).
    IpcEvents,
    /// Stream-ordered memory pools, `cuMemAllocAsync` (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`).
    MemoryPools,
    /// Managed memory, `cuMemAllocManaged` (`CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY`).
    ManagedMemory,
    /// The device uses the host pointer of registered memory as its own
    /// (`CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`).
    HostPointerForRegisteredMemory,
}

impl DeviceFeature {
    /// The driver's name of the attribute, as its documentation and error messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::UnifiedAddressing => "CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING",
            Self::MapHostMemory => "CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY",
            Self::StreamMemOps64 => "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS",
            Self::StreamWaitValueNor => "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR",
            Self::FlushRemoteWrites => "CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES",
            Self::VirtualMemoryManagement => "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
            Self::PosixFdHandles => "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
            Self::FabricHandles => "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED",
            Self::IpcEvents => "CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED",
            Self::MemoryPools => "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED",
            Self::ManagedMemory => "CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY",
            Self::HostPointerForRegisteredMemory => "CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM",
        }
    }

    fn attribute(self) -> sys::CUdevice_attribute {
        match self {
            Self::UnifiedAddressing => sys::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
            Self::MapHostMemory => sys::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
            Self::StreamMemOps64 => sys::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
            Self::StreamWaitValueNor => sys::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR,
            Self::FlushRemoteWrites => sys::CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES,
            Self::VirtualMemoryManagement => sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            Self::PosixFdHandles => sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            Self::FabricHandles => sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
            Self::IpcEvents => sys::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED,
            Self::MemoryPools => sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            Self::ManagedMemory => sys::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
            Self::HostPointerForRegisteredMemory => sys::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
        }
    }
}

impl std::fmt::Display for DeviceFeature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of the shareable handle types an allocation may be exported as (`CU_MEM_HANDLE_TYPE_*` bits, as
/// `CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES` reports them and `cuMemCreate`/`cuMemPoolCreate` take them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HandleTypes(u64);

impl HandleTypes {
    /// No shareable handle: memory that stays in this process (`CU_MEM_HANDLE_TYPE_NONE`).
    pub const NONE: Self = Self(sys::CU_MEM_HANDLE_TYPE_NONE as u64);
    /// A POSIX file descriptor, passed to another process with `SCM_RIGHTS`
    /// (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`).
    pub const POSIX_FD: Self = Self(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR as u64);
    /// A fabric handle, 64 opaque bytes that work across nodes with an IMEX channel (`CU_MEM_HANDLE_TYPE_FABRIC`).
    pub const FABRIC: Self = Self(sys::CU_MEM_HANDLE_TYPE_FABRIC as u64);

    /// The set of a `CU_MEM_HANDLE_TYPE_*` bit mask.
    pub const fn from_bits(bits: u64) -> Self {
        Self(bits)
    }

    /// Its `CU_MEM_HANDLE_TYPE_*` bit mask.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Whether every handle type of `other` is in the set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    pub(crate) fn raw(self) -> sys::CUmemAllocationHandleType {
        self.0 as sys::CUmemAllocationHandleType
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn compute_modes_decode() {
        assert_eq!(ComputeMode::from_raw(0), ComputeMode::Default);
        assert_eq!(ComputeMode::from_raw(2), ComputeMode::Prohibited);
        assert_eq!(ComputeMode::from_raw(3), ComputeMode::ExclusiveProcess);
        assert_eq!(ComputeMode::from_raw(7), ComputeMode::Unknown(7));
    }

    #[test]
    fn uuid_displays_like_nvidia_smi_and_parses_back() {
        let uuid = DeviceUuid([
            0x5d, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7, 0xf8,
        ]);
        let text = uuid.to_string();
        assert_eq!(text, "GPU-5d1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8");
        assert_eq!(text.parse::<DeviceUuid>().unwrap(), uuid);
        assert_eq!("GPU-5D1A2B3C-4D5E-6F70-8192-A3B4C5D6E7F8".parse::<DeviceUuid>().unwrap(), uuid);
        for bad in ["5d1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8", "GPU-5d1a", "GPU-zz1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"] {
            assert!(matches!(bad.parse::<DeviceUuid>(), Err(InvalidDeviceUuid { text }) if text == bad), "{bad}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn an_unknown_attribute_is_a_typed_error_naming_the_call() {
        let dev = Device::get(0).unwrap();
        let err = dev.attribute(1_000_000).unwrap_err();
        assert!(err.to_string().starts_with("cuDeviceGetAttribute failed: CUDA_ERROR_INVALID_VALUE"), "{err}");
    }

    #[test]
    fn handle_type_sets_hold_the_driver_bits() {
        assert_eq!(HandleTypes::NONE.bits(), 0);
        assert_eq!(HandleTypes::POSIX_FD.bits(), 1);
        assert_eq!(HandleTypes::FABRIC.bits(), 8);
        let both = HandleTypes::from_bits(HandleTypes::POSIX_FD.bits() | HandleTypes::FABRIC.bits());
        assert!(both.contains(HandleTypes::POSIX_FD) && both.contains(HandleTypes::FABRIC));
        assert!(!HandleTypes::FABRIC.contains(HandleTypes::POSIX_FD));
    }

    #[test]
    fn each_feature_names_its_attribute() {
        assert_eq!(DeviceFeature::StreamMemOps64.to_string(), "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS");
        assert_eq!(DeviceFeature::StreamMemOps64.attribute(), sys::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS);
        assert_eq!(DeviceFeature::MapHostMemory.attribute(), sys::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
    }
}
