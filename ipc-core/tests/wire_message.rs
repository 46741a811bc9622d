//! Encoding and decoding of every message: round trips, the byte layout `docs/protocol.md`
//! specifies, and one specific error for each kind of malformed input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::{
    Attached, BackendKind, ClientHello, Detach, DetachReason, FrameGeometry, HEADER_BYTES, HandleType, Header, MAGIC,
    MAX_PAYLOAD_BYTES, Message, MessageType, PROTOCOL_VERSION, PixelFormat, RING_OFFER_FIXED_BYTES, RefusalCode,
    Refused, RingOffer, SyncStrategy, WireError,
};

fn host_offer() -> RingOffer {
    RingOffer {
        backend: BackendKind::Host,
        handle_type: HandleType::HostMemfd,
        sync: SyncStrategy::CpuSpin,
        device_uuid: DeviceUuid([7; 16]),
        producer_pid: 4242,
        generation: 0x0102_0304_0506_0708,
        consumer_id: 3,
        slot_layout: FrameGeometry::new(64, 16, PixelFormat::Rgba8).unwrap().into(),
        slot_count: 3,
        slot_stride_bytes: 4096,
        data_offset: 0,
        allocation_bytes: 16384,
        granularity: 4096,
        control_bytes: 4096,
        legacy_mem_handle: None,
        event_handles: Vec::new(),
    }
}

fn legacy_offer() -> RingOffer {
    RingOffer {
        backend: BackendKind::Legacy,
        handle_type: HandleType::LegacyIpc,
        sync: SyncStrategy::IpcEvent,
        legacy_mem_handle: Some([0xAB; 64]),
        event_handles: vec![[1; 64], [2; 64], [3; 64], [4; 64], [5; 64], [6; 64]],
        granularity: 1,
        ..host_offer()
    }
}

fn vmm_offer() -> RingOffer {
    RingOffer {
        backend: BackendKind::Vmm,
        handle_type: HandleType::PosixFd,
        sync: SyncStrategy::GpuStreamOps,
        slot_layout: FrameGeometry::with_pitch(3840, 2160, 15360, PixelFormat::Rgba8).unwrap().into(),
        slot_count: 4,
        slot_stride_bytes: 3840 * 4 * 2160,
        data_offset: 0,
        allocation_bytes: 128 << 20,
        granularity: 2 << 20,
        ..host_offer()
    }
}

fn samples() -> Vec<Message> {
    vec![
        Message::ClientHello(ClientHello {
            object: Default::default(),
            part: 0,
            protocol_version: 1,
            client_pid: 1234,
            wanted_backend: Some(BackendKind::Vmm),
            consumer_name: "viewer-1 ✓".to_owned(),
        }),
        Message::ClientHello(ClientHello {
            object: Default::default(),
            part: 0,
            protocol_version: 1,
            client_pid: 0,
            wanted_backend: None,
            consumer_name: String::new(),
        }),
        Message::ClientHello(ClientHello {
            object: ipc_core::wire::ObjectKind::Pool,
            part: 3,
            protocol_version: PROTOCOL_VERSION,
            client_pid: 7,
            wanted_backend: None,
            consumer_name: "weights reader".to_owned(),
        }),
        Message::RingOffer(host_offer()),
        Message::RingOffer(legacy_offer()),
        Message::RingOffer(vmm_offer()),
        Message::Attached(Attached { consumer_id: 9 }),
        Message::Detach(Detach { consumer_id: 9, reason: DetachReason::ImportFailed }),
        Message::Refused(Refused {
            code: RefusalCode::RingFull,
            message: "all 8 consumer places are taken".to_owned(),
        }),
    ]
}

#[test]
fn every_message_round_trips_in_every_version() {
    for message in samples() {
        // `encode` picks the oldest version that carries the message: 1 for all of these (pixel frames).
        assert_eq!(message.encode().unwrap(), message.encode_in(1).unwrap());
        for version in 1..=PROTOCOL_VERSION {
            let bytes = message.encode_in(version).unwrap();
            if let Message::ClientHello(hello) = &message
                && hello.protocol_version < version
            {
                // A hello announces at least the version it is encoded in.
                let error = Message::decode(&bytes).unwrap_err();
                assert!(matches!(error, WireError::InvalidField { field: "ClientHello.protocol_version", .. }));
                continue;
            }
            assert_eq!(Message::decode(&bytes).unwrap(), message);
            let header = Header::decode(&bytes).unwrap();
            assert_eq!(header.version, version);
            assert_eq!(header.message_type, message.message_type());
            assert_eq!(header.payload_len as usize, bytes.len() - HEADER_BYTES);
            assert_eq!(header.fd_count as usize, message.fd_count());
        }
    }
}

#[test]
fn fd_counts_follow_the_handle_type() {
    assert_eq!(Message::RingOffer(host_offer()).fd_count(), 2);
    assert_eq!(Message::RingOffer(vmm_offer()).fd_count(), 2);
    assert_eq!(Message::RingOffer(legacy_offer()).fd_count(), 1);
    assert_eq!(Message::Attached(Attached { consumer_id: 1 }).fd_count(), 0);
}

#[test]
fn attached_bytes_match_the_spec_exactly() {
    let bytes = Message::Attached(Attached { consumer_id: 0x0102_0304 }).encode().unwrap();
    let mut expected = b"GPUIPC\r\n".to_vec();
    expected.extend_from_slice(&[1, 0, 3, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    expected.extend_from_slice(&[4, 3, 2, 1, 0, 0, 0, 0]);
    assert_eq!(bytes, expected);
    assert_eq!(&bytes[..8], &MAGIC);
}

#[test]
fn ring_offer_fields_sit_at_the_documented_offsets() {
    let offer = legacy_offer();
    let bytes = Message::RingOffer(offer.clone()).encode().unwrap();
    let p = &bytes[HEADER_BYTES..];
    let u16_at = |o: usize| u16::from_le_bytes(p[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(p[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(p[o..o + 8].try_into().unwrap());
    assert_eq!(p.len(), RING_OFFER_FIXED_BYTES + 6 * 64);
    assert_eq!(u16_at(0), 1); // backend legacy
    assert_eq!(u16_at(2), 1); // handle type legacy-ipc
    assert_eq!(u16_at(4), 3); // sync ipc-event
    assert_eq!(u16_at(6), 2); // pixel format rgba8
    assert_eq!(&p[8..24], &[7; 16]);
    assert_eq!(u32_at(24), 4242);
    assert_eq!(u32_at(28), 3);
    assert_eq!(u64_at(32), 0x0102_0304_0506_0708);
    assert_eq!((u32_at(40), u32_at(44), u32_at(48)), (64, 16, 256));
    assert_eq!(u32_at(52), 3);
    assert_eq!(u64_at(56), 4096);
    assert_eq!(u64_at(64), 0);
    assert_eq!(u64_at(72), 16384);
    assert_eq!(u64_at(80), 1);
    assert_eq!(u64_at(88), 4096);
    assert_eq!(u32_at(96), 1); // flags: legacy handle present
    assert_eq!(u32_at(100), 6);
    assert_eq!(&p[104..168], &[0xAB; 64]);
    assert_eq!(&p[168..232], &[1; 64]);
    assert_eq!(&p[488..552], &[6; 64]);
}

// ---- malformed input -------------------------------------------------------------------------

fn encoded(message: Message) -> Vec<u8> {
    message.encode().unwrap()
}

fn attached() -> Vec<u8> {
    encoded(Message::Attached(Attached { consumer_id: 1 }))
}

fn hello() -> Vec<u8> {
    encoded(Message::ClientHello(ClientHello {
        object: Default::default(),
        part: 0,
        protocol_version: 1,
        client_pid: 5,
        wanted_backend: None,
        consumer_name: "abc".to_owned(),
    }))
}

fn refused() -> Vec<u8> {
    encoded(Message::Refused(Refused { code: RefusalCode::BackendMismatch, message: "xyz".to_owned() }))
}

fn offer() -> Vec<u8> {
    encoded(Message::RingOffer(host_offer()))
}

/// Overwrites bytes at `offset` (from the start of the message).
fn patch(mut bytes: Vec<u8>, offset: usize, with: &[u8]) -> Vec<u8> {
    bytes[offset..offset + with.len()].copy_from_slice(with);
    bytes
}

/// Rewrites the header's payload length to match the bytes present.
fn fix_len(mut bytes: Vec<u8>) -> Vec<u8> {
    let len = (bytes.len() - HEADER_BYTES) as u32;
    bytes[12..16].copy_from_slice(&len.to_le_bytes());
    bytes
}

fn payload(offset: usize) -> usize {
    HEADER_BYTES + offset
}

#[test]
fn every_malformed_input_has_its_own_error() {
    type Check = fn(&WireError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        ("empty", vec![], |e| matches!(e, WireError::Truncated { what: "header", needed: 8, available: 0 })),
        ("short header", attached()[..10].to_vec(), |e| matches!(e, WireError::Truncated { what: "header", .. })),
        (
            "wrong magic",
            patch(attached(), 0, b"HTTP/1.1"),
            |e| matches!(e, WireError::BadMagic { found } if found == b"HTTP/1.1"),
        ),
        ("version 0", patch(attached(), 8, &0u16.to_le_bytes()), |e| {
            matches!(e, WireError::UnsupportedVersion { found: 0, oldest: 1, newest: 4 })
        }),
        ("version 5", patch(attached(), 8, &5u16.to_le_bytes()), |e| {
            matches!(e, WireError::UnsupportedVersion { found: 5, oldest: 1, newest: 4 })
        }),
        ("unknown type", patch(attached(), 10, &99u16.to_le_bytes()), |e| {
            matches!(e, WireError::UnknownMessageType { code: 99 })
        }),
        ("reserved header", patch(attached(), 20, &[1]), |e| {
            matches!(e, WireError::ReservedNotZero { field: "header.reserved" })
        }),
        (
            "oversized",
            patch(attached(), 12, &(MAX_PAYLOAD_BYTES + 1).to_le_bytes()),
            |e| matches!(e, WireError::PayloadTooLarge { len, .. } if *len == MAX_PAYLOAD_BYTES + 1),
        ),
        ("payload cut short", attached()[..HEADER_BYTES + 5].to_vec(), |e| {
            matches!(e, WireError::Truncated { what: "payload", needed: 8, available: 5 })
        }),
        ("bytes after the message", [attached(), vec![0]].concat(), |e| {
            matches!(e, WireError::TrailingBytes { message: "Attached", extra: 1 })
        }),
        ("payload longer than the layout", fix_len([attached(), vec![0; 4]].concat()), |e| {
            matches!(e, WireError::TrailingBytes { message: "Attached", extra: 4 })
        }),
        ("payload shorter than the layout", fix_len(attached()[..HEADER_BYTES + 2].to_vec()), |e| {
            matches!(e, WireError::Truncated { what: "Attached", needed: 4, available: 2 })
        }),
        ("fds on a message without fds", patch(attached(), 16, &1u32.to_le_bytes()), |e| {
            matches!(e, WireError::FdCountMismatch { message: "Attached", expected: 0, received: 1 })
        }),
        ("offer announcing one fd too few", patch(offer(), 16, &1u32.to_le_bytes()), |e| {
            matches!(e, WireError::FdCountMismatch { message: "RingOffer", expected: 2, received: 1 })
        }),
        ("reserved attached", patch(attached(), payload(4), &[1]), |e| {
            matches!(e, WireError::ReservedNotZero { field: "Attached.reserved" })
        }),
        (
            "unknown detach reason",
            patch(
                encoded(Message::Detach(Detach { consumer_id: 1, reason: DetachReason::ConsumerDone })),
                payload(4),
                &9u16.to_le_bytes(),
            ),
            |e| matches!(e, WireError::UnknownCode { field: "Detach.reason", code: 9 }),
        ),
        ("unknown refusal code", patch(refused(), payload(0), &0u16.to_le_bytes()), |e| {
            matches!(e, WireError::UnknownCode { field: "Refused.code", code: 0 })
        }),
        ("refusal text not UTF-8", patch(refused(), payload(8), &[0xff]), |e| {
            matches!(e, WireError::InvalidUtf8 { field: "Refused.message" })
        }),
        ("refusal text too long", patch(refused(), payload(4), &2000u32.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "Refused.message_len", .. })
        }),
        ("refusal text cut short", patch(refused(), payload(4), &10u32.to_le_bytes()), |e| {
            matches!(e, WireError::Truncated { what: "Refused", .. })
        }),
        ("hello version zero", patch(hello(), payload(0), &0u16.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "ClientHello.protocol_version", .. })
        }),
        ("hello unknown backend", patch(hello(), payload(2), &7u16.to_le_bytes()), |e| {
            matches!(e, WireError::UnknownCode { field: "ClientHello.wanted_backend", code: 7 })
        }),
        ("hello name too long", patch(hello(), payload(8), &65u16.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "ClientHello.name_len", .. })
        }),
        ("hello name not UTF-8", patch(hello(), payload(12), &[0xc3, 0x28]), |e| {
            matches!(e, WireError::InvalidUtf8 { field: "ClientHello.consumer_name" })
        }),
        ("hello unknown object kind", patch(hello(), payload(10), &[9]), |e| {
            matches!(e, WireError::UnknownCode { field: "ClientHello.object", code: 9 })
        }),
        ("offer unknown backend", patch(offer(), payload(0), &9u16.to_le_bytes()), |e| {
            matches!(e, WireError::UnknownCode { field: "RingOffer.backend", code: 9 })
        }),
        ("offer unknown sync", patch(offer(), payload(4), &0u16.to_le_bytes()), |e| {
            matches!(e, WireError::UnknownCode { field: "RingOffer.sync", code: 0 })
        }),
        ("offer unknown pixel format", patch(offer(), payload(6), &99u16.to_le_bytes()), |e| {
            matches!(e, WireError::UnknownCode { field: "RingOffer.pixel_format", code: 99 })
        }),
        ("offer handle type of another backend", patch(offer(), payload(2), &2u16.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "RingOffer.handle_type", .. })
        }),
        ("offer pitch below the row", patch(offer(), payload(48), &16u32.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "geometry.pitch_bytes", .. })
        }),
        ("offer zero slots", patch(offer(), payload(52), &0u32.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "RingOffer.slot_count", .. })
        }),
        ("offer slots beyond the allocation", patch(offer(), payload(52), &5u32.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "RingOffer.allocation_bytes", .. })
        }),
        ("offer stride overflow", patch(offer(), payload(56), &(u64::MAX - 3).to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "RingOffer.allocation_bytes", .. })
        }),
        ("offer granularity not a power of two", patch(offer(), payload(80), &3000u64.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "RingOffer.granularity", .. })
        }),
        ("offer zero control bytes", patch(offer(), payload(88), &0u64.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "RingOffer.control_bytes", .. })
        }),
        ("offer unknown flag", patch(offer(), payload(96), &2u32.to_le_bytes()), |e| {
            matches!(e, WireError::ReservedNotZero { field: "RingOffer.flags" })
        }),
        ("offer legacy handle on a memfd ring", patch(offer(), payload(96), &1u32.to_le_bytes()), |e| {
            matches!(e, WireError::InvalidField { field: "RingOffer.legacy_mem_handle", .. })
        }),
        ("offer legacy handle bytes without the flag", patch(offer(), payload(104 + 63), &[1]), |e| {
            matches!(e, WireError::ReservedNotZero { field: "RingOffer.legacy_mem_handle" })
        }),
        ("offer event handles missing", patch(offer(), payload(100), &5u32.to_le_bytes()), |e| {
            matches!(e, WireError::Truncated { what: "RingOffer.event_handles", needed: 320, available: 0 })
        }),
        ("offer absurd event count", patch(offer(), payload(100), &u32::MAX.to_le_bytes()), |e| {
            matches!(e, WireError::Truncated { what: "RingOffer.event_handles", .. })
        }),
        (
            "offer events without event sync",
            fix_len(patch([offer(), vec![0; 64]].concat(), payload(100), &1u32.to_le_bytes())),
            |e| matches!(e, WireError::InvalidField { field: "RingOffer.event_handles", .. }),
        ),
        ("offer cut inside the fixed part", fix_len(offer()[..payload(100)].to_vec()), |e| {
            matches!(e, WireError::Truncated { what: "RingOffer", .. })
        }),
    ];
    for (name, bytes, check) in &cases {
        match Message::decode(bytes) {
            Ok(message) => panic!("{name}: decoded {message:?}"),
            Err(error) => assert!(check(&error), "{name}: wrong error {error:?}"),
        }
    }
}

#[test]
fn decoding_never_panics_on_prefixes_or_byte_flips() {
    for message in samples() {
        let bytes = message.encode().unwrap();
        for end in 0..bytes.len() {
            assert!(Message::decode(&bytes[..end]).is_err(), "prefix {end} of {message:?}");
        }
        for i in 0..bytes.len() {
            for value in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut flipped = bytes.clone();
                flipped[i] = value;
                // Either outcome is fine; what is checked is that it returns.
                let _ = Message::decode(&flipped);
            }
        }
    }
}

#[test]
fn encoding_refuses_what_decoding_would_refuse() {
    let long_name = Message::ClientHello(ClientHello {
        object: Default::default(),
        part: 0,
        protocol_version: 1,
        client_pid: 1,
        wanted_backend: None,
        consumer_name: "x".repeat(65),
    });
    assert!(matches!(long_name.encode(), Err(WireError::InvalidField { field: "ClientHello.consumer_name", .. })));
    let too_many_events = Message::RingOffer(RingOffer { event_handles: vec![[0; 64]; 7], ..legacy_offer() });
    assert!(matches!(too_many_events.encode(), Err(WireError::InvalidField { field: "RingOffer.event_handles", .. })));
    let vmm_with_legacy_handle = Message::RingOffer(RingOffer { legacy_mem_handle: Some([0; 64]), ..vmm_offer() });
    assert!(vmm_with_legacy_handle.encode().is_err());
    let too_few_events = Message::RingOffer(RingOffer { event_handles: vec![[0; 64]; 5], ..legacy_offer() });
    assert!(matches!(too_few_events.encode(), Err(WireError::InvalidField { field: "RingOffer.event_handles", .. })));
    let huge = Message::RingOffer(RingOffer {
        slot_count: 550,
        allocation_bytes: 550 * 4096,
        event_handles: vec![[0; 64]; 1100],
        ..legacy_offer()
    });
    assert!(matches!(huge.encode(), Err(WireError::PayloadTooLarge { .. })));
    assert_eq!(MessageType::from_code(2).unwrap(), MessageType::RingOffer);
}

/// A hello that names a part of a pool carries it as 4 bytes after the name, and only then: a hello of part 0 is
/// what releases before parts send, byte for byte, and a release before parts reads a part's hello as a hello with
/// trailing bytes, which it refuses (it never serves part 0 in its place).
#[test]
fn a_hello_names_its_part_after_the_name_and_older_decoders_refuse_it() {
    let pool_hello = |part| ClientHello {
        object: ipc_core::wire::ObjectKind::Pool,
        part,
        protocol_version: 1,
        client_pid: 5,
        wanted_backend: None,
        consumer_name: "abc".to_owned(),
    };
    let whole = Message::ClientHello(pool_hello(0)).encode().unwrap();
    let part = Message::ClientHello(pool_hello(2)).encode().unwrap();
    assert_eq!(part.len(), whole.len() + 4);
    assert_eq!(&part[HEADER_BYTES..part.len() - 4], &whole[HEADER_BYTES..], "the same fields, then the part");
    assert_eq!(&part[part.len() - 4..], &2u32.to_le_bytes());
    assert_eq!(Message::decode(&part).unwrap(), Message::ClientHello(pool_hello(2)));

    // Part 0 written out is a second encoding of a plain hello: refused.
    let mut zero = whole.clone();
    zero.extend_from_slice(&0u32.to_le_bytes());
    let zero = fix_len(zero);
    assert!(matches!(Message::decode(&zero), Err(WireError::InvalidField { field: "ClientHello.part", .. })));

    // Only a pool is made of parts: a ring hello with a part is refused both ways.
    let ring = ClientHello { object: ipc_core::wire::ObjectKind::Ring, ..pool_hello(1) };
    assert!(matches!(
        Message::ClientHello(ring.clone()).encode(),
        Err(WireError::InvalidField { field: "ClientHello.part", .. })
    ));
    let mut ring_bytes = Message::ClientHello(ClientHello { part: 0, ..ring }).encode().unwrap();
    ring_bytes.extend_from_slice(&1u32.to_le_bytes());
    let ring_bytes = fix_len(ring_bytes);
    assert!(matches!(Message::decode(&ring_bytes), Err(WireError::InvalidField { field: "ClientHello.part", .. })));

    // Other lengths after the name are trailing bytes, as before.
    let mut odd = whole;
    odd.extend_from_slice(&[1, 0, 0]);
    assert!(matches!(Message::decode(&fix_len(odd)), Err(WireError::TrailingBytes { .. })));
}
