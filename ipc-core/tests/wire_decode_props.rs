//! Property tests: no input makes the decoders panic, and whatever decodes encodes back to the same bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::{
    Attached, BackendKind, ClientHello, DType, Detach, DetachReason, FrameGeometry, HEADER_BYTES, HandleType, Header,
    Message, MessageReader, MessageType, PROTOCOL_VERSION, PixelFormat, RefusalCode, Refused, RingOffer, SlotLayout,
    SyncStrategy, TensorDesc, WireError,
};
use proptest::collection::vec;
use proptest::prelude::*;

const TYPES: [MessageType; 5] = [
    MessageType::ClientHello,
    MessageType::RingOffer,
    MessageType::Attached,
    MessageType::Detach,
    MessageType::Refused,
];

/// A host ring of 2 slots of 1 MiB holding `layout`.
fn offer(layout: SlotLayout) -> RingOffer {
    RingOffer {
        backend: BackendKind::Host,
        handle_type: HandleType::HostMemfd,
        sync: SyncStrategy::CpuSpin,
        device_uuid: DeviceUuid([0; 16]),
        producer_pid: 5,
        generation: 6,
        consumer_id: 1,
        slot_layout: layout,
        slot_count: 2,
        slot_stride_bytes: 1 << 20,
        data_offset: 0,
        allocation_bytes: 2 << 20,
        granularity: 1 << 20,
        control_bytes: 131_072,
        legacy_mem_handle: None,
        event_handles: Vec::new(),
    }
}

/// Valid version-2 offers to mutate (decoding checks the header's fd count, not fds): a tensor with strides, a
/// contiguous one, and pixel frames.
fn v2_offers() -> Vec<Vec<u8>> {
    [
        SlotLayout::from(TensorDesc::strided(DType::F16, [4, 3, 100], [400, 128, 1]).unwrap()),
        SlotLayout::from(TensorDesc::contiguous(DType::U64, [16, 16]).unwrap()),
        SlotLayout::from(FrameGeometry::with_pitch(10, 10, 32, PixelFormat::Rgb8).unwrap()),
    ]
    .into_iter()
    .map(|layout| Message::RingOffer(offer(layout)).encode_in(2).unwrap())
    .collect()
}

/// Valid messages to mutate (the version-2 offers are in [`v2_offers`]).
fn samples() -> Vec<Vec<u8>> {
    [
        Message::ClientHello(ClientHello {
            object: Default::default(),
            part: 0,
            protocol_version: PROTOCOL_VERSION,
            client_pid: 42,
            wanted_backend: None,
            consumer_name: "viewer".into(),
        }),
        Message::ClientHello(ClientHello {
            object: ipc_core::wire::ObjectKind::Pool,
            part: 2,
            protocol_version: PROTOCOL_VERSION,
            client_pid: 42,
            wanted_backend: None,
            consumer_name: "weights reader".into(),
        }),
        Message::Attached(Attached { consumer_id: 3 }),
        Message::Detach(Detach { consumer_id: 3, reason: DetachReason::ImportFailed }),
        Message::Refused(Refused { code: RefusalCode::RingFull, message: "ring is full".into() }),
    ]
    .iter()
    .map(|m| m.encode().unwrap())
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn header_decode_never_panics(bytes in vec(any::<u8>(), 0..64)) {
        let _ = Header::decode(&bytes);
    }

    #[test]
    fn header_decode_never_panics_after_a_valid_magic(rest in vec(any::<u8>(), 0..32)) {
        let mut bytes = ipc_core::wire::MAGIC.to_vec();
        bytes.extend(rest);
        if let Ok(header) = Header::decode(&bytes) {
            prop_assert!(header.payload_len <= ipc_core::wire::MAX_PAYLOAD_BYTES);
        }
    }

    #[test]
    fn decode_payload_never_panics(
        version in 1u16..=PROTOCOL_VERSION,
        kind in 0usize..5,
        fd_count in any::<u32>(),
        stated_len in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        payload in vec(any::<u8>(), 0..600),
    ) {
        let header = Header {
            version,
            message_type: TYPES[kind],
            payload_len: stated_len.unwrap_or(payload.len() as u32),
            fd_count,
        };
        let _ = Message::decode_payload(&header, &payload);
    }

    #[test]
    fn mutated_messages_never_panic_and_what_decodes_reencodes(
        which in 0usize..4,
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = samples().swap_remove(which);
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(message) = Message::decode(&bytes) {
            // In the version its header names: a mutated version byte may name another version the build speaks.
            let version = Header::decode(&bytes).unwrap().version;
            prop_assert_eq!(message.encode_in(version).unwrap(), bytes);
        }
    }

    #[test]
    fn mutated_v2_offers_never_panic_and_what_decodes_is_valid_and_reencodes(
        which in 0usize..3,
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = v2_offers().swap_remove(which);
        // Most flips land in the slot layout and the fields next to it, where version 2 differs.
        for (at, value) in flips {
            let i = HEADER_BYTES + 160 + at.index(bytes.len() - HEADER_BYTES - 160);
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(Message::RingOffer(offer)) = Message::decode(&bytes) {
            let layout = &offer.slot_layout;
            prop_assert!(layout.bytes() > 0 && layout.bytes() % 4 == 0 && layout.bytes() <= offer.slot_stride_bytes);
            if let Some(tensor) = layout.tensor() {
                prop_assert!(tensor.span_bytes() <= layout.bytes());
                prop_assert!(tensor.ndim() <= 8);
            }
            let version = Header::decode(&bytes).unwrap().version;
            prop_assert_eq!(Message::RingOffer(offer).encode_in(version).unwrap(), bytes);
        }
    }

    #[test]
    fn any_tensor_description_is_valid_or_refused_with_a_layout_error_and_valid_ones_round_trip(
        dtype in prop::sample::select(DType::ALL.to_vec()),
        shape in vec(prop_oneof![1u64..5, 0u64..3, any::<u64>(), Just(1u64 << 62)], 0..10),
        strides in prop::option::of(vec(prop_oneof![0u64..5, any::<u64>()], 0..10)),
        slack in prop_oneof![Just(0u64), 0u64..64, any::<u64>()],
    ) {
        match TensorDesc::new(dtype, shape.clone(), strides.clone()) {
            Ok(tensor) => {
                let span = tensor.span_bytes();
                prop_assert!(span <= i64::MAX as u64);
                prop_assert!(tensor.element_count() <= i64::MAX as u64);
                // In a slot of at least its span (as the wire offers it), it round-trips in version 2.
                let bytes = span.div_ceil(4).saturating_add(slack / 4).saturating_mul(4);
                if let Ok(layout) = SlotLayout::tensors_in(bytes, tensor) {
                    let mut sent = offer(layout);
                    sent.slot_stride_bytes = sent.slot_layout.bytes().next_multiple_of(256);
                    sent.granularity = 1;
                    let Some(all) = sent.slot_stride_bytes.checked_mul(2) else { return Ok(()) };
                    sent.allocation_bytes = all;
                    let message = Message::RingOffer(sent);
                    let encoded = message.encode_in(2).unwrap();
                    prop_assert_eq!(Message::decode(&encoded).unwrap(), message);
                }
            }
            Err(WireError::InvalidLayout { field: "tensor", .. }) => {}
            Err(other) => prop_assert!(false, "not a layout error: {other}"),
        }
    }

    #[test]
    fn the_streaming_reader_never_panics(bytes in vec(any::<u8>(), 0..200), header_first in any::<bool>()) {
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let mut input = Vec::new();
        if header_first {
            // A header that passes its checks, so the payload path is reached.
            input.extend(samples().swap_remove(0).get(..HEADER_BYTES).unwrap());
        }
        input.extend(bytes);
        tx.write_all(&input).unwrap();
        tx.shutdown(Shutdown::Write).unwrap();
        let mut reader = MessageReader::new();
        // Every byte is queued and the write side is shut: the reader ends in a message or an error, never waits.
        for _ in 0..input.len() + 2 {
            match reader.read_available(rx.as_fd()) {
                Ok(Some(_)) => {}
                Ok(None) => prop_assert!(false, "the reader waited for bytes that cannot come"),
                Err(_) => break,
            }
        }
    }
}

/// The case the mutation test found once: a message encoded in version 1 whose version byte was changed to another
/// version this build speaks decodes, and encodes back to the same bytes in that version (not in its oldest).
#[test]
fn a_message_in_any_spoken_version_reencodes_in_that_version() {
    let attached = Message::Attached(Attached { consumer_id: 3 });
    for version in 1..=PROTOCOL_VERSION {
        let mut bytes = attached.encode().unwrap();
        bytes[8..10].copy_from_slice(&version.to_le_bytes());
        let decoded = Message::decode(&bytes).unwrap();
        assert_eq!(decoded.encode_in(version).unwrap(), bytes, "version {version}");
    }
}
