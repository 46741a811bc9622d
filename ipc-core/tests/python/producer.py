#!/usr/bin/env python3
"""A gpu-ipc producer in pure Python (3.11 standard library), written from docs/protocol.md and docs/ring.md only.

It makes a ring of the host-memory "host-fake" backend (backend 3, handle type host-memfd, sync cpu-spin): a
sealed control-block memfd laid out as ring.md says and a sealed data memfd holding the slots; it listens on a
Unix socket, admits consumers with the version-1 handshake, publishes frames with back-pressure from every LIVE
consumer, notices consumers that hang up or detach, and shuts down as protocol.md "Producer shutdown" says. It is
the evidence that the producer side of the protocol can be implemented from its specification alone; the Rust
consumer (`ipc_core::frames::Consumer`) is attached to it by `ipc-core/tests/python_producer.rs`.

    python3 producer.py --socket /tmp/frames.sock --frames 300 --consumers 2
    python3 producer.py --socket /tmp/frames.sock --frames 50 --end close      # close right after publishing

Frame content: every 8-byte word of frame s is s as a little-endian u64 (bytes after the last whole word continue
the same pattern), in the `pitch_bytes * height` bytes of slot `s % slots`.

The producer is single-threaded: one loop `poll`s the listening socket and the connections, and publishing happens
on that same thread, so a record is always taken between two frames, right before its offer is sent (protocol.md
"Attaching, step by step", step 5, the note for a producer's implementer). While it waits for a slot to be
released it keeps serving the socket and checks the consumers about every millisecond (ring.md "Detach and dead
peers").

`--end` says what happens after the last frame: `close` shuts down at once (consumers still read every frame
published before the close), `released` waits until every LIVE consumer released the last frame, `gone` waits
until every attached consumer has hung up. Every wait is bounded by `--timeout` seconds.

Output on stdout: first `{"listening": "<path>", "generation": G, "pid": P}` once the socket accepts connections,
and at the end one line of JSON, e.g.
    {"ok": 1, "published": 300, "attached": 2, "left": 2, "lost": 0, "refused": 0, "dropped": 0}
`attached` counts handshakes completed, `left` consumers that hung up after a ring-level detach (record DETACHED),
`lost` consumers that hung up (or whose process vanished) while LIVE, `refused` connections answered with
`Refused`, `dropped` handshakes closed without a message after a record was taken (their record given back).
Messages go to stderr. Exit 0 when every frame was published and the end condition was met, 1 otherwise (the
summary then has "ok": 0 and an "error" text).

Atomics: the control block is shared memory, so its u64 fields are read and written with atomic 8-byte operations
through libatomic and `ctypes` (acquire loads, release stores, sequentially consistent compare-and-swap), with a
plain aligned-access fallback on x86-64 only (gpuipc_wire.py, which tests/python/consumer.py shares).
"""

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

HANDSHAKE_TIMEOUT_S = 10.0  # protocol.md "Deadline": ProducerConfig::handshake_timeout, default 10 s
RING_FULL_RETRY_S = 1.0  # protocol.md refusal code 3: look again for up to 1 s while records wait to be freed
MAX_PENDING_HANDSHAKES = 64  # protocol.md step 2: ProducerConfig::max_pending_handshakes
DRAIN_AFTER_REFUSAL = 65536  # protocol.md "Failures": read and drop up to 64 KiB without waiting


class ProducerError(Exception):
    """A failure that ends the producer (a bounded wait that ran out, a socket path in use, ...)."""


def log(text):
    """A message for the user, on stderr."""
    print(f"producer: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Shared memory: the control block and the frame allocation (ring.md "Shared memory"; protocol.md fd table)
# ---------------------------------------------------------------------------------------------------------------


def sealed_memfd(name, size):
    """A memfd of exactly `size` bytes, sealed against shrinking and growing (ring.md "Shared memory")."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    except OSError:
        os.close(fd)
        raise
    return fd


class ControlBlock(ControlMapping):
    """The ring's control block: a sealed memfd of 131,072 bytes mapped MAP_SHARED read-write."""

    def __init__(self, atomics, slots, max_consumers, generation):
        self.fd = sealed_memfd("gpu-ipc-control", CONTROL_BYTES)
        super().__init__(self.fd, atomics)
        self.slots = slots
        self.max_consumers = max_consumers
        self.write_header(generation)

    def write_header(self, generation):
        """The header of ring.md "Layout": every field, RUNNING, and the magic last (Release)."""
        self.store(OFF_LAYOUT_VERSION, LAYOUT_VERSION)
        self.store(OFF_TOTAL_BYTES, CONTROL_BYTES)
        self.store(OFF_SLOT_COUNT, self.slots)
        self.store(OFF_MAX_CONSUMERS, self.max_consumers)
        self.store(OFF_GENERATION, generation)
        self.store(OFF_PRODUCER_PID, os.getpid())
        self.store(OFF_PRODUCER_STATE, PRODUCER_RUNNING)
        self.store(OFF_MAGIC, RING_MAGIC)

    def heartbeat(self):
        """`producer_heartbeat_ns`: CLOCK_MONOTONIC now."""
        self.store(OFF_PRODUCER_HEARTBEAT, time.clock_gettime_ns(time.CLOCK_MONOTONIC))

    def record_state(self, consumer):
        """(epoch, state) of record `consumer`."""
        word = self.load(consumer_state_offset(consumer))
        return word >> 8, word & 0xFF

    def poison_released(self, consumer):
        """POISON into every used `released` counter of record `consumer`."""
        for slot in range(self.slots):
            self.fetch_max(released_offset(consumer, slot), POISON)

    def close(self):
        """Unmaps the block and closes the fd."""
        super().close()
        os.close(self.fd)


class FrameMemory:
    """The host-fake frame allocation: a sealed memfd holding the slots (protocol.md "RingOffer")."""

    def __init__(self, width, height, slots):
        self.width, self.height, self.slots = width, height, slots
        self.pitch = width * BYTES_PER_PIXEL[PIXEL_RGBA8]
        self.frame_bytes = self.pitch * height
        self.stride = (self.frame_bytes + 255) // 256 * 256  # like the reference producer: rounded up to 256
        self.data_offset = 0
        self.allocation_bytes = self.data_offset + slots * self.stride
        self.granularity = largest_power_of_two_dividing(self.allocation_bytes, 2 << 20)
        self.fd = sealed_memfd("gpu-ipc-frames", self.allocation_bytes)
        self.map = mmap.mmap(self.fd, self.allocation_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def write_frame(self, seq):
        """Frame `seq`'s content into its slot: `seq` as a little-endian u64 in every 8 bytes."""
        word = seq.to_bytes(8, "little")
        content = (word * (self.frame_bytes // 8 + 1))[: self.frame_bytes]
        start = self.data_offset + (seq % self.slots) * self.stride
        self.map[start : start + self.frame_bytes] = content

    def close(self):
        """Unmaps the allocation and closes the fd."""
        self.map.close()
        os.close(self.fd)


from producer_handshake import (  # noqa: E402  (next to this file)
    ATTACHED, ATTACHED_WAIT, check_header, check_hello, Connection, drain_and_close, encode_offer, encode_refused,
    HEADER_REFUSALS, HELLO_WAIT, largest_power_of_two_dividing, Malformed, OFFER_WAIT,
)


@dataclasses.dataclass
class Counts:
    """What the summary reports."""

    published: int = 0
    attached: int = 0
    left: int = 0
    lost: int = 0
    refused: int = 0
    dropped: int = 0


class RingProducer:
    """The ring, its listening socket and its connections; every method runs on the one (publishing) thread."""

    def __init__(self, args):
        self.args = args
        self.generation = int.from_bytes(os.urandom(8), "little") | 1  # nonzero, differs per ring
        self.control = ControlBlock(make_atomics(log, ProducerError), args.slots, args.max_consumers, self.generation)
        self.frames = FrameMemory(args.width, args.height, args.slots)
        self.path = args.socket
        self.listener, self.socket_id = listen(args.socket)
        self.connections = []
        self.counts = Counts()
        self.next_check = 0.0

    # -- records (ring.md "Late join", "Detach and dead peers") ----------------------------------------------

    def take_record(self, pid):
        """`register_consumer`: claims the lowest FREE record (FREE -> JOINING, new epoch), resets it, sets its
        join sequence to `next_sequence` and stores LIVE. Returns (index, epoch), or None when none is FREE."""
        control = self.control
        for index in range(control.max_consumers):
            epoch, state = control.record_state(index)
            if state != STATE_FREE:
                continue
            new_epoch = epoch + 1
            swapped, _ = control.compare_and_swap(
                consumer_state_offset(index), state_word(epoch, STATE_FREE), state_word(new_epoch, STATE_JOINING)
            )
            if not swapped:
                continue
            control.store(pid_offset(index), pid)
            control.store(consumer_heartbeat_offset(index), 0)
            for slot in range(MAX_SLOTS):
                control.store(released_offset(index, slot), 0)
            join = control.load(OFF_NEXT_SEQUENCE, ATOMIC_SEQ_CST)
            control.store(join_sequence_offset(index), join)
            control.store(consumer_state_offset(index), state_word(new_epoch, STATE_LIVE))
            return index, new_epoch
        return None

    def mark_dead(self, index, epoch):
        """`mark_consumer_dead`: LIVE -> DEAD in `epoch`, then POISON into its `released`. True when it was LIVE."""
        swapped, _ = self.control.compare_and_swap(
            consumer_state_offset(index), state_word(epoch, STATE_LIVE), state_word(epoch, STATE_DEAD)
        )
        if swapped:
            self.control.poison_released(index)
        return swapped

    def reclaim(self, index, epoch):
        """`reclaim_consumer`: DETACHED or DEAD -> FREE, keeping the epoch so the next owner gets a new one."""
        for state in (STATE_DETACHED, STATE_DEAD):
            swapped, _ = self.control.compare_and_swap(
                consumer_state_offset(index), state_word(epoch, state), state_word(epoch, STATE_FREE)
            )
            if swapped:
                return True
        return False

    def some_record_waits_to_be_freed(self):
        """Whether a record is DETACHED or DEAD (freed when its connection hangs up)."""
        control = self.control
        return any(control.record_state(i)[1] in (STATE_DETACHED, STATE_DEAD) for i in range(control.max_consumers))

    # -- back-pressure (ring.md "Back-pressure") --------------------------------------------------------------

    def can_reuse(self, seq):
        """Whether the slot of frame `seq` (which held frame seq - N) may be rewritten."""
        slots = self.control.slots
        if seq < slots:
            return True
        previous = seq - slots
        control = self.control
        for index in range(control.max_consumers):
            _epoch, state = control.record_state(index)
            if state == STATE_JOINING:
                return False
            if state != STATE_LIVE:
                continue
            if control.load(join_sequence_offset(index)) > previous:
                continue
            if control.load(released_offset(index, seq % slots)) < previous + 1:
                return False
        return True

    def last_frame_released(self):
        """Whether every LIVE consumer released the last published frame (or joined after it)."""
        last = self.counts.published - 1
        if last < 0:
            return True
        control = self.control
        for index in range(control.max_consumers):
            _epoch, state = control.record_state(index)
            if state != STATE_LIVE or control.load(join_sequence_offset(index)) > last:
                continue
            if control.load(released_offset(index, last % control.slots)) < last + 1:
                return False
        return True

    # -- publishing -------------------------------------------------------------------------------------------

    def publish(self, seq):
        """Writes frame `seq` into its slot, then `published[slot] = seq + 1` (Release), heartbeat, and
        `next_sequence = seq + 1` (SeqCst: late joiners start after it)."""
        self.frames.write_frame(seq)
        self.control.fetch_max(published_offset(seq % self.control.slots), seq + 1)
        self.control.heartbeat()
        self.control.store(OFF_NEXT_SEQUENCE, seq + 1, ATOMIC_SEQ_CST)
        self.counts.published = seq + 1

    def wait_until(self, condition, what, timeout):
        """Serves the socket and checks consumers about every ms until `condition()`; ProducerError past
        `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            if condition():
                return
            now = time.monotonic()
            if now >= self.next_check:
                self.next_check = now + CHECK_INTERVAL_S
                self.serve(0)
                self.admit_pending()
                self.check_consumer_pids()
                self.control.heartbeat()
                if condition():
                    return
                if now >= deadline:
                    raise ProducerError(f"timed out after {timeout} s waiting for {what}")
            os.sched_yield()

    def run(self):
        """Waits for `--consumers`, publishes `--frames` frames, then waits as `--end` says."""
        args = self.args
        self.wait_until(lambda: self.attached_count() >= args.consumers, f"{args.consumers} consumers", args.timeout)
        for seq in range(args.frames):
            # Between two frames: serve the front door, take records and send offers right away.
            self.serve(0)
            self.admit_pending()
            self.wait_until(lambda s=seq: self.can_reuse(s), f"the slot of frame {seq} to be released", args.timeout)
            self.publish(seq)
            if args.publish_delay:
                self.wait_until(lambda d=time.monotonic() + args.publish_delay: time.monotonic() >= d, "", 1e9)
        if args.end == "released":
            self.wait_until(self.last_frame_released, "the last frame to be released", args.timeout)
        elif args.end == "gone":
            self.wait_until(lambda: self.attached_count() == 0, "every consumer to hang up", args.timeout)

    def attached_count(self):
        """Consumers whose handshake completed and whose connection is open."""
        return sum(1 for c in self.connections if c.phase == ATTACHED)

    # -- liveness (ring.md "Detach and dead peers"; protocol.md "Liveness") -----------------------------------

    def check_consumer_pids(self):
        """`check_consumers`: a LIVE consumer whose pid is gone (kill(pid, 0) = ESRCH) is marked DEAD. Pid 0 is
        never declared gone. Its record is freed when its connection hangs up."""
        for conn in self.connections:
            if conn.phase != ATTACHED or conn.pid == 0:
                continue
            if process_gone(conn.pid) and self.mark_dead(conn.consumer, conn.epoch):
                log(f"consumer {conn.consumer} (pid {conn.pid}) is gone: marked dead")
                self.counts.lost += 1
                conn.pid = 0  # counted; the hang-up frees the record

    def consumer_hung_up(self, conn):
        """The attached consumer's connection ended: DETACHED means it left, still LIVE means it is lost (DEAD,
        poisoned). Either way its record is freed now: with cpu-spin nothing else can write it any more."""
        conn.sock.close()
        self.connections.remove(conn)
        epoch, state = self.control.record_state(conn.consumer)
        if epoch != conn.epoch:
            return
        if state == STATE_LIVE and self.mark_dead(conn.consumer, conn.epoch):
            log(f"consumer {conn.consumer} hung up while LIVE: marked dead")
            self.counts.lost += 1
        elif state == STATE_DETACHED:
            self.counts.left += 1
        self.reclaim(conn.consumer, conn.epoch)

    # -- the front door (protocol.md "Connection lifecycle", "Failures") -------------------------------------

    def serve(self, timeout_ms):
        """One `poll` of the listener and every connection (waiting at most `timeout_ms`), then the deadlines."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        by_fd = {}
        for conn in self.connections:
            if conn.phase == OFFER_WAIT:
                continue  # nothing to read until the offer is sent; its hang-up shows when the offer is sent
            mask = select.POLLRDHUP if conn.phase == ATTACHED else select.POLLIN | select.POLLRDHUP
            poller.register(conn.sock, mask)
            by_fd[conn.fileno()] = conn
        for fd, events in poller.poll(timeout_ms):
            if fd == self.listener.fileno():
                self.accept_all()
                continue
            conn = by_fd.get(fd)
            if conn is None or conn not in self.connections:
                continue
            if conn.phase == ATTACHED:
                self.consumer_hung_up(conn)
            else:
                self.read_handshake(conn, events)
        self.enforce_deadlines()

    def accept_all(self):
        """Accepts every waiting connection; checks SO_PEERCRED's uid right away (Refused 4 before reading)."""
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log(f"accept failed: {err}")
                return
            sock.setblocking(False)
            pid, uid, _gid = peer_credentials(sock)
            if uid != os.geteuid():
                self.refuse_socket(sock, REFUSE_PEER, f"uid {uid} may not connect; this producer serves uid "
                                   f"{os.geteuid()} only")
                continue
            self.connections.append(Connection(sock, pid, time.monotonic() + HANDSHAKE_TIMEOUT_S))
            self.limit_pending()

    def limit_pending(self):
        """More than `max_pending_handshakes` in flight: close the oldest that has not sent a valid hello."""
        pending = [c for c in self.connections if c.phase != ATTACHED]
        if len(pending) <= MAX_PENDING_HANDSHAKES:
            return
        for conn in pending:
            if conn.phase == HELLO_WAIT:
                self.close_connection(conn)
                return

    def refuse_socket(self, sock, code, text):
        """Sends `Refused` (best effort), drains and closes."""
        try:
            sock.send(encode_refused(code, text), socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except OSError:
            pass
        self.counts.refused += 1
        drain_and_close(sock)

    def refuse(self, conn, code, text):
        """Refuses a connection that has no record."""
        self.connections.remove(conn)
        self.refuse_socket(conn.sock, code, text)

    def close_connection(self, conn):
        """Closes a connection without a message."""
        self.connections.remove(conn)
        drain_and_close(conn.sock)

    def drop_handshake(self, conn, why):
        """A handshake that failed after its record was taken: hang up **first**, then give the record back
        (protocol.md step 5 and "Failures": the consumer's hang-up check relies on that order)."""
        log(f"handshake of record {conn.consumer} dropped: {why}")
        self.close_connection(conn)
        self.mark_dead(conn.consumer, conn.epoch)
        self.reclaim(conn.consumer, conn.epoch)
        self.counts.dropped += 1

    def read_message(self, conn):
        """Reads what is there of one message, never past it. Returns (type, payload) when complete, None when
        more is needed; raises Malformed, or EOFError on a hang-up."""
        while True:
            if conn.header is None:
                want = HEADER.size - len(conn.buffer)
            else:
                want = HEADER.size + conn.header[1] - len(conn.buffer)
            if want > 0:
                try:
                    data, fds, truncated = recv_with_fds(conn.sock, want)
                except (BlockingIOError, InterruptedError):
                    return None
                except ConnectionResetError:
                    raise EOFError from None
                close_fds(fds)  # a peer's fds are never used: count them, close them
                conn.fds_received += len(fds)
                if truncated:
                    conn.fds_received = MAX_FDS + 1  # more than 2: the kernel cut them off
                if not data:
                    raise EOFError
                conn.buffer += data
            if conn.header is None and len(conn.buffer) >= HEADER.size:
                conn.header = check_header(bytes(conn.buffer[: HEADER.size]))
                continue
            if conn.header is not None and len(conn.buffer) == HEADER.size + conn.header[1]:
                msg_type, _, fd_count = conn.header
                payload = bytes(conn.buffer[HEADER.size :])
                conn.buffer.clear()
                conn.header = None
                return msg_type, payload, fd_count

    def read_handshake(self, conn, events):
        """Progress of a handshake: the hello (HELLO_WAIT) or the Attached (ATTACHED_WAIT)."""
        try:
            message = self.read_message(conn)
        except Malformed as err:
            if conn.phase == HELLO_WAIT:
                self.refuse(conn, err.code, str(err))
            else:
                self.drop_handshake(conn, f"bad message instead of Attached: {err}")
            return
        except EOFError:
            if conn.phase == HELLO_WAIT:
                self.close_connection(conn)
            else:
                self.drop_handshake(conn, "hung up before Attached")
            return
        if message is None:
            if events & (select.POLLHUP | select.POLLERR) and conn in self.connections:
                # Hung up with a message half sent.
                if conn.phase == HELLO_WAIT:
                    self.close_connection(conn)
                else:
                    self.drop_handshake(conn, "hung up before Attached")
            return
        if conn.phase == HELLO_WAIT:
            self.on_hello(conn, message)
        else:
            self.on_attached(conn, message)

    def on_hello(self, conn, message):
        """A complete first message: refuse it, or queue the connection for a record (OFFER_WAIT)."""
        msg_type, payload, fd_count = message
        try:
            wanted = check_hello(msg_type, payload, fd_count, conn.fds_received)
        except Malformed as err:
            self.refuse(conn, err.code, str(err))
            return
        if wanted not in (0, BACKEND_HOST_FAKE):
            self.refuse(conn, REFUSE_BACKEND, f"this producer's ring is host-fake (3), not backend {wanted}")
            return
        conn.phase = OFFER_WAIT

    def on_attached(self, conn, message):
        """The consumer's answer to the offer: `Attached` with its id completes the handshake."""
        msg_type, payload, fd_count = message
        if msg_type == MSG_ATTACHED and fd_count == 0 and conn.fds_received == 0 and len(payload) == ATTACHED_PAYLOAD.size:
            consumer_id, reserved = ATTACHED_PAYLOAD.unpack(payload)
            if consumer_id == conn.consumer and reserved == 0:
                conn.phase = ATTACHED
                self.counts.attached += 1
                return
        if msg_type == MSG_DETACH:
            self.drop_handshake(conn, "the consumer sent Detach instead of Attached")
        else:
            self.drop_handshake(conn, f"message type {msg_type} instead of Attached")

    def admit_pending(self):
        """On the publishing thread, between frames: takes a record for each valid hello and sends the offer at
        once (protocol.md step 5, the note for a producer's implementer). No record: Refused 3, after looking
        again for up to 1 s while records of consumers that left wait to be freed."""
        for conn in [c for c in self.connections if c.phase == OFFER_WAIT]:
            taken = self.take_record(conn.pid)
            if taken is None:
                now = time.monotonic()
                if conn.full_since is None:
                    conn.full_since = now
                if not self.some_record_waits_to_be_freed() or now - conn.full_since >= RING_FULL_RETRY_S:
                    self.refuse(conn, REFUSE_RING_FULL, "every consumer record is taken; try again later")
                continue
            conn.consumer, conn.epoch = taken
            self.send_offer(conn)

    def send_offer(self, conn):
        """RingOffer with the control memfd and the data memfd; a failed send drops the handshake."""
        message = encode_offer(self, conn.consumer)
        fds = array.array("i", [self.control.fd, self.frames.fd])
        try:
            sent = conn.sock.sendmsg(
                [message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
            )
        except OSError as err:
            self.drop_handshake(conn, f"cannot send the offer: {err}")
            return
        if sent != len(message):
            self.drop_handshake(conn, f"offer sent only in part ({sent} of {len(message)} bytes)")
            return
        conn.phase = ATTACHED_WAIT

    def enforce_deadlines(self):
        """Handshakes past their deadline are closed without a message (and their record given back)."""
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.phase == ATTACHED or now < conn.deadline:
                continue
            if conn.consumer is None:
                self.close_connection(conn)
            else:
                self.drop_handshake(conn, "deadline passed")

    # -- shutdown (protocol.md "Producer shutdown") -----------------------------------------------------------

    def shutdown(self):
        """POISON into every record's release counters, CLOSED (Release), then close every connection (pending
        handshakes get Refused 5 first); remove the socket file if it is still ours."""
        for index in range(self.control.max_consumers):
            self.control.poison_released(index)
        self.control.store(OFF_PRODUCER_STATE, PRODUCER_CLOSED)
        for conn in list(self.connections):
            if conn.phase == ATTACHED:
                self.connections.remove(conn)
                conn.sock.close()
            else:
                self.refuse(conn, REFUSE_SHUTTING_DOWN, "the producer is shutting down")
        self.listener.close()
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self.socket_id:
                os.unlink(self.path)
        except OSError:
            pass
        self.frames.close()
        self.control.close()


def listen(path):
    """The rendezvous socket (protocol.md "Socket file"): a stale socket is replaced, a live one or another file
    is an error; created with mode 0600 (umask during bind, chmod before listen). Returns (socket, (dev, ino))."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ProducerError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            raise ProducerError(f"{path}: another producer is listening there")
        except ConnectionRefusedError:
            os.unlink(path)
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    st = os.lstat(path)
    sock.listen(64)
    sock.setblocking(False)
    return sock, (st.st_dev, st.st_ino)


def parse_args(argv):
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--socket", required=True, help="rendezvous socket path (at most 107 bytes)")
    parser.add_argument("--slots", type=int, default=2, help="ring slots, 1 to 32")
    parser.add_argument("--frames", type=int, default=300, help="frames to publish")
    parser.add_argument("--consumers", type=int, default=0, help="consumers to wait for before publishing")
    parser.add_argument("--max-consumers", type=int, default=MAX_RECORDS, help="consumer records, 1 to 16")
    parser.add_argument("--width", type=int, default=64, help="frame width in pixels (rgba8)")
    parser.add_argument("--height", type=int, default=16, help="frame height in rows")
    parser.add_argument("--end", choices=("close", "released", "gone"), default="released",
                        help="after the last frame: close at once, wait for its release, or for every hang-up")
    parser.add_argument("--publish-delay", type=float, default=0.0, help="seconds between frames")
    parser.add_argument("--timeout", type=float, default=10.0, help="bound of every wait, in seconds")
    args = parser.parse_args(argv)
    if not 1 <= args.slots <= MAX_SLOTS:
        parser.error("--slots must be 1 to 32")
    if not 1 <= args.max_consumers <= MAX_RECORDS:
        parser.error("--max-consumers must be 1 to 16")
    if args.width <= 0 or args.height <= 0:
        parser.error("--width and --height must be positive")
    if len(os.fsencode(args.socket)) > 107:
        parser.error("--socket path longer than 107 bytes")
    return args


def main(argv):
    """Runs the producer; prints the listening line and the summary; returns the exit code."""
    args = parse_args(argv)
    try:
        producer = RingProducer(args)
    except (ProducerError, OSError) as err:
        log(f"cannot start: {err}")
        print(json.dumps({"ok": 0, "error": str(err)}), flush=True)
        return 1
    print(json.dumps({"listening": args.socket, "generation": producer.generation, "pid": os.getpid()}), flush=True)
    error = None
    try:
        producer.run()
    except ProducerError as err:
        error = str(err)
        log(error)
    finally:
        producer.shutdown()
    summary = {"ok": 0 if error else 1, **dataclasses.asdict(producer.counts)}
    if error:
        summary["error"] = error
    print(json.dumps(summary), flush=True)
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
