//! Modules (cubin or PTX images), their kernels, and checked kernel launches.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use super::address::DevicePtr;
use super::context::Context;
use super::error::{DriverError, Result};
use super::loader::{Driver, entry, release_quietly};
use super::span::DeviceSpan;
use super::stream::Stream;
use super::sys;

/// A loaded module; unloaded when the last [`Function`] from it and the module itself are dropped.
#[derive(Clone)]
pub struct Module {
    inner: Arc<Loaded>,
}

struct Loaded {
    ctx: Context,
    raw: sys::CUmodule,
}

// SAFETY: a CUmodule handle may be used from any thread of the process; the driver serialises access.
unsafe impl Send for Loaded {}
// SAFETY: every method passes the handle to thread-safe driver calls only.
unsafe impl Sync for Loaded {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module").field("raw", &self.inner.raw).finish()
    }
}

impl Module {
    /// Loads a cubin or a PTX image (PTX is JIT-compiled by the driver). PTX text need not end with a NUL: it is
    /// copied and terminated here (anything after a NUL is ignored), so NVRTC's output or a `.ptx` file's bytes
    /// can be passed as they are; a cubin (an ELF image) is passed to the driver unchanged.
    ///
    /// # Errors
    /// A failing `cuModuleLoadDataEx`: `CUDA_ERROR_NO_BINARY_FOR_GPU` for a cubin of another architecture,
    /// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` for PTX newer than the driver, `CUDA_ERROR_INVALID_IMAGE` otherwise.
    pub fn load(ctx: &Context, image: &[u8]) -> Result<Self> {
        let _entered = ctx.enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuModuleLoadDataEx, "cuModuleLoadDataEx")?;
        // PTX is text and must be NUL-terminated; a cubin is an ELF image, passed as is.
        let ptx;
        let data: *const c_void = if image.starts_with(b"\x7fELF") {
            image.as_ptr().cast()
        } else {
            let text: Vec<u8> = image.iter().copied().take_while(|&b| b != 0).collect();
            ptx = CString::new(text)
                .map_err(|e| DriverError::InvalidArgument { function: "cuModuleLoadDataEx", problem: e.to_string() })?;
            ptx.as_ptr().cast()
        };
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `data` points to a complete ELF image or a NUL-terminated PTX string that outlives the call;
        // no JIT options are passed (count 0, null arrays).
        d.check("cuModuleLoadDataEx", unsafe { f(&mut raw, data, 0, std::ptr::null_mut(), std::ptr::null_mut()) })?;
        Ok(Self { inner: Arc::new(Loaded { ctx: ctx.clone(), raw }) })
    }

    /// Looks up a kernel by its (unmangled, `extern "C"`) name and reads its parameter layout.
    ///
    /// # Errors
    /// `CUDA_ERROR_NOT_FOUND` for an unknown name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let d = Driver::get()?;
        let f = entry!(d, cuModuleGetFunction, "cuModuleGetFunction")?;
        let cname = CString::new(name)
            .map_err(|e| DriverError::InvalidArgument { function: "cuModuleGetFunction", problem: e.to_string() })?;
        let mut raw: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the out-pointer is a valid local; the module is alive; the name is NUL-terminated.
        d.check("cuModuleGetFunction", unsafe { f(&mut raw, self.inner.raw, cname.as_ptr()) })?;
        let params = param_sizes(d, raw)?;
        Ok(Function { module: self.clone(), raw, name: name.to_owned(), params })
    }

    /// The context the module was loaded in.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

/// Reads each parameter's size with `cuFuncGetParamInfo` (CUDA 12.4+), so that launches can be checked.
/// `None` when the driver predates it: launches are then unchecked.
fn param_sizes(d: &Driver, func: sys::CUfunction) -> Result<Option<Vec<usize>>> {
    let Ok(f) = entry!(d, cuFuncGetParamInfo, "cuFuncGetParamInfo") else { return Ok(None) };
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: out-pointers are valid locals; the function handle is alive; an index past the last parameter
        // returns CUDA_ERROR_INVALID_VALUE, which ends the loop.
        let rc = unsafe { f(func, sizes.len(), &mut offset, &mut size) };
        if rc == sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE {
            return Ok(Some(sizes));
        }
        d.check("cuFuncGetParamInfo", rc)?;
        sizes.push(size);
        if sizes.len() > 256 {
            return Ok(Some(sizes));
        }
    }
}

/// One raw kernel argument, for [`Function::launch`] (`unsafe`). The launch checks the count and each size against
/// the kernel's parameter list. Safe code uses [`KernelArg`] and [`Function::launch_typed`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelParam {
    /// A device pointer (`T*`), any address.
    Ptr(DevicePtr),
    /// `unsigned long long` / `uint64_t`.
    U64(u64),
    /// `long long` / `int64_t`.
    I64(i64),
    /// `unsigned int`.
    U32(u32),
    /// `int`.
    I32(i32),
    /// `float`.
    F32(f32),
}

impl KernelParam {
    fn size(&self) -> usize {
        match self {
            Self::Ptr(_) | Self::U64(_) | Self::I64(_) => 8,
            Self::U32(_) | Self::I32(_) | Self::F32(_) => 4,
        }
    }

    /// The argument's bytes, widened to 8 so each value has a stable address during the launch.
    fn storage(&self) -> u64 {
        match *self {
            Self::Ptr(p) => p.0,
            Self::U64(v) => v,
            Self::I64(v) => v as u64,
            Self::U32(v) => u64::from(v),
            Self::I32(v) => u64::from(v as u32),
            Self::F32(v) => u64::from(v.to_bits()),
        }
    }
}

/// One kernel argument of a safe launch ([`Function::launch_typed`]): memory only as a [`DeviceSpan`] borrowed from
/// its owner, so safe code cannot point a kernel at host memory Rust has lent out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg<'a> {
    /// A pointer parameter (`T*`): the span's start address. Pass its length (or element count) as a scalar
    /// argument if the kernel needs it.
    Span(DeviceSpan<'a>),
    /// `unsigned long long` / `uint64_t`.
    U64(u64),
    /// `long long` / `int64_t`.
    I64(i64),
    /// `unsigned int`.
    U32(u32),
    /// `int`.
    I32(i32),
    /// `float`.
    F32(f32),
}

impl<'a> From<DeviceSpan<'a>> for KernelArg<'a> {
    fn from(span: DeviceSpan<'a>) -> Self {
        Self::Span(span)
    }
}

impl KernelArg<'_> {
    /// The raw parameter: a span becomes its start address.
    fn param(&self) -> KernelParam {
        match *self {
            Self::Span(span) => KernelParam::Ptr(span.ptr()),
            Self::U64(v) => KernelParam::U64(v),
            Self::I64(v) => KernelParam::I64(v),
            Self::U32(v) => KernelParam::U32(v),
            Self::I32(v) => KernelParam::I32(v),
            Self::F32(v) => KernelParam::F32(v),
        }
    }
}

/// Grid and block shape of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Self { grid: (blocks, 1, 1), block: (threads, 1, 1), shared_mem_bytes: 0 }
    }
}

/// A kernel of a loaded module.
#[derive(Clone)]
pub struct Function {
    module: Module,
    raw: sys::CUfunction,
    name: String,
    params: Option<Vec<usize>>,
}

// SAFETY: a CUfunction handle may be used from any thread of the process; the driver serialises launches.
unsafe impl Send for Function {}
// SAFETY: every method passes the handle to thread-safe driver calls only.
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function").field("name", &self.name).field("params", &self.params).finish()
    }
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Parameter sizes in bytes, when the driver can report them.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// The module the kernel came from.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Checks `args` against the parameter list read at load time.
    fn check_args(&self, args: &[KernelParam]) -> Result<()> {
        let Some(sizes) = &self.params else { return Ok(()) };
        let given: Vec<usize> = args.iter().map(KernelParam::size).collect();
        if &given != sizes {
            return Err(DriverError::KernelSignature {
                kernel: self.name.clone(),
                problem: format!("takes parameters of sizes {sizes:?} bytes, the launch passed {given:?}"),
            });
        }
        Ok(())
    }

    /// Launches the kernel on `stream` with typed arguments: every pointer argument is a [`DeviceSpan`], memory
    /// its owner lends to the GPU.
    ///
    /// The argument count and sizes are checked against the kernel's own parameter list first (on drivers with
    /// `cuFuncGetParamInfo`). Kernels are trusted code, like the driver: this is sound as long as the kernel keeps
    /// to the spans it is given (what it does elsewhere in device memory is reported by the driver, e.g.
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` at the next sync).
    ///
    /// # Errors
    /// [`DriverError::KernelSignature`] for mismatched arguments; a failing `cuLaunchKernel`.
    pub fn launch_typed(&self, stream: &Stream, config: LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
        let params: Vec<KernelParam> = args.iter().map(KernelArg::param).collect();
        // SAFETY: every pointer argument is the start of a span, memory whose owner guarantees that no Rust
        // reference covers it; scalars point nowhere.
        unsafe { self.launch(stream, config, &params) }
    }

    /// Launches the kernel on `stream` with raw arguments. The safe form is [`Function::launch_typed`].
    ///
    /// The argument count and sizes are checked against the kernel's own parameter list first (on drivers with
    /// `cuFuncGetParamInfo`), so the driver never reads past the argument array.
    ///
    /// # Errors
    /// [`DriverError::KernelSignature`] for mismatched arguments; a failing `cuLaunchKernel`.
    ///
    /// # Safety
    /// Every [`KernelParam::Ptr`] the kernel dereferences must, until the kernel has finished, point to memory the
    /// device can address that no Rust reference covers (where the kernel writes) or that nothing writes through a
    /// Rust reference (where it reads): under unified addressing a host address is a valid kernel pointer.
    pub unsafe fn launch(&self, stream: &Stream, config: LaunchConfig, args: &[KernelParam]) -> Result<()> {
        self.check_args(args)?;
        // In the stream's context (the legacy default stream is the current context's), and the caller's back after.
        let _entered = stream.context().enter()?;
        let d = Driver::get()?;
        let f = entry!(d, cuLaunchKernel, "cuLaunchKernel")?;
        let mut storage: Vec<u64> = args.iter().map(KernelParam::storage).collect();
        // Little-endian: the first `size` bytes of each u64 slot hold the value, as the kernel reads it.
        let mut pointers: Vec<*mut c_void> = storage.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        let (gx, gy, gz) = config.grid;
        let (bx, by, bz) = config.block;
        // SAFETY: `pointers` holds one pointer per kernel parameter (checked above), each to 8 live bytes in
        // `storage`, which outlives the call (the driver copies arguments before returning); `extra` is null.
        d.check("cuLaunchKernel", unsafe {
            f(
                self.raw,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                config.shared_mem_bytes,
                stream.raw(),
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        release_quietly("unloading a module", |d| {
            let _entered = self.ctx.enter()?;
            let f = entry!(d, cuModuleUnload, "cuModuleUnload")?;
            // SAFETY: the module was loaded by us and is unloaded exactly once, when its last owner drops.
            d.check("cuModuleUnload", unsafe { f(self.raw) })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_widen_little_endian() {
        assert_eq!(KernelParam::U32(0xdead_beef).storage(), 0xdead_beef);
        assert_eq!(KernelParam::I32(-1).storage(), 0xffff_ffff);
        assert_eq!(KernelParam::F32(1.0).storage(), 0x3f80_0000);
        assert_eq!(KernelParam::Ptr(DevicePtr(0x7f00_0000_1000)).size(), 8);
        assert_eq!(KernelParam::U32(1).size(), 4);
    }

    #[test]
    fn typed_args_become_the_same_raw_params() {
        let span = DeviceSpan::of_owner(DevicePtr(0x7f00_0000_1000), 64);
        assert_eq!(KernelArg::from(span).param(), KernelParam::Ptr(DevicePtr(0x7f00_0000_1000)));
        assert_eq!(
            KernelArg::Span(span.slice(8, 8).unwrap_or(span)).param(),
            KernelParam::Ptr(DevicePtr(0x7f00_0000_1008))
        );
        assert_eq!(KernelArg::U64(7).param(), KernelParam::U64(7));
        assert_eq!(KernelArg::I64(-7).param(), KernelParam::I64(-7));
        assert_eq!(KernelArg::U32(3).param(), KernelParam::U32(3));
        assert_eq!(KernelArg::I32(-3).param(), KernelParam::I32(-3));
        assert_eq!(KernelArg::F32(0.5).param(), KernelParam::F32(0.5));
    }
}
