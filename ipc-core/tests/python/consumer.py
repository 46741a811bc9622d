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
written with atomic 8-byte operations. Python has none of its own, so this consumer calls libatomic (the GCC runtime
library, present wherever a C compiler is installed) through `ctypes`: `__atomic_load_8` (acquire),
`__atomic_store_8` (release), `__atomic_compare_exchange_8` and `__atomic_fetch_or_8`, on addresses inside the
mapping; the counters we write are raised with a compare-and-swap loop (a `fetch_max`: never lowered, so a POISON
the producer wrote stays, protocol.md "Frames, per sync strategy"). Without libatomic, on x86-64 only, it falls
back to plain aligned 8-byte loads and stores through `ctypes.c_uint64`, which on x86-64 are atomic with
acquire/release ordering; there the `fetch_max` and the compare-and-swap of the ring-level detach become a load
and a store, which the docs allow while our record is LIVE in our epoch (protocol.md: "a plain aligned store is
right only while your record is LIVE", checked before each release; "Leaving": "an aligned 8-byte store of the
DETACHED word does the same while you are attached"). The atomics, like the protocol's constants and framing,
are in gpuipc_wire.py, next to this file, which producer.py shares.

cuda_consumer.py, next to this file, reuses this module (handshake, frame waits, leaving) for the legacy and vmm
backends: it passes its own importer to `run` (see `HostImport` for what one provides).
"""

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

SUPPORTED_SYNC = {SYNC_CPU_SPIN, SYNC_CPU_SLEEP}
SLEEP_INTERVAL_S = 0.0001  # how long cpu-sleep sleeps between two looks at the counter (our choice)


from consumer_wire import (  # noqa: E402  (next to this file)
    check_control_header, check_memfd, ConsumerError, decode_offer, decode_refused, encode_client_hello, Evicted,
    expected_fd_count, HEADER_ERRORS, is_power_of_two, Offer, ProducerGone, ProtocolError, read_own_record,
    ReadsStuck, recv_exactly, recv_message, RefusedByProducer, send_message, UnsupportedStrategy,
)


# ---------------------------------------------------------------------------------------------------------------
# Attaching (protocol.md, "Attaching, step by step")
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Session:
    """Everything an attached consumer holds."""

    sock: socket.socket
    producer_pid: int  # from SO_PEERCRED: the producer's pid in our PID namespace, 0 if it cannot be seen
    offer: Offer
    control: ControlMapping
    frames: object  # the frame memory: HostFrames here, a CUDA import in cuda_consumer.py
    epoch: int
    join_sequence: int

    def live_word(self):
        """Our record's state word while we are attached."""
        return state_word(self.epoch, STATE_LIVE)


def peer_pid_checked(sock):
    """Step 1: the producer must run as our effective uid; returns its pid as SO_PEERCRED gives it (may be 0)."""
    pid, uid, _gid = peer_credentials(sock)
    if uid != os.geteuid():
        raise ProtocolError(f"the socket's owner runs as uid {uid}, not ours ({os.geteuid()}); hanging up")
    return pid


def send_detach(sock, consumer_id, reason):
    """Send Detach; it is advisory, so a peer that already hung up is not an error."""
    try:
        send_message(sock, MSG_DETACH, DETACH_PAYLOAD.pack(consumer_id, reason, 0))
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


class HostFrames:
    """The frame memory of a host-fake ring: its memfd mapped read-only. The test producer writes frame s's
    sequence number, as a little-endian u64, into every 8-byte word of the frame.

    The interface the frame loop uses (cuda_consumer.py implements it for GPU memory): `read_frames` (the loop
    itself: `read_frames` below), `before_read` (nothing to wait for here), `mismatched_words` (read and check a
    frame; every read finished when it returns), `after_read` (just before the release), `summary_fields` (extra
    keys of the JSON summary), `close`, and `control_block_leaked` (True once the control block must stay mapped
    because queued GPU work may still touch it; never here)."""

    control_block_leaked = False

    def __init__(self, offer, fds):
        self.map = mmap.mmap(fds[1], offer.allocation_bytes, mmap.MAP_SHARED, mmap.PROT_READ)

    @staticmethod
    def read_frames(session, args, progress):
        """The CPU strategies' frame loop."""
        read_frames(session, args, progress)

    def before_read(self, session, seq, deadline):
        """Nothing: the publish counter is the whole wait with the CPU strategies."""

    def mismatched_words(self, offer, seq):
        """How many 8-byte words of frame `seq` differ from `seq` (little-endian u64)."""
        start = offer.data_offset + (seq % offer.slot_count) * offer.slot_stride_bytes
        word_count = offer.pitch_bytes * offer.height // 8
        words = struct.unpack_from(f"<{word_count}Q", self.map, start)
        return sum(1 for word in words if word != seq)

    def after_read(self, seq):
        """Nothing: the reads are finished."""

    def summary_fields(self):
        """No extra keys."""
        return {}

    def close(self):
        """Unmap."""
        self.map.close()


class HostImport:
    """What attach needs to know of the backend: which offers it takes, and how it imports the frame memory."""

    wanted_backend = BACKEND_HOST_FAKE

    @staticmethod
    def check_offer(offer):
        """Raise unless we can read this offer: backend host-fake, a CPU strategy."""
        if offer.backend != BACKEND_HOST_FAKE:
            raise ProtocolError(f"we asked for host-fake (3) and were offered backend {offer.backend}")
        if offer.sync not in SUPPORTED_SYNC:
            raise UnsupportedStrategy(f"the producer uses sync strategy {SYNC_NAMES[offer.sync]}; this consumer "
                                      "supports only cpu-spin and cpu-sleep")

    @staticmethod
    def import_frames(offer, fds, control):
        """Step 6: map the frame memfd (the control block needs nothing more with the CPU strategies)."""
        del control
        return HostFrames(offer, fds)


def import_offer(offer, fds, atomics, importer):
    """Steps 4 to 6: check the offer is one we can read, map and check the control block, read our record, import
    the frame memory (`importer.import_frames`)."""
    importer.check_offer(offer)
    control = ControlMapping(fds[0], atomics)
    try:
        check_control_header(control, offer)
        epoch, join_sequence = read_own_record(control, offer.consumer_id)
        frames = importer.import_frames(offer, fds, control)
    except BaseException:
        control.close()
        raise
    return control, frames, epoch, join_sequence


def attach(socket_path, name, timeout_s, atomics, importer=HostImport):
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
            send_message(sock, MSG_CLIENT_HELLO, encode_client_hello(name, importer.wanted_backend))
        except OSError:
            pass  # the producer may have refused us before reading: its Refused is waiting to be read
        offer, fds = receive_offer(sock, deadline)
        try:
            control, frames, epoch, join_sequence = import_offer(offer, fds, atomics, importer)
        except (ConsumerError, OSError):
            send_detach(sock, offer.consumer_id, DETACH_IMPORT_FAILED)  # step 7
            raise
        finally:
            close_fds(fds)  # the mappings keep the memory; the fds are no longer needed
        try:
            if connection_hung_up(sock):
                # Step 5: the producer dropped this handshake before we read our record, which may already be a
                # newcomer's: leave it alone (no detach) and let the caller attach again.
                raise ProtocolError("the producer dropped this handshake before we joined (too slow?); "
                                    "attach again")
            send_message(sock, MSG_ATTACHED, ATTACHED_PAYLOAD.pack(offer.consumer_id, 0))  # step 8
        except BaseException:
            frames.close()
            control.close()
            raise
        sock.setblocking(True)
        return Session(sock, producer_pid, offer, control, frames, epoch, join_sequence)
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
    session.frames.before_read(session, seq, time.monotonic() + timeout_s)
    mismatched = session.frames.mismatched_words(session.offer, seq)
    if read_delay_s > 0:
        time.sleep(read_delay_s)
    check_still_live(session)
    if not hold:
        session.frames.after_read(seq)
        release(session, seq)
    return mismatched, state == READY_PAST_POISON


def poison_published(session):
    """The producer is gone: poison every publish counter (fetch_or 2^62) so other consumers' waits end too; but
    only while our record is still LIVE in our epoch: a producer that dropped us (marked our record dead, then hung
    up) is not gone, and its ring is not ours to poison (protocol.md, "Producer shutdown")."""
    if session.control.load(consumer_state_offset(session.offer.consumer_id)) != session.live_word():
        return
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
        detached, _ = session.control.compare_and_swap(consumer_state_offset(consumer_id), session.live_word(),
                                                       state_word(session.epoch, STATE_DETACHED))
    # Step 4: Detach (advisory). Step 5: close.
    send_detach(session.sock, consumer_id, DETACH_CONSUMER_DONE)
    session.sock.close()
    return detached


def release_mappings(session):
    """Unmap (or release) the frame memory, then the control block, unless GPU work may still touch it (its
    registration leaked: cuda_consumer.py with gpu-stream-ops and a stuck stream)."""
    session.frames.close()
    if not session.frames.control_block_leaked:
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
        session.frames.read_frames(session, args, progress)
    except ProducerGone:
        poison_published(session)
        session.sock.close()
        raise
    except (Evicted, ReadsStuck):
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
        **session.frames.summary_fields(),
    }
    print(json.dumps(summary), flush=True)


def run(args, importer=HostImport):
    """Attach, read, leave; returns the exit code. The summary is printed for exit 0, 4 and 5."""
    atomics = make_atomics(lambda text: print(f"consumer: {text}", file=sys.stderr), ProtocolError)
    session = attach(args.socket, args.name, args.timeout, atomics, importer)
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
