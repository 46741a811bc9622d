//! Shared memory viewed as a `#[repr(C)]` value made only of atomics ([`SharedObject`]), behind the one `unsafe`
//! trait that says which types may be laid over memory other processes write ([`AtomicPlainData`]).

use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;

use super::error::ShmError;
use super::memory::SharedMemory;

/// Types that may be laid over shared memory that other processes write concurrently.
///
/// # Safety
///
/// An implementor guarantees that every bit pattern of `size_of::<Self>()` bytes (including all zeros, which is
/// what a fresh memfd holds, and whatever a buggy or hostile peer wrote) is a valid value, and that every field is
/// an atomic (or an array or `#[repr(C)]` struct of such), so mutation by other processes through a shared
/// reference is ordinary interior mutability and never a data race on a non-atomic.
pub unsafe trait AtomicPlainData: Sync {}

// SAFETY: `AtomicU64` is valid for every 64-bit pattern and is mutated only atomically.
unsafe impl AtomicPlainData for AtomicU64 {}
// SAFETY: an array of valid-for-every-pattern atomics is itself valid for every pattern and has no padding.
unsafe impl<T: AtomicPlainData, const N: usize> AtomicPlainData for [T; N] {}

/// A [`SharedMemory`] whose first `size_of::<T>()` bytes are viewed as a `T` made only of atomics.
#[derive(Debug)]
pub struct SharedObject<T: AtomicPlainData> {
    memory: SharedMemory,
    _type: PhantomData<T>,
}

impl<T: AtomicPlainData> SharedObject<T> {
    /// Checks that `T` fits the mapping (size and alignment) and wraps it.
    pub fn new(memory: SharedMemory) -> Result<Self, ShmError> {
        let fits = memory.len() >= size_of::<T>() && memory.as_ptr().align_offset(align_of::<T>()) == 0;
        if !fits {
            return Err(ShmError::ViewDoesNotFit {
                len: memory.len(),
                type_name: std::any::type_name::<T>(),
                size: size_of::<T>(),
                align: align_of::<T>(),
            });
        }
        Ok(Self { memory, _type: PhantomData })
    }

    /// The shared object. Other processes may change it at any time, through its atomics only.
    pub fn get(&self) -> &T {
        // SAFETY: `new` checked that the mapping is at least `size_of::<T>()` bytes and aligned for `T`; the
        // mapping lives as long as `self.memory`, which the returned borrow of `self` keeps alive; and
        // `T: AtomicPlainData` makes any content valid and all concurrent mutation atomic.
        unsafe { &*self.memory.as_ptr().cast::<T>() }
    }

    /// The underlying mapping (for its fd, base address and length).
    pub fn memory(&self) -> &SharedMemory {
        &self.memory
    }
}

// SAFETY: as for `SharedMemory`, which this owns; `T` is made only of atomics (`AtomicPlainData`).
unsafe impl<T: AtomicPlainData + Send> gpu_ipc_driver::RegistrableHostMemory for SharedObject<T> {
    fn as_ptr(&self) -> *mut u8 {
        self.memory().as_ptr()
    }
    fn len(&self) -> usize {
        self.memory().len()
    }
}
