//! What the `pool` example program and its tests share: the pattern a buffer is filled with, how it is written
//! and checked (on a GPU through spans, on the host backend through the CPU), and the importer's measurements.

use std::time::{Duration, Instant};

use gpu_ipc::core::backend::{Backend, GpuBackend};
use gpu_ipc::core::host::Host;
use gpu_ipc::driver::DriverError;
use gpu_ipc::pool::{AttachOptions, BufferHandle, BufferView, PoolError, PoolImporter};

/// Words of the pattern written at each end of a buffer (the whole of a small one): enough to see a wrong mapping
/// or offset, cheap at 16 GiB.
pub const CHECKED_WORDS: u64 = 1024;

/// Word `i` of the pattern of a buffer whose seed is `seed`.
pub fn pattern_word(seed: u32, i: u64) -> u32 {
    seed ^ (i as u32).wrapping_mul(0x9e37_79b9)
}

/// The checked ranges of a buffer of `len` bytes: (first word, word count), at its start and at its end.
pub fn checked_ranges(len: u64) -> Vec<(u64, u64)> {
    let words = len / 4;
    let n = CHECKED_WORDS.min(words);
    if words <= 2 * CHECKED_WORDS { vec![(0, words)] } else { vec![(0, n), (words - n, n)] }
}

/// How a program reads and writes pool buffers with backend `B`.
pub trait PoolMemory<B: Backend> {
    /// Writes `words` at word `first` of the owner's buffer.
    ///
    /// # Errors
    /// A range past the buffer, a driver error.
    fn write(handle: &BufferHandle<B>, first: u64, words: &[u32]) -> Result<(), PoolError>;
    /// Reads `words.len()` words at word `first` of an importer's view.
    ///
    /// # Errors
    /// A range past the buffer, a driver error.
    fn read(view: &BufferView<B>, first: u64, words: &mut [u32]) -> Result<(), PoolError>;
}

/// On a GPU: copies through the buffer's span (the memory itself, in place).
pub struct GpuMemory;

impl<B: GpuBackend> PoolMemory<B> for GpuMemory {
    fn write(handle: &BufferHandle<B>, first: u64, words: &[u32]) -> Result<(), PoolError> {
        handle.span()?.write(first * 4, words).map_err(|e| PoolError::Backend(e.into()))
    }

    fn read(view: &BufferView<B>, first: u64, words: &mut [u32]) -> Result<(), PoolError> {
        view.span()?.read(first * 4, words).map_err(|e| PoolError::Backend(e.into()))
    }
}

/// On the host backend: the CPU reads and writes the shared host memory.
pub struct HostMemory;

impl PoolMemory<Host> for HostMemory {
    fn write(handle: &BufferHandle<Host>, first: u64, words: &[u32]) -> Result<(), PoolError> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        handle.write(first * 4, &bytes)
    }

    fn read(view: &BufferView<Host>, first: u64, words: &mut [u32]) -> Result<(), PoolError> {
        let mut bytes = vec![0u8; words.len() * 4];
        view.read(first * 4, &mut bytes)?;
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(4)) {
            *word = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        Ok(())
    }
}

/// Writes the pattern of `seed` into the checked ranges of an owner's buffer.
///
/// # Errors
/// As [`PoolMemory::write`].
pub fn fill<B: Backend, M: PoolMemory<B>>(handle: &BufferHandle<B>, seed: u32) -> Result<(), PoolError> {
    for (first, count) in checked_ranges(handle.len()) {
        let words: Vec<u32> = (first..first + count).map(|i| pattern_word(seed, i)).collect();
        M::write(handle, first, &words)?;
    }
    Ok(())
}

/// Words of the checked ranges of a view that differ from the pattern of `seed`.
///
/// # Errors
/// As [`PoolMemory::read`].
pub fn mismatches<B: Backend, M: PoolMemory<B>>(view: &BufferView<B>, seed: u32) -> Result<u64, PoolError> {
    let mut bad = 0;
    for (first, count) in checked_ranges(view.len()) {
        let mut words = vec![0u32; count as usize];
        M::read(view, first, &mut words)?;
        bad += words.iter().zip(first..).filter(|(w, i)| **w != pattern_word(seed, *i)).count() as u64;
    }
    Ok(bad)
}

/// The seed of buffer `name` in the example's naming: the number after the last `/`, plus one.
pub fn seed_of(name: &str) -> u32 {
    name.rsplit('/').next().and_then(|n| n.parse::<u32>().ok()).map_or(0x5eed, |n| n + 1)
}

/// The value at quantile `q` (0 to 1) of `samples`, nearest rank.
pub fn quantile(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

/// What an importer measured and checked.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ImporterReport {
    /// Attaches timed (each: handshake, directory and pin table mapped, every block of the pool imported).
    pub attaches: u64,
    /// Median attach, in milliseconds.
    pub attach_ms_p50: f64,
    /// 99th percentile attach, in milliseconds.
    pub attach_ms_p99: f64,
    /// Buffers the directory listed.
    pub buffers: u64,
    /// Bytes of those buffers.
    pub buffer_bytes: u64,
    /// Buffers whose checked words were all right.
    pub verified: u64,
    /// Words that were wrong.
    pub mismatched_words: u64,
    /// Lookups timed.
    pub lookups: u64,
    /// Median time of one lookup (a batch's time over its size), in nanoseconds.
    pub lookup_ns_p50: f64,
    /// 99th percentile of the same, in nanoseconds.
    pub lookup_ns_p99: f64,
}

/// Attaches `attaches` times (timing each), then once more to check every buffer against its pattern and time
/// `rounds` rounds of lookups of every name.
///
/// # Errors
/// Attach, lookup, or memory errors.
pub fn run_importer<B: Backend, M: PoolMemory<B>>(
    ctx: &B::Context,
    socket: &std::path::Path,
    attaches: u64,
    rounds: u64,
) -> Result<ImporterReport, PoolError> {
    let options = AttachOptions { name: "pool-example".into(), timeout: Duration::from_secs(30) };
    let mut attach_ms = Vec::new();
    for _ in 0..attaches {
        let start = Instant::now();
        let importer = PoolImporter::<B>::attach(ctx, socket, &options)?;
        attach_ms.push(start.elapsed().as_secs_f64() * 1e3);
        drop(importer);
    }
    let importer = PoolImporter::<B>::attach(ctx, socket, &options)?;
    let mut report = ImporterReport { attaches, ..ImporterReport::default() };
    report.attach_ms_p50 = quantile(&mut attach_ms, 0.5);
    report.attach_ms_p99 = quantile(&mut attach_ms, 0.99);
    let names: Vec<String> = importer.list()?.into_iter().map(|info| info.name).collect();
    for name in &names {
        let view = importer.lookup(name)?;
        report.buffers += 1;
        report.buffer_bytes += view.len();
        let bad = mismatches::<B, M>(&view, seed_of(name))?;
        report.mismatched_words += bad;
        report.verified += u64::from(bad == 0);
    }
    let mut per_lookup_ns = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        for name in &names {
            drop(importer.lookup(name)?);
        }
        if !names.is_empty() {
            per_lookup_ns.push(start.elapsed().as_secs_f64() * 1e9 / names.len() as f64);
            report.lookups += names.len() as u64;
        }
    }
    report.lookup_ns_p50 = quantile(&mut per_lookup_ns, 0.5);
    report.lookup_ns_p99 = quantile(&mut per_lookup_ns, 0.99);
    Ok(report)
}

/// Whether `e` says the CUDA driver is missing (the program then exits with the no-driver status).
pub fn no_driver(e: &PoolError) -> bool {
    matches!(e, PoolError::Backend(gpu_ipc::core::backend::BackendError::Driver(DriverError::LibraryNotFound { .. })))
}
