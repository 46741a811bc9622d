//! Consumers as real processes that come and go at random while the producer publishes flat out, on the fake backend
//! (host memory, no GPU): some read until they are SIGKILLed (often in the middle of attaching), some detach cleanly,
//! some exit without detaching, some hold a frame for a while. The producer must never stall or fail, every frame a
//! consumer reads must be intact, every consumer that was not killed must end well, and at the end every record must be
//! free again. Then producer processes are SIGKILLed at random and replaced on the same socket path: their consumers
//! must learn it within 2 s and attach to the next one. The GPU stress run (`gpu-ipc stress`) does the same with real
//! backends; this one runs in CI, where races in the frames layer (admission, watchdog, quarantine) show up first.
//!
//! The run is random but reproducible: it prints its seed, and `GPU_IPC_CHAOS_SEED=<seed>` replays its schedule (not
//! its timing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{frame_bytes, geometry};

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ipc_core::fake::{HostContext, HostFake};
use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig, SlowConsumerPolicy};
use ipc_core::wire::{BackendKind, ClientHello, Message, PROTOCOL_VERSION, SyncStrategy, recv_message};

const ROLE: &str = "GPU_IPC_CHAOS_CHILD";
const SOCKET: &str = "GPU_IPC_CHAOS_SOCKET";
const FRAMES: &str = "GPU_IPC_CHAOS_FRAMES";
/// How long the parent keeps spawning and killing.
const RUN_FOR: Duration = Duration::from_secs(6);
/// Children alive at most at once.
const MAX_CHILDREN: usize = 6;
/// Longest a child or the producer waits for anything.
const T: Duration = Duration::from_secs(10);
/// Longest the producer may go without publishing: a killed consumer's frame is released by the watchdog within
/// milliseconds, a holder keeps one for 30 ms.
const MAX_GAP: Duration = Duration::from_secs(2);

/// xorshift64*: enough randomness for a schedule, and no dependency.
struct Rng(u64);

impl Rng {
    fn seeded() -> (Self, u64) {
        let seed = std::env::var("GPU_IPC_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        });
        (Self(seed | 1), seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a child does once attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Reads until it is killed (or the producer goes).
    Reader,
    /// Reads its frames, then detaches.
    Detacher,
    /// Reads its frames, then exits without detaching (its record is left LIVE: the hang-up must free it).
    Quitter,
    /// Reads, holds one frame for 30 ms, reads on, then detaches.
    Holder,
}

impl Role {
    const ALL: [Self; 4] = [Self::Reader, Self::Detacher, Self::Quitter, Self::Holder];

    fn name(self) -> &'static str {
        match self {
            Self::Reader => "reader",
            Self::Detacher => "detacher",
            Self::Quitter => "quitter",
            Self::Holder => "holder",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// Not a test of its own: the body of the child processes the chaos tests start. Without the role variable (a
/// normal test run) it returns at once.
#[test]
#[ignore = "child-process entry point; run by the chaos tests, not on its own"]
fn child_process_entry_point() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    if role == "producer" {
        child_producer();
        return;
    }
    let Some(role) = Role::from_name(&role) else {
        panic!("unknown child role {role}");
    };
    let socket = PathBuf::from(std::env::var(SOCKET).unwrap());
    let frames: u64 = std::env::var(FRAMES).unwrap().parse().unwrap();
    match child(role, &socket, frames) {
        Ok(line) => println!("CHILD {line}"),
        Err(e) => {
            println!("CHILD error: {e}");
            std::process::exit(1);
        }
    }
}

/// Attaches, reads and leaves as `role` says; returns the line to report.
fn child(role: Role, socket: &Path, frames: u64) -> Result<String, FrameError> {
    let options = AttachOptions { name: role.name().into(), timeout: T, ..AttachOptions::default() };
    // A handshake the producer dropped (this process was too slow, e.g. stopped) is attached again.
    let mut attempts = 0;
    let mut c = loop {
        attempts += 1;
        match Consumer::<HostFake>::attach(&HostContext, socket, &options) {
            Err(FrameError::Config(message)) if message.contains("dropped this handshake") && attempts < 5 => {}
            other => break other?,
        }
    };
    let mut read = 0u64;
    let mut bad = 0u64;
    while role == Role::Reader || read < frames {
        let frame = match c.next_frame(None, T) {
            Ok(frame) => frame,
            Err(FrameError::ProducerGone { .. }) => return Ok(format!("gone read={read} bad={bad}")),
            Err(FrameError::EndOfStream { published, .. }) => {
                return Ok(format!("ended after {published} read={read} bad={bad}"));
            }
            // Stopped (SIGSTOP) long enough to hold the producer up: the eviction policy let it go.
            Err(FrameError::Evicted { .. }) => return Ok(format!("evicted read={read} bad={bad}")),
            Err(e) => return Err(e),
        };
        let mut got = vec![0u8; frame.bytes() as usize];
        c.region().read(frame.ptr(), &mut got).unwrap();
        let intact = got == frame_bytes(frame.seq().0, got.len());
        if role == Role::Holder && read == frames / 2 {
            thread::sleep(Duration::from_millis(30));
        }
        match c.release(frame, None) {
            // A release that succeeds vouches for what was read: the slot was held for us all along.
            Ok(()) => bad += u64::from(!intact),
            // Evicted meanwhile (stopped too long): what we read may have been rewritten under us; it does not
            // count (docs/protocol.md, "Check your record").
            Err(FrameError::Evicted { .. }) => return Ok(format!("evicted read={read} bad={bad}")),
            Err(e) => return Err(e),
        }
        read += 1;
    }
    match role {
        Role::Quitter => {
            // Out without a word: no detach, no teardown; the kernel closes the socket.
            println!("CHILD done read={read} bad={bad}");
            std::process::exit(0);
        }
        _ => c.detach(),
    }
    Ok(format!("done read={read} bad={bad}"))
}

/// A producer process: publishes flat out (strategy `GPU_IPC_CHAOS_SYNC`, one or two slots) until it is killed.
fn child_producer() {
    let socket = PathBuf::from(std::env::var(SOCKET).unwrap());
    let sync = match std::env::var("GPU_IPC_CHAOS_SYNC").as_deref() {
        Ok("cpu-sleep") => SyncStrategy::CpuSleep,
        _ => SyncStrategy::CpuSpin,
    };
    let slots = if std::process::id().is_multiple_of(2) { 1 } else { 2 };
    let mut p = Producer::<HostFake>::create(&HostContext, ProducerConfig::new(&socket, geometry(), slots, sync))
        .unwrap_or_else(|e| {
            println!("CHILD error: {e}");
            std::process::exit(1)
        });
    println!("CHILD listening");
    loop {
        let lease = p.acquire(None, T).unwrap();
        p.region().write(lease.ptr(), &frame_bytes(lease.seq().0, lease.bytes() as usize)).unwrap();
        p.publish(lease, None).unwrap();
    }
}

/// Bad clients at the front door while consumers come and go, until `knocking` turns false: connections closed at
/// once, garbage, a hello and then a hang-up (often while the producer prepares the offer, so the offer finds the
/// handshake gone and must give the record back), a hello and the offer taken and then a hang-up. Returns how many.
fn bad_clients(socket: &Path, knocking: &AtomicBool, mut rng: Rng) -> u32 {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    let hello = Message::ClientHello(ClientHello {
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        wanted_backend: Some(BackendKind::HostFake),
        consumer_name: "bad".into(),
    })
    .encode()
    .unwrap();
    let mut count = 0;
    while knocking.load(Ordering::Acquire) {
        thread::sleep(Duration::from_millis(rng.below(10)));
        let Ok(mut stream) = UnixStream::connect(socket) else { continue };
        count += 1;
        match rng.below(4) {
            0 => {}
            1 => {
                let garbage: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
                let _ = stream.write_all(&garbage);
            }
            2 => {
                let _ = stream.write_all(&hello);
            }
            _ => {
                let _ = stream.write_all(&hello);
                let _ = recv_message(stream.as_fd(), Duration::from_millis(200));
            }
        }
    }
    count
}

/// A child the parent started.
struct Spawned {
    child: Child,
    role: Role,
    killed: bool,
}

fn spawn(role: Role, socket: &Path, frames: u64) -> Spawned {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, role.name())
        .env(SOCKET, socket)
        .env(FRAMES, frames.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Spawned { child, role, killed: false }
}

/// What the producer thread saw.
#[derive(Debug, Default)]
struct ProducerRun {
    published: u64,
    longest_gap: Duration,
    error: Option<String>,
    lost: usize,
    evicted: usize,
    left_attached: usize,
}

/// Publishes until `stop`; then counts the consumers still attached once every one should be gone (within 1 s).
fn run_producer(
    socket: &Path,
    sync: SyncStrategy,
    slots: u32,
    configure: impl FnOnce(&mut ProducerConfig),
    stop: &AtomicBool,
) -> ProducerRun {
    let mut run = ProducerRun::default();
    let mut config = ProducerConfig::new(socket, geometry(), slots, sync);
    configure(&mut config);
    let mut p = Producer::<HostFake>::create(&HostContext, config).unwrap();
    let mut last = Instant::now();
    let mut publish = |p: &mut Producer<HostFake>, run: &mut ProducerRun| -> Result<(), FrameError> {
        let lease = p.acquire(None, T)?;
        p.region().write(lease.ptr(), &frame_bytes(lease.seq().0, lease.bytes() as usize)).unwrap();
        p.publish(lease, None)?;
        run.published += 1;
        run.longest_gap = run.longest_gap.max(last.elapsed());
        last = Instant::now();
        Ok(())
    };
    while !stop.load(Ordering::Acquire) {
        if let Err(e) = publish(&mut p, &mut run) {
            run.error = Some(format!("publishing frame {}: {e}", p.next_sequence()));
            return run;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while p.consumers() > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    run.lost = p.consumers_lost();
    run.evicted = p.consumers_evicted();
    run.left_attached = p.consumers();
    run
}

/// Reads the child's report line (after it exited).
fn report(spawned: &mut Spawned) -> String {
    let mut out = String::new();
    if let Some(stdout) = spawned.child.stdout.as_mut() {
        let _ = stdout.read_to_string(&mut out);
    }
    out.lines().find_map(|l| l.find("CHILD ").map(|i| l[i + 6..].to_owned())).unwrap_or_else(|| "no report".into())
}

/// Checks a child that ended on its own: exit 0 and no bad frame.
fn check_ended(spawned: &mut Spawned, seed: u64, failures: &mut Vec<String>) {
    let status = spawned.child.wait().unwrap();
    let line = report(spawned);
    if spawned.killed {
        return;
    }
    if !status.success() || !line.contains(" bad=0") {
        failures.push(format!("{} (seed {seed}): {status}: {line}", spawned.role.name()));
    }
}

fn chaos(sync: SyncStrategy, tag: &str) {
    let (mut rng, seed) = Rng::seeded();
    let slots = 1 + rng.below(4) as u32;
    eprintln!("chaos {tag}: seed {seed} (GPU_IPC_CHAOS_SEED=<seed> replays its schedule), {slots} slot(s)");
    let socket = std::env::temp_dir().join(format!("gpu-ipc-chaos-{}-{tag}.sock", std::process::id()));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (socket, stop) = (socket.clone(), stop.clone());
        thread::spawn(move || run_producer(&socket, sync, slots, |_| {}, &stop))
    };
    // The producer's socket exists once `create` returned.
    let ready = Instant::now() + T;
    while !socket.exists() && Instant::now() < ready {
        thread::sleep(Duration::from_millis(1));
    }
    let knocking = Arc::new(AtomicBool::new(true));
    let knocker = {
        let (socket, knocking) = (socket.clone(), knocking.clone());
        let rng = Rng(rng.next() | 1);
        thread::spawn(move || bad_clients(&socket, &knocking, rng))
    };
    let mut children: Vec<Spawned> = Vec::new();
    let mut failures = Vec::new();
    let (mut spawned, mut kills) = (0u32, 0u32);
    let started = Instant::now();
    while started.elapsed() < RUN_FOR {
        let mut index = 0;
        while index < children.len() {
            if children[index].child.try_wait().unwrap().is_some() {
                let mut ended = children.swap_remove(index);
                check_ended(&mut ended, seed, &mut failures);
            } else {
                index += 1;
            }
        }
        match rng.below(3) {
            0 | 1 if children.len() < MAX_CHILDREN => {
                let role = Role::ALL[rng.below(4) as usize];
                children.push(spawn(role, &socket, 20 + rng.below(200)));
                spawned += 1;
            }
            _ if !children.is_empty() => {
                // Kill anyone, readers most often (they never end on their own), whatever it is doing: starting
                // up, in the handshake, reading, holding a frame.
                let victim = rng.below(children.len() as u64) as usize;
                let target = &mut children[victim];
                if target.child.try_wait().unwrap().is_none() {
                    target.killed = target.child.kill().is_ok();
                    kills += u32::from(target.killed);
                }
            }
            _ => {}
        }
        thread::sleep(Duration::from_millis(rng.below(25)));
    }
    knocking.store(false, Ordering::Release);
    let knocks = knocker.join().unwrap();
    // Readers never end on their own: kill them; the others finish their frames.
    for child in &mut children {
        if child.role == Role::Reader && child.child.try_wait().unwrap().is_none() {
            child.killed = child.child.kill().is_ok();
            kills += u32::from(child.killed);
        }
    }
    for mut child in children {
        let deadline = Instant::now() + T;
        while child.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        if child.child.try_wait().unwrap().is_none() {
            failures.push(format!("{} (seed {seed}): still running after {T:?}", child.role.name()));
            let _ = child.child.kill();
        }
        check_ended(&mut child, seed, &mut failures);
    }
    // Every record must be free again (or about to be): 16 consumers attach at once, while the producer goes on
    // publishing flat out, read a few frames and detach.
    let readers: Vec<_> = (0..16)
        .map(|_| {
            let socket = socket.clone();
            thread::spawn(move || -> Result<(), FrameError> {
                let mut c = Consumer::<HostFake>::attach(&HostContext, &socket, &AttachOptions::default())?;
                for _ in 0..5 {
                    let frame = c.next_frame(None, T)?;
                    c.release(frame, None)?;
                }
                c.detach();
                Ok(())
            })
        })
        .collect();
    for reader in readers {
        if let Err(e) = reader.join().unwrap() {
            failures.push(format!("one of 16 consumers after the chaos (seed {seed}): {e}"));
        }
    }
    stop.store(true, Ordering::Release);
    let run = producer.join().unwrap();
    eprintln!(
        "chaos {tag}: {spawned} children, {kills} SIGKILLs, {knocks} bad clients, {} frames published, longest gap \
         {:?}, {} consumers lost, {} still attached at the end",
        run.published, run.longest_gap, run.lost, run.left_attached
    );
    assert!(run.error.is_none(), "seed {seed}: the producer failed: {:?}", run.error);
    assert!(run.longest_gap < MAX_GAP, "seed {seed}: the producer stalled for {:?}", run.longest_gap);
    assert!(failures.is_empty(), "seed {seed}: children failed:\n{}", failures.join("\n"));
    assert_eq!(run.left_attached, 0, "seed {seed}: consumers still counted after every one left");
    assert!(spawned > 20 && kills > 5, "seed {seed}: too little happened ({spawned} children, {kills} kills)");
}

#[test]
fn consumer_processes_come_and_go_and_are_killed_at_random_cpu_spin() {
    chaos(SyncStrategy::CpuSpin, "spin");
}

#[test]
fn consumer_processes_come_and_go_and_are_killed_at_random_cpu_sleep() {
    chaos(SyncStrategy::CpuSleep, "sleep");
}

/// Attaches to the producer at `socket`, retrying (for up to `T`) while none listens there yet.
fn attach_when_listening(socket: &Path) -> Result<Consumer<HostFake>, String> {
    let deadline = Instant::now() + T;
    loop {
        match Consumer::<HostFake>::attach(&HostContext, socket, &AttachOptions::default()) {
            Ok(c) => return Ok(c),
            Err(FrameError::Wire(ipc_core::wire::WireError::NoProducer { .. })) if Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(format!("attach: {e}")),
        }
    }
}

/// A consumer thread for the producer-kill test: attaches (retrying while no producer listens), reads and checks
/// frames until the producer is gone. Returns (frames read, bad frames, when it learned the producer was gone).
fn reader_until_gone(socket: PathBuf) -> thread::JoinHandle<Result<(u64, u64, Instant), String>> {
    thread::spawn(move || {
        let mut c = attach_when_listening(&socket)?;
        let (mut read, mut bad) = (0u64, 0u64);
        loop {
            match c.next_frame(None, T) {
                Ok(frame) => {
                    let mut got = vec![0u8; frame.bytes() as usize];
                    c.region().read(frame.ptr(), &mut got).unwrap();
                    bad += u64::from(got != frame_bytes(frame.seq().0, got.len()));
                    read += 1;
                    if let Err(e) = c.release(frame, None) {
                        if matches!(e, FrameError::ProducerGone { .. }) {
                            return Ok((read, bad, Instant::now()));
                        }
                        return Err(format!("release: {e}"));
                    }
                }
                Err(FrameError::ProducerGone { .. }) => return Ok((read, bad, Instant::now())),
                Err(e) => return Err(format!("next_frame after {read} frames: {e}")),
            }
        }
    })
}

/// Producer processes SIGKILLed at random moments, each replaced by a new one on the same socket path (the dead
/// one's socket file is stale): three consumers per round must read intact frames, learn within 2 s that the
/// producer is gone, and attach to the next one.
fn producer_kills(sync: &str) {
    let (mut rng, seed) = Rng::seeded();
    eprintln!("producer kills {sync}: seed {seed} (GPU_IPC_CHAOS_SEED=<seed> replays its schedule)");
    let socket = std::env::temp_dir().join(format!("gpu-ipc-chaos-{}-producer-{sync}.sock", std::process::id()));
    let mut slowest = Duration::ZERO;
    let mut frames = 0;
    for round in 0..12 {
        let mut producer = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
            .env(ROLE, "producer")
            .env(SOCKET, &socket)
            .env("GPU_IPC_CHAOS_SYNC", sync)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let readers: Vec<_> = (0..3).map(|_| reader_until_gone(socket.clone())).collect();
        thread::sleep(Duration::from_millis(50 + rng.below(250)));
        producer.kill().unwrap();
        let killed = Instant::now();
        let status = producer.wait().unwrap();
        // Killed by our SIGKILL, not ended by a panic of its own.
        assert_eq!(status.signal(), Some(9), "seed {seed}, round {round}: the producer ended on its own: {status}");
        for reader in readers {
            let (read, bad, gone_at) =
                reader.join().unwrap().unwrap_or_else(|e| panic!("seed {seed}, round {round}: a consumer: {e}"));
            assert_eq!(bad, 0, "seed {seed}, round {round}: {bad} of {read} frames were not intact");
            assert!(read > 0, "seed {seed}, round {round}: a consumer read nothing in at least 50 ms");
            let took = gone_at.saturating_duration_since(killed);
            assert!(
                took < Duration::from_secs(2),
                "seed {seed}, round {round}: ProducerGone came {took:?} after the kill"
            );
            slowest = slowest.max(took);
            frames += read;
        }
    }
    eprintln!(
        "producer kills {sync}: 12 producers killed, {frames} frames read, ProducerGone at most {slowest:?} after a kill"
    );
}

#[test]
fn producer_processes_are_killed_at_random_and_replaced_cpu_spin() {
    producer_kills("cpu-spin");
}

#[test]
fn producer_processes_are_killed_at_random_and_replaced_cpu_sleep() {
    producer_kills("cpu-sleep");
}

/// Readers frozen with SIGSTOP for 300-800 ms at random while the producer, with the eviction policy (200 ms),
/// publishes flat out: a frozen reader holds its frame, so the producer evicts it and goes on, never waiting much
/// longer than the window; thawed (SIGCONT), the reader learns it was evicted and ends well. Every frame read is
/// intact.
#[test]
fn frozen_consumers_are_evicted_and_the_producer_goes_on() {
    use rustix::process::{Pid, Signal, kill_process};
    let (mut rng, seed) = Rng::seeded();
    eprintln!("frozen: seed {seed} (GPU_IPC_CHAOS_SEED=<seed> replays its schedule)");
    let socket = std::env::temp_dir().join(format!("gpu-ipc-chaos-{}-frozen.sock", std::process::id()));
    let stop = Arc::new(AtomicBool::new(false));
    let window = Duration::from_millis(200);
    let producer = {
        let (socket, stop) = (socket.clone(), stop.clone());
        // Handshakes are cut short too (300 ms): a reader frozen in its handshake (rare: the window is about 100 us)
        // comes back to a dropped one, whose record may meanwhile be another reader's; it must notice, leave that
        // record alone and attach again. python_consumer.rs covers that case deterministically.
        let configure = move |c: &mut ProducerConfig| {
            c.slow_consumer = SlowConsumerPolicy::Evict { after: window };
            c.handshake_timeout = Duration::from_millis(300);
        };
        thread::spawn(move || run_producer(&socket, SyncStrategy::CpuSpin, 2, configure, &stop))
    };
    let ready = Instant::now() + T;
    while !socket.exists() && Instant::now() < ready {
        thread::sleep(Duration::from_millis(1));
    }
    let mut children: Vec<Spawned> = Vec::new();
    let mut failures = Vec::new();
    let (mut freezes, mut evicted_seen) = (0u32, 0u32);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        // Ended readers: frozen ones end "evicted"; they must end well, with intact frames.
        let mut index = 0;
        while index < children.len() {
            if children[index].child.try_wait().unwrap().is_some() {
                let mut ended = children.swap_remove(index);
                let status = ended.child.wait().unwrap();
                let line = report(&mut ended);
                evicted_seen += u32::from(line.starts_with("evicted"));
                if !status.success() || !line.contains(" bad=0") {
                    failures.push(format!("reader (seed {seed}): {status}: {line}"));
                }
            } else {
                index += 1;
            }
        }
        while children.len() < 3 {
            children.push(spawn(Role::Reader, &socket, 0));
        }
        thread::sleep(Duration::from_millis(100 + rng.below(200)));
        let victim = &children[rng.below(children.len() as u64) as usize];
        let pid = Pid::from_raw(victim.child.id() as i32).unwrap();
        kill_process(pid, Signal::STOP).unwrap();
        freezes += 1;
        thread::sleep(Duration::from_millis(300 + rng.below(500)));
        kill_process(pid, Signal::CONT).unwrap();
    }
    stop.store(true, Ordering::Release);
    let run = producer.join().unwrap();
    for mut child in children {
        let deadline = Instant::now() + T;
        while child.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        if child.child.try_wait().unwrap().is_none() {
            failures.push(format!("reader (seed {seed}): still running after {T:?}"));
            let _ = child.child.kill();
        }
        let status = child.child.wait().unwrap();
        let line = report(&mut child);
        evicted_seen += u32::from(line.starts_with("evicted"));
        if !status.success() || !line.contains(" bad=0") {
            failures.push(format!("reader (seed {seed}): {status}: {line}"));
        }
    }
    eprintln!(
        "frozen: {freezes} freezes, {} evictions ({evicted_seen} readers told), {} frames published, longest gap {:?}",
        run.evicted, run.published, run.longest_gap
    );
    assert!(run.error.is_none(), "seed {seed}: the producer failed: {:?}", run.error);
    assert!(failures.is_empty(), "seed {seed}: readers failed:\n{}", failures.join("\n"));
    // The window, plus a loaded machine's scheduling; a producer waiting for a frozen reader would show seconds.
    assert!(
        run.longest_gap < window + Duration::from_millis(500),
        "seed {seed}: the producer stalled for {:?}",
        run.longest_gap
    );
    // Not every freeze evicts (a reader frozen while it is still starting up holds nothing), most do.
    assert!(
        run.evicted >= 2 && evicted_seen >= 2,
        "seed {seed}: {} evictions, {evicted_seen} told, of {freezes} freezes",
        run.evicted
    );
}

/// A producer process paused (SIGSTOP, as `docker pause` or a debugger does) three times for 700 ms while two
/// consumers read: they must wait it out (their bounded waits time out, nothing else fails), go on with the very
/// next frame after each pause, and learn within 2 s that it is gone once it is SIGKILLed.
#[test]
fn a_paused_producer_is_waited_for_and_read_on_after() {
    use rustix::process::{Pid, Signal, kill_process};
    use std::sync::atomic::AtomicU64;
    let socket = std::env::temp_dir().join(format!("gpu-ipc-chaos-{}-paused.sock", std::process::id()));
    let mut producer = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, "producer")
        .env(SOCKET, &socket)
        .env("GPU_IPC_CHAOS_SYNC", "cpu-spin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let progress: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let readers: Vec<_> = (0..2)
        .map(|index| {
            let (socket, progress) = (socket.clone(), progress.clone());
            thread::spawn(move || -> Result<(u64, u64, Instant), String> {
                let mut c = attach_when_listening(&socket)?;
                let (mut read, mut timeouts, mut expected) = (0u64, 0u64, c.next_sequence());
                loop {
                    match c.next_frame(None, Duration::from_millis(200)) {
                        Ok(frame) => {
                            if frame.seq().0 != expected {
                                return Err(format!("frame {} after {}", frame.seq().0, expected - 1));
                            }
                            let mut got = vec![0u8; frame.bytes() as usize];
                            c.region().read(frame.ptr(), &mut got).unwrap();
                            if got != frame_bytes(frame.seq().0, got.len()) {
                                return Err(format!("frame {} not intact", frame.seq().0));
                            }
                            match c.release(frame, None) {
                                Ok(()) => {}
                                Err(FrameError::ProducerGone { .. }) => return Ok((read, timeouts, Instant::now())),
                                Err(e) => return Err(format!("release: {e}")),
                            }
                            read += 1;
                            expected += 1;
                            progress[index].store(read, Ordering::Release);
                        }
                        Err(FrameError::Timeout { .. }) => timeouts += 1,
                        Err(FrameError::ProducerGone { .. }) => return Ok((read, timeouts, Instant::now())),
                        Err(e) => return Err(format!("next_frame after {read} frames: {e}")),
                    }
                }
            })
        })
        .collect();
    let wait_for_progress = |more: u64| {
        let from: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Acquire)).collect();
        let deadline = Instant::now() + T;
        while progress.iter().zip(&from).any(|(p, f)| p.load(Ordering::Acquire) < f + more) {
            assert!(Instant::now() < deadline, "the readers stopped reading");
            thread::sleep(Duration::from_millis(5));
        }
    };
    let pid = Pid::from_raw(producer.id() as i32).unwrap();
    wait_for_progress(50);
    for _ in 0..3 {
        kill_process(pid, Signal::STOP).unwrap();
        thread::sleep(Duration::from_millis(700));
        kill_process(pid, Signal::CONT).unwrap();
        wait_for_progress(50);
    }
    producer.kill().unwrap();
    let killed = Instant::now();
    producer.wait().unwrap();
    for reader in readers {
        let (read, timeouts, gone_at) = reader.join().unwrap().unwrap_or_else(|e| panic!("a reader: {e}"));
        let took = gone_at.saturating_duration_since(killed);
        eprintln!(
            "paused producer: a reader read {read} frames, timed out {timeouts} times, learned of the kill after {took:?}"
        );
        assert!(timeouts >= 3, "the pauses were not seen ({timeouts} timeouts)");
        assert!(took < Duration::from_secs(2), "ProducerGone came {took:?} after the kill");
    }
}
