//! Batches of stream memory operations: several 64-bit waits and writes queued with one `cuStreamBatchMemOp`
//! call instead of one driver call each (the CPU cost of a GPU-side sync strategy is mostly driver calls).
//!
//! ```no_run
//! use gpu_ipc_driver::{Context, DeviceBuffer, DeviceMemory, MemOpBatch, MemOpScratch, Stream, WaitCondition};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::for_ordinal(0)?;
//! let stream = Stream::new(&ctx)?;
//! let counters = DeviceBuffer::alloc(&ctx, 64)?;
//! let mut scratch = MemOpScratch::default();
//! let span = counters.span();
//! let mut batch = MemOpBatch::new(&mut scratch);
//! batch.wait_u64(&span, 0, 1, WaitCondition::AtLeast)?; // until word 0 >= 1 ...
//! batch.write_u64(&span, 8, 2)?; // ... then word 1 = 2
//! batch.submit(&stream)?; // one driver call
//! # Ok(()) }
//! ```

use super::address::DevicePtr;
use super::error::Result;
use super::loader::{Driver, entry};
use super::span::DeviceSpan;
use super::stream::{Stream, WaitCondition};
use super::sys;

/// Operations one `cuStreamBatchMemOp` call takes at most (the driver requires fewer than 256); longer batches
/// are queued as several calls, in order.
pub const MAX_OPS_PER_CALL: usize = 255;

/// One stream memory operation on an aligned 64-bit word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    /// Hold the stream until the word at `address` satisfies `condition` against `value`
    /// (as [`Stream::wait_value_u64`]).
    WaitU64 {
        /// The word's device address.
        address: DevicePtr,
        /// The operand of the comparison.
        value: u64,
        /// The comparison.
        condition: WaitCondition,
    },
    /// Store `value` at `address` after the stream's earlier work, with the default memory barrier before it
    /// (as [`Stream::write_value_u64`]).
    WriteU64 {
        /// The word's device address.
        address: DevicePtr,
        /// The value stored.
        value: u64,
    },
}

/// Storage a [`MemOpBatch`] reuses, so that building one batch per frame allocates nothing after the first.
#[derive(Debug, Default)]
pub struct MemOpScratch {
    ops: Vec<MemOp>,
}

/// A batch of stream memory operations on words of [`DeviceSpan`]s, each checked (inside its span, 8-byte
/// aligned) as it is added, queued in order by [`MemOpBatch::submit`].
///
/// The batch borrows every span it was given for `'a`, so the memory cannot be freed before the operations are
/// queued (what happens to memory freed while they *run* is its owner's teardown business, as for every span).
#[derive(Debug)]
pub struct MemOpBatch<'a> {
    ops: &'a mut Vec<MemOp>,
}

impl<'a> MemOpBatch<'a> {
    /// An empty batch over `scratch`'s storage.
    pub fn new(scratch: &'a mut MemOpScratch) -> Self {
        scratch.ops.clear();
        Self { ops: &mut scratch.ops }
    }

    /// Adds a wait until the aligned 64-bit word at byte `offset` of `span` satisfies `condition` against `value`.
    ///
    /// # Errors
    /// [`DriverError::InvalidArgument`](super::DriverError::InvalidArgument) when the word is not an aligned
    /// 8-byte word inside `span`; the batch is unchanged.
    pub fn wait_u64(
        &mut self,
        span: &DeviceSpan<'a>,
        offset: u64,
        value: u64,
        condition: WaitCondition,
    ) -> Result<&mut Self> {
        let address = span.word_at(offset, "cuStreamBatchMemOp")?;
        self.ops.push(MemOp::WaitU64 { address, value, condition });
        Ok(self)
    }

    /// Adds a write of `value` to the aligned 64-bit word at byte `offset` of `span`.
    ///
    /// # Errors
    /// As [`wait_u64`](Self::wait_u64).
    pub fn write_u64(&mut self, span: &DeviceSpan<'a>, offset: u64, value: u64) -> Result<&mut Self> {
        let address = span.word_at(offset, "cuStreamBatchMemOp")?;
        self.ops.push(MemOp::WriteU64 { address, value });
        Ok(self)
    }

    /// The operations so far, in queue order.
    pub fn ops(&self) -> &[MemOp] {
        self.ops
    }

    /// How many operations the batch holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when the batch holds nothing (submitting it queues nothing).
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Queues every operation on `stream`, in order: one `cuStreamBatchMemOp` call per [`MAX_OPS_PER_CALL`]
    /// operations (none for an empty batch).
    ///
    /// # Errors
    /// A failing `cuStreamBatchMemOp` (e.g. `CUDA_ERROR_NOT_SUPPORTED` on a device without 64-bit stream memory
    /// operations). The calls before a failing one stay queued.
    pub fn submit(self, stream: &Stream) -> Result<()> {
        // SAFETY: every address was checked to be an aligned word inside a span that `'a` keeps borrowed, hence
        // memory that the device can address and that no Rust reference covers (the span owner's promise).
        unsafe { stream.batch_mem_ops(self.ops) }
    }
}

/// The index ranges of `n` operations queued [`MAX_OPS_PER_CALL`] at a time.
pub(super) fn chunks_of(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..n).step_by(MAX_OPS_PER_CALL).map(move |start| start..n.min(start + MAX_OPS_PER_CALL))
}

/// Operations converted on the stack per driver call; longer chunks use a heap buffer.
const STACK_OPS: usize = 16;

impl MemOp {
    pub(super) fn raw(self) -> sys::CUstreamBatchMemOpParams {
        match self {
            Self::WaitU64 { address, value, condition } => sys::CUstreamBatchMemOpParams {
                waitValue: sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st {
                    operation: sys::CU_STREAM_MEM_OP_WAIT_VALUE_64,
                    address: address.0,
                    __bindgen_anon_1:
                        sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st__bindgen_ty_1 {
                            value64: value,
                        },
                    flags: condition.flags(),
                    alias: 0,
                },
            },
            Self::WriteU64 { address, value } => sys::CUstreamBatchMemOpParams {
                writeValue: sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
                    operation: sys::CU_STREAM_MEM_OP_WRITE_VALUE_64,
                    address: address.0,
                    __bindgen_anon_1:
                        sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 {
                            value64: value,
                        },
                    flags: sys::CU_STREAM_WRITE_VALUE_DEFAULT,
                    alias: 0,
                },
            },
        }
    }
}

impl Stream {
    /// Queues `ops` on the stream, in order, with one `cuStreamBatchMemOp` call per
    /// [`MAX_OPS_PER_CALL`] operations (none when `ops` is empty). The safe form is
    /// [`MemOpBatch`].
    ///
    /// # Errors
    /// A failing `cuStreamBatchMemOp`; the calls before it stay queued.
    ///
    /// # Safety
    /// Every address in `ops` must satisfy what [`Stream::wait_value_u64`] (for waits) and
    /// [`Stream::write_value_u64`] (for writes) require, until the operation has run.
    pub unsafe fn batch_mem_ops(&self, ops: &[MemOp]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let d = Driver::get()?;
        let f = entry!(d, cuStreamBatchMemOp_v2, "cuStreamBatchMemOp")?;
        let empty = sys::CUstreamBatchMemOpParams { pad: [0; 6] };
        let mut on_stack = [empty; STACK_OPS];
        let mut on_heap = Vec::new();
        for range in chunks_of(ops.len()) {
            let chunk = &ops[range];
            let params = if chunk.len() <= STACK_OPS {
                &mut on_stack[..chunk.len()]
            } else {
                on_heap.resize(chunk.len(), empty);
                &mut on_heap[..]
            };
            for (param, op) in params.iter_mut().zip(chunk) {
                *param = op.raw();
            }
            // At most MAX_OPS_PER_CALL (255), so the count fits.
            let count = params.len() as u32;
            // SAFETY: the stream is alive; `params` holds `count` initialised operations for the duration of the
            // call (the driver copies them); the caller vouches for every address, which only the GPU
            // dereferences; flags must be 0.
            d.check("cuStreamBatchMemOp", unsafe { f(self.raw(), count, params.as_mut_ptr(), 0) })?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::DriverError;
    use super::*;

    fn span(ptr: u64, len: u64) -> DeviceSpan<'static> {
        DeviceSpan::of_owner(DevicePtr(ptr), len)
    }

    #[test]
    fn operations_keep_their_order_and_addresses() {
        let (a, b) = (span(0x1000, 64), span(0x9000, 16));
        let mut scratch = MemOpScratch::default();
        let mut batch = MemOpBatch::new(&mut scratch);
        batch.wait_u64(&a, 8, 5, WaitCondition::AtLeast).unwrap().write_u64(&b, 8, 7).unwrap();
        batch.write_u64(&a, 56, 9).unwrap();
        assert_eq!(
            batch.ops(),
            [
                MemOp::WaitU64 { address: DevicePtr(0x1008), value: 5, condition: WaitCondition::AtLeast },
                MemOp::WriteU64 { address: DevicePtr(0x9008), value: 7 },
                MemOp::WriteU64 { address: DevicePtr(0x1038), value: 9 },
            ]
        );
        assert_eq!(batch.len(), 3);
    }

    #[test]
    fn words_outside_their_span_or_unaligned_are_refused_and_leave_the_batch_unchanged() {
        let words = span(0x1000, 64);
        let mut scratch = MemOpScratch::default();
        let mut batch = MemOpBatch::new(&mut scratch);
        batch.write_u64(&words, 0, 1).unwrap();
        for offset in [4, 60, 64, u64::MAX - 3] {
            let err = batch.write_u64(&words, offset, 1).unwrap_err();
            assert!(matches!(err, DriverError::InvalidArgument { function: "cuStreamBatchMemOp", .. }), "{err}");
            assert!(batch.wait_u64(&words, offset, 1, WaitCondition::Equal).is_err());
        }
        assert!(batch.write_u64(&span(0x1004, 64), 0, 1).is_err(), "a span that starts unaligned");
        assert_eq!(batch.len(), 1);
    }

    #[test]
    fn scratch_is_reused_empty() {
        let words = span(0x1000, 64);
        let mut scratch = MemOpScratch::default();
        let mut batch = MemOpBatch::new(&mut scratch);
        batch.write_u64(&words, 0, 1).unwrap();
        assert!(!batch.is_empty());
        let batch = MemOpBatch::new(&mut scratch);
        assert!(batch.is_empty());
    }

    #[test]
    fn long_batches_are_split_into_driver_calls_of_at_most_255_in_order() {
        use super::chunks_of;
        let bounds = |n| chunks_of(n).map(|r| (r.start, r.end)).collect::<Vec<_>>();
        assert!(bounds(0).is_empty(), "an empty batch makes no call");
        assert_eq!(bounds(1), [(0, 1)]);
        assert_eq!(bounds(255), [(0, 255)]);
        assert_eq!(bounds(256), [(0, 255), (255, 256)]);
        assert_eq!(bounds(600), [(0, 255), (255, 510), (510, 600)]);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_batch_runs_its_waits_and_writes_in_order_on_the_gpu() {
        use super::super::{Context, DeviceBuffer, DeviceMemory};
        let ctx = Context::for_ordinal(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let words = DeviceBuffer::alloc(&ctx, 8 * 600).unwrap();
        words.write(0, &[0u64; 600]).unwrap();
        let span = words.span();
        let mut scratch = MemOpScratch::default();
        // Word 0 = 5, then a wait that only its write satisfies, then word 1 = 7; then 598 writes (three calls).
        let mut batch = MemOpBatch::new(&mut scratch);
        batch.write_u64(&span, 0, 5).unwrap();
        batch.wait_u64(&span, 0, 5, WaitCondition::AtLeast).unwrap();
        batch.write_u64(&span, 8, 7).unwrap();
        for i in 2..600u64 {
            batch.write_u64(&span, 8 * i, 1000 + i).unwrap();
        }
        assert_eq!(batch.len(), 601);
        batch.submit(&stream).unwrap();
        stream.synchronize().unwrap();
        let mut back = [0u64; 600];
        words.read(0, &mut back).unwrap();
        assert_eq!(&back[..2], [5, 7]);
        assert!((2..600).all(|i| back[i] == 1000 + i as u64));
    }
}
