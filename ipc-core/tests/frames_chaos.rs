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

use common::chaos::{Rng, Role, Spawned, T, report, spawn};
use common::{frame_bytes, geometry};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig, SlowConsumerPolicy};
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::{BackendKind, ClientHello, Message, PROTOCOL_VERSION, SyncStrategy, recv_message};

/// How long the parent keeps spawning and killing.
const RUN_FOR: Duration = Duration::from_secs(6);
/// Children alive at most at once.
const MAX_CHILDREN: usize = 6;
/// Longest the producer may go without publishing: a killed consumer's frame is released by the watchdog within
/// milliseconds, a holder keeps one for 30 ms.
const MAX_GAP: Duration = Duration::from_secs(2);

/// Not a test of its own: the body of the child processes the chaos tests start. Without the role variable (a
/// normal test run) it returns at once.
#[test]
#[ignore = "child-process entry point; run by the chaos tests, not on its own"]
fn child_process_entry_point() {
    common::chaos::child_process_entry_point();
}

/// Bad clients at the front door while consumers come and go, until `knocking` turns false: connections closed at
/// once, garbage, a hello and then a hang-up (often while the producer prepares the offer, so the offer finds the
/// handshake gone and must give the record back), a hello and the offer taken and then a hang-up. Returns how many.
fn bad_clients(socket: &Path, knocking: &AtomicBool, mut rng: Rng) -> u32 {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    let hello = Message::ClientHello(ClientHello {
        object: Default::default(),
        part: 0,
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        wanted_backend: Some(BackendKind::Host),
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
    let mut p = Producer::<Host>::create(&HostContext, config).unwrap();
    let mut last = Instant::now();
    let mut publish = |p: &mut Producer<Host>, run: &mut ProducerRun| -> Result<(), FrameError> {
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
                let mut c = Consumer::<Host>::attach(&HostContext, &socket, &AttachOptions::default())?;
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
        // A reader spawned (or thawed into a new attach) as the run ended may knock while the producer shuts down:
        // the clean refusal it gets then is the protocol working, not a failure.
        let refused_at_shutdown = line.contains("producer shutting down");
        if !refused_at_shutdown && (!status.success() || !line.contains(" bad=0")) {
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
