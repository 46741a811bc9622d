//! The fuzz targets' bodies, one function per decoder family that reads bytes from a peer, and the seeds that
//! the encoders make for each (`gen-corpus` writes them to `corpus/<target>/`). Each body panics only where a
//! decoder broke a promise: no panic or overflow on any input, what decodes encodes back to the same bytes, and no
//! description accepted that reaches outside the memory it describes. See `docs/fuzzing.md`.
#![allow(clippy::expect_used)]

use gpu_ipc_driver::DeviceUuid;
use ipc_core::wire::{
    Attached, BackendKind, ClientHello, DType, Detach, DetachReason, FrameGeometry, HandleType, Header,
    MAX_PAYLOAD_BYTES, Message, MessageType, ObjectKind, ObjectOffer, PROTOCOL_VERSION, PeerState, PeerStatus,
    PixelFormat, RefusalCode, Refused, RingOffer, SlotLayout, StatusReport, StatusRequest, SyncStrategy, TensorDesc,
};
use ipc_toolkit::pool::layout::{BlockId, Geometry};
use ipc_toolkit::pool::{BLOCK_PIECES_BYTES, BlockPieces, BlockReply, BlockRequest, PoolOffer};
use ipc_toolkit::queue::QueueOffer;
use ipc_toolkit::queue::layout::Geometry as QueueGeometry;
use ipc_toolkit::semaphore::SemaphoreOffer;
use ipc_toolkit::weights::{Manifest, SetParts, TensorEntry};

pub use ipc_toolkit::fuzzing::{pool_directory, queue_memory, semaphore_block};

/// Every target, by the name of its binary and corpus folder.
pub const TARGETS: [&str; 6] =
    ["wire_message", "object_offers", "pool_directory", "queue_memory", "semaphore_block", "weights_manifest"];

/// Runs target `name` on `data` (the seeds' replay test, and a crash's reproduction without libFuzzer).
pub fn run(name: &str, data: &[u8]) {
    match name {
        "wire_message" => wire_message(data),
        "object_offers" => object_offers(data),
        "pool_directory" => pool_directory(data),
        "queue_memory" => queue_memory(data),
        "semaphore_block" => semaphore_block(data),
        "weights_manifest" => weights_manifest(data),
        other => panic!("no fuzz target named {other}"),
    }
}

const TYPES: [MessageType; 8] = [
    MessageType::ClientHello,
    MessageType::RingOffer,
    MessageType::Attached,
    MessageType::Detach,
    MessageType::Refused,
    MessageType::ObjectOffer,
    MessageType::StatusRequest,
    MessageType::StatusReport,
];

/// The rendezvous socket's messages (header, hello, ring offer with its slot layout and tensor description,
/// object offer, status report, refusal, detach): whole messages, and payloads behind a header made from the
/// first two bytes, so the payload decoders are reached without a valid header too.
pub fn wire_message(data: &[u8]) {
    if let Ok(header) = Header::decode(data) {
        assert!(header.payload_len <= MAX_PAYLOAD_BYTES);
    }
    if let Ok(message) = Message::decode(data) {
        let version = Header::decode(data).expect("a message that decodes has a header").version;
        check_message(&message);
        let again = message.encode_in(version).expect("a decoded message encodes");
        assert_eq!(again, data, "{message:?} decoded from other bytes than it encodes to");
    }
    if let [kind, version, fds, payload @ ..] = data {
        let header = Header {
            version: 1 + u16::from(*version) % PROTOCOL_VERSION,
            message_type: TYPES[usize::from(*kind) % TYPES.len()],
            payload_len: payload.len() as u32,
            fd_count: u32::from(*fds % 8),
        };
        if let Ok(message) = Message::decode_payload(&header, payload) {
            check_message(&message);
            let again = message.encode_in(header.version).expect("a decoded payload encodes");
            assert_eq!(again.get(ipc_core::wire::HEADER_BYTES..), Some(payload), "{message:?}");
        }
    }
}

/// What every decoded message promises beyond its bytes.
fn check_message(message: &Message) {
    if let Message::RingOffer(offer) = message {
        let layout = &offer.slot_layout;
        assert!(layout.bytes() > 0 && layout.bytes() <= offer.slot_stride_bytes, "{offer:?}");
        if let Some(tensor) = layout.tensor() {
            assert!(tensor.span_bytes() <= layout.bytes(), "a tensor larger than its slot: {offer:?}");
            assert!(tensor.ndim() <= ipc_core::wire::MAX_TENSOR_DIMS);
        }
        let slots = offer.slot_stride_bytes.checked_mul(u64::from(offer.slot_count));
        let end = slots.and_then(|s| s.checked_add(offer.data_offset));
        assert!(end.is_some_and(|end| end <= offer.allocation_bytes), "slots outside the allocation: {offer:?}");
    }
    if let Message::ObjectOffer(offer) = message {
        object_body(offer.kind, &offer.body);
    }
}

/// A toolkit object's offer body, decoded as its kind says; what decodes encodes back to the same bytes.
fn object_body(kind: ObjectKind, body: &[u8]) {
    match kind {
        ObjectKind::Pool => {
            if let Ok(offer) = PoolOffer::decode(body) {
                assert_eq!(offer.encode().expect("a decoded pool offer encodes"), body, "{offer:?}");
                assert!(offer.geometry.check().is_ok(), "{offer:?}");
            }
        }
        ObjectKind::WorkQueue => {
            if let Ok(offer) = QueueOffer::decode(body) {
                assert_eq!(offer.encode(), body, "{offer:?}");
                assert!(offer.allocation_bytes >= offer.geometry.total_bytes, "{offer:?}");
            }
        }
        ObjectKind::Semaphore => {
            if let Ok(offer) = SemaphoreOffer::decode(body) {
                assert_eq!(offer.encode(), body, "{offer:?}");
            }
        }
        _ => {}
    }
}

/// The toolkit objects' offers and the pool's block channel: byte 0 picks the decoder (pool, work queue,
/// semaphore body; block request; block reply with 0 to 2 fds, or, for an input of its length, the block pieces
/// that follow a grant of several allocations with 0 to 9 fds), the rest is its input.
pub fn object_offers(data: &[u8]) {
    let [which, rest @ ..] = data else { return };
    match which % 5 {
        0 => object_body(ObjectKind::Pool, rest),
        1 => object_body(ObjectKind::WorkQueue, rest),
        2 => object_body(ObjectKind::Semaphore, rest),
        3 => {
            if let Ok(bytes) = rest.try_into()
                && let Ok(request) = BlockRequest::decode(bytes)
            {
                assert_eq!(&request.encode(), bytes);
            }
        }
        _ if rest.len() == BLOCK_PIECES_BYTES => {
            let fds = usize::from(which / 5 % 10);
            if let Ok(bytes) = rest.try_into()
                && let Ok(pieces) = BlockPieces::decode(bytes, fds)
            {
                assert_eq!(pieces.pieces.len(), fds);
                assert!(pieces.pieces.iter().all(|(_, size)| *size > 0), "{pieces:?}");
                assert_eq!(&pieces.encode().expect("what decodes encodes"), bytes, "{pieces:?}");
            }
        }
        _ => {
            let fds = usize::from(which / 5 % 3);
            if let Ok(bytes) = rest.try_into()
                && let Ok(reply) = BlockReply::decode(bytes, fds)
            {
                assert_eq!(reply.fd_count(), fds);
                assert_eq!(&reply.encode(), bytes, "{reply:?}");
            }
        }
    }
}

/// A host ring offer of 2 slots of 1 MiB holding `layout`.
fn ring_offer(layout: SlotLayout) -> RingOffer {
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

fn pool_offer() -> PoolOffer {
    let geometry = Geometry { entry_slots: 64, block_slots: 4 };
    PoolOffer {
        backend: BackendKind::Host,
        owner_pid: 77,
        pool_id: 0x5eed,
        geometry,
        directory_bytes: geometry.directory_bytes() as u64,
        pins_bytes: geometry.pins_bytes() as u64,
        device_uuid: DeviceUuid([0; 16]),
    }
}

fn queue_offer(backend: BackendKind) -> QueueOffer {
    let geometry = QueueGeometry::new(64, 32, 8).expect("a valid queue geometry");
    QueueOffer {
        backend,
        worker: 3,
        geometry,
        allocation_bytes: geometry.total_bytes.next_multiple_of(1 << 21),
        device_uuid: DeviceUuid([7; 16]),
        legacy_mem_handle: (backend == BackendKind::Legacy).then_some([0x42; 64]),
    }
}

fn semaphore_offer() -> SemaphoreOffer {
    SemaphoreOffer { layout_version: 1, record: 2, epoch: 5, max_peers: 32, shared_bytes: 65_536, generation: 9 }
}

/// A weights manifest (`ipc_toolkit::weights::Manifest::decode`) on the fuzzer's bytes: byte 0 picks the extent
/// mapped (its low bits shift a 64 GiB extent down). What decodes must encode back to the same bytes, and every
/// entry must lie after the manifest and inside the arena, inside the mapped extent.
///
/// # Panics
/// When the decoder accepts a manifest that breaks one of those rules.
pub fn weights_manifest(data: &[u8]) {
    let [shift, bytes @ ..] = data else { return };
    let mapped = (64u64 << 30) >> (shift % 40);
    let _ = Manifest::declared_len(bytes);
    let Ok(manifest) = Manifest::decode(bytes, mapped) else { return };
    assert!(manifest.arena_bytes <= mapped, "an arena larger than the mapping accepted");
    for entry in &manifest.entries {
        let end = entry.offset.checked_add(entry.span_bytes()).expect("an entry whose end overflows accepted");
        assert!(entry.offset >= bytes.len() as u64, "entry {} overlaps the manifest", entry.name);
        assert!(end <= manifest.arena_bytes, "entry {} reaches past the arena", entry.name);
    }
    assert_eq!(manifest.encode(), bytes, "a manifest that does not encode back to its bytes");
}

/// Manifests the owner writes: the seeds of `weights_manifest` (byte 0 = 0: a 64 GiB extent).
fn manifest_seeds() -> Vec<Vec<u8>> {
    let tensors = [
        ("embed.weight", TensorDesc::contiguous(DType::BF16, [32, 16]).expect("a valid tensor")),
        ("layers.0.proj", TensorDesc::strided(DType::F16, [4, 8], [1, 4]).expect("a valid tensor")),
        ("step", TensorDesc::contiguous(DType::I64, Vec::<u64>::new()).expect("a valid tensor")),
    ];
    [false, true]
        .into_iter()
        .map(|checksums| {
            let mut manifest = Manifest {
                set_name: "llama".into(),
                generation: 7,
                device_uuid: DeviceUuid([3; 16]),
                arena_bytes: 0,
                entries: tensors
                    .iter()
                    .map(|(name, desc)| TensorEntry {
                        name: (*name).to_owned(),
                        desc: desc.clone(),
                        offset: 0,
                        checksum: checksums.then_some(0x1234),
                    })
                    .collect(),
                parts: None,
            };
            let mut at = (manifest.encode().len() as u64).next_multiple_of(256);
            for entry in &mut manifest.entries {
                entry.offset = at;
                at = (at + entry.span_bytes()).next_multiple_of(256);
            }
            manifest.arena_bytes = at;
            [&[0u8][..], &manifest.encode()].concat()
        })
        .chain(std::iter::once(part_manifest_seed(&tensors)))
        .collect()
}

/// A part's manifest (format version 2): part 1 of a set on 2 devices, its tensors at places 2, 0 and 4 of 5.
fn part_manifest_seed(tensors: &[(&str, TensorDesc)]) -> Vec<u8> {
    let devices = vec![DeviceUuid([3; 16]), DeviceUuid([4; 16])];
    let mut manifest = Manifest {
        set_name: "llama".into(),
        generation: 7,
        device_uuid: DeviceUuid([4; 16]),
        arena_bytes: 0,
        entries: tensors
            .iter()
            .map(|(name, desc)| TensorEntry { name: (*name).to_owned(), desc: desc.clone(), offset: 0, checksum: None })
            .collect(),
        parts: Some(SetParts { part: 1, devices, set_tensors: 5, positions: vec![2, 0, 4] }),
    };
    let mut at = (manifest.encode().len() as u64).next_multiple_of(256);
    for entry in &mut manifest.entries {
        entry.offset = at;
        at = (at + entry.span_bytes()).next_multiple_of(256);
    }
    manifest.arena_bytes = at;
    [&[0u8][..], &manifest.encode()].concat()
}

/// Valid encodings of every message and body, made by the encoders: the seed corpus.
pub fn seeds() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let layouts = [
        SlotLayout::from(TensorDesc::strided(DType::F16, [4, 3, 100], [400, 128, 1]).expect("a valid tensor")),
        SlotLayout::from(TensorDesc::contiguous(DType::U64, [16, 16]).expect("a valid tensor")),
        SlotLayout::from(FrameGeometry::with_pitch(10, 10, 32, PixelFormat::Rgb8).expect("a valid frame")),
    ];
    let mut messages = vec![
        Message::ClientHello(ClientHello {
            object: ObjectKind::Ring,
            part: 0,
            protocol_version: PROTOCOL_VERSION,
            client_pid: 42,
            wanted_backend: None,
            consumer_name: "viewer".into(),
        }),
        Message::ClientHello(ClientHello {
            object: ObjectKind::Pool,
            part: 0,
            protocol_version: PROTOCOL_VERSION,
            client_pid: 43,
            wanted_backend: Some(BackendKind::Vmm),
            consumer_name: "importer".into(),
        }),
        Message::Attached(Attached { consumer_id: 3 }),
        Message::Detach(Detach { consumer_id: 3, reason: DetachReason::ImportFailed }),
        Message::Refused(Refused { code: RefusalCode::RingFull, message: "ring is full".into() }),
        Message::StatusRequest(StatusRequest),
        Message::StatusReport(StatusReport {
            kind: ObjectKind::Semaphore,
            backend: BackendKind::Host,
            owner_pid: 10,
            peers: vec![PeerStatus {
                id: 1,
                pid: Some(11),
                uid: 1000,
                gid: 1000,
                since_unix_ms: 1_700_000_000_000,
                last_sign_ms: Some(12),
                state: PeerState::Attached,
                name: "waiter".into(),
                detail: "2 stream waits".into(),
            }],
        }),
        Message::ObjectOffer(ObjectOffer {
            kind: ObjectKind::Pool,
            peer_id: 1,
            fd_count: 3,
            body: pool_offer().encode().expect("a valid pool offer"),
        }),
        Message::ObjectOffer(ObjectOffer {
            kind: ObjectKind::WorkQueue,
            peer_id: 2,
            fd_count: 1,
            body: queue_offer(BackendKind::Host).encode(),
        }),
        Message::ObjectOffer(ObjectOffer {
            kind: ObjectKind::Semaphore,
            peer_id: 3,
            fd_count: 1,
            body: semaphore_offer().encode(),
        }),
    ];
    messages.extend(layouts.iter().cloned().map(|layout| Message::RingOffer(ring_offer(layout))));
    let mut wire: Vec<Vec<u8>> = messages.iter().map(|m| m.encode().expect("a valid message")).collect();
    // Version 2 (deep rings, tensor layouts) too.
    wire.extend(layouts.into_iter().map(|l| Message::RingOffer(ring_offer(l)).encode_in(2).expect("v2 offer")));
    // A reader's hello for part 2 of a pool made of parts (a weight set on several devices).
    let part_hello = Message::ClientHello(ClientHello {
        object: ObjectKind::Pool,
        part: 2,
        protocol_version: PROTOCOL_VERSION,
        client_pid: 44,
        wanted_backend: Some(BackendKind::Vmm),
        consumer_name: "weights reader".into(),
    });
    wire.push(part_hello.encode().expect("a valid hello"));

    let block = BlockId { index: 2, serial: 9 };
    let offers = vec![
        [&[0u8][..], &pool_offer().encode().expect("a valid pool offer")].concat(),
        [&[1u8][..], &queue_offer(BackendKind::Host).encode()].concat(),
        [&[1u8][..], &queue_offer(BackendKind::Legacy).encode()].concat(),
        [&[2u8][..], &semaphore_offer().encode()].concat(),
        [&[3u8][..], &BlockRequest { block }.encode()[..]].concat(),
        // Byte 0 = 4 + 5 * fds.
        [&[4u8][..], &BlockReply::Gone { block }.encode()[..]].concat(),
        [
            &[9u8][..],
            &BlockReply::Grant { block, bytes: 4096, legacy_handle: None, with_fd: true, pieces: 1 }.encode()[..],
        ]
        .concat(),
        [
            &[4u8][..],
            &BlockReply::Grant { block, bytes: 1 << 21, legacy_handle: Some([1; 64]), with_fd: false, pieces: 1 }
                .encode()[..],
        ]
        .concat(),
        [
            &[4u8][..],
            &BlockReply::Grant { block, bytes: 3 << 21, legacy_handle: None, with_fd: false, pieces: 3 }.encode()[..],
        ]
        .concat(),
        // Byte 0 = 4 + 5 * fds: block pieces with 3 fds.
        [
            &[19u8][..],
            &BlockPieces { block, first: 8, pieces: vec![(0, 1 << 21), (1 << 21, 1 << 21), (2 << 21, 1 << 21)] }
                .encode()
                .expect("valid pieces")[..],
        ]
        .concat(),
    ];
    let mut all = vec![("wire_message", wire), ("object_offers", offers), ("weights_manifest", manifest_seeds())];
    all.extend(ipc_toolkit::fuzzing::seeds());
    all
}
