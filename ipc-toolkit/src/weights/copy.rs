//! Copying many tensors at once on a GPU: [`TensorCopier`] loads the gather kernel (`kernels/cuda/weights_gather.cu`,
//! images in `kernels/images/weights/`, `scripts/gen-kernels.sh`) and copies a whole state_dict into a staged
//! arena ([`StagedGeneration::copy_in`](super::StagedGeneration::copy_in)) or out of a held one
//! ([`HeldGeneration::copy_out`](super::HeldGeneration::copy_out)) with a few launches, at the bandwidth of one
//! memcpy, instead of one `cuMemcpyAsync` per tensor.

use super::arena::{NameIndex, Tensors};
use super::error::WeightsError;
use gpu_ipc_driver::image::{self, ComputeCapability, KernelImages};
use std::sync::Arc;

use gpu_ipc_driver::{ArenaSide, Context, DeviceSpan, GATHER_KERNEL, GatherCopy, Module, PreparedGather, Stream};

/// The gather kernel, from `kernels/images/weights/` (`scripts/gen-kernels.sh`).
static IMAGES: KernelImages = gpu_ipc_driver::kernel_images!("../kernels/images/weights");

/// Copies many tensors between device spans in one process: one per owner or reader, reused for every update
/// (it owns a small device table and the loaded kernel).
#[derive(Debug)]
pub struct TensorCopier {
    gather: GatherCopy,
}

impl TensorCopier {
    /// Loads the gather kernel in `ctx` (the image for the device's architecture) and allocates its table.
    ///
    /// # Errors
    /// A `Backend` pool error naming the image when no image loads (a driver too old for the PTX, say).
    pub fn new(ctx: &Context) -> Result<Self, WeightsError> {
        let (major, minor) = ctx.device().compute_capability().map_err(WeightsError::driver)?;
        let chosen = IMAGES
            .select(ComputeCapability::new(major, minor), image::force_ptx_from_env())
            .map_err(|e| WeightsError::Invalid(format!("the weights' gather kernel: {e}")))?;
        let loaded = Module::load(ctx, chosen.bytes)
            .and_then(|module| module.function(GATHER_KERNEL))
            .map_err(|e| WeightsError::Invalid(format!("the weights' gather kernel ({}): {e}", chosen.file)))?;
        tracing::debug!(image = chosen.file, "weights gather kernel loaded");
        Ok(Self { gather: GatherCopy::new(ctx, loaded).map_err(WeightsError::driver)? })
    }

    /// Queues every `(destination, source)` copy on `stream` (equal lengths, distinct destinations).
    ///
    /// # Errors
    /// Unequal lengths (nothing queued); a failing launch.
    pub fn copy(&mut self, copies: &[(DeviceSpan<'_>, DeviceSpan<'_>)], stream: &Stream) -> Result<(), WeightsError> {
        self.gather.copy(copies, stream).map_err(WeightsError::driver)
    }
}

/// Which way a [`BoundCopies`] copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyDirection {
    /// From the caller's memory into a staged arena ([`StagedGeneration::copy_in_bound`](super::StagedGeneration::copy_in_bound)):
    /// a trainer's parameters, published after every step.
    IntoArena,
    /// From a held arena into the caller's memory ([`HeldGeneration::copy_out_bound`](super::HeldGeneration::copy_out_bound)):
    /// a module's parameters, loaded in place.
    OutOfArena,
}

/// Arenas whose prepared copies a [`BoundCopies`] keeps (an owner cycles through `keep + 1` arenas, a reader
/// through as many as the owner publishes into); the least recently used goes first.
const MAX_PREPARED: usize = 8;

/// The same copies between a weight set's tensors and the caller's memory, made switch after switch: the caller's
/// spans bound once, and for each arena the gather's table prepared once and kept on the device, so that a switch
/// costs the CPU one launch however many tensors move (instead of splitting and uploading every tensor's pieces
/// each time: about 4.8 ms for the benchmark's 19,000 tensors on an H200).
///
/// A prepared table is used again only for an arena at the same address, as long, whose tensors the copies name lie
/// at the same offsets with the same lengths (checked at every launch: at once for an owner's generations, which
/// share one layout, entry by entry for a reader's); otherwise it is prepared anew.
pub struct BoundCopies<'a> {
    direction: CopyDirection,
    spans: Vec<(usize, DeviceSpan<'a>)>,
    /// Most recently used last.
    prepared: Vec<Prepared<'a>>,
    /// Tables prepared so far.
    preparations: u64,
}

/// One arena's prepared copies, and the layout they were prepared for.
struct Prepared<'a> {
    /// The offset and byte length of each bound tensor, in `spans` order.
    layout: Vec<(u64, u64)>,
    /// The layout's index when prepared: a generation sharing it shares the layout (an owner's).
    index: Arc<NameIndex>,
    gather: PreparedGather<'a>,
}

impl std::fmt::Debug for BoundCopies<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundCopies")
            .field("direction", &self.direction)
            .field("tensors", &self.spans.len())
            .field("prepared", &self.prepared.len())
            .finish()
    }
}

impl<'a> BoundCopies<'a> {
    /// `spans[k] = (index, span)`: tensor `index` (manifest order) and the caller's memory it is copied from or into
    /// (its whole byte span's length). Nothing is checked or prepared until the first copy.
    pub fn new(direction: CopyDirection, spans: Vec<(usize, DeviceSpan<'a>)>) -> Self {
        Self { direction, spans, prepared: Vec::new(), preparations: 0 }
    }

    /// Which way it copies.
    pub fn direction(&self) -> CopyDirection {
        self.direction
    }

    /// Tensors it copies.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether it copies no tensor.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Arenas it holds prepared copies for (at most 8).
    pub fn prepared_arenas(&self) -> usize {
        self.prepared.len()
    }

    /// Tables it has prepared so far (one per arena met, and one more each time an arena's tensors moved): a
    /// count that stops growing once every arena was met.
    pub fn preparations(&self) -> u64 {
        self.preparations
    }

    /// Queues on `stream` the copies between `arena` (a whole arena's span) laid out as `tensors` and the bound
    /// spans, in `direction` (which must be this value's).
    pub(super) fn run(
        &mut self,
        copier: &mut TensorCopier,
        direction: CopyDirection,
        arena: &DeviceSpan<'_>,
        tensors: &Tensors,
        stream: &Stream,
    ) -> Result<(), WeightsError> {
        if direction != self.direction {
            return Err(WeightsError::Invalid(format!(
                "copies bound {:?} used {direction:?}: bind the tensors again for the other way",
                self.direction
            )));
        }
        let (spans, direction) = (&self.spans, self.direction);
        let same_layout = |p: &Prepared<'a>| {
            Arc::ptr_eq(&p.index, tensors.index())
                || (p.layout.len() == spans.len()
                    && spans.iter().zip(&p.layout).all(|((i, _), at)| {
                        tensors.manifest.entries.get(*i).is_some_and(|e| (e.offset, e.span_bytes()) == *at)
                    }))
        };
        let found = self.prepared.iter().position(|p| p.gather.fits(arena) && same_layout(p));
        let mut prepared = match found {
            Some(at) => self.prepared.remove(at),
            None => {
                // Not met yet, or met with its tensors elsewhere (a reader's new generation from an owner that laid
                // them out otherwise): prepared anew, in place of the table for the same address if there is one.
                self.prepared.retain(|p| !p.gather.fits(arena));
                if self.prepared.len() >= MAX_PREPARED {
                    self.prepared.remove(0);
                }
                let mut layout = Vec::with_capacity(spans.len());
                let mut copies = Vec::with_capacity(spans.len());
                for (i, span) in spans {
                    let entry = tensors.entry_at(*i)?;
                    if entry.span_bytes() != span.len() {
                        return Err(WeightsError::mismatch(
                            &entry.name,
                            &entry.desc,
                            format!("{} bytes bound, {} in the arena", span.len(), entry.span_bytes()),
                        ));
                    }
                    layout.push((entry.offset, entry.span_bytes()));
                    copies.push((entry.offset, *span));
                }
                let side = match direction {
                    CopyDirection::IntoArena => ArenaSide::Destination,
                    CopyDirection::OutOfArena => ArenaSide::Source,
                };
                self.preparations += 1;
                let gather = copier.gather.prepare(arena, &copies, side).map_err(WeightsError::driver)?;
                Prepared { layout, index: tensors.index().clone(), gather }
            }
        };
        let launched = copier.gather.launch_prepared(&mut prepared.gather, arena, stream);
        self.prepared.push(prepared);
        launched.map_err(WeightsError::driver)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use gpu_ipc_driver::{DeviceBuffer, DeviceMemory, DeviceUuid, GATHER_PIECE_BYTES, GATHER_TABLE_PIECES};

    #[test]
    fn the_embedded_images_are_what_the_manifest_lists() {
        assert_eq!(IMAGES.check_manifest(), Ok(()));
        assert!(IMAGES.lists_kernel(GATHER_KERNEL), "the manifest lists {GATHER_KERNEL}");
        assert!(IMAGES.manifest.contains("\"kernels/cuda/weights_gather.cu\""));
    }

    #[test]
    fn the_ptx_copies_in_16_byte_units_with_streaming_hints() {
        let ptx = IMAGES.ptx_text();
        assert!(ptx.contains("ld.global.cs.v4.u32") && ptx.contains("st.global.cs.v4.u32"), "16-byte loads and stores");
    }

    /// Device 0's context, a stream and a gather copier in it.
    fn on_gpu() -> (Context, Stream, TensorCopier) {
        let ctx = Context::for_ordinal(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let copier = TensorCopier::new(&ctx).unwrap();
        (ctx, stream, copier)
    }

    /// A manifest of `sizes` (bytes, as u8 tensors) laid end to end from `first`, 256-byte aligned.
    fn manifest_of(sizes: &[u64], first: u64) -> Tensors {
        use super::super::manifest::{Manifest, TENSOR_ALIGN, TensorEntry};
        use ipc_core::wire::{DType, TensorDesc};
        let mut at = first;
        let entries = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let e = TensorEntry {
                    name: format!("t{i}"),
                    desc: TensorDesc::contiguous(DType::U8, [n]).unwrap(),
                    offset: at,
                    checksum: None,
                };
                at = (at + n).next_multiple_of(TENSOR_ALIGN);
                e
            })
            .collect();
        let set_name = "bound".into();
        Tensors::new(Manifest {
            set_name,
            generation: 1,
            device_uuid: DeviceUuid([0; 16]),
            arena_bytes: at,
            entries,
            parts: None,
        })
    }

    /// Bound copies into two arenas and out of one, each checked byte for byte: the table is prepared once per
    /// arena and launched again (the arena zeroed between, so a launch that copied nothing would show), prepared
    /// anew when the same arena's tensors move, and refused the other way.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn bound_copies_are_prepared_once_per_arena_and_copy_every_byte_again() {
        let (ctx, stream, mut copier) = on_gpu();
        let sizes: Vec<u64> =
            (0..300u64).map(|i| if i % 50 == 7 { GATHER_PIECE_BYTES * 2 + 48 } else { 16 + 64 * i }).collect();
        let tensors = manifest_of(&sizes, 4096);
        let arena_bytes = tensors.manifest.arena_bytes + (1 << 20);
        let total: u64 = sizes.iter().sum();
        let sources = DeviceBuffer::alloc(&ctx, total).unwrap();
        let pattern: Vec<u8> = (0..total).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        sources.span().write(0, &pattern).unwrap();
        let mut spans = Vec::new();
        let mut at = 0;
        for (i, &n) in sizes.iter().enumerate() {
            spans.push((i, sources.span().slice(at, n).unwrap()));
            at += n;
        }
        let expect = |arena: &DeviceBuffer, tensors: &Tensors, what: &str| {
            let mut back = vec![0u8; arena_bytes as usize];
            arena.span().read(0, &mut back).unwrap();
            let mut at = 0usize;
            for e in &tensors.manifest.entries {
                let (o, n) = (e.offset as usize, e.span_bytes() as usize);
                assert_eq!(back[o..o + n], pattern[at..at + n], "{what}: tensor {}", e.name);
                at += n;
            }
        };
        let arenas = [DeviceBuffer::alloc(&ctx, arena_bytes).unwrap(), DeviceBuffer::alloc(&ctx, arena_bytes).unwrap()];
        let mut bound = BoundCopies::new(CopyDirection::IntoArena, spans.clone());
        for round in 0..3 {
            for (k, arena) in arenas.iter().enumerate() {
                arena.span().write(0, &vec![0u8; arena_bytes as usize]).unwrap();
                bound.run(&mut copier, CopyDirection::IntoArena, &arena.span(), &tensors, &stream).unwrap();
                stream.synchronize().unwrap();
                expect(arena, &tensors, &format!("round {round}, arena {k}"));
            }
            assert_eq!((bound.prepared_arenas(), bound.preparations()), (2, 2), "one table per arena, kept");
        }
        // The same layout in another manifest (a reader's next generation): compared entry by entry, not prepared.
        let same = manifest_of(&sizes, 4096);
        bound.run(&mut copier, CopyDirection::IntoArena, &arenas[1].span(), &same, &stream).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(bound.preparations(), 2, "an unchanged layout is not prepared again");
        // A table is launched only on the arena it was prepared for.
        let spans_only: Vec<_> = spans.iter().map(|(i, span)| (tensors.manifest.entries[*i].offset, *span)).collect();
        let mut prepared = copier.gather.prepare(&arenas[0].span(), &spans_only, ArenaSide::Destination).unwrap();
        let err = copier.gather.launch_prepared(&mut prepared, &arenas[1].span(), &stream).unwrap_err();
        assert!(err.to_string().contains("prepare it again"), "{err}");
        drop(prepared);
        // The same arena, its tensors 256 bytes further on: prepared anew, copied to the new offsets.
        let moved = manifest_of(&sizes, 4096 + 256);
        arenas[0].span().write(0, &vec![0u8; arena_bytes as usize]).unwrap();
        bound.run(&mut copier, CopyDirection::IntoArena, &arenas[0].span(), &moved, &stream).unwrap();
        stream.synchronize().unwrap();
        expect(&arenas[0], &moved, "moved tensors");
        assert_eq!((bound.prepared_arenas(), bound.preparations()), (2, 3), "prepared anew, in the same place");
        let err = bound.run(&mut copier, CopyDirection::OutOfArena, &arenas[0].span(), &moved, &stream).unwrap_err();
        assert!(err.to_string().contains("bind the tensors again"), "{err}");
        // Out of an arena into the caller's memory.
        let targets = DeviceBuffer::alloc(&ctx, total).unwrap();
        let mut spans = Vec::new();
        let mut at = 0;
        for (i, &n) in sizes.iter().enumerate() {
            spans.push((i, targets.span().slice(at, n).unwrap()));
            at += n;
        }
        let mut out = BoundCopies::new(CopyDirection::OutOfArena, spans);
        for _ in 0..2 {
            targets.span().write(0, &vec![0u8; total as usize]).unwrap();
            out.run(&mut copier, CopyDirection::OutOfArena, &arenas[1].span(), &tensors, &stream).unwrap();
            stream.synchronize().unwrap();
            let mut back = vec![0u8; total as usize];
            targets.span().read(0, &mut back).unwrap();
            assert!(back == pattern, "every byte copied out");
        }
        assert_eq!(out.prepared_arenas(), 1);
    }

    /// Copies of every alignment (16, 8, 4, 2 and 1 byte), sizes from 1 byte to several pieces, and more pieces
    /// than one launch takes, checked byte for byte; then the same table region is reused by later calls.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn the_gather_copy_moves_every_byte_of_every_alignment() {
        let (ctx, stream, mut copier) = on_gpu();
        let size: u64 = 64 << 20;
        let (src, dst) = (DeviceBuffer::alloc(&ctx, size).unwrap(), DeviceBuffer::alloc(&ctx, size).unwrap());
        let pattern: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        src.span().write(0, &pattern).unwrap();
        for round in 0..3u64 {
            dst.span().write(0, &vec![0u8; size as usize]).unwrap();
            // (source offset, destination offset, bytes): each source range copied to the same range of dst
            // shifted by `round`, so later rounds put other bytes where earlier ones did.
            let m = 5 << 20;
            let mut ranges = vec![(0, 0, 2 * GATHER_PIECE_BYTES + 4096), (m + 8, m + 8, 40), (m + 68, m + 68, 12)];
            ranges.extend([(m + 102, m + 102, 6), (m + 131, m + 131, 1), (3 << 20, (3 << 20) + 1, 777)]);
            // Then many small copies: more pieces than one launch takes.
            let small = GATHER_TABLE_PIECES as u64 + 100;
            for k in 0..small {
                ranges.push(((8 << 20) + 256 * k, (8 << 20) + 256 * k + 16 * round, 96));
            }
            let spans: Vec<_> = ranges
                .iter()
                .map(|&(s, d, n)| (dst.span().slice(d, n).unwrap(), src.span().slice(s, n).unwrap()))
                .collect();
            copier.copy(&spans, &stream).unwrap();
            stream.synchronize().unwrap();
            let mut back = vec![0u8; size as usize];
            dst.span().read(0, &mut back).unwrap();
            for &(s, d, n) in &ranges {
                let (s, d, n) = (s as usize, d as usize, n as usize);
                assert_eq!(back[d..d + n], pattern[s..s + n], "round {round}: {n} bytes from {s} to {d}");
            }
        }
    }
}
