//! The capability checks of the legacy backend, on a real GPU: VMM memory is refused with a typed error that
//! names the fix, before `cuIpcGetMemHandle` is tried; a handle of this same process, which `cuIpcOpenMemHandle`
//! refuses, is named for what it is. Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_ipc_driver::Context;
use ipc_core::backend::{Backend, BackendError, SharedRegion};
use ipc_legacy::{ALLOCATION_GRANULE, Legacy};
use ipc_vmm::Vmm;

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_memory_is_refused_by_the_legacy_backend_with_the_fix() {
    let ctx = Context::for_ordinal(0).unwrap();
    let vmm = Vmm::allocate(&ctx, 1 << 20).unwrap();
    let err = Legacy::export_ptr(vmm.ptr()).unwrap_err();
    assert!(matches!(err, BackendError::Unsupported { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("VMM (cuMemCreate) allocation"), "{text}");
    assert!(text.ends_with("use the vmm backend"), "{text}");

    // And legacy memory exports: 64 bytes, no fd, its size rounded up to the granule (2 MiB).
    let legacy = Legacy::allocate(&ctx, 1 << 20).unwrap();
    let handle = Legacy::export(&legacy).unwrap();
    assert_eq!(handle.bytes.len(), 64);
    assert!(handle.fd.is_none());
    assert_eq!(handle.size, ALLOCATION_GRANULE);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_handle_of_this_same_process_is_refused_saying_so() {
    // cuIpcOpenMemHandle opens only another process's memory; its own handle comes back as
    // CUDA_ERROR_INVALID_CONTEXT, which the backend names for what it is, with the way out.
    let ctx = Context::for_ordinal(0).unwrap();
    let region = Legacy::allocate(&ctx, 1 << 20).unwrap();
    let err = Legacy::import(&ctx, Legacy::export(&region).unwrap()).expect_err("an import of its own handle");
    assert!(matches!(err, BackendError::Unsupported { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("CUDA_ERROR_INVALID_CONTEXT") && text.contains("this same process"), "{text}");
    assert!(text.ends_with("use the vmm backend, which also works within one process"), "{text}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn legacy_allocations_are_rounded_up_to_the_granule_and_exported_whole() {
    let ctx = Context::for_ordinal(0).unwrap();
    for (asked, expected) in [(1, ALLOCATION_GRANULE), (3 * ALLOCATION_GRANULE + 256, 4 * ALLOCATION_GRANULE)] {
        let region = Legacy::allocate(&ctx, asked).unwrap();
        assert_eq!(region.len(), expected, "{asked} bytes asked");
        // The driver's own view of the allocation agrees: the handle covers all of it.
        let (base, size) = gpu_ipc_driver::address_range(region.ptr()).unwrap();
        assert_eq!((base, size), (region.ptr(), expected));
        assert_eq!(Legacy::export(&region).unwrap().size, expected);
    }
}
