//! Memory of either backend, chosen at run time: allocated and exported here, or imported from another process.
//! The probes compare the backends, so they hold regions of both behind one type.

use std::os::fd::OwnedFd;

use gpu_ipc::BackendKind;
use gpu_ipc::core::backend::{Backend, BackendError, ExportedHandle};
use gpu_ipc::driver::{Context, DeviceMemory, DeviceSpan};

/// An exportable allocation made through one backend.
#[derive(Debug)]
pub enum ExportedRegion {
    /// `cuMemAlloc` memory (legacy backend).
    #[cfg(feature = "legacy")]
    Legacy(<gpu_ipc::legacy::Legacy as Backend>::Exported),
    /// `cuMemCreate` memory mapped here (VMM backend).
    #[cfg(feature = "vmm")]
    Vmm(<gpu_ipc::vmm::Vmm as Backend>::Exported),
}

/// Another process's allocation, imported through one backend; closed (unmapped) on drop.
#[derive(Debug)]
pub enum ImportedRegion {
    /// Opened with `cuIpcOpenMemHandle`.
    #[cfg(feature = "legacy")]
    Legacy(<gpu_ipc::legacy::Legacy as Backend>::Imported),
    /// Imported from an fd, reserved, mapped and made accessible.
    #[cfg(feature = "vmm")]
    Vmm(<gpu_ipc::vmm::Vmm as Backend>::Imported),
}

/// An exported handle as it travels to a child: the handle bytes and size in JSON, the fd (if any) beside it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HandleMessage {
    /// The backend that made it.
    pub backend: BackendKind,
    /// The handle bytes (64 for legacy; empty for VMM, whose fd travels with `SCM_RIGHTS`).
    pub bytes: Vec<u8>,
    /// The allocation's size.
    pub size: u64,
}

impl ExportedRegion {
    /// Allocates at least `bytes` through `backend`.
    ///
    /// # Errors
    /// The backend's refusal or the driver's error.
    pub fn allocate(backend: BackendKind, ctx: &Context, bytes: u64) -> Result<Self, BackendError> {
        Ok(match backend {
            #[cfg(feature = "legacy")]
            BackendKind::Legacy => Self::Legacy(gpu_ipc::legacy::Legacy::allocate(ctx, bytes)?),
            #[cfg(feature = "vmm")]
            BackendKind::Vmm => Self::Vmm(gpu_ipc::vmm::Vmm::allocate(ctx, bytes)?),
            other => return Err(not_gpu(other)),
        })
    }

    /// Exports it: the message to send and the fd to send beside it (VMM).
    ///
    /// # Errors
    /// The backend's export error.
    pub fn export(&self) -> Result<(HandleMessage, Option<OwnedFd>), BackendError> {
        let (backend, mut handle) = match self {
            #[cfg(feature = "legacy")]
            Self::Legacy(region) => (BackendKind::Legacy, gpu_ipc::legacy::Legacy::export(region)?),
            #[cfg(feature = "vmm")]
            Self::Vmm(region) => (BackendKind::Vmm, gpu_ipc::vmm::Vmm::export(region)?),
        };
        let fd = handle.fd.take();
        Ok((HandleMessage { backend, bytes: handle.bytes, size: handle.size }, fd))
    }
}

/// Its memory here (the whole allocation, rounded up to the backend's granularity).
impl DeviceMemory for ExportedRegion {
    fn span(&self) -> DeviceSpan<'_> {
        match self {
            #[cfg(feature = "legacy")]
            Self::Legacy(region) => region.span(),
            #[cfg(feature = "vmm")]
            Self::Vmm(region) => region.span(),
        }
    }
}

impl ImportedRegion {
    /// Imports what `message` (and `fd`, for VMM) describe.
    ///
    /// # Errors
    /// The backend's import error.
    pub fn import(ctx: &Context, message: &HandleMessage, fd: Option<OwnedFd>) -> Result<Self, BackendError> {
        let handle = ExportedHandle { bytes: message.bytes.clone(), fd, size: message.size };
        Ok(match message.backend {
            #[cfg(feature = "legacy")]
            BackendKind::Legacy => Self::Legacy(gpu_ipc::legacy::Legacy::import(ctx, handle)?),
            #[cfg(feature = "vmm")]
            BackendKind::Vmm => Self::Vmm(gpu_ipc::vmm::Vmm::import(ctx, handle)?),
            other => return Err(not_gpu(other)),
        })
    }
}

/// The imported memory here.
impl DeviceMemory for ImportedRegion {
    fn span(&self) -> DeviceSpan<'_> {
        match self {
            #[cfg(feature = "legacy")]
            Self::Legacy(region) => region.span(),
            #[cfg(feature = "vmm")]
            Self::Vmm(region) => region.span(),
        }
    }
}

/// A backend the probes cannot run: the host backend, or one not compiled in.
fn not_gpu(kind: BackendKind) -> BackendError {
    BackendError::Unsupported {
        backend: kind.name(),
        reason: "the probes measure GPU memory and this backend is not a GPU backend compiled into this build".into(),
        fix: "choose legacy or vmm".into(),
    }
}
