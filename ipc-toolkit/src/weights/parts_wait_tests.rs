//! A set of parts' stream gates on the host backend (no stream: [`WeightsPartsReader::watch`] arms the gate and word
//! that [`WeightsPartsReader::wait_on`] makes a stream wait on): every part's word follows the set's generation
//! (part 0's, never a part ahead of it), is released by a publication, by the owner's end seen on any part, by the
//! reader's close, and never goes backwards. The stream waits themselves: `examples/tests/gpu_weights_parts_wait.rs`
//! on a GPU.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::gate::GateSource;
use super::parts_tests::{make, open, publish, spread};
use super::parts_wait::PartsSource;
use super::stream_wait_tests::released_within;
use super::*;
use crate::pool::{AttachOptions, PoolImporter};
use ipc_core::host::{Host, HostContext};

/// A set of `n` tensors in `parts` parts with generation 1 published, its tensors, and a reader of it.
fn opened(name: &str, n: usize, parts: usize) -> (WeightsPartsOwner<Host>, Tensors, WeightsPartsReader<Host>) {
    let tensors = spread(n, parts);
    let mut owner = make(name, tensors.clone(), parts, 2);
    publish(&mut owner, &tensors);
    let reader = open(&owner).0;
    (owner, tensors, reader)
}

type Tensors = Vec<(String, TensorDesc, usize)>;

/// Stages part `part` alone, writes every tensor, commits it: the owner caught between parts.
fn commit_part(owner: &mut WeightsPartsOwner<Host>, part: usize) -> u64 {
    let part = owner.part_mut(part);
    let staged = part.stage().unwrap();
    for entry in staged.manifest().entries.clone() {
        staged.write(&entry.name, &vec![0x5a; entry.span_bytes() as usize]).unwrap();
    }
    part.commit().unwrap()
}

#[test]
fn each_parts_word_follows_the_sets_generation_not_a_part_ahead_of_it() {
    let (mut owner, _, reader) = opened("wait-publish", 6, 2);
    let waits = [reader.watch(2, 0).unwrap(), reader.watch(2, 1).unwrap()];
    assert_ne!(waits[0].status_word(), waits[1].status_word(), "a word per part");
    // Part 1 publishes 2 first, as commit does: the set's generation (part 0's) is still 1.
    assert_eq!(commit_part(&mut owner, 1), 2);
    std::thread::sleep(Duration::from_millis(20));
    for wait in &waits {
        assert_eq!(reader.wait_status(wait), GenerationWaitStatus::Waiting);
        assert_eq!(wait.word().load(), 1, "the word follows part 0's note, not part 1's");
    }
    assert_eq!(commit_part(&mut owner, 0), 2);
    for wait in &waits {
        assert_eq!(
            released_within(|w| reader.wait_status(w), wait, Duration::from_secs(1)).0,
            GenerationWaitStatus::Published { newest: 2 }
        );
    }
    // One word per part, whatever the wait; an old generation is released at once.
    let again = reader.watch(1, 1).unwrap();
    assert_eq!(again.status_word(), waits[1].status_word());
    assert_eq!(reader.wait_status(&again), GenerationWaitStatus::Published { newest: 2 });
    let err = reader.watch(3, 2).unwrap_err();
    assert!(matches!(&err, WeightsError::Invalid(m) if m.contains("2 parts: there is no part 2")), "{err}");
    for bad in [0, MAX_GENERATION + 1] {
        let err = reader.watch(bad, 0).unwrap_err();
        assert!(matches!(&err, WeightsError::Invalid(m) if m.contains("generations run from 1")), "{bad}: {err}");
    }
}

#[test]
fn every_parts_pending_wait_is_released_as_gone_when_the_owner_closes() {
    let (owner, _, reader) = opened("wait-gone", 7, 3);
    let waits: Vec<GenerationWait> =
        (0..3).flat_map(|part| [reader.watch(2, part).unwrap(), reader.watch(5, part).unwrap()]).collect();
    std::thread::sleep(Duration::from_millis(10));
    drop(owner);
    for wait in &waits {
        let status = released_within(|w| reader.wait_status(w), wait, Duration::from_secs(1)).0;
        assert_eq!(status, GenerationWaitStatus::OwnerGone { newest: 1 });
        assert_eq!(wait.word().load(), GONE_BIT | 1);
    }
    assert!(matches!(reader.watch(3, 0), Err(WeightsError::OwnerGone { .. })));
    assert!(matches!(reader.watch(3, 2), Err(WeightsError::OwnerGone { .. })));
}

#[test]
fn the_gates_see_the_owners_end_on_any_parts_connection_and_follow_part_0s_note() {
    // Two sets, so that one "part" can go while the other stays: what a part's connection hanging up alone looks like.
    let tensors = spread(4, 2);
    let mut first = make("source-first", tensors.clone(), 2, 2);
    let mut second = make("source-second", tensors.clone(), 2, 2);
    publish(&mut first, &tensors);
    publish(&mut first, &tensors);
    publish(&mut second, &tensors);
    let options = AttachOptions::default();
    let attach = |owner: &WeightsPartsOwner<Host>, part| {
        PoolImporter::<Host>::attach_part(&HostContext, owner.path(), &options, part).unwrap()
    };
    let source = PartsSource(vec![attach(&first, 0), attach(&second, 1)]);
    assert_eq!(source.newest(), 2, "part 0's note");
    assert!(!source.owner_gone());
    drop(second);
    let started = Instant::now();
    while !source.owner_gone() {
        assert!(started.elapsed() < Duration::from_secs(1), "the end of the second part's owner not seen within 1 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(source.newest(), 2);
}

#[test]
fn a_parts_reader_closed_with_pending_waits_releases_them_and_does_not_hang() {
    let (_owner, _, reader) = opened("wait-close", 4, 2);
    let waits = [reader.watch(9, 0).unwrap(), reader.watch(9, 1).unwrap()];
    std::thread::sleep(Duration::from_millis(10));
    let started = Instant::now();
    drop(reader);
    assert!(started.elapsed() < Duration::from_millis(500), "closing took {:?}", started.elapsed());
    for wait in &waits {
        // The wait keeps the word: it says gone (nothing will move it any more), never a freed word.
        assert_eq!(wait.word().load(), GONE_BIT | 1);
        assert_eq!(wait.status_of(wait.word().load()), GenerationWaitStatus::OwnerGone { newest: 1 });
    }
}

#[test]
fn the_words_never_go_backwards_nor_ahead_of_the_sets_generation_while_the_owner_publishes() {
    let (mut owner, tensors, reader) = opened("wait-monotonic", 5, 2);
    const LAST: u64 = 201;
    let waits = [reader.watch(LAST, 0).unwrap(), reader.watch(LAST, 1).unwrap()];
    let done = Arc::new(AtomicBool::new(false));
    let checker = {
        let (done, waits) = (done.clone(), waits.clone());
        std::thread::spawn(move || {
            let mut seen = [0u64; 2];
            let mut moves = 0u32;
            while !done.load(Ordering::Acquire) {
                for (wait, last) in waits.iter().zip(&mut seen) {
                    let word = wait.word().load();
                    assert!(word >= *last, "the word went back from {last} to {word}");
                    moves += u32::from(word != *last);
                    *last = word;
                }
            }
            moves
        })
    };
    for _ in 2..=LAST {
        let generation = publish(&mut owner, &tensors);
        for wait in &waits {
            assert!(wait.word().load() <= generation, "a word ahead of the set's generation {generation}");
        }
    }
    for wait in &waits {
        assert_eq!(
            released_within(|w| reader.wait_status(w), wait, Duration::from_secs(1)).0,
            GenerationWaitStatus::Published { newest: LAST }
        );
    }
    done.store(true, Ordering::Release);
    let moves = checker.join().unwrap();
    assert!(moves > 0, "the checker saw no word move");
}
