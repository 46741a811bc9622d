//! What a consumer is told when the producer hangs up before its offer: a producer that still runs dropped the
//! handshake ("attach again"); a producer that died did not (fake backend, no GPU).
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use ipc_core::frames::{AttachOptions, Consumer};
use ipc_core::host::{Host, HostContext};

const SOCKET: &str = "GPU_IPC_HANG_UP_SOCKET";

/// Not a test of its own: the body of the child process the test below starts, a "producer" that accepts, reads
/// the hello and dies without answering. Without the variable (a normal test run) it returns at once.
#[test]
#[ignore = "child-process entry point; run by the cross-process test, not on its own"]
fn child_process_entry_point() {
    let Ok(path) = std::env::var(SOCKET) else { return };
    let listener = UnixListener::bind(&path).unwrap();
    let (mut conn, _) = listener.accept().unwrap();
    let mut hello = [0u8; 16];
    let _ = conn.read(&mut hello);
    std::thread::sleep(Duration::from_millis(50));
    std::process::exit(3);
}

#[test]
fn a_producer_that_dies_before_its_offer_is_not_said_to_have_dropped_the_handshake() {
    let path: PathBuf = std::env::temp_dir().join(format!("gpu-ipc-hang-up-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(SOCKET, &path)
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !path.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let options = AttachOptions { timeout: Duration::from_secs(3), ..AttachOptions::default() };
    let error = Consumer::<Host>::attach(&HostContext, &path, &options).map(drop).unwrap_err().to_string();
    // Reaped only now: until then the dead producer is a zombie, which `kill(pid, 0)` still finds.
    let status = child.wait().unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(status.code(), Some(3), "the stand-in producer died as planned");
    assert!(
        !error.contains("dropped this handshake"),
        "a dead producer is not one that dropped the handshake: {error}"
    );
}
