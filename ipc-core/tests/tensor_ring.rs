//! Rings of any element on the host backend: a ring of tensors is read by a consumer of this release; a client of
//! protocol version 1 (hand-made bytes, as one written from an older docs/protocol.md sends them) still attaches to
//! a ring of pixel frames exactly as before, and is refused by a ring of tensors with code 1 and words that say why;
//! a consumer refused for its version says what to do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use ipc_core::frames::{AttachOptions, Consumer, FrameError, Producer, ProducerConfig};
use ipc_core::host::{Host, HostContext};
use ipc_core::wire::{
    ClientHello, DType, HEADER_BYTES, Header, MAGIC, Message, ObjectKind, PROTOCOL_VERSION, PixelFormat, RefusalCode,
    Refused, RendezvousListener, RingOffer, SlotLayout, SyncStrategy, TensorDesc, WireError, send_bytes,
};

const T: Duration = Duration::from_secs(10);

fn sock(name: &str) -> PathBuf {
    common::sock("tensor", name)
}

/// A hello as a client of protocol version 1 writes it by hand: header version 1, protocol_version 1, any backend.
fn v1_hello_bytes(name: &str) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&1u16.to_le_bytes()); // protocol_version
    payload.extend_from_slice(&0u16.to_le_bytes()); // wanted_backend: any
    payload.extend_from_slice(&std::process::id().to_le_bytes());
    payload.extend_from_slice(&(name.len() as u16).to_le_bytes());
    payload.extend_from_slice(&0u16.to_le_bytes()); // object 0 (ring): a reserved zero in version 1
    payload.extend_from_slice(name.as_bytes());
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&1u16.to_le_bytes()); // version 1
    bytes.extend_from_slice(&1u16.to_le_bytes()); // ClientHello
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&[0; 8]); // fd_count, reserved
    bytes.extend(payload);
    bytes
}

/// The raw answer of the producer at socket `name` to `hello` (see [`common::raw_answer`]).
fn raw_answer(p: &mut Producer<Host>, name: &str, hello: &[u8]) -> (Vec<u8>, Vec<OwnedFd>, UnixStream) {
    common::raw_answer(p, &sock(name), hello)
}

fn tensor() -> TensorDesc {
    // Two rows of three f32, the rows padded to four elements.
    TensorDesc::strided(DType::F32, [2, 3], [4, 1]).unwrap()
}

#[test]
fn a_version_1_client_attaches_to_a_ring_of_pixel_frames_exactly_as_before() {
    let mut p = common::producer(sock("v1-pixels"), SyncStrategy::CpuSleep, 2);
    let (bytes, fds, stream) = raw_answer(&mut p, "v1-pixels", &v1_hello_bytes("old"));
    // The version-1 RingOffer: header version 1, 168 bytes, the pixel fields where version 1 has them.
    let header = Header::decode(&bytes).unwrap();
    assert_eq!((header.version, header.payload_len, header.fd_count, fds.len()), (1, 168, 2, 2));
    let Message::RingOffer(offer) = Message::decode(&bytes).unwrap() else { panic!("not an offer") };
    let geometry = common::geometry();
    assert_eq!(offer.slot_layout, SlotLayout::frames(geometry));
    let payload = &bytes[HEADER_BYTES..];
    let u32_at = |at: usize| u32::from_le_bytes(payload[at..at + 4].try_into().unwrap());
    assert_eq!(u16::from_le_bytes([payload[6], payload[7]]), PixelFormat::Rgba8.code());
    assert_eq!((u32_at(40), u32_at(44), u32_at(48)), (64, 16, 256));
    assert_eq!(Message::RingOffer(offer.clone()).encode_in(1).unwrap(), bytes, "nothing but the version-1 layout");
    // Its `Attached`, in version 1, makes it a consumer like any other.
    let mut attached = MAGIC.to_vec();
    attached.extend_from_slice(&[1, 0, 3, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    attached.extend_from_slice(&offer.consumer_id.to_le_bytes());
    attached.extend_from_slice(&[0; 4]);
    send_bytes(stream.as_fd(), &attached, Vec::new(), T).unwrap();
    p.wait_for_consumers(1, T).unwrap();
    assert_eq!(p.consumers(), 1);
}

#[test]
fn a_version_1_client_at_a_ring_of_tensors_is_refused_with_code_1_and_told_why() {
    let config = ProducerConfig::new(sock("v1-tensors"), tensor(), 2, SyncStrategy::CpuSleep);
    let mut p = Producer::<Host>::create(&HostContext, config).unwrap();
    let (bytes, fds, _stream) = raw_answer(&mut p, "v1-tensors", &v1_hello_bytes("old"));
    assert!(fds.is_empty());
    assert_eq!(Header::decode(&bytes).unwrap().version, 1, "told in the version it speaks");
    let Message::Refused(Refused { code, message }) = Message::decode(&bytes).unwrap() else { panic!("not refused") };
    assert_eq!(code, RefusalCode::UnsupportedVersion);
    assert!(message.contains("carries tensors") && message.contains("protocol version 2"), "{message}");
    assert!(message.contains("float32 [2, 3] strides [4, 1]"), "{message}");
    // Nothing was taken for it: the producer publishes on, and a consumer of this release attaches.
    assert_eq!(p.consumers(), 0);
    common::publish(&mut p, T).unwrap();
}

#[test]
fn a_consumer_of_this_release_reads_a_ring_of_tensors() {
    let layout = SlotLayout::tensors_in(64, tensor()).unwrap();
    let config = ProducerConfig::new(sock("tensors"), layout.clone(), 2, SyncStrategy::CpuSpin);
    let mut p = Producer::<Host>::create(&HostContext, config).unwrap();
    assert_eq!(p.slot_layout(), &layout);
    let consumer = thread::spawn(|| {
        let mut c = Consumer::<Host>::attach(&HostContext, &sock("tensors"), &AttachOptions::default()).unwrap();
        let seen = (c.slot_layout().clone(), c.protocol_version(), c.geometry());
        let mut frames = Vec::new();
        for _ in 0..5 {
            let frame = c.next_frame(None, T).unwrap();
            let mut data = vec![0u8; frame.bytes() as usize];
            c.region().read(frame.ptr(), &mut data).unwrap();
            frames.push((frame.seq().0, data));
            c.release(frame, None).unwrap();
        }
        c.detach();
        (seen, frames)
    });
    p.wait_for_consumers(1, T).unwrap();
    for _ in 0..5 {
        let lease = p.acquire(None, T).unwrap();
        assert_eq!(lease.bytes(), 64);
        p.region().write(lease.ptr(), &common::frame_bytes(lease.seq().0, 64)).unwrap();
        p.publish(lease, None).unwrap();
    }
    let ((layout_seen, version, view), frames) = consumer.join().unwrap();
    assert_eq!((layout_seen, version), (layout, PROTOCOL_VERSION));
    // Code written for pixel rings sees the slot as one row of 64 gray8 bytes.
    assert_eq!((view.width(), view.height(), view.pixel_format()), (64, 1, PixelFormat::Gray8));
    for (seq, data) in frames {
        assert_eq!(data, common::frame_bytes(seq, 64), "frame {seq}");
    }
}

#[test]
fn a_hello_encoded_in_version_2_gets_a_version_2_offer_of_pixel_frames() {
    let mut p = common::producer(sock("v2-pixels"), SyncStrategy::CpuSleep, 2);
    let hello = ClientHello {
        protocol_version: 2,
        client_pid: std::process::id(),
        wanted_backend: None,
        consumer_name: "new".into(),
        object: ObjectKind::Ring,
        part: 0,
    };
    let (bytes, fds, _stream) = raw_answer(&mut p, "v2-pixels", &Message::ClientHello(hello).encode_in(2).unwrap());
    let header = Header::decode(&bytes).unwrap();
    assert_eq!((header.version, fds.len()), (2, 2));
    let Message::RingOffer(RingOffer { slot_layout, .. }) = Message::decode(&bytes).unwrap() else { panic!() };
    assert_eq!(slot_layout, SlotLayout::frames(common::geometry()));
    assert_eq!(slot_layout.tensor().unwrap().shape(), &[16, 64, 4]);
}

#[test]
fn a_consumer_refused_for_its_protocol_version_says_what_to_do() {
    // A producer that speaks only version 1 and checks the announced version (as a strict implementation may).
    let path = sock("strict-v1");
    let listener = RendezvousListener::bind(&path).unwrap();
    let producer = thread::spawn(move || {
        let conn = listener.accept(T).unwrap();
        let hello = conn.recv(T).unwrap();
        assert_eq!(hello.version, 1, "the hello goes out in version 1");
        let Message::ClientHello(hello) = hello.message else { panic!("not a hello") };
        assert_eq!(hello.protocol_version, PROTOCOL_VERSION, "announcing the newest version the consumer speaks");
        let refused = Refused { code: RefusalCode::UnsupportedVersion, message: "speak version 1".into() };
        conn.send(&Message::Refused(refused), Vec::new(), T).unwrap();
        conn.discard_unread();
    });
    let error = Consumer::<Host>::attach(&HostContext, &path, &AttachOptions::default()).err().unwrap();
    producer.join().unwrap();
    let FrameError::Wire(WireError::VersionRefused { message, oldest, newest }) = &error else {
        panic!("expected VersionRefused, got {error}")
    };
    assert_eq!((message.as_str(), *oldest, *newest), ("speak version 1", 1, PROTOCOL_VERSION));
    let text = error.to_string();
    assert!(text.contains("speak version 1") && text.contains("same gpu-ipc release"), "{text}");
}
