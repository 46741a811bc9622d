//! The reader's stream gate on the host backend (no stream: [`WeightsReader::watch`] arms the same gate and word
//! that [`WeightsReader::wait_on`] makes a stream wait on): released by a publication, by the owner's end, by the
//! reader's close; and the errors. The stream waits themselves: `examples/tests/gpu_weights.rs` on a GPU.

use std::time::{Duration, Instant};

use super::tests::{open, publish, sock, tensors};
use super::*;
use ipc_core::host::{Host, HostContext};

/// Polls `wait`'s status (`status`: a reader's `wait_status`) until it is no longer `Waiting` (at most `within`);
/// returns it and the time it took.
pub(super) fn released_within(
    status: impl Fn(&GenerationWait) -> GenerationWaitStatus,
    wait: &GenerationWait,
    within: Duration,
) -> (GenerationWaitStatus, Duration) {
    let started = Instant::now();
    loop {
        let status = status(wait);
        if status != GenerationWaitStatus::Waiting {
            return (status, started.elapsed());
        }
        assert!(started.elapsed() < within, "the wait for {} was not released within {within:?}", wait.generation());
        std::thread::yield_now();
    }
}

fn owner(name: &str) -> WeightsOwner<Host> {
    let mut owner =
        WeightsOwner::<Host>::create(&HostContext, sock(name), "model", tensors(), WeightsOptions::default()).unwrap();
    publish(&mut owner);
    owner
}

#[test]
fn a_wait_armed_before_the_next_generation_is_released_by_its_publication() {
    let mut owner = owner("gate-publish");
    let reader = open(&owner.path().to_path_buf(), "model");
    let wait = reader.watch(2).unwrap();
    assert_eq!(wait.generation(), 2);
    assert_ne!(wait.status_word().raw(), 0);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(reader.wait_status(&wait), GenerationWaitStatus::Waiting);
    let word = wait.status_word().raw();
    assert_eq!(publish(&mut owner), 2);
    let (status, took) = released_within(|w| reader.wait_status(w), &wait, Duration::from_secs(1));
    eprintln!("released {took:?} after the publication");
    assert_eq!(status, GenerationWaitStatus::Published { newest: 2 });
    // One word per reader, whatever the wait; an old generation is released at once.
    let again = reader.watch(1).unwrap();
    assert_eq!(again.status_word().raw(), word);
    assert_eq!(reader.wait_status(&again), GenerationWaitStatus::Published { newest: 2 });
}

#[test]
fn a_wait_pending_when_the_owner_closes_is_released_as_gone_within_a_second() {
    let owner = owner("gate-gone");
    let reader = open(&owner.path().to_path_buf(), "model");
    let waits = [reader.watch(2).unwrap(), reader.watch(5).unwrap()];
    std::thread::sleep(Duration::from_millis(10));
    drop(owner);
    let closed = Instant::now();
    for wait in &waits {
        let (status, _) = released_within(|w| reader.wait_status(w), wait, Duration::from_secs(1));
        assert_eq!(status, GenerationWaitStatus::OwnerGone { newest: 1 });
        assert_eq!(wait.status_of(GONE_BIT | 1), status);
    }
    eprintln!("released as gone {:?} after the owner closed", closed.elapsed());
    assert!(matches!(reader.watch(3), Err(WeightsError::OwnerGone { .. })));
}

#[test]
fn a_reader_closed_with_a_pending_wait_releases_it_and_does_not_hang() {
    let owner = owner("gate-close");
    let reader = open(&owner.path().to_path_buf(), "model");
    let wait = reader.watch(9).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let started = Instant::now();
    drop(reader);
    assert!(started.elapsed() < Duration::from_millis(500), "closing took {:?}", started.elapsed());
    // The wait keeps the word: it says gone (nothing will move it any more), never a freed word.
    assert_eq!(wait.word().load(), GONE_BIT | 1);
    assert_eq!(wait.status_of(wait.word().load()), GenerationWaitStatus::OwnerGone { newest: 1 });
}

#[test]
fn stream_waits_need_a_gpu_backend_and_a_real_generation() {
    let owner = owner("gate-errors");
    let reader = open(&owner.path().to_path_buf(), "model");
    for bad in [0, MAX_GENERATION + 1, u64::MAX] {
        let err = reader.watch(bad).unwrap_err();
        assert!(matches!(&err, WeightsError::Invalid(m) if m.contains("generations run from 1")), "{bad}: {err}");
    }
    // The host backend's word is host memory, readable here; a stream wait needs CUDA.
    let wait = reader.watch(1).unwrap();
    assert_eq!(reader.wait_status(&wait), GenerationWaitStatus::Published { newest: 1 });
    let err = format!("{}", WeightsError::NoCudaContext { set: "model".into() });
    assert!(err.contains("GPU backend") && err.contains("wait_for"), "{err}");
}
