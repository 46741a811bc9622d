//! The semaphore between real processes on the host backend (the `semaphore` example program): posts and waits
//! counted across processes, a poster SIGKILLed while others wait (and a newcomer after it), peers that never
//! posted SIGKILLed, the ignore rule, the owner's reset, the owner SIGKILLed, the owner closing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Proc, field, semaphore, semaphore_owner, semaphore_poster, semaphore_waiter};

/// How soon waiters must learn of a death (the bound).
const WITHIN: Duration = Duration::from_secs(1);

fn sock(tag: &str) -> PathBuf {
    common::socket(&format!("sem-{tag}"))
}

fn spawn(name: &str, args: &[&str]) -> Proc {
    semaphore(name, "host", args)
}

fn owner(path: &Path, initial: u64) -> Proc {
    semaphore_owner("host", path, initial)
}

fn poster(name: &str, path: &Path, count: u64, hold_secs: u64) -> Proc {
    semaphore_poster(name, "host", path, count, &["--hold-secs", &hold_secs.to_string()])
}

fn waiter(name: &str, path: &Path, count: u64, timeout_ms: u64, until_idle: bool) -> Proc {
    semaphore_waiter(name, "host", path, count, timeout_ms, if until_idle { &["--until-idle"] } else { &[] })
}

#[test]
fn posts_of_two_processes_are_taken_exactly_once_by_two_others() {
    const PER_POSTER: u64 = 500;
    let path = sock("count");
    let mut owner = owner(&path, 0);
    let waiters = [waiter("waiter-a", &path, 10_000, 1_500, true), waiter("waiter-b", &path, 10_000, 1_500, true)];
    let posters = [poster("poster-a", &path, PER_POSTER, 0), poster("poster-b", &path, PER_POSTER, 0)];
    for p in posters {
        let (status, _, json) = p.finish(Duration::from_secs(30));
        assert!(status.success(), "{json}");
        assert_eq!(field(&json, "count"), PER_POSTER);
    }
    let mut taken = 0;
    for w in waiters {
        let (status, _, json) = w.finish(Duration::from_secs(30));
        // Posters that exit cleanly detach: the waiters end idle, not with an error.
        assert!(status.success(), "{json}");
        assert_eq!(field(&json, "outcome"), "done", "{json}");
        taken += field(&json, "count").as_u64().unwrap();
    }
    assert_eq!(taken, 2 * PER_POSTER, "every post taken exactly once");
    owner.close_stdin();
    let (status, _, json) = owner.finish(Duration::from_secs(10));
    assert!(status.success(), "{json}");
    assert_eq!(field(&json, "value"), 0, "nothing left over, nothing taken twice: {json}");
}

#[test]
fn a_poster_sigkilled_while_others_wait_ends_their_waits_within_a_second() {
    let path = sock("poster-killed");
    let mut owner = owner(&path, 0);
    let waiters = [waiter("waiter-a", &path, 100, 30_000, false), waiter("waiter-b", &path, 100, 30_000, false)];
    let mut poster = poster("poster", &path, 3, 60);
    poster.wait_for_line("posted 3", Duration::from_secs(10));
    // Let the waiters take the three posts and block again.
    std::thread::sleep(Duration::from_millis(300));
    poster.kill9();
    let killed = Instant::now();
    let mut taken = 0;
    for w in waiters {
        let (status, _, json) = w.finish(Duration::from_secs(10));
        let after = killed.elapsed();
        assert!(after < WITHIN, "a waiter learnt of the death after {after:?}: {json}");
        assert_eq!(status.code(), Some(4), "{json}");
        assert_eq!(field(&json, "outcome"), "poster-died", "{json}");
        let message = field(&json, "message").as_str().unwrap();
        assert!(message.contains(&format!("pid {}", poster.pid())), "{message}");
        taken += field(&json, "count").as_u64().unwrap();
    }
    assert_eq!(taken, 3, "the posts made before the death were taken");
    let _ = poster.finish(Duration::from_secs(5));
    // A newcomer is told why, with the documented status and the semaphore's words.
    let late = spawn("late", &["wait", "--socket", path.to_str().unwrap(), "--timeout-ms", "1000"]);
    let (status, _, json) = late.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(4), "{json}");
    assert_eq!(field(&json, "outcome"), "poster-died", "{json}");
    let message = field(&json, "message").as_str().unwrap();
    assert!(message.contains("poisoned by a dead poster") && message.contains("died without detaching"), "{json}");
    assert!(!message.contains("producer shutting down"), "{json}");
    owner.close_stdin();
    let (status, _, json) = owner.finish(Duration::from_secs(10));
    assert_eq!(status.code(), Some(4), "the owner reports the broken semaphore too: {json}");
}

/// An owner with `extra` options (e.g. `--dead-poster ignore`); returns once it is ready.
fn owner_with(path: &Path, extra: &[&str]) -> Proc {
    let args: Vec<&str> =
        ["owner", "--socket", path.to_str().unwrap()].into_iter().chain(extra.iter().copied()).collect();
    let p = spawn("owner", &args);
    p.wait_for_line("ready", Duration::from_secs(30));
    p
}

#[test]
fn peers_that_never_posted_sigkilled_break_nothing() {
    let path = sock("never-posted");
    let mut owner = owner(&path, 0);
    // Attached with the default options, as a poster would be; it only never posts.
    let mut idle = poster("idle", &path, 0, 60);
    idle.wait_for_line("posted 0", Duration::from_secs(10));
    let doomed = waiter("doomed-waiter", &path, 100, 30_000, false);
    std::thread::sleep(Duration::from_millis(100));
    idle.kill9();
    let mut doomed = doomed;
    doomed.kill9();
    let _ = (idle.finish(Duration::from_secs(5)), doomed.finish(Duration::from_secs(5)));
    std::thread::sleep(Duration::from_millis(300));
    let w = waiter("survivor", &path, 2, 5_000, false);
    let (status, _, json) = poster("poster", &path, 2, 0).finish(Duration::from_secs(30));
    assert!(status.success(), "{json}");
    let (status, _, json) = w.finish(Duration::from_secs(30));
    assert!(status.success(), "the semaphore still works: {json}");
    assert_eq!(field(&json, "count"), 2, "{json}");
    owner.close_stdin();
    let (status, _, json) = owner.finish(Duration::from_secs(10));
    assert!(status.success(), "never poisoned: {json}");
    assert_eq!(field(&json, "value"), 0, "{json}");
}

#[test]
fn under_the_ignore_rule_a_poster_sigkilled_breaks_nothing() {
    let path = sock("ignore");
    let mut owner = owner_with(&path, &["--dead-poster", "ignore"]);
    let w = waiter("waiter", &path, 5, 30_000, false);
    let mut doomed = poster("doomed-poster", &path, 3, 60);
    doomed.wait_for_line("posted 3", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(200));
    doomed.kill9();
    let _ = doomed.finish(Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    let (status, _, json) = poster("poster", &path, 2, 0).finish(Duration::from_secs(30));
    assert!(status.success(), "{json}");
    let (status, _, json) = w.finish(Duration::from_secs(30));
    assert!(status.success(), "{json}");
    assert_eq!((field(&json, "outcome"), field(&json, "count")), (&"done".into(), &5.into()), "{json}");
    owner.close_stdin();
    let (status, _, json) = owner.finish(Duration::from_secs(10));
    assert!(status.success(), "{json}");
}

#[test]
fn the_owner_resets_a_poisoned_semaphore_and_waits_work_again() {
    let path = sock("reset");
    let mut owner = owner_with(&path, &["--reset-when-poisoned"]);
    let mut doomed = poster("doomed-poster", &path, 1, 60);
    doomed.wait_for_line("posted 1", Duration::from_secs(10));
    doomed.kill9();
    let _ = doomed.finish(Duration::from_secs(5));
    owner.wait_for_line("owner: reset (value", Duration::from_secs(10));
    // The post made before the death was not taken: the reset keeps it.
    let w = waiter("waiter", &path, 3, 5_000, false);
    let (status, _, json) = poster("poster", &path, 2, 0).finish(Duration::from_secs(30));
    assert!(status.success(), "{json}");
    let (status, _, json) = w.finish(Duration::from_secs(30));
    assert!(status.success(), "waits work again: {json}");
    assert_eq!(field(&json, "count"), 3, "{json}");
    owner.close_stdin();
    let (status, _, json) = owner.finish(Duration::from_secs(10));
    assert!(status.success(), "{json}");
    assert_eq!((field(&json, "resets"), field(&json, "value")), (&1.into(), &0.into()), "{json}");
}

#[test]
fn the_owner_sigkilled_ends_every_importers_wait_within_a_second() {
    let path = sock("owner-killed");
    let _cleanup = common::RemoveOnDrop(path.clone());
    let mut owner = owner(&path, 0);
    let waiters = [waiter("waiter-a", &path, 10, 30_000, false), waiter("waiter-b", &path, 10, 30_000, false)];
    std::thread::sleep(Duration::from_millis(100));
    owner.kill9();
    let killed = Instant::now();
    for w in waiters {
        let (status, _, json) = w.finish(Duration::from_secs(10));
        let after = killed.elapsed();
        assert!(after < WITHIN, "a waiter learnt of the owner's death after {after:?}: {json}");
        assert_eq!(status.code(), Some(4), "{json}");
        assert_eq!(field(&json, "outcome"), "owner-gone", "{json}");
    }
    let _ = owner.finish(Duration::from_secs(5));
}

#[test]
fn the_owner_closing_ends_every_wait_as_closed() {
    let path = sock("closed");
    let mut owner = owner(&path, 1);
    let w = waiter("waiter", &path, 5, 30_000, false);
    std::thread::sleep(Duration::from_millis(100));
    owner.close_stdin();
    let closed = Instant::now();
    let (status, _, json) = w.finish(Duration::from_secs(10));
    assert!(closed.elapsed() < WITHIN, "{json}");
    assert_eq!(status.code(), Some(4), "{json}");
    assert_eq!((field(&json, "outcome"), field(&json, "count")), (&"closed".into(), &1.into()), "{json}");
    let (status, _, _) = owner.finish(Duration::from_secs(10));
    assert!(status.success());
}

#[test]
fn the_cpu_round_trip_bench_runs_between_two_processes() {
    let dir = std::env::temp_dir();
    let p = spawn("bench", &["bench", "--rounds", "500", "--mode", "cpu", "--dir", dir.to_str().unwrap()]);
    let (status, _, json) = p.finish(Duration::from_secs(60));
    assert!(status.success(), "{json}");
    let trips = field(&json, "round_trips").as_array().unwrap();
    assert_eq!(trips.len(), 1, "{json}");
    let (p50, p99) = (trips[0]["p50_us"].as_f64().unwrap(), trips[0]["p99_us"].as_f64().unwrap());
    assert!(p50 > 0.0 && p50 <= p99, "{json}");
}
