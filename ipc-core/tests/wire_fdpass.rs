//! File descriptors over `SCM_RIGHTS` on a socketpair, with memfds: contents arrive, fds are
//! close-on-exec, the sender's copies are closed, truncation and count mismatches are errors
//! and leak nothing, partial reads are reassembled, timeouts and hang-ups are typed.
//!
//! The tests count this process's open fds, so they run one at a time (`SERIAL`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::{
    Attached, BackendKind, FrameGeometry, HandleType, MAX_FDS_PER_MESSAGE, Message, OfferFds, PeerConnection,
    PixelFormat, RingOffer, SyncStrategy, WireError, recv_message, send_bytes, send_message,
};
use rustix::fs::{MemfdFlags, SealFlags, memfd_create};
use rustix::io::{FdFlags, fcntl_getfd};

static SERIAL: Mutex<()> = Mutex::new(());
const T: Duration = Duration::from_secs(5);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A memfd of `size` bytes starting with `bytes`, sealed against resizing as the protocol requires.
fn memfd_with(bytes: &[u8], size: u64) -> OwnedFd {
    let fd = unsealed_memfd_with(bytes, size);
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    fd
}

fn unsealed_memfd_with(bytes: &[u8], size: u64) -> OwnedFd {
    let fd = memfd_create("wire-test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    let file = File::from(fd);
    file.set_len(size).unwrap();
    file.write_all_at(bytes, 0).unwrap();
    file.into()
}

fn read_fd(fd: &OwnedFd, len: usize) -> Vec<u8> {
    let file = File::from(fd.try_clone().unwrap());
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, 0).unwrap();
    buf
}

fn host_offer() -> RingOffer {
    RingOffer {
        backend: BackendKind::Host,
        handle_type: HandleType::HostMemfd,
        sync: SyncStrategy::CpuSleep,
        device_uuid: DeviceUuid([1; 16]),
        producer_pid: std::process::id(),
        generation: 1,
        consumer_id: 0,
        slot_layout: FrameGeometry::new(16, 16, PixelFormat::Rgba8).unwrap().into(),
        slot_count: 2,
        slot_stride_bytes: 1024,
        data_offset: 0,
        allocation_bytes: 4096,
        granularity: 4096,
        control_bytes: 512,
        legacy_mem_handle: None,
        event_handles: Vec::new(),
    }
}

#[test]
fn memfds_arrive_with_their_bytes_close_on_exec_and_the_senders_copies_close() {
    let _serial = serial();
    let (producer, consumer) = PeerConnection::pair().unwrap();
    let control = memfd_with(b"control block", 512);
    let data = memfd_with(b"frame pixels", 4096);
    // The test's own second reference, to show the consumer gets the same file, not a copy.
    let observer = File::from(data.try_clone().unwrap());
    let sent_numbers = [control.as_raw_fd(), data.as_raw_fd()];
    let offer = host_offer();
    producer.send(&Message::RingOffer(offer.clone()), OfferFds { control, data: Some(data) }.into_vec(), T).unwrap();
    // Nothing in this process can have reused the numbers yet (tests are serial), so their
    // absence from /proc/self/fd means `send` closed them.
    for number in sent_numbers {
        assert!(
            std::fs::symlink_metadata(format!("/proc/self/fd/{number}")).is_err(),
            "sender's fd {number} still open"
        );
    }

    let (received, fds) = consumer.recv(T).unwrap().into_ring_offer().unwrap();
    assert_eq!(received, offer);
    assert_eq!(read_fd(&fds.control, 13), b"control block");
    let data = fds.data.unwrap();
    assert_eq!(read_fd(&data, 12), b"frame pixels");
    for fd in [&fds.control, &data] {
        assert!(fcntl_getfd(fd).unwrap().contains(FdFlags::CLOEXEC));
    }
    File::from(data).write_all_at(b"written by consumer", 100).unwrap();
    let mut seen = [0u8; 19];
    observer.read_exact_at(&mut seen, 100).unwrap();
    assert_eq!(&seen, b"written by consumer");
}

#[test]
fn legacy_offer_carries_one_fd_and_the_handle_inline() {
    let _serial = serial();
    let (producer, consumer) = PeerConnection::pair().unwrap();
    let offer = RingOffer {
        backend: BackendKind::Legacy,
        handle_type: HandleType::LegacyIpc,
        legacy_mem_handle: Some([0x5a; 64]),
        granularity: 1,
        ..host_offer()
    };
    producer.send(&Message::RingOffer(offer.clone()), vec![memfd_with(b"c", 512)], T).unwrap();
    let (received, fds) = consumer.recv(T).unwrap().into_ring_offer().unwrap();
    assert_eq!(received.legacy_mem_handle, Some([0x5a; 64]));
    assert!(fds.data.is_none());
    assert_eq!(read_fd(&fds.control, 1), b"c");
}

#[test]
fn more_fds_than_the_receiver_has_room_for_is_an_error_and_leaks_nothing() {
    let _serial = serial();
    let (a, b) = PeerConnection::pair().unwrap();
    let before = open_fds();
    let bytes = Message::Attached(Attached { consumer_id: 1 }).encode().unwrap();
    let fds = (0..=MAX_FDS_PER_MESSAGE).map(|_| memfd_with(b"x", 1)).collect();
    send_bytes(a.as_fd(), &bytes, fds, T).unwrap();
    let error = recv_message(b.as_fd(), T).unwrap_err();
    assert!(matches!(error, WireError::FdsTruncated { room: MAX_FDS_PER_MESSAGE }), "{error:?}");
    assert_eq!(open_fds(), before);
}

#[test]
fn fds_on_a_message_that_announces_none_are_an_error_and_closed() {
    let _serial = serial();
    let (a, b) = PeerConnection::pair().unwrap();
    let before = open_fds();
    let bytes = Message::Attached(Attached { consumer_id: 1 }).encode().unwrap();
    send_bytes(a.as_fd(), &bytes, vec![memfd_with(b"x", 1)], T).unwrap();
    let error = b.recv(T).unwrap_err();
    assert!(matches!(error, WireError::FdCountMismatch { message: "Attached", expected: 0, received: 1 }), "{error:?}");
    assert_eq!(open_fds(), before);
}

#[test]
fn sender_refuses_the_wrong_number_of_fds_and_closes_them() {
    let _serial = serial();
    let (a, _b) = PeerConnection::pair().unwrap();
    let before = open_fds();
    let error = send_message(a.as_fd(), &Message::RingOffer(host_offer()), vec![memfd_with(b"c", 512)], T).unwrap_err();
    assert!(
        matches!(error, WireError::FdCountMismatch { message: "RingOffer", expected: 2, received: 1 }),
        "{error:?}"
    );
    assert_eq!(open_fds(), before);
}

#[test]
fn an_fd_of_the_wrong_kind_is_rejected_by_type() {
    let _serial = serial();
    let (producer, consumer) = PeerConnection::pair().unwrap();
    // A socket where the control memfd belongs.
    let (stray, _other) = PeerConnection::pair().unwrap();
    let stray: OwnedFd = stray.as_fd().try_clone_to_owned().unwrap();
    producer.send(&Message::RingOffer(host_offer()), vec![stray, memfd_with(b"d", 4096)], T).unwrap();
    let error = consumer.recv(T).unwrap_err();
    assert!(
        matches!(error, WireError::WrongFdType { index: 0, ref found, .. } if found.contains("Socket")),
        "{error:?}"
    );

    // A regular file that is not a memfd where the host data belongs.
    let dir = std::env::temp_dir().join(format!("gpu-ipc-wire-fdtype-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plain");
    let mut plain = File::create(&path).unwrap();
    plain.write_all(&[0; 4096]).unwrap();
    producer.send(&Message::RingOffer(host_offer()), vec![memfd_with(b"c", 512), OwnedFd::from(plain)], T).unwrap();
    let error = consumer.recv(T).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        matches!(error, WireError::WrongFdType { index: 1, ref found, .. } if found.contains("not a memfd")),
        "{error:?}"
    );
}

#[test]
fn a_memfd_of_another_size_than_announced_is_rejected() {
    let _serial = serial();
    let (producer, consumer) = PeerConnection::pair().unwrap();
    producer.send(&Message::RingOffer(host_offer()), vec![memfd_with(b"c", 100), memfd_with(b"d", 4096)], T).unwrap();
    let error = consumer.recv(T).unwrap_err();
    assert!(matches!(error, WireError::FdWrongSize { index: 0, size: 100, expected: 512 }), "{error:?}");
    // Larger is wrong too: the control block's size is exact, and so is the host backend's data.
    producer.send(&Message::RingOffer(host_offer()), vec![memfd_with(b"c", 512), memfd_with(b"d", 8192)], T).unwrap();
    let error = consumer.recv(T).unwrap_err();
    assert!(matches!(error, WireError::FdWrongSize { index: 1, size: 8192, expected: 4096 }), "{error:?}");
}

#[test]
fn an_unsealed_memfd_is_rejected() {
    let _serial = serial();
    let (producer, consumer) = PeerConnection::pair().unwrap();
    let fds = vec![unsealed_memfd_with(b"c", 512), memfd_with(b"d", 4096)];
    producer.send(&Message::RingOffer(host_offer()), fds, T).unwrap();
    let error = consumer.recv(T).unwrap_err();
    assert!(matches!(error, WireError::FdNotSealed { index: 0, .. }), "{error:?}");
}

#[test]
fn a_message_dribbled_in_byte_by_byte_is_reassembled() {
    let _serial = serial();
    let (producer, consumer) = PeerConnection::pair().unwrap();
    let offer = host_offer();
    let bytes = Message::RingOffer(offer.clone()).encode().unwrap();
    let writer = std::thread::spawn(move || {
        let fds = vec![memfd_with(b"c", 512), memfd_with(b"d", 4096)];
        send_bytes(producer.as_fd(), &bytes[..1], fds, T).unwrap();
        for chunk in bytes[1..].chunks(7) {
            std::thread::sleep(Duration::from_millis(1));
            send_bytes(producer.as_fd(), chunk, Vec::new(), T).unwrap();
        }
        producer
    });
    let (received, fds) = consumer.recv(T).unwrap().into_ring_offer().unwrap();
    assert_eq!(received, offer);
    assert_eq!(read_fd(&fds.control, 1), b"c");
    drop(writer.join().unwrap());
}

#[test]
fn waiting_for_a_silent_peer_times_out_naming_the_operation() {
    let _serial = serial();
    let (_a, b) = PeerConnection::pair().unwrap();
    let started = Instant::now();
    let error = b.recv(Duration::from_millis(50)).unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert!(matches!(error, WireError::Timeout { op: "recv", .. }), "{error:?}");
    assert!(error.to_string().contains("recv timed out"));
}

#[test]
fn hang_up_between_and_inside_messages() {
    let _serial = serial();
    let (a, b) = PeerConnection::pair().unwrap();
    assert!(!b.is_peer_gone().unwrap());
    a.send(&Message::Attached(Attached { consumer_id: 4 }), Vec::new(), T).unwrap();
    drop(a);
    // Gone, but the message it left is still delivered, then the hang-up.
    assert!(b.is_peer_gone().unwrap());
    assert!(matches!(b.recv(T).unwrap().message, Message::Attached(Attached { consumer_id: 4 })));
    let error = b.recv(T).unwrap_err();
    assert!(matches!(error, WireError::PeerHungUp { op: "recv", transferred: 0 }), "{error:?}");

    let (a, b) = PeerConnection::pair().unwrap();
    let bytes = Message::Attached(Attached { consumer_id: 4 }).encode().unwrap();
    send_bytes(a.as_fd(), &bytes[..26], Vec::new(), T).unwrap();
    drop(a);
    let error = b.recv(T).unwrap_err();
    assert!(matches!(error, WireError::PeerHungUp { op: "recv", transferred: 26 }), "{error:?}");

    // Sending to a vanished peer is an error, not SIGPIPE.
    let (a, b) = PeerConnection::pair().unwrap();
    drop(b);
    let error = a.send(&Message::Attached(Attached { consumer_id: 4 }), Vec::new(), T).unwrap_err();
    assert!(matches!(error, WireError::PeerHungUp { op: "send", .. }), "{error:?}");
}

#[test]
fn garbage_on_the_stream_is_a_typed_error() {
    let _serial = serial();
    let (a, b) = PeerConnection::pair().unwrap();
    send_bytes(a.as_fd(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Vec::new(), T).unwrap();
    let error = b.recv(T).unwrap_err();
    assert!(matches!(error, WireError::BadMagic { .. }), "{error:?}");
}
