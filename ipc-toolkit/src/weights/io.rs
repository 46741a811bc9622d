//! Bytes in and out of an arena on each backend: a GPU backend copies with `cuMemcpyHtoD`/`DtoH` through the
//! buffer's span; the host backend copies host memory. One trait, so that the owner and reader are written once.

use crate::pool::{BufferHandle, BufferView, PoolError};
use ipc_core::backend::{Backend, ReachableRegion};

/// A backend whose arenas the weights owner and reader can write and read from the host. Implemented for every
/// GPU backend and for the host backend.
pub trait ArenaBytes: Backend + Sized {
    /// Copies `src` into the owner's buffer at byte `offset`.
    ///
    /// # Errors
    /// A range past the buffer, a freed buffer, or the backend's copy error.
    fn write_owned(handle: &BufferHandle<Self>, offset: u64, src: &[u8]) -> Result<(), PoolError>;
    /// Copies from the owner's buffer at byte `offset` into `dst`.
    ///
    /// # Errors
    /// As [`ArenaBytes::write_owned`].
    fn read_owned(handle: &BufferHandle<Self>, offset: u64, dst: &mut [u8]) -> Result<(), PoolError>;
    /// Copies from an importer's view at byte `offset` into `dst`.
    ///
    /// # Errors
    /// A range past the buffer, or the backend's copy error.
    fn read_viewed(view: &BufferView<Self>, offset: u64, dst: &mut [u8]) -> Result<(), PoolError>;
}

// One impl for every backend whose regions this process can reach (legacy, vmm, host): a GPU backend copies with
// `cuMemcpyHtoD`/`DtoH` through the buffer's span, the host backend through its shared mapping.
impl<B> ArenaBytes for B
where
    B: Backend,
    B::Exported: ReachableRegion,
    B::Imported: ReachableRegion,
{
    fn write_owned(handle: &BufferHandle<Self>, offset: u64, src: &[u8]) -> Result<(), PoolError> {
        handle.write_from_host(offset, src)
    }

    fn read_owned(handle: &BufferHandle<Self>, offset: u64, dst: &mut [u8]) -> Result<(), PoolError> {
        handle.read_to_host(offset, dst)
    }

    fn read_viewed(view: &BufferView<Self>, offset: u64, dst: &mut [u8]) -> Result<(), PoolError> {
        view.read_to_host(offset, dst)
    }
}
