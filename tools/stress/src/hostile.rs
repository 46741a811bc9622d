//! Careless and hostile clients at a real producer's front door, each written once, small and on raw sockets:
//! random bytes, wrong magic / version / message type, a payload_len of 2^31, fds announced but not sent and sent
//! but not announced, truncated messages then a hang-up, silent clients, rapid connect/close, idle connections,
//! abandoned handshakes, and a peer of another user. Each returns its verdict and what it saw; none may stop the
//! producer or delay a frame (the caller checks that). The fake-backend tests in
//! `ipc-core/tests/hostile_clients.rs` do the same in-process.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_ipc::core::wire::{ClientHello, Message, PROTOCOL_VERSION, RefusalCode, recv_message, send_bytes};
use rustix::fs::{MemfdFlags, memfd_create};

use super::outcome::Status;
use super::procs::{NOBODY, reachable_copy};

/// How long a bad client may be kept before the producer hangs up on it.
pub const HANG_UP_WITHIN: Duration = Duration::from_secs(2);
/// Bound of every socket operation here.
const T: Duration = Duration::from_secs(10);

/// A behaviour's verdict and what it saw.
pub type Verdict = (Status, String);

fn passed(detail: impl Into<String>) -> Verdict {
    (Status::Passed, detail.into())
}

fn failed(detail: impl Into<String>) -> Verdict {
    (Status::Failed, detail.into())
}

fn connect(path: &Path) -> Result<UnixStream, String> {
    let stream = UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.display()))?;
    stream.set_read_timeout(Some(T)).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// A valid hello, as bytes.
pub fn hello_bytes() -> Vec<u8> {
    let hello = ClientHello {
        object: Default::default(),
        part: 0,
        protocol_version: PROTOCOL_VERSION,
        client_pid: std::process::id(),
        wanted_backend: None,
        consumer_name: "hostile".into(),
    };
    Message::ClientHello(hello).encode().unwrap_or_default()
}

/// A hello with `patch` applied to its bytes (the header is bytes 0..24: magic, version at 8, type at 10,
/// payload_len at 12, fd_count at 16).
pub fn patched_hello(patch: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = hello_bytes();
    patch(&mut bytes);
    bytes
}

/// Reads until the producer hangs up; `Err` when it kept the client longer than [`HANG_UP_WITHIN`].
fn hung_up_on(mut stream: UnixStream) -> Result<Vec<u8>, String> {
    let started = Instant::now();
    let mut got = Vec::new();
    match stream.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => return Err(format!("kept for {:?}: {e}", started.elapsed())),
    }
    if started.elapsed() > HANG_UP_WITHIN {
        return Err(format!("kept for {:?}", started.elapsed()));
    }
    Ok(got)
}

fn send_then_hang_up(path: &Path, bytes: &[u8], fds: Vec<OwnedFd>) -> Result<Vec<u8>, String> {
    let stream = connect(path)?;
    send_bytes(stream.as_fd(), bytes, fds, T).map_err(|e| format!("send: {e}"))?;
    hung_up_on(stream)
}

fn memfd() -> Result<OwnedFd, String> {
    memfd_create("hostile", MemfdFlags::CLOEXEC).map_err(|e| format!("memfd_create: {e}"))
}

/// Runs `cases`; passed when every one did.
fn all(cases: Vec<(&str, Result<Vec<u8>, String>)>) -> Verdict {
    let count = cases.len();
    let bad: Vec<String> = cases.into_iter().filter_map(|(n, r)| r.err().map(|e| format!("{n}: {e}"))).collect();
    if bad.is_empty() {
        passed(format!("{count} clients, each hung up on within {HANG_UP_WITHIN:?}"))
    } else {
        failed(bad.join("; "))
    }
}

/// Random bytes of several lengths (shorter than a header: we hang up; longer: the producer must).
pub fn random_bytes(path: &Path, seed: u64) -> Verdict {
    let mut rng = super::schedule::SplitMix::new(seed);
    let mut cases = Vec::new();
    for len in [1usize, 23, 24, 25, 100, 4096] {
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let result = connect(path).and_then(|stream| {
            (&stream).write_all(&bytes).map_err(|e| format!("write: {e}"))?;
            if len < 24 { Ok(Vec::new()) } else { hung_up_on(stream) }
        });
        cases.push(("random", result));
    }
    all(cases)
}

/// Wrong magic, wrong version, unknown message type.
pub fn wrong_header(path: &Path) -> Verdict {
    all(vec![
        ("magic", send_then_hang_up(path, &patched_hello(|b| b[0] ^= 0xff), Vec::new())),
        (
            // Every version up to PROTOCOL_VERSION is spoken: the next one is the first this build does not (a
            // spoken one is a real consumer, which holds the ring back until it reads or leaves).
            "the first unspoken version",
            send_then_hang_up(
                path,
                &patched_hello(|b| b[8..10].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes())),
                Vec::new(),
            ),
        ),
        (
            "type 99",
            send_then_hang_up(path, &patched_hello(|b| b[10..12].copy_from_slice(&99u16.to_le_bytes())), Vec::new()),
        ),
    ])
}

/// A payload_len of 2^31.
pub fn huge_payload_len(path: &Path) -> Verdict {
    all(vec![(
        "payload_len 2^31",
        send_then_hang_up(path, &patched_hello(|b| b[12..16].copy_from_slice(&(1u32 << 31).to_le_bytes())), Vec::new()),
    )])
}

/// One fd announced and none sent; one sent and none announced; three sent (more than the protocol's two).
pub fn fd_mismatch(path: &Path) -> Verdict {
    let fds = |n: usize| (0..n).map(|_| memfd()).collect::<Result<Vec<_>, _>>();
    all(vec![
        (
            "announced, not sent",
            send_then_hang_up(path, &patched_hello(|b| b[16..20].copy_from_slice(&1u32.to_le_bytes())), Vec::new()),
        ),
        ("sent, not announced", fds(1).and_then(|f| send_then_hang_up(path, &hello_bytes(), f))),
        ("three sent", fds(3).and_then(|f| send_then_hang_up(path, &hello_bytes(), f))),
    ])
}

/// A hello cut at several points, then a hang-up.
pub fn truncated(path: &Path) -> Verdict {
    let hello = hello_bytes();
    let mut cases = Vec::new();
    for cut in [1, 12, 23, 24, 30, hello.len() - 1] {
        let result = connect(path).and_then(|stream| {
            (&stream).write_all(&hello[..cut]).map_err(|e| format!("write: {e}"))?;
            std::thread::sleep(Duration::from_millis(5));
            Ok(Vec::new())
        });
        cases.push(("truncated", result));
    }
    all(cases)
}

/// `count` clients that connect and say nothing for `hold`.
pub fn silent(path: &Path, count: u32, hold: Duration) -> Verdict {
    match (0..count).map(|_| connect(path)).collect::<Result<Vec<_>, _>>() {
        Ok(silent) => {
            std::thread::sleep(hold);
            drop(silent);
            passed(format!("{count} silent clients held {hold:?}"))
        }
        Err(e) => failed(e),
    }
}

/// `count` connects, each closed at once.
pub fn rapid(path: &Path, count: u32) -> Verdict {
    let started = Instant::now();
    for i in 0..count {
        if let Err(e) = connect(path) {
            return failed(format!("connect {i}: {e}"));
        }
    }
    passed(format!("{count} connect/close in {:.2} s", started.elapsed().as_secs_f64()))
}

/// `count` idle connections held open while `real_consumer` (a real consumer process) attaches and reads.
pub fn idle_while_a_consumer_attaches(path: &Path, count: u32, real_consumer: impl FnOnce() -> Verdict) -> Verdict {
    let idle = match (0..count).map(|_| connect(path)).collect::<Result<Vec<_>, _>>() {
        Ok(idle) => idle,
        Err(e) => return failed(e),
    };
    let (status, detail) = real_consumer();
    drop(idle);
    (status, format!("{count} idle connections open; a real consumer: {detail}"))
}

/// `count` handshakes abandoned after the offer: hello, offer received (its fds dropped), hang-up.
pub fn abandoned_handshakes(path: &Path, count: u32) -> Verdict {
    for round in 0..count {
        let offer = connect(path).and_then(|stream| {
            send_bytes(stream.as_fd(), &hello_bytes(), Vec::new(), T).map_err(|e| format!("send: {e}"))?;
            recv_message(stream.as_fd(), T).map_err(|e| format!("no offer: {e}"))
        });
        match offer {
            Ok(received) if matches!(received.message, Message::RingOffer(_)) => {}
            Ok(received) => return failed(format!("round {round}: answered {:?}", received.message)),
            Err(e) => return failed(format!("round {round}: {e}")),
        }
    }
    passed(format!("{count} handshakes abandoned after the offer"))
}

/// The hidden `gpu-ipc-stress stress-peer` command: connects to `socket` and expects `Refused` (peer not allowed).
/// Exit status 0 when refused so, 1 otherwise (what came is printed).
pub fn peer_main(socket: &Path) -> u8 {
    let answer = connect(socket).and_then(|s| recv_message(s.as_fd(), T).map_err(|e| e.to_string()));
    match answer {
        Ok(r) if matches!(&r.message, Message::Refused(x) if x.code == RefusalCode::PeerNotAllowed) => {
            println!("refused: peer not allowed");
            0
        }
        Ok(r) => {
            println!("answered: {:?}", r.message);
            1
        }
        Err(e) => {
            println!("error: {e}");
            1
        }
    }
}

/// A client of another user (`nobody`): this program, copied where that user can run it, started with uid and
/// gid 65534 as `gpu-ipc-stress stress-peer`, on the socket made 0666 for this case only (so that only the producer's
/// `SO_PEERCRED` check stands), `count` times. Needs root (not run otherwise).
pub fn other_user(path: &Path, count: u32) -> Verdict {
    if !rustix::process::geteuid().is_root() {
        return (Status::NotRun, "needs root to start a client as another user".into());
    }
    let copy = match std::env::current_exe()
        .map_err(|e| format!("cannot find this program: {e}"))
        .and_then(|exe| reachable_copy(&exe, "peer"))
    {
        Ok(copy) => copy,
        Err(e) => return (Status::NotRun, e),
    };
    let mode = std::fs::metadata(path).map(|m| m.permissions().mode()).unwrap_or(0o600);
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)) {
        return failed(format!("chmod 0666 {}: {e}", path.display()));
    }
    let mut verdict = passed(format!("{count} clients as uid {NOBODY} refused with code 4 (peer not allowed)"));
    for i in 0..count {
        let output = {
            use std::os::unix::process::CommandExt;
            Command::new(copy.program()).arg("stress-peer").arg("--socket").arg(path).uid(NOBODY).gid(NOBODY).output()
        };
        match output {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                verdict = failed(format!("client {i}: {}: {}", o.status, String::from_utf8_lossy(&o.stdout).trim()));
                break;
            }
            Err(e) => {
                verdict = (Status::NotRun, format!("cannot start a client as uid {NOBODY}: {e}"));
                break;
            }
        }
    }
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
    verdict
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn the_hello_is_a_valid_message_and_patches_land_in_the_header() {
        let hello = hello_bytes();
        assert!(hello.len() > 24);
        assert!(matches!(Message::decode(&hello).unwrap(), Message::ClientHello(_)));
        let huge = patched_hello(|b| b[12..16].copy_from_slice(&(1u32 << 31).to_le_bytes()));
        assert_eq!(u32::from_le_bytes(huge[12..16].try_into().unwrap()), 1 << 31);
        assert!(Message::decode(&huge).is_err());
    }

    /// A stand-in producer that reads a little and hangs up at once: the behaviours that expect a hang-up pass;
    /// one that keeps the client open fails.
    #[test]
    fn behaviours_pass_against_a_door_that_hangs_up_and_fail_against_one_that_does_not() {
        let path = std::env::temp_dir().join(format!("gpu-ipc-stress-test-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut buf = [0u8; 64];
                let _ = (&stream).read(&mut buf);
                drop(stream);
            }
        });
        assert_eq!(wrong_header(&path).0, Status::Passed);
        assert_eq!(huge_payload_len(&path).0, Status::Passed);
        assert_eq!(fd_mismatch(&path).0, Status::Passed);
        assert_eq!(truncated(&path).0, Status::Passed);
        assert_eq!(rapid(&path, 50).0, Status::Passed);
        assert_eq!(silent(&path, 5, Duration::from_millis(10)).0, Status::Passed);
        // It answers no offer.
        assert_eq!(abandoned_handshakes(&path, 1).0, Status::Failed);
        let _ = std::fs::remove_file(&path);
    }
}
