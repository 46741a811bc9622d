"""What consumer.py reads and checks, as docs/protocol.md and docs/ring.md specify it: its errors, the messages on
the socket, the payloads (ClientHello, RingOffer, Refused) and the control block (split out of consumer.py, which
attaches, reads frames and leaves)."""

import argparse
import dataclasses
import fcntl
import json
import mmap
import os
import select
import socket
import stat
import struct
import sys
import time

# The protocol's constants, the control block's layout, atomics and framing shared with producer.py.
sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
from gpuipc_wire import (  # noqa: E402
    ATTACHED_PAYLOAD, BACKEND_HOST_FAKE, BadHeader, BYTES_PER_PIXEL, CHECK_INTERVAL_S, close_fds,
    consumer_state_offset, CONTROL_BYTES, ControlMapping, decode_header, DETACH_CONSUMER_DONE, DETACH_IMPORT_FAILED,
    DETACH_PAYLOAD, encode_message, EVENT_HANDLE_BYTES, HANDLE_TYPE_HOST_MEMFD, HANDLE_TYPE_LEGACY_IPC,
    HANDLE_TYPE_OF_BACKEND, HEADER, HELLO, join_sequence_offset, LAYOUT_VERSION, make_atomics, MAX_FDS,
    MAX_NAME_BYTES, MAX_RECORDS, MAX_REFUSAL_MESSAGE_BYTES, MAX_SLOTS, MSG_ATTACHED, MSG_CLIENT_HELLO, MSG_DETACH,
    MSG_REFUSED, MSG_RING_OFFER, OFF_GENERATION, OFF_LAYOUT_VERSION, OFF_MAGIC, OFF_MAX_CONSUMERS,
    OFF_NEXT_SEQUENCE, OFF_PRODUCER_STATE, OFF_SLOT_COUNT, OFF_TOTAL_BYTES, OFFER, peer_credentials, POISON,
    process_gone, PRODUCER_CLOSED, PRODUCER_RUNNING, PROTOCOL_VERSION, published_offset, recv_with_fds,
    REFUSAL_NAMES, REFUSED, released_offset, RING_MAGIC, STATE_DETACHED, STATE_LIVE, state_word, SYNC_CPU_SLEEP,
    SYNC_CPU_SPIN, SYNC_IPC_EVENT, SYNC_NAMES,
)




# ---------------------------------------------------------------------------------------------------------------
# Errors: each carries the process exit code
# ---------------------------------------------------------------------------------------------------------------


class ConsumerError(Exception):
    """A failure that ends the consumer; `exit_code` is what the process exits with."""

    exit_code = 1


class ProtocolError(ConsumerError):
    """The peer broke the protocol, a wait timed out, or something else went wrong (exit 1)."""


class UnsupportedStrategy(ConsumerError):
    """The offer's sync strategy is not one this consumer implements (exit 2)."""

    exit_code = 2


class RefusedByProducer(ConsumerError):
    """The producer answered the hello with `Refused` (exit 3)."""

    exit_code = 3


class ProducerGone(ConsumerError):
    """The producer hung up, closed the ring, poisoned its counters or exited (exit 4)."""

    exit_code = 4


class Evicted(ConsumerError):
    """Our record is no longer LIVE in our epoch: the producer evicted us or declared us dead (exit 5)."""

    exit_code = 5


class ReadsStuck(ConsumerError):
    """Our reads of a frame did not finish in time (GPU reads, cuda_consumer.py; exit 1). Leaving, step 1: we skip
    the poison and the ring-level detach and just hang up; the producer takes that for a death."""


# ---------------------------------------------------------------------------------------------------------------
# Messages on the socket (protocol.md, "Transport", "Header", "Validation")
# ---------------------------------------------------------------------------------------------------------------


def send_message(sock, msg_type, payload):
    """Send one message; MSG_NOSIGNAL so a peer that hung up gives an error instead of SIGPIPE."""
    data = encode_message(msg_type, payload)
    while data:
        sent = sock.send(data, socket.MSG_NOSIGNAL)
        data = data[sent:]


def recv_exactly(sock, count, deadline, fds):
    """Read exactly `count` bytes before `deadline`, appending received fds to `fds`. Never reads more."""
    chunks = []
    remaining = count
    while remaining > 0:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProtocolError("timed out waiting for the producer's answer")
        sock.settimeout(left)
        try:
            data, received, truncated = recv_with_fds(sock, remaining)
        except socket.timeout:
            raise ProtocolError("timed out waiting for the producer's answer") from None
        except ConnectionResetError:
            raise ProducerGone("the producer reset the connection") from None
        fds.extend(received)
        if truncated:
            raise ProtocolError(f"more than {MAX_FDS} fds arrived with a message (FdsTruncated)")
        if not data:
            raise ProducerGone("the producer hung up before its answer was complete")
        chunks.append(data)
        remaining -= len(data)
    return b"".join(chunks)


# What the consumer says of a header that fails a check of `decode_header` (`{}`: the field's value).
HEADER_ERRORS = {
    "BadMagic": "bad magic in the producer's message",
    "UnsupportedVersion": "the producer speaks protocol version {}, not 1",
    "ReservedNotZero": "header reserved field is not 0",
    "UnknownMessageType": "unknown message type {}",
    "PayloadTooLarge": "payload of {} bytes is over 65536",
}


def recv_message(sock, deadline):
    """Read one message: returns (type, payload, fds). The caller owns the fds, also on error (closed here)."""
    fds = []
    try:
        header = recv_exactly(sock, HEADER.size, deadline, fds)
        try:
            msg_type, payload_len, fd_count = decode_header(header)
        except BadHeader as err:
            text = HEADER_ERRORS[err.error].format(err.value)
            raise ProtocolError(f"{text} ({err.error})") from None
        payload = recv_exactly(sock, payload_len, deadline, fds)
        if len(fds) != fd_count:
            raise ProtocolError(f"header says {fd_count} fds, {len(fds)} arrived (FdCountMismatch)")
        return msg_type, payload, fds
    except BaseException:
        close_fds(fds)
        raise


# ---------------------------------------------------------------------------------------------------------------
# ClientHello, RingOffer, Refused (protocol.md, "Payloads")
# ---------------------------------------------------------------------------------------------------------------


def encode_client_hello(name, wanted_backend=BACKEND_HOST_FAKE):
    """ClientHello payload: version 1, wanting `wanted_backend` (host-fake unless told; 0: any), our pid, our
    name."""
    name_bytes = name.encode("utf-8")
    if len(name_bytes) > MAX_NAME_BYTES:
        raise ProtocolError(f"consumer name is {len(name_bytes)} bytes; at most {MAX_NAME_BYTES}")
    return HELLO.pack(PROTOCOL_VERSION, wanted_backend, os.getpid(), len(name_bytes), 0) + name_bytes


def decode_refused(payload):
    """(code, message) of a Refused payload, checked as the docs require."""
    if len(payload) < REFUSED.size:
        raise ProtocolError("Refused payload shorter than 8 bytes (Truncated)")
    code, reserved, message_len = REFUSED.unpack_from(payload)
    if code not in REFUSAL_NAMES:
        raise ProtocolError(f"unknown refusal code {code} (UnknownCode)")
    if message_len > MAX_REFUSAL_MESSAGE_BYTES:
        raise ProtocolError(f"refusal message of {message_len} bytes is over 1024 (InvalidField)")
    if len(payload) != REFUSED.size + message_len:
        raise ProtocolError("Refused payload length does not match message_len (Truncated/TrailingBytes)")
    if reserved != 0:
        raise ProtocolError("Refused reserved field is not 0 (ReservedNotZero)")
    try:
        message = payload[REFUSED.size :].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("refusal message is not UTF-8 (InvalidUtf8)") from None
    return code, message


@dataclasses.dataclass
class Offer:
    """The fields of a RingOffer this consumer (or cuda_consumer.py) uses."""

    backend: int
    handle_type: int
    sync: int
    pixel_format: int
    consumer_id: int
    generation: int
    width: int
    height: int
    pitch_bytes: int
    slot_count: int
    slot_stride_bytes: int
    data_offset: int
    allocation_bytes: int
    granularity: int
    control_bytes: int
    event_count: int
    device_uuid: bytes = bytes(16)  # cuDeviceGetUuid_v2 bytes; all zero on host-fake
    legacy_mem_handle: bytes = bytes(64)  # the CUipcMemHandle when flag bit 0 is set
    event_handles: tuple = ()  # 2 * slot_count CUipcEventHandles (64 bytes each) with ipc-event, else none


def is_power_of_two(value):
    """True for 1, 2, 4, ..."""
    return value > 0 and value & (value - 1) == 0


def decode_offer(payload):
    """Parse a RingOffer payload and check every rule of its table (protocol.md, "RingOffer (type 2)")."""
    if len(payload) < OFFER.size:
        raise ProtocolError(f"RingOffer payload of {len(payload)} bytes is shorter than 168 (Truncated)")
    (backend, handle_type, sync, pixel_format, device_uuid, _producer_pid, consumer_id, generation, width, height,
     pitch_bytes, slot_count, slot_stride_bytes, data_offset, allocation_bytes, granularity, control_bytes, flags,
     event_count, legacy_mem_handle) = OFFER.unpack_from(payload)
    expected_len = OFFER.size + EVENT_HANDLE_BYTES * event_count
    if len(payload) < expected_len:
        raise ProtocolError("RingOffer payload shorter than its event handles (Truncated)")
    if len(payload) > expected_len:
        raise ProtocolError("RingOffer payload longer than its layout (TrailingBytes)")
    if backend not in HANDLE_TYPE_OF_BACKEND or handle_type not in HANDLE_TYPE_OF_BACKEND.values():
        raise ProtocolError(f"unknown backend {backend} or handle type {handle_type} (UnknownCode)")
    if sync not in SYNC_NAMES or pixel_format not in BYTES_PER_PIXEL:
        raise ProtocolError(f"unknown sync {sync} or pixel format {pixel_format} (UnknownCode)")

    def require(condition, what):
        if not condition:
            raise ProtocolError(f"RingOffer breaks a rule: {what} (InvalidField)")

    require(handle_type == HANDLE_TYPE_OF_BACKEND[backend], "handle_type is not the backend's")
    require(width > 0 and height > 0, "width and height must be > 0")
    require(pitch_bytes >= width * BYTES_PER_PIXEL[pixel_format] and pitch_bytes % 4 == 0,
            "pitch_bytes >= width * bytes per pixel, multiple of 4")
    require(1 <= slot_count <= MAX_SLOTS, "slot_count in 1..=32")
    require(slot_stride_bytes >= pitch_bytes * height and slot_stride_bytes % 4 == 0,
            "slot_stride_bytes >= pitch_bytes * height, multiple of 4")
    require(data_offset % 4 == 0, "data_offset multiple of 4")
    require(is_power_of_two(granularity) and allocation_bytes % granularity == 0,
            "granularity a power of two dividing allocation_bytes")
    require(allocation_bytes >= data_offset + slot_count * slot_stride_bytes,
            "allocation_bytes >= data_offset + slot_count * slot_stride_bytes")
    require(control_bytes == CONTROL_BYTES, "control_bytes is 131072")
    require(event_count == (2 * slot_count if sync == SYNC_IPC_EVENT else 0),
            "event_count is 2 * slot_count with ipc-event, else 0")
    legacy_present = flags & 1 == 1
    require(legacy_present == (handle_type == HANDLE_TYPE_LEGACY_IPC), "flag bit 0 set exactly for legacy-ipc")
    if flags & ~1:
        raise ProtocolError("RingOffer flags other than bit 0 are set (ReservedNotZero)")
    if not legacy_present and legacy_mem_handle != bytes(64):
        raise ProtocolError("unused legacy_mem_handle is not zero (ReservedNotZero)")
    event_handles = tuple(payload[OFFER.size + EVENT_HANDLE_BYTES * k : OFFER.size + EVENT_HANDLE_BYTES * (k + 1)]
                          for k in range(event_count))
    return Offer(backend, handle_type, sync, pixel_format, consumer_id, generation, width, height, pitch_bytes,
                 slot_count, slot_stride_bytes, data_offset, allocation_bytes, granularity, control_bytes,
                 event_count, device_uuid, legacy_mem_handle, event_handles)


def expected_fd_count(offer):
    """1 fd for legacy (the control block), 2 for vmm and host-fake (control block, frame allocation)."""
    return 1 if offer.handle_type == HANDLE_TYPE_LEGACY_IPC else 2


def check_memfd(fd, size, what):
    """A sealed memfd of exactly `size` bytes (protocol.md, "File descriptors"; ring.md, "Shared memory")."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ProtocolError(f"{what} fd is not a regular file (WrongFdType)")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise ProtocolError(f"{what} fd is not a memfd: F_GET_SEALS fails (WrongFdType)") from None
    if info.st_size != size:
        raise ProtocolError(f"{what} memfd is {info.st_size} bytes, not {size} (FdWrongSize)")
    needed = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
    if seals & needed != needed:
        raise ProtocolError(f"{what} memfd is not sealed against shrinking and growing (FdNotSealed)")


# ---------------------------------------------------------------------------------------------------------------
# The control block (ring.md)
# ---------------------------------------------------------------------------------------------------------------


def check_control_header(control, offer):
    """Attach step 4, as ring.md ("Shared memory") spells it out: magic, layout_version 1, total_bytes 131072,
    slot_count (1 to 32, which `decode_offer` checked) and generation equal to the offer's, max_consumers 1 to 16
    with our consumer_id below it, producer_state RUNNING or CLOSED. Anything else: not the offered ring, stop."""
    magic = control.load(OFF_MAGIC)  # stored last by the producer, so check it first
    if magic != RING_MAGIC:
        raise ProtocolError(f"control block magic is {magic:#x}, not 'GIPCRING'")
    checks = [
        ("layout_version", OFF_LAYOUT_VERSION, LAYOUT_VERSION),
        ("total_bytes", OFF_TOTAL_BYTES, CONTROL_BYTES),
        ("slot_count", OFF_SLOT_COUNT, offer.slot_count),
        ("generation", OFF_GENERATION, offer.generation),
    ]
    for name, offset, expected in checks:
        value = control.load(offset)
        if value != expected:
            raise ProtocolError(f"control block {name} is {value}, expected {expected}")
    max_consumers = control.load(OFF_MAX_CONSUMERS)
    if not offer.consumer_id < max_consumers <= MAX_RECORDS:
        raise ProtocolError(f"consumer_id {offer.consumer_id} is not a record of this ring "
                            f"(max_consumers {max_consumers})")
    producer_state = control.load(OFF_PRODUCER_STATE)
    if producer_state not in (PRODUCER_RUNNING, PRODUCER_CLOSED):
        raise ProtocolError(f"control block producer_state is {producer_state}, not 1 (RUNNING) or 2 (CLOSED)")


def read_own_record(control, consumer_id):
    """Attach step 5: our record must say LIVE; returns (epoch, join_sequence)."""
    word = control.load(consumer_state_offset(consumer_id))
    if word & 0xFF != STATE_LIVE:
        raise ProtocolError(f"record {consumer_id} is in state {word & 0xFF}, not LIVE")
    return word >> 8, control.load(join_sequence_offset(consumer_id))
