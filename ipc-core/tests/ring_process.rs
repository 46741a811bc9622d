//! The ring control block shared between real processes: a child started from this very test binary
//! (`GPU_IPC_RING_CHILD` selects its role) attaches from an inherited memfd, and either side is SIGKILLed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ipc_core::ring::layout::ConsumerState;
use ipc_core::ring::{
    ConsumerControl, ConsumerId, GoneReason, LivenessPolicy, POISON, ProducerControl, RingConfig, RingError, Sequence,
    SlotIndex, WaitMode,
};
use ipc_core::shm::{SharedMemory, SharedObject};
use rustix::io::FdFlags;
use rustix::process::Pid;

const ROLE: &str = "GPU_IPC_RING_CHILD";
const CONTROL_FD: &str = "GPU_IPC_RING_CONTROL_FD";
const DATA_FD: &str = "GPU_IPC_RING_DATA_FD";
const FRAMES: &str = "GPU_IPC_RING_FRAMES";
const SLOTS: u32 = 4;

/// The "frames": one u64 per slot in a second shared memfd, which must equal the frame's sequence.
type FrameData = SharedObject<[AtomicU64; SLOTS as usize]>;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

/// An inheritable duplicate of `fd` (std and rustix create close-on-exec descriptors).
fn inheritable(fd: &SharedMemory) -> OwnedFd {
    let dup = rustix::io::dup(fd.fd()).unwrap();
    rustix::io::fcntl_setfd(&dup, FdFlags::empty()).unwrap();
    dup
}

/// Opens a descriptor of a process by number through /proc, which needs no unsafe `from_raw_fd`.
fn open_proc_fd(pid: u32, fd: &str) -> OwnedFd {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/fd/{fd}")).unwrap();
    OwnedFd::from(file)
}

fn spawn_child(role: &str, envs: &[(&str, String)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (key, value) in envs {
        command.env(key, value);
    }
    command.spawn().unwrap()
}

/// Reads the child's stdout until a line containing `prefix` and returns what follows it.
fn read_tagged_line(reader: &mut impl BufRead, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "child ended before printing {prefix}");
        // libtest prints "test child_process_entry_point ... " without a newline before the child's output.
        if let Some(start) = line.find(prefix) {
            return line[start + prefix.len()..].trim().to_owned();
        }
    }
}

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace().find_map(|pair| pair.strip_prefix(key)?.strip_prefix('=')).unwrap().parse().unwrap()
}

/// Not a test of its own: the body of the child processes the other tests start. Without the role variable (a
/// normal test run) it returns at once.
#[test]
#[ignore = "child-process entry point; run by the cross-process tests, not on its own"]
fn child_process_entry_point() {
    match std::env::var(ROLE).as_deref() {
        Ok("consumer") => child_consumer(),
        Ok("producer") => child_producer(),
        _ => {}
    }
}

/// Consumes frames with CPU spin until `FRAMES` are done or the producer closes, checking each frame's data.
fn child_consumer() {
    let pid = std::process::id();
    let control = open_proc_fd(pid, &std::env::var(CONTROL_FD).unwrap());
    let data = open_proc_fd(pid, &std::env::var(DATA_FD).unwrap());
    let frames: u64 = std::env::var(FRAMES).unwrap().parse().unwrap();
    let mut id_line = String::new();
    std::io::stdin().read_line(&mut id_line).unwrap();
    let id = ConsumerId::from_u64(id_line.trim().parse().unwrap());
    let consumer = ConsumerControl::attach(control, id, LivenessPolicy::default()).unwrap();
    let data = FrameData::new(SharedMemory::from_fd(data, SLOTS as usize * 8).unwrap()).unwrap();
    let first = consumer.join_sequence();
    let mut seq = first;
    let mut sum = 0u64;
    while seq.0 - first.0 < frames {
        match consumer.wait_published(seq, deadline(), WaitMode::Spin) {
            Ok(()) => {}
            Err(RingError::ProducerGone { reason: GoneReason::Closed, .. }) => break,
            Err(other) => panic!("consumer wait failed: {other}"),
        }
        let value = data.get()[consumer.block().slot_for(seq).0 as usize].load(Ordering::Relaxed);
        assert_eq!(value, seq.0, "frame data does not match its sequence");
        sum = sum.wrapping_add(value);
        consumer.release(seq).unwrap();
        seq = seq.next();
    }
    println!("CONSUMED first={} count={} sum={}", first.0, seq.0 - first.0, sum);
}

/// Creates a ring, registers its parent as consumer, publishes 3 frames, reports, then idles until killed.
fn child_producer() {
    let config = RingConfig { slot_count: 2, max_consumers: 2, generation: 1 };
    let producer = ProducerControl::create(config, LivenessPolicy::default()).unwrap();
    let parent = rustix::process::getppid().unwrap();
    let id = producer.register_consumer(parent).unwrap();
    for s in 0..2 {
        producer.publish(Sequence(s)).unwrap();
    }
    let fd = producer.block().memory().fd().as_raw_fd();
    println!("RING fd={fd} id={}", id.to_u64());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

struct Ring {
    producer: ProducerControl,
    data: FrameData,
}

fn parent_ring(max_consumers: u32) -> Ring {
    let config = RingConfig { slot_count: SLOTS, max_consumers, generation: 42 };
    let producer = ProducerControl::create(config, LivenessPolicy::default()).unwrap();
    let data = FrameData::new(SharedMemory::create("ring-test-data", SLOTS as usize * 8).unwrap()).unwrap();
    Ring { producer, data }
}

/// Starts a consumer child on `ring` and registers it; returns the child and its id.
fn start_consumer(ring: &Ring, frames: u64) -> (Child, ConsumerId) {
    let control = inheritable(ring.producer.block().memory());
    let data = inheritable(ring.data.memory());
    let mut child = spawn_child(
        "consumer",
        &[
            (CONTROL_FD, control.as_raw_fd().to_string()),
            (DATA_FD, data.as_raw_fd().to_string()),
            (FRAMES, frames.to_string()),
        ],
    );
    drop((control, data));
    let pid = Pid::from_raw(child.id() as i32).unwrap();
    let id = ring.producer.register_consumer(pid).unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "{}", id.to_u64()).unwrap();
    (child, id)
}

/// Publishes frame `seq` (writes its data, then the counter) after waiting for its slot.
fn produce(ring: &Ring, seq: Sequence) -> Result<(), RingError> {
    ring.producer.wait_reusable(seq, deadline(), WaitMode::Spin)?;
    ring.data.get()[ring.producer.slot_for(seq).0 as usize].store(seq.0, Ordering::Relaxed);
    ring.producer.publish(seq)
}

#[test]
fn child_consumes_ten_thousand_frames() {
    const COUNT: u64 = 10_000;
    let ring = parent_ring(2);
    let (mut child, _id) = start_consumer(&ring, COUNT);
    for s in 0..COUNT {
        produce(&ring, Sequence(s)).unwrap();
    }
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let report = read_tagged_line(&mut stdout, "CONSUMED ");
    assert!(child.wait().unwrap().success());
    assert_eq!(field(&report, "first"), 0);
    assert_eq!(field(&report, "count"), COUNT);
    assert_eq!(field(&report, "sum"), COUNT * (COUNT - 1) / 2);
}

#[test]
fn producer_survives_a_killed_consumer() {
    const TOTAL: u64 = 3_000;
    const KILL_AT: u64 = 1_000;
    let ring = parent_ring(2);
    let (mut child, id) = start_consumer(&ring, u64::MAX);
    let mut gone = Vec::new();
    let mut s = 0;
    while s < TOTAL {
        if s == KILL_AT {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap(); // reap, so kill(pid, 0) says ESRCH
        }
        match produce(&ring, Sequence(s)) {
            Ok(()) => s += 1,
            Err(RingError::ConsumerGone { consumer, reason: GoneReason::ProcessExited, .. }) => {
                gone.push((s, consumer));
                ring.producer.mark_consumer_dead(consumer).unwrap();
            }
            Err(other) => panic!("frame {s}: {other}"),
        }
    }
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(gone[0].1, id);
    // The consumer was at most N frames behind when it died.
    assert!(gone[0].0 >= KILL_AT && gone[0].0 <= KILL_AT + u64::from(SLOTS), "{gone:?}");
    assert_eq!(ring.producer.block().next_sequence(), Sequence(TOTAL));
    assert_eq!(ring.producer.block().consumer_state(id.index()), Some((ConsumerState::Dead, id.epoch())));
    let record = ring.producer.block().record_at(id.index()).unwrap();
    for slot in 0..SLOTS {
        assert_eq!(record.released(SlotIndex(slot)).load(Ordering::SeqCst), POISON);
    }
}

#[test]
fn killed_producer_is_reported_within_a_second() {
    let mut child = spawn_child("producer", &[]);
    let child_pid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let line = read_tagged_line(&mut stdout, "RING ");
    let control = open_proc_fd(child_pid, &field(&line, "fd").to_string());
    let id = ConsumerId::from_u64(field(&line, "id"));
    let consumer = ConsumerControl::attach(control, id, LivenessPolicy::default()).unwrap();
    assert_eq!(consumer.block().producer_pid(), u64::from(child_pid));
    for s in 0..2 {
        consumer.wait_published(Sequence(s), deadline(), WaitMode::Spin).unwrap();
        consumer.release(Sequence(s)).unwrap();
    }
    let (result, killed_at) = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let result = consumer.wait_published(Sequence(2), deadline(), WaitMode::Spin);
            (result, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(50));
        let killed_at = Instant::now();
        child.kill().unwrap();
        child.wait().unwrap();
        let (result, returned_at) = waiter.join().unwrap();
        (result, returned_at.duration_since(killed_at))
    });
    match result {
        Err(RingError::ProducerGone { pid, reason: GoneReason::ProcessExited }) => {
            assert_eq!(pid, u64::from(child_pid))
        }
        other => panic!("expected ProducerGone, got {other:?}"),
    }
    assert!(killed_at < Duration::from_secs(1), "took {killed_at:?}");
    // Survivor duty: release every GPU wait on frames that will never come.
    let last = consumer.highest_published();
    consumer.poison_published();
    assert!(ipc_core::ring::is_poisoned(consumer.block().published(SlotIndex(0)).load(Ordering::SeqCst)));
    assert_eq!(consumer.highest_published(), last, "the poison keeps which frames were published");
}
