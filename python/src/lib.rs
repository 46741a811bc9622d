//! The native module of the Python package `gpu_ipc` (`gpu_ipc._gpu_ipc`): a thin layer of `#[pyclass]` wrappers
//! over the Rust core, one per concept.
//!
//! | Python | Rust core |
//! |---|---|
//! | `Producer`, `Slot` | `gpu_ipc::core::frames::{Producer, SlotLease}` |
//! | `Consumer`, `Frame` | `gpu_ipc::core::frames::{Consumer, Frame}` |
//! | `SharedPool`, `SharedBuffer`, `PoolImporter`, `BufferView` | `gpu_ipc::pool::{SharedPool, BufferHandle, PoolImporter, BufferView}` |
//! | `Semaphore`, `SemaphoreWait` | `gpu_ipc::semaphore::{SemaphoreOwner, Semaphore, StreamWait}` |
//! | `WeightsOwner`, `WeightsReader`, `WeightsTensor` (under `gpu_ipc.weights`) | `gpu_ipc::weights::{WeightsOwner, WeightsReader, HeldGeneration}` |
//! | `testing.Pattern` | `gpu_ipc::kernels::{launch::PatternKernels, pattern}` |
//! | `GpuIpcError` and its subclasses | `gpu_ipc::core::frames::FrameError`, `semaphore::SemaphoreError` |
//!
//! The Python documentation lives in the stubs next to the package (`python/gpu_ipc/_gpu_ipc.pyi`), which CI
//! checks against this module (`mypy.stubtest`). The backend is chosen at run time, so a Python object holds an
//! enum of the concrete ends (legacy, vmm, host) rather than a generic one. Frames and slots are exported as
//! DLPack capsules (through `dlpark`) and, on a GPU, as `__cuda_array_interface__` v3: no copy either way.

mod consumer;
mod errors;
mod frame;
mod mapping;
mod pattern;
mod pool;
mod pool_import;
mod producer;
mod ring;
mod semaphore;
mod slot_arrays;
mod stream;
mod view;
mod weights;

use pyo3::prelude::*;

/// The module `gpu_ipc._gpu_ipc`.
#[pymodule]
fn _gpu_ipc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log_from_env();
    m.add_class::<producer::Producer>()?;
    m.add_class::<producer::Slot>()?;
    m.add_class::<consumer::Consumer>()?;
    m.add_class::<frame::Frame>()?;
    m.add_class::<frame::Stamp>()?;
    m.add_class::<semaphore::Semaphore>()?;
    m.add_class::<pool::SharedPool>()?;
    m.add_class::<pool::SharedBuffer>()?;
    m.add_class::<pool_import::PoolImporter>()?;
    m.add_class::<pool_import::BufferView>()?;
    m.add_function(wrap_pyfunction!(pool::sharing_backend, m)?)?;
    m.add_function(wrap_pyfunction!(ring::sync_strategies, m)?)?;
    m.add_function(wrap_pyfunction!(ring::default_sync, m)?)?;
    m.add_class::<semaphore::SemaphoreWait>()?;
    m.add_class::<pattern::Pattern>()?;
    m.add_class::<weights::WeightsOwner>()?;
    m.add_class::<weights::WeightsBound>()?;
    m.add_class::<weights::WeightsReader>()?;
    m.add_class::<weights::WeightsTensor>()?;
    m.add_class::<weights::GenerationWait>()?;
    m.add_function(wrap_pyfunction!(weights::read_sources, m)?)?;
    m.add_function(wrap_pyfunction!(weights::runs_of, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LEGACY_DEFAULT_STREAM", stream::LEGACY_DEFAULT_STREAM)?;
    m.add("STAMP_MASK", gpu_ipc::core::frames::STAMP_MASK)?;
    // The fork guard's process id, refreshed in a forked child (`ring::this_process`).
    let hooks = pyo3::types::PyDict::new(m.py());
    hooks.set_item("after_in_child", wrap_pyfunction!(ring::after_fork_in_child, m)?)?;
    m.py().import("os")?.call_method("register_at_fork", (), Some(&hooks))?;
    Ok(())
}

/// `GPU_IPC_LOG` (a filter as `RUST_LOG` takes it: `debug`, `ipc_toolkit=debug,info`): the library's log on
/// stderr, timestamped to the microsecond, for finding where an attach or an open spends its time. Unset: no log.
/// A malformed filter is said once on stderr and ignored.
fn log_from_env() {
    let Ok(filter) = std::env::var("GPU_IPC_LOG") else { return };
    match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(filter) => {
            // Another subscriber already set (an embedding application's) wins.
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
        }
        Err(e) => eprintln!("gpu_ipc: GPU_IPC_LOG={filter:?} ignored: {e}"),
    }
}
