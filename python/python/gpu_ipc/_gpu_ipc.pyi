"""Stubs of the native module ``gpu_ipc._gpu_ipc`` (checked against it in CI with ``mypy.stubtest``).

Streams: every ``stream=`` argument takes ``None``, an ``int`` (a raw ``CUstream`` handle), or an object that names
one: anything with ``__cuda_stream__`` (cuda.core; returns ``(version, handle)``), a ``.cuda_stream`` attribute
(``torch.cuda.Stream``) or a ``.ptr`` attribute (``cupy.cuda.Stream``). With a GPU backend, ``None`` means the CUDA
legacy default stream (handle ``1``), the one PyTorch and CuPy use unless told otherwise. The GPU-side strategies
(``gpu-stream-ops``, ``gpu-poll``) queue their waits and publishes on that stream and return at once: order your work
on the same stream (or pass yours). The handle must be a live stream of the device's primary context (the one
PyTorch, CuPy and JAX use). The host backend ignores streams.

Blocking calls release the GIL; CPU waits run in slices of 50 ms and look for signals between them, so Ctrl-C
raises ``KeyboardInterrupt`` during a wait. Objects may be used from any thread (one call at a time each). After
``fork()``, the child must make its own producer or consumer: the parent's raise ``GpuIpcError`` there. With a GPU
the child must be a new process, not a fork of one that used CUDA (CUDA does not work there:
``CUDA_ERROR_NOT_INITIALIZED``): start it with ``multiprocessing.get_context("spawn")`` (or ``"forkserver"``) or
``subprocess``.
"""

import os
import pathlib
from collections.abc import Sequence
from typing import Any, Literal, Protocol, final

from typing_extensions import Self

from gpu_ipc._errors import (
    GpuIpcError as GpuIpcError,
    ArgumentError as ArgumentError,
    ArgumentTypeError as ArgumentTypeError,
    ProducerGone as ProducerGone,
    PeerGone as PeerGone,
    Evicted as Evicted,
    Timeout as Timeout,
    GpuWaitGaveUp as GpuWaitGaveUp,
    AdmissionError as AdmissionError,
    EndOfStream as EndOfStream,
    ForeignToken as ForeignToken,
    ConfigError as ConfigError,
    StrategyUnavailable as StrategyUnavailable,
    Refused as Refused,
    BackendError as BackendError,
    DriverError as DriverError,
    NoDriver as NoDriver,
    RingError as RingError,
    WireError as WireError,
    NoProducer as NoProducer,
    ReleasedError as ReleasedError,
    ClosedError as ClosedError,
    NoOwner as NoOwner,
    OwnerGone as OwnerGone,
    PosterDied as PosterDied,
    SemaphoreClosed as SemaphoreClosed,
    NotFound as NotFound,
    StaleBuffer as StaleBuffer,
    NameTaken as NameTaken,
    PoolFull as PoolFull,
)

__all__ = [
    "AdmissionError",
    "ArgumentError",
    "ArgumentTypeError",
    "BackendError",
    "BufferView",
    "ClosedError",
    "ConfigError",
    "Consumer",
    "DriverError",
    "EndOfStream",
    "Evicted",
    "ForeignToken",
    "Frame",
    "GenerationWait",
    "GpuIpcError",
    "GpuWaitGaveUp",
    "LEGACY_DEFAULT_STREAM",
    "STAMP_MASK",
    "NameTaken",
    "NoDriver",
    "NoOwner",
    "NoProducer",
    "NotFound",
    "OwnerGone",
    "Pattern",
    "PeerGone",
    "PoolFull",
    "PoolImporter",
    "PosterDied",
    "Producer",
    "ProducerGone",
    "Refused",
    "ReleasedError",
    "RingError",
    "Semaphore",
    "SemaphoreClosed",
    "SemaphoreWait",
    "SharedBuffer",
    "SharedPool",
    "Slot",
    "StaleBuffer",
    "Stamp",
    "StrategyUnavailable",
    "Timeout",
    "WeightsBound",
    "WeightsOwner",
    "WeightsReader",
    "WeightsTensor",
    "WireError",
    "__version__",
    "_weights_read_sources",
    "_weights_runs",
    "default_sync",
    "sharing_backend",
    "sync_strategies",
]

__version__: str
LEGACY_DEFAULT_STREAM: int
"""``CU_STREAM_LEGACY`` (1): the stream a GPU backend uses when a call is given none."""
STAMP_MASK: int
"""``2**62 - 1``: the bits of a frame's stamp word that name the frame (``Frame.stamp_ptr``)."""

class _CudaStreamProtocol(Protocol):
    def __cuda_stream__(self) -> tuple[int, int]: ...

_StreamLike = int | _CudaStreamProtocol | Any | None

@final
class Producer:
    """The producing end of a frame ring: publishes frames into ``slots`` slots of one shared allocation.

    ``backend``: ``"vmm"`` (default), ``"legacy"`` or ``"host"`` (shared host memory, no GPU needed).
    ``sync``: ``"gpu-stream-ops"`` (default on a GPU: the GPU waits, no CPU per frame), ``"ipc-event"``,
    ``"cpu-spin"`` (default with ``backend="host"``), ``"cpu-sleep"``, or ``"gpu-poll"`` (MPS only).
    ``format``: ``rgb8`` (default), ``rgba8``, ``bgra8``, ``gray8``, ``gray16``, ``rgbaf16``, ``rgbaf32``; frames
    are ``(height, width, channels)`` arrays (``width`` 3840 and ``height`` 2160 by default). Or slots of any tensor:
    ``shape=(8, 1024, 1024), dtype="float16"`` (contiguous; ``dtype`` is a NumPy / PyTorch name, ``uint8`` by default,
    and ``width``, ``height``, ``format`` are then not given).

    Example::

        with gpu_ipc.Producer("/tmp/frames.sock", width=64, height=32, backend="host") as producer:
            producer.wait_for_consumers(1, timeout=10)
            slot = producer.acquire()
            numpy.from_dlpack(slot)[:] = 7     # writes the slot in place
            producer.publish(slot)
            producer.drain(timeout=5)
        # leaving the block closes the ring: consumers get every frame, then the end of the stream
    """

    def __new__(
        cls,
        socket: str | os.PathLike[str],
        width: int | None = None,
        height: int | None = None,
        format: str | None = None,
        slots: int = 4,
        sync: str | None = None,
        backend: str = "vmm",
        device: int = 0,
        max_consumers: int = 16,
        shape: Sequence[int] | None = None,
        dtype: str | None = None,
    ) -> Producer: ...
    def acquire(self, timeout: float = 1.0, stream: _StreamLike = None) -> Slot:
        """Waits until the next frame's slot is free (every live consumer released what it held) and returns it.

        With a GPU-side strategy the wait is queued on ``stream`` and this returns at once. Raises ``Timeout``.
        """
    def acquire_after(self, slot: Slot, timeout: float = 1.0, stream: _StreamLike = None) -> Slot:
        """Waits until the slot of the frame after ``slot``'s is free and returns it, while ``slot`` is still held: a
        producer may hold the next frame and up to ``slots - 1`` more at once (written in parallel or out of order),
        and publishes them in order (``publish`` refuses a frame before the ones it follows). Strategies whose
        waits are on the CPU (``cpu-spin``, ``cpu-sleep``, ``ipc-event``) only, for now. Raises ``Timeout``;
        ``ConfigError`` when that frame would take the slot of one this producer still holds, or for a GPU-side
        strategy; ``ForeignToken`` for another producer's slot; ``ReleasedError`` for a slot already published."""
    def publish(self, slot: Slot, stream: _StreamLike = None) -> None:
        """Publishes ``slot`` once the work queued on ``stream`` (default: the stream ``acquire`` used) is done.

        Also once the work queued so far on every other stream that took the slot through ``__dlpack__`` is done
        (those streams must still exist). A slot is published once: again raises ``ReleasedError``; another
        producer's raises ``ForeignToken``.
        """
    def wait_for_consumers(self, count: int = 1, timeout: float = 30.0) -> None:
        """Admits consumers until ``count`` are attached; raises ``Timeout`` after ``timeout`` seconds."""
    def drain(self, timeout: float = 10.0, stream: _StreamLike = None) -> None:
        """Waits until every live consumer released every published frame: the end of a run."""
    def consumers(self) -> int:
        """Consumers attached and alive."""
    def consumers_lost(self) -> int:
        """Consumers that vanished without detaching (killed, crashed)."""
    @property
    def next_sequence(self) -> int:
        """The sequence number the next ``acquire`` returns."""
    def close(self) -> None:
        """Closes the ring (waits, bounded, for the stream's work on it): consumers read the frames published,
        then get ``EndOfStream``. Slots not published are lost. Idempotent."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...
    @property
    def backend(self) -> str:
        """The backend's name: ``"legacy"``, ``"vmm"`` or ``"host"``."""
    @property
    def sync(self) -> str:
        """The ring's sync strategy."""
    @property
    def socket(self) -> pathlib.Path:
        """The rendezvous socket's path."""
    @property
    def slots(self) -> int:
        """The number of slots in the ring."""
    @property
    def device(self) -> int | None:
        """The CUDA device ordinal; ``None`` with the host backend."""
    @property
    def shape(self) -> tuple[int, ...]:
        """What each slot is as an array: ``(height, width, channels)`` of a pixel frame, the tensor's shape in a
        ring of tensors, ``(nbytes,)`` in a ring of bare bytes."""
    @property
    def dtype(self) -> str:
        """The element type's NumPy name (``"uint8"`` for the 8-bit formats)."""
    @property
    def nbytes(self) -> int:
        """Bytes in one slot."""

@final
class Slot:
    """The right to write one slot, then publish it once (``Producer.publish``).

    Read and write it in place as a tensor: ``torch.from_dlpack(slot)``, ``cupy.from_dlpack(slot)``,
    ``numpy.from_dlpack(slot)`` (host backend). Once published, this object raises ``ReleasedError`` on ``ptr``
    and the array protocols; tensors already made from it are the caller's responsibility: do not write them
    after ``publish``. Such a tensor never points at freed memory: it (and this object) keeps the ring's allocation
    alive in this process, even after the producer closed, until the last of them is gone.
    """

    @property
    def seq(self) -> int:
        """The frame's sequence number (0, 1, 2, ...)."""
    @property
    def slot(self) -> int:
        """The slot index in the ring."""
    @property
    def nbytes(self) -> int: ...
    @property
    def ptr(self) -> int:
        """The slot's address (device address on a GPU, host address with the host backend)."""
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def stream(self) -> int | None:
        """The stream ``acquire`` queued its wait on (GPU backends)."""
    @property
    def published(self) -> bool: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the memory, no copy; the consumer's ``stream`` is ordered after the stream the
        memory is ready on."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, ordinal)`` (kDLCUDA) on a GPU, ``(1, 0)`` (kDLCPU) in host memory."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, with ``stream``; absent (``AttributeError``) in host memory."""

@final
class Consumer:
    """The consuming end of a frame ring: attaches once, then reads frames in place, in order.

    ``wait_for_producer``: seconds to wait for the producer's socket to appear (default 0: fail at once with
    ``NoProducer``). ``timeout``: bound on the handshake, and on each frame's wait when iterating.

    Example::

        with gpu_ipc.Consumer("/tmp/frames.sock", backend="host", wait_for_producer=10) as consumer:
            for frame in consumer:                 # stops cleanly at the end of the stream
                image = numpy.from_dlpack(frame)   # (height, width, channels), no copy
                print(frame.seq, image[0, 0])
                # the frame is released when the next one is asked for

        # or by hand:
        with consumer.next_frame(timeout=1.0) as frame:
            use(torch.from_dlpack(frame))
        # released here
    """

    def __new__(
        cls,
        socket: str | os.PathLike[str],
        backend: str = "vmm",
        name: str = "consumer",
        device: int = 0,
        wait_for_producer: float = 0.0,
        timeout: float = 5.0,
    ) -> Consumer: ...
    def next_frame(self, timeout: float = 1.0, stream: _StreamLike = None) -> Frame:
        """The next frame. CPU strategies return when it is published; GPU-side ones queue the wait on ``stream``.

        Raises ``EndOfStream`` after the last frame of a closed ring, ``ProducerGone`` when the producer died,
        ``Evicted``, ``Timeout``. Ctrl-C during the wait raises ``KeyboardInterrupt`` (within about 50 ms; gpu-poll:
        when the wait returns); a frame found as it came is given back unread, never returned.
        """
    def release(self, frame: Frame, stream: _StreamLike = None) -> None:
        """Gives ``frame`` back once the work on ``stream`` (default: the stream ``next_frame`` used) read it.

        The release also waits for the work queued so far on every other stream that took the frame through
        ``__dlpack__`` (``torch.from_dlpack(frame)`` under another current stream): those streams must still exist.
        Work on a stream that took the frame through ``__cuda_array_interface__`` is not tracked: pass that stream.
        Twice raises ``ReleasedError``; another consumer's frame raises ``ForeignToken``.
        """
    def __iter__(self) -> Self: ...
    def __next__(self) -> Frame:
        """The next frame (waiting up to ``timeout``), releasing the one iteration handed out before it if the
        caller did not; stops at the end of the stream (the ``EndOfStream`` is kept in ``end``)."""
    @property
    def end(self) -> EndOfStream | None:
        """The ``EndOfStream`` that ended this consumer's stream, once it did: what stopped its iteration (a ``for``
        loop over it ends without one), or what ``next_frame`` or ``release`` raised. Read ``.published`` (the
        frames the producer published: keep what was computed from frames with ``seq`` below it) and ``.past_end``
        there. ``None`` until the end was seen.

        Example::

            for frame in consumer:
                ...
            assert consumer.end is not None and consumer.end.published == frames_seen
        """
    def detach(self) -> None:
        """Leaves the ring cleanly and tells the producer. Frames held become invalid. Idempotent. With a GPU-side
        strategy it waits at most 0.2 s (none after Ctrl-C) for the stream to pass the waits queued on the ring;
        a stream a quiet producer still holds is left to a background thread to finish the teardown."""
    def close(self) -> None:
        """As ``detach`` without the message. Idempotent."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...
    @property
    def next_sequence(self) -> int: ...
    @property
    def backend(self) -> str:
        """The backend's name: ``"legacy"``, ``"vmm"`` or ``"host"``."""
    @property
    def sync(self) -> str:
        """The ring's sync strategy."""
    @property
    def socket(self) -> pathlib.Path:
        """The rendezvous socket's path."""
    @property
    def slots(self) -> int:
        """The number of slots in the ring."""
    @property
    def device(self) -> int | None:
        """The CUDA device ordinal; ``None`` with the host backend."""
    @property
    def shape(self) -> tuple[int, ...]:
        """What each slot is as an array: ``(height, width, channels)`` of a pixel frame, the tensor's shape in a
        ring of tensors, ``(nbytes,)`` in a ring of bare bytes."""
    @property
    def dtype(self) -> str:
        """The element type's NumPy name (``"uint8"`` for the 8-bit formats)."""
    @property
    def nbytes(self) -> int:
        """Bytes in one slot."""

@final
class Frame:
    """The right to read one published frame in place, until it is released.

    ``torch.from_dlpack(frame)``, ``cupy.from_dlpack(frame)``, ``jax.dlpack.from_dlpack(frame)``,
    ``numpy.from_dlpack(frame)`` (host backend): no copy. ``frame.array("torch")`` (``"cupy"``, ``"numpy"``) gives
    the same array for a fraction of the cost: the slot's array, made once, handed out again. Once the frame is
    released (or its consumer closed) the slot is the producer's again: this object raises ``ReleasedError`` on
    ``ptr``, ``array`` and the array protocols, but tensors already made from it still point at the slot and will see
    later frames: copy what you keep (``tensor.clone()``), or ``__dlpack__(copy=True)`` on the host backend. Such a
    tensor never points at unmapped memory: it (and this object) keeps the ring mapped in this process, even after
    the consumer closed, until the last of them is gone.

    A frame is writable, and it is shared: its views are the slot itself, the memory every consumer of the ring
    reads that frame from. What one consumer writes into a frame (``numpy.from_dlpack(frame)[:] = 0``, an in-place
    torch op) the others read too, if they read it after the write; nothing marks the views read-only. Treat frames
    as read-only, or copy first (``tensor.clone()``) and change the copy.
    """

    @property
    def seq(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def ptr(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def stream(self) -> int | None:
        """The stream ``next_frame`` queued its wait on (GPU backends)."""
    def array(self, library: str) -> Any:
        """This frame as an array of ``library``: ``"torch"`` (a ``torch.Tensor``), ``"cupy"`` or ``"numpy"`` (host
        backend). The same array as ``torch.from_dlpack(frame)`` (the frame in place, no copy), for a fraction of its
        cost: a slot's memory never moves, so its array is made once (through DLPack, the first time a frame of that
        slot is asked for as that library) and kept by the consumer, and each call hands out a new array object over
        it (``Tensor.detach()``, ``ndarray.view()``): what you do to your array's shape or flags in place never
        reaches the next frame.

        Streams as with ``from_dlpack``: the library's current stream (``torch.cuda.current_stream()``) is ordered
        after the stream the frame's wait was queued on (nothing to do when they are the same: pass your stream to
        ``next_frame``), and the frame's release waits for the work queued on it.

        The array is valid for this frame until the frame is released: afterwards it shows whatever the producer
        writes into the slot next (copy what you keep, ``tensor.clone()``), and the array of the slot's next frame
        is the same memory. Ask each frame for its own array: ``frame.array("torch")`` inside the loop, never one
        kept from an earlier frame. Raises ``ReleasedError`` once the frame is released or its consumer closed;
        ``ArgumentError`` for another library (JAX: its arrays are immutable; use ``jax.dlpack.from_dlpack(frame)``).

        Example::

            for frame in consumer:
                image = frame.array("torch")      # (height, width, channels) uint8 on cuda, the frame in place
                total += image.float().mean()
        """
    @property
    def stamp_ptr(self) -> int | None:
        """Device address of the frame's stamp word (gpu-stream-ops, gpu-poll; ``None`` otherwise): check it in your
        kernel before reading the frame (``(word & STAMP_MASK) == stamp_expected``, read with ld.acquire.sys); a dead
        producer's poison releases the stream's wait for a frame it never wrote. Raises ``ReleasedError`` once the
        frame is released or its consumer closed (the word is unregistered when the consumer closes)."""
    @property
    def stamp_expected(self) -> int:
        """The value the stamp word holds, under ``STAMP_MASK``, while the frame is the producer's: ``seq + 1``."""
    @property
    def stamp(self) -> Stamp:
        """The frame's stamp word as a 0-d ``int64`` array, no copy, to check on the device (no host sync) that the
        frame is the producer's before using what was computed from it::

            valid = (torch.from_dlpack(frame.stamp) & gpu_ipc.STAMP_MASK) == frame.stamp_expected

        (or ``frame.stamp.array("torch")``, the slot's word as a cached array, as ``Frame.array``). With
        gpu-stream-ops and gpu-poll the word is device-readable host memory (a CUDA tensor; ordered after the
        frame's wait like the frame); a dead producer's poison releases the stream's wait for a frame it never
        wrote, and ``valid`` is then false. With the CPU strategies, ipc-event and the host backend it is the same
        word read by the CPU (a CPU tensor, ``numpy.from_dlpack(frame.stamp)``): such a frame was seen published
        before it was handed out, and its stamp matches until its slot carries a later frame. Read the array before
        the frame is released (queue the comparison before ``release``): afterwards the word belongs to the next
        frame of the slot, and with a GPU-side strategy it is unregistered when the consumer closes. Raises
        ``ReleasedError`` once the frame is released or its consumer closed.
        """
    @property
    def released(self) -> bool: ...
    def release(self, stream: _StreamLike = None) -> None:
        """``consumer.release(self, stream)``."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the memory, no copy; the consumer's ``stream`` is ordered after the stream the
        memory is ready on."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, ordinal)`` (kDLCUDA) on a GPU, ``(1, 0)`` (kDLCPU) in host memory."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, with ``stream``; absent (``AttributeError``) in host memory."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool:
        """Releases the frame unless it was released already (or its consumer closed); the end of the stream found by
        the release (a frame queued past the end) is not an error here."""

@final
class Stamp:
    """A frame's stamp word, as an array (``Frame.stamp``): ``torch.from_dlpack(frame.stamp)``,
    ``cupy.from_dlpack(frame.stamp)``, ``numpy.from_dlpack(frame.stamp)`` give a 0-d ``int64`` view of it, no copy
    (``frame.stamp.array("torch")`` the same, cached per slot). ``(view & STAMP_MASK) == frame.stamp_expected`` says
    whether the frame is the producer's.
    """

    @property
    def expected(self) -> int:
        """``frame.stamp_expected``: the value the word holds, under ``STAMP_MASK``, while the frame is the producer's."""
    @property
    def ptr(self) -> int:
        """The word's address: a device address with gpu-stream-ops and gpu-poll (``Frame.stamp_ptr``), else a host
        address. Raises ``ReleasedError`` once the frame is released or its consumer closed."""
    def array(self, library: str) -> Any:
        """The word as an array of ``library`` (``"torch"``, ``"cupy"``, ``"numpy"``), as ``Frame.array``: the slot's
        word is made an array once and handed out again, ordered on the library's current stream after the frame's
        wait. A CUDA tensor with gpu-stream-ops and gpu-poll, a CPU one otherwise (as ``from_dlpack(frame.stamp)``).
        Valid until the frame is released (then it is the slot's next frame's word). Raises ``ReleasedError`` once
        the frame is released or its consumer closed.

        Example::

            valid = (frame.stamp.array("torch") & gpu_ipc.STAMP_MASK) == frame.stamp_expected  # a CUDA bool
        """
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the memory, no copy; the consumer's ``stream`` is ordered after the stream the
        memory is ready on."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, ordinal)`` (kDLCUDA) on a GPU, ``(1, 0)`` (kDLCPU) in host memory."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, with ``stream``; absent (``AttributeError``) in host memory."""

@final
class Semaphore:
    """A cross-process counting semaphore: posts from any process that attached, waits on the CPU or on a CUDA stream.

    ``Semaphore.create(socket, initial=0)`` makes one and serves it at ``socket`` (this process is its owner: closing
    it ends the semaphore for everyone); ``Semaphore(socket)`` attaches to one. ``backend``: ``"vmm"`` or
    ``"legacy"`` (a GPU: stream posts and waits on ``device``'s primary context) or ``"host"`` (CPU posts and waits
    only). A peer becomes a poster with its first post: a peer that has posted and dies without closing poisons the
    semaphore (``dead_poster="poison"``, the default at ``create``): every waiter, and every newcomer, gets
    ``PosterDied``, since posts it owed may never come, until the owner calls ``reset()``. With
    ``dead_poster="ignore"`` the semaphore goes on. A peer that never posted breaks nothing by dying (``posts=False``
    is no longer needed; it is kept, and makes ``post`` refuse).

    Example::

        # process A
        with gpu_ipc.Semaphore.create("/tmp/ready.sock", backend="host") as ready:
            ...
            ready.post()                    # one more post
        # process B
        with gpu_ipc.Semaphore("/tmp/ready.sock", backend="host", wait_for_owner=10) as ready:
            ready.wait(timeout=5)           # takes one post, or raises Timeout

    On a GPU, ``post(stream=s)`` adds the post once the work queued on ``s`` before it is done, and
    ``wait_on(s)`` makes ``s`` wait for a post (the CPU returns at once) and returns the wait; ``wait_status(wait)``
    then says whether a post released it, or raises when the semaphore ended and released it without one (discard
    that work).
    """

    def __new__(
        cls,
        socket: str | os.PathLike[str],
        backend: str = "vmm",
        device: int = 0,
        name: str = "semaphore-peer",
        posts: bool = True,
        timeout: float = 5.0,
        wait_for_owner: float = 0.0,
    ) -> Semaphore: ...
    @staticmethod
    def create(
        socket: str | os.PathLike[str],
        initial: int = 0,
        backend: str = "vmm",
        device: int = 0,
        dead_poster: Literal["poison", "ignore"] = "poison",
    ) -> Semaphore:
        """Creates a semaphore holding ``initial`` posts and serves it at ``socket``; this process is its owner.
        ``dead_poster``: what the death of a peer that has posted does, ``"poison"`` (the default: the semaphore
        breaks until ``reset()``) or ``"ignore"`` (it goes on)."""
    def post(self, count: int = 1, stream: _StreamLike = None) -> None:
        """Adds ``count`` posts: now, from the CPU; or, with ``stream``, once the work queued on it before is done
        (the call returns at once)."""
    def wait(self, timeout: float = 1.0) -> None:
        """Waits up to ``timeout`` seconds, on the CPU, for a post and takes it; a wait that times out takes nothing.

        Raises ``Timeout``, or ``PosterDied``, ``OwnerGone``, ``SemaphoreClosed`` as soon as the semaphore ends.
        """
    def try_wait(self) -> bool:
        """Takes a post if one is there, without waiting."""
    def wait_on(self, stream: _StreamLike) -> SemaphoreWait:
        """Makes ``stream`` wait for a post (its later work runs once one is taken for it) and returns at once: the
        wait, for ``wait_status``."""
    def wait_status(self, wait: SemaphoreWait) -> bool:
        """Whether the stream wait ``wait`` was released by a post (``False``: not yet). Raises the error that ended
        the semaphore when that released it instead (the work queued after it ran without a post: discard it)."""
    @property
    def value(self) -> int:
        """Posts not yet taken, minus stream waits still waiting (negative when streams wait for posts)."""
    def check(self) -> None:
        """Raises the error that ended the semaphore, if it ended (``PosterDied``, ``OwnerGone``, ``SemaphoreClosed``)."""
    def reset(self) -> int:
        """The owner's: makes a semaphore a dead poster poisoned work again, for every peer, and returns its value
        afterwards. Posts made before the death and not taken are kept; stream waits the poison released count as
        served (``value`` becomes ``max(0, posts - takes)``). An open semaphore is left as it is."""
    @property
    def owner(self) -> bool:
        """Whether this process created it (and closing it ends it for everyone)."""
    @property
    def socket(self) -> pathlib.Path: ...
    def close(self) -> None:
        """Detaches (an importer) or closes the semaphore for everyone (the owner). Idempotent."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

@final
class SemaphoreWait:
    """A stream wait queued by ``Semaphore.wait_on``: ask ``Semaphore.wait_status`` how it was released."""

    @property
    def ticket(self) -> int:
        """The wait's ticket: post number ``ticket + 1`` releases it."""
    @property
    def status_word(self) -> int:
        """The device address of the word that says how the wait was released, for kernels queued after it: a post
        released it iff ``(word & ((1 << 62) - 1)) > ticket`` (``released_by_post``). Read-only for kernels."""
    def released_by_post(self, word: int) -> bool:
        """Whether ``word`` (the value read at ``status_word``) says a post, not the poison, released this wait."""

@final
class SharedPool:
    """The owner of a pool of named buffers, served at ``socket``: other processes find each buffer by name
    (``gpu_ipc.open`` or ``PoolImporter``) and read it in place, with no copy.

    ``share(tensor, name)`` shares memory another allocator made, in place: a PyTorch CUDA tensor (its caching
    allocator's ``cuMemAlloc`` memory with ``backend="legacy"``; with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
    its ``cuMemCreate`` memory with ``backend="vmm"``), a CuPy array, anything with ``__cuda_array_interface__``, or on
    the host backend a NumPy view of memory the host backend allocated. ``alloc(name, shape, dtype)`` allocates a
    buffer in the pool's own memory (``capacity`` bytes; 0, the default, makes a pool that only shares). Usually made
    for you by ``gpu_ipc.share``.

    Example::

        pool = gpu_ipc.SharedPool("/tmp/weights.sock", backend="legacy")
        weights = torch.randn(4096, 4096, device="cuda")
        shared = pool.share(weights, "weights/layer0")   # importers find it by name from now on
        ...
        shared.free()                                     # no longer found; the tensor is kept while importers view it

    A shared object is let go (given back to its allocator) only once its buffer is freed, no importer views it and
    the GPU work queued on it when it was freed has finished: checked at every ``share``, ``alloc``, ``free`` and
    ``reclaim``. Closing the pool frees what it shares; objects importers still view then are kept for the life of
    the process.
    """

    def __new__(
        cls, socket: str | os.PathLike[str], backend: str = "vmm", device: int = 0, capacity: int = 0
    ) -> SharedPool: ...
    def share(self, obj: Any, name: str) -> SharedBuffer:
        """Shares ``obj``'s memory in place under ``name`` (no copy) and returns the owner's handle on it. The pool
        keeps a reference to ``obj`` until the buffer is freed and no importer views it, so its allocator does not
        hand the memory to another tensor meanwhile; write it only when the importers expect it."""
    def alloc(self, name: str, shape: Sequence[int], dtype: str = "uint8") -> SharedBuffer:
        """Allocates a buffer of ``shape`` and ``dtype`` (contiguous) in the pool's own memory, named ``name``; fill it
        through its views (``torch.from_dlpack(buffer)``)."""
    def reclaim(self) -> int:
        """Gives back the bytes of freed buffers no importer views any more (and lets go of their shared objects);
        returns how many. ``share``, ``alloc`` and ``free`` do this too."""
    @property
    def backend(self) -> str: ...
    @property
    def socket(self) -> pathlib.Path: ...
    def close(self) -> None:
        """Closes the pool: importers find nothing new (``OwnerGone``); views they hold stay valid. Shared objects are
        let go as ``free`` lets them go, but those importers still view are kept for the life of the process.
        Idempotent."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

@final
class SharedBuffer:
    """The owner's handle on a buffer of its pool: ``free()`` it (or leave the ``with`` block) to stop sharing it.

    A buffer made by ``SharedPool.alloc`` is read and written through its views (``torch.from_dlpack(buffer)``,
    ``__cuda_array_interface__``); one made by ``share`` is the object that was shared (``.source``). After ``free``
    importers no longer find it by name, and its bytes are reused only once no importer views it, no tensor made from
    it here lives and the GPU work queued on it has finished (a shared object is let go then).
    """

    @property
    def name(self) -> str: ...
    @property
    def generation(self) -> int:
        """Tells this buffer from an earlier or later one of the same name."""
    @property
    def nbytes(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def source(self) -> Any:
        """The object shared with ``SharedPool.share``, while the pool holds it: until it is freed and no importer views
        it (``None`` for an allocated buffer, or once let go)."""
    @property
    def freed(self) -> bool: ...
    def free(self, stream: Any = None) -> None:
        """Stops sharing: importers no longer find it by name, at once. Its bytes are reused (a shared object is let go)
        only once no importer views it, no tensor made from it in this process lives, and the GPU work queued on it
        has finished: with ``stream=None`` this waits for the device's queued work (every stream); with a stream (an
        int handle, or an object with ``__cuda_stream__``, ``.cuda_stream`` or ``.ptr``) it does not wait, and the
        bytes wait for the work queued on that stream so far. Twice raises ``ReleasedError``."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the memory, no copy; the consumer's ``stream`` is ordered after the stream the
        memory is ready on."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, ordinal)`` (kDLCUDA) on a GPU, ``(1, 0)`` (kDLCPU) in host memory."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, with ``stream``; absent (``AttributeError``) in host memory."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool:
        """Frees the buffer unless it was freed already."""

@final
class PoolImporter:
    """One process's attachment to a pool: finds its buffers by name, with no round trip to the owner.

    ``backend``: the pool's (``None``, the default: asked of the owner). Usually made for you by ``gpu_ipc.open``.
    """

    def __new__(
        cls,
        socket: str | os.PathLike[str],
        backend: str | None = None,
        device: int = 0,
        name: str = "pool-importer",
        timeout: float = 5.0,
        wait_for_owner: float = 0.0,
    ) -> PoolImporter: ...
    def lookup(self, name: str) -> BufferView:
        """The live buffer named ``name``, as a view pinned for as long as it (or a tensor made from it) lives: its
        bytes are not reused meanwhile, even if the owner frees it. Raises ``NotFound``, ``OwnerGone``."""
    def names(self) -> list[str]:
        """The names of the live buffers, as the pool's directory lists them now."""
    @property
    def owner_gone(self) -> bool:
        """Whether the owner closed the pool or went away (views already held stay valid)."""
    @property
    def backend(self) -> str: ...
    @property
    def socket(self) -> pathlib.Path: ...
    def close(self) -> None:
        """Detaches (views already made stay valid). Idempotent."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

@final
class BufferView:
    """A pool buffer as seen by an importer: read and write it in place as a tensor (``torch.from_dlpack(view)``,
    ``cupy.from_dlpack(view)``, ``numpy.from_dlpack(view)`` on the host backend), no copy.

    The view (and every tensor made from it) pins the buffer: its bytes are not reused, even after the owner freed
    it, until the last of them is gone; then GPU work queued so far is waited for before the pin goes. No stream
    orders it: when the bytes are ready is for the processes sharing it to agree on (a ``Semaphore``, say).
    ``release()`` gives up this object's pin; tensors made from it keep theirs.
    """

    @property
    def name(self) -> str: ...
    @property
    def generation(self) -> int:
        """The generation this view holds (a buffer freed and allocated again under its name has another)."""
    @property
    def nbytes(self) -> int: ...
    @property
    def ptr(self) -> int:
        """The address of its first byte in this process (a device address on a GPU)."""
    @property
    def shape(self) -> tuple[int, ...]:
        """Its shape as an array: ``(height, width, channels)`` of a pixel frame, else the tensor's (``(nbytes,)``
        for bare bytes)."""
    @property
    def dtype(self) -> str: ...
    def check_current(self) -> None:
        """Raises ``StaleBuffer`` once the owner freed the buffer (the view's bytes stay valid), ``ReleasedError`` after
        ``release``."""
    def release(self) -> None:
        """Gives up this object's pin (tensors made from it keep theirs). Idempotent."""
    @property
    def released(self) -> bool: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the memory, no copy; the consumer's ``stream`` is ordered after the stream the
        memory is ready on."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, ordinal)`` (kDLCUDA) on a GPU, ``(1, 0)`` (kDLCPU) in host memory."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, with ``stream``; absent (``AttributeError``) in host memory."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

@final
class Pattern:
    """The pattern every frame of the Rust example programs carries (``gpu_ipc.testing.Pattern``): word ``i`` of
    frame ``seq`` is ``mix(i * 0x9E3779B1 ^ seq * 0x85EBCA6B ^ 0xA5A5A5A5)`` (32-bit products),
    ``mix(x) = x ^ (x >> 16)``.

    ``fill`` writes it into a slot, ``verify`` checks a frame against it: on a GPU with the kernels the Rust
    ``producer`` and ``consumer`` launch (embedded in the package: no CUDA toolkit, no compiler), queued on
    ``stream`` (default: the stream the slot or frame is ready on) with no CPU synchronisation; with the host
    backend on the CPU. ``mismatches()`` waits for the device and returns the mismatched words counted so far.
    ``frames``: keep one counter per sequence below it (so that ``mismatches(below=n)`` leaves out frames queued
    past the end of a stream), instead of one for every frame.

    A frame or slot is covered whole, as the Rust programs cover it: its ``nbytes``, rows padded to the pitch
    included (a 33x7 ``rgb8`` frame is 7 rows of 100 bytes, 700 bytes, 175 words). Where the length is not a whole
    number of words (a tensor ring of odd size), the host backend writes the bytes past the last whole word as zeros
    and does not check them; the GPU kernels refuse such a length.

    Example::

        check = gpu_ipc.testing.Pattern()
        with gpu_ipc.Consumer(sock) as consumer:
            for frame in consumer:
                check.verify(frame)           # frame.seq's pattern, on frame.stream
        assert check.mismatches() == 0
    """

    def __new__(cls, frames: int | None = None) -> Self: ...
    @staticmethod
    def word(seq: int, index: int) -> int:
        """Word ``index`` of frame ``seq``'s pattern."""
    def fill(
        self, target: Slot | SharedBuffer | BufferView, seq: int | None = None, *, stream: _StreamLike = None
    ) -> None:
        """Writes frame ``seq``'s pattern (default: the slot's own sequence) into every word of ``target`` (a
        ``Slot``, or a pool buffer), queued on ``stream`` (default: the stream the slot is ready on; another stream
        is ordered after it, and the publish after that stream)."""
    def verify(
        self, target: Frame | SharedBuffer | BufferView, seq: int | None = None, *, stream: _StreamLike = None
    ) -> None:
        """Checks every word of ``target`` (a ``Frame``, or a pool buffer) against frame ``seq``'s pattern (default:
        the frame's own sequence) and adds the mismatched words to this object's count: queued on ``stream``
        (default: the stream the frame is ready on; another stream is ordered after it, and the release after that
        stream), no CPU synchronisation. Read the count with ``mismatches()``."""
    def mismatches(self, below: int | None = None) -> int:
        """The mismatched words ``verify`` counted since the last ``reset()`` (with per-frame counters: those of the
        frames with a sequence below ``below``, default all): waits for the device's queued work
        (``cuCtxSynchronize``) first."""
    def reset(self) -> None:
        """Sets the counts back to 0 (after waiting for the device)."""

def sharing_backend(obj: Any, device: int = 0) -> str:
    """The backend that shares ``obj``'s memory in place: ``"host"`` for host memory (``__array_interface__``);
    ``"legacy"`` for GPU memory from ``cuMemAlloc`` (PyTorch's default caching allocator, CuPy's); ``"vmm"``
    otherwise (``cuMemCreate``: PyTorch's ``expandable_segments:True``). ``device``: the GPU it is on."""

def sync_strategies() -> list[dict[str, str | bool]]:
    """Every sync strategy in wire-code order, as the core's descriptor (``SyncStrategy::traits``) describes it:
    ``name``, ``waits`` and ``publishes`` (``"cpu"`` or ``"gpu"``: who waits for a frame or a slot, who marks a frame
    published), ``needs_cuda``, ``needs_mps``, ``isolated_container`` (a consumer in its own IPC namespace can run
    it), ``default`` (the one default strategy where a GPU backend runs)."""

def default_sync(backend: str) -> str:
    """The strategy a ring made with ``backend`` uses when none is named: ``"gpu-stream-ops"`` where a GPU backend
    runs (the GPU waits, no MPS needed), ``"cpu-spin"`` with ``"host"``."""

def _weights_read_sources(
    tensors: dict[str, Any],
    names: list[str],
    first: int,
    kind: type,
    dtypes: list[Any],
    shapes: list[Any],
    device: int,
) -> tuple[list[int], int]:
    """``_weights_read_sources(tensors, names, first, kind, dtypes, shapes, device)``: the addresses
    ``Publisher.update`` would copy from, read the way it reads them, and the index of the first tensor that fails
    a check (``len(names)`` when none does). For tests and measurements of that step without a GPU."""

def _weights_runs(
    entries: Sequence[tuple[str, Sequence[int], Sequence[int] | None, int]],
) -> tuple[list[tuple[str, int, list[int], list[int], int, int]], list[int]]:
    """``_weights_runs(entries)``: the runs ``arena()`` gives for a manifest of ``entries`` (``(dtype, shape, strides,
    offset)`` each; strides in elements or ``None``, offsets in bytes, each a multiple of its element size), and each
    entry's place among the runs' tensors. For tests of the cut on layouts no owner makes."""

@final
class WeightsOwner:
    """The owner of a weight set (``gpu_ipc.weights.publish`` makes one): its tensors' layout is fixed when made. For
    a set on several devices (``WeightsOwner.parts``), one handle per part: each stages, copies and describes its
    part's tensors on its device; ``commit``, ``generation`` and ``close`` are the set's."""

    def __new__(
        cls,
        socket: str | os.PathLike[str],
        name: str,
        layout: Sequence[tuple[str, str, Sequence[int]]],
        backend: str = "vmm",
        device: int = 0,
        keep: int = 2,
        checksums: bool = False,
        max_arenas: int | None = None,
        max_readers: int | None = None,
    ) -> Self: ...
    @staticmethod
    def parts(
        socket: str | os.PathLike[str],
        name: str,
        layout: Sequence[tuple[str, str, Sequence[int], int]],
        devices: Sequence[int],
        backend: str = "vmm",
        keep: int = 2,
        checksums: bool = False,
        max_arenas: int | None = None,
        max_readers: int | None = None,
    ) -> list[WeightsOwner]:
        """Serves a set on several devices, one part per CUDA device of ``devices`` (part order): ``layout`` gives
        each tensor's ``(name, dtype, shape, part)`` in the publisher's order; every part holds at least one.
        Returns one handle per part. On the host backend (tests: there are no devices), ``devices`` only counts the
        parts, and their manifests name made-up distinct device UUIDs."""
    @property
    def part(self) -> int:
        """The part this handle stands for (0 for a set on one device)."""
    @property
    def generation(self) -> int:
        """The newest published generation (0 before the first commit)."""
    def stage(self) -> list[tuple[str, WeightsTensor]]:
        """Makes (or returns) the next generation's arena and returns its tensors, writable, as ``(name, view)`` pairs."""
    def stage_extent(self) -> tuple[int, int]:
        """Makes (or returns) the next generation's arena and returns where it lies, ``(address, bytes)``: what
        ``stage_arena`` gives without describing the tensors (``Publisher.stage`` keeps its cuts per arena)."""
    def stage_arena(
        self,
    ) -> tuple[WeightsTensor, tuple[list[str], list[tuple[str, int, list[int], list[int], int, int]], list[int]]]:
        """Makes (or returns) the next generation's arena and returns it whole, writable, as one ``uint8`` view, with
        its tensors as ``(names, runs, order)``: the names (layout order); the runs, ``(dtype, count, shape,
        strides, offset, step)`` each (tensors of one element type, shape and strides, ``step`` bytes apart from
        byte ``offset``; strides in elements); for each name, its place among the runs' tensors laid end to end."""
    def copy_in(self, ptrs: Sequence[int], first: int = 0, stream: Any = None) -> None:
        """Copies the caller's device memory into the staged tensors, on ``stream`` (default: the legacy default
        stream) with a few launches of the gather kernel: ``ptrs[i]`` is the address of tensor ``first + i``'s
        bytes (layout order; a tensor of the set's device, its whole byte span; 0: not copied). Stages the next
        generation first if none is."""
    def bind_sources(self, ptrs: Sequence[int]) -> WeightsBound:
        """Binds the caller's device memory for ``copy_in_bound``: ``ptrs[i]`` is the address of tensor ``i``'s source
        (layout order; its whole byte span, on the set's device; 0: not copied). That memory must stay the caller's
        while the result lives (``Publisher.bind`` keeps the tensors beside it)."""
    def copy_in_bound(self, bound: WeightsBound, stream: Any = None) -> None:
        """Queues on ``stream`` (default: the legacy default stream) the copies ``bound`` names into the staged tensors
        with one launch of the gather kernel (its table prepared once per arena), staging the next generation first
        if none is."""
    def copy_in_from(
        self,
        tensors: dict[str, Any],
        names: list[str],
        first: int,
        kind: type,
        dtypes: list[Any],
        shapes: list[Any],
        stream: Any = None,
    ) -> int:
        """Copies ``tensors[names[i]]`` into staged tensor ``i`` for ``i`` from ``first`` on, while each is a ``kind``
        (``torch.Tensor``) whose ``dtype`` is ``dtypes[i]`` (the same object), whose ``shape`` equals
        ``shapes[i]``, on the set's device, contiguous: read and launched batch by batch on ``stream`` (the GPU
        copies one batch while the next is read). Returns the index of the first tensor that is not (or missing),
        after queueing those before it; ``len(names)`` when every one was. Stages the next generation first if
        none is. The tensors must stay alive until ``commit``."""
    def write(self, name: str, data: bytes) -> None:
        """Writes ``data`` (the tensor's bytes) into the staged tensor ``name`` (from host memory: ``cuMemcpyHtoD`` on
        a GPU). Stages the next generation first if none is."""
    def commit(self) -> int:
        """Publishes the staged generation, after the device's queued work (the copies) has finished; returns it."""
    def readers(self) -> list[tuple[int | None, list[int]]]:
        """The readers attached now: ``(pid, generations held)`` each (pid ``None`` in another PID namespace)."""
    def arenas(self) -> int:
        """Arenas made and not reused yet (published, staged, retired but held by readers)."""
    def layout(self) -> list[tuple[str, str, list[int]]]:
        """The set's tensors: ``(name, dtype, shape)`` each, in order."""
    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def device(self) -> int | None: ...
    @property
    def socket(self) -> pathlib.Path: ...
    def close(self) -> None:
        """Stops serving the set (readers keep what they hold). Idempotent."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

@final
class WeightsBound:
    """Tensors bound once for a weight set's copies (``gpu_ipc.weights`` keeps one in ``BoundSources`` and
    ``BoundTargets``, beside the tensors it names, which must stay alive while it does)."""

    def __len__(self) -> int: ...
    @property
    def prepared_arenas(self) -> int:
        """Arenas whose copies are prepared (their tables kept on the device; at most 8)."""
    @property
    def preparations(self) -> int:
        """Tables prepared so far (one per arena met, one more when an arena's tensors moved): stops growing once
        every arena was met."""

@final
class WeightsReader:
    """A reader of a weight set (``gpu_ipc.weights.open`` makes one): holds one generation at a time. A set on
    several devices is read whole (every part at one generation); the handle made stands for part 0, ``part_of(k)``
    gives part ``k``'s (its tensors, on its device); the generation, ``refresh`` and the owner's end are the set's."""

    def __new__(
        cls,
        socket: str | os.PathLike[str],
        name: str,
        backend: str | None = None,
        device: int | None = None,
        timeout: float = 10.0,
    ) -> Self: ...
    @property
    def part_count(self) -> int:
        """The number of parts the set lies in (1: one device)."""
    @property
    def part(self) -> int:
        """The part this handle stands for (0 for a set on one device)."""
    def part_of(self, part: int) -> WeightsReader:
        """A handle of the same reader for part ``part``: its tensors, on its device."""
    def order(self) -> list[tuple[int, int]]:
        """The set's tensors in the publisher's order: ``(part, index in that part's manifest)`` each."""
    @property
    def generation(self) -> int:
        """The generation held now."""
    def latest(self) -> int:
        """The newest published generation: a word in shared memory, no round trip. Raises ``OwnerGone``."""
    def refresh(self) -> int:
        """Moves to the newest generation and returns it; tensors of the old one stay valid until dropped."""
    def wait_for(self, generation: int, timeout: float | None = None) -> int:
        """Blocks until ``generation`` or a newer one is published (``timeout`` seconds at most, ``None``: no bound),
        in 50 ms slices (Ctrl-C works); returns the newest. Raises ``Timeout``, ``OwnerGone``."""
    def wait_on(self, generation: int, stream: Any = None) -> GenerationWait:
        """Makes ``stream`` (default: the legacy default stream) wait until ``generation`` or a newer one is
        published, or the owner is gone, or this reader closes (a stream wait cannot time out: the end releases it),
        and returns at once: the wait, for ``wait_status`` and for the kernels queued after it (its status word).
        Does not move the reader: call ``refresh`` when the CPU sees the generation. ``stream`` is a stream of this
        handle's device (for a set of parts, part ``part``'s: the wait uses the word of the first part on that
        device, which follows the set's generation). Raises ``GpuIpcError`` on the host backend (use ``wait_for``
        or ``watch``), ``ArgumentError`` for generation 0, ``OwnerGone``."""
    def watch(self, generation: int) -> GenerationWait:
        """Makes the reader's status word follow the published generation until ``generation`` or a newer one is
        published or the owner is gone, without a stream wait; returns the wait (read its word on the device, or
        ask ``wait_status``). For a set of parts, the word of this handle's part (on its device), following the
        set's generation. Works on every backend (on the host backend the word is host memory). Raises
        ``ArgumentError`` for generation 0, ``OwnerGone``."""
    def wait_status(self, wait: GenerationWait) -> tuple[str, int]:
        """How ``wait`` stands: ``("published", newest)`` (the generation or a newer one is published),
        ``("gone", newest)`` (released by the owner's end, or this reader's close, before it came), or
        ``("waiting", 0)``."""
    def tensors(self) -> list[tuple[str, WeightsTensor]]:
        """The held generation's tensors as ``(name, view)`` pairs; each view keeps the generation alive."""
    def arena(
        self,
    ) -> tuple[WeightsTensor, tuple[list[str], list[tuple[str, int, list[int], list[int], int, int]], list[int]]]:
        """The held generation's whole arena as one ``uint8`` view (the manifest at byte 0), with its tensors as
        ``(names, runs, order)``: the names (manifest order); the runs, ``(dtype, count, shape, strides, offset,
        step)`` each (tensors of one element type, shape and strides, ``step`` bytes apart from byte ``offset``;
        strides in elements; every entry checked against the mapped extent); for each name, its place among the
        runs' tensors laid end to end. One DLPack import for every tensor, which ``gpu_ipc.weights`` cuts the
        tensors from, a strided view per run. The view keeps the generation alive."""
    def manifest(self) -> list[tuple[str, str, list[int], list[int], int, int | None]]:
        """The held generation's manifest: ``(name, dtype, shape, strides, offset, checksum)`` per tensor."""
    def verify(self) -> int:
        """Checks the held generation's bytes against its manifest's checksums; returns how many tensors were checked
        (0 when the owner published none). Raises ``GpuIpcError`` naming the first that differs."""
    def read(self, name: str) -> bytes:
        """Tensor ``name``'s bytes, copied to host memory."""
    def copy_out(self, ptrs: Sequence[int], first: int = 0, stream: Any = None) -> None:
        """Copies the held tensors into the caller's device memory, on ``stream`` (default: the legacy default stream)
        with a few launches of the gather kernel: ``ptrs[i]`` is the address of the destination of tensor
        ``first + i`` (manifest order; its whole byte span, on the set's device; 0: not copied): what ``load_into``
        does. The held generation stays mapped until the device's queued work is done, whatever ``refresh`` does
        meanwhile."""
    def bind_targets(self, ptrs: Sequence[int]) -> WeightsBound:
        """Binds the caller's device memory for ``copy_out_bound``: ``ptrs[i]`` is the address of the destination of
        tensor ``i`` (the held generation's manifest order; its whole byte span, on the set's device; 0: not
        copied). That memory must stay the caller's while the result lives (``Reader.bind`` keeps the tensors
        beside it)."""
    def copy_out_bound(self, bound: WeightsBound, stream: Any = None) -> None:
        """Queues on ``stream`` (default: the legacy default stream) the copies ``bound`` names out of the held
        generation with one launch of the gather kernel (its table prepared once per arena). The held generation
        stays mapped until the device's queued work is done, whatever ``refresh`` does meanwhile."""
    def copy_out_to(
        self,
        tensors: dict[str, Any],
        names: list[str],
        first: int,
        kind: type,
        dtypes: list[Any],
        shapes: list[Any],
        stream: Any = None,
    ) -> int:
        """Copies held tensor ``i`` into ``tensors[names[i]]`` for every ``i`` from ``first`` on, on ``stream``, when
        each is a ``kind`` (``torch.Tensor``) whose ``dtype`` is ``dtypes[i]`` (the same object), whose ``shape``
        equals ``shapes[i]``, on the set's device, contiguous: every one is checked first, so nothing is written
        unless all pass. Returns ``len(names)`` once the copies are queued, else the index of the first tensor that
        does not pass (or is missing), with nothing queued. ``names`` must be the held generation's, in manifest
        order."""
    @property
    def owner_gone(self) -> bool:
        """Whether the owner closed the set or went away (what is held stays readable)."""
    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def device(self) -> int | None: ...
    @property
    def socket(self) -> pathlib.Path: ...
    def close(self) -> None:
        """Lets go of the set (tensors already made stay valid). Idempotent."""
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...

@final
class GenerationWait:
    """A wait for a generation of a weight set (``Reader.wait_on``, ``Reader.watch``). ``Reader.wait_status(wait)``
    says how it stands; on the device, read the status word (``torch.from_dlpack(wait)``, a 0-d ``int64``, no
    copy; ordered on the stream you queue the read on, so queue it after the wait): the generation is published
    iff ``(word & ~GONE_BIT) >= wait.generation``; else ``word & GONE_BIT`` says the owner is gone (or the reader
    closed). The word stays allocated (and registered) while this object or an array made from it lives."""

    GONE_BIT: int
    @property
    def generation(self) -> int:
        """The generation waited for."""
    @property
    def status_word(self) -> int:
        """The status word's address for kernels (read-only for them): a device address on a GPU backend, a host
        address on the host backend."""
    def status_of(self, word: int) -> str:
        """What ``word`` (a value read at ``status_word``) says of this wait: ``"published"``, ``"gone"`` or
        ``"waiting"``."""
    @property
    def shape(self) -> tuple[int, ...]:
        """``()``: the status word as a 0-d array."""
    @property
    def dtype(self) -> str:
        """``"int64"`` (the word's bits; the gone bit is below the sign)."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the memory, no copy; the consumer's ``stream`` is ordered after the stream the
        memory is ready on."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, ordinal)`` (kDLCUDA) on a GPU, ``(1, 0)`` (kDLCPU) in host memory."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, with ``stream``; absent (``AttributeError``) in host memory."""

@final
class WeightsTensor:
    """One tensor of a weight set's generation, in place: ``torch.from_dlpack(t)``, ``cupy.from_dlpack(t)``,
    ``numpy.from_dlpack(t)`` on the host backend. It keeps its generation (its arena, mapped and held from reuse)
    alive while it, or a tensor made from it, lives."""

    @property
    def name(self) -> str: ...
    @property
    def generation(self) -> int:
        """The generation it belongs to."""
    @property
    def nbytes(self) -> int: ...
    @property
    def ptr(self) -> int:
        """The address of its first byte in this process (a device address on a GPU)."""
    @property
    def shape(self) -> tuple[int, ...]:
        """Its shape as an array: ``(height, width, channels)`` of a pixel frame, else the tensor's (``(nbytes,)``
        for bare bytes)."""
    @property
    def dtype(self) -> str:
        """The element type's NumPy name (``"uint8"``, ``"float32"``, ``"bfloat16"``, ...)."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the memory, no copy; the consumer's ``stream`` is ordered after the stream the
        memory is ready on."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(2, ordinal)`` (kDLCUDA) on a GPU, ``(1, 0)`` (kDLCPU) in host memory."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, with ``stream``; absent (``AttributeError``) in host memory."""
