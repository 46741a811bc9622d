//! Loading `libcuda.so.1` at run time, initialising it once, and checking every call's result.

use std::ffi::{CStr, c_char};
use std::sync::OnceLock;

use super::error::{DriverError, Result, fallback_name};
use super::sys;

/// The library name the NVIDIA driver installs; `GPU_IPC_LIBCUDA` overrides it (a path or a name).
const DEFAULT_LIBRARY: &str = "libcuda.so.1";

/// The driver's CUDA API version, as `cuDriverGetVersion` reports it (13000 means 13.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion(pub i32);

impl DriverVersion {
    /// Major CUDA version (13 for 13000).
    pub fn major(self) -> i32 {
        self.0 / 1000
    }
    /// Minor CUDA version (0 for 13000, 2 for 12020).
    pub fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl std::fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// The loaded CUDA driver. One per process, created on first use and never unloaded.
pub struct Driver {
    api: sys::CudaDriverApi,
    library: String,
    version: DriverVersion,
    init: OnceLock<Result<()>>,
}

static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();

impl Driver {
    /// Loads the driver library (once) without initialising CUDA; enough to read its version.
    ///
    /// # Errors
    /// [`DriverError::LibraryNotFound`] when `libcuda.so.1` cannot be loaded.
    pub fn load() -> Result<&'static Driver> {
        DRIVER.get_or_init(Self::open).as_ref().map_err(Clone::clone)
    }

    /// Loads the driver and runs `cuInit(0)` (once); every other call goes through this.
    ///
    /// # Errors
    /// [`DriverError::LibraryNotFound`] without a driver; `cuInit`'s error (for example
    /// `CUDA_ERROR_NO_DEVICE`) when the driver is present but unusable.
    pub fn get() -> Result<&'static Driver> {
        let driver = Self::load()?;
        driver
            .init
            .get_or_init(|| {
                let f = driver.entry("cuInit", &driver.api.cuInit)?;
                // SAFETY: cuInit takes a flags word that must be 0 and touches no caller memory.
                driver.check("cuInit", unsafe { f(0) })
            })
            .clone()?;
        Ok(driver)
    }

    fn open() -> Result<Driver> {
        let library = std::env::var("GPU_IPC_LIBCUDA").unwrap_or_else(|_| DEFAULT_LIBRARY.to_owned());
        // SAFETY: loading libcuda runs its ELF initialisers, which the NVIDIA driver documents as safe to run in
        // any process; bindgen's constructor resolves each symbol and keeps a missing one as an Err field.
        let api = unsafe { sys::CudaDriverApi::new(&library) }
            .map_err(|e| DriverError::LibraryNotFound { library: library.clone(), reason: e.to_string() })?;
        let mut driver = Driver { api, library, version: DriverVersion(0), init: OnceLock::new() };
        let f = driver.entry("cuDriverGetVersion", &driver.api.cuDriverGetVersion)?;
        let mut version = 0i32;
        // SAFETY: the out-pointer is a valid, writable i32 on our stack.
        driver.check("cuDriverGetVersion", unsafe { f(&mut version) })?;
        driver.version = DriverVersion(version);
        tracing::debug!(library = %driver.library, version = %driver.version, "loaded the CUDA driver");
        Ok(driver)
    }

    /// The driver's CUDA API version.
    pub fn version(&self) -> DriverVersion {
        self.version
    }

    /// The library name or path that was loaded.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The generated function table.
    pub(crate) fn api(&self) -> &sys::CudaDriverApi {
        &self.api
    }

    /// One entry point of the table, or a typed error naming it when this driver lacks it.
    pub(crate) fn entry<T: Copy>(
        &self,
        function: &'static str,
        slot: &std::result::Result<T, libloading::Error>,
    ) -> Result<T> {
        slot.as_ref()
            .copied()
            .map_err(|_| DriverError::MissingEntryPoint { function, driver_version: self.version.to_string() })
    }

    /// Turns a `CUresult` into `Ok` or a [`DriverError::Call`] naming the function and the result.
    pub(crate) fn check(&self, function: &'static str, result: sys::CUresult) -> Result<()> {
        if result == sys::cudaError_enum::CUDA_SUCCESS {
            return Ok(());
        }
        Err(DriverError::Call {
            function,
            code: result.0,
            name: self.static_string(&self.api.cuGetErrorName, result).unwrap_or(fallback_name(result.0)),
            description: self.static_string(&self.api.cuGetErrorString, result).unwrap_or("(no description)"),
        })
    }

    fn static_string(
        &self,
        slot: &std::result::Result<
            unsafe extern "C" fn(sys::CUresult, *mut *const c_char) -> sys::CUresult,
            libloading::Error,
        >,
        result: sys::CUresult,
    ) -> Option<&'static str> {
        let f = slot.as_ref().ok()?;
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: the out-pointer is a valid local; the driver stores a pointer to a static string or fails.
        let rc = unsafe { f(result, &mut text) };
        if rc != sys::cudaError_enum::CUDA_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: cuGetErrorName/cuGetErrorString return NUL-terminated strings with static lifetime inside the
        // driver library, which this process never unloads (the Driver lives in a static OnceLock).
        unsafe { CStr::from_ptr(text) }.to_str().ok()
    }
}

/// For `Drop`: runs one release call and logs a failure instead of panicking or propagating it (the memmap2 habit).
/// Without a loadable driver there is nothing to release.
pub(crate) fn release_quietly(what: &str, call: impl FnOnce(&Driver) -> Result<()>) {
    let Ok(driver) = Driver::get() else { return };
    if let Err(e) = call(driver) {
        tracing::warn!(error = %e, "{what} failed");
    }
}

/// Looks up a driver entry point by its field in the generated table:
/// `let f = entry!(driver, cuMemFree_v2, "cuMemFree")?;` then `unsafe { f(..) }` with a SAFETY comment.
macro_rules! entry {
    ($driver:expr, $field:ident, $name:literal) => {
        $driver.entry($name, &$driver.api().$field)
    };
}
pub(crate) use entry;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_splits_major_minor() {
        let v = DriverVersion(13000);
        assert_eq!((v.major(), v.minor()), (13, 0));
        assert_eq!(DriverVersion(12090).to_string(), "12.9");
    }
}
