//! Criterion micro-benchmarks of the host-side per-frame paths (no GPU needed): what the CPU strategies pay per
//! frame in the control block, what a handshake pays to encode and decode its offer, and the host reference of
//! the frame pattern. GPU-side figures come from `gpu_memory` and `gpu_signal` (run on the GPU machine by
//! `scripts/bench-gpu.sh`) and from `gpu-ipc bench pipeline`; see docs/benchmarks.md.

#![forbid(unsafe_code)]
// Only ipc-core's driver and sys layers may contain `unsafe`.
// Benches may panic on setup failure: there is nobody to report an error to.
#![allow(clippy::expect_used)]
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_ipc_driver::DeviceUuid;
use gpu_ipc_kernels::pattern::fill_pattern_host;
use ipc_core::ring::{ConsumerControl, LivenessPolicy, ProducerControl, RingConfig, Sequence};
use ipc_core::wire::{BackendKind, FrameGeometry, Message, PixelFormat, RingOffer, SyncStrategy};

fn ring_cycle(c: &mut Criterion) {
    let producer = ProducerControl::create(
        RingConfig { slot_count: 4, max_consumers: 2, generation: 1 },
        LivenessPolicy::default(),
    )
    .expect("control block");
    let id = producer.register_consumer(rustix::process::getpid()).expect("register");
    let fd = producer.block().memory().try_clone_fd().expect("dup");
    let consumer = ConsumerControl::attach(fd, id, LivenessPolicy::default()).expect("attach");
    let mut seq = 0u64;
    c.bench_function("ring: reuse check + publish + is_published + release (one frame, one consumer)", |b| {
        b.iter(|| {
            let s = Sequence(seq);
            assert!(producer.can_reuse(s).expect("reuse"));
            producer.publish(s).expect("publish");
            assert!(consumer.is_published(s).expect("published"));
            consumer.release(s).expect("release");
            seq += 1;
        });
    });
}

fn offer() -> RingOffer {
    RingOffer {
        backend: BackendKind::Vmm,
        handle_type: BackendKind::Vmm.handle_type(),
        sync: SyncStrategy::GpuStreamOps,
        device_uuid: DeviceUuid([7; 16]),
        producer_pid: 42,
        generation: 1,
        consumer_id: 0,
        slot_layout: FrameGeometry::new(3840, 2160, PixelFormat::Rgb8).expect("geometry").into(),
        slot_count: 4,
        slot_stride_bytes: 24_883_200,
        data_offset: 0,
        allocation_bytes: 100 << 20,
        granularity: 2 << 20,
        control_bytes: 131_072,
        legacy_mem_handle: None,
        event_handles: Vec::new(),
    }
}

fn wire(c: &mut Criterion) {
    let message = Message::RingOffer(offer());
    let bytes = message.encode().expect("encode");
    c.bench_function("wire: encode a RingOffer", |b| b.iter(|| black_box(&message).encode().expect("encode")));
    c.bench_function("wire: decode a RingOffer", |b| b.iter(|| Message::decode(black_box(&bytes)).expect("decode")));
}

fn pattern(c: &mut Criterion) {
    let mut frame = vec![0u32; 3840 * 2160 * 3 / 4];
    c.bench_function("pattern: host reference fill of one 4K RGB frame", |b| {
        b.iter(|| fill_pattern_host(black_box(&mut frame), 7));
    });
}

criterion_group!(benches, ring_cycle, wire, pattern);
criterion_main!(benches);
