//! Driver-layer tests on a real GPU. Ignored on machines without one (shown as ignored, never as passed);
//! the GPU suite runs them with `--run-ignored all` (see docs/gpu-testing.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ipc_core::driver::{
    Context, Device, DeviceBuffer, DevicePtr, Event, EventFlags, IpcMemHandle, Stream, VmmAllocation, VmmGranularity,
    VmmMapping, WaitCondition, copy_device_async, copy_from_device, copy_to_device, pointer_allowed_handle_types,
    pointer_is_legacy_ipc_capable, sys,
};

fn ctx() -> Context {
    Context::for_ordinal(0).expect("device 0 and its primary context")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_identity_and_attributes() {
    assert!(Device::count().unwrap() >= 1);
    let dev = Device::get(0).unwrap();
    let name = dev.name().unwrap();
    assert!(!name.is_empty());
    let (major, minor) = dev.compute_capability().unwrap();
    assert!((major, minor) >= (7, 5), "{name} is sm_{major}{minor}");
    assert_ne!(dev.uuid().unwrap().0, [0u8; 16]);
    assert!(dev.total_memory().unwrap() > 1 << 30);
    assert!(dev.flag(sys::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING).unwrap());
    assert!(dev.pci_bus_id().unwrap().contains(':'));
    // An unknown attribute is a typed error naming the call, not a panic.
    let err = dev.attribute(1_000_000).unwrap_err();
    assert!(err.to_string().starts_with("cuDeviceGetAttribute failed: CUDA_ERROR_INVALID_VALUE"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn allocation_copies_and_fills_round_trip() {
    let ctx = ctx();
    let words = 1 << 18;
    let src: Vec<u32> = (0..words as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let a = DeviceBuffer::alloc(&ctx, (words * 4) as u64).unwrap();
    let b = DeviceBuffer::alloc(&ctx, (words * 4) as u64).unwrap();
    a.write(0, &src).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    copy_device_async(b.ptr(), a.ptr(), a.len(), &stream).unwrap();
    stream.synchronize().unwrap();
    let mut back = vec![0u32; words];
    b.read(0, &mut back).unwrap();
    assert_eq!(back, src);

    b.fill_u32_async(0xfeed_beef, &stream).unwrap();
    stream.synchronize().unwrap();
    b.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&w| w == 0xfeed_beef));

    // Out-of-bounds host-side requests are refused before the driver is called.
    assert!(a.write(a.len() - 2, &[1u32]).is_err());
    let (free, total) = ctx.memory_info().unwrap();
    assert!(free > 0 && free <= total);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn events_order_and_time_work() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let start = Event::new(&ctx, EventFlags::TIMING).unwrap();
    let end = Event::new(&ctx, EventFlags::TIMING).unwrap();
    let buf = DeviceBuffer::alloc(&ctx, 64 << 20).unwrap();
    start.record(&stream).unwrap();
    for i in 0..8 {
        buf.fill_u32_async(i, &stream).unwrap();
    }
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    assert!(end.is_complete().unwrap());
    let ms = Event::elapsed_ms(&start, &end).unwrap();
    assert!(ms > 0.0 && ms < 1_000.0, "{ms} ms for 512 MiB of fills");

    let shared = Event::new(&ctx, EventFlags::INTERPROCESS).unwrap();
    let handle = shared.ipc_handle().unwrap();
    assert_ne!(handle.0, [0u8; 64]);
    // Timing and interprocess together are refused by the driver with a typed error.
    let err = Event::new(&ctx, EventFlags { timing: true, blocking_sync: false, interprocess: true }).unwrap_err();
    assert!(err.to_string().contains("cuEventCreate"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_wait_and_write_value_64_bit() {
    let ctx = ctx();
    let flags = DeviceBuffer::alloc(&ctx, 16).unwrap();
    flags.write(0, &[0u64, 0u64]).unwrap();
    let (flag, out) = (flags.ptr(), flags.ptr().offset(8));
    let stream = Stream::new(&ctx).unwrap();
    let target = 0x1_0000_0005u64; // above 2^32: only a 64-bit compare is satisfied by the right value
    stream.wait_value_u64(flag, target, WaitCondition::AtLeast).unwrap();
    stream.write_value_u64(out, 42).unwrap();

    // The low 32 bits alone must not release the wait.
    write_u64(flag, 5);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!stream.is_idle().unwrap(), "the wait was released by a value below the target");
    assert_eq!(read_u64(out), 0);

    let released = Instant::now();
    write_u64(flag, target);
    stream.synchronize().unwrap();
    assert_eq!(read_u64(out), 42);
    assert!(released.elapsed() < Duration::from_secs(1));
}

fn write_u64(addr: DevicePtr, value: u64) {
    copy_to_device(addr, &[value]).unwrap();
}

fn read_u64(addr: DevicePtr) -> u64 {
    let mut v = [0u64];
    copy_from_device(&mut v, addr).unwrap();
    v[0]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_allocation_exports_and_imports_through_an_fd() {
    let ctx = ctx();
    let granularity = VmmGranularity::for_device(ctx.device()).unwrap();
    assert!(granularity.minimum.is_power_of_two() && granularity.minimum >= 4096);
    assert_eq!(granularity.round_up(1), granularity.minimum);
    let size = granularity.minimum * 2;
    let exporter = VmmMapping::map(VmmAllocation::create(&ctx, size).unwrap()).unwrap();
    let fd = exporter.allocation().export_fd().unwrap();
    let importer =
        VmmMapping::map(VmmAllocation::import_fd(&ctx, std::os::fd::AsFd::as_fd(&fd), size).unwrap()).unwrap();
    drop(fd);
    assert_ne!(exporter.ptr(), importer.ptr());
    let data: Vec<u64> = (0..size / 8).map(|i| i ^ 0xabcd).collect();
    copy_to_device(exporter.ptr(), &data).unwrap();
    let mut back = vec![0u64; data.len()];
    copy_from_device(&mut back, importer.ptr()).unwrap();
    assert_eq!(back, data);

    // VMM memory is not legacy-IPC capable, and the driver refuses a legacy handle for it.
    assert!(!pointer_is_legacy_ipc_capable(exporter.ptr()).unwrap());
    assert_eq!(
        pointer_allowed_handle_types(exporter.ptr()).unwrap()
            & u64::from(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        u64::from(sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    );
    let err = IpcMemHandle::of(exporter.ptr()).unwrap_err();
    assert!(err.is(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE), "{err}");

    // A size that is not a multiple of the granularity is refused before the driver is called.
    assert!(VmmAllocation::create(&ctx, granularity.minimum + 1).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn legacy_allocations_are_ipc_capable() {
    let ctx = ctx();
    let buf = DeviceBuffer::alloc(&ctx, 1 << 20).unwrap();
    assert!(pointer_is_legacy_ipc_capable(buf.ptr()).unwrap());
    let handle = IpcMemHandle::of(buf.ptr()).unwrap();
    assert_ne!(handle.0, [0u8; 64]);
}
