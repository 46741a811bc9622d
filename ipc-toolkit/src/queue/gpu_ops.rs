//! The queue's operations for the CPU side of a process when the queue is in device memory: each is a launch of
//! one of the queue's own kernels (`kernels/cuda/queue_host_ops.cu`, built on the same device functions user
//! kernels call) on a private non-blocking stream, with its inputs and outputs in a small staging area of host
//! memory registered for the device, and a bounded wait for the stream. The CPU never touches the queue's words:
//! its atomics and the GPU's are not atomic with each other on host memory over PCIe, and device memory has no CPU
//! atomics at all (see `docs/work-queue.md`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::layout::{CELL_HEADER_BYTES, Geometry, cell};
use super::ops::{Census, PushFlags, PushRequest, Reclaimed, Status, Swept, TaskData};
use crate::queue::error::QueueError;
use gpu_ipc_driver::image::{self, ComputeCapability, KernelImages};
use gpu_ipc_driver::{
    Context, DeviceBuffer, DeviceMemory, DeviceSpan, Function, HostRegistration, KernelArg, LaunchConfig, Module,
    Stream,
};
use ipc_core::ring::{WaitMode, bounded_wait};
use ipc_core::shm::SharedMemory;

/// The queue's kernels, from `kernels/images/queue/` (`scripts/gen-kernels.sh`).
static IMAGES: KernelImages = gpu_ipc_driver::kernel_images!("../kernels/images/queue");

/// The kernels' names (`kernels/cuda/queue_host_ops.cu`).
const KERNELS: [&str; 7] = [
    "gpu_ipc_wq_host_push",
    "gpu_ipc_wq_host_pop",
    "gpu_ipc_wq_host_complete",
    "gpu_ipc_wq_host_reclaim",
    "gpu_ipc_wq_host_add",
    "gpu_ipc_wq_host_close",
    "gpu_ipc_wq_host_sweep",
];

/// Bytes of the staging area's result words, before its entries.
const OUT_BYTES: u64 = 512;
/// Entries of one batch at most.
const MAX_BATCH: u64 = 256;
/// How long one operation's kernel may take before the queue reports the GPU busy.
const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Threads of the reclaim and sweep kernels' blocks (one cell each, grid-stride).
const RECLAIM_THREADS: u32 = 256;
/// Words of the passes' counters: tickets, put back (reclaim) or more (sweep), abandoned, and the sweep's census
/// (writing, full, leased).
const COUNTER_WORDS: u64 = 8;

/// A kernel launch's arguments.
type Args<'a> = Vec<KernelArg<'a>>;

/// The queue's kernels, a stream and a staging area in one process.
pub(super) struct GpuOps {
    g: Geometry,
    stream: Stream,
    /// In an `Arc` so that teardown can leak it on purpose (see `Drop`).
    staging: Arc<HostRegistration<SharedMemory>>,
    kernels: [Function; 7],
    /// The counters of the reclaim and sweep passes, in device memory; in an `Arc` for the same reason.
    counters: Arc<DeviceBuffer>,
    /// The owner's record of the leases its sweeps saw (per cell: the state word, and the `%globaltimer` at which a
    /// sweep first saw it), in device memory; made by the first sweep (only the owner sweeps).
    seen: Option<Arc<DeviceBuffer>>,
    /// Entries the staging area holds after its result words.
    batch: usize,
    /// An operation's kernel did not finish in time: its outputs may still be written, so no other is started.
    stuck: bool,
    /// For the sweep's record, made on first use; declared last, so dropped after everything made in it.
    ctx: Context,
}

impl GpuOps {
    /// Loads the kernels in `ctx` and makes the stream and the staging area.
    ///
    /// # Errors
    /// [`QueueError::Kernels`] when no image loads; a driver or shared-memory error.
    pub(super) fn new(ctx: &Context, g: Geometry) -> Result<Self, QueueError> {
        let (major, minor) = ctx.device().compute_capability()?;
        let force_ptx = image::force_ptx_from_env();
        let chosen = IMAGES
            .select(ComputeCapability::new(major, minor), force_ptx)
            .map_err(|e| QueueError::Config(e.to_string()))?;
        let module =
            Module::load(ctx, chosen.bytes).map_err(|source| QueueError::Kernels { image: chosen.file, source })?;
        let mut kernels = Vec::with_capacity(KERNELS.len());
        for name in KERNELS {
            kernels.push(module.function(name).map_err(|source| QueueError::Kernels { image: chosen.file, source })?);
        }
        let kernels: [Function; 7] =
            kernels.try_into().map_err(|_| QueueError::Layout("the queue kernels did not all load".into()))?;
        let entries = (MAX_BATCH * u64::from(g.cell_bytes)).max(g.cells_offset);
        let bytes = (OUT_BYTES + entries).next_multiple_of(64 * 1024);
        let memory = SharedMemory::create("gpu-ipc-queue-staging", bytes as usize)?;
        let staging = Arc::new(HostRegistration::new(ctx, Arc::new(memory))?);
        let batch = ((bytes - OUT_BYTES) / u64::from(g.cell_bytes)).min(MAX_BATCH) as usize;
        tracing::debug!(image = chosen.file, batch, "work queue kernels loaded");
        let counters = Arc::new(DeviceBuffer::alloc(ctx, 8 * COUNTER_WORDS)?);
        Ok(Self {
            g,
            ctx: ctx.clone(),
            stream: Stream::new(ctx)?,
            staging,
            kernels,
            counters,
            seen: None,
            batch,
            stuck: false,
        })
    }

    fn memory(&self) -> &SharedMemory {
        self.staging.memory()
    }

    fn out_word(&self, index: usize) -> Result<u64, QueueError> {
        let words = self.memory().words(0, OUT_BYTES as usize / 8)?;
        Ok(words.get(index).map_or(0, |w| w.load(std::sync::atomic::Ordering::Acquire)))
    }

    fn clear_out(&self) -> Result<(), QueueError> {
        Ok(self.memory().write_bytes(0, &[0; OUT_BYTES as usize])?)
    }

    fn entry_at(&self, index: usize) -> usize {
        OUT_BYTES as usize + index * self.g.cell_bytes as usize
    }

    fn entry_word(&self, index: usize, offset: u64) -> Result<u64, QueueError> {
        let mut bytes = [0; 8];
        self.memory().read_bytes(self.entry_at(index) + offset as usize, &mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    /// Clears the result words and runs kernel `which` as `(queue, a, [b,] entries, count, out)`, the shape of every
    /// staging kernel (`a`: the worker slot; `b`: flags, or the gone worker for the reclaim pass).
    #[allow(clippy::too_many_arguments)]
    fn run_staged(
        &mut self,
        which: usize,
        queue: DeviceSpan<'_>,
        a: u16,
        b: Option<u32>,
        count: usize,
        blocks: u32,
        threads: u32,
    ) -> Result<(), QueueError> {
        self.clear_out()?;
        let staging = self.staging.clone();
        let (out, entries) = spans(&staging)?;
        let mut args = vec![KernelArg::Span(queue), KernelArg::U32(u32::from(a))];
        args.extend(b.map(KernelArg::U32));
        args.extend([KernelArg::Span(entries), KernelArg::U32(count as u32), KernelArg::Span(out)]);
        self.run(which, blocks, threads, &args)
    }

    /// Launches kernel `which` with one thread (or `grid` blocks for the reclaim pass) and waits for it.
    fn run(&mut self, which: usize, blocks: u32, threads: u32, args: &Args<'_>) -> Result<(), QueueError> {
        if self.stuck {
            return Err(QueueError::GpuBusy { waited: OP_TIMEOUT });
        }
        self.kernels[which].launch_typed(&self.stream, LaunchConfig::linear(blocks, threads), args)?;
        self.wait()
    }

    /// Waits, bounded, until the stream has run what was queued.
    fn wait(&mut self) -> Result<(), QueueError> {
        let stream = &self.stream;
        let result = bounded_wait(
            Instant::now() + OP_TIMEOUT,
            WaitMode::Spin,
            Duration::from_millis(1),
            || stream.is_idle().map_err(QueueError::from),
            || Ok(()),
            |waited| QueueError::GpuBusy { waited },
        );
        if matches!(result, Err(QueueError::GpuBusy { .. })) {
            self.stuck = true;
        }
        result
    }

    /// Whether no kernel of these operations may still run.
    pub(super) fn settled(&mut self) -> bool {
        !self.stuck && self.wait().is_ok()
    }

    /// Zeroes the queue's memory (every cell EMPTY in lap 0) and writes the header.
    pub(super) fn init(&mut self, queue: DeviceSpan<'_>) -> Result<(), QueueError> {
        queue.slice(0, self.g.total_bytes)?.fill_u32_async(0, &self.stream)?;
        let header: Vec<u8> = self.g.header_words().iter().flat_map(|w| w.to_le_bytes()).collect();
        self.memory().write_bytes(OUT_BYTES as usize, &header)?;
        let staging = self.staging.clone();
        let (_, entries) = spans(&staging)?;
        queue.slice(0, header.len() as u64)?.copy_from_async(&entries.slice(0, header.len() as u64)?, &self.stream)?;
        self.wait()
    }

    pub(super) fn push(
        &mut self,
        queue: DeviceSpan<'_>,
        slot: u16,
        requests: &[PushRequest<'_>],
        flags: PushFlags,
    ) -> Result<Vec<(Status, u64)>, QueueError> {
        let mut done = Vec::with_capacity(requests.len());
        for chunk in requests.chunks(self.batch.max(1)) {
            for (i, request) in chunk.iter().enumerate() {
                let at = self.entry_at(i);
                let mut head = [0u8; CELL_HEADER_BYTES as usize];
                head[8..16].copy_from_slice(&request.id.unwrap_or(u64::MAX).to_le_bytes());
                head[16..20].copy_from_slice(&request.attempt.to_le_bytes());
                head[20..24].copy_from_slice(&(request.record.len() as u32).to_le_bytes());
                self.memory().write_bytes(at, &head)?;
                self.memory().write_bytes(at + cell::RECORD as usize, request.record)?;
            }
            let bits = u32::from(flags.count) | u32::from(flags.force) << 1;
            self.run_staged(0, queue, slot, Some(bits), chunk.len(), 1, 1)?;
            let attempted = (self.out_word(0)? as usize).min(chunk.len());
            for i in 0..attempted {
                done.push((Status::from_code(self.entry_word(i, 0)?), self.entry_word(i, cell::ID)?));
            }
            if done.last().is_none_or(|(status, _)| *status != Status::Ok) || attempted < chunk.len() {
                break;
            }
        }
        Ok(done)
    }

    pub(super) fn pop(
        &mut self,
        queue: DeviceSpan<'_>,
        slot: u16,
        max: usize,
    ) -> Result<(Vec<TaskData>, Status), QueueError> {
        let want = max.min(self.batch.max(1));
        self.run_staged(1, queue, slot, None, want, 1, 1)?;
        let got = (self.out_word(0)? as usize).min(want);
        let status = if got == want { Status::Ok } else { Status::from_code(self.out_word(1)?) };
        let tasks = (0..got).map(|i| self.read_entry(i)).collect::<Result<Vec<_>, _>>()?;
        Ok((tasks, status))
    }

    fn read_entry(&self, index: usize) -> Result<TaskData, QueueError> {
        let attempt_len = self.entry_word(index, cell::ATTEMPT)?;
        let len = ((attempt_len >> 32) as usize).min(self.g.record_bytes as usize);
        let mut record = vec![0; len];
        self.memory().read_bytes(self.entry_at(index) + cell::RECORD as usize, &mut record)?;
        Ok(TaskData {
            position: self.entry_word(index, 0)?,
            id: self.entry_word(index, cell::ID)?,
            attempt: attempt_len as u32,
            record,
        })
    }

    pub(super) fn complete(
        &mut self,
        queue: DeviceSpan<'_>,
        slot: u16,
        positions: &[u64],
        count: bool,
    ) -> Result<Vec<bool>, QueueError> {
        let mut done = Vec::with_capacity(positions.len());
        let per_launch = (OUT_BYTES as usize / 8).min(self.batch.max(1));
        for chunk in positions.chunks(per_launch) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|p| p.to_le_bytes()).collect();
            self.memory().write_bytes(OUT_BYTES as usize, &bytes)?;
            self.run_staged(2, queue, slot, Some(u32::from(count)), chunk.len(), 1, 1)?;
            for i in 0..chunk.len() {
                done.push(self.out_word(i)? == 1);
            }
        }
        Ok(done)
    }

    pub(super) fn reclaim(
        &mut self,
        queue: DeviceSpan<'_>,
        owner: u16,
        dead: u16,
        max: usize,
    ) -> Result<Reclaimed, QueueError> {
        let want = max.min(self.batch.max(1));
        let blocks = self.g.capacity.div_ceil(u64::from(RECLAIM_THREADS)).min(1024) as u32;
        // The pass's threads count in device memory (no GPU atomics on host memory), copied out afterwards.
        let scratch = self.counters.clone();
        let counters = scratch.span();
        counters.fill_u32_async(0, &self.stream)?;
        let staging = self.staging.clone();
        let (out, entries) = spans(&staging)?;
        let args = vec![
            KernelArg::Span(queue),
            KernelArg::U32(u32::from(owner)),
            KernelArg::U32(u32::from(dead)),
            KernelArg::Span(entries),
            KernelArg::U32(want as u32),
            KernelArg::Span(counters),
        ];
        self.clear_out()?;
        self.run(3, blocks, RECLAIM_THREADS, &args)?;
        out.slice(0, counters.len())?.copy_from_async(&counters, &self.stream)?;
        self.wait()?;
        let (tickets, abandoned, put_back) = (self.out_word(0)?, self.out_word(1)?, self.out_word(2)?);
        let stolen = (tickets as usize).min(want);
        let stolen = (0..stolen).map(|i| self.read_entry(i)).collect::<Result<Vec<_>, _>>()?;
        Ok(Reclaimed { stolen, abandoned, more: put_back > 0 })
    }

    pub(super) fn give_back(
        &mut self,
        queue: DeviceSpan<'_>,
        slot: u16,
        positions: &[u64],
    ) -> Result<Vec<bool>, QueueError> {
        let mut done = Vec::with_capacity(positions.len());
        let per_launch = (OUT_BYTES as usize / 8).min(self.batch.max(1));
        for chunk in positions.chunks(per_launch) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|p| p.to_le_bytes()).collect();
            self.memory().write_bytes(OUT_BYTES as usize, &bytes)?;
            // Flags bit 1: give the leases back rather than complete them.
            self.run_staged(2, queue, slot, Some(2), chunk.len(), 1, 1)?;
            for i in 0..chunk.len() {
                done.push(self.out_word(i)? == 1);
            }
        }
        Ok(done)
    }

    pub(super) fn sweep(&mut self, queue: DeviceSpan<'_>, lease: Duration, max: usize) -> Result<Swept, QueueError> {
        let want = max.min(self.batch.max(1));
        let blocks = self.g.capacity.div_ceil(u64::from(RECLAIM_THREADS)).min(1024) as u32;
        let seen = match &self.seen {
            Some(seen) => seen.clone(),
            None => {
                let seen = Arc::new(DeviceBuffer::alloc(&self.ctx, 16 * self.g.capacity)?);
                seen.span().fill_u32_async(0, &self.stream)?;
                self.seen = Some(seen.clone());
                seen
            }
        };
        let scratch = self.counters.clone();
        let counters = scratch.span();
        counters.fill_u32_async(0, &self.stream)?;
        let staging = self.staging.clone();
        let (out, entries) = spans(&staging)?;
        let lease_ns = u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX);
        let args = vec![
            KernelArg::Span(queue),
            KernelArg::Span(seen.span()),
            KernelArg::U64(lease_ns),
            KernelArg::Span(entries),
            KernelArg::U32(want as u32),
            KernelArg::Span(counters),
        ];
        self.clear_out()?;
        self.run(6, blocks, RECLAIM_THREADS, &args)?;
        out.slice(0, counters.len())?.copy_from_async(&counters, &self.stream)?;
        self.wait()?;
        let tickets = (self.out_word(0)? as usize).min(want);
        let mut stolen = Vec::with_capacity(tickets);
        for i in 0..tickets {
            // A ticket whose compare-and-swap lost (the holder completed meanwhile) is marked with position ~0.
            if self.entry_word(i, 0)? != u64::MAX {
                stolen.push(self.read_entry(i)?);
            }
        }
        let census = Census { writing: self.out_word(2)?, full: self.out_word(3)?, leased: self.out_word(4)? };
        Ok(Swept { stolen, more: self.out_word(1)? > 0, census })
    }

    /// The word at byte `offset` of the queue (a copy through the staging area).
    pub(super) fn word(&mut self, queue: DeviceSpan<'_>, offset: u64) -> Result<u64, QueueError> {
        if self.stuck {
            return Err(QueueError::GpuBusy { waited: OP_TIMEOUT });
        }
        {
            let staging = self.staging.clone();
            let (_, entries) = spans(&staging)?;
            entries.slice(0, 8)?.copy_from_async(&queue.slice(offset, 8)?, &self.stream)?;
        }
        self.wait()?;
        self.entry_word(0, 0)
    }

    pub(super) fn add(&mut self, queue: DeviceSpan<'_>, offset: u64, value: u64) -> Result<(), QueueError> {
        let args = vec![KernelArg::Span(queue.slice(offset, 8)?), KernelArg::U64(value)];
        self.run(4, 1, 1, &args)
    }

    pub(super) fn close(&mut self, queue: DeviceSpan<'_>) -> Result<(), QueueError> {
        let args = vec![KernelArg::Span(queue)];
        self.run(5, 1, 1, &args)
    }

    /// Copies the first `bytes` of the queue into the staging entries and reads them as words.
    fn read_words(&mut self, queue: DeviceSpan<'_>, bytes: u64) -> Result<Vec<u64>, QueueError> {
        if self.stuck {
            return Err(QueueError::GpuBusy { waited: OP_TIMEOUT });
        }
        {
            let staging = self.staging.clone();
            let (_, entries) = spans(&staging)?;
            entries.slice(0, bytes)?.copy_from_async(&queue.slice(0, bytes)?, &self.stream)?;
        }
        self.wait()?;
        let first = OUT_BYTES as usize / 8;
        let words = self.memory().words(first, bytes as usize / 8)?;
        Ok(words.iter().map(|w| w.load(std::sync::atomic::Ordering::Acquire)).collect())
    }

    pub(super) fn snapshot(&mut self, queue: DeviceSpan<'_>) -> Result<Vec<u64>, QueueError> {
        let bytes = self.g.cells_offset;
        self.read_words(queue, bytes)
    }

    pub(super) fn header(&mut self, queue: DeviceSpan<'_>) -> Result<[u64; 8], QueueError> {
        let words = self.read_words(queue, 64)?;
        Ok(std::array::from_fn(|i| words.get(i).copied().unwrap_or(0)))
    }
}

/// The spans of a staging area's result words and of its entries.
fn spans(staging: &HostRegistration<SharedMemory>) -> Result<(DeviceSpan<'_>, DeviceSpan<'_>), QueueError> {
    let span = staging.span();
    Ok((span.slice(0, OUT_BYTES)?, span.slice(OUT_BYTES, span.len() - OUT_BYTES)?))
}

impl Drop for GpuOps {
    fn drop(&mut self) {
        // Nothing may be unregistered under a kernel still writing the staging area.
        if self.stuck || self.wait().is_err() {
            tracing::error!("a work-queue kernel did not finish: leaking its staging area rather than freeing it");
            std::mem::forget(self.staging.clone());
            std::mem::forget(self.counters.clone());
            std::mem::forget(self.seen.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_images_are_what_the_manifest_lists() {
        assert_eq!(IMAGES.check_manifest(), Ok(()));
        for name in KERNELS {
            assert!(IMAGES.lists_kernel(name), "{name} is not in the manifest");
        }
        assert!(IMAGES.manifest.contains("\"kernels/cuda/queue_host_ops.cu\""));
        assert!(IMAGES.manifest.contains("\"kernels/cuda/work_queue.cuh\""));
    }

    #[test]
    fn the_ptx_follows_the_coherency_rule() {
        let ptx = IMAGES.ptx_text();
        assert!(ptx.contains("ld.acquire.sys"), "polls read with ld.acquire.sys");
        assert!(ptx.contains("atom.acq_rel.sys"), "state changes are acq_rel system-scope compare-and-swaps");
    }
}
