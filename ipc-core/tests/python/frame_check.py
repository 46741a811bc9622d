"""How cuda_consumer.py checks frames: the frame check pattern of docs/kernels.md (with its self-test against the
doc's vectors) and the two verifiers that apply it, on the GPU through CuPy or on pinned host copies (split out of
cuda_consumer.py, which imports and reads the frames)."""

import ctypes
import json
import os
import re
import struct
import sys

SAMPLE_WORDS = 4096  # words checked per frame by the pure-Python host verifier
RUN_AHEAD_MAX = 32  # gpu-stream-ops: at most this many frames queued on our stream and not yet counted (ours)
HOST_COPY_BYTES = 128 << 20  # gpu-stream-ops with the host verifier: pinned copies of the frames in flight, at most


def log(text):
    """A message on stderr."""
    print(f"cuda_consumer: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# The frame check pattern (docs/kernels.md, "The frame check pattern")
# ---------------------------------------------------------------------------------------------------------------

U32 = 0xFFFFFFFF
INDEX_MULTIPLIER = 0x9E3779B1
SEQ_MULTIPLIER = 0x85EBCA6B
PATTERN_XOR = 0xA5A5A5A5


def seq_term(seq):
    """`(u32)seq * 0x85EBCA6B ^ 0xA5A5A5A5`, wrapping in 32 bits: only the low 32 bits of seq count."""
    return (((seq & U32) * SEQ_MULTIPLIER) & U32) ^ PATTERN_XOR


def pattern_word(seq, index):
    """Word `index` of frame `seq`: x = (u32)index * 0x9E3779B1 ^ (u32)seq * 0x85EBCA6B ^ 0xA5A5A5A5; x ^ (x >> 16)."""
    x = (((index & U32) * INDEX_MULTIPLIER) & U32) ^ seq_term(seq)
    return x ^ (x >> 16)


def index_term(xp, indices):
    """`(u32)index * 0x9E3779B1` for an array of indices, with `xp` numpy or cupy (uint32 products wrap)."""
    return xp.asarray(indices, dtype=xp.uint32) * xp.uint32(INDEX_MULTIPLIER)


def expected_words(xp, index_terms, seq):
    """The pattern of frame `seq` at the indices whose `index_term` is given."""
    x = index_terms ^ xp.uint32(seq_term(seq))
    return x ^ (x >> xp.uint32(16))


# The table of docs/kernels.md, as it read when this was written; --self-test prefers the doc's own table.
EMBEDDED_VECTORS = [
    (0, 0, 0xA5A50000), (0, 1, 0x3B92E786), (1, 0, 0x204E4F80), (1, 1, 0xBE79A806), (2, 3, 0x74D428B4),
    (7, 1000, 0x04647244), (123456789, 4095, 0xD2BEA893), (4294967296, 0, 0xA5A50000), (4294967301, 17, 0xB990FCE3),
]
KERNELS_MD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "docs", "kernels.md")
VECTOR_ROW = re.compile(r"^\|\s*(\d+)(?:\s*\([^)]*\))?\s*\|\s*(\d+)\s*\|\s*`(0x[0-9A-Fa-f]{8})`")


def kernels_md_vectors(path=None):
    """(seq, index, pattern) rows of the table in docs/kernels.md's "The frame check pattern", or None when the
    file is not there (the script copied elsewhere)."""
    try:
        with open(path or KERNELS_MD, encoding="utf-8") as doc:
            text = doc.read()
    except OSError:
        return None
    section = text.split("## The frame check pattern", 1)[-1]
    rows = []
    for line in section.splitlines():
        match = VECTOR_ROW.match(line)
        if match:
            rows.append((int(match.group(1)), int(match.group(2)), int(match.group(3), 16)))
    return rows


def self_test():
    """Checks the pattern (pure Python, numpy and CuPy where they import) against docs/kernels.md's vectors;
    prints one JSON line; 0 when every check that could run passed."""
    vectors = kernels_md_vectors()
    source = "docs/kernels.md"
    if vectors is None:
        vectors, source = EMBEDDED_VECTORS, "embedded copy (docs/kernels.md not found)"
    failures = []
    if not vectors:
        failures.append("no vectors found in docs/kernels.md's table")
    for seq, index, want in vectors:
        got = pattern_word(seq, index)
        if got != want:
            failures.append(f"python: pattern({seq}, {index}) = {got:#010x}, the doc says {want:#010x}")
    results = {"python": "passed"}

    def check_arrays(name, xp, to_host):
        for seq, index, want in vectors:
            got = int(to_host(expected_words(xp, index_term(xp, [index]), seq))[0])
            if got != want:
                failures.append(f"{name}: pattern({seq}, {index}) = {got:#010x}, the doc says {want:#010x}")
        results[name] = "failed" if any(f.startswith(name) for f in failures) else "passed"

    try:
        import numpy
    except ImportError:
        results["numpy"] = "not installed"
    else:
        check_arrays("numpy", numpy, lambda a: a)
    try:
        import cupy
    except ImportError:
        results["cupy"] = "not installed"
    else:
        try:
            check_arrays("cupy", cupy, cupy.asnumpy)
        except Exception as err:  # no GPU, no driver: CuPy imports but cannot run
            results["cupy"] = f"not run: {type(err).__name__}: {err}".splitlines()[0]
    results["python"] = "failed" if any(f.startswith("python") for f in failures) else "passed"
    for failure in failures:
        log(failure)
    print(json.dumps({"self_test": "failed" if failures else "passed", "vectors": len(vectors), "source": source,
                      **results}), flush=True)
    return 1 if failures else 0



# ---------------------------------------------------------------------------------------------------------------
# Verifiers: the pattern checked on the GPU (CuPy) or on pinned host copies
# ---------------------------------------------------------------------------------------------------------------


class CupyVerifier:
    """Checks a frame in place with CuPy, on our stream (CuPy's external stream over our CUstream, so that CuPy's
    kernels are ordered with the driver calls we queue there). Each frame's count of mismatched words is copied
    (cuMemcpyDtoHAsync, on the same stream) into its own word of a pinned host buffer, read once the stream has
    passed it: reading it never makes the CPU synchronise with the stream."""

    name = "cupy"

    def __init__(self, cupy, ordinal, stream, drv):
        self.cp = cupy
        self.ordinal = ordinal
        self.drv = drv
        self.raw_stream = stream
        self.device = cupy.cuda.Device(ordinal)
        self.stream = cupy.cuda.ExternalStream(int(stream), ordinal)
        self.terms = None  # index_term of 0 .. n_words, made at the first frame
        self.counts = None  # pinned host buffer: one int64 count per frame in flight
        self.depth = 0

    @staticmethod
    def max_depth(frame_bytes):
        """Frames it can have in flight: a count word each, so no limit of its own."""
        del frame_bytes
        return RUN_AHEAD_MAX

    def prepare(self, frame_bytes, depth):
        """A pinned count word for each of `depth` frames in flight."""
        del frame_bytes
        if self.counts is None or self.depth < depth:
            self.close()
            self.counts = int(self.drv.call("cuMemAllocHost", 8 * depth))
            self.depth = depth

    def warm_up(self):
        """Compile (or load from CuPy's cache) the kernels the check uses, before any frame waits for them."""
        cp = self.cp
        with self.device, self.stream:
            words = cp.zeros(1024, dtype=cp.uint32)
            check = words != expected_words(cp, index_term(cp, cp.arange(1024, dtype=cp.uint32)), 1)
            int(cp.count_nonzero(check).astype(cp.int64, copy=False))  # nothing else is queued yet

    def start(self, ptr, n_words, seq, k=0):
        """Queue the check of `n_words` words at device address `ptr` on our stream, its count into word `k`;
        returns what `finish` reads."""
        cp = self.cp
        with self.device, self.stream:
            if self.terms is None or self.terms.size != n_words:
                self.terms = index_term(cp, cp.arange(n_words, dtype=cp.uint32))
            memory = cp.cuda.UnownedMemory(ptr, n_words * 4, self, device_id=self.ordinal)
            words = cp.ndarray((n_words,), dtype=cp.uint32, memptr=cp.cuda.MemoryPointer(memory, 0))
            count = cp.count_nonzero(words != expected_words(cp, self.terms, seq)).astype(cp.int64, copy=False)
        self.drv.call("cuMemcpyDtoHAsync", self.counts + 8 * k, count.data.ptr, 8, self.raw_stream)
        return k, count  # the device count stays referenced until it is read

    def finish(self, pending):
        """The count, once the stream has passed the check and its copy."""
        k, _count = pending
        return ctypes.c_int64.from_address(self.counts + 8 * k).value

    def close(self):
        """Drop the cached index terms, free the count words."""
        self.terms = None
        if self.counts is not None:
            self.drv.try_call("cuMemFreeHost", self.counts)
            self.counts = None
            self.depth = 0


class HostCopyVerifier:
    """Copies a frame to pinned host memory on our stream, then checks every word with numpy or a sample in pure
    Python."""

    def __init__(self, drv, stream, numpy):
        self.drv = drv
        self.stream = stream
        self.np = numpy
        self.name = "host-copy-numpy" if numpy is not None else "host-copy-python-sample"
        self.host = None  # pinned buffer address: one frame's copy per frame in flight
        self.host_bytes = 0
        self.frame_bytes = 0
        self.terms = None

    @staticmethod
    def max_depth(frame_bytes):
        """Frames it can have in flight: as many pinned copies as fit in HOST_COPY_BYTES, at least one."""
        return max(1, HOST_COPY_BYTES // max(1, frame_bytes))

    def prepare(self, frame_bytes, depth):
        """A pinned buffer for `depth` frames."""
        if self.host is None or self.host_bytes < frame_bytes * depth:
            self.close()
            self.host = int(self.drv.call("cuMemAllocHost", frame_bytes * depth))
            self.host_bytes = frame_bytes * depth
        self.frame_bytes = frame_bytes

    def warm_up(self):
        """Nothing to compile."""

    def start(self, ptr, n_words, seq, k=0):
        """Queue the copy of the frame into copy `k`; returns (n_words, seq, its address)."""
        host = self.host + k * self.frame_bytes
        self.drv.call("cuMemcpyDtoHAsync", host, ptr, n_words * 4, self.stream)
        return n_words, seq, host

    def finish(self, pending):
        """Check the copy (the stream has passed it)."""
        n_words, seq, host = pending
        buffer = (ctypes.c_char * (n_words * 4)).from_address(host)
        if self.np is not None:
            np = self.np
            if self.terms is None or self.terms.size != n_words:
                self.terms = index_term(np, np.arange(n_words, dtype=np.uint32))
            words = np.frombuffer(buffer, dtype="<u4", count=n_words)
            return int(np.count_nonzero(words != expected_words(np, self.terms, seq)))
        step = max(1, n_words // SAMPLE_WORDS)
        indices = sorted(set(range(0, n_words, step)) | {n_words - 1}) if n_words else []
        return sum(1 for i in indices if struct.unpack_from("<I", buffer, 4 * i)[0] != pattern_word(seq, i))

    def close(self):
        """Free the pinned buffer."""
        if self.host is not None:
            self.drv.try_call("cuMemFreeHost", self.host)
            self.host = None
