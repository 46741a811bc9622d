//! Bounded waits: the one loop every CPU-side wait of the ring and the frame API runs through.

use std::time::{Duration, Instant};

use super::WaitMode;
use crate::ring::error::{RingError, WaitTarget};

/// Waits until `condition` holds, `deadline` passes, or `liveness` reports a gone peer. Never unbounded.
///
/// `condition` is evaluated first and once more after a failed liveness check or at the deadline, so a frame
/// published just before its producer closed is still delivered. In [`WaitMode::Spin`] liveness is checked every
/// `check_interval` (measured every 64 spins); in [`WaitMode::Sleep`] after each sleep that ends past it.
pub fn wait_until(
    waiting_for: WaitTarget,
    deadline: Instant,
    mode: WaitMode,
    check_interval: Duration,
    mut condition: impl FnMut() -> Result<bool, RingError>,
    mut liveness: impl FnMut() -> Result<(), RingError>,
) -> Result<(), RingError> {
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
            return if condition()? {
                Ok(())
            } else {
                Err(RingError::Timeout { waiting_for, waited: now.duration_since(start) })
            };
        }
    }
}
