//! gpu-ipc: share GPU memory between processes through the CUDA driver API.
//!
//! This is the crate applications depend on:
//!
//! ```toml
//! [dependencies]
//! gpu-ipc = { path = "../gpu-ipc/gpu-ipc" }   # features: legacy, vmm (both by default), cudarc (interop)
//! ```
//!
//! It re-exports the driver layer ([`driver`]: CUDA contexts, streams, memory, device queries), the core
//! ([`core`]: backend trait, wire protocol, frame ring), the toolkit ([`toolkit`]: the [`semaphore`], the [`pool`],
//! the memory pool with named buffers, whose [`SharedPool`] and [`PoolImporter`] are at the top too, the work
//! [`queue`], and the object door they are reached through), the descriptions of what a ring's slots hold
//! ([`SlotLayout`]: pixel frames or any tensor), the backends compiled in by Cargo feature (`legacy`, `vmm`; both by
//! default, and [`host`], the host backend that needs no GPU), the embedded kernels, and [`BackendKind`], the one
//! name of a backend, with [`dispatch`] and [`dispatch_gpu`] to run code generic over the backend for a choice made at
//! run time (`--backend`).
//!
//! The library logs through [`tracing`](https://docs.rs/tracing): install a subscriber (for example
//! `tracing_subscriber::fmt().init()`) to see what it says about consumers attaching, dying or being evicted.
//!
//! ```no_run
//! use gpu_ipc::{BackendKind, GpuBackendVisitor};
//! use gpu_ipc::core::backend::{Backend, GpuBackend};
//!
//! struct Name;
//! impl GpuBackendVisitor for Name {
//!     type Output = &'static str;
//!     fn visit<B: GpuBackend>(self) -> &'static str {
//!         B::KIND.name()
//!     }
//! }
//! let kind: BackendKind = "vmm".parse()?;
//! assert_eq!(gpu_ipc::dispatch_gpu(kind, Name)?, "vmm");
//! // The host backend shares host memory: code that needs a GPU is refused it, with the reason.
//! assert!(gpu_ipc::dispatch_gpu(BackendKind::Host, Name).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use gpu_ipc_driver as driver;
pub use gpu_ipc_kernels as kernels;
pub use ipc_core as core;
pub use ipc_core::host;
#[cfg(feature = "legacy")]
pub use ipc_legacy as legacy;
pub use ipc_toolkit as toolkit;
pub use ipc_toolkit::queue;
pub use ipc_toolkit::semaphore;
#[cfg(feature = "vmm")]
pub use ipc_vmm as vmm;

pub use ipc_core::wire::{BackendKind, SyncStrategy, UnknownName};
/// What a ring's slots hold: pixel frames ([`FrameGeometry`]), any tensor ([`TensorDesc`], of a [`DType`]) or bare
/// bytes, described by one [`SlotLayout`] (`ProducerConfig::new` takes any of them; `Consumer::slot_layout` says
/// what a ring holds).
pub use ipc_core::wire::{DType, FrameGeometry, PixelFormat, SlotLayout, TensorDesc};
pub use ipc_toolkit::pool;
pub use ipc_toolkit::pool::{PoolImporter, SharedPool};
pub use ipc_toolkit::weights;
pub use ipc_toolkit::weights::{WeightsOwner, WeightsPartsOwner, WeightsPartsReader, WeightsReader};

use ipc_core::backend::{Backend, GpuBackend};

#[cfg(not(any(feature = "legacy", feature = "vmm")))]
compile_error!("enable at least one backend feature of gpu-ipc: `legacy` or `vmm`");

#[cfg(feature = "cudarc")]
pub mod cudarc_interop;

/// The Rust snippets of the README, compiled as doc tests with the paths an outside project uses.
#[cfg(all(doctest, feature = "vmm"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDocTests;

/// The Rust snippets of `docs/frames.md`, compiled as doc tests with the paths an outside project uses.
#[cfg(doctest)]
#[doc = include_str!("../../docs/frames.md")]
pub struct FramesDocTests;

/// The Rust snippets of `docs/pipelines.md`, compiled as doc tests with the paths an outside project uses (its
/// host-backend example runs).
#[cfg(doctest)]
#[doc = include_str!("../../docs/pipelines.md")]
pub struct PipelinesDocTests;

/// The Rust snippets of `docs/pool.md`, compiled (and, for the host backend's, run) as doc tests with the paths an
/// outside project uses.
#[cfg(all(doctest, feature = "legacy", feature = "vmm"))]
#[doc = include_str!("../../docs/pool.md")]
pub struct PoolDocTests;

/// The Rust snippets of `docs/weights.md`, compiled and run (host backend) as doc tests with the paths an outside
/// project uses.
#[cfg(doctest)]
#[doc = include_str!("../../docs/weights.md")]
pub struct WeightsDocTests;

/// The Rust snippets of `docs/semaphore.md`, compiled (and the host-backend one run) as doc tests with the paths an
/// outside project uses.
#[cfg(all(doctest, feature = "vmm"))]
#[doc = include_str!("../../docs/semaphore.md")]
pub struct SemaphoreDocTests;

/// The Rust snippets of `docs/work-queue.md`, compiled (and the host-backend one run) as doc tests with the paths an
/// outside project uses.
#[cfg(all(doctest, feature = "vmm"))]
#[doc = include_str!("../../docs/work-queue.md")]
pub struct WorkQueueDocTests;

/// The Rust snippets of `docs/interop.md`, compiled as doc tests with the paths an outside project uses.
#[cfg(all(doctest, feature = "cudarc", feature = "vmm"))]
#[doc = include_str!("../../docs/interop.md")]
pub struct InteropDocTests;

/// Every backend compiled into this build, the host backend last (it is always there).
pub const COMPILED: &[BackendKind] = &[
    #[cfg(feature = "legacy")]
    BackendKind::Legacy,
    #[cfg(feature = "vmm")]
    BackendKind::Vmm,
    BackendKind::Host,
];

/// The GPU backends compiled into this build (`legacy`, `vmm`).
pub const COMPILED_GPU: &[BackendKind] = &[
    #[cfg(feature = "legacy")]
    BackendKind::Legacy,
    #[cfg(feature = "vmm")]
    BackendKind::Vmm,
];

/// Code generic over the backend, the host backend included, run for a [`BackendKind`] chosen at run time.
pub trait BackendVisitor {
    /// What the code returns.
    type Output;
    /// Runs the code with `B` as the backend.
    fn visit<B: Backend>(self) -> Self::Output;
}

/// Code generic over a GPU backend (a CUDA context, and regions that lend their memory to kernels as spans), run
/// for a [`BackendKind`] chosen at run time.
pub trait GpuBackendVisitor {
    /// What the code returns.
    type Output;
    /// Runs the code with `B` as the backend.
    fn visit<B: GpuBackend>(self) -> Self::Output;
}

/// A backend this build cannot run for the code asked: not compiled in, or the host backend where a GPU is needed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", unavailable_message(*.kind, *.needs_gpu))]
pub struct BackendUnavailable {
    /// The backend asked for.
    pub kind: BackendKind,
    /// Whether the code needs a GPU backend.
    pub needs_gpu: bool,
}

fn unavailable_message(kind: BackendKind, needs_gpu: bool) -> String {
    let names = |list: &[BackendKind]| list.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ");
    if needs_gpu && !kind.is_gpu() {
        format!("the {kind} backend shares host memory and runs no GPU work; use one of: {}", names(COMPILED_GPU))
    } else {
        format!(
            "the {kind} backend is not compiled into this build (Cargo feature `{kind}` of gpu-ipc); this build has: {}",
            names(if needs_gpu { COMPILED_GPU } else { COMPILED })
        )
    }
}

/// Runs `visitor` with `kind`'s backend type.
///
/// # Errors
/// [`BackendUnavailable`] when `kind` is not compiled into this build.
pub fn dispatch<V: BackendVisitor>(kind: BackendKind, visitor: V) -> Result<V::Output, BackendUnavailable> {
    match kind {
        #[cfg(feature = "legacy")]
        BackendKind::Legacy => Ok(visitor.visit::<ipc_legacy::Legacy>()),
        #[cfg(feature = "vmm")]
        BackendKind::Vmm => Ok(visitor.visit::<ipc_vmm::Vmm>()),
        BackendKind::Host => Ok(visitor.visit::<ipc_core::host::Host>()),
        _ => Err(BackendUnavailable { kind, needs_gpu: false }),
    }
}

/// Runs `visitor` with `kind`'s backend type, a GPU backend.
///
/// # Errors
/// [`BackendUnavailable`] for the host backend, or a backend not compiled into this build.
pub fn dispatch_gpu<V: GpuBackendVisitor>(kind: BackendKind, visitor: V) -> Result<V::Output, BackendUnavailable> {
    match kind {
        #[cfg(feature = "legacy")]
        BackendKind::Legacy => Ok(visitor.visit::<ipc_legacy::Legacy>()),
        #[cfg(feature = "vmm")]
        BackendKind::Vmm => Ok(visitor.visit::<ipc_vmm::Vmm>()),
        _ => Err(BackendUnavailable { kind, needs_gpu: true }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_backend_round_trips_through_its_name_and_serde() {
        for b in BackendKind::ALL {
            assert_eq!(b.name().parse::<BackendKind>().unwrap(), b);
            assert_eq!(b.to_string(), b.name());
            let json = serde_json::to_string(&b).unwrap();
            assert_eq!(json, format!("\"{}\"", b.name()));
            assert_eq!(serde_json::from_str::<BackendKind>(&json).unwrap(), b);
        }
        // Names written before there was one word for a backend are still read.
        assert_eq!(serde_json::from_str::<BackendKind>("\"HostFake\"").unwrap(), BackendKind::Host);
        assert_eq!("host-fake".parse::<BackendKind>().unwrap(), BackendKind::Host);
        let err = "cuda9".parse::<BackendKind>().unwrap_err();
        assert_eq!(err.to_string(), "unknown backend `cuda9`; expected one of: legacy, vmm, host");
    }

    #[test]
    #[allow(deprecated)]
    fn the_host_backends_old_names_still_compile_and_mean_the_host_backend() {
        assert_eq!(BackendKind::HostFake, BackendKind::Host);
        assert!(matches!(BackendKind::Host, BackendKind::HostFake));
        let old: Option<crate::host::HostFake> = Some(crate::host::Host);
        assert!(old.is_some());
        let _context: crate::core::fake::HostContext = crate::host::HostContext;
    }

    #[test]
    fn every_strategy_round_trips_through_its_cli_name_and_serde() {
        for s in SyncStrategy::ALL {
            assert_eq!(s.name().parse::<SyncStrategy>().unwrap(), s);
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{}\"", s.name()));
        }
        assert_eq!(serde_json::from_str::<SyncStrategy>("\"GpuStreamOps\"").unwrap(), SyncStrategy::GpuStreamOps);
        let err = "gpu-spin".parse::<SyncStrategy>().unwrap_err();
        assert!(err.to_string().contains("cpu-spin, cpu-sleep, ipc-event, gpu-stream-ops, gpu-poll"), "{err}");
    }

    struct Name;
    impl BackendVisitor for Name {
        type Output = &'static str;
        fn visit<B: Backend>(self) -> &'static str {
            B::KIND.name()
        }
    }
    impl GpuBackendVisitor for Name {
        type Output = &'static str;
        fn visit<B: GpuBackend>(self) -> &'static str {
            B::KIND.name()
        }
    }

    #[test]
    fn dispatch_runs_the_chosen_backend_and_refuses_the_host_fake_where_a_gpu_is_needed() {
        for &b in COMPILED {
            assert_eq!(dispatch(b, Name).unwrap(), b.name());
        }
        for &b in COMPILED_GPU {
            assert_eq!(dispatch_gpu(b, Name).unwrap(), b.name());
        }
        let err = dispatch_gpu(BackendKind::Host, Name).unwrap_err();
        assert!(err.to_string().starts_with("the host backend shares host memory"), "{err}");
        assert!(COMPILED.contains(&BackendKind::Host));
    }
}
