//! What the GPU is handed, in the driver layer's own words: a device address ([`DevicePtr`]), the element types
//! copied bytewise ([`DeviceCopy`]), and host memory that may be registered for the device
//! ([`RegistrableHostMemory`]). Every other file of the layer stands on these; they stand on nothing.

/// A device virtual address (unified with host addresses on 64-bit Linux).
///
/// A `DevicePtr` is only a number: holding one keeps nothing alive, and it may well be the address of host memory
/// Rust has lent out (a pinned host buffer's device address is its host address). So every operation that makes
/// the GPU dereference one is an `unsafe fn`; safe code uses a [`DeviceSpan`](super::DeviceSpan) from the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    #[must_use]
    pub fn offset(self, bytes: u64) -> Self {
        Self(self.0 + bytes)
    }

    /// The raw address.
    pub fn raw(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Plain element types that may be copied bytewise between host and device.
pub trait DeviceCopy: Copy + Default + sealed::Sealed + 'static {}
macro_rules! device_copy {
    ($($t:ty),*) => { $(impl sealed::Sealed for $t {} impl DeviceCopy for $t {})* };
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// Host memory that may be page-locked and mapped for the device by [`HostRegistration`](super::HostRegistration).
///
/// # Safety
/// `as_ptr()..as_ptr()+len()` must be a page-aligned, mapped range that stays mapped, at the same address, for as
/// long as the implementing value lives, and that Rust code only accesses through atomics or raw pointers (the
/// device may write it at any time).
pub unsafe trait RegistrableHostMemory: Send + Sync {
    /// Start of the range.
    fn as_ptr(&self) -> *mut u8;
    /// Length of the range in bytes.
    fn len(&self) -> usize;
    /// True for an empty range (which cannot be registered).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
