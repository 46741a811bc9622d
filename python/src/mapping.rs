//! Keeping a ring's GPU memory mapped for as long as a tensor made from it lives.
//!
//! A DLPack capsule (and so `torch.from_dlpack(frame)`, `cupy.from_dlpack(frame)`, ...) and a `Frame`, `Slot` or
//! `BufferView` object (which `__cuda_array_interface__` consumers keep as the memory's owner) each hold a
//! [`MappingHold`]: one more owner of the core's shared region (`Consumer::shared_region`,
//! `Producer::shared_region`) or of a pool's pinned view (which keeps its block mapped and its bytes from reuse). Closing the
//! consumer (or producer) then drops the core's own reference only, and the memory stays mapped in this process
//! until the last tensor made from it is gone: such a tensor never points at unmapped memory. What it reads there
//! is another matter: the slot is the producer's again (see the `Frame` docs).
//!
//! The last holder unmaps. A tensor's deleter may run while GPU work that reads it is still queued (PyTorch calls
//! it as soon as the tensor is freed), so the last hold does not unmap on the spot: a thread waits for the
//! device's queued work (`cuCtxSynchronize`), then unmaps. That thread is the only waiter, so nothing that frees a
//! tensor ever blocks on the GPU; a device that never finishes its work leaks the mapping (and the thread) rather
//! than unmapping under it. In a forked child a hold is forgotten, never unmapped: the mapping is the parent's.

use std::sync::{Arc, Mutex};

use gpu_ipc::driver::Context;

use crate::ring::lock;

/// One owner of a GPU mapping: cloned into every capsule and every frame or slot object.
pub struct MappingHold(Box<dyn Holder>);

/// What a hold holds, whatever the backend's region type.
trait Holder: Send + Sync {
    fn another(&self) -> Box<dyn Holder>;
}

struct Hold<T: Send + Sync + 'static> {
    /// `None` only during `drop`.
    region: Option<Arc<T>>,
    /// The device's context; `None` for host memory (no GPU work to wait for: the last hold drops it at once).
    ctx: Option<Context>,
    /// The process that made the hold (see the module docs on `fork`).
    pid: u32,
}

impl MappingHold {
    /// A hold on `region`, whose memory belongs to `ctx`'s device (`None`: host memory).
    pub fn new<T: Send + Sync + 'static>(region: Arc<T>, ctx: Option<Context>) -> Self {
        Self(Box::new(Hold { region: Some(region), ctx, pid: std::process::id() }))
    }
}

impl Clone for MappingHold {
    fn clone(&self) -> Self {
        Self(self.0.another())
    }
}

impl<T: Send + Sync + 'static> Holder for Hold<T> {
    fn another(&self) -> Box<dyn Holder> {
        Box::new(Hold { region: self.region.clone(), ctx: self.ctx.clone(), pid: self.pid })
    }
}

impl<T: Send + Sync + 'static> Drop for Hold<T> {
    fn drop(&mut self) {
        let Some(region) = self.region.take() else { return };
        if self.pid != std::process::id() {
            std::mem::forget(region);
            return;
        }
        // `into_inner` is atomic: of two holds dropped at once on two threads, exactly one gets the region.
        let Some(last) = Arc::into_inner(region) else { return };
        let Some(ctx) = self.ctx.clone() else { return drop(last) };
        let handed = Arc::new(Mutex::new(Some(last)));
        let theirs = handed.clone();
        let spawned = std::thread::Builder::new().name("gpu-ipc-unmap".into()).spawn(move || {
            let Some(last) = lock(&theirs).take() else { return };
            match ctx.synchronize() {
                Ok(()) => drop(last),
                Err(error) => {
                    tracing::error!(%error, "the device's work did not end: leaking a ring mapping, not unmapping it");
                    std::mem::forget(last);
                }
            }
        });
        if spawned.is_err()
            && let Some(last) = lock(&handed).take()
        {
            // No thread to wait in: leak the mapping rather than unmap it under queued work.
            std::mem::forget(last);
        }
    }
}
