"""What the pure-Python consumer (consumer.py) and producer (producer.py) share, written from docs/protocol.md and
docs/ring.md only (Python 3.11 standard library): the protocol's constants and message framing, the control
block's layout, atomic 8-byte operations on shared memory, and fd passing over the Unix socket.

The scripts import it as `gpuipc_wire`: they are run as `python3 path/to/script.py`, which puts this directory on
`sys.path`.

Atomics. The control block is shared memory that the other side updates concurrently, so its u64 fields are read
and written with atomic 8-byte operations. Python has none of its own, so this module calls libatomic (the GCC
runtime library, present wherever a C compiler is installed) through `ctypes`: `__atomic_load_8` (acquire unless
told), `__atomic_store_8` (release unless told), `__atomic_compare_exchange_8` and `__atomic_fetch_or_8`
(sequentially consistent), on addresses inside the mapping. Without libatomic, on x86-64 only, it falls back to
plain aligned 8-byte loads and stores through `ctypes.c_uint64`, which on x86-64 are atomic with acquire/release
ordering; there a read-modify-write is a load and a store (see `PlainX86` for when the docs allow that).
"""

import ctypes
import mmap
import os
import platform
import socket
import struct

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
SYNC_GPU_STREAM_OPS = 4
SYNC_GPU_POLL = 5
SYNC_NAMES = {1: "cpu-spin", 2: "cpu-sleep", 3: "ipc-event", 4: "gpu-stream-ops", 5: "gpu-poll"}

PIXEL_RGBA8 = 2
BYTES_PER_PIXEL = {1: 3, 2: 4, 3: 4, 4: 1, 5: 2, 6: 8, 7: 16}  # pixel format code -> bytes per pixel

REFUSE_VERSION = 1
REFUSE_BACKEND = 2
REFUSE_RING_FULL = 3
REFUSE_PEER = 4
REFUSE_SHUTTING_DOWN = 5
REFUSE_MALFORMED = 6
REFUSAL_NAMES = {
    REFUSE_VERSION: "unsupported protocol version",
    REFUSE_BACKEND: "backend mismatch",
    REFUSE_RING_FULL: "ring full",
    REFUSE_PEER: "peer not allowed",
    REFUSE_SHUTTING_DOWN: "producer shutting down",
    REFUSE_MALFORMED: "malformed hello",
}

DETACH_CONSUMER_DONE = 1
DETACH_IMPORT_FAILED = 3

MAX_NAME_BYTES = 64
MAX_REFUSAL_MESSAGE_BYTES = 1024

# Payloads (protocol.md, "Payloads").
HELLO = struct.Struct("<HHIHH")  # ClientHello: protocol_version, wanted_backend, client_pid, name_len, reserved
OFFER = struct.Struct("<HHHH16sIIQIIIIQQQQQII64s")  # RingOffer's fixed part, without event handles: 168 bytes
EVENT_HANDLE_BYTES = 64
ATTACHED_PAYLOAD = struct.Struct("<II")  # consumer_id, reserved
DETACH_PAYLOAD = struct.Struct("<IHH")  # consumer_id, reason, reserved
REFUSED = struct.Struct("<HHI")  # code, reserved, message_len; the message follows

# ---------------------------------------------------------------------------------------------------------------
# Control block constants (docs/ring.md, "Layout (version 1)")
# ---------------------------------------------------------------------------------------------------------------

CONTROL_BYTES = 131072
RING_MAGIC = 0x474E495243504947  # the bytes "GIPCRING" read as a little-endian u64
LAYOUT_VERSION = 1
MAX_SLOTS = 32
MAX_RECORDS = 16

OFF_MAGIC = 0
OFF_LAYOUT_VERSION = 8
OFF_TOTAL_BYTES = 16
OFF_SLOT_COUNT = 24
OFF_MAX_CONSUMERS = 32
OFF_GENERATION = 40
OFF_PRODUCER_PID = 48
OFF_PRODUCER_STATE = 56
OFF_PRODUCER_HEARTBEAT = 128
OFF_NEXT_SEQUENCE = 256

PRODUCER_RUNNING = 1
PRODUCER_CLOSED = 2

STATE_FREE, STATE_JOINING, STATE_LIVE, STATE_DETACHED, STATE_DEAD = 0, 1, 2, 3, 4

POISON = 1 << 62

CHECK_INTERVAL_S = 0.001  # how often a wait checks liveness (ring.md, "Bounded CPU waits", "Detach and dead peers")


def published_offset(slot):
    """Offset of `published[slot]`: 384 + 128 slot."""
    return 384 + 128 * slot


def consumer_state_offset(consumer):
    """Offset of record `consumer`, whose first field is `consumers[consumer].state` (`epoch << 8 | state`):
    4480 + 4352 consumer."""
    return 4480 + 4352 * consumer


def pid_offset(consumer):
    """Offset of `consumers[consumer].pid`: record + 8."""
    return consumer_state_offset(consumer) + 8


def join_sequence_offset(consumer):
    """Offset of `consumers[consumer].join_sequence`: record + 16."""
    return consumer_state_offset(consumer) + 16


def consumer_heartbeat_offset(consumer):
    """Offset of `consumers[consumer].heartbeat_ns`: record + 128."""
    return consumer_state_offset(consumer) + 128


def released_offset(consumer, slot):
    """Offset of `consumers[consumer].released[slot]`: record + 256 + 128 slot."""
    return consumer_state_offset(consumer) + 256 + 128 * slot


def state_word(epoch, state):
    """A record's state word."""
    return (epoch << 8) | state


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

    def load(self, address, order=ATOMIC_ACQUIRE):
        """Load (acquire unless told)."""
        return self._load(address, order)

    def store(self, address, value, order=ATOMIC_RELEASE):
        """Store (release unless told)."""
        self._store(address, value, order)

    def compare_and_swap(self, address, expected, desired):
        """Replace `expected` by `desired` (sequentially consistent); returns (swapped, value seen)."""
        current = ctypes.c_uint64(expected)
        swapped = self._compare_exchange(address, ctypes.byref(current), desired, ATOMIC_SEQ_CST, ATOMIC_SEQ_CST)
        return swapped, current.value

    def fetch_or(self, address, bits):
        """Set `bits` (sequentially consistent); returns the previous value."""
        return self._fetch_or(address, bits, ATOMIC_SEQ_CST)


class PlainX86:
    """Fallback without libatomic, x86-64 only: aligned 8-byte loads and stores are atomic there, loads have
    acquire and stores release semantics. There is no read-modify-write: `compare_and_swap` and `fetch_or` (and so
    `ControlMapping.fetch_max`) are a load then a store.

    For a consumer, protocol.md allows that while its record is LIVE in its epoch: for the detach ("an aligned
    8-byte store of the DETACHED word does the same while you are attached") and for its release counters ("a
    plain aligned store is right only while your record is LIVE", checked before each release and before the
    poison of the detach). For a producer it is right for the fields only the producer writes; for a consumer's
    state word it races with the consumer's own detach, which is why libatomic is preferred."""

    def load(self, address, order=ATOMIC_ACQUIRE):
        """Aligned 8-byte load."""
        del order
        return ctypes.c_uint64.from_address(address).value

    def store(self, address, value, order=ATOMIC_RELEASE):
        """Aligned 8-byte store."""
        del order
        ctypes.c_uint64.from_address(address).value = value

    def compare_and_swap(self, address, expected, desired):
        """Not atomic: store `desired` if the word holds `expected`; returns (swapped, value seen)."""
        seen = self.load(address)
        if seen != expected:
            return False, seen
        self.store(address, desired)
        return True, seen

    def fetch_or(self, address, bits):
        """Not atomic: load, then store the value with `bits` set."""
        previous = self.load(address)
        self.store(address, previous | bits)
        return previous


def make_atomics(warn, error):
    """libatomic when it can be loaded, else the x86-64 fallback (telling `warn`, a function of one text); on any
    other architecture raises `error` (an exception class)."""
    for name in ("libatomic.so.1", "libatomic.so"):
        try:
            return LibAtomic(ctypes.CDLL(name))
        except OSError:
            continue
    if platform.machine() in ("x86_64", "AMD64"):
        warn("libatomic not found; using plain aligned 8-byte loads and stores (x86-64)")
        return PlainX86()
    raise error("libatomic is needed for atomic operations on this architecture and could not be loaded")


class ControlMapping:
    """A control block's memfd mapped MAP_SHARED read-write, with atomic access to its u64 fields."""

    def __init__(self, fd, atomics):
        self.map = mmap.mmap(fd, CONTROL_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # A ctypes view of the first byte gives the mapping's address; it must go before the map is closed.
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(self._anchor)
        self.atomics = atomics

    def load(self, offset, order=ATOMIC_ACQUIRE):
        """Acquire (or `order`) load of the u64 at `offset`."""
        return self.atomics.load(self.base + offset, order)

    def store(self, offset, value, order=ATOMIC_RELEASE):
        """Release (or `order`) store of the u64 at `offset`."""
        self.atomics.store(self.base + offset, value, order)

    def compare_and_swap(self, offset, expected, desired):
        """Sequentially consistent compare-and-swap of the u64 at `offset`; returns (swapped, value seen)."""
        return self.atomics.compare_and_swap(self.base + offset, expected, desired)

    def fetch_or(self, offset, bits):
        """Set `bits` in the u64 at `offset`; returns the previous value."""
        return self.atomics.fetch_or(self.base + offset, bits)

    def fetch_max(self, offset, value):
        """Raise the u64 at `offset` to at least `value`, never lower it (ring.md, invariant 2: host writers use
        fetch_max, so a POISON already there stays)."""
        current = self.load(offset)
        while current < value:
            swapped, current = self.compare_and_swap(offset, current, value)
            if swapped:
                return

    def close(self):
        """Unmap."""
        del self._anchor
        self.map.close()


# ---------------------------------------------------------------------------------------------------------------
# Messages on the socket (protocol.md, "Transport", "Header", "Validation")
# ---------------------------------------------------------------------------------------------------------------


def encode_message(msg_type, payload, fd_count=0):
    """Header + payload of one message (the fds, if any, go with it as SCM_RIGHTS)."""
    return HEADER.pack(WIRE_MAGIC, PROTOCOL_VERSION, msg_type, len(payload), fd_count, 0) + payload


class BadHeader(Exception):
    """A header that breaks protocol.md "Validation": `error` names the check it failed (BadMagic,
    UnsupportedVersion, ReservedNotZero, UnknownMessageType, PayloadTooLarge), `value` is the field's value."""

    def __init__(self, error, value):
        super().__init__(error)
        self.error = error
        self.value = value


def decode_header(raw):
    """(type, payload_len, fd_count) of a 24-byte header, checked in protocol.md's order; `BadHeader` otherwise."""
    magic, version, msg_type, payload_len, fd_count, reserved = HEADER.unpack(raw)
    if magic != WIRE_MAGIC:
        raise BadHeader("BadMagic", magic)
    if version != PROTOCOL_VERSION:
        raise BadHeader("UnsupportedVersion", version)
    if reserved != 0:
        raise BadHeader("ReservedNotZero", reserved)
    if msg_type not in KNOWN_MESSAGE_TYPES:
        raise BadHeader("UnknownMessageType", msg_type)
    if payload_len > MAX_PAYLOAD:
        raise BadHeader("PayloadTooLarge", payload_len)
    return msg_type, payload_len, fd_count


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


def recv_with_fds(sock, count, flags=0):
    """One `recvmsg` of at most `count` bytes with room for MAX_FDS fds (received close-on-exec), `flags` added:
    returns (data, fds, truncated), `truncated` when the kernel cut off fds (MSG_CTRUNC). The caller owns the fds."""
    data, ancdata, msg_flags, _ = sock.recvmsg(
        count, socket.CMSG_SPACE(MAX_FDS * struct.calcsize("i")), socket.MSG_CMSG_CLOEXEC | flags
    )
    return data, fds_from_ancillary(ancdata), bool(msg_flags & socket.MSG_CTRUNC)


def peer_credentials(sock):
    """(pid, uid, gid) of the peer from SO_PEERCRED; the pid is 0 when it is not in our PID namespace."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


def process_gone(pid):
    """True when `pid` (non-zero) no longer exists (kill(pid, 0) fails with ESRCH)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
