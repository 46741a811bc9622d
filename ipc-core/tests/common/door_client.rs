//! A bad client at a front door (a producer's or an object owner's): raw connections, and what the door must do
//! with them. Shared by the hostile-client tests of the ring and of the toolkit's objects.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use ipc_core::wire::{Message, PeerConnection, RefusalCode, StatusReport, StatusRequest};

/// How long a raw client waits for an answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The status report of the door at `path` (what `gpu-ipc ps` shows), asked on a raw connection.
pub fn status(path: &Path) -> StatusReport {
    let conn = PeerConnection::connect(path, TIMEOUT).unwrap();
    conn.send(&Message::StatusRequest(StatusRequest), Vec::new(), TIMEOUT).unwrap();
    match conn.recv(TIMEOUT).unwrap().message {
        Message::StatusReport(report) => report,
        other => panic!("the door answered a status request with {other:?}"),
    }
}

/// A raw connection to the door at `path`.
pub fn connect(path: &Path) -> UnixStream {
    let stream = UnixStream::connect(path).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream
}

/// Reads until the door hangs up (what it sent before that is returned): a bad client is dropped at once, not
/// when its handshake deadline passes.
pub fn hung_up_on(mut stream: UnixStream) -> Vec<u8> {
    let started = Instant::now();
    let mut got = Vec::new();
    match stream.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the door kept a bad client for {:?}: {e}", started.elapsed()),
    }
    assert!(started.elapsed() < Duration::from_secs(2), "the door kept a bad client for {:?}", started.elapsed());
    got
}

/// Sends random bytes of several lengths, each on its own connection: a whole header's worth or more is refused
/// as a malformed hello and hung up on; less is silence, which the client ends itself.
pub fn random_bytes_are_refused(path: &Path) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for len in [1usize, 23, 24, 25, 100, 4096] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let stream = connect(path);
        (&stream).write_all(&bytes).unwrap();
        if len < 24 {
            // Less than a header: the door waits for the rest, so hang up ourselves.
            drop(stream);
        } else {
            let answer = hung_up_on(stream);
            assert!(
                matches!(Message::decode(&answer), Ok(Message::Refused(r)) if r.code == RefusalCode::MalformedHello),
                "answer to {len} random bytes: {answer:02x?}"
            );
        }
    }
}
