//! The semaphore through its real door, on the host backend, within one process (threads as peers): attach,
//! counting, roles, and what each end looks like to the survivors. Across real processes: the examples' tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ipc_core::host::{Host, HostContext};
use ipc_toolkit::door::DoorError;
use ipc_toolkit::semaphore::{AttachOptions, Semaphore, SemaphoreError, SemaphoreOwner, SemaphoreState};

fn sock(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-sem-{}-{name}.sock", std::process::id()))
}

fn attach(owner: &SemaphoreOwner, posts: bool) -> Semaphore {
    let options = AttachOptions { name: format!("peer-{posts}"), posts, ..AttachOptions::default() };
    Semaphore::attach::<Host>(&HostContext, owner.path(), &options).unwrap()
}

/// Waits up to 5 s for `condition`.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within 5 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn posts_from_one_peer_are_taken_by_another_and_a_timed_out_wait_takes_nothing() {
    let owner = SemaphoreOwner::create::<Host>(&HostContext, &sock("count"), 2).unwrap();
    let poster = attach(&owner, true);
    let waiter = attach(&owner, false);
    eventually("two peers listed", || owner.peers().len() == 2);
    waiter.wait(Duration::from_secs(1)).unwrap();
    assert!(waiter.try_wait().unwrap());
    let started = Instant::now();
    let err = waiter.wait(Duration::from_millis(50)).unwrap_err();
    assert!(matches!(err, SemaphoreError::Timeout { waited } if waited >= Duration::from_millis(50)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(owner.semaphore().value(), 0, "a timed-out wait leaves no ticket behind");
    poster.post(3).unwrap();
    for _ in 0..3 {
        waiter.wait(Duration::from_secs(1)).unwrap();
    }
    assert!(!waiter.try_wait().unwrap());
    // A pure waiter may not post, and says how to.
    let err = waiter.post(1).unwrap_err();
    assert!(matches!(err, SemaphoreError::NotAPoster) && err.to_string().contains("posts = false"), "{err}");
    assert!(matches!(poster.post(0), Err(SemaphoreError::InvalidPost { count: 0, .. })));
}

#[test]
fn the_owner_tells_who_is_attached_and_in_which_role() {
    let owner = SemaphoreOwner::create::<Host>(&HostContext, &sock("status"), 0).unwrap();
    let poster = attach(&owner, true);
    let _waiter = attach(&owner, true);
    poster.post(1).unwrap(); // a poster from its first post on
    eventually("two peers listed", || owner.peers().len() == 2);
    let report = ipc_toolkit::door::status(owner.path(), Duration::from_secs(5)).unwrap();
    assert_eq!(report.kind, ipc_core::wire::ObjectKind::Semaphore);
    let mut details: Vec<&str> = report.peers.iter().map(|p| p.detail.as_str()).collect();
    details.sort_unstable();
    assert_eq!(details.len(), 2, "{details:?}");
    assert!(details[0].ends_with("posts, 0 stream waits queued"), "{details:?}");
    assert!(details[1].ends_with("waits only, 0 stream waits queued"), "{details:?}");
}

#[test]
fn a_waiter_blocked_in_wait_is_released_by_a_post_from_another_thread() {
    let owner = SemaphoreOwner::create::<Host>(&HostContext, &sock("release"), 0).unwrap();
    let waiter = Arc::new(attach(&owner, false));
    let blocked = {
        let waiter = Arc::clone(&waiter);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            waiter.wait(Duration::from_secs(10)).map(|()| t0.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(30));
    owner.semaphore().post(1).unwrap();
    let waited = blocked.join().unwrap().unwrap();
    assert!(waited >= Duration::from_millis(25) && waited < Duration::from_secs(5), "{waited:?}");
}

#[test]
fn many_threads_of_many_peers_take_each_post_exactly_once() {
    const POSTS: u64 = 4_000;
    let owner = SemaphoreOwner::create::<Host>(&HostContext, &sock("many"), 0).unwrap();
    let taken = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            let poster = attach(&owner, true);
            s.spawn(move || {
                for _ in 0..POSTS / 2 {
                    poster.post(1).unwrap();
                }
            });
        }
        for _ in 0..3 {
            let waiter = attach(&owner, false);
            let taken = &taken;
            s.spawn(move || {
                loop {
                    match waiter.wait(Duration::from_millis(500)) {
                        Ok(()) => taken.fetch_add(1, Ordering::Relaxed),
                        Err(SemaphoreError::Timeout { .. }) => return,
                        Err(e) => panic!("{e}"),
                    };
                }
            });
        }
    });
    assert_eq!(taken.load(Ordering::Relaxed), POSTS);
    assert_eq!(owner.semaphore().value(), 0);
    assert!(owner.semaphore().check().is_ok(), "posters that detach cleanly break nothing");
}

#[test]
fn the_owner_closing_ends_every_peer_wait_at_once() {
    let owner = SemaphoreOwner::create::<Host>(&HostContext, &sock("close"), 0).unwrap();
    let waiter = Arc::new(attach(&owner, false));
    let blocked = {
        let waiter = Arc::clone(&waiter);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            (waiter.wait(Duration::from_secs(30)), t0.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(30));
    let closed_at = Instant::now();
    owner.close();
    let (result, _) = blocked.join().unwrap();
    assert!(matches!(result, Err(SemaphoreError::Closed)), "{result:?}");
    assert!(closed_at.elapsed() < Duration::from_secs(1), "{:?}", closed_at.elapsed());
    assert_eq!(waiter.block().state(), Some(SemaphoreState::Closed), "closed, not taken for the owner's death");
    assert!(matches!(waiter.check(), Err(SemaphoreError::Closed)));
}

#[test]
fn attaching_where_nothing_listens_says_to_start_the_owner() {
    let missing = sock("missing");
    let err = Semaphore::attach::<Host>(&HostContext, &missing, &AttachOptions::default()).unwrap_err();
    assert!(matches!(err, SemaphoreError::Door(DoorError::NoOwner { .. })), "{err}");
    assert!(err.to_string().contains("start the process that creates the semaphore first"), "{err}");
}
