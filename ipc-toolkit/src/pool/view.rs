//! [`BufferView`]: an importer's pinned view of a named buffer.

use std::sync::Arc;

use super::attachment::ImporterInner;
use super::blocks::ImportedBlock;
use super::directory::{EntryRecord, find};
use super::error::PoolError;
use super::handle::{BufferInfo, check_range, copy_from_region};
use gpu_ipc_driver::{DeviceMemory, DevicePtr, DeviceSpan};
use ipc_core::backend::{Backend, GpuBackend, ReachableRegion};
use ipc_core::host::Host;
use ipc_core::wire::TensorDesc;

/// A buffer an importer looked up: its address in this process, its length, tensor description and generation.
///
/// While the view lives, its slot is pinned: the owner does not reuse the buffer's bytes even if it frees the
/// buffer, and the block stays mapped (even past the importer's drop). Make sure GPU work that reads or writes the
/// buffer has finished before the view is dropped. Dropping the last view of a freed buffer lets the owner reuse
/// its bytes.
pub struct BufferView<B: Backend> {
    importer: Arc<ImporterInner<B>>,
    block: Arc<ImportedBlock<B>>,
    slot: u32,
    info: BufferInfo,
    ptr: DevicePtr,
}

impl<B: Backend> std::fmt::Debug for BufferView<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferView")
            .field("name", &self.info.name)
            .field("generation", &self.info.generation)
            .field("ptr", &self.ptr)
            .field("len", &self.info.len)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> BufferView<B> {
    /// A view of the entry in `slot`, which the caller pinned once (the view owns that pin).
    pub(crate) fn new(
        importer: Arc<ImporterInner<B>>,
        block: Arc<ImportedBlock<B>>,
        slot: u32,
        record: EntryRecord,
    ) -> Self {
        let ptr = block.base().offset(record.offset);
        let info = BufferInfo { name: record.name, generation: record.generation, len: record.len, desc: record.desc };
        Self { importer, block, slot, info, ptr }
    }

    /// The buffer's name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The generation this view holds.
    pub fn generation(&self) -> u64 {
        self.info.generation
    }

    /// Its address in this process.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.info.len
    }

    /// Always false: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// Its tensor description, if it has one.
    pub fn desc(&self) -> Option<&TensorDesc> {
        self.info.desc.as_ref()
    }

    /// Name, generation, length and description.
    pub fn info(&self) -> &BufferInfo {
        &self.info
    }

    /// The directory slot this view pins.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Whether the owner still lists this buffer under its name: `Ok` if so; [`PoolError::StaleBuffer`] with the
    /// generation the name holds now (if any) once the owner freed it. The view's memory stays valid either way.
    ///
    /// # Errors
    /// [`PoolError::StaleBuffer`]; a malformed directory.
    pub fn check_current(&self) -> Result<(), PoolError> {
        let geometry = self.importer.offer.geometry;
        let found = find(&self.importer.directory, geometry, &self.info.name).map_err(|e| PoolError::Protocol {
            path: self.importer.path.clone(),
            what: "directory",
            problem: e.to_string(),
        })?;
        match found {
            Some((slot, _, record)) if slot == self.slot && record.generation == self.info.generation => Ok(()),
            other => Err(PoolError::StaleBuffer {
                name: self.info.name.clone(),
                held_generation: self.info.generation,
                current: other.map(|(_, _, record)| record.generation),
            }),
        }
    }

    /// Views of this buffer's slot the importer holds now, this one included (what the owner waits for).
    pub fn pins(&self) -> u64 {
        self.importer.pins_of(self.slot)
    }
}

impl<B: Backend> Clone for BufferView<B> {
    /// Another view of the same buffer, with its own pin.
    fn clone(&self) -> Self {
        self.importer.pin_again(self.slot);
        Self {
            importer: self.importer.clone(),
            block: self.block.clone(),
            slot: self.slot,
            info: self.info.clone(),
            ptr: self.ptr,
        }
    }
}

impl<B: Backend> Drop for BufferView<B> {
    fn drop(&mut self) {
        self.importer.unpin(self.slot);
    }
}

impl<B: GpuBackend> BufferView<B> {
    /// The buffer's memory, for kernels and copies in this process, borrowed from the view.
    ///
    /// # Errors
    /// Never for a view the importer made (it checked the buffer lies inside its block).
    pub fn span(&self) -> Result<DeviceSpan<'_>, PoolError> {
        self.block.region.span().sub_span_at(self.ptr, self.info.len).map_err(|e| PoolError::Backend(e.into()))
    }
}

impl<B: Backend> BufferView<B>
where
    B::Imported: ReachableRegion,
{
    /// Copies the buffer's bytes at byte `offset` into `dst`, on any backend (what the weights reader reads with).
    pub(crate) fn read_to_host(&self, offset: u64, dst: &mut [u8]) -> Result<(), PoolError> {
        let ctx = B::cuda_context(self.importer.blocks.context());
        copy_from_region(&self.block.region, ctx, &self.info.name, self.ptr, self.info.len, offset, dst)
    }
}

impl BufferView<Host> {
    /// Reads `dst.len()` bytes at byte `offset` of the buffer (the host backend's stand-in for a kernel).
    ///
    /// # Errors
    /// A range past the buffer's end.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), PoolError> {
        check_range(&self.info.name, self.info.len, offset, dst.len())?;
        Ok(self.block.region.read(self.ptr.offset(offset), dst)?)
    }

    /// Writes `src` at byte `offset` of the buffer.
    ///
    /// # Errors
    /// A range past the buffer's end.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), PoolError> {
        check_range(&self.info.name, self.info.len, offset, src.len())?;
        Ok(self.block.region.write(self.ptr.offset(offset), src)?)
    }
}
