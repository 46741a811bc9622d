//! The queue's operations, whoever does them: the CPU on host memory ([`HostQueue`], the host backend), or the GPU
//! on device memory ([`GpuOps`], which launches the queue's own kernels), behind one [`Engine`]. What they say is
//! in `ops.rs`, below both.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::gpu_ops::GpuOps;
use super::host_ops::HostQueue;
use super::layout::Geometry;
use super::ops::{PushFlags, PushRequest, Reclaimed, Status, Swept, TaskData, stats_of};
use super::{MemoryAccess, QueueStats};
use crate::queue::error::QueueError;
use gpu_ipc_driver::Context;

/// Who does the operations of one process on one queue.
pub(super) enum Engine {
    /// The CPU, on host memory; with the owner's record of the leases it has seen (see [`Engine::sweep`]).
    Host(Geometry, Mutex<Vec<(u64, Instant)>>),
    /// The GPU, through the queue's kernels (one stream and staging area, used by one thread at a time).
    Gpu(Box<Mutex<GpuOps>>),
}

impl Engine {
    /// The engine for memory reached as `access`; device memory needs `cuda`.
    pub(super) fn new(access: MemoryAccess<'_>, cuda: Option<&Context>, g: Geometry) -> Result<Self, QueueError> {
        match (access, cuda) {
            (MemoryAccess::Host(memory), _) => {
                HostQueue::new(memory, g)?;
                Ok(Self::Host(g, Mutex::new(Vec::new())))
            }
            (MemoryAccess::Device(_), Some(ctx)) => Ok(Self::Gpu(Box::new(Mutex::new(GpuOps::new(ctx, g)?)))),
            (MemoryAccess::Device(_), None) => Err(QueueError::NeedsGpu { what: "a queue in device memory" }),
        }
    }

    /// Runs `host` or `gpu`, whichever matches the engine and the memory.
    fn with<T>(
        &self,
        access: MemoryAccess<'_>,
        host: impl FnOnce(&HostQueue<'_>) -> T,
        gpu: impl FnOnce(&mut GpuOps, gpu_ipc_driver::DeviceSpan<'_>) -> Result<T, QueueError>,
    ) -> Result<T, QueueError> {
        match (self, access) {
            (Self::Host(g, _), MemoryAccess::Host(memory)) => Ok(host(&HostQueue::new(memory, *g)?)),
            (Self::Gpu(ops), MemoryAccess::Device(span)) => {
                let mut ops = ops.lock().unwrap_or_else(PoisonError::into_inner);
                gpu(&mut ops, span)
            }
            _ => Err(QueueError::Layout("the engine and the memory disagree on where the queue lives".into())),
        }
    }

    /// Whether no operation's kernel may still run (always, on the host).
    pub(super) fn settled(&self) -> bool {
        match self {
            Self::Host(..) => true,
            Self::Gpu(ops) => ops.lock().unwrap_or_else(PoisonError::into_inner).settled(),
        }
    }

    pub(super) fn init(&self, access: MemoryAccess<'_>) -> Result<(), QueueError> {
        self.with(access, |q| q.init(), |ops, span| ops.init(span))
    }

    pub(super) fn push(
        &self,
        access: MemoryAccess<'_>,
        slot: u16,
        requests: &[PushRequest<'_>],
        flags: PushFlags,
    ) -> Result<Vec<(Status, u64)>, QueueError> {
        self.with(access, |q| q.push(slot, requests, flags), |ops, span| ops.push(span, slot, requests, flags))
    }

    pub(super) fn pop(
        &self,
        access: MemoryAccess<'_>,
        slot: u16,
        max: usize,
    ) -> Result<(Vec<TaskData>, Status), QueueError> {
        self.with(access, |q| q.pop(slot, max), |ops, span| ops.pop(span, slot, max))
    }

    pub(super) fn complete(
        &self,
        access: MemoryAccess<'_>,
        slot: u16,
        positions: &[u64],
        count: bool,
    ) -> Result<Vec<bool>, QueueError> {
        self.with(
            access,
            |q| q.complete(slot, positions, count),
            |ops, span| ops.complete(span, slot, positions, count),
        )
    }

    /// Hands the leases of `positions` held by `slot` back to the owner (holder [`GIVEN_BACK`]); `true` where the
    /// lease was still `slot`'s.
    ///
    /// [`GIVEN_BACK`]: super::layout::GIVEN_BACK
    pub(super) fn give_back(
        &self,
        access: MemoryAccess<'_>,
        slot: u16,
        positions: &[u64],
    ) -> Result<Vec<bool>, QueueError> {
        self.with(access, |q| q.give_back(slot, positions), |ops, span| ops.give_back(span, slot, positions))
    }

    /// The owner's pass over every cell: counts the cells that hold work, and takes over (holder
    /// [`TAKEN`](super::layout::TAKEN)) up to `max` tasks that were given back or whose lease has been seen, by
    /// this pass and earlier ones, held by the same holder in the same lap for `lease` or longer. The record of
    /// what was seen when lives with the engine (host memory, or device memory the GPU's clock stamps), so a lease
    /// runs from the first pass that saw it, not from the pop: no clock is shared with the workers.
    pub(super) fn sweep(&self, access: MemoryAccess<'_>, lease: Duration, max: usize) -> Result<Swept, QueueError> {
        match (self, access) {
            (Self::Host(g, seen), MemoryAccess::Host(memory)) => {
                let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                Ok(HostQueue::new(memory, *g)?.sweep(&mut seen, lease, max))
            }
            (Self::Gpu(ops), MemoryAccess::Device(span)) => {
                ops.lock().unwrap_or_else(PoisonError::into_inner).sweep(span, lease, max)
            }
            _ => Err(QueueError::Layout("the engine and the memory disagree on where the queue lives".into())),
        }
    }

    /// The word at byte `offset` of the queue.
    pub(super) fn word(&self, access: MemoryAccess<'_>, offset: u64) -> Result<u64, QueueError> {
        self.with(access, |q| q.word_at(offset), |ops, span| ops.word(span, offset))
    }

    pub(super) fn reclaim(
        &self,
        access: MemoryAccess<'_>,
        owner: u16,
        dead: u16,
        max: usize,
    ) -> Result<Reclaimed, QueueError> {
        self.with(access, |q| q.reclaim(owner, dead, max), |ops, span| ops.reclaim(span, owner, dead, max))
    }

    pub(super) fn add(&self, access: MemoryAccess<'_>, offset: u64, value: u64) -> Result<(), QueueError> {
        self.with(access, |q| q.add(offset, value), |ops, span| ops.add(span, offset, value))
    }

    pub(super) fn close(&self, access: MemoryAccess<'_>) -> Result<(), QueueError> {
        self.with(access, |q| q.close(), |ops, span| ops.close(span))
    }

    pub(super) fn header(&self, access: MemoryAccess<'_>) -> Result<[u64; 8], QueueError> {
        self.with(access, |q| q.header(), |ops, span| ops.header(span))
    }

    /// The header and the worker table, word by word.
    pub(super) fn snapshot(&self, access: MemoryAccess<'_>) -> Result<Vec<u64>, QueueError> {
        self.with(access, |q| q.snapshot(), |ops, span| ops.snapshot(span))
    }

    /// The counters of every worker slot and of the header, summed.
    pub(super) fn stats(&self, access: MemoryAccess<'_>, g: &Geometry) -> Result<QueueStats, QueueError> {
        Ok(stats_of(&self.snapshot(access)?, g))
    }
}
