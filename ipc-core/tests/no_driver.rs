//! Without a CUDA driver every entry point returns a typed error, never a panic. Runs everywhere: the library
//! name is pointed at one that cannot exist, so this also holds on a GPU machine.

#[test]
fn missing_driver_is_a_typed_error_naming_the_library() {
    set_library("libcuda-that-does-not-exist.so.1");
    let err = match gpu_ipc_driver::Driver::get() {
        Ok(_) => panic!("a nonexistent library loaded"),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(matches!(err, gpu_ipc_driver::DriverError::LibraryNotFound { .. }), "{err:?}");
    assert!(text.contains("libcuda-that-does-not-exist.so.1"), "{text}");
    assert!(text.contains("install the NVIDIA driver"), "{text}");
    // Every owner goes through the same loader, so they fail the same way.
    assert!(gpu_ipc_driver::Device::count().is_err());
    assert!(gpu_ipc_driver::Context::for_ordinal(0).is_err());
}

fn set_library(name: &str) {
    #[allow(unsafe_code)]
    // SAFETY: this test binary has a single test and no other threads read the environment.
    unsafe {
        std::env::set_var("GPU_IPC_LIBCUDA", name);
    }
}
