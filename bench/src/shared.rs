//! What the bench's processes share besides the frames: the producer's publish times (a memfd array indexed by
//! sequence), the study designs' flags, and the clocks both sides read.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpu_ipc::core::shm::{SharedMemory, SharedObject, ShmError};
use gpu_ipc::driver::{Context, Event, EventFlags, Stream};
use harness::MeasurementError;

/// Entries of the publish-time array: sequence `s` lives at `s % STAMP_SLOTS`. The producer is never more than 256
/// frames ahead of a consumer, so an entry is read long before it is reused.
pub const STAMP_SLOTS: usize = 1 << 16;

type StampArray = [AtomicU64; STAMP_SLOTS];

/// The producer's publish time of each frame, `CLOCK_MONOTONIC` nanoseconds (0: not yet published).
#[derive(Debug)]
pub struct PublishStamps(SharedObject<StampArray>);

impl PublishStamps {
    /// A fresh, zeroed array in a sealed memfd.
    ///
    /// # Errors
    /// The memfd could not be made.
    pub fn create() -> Result<Self, ShmError> {
        Ok(Self(SharedObject::new(SharedMemory::create("gpu-ipc-bench-stamps", size_of::<StampArray>())?)?))
    }

    /// Maps the array the producer sent.
    ///
    /// # Errors
    /// A memfd of the wrong size or without seals.
    pub fn open(fd: OwnedFd) -> Result<Self, ShmError> {
        Ok(Self(SharedObject::new(SharedMemory::from_fd(fd, size_of::<StampArray>())?)?))
    }

    /// A copy of the fd, to send.
    ///
    /// # Errors
    /// `dup` failed.
    pub fn fd(&self) -> Result<OwnedFd, ShmError> {
        self.0.memory().try_clone_fd()
    }

    /// Records that frame `seq` was published at `ns`.
    pub fn record(&self, seq: u64, ns: u64) {
        self.0.get()[(seq % STAMP_SLOTS as u64) as usize].store(ns.max(1), Ordering::Release);
    }

    /// When frame `seq` was published, if recorded.
    pub fn get(&self, seq: u64) -> Option<u64> {
        let ns = self.0.get()[(seq % STAMP_SLOTS as u64) as usize].load(Ordering::Acquire);
        (ns != 0).then_some(ns)
    }
}

/// Words of the study designs' flag block.
pub mod flag {
    /// Frames published: `seq + 1` of the last one (the study's atomic frame counter).
    pub const PUBLISHED: usize = 0;
    /// Frames consumed: `seq + 1` of the last one the consumer is done with.
    pub const CONSUMED: usize = 1;
    /// Design (b)'s ready flag: 1 while a frame waits in the staging buffer.
    pub const READY: usize = 2;
    /// Set by either side that gives up, so the other stops waiting.
    pub const ABORT: usize = 3;
}

type FlagArray = [AtomicU64; 8];

/// The study designs' flags, in a sealed memfd both processes map.
#[derive(Debug)]
pub struct StudyFlags(SharedObject<FlagArray>);

impl StudyFlags {
    /// Fresh, zeroed flags.
    ///
    /// # Errors
    /// The memfd could not be made.
    pub fn create() -> Result<Self, ShmError> {
        Ok(Self(SharedObject::new(SharedMemory::create("gpu-ipc-bench-flags", size_of::<FlagArray>())?)?))
    }

    /// Maps the flags the producer sent.
    ///
    /// # Errors
    /// A memfd of the wrong size or without seals.
    pub fn open(fd: OwnedFd) -> Result<Self, ShmError> {
        Ok(Self(SharedObject::new(SharedMemory::from_fd(fd, size_of::<FlagArray>())?)?))
    }

    /// A copy of the fd, to send.
    ///
    /// # Errors
    /// `dup` failed.
    pub fn fd(&self) -> Result<OwnedFd, ShmError> {
        self.0.memory().try_clone_fd()
    }

    /// Flag word `index` (see [`flag`]).
    pub fn word(&self, index: usize) -> &AtomicU64 {
        &self.0.get()[index % 8]
    }

    /// Waits until flag `index` reaches at least `value` (or, with `equal`, equals it), polling with `nap` (`None`
    /// spins). Bounded by `timeout`; stops when the abort flag is set.
    ///
    /// # Errors
    /// [`MeasurementError::Wait`]: why it stopped waiting.
    pub fn wait(
        &self,
        index: usize,
        value: u64,
        equal: bool,
        nap: Option<Duration>,
        timeout: Duration,
    ) -> Result<(), MeasurementError> {
        let started = Instant::now();
        let mut polls = 0u32;
        loop {
            let now = self.word(index).load(Ordering::Acquire);
            if (equal && now == value) || (!equal && now >= value) {
                return Ok(());
            }
            polls = polls.wrapping_add(1);
            if nap.is_some() || polls.is_multiple_of(256) {
                if self.word(flag::ABORT).load(Ordering::Acquire) != 0 {
                    return Err(MeasurementError::Wait("the other side gave up".to_owned()));
                }
                if started.elapsed() >= timeout {
                    return Err(MeasurementError::Wait(format!(
                        "flag {index} stayed at {now}, not {value}, for {timeout:?}"
                    )));
                }
            }
            match nap {
                Some(d) => std::thread::sleep(d),
                None => std::hint::spin_loop(),
            }
        }
    }

    /// Tells the other side to stop waiting.
    pub fn abort(&self) {
        self.word(flag::ABORT).store(1, Ordering::Release);
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the same clock in every process of the machine.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec.max(0) as u64) * 1_000_000_000 + t.tv_nsec.clamp(0, 999_999_999) as u64
}

/// CPU time (user + system, every thread) this process has used, in nanoseconds.
pub fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    (t.tv_sec.max(0) as u64) * 1_000_000_000 + t.tv_nsec.clamp(0, 999_999_999) as u64
}

/// When each frame's queued work completed, seen from the CPU: an event recorded after the frame's work, polled
/// (never waited on without a bound). With CPU strategies the work is already done when the event is recorded; with
/// GPU ones the stamp is the first poll that saw it done, so it is late by at most one loop iteration.
#[derive(Debug)]
pub struct CompletionClock {
    events: Vec<Event>,
    pending: VecDeque<(u64, usize)>,
    next: usize,
}

impl CompletionClock {
    /// A clock that tracks up to `depth` frames in flight.
    ///
    /// # Errors
    /// Event creation failed.
    pub fn new(ctx: &Context, depth: usize) -> Result<Self, gpu_ipc::driver::DriverError> {
        let events = (0..depth.max(1)).map(|_| Event::new(ctx, EventFlags::default())).collect::<Result<_, _>>()?;
        Ok(Self { events, pending: VecDeque::new(), next: 0 })
    }

    /// Marks frame `seq`'s work queued on `stream` so far; when `depth` frames are in flight, first waits (bounded
    /// by `deadline`) for the oldest and hands its completion to `done`.
    ///
    /// # Errors
    /// Driver errors; a frame not done by `deadline`.
    pub fn after(
        &mut self,
        seq: u64,
        stream: &Stream,
        deadline: Instant,
        done: &mut impl FnMut(u64, u64),
    ) -> Result<(), MeasurementError> {
        if self.pending.len() == self.events.len() {
            self.wait_oldest(deadline, done)?;
        }
        let index = self.next;
        self.next = (self.next + 1) % self.events.len();
        self.events[index].record(stream)?;
        self.pending.push_back((seq, index));
        self.poll(done)
    }

    /// Hands every completed frame, oldest first, to `done(seq, ns)`.
    ///
    /// # Errors
    /// Driver errors.
    pub fn poll(&mut self, done: &mut impl FnMut(u64, u64)) -> Result<(), MeasurementError> {
        while let Some(&(seq, index)) = self.pending.front() {
            if !self.events[index].is_complete()? {
                break;
            }
            done(seq, monotonic_ns());
            self.pending.pop_front();
        }
        Ok(())
    }

    /// Waits (bounded by `deadline`) for every frame in flight.
    ///
    /// # Errors
    /// Driver errors; frames not done by `deadline`.
    pub fn finish(&mut self, deadline: Instant, done: &mut impl FnMut(u64, u64)) -> Result<(), MeasurementError> {
        while !self.pending.is_empty() {
            self.wait_oldest(deadline, done)?;
        }
        Ok(())
    }

    fn wait_oldest(&mut self, deadline: Instant, done: &mut impl FnMut(u64, u64)) -> Result<(), MeasurementError> {
        let Some(&(seq, index)) = self.pending.front() else { return Ok(()) };
        let mut polls = 0u32;
        while !self.events[index].is_complete()? {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) && Instant::now() >= deadline {
                return Err(MeasurementError::Wait(format!("frame {seq}'s work was not done in time")));
            }
            std::hint::spin_loop();
        }
        done(seq, monotonic_ns());
        self.pending.pop_front();
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn publish_stamps_cross_a_memfd() {
        let producer = PublishStamps::create().unwrap();
        let consumer = PublishStamps::open(producer.fd().unwrap()).unwrap();
        assert_eq!(consumer.get(7), None);
        producer.record(7, 123);
        producer.record(8, 0);
        assert_eq!(consumer.get(7), Some(123));
        assert_eq!(consumer.get(8), Some(1), "a zero time is stored as 1, never as 'missing'");
        producer.record(7 + STAMP_SLOTS as u64, 456);
        assert_eq!(consumer.get(7), Some(456));
    }

    #[test]
    fn flag_waits_are_bounded_and_abortable() {
        let a = StudyFlags::create().unwrap();
        let b = StudyFlags::open(a.fd().unwrap()).unwrap();
        a.word(flag::PUBLISHED).store(3, Ordering::Release);
        assert!(b.wait(flag::PUBLISHED, 3, false, None, Duration::from_secs(1)).is_ok());
        assert!(b.wait(flag::PUBLISHED, 2, false, None, Duration::from_secs(1)).is_ok());
        assert!(b.wait(flag::PUBLISHED, 2, true, Some(Duration::from_micros(1)), Duration::from_millis(20)).is_err());
        let started = Instant::now();
        let err = b.wait(flag::CONSUMED, 1, false, Some(Duration::from_micros(10)), Duration::from_millis(30));
        assert!(matches!(err, Err(MeasurementError::Wait(why)) if why.contains("stayed at 0")));
        assert!(started.elapsed() < Duration::from_secs(1));
        a.abort();
        let err = b.wait(flag::CONSUMED, 1, false, None, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(&err, MeasurementError::Wait(why) if why == "the other side gave up"), "{err}");
    }

    #[test]
    fn clocks_move_forward() {
        let (t0, c0) = (monotonic_ns(), cpu_ns());
        let mut x = 0u64;
        for i in 0..200_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(monotonic_ns() > t0);
        assert!(cpu_ns() >= c0);
    }
}
