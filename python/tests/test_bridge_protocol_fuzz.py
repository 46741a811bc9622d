"""The bridge's protocol decoders against hostile bytes (the other end of a bridge is a peer across the network):
every input decodes to what encodes back to it, or raises :class:`ProtocolError` (or :class:`PeerGone` for a
failure report), never another exception. A seeded random mutation run here (no extra dependency); the
coverage-guided run is ``fuzz/python/bridge_protocol.py`` (atheris, docs/fuzzing.md), whose findings are the
regression tests below."""

from __future__ import annotations

import json
import random
import struct

import pytest

from gpu_ipc.bridge_protocol import (
    END,
    GRANT,
    HELLO,
    MAGIC,
    WRITTEN,
    Choice,
    Grant,
    Offer,
    PathReport,
    ProtocolError,
    Region,
    decode,
    decode_choice,
    decode_grant,
    decode_hello,
    decode_offer,
    encode,
    encode_choice,
    encode_grant,
    encode_offer,
)

LAYOUT = {"shape": [4, 4], "dtype": "uint8", "nbytes": 16, "slots": 3}
SEEDS = [
    encode_grant(Grant(7, 1, 0x7F00_0000_1000, 4096, 0, b"reach-info")),
    encode(WRITTEN, struct.pack("<QQ", 7, 3)),
    encode(END, struct.pack("<Q", 12)),
    encode(HELLO, json.dumps(LAYOUT).encode()),
    encode_offer(Offer(2, Grant(0, 0, 0x7F00_0000_1000, 16, 0, b"slot"),
                       (Region(0x7F00_0000_2000, 16, 0, b"r0"), Region(0x7F00_0000_3000, 16, 0, b"")))),
    encode_choice(Choice("landing", PathReport(("cuda_ipc/cuda",), "zero-copy", True, "UCX", 150.0))),
]


@pytest.mark.parametrize("body", [
    # Found by the atheris run: a hello whose JSON is broken (bytes that are not UTF-8 in the shape).
    b'{"shape": [4, \xcc\xa2, "dtype": "uint8", "nbytes": 16, "slots": 3}',
    b"",
    b"\xff\xfe",
    b"[1, 2]",
    b"null",
    b'{"shape": "4x4", "dtype": "uint8", "nbytes": 16, "slots": 3}',
    b'{"shape": [4, -1], "dtype": "uint8", "nbytes": 16, "slots": 3}',
    b'{"shape": [4, 4.5], "dtype": "uint8", "nbytes": 16, "slots": 3}',
    b'{"shape": [4, true], "dtype": "uint8", "nbytes": 16, "slots": 3}',
    b'{"shape": [4, 4], "dtype": 7, "nbytes": 16, "slots": 3}',
    b'{"shape": [4, 4], "dtype": "uint8", "nbytes": 16, "slots": 0}',
    b'{"shape": [4, 4], "dtype": "uint8", "slots": 3}',
    b'{"shape": [4, 4], "dtype": "uint8", "nbytes": 16, "slots": 3, "path": "tcp"}',
    b"[" * 100_000,
])
def test_a_hello_that_is_not_a_frame_layout_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_hello(body)


def test_a_hello_with_a_layout_decodes_to_it() -> None:
    assert decode_hello(json.dumps(LAYOUT).encode()) == {**LAYOUT, "path": "auto"}


@pytest.mark.parametrize("body", [
    b"",
    b"[]",
    b'{"window": -1, "landing": []}',
    b'{"window": 65, "landing": []}',
    b'{"window": 1, "landing": [{"ptr": 1, "nbytes": 2, "device": 0, "reach": ""}, '
    b'{"ptr": 1, "nbytes": 2, "device": 0, "reach": ""}]}',
    b'{"window": 1, "landing": [{"ptr": 1, "nbytes": 2, "device": 0, "reach": 7}]}',
    b'{"window": 1, "landing": [{"ptr": 18446744073709551616, "nbytes": 2, "device": 0, "reach": ""}]}',
    b'{"window": 1, "landing": [{"ptr": 1, "nbytes": true, "device": 0, "reach": ""}]}',
    b'{"window": 0, "landing": [], "direct": [1, 2]}',
    b'{"window": 0, "landing": [], "landing_error": 3}',
])
def test_an_offer_that_is_not_one_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_offer(body)


@pytest.mark.parametrize("body", [
    # Found by the seeded mutations: a choice without gpu_direct (None by .get) passed, as did 1 for True.
    b'{"path": "landing", "transports": [], "description": "", "how": "", "gbps": 1}',
    b'{"path": "landing", "transports": [], "description": "", "gpu_direct": 1, "how": "", "gbps": 1}',
    b'{"path": "landing", "transports": [], "description": "", "gpu_direct": null, "how": "", "gbps": NaN}',
    b'{"path": "landing"}',
    b'{"path": "landing", "transports": "tcp/lo", "description": "", "gpu_direct": null, "how": "", "gbps": 1}',
    b'{"path": "landing", "transports": [], "description": "", "gpu_direct": "yes", "how": "", "gbps": 1}',
    b'{"path": "landing", "transports": [], "description": "", "gpu_direct": null, "how": "", "gbps": "1"}',
])
def test_a_choice_that_is_not_one_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_choice(body)


def _check(message: bytes) -> None:
    try:
        kind, body = decode(message)
    except ProtocolError:
        return
    assert encode(kind, body) == message
    for decoder in (decode_grant, decode_hello, decode_offer, decode_choice):
        try:
            decoded = decoder(body)
        except ProtocolError:
            continue
        if isinstance(decoded, Grant):
            assert encode_grant(decoded) == encode(GRANT, body)
        elif isinstance(decoded, Offer):
            assert decode_offer(decode(encode_offer(decoded))[1]) == decoded
        elif isinstance(decoded, Choice):
            assert decode_choice(decode(encode_choice(decoded))[1]) == decoded


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        what = rng.randrange(4)
        if what == 0 and out:
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif what == 1:
            out.insert(rng.randint(0, len(out)), rng.randrange(256))
        elif what == 2 and out:
            at = rng.randrange(len(out))
            del out[at:at + rng.randint(1, 8)]
        else:
            cut = rng.randint(0, len(out))
            out = out[:cut] if rng.random() < 0.5 else out[:cut] + bytes(rng.randrange(256) for _ in range(8))
    return bytes(out)


def test_mutated_notifications_decode_or_raise_protocol_errors() -> None:
    rng = random.Random(30)
    for _ in range(20_000):
        message = _mutate(rng, rng.choice(SEEDS))
        if rng.random() < 0.5:  # mostly past the magic, where the decoders are
            message = MAGIC + message[len(MAGIC):]
        _check(message)
