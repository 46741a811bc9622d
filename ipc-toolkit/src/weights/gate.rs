//! A reader's gate: one 64-bit word of its own (a page of host memory, registered for the device on a GPU
//! backend) that a small thread of the reader keeps equal to the newest published generation while some wait for a
//! newer one is pending, and marks "gone" when the owner closes the set or dies, or the reader closes. Stream waits
//! (`cuStreamWaitValue64`, wrap-safe "at least") and kernels wait on and read this word, never the owner's pool
//! directory: see [`WeightsReader::wait_on`](super::WeightsReader::wait_on) for why.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::stream_marks::StreamMarks;
use gpu_ipc_driver::{DevicePtr, HostRegistration};
use ipc_core::shm::{SharedMemory, SharedObject};

/// The bit of a status word that says the owner is gone (it closed the set or its process ended) or the reader
/// closed: set together with the newest generation seen (the low bits). `2^62`, not `u64::MAX`: a stream's
/// "at least" wait compares `(int64)(word - generation) >= 0`, which `u64::MAX` would fail for every generation.
pub const GONE_BIT: u64 = 1 << 62;
/// The largest generation a stream may wait for (the bits above it are [`GONE_BIT`]'s and the sign).
pub const MAX_GENERATION: u64 = GONE_BIT - 1;

/// How long the gate thread naps between two looks at the published generation while a wait is pending.
pub(super) const GATE_POLL: Duration = Duration::from_micros(20);

/// Bytes of the gate's memory: one page (host registration works on whole pages).
const GATE_BYTES: usize = 4096;

/// What the gate thread follows: the newest published generation and whether the owner is gone.
pub(super) trait GateSource: Send + 'static {
    /// The newest published generation (the pool directory's note word).
    fn newest(&self) -> u64;
    /// Whether the owner closed the set or its process ended.
    fn owner_gone(&self) -> bool;
}

/// The gate's word: its memory, and on a GPU backend its registration for the device. Kept alive by the reader and
/// by every [`GenerationWait`](super::GenerationWait) that points at it (and leaked, never unregistered, when a
/// stream may still poll it at teardown).
pub struct StatusWord {
    memory: Arc<SharedObject<AtomicU64>>,
    registration: Option<HostRegistration<SharedObject<AtomicU64>>>,
}

impl std::fmt::Debug for StatusWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWord").field("ptr", &self.ptr()).field("value", &self.load()).finish()
    }
}

impl StatusWord {
    /// The word's address for kernels: its device address on a GPU backend, its host address on the host backend.
    pub fn ptr(&self) -> DevicePtr {
        match &self.registration {
            Some(registration) => registration.device_ptr(),
            None => DevicePtr(self.memory.memory().as_ptr() as u64),
        }
    }

    /// The word now, as the CPU reads it.
    pub fn load(&self) -> u64 {
        self.memory.get().load(Ordering::Acquire)
    }

    /// The registration, on a GPU backend.
    pub(super) fn registration(&self) -> Option<&HostRegistration<SharedObject<AtomicU64>>> {
        self.registration.as_ref()
    }

    fn word(&self) -> &AtomicU64 {
        self.memory.get()
    }
}

/// Whether `word` lets a wait for `generation` go: the generation published, or the gone mark.
pub(super) fn released(word: u64, generation: u64) -> bool {
    word & GONE_BIT != 0 || (word & !GONE_BIT) >= generation
}

/// What the reader and the gate thread share.
struct Armed {
    /// The newest generation a pending wait asked for.
    wanted: u64,
    /// Whether the thread is following the note now (a wait is pending).
    polling: bool,
    stop: bool,
}

type Shared = (Mutex<Armed>, Condvar);

fn lock(shared: &Shared) -> MutexGuard<'_, Armed> {
    shared.0.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The word, and the thread that moves it while a wait is pending (asleep on a condition variable otherwise).
pub(super) struct Gate {
    word: Arc<StatusWord>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Gate {
    /// Makes the word (registered for `ctx`'s device when given) and starts its thread, idle until [`arm`].
    ///
    /// [`arm`]: Self::arm
    pub(super) fn new(ctx: Option<&gpu_ipc_driver::Context>, source: impl GateSource) -> Result<Self, String> {
        let memory = SharedMemory::create("gpu-ipc-weights-gate", GATE_BYTES)
            .and_then(SharedObject::new)
            .map_err(|e| format!("making its word in host memory: {e}"))?;
        let memory = Arc::new(memory);
        let registration = match ctx {
            Some(ctx) => Some(
                HostRegistration::new(ctx, Arc::clone(&memory))
                    .map_err(|e| format!("registering its word for the device: {e}"))?,
            ),
            None => None,
        };
        let word = Arc::new(StatusWord { memory, registration });
        refresh(word.word(), &source);
        let shared: Arc<Shared> =
            Arc::new((Mutex::new(Armed { wanted: 0, polling: false, stop: false }), Condvar::new()));
        let (theirs, their_word) = (Arc::clone(&shared), Arc::clone(&word));
        let thread = std::thread::Builder::new()
            .name("gpu-ipc-weights-gate".into())
            .spawn(move || follow(&their_word, &theirs, &source))
            .map_err(|e| format!("starting its thread: {e}"))?;
        Ok(Self { word, shared, thread: Some(thread) })
    }

    /// The word.
    pub(super) fn word(&self) -> &Arc<StatusWord> {
        &self.word
    }

    /// Asks the thread to follow the note until `generation` (or a newer one) is published or the owner goes;
    /// returns the word after one look of its own (so an already published generation needs no wait).
    pub(super) fn arm(&self, generation: u64, source: &impl GateSource) -> u64 {
        let word = refresh(self.word.word(), source);
        if !released(word, generation) {
            let mut armed = lock(&self.shared);
            armed.wanted = armed.wanted.max(generation);
            self.shared.1.notify_all();
        }
        word
    }

    /// Whether the thread is following the note now (a wait is pending).
    #[cfg(test)]
    pub(super) fn polling(&self) -> bool {
        lock(&self.shared).polling
    }

    /// Stops the thread and marks the word gone, which releases every wait still pending on it (nothing would
    /// move the word any more).
    pub(super) fn close(&mut self) {
        lock(&self.shared).stop = true;
        self.shared.1.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.word.word().fetch_or(GONE_BIT, Ordering::AcqRel);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.close();
    }
}

/// One look: the newest generation into the word (never backwards), then the gone mark if the owner is gone (with
/// a second look at the note, so a generation published just before the end is not missed). Returns the word.
fn refresh(word: &AtomicU64, source: &impl GateSource) -> u64 {
    let newest = source.newest().min(MAX_GENERATION);
    let mut now = word.fetch_max(newest, Ordering::AcqRel).max(newest);
    if now & GONE_BIT == 0 && source.owner_gone() {
        word.fetch_max(source.newest().min(MAX_GENERATION), Ordering::AcqRel);
        now = word.fetch_or(GONE_BIT, Ordering::AcqRel) | GONE_BIT;
        tracing::info!(
            newest = now & !GONE_BIT,
            "weights: the owner is gone: stream waits on this reader's gate released"
        );
    }
    now
}

/// The thread: asleep while no wait is pending; otherwise a look every [`GATE_POLL`].
fn follow(word: &StatusWord, shared: &Shared, source: &impl GateSource) {
    loop {
        {
            let mut armed = lock(shared);
            loop {
                if armed.stop {
                    return;
                }
                if released(word.load(), armed.wanted) {
                    armed.polling = false;
                    armed = shared.1.wait(armed).unwrap_or_else(PoisonError::into_inner);
                    continue;
                }
                armed.polling = true;
                break;
            }
        }
        refresh(word.word(), source);
        std::thread::sleep(GATE_POLL);
    }
}

/// How long a reader's teardown waits for its streams to pass the waits its gate released.
const SETTLE: Duration = Duration::from_secs(1);

/// A reader's gate and, on a GPU backend, the marks after the stream waits queued on its word.
pub(super) struct StreamGate {
    pub(super) gate: Gate,
    pub(super) marks: Option<StreamMarks>,
    /// Whether the device can queue 64-bit stream waits (asked once, at the first `wait_on`).
    pub(super) mem_ops: Option<bool>,
}

impl StreamGate {
    /// A gate with no stream wait queued yet.
    pub(super) fn new(gate: Gate) -> Self {
        Self { gate, marks: None, mem_ops: None }
    }

    /// Teardown: the gate marks its word gone (every queued wait is then released), then the streams get up to
    /// [`SETTLE`] to pass them; if one has not (a stream held behind other work), the word stays registered and
    /// mapped for good rather than be unregistered under a stream that may still poll it.
    fn close(mut self) {
        self.gate.close();
        let Some(mut marks) = self.marks.take() else { return };
        let word = Arc::clone(self.gate.word());
        if !marks.settle(SETTLE, |generation| released(word.load(), generation), "weights reader") {
            std::mem::forget(word);
        }
    }
}

/// The reader's stream-gate slot: the gate made at the first wait, and closed (settled) when the reader goes.
#[derive(Default)]
pub(super) struct GateSlot(std::sync::Mutex<Option<StreamGate>>);

impl GateSlot {
    pub(super) fn lock(&self) -> MutexGuard<'_, Option<StreamGate>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The gate, taken out for teardown.
    fn take(&mut self) -> Option<StreamGate> {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl Drop for GateSlot {
    fn drop(&mut self) {
        if let Some(gate) = self.take() {
            gate.close();
        }
    }
}

/// A set of parts' stream-gate slots, one a part (each gate's word is registered for that part's device).
pub(super) struct GateSlots(Vec<GateSlot>);

impl GateSlots {
    /// `parts` empty slots: each gate is made at the first wait on its part.
    pub(super) fn new(parts: usize) -> Self {
        Self((0..parts).map(|_| GateSlot::default()).collect())
    }

    /// Part `part`'s slot.
    pub(super) fn get(&self, part: usize) -> Option<&GateSlot> {
        self.0.get(part)
    }
}

impl Drop for GateSlots {
    /// Every gate is marked gone before any is settled: a stream on one part's device may wait behind a stream
    /// waiting on another part's word, and settling one gate while another still holds its waits would wait out
    /// [`SETTLE`] and leak the word for nothing.
    fn drop(&mut self) {
        let mut gates: Vec<StreamGate> = self.0.iter_mut().filter_map(GateSlot::take).collect();
        for gate in &mut gates {
            gate.gate.close();
        }
        for gate in gates {
            gate.close();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    /// A note and an owner the test moves by hand, counting the thread's looks.
    #[derive(Clone, Default)]
    struct Fake(Arc<(AtomicU64, AtomicBool, AtomicU64)>);

    impl GateSource for Fake {
        fn newest(&self) -> u64 {
            self.0.2.fetch_add(1, Ordering::Relaxed);
            self.0.0.load(Ordering::Acquire)
        }
        fn owner_gone(&self) -> bool {
            self.0.1.load(Ordering::Acquire)
        }
    }

    impl Fake {
        fn publish(&self, generation: u64) {
            self.0.0.store(generation, Ordering::Release);
        }
        fn looks(&self) -> u64 {
            self.0.2.load(Ordering::Relaxed)
        }
    }

    fn until(what: &str, within: Duration, condition: impl Fn() -> bool) -> Duration {
        let started = Instant::now();
        while !condition() {
            assert!(started.elapsed() < within, "{what}: not within {within:?}");
            std::thread::yield_now();
        }
        started.elapsed()
    }

    #[test]
    fn a_generation_published_after_the_wait_is_armed_reaches_the_word_and_the_thread_goes_idle() {
        let fake = Fake::default();
        fake.publish(3);
        let gate = Gate::new(None, fake.clone()).unwrap();
        assert_eq!(gate.word().load(), 3);
        assert!(!released(gate.arm(4, &fake), 4));
        until("the thread polls", Duration::from_secs(1), || gate.polling());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(gate.word().load(), 3, "nothing published yet");
        fake.publish(4);
        let took = until("generation 4 in the word", Duration::from_secs(1), || gate.word().load() == 4);
        eprintln!("the gate saw the new generation {took:?} after it was published (nap {GATE_POLL:?})");
        until("the thread goes idle", Duration::from_secs(1), || !gate.polling());
        let looks = fake.looks();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(fake.looks(), looks, "an idle gate does not look at the note");
        // Already published: arming needs no wait and wakes nobody.
        assert_eq!(gate.arm(2, &fake), 4);
        assert!(!gate.polling());
    }

    #[test]
    fn the_owner_gone_marks_the_word_and_releases_every_wait() {
        let fake = Fake::default();
        fake.publish(7);
        let gate = Gate::new(None, fake.clone()).unwrap();
        gate.arm(8, &fake);
        gate.arm(20, &fake);
        until("the thread polls", Duration::from_secs(1), || gate.polling());
        fake.0.1.store(true, Ordering::Release);
        let took = until("the gone mark", Duration::from_secs(1), || gate.word().load() & GONE_BIT != 0);
        eprintln!("the gate marked the owner gone {took:?} after it went");
        let word = gate.word().load();
        assert_eq!(word, GONE_BIT | 7, "the gone mark keeps the newest generation seen");
        assert!(released(word, 8) && released(word, 20));
        // What a stream's "at least" wait computes: (int64)(word - generation) >= 0.
        assert!((word.wrapping_sub(20) as i64) >= 0 && (word.wrapping_sub(MAX_GENERATION) as i64) >= 0);
        until("the thread goes idle", Duration::from_secs(1), || !gate.polling());
    }

    #[test]
    fn closing_with_a_pending_wait_stops_the_thread_and_releases_the_wait() {
        let fake = Fake::default();
        fake.publish(1);
        let mut gate = Gate::new(None, fake.clone()).unwrap();
        gate.arm(2, &fake);
        until("the thread polls", Duration::from_secs(1), || gate.polling());
        let word = Arc::clone(gate.word());
        let started = Instant::now();
        gate.close();
        assert!(started.elapsed() < Duration::from_millis(100), "close took {:?}", started.elapsed());
        assert_eq!(word.load(), GONE_BIT | 1);
        let looks = fake.looks();
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(fake.looks(), looks, "the thread is stopped");
        drop(gate);
        assert_eq!(word.load(), GONE_BIT | 1, "the word outlives the gate while a wait points at it");
    }

    #[test]
    fn the_word_never_goes_backwards_and_the_gone_mark_sticks() {
        let fake = Fake::default();
        fake.publish(5);
        let gate = Gate::new(None, fake.clone()).unwrap();
        fake.publish(2);
        assert_eq!(gate.arm(3, &fake), 5);
        fake.0.1.store(true, Ordering::Release);
        assert_eq!(gate.arm(9, &fake), GONE_BIT | 5);
        fake.0.1.store(false, Ordering::Release);
        fake.publish(9);
        assert_eq!(gate.arm(9, &fake), GONE_BIT | 5, "gone is final");
    }
}
