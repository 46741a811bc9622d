#!/usr/bin/env python3
"""A gpu-ipc consumer in pure Python (3.11 standard library), written from docs/protocol.md and docs/ring.md only.

It attaches to a producer of the host-memory "host-fake" backend (backend 3, handle type host-memfd), reads
frames with the CPU strategies (cpu-spin, cpu-sleep), checks their content and leaves cleanly. It is the
evidence that the protocol can be implemented from its specification alone, and an example for anyone who wants
to write a consumer in another language: every step names the section of the docs it follows.

    python3 consumer.py --socket /tmp/frames.sock --frames 300
    python3 consumer.py --socket /tmp/frames.sock --frames 0            # until the producer is gone
    python3 consumer.py --socket /tmp/frames.sock --read-delay 0.05     # a slow reader
    python3 consumer.py --socket /tmp/frames.sock --stall-after 5       # stops releasing after 5 frames

Frame content: the test producer writes frame s's sequence number, as a little-endian u64, into every 8-byte word
of the frame (the `pitch_bytes * height` bytes of its slot; bytes after the last whole word are not checked).

Options for tests: `--frames 0` reads until the producer is gone (no count to reach, so it never leaves on its
own); `--read-delay S` sleeps S seconds after reading each frame, before releasing it; `--stall-after N` releases
the first N frames as usual and then stops releasing: it goes on waiting for and reading the next frames (each
wait bounded by `--timeout`) but holds every one, like a consumer stuck on its output, until the producer evicts
it, it has read `--frames` frames, or a wait times out. A held frame still gets the record check that precedes a
release.

Output: one line of JSON on stdout when it stops after reading (exit 0, 4 or 5), e.g.
    {"frames": 300, "held": 0, "read_past_poison": 0, "first_seq": 17, "mismatched_words": 0, "consumer_id": 1}
`frames` is how many frames it read and verified (from `first_seq` on, consecutive), `held` how many of those it
did not release (`--stall-after`), `read_past_poison` how many it read although their publish counter was
poisoned (frames published before a clean close, protocol.md "When frame s is readable"), `mismatched_words` the
8-byte words among them that differed from the frame's sequence number. A frame counts only once the record check
after reading it passed: a frame read after the producer evicted us may have been rewritten meanwhile and is not
counted. With exit 0, `frames` is `--frames`. Messages go to stderr.

Exit codes:
    0  read `--frames` frames and left cleanly (ring-level detach succeeded)
    1  protocol error, unexpected data, timeout, or the peer check failed (no summary)
    2  the offer names a sync strategy this consumer does not support (only cpu-spin and cpu-sleep are)
    3  the producer refused us (its code and message are printed)
    4  the producer is gone (closed the ring, hung up, poisoned counters, or its process exited) and the next frame
       will never come: every frame it published before a clean close was read first (protocol.md, "Producer
       shutdown"). The summary says how many. With `--frames 0` this is the normal end of a run: a consumer that
       read everything and then found the producer gone exits 4 with its count.
    5  the producer evicted us or declared us dead (our record is no longer LIVE in our epoch); the summary counts
       the frames read before

Atomics. The control block is shared memory that the producer updates concurrently, so the counters are read and
written with atomic 8-byte operations. Python has none of its own, so this file calls libatomic (the GCC runtime
library, present wherever a C compiler is installed) through `ctypes`: `__atomic_load_8` (acquire),
`__atomic_store_8` (release), `__atomic_compare_exchange_8` and `__atomic_fetch_or_8`, on addresses inside the
mapping; the counters we write are raised with a compare-and-swap loop (a `fetch_max`: never lowered, so a POISON
the producer wrote stays, protocol.md "Frames, per sync strategy"). Without libatomic, on x86-64 only, it falls
back to plain aligned 8-byte loads and stores through `ctypes.c_uint64`, which on x86-64 are atomic with
acquire/release ordering; there the `fetch_max` and the compare-and-swap of the ring-level detach become a load
and a store, which the docs allow while our record is LIVE in our epoch (protocol.md: "a plain aligned store is
right only while your record is LIVE", checked before each release; "Leaving": "an aligned 8-byte store of the
DETACHED word does the same while you are attached").
"""

import argparse
import ctypes
import dataclasses
import fcntl
import json
import mmap
import os
import platform
import select
import socket
import stat
import struct
import sys
import time

# ---------------------------------------------------------------------------------------------------------------
# Wire protocol constants (docs/protocol.md)
# ---------------------------------------------------------------------------------------------------------------

WIRE_MAGIC = b"GPUIPC\r\n"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<8sHHIII")  # magic, version, type, payload_len, fd_count, reserved: 24 bytes
MAX_PAYLOAD = 65536
MAX_FDS = 2

MSG_CLIENT_HELLO = 1
MSG_RING_OFFER = 2
MSG_ATTACHED = 3
MSG_DETACH = 4
MSG_REFUSED = 5
KNOWN_MESSAGE_TYPES = {MSG_CLIENT_HELLO, MSG_RING_OFFER, MSG_ATTACHED, MSG_DETACH, MSG_REFUSED}

BACKEND_LEGACY = 1
BACKEND_VMM = 2
BACKEND_HOST_FAKE = 3
HANDLE_TYPE_LEGACY_IPC = 1
HANDLE_TYPE_POSIX_FD = 2
HANDLE_TYPE_HOST_MEMFD = 3
HANDLE_TYPE_OF_BACKEND = {
    BACKEND_LEGACY: HANDLE_TYPE_LEGACY_IPC,
    BACKEND_VMM: HANDLE_TYPE_POSIX_FD,
    BACKEND_HOST_FAKE: HANDLE_TYPE_HOST_MEMFD,
}

SYNC_CPU_SPIN = 1
SYNC_CPU_SLEEP = 2
SYNC_IPC_EVENT = 3
SYNC_NAMES = {1: "cpu-spin", 2: "cpu-sleep", 3: "ipc-event", 4: "gpu-stream-ops", 5: "gpu-poll"}
SUPPORTED_SYNC = {SYNC_CPU_SPIN, SYNC_CPU_SLEEP}

BYTES_PER_PIXEL = {1: 3, 2: 4, 3: 4, 4: 1, 5: 2, 6: 8, 7: 16}  # pixel format code -> bytes per pixel

REFUSAL_NAMES = {
    1: "unsupported protocol version",
    2: "backend mismatch",
    3: "ring full",
    4: "peer not allowed",
    5: "producer shutting down",
    6: "malformed hello",
}

DETACH_CONSUMER_DONE = 1
DETACH_IMPORT_FAILED = 3

MAX_NAME_BYTES = 64
MAX_REFUSAL_MESSAGE_BYTES = 1024

# RingOffer's fixed part, 168 bytes (protocol.md, "RingOffer (type 2)").
OFFER = struct.Struct("<HHHH16sIIQIIIIQQQQQII64s")
EVENT_HANDLE_BYTES = 64

# ---------------------------------------------------------------------------------------------------------------
# Control block constants (docs/ring.md, "Layout (version 1)")
# ---------------------------------------------------------------------------------------------------------------

CONTROL_BYTES = 131072
RING_MAGIC = 0x474E495243504947  # the bytes "GIPCRING" read as a little-endian u64
LAYOUT_VERSION = 1
MAX_SLOTS = 32

OFF_MAGIC = 0
OFF_LAYOUT_VERSION = 8
OFF_TOTAL_BYTES = 16
OFF_SLOT_COUNT = 24
OFF_MAX_CONSUMERS = 32
OFF_GENERATION = 40
OFF_PRODUCER_STATE = 56
OFF_NEXT_SEQUENCE = 256

PRODUCER_RUNNING = 1
PRODUCER_CLOSED = 2

STATE_LIVE = 2
STATE_DETACHED = 3

POISON = 1 << 62

CHECK_INTERVAL_S = 0.001  # how often a wait checks the producer's liveness (ring.md, "Bounded CPU waits")
SLEEP_INTERVAL_S = 0.0001  # how long cpu-sleep sleeps between two looks at the counter (our choice)


def published_offset(slot):
    """Offset of `published[slot]`."""
    return 384 + 128 * slot


def consumer_state_offset(consumer):
    """Offset of `consumers[consumer].state` (`epoch << 8 | state`)."""
    return 4480 + 4352 * consumer


def join_sequence_offset(consumer):
    """Offset of `consumers[consumer].join_sequence`."""
    return consumer_state_offset(consumer) + 16


def released_offset(consumer, slot):
    """Offset of `consumers[consumer].released[slot]`."""
    return consumer_state_offset(consumer) + 256 + 128 * slot


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


# ---------------------------------------------------------------------------------------------------------------
# Atomic 8-byte operations on shared memory
# ---------------------------------------------------------------------------------------------------------------

ATOMIC_ACQUIRE = 2
ATOMIC_RELEASE = 3
ATOMIC_SEQ_CST = 5


class LibAtomic:
    """Atomic u64 operations at absolute addresses, through libatomic's out-of-line functions."""

    def __init__(self, lib):
        # getattr, not `lib.__atomic_load_8`: inside a class Python would mangle a name that starts with "__".
        self._load = getattr(lib, "__atomic_load_8")
        self._load.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self._load.restype = ctypes.c_uint64
        self._store = getattr(lib, "__atomic_store_8")
        self._store.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
        self._store.restype = None
        # The library form has no `weak` argument: (ptr, expected *, desired, success order, failure order).
        self._compare_exchange = getattr(lib, "__atomic_compare_exchange_8")
        self._compare_exchange.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.c_uint64,
            ctypes.c_int,
            ctypes.c_int,
        ]
        self._compare_exchange.restype = ctypes.c_bool
        self._fetch_or = getattr(lib, "__atomic_fetch_or_8")
        self._fetch_or.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
        self._fetch_or.restype = ctypes.c_uint64

    def load(self, address):
        """Load with acquire ordering."""
        return self._load(address, ATOMIC_ACQUIRE)

    def store(self, address, value):
        """Store with release ordering."""
        self._store(address, value, ATOMIC_RELEASE)

    def compare_and_swap(self, address, expected, desired):
        """Replace `expected` by `desired` (sequentially consistent); True when it did."""
        current = ctypes.c_uint64(expected)
        return self._compare_exchange(address, ctypes.byref(current), desired, ATOMIC_SEQ_CST, ATOMIC_SEQ_CST)

    def fetch_or(self, address, bits):
        """Set `bits` (sequentially consistent); returns the previous value."""
        return self._fetch_or(address, bits, ATOMIC_SEQ_CST)


class PlainX86:
    """Fallback without libatomic, x86-64 only: aligned 8-byte loads and stores are atomic there, loads have
    acquire and stores release semantics. There is no read-modify-write: `compare_and_swap` and `fetch_or` (and so
    `ControlBlock.fetch_max`) are a load then a store, which protocol.md allows while our record is LIVE in our
    epoch: for the detach ("an aligned 8-byte store of the DETACHED word does the same while you are attached") and
    for our release counters ("a plain aligned store is right only while your record is LIVE", checked before
    each release and before the poison of the detach)."""

    def load(self, address):
        """Aligned 8-byte load."""
        return ctypes.c_uint64.from_address(address).value

    def store(self, address, value):
        """Aligned 8-byte store."""
        ctypes.c_uint64.from_address(address).value = value

    def compare_and_swap(self, address, expected, desired):
        """Not atomic: store `desired` if the word holds `expected`."""
        if self.load(address) != expected:
            return False
        self.store(address, desired)
        return True

    def fetch_or(self, address, bits):
        """Not atomic: load, then store the value with `bits` set."""
        previous = self.load(address)
        self.store(address, previous | bits)
        return previous


def make_atomics():
    """libatomic when it can be loaded, else the x86-64 fallback; anything else is an error."""
    for name in ("libatomic.so.1", "libatomic.so"):
        try:
            return LibAtomic(ctypes.CDLL(name))
        except OSError:
            continue
    if platform.machine() in ("x86_64", "AMD64"):
        print("consumer: libatomic not found; using plain aligned 8-byte loads and stores (x86-64)", file=sys.stderr)
        return PlainX86()
    raise ProtocolError("libatomic is needed for atomic operations on this architecture and could not be loaded")


# ---------------------------------------------------------------------------------------------------------------
# Messages on the socket (protocol.md, "Transport", "Header", "Validation")
# ---------------------------------------------------------------------------------------------------------------


def encode_message(msg_type, payload):
    """Header + payload of a message that carries no fds."""
    return HEADER.pack(WIRE_MAGIC, PROTOCOL_VERSION, msg_type, len(payload), 0, 0) + payload


def send_message(sock, msg_type, payload):
    """Send one message; MSG_NOSIGNAL so a peer that hung up gives an error instead of SIGPIPE."""
    data = encode_message(msg_type, payload)
    while data:
        sent = sock.send(data, socket.MSG_NOSIGNAL)
        data = data[sent:]


def fds_from_ancillary(ancdata):
    """The fds of every SCM_RIGHTS control message in `ancdata`."""
    fds = []
    int_size = struct.calcsize("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            whole = len(data) - len(data) % int_size
            fds.extend(struct.unpack(f"{whole // int_size}i", data[:whole]))
    return fds


def close_fds(fds):
    """Close every fd in the list, ignoring errors."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


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
            data, ancdata, flags, _ = sock.recvmsg(remaining, socket.CMSG_SPACE(MAX_FDS * struct.calcsize("i")),
                                                   socket.MSG_CMSG_CLOEXEC)
        except socket.timeout:
            raise ProtocolError("timed out waiting for the producer's answer") from None
        except ConnectionResetError:
            raise ProducerGone("the producer reset the connection") from None
        fds.extend(fds_from_ancillary(ancdata))
        if flags & socket.MSG_CTRUNC:
            raise ProtocolError("more than 2 fds arrived with a message (FdsTruncated)")
        if not data:
            raise ProducerGone("the producer hung up before its answer was complete")
        chunks.append(data)
        remaining -= len(data)
    return b"".join(chunks)


def recv_message(sock, deadline):
    """Read one message: returns (type, payload, fds). The caller owns the fds, also on error (closed here)."""
    fds = []
    try:
        header = recv_exactly(sock, HEADER.size, deadline, fds)
        magic, version, msg_type, payload_len, fd_count, reserved = HEADER.unpack(header)
        if magic != WIRE_MAGIC:
            raise ProtocolError("bad magic in the producer's message (BadMagic)")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"the producer speaks protocol version {version}, not 1 (UnsupportedVersion)")
        if reserved != 0:
            raise ProtocolError("header reserved field is not 0 (ReservedNotZero)")
        if msg_type not in KNOWN_MESSAGE_TYPES:
            raise ProtocolError(f"unknown message type {msg_type} (UnknownMessageType)")
        if payload_len > MAX_PAYLOAD:
            raise ProtocolError(f"payload of {payload_len} bytes is over 65536 (PayloadTooLarge)")
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


def encode_client_hello(name):
    """ClientHello payload: version 1, wanting host-fake, our pid, our name."""
    name_bytes = name.encode("utf-8")
    if len(name_bytes) > MAX_NAME_BYTES:
        raise ProtocolError(f"consumer name is {len(name_bytes)} bytes; at most {MAX_NAME_BYTES}")
    return struct.pack("<HHIHH", PROTOCOL_VERSION, BACKEND_HOST_FAKE, os.getpid(), len(name_bytes), 0) + name_bytes


def decode_refused(payload):
    """(code, message) of a Refused payload, checked as the docs require."""
    if len(payload) < 8:
        raise ProtocolError("Refused payload shorter than 8 bytes (Truncated)")
    code, reserved, message_len = struct.unpack_from("<HHI", payload)
    if code not in REFUSAL_NAMES:
        raise ProtocolError(f"unknown refusal code {code} (UnknownCode)")
    if message_len > MAX_REFUSAL_MESSAGE_BYTES:
        raise ProtocolError(f"refusal message of {message_len} bytes is over 1024 (InvalidField)")
    if len(payload) != 8 + message_len:
        raise ProtocolError("Refused payload length does not match message_len (Truncated/TrailingBytes)")
    if reserved != 0:
        raise ProtocolError("Refused reserved field is not 0 (ReservedNotZero)")
    try:
        message = payload[8:].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("refusal message is not UTF-8 (InvalidUtf8)") from None
    return code, message


@dataclasses.dataclass
class Offer:
    """The fields of a RingOffer this consumer uses."""

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


def is_power_of_two(value):
    """True for 1, 2, 4, ..."""
    return value > 0 and value & (value - 1) == 0


def decode_offer(payload):
    """Parse a RingOffer payload and check every rule of its table (protocol.md, "RingOffer (type 2)")."""
    if len(payload) < OFFER.size:
        raise ProtocolError(f"RingOffer payload of {len(payload)} bytes is shorter than 168 (Truncated)")
    (backend, handle_type, sync, pixel_format, _device_uuid, _producer_pid, consumer_id, generation, width, height,
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
    return Offer(backend, handle_type, sync, pixel_format, consumer_id, generation, width, height, pitch_bytes,
                 slot_count, slot_stride_bytes, data_offset, allocation_bytes, granularity, control_bytes,
                 event_count)


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


class ControlBlock:
    """The producer's control block, mapped MAP_SHARED read-write, with atomic access to its u64 fields."""

    def __init__(self, fd, atomics):
        self.map = mmap.mmap(fd, CONTROL_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # A ctypes view of the first byte gives the mapping's address; it must go before the map is closed.
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(self._anchor)
        self.atomics = atomics

    def load(self, offset):
        """Acquire load of the u64 at `offset`."""
        return self.atomics.load(self.base + offset)

    def store(self, offset, value):
        """Release store of the u64 at `offset`."""
        self.atomics.store(self.base + offset, value)

    def compare_and_swap(self, offset, expected, desired):
        """Compare-and-swap of the u64 at `offset`; True when it swapped."""
        return self.atomics.compare_and_swap(self.base + offset, expected, desired)

    def fetch_or(self, offset, bits):
        """Set `bits` in the u64 at `offset`."""
        return self.atomics.fetch_or(self.base + offset, bits)

    def fetch_max(self, offset, value):
        """Raise the u64 at `offset` to at least `value` (ring.md, invariant 2: host writers use fetch_max, so a
        POISON the producer wrote stays)."""
        while True:
            current = self.load(offset)
            if current >= value or self.compare_and_swap(offset, current, value):
                return

    def close(self):
        """Unmap."""
        del self._anchor
        self.map.close()


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
    if not offer.consumer_id < max_consumers <= 16:
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


# ---------------------------------------------------------------------------------------------------------------
# Attaching (protocol.md, "Attaching, step by step")
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Session:
    """Everything an attached consumer holds."""

    sock: socket.socket
    producer_pid: int  # from SO_PEERCRED: the producer's pid in our PID namespace, 0 if it cannot be seen
    offer: Offer
    control: ControlBlock
    data: mmap.mmap
    epoch: int
    join_sequence: int

    def live_word(self):
        """Our record's state word while we are attached."""
        return self.epoch << 8 | STATE_LIVE


def peer_pid_checked(sock):
    """Step 1: the producer must run as our effective uid; returns its pid as SO_PEERCRED gives it (may be 0)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.geteuid():
        raise ProtocolError(f"the socket's owner runs as uid {uid}, not ours ({os.geteuid()}); hanging up")
    return pid


def send_detach(sock, consumer_id, reason):
    """Send Detach; it is advisory, so a peer that already hung up is not an error."""
    try:
        send_message(sock, MSG_DETACH, struct.pack("<IHH", consumer_id, reason, 0))
    except OSError:
        pass


def receive_offer(sock, deadline):
    """Step 3: one message, RingOffer with its fds or Refused. Returns (offer, fds)."""
    msg_type, payload, fds = recv_message(sock, deadline)
    try:
        if msg_type == MSG_REFUSED:
            code, message = decode_refused(payload)
            raise RefusedByProducer(f"refused: code {code} ({REFUSAL_NAMES[code]}): {message}")
        if msg_type != MSG_RING_OFFER:
            raise ProtocolError(f"expected RingOffer or Refused, got message type {msg_type}")
        offer = decode_offer(payload)
        if len(fds) != expected_fd_count(offer):
            raise ProtocolError(f"RingOffer came with {len(fds)} fds, not {expected_fd_count(offer)} "
                                "(FdCountMismatch)")
        check_memfd(fds[0], offer.control_bytes, "control block")
        if offer.handle_type == HANDLE_TYPE_HOST_MEMFD:
            check_memfd(fds[1], offer.allocation_bytes, "frame allocation")
        return offer, fds
    except BaseException:
        close_fds(fds)
        raise


def import_offer(offer, fds, atomics):
    """Steps 4 to 6 for host-fake: map and check the control block, read our record, map the frame memfd."""
    if offer.backend != BACKEND_HOST_FAKE:
        raise ProtocolError(f"we asked for host-fake (3) and were offered backend {offer.backend}")
    if offer.sync not in SUPPORTED_SYNC:
        raise UnsupportedStrategy(f"the producer uses sync strategy {SYNC_NAMES[offer.sync]}; this consumer "
                                  "supports only cpu-spin and cpu-sleep")
    control = ControlBlock(fds[0], atomics)
    try:
        check_control_header(control, offer)
        epoch, join_sequence = read_own_record(control, offer.consumer_id)
        data = mmap.mmap(fds[1], offer.allocation_bytes, mmap.MAP_SHARED, mmap.PROT_READ)
    except BaseException:
        control.close()
        raise
    return control, data, epoch, join_sequence


def attach(socket_path, name, timeout_s, atomics):
    """Connect, hello, offer, import, Attached: the whole handshake, bounded by `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(socket_path)
        except OSError as err:
            raise ProtocolError(f"cannot connect to {socket_path}: {err.strerror}") from None
        producer_pid = peer_pid_checked(sock)
        try:
            send_message(sock, MSG_CLIENT_HELLO, encode_client_hello(name))
        except OSError:
            pass  # the producer may have refused us before reading: its Refused is waiting to be read
        offer, fds = receive_offer(sock, deadline)
        try:
            control, data, epoch, join_sequence = import_offer(offer, fds, atomics)
        except (ConsumerError, OSError):
            send_detach(sock, offer.consumer_id, DETACH_IMPORT_FAILED)  # step 7
            raise
        finally:
            close_fds(fds)  # the mappings keep the memory; the fds are no longer needed
        if connection_hung_up(sock):
            # Step 5: the producer dropped this handshake before we read our record, which may already be a
            # newcomer's: leave it alone (no detach) and let the caller attach again.
            raise ProtocolError("the producer dropped this handshake before we joined (too slow?); attach again")
        send_message(sock, MSG_ATTACHED, struct.pack("<II", offer.consumer_id, 0))  # step 8
        sock.setblocking(True)
        return Session(sock, producer_pid, offer, control, data, epoch, join_sequence)
    except BaseException:
        sock.close()
        raise


# ---------------------------------------------------------------------------------------------------------------
# Frames (protocol.md, "Frames, per sync strategy"; "Producer shutdown")
# ---------------------------------------------------------------------------------------------------------------


def connection_hung_up(sock):
    """True when the producer's side of the connection is closed (POLLRDHUP, POLLHUP or POLLERR)."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)
    return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


def process_gone(pid):
    """True when `pid` (non-zero) no longer exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def producer_gone_reason(session):
    """Why the producer is gone, or None while it is there: ring CLOSED, connection hung up, or process exited."""
    if session.control.load(OFF_PRODUCER_STATE) == PRODUCER_CLOSED:
        return "the producer closed the ring"
    if connection_hung_up(session.sock):
        return "the producer hung up"
    if session.producer_pid != 0 and process_gone(session.producer_pid):
        return f"the producer's process {session.producer_pid} is gone"
    return None


def check_still_live(session):
    """Our record must still be LIVE in our epoch (protocol.md, "Check your record", before waiting for each frame
    and before each release); otherwise the producer evicted us or declared us dead: we stop, and write our
    counters no more (ring-level detach included)."""
    word = session.control.load(consumer_state_offset(session.offer.consumer_id))
    if word != session.live_word():
        raise Evicted(f"record {session.offer.consumer_id} is no longer LIVE in epoch {session.epoch} "
                      f"(state word {word:#x}): the producer evicted us or declared us dead")


READY = "ready"
READY_PAST_POISON = "ready, published before a clean close, its counter poisoned since"
WAITING = "waiting"


def published_before_close(session, seq):
    """True when the producer closed the ring cleanly after publishing frame `seq`: `producer_state` is CLOSED and
    `seq < next_sequence`. Nothing writes the slots after a clean close, so such a frame is still readable."""
    if session.control.load(OFF_PRODUCER_STATE) != PRODUCER_CLOSED:
        return False
    # Loaded after the state: the producer stored next_sequence before CLOSED (Release), so this is its last value.
    return seq < session.control.load(OFF_NEXT_SEQUENCE)


def frame_state(session, slot, seq):
    """READY (or READY_PAST_POISON) when frame `seq` (in `slot`) is readable, WAITING when not yet; raises when it
    never will be. The cases of protocol.md, "When frame s is readable", in its order."""
    value = session.control.load(published_offset(slot))
    if value == seq + 1:
        return READY
    if value & POISON:
        # Another consumer's poison at the producer's hang-up must not hide a frame published before a clean close.
        if published_before_close(session, seq):
            return READY_PAST_POISON
        raise ProducerGone(f"the publish counter of slot {slot} is poisoned ({value:#x}): the producer is gone")
    if value > seq + 1:
        check_still_live(session)  # an overrun cannot happen to a LIVE consumer: first see whether we still are
        raise ProtocolError(f"overrun: slot {slot} already holds frame {value - 1}, we wait for {seq}")
    return WAITING


def wait_readable(session, seq, timeout_s):
    """Wait until frame `seq` is readable, checking the producer and our record about every millisecond; bounded
    by `timeout_s`. Returns the frame's state (READY or READY_PAST_POISON)."""
    slot = seq % session.offer.slot_count
    sleeping = session.offer.sync == SYNC_CPU_SLEEP
    deadline = time.monotonic() + timeout_s
    next_check = time.monotonic() + CHECK_INTERVAL_S
    while True:
        state = frame_state(session, slot, seq)
        if state != WAITING:
            return state
        now = time.monotonic()
        if now >= next_check:
            gone = producer_gone_reason(session)
            if gone is not None:
                # Frames the producer published before it left are still delivered: look once more. (A clean
                # close stores CLOSED before it hangs up, so this look sees CLOSED whatever told us it left.)
                state = frame_state(session, slot, seq)
                if state != WAITING:
                    return state
                raise ProducerGone(f"{gone} while we waited for frame {seq}")
            check_still_live(session)
            if now >= deadline:
                raise ProtocolError(f"timed out after {timeout_s} s waiting for frame {seq}")
            next_check = now + CHECK_INTERVAL_S
            if not sleeping:
                os.sched_yield()  # spin, but let an oversubscribed machine progress
        if sleeping:
            time.sleep(SLEEP_INTERVAL_S)


def count_mismatched_words(session, seq):
    """How many 8-byte words of frame `seq` differ from `seq` (little-endian u64)."""
    offer = session.offer
    start = offer.data_offset + (seq % offer.slot_count) * offer.slot_stride_bytes
    word_count = offer.pitch_bytes * offer.height // 8
    words = struct.unpack_from(f"<{word_count}Q", session.data, start)
    return sum(1 for word in words if word != seq)


def release(session, seq):
    """We are done reading frame `seq`: raise `released[c][slot]` to `seq + 1` (fetch_max, release ordering; never
    lowered, so a POISON the producer stored there stays)."""
    slot = seq % session.offer.slot_count
    session.control.fetch_max(released_offset(session.offer.consumer_id, slot), seq + 1)


def read_frame(session, seq, hold, timeout_s, read_delay_s):
    """Frame `seq` with a CPU strategy (protocol.md, "Frames, per sync strategy"): check our record, wait until
    the frame is readable, read it, check our record again, then release it, unless `hold`. Returns how many of
    its words are wrong, and whether its publish counter was poisoned (READY_PAST_POISON). The second check is
    the one before the release (a held frame gets it too): it also tells us the slot was still ours while we read
    it, since the producer rewrites a slot we hold only after it evicted us."""
    check_still_live(session)
    state = wait_readable(session, seq, timeout_s)
    mismatched = count_mismatched_words(session, seq)
    if read_delay_s > 0:
        time.sleep(read_delay_s)
    check_still_live(session)
    if not hold:
        release(session, seq)
    return mismatched, state == READY_PAST_POISON


def poison_published(session):
    """The producer is gone: poison every publish counter (fetch_or 2^62) so other consumers' waits end too."""
    for slot in range(session.offer.slot_count):
        session.control.fetch_or(published_offset(slot), POISON)


# ---------------------------------------------------------------------------------------------------------------
# Leaving (protocol.md, "Leaving (consumer)")
# ---------------------------------------------------------------------------------------------------------------


def leave(session):
    """Poison our release counters while LIVE, CAS LIVE -> DETACHED, send Detach(1), close. True when the
    ring-level detach succeeded (False: the producer had already declared us dead or evicted us, and we wrote
    nothing into the record)."""
    consumer_id = session.offer.consumer_id
    # Step 1: every frame we read is released already, or abandoned (held); CPU reads are finished.
    detached = False
    if session.control.load(consumer_state_offset(consumer_id)) == session.live_word():
        # Step 2: POISON into released[c][0 .. N] while the record is still LIVE.
        for slot in range(session.offer.slot_count):
            session.control.fetch_max(released_offset(consumer_id, slot), POISON)
        # Step 3: the ring-level detach.
        detached = session.control.compare_and_swap(consumer_state_offset(consumer_id), session.live_word(),
                                                    session.epoch << 8 | STATE_DETACHED)
    # Step 4: Detach (advisory). Step 5: close.
    send_detach(session.sock, consumer_id, DETACH_CONSUMER_DONE)
    session.sock.close()
    return detached


def release_mappings(session):
    """Unmap the frame memory and the control block."""
    session.data.close()
    session.control.close()


# ---------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Progress:
    """What the consumer has done so far; the summary reports it however the run ends."""

    frames: int = 0  # read, verified and counted
    held: int = 0  # of those, frames not released (--stall-after)
    read_past_poison: int = 0  # of those, frames whose publish counter was poisoned (published before a clean close)
    mismatched_words: int = 0


def read_frames(session, args, progress):
    """Read frames from the join sequence on: `args.frames` of them, or, with 0, until the producer is gone (its
    ProducerGone ends the loop). Frames after the first `args.stall_after` are held, not released."""
    seq = session.join_sequence
    while args.frames == 0 or progress.frames < args.frames:
        hold = args.stall_after is not None and progress.frames >= args.stall_after
        mismatched, past_poison = read_frame(session, seq, hold, args.timeout, args.read_delay)
        progress.frames += 1
        progress.held += int(hold)
        progress.read_past_poison += int(past_poison)
        progress.mismatched_words += mismatched
        seq += 1


def read_and_leave(session, args, progress):
    """Read, then leave; on the way out, do what each reason to stop requires."""
    try:
        read_frames(session, args, progress)
    except ProducerGone:
        poison_published(session)
        session.sock.close()
        raise
    except Evicted:
        session.sock.close()  # no counter written; the producer keeps our record until it sees the hang-up
        raise
    except ConsumerError:
        leave(session)  # a timeout or an overrun: the producer is there, so leave it cleanly
        raise
    if not leave(session):
        raise Evicted(f"ring-level detach failed: record {session.offer.consumer_id} was no longer LIVE "
                      "(the producer had declared us dead or evicted us)")


def print_summary(session, progress):
    """The JSON line on stdout."""
    summary = {
        "frames": progress.frames,
        "held": progress.held,
        "read_past_poison": progress.read_past_poison,
        "first_seq": session.join_sequence,
        "mismatched_words": progress.mismatched_words,
        "consumer_id": session.offer.consumer_id,
    }
    print(json.dumps(summary), flush=True)


def run(args):
    """Attach, read, leave; returns the exit code. The summary is printed for exit 0, 4 and 5."""
    atomics = make_atomics()
    session = attach(args.socket, args.name, args.timeout, atomics)
    progress = Progress()
    try:
        read_and_leave(session, args, progress)
    except (ProducerGone, Evicted):
        print_summary(session, progress)
        raise
    finally:
        release_mappings(session)
    print_summary(session, progress)
    return 0


def non_negative_int(text):
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def non_negative_float(text):
    """argparse type: a number >= 0."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number >= 0")
    return value


def parse_args(argv):
    """Command line."""
    parser = argparse.ArgumentParser(description="gpu-ipc consumer for the host-fake backend, in pure Python")
    parser.add_argument("--socket", required=True, help="the producer's rendezvous socket path")
    parser.add_argument("--frames", type=non_negative_int, default=100,
                        help="how many frames to read; 0: until the producer is gone (default 100)")
    parser.add_argument("--name", default="python-consumer", help="consumer name sent in the hello (<= 64 bytes)")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds allowed for the attach, and for each frame to arrive (default 10)")
    parser.add_argument("--read-delay", type=non_negative_float, default=0.0,
                        help="seconds to sleep after reading each frame, before releasing it (default 0)")
    parser.add_argument("--stall-after", type=non_negative_int, default=None,
                        help="release only the first N frames; hold every later one (wait for eviction)")
    return parser.parse_args(argv)


def main(argv=None):
    """Entry point: runs the consumer and turns its errors into a message and an exit code."""
    args = parse_args(argv)
    try:
        return run(args)
    except ConsumerError as err:
        print(f"consumer: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except OSError as err:
        print(f"consumer: {err}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
