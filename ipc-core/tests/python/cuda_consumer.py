#!/usr/bin/env python3
"""A gpu-ipc consumer in Python for the real GPU backends (legacy and vmm), written from the docs alone
(docs/protocol.md, docs/ring.md, docs/kernels.md "The frame check pattern", docs/frames.md): the same exercise as
consumer.py, whose handshake, frame waits and leaving it reuses (it imports consumer.py and gives it a CUDA
importer), plus attaching step 6, the import of the frame memory, through the CUDA driver API of `cuda-bindings`.

    python3 cuda_consumer.py --socket /tmp/frames.sock --frames 200
    python3 cuda_consumer.py --socket /tmp/frames.sock --backend vmm --verifier host
    python3 cuda_consumer.py --self-test          # the pattern against docs/kernels.md's vectors; no GPU needed

Strategies: cpu-spin, cpu-sleep (host counters in the control block) and ipc-event (the producer's published
event of the slot polled with cuEventQuery before reading, our released event recorded with cuEventRecord before
the release counter is raised; protocol.md "IPC events": neither side makes a stream wait on the other's event)
and gpu-stream-ops (the control block host-registered for the device; per frame, on our stream,
cuStreamWaitValue64 on the publish counter, the check, cuStreamWriteValue64 of the release counter and an event;
the CPU only queues, at most 8 to 32 frames ahead (2 * slot_count, within the verifier's means), and polls the
oldest frame's event, watching the producer and our record: see StreamOpsLoop). gpu-poll (a polling kernel)
exits 2.

Attaching (protocol.md, "Attaching, step by step", step 6): the GPU is the one whose cuDeviceGetUuid(_v2) equals the
offer's device_uuid, used through its primary context. legacy: cuIpcOpenMemHandle(legacy_mem_handle,
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), its size checked with cuMemGetAddressRange. vmm:
cuMemImportFromShareableHandle(fd 1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), cuMemAddressReserve of
allocation_bytes aligned to this GPU's cuMemGetAllocationGranularity, cuMemMap, cuMemSetAccess (read-write for this
device). Leaving undoes it in reverse order (vmm: cuMemUnmap, cuMemAddressFree, cuMemRelease; legacy:
cuIpcCloseMemHandle; gpu-stream-ops first cuMemHostUnregister of the control block), after the ring-level detach
and once our stream is idle. When the machine has one GPU, its
context and the verifier are made ready before connecting, so the handshake (bounded by the producer, 10 s by
default) only imports.

Frame content: word i (32-bit little-endian, i in 0 .. pitch_bytes * height / 4, row padding included) of frame seq
is expected to hold the frame check pattern of docs/kernels.md, pattern(seq, i). Verifiers (`--verifier`):
- `cupy` (auto's first choice): a uint32 CuPy array over the slot's bytes in place (UnownedMemory, MemoryPointer),
  the expected pattern computed with CuPy, the mismatched words counted on the GPU, on our own stream;
- `host`: the frame copied to pinned host memory (cuMemcpyDtoHAsync on our stream), then every word checked with
  numpy (`host-copy-numpy`) or, without numpy, a sample of up to 4,096 evenly spaced words in pure Python
  (`host-copy-python-sample`).
With the CPU strategies and ipc-event every read finishes (an event recorded after it, polled for at most 10 s)
before the frame is released; with gpu-stream-ops the release is queued after the reads on the same stream, and a
frame counts once its event completed. Reads (or, with gpu-stream-ops, anything queued on the ring) that do not
finish in time end the run with exit 1 (or 4 / 5 when the producer was gone or had evicted us) without touching
the record, and the mappings (and the control block's registration) are leaked rather than undone under the GPU
(protocol.md, "Leaving", step 1). With gpu-stream-ops, --read-delay holds back the queuing of each release and
--stall-after queues no release for the later frames.

Output, exit codes: as consumer.py (0 read --frames frames and left, 1 error, 2 unsupported strategy, 3 refused,
4 producer gone, 5 evicted); the JSON line on stdout adds "backend", "sync", "verifier" and "device" (the GPU's
UUID). Without cuda-bindings, or without a CUDA driver or GPU, it exits 1 with one line saying what is missing.

What the docs leave open (and the reading taken here) is listed in the report of the commit that added this file;
the places are marked "Doc gap" below.
"""

import argparse
import collections
import ctypes
import json
import os
import re
import struct
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
import consumer  # noqa: E402  (the handshake, frame waits and leaving; next to this file)
from consumer import (  # noqa: E402
    ConsumerError, Evicted, ProducerGone, ProtocolError, ReadsStuck, UnsupportedStrategy,
)
from gpuipc_wire import (  # noqa: E402
    BACKEND_LEGACY, BACKEND_VMM, CHECK_INTERVAL_S, CONTROL_BYTES, POISON, published_offset, released_offset,
    SYNC_CPU_SLEEP, SYNC_CPU_SPIN, SYNC_GPU_STREAM_OPS, SYNC_IPC_EVENT, SYNC_NAMES,
)

SUPPORTED_SYNC = {SYNC_CPU_SPIN, SYNC_CPU_SLEEP, SYNC_IPC_EVENT, SYNC_GPU_STREAM_OPS}
BACKEND_NAMES = {BACKEND_LEGACY: "legacy", BACKEND_VMM: "vmm", 3: "host-fake"}
GPU_TIMEOUT_S = 10.0  # how long our reads of one frame may take on the GPU (the reference's gpu_timeout default)
EVENT_POLL_S = 0.00002  # nap between two cuEventQuery looks (ours; cpu-sleep's 20 us)
MEMHOSTREGISTER_DEVICEMAP = 0x02  # CU_MEMHOSTREGISTER_DEVICEMAP in cuda.h, where the bindings do not export it
from frame_check import (  # noqa: E402  (the pattern and the verifiers; next to this file)
    CupyVerifier, EMBEDDED_VECTORS, expected_words, HOST_COPY_BYTES, HostCopyVerifier, INDEX_MULTIPLIER, index_term,
    KERNELS_MD, kernels_md_vectors, log, pattern_word, PATTERN_XOR, RUN_AHEAD_MAX, SAMPLE_WORDS, self_test,
    SEQ_MULTIPLIER, seq_term, U32, VECTOR_ROW,
)
from cuda_driver import (  # noqa: E402  (the driver API through cuda-bindings; next to this file)
    CudaError, Driver, load_cuda_bindings, struct_bytes, struct_from_bytes, uuid_text,
)


class CudaDevice:
    """cuInit, the visible GPUs and their UUIDs; once one is chosen, its primary context (made current), our
    stream, an event that bounds our waits for the stream, and the frame verifier."""

    def __init__(self, drv, verifier_choice):
        self.drv = drv
        self.cu = drv.cu
        self.verifier_choice = verifier_choice
        drv.call("cuInit", 0)
        self.driver_version = drv.call("cuDriverGetVersion")
        self.devices = []  # (ordinal, CUdevice, uuid bytes)
        for ordinal in range(drv.call("cuDeviceGetCount")):
            dev = drv.call("cuDeviceGet", ordinal)
            uuid_call = "cuDeviceGetUuid_v2" if hasattr(self.cu, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
            self.devices.append((ordinal, dev, struct_bytes(drv.call(uuid_call, dev), 16)))
        if not self.devices:
            raise CudaError("cuDeviceGetCount found no CUDA device (is CUDA_VISIBLE_DEVICES empty?)")
        self.cupy = None
        self.numpy = None
        if verifier_choice in ("auto", "cupy"):
            try:
                import cupy
                self.cupy = cupy
            except ImportError as err:
                if verifier_choice == "cupy":
                    raise CudaError(f"--verifier cupy: CuPy does not import ({err})") from None
                log("CuPy is not installed: frames are copied to the host and checked there")
        if self.cupy is None:
            try:
                import numpy
                self.numpy = numpy
            except ImportError:
                log("numpy is not installed either: a sample of each frame's words is checked in pure Python")
        self.ordinal = None
        self.dev = None
        self.uuid = None
        self.context = None
        self.stream = None
        self.done_event = None
        self.verifier = None
        self.stuck = False  # our stream did not finish in time: leak rather than unmap under it

    def prepare_if_single(self):
        """With one visible GPU the offer can only name that one: get it ready before connecting."""
        if len(self.devices) == 1:
            self.open(0)

    def open(self, ordinal):
        """Primary context of GPU `ordinal` (retained, made current), our stream and event, the verifier."""
        drv = self.drv
        _, dev, uuid = self.devices[ordinal]
        self.context = drv.call("cuDevicePrimaryCtxRetain", dev)
        self.ordinal, self.dev, self.uuid = ordinal, dev, uuid
        drv.call("cuCtxSetCurrent", self.context)
        self.stream = drv.call("cuStreamCreate", int(self.cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        self.done_event = drv.call("cuEventCreate", int(self.cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        if self.cupy is not None:
            try:
                self.verifier = CupyVerifier(self.cupy, ordinal, self.stream, drv)
                self.verifier.warm_up()
            except Exception as err:  # CuPy's own errors: name them, then stop
                raise CudaError(f"CuPy cannot run on GPU {ordinal}: {type(err).__name__}: {err}") from None
        else:
            self.verifier = HostCopyVerifier(drv, self.stream, self.numpy)

    def select(self, uuid):
        """The GPU the offer names (RingOffer.device_uuid against cuDeviceGetUuid); opened if it is not yet."""
        for ordinal, _, device_uuid in self.devices:
            if device_uuid == uuid:
                break
        else:
            visible = ", ".join(uuid_text(u) for _, _, u in self.devices)
            raise CudaError(f"the producer's GPU {uuid_text(uuid)} is not visible here (visible: {visible}); "
                            "check CUDA_VISIBLE_DEVICES")
        if self.ordinal is None:
            self.open(ordinal)
        elif self.ordinal != ordinal:
            raise CudaError(f"GPU {self.ordinal} was made ready, but the offer names GPU {ordinal}")
        return ordinal

    def attribute(self, name):
        """An integer device attribute of the chosen GPU."""
        return self.drv.call("cuDeviceGetAttribute", getattr(self.cu.CUdevice_attribute, name), self.dev)

    def wait_stream(self, what):
        """Wait, at most GPU_TIMEOUT_S, until our stream has passed everything queued on it (an event recorded and
        polled: never an unbounded synchronise). ReadsStuck past that, and from then on nothing is unmapped."""
        self.drv.call("cuEventRecord", self.done_event, self.stream)
        deadline = time.monotonic() + GPU_TIMEOUT_S
        while True:
            result, _ = self.drv.status("cuEventQuery", self.done_event)
            if result == self.drv.success:
                return
            if result != self.drv.not_ready:
                raise CudaError(f"cuEventQuery failed while waiting for {what}: {self.drv.error_name(result)} "
                                f"({int(result)})")
            if time.monotonic() >= deadline:
                self.stuck = True
                raise ReadsStuck(f"the GPU did not finish {what} within {GPU_TIMEOUT_S} s; leaving the mappings "
                                 "in place and hanging up without the ring-level detach")
            time.sleep(EVENT_POLL_S)

    def close(self):
        """Our event and stream, the verifier, then the primary context (once every ring is closed)."""
        if self.context is None:
            return
        if self.stuck:
            log("our stream is stuck: the stream, event and context are left as they are")
            return
        if self.verifier is not None:
            self.verifier.close()
        if self.done_event is not None:
            self.drv.try_call("cuEventDestroy", self.done_event)
        if self.stream is not None:
            self.drv.try_call("cuStreamDestroy", self.stream)
        self.drv.try_call("cuDevicePrimaryCtxRelease", self.dev)
        self.context = None


class GpuFrames:
    """One ring's frame memory imported into our context (legacy or vmm), with its IPC events (ipc-event) or the
    control block registered for the device (gpu-stream-ops): the interface consumer.py's frame loop uses (see
    consumer.HostFrames). Everything acquired is undone in reverse order by `close`, also when the import fails
    half-way."""

    def __init__(self, device, offer, fds, control):
        self.device = device
        self.drv = device.drv
        self.cu = device.cu
        self.offer = offer
        self.undo = []  # (driver function, its arguments) that undo what was acquired, in the order acquired
        self.events = []  # ipc-event: the offer's IPC events; gpu-stream-ops: one event per frame in flight
        self.base = 0
        self.control_base = 0  # gpu-stream-ops: the control block's device pointer
        self.control_registered = False
        self.control_block_leaked = False
        frame_bytes = offer.pitch_bytes * offer.height
        self.depth = 1  # frames in flight on our stream
        if offer.sync == SYNC_GPU_STREAM_OPS:
            self.depth = min(max(2 * offer.slot_count, 8), device.verifier.max_depth(frame_bytes))
        try:
            if offer.backend == BACKEND_LEGACY:
                self.import_legacy()
            else:
                self.import_vmm(fds[1])
            if offer.sync == SYNC_IPC_EVENT:
                for handle in offer.event_handles:
                    event = self.drv.call("cuIpcOpenEventHandle", struct_from_bytes(self.cu.CUipcEventHandle, handle))
                    self.undo.append(("cuEventDestroy", (event,)))
                    self.events.append(event)
            if offer.sync == SYNC_GPU_STREAM_OPS:
                self.register_control_block(control)
                flags = int(self.cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
                for _ in range(self.depth):
                    event = self.drv.call("cuEventCreate", flags)
                    self.undo.append(("cuEventDestroy", (event,)))
                    self.events.append(event)
            device.verifier.prepare(frame_bytes, self.depth)
        except BaseException:
            self.close()
            raise

    def register_control_block(self, control):
        """gpu-stream-ops (protocol.md, attaching step 6; ring.md, "Shared memory"): cuMemHostRegister the whole
        control-block mapping with CU_MEMHOSTREGISTER_DEVICEMAP and take its device pointer, the `base` of the
        counters' addresses. The GPU must offer 64-bit stream memory operations and mapped host memory."""
        device = self.device
        # Doc gap: protocol.md names no device attribute; frames.md names the 64-bit one; mapped host memory is ours.
        for names in (("CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS",
                       "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1"),
                      ("CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY",)):
            name = next((n for n in names if hasattr(self.cu.CUdevice_attribute, n)), None)
            if name is None:
                log(f"this cuda-bindings has no {names[0]}: not checked")
            elif not device.attribute(name):
                raise CudaError(f"GPU {device.ordinal} reports {name} = 0: it cannot run gpu-stream-ops; ask the "
                                "producer for cpu-spin, cpu-sleep or ipc-event")
        flags = int(getattr(self.cu, "CU_MEMHOSTREGISTER_DEVICEMAP", MEMHOSTREGISTER_DEVICEMAP))
        self.drv.call("cuMemHostRegister", control.base, CONTROL_BYTES, flags)
        self.undo.append(("cuMemHostUnregister", (control.base,)))
        self.control_registered = True
        self.control_base = int(self.drv.call("cuMemHostGetDevicePointer", control.base, 0))

    def import_legacy(self):
        """cuIpcOpenMemHandle(legacy_mem_handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS); the mapping must cover
        data_offset + slot_count * slot_stride_bytes."""
        offer = self.offer
        handle = struct_from_bytes(self.cu.CUipcMemHandle, offer.legacy_mem_handle)
        flags = int(self.cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        ptr = self.drv.call("cuIpcOpenMemHandle", handle, flags)
        self.undo.append(("cuIpcCloseMemHandle", (ptr,)))
        self.base = int(ptr)
        # Doc gap: whether the opened pointer is the start of `allocation_bytes` (the handle taken at the
        # allocation's base) is not said; cuIpcOpenMemHandle maps the whole allocation and returns its base.
        needed = offer.data_offset + offer.slot_count * offer.slot_stride_bytes
        try:
            range_base, range_size = self.drv.call("cuMemGetAddressRange", ptr)
        except CudaError as err:
            log(f"cannot check the size of the legacy allocation: {err}")
            return
        range_base = int(range_base)
        if not range_base <= self.base or self.base + needed > range_base + range_size:
            raise CudaError(f"the opened legacy allocation is {range_size} bytes at {range_base:#x} (pointer "
                            f"{self.base:#x}); the offer needs {needed} bytes from the pointer on")
        if range_base != self.base or range_size != offer.allocation_bytes:
            log(f"the legacy allocation is {range_size} bytes at {range_base:#x}; the offer says "
                f"{offer.allocation_bytes} bytes at the pointer {self.base:#x}")

    def import_vmm(self, fd):
        """Import the POSIX fd, reserve allocation_bytes aligned to this GPU's granularity, map, allow read-write
        access for this GPU."""
        offer, drv, cu, device = self.offer, self.drv, self.cu, self.device
        for attribute in ("CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED",
                          "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"):
            if not device.attribute(attribute):
                raise CudaError(f"GPU {device.ordinal} reports {attribute} = 0: it cannot import a vmm ring; ask "
                                "for the legacy backend (--backend legacy)")
        handle_type = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        handle = drv.call("cuMemImportFromShareableHandle", fd, handle_type)
        self.undo.append(("cuMemRelease", (handle,)))
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device.ordinal
        prop.requestedHandleTypes = handle_type
        granularity = drv.call("cuMemGetAllocationGranularity", prop,
                               cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        size = offer.allocation_bytes
        if size % granularity:
            raise CudaError(f"allocation_bytes {size} is not a multiple of this GPU's VMM granularity {granularity}")
        ptr = drv.call("cuMemAddressReserve", size, max(granularity, offer.granularity), 0, 0)
        self.undo.append(("cuMemAddressFree", (ptr, size)))
        drv.call("cuMemMap", ptr, size, 0, handle, 0)
        self.undo.append(("cuMemUnmap", (ptr, size)))
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device.ordinal
        # Doc gap: the docs say cuMemSetAccess without the flags; a reader only needs PROT_READ, we ask read-write.
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        drv.call("cuMemSetAccess", ptr, size, [access], 1)
        self.base = int(ptr)

    # The frame loop's interface (consumer.read_frame).

    def before_read(self, session, seq, deadline):
        """ipc-event: poll the producer's published event of the slot until it completes (protocol.md, "Frames,
        per sync strategy"), checking the producer and our record about every millisecond; bounded."""
        if self.offer.sync != SYNC_IPC_EVENT:
            return
        event = self.events[seq % self.offer.slot_count]
        next_check = time.monotonic() + CHECK_INTERVAL_S
        while True:
            result, _ = self.drv.status("cuEventQuery", event)
            if result == self.drv.success:
                return
            if result != self.drv.not_ready:
                raise CudaError(f"cuEventQuery of the published event of frame {seq} failed: "
                                f"{self.drv.error_name(result)} ({int(result)})")
            now = time.monotonic()
            if now >= next_check:
                gone = consumer.producer_gone_reason(session)
                if gone is not None and self.drv.status("cuEventQuery", event)[0] != self.drv.success:
                    raise ProducerGone(f"{gone} while we waited for the published event of frame {seq}")
                consumer.check_still_live(session)
                if now >= deadline:
                    raise ProtocolError(f"timed out waiting for the published event of frame {seq}")
                next_check = now + CHECK_INTERVAL_S
            time.sleep(EVENT_POLL_S)

    def read_frames(self, session, args, progress):
        """The frame loop: consumer.py's for the CPU strategies and ipc-event, StreamOpsLoop's for gpu-stream-ops."""
        if self.offer.sync == SYNC_GPU_STREAM_OPS:
            StreamOpsLoop(self, session, args, progress).run()
        else:
            consumer.read_frames(session, args, progress)

    def frame_address(self, seq):
        """Device address of frame `seq` (in slot seq % N) and its length in 32-bit words."""
        offer = self.offer
        ptr = self.base + offer.data_offset + (seq % offer.slot_count) * offer.slot_stride_bytes
        return ptr, offer.pitch_bytes * offer.height // 4

    def start_check(self, seq, k=0):
        """Queue the check of frame `seq` on our stream, its result into the verifier's slot `k`."""
        ptr, n_words = self.frame_address(seq)
        try:
            return self.device.verifier.start(ptr, n_words, seq, k)
        except ConsumerError:
            raise
        except Exception as err:  # CuPy's errors
            raise CudaError(f"checking frame {seq} failed: {type(err).__name__}: {err}".splitlines()[0]) from None

    def mismatched_words(self, offer, seq):
        """Check frame `seq` in its slot on the GPU (or its copy on the host); returns the mismatched words (of the
        sample, for host-copy-python-sample). The stream has passed the reads when this returns."""
        del offer
        pending = self.start_check(seq)
        self.device.wait_stream(f"the check of frame {seq}")
        return self.device.verifier.finish(pending)

    def after_read(self, seq):
        """ipc-event: record our released event of the slot on our stream (after the reads), before the counter."""
        if self.offer.sync == SYNC_IPC_EVENT:
            slot = seq % self.offer.slot_count
            self.drv.call("cuEventRecord", self.events[self.offer.slot_count + slot], self.device.stream)

    def summary_fields(self):
        """backend, sync, verifier and device in the JSON summary."""
        return {"backend": BACKEND_NAMES[self.offer.backend], "sync": SYNC_NAMES[self.offer.sync],
                "verifier": self.device.verifier.name, "device": uuid_text(self.device.uuid)}

    def close(self):
        """Once our stream is idle: undo everything in reverse order (protocol.md, "Leaving", step 6: events
        destroyed first, the control block unregistered, then vmm: unmap, free the address range, release the
        handle; legacy: close the handle). Leaked when the stream is stuck, the control block's registration and
        mapping included (`control_block_leaked`): a stream wait may still poll it."""
        if not self.undo:
            return
        if not self.device.stuck:
            try:
                self.device.wait_stream("our last reads before unmapping")
            except ConsumerError as err:
                log(str(err))
        if self.device.stuck:
            log("leaking the ring's mappings" + (" and the control block's registration" if self.control_registered
                                                  else "") + ": the GPU may still be using them")
            self.control_block_leaked = self.control_registered
            self.undo.clear()
            return
        while self.undo:
            name, args = self.undo.pop()
            self.drv.try_call(name, *args)


class StreamOpsLoop:
    """The gpu-stream-ops frame loop (protocol.md, "Frames, per sync strategy"; ring.md, "GPU strategy mapping").
    For frame s in slot i, on our stream: cuStreamWaitValue64(base + offset(published[i]), s + 1, GEQ), the check of
    the frame (CuPy's kernels, or the copy to the host), cuStreamWriteValue64(base + offset(released[c][i]), s + 1,
    0) (default flags: with the memory barrier), then cuEventRecord of that frame's event. The CPU only queues:
    at most `depth` frames are queued and not yet counted; it then polls the oldest frame's event (cuEventQuery,
    never a synchronise), for at most --timeout, checking the producer and our record about every millisecond.

    A frame counts once its event has completed, our record is still LIVE in our epoch (the producer rewrites a
    slot we read only after our release, unless it evicted us: protocol.md, "Check your record", "a consumer that
    holds several frames checks before it counts each as read") and the producer really published it: the low bits
    of published[i] reach s + 1 (a poison keeps them, protocol.md "When frame s is readable"; with a GPU strategy a
    CLOSED ring's next_sequence proves nothing, the publish being counted when queued). A wait passed by the poison
    alone means the frame never came: its check is discarded
    and the loop ends with ProducerGone.

    Producer gone (closed, hung up, its process gone): while our record is LIVE we poison the publish counters so
    that the waits we queued pass, and poison them again at every check, since a dead producer's queued stream
    writes can still land (ring.md, "GPU strategy mapping", Survivor). Whatever ends the loop, our stream is first
    waited for (an event, bounded by GPU_TIMEOUT_S: "Leaving", step 1); if it does not get there, ReadsStuck, and
    nothing is unmapped or unregistered."""

    def __init__(self, frames, session, args, progress):
        self.frames = frames
        self.session = session
        self.args = args
        self.progress = progress
        self.device = frames.device
        self.drv = frames.drv
        self.stream = frames.device.stream
        self.offer = session.offer
        self.geq = int(frames.cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        self.inflight = collections.deque()  # (seq, k, pending check, held) in the order queued
        self.gone = None  # why the producer is gone, once seen

    def run(self):
        """Read, then make sure our stream has passed everything we queued, however the loop ended."""
        try:
            self.read()
        except BaseException as err:
            self.drain(err)
            raise
        self.drain(None)

    def read(self):
        """Queue frames up to `depth` ahead, count the oldest, until --frames are counted (0: until the producer is
        gone)."""
        first = self.session.join_sequence
        next_seq = first
        while True:
            while len(self.inflight) < self.frames.depth and (self.args.frames == 0
                                                              or next_seq - first < self.args.frames):
                self.queue(next_seq, self.args.stall_after is not None and next_seq - first >= self.args.stall_after)
                next_seq += 1
            if not self.inflight:
                return
            self.count_oldest()

    def queue(self, seq, hold):
        """Frame `seq` on our stream: wait, check, release (unless `hold`), event."""
        # Doc gap: "check your record before waiting for each frame and before releasing it" assumes a CPU release;
        # here the release is queued before the reads have run. We check when queuing, and again before counting.
        consumer.check_still_live(self.session)
        slot = seq % self.offer.slot_count
        k = seq % self.frames.depth
        base = self.frames.control_base
        self.drv.call("cuStreamWaitValue64", self.stream, base + published_offset(slot), seq + 1, self.geq)
        pending = self.frames.start_check(seq, k)
        if self.args.read_delay > 0:
            time.sleep(self.args.read_delay)  # holds back the release we queue next
        if not hold:
            self.drv.call("cuStreamWriteValue64", self.stream,
                          base + released_offset(self.offer.consumer_id, slot), seq + 1, 0)
        self.drv.call("cuEventRecord", self.frames.events[k], self.stream)
        self.inflight.append((seq, k, pending, hold))

    def count_oldest(self):
        """Wait for the oldest frame's event (bounded by --timeout), then count it or end the loop."""
        session, offer = self.session, self.offer
        seq, k, pending, hold = self.inflight[0]
        slot = seq % offer.slot_count
        if not self.poll(self.frames.events[k], time.monotonic() + self.args.timeout, check_record=True):
            published = (session.control.load(published_offset(slot)) & ~POISON) >= seq + 1
            raise ProtocolError(f"timed out after {self.args.timeout} s waiting for frame {seq}"
                                + (" (published; our stream has not passed its check)" if published else ""))
        self.inflight.popleft()
        consumer.check_still_live(session)  # vouches for what the check read
        value = session.control.load(published_offset(slot))
        # The low bits only: with GPU strategies next_sequence moves when the publish is queued, so a CLOSED ring's
        # next_sequence does not prove the frame was written (protocol.md, "GPU waits pass on POISON too").
        if (value & ~POISON) < seq + 1:
            gone = self.gone or consumer.producer_gone_reason(session) or f"slot {slot}'s publish counter is poisoned"
            raise ProducerGone(f"{gone}: frame {seq} was never published (its counter reads {value:#x}; the poison "
                               "let our wait pass, and the check of the slot is discarded)")
        progress = self.progress
        progress.frames += 1
        progress.held += int(hold)
        progress.read_past_poison += int(bool(value & POISON))
        progress.mismatched_words += self.device.verifier.finish(pending)

    def watch_producer(self):
        """Once the producer is gone, poison the publish counters (while our record is LIVE: consumer.py's
        poison_published), now and at every later check."""
        # Doc gap: protocol.md asks a consumer to poison once, at the hang-up; that a dead producer's late stream
        # writes can take the poison back, so that it must be repeated, is only in ring.md (the reference's watchdog).
        if self.gone is None:
            self.gone = consumer.producer_gone_reason(self.session)
        if self.gone is not None:
            consumer.poison_published(self.session)

    def poll(self, event, deadline, check_record):
        """Poll `event` until it completes (True) or `deadline` passes (False), watching the producer (and, with
        `check_record`, our record) about every millisecond. CudaError when the query fails."""
        next_check = time.monotonic() + CHECK_INTERVAL_S
        while True:
            result, _ = self.drv.status("cuEventQuery", event)
            if result == self.drv.success:
                return True
            if result != self.drv.not_ready:
                raise CudaError(f"cuEventQuery failed: {self.drv.error_name(result)} ({int(result)})")
            now = time.monotonic()
            if now >= next_check:
                self.watch_producer()
                if check_record:
                    consumer.check_still_live(self.session)
                if now >= deadline:
                    return False
                next_check = now + CHECK_INTERVAL_S
            time.sleep(EVENT_POLL_S)

    def drain(self, err):
        """Leaving, step 1: wait, at most GPU_TIMEOUT_S, until our stream has passed everything we queued (an event
        recorded after it), the producer watched meanwhile. Frames still in flight are not counted. When the stream
        does not get there, nothing is unmapped or unregistered from then on (`device.stuck`), and the loop ends
        with ReadsStuck (so that consumer.py skips the poison and the ring-level detach), unless it ended with
        ProducerGone or Evicted already: those write nothing into our record either, and keep their exit code."""
        if self.device.stuck:
            return
        # Doc gap: an evicted consumer (or one whose frame never came from a producer still there) may not poison the
        # publish counters its queued waits watch, and the docs give it no other way to release them: it waits, bounded,
        # then leaks. Whether its late stream writes after the hang-up are re-poisoned for it is not said either, so we
        # drain before hanging up on every path.
        try:
            self.drv.call("cuEventRecord", self.device.done_event, self.stream)
            if self.poll(self.device.done_event, time.monotonic() + GPU_TIMEOUT_S, check_record=False):
                self.inflight.clear()
                return
            why = f"our stream did not pass the work queued on the ring within {GPU_TIMEOUT_S} s"
        except CudaError as cuda_err:
            why = str(cuda_err)
        self.device.stuck = True
        leaking = "leaving the mappings and the control block's registration in place"
        if isinstance(err, (ProducerGone, Evicted)):
            log(f"{why}: {leaking}")
            return
        before = f"{err}; then " if err is not None else ""
        raise ReadsStuck(f"{before}{why}: {leaking} and hanging up without the ring-level detach") from None


class CudaImport:
    """consumer.py's importer for the GPU backends."""

    def __init__(self, device, wanted_backend):
        self.device = device
        self.wanted_backend = wanted_backend

    def check_offer(self, offer):
        """legacy or vmm (the one asked for, if any), with a strategy we implement."""
        if offer.backend not in (BACKEND_LEGACY, BACKEND_VMM):
            raise ProtocolError(f"offered backend {BACKEND_NAMES.get(offer.backend, offer.backend)}; this consumer "
                                "reads legacy and vmm rings (consumer.py reads host-fake)")
        if self.wanted_backend and offer.backend != self.wanted_backend:
            raise ProtocolError(f"we asked for {BACKEND_NAMES[self.wanted_backend]} and were offered "
                                f"{BACKEND_NAMES[offer.backend]}")
        if offer.sync not in SUPPORTED_SYNC:
            raise UnsupportedStrategy(f"the producer uses sync strategy {SYNC_NAMES[offer.sync]}; this consumer "
                                      "supports cpu-spin, cpu-sleep, ipc-event and gpu-stream-ops")

    def import_frames(self, offer, fds, control):
        """Attaching step 6 on the GPU the offer names."""
        self.device.select(offer.device_uuid)
        return GpuFrames(self.device, offer, fds, control)


# ---------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------

WANTED_BACKEND = {"any": 0, "legacy": BACKEND_LEGACY, "vmm": BACKEND_VMM}


def parse_args(argv):
    """Command line: consumer.py's, plus --backend, --verifier and --self-test."""
    parser = argparse.ArgumentParser(description="gpu-ipc consumer for the legacy and vmm backends, in Python "
                                                 "with cuda-bindings (and CuPy to check frames on the GPU)")
    parser.add_argument("--socket", help="the producer's rendezvous socket path (required unless --self-test)")
    parser.add_argument("--frames", type=consumer.non_negative_int, default=100,
                        help="how many frames to read; 0: until the producer is gone (default 100)")
    parser.add_argument("--name", default="python-cuda-consumer", help="consumer name sent in the hello")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds allowed for the attach, and for each frame to arrive (default 10)")
    parser.add_argument("--backend", choices=sorted(WANTED_BACKEND), default="any",
                        help="backend to ask for in the hello (default any: legacy or vmm)")
    parser.add_argument("--verifier", choices=("auto", "cupy", "host"), default="auto",
                        help="check frames with CuPy on the GPU, or copy them to the host (default auto: CuPy "
                             "when it imports)")
    parser.add_argument("--read-delay", type=consumer.non_negative_float, default=0.0,
                        help="seconds to sleep after reading each frame, before releasing it (default 0)")
    parser.add_argument("--stall-after", type=consumer.non_negative_int, default=None,
                        help="release only the first N frames; hold every later one (wait for eviction)")
    parser.add_argument("--self-test", action="store_true",
                        help="check the pattern against docs/kernels.md's vectors and exit (no GPU needed)")
    args = parser.parse_args(argv)
    if not args.self_test and not args.socket:
        parser.error("--socket is required (or --self-test)")
    return args


def main(argv=None):
    """Entry point: CUDA first (before connecting), then consumer.py's run with the CUDA importer."""
    args = parse_args(argv)
    if args.self_test:
        return self_test()
    device = None
    try:
        drv = Driver(load_cuda_bindings())
        device = CudaDevice(drv, args.verifier)
        device.prepare_if_single()
        return consumer.run(args, CudaImport(device, WANTED_BACKEND[args.backend]))
    except ConsumerError as err:
        print(f"cuda_consumer: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except OSError as err:
        print(f"cuda_consumer: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        if device is not None:
            device.close()


if __name__ == "__main__":
    sys.exit(main())
