//! The stale-poison race (issue 9, defect 1), as a bounded stress test: a watchdog that keeps re-poisoning a dead
//! consumer's `released` counters must never poison the consumer that takes the record next.
//!
//! One thread plays the watchdog (re-poisons the dead consumer's record in a tight loop, far more often than the
//! real watchdog's 1 ms, to make the window easy to hit); the main thread declares consumers dead, frees their
//! record and registers the next consumer in it, then checks that the new consumer's counters are clean.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipc_core::ring::layout::{ConsumerState, LAYOUT_1_MAX_SLOTS, state_word};
use ipc_core::ring::{ConsumerId, LivenessPolicy, POISON, ProducerControl, RingConfig};
use rustix::process::getpid;

#[test]
fn a_repoisoned_dead_record_never_poisons_its_next_owner() {
    // 32 slots: each cycle resets and poisons every counter of the record, so deeper rings only slow the loop down.
    let config = RingConfig { slot_count: LAYOUT_1_MAX_SLOTS, max_consumers: 1, generation: 3 };
    let ring = Arc::new(ProducerControl::create(config, LivenessPolicy::default()).unwrap());
    let dead: Arc<Mutex<Option<ConsumerId>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let repoisons = Arc::new(AtomicU64::new(0));
    let watchdog = {
        let (ring, dead, stop, repoisons) = (ring.clone(), dead.clone(), stop.clone(), repoisons.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let id = *dead.lock().unwrap();
                if let Some(id) = id {
                    ring.repoison_released(id).unwrap();
                    repoisons.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    let budget = Duration::from_secs(2);
    let start = Instant::now();
    let (mut cycles, mut poisoned) = (0u64, 0u64);
    while start.elapsed() < budget && cycles < 2_000_000 {
        let id = ring.register_consumer(getpid()).unwrap();
        let record = ring.block().record_at(id.index()).unwrap();
        // Its counters start clean and nobody may touch them while it is live and has released nothing.
        for _ in 0..8 {
            std::hint::spin_loop();
        }
        if record.released_counters().any(|c| c.load(Ordering::Acquire) == POISON) {
            poisoned += 1;
        }
        assert_eq!(record.state().load(Ordering::Acquire), state_word(id.epoch(), ConsumerState::Live));
        ring.mark_consumer_dead(id).unwrap();
        // The watchdog now re-poisons `id` until told otherwise; the record is freed at once.
        *dead.lock().unwrap() = Some(id);
        ring.reclaim_consumer(id).unwrap();
        cycles += 1;
    }
    stop.store(true, Ordering::Relaxed);
    watchdog.join().unwrap();
    println!("{cycles} cycles, {} repoisons, {poisoned} new owners poisoned", repoisons.load(Ordering::Relaxed));
    assert!(cycles > 10_000, "the stress loop ran only {cycles} cycles");
    assert_eq!(poisoned, 0, "{poisoned} of {cycles} new consumers got a stale poison");
}
