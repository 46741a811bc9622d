//! Virtual memory management (VMM): physical allocations exportable as POSIX file descriptors, and their
//! mappings into this process's device address space.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::address::DevicePtr;
use super::context::Context;
use super::device::{Device, HandleTypes};
use super::error::{DriverError, Result};
use super::loader::{Driver, entry, release_quietly};
use super::span::{DeviceMemory, DeviceSpan};
use super::sys;

fn posix_fd_props(device: Device) -> sys::CUmemAllocationProp {
    allocation_props(device, sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
}

fn allocation_props(device: Device, handle_types: sys::CUmemAllocationHandleType) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: handle_types,
        location: sys::CUmemLocation { type_: sys::CU_MEM_LOCATION_TYPE_DEVICE, id: device.ordinal() },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The sizes VMM allocations and mappings must be multiples of, for POSIX-fd-exportable memory on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmGranularity {
    /// The minimum granularity (2 MiB on current GPUs).
    pub minimum: u64,
    /// The granularity the driver recommends for performance.
    pub recommended: u64,
}

impl VmmGranularity {
    /// Queries both granularities.
    ///
    /// # Errors
    /// A failing `cuMemGetAllocationGranularity` (e.g. `CUDA_ERROR_NOT_SUPPORTED` without VMM support).
    pub fn for_device(device: Device) -> Result<Self> {
        let d = Driver::get()?;
        let f = entry!(d, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity")?;
        let prop = posix_fd_props(device);
        let (mut minimum, mut recommended) = (0usize, 0usize);
        // SAFETY: out-pointers are valid locals; `prop` is a fully initialised property struct.
        d.check("cuMemGetAllocationGranularity", unsafe {
            f(&mut minimum, &prop, sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        })?;
        // SAFETY: as above.
        d.check("cuMemGetAllocationGranularity", unsafe {
            f(&mut recommended, &prop, sys::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        })?;
        Ok(Self { minimum: minimum as u64, recommended: recommended as u64 })
    }

    /// `bytes` rounded up to a multiple of the minimum granularity.
    pub fn round_up(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.minimum.max(1)) * self.minimum.max(1)
    }
}

/// A physical VMM allocation (`cuMemCreate`, POSIX-fd exportable unless made with other handle types) or an
/// imported or retained one; released on drop.
///
/// The memory itself lives until every process has released its handle and unmapped it: that is what keeps
/// shared memory alive after the exporter exits.
pub struct VmmAllocation {
    ctx: Context,
    handle: sys::CUmemGenericAllocationHandle,
    size: u64,
}

impl std::fmt::Debug for VmmAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmmAllocation").field("handle", &self.handle).field("size", &self.size).finish()
    }
}

impl VmmAllocation {
    /// Creates `size` bytes (a multiple of the minimum [`VmmGranularity`]) on the context's device.
    ///
    /// # Errors
    /// A size that is not a multiple of the granularity; a failing `cuMemCreate`.
    pub fn create(ctx: &Context, size: u64) -> Result<Self> {
        Self::create_with_handle_types(ctx, size, HandleTypes::POSIX_FD)
    }

    /// Creates `size` bytes (a multiple of the minimum [`VmmGranularity`]) that may be exported as the
    /// `handle_types` ([`HandleTypes::NONE`] for memory that stays in this process, [`HandleTypes::POSIX_FD`],
    /// [`HandleTypes::FABRIC`]).
    ///
    /// # Errors
    /// A size that is not a multiple of the granularity; a failing `cuMemCreate` (a fabric handle is refused,
    /// e.g. with `CUDA_ERROR_NOT_SUPPORTED` or `CUDA_ERROR_NOT_PERMITTED`, where no IMEX channel is set up).
    pub fn create_with_handle_types(ctx: &Context, size: u64, handle_types: HandleTypes) -> Result<Self> {
        let granularity = VmmGranularity::for_device(ctx.device())?;
        if size == 0 || !size.is_multiple_of(granularity.minimum) {
            return Err(DriverError::InvalidArgument {
                function: "cuMemCreate",
                problem: format!(
                    "{size} bytes is not a positive multiple of the {}-byte VMM granularity",
                    granularity.minimum
                ),
            });
        }
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemCreate, "cuMemCreate")?;
        let prop = allocation_props(ctx.device(), handle_types.raw());
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: the out-pointer is a valid local; `prop` is fully initialised; flags must be 0.
        d.check("cuMemCreate", unsafe { f(&mut handle, size as usize, &prop, 0) })?;
        Ok(Self { ctx: ctx.clone(), handle, size })
    }

    /// Exports the allocation as a new POSIX file descriptor (close-on-exec, owned by the caller).
    ///
    /// Make one only when a peer asks for it and close it right after sending (the wire layer does).
    ///
    /// # Errors
    /// A failing `cuMemExportToShareableHandle` (e.g. for an allocation made without the POSIX-fd handle type).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let d = Driver::get()?;
        let f = entry!(d, cuMemExportToShareableHandle, "cuMemExportToShareableHandle")?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: for the POSIX-fd handle type the driver writes one int (a new fd) into the valid local.
        d.check("cuMemExportToShareableHandle", unsafe {
            f((&mut fd as *mut std::ffi::c_int).cast(), self.handle, sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        })?;
        if fd < 0 {
            return Err(DriverError::InvalidArgument {
                function: "cuMemExportToShareableHandle",
                problem: format!("the driver returned fd {fd}"),
            });
        }
        // SAFETY: the driver created this descriptor for us and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Imports an allocation from a file descriptor another process exported (`size` as that process said).
    /// The fd is only borrowed: the caller may close it afterwards.
    ///
    /// # Errors
    /// A failing `cuMemImportFromShareableHandle` (e.g. `CUDA_ERROR_INVALID_VALUE` for an fd that is not a CUDA
    /// allocation).
    pub fn import_fd(ctx: &Context, fd: BorrowedFd<'_>, size: u64) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle")?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: for the POSIX-fd handle type the "OS handle" argument is the fd's value cast to a pointer; the fd
        // is open for the duration of the call (borrowed); the out-pointer is a valid local.
        d.check("cuMemImportFromShareableHandle", unsafe {
            f(
                &mut handle,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        Ok(Self { ctx: ctx.clone(), handle, size })
    }

    /// Exports the allocation as a fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`, 64 opaque bytes), which works
    /// across nodes of an NVLink fabric and needs an IMEX channel.
    ///
    /// # Errors
    /// A failing `cuMemExportToShareableHandle` (e.g. for memory created without the fabric handle type, or
    /// `CUDA_ERROR_NOT_PERMITTED` / `CUDA_ERROR_NOT_SUPPORTED` without IMEX).
    pub fn export_fabric(&self) -> Result<[u8; 64]> {
        let d = Driver::get()?;
        let f = entry!(d, cuMemExportToShareableHandle, "cuMemExportToShareableHandle")?;
        let mut handle = [0u8; 64];
        // SAFETY: for the fabric handle type the driver writes one CUmemFabricHandle (64 bytes) into the valid
        // local buffer of that size.
        d.check("cuMemExportToShareableHandle", unsafe {
            f(handle.as_mut_ptr().cast(), self.handle, sys::CU_MEM_HANDLE_TYPE_FABRIC, 0)
        })?;
        Ok(handle)
    }

    /// Imports an allocation from a fabric handle another process exported (`size` as that process said).
    ///
    /// # Errors
    /// A failing `cuMemImportFromShareableHandle`.
    pub fn import_fabric(ctx: &Context, handle: &[u8; 64], size: u64) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle")?;
        let mut raw: sys::CUmemGenericAllocationHandle = 0;
        let mut fabric = *handle;
        // SAFETY: for the fabric handle type the "OS handle" argument points to a CUmemFabricHandle (64 bytes),
        // here a local copy valid for the call; the out-pointer is a valid local.
        d.check("cuMemImportFromShareableHandle", unsafe {
            f(&mut raw, fabric.as_mut_ptr().cast(), sys::CU_MEM_HANDLE_TYPE_FABRIC)
        })?;
        Ok(Self { ctx: ctx.clone(), handle: raw, size })
    }

    /// A new reference to the VMM allocation mapped at `ptr` (`cuMemRetainAllocationHandle`), released on drop;
    /// `size` is the allocation's size as the caller knows it.
    ///
    /// # Errors
    /// A failing `cuMemRetainAllocationHandle`: memory that is not mapped from a VMM allocation (`cuMemAlloc`,
    /// pool, host or managed memory) is refused, typically with `CUDA_ERROR_INVALID_VALUE`.
    pub fn retain(ctx: &Context, ptr: DevicePtr, size: u64) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle")?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: the out-pointer is a valid local; the address is only looked up by the driver, never
        // dereferenced on the host.
        d.check("cuMemRetainAllocationHandle", unsafe { f(&mut handle, ptr.0 as *mut std::ffi::c_void) })?;
        Ok(Self { ctx: ctx.clone(), handle, size })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for VmmAllocation {
    fn drop(&mut self) {
        release_quietly("releasing a VMM allocation", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuMemRelease, "cuMemRelease")?;
            // SAFETY: the handle came from cuMemCreate/cuMemImportFromShareableHandle and is released once, here.
            d.check("cuMemRelease", unsafe { f(self.handle) })
        });
    }
}

/// A [`VmmAllocation`] mapped at a reserved device address and made readable and writable by the context's
/// device; or several, side by side in one reserved range ([`VmmMapping::map_side_by_side`]: how an importer sees a
/// range PyTorch's expandable segments made of many allocations). Unmapped, unreserved and released on drop.
pub struct VmmMapping {
    ctx: Context,
    /// The allocations, in address order, each at its offset from `base`.
    allocations: Vec<(u64, VmmAllocation)>,
    base: DevicePtr,
    size: u64,
    /// How many allocations (from the first) are mapped: what `Drop` unmaps.
    mapped: usize,
}

impl std::fmt::Debug for VmmMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmmMapping")
            .field("base", &self.base)
            .field("size", &self.size)
            .field("allocations", &self.allocations.len())
            .finish()
    }
}

impl VmmMapping {
    /// Reserves an address range, maps the allocation there and grants the device read-write access.
    ///
    /// # Errors
    /// A failing `cuMemAddressReserve`, `cuMemMap` or `cuMemSetAccess`; whatever was done is undone.
    pub fn map(allocation: VmmAllocation) -> Result<Self> {
        Self::map_side_by_side(vec![allocation])
    }

    /// Reserves one address range for all the allocations, maps each there right after the one before (in the
    /// order given, each whole, at offset 0 of the allocation), and grants the device read-write access to the
    /// whole range: one contiguous span, as the exporter had them.
    ///
    /// # Errors
    /// No allocation, or allocations of other contexts; a size that is not a multiple of the granularity; a
    /// failing `cuMemAddressReserve`, `cuMemMap` or `cuMemSetAccess`; whatever was done is undone (the mapped
    /// pieces unmapped, the range freed, the allocations released).
    pub fn map_side_by_side(allocations: Vec<VmmAllocation>) -> Result<Self> {
        let invalid = |problem: String| DriverError::InvalidArgument { function: "cuMemMap", problem };
        let Some(ctx) = allocations.first().map(|a| a.ctx.clone()) else {
            return Err(invalid("no allocation to map".into()));
        };
        if allocations.iter().any(|a| a.ctx.as_raw() != ctx.as_raw()) {
            return Err(invalid("allocations of several contexts cannot be mapped side by side".into()));
        }
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let granularity = VmmGranularity::for_device(ctx.device())?;
        let mut offsets = Vec::with_capacity(allocations.len());
        let mut size = 0u64;
        for allocation in &allocations {
            if allocations.len() > 1 && !allocation.size.is_multiple_of(granularity.minimum.max(1)) {
                return Err(invalid(format!(
                    "an allocation of {} bytes is not a multiple of the {}-byte granularity: the next one could not \
                     be mapped right after it",
                    allocation.size, granularity.minimum
                )));
            }
            offsets.push(size);
            size =
                size.checked_add(allocation.size).ok_or_else(|| invalid("the allocations exceed 2^64 bytes".into()))?;
        }
        let reserve = entry!(d, cuMemAddressReserve, "cuMemAddressReserve")?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a valid local; no fixed address is requested (addr 0); flags 0.
        d.check("cuMemAddressReserve", unsafe {
            reserve(&mut base, size as usize, granularity.minimum as usize, 0, 0)
        })?;
        // From here on Drop undoes what was done.
        let allocations = offsets.into_iter().zip(allocations).collect();
        let mut mapping = Self { ctx: ctx.clone(), allocations, base: DevicePtr(base), size, mapped: 0 };
        let map = entry!(d, cuMemMap, "cuMemMap")?;
        for (offset, allocation) in &mapping.allocations {
            // SAFETY: [base + offset, + size) lies inside the range just reserved by us, after the pieces mapped
            // before; the handle is alive; offset into the allocation 0, flags 0.
            d.check("cuMemMap", unsafe { map(base + offset, allocation.size as usize, 0, allocation.handle, 0) })?;
            mapping.mapped += 1;
        }
        let set_access = entry!(d, cuMemSetAccess, "cuMemSetAccess")?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation { type_: sys::CU_MEM_LOCATION_TYPE_DEVICE, id: ctx.device().ordinal() },
            flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the whole range is mapped; one descriptor is passed, by pointer to a valid local.
        d.check("cuMemSetAccess", unsafe { set_access(base, size as usize, &access, 1) })?;
        Ok(mapping)
    }

    /// The device address of the mapping.
    pub fn ptr(&self) -> DevicePtr {
        self.base
    }

    /// Size in bytes (of every allocation mapped, side by side).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The (first) allocation behind the mapping (to export it).
    pub fn allocation(&self) -> &VmmAllocation {
        // `map_side_by_side` refuses to make a mapping of no allocation.
        &self.allocations[0].1
    }

    /// Every allocation behind the mapping, in address order, each with its offset from [`ptr`](Self::ptr).
    pub fn allocations(&self) -> impl Iterator<Item = (u64, &VmmAllocation)> {
        self.allocations.iter().map(|(offset, allocation)| (*offset, allocation))
    }
}

impl DeviceMemory for VmmMapping {
    fn span(&self) -> DeviceSpan<'_> {
        // `map_side_by_side` mapped exactly `size` bytes at `base` (cuMemMap refuses a size the allocation does not
        // have), and made all of them accessible.
        DeviceSpan::of_owner(self.base, self.size)
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        for (offset, allocation) in self.allocations.iter().take(self.mapped) {
            release_quietly("unmapping a VMM range", |d| {
                let _entered = self.ctx.enter()?;
                let f = entry!(d, cuMemUnmap, "cuMemUnmap")?;
                // SAFETY: this piece was mapped by `map_side_by_side` and is unmapped exactly once, here.
                d.check("cuMemUnmap", unsafe { f(self.base.0 + offset, allocation.size as usize) })
            });
        }
        release_quietly("freeing a VMM address range", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuMemAddressFree, "cuMemAddressFree")?;
            // SAFETY: the range was reserved by `map_side_by_side` and is freed exactly once, after unmapping.
            d.check("cuMemAddressFree", unsafe { f(self.base.0, self.size as usize) })
        });
        // `allocations` drop after this, releasing the physical handles.
    }
}
