//! Errors of the driver layer.

use super::sys;

/// Result of a driver-layer operation.
pub type Result<T, E = DriverError> = std::result::Result<T, E>;

/// What went wrong talking to the CUDA driver.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// `libcuda.so.1` could not be loaded: no NVIDIA driver on this machine (or not on the loader path).
    #[error(
        "no CUDA driver: {library} could not be loaded ({reason}); install the NVIDIA driver, or run on a machine with an NVIDIA GPU"
    )]
    LibraryNotFound {
        /// The library name or path that was tried.
        library: String,
        /// The loader's message.
        reason: String,
    },
    /// The loaded driver lacks an entry point this call needs (the driver is older than the feature).
    #[error(
        "the CUDA driver has no {function} (driver API {driver_version}); update the NVIDIA driver to one that supports it"
    )]
    MissingEntryPoint {
        /// The CUDA function that is missing.
        function: &'static str,
        /// The driver's version, as `cuDriverGetVersion` reports it.
        driver_version: String,
    },
    /// A driver call returned an error code.
    #[error("{function} failed: {name} ({code}): {description}")]
    Call {
        /// The CUDA function that failed.
        function: &'static str,
        /// The raw `CUresult`.
        code: u32,
        /// The result's name, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: &'static str,
        /// The driver's description of the result.
        description: &'static str,
    },
    /// A kernel launch whose arguments do not match the kernel's parameter list.
    #[error("kernel {kernel}: {problem}")]
    KernelSignature {
        /// The kernel's name.
        kernel: String,
        /// What does not match.
        problem: String,
    },
    /// An argument was rejected before the driver was called.
    #[error("{function}: {problem}")]
    InvalidArgument {
        /// The operation that rejected it.
        function: &'static str,
        /// Why.
        problem: String,
    },
    /// A context handle from another library that is no device's primary context.
    #[error(
        "the context handle is not a device's primary context (one made with cuCtxCreate?); gpu-ipc works in the primary context, which cudarc, the CUDA runtime, PyTorch and CuPy use by default: make the other library use it"
    )]
    NotPrimaryContext,
    /// The calling thread has no current context to take.
    #[error("no CUDA context is current on this thread; create or bind one first (or use Context::for_ordinal)")]
    NoCurrentContext,
    /// `cuIpcOpenEventHandle` returned `CUDA_ERROR_MAP_FAILED` (205): the exporter's IPC event lives in shared
    /// memory this process cannot map, which is what a separate IPC namespace (a container's default under Docker
    /// and Kubernetes) or a private `/dev/shm` does. GPU memory handles still work there; events do not.
    #[error(
        "cuIpcOpenEventHandle failed: CUDA_ERROR_MAP_FAILED (205): this process cannot open the other process's \
         CUDA IPC event, because it runs in another IPC namespace (a container's default under Docker and \
         Kubernetes) or with a private /dev/shm; GPU memory can still be shared, IPC events cannot: use the \
         gpu-stream-ops, cpu-spin or cpu-sleep strategy, or share the IPC namespace (docker run --ipc=host, \
         Kubernetes hostIPC: true)"
    )]
    IpcEventUnreachable,
}

impl DriverError {
    /// The raw `CUresult` of a failed call, if this error came from one.
    pub fn cuda_code(&self) -> Option<u32> {
        match self {
            Self::Call { code, .. } => Some(*code),
            Self::IpcEventUnreachable => Some(sys::cudaError_enum::CUDA_ERROR_MAP_FAILED.0),
            _ => None,
        }
    }

    /// True when the driver said there is no CUDA-capable device.
    pub fn is_no_device(&self) -> bool {
        self.cuda_code() == Some(sys::cudaError_enum::CUDA_ERROR_NO_DEVICE.0)
    }

    /// True when the driver said the context is invalid (`CUDA_ERROR_INVALID_CONTEXT`), which
    /// `cuIpcOpenMemHandle` also answers for a handle exported by the calling process itself.
    pub fn is_invalid_context(&self) -> bool {
        self.cuda_code() == Some(sys::cudaError_enum::CUDA_ERROR_INVALID_CONTEXT.0)
    }

    /// True when the failing call returned `code`.
    pub fn is(&self, code: sys::CUresult) -> bool {
        self.cuda_code() == Some(code.0)
    }
}

/// Names of the results we most often report, for when `cuGetErrorName` itself is unavailable.
pub(crate) fn fallback_name(code: u32) -> &'static str {
    match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        200 => "CUDA_ERROR_INVALID_IMAGE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
        218 => "CUDA_ERROR_INVALID_PTX",
        205 => "CUDA_ERROR_MAP_FAILED",
        222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "CUDA_ERROR_(unnamed)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_error_names_function_and_result() {
        let e = DriverError::Call {
            function: "cuIpcGetMemHandle",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE",
            description: "invalid argument",
        };
        assert_eq!(e.to_string(), "cuIpcGetMemHandle failed: CUDA_ERROR_INVALID_VALUE (1): invalid argument");
        assert_eq!(e.cuda_code(), Some(1));
        assert!(e.is(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE));
        assert!(!e.is_no_device());
    }

    #[test]
    fn fallback_names_cover_the_image_errors() {
        assert_eq!(fallback_name(209), "CUDA_ERROR_NO_BINARY_FOR_GPU");
        assert_eq!(fallback_name(222), "CUDA_ERROR_UNSUPPORTED_PTX_VERSION");
        assert_eq!(fallback_name(12345), "CUDA_ERROR_(unnamed)");
    }

    #[test]
    fn an_ipc_event_that_cannot_be_mapped_names_the_namespace_and_the_fixes() {
        let e = DriverError::IpcEventUnreachable;
        let s = e.to_string();
        assert!(s.starts_with("cuIpcOpenEventHandle failed: CUDA_ERROR_MAP_FAILED (205)"), "{s}");
        for words in ["IPC namespace", "gpu-stream-ops", "cpu-spin", "--ipc=host", "hostIPC: true"] {
            assert!(s.contains(words), "{words}: {s}");
        }
        assert!(e.is(sys::cudaError_enum::CUDA_ERROR_MAP_FAILED));
        assert_eq!(fallback_name(205), "CUDA_ERROR_MAP_FAILED");
    }

    #[test]
    fn missing_library_message_says_what_to_do() {
        let e = DriverError::LibraryNotFound { library: "libcuda.so.1".into(), reason: "not found".into() };
        let s = e.to_string();
        assert!(s.starts_with("no CUDA driver: libcuda.so.1 could not be loaded"), "{s}");
        assert!(s.contains("install the NVIDIA driver"), "{s}");
    }
}
