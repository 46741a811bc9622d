//! Producer processes SIGKILLed or paused (SIGSTOP) at random while consumers read, on the fake backend (host
//! memory, no GPU): consumers must read intact frames, wait out a pause, learn within 2 s that a killed producer is
//! gone and attach to the next one on the same socket path. The consumer side of the chaos run is `frames_chaos.rs`;
//! both re-run their own binary as the child processes (`common/chaos.rs`).
//!
//! The run is random but reproducible: it prints its seed, and `GPU_IPC_CHAOS_SEED=<seed>` replays its schedule (not
//! its timing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::chaos::{ROLE, Rng, SOCKET, T};
use common::{RemoveOnDrop, frame_bytes};

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use ipc_core::frames::{AttachOptions, Consumer, FrameError};
use ipc_core::host::{Host, HostContext};

/// Not a test of its own: the body of the child processes the chaos tests start. Without the role variable (a
/// normal test run) it returns at once.
#[test]
#[ignore = "child-process entry point; run by the chaos tests, not on its own"]
fn child_process_entry_point() {
    common::chaos::child_process_entry_point();
}

/// Attaches to the producer at `socket`, retrying (for up to `T`) while none listens there yet.
fn attach_when_listening(socket: &Path) -> Result<Consumer<Host>, String> {
    let deadline = Instant::now() + T;
    loop {
        match Consumer::<Host>::attach(&HostContext, socket, &AttachOptions::default()) {
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
    let _cleanup = RemoveOnDrop(socket.clone());
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

/// A producer process paused (SIGSTOP, as `docker pause` or a debugger does) three times for 700 ms while two
/// consumers read: they must wait it out (their bounded waits time out, nothing else fails), go on with the very
/// next frame after each pause, and learn within 2 s that it is gone once it is SIGKILLed.
#[test]
fn a_paused_producer_is_waited_for_and_read_on_after() {
    use rustix::process::{Pid, Signal, kill_process};
    use std::sync::atomic::AtomicU64;
    let socket = std::env::temp_dir().join(format!("gpu-ipc-chaos-{}-paused.sock", std::process::id()));
    let _cleanup = RemoveOnDrop(socket.clone());
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
