//! Driver-layer tests on a real GPU. Ignored on machines without one (shown as ignored, never as passed);
//! the GPU suite runs them with `--run-ignored all` (see docs/gpu-testing.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpu_ipc_driver::{
    Context, Device, DeviceBuffer, DeviceFeature, DeviceMemory, DeviceSpan, Event, EventFlags, HandleTypes,
    HostRegistration, IpcMemHandle, Stream, VmmAllocation, VmmGranularity, VmmMapping, WaitCondition, address_range,
    copy_from_device, copy_to_device, pointer_allowed_handle_types, pointer_is_legacy_ipc_capable, raw::CUresult,
};
use ipc_core::shm::{SharedMemory, SharedObject};

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
    assert!(dev.supports(DeviceFeature::UnifiedAddressing).unwrap());
    assert!(dev.pci_bus_id().unwrap().contains(':'));
    // Every GPU this project supports (sm_75 and newer) has dozens of SMs; an H200 has 132.
    assert!(dev.sm_count().unwrap() >= 16, "{name}: {} SMs", dev.sm_count().unwrap());
    if dev.supports(DeviceFeature::MemoryPools).unwrap() {
        assert!(dev.memory_pool_handle_types().unwrap().contains(HandleTypes::POSIX_FD));
    }
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
    b.span().copy_from_async(&a.span(), &stream).unwrap();
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
    let (flag, out) = (flags.span().slice(0, 8).unwrap(), flags.span().slice(8, 8).unwrap());
    let stream = Stream::new(&ctx).unwrap();
    let target = 0x1_0000_0005u64; // above 2^32: only a 64-bit compare is satisfied by the right value
    flag.wait_value_u64(&stream, 0, target, WaitCondition::AtLeast).unwrap();
    out.write_value_u64(&stream, 0, 42).unwrap();
    // Words outside the span, or unaligned, are refused before the driver is called.
    assert!(flag.write_value_u64(&stream, 8, 1).is_err());
    assert!(flags.span().write_value_u64(&stream, 4, 1).is_err());

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

fn write_u64(word: DeviceSpan<'_>, value: u64) {
    word.write(0, &[value]).unwrap();
}

fn read_u64(word: DeviceSpan<'_>) -> u64 {
    let mut v = [0u64];
    word.read(0, &mut v).unwrap();
    v[0]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn spans_copy_to_and_from_registered_host_memory_seen_as_atomics() {
    let ctx = ctx();
    let stream = Stream::new(&ctx).unwrap();
    let block =
        Arc::new(SharedObject::<[AtomicU64; 512]>::new(SharedMemory::create("span-test", 4096).unwrap()).unwrap());
    let registration = HostRegistration::new(&ctx, Arc::clone(&block)).unwrap();
    assert_eq!(registration.span().len(), 4096);

    // A device buffer's words land in the host block, through the driver's copy and through stream writes.
    let device = DeviceBuffer::alloc(&ctx, 4096).unwrap();
    let words: Vec<u64> = (0..512).map(|i| i * 3 + 1).collect();
    device.write(0, &words).unwrap();
    device.span().copy_to_host_memory(block.as_ref(), 0).unwrap();
    assert_eq!(block.get()[511].load(Ordering::Acquire), 511 * 3 + 1);
    registration.span().copy_from_async(&device.span(), &stream).unwrap();
    registration.write_value_u64(&stream, 8, 0xfeed).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(block.get()[1].load(Ordering::Acquire), 0xfeed);
    assert_eq!(block.get()[2].load(Ordering::Acquire), 7);

    // And back: the host block into a sub-span of the device buffer.
    block.get()[0].store(99, Ordering::Release);
    let head = device.span().slice(0, 4096).unwrap();
    head.copy_from_host_memory(block.as_ref(), 0).unwrap();
    assert_eq!(read_u64(head), 99);
    // A host range that does not fit the host memory is refused before the driver is called.
    assert!(device.span().copy_from_host_memory(block.as_ref(), 8).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
#[allow(unsafe_code)]
fn raw_copies_reach_the_same_bytes_as_span_copies() {
    let ctx = ctx();
    let buf = DeviceBuffer::alloc(&ctx, 64).unwrap();
    // SAFETY: the range is inside a device allocation this test owns; no Rust reference covers device memory.
    unsafe { copy_to_device(buf.ptr().offset(8), &[0x1234_5678u32, 9]) }.unwrap();
    let mut via_span = [0u32; 2];
    buf.span().read(8, &mut via_span).unwrap();
    assert_eq!(via_span, [0x1234_5678, 9]);
    let mut raw = [0u32; 2];
    // SAFETY: as above; the destination is a local array.
    unsafe { copy_from_device(&mut raw, buf.ptr().offset(8)) }.unwrap();
    assert_eq!(raw, via_span);
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
    assert_eq!((exporter.span().len(), importer.span().len()), (size, size));
    exporter.span().write(0, &data).unwrap();
    let mut back = vec![0u64; data.len()];
    importer.span().read(0, &mut back).unwrap();
    assert_eq!(back, data);

    // VMM memory is not legacy-IPC capable, and the driver refuses a legacy handle for it.
    assert!(!pointer_is_legacy_ipc_capable(exporter.ptr()).unwrap());
    assert_eq!(
        pointer_allowed_handle_types(exporter.ptr()).unwrap() & HandleTypes::POSIX_FD.bits(),
        HandleTypes::POSIX_FD.bits()
    );
    let err = IpcMemHandle::of(exporter.ptr()).unwrap_err();
    assert!(err.is(CUresult::CUDA_ERROR_INVALID_VALUE), "{err}");

    // A size that is not a multiple of the granularity is refused before the driver is called.
    assert!(VmmAllocation::create(&ctx, granularity.minimum + 1).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_allocations_side_by_side_are_walked_exported_one_by_one_and_mapped_side_by_side_again() {
    // What PyTorch's expandable segments make: allocations mapped one after the other in one reserved range.
    let ctx = ctx();
    let g = VmmGranularity::for_device(ctx.device()).unwrap().minimum;
    let sizes = [g, 2 * g, g];
    let exporter =
        VmmMapping::map_side_by_side(sizes.iter().map(|&size| VmmAllocation::create(&ctx, size).unwrap()).collect())
            .unwrap();
    let total: u64 = sizes.iter().sum();
    assert_eq!((exporter.size(), exporter.span().len()), (total, total));
    let offsets: Vec<u64> = exporter.allocations().map(|(offset, _)| offset).collect();
    assert_eq!(offsets, [0, g, 3 * g]);
    // The driver reports each allocation's own range, wherever in it it is asked.
    for (offset, size) in [(0, g), (g, 2 * g), (3 * g, g)] {
        for probe in [offset, offset + size / 2, offset + size - 1] {
            assert_eq!(address_range(exporter.ptr().offset(probe)).unwrap(), (exporter.ptr().offset(offset), size));
        }
    }
    let data: Vec<u64> = (0..total / 8).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
    exporter.span().write(0, &data).unwrap();
    // Each allocation exported once (retained by address, as export_existing does), imported and mapped side by
    // side again: the same bytes at the same offsets, across both boundaries.
    let imported = exporter
        .allocations()
        .map(|(offset, allocation)| {
            let retained = VmmAllocation::retain(&ctx, exporter.ptr().offset(offset), allocation.size()).unwrap();
            let fd = retained.export_fd().unwrap();
            VmmAllocation::import_fd(&ctx, std::os::fd::AsFd::as_fd(&fd), allocation.size()).unwrap()
        })
        .collect();
    let importer = VmmMapping::map_side_by_side(imported).unwrap();
    assert_ne!(importer.ptr(), exporter.ptr());
    let mut back = vec![0u64; data.len()];
    importer.span().read(0, &mut back).unwrap();
    assert_eq!(back, data);
    // The importer's mapping outlives the exporter's.
    drop(exporter);
    importer.span().read(0, &mut back).unwrap();
    assert_eq!(back, data);
    // Nothing to map is refused before the driver is called.
    assert!(VmmMapping::map_side_by_side(Vec::new()).is_err());
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
