//! Borrowed ranges of memory the GPU may access ([`DeviceSpan`]), the owners that hand them out
//! ([`DeviceMemory`]), and the safe, bounds-checked operations on them.
//!
//! The soundness rule of the driver layer: a safe function never lets the GPU (or the driver's copy engines)
//! read or write memory that Rust code holds a reference to. A bare [`DevicePtr`] is only a number (under unified
//! addressing a pinned host buffer's device address is its host address), so every operation that makes the GPU
//! dereference one is an `unsafe fn`. A `DeviceSpan` can only be obtained from an owner of memory that no Rust
//! reference covers (device allocations, imports and mappings, managed memory, and host memory registered for the
//! device whose CPU side is reachable only through atomics), and sub-spans are bounds-checked; so the operations
//! taking spans are safe.

use std::marker::PhantomData;

use super::address::{DeviceCopy, DevicePtr, RegistrableHostMemory};
use super::copy;
use super::error::{DriverError, Result};
use super::stream::{Stream, WaitCondition};

/// A range of memory the GPU may read and write, borrowed from its owner for `'a`: an address and a length.
///
/// Obtained from a [`DeviceMemory`] owner ([`DeviceMemory::span`]) and narrowed with [`DeviceSpan::slice`] or
/// [`DeviceSpan::sub_span_at`]; never made from a bare address in safe code. The borrow keeps the owner alive
/// while work is *queued*; work that runs after the owner is dropped is the owner's teardown problem (owners
/// release memory only through the driver, which reports, rather than corrupts, a late access).
///
/// ```no_run
/// use gpu_ipc_driver::{Context, DeviceBuffer, DeviceMemory};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::for_ordinal(0)?;
/// let buffer = DeviceBuffer::alloc(&ctx, 4096)?;
/// let tail = buffer.span().slice(4000, 96)?;
/// tail.write(0, &[7u32; 24])?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpan<'a> {
    ptr: DevicePtr,
    len: u64,
    owner: PhantomData<&'a ()>,
}

impl std::fmt::Debug for DeviceSpan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSpan").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

/// Owners of memory the GPU may access while no Rust reference covers it: device allocations and mappings, and
/// host memory registered for the device whose CPU side is reachable only through atomics.
///
/// Implementing it outside the driver layer is safe: a span can only be made from another span.
pub trait DeviceMemory {
    /// The whole range, borrowed.
    fn span(&self) -> DeviceSpan<'_>;
}

impl<T: DeviceMemory + ?Sized> DeviceMemory for &T {
    fn span(&self) -> DeviceSpan<'_> {
        (**self).span()
    }
}

impl<T: DeviceMemory + ?Sized> DeviceMemory for std::sync::Arc<T> {
    fn span(&self) -> DeviceSpan<'_> {
        (**self).span()
    }
}

impl<T: DeviceMemory + ?Sized> DeviceMemory for Box<T> {
    fn span(&self) -> DeviceSpan<'_> {
        (**self).span()
    }
}

impl<'a> DeviceSpan<'a> {
    /// A span over memory the caller owns; only for owners in the driver layer, which know what they hold.
    pub(super) fn of_owner(ptr: DevicePtr, len: u64) -> Self {
        Self { ptr, len, owner: PhantomData }
    }

    /// A span over `len` bytes at `ptr`, for memory that some code outside this crate owns.
    ///
    /// # Safety
    /// For as long as `'a` and any GPU work queued through the span runs, `[ptr, ptr + len)` must be memory the
    /// device can address and that no Rust reference (`&`, `&mut`, slices) covers: device memory, or host memory
    /// that Rust code reaches only through atomics or raw pointers.
    pub unsafe fn from_raw_parts(ptr: DevicePtr, len: u64) -> Self {
        Self::of_owner(ptr, len)
    }

    /// The start address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length span.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at byte `offset` of this span.
    ///
    /// # Errors
    /// [`DriverError::InvalidArgument`] when they do not lie inside it.
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceSpan<'a>> {
        self.check_fits("DeviceSpan::slice", offset, len)?;
        Ok(Self::of_owner(self.ptr.offset(offset), len))
    }

    /// The first `len` bytes, or the whole span if it is shorter.
    #[must_use]
    pub fn prefix(&self, len: u64) -> DeviceSpan<'a> {
        Self::of_owner(self.ptr, len.min(self.len))
    }

    /// The `len` bytes at address `ptr`, which must lie inside this span (for addresses computed elsewhere, such
    /// as a ring slot's).
    ///
    /// # Errors
    /// [`DriverError::InvalidArgument`] when they do not lie inside it.
    pub fn sub_span_at(&self, ptr: DevicePtr, len: u64) -> Result<DeviceSpan<'a>> {
        let offset = ptr.0.checked_sub(self.ptr.0).ok_or_else(|| DriverError::InvalidArgument {
            function: "DeviceSpan::sub_span_at",
            problem: format!("address {ptr} is below the span starting at {}", self.ptr),
        })?;
        self.check_fits("DeviceSpan::sub_span_at", offset, len)?;
        Ok(Self::of_owner(ptr, len))
    }

    fn check_fits(&self, function: &'static str, offset: u64, bytes: u64) -> Result<()> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.len) {
            return Err(DriverError::InvalidArgument {
                function,
                problem: format!("{bytes} bytes at offset {offset} exceed the {}-byte span at {}", self.len, self.ptr),
            });
        }
        Ok(())
    }

    /// The device address of the aligned 64-bit word at byte `offset`, checked against the span.
    pub(super) fn word_at(&self, offset: u64, function: &'static str) -> Result<DevicePtr> {
        let fits = offset.checked_add(8).is_some_and(|end| end <= self.len);
        if !fits || !offset.is_multiple_of(8) || !self.ptr.0.is_multiple_of(8) {
            return Err(DriverError::InvalidArgument {
                function,
                problem: format!(
                    "offset {offset} is not an aligned 8-byte word of the {}-byte span at {}",
                    self.len, self.ptr
                ),
            });
        }
        Ok(self.ptr.offset(offset))
    }

    /// Copies `src` into the span at byte `offset` (synchronous, `cuMemcpyHtoD`).
    ///
    /// # Errors
    /// Out of bounds, or a failing `cuMemcpyHtoD`.
    pub fn write<T: DeviceCopy>(&self, offset: u64, src: &[T]) -> Result<()> {
        self.check_fits("cuMemcpyHtoD", offset, std::mem::size_of_val(src) as u64)?;
        // SAFETY: the destination lies inside this span, whose owner guarantees no Rust reference covers it.
        unsafe { copy::copy_to_device(self.ptr.offset(offset), src) }
    }

    /// Copies from the span at byte `offset` into `dst` (synchronous, `cuMemcpyDtoH`).
    ///
    /// # Errors
    /// Out of bounds, or a failing `cuMemcpyDtoH`.
    pub fn read<T: DeviceCopy>(&self, offset: u64, dst: &mut [T]) -> Result<()> {
        self.check_fits("cuMemcpyDtoH", offset, std::mem::size_of_val(dst) as u64)?;
        // SAFETY: the source lies inside this span, whose owner guarantees no Rust reference covers it.
        unsafe { copy::copy_from_device(dst, self.ptr.offset(offset)) }
    }

    /// Fills the whole span with a 32-bit value on `stream` (`cuMemsetD32Async`; the length must be a multiple of 4).
    ///
    /// # Errors
    /// A length not a multiple of 4, or a failing `cuMemsetD32Async`.
    pub fn fill_u32_async(&self, value: u32, stream: &Stream) -> Result<()> {
        // SAFETY: the whole range is this span, whose owner guarantees no Rust reference covers it.
        unsafe { copy::fill_u32_async(self.ptr, self.len, value, stream) }
    }

    /// Copies all of `src` into this span on `stream` (`cuMemcpyDtoDAsync`); the lengths must be equal.
    ///
    /// # Errors
    /// Different lengths, or a failing `cuMemcpyDtoDAsync`.
    pub fn copy_from_async(&self, src: &DeviceSpan<'_>, stream: &Stream) -> Result<()> {
        if src.len != self.len {
            return Err(DriverError::InvalidArgument {
                function: "cuMemcpyDtoDAsync",
                problem: format!("source of {} bytes and destination of {} bytes differ", src.len, self.len),
            });
        }
        // SAFETY: both ranges are whole spans, whose owners guarantee no Rust reference covers them.
        unsafe { copy::copy_device_async(self.ptr, src.ptr, self.len, stream) }
    }

    /// Copies the whole span into `dst[offset..offset + len]` (synchronous, `cuMemcpyDtoH`), host memory that is
    /// not Rust-owned (a shared-memory mapping, registered or not).
    ///
    /// # Errors
    /// A range beyond `dst`, or a failing `cuMemcpyDtoH`.
    pub fn copy_to_host_memory<M: RegistrableHostMemory>(&self, dst: &M, offset: usize) -> Result<()> {
        let bytes = host_bytes(self.len, "cuMemcpyDtoH")?;
        // SAFETY: the source is this whole span, whose owner guarantees no Rust reference covers it.
        unsafe { copy::copy_device_to_host_memory(dst, offset, self.ptr, bytes) }
    }

    /// Copies `src[offset..offset + len]`, host memory that is not Rust-owned, into the whole span
    /// (`cuMemcpyHtoD`). Synchronous: it returns when the bytes are on the device, also from pageable memory,
    /// where `cuMemcpyHtoD` alone returns once the source is staged (the copy is followed by a synchronisation of
    /// the legacy default stream, which waits for no stream this crate makes).
    ///
    /// # Errors
    /// A range beyond `src`, or a failing `cuMemcpyHtoD`.
    pub fn copy_from_host_memory<M: RegistrableHostMemory>(&self, src: &M, offset: usize) -> Result<()> {
        let bytes = host_bytes(self.len, "cuMemcpyHtoD")?;
        // SAFETY: the destination is this whole span, whose owner guarantees no Rust reference covers it.
        unsafe { copy::copy_host_memory_to_device(self.ptr, src, offset, bytes) }
    }

    /// Queues on `stream` a GPU-side wait until the aligned 64-bit word at byte `offset` of the span satisfies
    /// `condition` against `value` (`cuStreamWaitValue64`).
    ///
    /// # Errors
    /// An offset outside the span or not 8-byte aligned; a failing `cuStreamWaitValue64`.
    pub fn wait_value_u64(&self, stream: &Stream, offset: u64, value: u64, condition: WaitCondition) -> Result<()> {
        let word = self.word_at(offset, "cuStreamWaitValue64")?;
        // SAFETY: `word` is an aligned word inside this span, whose owner guarantees no Rust reference covers it.
        unsafe { stream.wait_value_u64(word, value, condition) }
    }

    /// Queues on `stream` a GPU-side write of `value` to the aligned 64-bit word at byte `offset` of the span
    /// (`cuStreamWriteValue64`), after the stream's earlier work.
    ///
    /// # Errors
    /// An offset outside the span or not 8-byte aligned; a failing `cuStreamWriteValue64`.
    pub fn write_value_u64(&self, stream: &Stream, offset: u64, value: u64) -> Result<()> {
        let word = self.word_at(offset, "cuStreamWriteValue64")?;
        // SAFETY: as for `wait_value_u64`.
        unsafe { stream.write_value_u64(word, value) }
    }
}

fn host_bytes(len: u64, function: &'static str) -> Result<usize> {
    usize::try_from(len).map_err(|_| DriverError::InvalidArgument {
        function,
        problem: format!("{len} bytes do not fit this machine's address space"),
    })
}

/// The parts every owned device range shares (a context, an address, a length): `Debug`, `ptr()`, `len()`,
/// `is_empty()` and [`DeviceMemory`] over the whole range. `$what` names the range in the accessors' docs.
/// The type keeps its own constructor and `Drop` (how the range is let go is what differs).
macro_rules! owned_device_range {
    ($ty:ident, $what:literal) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty)).field("ptr", &self.ptr).field("len", &self.len).finish()
            }
        }

        impl $ty {
            #[doc = concat!("The address of ", $what, " in this process.")]
            pub fn ptr(&self) -> $crate::DevicePtr {
                self.ptr
            }

            #[doc = concat!("The size of ", $what, " in bytes.")]
            pub fn len(&self) -> u64 {
                self.len
            }

            /// Always false: no empty range is made (zero-byte allocations are refused; the driver maps none).
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
        }

        impl $crate::span::DeviceMemory for $ty {
            fn span(&self) -> $crate::span::DeviceSpan<'_> {
                $crate::span::DeviceSpan::of_owner(self.ptr, self.len)
            }
        }
    };
}
pub(crate) use owned_device_range;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn span(ptr: u64, len: u64) -> DeviceSpan<'static> {
        DeviceSpan::of_owner(DevicePtr(ptr), len)
    }

    #[test]
    fn slices_stay_inside_the_span() {
        let whole = span(0x1000, 256);
        let part = whole.slice(16, 32).unwrap();
        assert_eq!((part.ptr(), part.len()), (DevicePtr(0x1010), 32));
        assert_eq!(whole.slice(0, 256).unwrap(), whole);
        assert_eq!(whole.slice(256, 0).unwrap().len(), 0);
        for (offset, len) in [(0, 257), (255, 2), (u64::MAX, 2), (1, u64::MAX)] {
            let err = whole.slice(offset, len).unwrap_err();
            assert!(matches!(err, DriverError::InvalidArgument { function: "DeviceSpan::slice", .. }), "{err}");
        }
        // A slice of a slice is checked against the slice, not the original.
        assert!(part.slice(0, 33).is_err());
        assert_eq!(whole.prefix(16), whole.slice(0, 16).unwrap());
        assert_eq!(whole.prefix(1000), whole);
    }

    #[test]
    fn sub_spans_by_address_are_checked_both_ways() {
        let whole = span(0x1000, 256);
        assert_eq!(whole.sub_span_at(DevicePtr(0x1080), 128).unwrap(), whole.slice(128, 128).unwrap());
        assert!(whole.sub_span_at(DevicePtr(0xfff), 1).is_err(), "below the start");
        assert!(whole.sub_span_at(DevicePtr(0x1080), 129).is_err(), "past the end");
    }

    #[test]
    fn words_must_be_aligned_and_inside() {
        let whole = span(0x1000, 64);
        assert_eq!(whole.word_at(56, "x").unwrap(), DevicePtr(0x1038));
        assert!(whole.word_at(60, "x").is_err(), "unaligned");
        assert!(whole.word_at(64, "x").is_err(), "past the end");
        assert!(span(0x1004, 64).word_at(0, "x").is_err(), "unaligned span start");
    }

    #[test]
    fn checks_run_before_the_driver_is_called() {
        let whole = span(0x1000, 64);
        assert!(matches!(whole.write(60, &[1u64]), Err(DriverError::InvalidArgument { .. })));
        assert!(matches!(whole.read(0, &mut [0u8; 65]), Err(DriverError::InvalidArgument { .. })));
    }
}
