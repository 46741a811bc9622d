//! gpu-ipc: share GPU memory between processes through the CUDA driver API.
//!
//! This is the crate applications depend on. It re-exports the core ([`core`]: driver layer, backend trait,
//! wire protocol, frame ring), the backends compiled in by Cargo feature (`legacy`, `vmm`; both by default), the
//! embedded kernels, and [`BackendChoice`], which picks a compiled-in backend at run time (`--backend`).
//!
//! ```no_run
//! use gpu_ipc::{BackendChoice, BackendVisitor};
//! use gpu_ipc::core::backend::{Backend, GpuBackend};
//!
//! struct Name;
//! impl BackendVisitor for Name {
//!     type Output = &'static str;
//!     fn visit<B: GpuBackend>(self) -> &'static str {
//!         B::NAME
//!     }
//! }
//! let choice: BackendChoice = "vmm".parse().unwrap();
//! assert_eq!(choice.dispatch(Name), "vmm");
//! ```

pub use gpu_ipc_kernels as kernels;
pub use ipc_core as core;
#[cfg(feature = "legacy")]
pub use ipc_legacy as legacy;
#[cfg(feature = "vmm")]
pub use ipc_vmm as vmm;

use ipc_core::backend::GpuBackend;

#[cfg(not(any(feature = "legacy", feature = "vmm")))]
compile_error!("enable at least one backend feature of gpu-ipc: `legacy` or `vmm`");

/// A GPU backend compiled into this build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// `cuIpcGetMemHandle` / `cuIpcOpenMemHandle` (feature `legacy`).
    #[cfg(feature = "legacy")]
    Legacy,
    /// `cuMemCreate` + POSIX fd over `SCM_RIGHTS` (feature `vmm`).
    #[cfg(feature = "vmm")]
    Vmm,
}

/// Code that is generic over the backend, run for a [`BackendChoice`] made at run time.
pub trait BackendVisitor {
    /// What the code returns.
    type Output;
    /// Runs the code with `B` as the backend (a [`GpuBackend`]: a CUDA context, and regions that lend their memory
    /// to kernels as spans).
    fn visit<B: GpuBackend>(self) -> Self::Output;
}

impl BackendChoice {
    /// Every backend compiled in.
    pub const ALL: &'static [BackendChoice] = &[
        #[cfg(feature = "legacy")]
        BackendChoice::Legacy,
        #[cfg(feature = "vmm")]
        BackendChoice::Vmm,
    ];

    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "legacy")]
            Self::Legacy => "legacy",
            #[cfg(feature = "vmm")]
            Self::Vmm => "vmm",
        }
    }

    /// Runs `visitor` with this backend's type.
    pub fn dispatch<V: BackendVisitor>(self, visitor: V) -> V::Output {
        match self {
            #[cfg(feature = "legacy")]
            Self::Legacy => visitor.visit::<ipc_legacy::Legacy>(),
            #[cfg(feature = "vmm")]
            Self::Vmm => visitor.visit::<ipc_vmm::Vmm>(),
        }
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--backend` value that names no compiled-in backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownBackend(pub String);

impl std::fmt::Display for UnknownBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = BackendChoice::ALL.iter().map(|b| b.name()).collect();
        write!(f, "unknown backend `{}`; this build has: {}", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownBackend {}

impl std::str::FromStr for BackendChoice {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendChoice::ALL.iter().copied().find(|b| b.name() == s).ok_or_else(|| UnknownBackend(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_compiled_backend_round_trips_through_its_name() {
        assert!(!BackendChoice::ALL.is_empty());
        for b in BackendChoice::ALL {
            assert_eq!(b.name().parse::<BackendChoice>().unwrap(), *b);
            assert_eq!(b.to_string(), b.name());
        }
        let err = "cuda9".parse::<BackendChoice>().unwrap_err();
        assert!(err.to_string().starts_with("unknown backend `cuda9`; this build has:"), "{err}");
    }

    #[cfg(all(feature = "legacy", feature = "vmm"))]
    #[test]
    fn dispatch_runs_the_chosen_backend() {
        struct Name;
        impl BackendVisitor for Name {
            type Output = &'static str;
            fn visit<B: GpuBackend>(self) -> &'static str {
                B::NAME
            }
        }
        assert_eq!(BackendChoice::Legacy.dispatch(Name), "legacy");
        assert_eq!(BackendChoice::Vmm.dispatch(Name), "vmm");
    }
}
