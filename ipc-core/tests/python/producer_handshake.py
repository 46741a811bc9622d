"""The producer's side of the handshake, as docs/protocol.md specifies it: the offer and refusal it encodes, the
hello it checks, and the states of a connection (split out of producer.py, which runs the ring)."""

import argparse
import array
import dataclasses
import errno
import fcntl
import json
import mmap
import os
import select
import socket
import stat
import sys
import time

# The protocol's constants, the control block's layout, atomics and framing shared with consumer.py.
sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
from gpuipc_wire import (  # noqa: E402
    ATOMIC_SEQ_CST, ATTACHED_PAYLOAD, BACKEND_HOST_FAKE, BadHeader, BYTES_PER_PIXEL, CHECK_INTERVAL_S, close_fds,
    consumer_heartbeat_offset, consumer_state_offset, CONTROL_BYTES, ControlMapping, decode_header, encode_message,
    HANDLE_TYPE_HOST_MEMFD, HANDLE_TYPE_OF_BACKEND, HEADER, HELLO, join_sequence_offset, LAYOUT_VERSION,
    make_atomics, MAX_FDS, MAX_NAME_BYTES, MAX_PAYLOAD, MAX_RECORDS, MAX_SLOTS, MSG_ATTACHED, MSG_CLIENT_HELLO,
    MSG_DETACH, MSG_REFUSED, MSG_RING_OFFER, OFF_GENERATION, OFF_LAYOUT_VERSION, OFF_MAGIC, OFF_MAX_CONSUMERS,
    OFF_NEXT_SEQUENCE, OFF_PRODUCER_HEARTBEAT, OFF_PRODUCER_PID, OFF_PRODUCER_STATE, OFF_SLOT_COUNT,
    OFF_TOTAL_BYTES, OFFER, peer_credentials, pid_offset, PIXEL_RGBA8, POISON, process_gone, PRODUCER_CLOSED,
    PRODUCER_RUNNING, published_offset, recv_with_fds, REFUSE_BACKEND, REFUSE_MALFORMED, REFUSE_PEER,
    REFUSE_RING_FULL, REFUSE_SHUTTING_DOWN, REFUSE_VERSION, REFUSED, released_offset, RING_MAGIC, STATE_DEAD,
    STATE_DETACHED, STATE_FREE, STATE_JOINING, STATE_LIVE, state_word, SYNC_CPU_SPIN,
)

DRAIN_AFTER_REFUSAL = 65536  # protocol.md "Failures": read and drop up to 64 KiB without waiting


def largest_power_of_two_dividing(value, limit):
    """protocol.md "granularity": the largest power of two, at most `limit`, that divides `value`."""
    granularity = 1
    while granularity < limit and value % (granularity * 2) == 0:
        granularity *= 2
    return granularity


# ---------------------------------------------------------------------------------------------------------------
# Messages (protocol.md "Header", "Payloads")
# ---------------------------------------------------------------------------------------------------------------


def encode_refused(code, message):
    """A `Refused` message (type 5)."""
    text = message.encode()[:1024]
    return encode_message(MSG_REFUSED, REFUSED.pack(code, 0, len(text)) + text)


def encode_offer(ring, consumer_id):
    """A `RingOffer` (type 2) for the host-fake ring, sent with 2 fds."""
    frames = ring.frames
    payload = OFFER.pack(
        BACKEND_HOST_FAKE,
        HANDLE_TYPE_HOST_MEMFD,
        SYNC_CPU_SPIN,
        PIXEL_RGBA8,
        bytes(16),  # device_uuid: all zero on host-fake
        os.getpid(),
        consumer_id,
        ring.generation,
        frames.width,
        frames.height,
        frames.pitch,
        frames.slots,
        frames.stride,
        frames.data_offset,
        frames.allocation_bytes,
        frames.granularity,
        CONTROL_BYTES,
        0,  # flags: no legacy handle
        0,  # event_count
        bytes(64),  # legacy_mem_handle: zero
    )
    return encode_message(MSG_RING_OFFER, payload, fd_count=2)


class Malformed(Exception):
    """A first message the producer refuses: `code` is the refusal code."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


# The refusal code and text for a header that fails a check of `decode_header` (`{}`: the field's value).
HEADER_REFUSALS = {
    "BadMagic": (REFUSE_MALFORMED, "bad magic: not a gpu-ipc message"),
    "UnsupportedVersion": (REFUSE_VERSION, "speak version 1"),
    "ReservedNotZero": (REFUSE_MALFORMED, "header reserved field is not zero"),
    "UnknownMessageType": (REFUSE_MALFORMED, "unknown message type {}"),
    "PayloadTooLarge": (REFUSE_MALFORMED, f"payload of {{}} bytes is larger than {MAX_PAYLOAD}"),
}


def check_header(raw):
    """(type, payload_len, fd_count) of a 24-byte header, or `Malformed` in protocol.md's order of checks."""
    try:
        return decode_header(raw)
    except BadHeader as err:
        code, text = HEADER_REFUSALS[err.error]
        raise Malformed(code, text.format(err.value)) from None


def check_hello(msg_type, payload, fd_count, fds_received):
    """The hello's wanted_backend (0 = any), or `Malformed` (protocol.md "ClientHello", "Validation")."""
    if fds_received > 2:
        raise Malformed(REFUSE_MALFORMED, "more than 2 fds")
    if fds_received != fd_count:
        raise Malformed(REFUSE_MALFORMED, "fds received differ from fd_count")
    if msg_type != MSG_CLIENT_HELLO:
        raise Malformed(REFUSE_MALFORMED, f"expected ClientHello, got message type {msg_type}")
    if len(payload) < HELLO.size:
        raise Malformed(REFUSE_MALFORMED, "ClientHello payload truncated")
    protocol_version, wanted_backend, _client_pid, name_len, reserved = HELLO.unpack_from(payload)
    if len(payload) < HELLO.size + name_len:
        raise Malformed(REFUSE_MALFORMED, "ClientHello payload truncated")
    if len(payload) > HELLO.size + name_len:
        raise Malformed(REFUSE_MALFORMED, "ClientHello payload has trailing bytes")
    if wanted_backend != 0 and wanted_backend not in HANDLE_TYPE_OF_BACKEND:
        raise Malformed(REFUSE_MALFORMED, f"unknown backend code {wanted_backend}")
    try:
        payload[HELLO.size :].decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed(REFUSE_MALFORMED, "consumer_name is not UTF-8") from None
    if protocol_version < 1 or name_len > MAX_NAME_BYTES:
        raise Malformed(REFUSE_MALFORMED, "ClientHello field out of range")
    if reserved != 0:
        raise Malformed(REFUSE_MALFORMED, "ClientHello reserved field is not zero")
    if fd_count != 0:
        raise Malformed(REFUSE_MALFORMED, "ClientHello carries no fds")
    return wanted_backend


# ---------------------------------------------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------------------------------------------

# Connection phases
HELLO_WAIT = "hello"  # accepted, reading the ClientHello
OFFER_WAIT = "offer"  # valid hello, waiting for the publishing loop to take a record
ATTACHED_WAIT = "attached?"  # offer sent, reading the Attached
ATTACHED = "attached"  # handshake done: the connection only signals liveness


@dataclasses.dataclass
class Connection:
    """One accepted connection and where its handshake is."""

    sock: socket.socket
    pid: int
    deadline: float
    phase: str = HELLO_WAIT
    buffer: bytearray = dataclasses.field(default_factory=bytearray)
    header: tuple = None  # (type, payload_len, fd_count) once the header is read
    fds_received: int = 0
    consumer: int = None  # record index once one is taken
    epoch: int = None
    full_since: float = None  # first time no record was free (refusal code 3 retries for 1 s)

    def fileno(self):
        """The socket's fd."""
        return self.sock.fileno()


def drain_and_close(sock):
    """Reads and drops up to 64 KiB without waiting, then closes (protocol.md "Failures": the peer then reads our
    refusal and end of stream, not ECONNRESET)."""
    remaining = DRAIN_AFTER_REFUSAL
    try:
        while remaining > 0:
            data, fds, _truncated = recv_with_fds(sock, min(remaining, 4096), socket.MSG_DONTWAIT)
            close_fds(fds)
            if not data:
                break
            remaining -= len(data)
    except OSError:
        pass
    sock.close()


# ---------------------------------------------------------------------------------------------------------------
# The producer
# ---------------------------------------------------------------------------------------------------------------
