//! The work queue's demo kernels (`kernels/cuda/work_queue_demo.cu`), with launch helpers: a persistent worker
//! that pops tasks, works on each and completes it, and a producer that pushes tasks from a kernel. Both take the
//! queue and the process's worker slot as their first two arguments, which the queue handles' `launch` passes
//! (`WorkQueue::launch`, `QueueWorker::launch` in `ipc_toolkit::queue`); the helpers here give the rest.
//!
//! A demo task's record is `record_bytes` long (a multiple of 8) and holds its value in every 64-bit word
//! ([`demo_record`]); the worker checks that, and sums the values and their squares, so that a run can be checked
//! against the values pushed ([`DemoSums`]).

use std::time::Duration;

use gpu_ipc_driver::{Context, DeviceBuffer, DeviceMemory, Function, KernelArg, LaunchConfig, Stream};

use crate::launch::{KernelError, load_module};

/// `gpu_ipc_wq_demo_worker(unsigned long long* queue, unsigned int worker, unsigned long long work_rounds,
/// unsigned long long timeout_ns, unsigned long long* result)`.
pub const DEMO_WORKER: &str = "gpu_ipc_wq_demo_worker";

/// `gpu_ipc_wq_demo_producer(unsigned long long* queue, unsigned int worker, unsigned long long first,
/// unsigned long long count, unsigned int record_bytes, unsigned long long timeout_ns, unsigned long long* result)`.
pub const DEMO_PRODUCER: &str = "gpu_ipc_wq_demo_producer";

/// The work queue's demo kernels.
pub const KERNELS: [&str; 2] = [DEMO_WORKER, DEMO_PRODUCER];

/// Words of the worker's result, then the producer's two.
const WORKER_WORDS: usize = 10;
const RESULT_WORDS: usize = WORKER_WORDS + 2;

/// The record of the demo task with value `value`: the value in each of the `record_bytes / 8` words.
pub fn demo_record(value: u64, record_bytes: usize) -> Vec<u8> {
    value.to_le_bytes().iter().copied().cycle().take(record_bytes / 8 * 8).collect()
}

/// Count, sum and sum of squares (wrapping) of task values: what a run must add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DemoSums {
    /// Tasks.
    pub count: u64,
    /// Sum of their values.
    pub sum: u64,
    /// Sum of their squares, wrapping.
    pub squares: u64,
}

impl DemoSums {
    /// The sums of the values `first .. first + count`.
    pub fn of_range(first: u64, count: u64) -> Self {
        (first..first + count).fold(Self::default(), |s, v| s.with(v))
    }

    /// With one more value.
    pub fn with(self, value: u64) -> Self {
        Self {
            count: self.count + 1,
            sum: self.sum.wrapping_add(value),
            squares: self.squares.wrapping_add(value.wrapping_mul(value)),
        }
    }

    /// Both together.
    pub fn merge(self, other: Self) -> Self {
        Self {
            count: self.count + other.count,
            sum: self.sum.wrapping_add(other.sum),
            squares: self.squares.wrapping_add(other.squares),
        }
    }
}

/// What a demo worker kernel reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkerResult {
    /// Tasks completed, with the sums of their values.
    pub sums: DemoSums,
    /// Completions refused: the owner had taken the task back.
    pub lease_lost: u64,
    /// Warps that stopped at the deadline rather than at the end of the queue.
    pub timed_out_warps: u64,
    /// Tasks that were redeliveries (attempt above 0).
    pub redelivered: u64,
    /// Records with a word other than the task's value.
    pub bad_records: u64,
    /// `%globaltimer` when the first warp started and when the last one ended, in ns (the same clock in every
    /// process on the GPU).
    pub gpu_start_ns: u64,
    /// See `gpu_start_ns`.
    pub gpu_end_ns: u64,
}

/// The demo kernels, loaded in one context, with a result buffer.
pub struct QueueDemoKernels {
    worker: Function,
    producer: Function,
    result: DeviceBuffer,
    sms: u32,
}

impl QueueDemoKernels {
    /// Loads the image that suits the context's device (`GPU_IPC_FORCE_PTX=1` forces the PTX).
    ///
    /// # Errors
    /// [`KernelError::NoImage`] or [`KernelError::ImageRejected`].
    pub fn load(ctx: &Context) -> Result<Self, KernelError> {
        let (module, _) = load_module(ctx, crate::image::force_ptx_from_env())?;
        let sms = ctx.device().sm_count()?;
        Ok(Self {
            worker: module.function(DEMO_WORKER)?,
            producer: module.function(DEMO_PRODUCER)?,
            result: DeviceBuffer::alloc(ctx, (RESULT_WORDS * 8) as u64)?,
            sms,
        })
    }

    /// The worker kernel.
    pub fn worker(&self) -> &Function {
        &self.worker
    }

    /// The producer kernel.
    pub fn producer(&self) -> &Function {
        &self.producer
    }

    /// Clears the results (synchronous; before the launches whose results are read).
    ///
    /// # Errors
    /// The copy's error.
    pub fn reset(&self) -> Result<(), KernelError> {
        let mut words = [0u64; RESULT_WORDS];
        words[8] = u64::MAX;
        self.result.write(0, &words)?;
        Ok(())
    }

    /// The worker's launch: `warps_per_sm` warps on each multiprocessor, each popping and completing tasks, every
    /// task worked on for `work_rounds` rounds of a 64-bit mix per record word, until the queue is closed and
    /// drained or `timeout` passes. The arguments follow the queue's two.
    pub fn worker_launch(
        &self,
        warps_per_sm: u32,
        work_rounds: u64,
        timeout: Duration,
    ) -> (LaunchConfig, Vec<KernelArg<'_>>) {
        let warps = warps_per_sm.clamp(1, 32);
        let config = LaunchConfig::linear(self.sms, 32 * warps);
        let span = self.result.span().prefix((WORKER_WORDS * 8) as u64);
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        (config, vec![KernelArg::U64(work_rounds), KernelArg::U64(timeout_ns), KernelArg::Span(span)])
    }

    /// The producer's launch: the tasks `first .. first + count` with `record_bytes` records (a multiple of 8),
    /// pushed by `threads` threads in all, waiting while the queue is full until `timeout` passes. The arguments
    /// follow the queue's two.
    ///
    /// # Errors
    /// A record size that is not a positive multiple of 8.
    pub fn producer_launch(
        &self,
        first: u64,
        count: u64,
        record_bytes: u32,
        threads: u32,
        timeout: Duration,
    ) -> Result<(LaunchConfig, Vec<KernelArg<'_>>), KernelError> {
        if record_bytes == 0 || !record_bytes.is_multiple_of(8) {
            return Err(KernelError::UnalignedSize { bytes: u64::from(record_bytes) });
        }
        let blocks = threads.div_ceil(256).clamp(1, 4 * self.sms);
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let span = self.result.span().slice((WORKER_WORDS * 8) as u64, 16)?;
        let args = vec![
            KernelArg::U64(first),
            KernelArg::U64(count),
            KernelArg::U32(record_bytes),
            KernelArg::U64(timeout_ns),
            KernelArg::Span(span),
        ];
        Ok((LaunchConfig::linear(blocks, 256), args))
    }

    /// Waits, up to `timeout`, until `stream` has run what was queued on it; `false` when it has not.
    ///
    /// # Errors
    /// A driver error (of a kernel that failed, for instance).
    pub fn wait(&self, stream: &Stream, timeout: Duration) -> Result<bool, KernelError> {
        let deadline = std::time::Instant::now() + timeout;
        while !stream.is_idle()? {
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(true)
    }

    fn words(&self) -> Result<[u64; RESULT_WORDS], KernelError> {
        let mut words = [0u64; RESULT_WORDS];
        self.result.read(0, &mut words)?;
        Ok(words)
    }

    /// The worker's result (once its stream is idle: see [`QueueDemoKernels::wait`]).
    ///
    /// # Errors
    /// The copy's error.
    pub fn worker_result(&self) -> Result<WorkerResult, KernelError> {
        let w = self.words()?;
        Ok(WorkerResult {
            sums: DemoSums { count: w[0], sum: w[1], squares: w[2] },
            lease_lost: w[3],
            timed_out_warps: w[4],
            redelivered: w[6],
            bad_records: w[7],
            gpu_start_ns: w[8],
            gpu_end_ns: w[9],
        })
    }

    /// The producer's result: (tasks pushed, tasks it could not push), once its stream is idle.
    ///
    /// # Errors
    /// The copy's error.
    pub fn producer_result(&self) -> Result<(u64, u64), KernelError> {
        let w = self.words()?;
        Ok((w[WORKER_WORDS], w[WORKER_WORDS + 1]))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn demo_records_hold_the_value_in_every_word() {
        let record = demo_record(0x0102_0304_0506_0708, 24);
        assert_eq!(record.len(), 24);
        for word in record.chunks(8) {
            assert_eq!(u64::from_le_bytes(word.try_into().unwrap()), 0x0102_0304_0506_0708);
        }
        assert_eq!(demo_record(1, 20).len(), 16, "whole words only");
    }

    #[test]
    fn sums_of_a_range_add_up_whichever_way_they_are_split() {
        let whole = DemoSums::of_range(10, 1000);
        assert_eq!(whole.count, 1000);
        assert_eq!(whole.sum, (10..1010).sum::<u64>());
        assert_eq!(DemoSums::of_range(10, 400).merge(DemoSums::of_range(410, 600)), whole);
        assert_ne!(DemoSums::of_range(10, 999).with(10), whole, "a task done twice and one missed show");
    }
}
