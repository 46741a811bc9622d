//! Property tests: no input makes the decoders panic, and whatever decodes encodes back to the same bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use ipc_core::wire::{
    Attached, ClientHello, Detach, DetachReason, HEADER_BYTES, Header, Message, MessageReader, MessageType,
    PROTOCOL_VERSION, RefusalCode, Refused,
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

/// Valid messages to mutate (a `RingOffer` is covered by the arbitrary payloads: its valid encodings need fds).
fn samples() -> Vec<Vec<u8>> {
    [
        Message::ClientHello(ClientHello {
            object: Default::default(),
            protocol_version: PROTOCOL_VERSION,
            client_pid: 42,
            wanted_backend: None,
            consumer_name: "viewer".into(),
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
        kind in 0usize..5,
        fd_count in any::<u32>(),
        stated_len in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        payload in vec(any::<u8>(), 0..600),
    ) {
        let header = Header {
            version: PROTOCOL_VERSION,
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
            prop_assert_eq!(message.encode().unwrap(), bytes);
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
