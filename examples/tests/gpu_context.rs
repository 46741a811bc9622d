//! The library leaves the calling thread's current context as it found it (PyTorch and the CUDA runtime read the
//! current device from it): `Context::enter` makes a context current for a scope and puts back another that was;
//! the driver wrapper's calls enter their context instead of leaving it bound. With two GPUs, memory of the other GPU
//! made, written and read while this GPU's context is current, on both backends (a VMM mapping is reachable from its
//! own device's context only: a synchronous copy the current context cannot make is made in the memory's device's
//! context). Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_ipc::driver::{Context, Device, DeviceBuffer, Stream};

/// The device of the context current on this thread, `None` when none is.
fn current_device() -> Option<i32> {
    if !Context::any_current().unwrap() {
        return None;
    }
    Some(Context::current().unwrap().device().ordinal())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_thread_with_no_current_context_keeps_the_one_the_library_entered() {
    let ctx = Context::retain(Device::get(0).unwrap()).unwrap();
    // A new thread starts with no current context; the first call that needs one leaves it current (nobody's
    // device moves), so that the thread's calls that use the current context find it.
    std::thread::spawn(move || {
        assert_eq!(current_device(), None, "a new thread has no current context");
        let buffer = DeviceBuffer::alloc(&ctx, 4096).unwrap();
        assert_eq!(current_device(), Some(0));
        let stream = Stream::new(&ctx).unwrap();
        buffer.fill_u32_async(7, &stream).unwrap();
        stream.synchronize().unwrap();
        let mut back = [0u32; 4];
        buffer.read(0, &mut back).unwrap();
        assert_eq!(back, [7; 4]);
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn entering_the_context_already_current_keeps_it_current() {
    let ctx = Context::for_ordinal(0).unwrap();
    {
        let _outer = ctx.enter().unwrap();
        {
            let _inner = ctx.enter().unwrap();
        }
        assert_eq!(current_device(), Some(0));
    }
    assert_eq!(current_device(), Some(0), "for_ordinal made it current, and leaving the guards keeps it so");
}

/// Tests that need two GPUs (scripts/gpu-suite.sh runs the `two_gpus` modules where it finds two).
mod two_gpus {
    use super::*;
    use gpu_ipc::core::backend::Backend;
    use gpu_ipc::driver::DeviceMemory;
    use gpu_ipc::legacy::Legacy;
    use gpu_ipc::vmm::Vmm;

    fn needs_two() {
        let count = Device::count().unwrap();
        assert!(count >= 2, "this test needs two GPUs; this machine has {count}");
    }

    #[test]
    #[ignore = "needs two CUDA GPUs"]
    fn entering_the_other_gpus_context_puts_the_callers_back() {
        needs_two();
        let gpu1 = Context::for_ordinal(1).unwrap();
        let gpu0 = Context::for_ordinal(0).unwrap(); // current now, as a torch program's cuda:0
        {
            let _entered = gpu1.enter().unwrap();
            assert_eq!(current_device(), Some(1));
        }
        assert_eq!(current_device(), Some(0), "the caller's device moved");
        let buffer = DeviceBuffer::alloc(&gpu1, 4096).unwrap();
        gpu1.synchronize().unwrap();
        drop(buffer);
        assert_eq!(current_device(), Some(0), "allocating on GPU 1 moved the caller's device");
        drop(gpu0);
    }

    /// Memory of GPU 1 allocated by `B`, written and read from the host while GPU 0's context is current.
    fn written_and_read_from_the_other_gpu<B: Backend<Context = Context>>()
    where
        B::Exported: DeviceMemory,
    {
        needs_two();
        let gpu1 = Context::for_ordinal(1).unwrap();
        let _gpu0 = Context::for_ordinal(0).unwrap();
        let region = B::allocate(&gpu1, 1 << 21).unwrap();
        assert_eq!(current_device(), Some(0));
        let words: Vec<u32> = (0..1024).collect();
        // A span does not know its context: a copy GPU 0's context cannot make (VMM memory is mapped for GPU 1
        // only) is made again in GPU 1's.
        region.span().write(4096, &words).unwrap();
        assert_eq!(current_device(), Some(0), "the write moved the caller's device");
        let mut back = vec![0u32; 1024];
        region.span().read(4096, &mut back).unwrap();
        assert_eq!(back, words);
        assert_eq!(current_device(), Some(0), "the read moved the caller's device");
        drop(region);
        assert_eq!(current_device(), Some(0), "freeing GPU 1's memory moved the caller's device");
    }

    #[test]
    #[ignore = "needs two CUDA GPUs"]
    fn memory_of_the_other_gpu_is_reached_through_its_context_legacy() {
        written_and_read_from_the_other_gpu::<Legacy>();
    }

    #[test]
    #[ignore = "needs two CUDA GPUs"]
    fn memory_of_the_other_gpu_is_reached_through_its_context_vmm() {
        written_and_read_from_the_other_gpu::<Vmm>();
    }
}
