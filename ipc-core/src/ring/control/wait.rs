//! Bounded waits: the one polling loop every CPU-side wait of the ring and of the frame API runs through.

use std::time::{Duration, Instant};

use super::WaitMode;
use crate::ring::error::{RingError, WaitTarget};

/// Polls `condition` until it holds, `deadline` passes, or `liveness` fails. Never unbounded: the loop every CPU-side
/// wait of the crate goes through ([`wait_until`] for the ring's counters, the frame API's waits on CUDA events).
///
/// - `condition` is evaluated first, and once more after a failed liveness check or at the deadline, so what
///   happened just before a peer left (or just before the deadline) still counts.
/// - In [`WaitMode::Spin`] the clock is read every 64 spins; liveness is checked when `check_interval` has passed
///   since the last check, and the thread then yields once, so an oversubscribed machine still makes progress.
/// - In [`WaitMode::Sleep`] each nap is cut short at the deadline; liveness is checked after each nap that ends
///   `check_interval` or more after the last check (`Duration::ZERO`: after every nap).
/// - At the deadline the result is `timed_out(waited)`, `waited` measured from the call.
///
/// # Errors
/// The first error of `condition`, the error of `liveness` (unless `condition` then holds), or `timed_out(waited)`.
pub fn bounded_wait<E>(
    deadline: Instant,
    mode: WaitMode,
    check_interval: Duration,
    mut condition: impl FnMut() -> Result<bool, E>,
    mut liveness: impl FnMut() -> Result<(), E>,
    timed_out: impl FnOnce(Duration) -> E,
) -> Result<(), E> {
    let start = Instant::now();
    let mut last_check = start;
    let mut spins: u32 = 0;
    loop {
        if condition()? {
            return Ok(());
        }
        match mode {
            WaitMode::Spin => {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if !spins.is_multiple_of(64) {
                    continue;
                }
            }
            WaitMode::Sleep(nap) => {
                std::thread::sleep(nap.min(deadline.saturating_duration_since(Instant::now())));
            }
        }
        let now = Instant::now();
        if now.duration_since(last_check) >= check_interval {
            last_check = now;
            if let Err(gone) = liveness() {
                return if condition()? { Ok(()) } else { Err(gone) };
            }
            if mode == WaitMode::Spin {
                std::thread::yield_now();
            }
        }
        if now >= deadline {
            return if condition()? { Ok(()) } else { Err(timed_out(now.duration_since(start))) };
        }
    }
}

/// Waits until `condition` holds, `deadline` passes, or `liveness` reports a gone peer. Never unbounded.
///
/// [`bounded_wait`] with the ring's timeout ([`RingError::Timeout`] naming `waiting_for`): `condition` is evaluated
/// first and once more after a failed liveness check or at the deadline, so a frame published just before its
/// producer closed is still delivered. In [`WaitMode::Spin`] liveness is checked every `check_interval` (measured
/// every 64 spins); in [`WaitMode::Sleep`] after each sleep that ends past it.
pub fn wait_until(
    waiting_for: WaitTarget,
    deadline: Instant,
    mode: WaitMode,
    check_interval: Duration,
    condition: impl FnMut() -> Result<bool, RingError>,
    liveness: impl FnMut() -> Result<(), RingError>,
) -> Result<(), RingError> {
    bounded_wait(deadline, mode, check_interval, condition, liveness, |waited| RingError::Timeout {
        waiting_for,
        waited,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const MODES: [WaitMode; 2] = [WaitMode::Spin, WaitMode::Sleep(Duration::from_millis(1))];

    #[derive(Debug, PartialEq, Eq)]
    enum Outcome {
        Gone,
        TimedOut(Duration),
    }

    #[test]
    fn a_condition_that_holds_returns_at_once_without_a_liveness_check() {
        for mode in MODES {
            let checks = Cell::new(0);
            let result = bounded_wait(
                Instant::now(),
                mode,
                Duration::ZERO,
                || Ok::<_, Outcome>(true),
                || {
                    checks.set(checks.get() + 1);
                    Ok(())
                },
                Outcome::TimedOut,
            );
            assert_eq!((result, checks.get()), (Ok(()), 0), "{mode:?}");
        }
    }

    #[test]
    fn the_deadline_ends_the_wait_with_the_time_waited() {
        for mode in MODES {
            let start = Instant::now();
            let deadline = start + Duration::from_millis(20);
            // The wait's clock starts before its first look at the condition.
            let first_look = Cell::new(None);
            let condition = || {
                first_look.set(first_look.get().or_else(|| Some(Instant::now())));
                Ok(false)
            };
            let result = bounded_wait(deadline, mode, Duration::ZERO, condition, || Ok(()), Outcome::TimedOut);
            let Err(Outcome::TimedOut(waited)) = result else { panic!("{mode:?}: {result:?}") };
            let at_least = deadline.saturating_duration_since(first_look.get().unwrap());
            assert!(waited >= at_least && waited <= start.elapsed(), "{mode:?}: waited {waited:?}");
        }
    }

    #[test]
    fn the_condition_is_checked_once_more_at_the_deadline_and_after_a_failed_liveness_check() {
        for mode in MODES {
            // False until the deadline has passed: only the last look sees it.
            let deadline = Instant::now() + Duration::from_millis(5);
            let late = || Ok::<_, Outcome>(Instant::now() >= deadline);
            assert_eq!(bounded_wait(deadline, mode, Duration::ZERO, late, || Ok(()), Outcome::TimedOut), Ok(()));
            // Turns true inside the failed liveness check (the peer published, then left).
            let published = Cell::new(false);
            let liveness = || {
                published.set(true);
                Err(Outcome::Gone)
            };
            let far = Instant::now() + Duration::from_secs(10);
            let result = bounded_wait(far, mode, Duration::ZERO, || Ok(published.get()), liveness, Outcome::TimedOut);
            assert_eq!(result, Ok(()), "{mode:?}");
            // Without that, the liveness error is the result.
            let result =
                bounded_wait(far, mode, Duration::ZERO, || Ok(false), || Err(Outcome::Gone), Outcome::TimedOut);
            assert_eq!(result, Err(Outcome::Gone), "{mode:?}");
        }
    }

    #[test]
    fn liveness_is_checked_at_most_once_per_check_interval() {
        for mode in MODES {
            let checks = Cell::new(0u32);
            let liveness = || {
                checks.set(checks.get() + 1);
                Ok(())
            };
            let interval = Duration::from_millis(10);
            let start = Instant::now();
            let deadline = start + Duration::from_millis(50);
            let result = bounded_wait(deadline, mode, interval, || Ok(false), liveness, Outcome::TimedOut);
            let elapsed = start.elapsed();
            assert!(matches!(result, Err(Outcome::TimedOut(_))));
            // At least one, and never two within one interval.
            let most = (elapsed.as_millis() / interval.as_millis()) as u32;
            assert!((1..=most).contains(&checks.get()), "{mode:?}: {} checks in {elapsed:?}", checks.get());
        }
    }

    #[test]
    fn with_no_check_interval_a_sleeping_wait_checks_liveness_after_every_nap() {
        let (looks, checks) = (Cell::new(0u32), Cell::new(0u32));
        let condition = || {
            looks.set(looks.get() + 1);
            Ok(false)
        };
        let liveness = || {
            checks.set(checks.get() + 1);
            Ok(())
        };
        let mode = WaitMode::Sleep(Duration::from_millis(5));
        let deadline = Instant::now() + Duration::from_millis(30);
        let result = bounded_wait(deadline, mode, Duration::ZERO, condition, liveness, Outcome::TimedOut);
        assert!(matches!(result, Err(Outcome::TimedOut(_))));
        // One look before each nap, one check after it, and one last look at the deadline.
        assert!(checks.get() >= 1);
        assert_eq!(looks.get(), checks.get() + 1);
    }

    #[test]
    fn the_first_condition_error_ends_the_wait() {
        for mode in MODES {
            let far = Instant::now() + Duration::from_secs(10);
            let result = bounded_wait(far, mode, Duration::ZERO, || Err(Outcome::Gone), || Ok(()), Outcome::TimedOut);
            assert_eq!(result, Err(Outcome::Gone));
        }
    }

    #[test]
    fn wait_until_names_what_it_waited_for() {
        let target = WaitTarget::Published(crate::ring::Sequence(3));
        let result = wait_until(target, Instant::now(), WaitMode::Spin, Duration::ZERO, || Ok(false), || Ok(()));
        assert!(matches!(result, Err(RingError::Timeout { waiting_for, .. }) if waiting_for == target), "{result:?}");
    }
}
