//! The capability checks before a legacy export, on a real GPU: VMM memory is refused with a typed error that
//! names the fix, before `cuIpcGetMemHandle` is tried. Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_ipc_driver::Context;
use ipc_core::backend::{Backend, BackendError, SharedRegion};
use ipc_legacy::Legacy;
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

    // And legacy memory exports: 64 bytes, no fd.
    let legacy = Legacy::allocate(&ctx, 1 << 20).unwrap();
    let handle = Legacy::export(&legacy).unwrap();
    assert_eq!(handle.bytes.len(), 64);
    assert!(handle.fd.is_none());
    assert_eq!(handle.size, 1 << 20);
}
