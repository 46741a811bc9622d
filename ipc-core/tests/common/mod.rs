//! What the fake-backend tests share: a socket path per test, the small frame they move, its content, and the
//! producer's step that writes and publishes it. Each test file uses part of it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod chaos;
pub mod door_client;
pub mod python;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipc_core::frames::{FrameError, Producer, ProducerConfig};
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::{FrameGeometry, HEADER_BYTES, Header, PixelFormat, SyncStrategy, recv_bytes, send_bytes};

/// The file `relative` to ipc-core's directory (`tests/python/consumer.py`, `../docs/protocol.md`), found at run time,
/// so a suite built at one path runs from a checkout at another (a nextest archive replayed on the GPU machine with
/// `--workspace-remap`, a copied tree): cargo test and cargo-nextest set `CARGO_MANIFEST_DIR` in the test process
/// (nextest to the remapped tree); a test binary run by hand needs it set (no path is compiled in). Fails
/// the test, saying how to point it at a checkout, when the file is not there.
pub fn package_file(relative: &str) -> PathBuf {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| {
        panic!(
            "CARGO_MANIFEST_DIR is not set: run the tests with cargo or cargo-nextest, or set it to CHECKOUT/ipc-core"
        )
    }));
    let path = dir.join(relative);
    assert!(
        path.exists(),
        "{} does not exist: run the tests from a checkout of the project (cargo nextest run, or an archive with \
         --workspace-remap CHECKOUT), or set CARGO_MANIFEST_DIR=CHECKOUT/ipc-core for a test binary run by hand",
        path.display()
    );
    path
}

/// A socket path in the temporary directory, unique to this test process, `tag` (the test file) and `name`.
pub fn sock(tag: &str, name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpu-ipc-{tag}-{}-{name}.sock", std::process::id()))
}

/// Removes a socket file when dropped, even when the test fails: a SIGKILLed producer cannot unlink its own socket,
/// and the kill tests would otherwise leave one in the temporary directory per run.
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The frame every fake-backend test moves: 64 x 16 RGBA, 4096 bytes (512 words).
pub fn geometry() -> FrameGeometry {
    FrameGeometry::new(64, 16, PixelFormat::Rgba8).unwrap()
}

/// Frame `seq`'s content: its sequence number (little endian) in every 8 bytes, so a stale or torn frame shows.
pub fn frame_bytes(seq: u64, len: usize) -> Vec<u8> {
    seq.to_le_bytes().iter().copied().cycle().take(len).collect()
}

/// A producer of [`geometry`] frames on the fake backend.
pub fn producer(path: PathBuf, sync: SyncStrategy, slots: u32) -> Producer<Host> {
    Producer::<Host>::create(&HostContext, ProducerConfig::new(path, geometry(), slots, sync)).unwrap()
}

/// Acquires the next slot, writes [`frame_bytes`] into it and publishes it; returns its sequence number.
pub fn publish(p: &mut Producer<Host>, timeout: Duration) -> Result<u64, FrameError> {
    let lease = p.acquire(None, timeout)?;
    p.region().write(lease.ptr(), &frame_bytes(lease.seq().0, lease.bytes() as usize)).unwrap();
    let seq = lease.seq().0;
    p.publish(lease, None)?;
    Ok(seq)
}

/// Connects to the producer's socket `path`, sends the raw `hello`, and reads the raw answer (header and payload) and
/// its fds while the producer serves its front door; the stream stays open for what the test sends next.
pub fn raw_answer(p: &mut Producer<Host>, path: &Path, hello: &[u8]) -> (Vec<u8>, Vec<OwnedFd>, UnixStream) {
    let timeout = Duration::from_secs(10);
    let stream = UnixStream::connect(path).unwrap();
    send_bytes(stream.as_fd(), hello, Vec::new(), timeout).unwrap();
    let deadline = Instant::now() + timeout;
    let mut poll = [rustix::event::PollFd::new(&stream, rustix::event::PollFlags::IN)];
    let nap = rustix::event::Timespec { tv_sec: 0, tv_nsec: 1_000_000 };
    while rustix::event::poll(&mut poll, Some(&nap)).unwrap() == 0 {
        p.admit_pending().unwrap();
        assert!(Instant::now() < deadline, "no answer");
    }
    let mut bytes = vec![0u8; HEADER_BYTES];
    let fds = recv_bytes(stream.as_fd(), &mut bytes, timeout).unwrap();
    let header = Header::decode(&bytes).unwrap();
    let mut payload = vec![0u8; header.payload_len as usize];
    recv_bytes(stream.as_fd(), &mut payload, timeout).unwrap();
    bytes.extend(payload);
    (bytes, fds, stream)
}

/// A copy of this test binary that `nobody` can run (the build directory may be closed to other users).
/// Root-only tests run children from it. Made once: the tests run on threads of one process, and a file being written cannot be run.
pub fn binary_for_nobody() -> PathBuf {
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        // Copies left by earlier runs whose process is gone.
        for entry in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.strip_prefix("gpu-ipc-users-").and_then(|rest| rest.strip_suffix("-child"));
            if pid.and_then(|p| p.parse::<u32>().ok()).is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let copy = std::env::temp_dir().join(format!("gpu-ipc-users-{}-child", std::process::id()));
        std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    })
    .clone()
}
