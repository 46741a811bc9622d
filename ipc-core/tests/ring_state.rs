//! Single-process tests of the ring control block: layout, back-pressure, late join, detach, dead peers, waits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ipc_core::ring::layout::{ConsumerState, LAYOUT_1_MAX_SLOTS, MAX_CONSUMERS, MAX_SLOTS, RingLayout, state_word};
use ipc_core::ring::{
    ConsumerControl, ConsumerId, ControlBlock, GoneReason, LivenessPolicy, POISON, ProducerControl, ReleaseRequirement,
    RingConfig, RingError, Sequence, SlotIndex, WaitMode, WaitTarget,
};
use ipc_core::shm::{SharedMemory, ShmError};
use rustix::process::getpid;

fn producer(slots: u32, consumers: u32) -> ProducerControl {
    let config = RingConfig { slot_count: slots, max_consumers: consumers, generation: 7 };
    ProducerControl::create(config, LivenessPolicy::default()).unwrap()
}

fn attach(producer: &ProducerControl, id: ConsumerId) -> ConsumerControl {
    let fd = producer.block().memory().try_clone_fd().unwrap();
    ConsumerControl::attach(fd, id, LivenessPolicy::default()).unwrap()
}

fn join_consumer(producer: &ProducerControl) -> ConsumerControl {
    let id = producer.register_consumer(getpid()).unwrap();
    attach(producer, id)
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
fn offsets_are_aligned_and_hot_counters_own_their_lines() {
    // Version 1: every per-frame counter alone on a 128-byte line, whoever writes it.
    let producer = producer(LAYOUT_1_MAX_SLOTS, MAX_CONSUMERS);
    let block = producer.block();
    let layout = block.layout();
    assert_eq!(layout, RingLayout::V1);
    let base = block.memory().as_ptr() as usize;
    assert_eq!(base % 4096, 0, "mapping page aligned");
    assert_eq!(block.memory().len(), 131_072);
    let addr = |counter: &AtomicU64| counter as *const AtomicU64 as usize - base;

    let mut hot = vec![
        (layout.next_sequence_offset(), addr(block.next_sequence_counter())),
        (layout.producer_heartbeat_offset(), addr(block.producer_heartbeat_ns())),
    ];
    for slot in 0..LAYOUT_1_MAX_SLOTS {
        hot.push((layout.published_offset(SlotIndex(slot)), addr(block.published(SlotIndex(slot)))));
    }
    for consumer in 0..MAX_CONSUMERS {
        let record = block.record_at(consumer).unwrap();
        hot.push((layout.consumer_heartbeat_offset(consumer), addr(record.heartbeat_ns())));
        for slot in 0..LAYOUT_1_MAX_SLOTS {
            let offset = layout.released_offset(consumer, SlotIndex(slot));
            hot.push((offset, addr(record.released(SlotIndex(slot)))));
        }
        assert_eq!(layout.consumer_state_offset(consumer), addr(record.state()));
        assert_eq!(layout.consumer_state_offset(consumer) % 128, 0);
    }
    assert_eq!(layout.producer_state_offset(), addr(block.producer_state()));
    assert_eq!(hot.len(), 2 + 32 + 16 * 33);

    let mut lines_64 = HashSet::new();
    let mut lines_128 = HashSet::new();
    for (offset, actual) in &hot {
        assert_eq!(offset, actual, "offset function disagrees with the block's accessor");
        assert_eq!(offset % 8, 0);
        assert!(offset + 8 <= 131_072);
        assert!(lines_64.insert(offset / 64), "offset {offset} shares a 64-byte line");
        assert!(lines_128.insert(offset / 128), "offset {offset} shares a 128-byte line");
    }
    // Spot values that the documentation's offset table states.
    assert_eq!(layout.next_sequence_offset(), 256);
    assert_eq!(layout.published_offset(SlotIndex(1)), 512);
    assert_eq!(layout.released_offset(0, SlotIndex(0)), 4736);
    assert_eq!(layout.released_offset(1, SlotIndex(2)), 4480 + 4352 + 256 + 2 * 128);
}

#[test]
fn a_ring_of_more_than_32_slots_uses_layout_2_and_packs_each_writers_counters() {
    for slots in [33, 64, 128, MAX_SLOTS] {
        let producer = producer(slots, MAX_CONSUMERS);
        let block = producer.block();
        let layout = block.layout();
        assert_eq!(layout, RingLayout::V2, "{slots} slots");
        assert_eq!(block.memory().len(), 65_536);
        let base = block.memory().as_ptr() as usize;
        let addr = |counter: &AtomicU64| counter as *const AtomicU64 as usize - base;
        for slot in [0, 1, slots - 1] {
            assert_eq!(addr(block.published(SlotIndex(slot))), 384 + 8 * slot as usize);
            for consumer in [0, 1, MAX_CONSUMERS - 1] {
                let record = block.record_at(consumer).unwrap();
                let offset = 2432 + 2304 * consumer as usize + 256 + 8 * slot as usize;
                assert_eq!(layout.released_offset(consumer, SlotIndex(slot)), offset);
                assert_eq!(addr(record.released(SlotIndex(slot))), offset);
                assert_eq!(addr(record.state()), 2432 + 2304 * consumer as usize);
                assert_eq!(addr(record.heartbeat_ns()), 2432 + 2304 * consumer as usize + 128);
            }
        }
        // The header words are where version 1 has them; only the version and the size differ.
        let header: Vec<u64> = (0..8).map(|w| block.counter(8 * w).unwrap().load(Ordering::SeqCst)).collect();
        assert_eq!(header[1..5], [2, 65_536, u64::from(slots), u64::from(MAX_CONSUMERS)]);
        // A consumer attaches to it as to any ring.
        let fd = block.memory().try_clone_fd().unwrap();
        let attached = ControlBlock::attach(fd).unwrap();
        assert_eq!((attached.layout(), attached.slot_count()), (RingLayout::V2, slots));
    }
}

#[test]
fn attach_refuses_a_block_whose_header_disagrees_with_its_size() {
    // A version-2 block whose header says version 1 (or an unknown version) is refused before anything is read.
    let producer = producer(64, 2);
    let version = producer.block().counter(8).unwrap();
    version.store(1, Ordering::SeqCst);
    let err = ControlBlock::attach(producer.block().memory().try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, RingError::Corrupt { what: "total_bytes", .. }), "{err}");
    version.store(9, Ordering::SeqCst);
    let err = ControlBlock::attach(producer.block().memory().try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, RingError::LayoutVersion { found: 9, newest: 2 }), "{err}");
    assert!(err.to_string().contains("layout version 9"), "{err}");
    // A version-2 header with more slots than version 1 holds, in a block of version 1's size.
    let shallow = self::producer(4, 2);
    shallow.block().counter(8).unwrap().store(2, Ordering::SeqCst);
    let err = ControlBlock::attach(shallow.block().memory().try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, RingError::Corrupt { what: "total_bytes", value: 131_072 }), "{err}");
}

#[test]
fn header_is_initialised_and_attach_validates() {
    let producer = producer(4, 3);
    let fd = producer.block().memory().try_clone_fd().unwrap();
    let block = ControlBlock::attach(fd).unwrap();
    assert_eq!(block.slot_count(), 4);
    assert_eq!(block.max_consumers(), 3);
    assert_eq!(block.generation(), 7);
    assert_eq!(block.producer_pid(), getpid().as_raw_pid() as u64);
    assert_eq!(block.next_sequence(), Sequence(0));

    let blank = SharedMemory::create("blank", RingLayout::V1.block_bytes()).unwrap();
    let err = ControlBlock::attach(blank.try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, RingError::BadMagic { found: 0 }), "{err}");

    let small = SharedMemory::create("small", 4096).unwrap();
    let err = ControlBlock::attach(small.try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, RingError::Shm(ShmError::SizeMismatch { actual: 4096, .. })), "{err}");

    let bad = RingConfig { slot_count: MAX_SLOTS + 1, max_consumers: 1, generation: 0 };
    let err = ProducerControl::create(bad, LivenessPolicy::default()).unwrap_err();
    assert!(matches!(err, RingError::InvalidConfig { what: "slot_count", value: 257, max: 256 }), "{err}");
}

#[test]
fn one_consumer_back_pressure() {
    let producer = producer(4, 2);
    let consumer = join_consumer(&producer);
    assert_eq!(consumer.join_sequence(), Sequence(0));
    for s in 0..4 {
        assert!(producer.can_reuse(Sequence(s)).unwrap(), "fresh slot {s}");
        producer.publish(Sequence(s)).unwrap();
    }
    assert_eq!(producer.block().next_sequence(), Sequence(4));
    assert!(!producer.can_reuse(Sequence(4)).unwrap(), "frame 0 not released yet");
    let mut pending = Vec::new();
    producer.pending_releases(Sequence(5), &mut pending).unwrap();
    assert_eq!(
        pending,
        vec![ReleaseRequirement {
            consumer: consumer.id(),
            slot: SlotIndex(1),
            offset: RingLayout::V1.released_offset(consumer.id().index(), SlotIndex(1)),
            at_least: 2,
        }]
    );

    assert!(consumer.is_published(Sequence(0)).unwrap());
    assert!(!consumer.is_published(Sequence(4)).unwrap());
    consumer.release(Sequence(0)).unwrap();
    assert!(producer.can_reuse(Sequence(4)).unwrap());
    assert!(!producer.can_reuse(Sequence(5)).unwrap());
    producer.publish(Sequence(4)).unwrap();
    assert!(consumer.is_published(Sequence(4)).unwrap());
    assert_eq!(producer.block().published(SlotIndex(0)).load(Ordering::SeqCst), 5);
    // Frame 0's slot now holds frame 4: asking for frame 0 again is an overrun, not a stale "yes".
    let err = consumer.is_published(Sequence(0)).unwrap_err();
    assert!(matches!(err, RingError::Overrun { found: 5, .. }), "{err}");

    let err = producer.publish(Sequence(9)).unwrap_err();
    assert!(matches!(err, RingError::OutOfOrder { expected: Sequence(5), got: Sequence(9) }), "{err}");
}

/// Simulates a producer and `consumers` consumers that each release at their own pace, and checks at every step
/// that the producer never gets more than N frames ahead of the slowest consumer and that each reader sees the
/// frame it expects in the slot.
fn run_paced(consumers: u32, slots: u32, frames: u64) {
    let producer = producer(slots, consumers);
    let readers: Vec<ConsumerControl> = (0..consumers).map(|_| join_consumer(&producer)).collect();
    let mut data = vec![u64::MAX; slots as usize];
    let mut next_read = vec![0u64; consumers as usize];
    let mut next_write = 0u64;
    let mut step = 0u64;
    while next_read.iter().copied().min().unwrap_or(0) < frames {
        step += 1;
        assert!(step < frames * 64, "no progress");
        let seq = Sequence(next_write);
        if next_write < frames && producer.can_reuse(seq).unwrap() {
            data[producer.slot_for(seq).0 as usize] = next_write;
            producer.publish(seq).unwrap();
            next_write += 1;
        }
        let slowest = next_read.iter().copied().min().unwrap_or(0);
        assert!(next_write - slowest <= u64::from(slots), "producer ran more than N ahead");
        for (i, reader) in readers.iter().enumerate() {
            // Consumer i acts every (i + 1)-th step.
            if !step.is_multiple_of(i as u64 + 1) || next_read[i] >= frames {
                continue;
            }
            let seq = Sequence(next_read[i]);
            if reader.is_published(seq).unwrap() {
                assert_eq!(data[reader.block().slot_for(seq).0 as usize], seq.0, "consumer {i} read wrong frame");
                reader.release(seq).unwrap();
                next_read[i] += 1;
            }
        }
    }
    assert_eq!(next_write, frames);
    assert!(next_read.iter().all(|&n| n == frames));
}

#[test]
fn paced_consumers_1_2_and_8() {
    run_paced(1, 2, 300);
    run_paced(2, 3, 300);
    run_paced(8, 4, 300);
    run_paced(16, 8, 200);
}

#[test]
fn late_joiner_does_not_block_earlier_frames() {
    let producer = producer(4, 4);
    let early = join_consumer(&producer);
    for s in 0..10 {
        producer.wait_reusable(Sequence(s), soon(), WaitMode::Spin).unwrap();
        producer.publish(Sequence(s)).unwrap();
        early.release(Sequence(s)).unwrap();
    }
    let late = join_consumer(&producer);
    assert_eq!(late.join_sequence(), Sequence(10));
    let err = late.is_published(Sequence(9)).unwrap_err();
    assert!(matches!(err, RingError::BeforeJoin { join: Sequence(10), .. }), "{err}");
    // Frames 10..13 reuse slots of frames 6..9, which the late joiner never reads.
    for s in 10..14 {
        assert!(producer.can_reuse(Sequence(s)).unwrap(), "frame {s}");
        producer.publish(Sequence(s)).unwrap();
        early.release(Sequence(s)).unwrap();
    }
    assert!(!producer.can_reuse(Sequence(14)).unwrap(), "late joiner must release frame 10 first");
    let mut pending = Vec::new();
    producer.pending_releases(Sequence(14), &mut pending).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].consumer, late.id());
    assert_eq!(pending[0].at_least, 11);
    assert!(late.is_published(Sequence(10)).unwrap());
    late.release(Sequence(10)).unwrap();
    assert!(producer.can_reuse(Sequence(14)).unwrap());
}

#[test]
fn joining_record_holds_back_reuse() {
    let producer = producer(2, 2);
    producer.publish(Sequence(0)).unwrap();
    producer.publish(Sequence(1)).unwrap();
    // A registration caught between its claim and its join decision.
    let record = producer.block().record_at(1).unwrap();
    record.state().store(state_word(1, ConsumerState::Joining), Ordering::SeqCst);
    assert!(!producer.can_reuse(Sequence(2)).unwrap());
    let err = producer.pending_releases(Sequence(2), &mut Vec::new()).unwrap_err();
    assert!(matches!(err, RingError::JoinInProgress { index: 1 }), "{err}");
    record.state().store(state_word(1, ConsumerState::Free), Ordering::SeqCst);
    assert!(producer.can_reuse(Sequence(2)).unwrap());
}

#[test]
fn detach_stops_counting_and_record_is_reclaimed() {
    let producer = producer(2, 1);
    let consumer = join_consumer(&producer);
    let id = consumer.id();
    producer.publish(Sequence(0)).unwrap();
    producer.publish(Sequence(1)).unwrap();
    assert!(!producer.can_reuse(Sequence(2)).unwrap());
    consumer.detach().unwrap();
    assert!(producer.can_reuse(Sequence(2)).unwrap());
    assert_eq!(producer.block().consumer_state(0), Some((ConsumerState::Detached, id.epoch())));
    let record = producer.block().record_at(0).unwrap();
    assert_eq!(record.released(SlotIndex(0)).load(Ordering::SeqCst), POISON);
    assert_eq!(record.released(SlotIndex(1)).load(Ordering::SeqCst), POISON);

    let err = producer.register_consumer(getpid()).unwrap_err();
    assert!(matches!(err, RingError::RingFull { max_consumers: 1, reclaimable: 1 }), "{err}");
    producer.reclaim_consumer(id).unwrap();
    let again = producer.register_consumer(getpid()).unwrap();
    assert_eq!(again.index(), 0);
    assert_eq!(again.epoch(), id.epoch() + 1);
    assert_eq!(record.released(SlotIndex(0)).load(Ordering::SeqCst), 0, "counters reset for the new owner");
    assert_eq!(ConsumerId::from_u64(again.to_u64()), again);

    // The old id is refused everywhere instead of acting on the newcomer.
    let fd = producer.block().memory().try_clone_fd().unwrap();
    let err = ConsumerControl::attach(fd, id, LivenessPolicy::default()).unwrap_err();
    assert!(matches!(err, RingError::NotLive { found: Some(ConsumerState::Live), .. }), "{err}");
    assert!(producer.mark_consumer_dead(id).is_err());
    assert_eq!(producer.block().consumer_state(0), Some((ConsumerState::Live, again.epoch())));
}

#[test]
fn dropping_a_consumer_detaches_it() {
    let producer = producer(2, 1);
    let id = {
        let consumer = join_consumer(&producer);
        consumer.id()
    };
    assert_eq!(producer.block().consumer_state(0), Some((ConsumerState::Detached, id.epoch())));
}

#[test]
fn dead_consumer_stops_counting_and_is_poisoned() {
    let producer = producer(2, 3);
    let alive = join_consumer(&producer);
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = exited.id();
    exited.wait().unwrap();
    let dead = producer.register_consumer(rustix::process::Pid::from_raw(dead_pid as i32).unwrap()).unwrap();
    for s in 0..2 {
        producer.publish(Sequence(s)).unwrap();
        alive.release(Sequence(s)).unwrap();
    }
    assert!(!producer.can_reuse(Sequence(2)).unwrap(), "the dead one still counts until marked");
    let err = producer.wait_reusable(Sequence(2), soon(), WaitMode::Sleep(Duration::from_micros(200)));
    match err {
        Err(RingError::ConsumerGone { consumer, pid, reason: GoneReason::ProcessExited }) => {
            assert_eq!(consumer, dead);
            assert_eq!(pid, u64::from(dead_pid));
        }
        other => panic!("expected ConsumerGone, got {other:?}"),
    }
    producer.mark_consumer_dead(dead).unwrap();
    producer.mark_consumer_dead(dead).unwrap(); // idempotent
    assert!(producer.can_reuse(Sequence(2)).unwrap());
    let record = producer.block().record_at(dead.index()).unwrap();
    assert_eq!(record.released(SlotIndex(0)).load(Ordering::SeqCst), POISON);
    producer.check_consumers().unwrap();
    // A consumer declared dead that wakes up is told so, and cannot lower the poison.
    let zombie = attach(&producer, alive.id());
    producer.mark_consumer_dead(alive.id()).unwrap();
    let err = zombie.release(Sequence(1)).unwrap_err();
    assert!(matches!(err, RingError::NotLive { found: Some(ConsumerState::Dead), .. }), "{err}");
}

/// The survivor's abort words (docs/frames.md, "Kills under MPS"): kernels a dead peer launched on the ring watch them.
#[test]
fn a_peer_declared_dead_gets_its_kernel_abort_word_raised_and_a_newcomer_finds_it_lowered() {
    for slots in [4, 64] {
        let producer = producer(slots, 2);
        let layout = producer.block().layout();
        let a = join_consumer(&producer);
        let b = join_consumer(&producer);
        let word = |index: u32| {
            producer.block().memory().words(layout.kernel_abort_offset(index) / 8, 1).unwrap()[0]
                .load(Ordering::Acquire)
        };
        assert_eq!((word(0), word(1)), (0, 0));
        let dead = a.id();
        producer.mark_consumer_dead(dead).unwrap();
        assert_eq!((word(0), word(1)), (1, 0), "only the dead consumer's word is raised");
        assert_eq!(producer.block().record_at(0).unwrap().kernel_abort().load(Ordering::Acquire), 1);
        drop(a);
        producer.reclaim_consumer(dead).unwrap();
        // The record's next owner starts with the word lowered, or its kernels would leave at once.
        let c = join_consumer(&producer);
        assert_eq!(c.id().index(), 0);
        assert_eq!(word(0), 0);
        // The producer's word, in the header: a consumer raises it when it sees the producer's process gone.
        let header = |block: &ControlBlock| block.producer_kernel_abort().load(Ordering::Acquire);
        assert_eq!(header(producer.block()), 0);
        b.raise_producer_kernel_abort();
        assert_eq!(header(producer.block()), 1);
        let raw = producer.block().memory().words(layout.producer_kernel_abort_offset() / 8, 1).unwrap()[0]
            .load(Ordering::Acquire);
        assert_eq!(raw, 1, "at the offset the layout names");
    }
}

#[test]
fn sequences_beyond_u32() {
    let producer = producer(3, 2);
    let start = (1u64 << 32) + 5;
    // Stand in for a producer that has already run for 2^32 frames.
    producer.block().next_sequence_counter().store(start, Ordering::SeqCst);
    let consumer = join_consumer(&producer);
    assert_eq!(consumer.join_sequence(), Sequence(start));
    for s in start..start + 10 {
        producer.wait_reusable(Sequence(s), soon(), WaitMode::Spin).unwrap();
        producer.publish(Sequence(s)).unwrap();
        assert!(consumer.is_published(Sequence(s)).unwrap());
        let slot = producer.slot_for(Sequence(s));
        assert_eq!(slot, SlotIndex((s % 3) as u32));
        assert_eq!(producer.block().published(slot).load(Ordering::SeqCst), s + 1);
        consumer.release(Sequence(s)).unwrap();
    }
    assert!(start + 10 > u64::from(u32::MAX));
    assert_eq!(producer.block().next_sequence(), Sequence(start + 10));
}

#[test]
fn waits_are_bounded_and_report_why() {
    let producer = producer(2, 1);
    let consumer = join_consumer(&producer);
    for mode in [WaitMode::Spin, WaitMode::Sleep(Duration::from_millis(2))] {
        let begin = Instant::now();
        let err = consumer.wait_published(Sequence(0), begin + Duration::from_millis(30), mode).unwrap_err();
        match err {
            RingError::Timeout { waiting_for, waited } => {
                assert_eq!(waiting_for, WaitTarget::Published(Sequence(0)));
                // `waited` counts from inside the call; the deadline counts from `begin`, a moment earlier.
                assert!(begin.elapsed() >= Duration::from_millis(30), "{:?}", begin.elapsed());
                assert!(waited >= Duration::from_millis(25), "{waited:?}");
                assert!(waited < Duration::from_secs(2), "{waited:?}");
            }
            other => panic!("expected Timeout, got {other:?}"),
        }
    }
    producer.publish(Sequence(0)).unwrap();
    producer.publish(Sequence(1)).unwrap();
    let err =
        producer.wait_reusable(Sequence(2), Instant::now() + Duration::from_millis(10), WaitMode::Spin).unwrap_err();
    assert!(matches!(err, RingError::Timeout { waiting_for: WaitTarget::Reusable(Sequence(2)), .. }), "{err}");

    // Closing: frames already published are still delivered, then ProducerGone.
    producer.close();
    consumer.wait_published(Sequence(1), soon(), WaitMode::Spin).unwrap();
    consumer.release(Sequence(0)).unwrap();
    consumer.release(Sequence(1)).unwrap();
    let err = consumer.wait_published(Sequence(2), soon(), WaitMode::Spin).unwrap_err();
    assert!(matches!(err, RingError::ProducerGone { reason: GoneReason::Closed, .. }), "{err}");
}

#[test]
fn poison_releases_everyone() {
    let producer = producer(2, 2);
    let consumer = join_consumer(&producer);
    consumer.poison_published();
    assert_eq!(producer.block().published(SlotIndex(1)).load(Ordering::SeqCst), POISON);
    let err = consumer.is_published(Sequence(0)).unwrap_err();
    assert!(matches!(err, RingError::ProducerGone { reason: GoneReason::Poisoned, .. }), "{err}");
    // A producer that was only presumed dead learns it from publish, and cannot lower the poison.
    let err = producer.publish(Sequence(0)).unwrap_err();
    assert!(matches!(err, RingError::ProducerGone { reason: GoneReason::Poisoned, .. }), "{err}");
    assert_eq!(producer.block().published(SlotIndex(0)).load(Ordering::SeqCst), POISON);
}

#[test]
fn poisoning_keeps_which_frames_the_producer_published_for_every_consumer() {
    let producer = producer(2, 2);
    let (a, b) = (join_consumer(&producer), join_consumer(&producer));
    for seq in 0..3 {
        producer.publish(Sequence(seq)).unwrap();
        a.release(Sequence(seq)).unwrap();
        b.release(Sequence(seq)).unwrap();
    }
    assert_eq!(a.highest_published(), Some(2));
    // The first consumer to see the producer gone poisons; the second still reads the truth.
    a.poison_published();
    b.poison_published();
    assert_eq!(b.highest_published(), Some(2));
    assert!(matches!(b.is_published(Sequence(3)), Err(RingError::ProducerGone { .. })));
}

#[test]
fn stale_heartbeat_means_gone() {
    let producer = producer(2, 1);
    let id = producer.register_consumer(getpid()).unwrap();
    let policy = LivenessPolicy { heartbeat_timeout: Some(Duration::from_millis(20)), ..LivenessPolicy::default() };
    let fd = producer.block().memory().try_clone_fd().unwrap();
    let consumer = ConsumerControl::attach(fd, id, policy).unwrap();
    consumer.check_producer().unwrap();
    std::thread::sleep(Duration::from_millis(40));
    match consumer.check_producer() {
        Err(RingError::ProducerGone { reason: GoneReason::HeartbeatStale { age }, .. }) => {
            assert!(age >= Duration::from_millis(40), "{age:?}")
        }
        other => panic!("expected stale heartbeat, got {other:?}"),
    }
    producer.heartbeat();
    consumer.check_producer().unwrap();
}

#[test]
fn threads_share_frames_through_the_ring() {
    const FRAMES: u64 = 2_000;
    const SLOTS: u32 = 4;
    let producer = producer(SLOTS, 8);
    let data: Vec<AtomicU64> = (0..SLOTS).map(|_| AtomicU64::new(u64::MAX)).collect();
    let readers: Vec<ConsumerControl> = (0..8).map(|_| join_consumer(&producer)).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = readers
            .iter()
            .enumerate()
            .map(|(i, reader)| {
                let data = &data;
                scope.spawn(move || {
                    let mode = if i < 2 { WaitMode::Spin } else { WaitMode::Sleep(Duration::from_micros(50)) };
                    let mut sum = 0u64;
                    for s in 0..FRAMES {
                        reader.wait_published(Sequence(s), soon(), mode).unwrap();
                        let slot = reader.block().slot_for(Sequence(s)).0 as usize;
                        let value = data[slot].load(Ordering::Relaxed);
                        assert_eq!(value, s, "consumer {i} frame {s}");
                        sum += value;
                        reader.release(Sequence(s)).unwrap();
                    }
                    sum
                })
            })
            .collect();
        for s in 0..FRAMES {
            producer.wait_reusable(Sequence(s), soon(), WaitMode::Spin).unwrap();
            data[producer.slot_for(Sequence(s)).0 as usize].store(s, Ordering::Relaxed);
            producer.publish(Sequence(s)).unwrap();
        }
        for handle in handles {
            assert_eq!(handle.join().unwrap(), FRAMES * (FRAMES - 1) / 2);
        }
    });
}
