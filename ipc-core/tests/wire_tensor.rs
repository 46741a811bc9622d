//! Protocol version 2 on the wire: slot layouts of any tensor round-trip, each version carries what it can, and
//! every mangled version-2 offer or hello is rejected with its own error (`docs/protocol.md`, "Versions" and
//! "RingOffer (type 2), version 2").
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::{
    BackendKind, ClientHello, DType, FrameGeometry, HEADER_BYTES, HandleType, Header, LayoutError, Message, ObjectKind,
    PROTOCOL_VERSION, PixelFormat, RING_OFFER_FIXED_BYTES, RING_OFFER_V2_FIXED_BYTES, RefusalCode, Refused, RingOffer,
    SlotLayout, SyncStrategy, TensorDesc, WireError,
};

/// A host ring of 3 slots of 64 KiB, holding `layout`.
fn offer(layout: SlotLayout) -> RingOffer {
    RingOffer {
        backend: BackendKind::Host,
        handle_type: HandleType::HostMemfd,
        sync: SyncStrategy::CpuSleep,
        device_uuid: DeviceUuid([0; 16]),
        producer_pid: 77,
        generation: 9,
        consumer_id: 2,
        slot_layout: layout,
        slot_count: 3,
        slot_stride_bytes: 64 << 10,
        data_offset: 0,
        allocation_bytes: 192 << 10,
        granularity: 64 << 10,
        control_bytes: 131_072,
        legacy_mem_handle: None,
        event_handles: Vec::new(),
    }
}

fn layouts() -> Vec<SlotLayout> {
    vec![
        TensorDesc::contiguous(DType::F32, [4, 16, 16]).unwrap().into(),
        TensorDesc::strided(DType::BF16, [8, 100], [128, 1]).unwrap().into(),
        TensorDesc::strided(DType::C128, [3, 5], [1, 3]).unwrap().into(),
        SlotLayout::tensors_in(4096, TensorDesc::contiguous(DType::I64, []).unwrap()).unwrap(),
        SlotLayout::tensors_in(65_536, TensorDesc::contiguous(DType::U8, [1; 8]).unwrap()).unwrap(),
        SlotLayout::raw(65_536).unwrap(),
        FrameGeometry::new(64, 16, PixelFormat::Rgba8).unwrap().into(),
        FrameGeometry::with_pitch(30, 20, 256, PixelFormat::RgbaF16).unwrap().into(),
    ]
}

#[test]
fn every_layout_round_trips_in_version_2_and_frames_in_version_1_too() {
    for layout in layouts() {
        let message = Message::RingOffer(offer(layout.clone()));
        let v2 = message.encode_in(2).unwrap();
        assert_eq!(Message::decode(&v2).unwrap(), message, "{layout}");
        let ndim = layout.tensor().map_or(0, TensorDesc::ndim);
        let words = ndim * if layout.tensor().and_then(TensorDesc::strides).is_some() { 2 } else { 1 };
        assert_eq!(v2.len(), HEADER_BYTES + RING_OFFER_V2_FIXED_BYTES + 8 * words, "{layout}");
        match layout.frame_geometry() {
            Some(_) => {
                // Pixel frames: version 1 carries them too, and `encode` picks version 1.
                let v1 = message.encode_in(1).unwrap();
                assert_eq!(message.encode().unwrap(), v1);
                assert_eq!(v1.len(), HEADER_BYTES + RING_OFFER_FIXED_BYTES);
                assert_eq!(Message::decode(&v1).unwrap(), message);
            }
            None => {
                assert!(
                    matches!(message.encode_in(1), Err(WireError::NeedsVersion { version: 1, needs: 2, .. })),
                    "{layout}"
                );
                assert_eq!(message.encode().unwrap(), v2, "`encode` picks the oldest version that carries it");
            }
        }
    }
    assert!(matches!(
        Message::RingOffer(offer(layouts().remove(0))).encode_in(5),
        Err(WireError::UnsupportedVersion { found: 5, oldest: 1, newest: 4 })
    ));
}

#[test]
fn the_agreed_version_is_the_older_of_the_two() {
    let hello = |protocol_version| ClientHello {
        protocol_version,
        client_pid: 1,
        wanted_backend: None,
        consumer_name: "c".into(),
        object: ObjectKind::Ring,
        part: 0,
    };
    assert_eq!([1, 2, 7].map(|v| hello(v).agreed_version()), [1, 2, PROTOCOL_VERSION]);
    // A hello may be encoded in any version it announces, never in a newer one.
    let announces_1_in_v2 = Message::ClientHello(hello(1)).encode_in(2).unwrap();
    assert!(matches!(
        Message::decode(&announces_1_in_v2),
        Err(WireError::InvalidField { field: "ClientHello.protocol_version", .. })
    ));
    let v2 = Message::ClientHello(hello(2));
    assert_eq!(Message::decode(&v2.encode_in(2).unwrap()).unwrap(), v2);
    assert_eq!(Header::decode(&v2.encode().unwrap()).unwrap().version, 1, "a hello goes out in version 1");
}

#[test]
fn a_code_1_refusal_becomes_an_error_that_says_what_to_do() {
    let refused = Refused { code: RefusalCode::UnsupportedVersion, message: "speak version 1".into() };
    let error = refused.into_error();
    assert!(
        matches!(&error, WireError::VersionRefused { oldest: 1, newest: 4, message } if message == "speak version 1")
    );
    let text = error.to_string();
    assert!(text.contains("versions 1 to 4") && text.contains("same gpu-ipc release"), "{text}");
    let other = Refused { code: RefusalCode::RingFull, message: "full".into() }.into_error();
    assert!(matches!(other, WireError::Refused { code: RefusalCode::RingFull, .. }));
}

/// Payload offsets of the version-2 slot layout (after the 24-byte header).
const SLOT_BYTES: usize = HEADER_BYTES + 168;
const DTYPE: usize = HEADER_BYTES + 176;
const NDIM: usize = HEADER_BYTES + 178;
const TENSOR_FLAGS: usize = HEADER_BYTES + 179;
const RESERVED: usize = HEADER_BYTES + 180;
const SHAPE: usize = HEADER_BYTES + 184;

fn patched(mut bytes: Vec<u8>, at: usize, with: &[u8]) -> Vec<u8> {
    bytes[at..at + with.len()].copy_from_slice(with);
    bytes
}

/// A version-2 offer of a contiguous f32 [4, 16, 16] tensor (4096 bytes), as bytes.
fn tensor_offer() -> Vec<u8> {
    Message::RingOffer(offer(layouts().remove(0))).encode_in(2).unwrap()
}

/// A version-2 offer of a bf16 [8, 100] tensor with strides [128, 1], as bytes.
fn strided_offer() -> Vec<u8> {
    Message::RingOffer(offer(layouts().remove(1))).encode_in(2).unwrap()
}

/// A version-2 offer of 64 x 16 rgba8 frames, as bytes.
fn frame_offer() -> Vec<u8> {
    Message::RingOffer(offer(layouts().remove(6))).encode_in(2).unwrap()
}

fn layout_error(bytes: &[u8]) -> LayoutError {
    match Message::decode(bytes) {
        Err(WireError::InvalidLayout { field: "RingOffer.slot_layout", source }) => source,
        other => panic!("expected InvalidLayout, got {other:?}"),
    }
}

/// Sets the payload length in the header after the payload grew or shrank.
fn with_payload_len(mut bytes: Vec<u8>) -> Vec<u8> {
    let len = (bytes.len() - HEADER_BYTES) as u32;
    bytes[12..16].copy_from_slice(&len.to_le_bytes());
    bytes
}

#[test]
fn mangled_tensor_offers_get_their_own_errors() {
    let u64le = |v: u64| v.to_le_bytes();
    // The shape: too many dimensions (nine, the payload grown to hold them), an extent of 0, one of 2^63.
    let mut nine = patched(tensor_offer(), NDIM, &[9]);
    nine.splice(SHAPE..SHAPE, std::iter::repeat_n(0u8, 6 * 8)).for_each(drop);
    let nine = with_payload_len(nine);
    assert_eq!(layout_error(&nine), LayoutError::TooManyDims { ndim: 9, max: 8 });
    let ndim_255 = patched(tensor_offer(), NDIM, &[255]);
    assert_eq!(layout_error(&ndim_255), LayoutError::TooManyDims { ndim: 255, max: 8 });
    assert_eq!(
        layout_error(&patched(tensor_offer(), SHAPE + 8, &u64le(0))),
        LayoutError::BadExtent { dim: 1, extent: 0 }
    );
    assert_eq!(
        layout_error(&patched(tensor_offer(), SHAPE, &u64le(1 << 63))),
        LayoutError::BadExtent { dim: 0, extent: 1 << 63 }
    );
    // Overflow of the element count and of the span: each extent is allowed, their product is not.
    let huge = patched(patched(tensor_offer(), SHAPE, &u64le(1 << 40)), SHAPE + 8, &u64le(1 << 40));
    assert!(matches!(layout_error(&huge), LayoutError::TooLarge { dtype: DType::F32, .. }));
    // A tensor larger than the slot.
    let past_the_slot = patched(tensor_offer(), SHAPE, &u64le(5));
    assert!(matches!(layout_error(&past_the_slot), LayoutError::ExceedsSlot { span: 5120, bytes: 4096, .. }));
    // Strides: too large, or reaching past the slot.
    let strides = SHAPE + 16;
    assert_eq!(
        layout_error(&patched(strided_offer(), strides, &u64le(1 << 63))),
        LayoutError::StrideTooLarge { dim: 0, stride: 1 << 63 }
    );
    assert!(matches!(
        layout_error(&patched(strided_offer(), strides, &u64le(1 << 62))),
        LayoutError::TooLarge { dtype: DType::BF16, .. }
    ));
    assert!(matches!(layout_error(&patched(strided_offer(), strides, &u64le(1024))), LayoutError::ExceedsSlot { .. }));
    // The slot size: 0, not a multiple of 4, more than a slot's stride.
    for bytes in [0u64, 4098] {
        assert_eq!(layout_error(&patched(tensor_offer(), SLOT_BYTES, &u64le(bytes))), LayoutError::SlotBytes { bytes });
    }
    assert!(matches!(
        Message::decode(&patched(tensor_offer(), SLOT_BYTES, &u64le(128 << 10))),
        Err(WireError::InvalidField { field: "RingOffer.slot_stride_bytes", .. })
    ));
    // Codes, flags and reserved bytes.
    assert!(matches!(
        Message::decode(&patched(tensor_offer(), DTYPE, &99u16.to_le_bytes())),
        Err(WireError::UnknownCode { field: "RingOffer.dtype", code: 99 })
    ));
    assert!(matches!(
        Message::decode(&patched(tensor_offer(), TENSOR_FLAGS, &[2])),
        Err(WireError::ReservedNotZero { field: "RingOffer.tensor_flags" })
    ));
    assert!(matches!(
        Message::decode(&patched(tensor_offer(), RESERVED + 3, &[1])),
        Err(WireError::ReservedNotZero { field: "RingOffer.slot_layout.reserved" })
    ));
    assert!(matches!(
        Message::decode(&patched(tensor_offer(), DTYPE, &[0, 0])),
        Err(WireError::InvalidField { field: "RingOffer.ndim", .. })
    ));
    // Strides announced but not sent: the payload ends early.
    assert!(matches!(Message::decode(&patched(tensor_offer(), TENSOR_FLAGS, &[1])), Err(WireError::Truncated { .. })));
    // No pixel format, but pixel fields.
    assert!(matches!(
        Message::decode(&patched(tensor_offer(), HEADER_BYTES + 40, &u32::to_le_bytes(64))),
        Err(WireError::InvalidField { field: "RingOffer.width", .. })
    ));
}

#[test]
fn a_pixel_offer_whose_tensor_is_not_the_frame_is_rejected() {
    // The frame is u8 [16, 64, 4], 4096 bytes: another element type, shape, a stride, another size.
    let not_the_frame = |bytes: Vec<u8>, what: &str| match layout_error(&bytes) {
        LayoutError::NotTheFrame { what: found, .. } => assert_eq!(found, what),
        other => panic!("expected NotTheFrame, got {other}"),
    };
    not_the_frame(patched(frame_offer(), DTYPE, &DType::I8.code().to_le_bytes()), "tensor");
    not_the_frame(patched(frame_offer(), SHAPE + 16, &2u64.to_le_bytes()), "tensor");
    not_the_frame(patched(frame_offer(), SLOT_BYTES, &8192u64.to_le_bytes()), "bytes");
    // A version-1 offer has no "not pixel frames": pixel format 0 is an unknown code there.
    let v1 = Message::RingOffer(offer(layouts().remove(6))).encode_in(1).unwrap();
    assert!(matches!(
        Message::decode(&patched(v1, HEADER_BYTES + 6, &[0, 0])),
        Err(WireError::UnknownCode { field: "RingOffer.pixel_format", code: 0 })
    ));
}

#[test]
fn a_version_1_offer_of_frames_is_the_version_1_layout_byte_for_byte() {
    // The layout version 1 specifies (docs/protocol.md): pixel fields at 6 and 40..52, 168 bytes, no slot layout.
    let geometry = FrameGeometry::with_pitch(30, 20, 256, PixelFormat::RgbaF16).unwrap();
    let bytes = Message::RingOffer(offer(geometry.into())).encode_in(1).unwrap();
    let payload = &bytes[HEADER_BYTES..];
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 1);
    assert_eq!(payload.len(), 168);
    assert_eq!(u16::from_le_bytes([payload[6], payload[7]]), PixelFormat::RgbaF16.code());
    let word = |at: usize| u32::from_le_bytes(payload[at..at + 4].try_into().unwrap());
    assert_eq!((word(40), word(44), word(48)), (30, 20, 256));
}
