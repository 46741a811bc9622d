//! The producer side of the protocol is implementable from its documentation alone, and the Rust consumer copes
//! with a producer it did not write: `tests/python/producer.py`, a host-fake producer in pure Python written only
//! from `docs/protocol.md` and `docs/ring.md`, runs as a separate process and `Consumer<Host>`s attach to it.
//! Two consumers read every frame intact and detach cleanly; a consumer process SIGKILLed while it holds a frame
//! is declared lost and the producer finishes for the other one; consumers of a SIGKILLed producer get
//! `ProducerGone` within 2 s; and a consumer behind a producer that closes cleanly reads every frame published
//! before the close, then gets `EndOfStream`.
//!
//! These tests need python3 (3.11 or later; `PYTHON` names another interpreter). Without one they fail, saying so.
//! Every wait is bounded; a child process still running when its test ends is killed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::frame_bytes;
use common::python::{Finished, KillOnDrop, PyScript, line_reader};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ipc_core::frames::{AttachOptions, Consumer, FrameError};
use ipc_core::host::{Host, HostContext};

const T: Duration = Duration::from_secs(10);
const SCRIPT: &str = "producer.py";
/// Environment of the child consumer process (see [`child_process_entry_point`]).
const ROLE: &str = "GPU_IPC_PYPROD_ROLE";
const SOCKET: &str = "GPU_IPC_PYPROD_SOCKET";
/// Frames the child reads and releases before it holds one.
const CHILD_RELEASES: u64 = 20;

fn sock(name: &str) -> PathBuf {
    common::sock("pyprod", name)
}

/// Exit 0 and the summary's counts: `(published, attached, left, lost)`.
fn assert_counts(finished: &Finished, published: u64, attached: u64, left: u64, lost: u64) {
    assert_eq!(finished.code, Some(0), "{}", finished.describe());
    let got = (
        finished.summary("published"),
        finished.summary("attached"),
        finished.summary("left"),
        finished.summary("lost"),
    );
    assert_eq!(got, (published, attached, left, lost), "(published, attached, left, lost)\n{}", finished.describe());
}

/// A Python producer process, listening once [`PyProducer::spawn`] returns; killed on drop if still running.
struct PyProducer {
    socket: PathBuf,
    process: PyScript,
}

impl PyProducer {
    /// Starts `producer.py --socket <name's path> <options>` and waits (bounded) for its "listening" line.
    fn spawn(name: &str, options: &[&str]) -> Self {
        let socket = sock(name);
        let mut process = PyScript::spawn(&common::python::python(11), SCRIPT, "python producer", &socket, options);
        match process.next_line(T) {
            Some(line) if line.contains("\"listening\"") => {}
            Some(_) => panic!("the producer did not start\n{}", process.wait(T).describe()),
            None => panic!("the producer did not say it listens within {T:?}\n{}", process.wait(T).describe()),
        }
        Self { socket, process }
    }
}

fn attach(socket: &Path) -> Result<Consumer<Host>, FrameError> {
    Consumer::<Host>::attach(&HostContext, socket, &AttachOptions::default())
}

/// Reads `frames` frames, checking every byte; returns (first seq, frames read, bad frames, last seq).
fn read_frames(c: &mut Consumer<Host>, frames: u64) -> Result<(u64, u64, u64, Option<u64>), FrameError> {
    let first = c.next_sequence();
    let (mut bad, mut last) = (0, None);
    for _ in 0..frames {
        let frame = c.next_frame(None, T)?;
        let mut got = vec![0u8; frame.bytes() as usize];
        c.region().read(frame.ptr(), &mut got).unwrap();
        if got != frame_bytes(frame.seq().0, got.len()) || last.is_some_and(|l: u64| frame.seq().0 != l + 1) {
            bad += 1;
        }
        last = Some(frame.seq().0);
        c.release(frame, None)?;
    }
    Ok((first, frames, bad, last))
}

/// A consumer thread: attaches, reads `frames` frames checking each byte, detaches; returns (first, read, bad).
fn spawn_reader(socket: &Path, frames: u64) -> JoinHandle<Result<(u64, u64, u64), FrameError>> {
    let socket = socket.to_owned();
    thread::spawn(move || {
        let mut c = attach(&socket)?;
        let (first, read, bad, _) = read_frames(&mut c, frames)?;
        c.detach();
        Ok((first, read, bad))
    })
}

#[test]
fn two_rust_consumers_read_every_frame_of_the_python_producer() {
    let mut p = PyProducer::spawn("two", &["--slots", "2", "--frames", "300", "--consumers", "2", "--end", "gone"]);
    let readers = [spawn_reader(&p.socket, 300), spawn_reader(&p.socket, 300)];
    let finished = p.process.wait(Duration::from_secs(30));
    for r in readers {
        let read = r.join().unwrap().unwrap_or_else(|err| panic!("{err}\n{}", finished.describe()));
        assert_eq!(read, (0, 300, 0), "{}", finished.describe());
    }
    assert_counts(&finished, 300, 2, 2, 0);
    assert!(!p.socket.exists(), "the producer left its socket file behind");
}

/// Not a test of its own: the body of the child consumer process that
/// [`a_consumer_killed_while_it_holds_a_frame_does_not_stop_the_python_producer`] starts and kills. Without the
/// role variable (a normal test run) it returns at once.
#[test]
#[ignore = "child-process entry point; run by the kill test, not on its own"]
fn child_process_entry_point() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert_eq!(role, "holder", "unknown child role");
    let socket = PathBuf::from(std::env::var(SOCKET).unwrap());
    let mut c = attach(&socket).unwrap();
    let (first, read, bad, _) = read_frames(&mut c, CHILD_RELEASES).unwrap();
    println!("CHILD read first={first} read={read} bad={bad}");
    let held = c.next_frame(None, T).unwrap();
    println!("CHILD holding {}", held.seq().0);
    // Hold it until the parent kills us (bounded, so an orphan cannot linger).
    thread::sleep(Duration::from_secs(30));
    println!("CHILD was not killed");
    std::process::exit(1);
}

#[test]
fn a_consumer_killed_while_it_holds_a_frame_does_not_stop_the_python_producer() {
    let mut p =
        PyProducer::spawn("kill-consumer", &["--slots", "2", "--frames", "300", "--consumers", "2", "--end", "gone"]);
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
            .env(ROLE, "holder")
            .env(SOCKET, &p.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let child_lines = line_reader(child.0.stdout.take().unwrap());
    let stayer = spawn_reader(&p.socket, 300);
    // Wait (bounded) until the child holds frame CHILD_RELEASES: the producer cannot go past it without us.
    let deadline = Instant::now() + T;
    let mut seen = Vec::new();
    loop {
        match child_lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            // libtest may print its "test ... " prefix on the same line.
            Ok(line) if line.contains("CHILD holding") => {
                assert!(line.ends_with(&format!("CHILD holding {CHILD_RELEASES}")), "{line}");
                break;
            }
            Ok(line) => seen.push(line),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                panic!("the child consumer never held a frame\nchild: {seen:#?}\n{}", p.process.wait(T).describe())
            }
        }
    }
    assert!(seen.iter().any(|l| l.ends_with(&format!("CHILD read first=0 read={CHILD_RELEASES} bad=0"))), "{seen:#?}");
    thread::sleep(Duration::from_millis(100)); // the producer is now stuck on the held slot
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let finished = p.process.wait(Duration::from_secs(30));
    assert_eq!(stayer.join().unwrap().unwrap(), (0, 300, 0), "{}", finished.describe());
    assert_counts(&finished, 300, 2, 1, 1);
}

#[test]
fn consumers_of_a_killed_python_producer_get_producer_gone_within_2_s() {
    let mut p = PyProducer::spawn(
        "kill-producer",
        &["--slots", "2", "--frames", "5", "--consumers", "1", "--end", "gone", "--timeout", "60"],
    );
    let socket = p.socket.clone();
    let _cleanup = common::RemoveOnDrop(socket.clone());
    let (read_tx, read_rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let mut c = attach(&socket).unwrap();
        let read = read_frames(&mut c, 5).unwrap();
        read_tx.send(read).unwrap();
        let err = c.next_frame(None, T).err(); // frame 5 never comes
        (err, Instant::now())
    });
    let read = read_rx.recv_timeout(T).expect("the consumer did not read 5 frames");
    assert_eq!(read, (0, 5, 0, Some(4)));
    thread::sleep(Duration::from_millis(200)); // the consumer waits for frame 5
    let killed = p.process.kill();
    let (err, returned) = waiter.join().unwrap();
    let err = err.expect("next_frame returned a frame the producer never published");
    assert!(matches!(err, FrameError::ProducerGone { .. }), "{err}");
    let took = returned.saturating_duration_since(killed);
    eprintln!("ProducerGone {took:?} after the SIGKILL");
    assert!(took < Duration::from_secs(2), "ProducerGone {took:?} after the SIGKILL");
}

#[test]
fn a_consumer_behind_a_cleanly_closing_python_producer_reads_every_frame_then_producer_gone() {
    const FRAMES: u64 = 100;
    const SLOTS: u64 = 8;
    let mut p = PyProducer::spawn(
        "close",
        &["--slots", &SLOTS.to_string(), "--frames", &FRAMES.to_string(), "--consumers", "1", "--end", "close"],
    );
    let socket = p.socket.clone();
    let (behind_tx, behind_rx) = mpsc::channel();
    let (closed_tx, closed_rx) = mpsc::channel::<()>();
    let reader = thread::spawn(move || {
        let mut c = attach(&socket)?;
        // Read up to the frame whose release lets the producer publish its last one, then stay behind until the
        // producer has closed: the last SLOTS frames are read after the close.
        let before = read_frames(&mut c, FRAMES - SLOTS)?;
        behind_tx.send(()).unwrap();
        closed_rx.recv_timeout(T).expect("the producer did not close");
        let after = read_frames(&mut c, SLOTS)?;
        let end = c.next_frame(None, T).err();
        c.detach();
        Ok::<_, FrameError>((before, after, end))
    });
    behind_rx.recv_timeout(T).expect("the consumer did not read its frames");
    let finished = p.process.wait(T);
    assert_counts(&finished, FRAMES, 1, 0, 0);
    closed_tx.send(()).unwrap();
    let (before, after, end) = reader.join().unwrap().unwrap();
    assert_eq!(before, (0, FRAMES - SLOTS, 0, Some(FRAMES - SLOTS - 1)), "{}", finished.describe());
    assert_eq!(after, (FRAMES - SLOTS, SLOTS, 0, Some(FRAMES - 1)), "{}", finished.describe());
    let end = end.expect("a frame after the last one published");
    // The Python producer closed its ring (state CLOSED) before it exited: a clean end, not a death.
    assert!(matches!(end, FrameError::EndOfStream { published: FRAMES, past_end: None }), "{end}");
}
