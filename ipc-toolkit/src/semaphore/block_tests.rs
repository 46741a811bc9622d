#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::semaphore::layout::{POSTED_WORD, RECORD_TICKETS};

fn block(initial: u64) -> SemaphoreBlock {
    SemaphoreBlock::create(initial, 7, DeadPoster::Poison).unwrap()
}

/// Posts as the owner (record 0), as the owner's handle does.
trait PostAsOwner {
    fn post(&self, count: u64) -> Result<(), SemaphoreError>;
}

impl PostAsOwner for SemaphoreBlock {
    fn post(&self, count: u64) -> Result<(), SemaphoreError> {
        self.post_as(SemaphoreBlock::OWNER_RECORD, count)
    }
}

/// A second mapping of the same memfd, as another process would have.
fn peer_view(block: &SemaphoreBlock) -> SemaphoreBlock {
    SemaphoreBlock::attach(block.shared().memory().try_clone_fd().unwrap()).unwrap()
}

/// An attached peer's record, as the owner and the peer set it up; a poster has posted once.
fn attach_peer(block: &SemaphoreBlock, posts: bool) -> PeerRecord {
    let record = block.claim_record(Some(4242)).unwrap();
    assert!(block.move_record(record, RecordState::Offered, RecordState::Attached));
    if posts {
        block.post_as(record, 1).unwrap();
    }
    record
}

/// `cuStreamWaitValue64`'s GEQ, as the GPU evaluates it on `posted`.
fn gpu_wait_passes(block: &SemaphoreBlock, ticket: u64) -> bool {
    let word = block.word(POSTED_WORD).load(Ordering::Acquire);
    (word.wrapping_sub(ticket + 1) as i64) >= 0
}

#[test]
fn a_fresh_block_attaches_and_a_foreign_one_is_refused() {
    let owner = block(3);
    let peer = peer_view(&owner);
    assert_eq!((peer.posted(), peer.taken(), peer.value()), (3, 0, 3));
    assert_eq!((peer.max_peers(), peer.generation()), (MAX_PEERS, 7));
    assert_eq!(peer.owner_pid(), u64::from(std::process::id()));
    assert!(peer.check().is_ok());

    let foreign = SharedMemory::create("not-a-semaphore", SHARED_BYTES).unwrap();
    let err = SemaphoreBlock::attach(foreign.try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, SemaphoreError::BadMagic { found: 0 }), "{err}");
    let small = SharedMemory::create("small", 4096).unwrap();
    let err = SemaphoreBlock::attach(small.try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, SemaphoreError::Shm(_)), "{err}");
    owner.word(VERSION_WORD).store(9, Ordering::Relaxed);
    let err = SemaphoreBlock::attach(owner.shared().memory().try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, SemaphoreError::LayoutVersion { found: 9, expected: 2 }), "{err}");
}

#[test]
fn posts_are_taken_exactly_once_and_bad_counts_are_refused() {
    let b = block(0);
    assert!(!b.try_take().unwrap());
    b.post(2).unwrap();
    assert!(b.try_take().unwrap() && b.try_take().unwrap());
    assert!(!b.try_take().unwrap());
    assert_eq!(b.value(), 0);
    for bad in [0, MAX_POST + 1] {
        assert!(matches!(b.post(bad), Err(SemaphoreError::InvalidPost { count, .. }) if count == bad));
    }
    assert!(matches!(
        SemaphoreBlock::create(MAX_POST + 1, 0, DeadPoster::Poison),
        Err(SemaphoreError::InvalidPost { .. })
    ));
}

#[test]
fn a_stream_ticket_is_served_before_later_cpu_takes() {
    let b = block(0);
    let peer = attach_peer(&b, false);
    let mut hint = 0;
    let ticket = b.take_ticket(peer, &mut hint).unwrap();
    assert_eq!((ticket, b.value()), (0, -1));
    assert!(!b.ticket_released(ticket).unwrap() && !gpu_wait_passes(&b, ticket));
    b.post(1).unwrap();
    assert!(b.ticket_released(ticket).unwrap() && gpu_wait_passes(&b, ticket));
    assert!(!b.try_take().unwrap(), "post 1 is the ticket's");
    b.post(1).unwrap();
    assert!(b.try_take().unwrap());
}

#[test]
fn a_peer_has_a_bounded_number_of_unreached_tickets_and_reached_slots_are_reused() {
    let b = block(0);
    let peer = attach_peer(&b, false);
    let mut hint = 0;
    for expected in 0..TICKETS_PER_PEER as u64 {
        assert_eq!(b.take_ticket(peer, &mut hint).unwrap(), expected);
    }
    let err = b.take_ticket(peer, &mut hint).unwrap_err();
    assert!(matches!(err, SemaphoreError::TooManyStreamWaits { limit: TICKETS_PER_PEER }), "{err}");
    b.post(1).unwrap();
    assert_eq!(b.take_ticket(peer, &mut hint).unwrap(), TICKETS_PER_PEER as u64);
}

#[test]
fn a_dead_poster_breaks_the_semaphore_and_poison_releases_every_gpu_wait() {
    let owner = block(0);
    let poster = attach_peer(&owner, true);
    let waiter = attach_peer(&owner, false);
    let mut hint = 0;
    // The poster's one post (made at attach) reaches ticket 0.
    let tickets: Vec<u64> = (0..3).map(|_| owner.take_ticket(waiter, &mut hint).unwrap()).collect();
    assert_eq!(owner.peer_gone(poster), Departure::PosterDied);
    let peer = peer_view(&owner);
    let err = peer.check().unwrap_err();
    assert!(
        matches!(err, SemaphoreError::PosterDied { pid: PeerPid(Some(4242)), record } if record == poster.index),
        "{err}"
    );
    let words = err.to_string();
    assert!(words.contains("pid 4242") && words.contains("poisoned by a dead poster"), "{err}");
    for &t in &tickets {
        assert!(gpu_wait_passes(&peer, t), "ticket {t}");
    }
    // Ticket 0 got a real post; the others were released by the poison.
    assert!(peer.ticket_released(tickets[0]).unwrap());
    assert!(matches!(peer.ticket_released(tickets[1]), Err(SemaphoreError::PosterDied { .. })));
    assert!(matches!(peer.try_take(), Err(SemaphoreError::PosterDied { .. })));
    assert!(matches!(peer.post(1), Err(SemaphoreError::PosterDied { .. })));
    assert_eq!(peer.posted(), 1, "the poison keeps the count");
    // The first reason stays; later ones only poison again.
    assert!(!owner.end(SemaphoreState::Closed));
    assert!(matches!(owner.check(), Err(SemaphoreError::PosterDied { .. })));
}

#[test]
fn a_dead_waiter_gives_back_the_tickets_no_post_reached() {
    let b = block(0);
    let waiter = attach_peer(&b, false);
    let mut hint = 0;
    for _ in 0..3 {
        b.take_ticket(waiter, &mut hint).unwrap();
    }
    b.post(1).unwrap(); // reaches ticket 0: used
    assert_eq!(b.value(), -2);
    assert_eq!(b.peer_gone(waiter), Departure::WaiterDied { refunded: 2 });
    assert_eq!(b.value(), 0, "the dead tickets no longer count");
    assert!(b.check().is_ok(), "a waiter's death does not break the semaphore");
    // The refunds went to the dead tickets 1 and 2; the next post is a live taker's.
    assert!(!b.try_take().unwrap());
    b.post(1).unwrap();
    assert!(b.try_take().unwrap());
    assert!(!b.record_is(waiter, RecordState::Attached) && b.peer_gone(waiter) == Departure::Stale);
}

#[test]
fn a_waiter_that_died_taking_a_ticket_is_judged_by_who_holds_it() {
    let b = block(0);
    let dead = attach_peer(&b, false);
    let live = attach_peer(&b, false);
    let slot = |record: PeerRecord, i: usize| b.word(record_word_index(record.index) + RECORD_TICKETS + i);
    // Died after its compare-and-swap: ticket 0 is handed out and nobody else holds it.
    b.word(TAKEN_WORD).store(1, Ordering::SeqCst);
    slot(dead, 0).store(1 | TAKING, Ordering::SeqCst);
    // Died before its compare-and-swap: ticket 1 was never handed out.
    slot(dead, 1).store(2 | TAKING, Ordering::SeqCst);
    assert_eq!(b.peer_gone(dead), Departure::WaiterDied { refunded: 1 });

    // Lost the race to a live peer that holds the ticket.
    let dead = attach_peer(&b, false);
    b.word(TAKEN_WORD).store(3, Ordering::SeqCst);
    slot(dead, 0).store(3 | TAKING, Ordering::SeqCst);
    slot(live, 0).store(3, Ordering::SeqCst);
    assert_eq!(b.peer_gone(dead), Departure::WaiterDied { refunded: 0 });
}

#[test]
fn records_are_claimed_until_full_and_stale_ones_are_left_alone() {
    let b = block(0);
    let first = b.claim_record(None).unwrap();
    assert_eq!(first.index, 1);
    assert_eq!(b.peer_gone(first), Departure::NeverAttached);
    let again = b.claim_record(None).unwrap();
    assert_eq!((again.index, again.epoch), (1, first.epoch + 1), "a new epoch");
    assert_eq!(b.peer_gone(first), Departure::Stale, "the old claim is not the record's any more");
    assert!(b.move_record(again, RecordState::Offered, RecordState::Attached));
    assert!(b.move_record(again, RecordState::Attached, RecordState::Detached));
    assert_eq!(b.peer_gone(again), Departure::Detached);
    for _ in 1..MAX_PEERS {
        b.claim_record(None).unwrap();
    }
    assert!(matches!(b.claim_record(None), Err(SemaphoreError::Full { max: MAX_PEERS })));
    assert_eq!(b.peer_gone(SemaphoreBlock::OWNER_RECORD), Departure::Stale, "the owner's record is never freed");
}

#[test]
fn garbage_in_a_record_never_panics_the_owner_nor_makes_up_posts() {
    let b = block(0);
    let peer = attach_peer(&b, false);
    // Two real unreached tickets, then garbage in every other slot.
    let mut hint = 0;
    b.take_ticket(peer, &mut hint).unwrap();
    b.take_ticket(peer, &mut hint).unwrap();
    for (i, value) in [u64::MAX, TAKING, POISON, 1, 2, 3, 1000, 0x8000_0000_0000_0002].into_iter().enumerate() {
        b.word(record_word_index(peer.index) + RECORD_TICKETS + 2 + i).store(value, Ordering::Relaxed);
    }
    // Refunds never exceed the tickets handed out and unreached (here 2), whatever the slots claim.
    assert!(matches!(b.peer_gone(peer), Departure::WaiterDied { refunded } if refunded <= 2));
    assert!(b.value() <= 0, "value {}", b.value());
    b.word(STATE_WORD).store(77, Ordering::SeqCst);
    assert!(matches!(b.check(), Err(SemaphoreError::Corrupt { what: "state", value: 77 })));
}

/// Found by fuzzing (`fuzz/`, semaphore_block): a `taken` count a peer set to `u64::MAX` made the next stream
/// ticket overflow (a panic with overflow checks, a wrapped count without).
#[test]
fn a_taken_count_no_peer_reaches_is_corrupt_for_the_next_ticket() {
    let b = block(0);
    let peer = attach_peer(&b, false);
    let mut hint = 0;
    for taken in [u64::MAX, TAKING, COUNT_MASK] {
        b.word(TAKEN_WORD).store(taken, Ordering::SeqCst);
        let error = b.take_ticket(peer, &mut hint).unwrap_err();
        assert!(matches!(error, SemaphoreError::Corrupt { what: "taken", value } if value == taken), "{error}");
        assert_eq!(b.taken(), taken, "nothing was taken");
    }
    b.word(TAKEN_WORD).store(COUNT_MASK - 1, Ordering::SeqCst);
    assert_eq!(b.take_ticket(peer, &mut hint).unwrap(), COUNT_MASK - 1);
}

#[test]
fn threads_posting_and_taking_see_every_post_taken_exactly_once() {
    const PER_THREAD: u64 = 20_000;
    let b = block(0);
    let took = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..PER_THREAD {
                    b.post(1).unwrap();
                }
            });
            s.spawn(|| {
                let mut mine = 0;
                while mine < PER_THREAD {
                    if b.try_take().unwrap() {
                        mine += 1;
                    } else {
                        std::hint::spin_loop();
                    }
                }
                took.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    assert_eq!(took.load(Ordering::Relaxed), 4 * PER_THREAD);
    assert_eq!((b.posted(), b.taken(), b.try_take().unwrap()), (4 * PER_THREAD, 4 * PER_THREAD, false));
}

#[test]
fn a_peer_that_never_posted_never_poisons_and_one_that_posted_does() {
    let b = block(0);
    // Attached with nothing said about its role: only its first post makes it a poster.
    let waiter = attach_peer(&b, false);
    let mut hint = 0;
    b.take_ticket(waiter, &mut hint).unwrap();
    assert!(!b.has_posted(waiter));
    assert_eq!(b.peer_gone(waiter), Departure::WaiterDied { refunded: 1 });
    assert!(b.check().is_ok(), "a peer that never posted broke the semaphore");

    let peer = b.claim_record(Some(77)).unwrap();
    assert!(b.move_record(peer, RecordState::Offered, RecordState::Attached));
    assert!(!b.has_posted(peer));
    // The flag is set before the post is added: a crash in between still counts it as a poster.
    b.mark_poster(peer);
    assert!(b.has_posted(peer) && b.posted() == 1, "the refund only");
    assert_eq!(b.peer_gone(peer), Departure::PosterDied);
    assert!(matches!(b.check(), Err(SemaphoreError::PosterDied { pid: PeerPid(Some(77)), .. })));
}

#[test]
fn under_the_ignore_rule_a_dead_poster_breaks_nothing_and_every_peer_sees_the_rule() {
    let b = SemaphoreBlock::create(0, 7, DeadPoster::Ignore).unwrap();
    let peer = peer_view(&b);
    assert_eq!((b.dead_poster(), peer.dead_poster()), (DeadPoster::Ignore, DeadPoster::Ignore));
    assert_eq!(block(0).dead_poster(), DeadPoster::Poison, "poison is the default rule");
    let poster = attach_peer(&b, true);
    let mut hint = 0;
    b.take_ticket(poster, &mut hint).unwrap(); // ticket 0: reached by the poster's post
    b.take_ticket(poster, &mut hint).unwrap(); // ticket 1: unreached, given back
    assert_eq!(b.peer_gone(poster), Departure::PosterDiedIgnored { refunded: 1 });
    assert!(peer.check().is_ok(), "{:?}", peer.check());
    assert_eq!(peer.value(), 0);
    b.post(1).unwrap();
    assert!(peer.try_take().unwrap());
    // A rule no owner writes is refused when attaching.
    b.word(DEAD_POSTER_WORD).store(9, Ordering::Relaxed);
    let err = SemaphoreBlock::attach(b.shared().memory().try_clone_fd().unwrap()).unwrap_err();
    assert!(matches!(err, SemaphoreError::Corrupt { what: "dead_poster", value: 9 }), "{err}");
}

#[test]
fn the_owner_resets_a_poisoned_semaphore_keeping_untaken_posts_and_serving_released_tickets() {
    let b = block(0);
    let poster = attach_peer(&b, true); // posts 1
    let waiter = attach_peer(&b, false);
    b.post(2).unwrap(); // 3 posts
    assert!(b.try_take().unwrap()); // ticket 0
    let mut hint = 0;
    let reached = b.take_ticket(waiter, &mut hint).unwrap(); // ticket 1: posted
    assert_eq!(b.peer_gone(poster), Departure::PosterDied);
    assert!(b.reset().is_ok());
    assert_eq!(b.check().unwrap(), (), "open again");
    assert_eq!((b.value(), b.resets()), (1, 1), "the untaken post is kept");
    assert!(b.ticket_released(reached).unwrap());

    // Broken with stream waits the poison released: they count as served, and say how they were released.
    let poster = attach_peer(&b, true); // posts 1: value 2
    assert!(b.try_take().unwrap() && b.try_take().unwrap());
    let poisoned: Vec<u64> = (0..2).map(|_| b.take_ticket(waiter, &mut hint).unwrap()).collect();
    assert_eq!(b.value(), -2);
    assert_eq!(b.peer_gone(poster), Departure::PosterDied);
    for &t in &poisoned {
        assert!(gpu_wait_passes(&b, t) && b.ticket_released(t).is_err());
    }
    assert_eq!(b.reset().unwrap(), 0, "the debt of released waits is dropped");
    let peer = peer_view(&b);
    assert!(peer.check().is_ok());
    for &t in &poisoned {
        assert!(gpu_wait_passes(&peer, t), "a wait not yet evaluated passes at once");
        assert!(matches!(peer.ticket_released(t), Err(SemaphoreError::PosterDied { .. })), "still told");
    }
    assert!(!peer.try_take().unwrap());
    b.post(1).unwrap();
    let next = peer.take_ticket(waiter, &mut hint).unwrap();
    assert!(peer.ticket_released(next).unwrap() && gpu_wait_passes(&peer, next));
    assert!(!peer.try_take().unwrap());
    // A closed semaphore is not reset.
    b.end(SemaphoreState::Closed);
    assert!(matches!(b.reset(), Err(SemaphoreError::Closed)));
}
