//! The kernel lease: how a kernel launched on the ring learns that its process is gone.
//!
//! Under MPS, a process SIGKILLed while its persistent kernel runs leaves that kernel to the MPS server, which must
//! tear down a kernel that never ends; on the H200 that faulted the server's other clients (CUDA error 700) in 2 of
//! 3 kills of a persistent producer, where frame graphs and gpu-poll waits (kernels that end by themselves) faulted
//! none (docs/results, stress.md, "Kills while a kernel waits on shared memory"). So a kernel on the ring ends by
//! itself once its process is gone, two ways (docs/frames.md, "Kills under MPS"):
//!
//! - **the heartbeat**: one thread per process (started with the first port) adds 1 to the heartbeat word of every
//!   live port every [`HEARTBEAT_PERIOD`]; a kernel that sees the word stand still for the lease (measured with
//!   `%globaltimer`, so no clock is shared between host and GPU) leaves with `GPU_IPC_RING_ORPHANED`. The word lives
//!   in the port, memory this process owns, so nothing another process does can keep a dead process's kernel
//!   alive.
//! - **the survivor's abort word**: a consumer that sees its producer hang up raises the producer's kernel abort
//!   word in the control block; a producer that declares a consumer dead raises that consumer's
//!   (`crate::ring::layout::RingLayout::kernel_abort_offset`). Kernels watch their peer's word beside their own
//!   abort word, so with a survivor they leave within about a millisecond, before the lease runs out.
//!
//! Both are on by default ([`KernelLease::default`]); [`LEASE_ENV`] sets the lease or turns both off, for the stress
//! run's comparison and for diagnosis. A process stopped for longer than the lease (`SIGSTOP`, a debugger's
//! breakpoint) finds its kernels gone when it resumes: they ended as orphaned.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

/// How often the heartbeat thread moves every port's heartbeat word forward.
pub const HEARTBEAT_PERIOD: Duration = Duration::from_millis(10);

/// The environment variable that sets the kernel lease of every side of this process, read when a producer or
/// consumer is made: a number of milliseconds (`100`), or `0` or `off` for no lease and no survivor's abort word
/// (kernels then leave only on their own abort word and their deadlines). Unset: [`KernelLease::DEFAULT`].
pub const LEASE_ENV: &str = "GPU_IPC_KERNEL_LEASE_MS";

/// How a side's kernels on the ring learn that their process is gone ([`crate::frames::Producer::set_kernel_lease`],
/// [`crate::frames::Consumer::set_kernel_lease`]; module `resident`, "the kernel lease").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelLease {
    /// A kernel leaves once this process's heartbeat has stood still for this long, or at once when the survivor
    /// raises this side's kernel abort word in the control block.
    After(Duration),
    /// Neither: kernels leave only on the abort word this process raises (drop, finish, its watchdog) and on their
    /// own deadlines. A kernel of a killed process then spins until its deadline, which under MPS faults the other
    /// clients (docs/frames.md, "Kills under MPS"): for measuring that, not for use.
    Off,
}

impl KernelLease {
    /// The lease unless [`LEASE_ENV`] says otherwise: 100 ms, ten heartbeats, so that a heartbeat thread delayed by
    /// a loaded CPU does not end a live process's kernels, while a killed process's kernels leave within about
    /// 100 ms.
    pub const DEFAULT: Duration = Duration::from_millis(100);

    /// The lease [`LEASE_ENV`] asks for ([`KernelLease::DEFAULT`] when unset or not understood, with a warning).
    pub fn from_env() -> Self {
        let lease = parse(std::env::var_os(LEASE_ENV).as_deref());
        match &lease {
            Ok(Self::Off) => tracing::info!("{LEASE_ENV}=0: kernels on the ring get no lease and no survivor's abort"),
            Ok(_) => {}
            Err(value) => tracing::warn!("{LEASE_ENV}={value:?} is not a number of milliseconds or off; using 100"),
        }
        lease.unwrap_or(Self::After(Self::DEFAULT))
    }

    /// The lease in nanoseconds as the exit words carry it (0: none).
    pub(crate) fn lease_ns(self) -> u64 {
        match self {
            Self::After(lease) => u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX).max(1),
            Self::Off => 0,
        }
    }

    /// Whether the survivor's abort word is watched too.
    pub(crate) fn watches_peer(self) -> bool {
        self != Self::Off
    }
}

impl Default for KernelLease {
    /// [`KernelLease::from_env`].
    fn default() -> Self {
        Self::from_env()
    }
}

/// [`LEASE_ENV`]'s value: `Err` with the value when it is not understood.
fn parse(value: Option<&OsStr>) -> Result<KernelLease, String> {
    let Some(value) = value else { return Ok(KernelLease::After(KernelLease::DEFAULT)) };
    let text = value.to_string_lossy();
    match text.trim() {
        "0" | "off" => Ok(KernelLease::Off),
        ms => ms.parse::<u64>().map(|ms| KernelLease::After(Duration::from_millis(ms))).map_err(|_| text.into_owned()),
    }
}

/// A heartbeat word: where the heartbeat thread adds 1 each period.
pub(crate) trait HeartbeatWord: Send + Sync {
    /// The word.
    fn heartbeat(&self) -> &AtomicU64;
}

/// The ports whose heartbeat words the thread moves, and the condition it sleeps on while there are none.
struct Beats {
    words: Mutex<Vec<Weak<dyn HeartbeatWord>>>,
    some: Condvar,
}

fn beats() -> &'static Beats {
    static BEATS: OnceLock<Beats> = OnceLock::new();
    static THREAD: OnceLock<()> = OnceLock::new();
    let beats = BEATS.get_or_init(|| Beats { words: Mutex::new(Vec::new()), some: Condvar::new() });
    THREAD.get_or_init(|| {
        let spawned = std::thread::Builder::new().name("gpu-ipc-heartbeat".into()).spawn(move || run(beats));
        if let Err(error) = spawned {
            tracing::error!(%error, "no heartbeat thread: kernels on the ring will leave as orphaned after their lease");
        }
    });
    beats
}

/// Moves `word` forward every [`HEARTBEAT_PERIOD`] for as long as it lives (the thread drops it after its last
/// owner).
pub(crate) fn keep_beating(word: &Arc<dyn HeartbeatWord>) {
    let beats = beats();
    if let Ok(mut words) = beats.words.lock() {
        // A first beat now: a kernel launched before the next period sees the word move within one period.
        word.heartbeat().fetch_add(1, Ordering::Release);
        words.push(Arc::downgrade(word));
        beats.some.notify_all();
    }
}

fn run(beats: &Beats) {
    loop {
        let Ok(mut words) = beats.words.lock() else { return };
        while words.is_empty() {
            match beats.some.wait(words) {
                Ok(guard) => words = guard,
                Err(_) => return,
            }
        }
        words.retain(|word| match word.upgrade() {
            Some(word) => {
                word.heartbeat().fetch_add(1, Ordering::Release);
                true
            }
            None => false,
        });
        drop(words);
        std::thread::sleep(HEARTBEAT_PERIOD);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_lease_is_100_ms_unless_the_environment_sets_it_or_turns_it_off() {
        let after = |ms| Ok(KernelLease::After(Duration::from_millis(ms)));
        assert_eq!(parse(None), after(100));
        assert_eq!(parse(Some(OsStr::new("50"))), after(50));
        assert_eq!(parse(Some(OsStr::new(" 250 "))), after(250));
        assert_eq!(parse(Some(OsStr::new("0"))), Ok(KernelLease::Off));
        assert_eq!(parse(Some(OsStr::new("off"))), Ok(KernelLease::Off));
        assert_eq!(parse(Some(OsStr::new("soon"))), Err("soon".to_owned()));
        assert_eq!(KernelLease::After(Duration::from_millis(100)).lease_ns(), 100_000_000);
        assert_eq!(KernelLease::Off.lease_ns(), 0);
        assert_eq!(KernelLease::After(Duration::ZERO).lease_ns(), 1, "a zero lease is not \"none\"");
        assert!(!KernelLease::Off.watches_peer() && KernelLease::After(Duration::from_millis(1)).watches_peer());
    }

    struct Word(AtomicU64);

    impl HeartbeatWord for Word {
        fn heartbeat(&self) -> &AtomicU64 {
            &self.0
        }
    }

    /// Reads the word until it moved `beats` times, at most `limit`.
    fn beats_within(word: &AtomicU64, beats: u64, limit: Duration) -> Option<Duration> {
        let (start, first) = (Instant::now(), word.load(Ordering::Acquire));
        while start.elapsed() < limit {
            if word.load(Ordering::Acquire) >= first + beats {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    #[test]
    fn the_heartbeat_moves_every_live_word_each_period_and_forgets_dropped_ones() {
        let (a, b): (Arc<dyn HeartbeatWord>, Arc<dyn HeartbeatWord>) =
            (Arc::new(Word(AtomicU64::new(0))), Arc::new(Word(AtomicU64::new(0))));
        keep_beating(&a);
        assert!(a.heartbeat().load(Ordering::Acquire) >= 1, "a first beat at once");
        keep_beating(&b);
        // Ten beats take ten periods (100 ms); a loaded machine gets ten times that.
        let ten = beats_within(a.heartbeat(), 10, 100 * HEARTBEAT_PERIOD).unwrap();
        assert!(ten >= 9 * HEARTBEAT_PERIOD, "ten beats in {ten:?}: faster than the period");
        assert!(beats_within(b.heartbeat(), 10, 100 * HEARTBEAT_PERIOD).is_some());
        // Dropped, a word is forgotten (the thread held only a weak reference); the other keeps beating.
        let weak = Arc::downgrade(&a);
        drop(a);
        assert!(weak.upgrade().is_none());
        assert!(beats_within(b.heartbeat(), 3, 100 * HEARTBEAT_PERIOD).is_some());
    }
}
