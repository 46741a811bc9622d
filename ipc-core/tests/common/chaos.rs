//! The chaos tests' child processes: a consumer that attaches, reads and leaves as its [`Role`] says, or a producer
//! that publishes flat out until it is killed. Each chaos test binary re-runs itself as the child (its
//! `child_process_entry_point` test calls [`child_process_entry_point`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use ipc_core::host::{Host, HostContext};

use super::{frame_bytes, geometry};
use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use ipc_core::wire::SyncStrategy;

pub const ROLE: &str = "GPU_IPC_CHAOS_CHILD";
pub const SOCKET: &str = "GPU_IPC_CHAOS_SOCKET";
pub const FRAMES: &str = "GPU_IPC_CHAOS_FRAMES";
/// Longest a child or the producer waits for anything.
pub const T: Duration = Duration::from_secs(10);

/// xorshift64*: enough randomness for a schedule, and no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn seeded() -> (Self, u64) {
        let seed = std::env::var("GPU_IPC_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        });
        (Self(seed | 1), seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a child does once attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
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
    pub const ALL: [Self; 4] = [Self::Reader, Self::Detacher, Self::Quitter, Self::Holder];

    pub fn name(self) -> &'static str {
        match self {
            Self::Reader => "reader",
            Self::Detacher => "detacher",
            Self::Quitter => "quitter",
            Self::Holder => "holder",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// Not a test of its own: the body of the child processes the chaos tests start. Without the role variable (a
/// normal test run) it returns at once.
pub fn child_process_entry_point() {
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
pub fn child(role: Role, socket: &Path, frames: u64) -> Result<String, FrameError> {
    let options = AttachOptions { name: role.name().into(), timeout: T, ..AttachOptions::default() };
    // A handshake the producer dropped (this process was too slow, e.g. stopped) is attached again.
    let mut attempts = 0;
    let mut c = loop {
        attempts += 1;
        match Consumer::<Host>::attach(&HostContext, socket, &options) {
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
pub fn child_producer() {
    let socket = PathBuf::from(std::env::var(SOCKET).unwrap());
    let sync = match std::env::var("GPU_IPC_CHAOS_SYNC").as_deref() {
        Ok("cpu-sleep") => SyncStrategy::CpuSleep,
        _ => SyncStrategy::CpuSpin,
    };
    let slots = if std::process::id().is_multiple_of(2) { 1 } else { 2 };
    let mut p = Producer::<Host>::create(&HostContext, ProducerConfig::new(&socket, geometry(), slots, sync))
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

/// A child the parent started.
pub struct Spawned {
    pub child: Child,
    pub role: Role,
    pub killed: bool,
}

pub fn spawn(role: Role, socket: &Path, frames: u64) -> Spawned {
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

/// Reads the child's report line (after it exited).
pub fn report(spawned: &mut Spawned) -> String {
    let mut out = String::new();
    if let Some(stdout) = spawned.child.stdout.as_mut() {
        let _ = stdout.read_to_string(&mut out);
    }
    out.lines().find_map(|l| l.find("CHILD ").map(|i| l[i + 6..].to_owned())).unwrap_or_else(|| "no report".into())
}
