//! The paced rows' producer schedule: frame `k` starts at `anchor + k / fps` on a fixed grid (no drift from one
//! frame's lateness to the next); a frame that starts more than one interval late moves the grid to now instead of
//! letting the frames behind it go out back to back, as a camera that missed a frame would not send two at once.

use std::time::{Duration, Instant};

/// How close to a due time the producer stops sleeping and spins (a sleep's wake-up is later than asked by up to
/// tens of microseconds on a loaded machine).
const SPIN_BEFORE: Duration = Duration::from_micros(200);

/// When each frame of a paced row is due.
#[derive(Debug, Clone)]
pub struct PaceSchedule {
    fps: u32,
    anchor: Instant,
    anchor_seq: u64,
    behind: u64,
}

impl PaceSchedule {
    /// A schedule of `fps` frames per second (at least 1) whose frame 0 is due at `start`.
    pub fn new(fps: u32, start: Instant) -> Self {
        Self { fps: fps.max(1), anchor: start, anchor_seq: 0, behind: 0 }
    }

    /// The interval between frames.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(1_000_000_000 / u64::from(self.fps))
    }

    /// When frame `seq` is due on the current grid (frames before the grid's anchor are due at the anchor).
    pub fn due(&self, seq: u64) -> Instant {
        let k = u128::from(seq.saturating_sub(self.anchor_seq));
        let ns = k * 1_000_000_000 / u128::from(self.fps);
        self.anchor + Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// When the producer starts frame `seq`, asked at `now`: its due time, or `now` if that has passed; more than
    /// one interval late, the grid moves so that `seq` is due now (counted in [`PaceSchedule::behind`]).
    pub fn start(&mut self, seq: u64, now: Instant) -> Instant {
        let due = self.due(seq);
        if now > due + self.interval() {
            self.anchor = now;
            self.anchor_seq = seq;
            self.behind += 1;
            return now;
        }
        due.max(now)
    }

    /// How many times the producer fell more than one interval behind and the grid moved.
    pub fn behind(&self) -> u64 {
        self.behind
    }
}

/// Waits until `due`: sleeps while more than 200 us remain, then spins (returns at once for a past time).
pub fn sleep_until(due: Instant) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        let left = due - now;
        if left > SPIN_BEFORE {
            std::thread::sleep(left - SPIN_BEFORE);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The paced row's note: the pace, and how often the producer could not keep it.
pub fn paced_note(fps: u32, behind: u64) -> String {
    let mut note = format!(
        "producer paced at {fps} FPS (frame k due at start + k/{fps} s); the consumer waits for each verify before \
         the next frame"
    );
    if behind > 0 {
        note.push_str(&format!("; the producer fell more than a frame behind its pace {behind} times"));
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_due_on_a_fixed_grid_without_drift() {
        let t0 = Instant::now();
        let s = PaceSchedule::new(60, t0);
        assert_eq!(s.interval(), Duration::from_nanos(16_666_666));
        assert_eq!(s.due(0), t0);
        assert_eq!(s.due(1), t0 + Duration::from_nanos(16_666_666));
        // 60 frames are exactly one second: no rounding error accumulates.
        assert_eq!(s.due(60), t0 + Duration::from_secs(1));
        assert_eq!(s.due(6_000), t0 + Duration::from_secs(100));
        let fast = PaceSchedule::new(1_000, t0);
        assert_eq!(fast.due(3), t0 + Duration::from_millis(3));
        assert_eq!(PaceSchedule::new(0, t0).interval(), Duration::from_secs(1), "0 FPS is taken as 1");
    }

    #[test]
    fn early_waits_slightly_late_goes_at_once_and_far_behind_moves_the_grid() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = PaceSchedule::new(1_000, t0);
        // Asked early: start at the due time.
        assert_eq!(s.start(5, t0 + ms(2)), t0 + ms(5));
        // Late by less than an interval: start now, the grid stays.
        assert_eq!(s.start(5, t0 + ms(5) + Duration::from_micros(500)), t0 + ms(5) + Duration::from_micros(500));
        assert_eq!(s.behind(), 0);
        assert_eq!(s.due(6), t0 + ms(6));
        // Late by more than an interval: start now and move the grid.
        let late = t0 + ms(20);
        assert_eq!(s.start(7, late), late);
        assert_eq!(s.behind(), 1);
        assert_eq!(s.due(8), late + ms(1));
        assert_eq!(s.due(7), late);
        assert_eq!(s.due(3), late, "frames before the anchor are due at it");
    }

    #[test]
    fn sleeping_until_a_time_reaches_it() {
        let due = Instant::now() + Duration::from_millis(3);
        sleep_until(due);
        assert!(Instant::now() >= due);
        let before = Instant::now();
        sleep_until(before);
        assert!(before.elapsed() < Duration::from_millis(50), "a past time returns at once");
    }

    #[test]
    fn the_note_says_the_pace_and_when_it_slipped() {
        assert!(paced_note(240, 0).starts_with("producer paced at 240 FPS"));
        assert!(!paced_note(240, 0).contains("behind"));
        assert!(paced_note(60, 3).ends_with("fell more than a frame behind its pace 3 times"));
    }
}
