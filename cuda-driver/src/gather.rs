//! Many device-to-device copies in one kernel launch: [`GatherCopy`] splits each copy into pieces, writes the
//! pieces' table to the device and launches the gather kernel (`kernels/cuda/weights_gather.cu`, one block per
//! piece) once per batch. A weight set's generation switch of 19,000 tensors is then a few launches at the
//! bandwidth of one memcpy, where one `cuMemcpyAsync` per tensor costs microseconds each on the CPU and the GPU.
//!
//! ```no_run
//! use gpu_ipc_driver::{Context, DeviceBuffer, DeviceMemory, GatherCopy, Module, Stream};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let image: &[u8] = &[];
//! let ctx = Context::for_ordinal(0)?;
//! let module = Module::load(&ctx, image)?; // an image of kernels/cuda/weights_gather.cu
//! let mut gather = GatherCopy::new(&ctx, module.function(gpu_ipc_driver::GATHER_KERNEL)?)?;
//! let (a, b) = (DeviceBuffer::alloc(&ctx, 1 << 20)?, DeviceBuffer::alloc(&ctx, 1 << 20)?);
//! let stream = Stream::new(&ctx)?;
//! let (src, dst) = (a.span(), b.span());
//! gather.copy(&[(dst.slice(0, 4096)?, src.slice(8192, 4096)?), (dst.slice(4096, 64)?, src.slice(0, 64)?)], &stream)?;
//! stream.synchronize()?;
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::marker::PhantomData;

use super::context::Context;
use super::error::{DriverError, Result};
use super::event::{Event, EventFlags};
use super::host::PinnedHostBuffer;
use super::loader::{Driver, entry};
use super::memory::DeviceBuffer;
use super::module::{Function, KernelParam, LaunchConfig};
use super::span::DeviceSpan;
use super::stream::Stream;

/// The gather kernel's name (`kernels/cuda/weights_gather.cu`); [`GatherCopy::new`] takes only a function of
/// this name.
pub const GATHER_KERNEL: &str = "gpu_ipc_gather_copy";
/// Bytes of one piece at most: longer copies are split, so that one large tensor is copied by many blocks, and a
/// launch has enough blocks (several waves of them) that its last, partly filled wave costs little.
pub const GATHER_PIECE_BYTES: u64 = 256 << 10;
/// Pieces the device table holds (3 MiB): one launch copies at most this many (32 GiB at full pieces).
pub const GATHER_TABLE_PIECES: usize = 1 << 17;
/// Threads of a gather block: 512 copied the benchmark's 19,000-tensor state_dict 3% faster than 256 on an H200
/// (tools/scripts/gather-variants.py, 2026-11-29: 11.30 against 11.65 ms for 22.4 GB; pieces of 64 KiB to 1 MiB,
/// 8 loads in flight instead of 4 and a persistent grid all within 2% of these).
const THREADS: u32 = 512;
/// Words of one piece in the table: destination, source, bytes.
const WORDS: usize = 3;
/// Launches whose table regions may still be read, at most, before the oldest is waited for.
const MAX_IN_FLIGHT: usize = 64;

/// The table words of `copies` split into pieces of at most [`GATHER_PIECE_BYTES`], in order (empty copies
/// skipped): destination, source and byte count per piece.
///
/// # Errors
/// [`DriverError::InvalidArgument`] naming the first pair whose source and destination lengths differ.
pub fn gather_pieces(copies: &[(DeviceSpan<'_>, DeviceSpan<'_>)], words: &mut Vec<u64>) -> Result<()> {
    words.clear();
    for (i, (dst, src)) in copies.iter().enumerate() {
        if dst.len() != src.len() {
            return Err(DriverError::InvalidArgument {
                function: "gather copy",
                problem: format!("copy {i}: a source of {} bytes into a destination of {} bytes", src.len(), dst.len()),
            });
        }
        let mut at = 0;
        while at < dst.len() {
            let bytes = (dst.len() - at).min(GATHER_PIECE_BYTES);
            words.extend_from_slice(&[dst.ptr().offset(at).0, src.ptr().offset(at).0, bytes]);
            at += bytes;
        }
    }
    Ok(())
}

/// A gather copy between one span (an *arena*) and many spans of the caller's, prepared once and launched many
/// times: its pieces' table written to the device when made, so that a launch costs the CPU one `cuLaunchKernel`
/// and a comparison of the arena's address, however many pieces it copies (a weight set's generation switch from
/// tensors bound once: splitting and uploading the 85,000 pieces of a 19,000-tensor state_dict took about 4.8 ms of
/// CPU per switch before the table was kept). It borrows the caller's spans for `'a`; the arena is lent again at
/// each launch. Made by [`GatherCopy::prepare`], launched by [`GatherCopy::launch_prepared`].
pub struct PreparedGather<'a> {
    /// `None` only once `Drop` leaked it.
    table: Option<DeviceBuffer>,
    pieces: u32,
    /// The arena's address, and how far into it the pieces reach.
    arena: u64,
    extent: u64,
    /// Recorded after the last launch on each stream that read the table: `Drop` waits for them before freeing it.
    launched: Vec<(usize, Event)>,
    _spans: PhantomData<DeviceSpan<'a>>,
}

impl std::fmt::Debug for PreparedGather<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedGather")
            .field("pieces", &self.pieces)
            .field("extent", &self.extent)
            .finish_non_exhaustive()
    }
}

impl PreparedGather<'_> {
    /// Pieces one launch copies.
    pub fn pieces(&self) -> u32 {
        self.pieces
    }

    /// Whether `arena` is a span it may copy between: at the address it was prepared for, and reaching as far as
    /// its pieces do.
    pub fn fits(&self, arena: &DeviceSpan<'_>) -> bool {
        arena.ptr().0 == self.arena && arena.len() >= self.extent
    }
}

impl Drop for PreparedGather<'_> {
    fn drop(&mut self) {
        for (_, event) in self.launched.drain(..) {
            if event.synchronize().is_err() {
                tracing::error!(
                    "a prepared gather copy did not finish: leaking its table rather than freeing it under it"
                );
                std::mem::forget(self.table.take());
                return;
            }
        }
    }
}

/// Which way a prepared gather copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaSide {
    /// From the caller's spans into the arena.
    Destination,
    /// From the arena into the caller's spans.
    Source,
}

/// Copies many device spans into others with one launch of the gather kernel per [`GATHER_TABLE_PIECES`] pieces,
/// in stream order. Owns the device table the launches read (a ring: a region is rewritten only after the launch
/// that read it has finished).
pub struct GatherCopy {
    function: Function,
    /// `None` only once `Drop` leaked it.
    table: Option<DeviceBuffer>,
    /// The table's page-locked twin in host memory: each launch's region is written here and uploaded from here,
    /// so that the upload is asynchronous (from pageable memory the driver stages the bytes and may hold the CPU
    /// until the kernels queued before it have run, which would stop the CPU preparing the next batch while the
    /// GPU copies this one). Rewritten under the same rule as the table. `None` only once `Drop` leaked it.
    staging: Option<PinnedHostBuffer>,
    words: Vec<u64>,
    /// The next free piece of the table.
    cursor: usize,
    /// Launches that may still read the table: their regions (in pieces) and an event recorded after each.
    in_flight: VecDeque<(usize, usize, Event)>,
    ctx: Context,
}

impl std::fmt::Debug for GatherCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatherCopy").field("in_flight", &self.in_flight.len()).finish_non_exhaustive()
    }
}

impl GatherCopy {
    /// A gather copier in `ctx` launching `function`, which must be the gather kernel ([`GATHER_KERNEL`] of an
    /// image of `kernels/cuda/weights_gather.cu`): it allocates the device table.
    ///
    /// # Errors
    /// [`DriverError::KernelSignature`] for a function of another name; an allocation error.
    pub fn new(ctx: &Context, function: Function) -> Result<Self> {
        if function.name() != GATHER_KERNEL {
            return Err(DriverError::KernelSignature {
                kernel: function.name().to_owned(),
                problem: format!("a gather copy launches {GATHER_KERNEL} only"),
            });
        }
        let table = DeviceBuffer::alloc(ctx, (GATHER_TABLE_PIECES * WORDS * 8) as u64)?;
        let staging = PinnedHostBuffer::alloc(ctx, GATHER_TABLE_PIECES * WORDS * 8)?;
        Ok(Self {
            function,
            table: Some(table),
            staging: Some(staging),
            words: Vec::new(),
            cursor: 0,
            in_flight: VecDeque::new(),
            ctx: ctx.clone(),
        })
    }

    /// Queues on `stream` the copy of every `(destination, source)` pair (equal lengths; distinct, non-overlapping
    /// destinations). Returns once the launches are queued; the copies run in stream order, and what happens to
    /// the memory while they run is its owners' business, as for every span.
    ///
    /// # Errors
    /// [`DriverError::InvalidArgument`] for a pair of different lengths (nothing queued); a failing
    /// `cuMemcpyHtoDAsync`, `cuLaunchKernel`, or wait for an earlier launch.
    pub fn copy(&mut self, copies: &[(DeviceSpan<'_>, DeviceSpan<'_>)], stream: &Stream) -> Result<()> {
        // The kernel's context current on this thread (the legacy default stream is the current context's).
        let _entered = self.ctx.enter()?;
        let mut words = std::mem::take(&mut self.words);
        let queued = gather_pieces(copies, &mut words)
            .and_then(|()| words.chunks(GATHER_TABLE_PIECES * WORDS).try_for_each(|batch| self.launch(batch, stream)));
        self.words = words;
        queued
    }

    /// Prepares the copies between `arena` and the caller's spans: `copies[k] = (offset, span)` copies `span`
    /// into `arena` at `offset` (`side` [`ArenaSide::Destination`]) or the same bytes of `arena` into `span`
    /// ([`ArenaSide::Source`]); split into pieces as [`copy`](Self::copy) does, their table written to a device
    /// buffer of its own for [`launch_prepared`](Self::launch_prepared). Nothing is copied here.
    ///
    /// # Errors
    /// [`DriverError::InvalidArgument`] for a copy that does not fit in `arena`, or more pieces than one launch
    /// takes (2^31 - 1); an allocation or upload error.
    pub fn prepare<'a>(
        &mut self,
        arena: &DeviceSpan<'_>,
        copies: &[(u64, DeviceSpan<'a>)],
        side: ArenaSide,
    ) -> Result<PreparedGather<'a>> {
        let mut pairs = Vec::with_capacity(copies.len());
        let mut extent = 0;
        for &(offset, span) in copies {
            let inside = arena.slice(offset, span.len())?;
            extent = extent.max(offset + span.len());
            pairs.push(match side {
                ArenaSide::Destination => (inside, span),
                ArenaSide::Source => (span, inside),
            });
        }
        let mut words = Vec::new();
        gather_pieces(&pairs, &mut words)?;
        let pieces = u32::try_from(words.len() / WORDS).ok().filter(|&p| p <= i32::MAX as u32).ok_or_else(|| {
            DriverError::InvalidArgument {
                function: "gather copy",
                problem: format!("{} pieces: one launch takes 2^31 - 1 at most", words.len() / WORDS),
            }
        })?;
        let table = DeviceBuffer::alloc(&self.ctx, (words.len().max(WORDS) * 8) as u64)?;
        table.write(0, &words)?;
        Ok(PreparedGather {
            table: Some(table),
            pieces,
            arena: arena.ptr().0,
            extent,
            launched: Vec::new(),
            _spans: PhantomData,
        })
    }

    /// Queues on `stream` the copies `prepared` holds, between the caller's spans it borrows and `arena`, lent again
    /// for this call, which must [fit](PreparedGather::fits) (the address it was prepared for, as long), with one
    /// launch of the kept table. The rules of [`copy`](Self::copy).
    ///
    /// # Errors
    /// [`DriverError::InvalidArgument`] for an arena that does not fit, or a table made in another context
    /// (nothing queued); a failing `cuLaunchKernel` or event record.
    pub fn launch_prepared(
        &mut self,
        prepared: &mut PreparedGather<'_>,
        arena: &DeviceSpan<'_>,
        stream: &Stream,
    ) -> Result<()> {
        if !prepared.fits(arena) {
            return Err(DriverError::InvalidArgument {
                function: "gather copy",
                problem: format!(
                    "a gather prepared for {} bytes at {:#x} launched on {} bytes at {:#x}: prepare it again",
                    prepared.extent,
                    prepared.arena,
                    arena.len(),
                    arena.ptr().0
                ),
            });
        }
        if prepared.pieces == 0 {
            return Ok(());
        }
        let _entered = self.ctx.enter()?;
        let table = prepared.table.as_ref().ok_or_else(|| DriverError::InvalidArgument {
            function: "gather copy",
            problem: "the prepared table was leaked".into(),
        })?;
        if table.context().as_raw() != self.ctx.as_raw() {
            return Err(DriverError::InvalidArgument {
                function: "gather copy",
                problem: "a gather prepared in another context".into(),
            });
        }
        let config = LaunchConfig::linear(prepared.pieces, THREADS);
        let args = [KernelParam::Ptr(table.ptr()), KernelParam::U32(prepared.pieces)];
        // SAFETY: the gather kernel (its name checked in `new`): block i copies piece i of the prepared table, which
        // `prepare` split from copies between the caller's spans, which `prepared` borrows for as long as it lives,
        // and ranges of an arena at `arena`'s address that reach no further than `arena` (checked above), a span
        // the caller lends for this call as for `copy`; the table is alive (freed only after the launches that read
        // it) and only read.
        unsafe { self.function.launch(stream, config, &args)? };
        let done = Event::new(&self.ctx, EventFlags { timing: false, blocking_sync: false, interprocess: false })?;
        done.record(stream)?;
        let key = stream.raw() as usize;
        prepared.launched.retain(|(s, _)| *s != key);
        prepared.launched.push((key, done));
        Ok(())
    }

    /// One launch of `batch` (whole pieces, at most the table's).
    fn launch(&mut self, batch: &[u64], stream: &Stream) -> Result<()> {
        let pieces = batch.len() / WORDS;
        if self.cursor + pieces > GATHER_TABLE_PIECES {
            self.cursor = 0;
        }
        let (start, end) = (self.cursor, self.cursor + pieces);
        // Wait for every launch that may still read [start, end), and for the oldest beyond the bound.
        let mut kept = VecDeque::with_capacity(self.in_flight.len());
        for (s, e, event) in self.in_flight.drain(..) {
            if s < end && start < e {
                event.synchronize()?;
            } else {
                kept.push_back((s, e, event));
            }
        }
        self.in_flight = kept;
        while self.in_flight.len() >= MAX_IN_FLIGHT {
            if let Some((_, _, event)) = self.in_flight.pop_front() {
                event.synchronize()?;
            }
        }
        let table = self.table.as_ref().ok_or_else(|| DriverError::InvalidArgument {
            function: "gather copy",
            problem: "the table was leaked".into(),
        })?;
        let region = table.ptr().offset((start * WORDS * 8) as u64);
        let staging = self.staging.as_mut().ok_or_else(|| DriverError::InvalidArgument {
            function: "gather copy",
            problem: "the table's staging was leaked".into(),
        })?;
        let bytes = std::mem::size_of_val(batch);
        let staged = &mut staging.as_mut_slice()[start * WORDS * 8..][..bytes];
        for (to, word) in staged.chunks_exact_mut(8).zip(batch) {
            to.copy_from_slice(&word.to_ne_bytes());
        }
        let source = staging.device_ptr().offset((start * WORDS * 8) as u64);
        let d = Driver::get()?;
        let upload = entry!(d, cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync")?;
        // SAFETY: the destination is [start, end) of the table this value owns, which no launch still reads (waited
        // for above) and no Rust reference covers; the source is the same region of the page-locked staging this
        // value owns, just written, which no Rust reference covers once the slice above is gone and which is not
        // rewritten until the event recorded after this launch has passed (the same rule as the table; `Drop` waits
        // for those events before freeing it); the stream is alive.
        d.check("cuMemcpyHtoDAsync", unsafe { upload(region.0, source.0 as *const _, bytes, stream.raw()) })?;
        let config = LaunchConfig::linear(pieces as u32, THREADS);
        let args = [KernelParam::Ptr(region), KernelParam::U32(pieces as u32)];
        // SAFETY: the kernel is the gather kernel (its name checked in `new`; kernels are trusted code, as for
        // `Function::launch_typed`): block i reads piece i of the table region just written and copies that piece's
        // bytes, and every piece lies inside a destination and a source span the caller lent for this call (built by
        // `gather_pieces` from the spans alone).
        unsafe { self.function.launch(stream, config, &args)? };
        let done = Event::new(&self.ctx, EventFlags { timing: false, blocking_sync: false, interprocess: false })?;
        done.record(stream)?;
        self.in_flight.push_back((start, end, done));
        self.cursor = end;
        Ok(())
    }
}

impl Drop for GatherCopy {
    fn drop(&mut self) {
        // The table must outlive the launches that read it.
        for (_, _, event) in self.in_flight.drain(..) {
            if event.synchronize().is_err() {
                tracing::error!("a gather copy did not finish: leaking its table rather than freeing it under it");
                std::mem::forget(self.table.take());
                std::mem::forget(self.staging.take());
                return;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::address::DevicePtr;
    use super::*;

    fn span(ptr: u64, len: u64) -> DeviceSpan<'static> {
        DeviceSpan::of_owner(DevicePtr(ptr), len)
    }

    #[test]
    fn copies_are_split_into_pieces_in_order() {
        let big = 2 * GATHER_PIECE_BYTES + 48;
        let copies = [(span(0x10_0000, 64), span(0x90_0000, 64)), (span(0x1000_0000, big), span(0x4000_0000, big))];
        let mut words = Vec::new();
        gather_pieces(&copies, &mut words).unwrap();
        let p = GATHER_PIECE_BYTES;
        assert_eq!(
            words,
            [
                0x10_0000,
                0x90_0000,
                64,
                0x1000_0000,
                0x4000_0000,
                p,
                0x1000_0000 + p,
                0x4000_0000 + p,
                p,
                0x1000_0000 + 2 * p,
                0x4000_0000 + 2 * p,
                48
            ]
        );
    }

    #[test]
    fn empty_copies_add_no_piece_and_unequal_lengths_are_refused() {
        let mut words = vec![7];
        gather_pieces(&[(span(0x1000, 0), span(0x2000, 0))], &mut words).unwrap();
        assert!(words.is_empty());
        let err = gather_pieces(&[(span(0x1000, 8), span(0x2000, 8)), (span(0x3000, 16), span(0x4000, 8))], &mut words)
            .unwrap_err();
        assert!(err.to_string().contains("copy 1: a source of 8 bytes into a destination of 16 bytes"), "{err}");
    }
}
