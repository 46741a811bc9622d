//! Devices: enumeration, identity and attributes.

use std::ffi::{CStr, c_char};

use super::error::Result;
use super::loader::{Driver, entry};
use super::sys;
pub use crate::wire::DeviceUuid;

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

    /// One device attribute (`CU_DEVICE_ATTRIBUTE_*` from [`sys`](super::sys)).
    ///
    /// # Errors
    /// `CUDA_ERROR_INVALID_VALUE` for an attribute this driver does not know.
    pub fn attribute(self, attribute: sys::CUdevice_attribute) -> Result<i32> {
        let d = Driver::get()?;
        let f = entry!(d, cuDeviceGetAttribute, "cuDeviceGetAttribute")?;
        let mut value = 0;
        // SAFETY: the out-pointer is a valid local; the driver validates the attribute.
        d.check("cuDeviceGetAttribute", unsafe { f(&mut value, attribute, self.raw) })?;
        Ok(value)
    }

    /// A boolean attribute.
    ///
    /// # Errors
    /// As [`Device::attribute`].
    pub fn flag(self, attribute: sys::CUdevice_attribute) -> Result<bool> {
        Ok(self.attribute(attribute)? != 0)
    }

    /// Compute capability `(major, minor)`.
    ///
    /// # Errors
    /// As [`Device::attribute`].
    pub fn compute_capability(self) -> Result<(u32, u32)> {
        let major = self.attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok((major.max(0) as u32, minor.max(0) as u32))
    }

    /// The compute mode.
    ///
    /// # Errors
    /// As [`Device::attribute`].
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_modes_decode() {
        assert_eq!(ComputeMode::from_raw(0), ComputeMode::Default);
        assert_eq!(ComputeMode::from_raw(2), ComputeMode::Prohibited);
        assert_eq!(ComputeMode::from_raw(3), ComputeMode::ExclusiveProcess);
        assert_eq!(ComputeMode::from_raw(7), ComputeMode::Unknown(7));
    }
}
