//! The specification and the code agree: the byte-exact examples in `docs/protocol.md` and `docs/ring.md` (fenced
//! blocks whose info string is `golden-hex NAME`) are what the reference implementation encodes and decodes, and
//! the code tables of `docs/protocol.md` are the codes the implementation uses.
//!
//! A golden block holds one example per block: on each line, the leading tokens that are two hex digits are bytes,
//! the rest of the line is a comment. Every block must have its value here and every value here its block, so an
//! example cannot be added, removed or renamed on one side only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../ipc-core/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use gpu_ipc_driver::DeviceUuid;
use ipc_core::ring::layout::{MAGIC as RING_MAGIC, header};
use ipc_core::ring::{ControlBlock, LivenessPolicy, ProducerControl, RingConfig, RingLayout, SlotIndex};
use ipc_core::shm::SharedMemory;
use ipc_core::wire::{
    Attached, BackendKind, ClientHello, DType, Detach, DetachReason, FrameGeometry, HEADER_BYTES, HandleType, Header,
    MAGIC, Message, MessageType, ObjectKind, ObjectOffer, PeerState, PeerStatus, PixelFormat, RefusalCode, Refused,
    RingOffer, StatusReport, StatusRequest, SyncStrategy, TensorDesc,
};
use ipc_toolkit::pool::layout::{BlockId, Geometry};
use ipc_toolkit::pool::{BLOCK_PIECES_BYTES, BLOCK_REPLY_BYTES, BlockPieces, BlockReply, BlockRequest, PoolOffer};
use ipc_toolkit::queue::QueueOffer;
use ipc_toolkit::queue::layout::Geometry as QueueGeometry;
use ipc_toolkit::semaphore::SemaphoreOffer;

fn doc(name: &str) -> String {
    let path = common::package_file(&format!("../docs/{name}"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every `golden-hex NAME` block of `text`, by name.
fn golden_blocks(text: &str, file: &str) -> BTreeMap<String, Vec<u8>> {
    let mut blocks = BTreeMap::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.trim().strip_prefix("```golden-hex") else {
            continue;
        };
        let name = name.trim().to_owned();
        assert!(!name.is_empty(), "{file}: a golden-hex block without a name");
        let mut bytes = Vec::new();
        for line in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            let hex = line.split_whitespace().take_while(|t| t.len() == 2 && t.chars().all(|c| c.is_ascii_hexdigit()));
            bytes.extend(hex.map(|t| u8::from_str_radix(t, 16).unwrap()));
        }
        assert!(!bytes.is_empty(), "{file}: golden block {name} has no bytes");
        assert!(blocks.insert(name.clone(), bytes).is_none(), "{file}: two golden blocks named {name}");
    }
    blocks
}

const UUID: DeviceUuid =
    DeviceUuid([0x5d, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7, 0xf8]);

/// The value each golden message block shows.
fn golden_messages() -> BTreeMap<&'static str, Message> {
    let legacy_handle: [u8; 64] = std::array::from_fn(|i| 0x40 + i as u8);
    BTreeMap::from([
        (
            "client-hello",
            Message::ClientHello(ClientHello {
                object: Default::default(),
                part: 0,
                protocol_version: 1,
                wanted_backend: Some(BackendKind::Vmm),
                client_pid: 4242,
                consumer_name: "viewer".into(),
            }),
        ),
        (
            "ring-offer-vmm",
            Message::RingOffer(RingOffer {
                backend: BackendKind::Vmm,
                handle_type: HandleType::PosixFd,
                sync: SyncStrategy::GpuStreamOps,
                device_uuid: UUID,
                producer_pid: 1234,
                generation: 0x1_8765_4321,
                consumer_id: 2,
                slot_layout: FrameGeometry::new(1920, 1080, PixelFormat::Rgba8).unwrap().into(),
                slot_count: 4,
                slot_stride_bytes: 8_294_400,
                data_offset: 0,
                allocation_bytes: 33_554_432,
                granularity: 2 << 20,
                control_bytes: RingLayout::V1.block_bytes() as u64,
                legacy_mem_handle: None,
                event_handles: Vec::new(),
            }),
        ),
        (
            "ring-offer-legacy-ipc-event",
            Message::RingOffer(RingOffer {
                backend: BackendKind::Legacy,
                handle_type: HandleType::LegacyIpc,
                sync: SyncStrategy::IpcEvent,
                device_uuid: UUID,
                producer_pid: 1234,
                generation: 7,
                consumer_id: 0,
                slot_layout: FrameGeometry::new(640, 480, PixelFormat::Gray8).unwrap().into(),
                slot_count: 1,
                slot_stride_bytes: 307_200,
                data_offset: 0,
                allocation_bytes: 307_200,
                granularity: 4096,
                control_bytes: RingLayout::V1.block_bytes() as u64,
                legacy_mem_handle: Some(legacy_handle),
                event_handles: vec![[0xe0; 64], [0xe1; 64]],
            }),
        ),
        (
            "client-hello-v2",
            Message::ClientHello(ClientHello {
                object: ObjectKind::Ring,
                part: 0,
                protocol_version: 2,
                wanted_backend: Some(BackendKind::Vmm),
                client_pid: 4242,
                consumer_name: "viewer".into(),
            }),
        ),
        (
            "client-hello-v3",
            Message::ClientHello(ClientHello {
                object: ObjectKind::Ring,
                part: 0,
                protocol_version: 3,
                wanted_backend: Some(BackendKind::Vmm),
                client_pid: 4242,
                consumer_name: "viewer".into(),
            }),
        ),
        (
            "ring-offer-v2-tensor",
            Message::RingOffer(RingOffer {
                backend: BackendKind::Vmm,
                handle_type: HandleType::PosixFd,
                sync: SyncStrategy::GpuStreamOps,
                device_uuid: UUID,
                producer_pid: 1234,
                generation: 0x1_8765_4321,
                consumer_id: 1,
                slot_layout: TensorDesc::contiguous(DType::F32, [4, 1024, 1024]).unwrap().into(),
                slot_count: 4,
                slot_stride_bytes: 16 << 20,
                data_offset: 0,
                allocation_bytes: 64 << 20,
                granularity: 2 << 20,
                control_bytes: RingLayout::V1.block_bytes() as u64,
                legacy_mem_handle: None,
                event_handles: Vec::new(),
            }),
        ),
        (
            "ring-offer-v2-frames",
            Message::RingOffer(RingOffer {
                backend: BackendKind::Host,
                handle_type: HandleType::HostMemfd,
                sync: SyncStrategy::CpuSpin,
                device_uuid: DeviceUuid([0; 16]),
                producer_pid: 1234,
                generation: 7,
                consumer_id: 0,
                slot_layout: FrameGeometry::with_pitch(3, 2, 12, PixelFormat::Rgb8).unwrap().into(),
                slot_count: 1,
                slot_stride_bytes: 256,
                data_offset: 0,
                allocation_bytes: 4096,
                granularity: 4096,
                control_bytes: RingLayout::V1.block_bytes() as u64,
                legacy_mem_handle: None,
                event_handles: Vec::new(),
            }),
        ),
        (
            "client-hello-pool",
            Message::ClientHello(ClientHello {
                object: ObjectKind::Pool,
                part: 0,
                protocol_version: 1,
                wanted_backend: Some(BackendKind::Vmm),
                client_pid: 4242,
                consumer_name: "viewer".into(),
            }),
        ),
        (
            "object-offer",
            Message::ObjectOffer(ObjectOffer {
                kind: ObjectKind::Pool,
                peer_id: 3,
                fd_count: 1,
                body: vec![0xde, 0xad, 0xbe, 0xef],
            }),
        ),
        (
            "object-offer-pool",
            Message::ObjectOffer(ObjectOffer {
                kind: ObjectKind::Pool,
                peer_id: 3,
                fd_count: 3,
                body: pool_offer().encode().unwrap(),
            }),
        ),
        (
            "object-offer-semaphore",
            Message::ObjectOffer(ObjectOffer {
                kind: ObjectKind::Semaphore,
                peer_id: 3,
                fd_count: 1,
                body: SemaphoreOffer {
                    layout_version: 2,
                    record: 3,
                    epoch: 7,
                    max_peers: 32,
                    shared_bytes: 65536,
                    generation: 0x1_8765_4321,
                }
                .encode(),
            }),
        ),
        (
            "object-offer-work-queue",
            Message::ObjectOffer(ObjectOffer {
                kind: ObjectKind::WorkQueue,
                peer_id: 7,
                fd_count: 1,
                body: work_queue_offer().encode(),
            }),
        ),
        ("status-request", Message::StatusRequest(StatusRequest)),
        (
            "status-report",
            Message::StatusReport(StatusReport {
                kind: ObjectKind::Ring,
                backend: BackendKind::Vmm,
                owner_pid: 1234,
                peers: vec![PeerStatus {
                    id: 2,
                    pid: Some(4242),
                    uid: 1000,
                    gid: 1000,
                    since_unix_ms: 1_764_100_800_000,
                    last_sign_ms: Some(120),
                    state: PeerState::Attached,
                    name: "viewer".into(),
                    detail: "released frame 41".into(),
                }],
            }),
        ),
        ("attached", Message::Attached(Attached { consumer_id: 0x0102_0304 })),
        ("attached-without-events", Message::AttachedWithoutEvents(Attached { consumer_id: 0x0102_0304 })),
        ("detach-consumer-done", Message::Detach(Detach { consumer_id: 2, reason: DetachReason::ConsumerDone })),
        ("detach-import-failed", Message::Detach(Detach { consumer_id: 2, reason: DetachReason::ImportFailed })),
        (
            "refused-version",
            Message::Refused(Refused { code: RefusalCode::UnsupportedVersion, message: "speak version 1".into() }),
        ),
    ])
}

/// The work queue offer of the `object-offer-work-queue` example.
fn work_queue_offer() -> QueueOffer {
    QueueOffer {
        backend: BackendKind::Vmm,
        worker: 3,
        geometry: QueueGeometry::new(1024, 16, 64).unwrap(),
        allocation_bytes: 2 << 20,
        device_uuid: UUID,
        legacy_mem_handle: None,
    }
}

#[test]
fn the_work_queue_offer_body_decodes_to_its_value() {
    let blocks = golden_blocks(&doc("protocol.md"), "protocol.md");
    let Message::ObjectOffer(offer) = Message::decode(&blocks["object-offer-work-queue"]).unwrap() else {
        panic!("object-offer-work-queue is not an ObjectOffer");
    };
    assert_eq!(QueueOffer::decode(&offer.body).unwrap(), work_queue_offer());
}

/// The pool's offer body in `golden-hex object-offer-pool`.
fn pool_offer() -> PoolOffer {
    let geometry = Geometry { entry_slots: 4096, block_slots: 64 };
    PoolOffer {
        backend: BackendKind::Vmm,
        owner_pid: 1234,
        pool_id: 0x1_8765_4321,
        geometry,
        directory_bytes: geometry.directory_bytes() as u64,
        pins_bytes: geometry.pins_bytes() as u64,
        device_uuid: UUID,
    }
}

/// Golden blocks of the pool's block channel: fixed-size messages without a header.
const BLOCK_CHANNEL_PREFIX: &str = "block-";

#[test]
fn every_golden_message_encodes_to_its_bytes_and_decodes_to_its_value() {
    let mut blocks = golden_blocks(&doc("protocol.md"), "protocol.md");
    blocks.retain(|name, _| !name.starts_with(BLOCK_CHANNEL_PREFIX));
    let values = golden_messages();
    let documented: Vec<&str> = blocks.keys().map(String::as_str).collect();
    let known: Vec<&str> = values.keys().copied().collect();
    assert_eq!(documented, known, "golden blocks in docs/protocol.md vs values in this test");
    for (name, value) in &values {
        let bytes = &blocks[*name];
        // Each example is in the version its name says (`-v2`: version 2), else the oldest that carries it (1, and
        // 4 for AttachedWithoutEvents).
        let version = if name.contains("-v2") && value.message_type() == MessageType::RingOffer {
            2
        } else {
            value.oldest_version()
        };
        let encoded = value.encode_in(version).unwrap();
        assert_eq!(&encoded, bytes, "{name}: the implementation encodes other bytes than the doc");
        assert_eq!(&Message::decode(bytes).unwrap(), value, "{name}: the doc's bytes decode to another value");
        let header = Header::decode(bytes).unwrap();
        assert_eq!(header.version, version, "{name}: version");
        assert_eq!(header.fd_count as usize, value.fd_count(), "{name}: fd_count");
        assert_eq!(header.payload_len as usize, bytes.len() - HEADER_BYTES, "{name}: payload_len");
    }
    // Every message type has at least one example.
    let shown: Vec<MessageType> = values.values().map(Message::message_type).collect();
    for t in [
        MessageType::ClientHello,
        MessageType::RingOffer,
        MessageType::Attached,
        MessageType::Detach,
        MessageType::Refused,
        MessageType::ObjectOffer,
        MessageType::StatusRequest,
        MessageType::StatusReport,
        MessageType::AttachedWithoutEvents,
    ] {
        assert!(shown.contains(&t), "no golden example of {}", t.name());
    }
}

#[test]
fn the_pool_block_channel_examples_are_what_the_pool_encodes_and_decodes() {
    let mut blocks = golden_blocks(&doc("protocol.md"), "protocol.md");
    blocks.retain(|name, _| name.starts_with(BLOCK_CHANNEL_PREFIX));
    let block = BlockId { index: 7, serial: 3 };
    let request = &blocks["block-request"];
    assert_eq!(BlockRequest { block }.encode().as_slice(), request.as_slice());
    assert_eq!(BlockRequest::decode(request.as_slice().try_into().unwrap()).unwrap(), BlockRequest { block });
    let legacy_handle: [u8; 64] = std::array::from_fn(|i| 0x40 + i as u8);
    let replies = [
        (
            "block-grant-legacy",
            BlockReply::Grant { block, bytes: 64 << 20, legacy_handle: Some(legacy_handle), with_fd: false, pieces: 1 },
        ),
        (
            "block-grant-vmm",
            BlockReply::Grant { block, bytes: 64 << 20, legacy_handle: None, with_fd: true, pieces: 1 },
        ),
        (
            "block-grant-span",
            BlockReply::Grant { block, bytes: 60 << 20, legacy_handle: None, with_fd: false, pieces: 3 },
        ),
        ("block-gone", BlockReply::Gone { block }),
    ];
    let mut names: Vec<&str> = replies.iter().map(|(name, _)| *name).collect();
    names.push("block-request");
    names.push("block-pieces");
    let pieces =
        BlockPieces { block, first: 0, pieces: vec![(0, 20 << 20), (20 << 20, 20 << 20), (40 << 20, 20 << 20)] };
    let pieces_bytes: &[u8; BLOCK_PIECES_BYTES] = blocks["block-pieces"].as_slice().try_into().unwrap();
    assert_eq!(&pieces.encode().unwrap(), pieces_bytes, "block-pieces: the pool encodes other bytes than the doc");
    assert_eq!(BlockPieces::decode(pieces_bytes, 3).unwrap(), pieces, "block-pieces");
    names.sort_unstable();
    assert_eq!(blocks.keys().map(String::as_str).collect::<Vec<_>>(), names, "block channel examples");
    for (name, reply) in replies {
        let bytes: &[u8; BLOCK_REPLY_BYTES] = blocks[name].as_slice().try_into().unwrap();
        assert_eq!(&reply.encode(), bytes, "{name}: the pool encodes other bytes than the doc");
        assert_eq!(BlockReply::decode(bytes, reply.fd_count()).unwrap(), reply, "{name}");
    }
}

#[test]
fn the_control_block_header_images_are_what_a_ring_writes_and_what_a_consumer_reads() {
    let blocks = golden_blocks(&doc("ring.md"), "ring.md");
    let names = ["control-block-header", "control-block-header-v2"];
    assert_eq!(blocks.keys().collect::<Vec<_>>(), names, "golden blocks in docs/ring.md");
    // (image, slots, layout): version 1 at 4 slots, version 2 at 256.
    for (name, slots, layout) in [(names[0], 4, RingLayout::V1), (names[1], 256, RingLayout::V2)] {
        let image = &blocks[name];
        assert_eq!(image.len(), 64, "{name}");
        assert_eq!(u64::from_le_bytes(image[..8].try_into().unwrap()), RING_MAGIC);
        assert_eq!(&image[..8], b"GIPCRING");

        // Encode: a ring made with the image's settings has exactly that header (but for the pid: ours).
        let ring = ProducerControl::create(
            RingConfig { slot_count: slots, max_consumers: 16, generation: 0x1_8765_4321 },
            LivenessPolicy::default(),
        )
        .unwrap();
        assert_eq!(ring.block().layout(), layout, "{name}");
        let mut written = [0u8; 64];
        ring.block().memory().read_bytes(0, &mut written).unwrap();
        let mut expected = image.clone();
        expected[48..56].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        assert_eq!(
            written.as_slice(),
            expected.as_slice(),
            "{name}: the header a ring writes differs from docs/ring.md"
        );

        // Decode: a sealed memfd holding the image attaches, and reads back the image's fields.
        let memory = SharedMemory::create("golden-control-block", layout.block_bytes()).unwrap();
        memory.write_bytes(0, image).unwrap();
        let block = ControlBlock::attach(memory.try_clone_fd().unwrap()).unwrap();
        assert_eq!((block.layout(), block.slot_count(), block.max_consumers()), (layout, slots, 16), "{name}");
        assert_eq!(block.generation(), 0x1_8765_4321);
        assert_eq!(block.producer_pid(), 1234);
    }
    assert_eq!(RingLayout::V1.block_bytes(), 131_072, "docs say 131072 bytes");
    assert_eq!(RingLayout::V2.block_bytes(), 65_536, "docs say 65536 bytes");
}

/// The offset a ring.md layout table's cell names, for consumer `c` and slot `i`: terms joined by ` + `, each a
/// number, `N·i`, `N·c`, or `…` (the record's start: the state row's offset).
fn table_offset(cell: &str, record: usize, c: usize, i: usize) -> usize {
    cell.split(" + ")
        .map(|term| match term.split_once('·') {
            Some((n, "i")) => n.parse::<usize>().unwrap() * i,
            Some((n, "c")) => n.parse::<usize>().unwrap() * c,
            None if term == "…" => record,
            _ => term.parse().unwrap_or_else(|_| panic!("ring.md: offset term {term:?} in {cell:?}")),
        })
        .sum()
}

#[test]
fn the_control_block_tables_are_the_offsets_the_code_uses() {
    let text = doc("ring.md");
    for (heading, layout) in [("## Layout version 1", RingLayout::V1), ("## Layout version 2", RingLayout::V2)] {
        let section = text.split(heading).nth(1).unwrap_or_else(|| panic!("ring.md has no {heading:?}"));
        let rows =
            section.lines().skip_while(|l| !l.starts_with("| Offset |")).skip(2).take_while(|l| l.starts_with('|'));
        let mut fields = Vec::new();
        // A consumer and a slot other than 0, so that every stride counts.
        let (c, i) = (3u32, 5u32);
        let mut record = 0;
        for row in rows {
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            let field = cells[1].trim_matches('`').split('`').next().unwrap().to_owned();
            let offset = table_offset(cells[0], record, c as usize, i as usize);
            let slot = SlotIndex(i);
            let expected = match field.as_str() {
                "header.magic" => header::MAGIC,
                "header.layout_version" => header::LAYOUT_VERSION,
                "header.total_bytes" => header::TOTAL_BYTES,
                "header.slot_count" => header::SLOT_COUNT,
                "header.max_consumers" => header::MAX_CONSUMERS,
                "header.generation" => header::GENERATION,
                "header.producer_pid" => header::PRODUCER_PID,
                "header.producer_state" => layout.producer_state_offset(),
                "header.device_words" => header::DEVICE_WORDS,
                "header.producer_kernel_abort" => layout.producer_kernel_abort_offset(),
                "producer_heartbeat_ns" => layout.producer_heartbeat_offset(),
                "next_sequence" => layout.next_sequence_offset(),
                "published[i]" => layout.published_offset(slot),
                "consumers[c].state" => {
                    record = offset;
                    layout.consumer_state_offset(c)
                }
                "consumers[c].pid" => layout.consumer_pid_offset(c),
                "consumers[c].join_sequence" => layout.join_sequence_offset(c),
                "consumers[c].kernel_abort" => layout.kernel_abort_offset(c),
                "consumers[c].heartbeat_ns" => layout.consumer_heartbeat_offset(c),
                "consumers[c].released[i]" => layout.released_offset(c, slot),
                other => panic!("ring.md {heading}: unknown field {other:?}"),
            };
            assert_eq!(offset, expected, "ring.md {heading}: {field} at {:?}", cells[0]);
            fields.push(field);
        }
        assert_eq!(fields.len(), 19, "ring.md {heading}: every field has its row: {fields:?}");
        // The table's header values are the layout's.
        let value_of = |field: &str| section.lines().find(|l| l.contains(&format!("`{field}`"))).unwrap().to_owned();
        assert!(value_of("header.layout_version").contains(&format!("| `{}` |", layout.version())), "{heading}");
        assert!(value_of("header.total_bytes").contains(&format!("| `{}` |", layout.block_bytes())), "{heading}");
        assert!(value_of("header.slot_count").contains(&format!("1..={}", layout.max_slots())), "{heading}");
    }
}

/// Rows `(name, code, rest)` of the markdown table whose first header cell is `first_header`; the name is the
/// first cell up to any ` (`.
fn table(text: &str, first_header: &str) -> Vec<(String, u16, Vec<String>)> {
    let mut rows = Vec::new();
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&format!("| {first_header} |")));
    assert!(lines.next().is_some(), "no table headed {first_header:?} in docs/protocol.md");
    for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cells: Vec<String> = line.trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect();
        let name = cells[0].split(" (").next().unwrap().to_owned();
        let code = cells[1].parse().unwrap_or_else(|_| panic!("{first_header}: bad code in {line:?}"));
        rows.push((name, code, cells[2..].to_vec()));
    }
    rows
}

/// `ConsumerDone` -> `consumer done`.
fn words(debug: String) -> String {
    let mut out = String::new();
    for (i, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push(' ');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[test]
fn the_code_tables_are_the_codes_the_implementation_uses() {
    let text = doc("protocol.md");
    let t = table(&text, "type");
    assert_eq!(t.len(), 9);
    for (name, code, _) in t {
        assert_eq!(MessageType::from_code(code).unwrap().name(), name);
    }
    for (name, code, rest) in table(&text, "backend") {
        let backend = BackendKind::from_code(code, "backend").unwrap();
        assert_eq!(backend.to_string(), name);
        assert_eq!(backend.handle_type().to_string(), rest[0]);
    }
    for (name, code, _) in table(&text, "handle type") {
        assert_eq!(HandleType::from_code(code, "handle type").unwrap().to_string(), name);
    }
    let syncs = table(&text, "sync strategy");
    assert_eq!(syncs.len(), 5);
    for (name, code, _) in syncs {
        assert_eq!(SyncStrategy::from_code(code, "sync").unwrap().to_string(), name);
    }
    let formats = table(&text, "pixel format");
    assert_eq!(formats.len(), 7);
    for (name, code, rest) in formats {
        let format = PixelFormat::from_code(code, "pixel format").unwrap();
        assert_eq!(words(format!("{format:?}")).replace(' ', "-"), name);
        assert_eq!(format.bytes_per_pixel().to_string(), rest[0], "{name}");
    }
    let dtypes = table(&text, "dtype");
    assert_eq!(dtypes.len(), DType::ALL.len());
    for (name, code, rest) in dtypes {
        let dtype = DType::from_code(code, "dtype").unwrap();
        assert_eq!(dtype.name(), name);
        assert_eq!(dtype.size_bytes().to_string(), rest[0], "{name}");
        let dlpack = dtype.dlpack();
        assert_eq!(format!("{}, {}", dlpack.code, dlpack.bits), rest[1], "{name}: DLPack");
    }
    let reasons = table(&text, "detach reason");
    assert_eq!(reasons.len(), 5);
    for (name, code, _) in reasons {
        assert_eq!(words(format!("{:?}", DetachReason::from_code(code).unwrap())), name);
    }
    let refusals = table(&text, "refusal code");
    assert_eq!(refusals.len(), 7);
    for (name, code, _) in refusals {
        assert_eq!(RefusalCode::from_code(code).unwrap().to_string(), name);
    }
    let objects = table(&text, "object kind");
    assert_eq!(objects.len(), ObjectKind::ALL.len());
    for (name, code, _) in objects {
        assert_eq!(ObjectKind::from_code(code, "object kind").unwrap().name(), name);
    }
    assert!(text.contains("`47 50 55 49 50 43 0d 0a`"));
    assert_eq!(&MAGIC, b"GPUIPC\r\n");
}
